"""Fixed data for deterministic TUI snapshots: a static backend with canned GPUs and jobs.

Pilot tests use the real embedded engine (see ``embedded_app`` in conftest). Snapshots
need data that never changes (times, pids, memory), so they use :class:`StaticBackend`,
which implements the same :class:`~gpulayer_tui.backend.EngineBackend` interface.
"""

from __future__ import annotations

import asyncio
import copy
import io
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Static

from gpulayer_tui.backend import BackendError, LogChunk
from gpulayer_tui.engine.config import PolicySettings, UsageSettings
from gpulayer_tui.engine.domain import Domain
from gpulayer_tui.engine.gpus import GpuProcess, GpuReading
from gpulayer_tui.engine.spec import SpecError, parse_spec
from gpulayer_tui.engine.usage import UsageRecorder
from gpulayer_tui.wire import ROW_SPEC_KEYS, JobRowJSON

GIB = 1024**3
FIXED_NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC

MODELS = [
    ("NVIDIA H100 80GB HBM3", 80),
    ("NVIDIA A100-SXM4-80GB", 80),
    ("NVIDIA L4", 24),
    ("NVIDIA RTX 6000 Ada Generation", 48),
]


def _history(index: int, total: int) -> list[list[float | int]]:
    points = []
    for i in range(60):
        util = (index * 17 + i * 7) % 100
        points.append([FIXED_NOW - 60 + i, util, int(total * ((i + index * 9) % 60) / 100)])
    return points


RUNNING_ON_GPU = {0: (10, 20 * GIB)}
"""GPU index -> (job id, bytes it holds): the running GPU jobs of :func:`jobs_fixture`."""


def gpus_view(n_gpus: int, cpu_slots: int = 8) -> dict[str, Any]:
    """A ``/gpus`` answer for ``n_gpus`` GPUs with owned, foreign and free memory."""
    domains = []
    unregistered_total = 0
    for index in range(n_gpus):
        name, gib = MODELS[index % len(MODELS)]
        total = gib * GIB
        # Memory is owned only where a job of jobs_fixture() runs: job 10 on gpu0.
        owner = RUNNING_ON_GPU.get(index)
        owned = owner[1] if owner else 0
        foreign = 18 * GIB if index == 1 else 0
        unattributed = GIB // 2 if n_gpus else 0
        used = owned + foreign + unattributed
        processes = []
        jobs = []
        if owner:
            jobs = [owner[0]]
            processes.append(
                {
                    "pid": 5000 + owner[0],
                    "used_bytes": owned,
                    "gpu_util": 87,
                    "job_id": owner[0],
                    "user": "ana",
                    "command": f"python train.py --shard {index}",
                    "start_ticks": 654321 + index,
                    "ppid": 1,
                    "started_at": FIXED_NOW - 1800,  # (the job's own pid: its start)
                    "cpu_percent": 98.5 + index,
                    "rss": 3 * GIB + index * 256 * 1024**2,
                }
            )
        if foreign:
            processes.append(
                {
                    "pid": 4242,
                    "used_bytes": foreign,
                    "gpu_util": 4,
                    "job_id": None,
                    "user": "ben",
                    "command": "python notebook_kernel.py",
                    "start_ticks": 123456,
                    "ppid": 4200,
                    "started_at": FIXED_NOW - 2 * 3600 - 300,
                    "cpu_percent": 3.2,
                    "rss": 870 * 1024**2,
                }
            )
            unregistered_total += foreign
        domains.append(
            {
                "name": f"gpu{index}",
                "gpu_index": index,
                "gpu_uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
                "state": "in_service",
                "state_reason": "",
                "drain_reason": None,
                "health": "healthy",
                "failures": 0,
                "last_error": "",
                "slots": 1,
                "used_slots": len(jobs),
                "jobs": jobs,
                "leaving_jobs": [],
                "gpu": {
                    "name": name,
                    "memory_total": total,
                    "memory_used": used,
                    "memory_reserved": None,
                    "utilization": (index * 37 + 12) % 100,
                    "temperature": 40 + index * 4,
                    "power_watts": 90.0 + index * 35,
                    "power_limit_watts": 400.0,
                    "error": None,
                    "lost": False,
                },
                "vram": {
                    "total": total,
                    "used": used,
                    "owned": owned,
                    "unregistered": foreign,
                    "unattributed": unattributed,
                    "reserved_extra": 0,
                    "free": total - used,
                    "leaving": 0,
                    "driver_reserved": 0,
                },
                "processes": processes,
                "history": _history(index, total),
            }
        )
    domains.append(
        {
            "name": "cpu",
            "gpu_index": None,
            "gpu_uuid": None,
            "state": "in_service",
            "state_reason": "",
            "drain_reason": None,
            "health": "healthy",
            "failures": 0,
            "last_error": "",
            "slots": cpu_slots,
            "used_slots": 1,
            "jobs": [3],
            "leaving_jobs": [],
            "gpu": None,
            "vram": None,
            "processes": [],
        }
    )
    message = (
        None
        if n_gpus
        else "No NVIDIA driver found (NVML library not found): running with 0 GPUs; "
        "CPU jobs still work."
    )
    return {
        "backend": "simulated" if n_gpus else "nvml",
        "capacity": "known" if n_gpus else "no_gpus",
        "message": message,
        "driver_version": "simulated",
        "taken_at": FIXED_NOW,
        "probe_seconds": 0.001,
        "unregistered_total": unregistered_total,
        "domains": domains,
        "gpus_without_domain": [],
        "missing_gpus": [],
    }


def _job(
    job_id: int,
    name: str,
    status: str,
    message: str,
    *,
    command: list[str] | None = None,
    gpus: list[int] | None = None,
    domains: list[str] | None = None,
    vram_gb: float | None = None,
    reason: str | None = None,
    exit_code: int | None = None,
    started: float | None = None,
    ended: float | None = None,
    priority: int = 0,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "command", "command": command or ["python", f"{name}.py"]}
    spec["priority"] = priority
    if gpus:
        spec["gpus"] = len(gpus)
    if vram_gb is not None:
        spec["vram_gb"] = vram_gb
    return {
        "id": job_id,
        "name": name,
        "kind": "command",
        "status": status,
        "termination_reason": reason,
        "exit_code": exit_code,
        "message": message,
        "domains": domains or [],
        "gpus": gpus or [],
        "priority": priority,
        "pid": 5000 + job_id if started else None,
        "created_at": FIXED_NOW - 3600 + job_id * 60,
        # (a job refused at submission goes pending -> failed, never queued)
        "queued_at": None if reason == "over_capacity" else FIXED_NOW - 3600 + job_id * 60,
        "started_at": started,
        "ended_at": ended,
        "owner_uid": 65534,  # (nobody: named alike on every test machine)
        "kill_at": None,
        "stop_reason": None,
        "spec": spec,
    }


def jobs_fixture() -> list[dict[str, Any]]:
    """Jobs in every status, with queued and failed reasons, newest first."""
    t = FIXED_NOW
    jobs = [
        _job(
            1,
            "prep-data",
            "completed",
            "exited with code 0",
            reason="exit_code",
            exit_code=0,
            domains=["cpu"],
            started=t - 3500,
            ended=t - 3300,
        ),
        _job(
            2,
            "train-small",
            "failed",
            "exited with code 3",
            reason="exit_code",
            exit_code=3,
            domains=["gpu0"],
            gpus=[0],
            started=t - 3000,
            ended=t - 2900,
        ),
        _job(3, "tokenize", "running", "running on cpu", domains=["cpu"], started=t - 600),
        _job(
            4,
            "huge",
            "failed",
            "requested 3 GPUs, but this machine has 2",
            reason="over_capacity",
            gpus=None,
            ended=t - 3600 + 4 * 60,  # refused at submission: it ended as it was created
        ),
        _job(
            5,
            "oom-risk",
            "failed",
            "requested 100 GiB per GPU, but the largest GPU has 80 GiB",
            reason="over_capacity",
            vram_gb=100,
            ended=t - 3600 + 5 * 60,
        ),
        _job(
            10,
            "train-a",
            "running",
            "running on gpu0",
            domains=["gpu0"],
            gpus=[0],
            vram_gb=20,
            started=t - 1800,
        ),
        _job(
            11,
            "train-b",
            "queued",
            "waiting for gpu1: 18.0 GiB held by pid 4242 (python notebook_kernel.py, user ben); "
            "needs 70.0 GiB, 43.5 GiB free",
            vram_gb=70,
            priority=5,
        ),
        _job(12, "eval", "queued", "waiting for job 10"),
        _job(
            13,
            "sweep",
            "cancelled",
            "dependency job 2 failed",
            reason="dependency_failed",
            ended=t - 2900,
        ),
        _job(
            14,
            "bench",
            "cancelled",
            "cancelled by user",
            reason="cancelled",
            exit_code=143,
            domains=["gpu1"],
            gpus=[1],
            started=t - 900,
            ended=t - 850,
        ),
    ]
    return sorted(jobs, key=lambda j: -j["id"])


USAGE_TICKS = 48
"""Points in each GPU series of :func:`usage_fixture`."""


def usage_fixture(job: dict[str, Any], gpus: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``GET /v1/jobs/ID/usage`` answer for one job of :func:`jobs_fixture`, made by the
    engine's own :class:`UsageRecorder` from fixed readings at fixed times (no clock): every
    job that ran on GPUs has one; a running job's last point is its GPUs' reading in
    ``gpus`` (``/gpus``)."""
    job_id, started = job["id"], job.get("started_at")
    if not job.get("gpus") or not started:
        return {"job": job_id, "summary": None, "series": []}
    end = job.get("ended_at") or FIXED_NOW
    step = (end - started) / USAGE_TICKS
    declared = job["spec"].get("vram_gb")
    declared_bytes = None if declared is None else int(declared * GIB)
    domains = {g: Domain(f"gpu{g}", g, f"GPU-{g}", 4) for g in job["gpus"]}
    for dom in domains.values():
        dom.hold(job_id, declared_bytes, False)
    recorder = UsageRecorder(
        UsageSettings(point_interval=0),
        PolicySettings(),
        lambda _: (started, declared_bytes),
        lambda *_: None,
        lambda *_: None,
    )
    readings = {d["gpu_index"]: d for d in (gpus or {}).get("domains", [])}
    for tick in range(USAGE_TICKS + 1):
        for gpu, dom in domains.items():
            held = RUNNING_ON_GPU.get(gpu, (0, 6 * GIB))[1] if job_id == 10 else 6 * GIB
            vram = held * min(tick, 8) // 8 // (1024 * 1024) * 1024 * 1024  # ramps up
            util = 0 if tick < 2 else 35 + (tick * 13 + gpu * 29) % 60
            if job_id == 14 and tick >= 8:
                util = 0  # the bench hung: idle, warned, then cancelled
            now = readings.get(gpu)
            if tick == USAGE_TICKS and job["status"] == "running" and now and now["gpu"]:
                util = now["gpu"]["utilization"]
            reading = GpuReading(
                gpu,
                f"GPU-{gpu}",
                "NVIDIA A100-SXM4-80GB",
                80 * GIB,
                vram,
                utilization=util,
                memory_utilization=util // 2,
                power_watts=80.0 + util * 2.5,
                processes=(GpuProcess(100_000 + job_id, vram),),
            )
            dom.apply_sample(reading, {100_000 + job_id: job_id}, {})
        recorder.observe(started + tick * step, domains.values())
    usage = recorder.live(job_id)
    assert usage is not None
    if job_id == 14:
        usage.idle_warning = (
            "idle: its GPUs were under 5% utilisation for 30 s ([policy] idle_after = 30 s)"
        )
    out = usage.to_json()
    del out["totals"]  # (the engine's running sums: nothing a client reads)
    return dict(out)


def events_fixture(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A plausible timeline for one job."""
    events = [
        {
            "at": job["created_at"],
            "kind": "job.submitted",
            "status": "pending",
            "reason": None,
            "message": "",
            "data": {},
        }
    ]
    if job.get("queued_at") and job["status"] != "completed":
        events.append(
            {
                "at": job["queued_at"] + 0.001,
                "kind": "job.transition",
                "status": "queued",
                "reason": None,
                "message": (
                    job["message"] if job["status"] == "queued" else "the only GPU slot is busy"
                ),
                "data": {},
            }
        )
    if job.get("started_at"):
        events.append(
            {
                "at": job["started_at"],
                "kind": "job.transition",
                "status": "running",
                "reason": None,
                "message": f"running on {', '.join(job['domains'])}",
                "data": {},
            }
        )
    if job.get("ended_at") or job["status"] in ("failed", "cancelled", "completed"):
        events.append(
            {
                "at": job.get("ended_at") or job["created_at"] + 0.002,
                "kind": "job.transition",
                "status": job["status"],
                "reason": job["termination_reason"],
                "message": job["message"],
                "data": {},
            }
        )
    return events


FAKE_USERS = {
    1000: ("ana", 0.5, 2.0),
    65534: ("nobody", 1.5, 1.0),
    1001: ("ben", 3.25, 1.0),
}
"""uid -> (name, recent GPU-hours, share) of :meth:`StaticBackend.users` (every fixed job
is nobody's; ana and ben have only past use)."""

FAKE_LIMITS: dict[str, dict[str, Any]] = {
    "default": {"max_gpus": 4, "max_vram_gb": None, "max_queued": 500, "max_priority": 0},
    "ana": {"max_gpus": 8, "max_vram_gb": 160.0, "max_queued": 500, "max_priority": 0},
}
"""The README's example ``[users.default]`` and ``[users.ana]`` (with a VRAM limit)."""


class StaticBackend:
    """Canned engine answers; ``submit`` validates with the engine's own spec rules."""

    mode = "embedded"
    location = "/home/ana/.local/state/gpulayer"

    def __init__(
        self,
        n_gpus: int = 2,
        jobs: list[dict[str, Any]] | None = None,
        logs: dict[Any, bytes] | None = None,
    ) -> None:
        self._gpus = gpus_view(n_gpus)
        self._jobs = {j["id"]: j for j in (jobs if jobs is not None else jobs_fixture())}
        self._logs = logs or {10: b"epoch 1/10 loss=2.31\nepoch 2/10 loss=1.87\n"}
        self._never = asyncio.Event()
        self.submitted: list[dict[str, Any]] = []
        self.cancelled: list[int] = []

    async def close(self) -> None:
        self._never.set()

    async def health(self) -> dict[str, Any]:
        return {
            "engine": "gpulayer-tui",
            "version": "0.2.0",
            "backend": self._gpus["backend"],
            "state_dir": self.location,
            "capacity": self._gpus["capacity"],
            "no_gpu_notice": self._gpus["message"],
            "store_failure": None,
        }

    async def gpus(self) -> dict[str, Any]:
        return copy.deepcopy(self._gpus)

    async def jobs(
        self, statuses: list[str] | None = None, limit: int = 10_000
    ) -> list[dict[str, Any]]:
        jobs = sorted(self._jobs.values(), key=lambda j: -j["id"])
        if statuses:
            jobs = [j for j in jobs if j["status"] in statuses]
        return copy.deepcopy(jobs[:limit])

    async def jobs_page(self, **query: Any) -> dict[str, Any]:
        """``GET /v1/jobs`` over the fixed jobs (rows as the engine cuts them)."""
        from gpulayer_tui.widgets.job_columns import command_text, sort_value

        jobs = list(self._jobs.values())
        if statuses := [s for s in str(query.get("status") or "").split(",") if s]:
            jobs = [j for j in jobs if j["status"] in statuses]
        if text := str(query.get("q") or "").lower():
            jobs = [
                j
                for j in jobs
                if any(text in str(v).lower() for v in (j["id"], j["name"], j["message"]))
                or text in command_text(j).lower()
            ]
        if query.get("before") is not None:
            jobs = [j for j in jobs if j["id"] < int(query["before"])]
        key = str(query.get("sort") or "id")
        jobs.sort(key=lambda j: sort_value(key, j, 0.0), reverse=query.get("order") != "asc")
        offset, limit = int(query.get("offset") or 0), int(query.get("limit") or 500)
        row_keys = JobRowJSON.__required_keys__ | JobRowJSON.__optional_keys__
        rows = [
            {k: v for k, v in j.items() if k in row_keys}
            | {"spec": {k: v for k, v in j["spec"].items() if k in ROW_SPEC_KEYS}}
            | self._row_use(j)
            for j in jobs[offset : offset + limit]
        ]
        return {"jobs": copy.deepcopy(rows), "more": offset + limit < len(jobs)}

    async def job(self, job_id: int) -> dict[str, Any]:
        if job_id not in self._jobs:
            raise BackendError(f"no job {job_id}", 404)
        job = copy.deepcopy(self._jobs[job_id])
        summary = usage_fixture(job, self._gpus)["summary"]
        if summary is not None:  # (as the engine's: GPU jobs seen running)
            job["usage"] = summary
        return {"job": job, "events": events_fixture(job)}

    async def usage(self, job_id: int) -> dict[str, Any]:
        if job_id not in self._jobs:
            raise BackendError(f"no job {job_id}", 404)
        return usage_fixture(self._jobs[job_id], self._gpus)

    def _row_use(self, job: dict[str, Any]) -> dict[str, Any]:
        """A row's ``use`` (GPU jobs seen running), from the same usage as :meth:`usage`."""
        summary = usage_fixture(job, self._gpus)["summary"]
        if summary is None:
            return {}
        keys = ("peak_vram", "util_mean", "energy_wh")
        return {"use": {k: summary[k] for k in keys}}

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        try:
            parsed = parse_spec(spec)
        except SpecError as err:
            raise BackendError(str(err), 400) from None
        machine = len(self._gpus["domains"]) - 1
        if (parsed.gpus or 0) > machine:
            status, message, reason = (
                "failed",
                f"requested {parsed.gpus} GPUs, but this machine has {machine}",
                "over_capacity",
            )
        else:
            status, message, reason = "queued", "all 2 GPU slots busy", None
        job_id = max(self._jobs, default=0) + 1
        job = _job(
            job_id,
            parsed.default_name(),
            status,
            message,
            reason=reason,
            command=parsed.command or ["sh", "-c", parsed.shell or ""],
        )
        self._jobs[job_id] = job
        self.submitted.append(spec)
        return copy.deepcopy(job)

    async def cancel(self, job_id: int) -> dict[str, Any]:
        if job_id not in self._jobs:
            raise BackendError(f"no job {job_id}", 404)
        self.cancelled.append(job_id)
        job = self._jobs[job_id]
        if job["status"] not in ("pending", "queued", "running"):
            raise BackendError(f"job {job_id} already {job['status']}", 409)
        job.update(status="cancelled", termination_reason="cancelled", message="cancelled by user")
        return copy.deepcopy(job)

    async def cancel_many(self, job_ids: list[int]) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = []
        for job_id in job_ids:
            try:
                answers.append(dict(await self.cancel(job_id)))
            except BackendError as err:
                answers.append({"id": job_id, "error": str(err), "status": err.status})
        return answers

    async def why(self, job_id: int) -> dict[str, Any]:
        """The engine's answer for the fixture: waiting jobs in id order, no limits, one
        user (the shape is checked against a real engine's in test_ui_fake_contract)."""
        job = self._jobs.get(job_id)
        if job is None:
            raise BackendError(f"no job {job_id}", 404)
        ready = sorted(j["id"] for j in self._jobs.values() if j["status"] == "queued")
        waiting = job["status"] in ("pending", "queued")
        place = ready.index(job_id) + 1 if job_id in ready else None
        return {
            "job": job_id,
            "status": job["status"],
            "waiting": waiting,
            "reason": job["message"],
            "kill_at": job.get("kill_at"),
            "priority": job["priority"],
            "user": "nobody",
            "place": place,
            "ready": len(ready),
            "ahead": ready[: (place or 1) - 1],
            "waiting_for_jobs": [],
            "waiting_for": [],
            "capacity": None,
            "limits": {
                "max_gpus": None,
                "max_vram_gb": None,
                "max_queued": None,
                "max_priority": None,
                "running_gpus": 1,
                "running_vram_gb": 20.0,
                "waiting": len(ready),
                "from": "[users.default]",
                "tables": {},
            },
            "fair_share": [{"user": "nobody", "gpu_hours": 1.5, "share": 1.0, "fair_usage": 1.5}],
            "reservation": None,
            "preempting": [],
            "may_preempt": None,
            "held_by": [],
            "out_of_service": [],
        }

    async def users(self) -> dict[str, Any]:
        """``GET /v1/users`` over the fixture: the jobs' owner (nobody) with what its jobs
        hold and have waiting, and two users with only past use, under the README's
        example limits; in fair-share order, as the engine's (keys checked against a real
        engine's in test_ui_fake_contract)."""
        rows = []
        for uid, (name, gpu_hours, share) in FAKE_USERS.items():
            own = [j for j in self._jobs.values() if j["owner_uid"] == uid]
            running = [j for j in own if j["status"] == "running"]
            limits = FAKE_LIMITS.get(name, FAKE_LIMITS["default"])
            rows.append(
                {
                    "user": name,
                    "gpu_hours": gpu_hours,
                    "share": share,
                    "fair_usage": gpu_hours / share,
                    "uid": uid,
                    "running_jobs": len(running),
                    "running_gpus": sum(len(j["gpus"]) for j in running),
                    "running_vram_gb": round(
                        float(sum(j["spec"].get("vram_gb") or 0 for j in running if j["gpus"])), 1
                    ),
                    "waiting": sum(j["status"] in ("pending", "queued") for j in own),
                    **limits,
                }
            )
        rows.sort(key=lambda row: (row["fair_usage"], row["user"]))
        return {"users": rows}

    async def restart(self, job_id: int) -> dict[str, Any]:
        """The ended job's spec again, as the engine would (a new queued job)."""
        old = self._jobs.get(job_id)
        if old is None:
            raise BackendError(f"no job {job_id}", 404)
        if old["status"] in ("pending", "queued", "running"):
            raise BackendError(f"job {job_id} is {old['status']}: only an ended job restarts", 409)
        return {"job": await self.submit({**old["spec"], "restart_of": job_id}), "left_out": []}

    async def edit(self, job_id: int, changes: dict[str, Any]) -> dict[str, Any]:
        job = self._jobs.get(job_id)
        if job is None:
            raise BackendError(f"no job {job_id}", 404)
        if job["status"] not in ("pending", "queued"):
            state = "is running" if job["status"] == "running" else f"has ended ({job['status']})"
            raise BackendError(f"job {job_id} {state}: only a waiting job is edited", 409)
        job["spec"].update(changes)
        job["priority"] = job["spec"].get("priority", 0)
        return copy.deepcopy(job)

    async def process(self, pid: int) -> dict[str, Any]:
        """What the engine says of a listed process (its name: its program's)."""
        for dom in self._gpus["domains"]:
            for proc in dom["processes"]:
                if proc["pid"] == pid:
                    program = proc["command"].split(" ", 1)[0]
                    uid = 0 if proc["user"] == "root" else 1000
                    return {
                        **{k: proc[k] for k in ("pid", "start_ticks", "user", "command")},
                        **{"uid": uid, "started_at": proc["started_at"], "name": program},
                    }
        raise BackendError(f"no process with pid {pid}", 404, "pid")

    async def signal_process(self, pid: int, signal: str, start_ticks: int | None) -> str:
        """The engine's rule for someone else's process (every fixed stray is ben's, and
        the fixed data's user is ana)."""
        for dom in self._gpus["domains"]:
            for proc in dom["processes"]:
                if proc["pid"] == pid and proc.get("job_id") is None:
                    raise BackendError(
                        f"pid {pid} belongs to {proc['user']}; ana may signal "
                        "only its own processes",
                        400,
                        "pid",
                    )
        raise BackendError(f"no process with pid {pid} (it exited, or never was)", 400, "pid")

    async def read_log(
        self, job_id: int, offset: int, limit: int = 256 * 1024, replica: int | None = None
    ) -> LogChunk:
        key: Any = job_id if replica is None else (job_id, replica)
        data = self._logs.get(key, b"")[offset : offset + limit]
        return LogChunk(data, offset + len(data))

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        yield {"kind": "hello"}  # subscribed; then nothing ever happens
        await self._never.wait()


async def until(
    pilot: Pilot[Any], predicate: Callable[[], Any], what: str = "", timeout: float = 10.0
) -> Any:
    """Let the app run until ``predicate()`` is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what or predicate}")
        await pilot.pause(0.05)


def shown_text(widget: Static, width: int = 300) -> str:
    """What ``widget`` shows, as plain text, ``width`` columns wide (a rich table too)."""
    console = Console(width=width, file=io.StringIO(), color_system=None)
    with console.capture() as capture:
        console.print(widget.content)
    return capture.get()


async def type_text(pilot: Pilot[Any], text: str) -> None:
    """Type ``text`` as one burst, as a terminal delivers fast typing: every key sent, then
    the app let run until its screen has taken them all in.

    ``pilot.press(*text)`` waits after each key until the process looks idle (Textual's
    ``wait_for_idle``: 20 ms slices of under 1 ms of CPU), 50-100 ms a key with the engine
    in the same process: half the TUI tests' time went to it, 30 s to one form's fields.
    The app reads bursts as it reads single keys (``key_hold``, ``FieldInput``).
    """
    from textual import events
    from textual.keys import _character_to_key

    app = pilot.app
    driver = app._driver
    assert driver is not None
    for character in text:
        key = character if character.isalnum() else _character_to_key(character)
        event = events.Key(key, character)
        event.set_sender(app)
        driver.send_message(event)
    # (the keys reach the app's queue, then the focused field's: two rounds of waits)
    await pilot._wait_for_screen()
    await pilot.pause()


async def click_head(pilot: Any, table: Any, key: str) -> None:
    """Click the head of ``table``'s column ``key`` with the mouse (a real click: the
    screen's coordinates of that head's first cell)."""
    x = table.content_region.x - int(table.scroll_x)
    for column in table.ordered_columns:
        if column.key.value == key:
            break
        x += column.get_render_width(table)
    else:
        raise AssertionError(f"no column {key!r}")
    await pilot.click(offset=(x + 1, table.content_region.y))
    await pilot.pause()
