"""JSON views of the engine's GPU state, shared by ``GET /gpus`` and ``gpu.sample`` events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .domain import Domain
from .procs import started_at

if TYPE_CHECKING:
    from .engine import Engine


def _domain_view(engine: Engine, dom: Domain, history: bool) -> dict[str, Any]:
    view: dict[str, Any] = engine.domain_json(dom)
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
        sample = engine.sampler.latest
        owners = sample.owners if sample else {}
        info = sample.info if sample else {}
        for proc in reading.processes:
            owner = owners.get(proc.pid)
            pinfo = info.get(proc.pid)
            ticks = pinfo.start_ticks if pinfo else None
            view["processes"].append(
                {
                    "pid": proc.pid,
                    "used_bytes": proc.used_bytes,
                    "job_id": owner,
                    "user": pinfo.user if pinfo else "",
                    "command": pinfo.command if pinfo else "",
                    "start_ticks": ticks,
                    "started_at": None if ticks is None else started_at(ticks),
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
        points = engine.sampler.history.get(dom.gpu_index, ())
        view["history"] = [[p.at, p.utilization, p.memory_used] for p in points]
    return view


def gpus_view(engine: Engine, history: bool = True) -> dict[str, Any]:
    """Domains (GPU ones in index order, then ``cpu``) with readings and VRAM accounting."""
    sample = engine.sampler.latest
    domains = [_domain_view(engine, d, history) for d in engine.scheduler.domains.values()]
    return {
        "backend": engine.probe.backend,
        "capacity": engine.scheduler.capacity.value,
        "message": engine.no_gpu_notice or engine.scheduler.capacity_message or None,
        "driver_version": sample.result.driver_version if sample else None,
        "taken_at": sample.taken_at if sample else None,
        "probe_seconds": sample.duration if sample else None,
        "unregistered_total": sum(
            (d["vram"] or {}).get("unregistered", 0) for d in domains if d["vram"]
        ),
        "domains": domains,
    }


def sample_event_data(engine: Engine) -> dict[str, Any]:
    """Payload of a ``gpu.sample`` event (no history: subscribers keep their own)."""
    return gpus_view(engine, history=False)
