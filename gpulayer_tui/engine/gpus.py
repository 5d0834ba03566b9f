"""GPU observation: one probe interface, two backends (NVML and simulated).

A probe's :meth:`GpuProbe.read` is a *blocking* call that returns one complete picture of
every GPU. The engine never calls it on the event loop: the sampler runs it in a worker
thread with a deadline (see :mod:`gpulayer_tui.engine.sampler`).

Backends:
    * :class:`gpulayer_tui.engine.nvml.NvmlProbe` reads real GPUs through nvidia-ml-py.
    * :class:`gpulayer_tui.engine.simulate.SimulatedProbe` reads a spec such as
      ``2xA100-80GB`` and a ledger file of which pid "holds" how much memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

GIB = 1024**3


class ProbeStatus(StrEnum):
    """How complete a probe reading is."""

    OK = "ok"
    """Every GPU was read (individual GPUs may still carry an error)."""
    NO_DRIVER = "no_driver"
    """No NVIDIA driver/NVML: the machine has zero usable GPUs. Capacity is known (0)."""
    ERROR = "error"
    """The probe failed as a whole: capacity is unknown, not zero."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU.

    Attributes:
        pid: Host PID as reported by the driver.
        used_bytes: GPU memory it holds; ``None`` when the driver says "not available"
            (containers, permissions). Never guess zero: such memory is counted through
            ``memory.used`` as unattributed.
        sm_util: Percent of the GPU's time its kernels ran (SM), averaged over the
            driver's samples since the last read; ``None`` when the driver has none
            (not supported, or no sample for it yet).
    """

    pid: int
    used_bytes: int | None
    sm_util: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant. Any metric may be ``None`` (not supported / failed).

    Attributes:
        index: NVML index (PCI bus order).
        uuid: Stable GPU UUID.
        name: Marketing name, e.g. ``NVIDIA A100-SXM4-80GB``.
        memory_total: Bytes, all of the GPU's memory (``memory_reserved`` included).
        memory_used: Bytes in use, as the driver counts it (includes unlisted users);
            not ``memory_reserved`` where the driver says that apart.
        memory_reserved: Bytes the driver keeps for itself (NVML's v2 memory info); no
            job can have them. ``None`` where the driver does not say (older drivers:
            then ``memory_used`` includes them).
        utilization: GPU busy percent over the driver's last period (SM activity).
        memory_utilization: Percent of that period the memory was being read or written
            (memory-bandwidth use).
        temperature: Degrees Celsius.
        power_watts: Current draw.
        power_limit_watts: Enforced power limit.
        energy_mj: The driver's total-energy counter (millijoules since the driver
            loaded) as last read; ``None`` where the GPU has none (energy is then
            estimated from power). Reading it is costly on some GPUs (2.4 ms on an H200,
            300 times a power read), so a probe may read it only every few seconds.
        energy_at: When ``energy_mj`` was read (``time.monotonic()``); a new value means
            a new read.
        processes: Compute (and graphics) processes with their memory.
        processes_listed: False when a process list could not be read (an NVML error,
            or not permitted, as in many containers): memory no listed process explains
            may then be our own jobs' (see :meth:`.Domain.apply_sample`).
        error: Why this reading is incomplete, if it is.
        lost: True when the driver reports the GPU as lost/fallen off the bus.
        failed: True when the GPU did not answer the basic reads (handle, memory): a
            failure that counts against its domain's health. Field-level gaps (a metric
            not supported, the process list not permitted) are not failures.
    """

    index: int
    uuid: str
    name: str
    memory_total: int | None
    memory_used: int | None
    memory_reserved: int | None = None
    utilization: int | None = None
    temperature: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    memory_utilization: int | None = None
    energy_mj: int | None = None
    energy_at: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    processes_listed: bool = True
    error: str | None = None
    lost: bool = False
    failed: bool = False

    @property
    def memory_usable(self) -> int | None:
        """Bytes jobs can have: all memory but what the driver keeps for itself."""
        if self.memory_total is None:
            return None
        return self.memory_total - (self.memory_reserved or 0)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Everything one probe call saw.

    Attributes:
        status: Whether the reading is complete, impossible (no driver) or failed.
        gpus: One reading per GPU, by index.
        message: Human explanation for ``NO_DRIVER``/``ERROR`` (said once, plainly).
        backend: ``"nvml"`` or ``"simulated"``.
        driver_version: Driver version string, when known.
        device_count: GPUs the driver lists (from :meth:`GpuProbe.inventory`).
    """

    status: ProbeStatus
    gpus: tuple[GpuReading, ...] = ()
    message: str | None = None
    backend: str = ""
    driver_version: str | None = None
    device_count: int = 0
    extra: dict[str, str] = field(default_factory=dict)


class GpuProbe(Protocol):
    """What the sampler needs from a backend."""

    backend: str

    def read(self) -> ProbeResult:
        """Read every GPU once. Blocking; must not raise for device or driver errors."""
        ...

    def inventory(self) -> ProbeResult:
        """Driver state and ``device_count`` (no readings). Blocking; must not raise."""
        ...

    def read_device(self, index: int) -> GpuReading:
        """Read one GPU. Blocking; errors become fields of the reading (``failed``,
        ``lost``, ``error``), never exceptions. Safe to call from several threads."""
        ...

    def close(self) -> None:
        """Release the backend (e.g. ``nvmlShutdown``)."""
        ...
