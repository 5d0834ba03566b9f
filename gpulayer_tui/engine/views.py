"""JSON views of the engine's GPU state, shared by ``GET /gpus`` and ``gpu.sample`` events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..wire import GpusJSON
from .domain import Domain
from .procs import started_at

if TYPE_CHECKING:
    from .sampler import Sample, Sampler
    from .scheduler import Scheduler


def _domain_view(
    dom: Domain, sample: Sample | None, sampler: Sampler, history: bool
) -> dict[str, Any]:
    view: dict[str, Any] = dict(dom.to_json())
    view.update(gpu_uuid=dom.gpu_uuid, jobs=sorted(dom.holdings), gpu=None, vram=None, processes=[])
    reading = dom.reading
    if reading is not None:
        view["gpu"] = {
            "name": reading.name,
            "memory_total": reading.memory_total,
            "memory_used": reading.memory_used,
            "utilization": reading.utilization,
            "temperature": reading.temperature,
            "power_watts": reading.power_watts,
            "power_limit_watts": reading.power_limit_watts,
            "error": reading.error,
            "lost": reading.lost,
        }
        owners = sample.owners if sample else {}
        info = sample.info if sample else {}
        host = sample.host if sample else {}
        for proc in reading.processes:
            owner = owners.get(proc.pid)
            pinfo = info.get(proc.pid)
            use = host.get(proc.pid)
            ticks = pinfo.start_ticks if pinfo else None
            view["processes"].append(
                {
                    "pid": proc.pid,
                    "used_bytes": proc.used_bytes,
                    "gpu_util": proc.sm_util,
                    "job_id": owner,
                    "user": pinfo.user if pinfo else "",
                    "command": pinfo.command if pinfo else "",
                    "start_ticks": ticks,
                    "ppid": pinfo.ppid if pinfo else None,
                    "started_at": None if ticks is None else started_at(ticks),
                    "cpu_percent": use.cpu_percent if use else None,
                    "rss": use.rss if use else None,
                }
            )
    account = dom.account
    if account is not None:
        view["vram"] = {
            "total": account.total,
            "used": account.used,
            "owned": account.owned,
            "unregistered": account.unregistered,
            "unattributed": account.unattributed,
            "reserved_extra": account.reserved_extra,
            "free": account.free,
        }
    if history and dom.gpu_index is not None:
        points = sampler.history.get(dom.gpu_index, ())
        view["history"] = [[p.at, p.utilization, p.memory_used] for p in points]
    return view


def gpus_view(
    scheduler: Scheduler, sampler: Sampler, backend: str, notice: str | None, history: bool = True
) -> GpusJSON:
    """Domains (GPU ones in index order, then ``cpu``) with readings and VRAM accounting.

    Args:
        scheduler: The domains and the capacity.
        sampler: The latest sample and each GPU's history.
        backend: ``nvml`` or ``simulated``.
        notice: Said once when there is no GPU driver.
        history: Include each GPU's history points (``GET /gpus``; events leave them out).
    """
    sample = sampler.latest
    domains = [_domain_view(d, sample, sampler, history) for d in scheduler.domains.values()]
    view: dict[str, Any] = {
        "backend": backend,
        "capacity": scheduler.capacity.value,
        "message": notice or scheduler.capacity_message or None,
        "driver_version": sample.result.driver_version if sample else None,
        "taken_at": sample.taken_at if sample else None,
        "probe_seconds": sample.duration if sample else None,
        "unregistered_total": sum(
            (d["vram"] or {}).get("unregistered", 0) for d in domains if d["vram"]
        ),
        "domains": domains,
    }
    return view  # type: ignore[return-value]  # built field by field above
