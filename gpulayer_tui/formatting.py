"""Small text formatters shared by the CLI and the TUI (stdlib only)."""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:  # (the CLI imports this module: no wire, no typing at run time)
    from .wire import JobRowJSON, ReplicaJSON

GIB = 1024**3


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def gib(value: int | None) -> str:
    """Bytes as GiB with one decimal; ``?`` when unknown."""
    return "?" if value is None else f"{value / GIB:.1f}"


def replica_health(job: JobRowJSON) -> str:
    """``2/2 up`` for a service's job JSON; ``""`` for other kinds."""
    replicas = job.get("replicas")
    if job.get("kind") != "service" or not replicas:
        return ""
    up = sum(1 for r in replicas if r.get("state") == "up")
    return f"{up}/{len(replicas)} up"


def replica_state(replica: ReplicaJSON, now: float) -> str:
    """What a replica is doing, with live countdowns: ``backoff (restart in 4s)``,
    ``starting for 12s (port 41234 not answering)``."""
    state = str(replica.get("state", "?"))
    restart_at, started_at = replica.get("next_restart_at"), replica.get("started_at")
    if state == "backoff" and restart_at:
        return f"backoff (restart in {duration(restart_at - now)})"
    if state == "starting" and started_at:
        waited = duration(now - started_at)
        port = replica.get("port")
        return f"starting for {waited}" + (f" (port {port} not answering)" if port else "")
    return state
