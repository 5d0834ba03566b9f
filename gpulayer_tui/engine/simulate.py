"""Simulated GPUs for machines without a driver (tests, demos, CI).

``--simulate 2xA100-80GB`` or ``--simulate 1xH200-141GB,1xL4-24GB`` describes the GPUs.
Which process "holds" how much memory comes from a ledger file in the state dir that
tests and demos write (see :class:`SimLedger`), so a real ``sleep`` process can hold 20 GiB
on GPU 1 and the engine's VRAM accounting, queued reasons and over-capacity verdicts are
exercised end to end. Ledger entries whose pid has exited are ignored, as the driver would
free their memory.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gpus import GIB, GpuProcess, GpuReading, ProbeResult, ProbeStatus

LEDGER_FILENAME = "sim-ledger.json"

_PART = re.compile(r"^(?P<count>\d+)x(?P<model>[A-Za-z0-9_.]+)-(?P<gb>\d+(?:\.\d+)?)GB$", re.I)


@dataclass(frozen=True, slots=True)
class SimulatedGpu:
    """One simulated GPU model."""

    model: str
    memory_gib: float


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


def _pid_alive(pid: int) -> bool:
    # A zombie still has /proc/PID; read its state so an exited-but-unreaped holder frees
    # its simulated memory at once, as a real driver does when the context is destroyed.
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    state = data[data.rfind(b")") + 2 : data.rfind(b")") + 3]
    return state not in (b"Z", b"X")


class SimLedger:
    """The ledger file: who holds simulated memory, and per-GPU overrides.

    File shape (JSON)::

        {"processes": [{"gpu": 1, "pid": 4242, "used_gb": 20.0}],
         "gpus": {"1": {"utilization": 87, "temperature": 71, "unattributed_gb": 0.5}}}

    Per-GPU ``lost``/``failed``/``error`` simulate a GPU that fell off the bus or stopped
    answering (domain health).

    ``used_gb`` may be ``null`` to simulate NVML's "not available".
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
        """Record that ``pid`` holds ``used_gb`` GiB on ``gpu`` (replacing any entry)."""
        data = self.load()
        data["processes"] = [
            p for p in data["processes"] if not (p.get("gpu") == gpu and p.get("pid") == pid)
        ]
        data["processes"].append({"gpu": gpu, "pid": pid, "used_gb": used_gb})
        self.save(data)

    def release(self, pid: int) -> None:
        """Forget every entry of ``pid``."""
        data = self.load()
        data["processes"] = [p for p in data["processes"] if p.get("pid") != pid]
        self.save(data)

    def set_gpu(self, gpu: int, **fields: Any) -> None:
        """Override per-GPU fields (utilization, temperature, power_watts, unattributed_gb)."""
        data = self.load()
        data["gpus"].setdefault(str(gpu), {}).update(fields)
        self.save(data)


class SimulatedProbe:
    """A :class:`~gpulayer_tui.engine.gpus.GpuProbe` over simulated GPUs."""

    backend = "simulated"

    def __init__(self, gpus: list[SimulatedGpu], state_dir: Path) -> None:
        self._gpus = gpus
        self._ledger = SimLedger(state_dir)
        # Deterministic UUIDs so config files can name simulated GPUs by uuid too.
        self._uuids = [
            "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpulayer-sim/{i}/{g.model}"))
            for i, g in enumerate(gpus)
        ]

    def read(self) -> ProbeResult:
        """Read the ledger and return one reading per simulated GPU."""
        ledger = self._ledger.load()
        held: dict[int, list[GpuProcess]] = {i: [] for i in range(len(self._gpus))}
        for entry in ledger["processes"]:
            try:
                gpu_index = int(entry["gpu"])
                pid = int(entry["pid"])
                raw = entry.get("used_gb")
                used = None if raw is None else int(float(raw) * GIB)
            except (KeyError, TypeError, ValueError):
                continue
            if gpu_index in held and _pid_alive(pid):
                held[gpu_index].append(GpuProcess(pid, used))
        readings = []
        for index, gpu in enumerate(self._gpus):
            overrides: dict[str, Any] = ledger["gpus"].get(str(index), {})
            total = int(gpu.memory_gib * GIB)
            procs = held[index]
            used = sum(p.used_bytes or 0 for p in procs)
            # A process whose usage is "not available" still uses memory: simulate it as
            # 1 GiB that only memory.used shows, like the real driver.
            used += GIB * sum(1 for p in procs if p.used_bytes is None)
            used += int(float(overrides.get("unattributed_gb", 0)) * GIB)
            util = overrides.get("utilization")
            if util is None:
                util = min(100, 40 * len(procs))
            readings.append(
                GpuReading(
                    index=index,
                    uuid=self._uuids[index],
                    name=f"Simulated {gpu.model}",
                    memory_total=total,
                    memory_used=min(total, used),
                    utilization=int(util),
                    temperature=int(overrides.get("temperature", 35 + int(util) // 3)),
                    power_watts=float(overrides.get("power_watts", 60 + 3 * int(util))),
                    power_limit_watts=float(overrides.get("power_limit_watts", 400)),
                    memory_utilization=int(overrides.get("memory_utilization", int(util) // 2)),
                    energy_mj=overrides.get("energy_mj"),
                    energy_at=None if overrides.get("energy_mj") is None else time.monotonic(),
                    processes=tuple(procs),
                    error=overrides.get("error"),
                    lost=bool(overrides.get("lost", False)),
                    failed=bool(overrides.get("failed", False)),
                )
            )
        return ProbeResult(
            status=ProbeStatus.OK,
            gpus=tuple(readings),
            backend=self.backend,
            driver_version="simulated",
        )

    def inventory(self) -> ProbeResult:
        """The simulated GPUs are always there."""
        return ProbeResult(
            status=ProbeStatus.OK,
            backend=self.backend,
            driver_version="simulated",
            device_count=len(self._gpus),
        )

    def read_device(self, index: int) -> GpuReading:
        """Read one simulated GPU (the ledger is re-read each time)."""
        return self.read().gpus[index]

    def close(self) -> None:
        """Nothing to release."""
