"""JSON views of the engine's GPU state, shared by ``GET /gpus`` and ``gpu.sample`` events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..wire import GpusJSON
from .domain import Domain
from .procs import started_at

if TYPE_CHECKING:
    from .gpus import GpuReading
    from .sampler import Sample, Sampler
    from .scheduler import Scheduler


def _reading_view(reading: GpuReading, sample: Sample | None, view: dict[str, Any]) -> None:
    """Fill ``view``'s ``gpu`` and ``processes`` from one GPU's reading."""
    view["gpu"] = {
        "name": reading.name,
        "memory_total": reading.memory_total,
        "memory_used": reading.memory_used,
        "memory_reserved": reading.memory_reserved,
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


def _domain_view(
    dom: Domain, sample: Sample | None, sampler: Sampler, history: bool
) -> dict[str, Any]:
    view: dict[str, Any] = dict(dom.to_json())
    view.update(
        gpu_uuid=dom.gpu_uuid,
        jobs=sorted(dom.holdings),
        leaving_jobs=dom.leaving_jobs,
        gpu=None,
        vram=None,
        processes=[],
    )
    if dom.reading is not None:
        _reading_view(dom.reading, sample, view)
    account = dom.account
    if account is not None:
        view["vram"] = {
            "total": account.total,
            "used": account.used,
            # (a job's memory until the sample after its end: still ours, not a stray's)
            "owned": account.owned + account.leaving,
            "leaving": account.leaving,
            "unregistered": account.unregistered,
            "unattributed": account.unattributed,
            "reserved_extra": account.reserved_extra,
            "free": account.free,
            "driver_reserved": account.driver_reserved,
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
    owned = {d.gpu_index for d in scheduler.domains.values() if d.is_gpu}
    other: list[dict[str, Any]] = []
    for reading in sample.result.gpus if sample is not None else ():
        if reading.index in owned:
            continue
        # A GPU the config gives no domain (``auto_domains = false``): not the engine's,
        # but its load and memory are the machine's, and jobs may still run there (its
        # domain was removed while they ran).
        retired = scheduler.retired.get(reading.index)
        entry: dict[str, Any] = {
            "gpu_index": reading.index,
            "gpu_uuid": reading.uuid,
            "jobs": sorted(retired.holdings) if retired is not None else [],
            "gpu": None,
            "processes": [],
            # (its read failed: the figures are the last good read's, as a domain's
            # "failures" says; they showed as live, and its graph plotted them: h148)
            "failures": 1 if reading.failed else 0,
        }
        _reading_view(reading, sample, entry)
        if history:
            points = sampler.history.get(reading.index, ())
            entry["history"] = [[p.at, p.utilization, p.memory_used] for p in points]
        other.append(entry)
    for index, jobs in scheduler.missing_gpus().items():
        # A GPU jobs still run on that the driver no longer lists (gone while no engine
        # ran): said, or the job ran on "gpu1" of a machine that showed none.
        gone: dict[str, Any] = {
            "gpu_index": index,
            "gpu_uuid": scheduler.retired[index].gpu_uuid,
            # (its panel said "unknown GPU" and `gpus` "-": which domain it was is what
            # a user knows it by)
            "name": scheduler.retired[index].name,
            "jobs": jobs,
            "gpu": None,
            "processes": [],
            "missing": True,
        }
        if history:
            gone["history"] = []
        other.append(gone)
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
        "gpus_without_domain": other,
        "missing_gpus": [
            {"name": known.name, "gpu_uuid": uuid}
            for uuid, known in sorted(scheduler.missing_known.items(), key=lambda kv: kv[1].name)
        ],
    }
    return view  # type: ignore[return-value]  # built field by field above
