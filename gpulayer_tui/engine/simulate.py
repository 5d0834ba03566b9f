"""Simulated GPUs for machines without a driver (tests, demos, CI).

``--simulate 2xA100-80GB`` or ``--simulate 1xH200-141GB,1xL4-24GB`` describes the GPUs.
Which process "holds" how much memory comes from a ledger file in the state dir that
tests and demos write (see :class:`SimLedger`), so a real ``sleep`` process can hold 20 GiB
on GPU 1 and the engine's VRAM accounting, queued reasons and over-capacity verdicts are
exercised end to end. Ledger entries whose pid has exited are ignored, as the driver would
free their memory. The engine's own jobs need no ledger: it hands the probe where each runs
(:func:`placed_processes`), and ``[simulate]`` says what they hold and how busy they keep
their GPUs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import SimulateSettings
from .gpus import GIB, GpuProcess, GpuReading, ProbeResult, ProbeStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from .jobbook import ActiveJob

LEDGER_FILENAME = "sim-ledger.json"

_PART = re.compile(r"^(?P<count>\d+)x(?P<model>[A-Za-z0-9_.]+)-(?P<gb>\d+(?:\.\d+)?)GB$", re.I)


@dataclass(frozen=True, slots=True)
class SimulatedGpu:
    """One simulated GPU model."""

    model: str
    memory_gib: float


# Board power limits (W) of common models, by the start of the model's name; others 400 W
# (an A100's). An L4 drawing 360 W of a 400 W limit was no L4.
_POWER_LIMITS = (
    ("B200", 1000.0),
    ("H200", 700.0),
    ("H100", 700.0),
    ("L40S", 350.0),
    ("L40", 300.0),
    ("L4", 72.0),
    ("T4", 70.0),
    ("A10G", 150.0),
    ("A10", 150.0),
    ("A30", 165.0),
    ("A40", 300.0),
    ("V100", 300.0),
    ("RTX4090", 450.0),
    ("A6000", 300.0),
)


def power_limit_of(model: str) -> float:
    """A simulated GPU's power limit in watts, from its model's name."""
    name = model.upper().replace(" ", "").replace("-", "")
    for prefix, watts in _POWER_LIMITS:
        # (a whole model number: "A10" is not the start of "A100")
        if name.startswith(prefix) and not name[len(prefix) : len(prefix) + 1].isdigit():
            return watts
    return 400.0


def parse_simulate_spec(spec: str) -> list[SimulatedGpu]:
    """Parse ``2xA100-80GB`` / ``1xH200-141GB,1xL4-24GB`` into GPUs in index order.

    Raises:
        ValueError: Naming the part that is wrong and the expected shape.
    """
    gpus: list[SimulatedGpu] = []
    if not spec.strip():
        raise ValueError("--simulate: empty spec; expected e.g. 2xA100-80GB")
    for raw in spec.split(","):
        part = raw.strip()
        match = _PART.match(part)
        if match is None:
            raise ValueError(
                f"--simulate: cannot read {part!r}; expected COUNTxMODEL-MEMGB, "
                "e.g. 2xA100-80GB or 1xH200-141GB,1xL4-24GB"
            )
        count = int(match["count"])
        memory = float(match["gb"])
        if count < 1 or memory <= 0:
            raise ValueError(f"--simulate: {part!r} needs a count >= 1 and memory > 0")
        gpus.extend(SimulatedGpu(match["model"], memory) for _ in range(count))
    if len(gpus) > 64:
        raise ValueError(f"--simulate: {len(gpus)} GPUs is more than the 64 supported")
    return gpus


def simulate_problem(simulate: str | None, simulate_if_no_gpu: str | None = None) -> str | None:
    """Why a ``--simulate`` (or ``--simulate-if-no-gpu``) spec cannot be read; ``None``
    when it can, or none was given."""
    for spec in (simulate, simulate_if_no_gpu):
        if spec is not None:
            try:
                parse_simulate_spec(spec)
            except ValueError as err:
                return str(err)
    return None


def _session_and_start(pid: int) -> tuple[int, int] | None:
    """The session id and start time (clock ticks since boot) of a live ``pid``; ``None``
    when it is gone (or a zombie)."""
    # A zombie still has /proc/PID; read its state so an exited-but-unreaped holder frees
    # its simulated memory at once, as a real driver does when the context is destroyed.
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[3]), int(fields[19])


def _ancestors(pid: int, depth: int = 32) -> list[int]:
    """``pid``'s parent, its parent's, and so on (init left out): a ledger entry speaks for
    them too (an adopted shell whose child holds the memory was given 1 GiB more beside it)."""
    found = []
    for _ in range(depth):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            break
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) < 2:
            break
        pid = int(fields[1])
        if pid <= 1:
            break
        found.append(pid)
    return found


def _session_of(pid: int) -> int | None:
    """The session id of a live ``pid``; ``None`` when it is gone (or a zombie)."""
    found = _session_and_start(pid)
    return None if found is None else found[0]


def _pid_alive(pid: int) -> bool:
    return _session_of(pid) is not None


@dataclass(frozen=True, slots=True)
class PlacedProcess:
    """A process the engine placed on a simulated GPU: a job's group leader, a service
    replica's, or an adopted pid.

    Attributes:
        gpu: The GPU's index.
        pid: The process.
        job_id: Its job (seeds its utilisation pattern).
        declared: The job's declared memory per GPU (bytes), if any.
    """

    gpu: int
    pid: int
    job_id: int
    declared: int | None


def placed_processes(
    roots: dict[int, tuple[int, int | None]], lookup: Callable[[int], ActiveJob | None]
) -> tuple[PlacedProcess, ...]:
    """Where the engine's processes run: each root pid (a job's group leader, a replica's,
    an adopted pid) on each GPU its job (or replica) was given."""
    placed: list[PlacedProcess] = []
    for pid, (job_id, _ticks) in roots.items():
        act = lookup(job_id)
        if act is None:
            continue
        job = act.job
        gpus = job.gpus
        if job.replicas:
            gpus = next((r.gpus for r in job.replicas if r.pid == pid), [])
        declared = act.request.vram_bytes if act.request is not None else None
        if declared is None and act.request is None:
            raw = job.spec.get("vram_gb")
            declared = int(float(raw) * GIB) if isinstance(raw, int | float) else None
        placed.extend(PlacedProcess(gpu, pid, job_id, declared) for gpu in gpus)
    return tuple(placed)


class SimLedger:
    """The ledger file: who holds simulated memory, and per-GPU overrides.

    File shape (JSON)::

        {"processes": [{"gpu": 1, "pid": 4242, "used_gb": 20.0}],
         "gpus": {"1": {"utilization": 87, "temperature": 71, "unattributed_gb": 0.5}}}

    Per-GPU ``lost``/``failed``/``error`` simulate a GPU that fell off the bus or stopped
    answering (domain health).

    ``used_gb`` may be ``null`` to simulate NVML's "not available". An entry made by
    :meth:`hold` also has the process's ``start`` (clock ticks since boot): a process that
    later gets the same pid is not the holder (the ledger spoke for whatever reused it,
    which was then offered to be signalled). Entries without it speak for the pid.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LEDGER_FILENAME

    def load(self) -> dict[str, Any]:
        """Return the ledger; a missing or unreadable file is an empty ledger."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {"processes": [], "gpus": {}}
        if not isinstance(data, dict):
            return {"processes": [], "gpus": {}}
        data.setdefault("processes", [])
        data.setdefault("gpus", {})
        return data

    def save(self, data: dict[str, Any]) -> None:
        """Write atomically (temp file + rename) so a reader never sees half a file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def hold(self, gpu: int, pid: int, used_gb: float | None) -> None:
        """Record that ``pid`` holds ``used_gb`` GiB on ``gpu`` (replacing any entry); only
        that process, not a later one with its pid."""
        data = self.load()
        data["processes"] = [
            p for p in data["processes"] if not (p.get("gpu") == gpu and p.get("pid") == pid)
        ]
        entry: dict[str, Any] = {"gpu": gpu, "pid": pid, "used_gb": used_gb}
        found = _session_and_start(pid)
        if found is not None:
            entry["start"] = found[1]
        data["processes"].append(entry)
        self.save(data)

    def release(self, pid: int) -> None:
        """Forget every entry of ``pid``."""
        data = self.load()
        data["processes"] = [p for p in data["processes"] if p.get("pid") != pid]
        self.save(data)

    def set_gpu(self, gpu: int, **fields: Any) -> None:
        """Override per-GPU fields (utilization, temperature, power_watts, unattributed_gb,
        error, failed, lost)."""
        data = self.load()
        data["gpus"].setdefault(str(gpu), {}).update(fields)
        self.save(data)


class SimulatedProbe:
    """A :class:`~gpulayer_tui.engine.gpus.GpuProbe` over simulated GPUs.

    Two sources put processes on the GPUs: the ledger (tests and demos write it) and the
    engine's placements (:meth:`place`), so that a job on a simulated GPU shows its
    process, memory and utilisation as on a real box (``[simulate]`` says how much). The
    ledger speaks for a job where it names the job's process, or a process of the job's
    session (as a CUDA worker under the job's shell would be), on that GPU.

    Each tick is read once: :meth:`inventory` loads the ledger and builds every GPU's
    reading, and :meth:`read_device` hands out that tick's reading of one GPU.
    """

    backend = "simulated"

    def __init__(
        self,
        gpus: list[SimulatedGpu],
        state_dir: Path,
        settings: SimulateSettings | None = None,
    ) -> None:
        self._gpus = gpus
        self._ledger = SimLedger(state_dir)
        self.settings = settings or SimulateSettings()
        # Deterministic UUIDs so config files can name simulated GPUs by uuid too.
        self._uuids = [
            "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpulayer-sim/{i}/{g.model}"))
            for i, g in enumerate(gpus)
        ]
        self._placed: tuple[PlacedProcess, ...] = ()
        self._tick = 0
        self._readings: tuple[GpuReading, ...] | None = None

    def place(self, processes: tuple[PlacedProcess, ...]) -> None:
        """The engine's placements as of now (called on the loop before each tick; the
        tuple is replaced whole, so a reading thread sees one or the other)."""
        self._placed = processes

    def read(self) -> ProbeResult:
        """Read the ledger and return one reading per simulated GPU."""
        readings = self._read_all()
        return ProbeResult(
            status=ProbeStatus.OK,
            gpus=readings,
            backend=self.backend,
            driver_version="simulated",
            device_count=len(readings),
        )

    def inventory(self) -> ProbeResult:
        """The simulated GPUs are always there; this tick's readings are built here."""
        self._read_all()
        return ProbeResult(
            status=ProbeStatus.OK,
            backend=self.backend,
            driver_version="simulated",
            device_count=len(self._gpus),
        )

    def read_device(self, index: int) -> GpuReading:
        """This tick's reading of one simulated GPU (the ledger is read once a tick, by
        :meth:`inventory`)."""
        readings = self._readings
        if readings is None:
            readings = self._read_all()
        return readings[index]

    def close(self) -> None:
        """Nothing to release."""

    # -- one tick ------------------------------------------------------------------------

    def _read_all(self) -> tuple[GpuReading, ...]:
        self._tick += 1
        ledger = self._ledger.load()
        held: dict[int, list[GpuProcess]] = {i: [] for i in range(len(self._gpus))}
        # (gpu, pid) and (gpu, session) of every live ledger entry: the ledger speaks there.
        spoken: set[tuple[int, int]] = set()
        for entry in ledger["processes"]:
            try:
                gpu_index = int(entry["gpu"])
                pid = int(entry["pid"])
                raw = entry.get("used_gb")
                used = None if raw is None else int(float(raw) * GIB)
            except (KeyError, TypeError, ValueError):
                continue
            if gpu_index not in held:
                continue
            found = _session_and_start(pid)
            if found is None:
                continue
            session, start = found
            if entry.get("start") not in (None, start):
                continue  # (its pid reused by another process: that one holds nothing)
            held[gpu_index].append(GpuProcess(pid, used))
            spoken.update(((gpu_index, pid), (gpu_index, session)))
            spoken.update((gpu_index, parent) for parent in _ancestors(pid))
        ledger_count = {index: len(procs) for index, procs in held.items()}
        job_util: dict[int, int] = dict.fromkeys(held, 0)
        settings = self.settings
        if settings.jobs:
            for placed in self._placed:
                if placed.gpu not in held or (placed.gpu, placed.pid) in spoken:
                    continue
                if not _pid_alive(placed.pid):
                    continue
                spoken.add((placed.gpu, placed.pid))
                if placed.declared is None:
                    used = int(settings.memory_gb * GIB)
                else:
                    used = int(placed.declared * settings.memory_fraction)
                util = self._utilization(placed)
                held[placed.gpu].append(GpuProcess(placed.pid, used, util))
                job_util[placed.gpu] += util
        readings = tuple(
            self._reading(
                index, gpu, held[index], 40 * ledger_count[index] + job_util[index], ledger["gpus"]
            )
            for index, gpu in enumerate(self._gpus)
        )
        self._readings = readings
        return readings

    def _utilization(self, placed: PlacedProcess) -> int:
        """What one job's process adds to its GPU this tick: the set level, moved by a
        pattern seeded by (seed, job, GPU, tick), so a run repeats exactly."""
        settings = self.settings
        level = settings.utilization
        if settings.jitter:
            rng = random.Random(f"{settings.seed}/{placed.job_id}/{placed.gpu}/{self._tick}")
            level += rng.randint(-settings.jitter, settings.jitter)
        return max(0, min(100, level))

    def _reading(
        self,
        index: int,
        gpu: SimulatedGpu,
        procs: list[GpuProcess],
        busy: int,
        overrides_by_gpu: dict[str, Any],
    ) -> GpuReading:
        overrides: dict[str, Any] = overrides_by_gpu.get(str(index), {})
        total = int(gpu.memory_gib * GIB)
        # No GPU hands out more than it has: processes (in the ledger's order, then jobs)
        # get what is left, a ledger asking for more notwithstanding (its processes were
        # shown holding more than the GPU, and its unregistered VRAM past the total).
        left = total
        for number, proc in enumerate(procs):
            if proc.used_bytes is not None:
                kept = min(proc.used_bytes, left)
                left -= kept
                if kept != proc.used_bytes:
                    procs[number] = dataclasses.replace(proc, used_bytes=kept)
        used = sum(p.used_bytes or 0 for p in procs)
        # A process whose usage is "not available" still uses memory: simulate it as
        # 1 GiB that only memory.used shows, like the real driver.
        used += GIB * sum(1 for p in procs if p.used_bytes is None)
        used += int(float(overrides.get("unattributed_gb", 0)) * GIB)
        util = overrides.get("utilization")
        if util is None:  # (ledger processes count 40 % each; placed jobs [simulate]'s)
            util = min(100, busy)
        util = int(util)
        limit = power_limit_of(gpu.model)
        return GpuReading(
            index=index,
            uuid=self._uuids[index],
            name=f"Simulated {gpu.model}",
            memory_total=total,
            memory_used=min(total, used),
            utilization=int(util),
            temperature=int(overrides.get("temperature", 35 + int(util) // 3)),
            # (idle at 15 % of the limit, 90 % of it at full load: 60-360 W for 400 W)
            power_watts=float(overrides.get("power_watts", limit * (0.15 + 0.0075 * util))),
            power_limit_watts=float(overrides.get("power_limit_watts", limit)),
            memory_utilization=int(overrides.get("memory_utilization", int(util) // 2)),
            energy_mj=overrides.get("energy_mj"),
            energy_at=None if overrides.get("energy_mj") is None else time.monotonic(),
            processes=tuple(procs),
            error=overrides.get("error"),
            lost=bool(overrides.get("lost", False)),
            failed=bool(overrides.get("failed", False)),
        )
