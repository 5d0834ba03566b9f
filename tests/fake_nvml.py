"""A fake NVML for tests: a device table plus error and hang injection.

:class:`FakeNvml` replaces the ``pynvml`` functions the probe uses at their function
boundary (``monkeypatch.setattr(pynvml, "nvmlInit", ...)``), so the real exception
classes, constants and the probe's own code all run unchanged. Errors are real
``pynvml.NVMLError(code)`` instances, which pynvml turns into the matching subclass
(``NVMLError_GpuIsLost``, ``NVMLError_NotSupported``, ...).

Register the ``fake_nvml`` fixture with ``pytest_plugins = ["tests.fake_nvml"]`` (in
``tests/conftest.py`` or a test module), then::

    def test_x(fake_nvml):
        fake_nvml.fail("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_NOT_SUPPORTED, index=1)
        hang = fake_nvml.hang("nvmlDeviceGetCount")   # blocks until hang.release()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

GIB = 1024**3

#: Every pynvml function the fake replaces.
PATCHED_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
)

#: How long a hung call waits for release before giving up with NVML_ERROR_TIMEOUT, so a
#: test that forgets to release cannot wedge the run forever.
HANG_SAFETY_S = 30.0


@dataclass
class FakeDevice:
    """One fake GPU. Edit fields freely between reads; the fake reads them live.

    ``compute``/``graphics`` hold ``(pid, used_bytes)`` pairs; ``used_bytes`` may be
    ``None`` (what pynvml returns for "not available") or any raw int, such as the
    ``2**64 - 1`` sentinel, to exercise the probe's own guard. ``power_mw`` /
    ``power_limit_mw`` are milliwatts, as NVML reports them; ``energy_mj`` is the
    total-energy counter in millijoules (``None``: the GPU has none, NOT_SUPPORTED).
    ``name`` may be ``bytes`` to imitate old bindings. ``process_util`` holds
    ``(pid, smUtil)`` samples, each read handed out stamped now (none: NOT_FOUND, as the
    driver says when it has no sample). ``lost=True`` makes every call for this GPU raise
    GPU_IS_LOST. ``memory_used`` is what the v1 memory read says (the driver's own
    reserve included); ``memory_reserved`` is that reserve, which the v2 read says apart
    (``used`` there excludes it). ``None`` imitates a driver without the v2 read: asking
    for it raises FUNCTION_NOT_FOUND.
    """

    uuid: str
    name: str | bytes
    memory_total: int
    memory_used: int
    utilization: int = 0
    memory_utilization: int = 0
    temperature: int = 35
    power_mw: int = 60_000
    power_limit_mw: int = 300_000
    energy_mj: int | None = None
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    process_util: list[tuple[int, int]] = field(default_factory=list)
    lost: bool = False
    index: int = -1
    memory_reserved: int | None = None


@dataclass
class Hang:
    """A hung call: ``entered`` is set once a call blocks; ``release()`` lets it go on."""

    function: str
    index: int | None
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    once: bool = False

    def release(self) -> None:
        """Let the blocked call (and any later one) continue."""
        self.released.set()


@dataclass
class _Failure:
    function: str
    error: int | BaseException
    index: int | None
    remaining: int | None  # None: fail forever

    def make(self) -> BaseException:
        if isinstance(self.error, BaseException):
            return self.error
        return pynvml.NVMLError(self.error)


#: Linux never hands out a pid above 2**22 (PID_MAX_LIMIT), so a process listed
#: with one is never a real process whose facts the engine could read: with
#: pid_max 32768, a literal 4242 or 5151 can be a test's own engine (it was, in CI).
NO_SUCH_PID = 2**22 + 1
STRAY_PID = NO_SUCH_PID + 4242


def default_devices() -> list[FakeDevice]:
    """Two GPUs: an A100 running one CUDA process and an idle H100."""
    return [
        FakeDevice(
            uuid="GPU-00000000-0000-0000-0000-000000000000",
            name="NVIDIA A100-SXM4-80GB",
            memory_total=80 * GIB,
            memory_used=20 * GIB,
            utilization=57,
            temperature=61,
            power_mw=250_500,
            power_limit_mw=400_000,
            compute=[(STRAY_PID, 19 * GIB)],
        ),
        FakeDevice(
            uuid="GPU-11111111-1111-1111-1111-111111111111",
            name="NVIDIA H100 80GB HBM3",
            memory_total=80 * GIB,
            memory_used=512 * 1024**2,
            utilization=0,
            temperature=33,
            power_mw=70_000,
            power_limit_mw=700_000,
        ),
    ]


class FakeNvml:
    """Stand-in for the NVML C library behind ``pynvml``.

    Attributes:
        devices: The GPUs, in index order (``index`` is assigned on every count/handle).
        driver_version: What ``nvmlSystemGetDriverVersion`` returns.
        calls: Every call made, as ``(function, gpu index or None)``.
        refcount: Like NVML: ``nvmlInit`` increments, ``nvmlShutdown`` decrements; calls
            other than ``nvmlInit`` raise NVML_ERROR_UNINITIALIZED while it is zero.
        stray_pid: The default A100's one CUDA process, never a real process.
        no_such_pid: Another pid no real process can have, for a test's own listing.
    """

    stray_pid = STRAY_PID
    no_such_pid = NO_SUCH_PID

    def __init__(self, devices: list[FakeDevice] | None = None) -> None:
        """Create the fake with ``devices`` (default: :func:`default_devices`)."""
        self.devices: list[FakeDevice] = default_devices() if devices is None else devices
        self.driver_version: str | bytes = "550.54.15"
        self.calls: list[tuple[str, int | None]] = []
        self.refcount = 0
        self._failures: list[_Failure] = []
        self._hangs: list[Hang] = []
        self._lock = threading.Lock()

    # --- configuration ------------------------------------------------------------

    def fail(
        self,
        function: str,
        error: int | BaseException,
        *,
        index: int | None = None,
        times: int | None = None,
    ) -> None:
        """Make ``function`` raise.

        Args:
            function: A pynvml function name from :data:`PATCHED_FUNCTIONS`.
            error: An ``NVML_ERROR_*`` code (raised as ``pynvml.NVMLError(code)``) or an
                exception instance to raise as is (e.g. ``NVMLLibraryMismatchError``).
            index: Only for this GPU index; ``None`` for every call.
            times: Fail this many times, then succeed; ``None`` fails forever.
        """
        if function not in PATCHED_FUNCTIONS:
            raise ValueError(f"FakeNvml does not patch {function!r}")
        self._failures.append(_Failure(function, error, index, times))

    def clear_failures(self) -> None:
        """Remove every injected failure."""
        self._failures.clear()

    def hang(self, function: str, *, index: int | None = None, once: bool = False) -> Hang:
        """Make ``function`` block until the returned :class:`Hang` is released.

        Args:
            function: A pynvml function name from :data:`PATCHED_FUNCTIONS`.
            index: Only for this GPU index; ``None`` for every call.
            once: Only the first matching call blocks.
        """
        if function not in PATCHED_FUNCTIONS:
            raise ValueError(f"FakeNvml does not patch {function!r}")
        hang = Hang(function, index, once=once)
        self._hangs.append(hang)
        return hang

    def release_all(self) -> None:
        """Release every hang (the fixture does this at teardown)."""
        for hang in self._hangs:
            hang.release()

    def call_count(self, function: str, index: int | None = None) -> int:
        """How many times ``function`` was called (for GPU ``index`` if given)."""
        return sum(
            1 for name, idx in self.calls if name == function and (index is None or idx == index)
        )

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        """Replace the pynvml functions with this fake (undone by ``monkeypatch``)."""
        for function in PATCHED_FUNCTIONS:
            monkeypatch.setattr(pynvml, function, getattr(self, "_" + function))
        return self

    # --- the machinery every fake call goes through ----------------------------------

    def _enter(self, function: str, index: int | None, *, needs_init: bool = True) -> None:
        with self._lock:
            self.calls.append((function, index))
            hangs = [h for h in self._hangs if _matches(h.function, h.index, function, index)]
        for hang in hangs:
            if hang.once and hang.entered.is_set():
                continue
            hang.entered.set()
            if not hang.released.wait(HANG_SAFETY_S):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        with self._lock:
            for failure in self._failures:
                if not _matches(failure.function, failure.index, function, index):
                    continue
                if failure.remaining is not None:
                    if failure.remaining <= 0:
                        continue
                    failure.remaining -= 1
                raise failure.make()
        if needs_init and self.refcount <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, function: str, handle: Any) -> FakeDevice:
        if not isinstance(handle, FakeDevice):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter(function, handle.index)
        if handle.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle

    # --- the patched functions ----------------------------------------------------------

    def _nvmlInit(self) -> None:
        self._enter("nvmlInit", None, needs_init=False)
        self.refcount += 1

    def _nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", None)
        self.refcount -= 1

    def _nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion", None)
        return self.driver_version

    def _nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", None)
        return len(self.devices)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        device = self.devices[index]
        device.index = index
        if device.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return device

    def _nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def _nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._device("nvmlDeviceGetName", handle).name

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> SimpleNamespace:
        device = self._device("nvmlDeviceGetMemoryInfo", handle)
        if version:
            if device.memory_reserved is None or version != pynvml.nvmlMemory_v2:
                raise pynvml.NVMLError(
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
                    if device.memory_reserved is None
                    else pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
                )
            return SimpleNamespace(
                version=version,
                total=device.memory_total,
                reserved=device.memory_reserved,
                used=device.memory_used - device.memory_reserved,
                free=device.memory_total - device.memory_used,
            )
        return SimpleNamespace(
            total=device.memory_total,
            used=device.memory_used,
            free=device.memory_total - device.memory_used,
        )

    def _nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        device = self._device("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=device.utilization, memory=device.memory_utilization)

    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        device = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.temperature

    def _nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetPowerUsage", handle).power_mw

    def _nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        device = self._device("nvmlDeviceGetTotalEnergyConsumption", handle)
        if device.energy_mj is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device.energy_mj

    def _nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        device = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        return _process_infos(device.compute)

    def _nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        device = self._device("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return _process_infos(device.graphics)

    def _nvmlDeviceGetProcessUtilization(self, handle: Any, since: int) -> list[SimpleNamespace]:
        device = self._device("nvmlDeviceGetProcessUtilization", handle)
        return _process_util_samples(device.process_util, int(since))


def _process_util_samples(entries: list[tuple[int, int]], since: int) -> list[SimpleNamespace]:
    now = int(time.time() * 1_000_000)
    if not entries or now <= since:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    return [
        SimpleNamespace(pid=pid, timeStamp=now, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
        for pid, sm in entries
    ]


def _matches(want_function: str, want_index: int | None, function: str, index: int | None) -> bool:
    return want_function == function and (want_index is None or want_index == index)


def _process_infos(entries: list[tuple[int, int | None]]) -> list[SimpleNamespace]:
    # Same attribute names as pynvml's nvmlFriendlyObject for c_nvmlProcessInfo_v3_t.
    return [
        SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0)
        for pid, used in entries
    ]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """A :class:`FakeNvml` with :func:`default_devices`, installed into ``pynvml``."""
    fake = FakeNvml().install(monkeypatch)
    yield fake
    # Unblock any thread still parked in a hung call so it can finish and not leak.
    fake.release_all()


__all__ = [
    "GIB",
    "PATCHED_FUNCTIONS",
    "FakeDevice",
    "FakeNvml",
    "Hang",
    "default_devices",
    "fake_nvml",
]
