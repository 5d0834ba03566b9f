"""Real GPUs through NVML (the ``pynvml`` module shipped by nvidia-ml-py).

:class:`NvmlProbe` turns every NVML failure into data: a machine without a driver is a
``NO_DRIVER`` result with zero GPUs, a GPU that fell off the bus is a reading with
``lost=True``, and a metric the GPU does not support is ``None``. :meth:`NvmlProbe.read`
never raises for NVML errors, because it runs in a sampler thread whose crash would blank
the whole GPU view.

Exception names worth knowing (nvidia-ml-py 13): ``NVMLError_LibraryNotFound``,
``NVMLError_DriverNotLoaded``, ``NVMLError_NoPermission``, ``NVMLError_NotSupported``,
``NVMLError_GpuIsLost`` (not ``GPUIsLost``), ``NVMLError_Uninitialized`` and
``NVMLError_LibRmVersionMismatch``. ``NVMLError(code)`` builds the matching subclass.
The unversioned process-list functions raise ``NVMLLibraryMismatchError``, which is *not*
an ``NVMLError``, when the installed driver lacks the ``_v3`` entry points.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from .gpus import GpuProcess, GpuReading, ProbeResult, ProbeStatus

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a hard dependency
    # A broken install must still let CPU jobs run: treat it like a missing driver.
    pynvml = None

_T = TypeVar("_T")

BACKEND = "nvml"
# Seconds between reads of each GPU's total-energy counter (see NvmlProbe).
ENERGY_INTERVAL_S = 10.0

# NVML reports "not available" (e.g. per-process memory under WDDM or in some containers)
# as an all-ones unsigned long long. pynvml already maps it to None in the process lists,
# but older bindings did not, and 16 EiB "used" would wreck VRAM accounting.
_NOT_AVAILABLE_ULL = 2**64 - 1

CPU_STILL_WORKS = "running with 0 GPUs; CPU jobs still work."


def _text(value: Any) -> str:
    """Return an NVML string as ``str`` (bindings before 11.x returned ``bytes``)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _nvml_errors() -> tuple[type[BaseException], ...]:
    """Exception types the bindings raise for NVML failures.

    ``NVMLLibraryMismatchError`` only exists in newer bindings, hence the lookup.
    """
    mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type) and issubclass(mismatch, BaseException):
        return (pynvml.NVMLError, mismatch)
    return (pynvml.NVMLError,)


class _GpuLost(Exception):
    """Internal: a call for this GPU said it is lost; stop reading it."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class NvmlProbe:
    """GPU probe backed by NVML.

    NVML is initialised lazily on the first :meth:`read`. When the NVML library or the
    kernel driver is missing the probe remembers it and every later read returns the
    same ``NO_DRIVER`` result without touching NVML again; other initialisation errors
    are retried on the next read.

    Attributes:
        backend: Always ``"nvml"``.
    """

    backend: str = BACKEND

    def __init__(self, energy_interval: float = ENERGY_INTERVAL_S) -> None:
        """Create the probe; nothing is loaded until the first :meth:`read`.

        Args:
            energy_interval: Seconds between reads of a GPU's total-energy counter (0:
                every read). The counter is cumulative, so reading it less often loses
                nothing; it costs 2.4 ms per call on an H200 (a power read: 0.007 ms).
        """
        self.energy_interval = energy_interval
        # GPU index -> (monotonic time, counter) of its last energy read; None: no counter.
        self._energy: dict[int, tuple[float, int | None]] = {}
        # GPU index -> the newest per-process utilisation sample seen (the driver's
        # microsecond timestamp): the next read asks only for newer ones.
        self._util_seen: dict[int, int] = {}
        # False once the driver has shown it has no v2 memory info (older drivers): the
        # v1 read is then used without asking again each tick.
        self._memory_v2 = True
        # Guards init/shutdown only. Device reads are not serialised: NVML is thread-safe.
        self._lock = threading.Lock()
        self._initialized = False
        self._no_driver: ProbeResult | None = None
        self._driver_version: str | None = None

    def read(self) -> ProbeResult:
        """Read every GPU once.

        Blocking (NVML calls can stall on a wedged driver); call it from a worker thread.

        Returns:
            ``OK`` with one reading per GPU (a GPU may carry ``error``/``lost``),
            ``NO_DRIVER`` with no GPUs when there is no NVML library or driver, or
            ``ERROR`` with a message when NVML failed as a whole.
        """
        inventory = self.inventory()
        if inventory.status is not ProbeStatus.OK:
            return inventory
        return replace(
            inventory,
            gpus=tuple(self.read_device(index) for index in range(inventory.device_count)),
        )

    def inventory(self) -> ProbeResult:
        """Initialise if needed and count the GPUs (no per-GPU reads).

        Returns:
            ``OK`` with ``device_count``, ``NO_DRIVER`` or ``ERROR`` as :meth:`read` does.
        """
        try:
            early = self._ensure_init()
            if early is not None:
                return early
            try:
                count = int(pynvml.nvmlDeviceGetCount())
            except _nvml_errors() as exc:
                if isinstance(exc, pynvml.NVMLError_Uninitialized):
                    # Someone shut NVML down under us: initialise again on the next read.
                    self._initialized = False
                return self._error(f"NVML could not count the GPUs ({exc}).")
            return ProbeResult(
                status=ProbeStatus.OK,
                backend=BACKEND,
                driver_version=self._driver_version,
                device_count=count,
            )
        except Exception as exc:
            return self._error(f"GPU probe failed unexpectedly ({type(exc).__name__}: {exc}).")

    def read_device(self, index: int) -> GpuReading:
        """Read one GPU (after :meth:`inventory`); never raises."""
        try:
            return self._read_gpu(index)
        except Exception as exc:
            return _failed(index, "", "", f"unexpected error ({type(exc).__name__}: {exc})")

    def close(self) -> None:
        """Shut NVML down if this probe initialised it. Never raises for NVML errors.

        A later :meth:`read` initialises NVML again.
        """
        # Do not wait long on a stuck init: the process is usually exiting anyway.
        if not self._lock.acquire(timeout=2.0):
            return
        try:
            if not self._initialized or pynvml is None:
                return
            self._initialized = False
            try:
                pynvml.nvmlShutdown()
            except _nvml_errors():
                pass
        finally:
            self._lock.release()

    # --- init -----------------------------------------------------------------------

    def _ensure_init(self) -> ProbeResult | None:
        """Initialise NVML once.

        Returns:
            ``None`` when NVML is ready to read, else the result to return instead.
        """
        if self._no_driver is not None:
            return self._no_driver
        if self._initialized:
            return None
        # A second read arriving while an init is stuck must not pile up behind it.
        if not self._lock.acquire(blocking=False):
            return self._error("NVML initialisation is still in progress (it may be stuck).")
        try:
            return self._init_locked()
        finally:
            self._lock.release()

    def _init_locked(self) -> ProbeResult | None:
        if self._no_driver is not None:
            return self._no_driver
        if self._initialized:
            return None
        if pynvml is None:
            self._no_driver = self._no_driver_result(
                f"No NVIDIA support: the pynvml module cannot be imported; {CPU_STILL_WORKS}"
            )
            return self._no_driver
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self._no_driver = self._no_driver_result(
                f"No NVIDIA driver found (NVML library not found): {CPU_STILL_WORKS}"
            )
            return self._no_driver
        except pynvml.NVMLError_DriverNotLoaded:
            self._no_driver = self._no_driver_result(
                f"No NVIDIA driver loaded (NVML: driver not loaded): {CPU_STILL_WORKS}"
            )
            return self._no_driver
        except pynvml.NVMLError_NoPermission:
            return self._error(
                "NVML refused access (insufficient permissions): this user cannot read the "
                "GPUs; check the permissions on /dev/nvidia*."
            )
        except pynvml.NVMLError_LibRmVersionMismatch:
            return self._error(
                "NVML and the loaded NVIDIA kernel driver have different versions (driver "
                "updated without reboot?): reboot or reload the nvidia module."
            )
        except _nvml_errors() as exc:
            return self._error(f"NVML failed to initialise ({exc}); retrying on the next read.")
        self._initialized = True
        self._driver_version = self._read_driver_version()
        return None

    def _energy_counter(
        self, index: int, handle: Any, notes: list[str]
    ) -> tuple[int | None, float | None]:
        """The GPU's energy counter and when it was read: read again once it is due."""
        now = time.monotonic()
        last = self._energy.get(index)
        if last is not None and now - last[0] < self.energy_interval:
            return last[1], (None if last[1] is None else last[0])
        value = _field(
            notes, "energy", lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        )
        self._energy[index] = (now, value)
        return value, (None if value is None else now)

    @staticmethod
    def _read_driver_version() -> str | None:
        try:
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except _nvml_errors():
            return None

    # --- reading ----------------------------------------------------------------------

    def _read_gpu(self, index: int) -> GpuReading:
        """Read one GPU; errors become fields of the reading, never exceptions."""
        uuid = ""
        name = ""
        notes: list[str] = []
        try:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost(exc) from exc
            except _nvml_errors() as exc:
                return _failed(index, uuid, name, f"cannot open GPU {index} ({exc})")

            uuid = _text(_field(notes, "uuid", lambda: pynvml.nvmlDeviceGetUUID(handle)) or "")
            name = _text(_field(notes, "name", lambda: pynvml.nvmlDeviceGetName(handle)) or "")

            memory_total: int | None
            memory_used: int | None
            memory_reserved: int | None
            try:
                memory_total, memory_used, memory_reserved = self._memory_info(handle)
            except pynvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost(exc) from exc
            except pynvml.NVMLError_NotSupported:
                # Some unified-memory parts (e.g. GB10) have no framebuffer counters.
                memory_total = memory_used = memory_reserved = None
                notes.append("memory info not supported by this GPU")
            except _nvml_errors() as exc:
                return _failed(index, uuid, name, f"cannot read memory ({exc})")

            rates = _field(
                notes, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle)
            )
            utilization = None if rates is None else int(rates.gpu)
            memory_utilization = None if rates is None else int(rates.memory)
            temperature = _field(
                notes,
                "temperature",
                lambda: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            )
            power = _field(
                notes, "power", lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0
            )
            power_limit = _field(
                notes,
                "power limit",
                lambda: int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)) / 1000.0,
            )
            energy, energy_at = self._energy_counter(index, handle, notes)
            listed_before = len(notes)
            processes = _read_processes(handle, notes)
            processes_listed = len(notes) == listed_before  # (every failure adds a note)
            if processes:
                processes = self._with_utilization(index, handle, processes)
        except _GpuLost as lost:
            return GpuReading(
                index=index,
                uuid=uuid,
                name=name,
                memory_total=None,
                memory_used=None,
                error=f"GPU is lost: the driver says it fell off the bus ({lost.cause}); "
                "reset the GPU or reboot.",
                lost=True,
            )
        return GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            memory_total=memory_total,
            memory_used=memory_used,
            memory_reserved=memory_reserved,
            utilization=utilization,
            temperature=temperature,
            power_watts=power,
            power_limit_watts=power_limit,
            memory_utilization=memory_utilization,
            energy_mj=energy,
            energy_at=energy_at,
            processes=processes,
            processes_listed=processes_listed,
            error="; ".join(notes) or None,
        )

    def _memory_info(self, handle: Any) -> tuple[int, int, int | None]:
        """Total, used and driver-reserved bytes. The v2 read (drivers from R510) says
        what the driver keeps for itself apart from ``used``: on an idle H200 that is
        0.6 GiB, which the v1 read counts as used, and no process explains it, so every
        idle GPU showed that much "unattributed". An older driver answers v1 only
        (``reserved`` unknown), and is not asked again."""
        if self._memory_v2:
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except (
                pynvml.NVMLError_FunctionNotFound,
                pynvml.NVMLError_ArgumentVersionMismatch,
                AttributeError,  # (bindings without nvmlMemory_v2)
                TypeError,  # (bindings without the version argument)
            ):
                self._memory_v2 = False
            except pynvml.NVMLError_NotSupported:
                pass  # this GPU only: try v1, which says so again if it has none either
            else:
                return int(memory.total), int(memory.used), int(memory.reserved)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(memory.total), int(memory.used), None

    def _with_utilization(
        self, index: int, handle: Any, processes: tuple[GpuProcess, ...]
    ) -> tuple[GpuProcess, ...]:
        """``processes`` with each one's SM utilisation: the mean of the driver's samples
        for it since the last read (``nvmlDeviceGetProcessUtilization``; on the first
        read, the last two seconds'). Optional: a driver without it, or with no sample
        yet, leaves them ``None``; a lost GPU aborts the read like any other call."""
        since = self._util_seen.get(index)
        if since is None:
            since = int((time.time() - 2.0) * 1_000_000)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
        except pynvml.NVMLError_GpuIsLost as exc:
            raise _GpuLost(exc) from exc
        except _nvml_errors():
            # NOT_FOUND (no sample since then), NOT_SUPPORTED, and pynvml's "error 0"
            # for an empty list: nothing known, nothing to note.
            return processes
        sums: dict[int, list[int]] = {}
        newest = since
        for sample in samples:
            newest = max(newest, int(sample.timeStamp))
            total = sums.setdefault(int(sample.pid), [0, 0])
            total[0] += int(sample.smUtil)
            total[1] += 1
        self._util_seen[index] = newest
        return tuple(
            GpuProcess(p.pid, p.used_bytes, min(100, sums[p.pid][0] // sums[p.pid][1]))
            if p.pid in sums
            else p
            for p in processes
        )

    @staticmethod
    def _no_driver_result(message: str) -> ProbeResult:
        return ProbeResult(status=ProbeStatus.NO_DRIVER, gpus=(), backend=BACKEND, message=message)

    @staticmethod
    def _error(message: str) -> ProbeResult:
        return ProbeResult(status=ProbeStatus.ERROR, gpus=(), backend=BACKEND, message=message)


def _failed(index: int, uuid: str, name: str, error: str) -> GpuReading:
    """A reading for a GPU that could not be read but is not reported lost."""
    return GpuReading(
        index=index,
        uuid=uuid,
        name=name,
        memory_total=None,
        memory_used=None,
        error=error,
        failed=True,
    )


def _field(notes: list[str], what: str, call: Callable[[], _T]) -> _T | None:
    """Run one optional NVML query.

    ``NotSupported`` is normal for many GPUs (e.g. no power sensor) and yields ``None``
    silently; other failures yield ``None`` and a note; a lost GPU aborts the whole read.
    """
    try:
        return call()
    except pynvml.NVMLError_GpuIsLost as exc:
        raise _GpuLost(exc) from exc
    except pynvml.NVMLError_NotSupported:
        return None
    except _nvml_errors() as exc:
        notes.append(f"{what} failed ({exc})")
        return None


def _read_processes(handle: Any, notes: list[str]) -> tuple[GpuProcess, ...]:
    """Compute plus graphics processes on one GPU, one entry per pid.

    A pid can appear in both lists (CUDA + OpenGL in one process); NVML reports the same
    allocation in each, so the larger known figure is kept rather than summed.
    """
    used_by_pid: dict[int, int | None] = {}
    denied = False
    listers = (
        ("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
        ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses),
    )
    for kind, lister in listers:
        try:
            infos = lister(handle)
        except pynvml.NVMLError_GpuIsLost as exc:
            raise _GpuLost(exc) from exc
        except pynvml.NVMLError_NoPermission:
            denied = True
            continue
        except pynvml.NVMLError_NotSupported:
            # e.g. graphics processes on a compute-only board.
            continue
        except _nvml_errors() as exc:
            notes.append(f"{kind} process list failed ({exc})")
            continue
        for info in infos:
            pid = int(info.pid)
            used = _used_bytes(getattr(info, "usedGpuMemory", None))
            if pid not in used_by_pid:
                used_by_pid[pid] = used
                continue
            known = used_by_pid[pid]
            if used is not None and (known is None or used > known):
                used_by_pid[pid] = used
    if denied:
        notes.append("process list not permitted (insufficient permissions)")
    return tuple(GpuProcess(pid, used) for pid, used in used_by_pid.items())


def _used_bytes(value: Any) -> int | None:
    """Per-process memory, or ``None`` when NVML says it is not available."""
    if value is None:
        return None
    used = int(value)
    if used < 0 or used >= _NOT_AVAILABLE_ULL:
        return None
    return used
