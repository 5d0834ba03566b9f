"""NvmlProbe against the fake NVML (tests/fake_nvml.py) and against the real bindings."""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

import pynvml
import pytest

from gpulayer_tui.engine.gpus import GpuProcess, ProbeStatus
from gpulayer_tui.engine.nvml import NvmlProbe

if TYPE_CHECKING:
    from tests.fake_nvml import FakeNvml

# Registers the fake_nvml fixture. Not imported directly at runtime: a plain import before
# registration would stop pytest from rewriting the module's asserts (and warn = error).
pytest_plugins = ["tests.fake_nvml"]

GIB = 1024**3
DEVICE_CALLS = (
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetMemoryInfo",
)


@pytest.fixture
def probe() -> NvmlProbe:
    return NvmlProbe()


def test_reads_every_gpu_with_all_fields(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    result = probe.read()

    assert result.status is ProbeStatus.OK
    assert result.backend == "nvml"
    assert result.message is None
    assert result.driver_version == "550.54.15"
    assert [g.index for g in result.gpus] == [0, 1]

    a100, h100 = result.gpus
    assert a100.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert a100.name == "NVIDIA A100-SXM4-80GB"
    assert a100.memory_total == 80 * GIB
    assert a100.memory_used == 20 * GIB
    assert a100.utilization == 57
    assert a100.temperature == 61
    assert a100.power_watts == pytest.approx(250.5)
    assert a100.power_limit_watts == pytest.approx(400.0)
    assert a100.processes == (GpuProcess(fake_nvml.stray_pid, 19 * GIB),)
    assert a100.error is None
    assert a100.lost is False

    assert h100.name == "NVIDIA H100 80GB HBM3"
    assert h100.memory_used == 512 * 1024**2
    assert h100.utilization == 0
    assert h100.power_limit_watts == pytest.approx(700.0)
    assert h100.processes == ()
    assert h100.error is None


def test_reads_live_values_each_time(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    assert probe.read().gpus[0].memory_used == 20 * GIB
    fake_nvml.devices[0].memory_used = 70 * GIB
    fake_nvml.devices[0].compute.append((5000, 50 * GIB))

    gpu = probe.read().gpus[0]

    assert gpu.memory_used == 70 * GIB
    assert gpu.processes == (GpuProcess(fake_nvml.stray_pid, 19 * GIB), GpuProcess(5000, 50 * GIB))
    assert fake_nvml.call_count("nvmlInit") == 1


def test_process_memory_not_available_is_none_never_zero(
    fake_nvml: FakeNvml, probe: NvmlProbe
) -> None:
    fake_nvml.devices[1].compute = [(100, None), (101, 2**64 - 1), (102, 3 * GIB)]

    gpu = probe.read().gpus[1]

    assert gpu.processes == (
        GpuProcess(100, None),
        GpuProcess(101, None),
        GpuProcess(102, 3 * GIB),
    )


def test_compute_and_graphics_processes_merge_by_pid(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.devices[1].compute = [(10, 1 * GIB), (11, None), (12, 4 * GIB)]
    fake_nvml.devices[1].graphics = [(10, 2 * GIB), (11, 3 * GIB), (12, None), (13, None)]

    gpu = probe.read().gpus[1]

    assert gpu.processes == (
        GpuProcess(10, 2 * GIB),
        GpuProcess(11, 3 * GIB),
        GpuProcess(12, 4 * GIB),
        GpuProcess(13, None),
    )


def test_each_process_gets_its_sm_utilisation_from_the_drivers_samples(
    fake_nvml: FakeNvml, probe: NvmlProbe
) -> None:
    device = fake_nvml.devices[1]
    device.compute = [(10, 1 * GIB), (11, 2 * GIB)]
    device.process_util = [(10, 70), (10, 80), (12, 50)]  # two samples of 10; 12 is not listed

    gpu = probe.read().gpus[1]

    assert gpu.processes == (GpuProcess(10, 1 * GIB, 75), GpuProcess(11, 2 * GIB, None))
    assert gpu.error is None
    # No sample since the last read (the driver says NOT_FOUND): not known, not an error.
    device.process_util = []
    gpu = probe.read().gpus[1]
    assert gpu.processes == (GpuProcess(10, 1 * GIB), GpuProcess(11, 2 * GIB))
    assert gpu.error is None
    # A driver without it: the same; a GPU lost in the middle of it: lost.
    device.process_util = [(10, 90)]
    fake_nvml.fail("nvmlDeviceGetProcessUtilization", pynvml.NVML_ERROR_NOT_SUPPORTED, index=1)
    assert probe.read().gpus[1].processes[0].sm_util is None
    fake_nvml.clear_failures()
    fake_nvml.fail("nvmlDeviceGetProcessUtilization", pynvml.NVML_ERROR_GPU_IS_LOST, index=1)
    assert probe.read().gpus[1].lost
    # An idle GPU (no process) is not asked at all.
    fake_nvml.clear_failures()
    calls = fake_nvml.call_count("nvmlDeviceGetProcessUtilization", 0)
    fake_nvml.devices[0].compute = []
    probe.read()
    assert fake_nvml.call_count("nvmlDeviceGetProcessUtilization", 0) == calls


def test_bytes_strings_from_old_bindings_are_decoded(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.devices[0].name = b"Tesla V100-SXM2-16GB"
    fake_nvml.driver_version = b"470.256.02"

    result = probe.read()

    assert result.gpus[0].name == "Tesla V100-SXM2-16GB"
    assert result.driver_version == "470.256.02"


@pytest.mark.parametrize(
    ("code", "wording"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "library not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
    ],
)
def test_no_driver_is_zero_gpus_said_once_and_not_retried(
    fake_nvml: FakeNvml, probe: NvmlProbe, code: int, wording: str
) -> None:
    fake_nvml.fail("nvmlInit", code)

    first = probe.read()
    second = probe.read()

    assert first.status is ProbeStatus.NO_DRIVER
    assert first.gpus == ()
    assert first.backend == "nvml"
    assert first.message is not None
    assert first.message.startswith("No NVIDIA driver")
    assert wording in first.message
    assert first.message.endswith("CPU jobs still work.")
    assert "\n" not in first.message
    assert "NVMLError" not in first.message
    assert second == first
    assert fake_nvml.call_count("nvmlInit") == 1
    assert all(fake_nvml.call_count(name) == 0 for name in DEVICE_CALLS)


def test_no_driver_close_does_not_shut_down(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    probe.read()

    probe.close()

    assert fake_nvml.call_count("nvmlShutdown") == 0


def test_init_permission_denied_is_error_naming_permissions(
    fake_nvml: FakeNvml, probe: NvmlProbe
) -> None:
    fake_nvml.fail("nvmlInit", pynvml.NVML_ERROR_NO_PERMISSION, times=1)

    denied = probe.read()
    retried = probe.read()

    assert denied.status is ProbeStatus.ERROR
    assert denied.gpus == ()
    assert denied.message is not None
    assert "permission" in denied.message
    assert retried.status is ProbeStatus.OK
    assert len(retried.gpus) == 2


def test_other_init_error_is_error_and_retried(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlInit", pynvml.NVML_ERROR_UNKNOWN, times=1)

    failed = probe.read()
    retried = probe.read()

    assert failed.status is ProbeStatus.ERROR
    assert failed.message is not None
    assert "Unknown Error" in failed.message
    assert retried.status is ProbeStatus.OK
    assert fake_nvml.call_count("nvmlInit") == 2


def test_version_mismatch_at_init_says_what_to_do(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlInit", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)

    result = probe.read()

    assert result.status is ProbeStatus.ERROR
    assert result.message is not None
    assert "reboot" in result.message


def test_lost_gpu_is_marked_and_others_still_read(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.devices[0].lost = True

    result = probe.read()

    assert result.status is ProbeStatus.OK
    lost, fine = result.gpus
    assert lost.index == 0
    assert lost.lost is True
    assert lost.error is not None
    assert "GPU is lost" in lost.error
    assert lost.memory_total is None
    assert lost.memory_used is None
    assert lost.utilization is None
    assert lost.processes == ()
    assert fine.lost is False
    assert fine.error is None
    assert fine.memory_used == 512 * 1024**2
    assert fine.uuid == "GPU-11111111-1111-1111-1111-111111111111"


def test_gpu_lost_mid_read_keeps_known_identity(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_GPU_IS_LOST, index=1)

    gpu = probe.read().gpus[1]

    assert gpu.lost is True
    assert gpu.uuid == "GPU-11111111-1111-1111-1111-111111111111"
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.memory_used is None
    assert gpu.utilization is None
    assert gpu.error is not None
    assert "GPU is lost" in gpu.error


def test_unknown_error_on_memory_fails_that_gpu_only(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, index=0)

    result = probe.read()

    assert result.status is ProbeStatus.OK
    broken, fine = result.gpus
    assert broken.lost is False
    assert broken.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert broken.memory_total is None
    assert broken.memory_used is None
    assert broken.processes == ()
    assert broken.error is not None
    assert "memory" in broken.error
    assert "Unknown Error" in broken.error
    assert fine.error is None
    assert fine.memory_total == 80 * GIB


def test_handle_error_gives_empty_identity(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_UNKNOWN, index=1)

    gpu = probe.read().gpus[1]

    assert gpu.index == 1
    assert gpu.uuid == ""
    assert gpu.name == ""
    assert gpu.memory_used is None
    assert gpu.lost is False
    assert gpu.error == "cannot open GPU 1 (Unknown Error)" and gpu.failed


def test_not_supported_metrics_are_none_without_error(
    fake_nvml: FakeNvml, probe: NvmlProbe
) -> None:
    for function in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
    ):
        fake_nvml.fail(function, pynvml.NVML_ERROR_NOT_SUPPORTED, index=1)

    result = probe.read()

    gpu = result.gpus[1]
    assert gpu.utilization is None
    assert gpu.temperature is None
    assert gpu.power_watts is None
    assert gpu.power_limit_watts is None
    assert gpu.error is None
    assert gpu.memory_used == 512 * 1024**2
    assert result.gpus[0].temperature == 61


def test_other_metric_error_is_none_with_note(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_UNKNOWN, index=0)

    gpu = probe.read().gpus[0]

    assert gpu.temperature is None
    assert gpu.utilization == 57
    assert gpu.error is not None
    assert "temperature" in gpu.error


def test_memory_not_supported_keeps_other_metrics(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_NOT_SUPPORTED, index=0)

    gpu = probe.read().gpus[0]

    assert gpu.memory_total is None
    assert gpu.memory_used is None
    assert gpu.utilization == 57
    assert gpu.processes == (GpuProcess(fake_nvml.stray_pid, 19 * GIB),)
    assert gpu.lost is False
    assert gpu.error is not None
    assert "memory" in gpu.error


def test_process_list_not_permitted(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    for function in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ):
        fake_nvml.fail(function, pynvml.NVML_ERROR_NO_PERMISSION)

    gpu = probe.read().gpus[0]

    assert gpu.processes == ()
    assert gpu.memory_used == 20 * GIB
    assert gpu.lost is False
    assert gpu.error is not None
    assert "process list not permitted" in gpu.error


def test_graphics_list_not_supported_keeps_compute(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetGraphicsRunningProcesses", pynvml.NVML_ERROR_NOT_SUPPORTED)

    gpu = probe.read().gpus[0]

    assert gpu.processes == (GpuProcess(fake_nvml.stray_pid, 19 * GIB),)
    assert gpu.error is None


def test_old_driver_process_list_mismatch_does_not_raise(
    fake_nvml: FakeNvml, probe: NvmlProbe
) -> None:
    # Not an NVMLError subclass: raised by pynvml's unversioned process-list wrappers.
    fake_nvml.fail(
        "nvmlDeviceGetComputeRunningProcesses",
        pynvml.NVMLLibraryMismatchError("Unversioned function called"),
    )

    gpu = probe.read().gpus[0]

    assert gpu.processes == ()
    assert gpu.memory_used == 20 * GIB
    assert gpu.error is not None
    assert "compute process list failed" in gpu.error


def test_count_failure_is_error(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)

    result = probe.read()

    assert result.status is ProbeStatus.ERROR
    assert result.gpus == ()
    assert result.backend == "nvml"
    assert result.message is not None
    assert "count" in result.message
    assert "Unknown Error" in result.message


def test_unexpected_exception_becomes_error_result(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlDeviceGetCount", RuntimeError("boom"))

    result = probe.read()

    assert result.status is ProbeStatus.ERROR
    assert result.message is not None
    assert "RuntimeError: boom" in result.message


def test_driver_version_failure_is_none(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml.fail("nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_NOT_SUPPORTED)

    result = probe.read()

    assert result.status is ProbeStatus.OK
    assert result.driver_version is None


def test_close_shuts_down_once_and_swallows_errors(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    probe.read()
    fake_nvml.fail("nvmlShutdown", pynvml.NVML_ERROR_UNKNOWN)

    probe.close()
    probe.close()

    assert fake_nvml.call_count("nvmlShutdown") == 1


def test_close_after_read_releases_nvml(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    probe.read()
    assert fake_nvml.refcount == 1

    probe.close()

    assert fake_nvml.call_count("nvmlShutdown") == 1
    assert fake_nvml.refcount == 0


def test_close_without_read_does_nothing(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    probe.close()

    assert fake_nvml.call_count("nvmlShutdown") == 0


def test_read_during_stuck_init_returns_at_once(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    hang = fake_nvml.hang("nvmlInit")
    results = []
    worker = threading.Thread(target=lambda: results.append(probe.read()), daemon=True)
    worker.start()
    assert hang.entered.wait(5)

    meanwhile = probe.read()
    hang.release()
    worker.join(5)

    assert meanwhile.status is ProbeStatus.ERROR
    assert meanwhile.message is not None
    assert "in progress" in meanwhile.message
    assert not worker.is_alive()
    assert [r.status for r in results] == [ProbeStatus.OK]


def test_hung_device_call_blocks_read_until_released(fake_nvml: FakeNvml, probe: NvmlProbe) -> None:
    hang = fake_nvml.hang("nvmlDeviceGetMemoryInfo", index=1)
    results = []
    worker = threading.Thread(target=lambda: results.append(probe.read()), daemon=True)
    worker.start()
    assert hang.entered.wait(5)
    worker.join(0.2)
    assert worker.is_alive()

    hang.release()
    worker.join(5)

    assert len(results) == 1
    assert results[0].gpus[1].memory_used == 512 * 1024**2


def _real_nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_real_nvml_library_present(), reason="an NVML library is installed here")
def test_real_pynvml_without_driver_is_no_driver() -> None:
    probe = NvmlProbe()
    try:
        first = probe.read()
        second = probe.read()
    finally:
        probe.close()

    assert first.status is ProbeStatus.NO_DRIVER
    assert first.gpus == ()
    assert first.message is not None
    assert "No NVIDIA driver found" in first.message
    assert second == first


@pytest.mark.skipif(not _real_nvml_library_present(), reason="no NVML library here")
def test_real_pynvml_with_library_reads_without_raising() -> None:
    probe = NvmlProbe()
    try:
        result = probe.read()
    finally:
        probe.close()

    assert result.status in (ProbeStatus.OK, ProbeStatus.NO_DRIVER)
    for gpu in result.gpus:
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.lost or gpu.memory_total is None or gpu.memory_total > 0


def test_the_drivers_own_reserve_is_read_apart_from_used(
    fake_nvml: FakeNvml, probe: NvmlProbe
) -> None:
    # An idle H200 says 0.6 GiB "used" in the v1 read with no process: the driver's own
    # reserve. The v2 read says it apart, so it is not taken for unexplained memory.
    a100, h100 = fake_nvml.devices  # (one driver: both answer v2, or neither)
    a100.memory_reserved = 615 * 1024**2
    h100.memory_reserved = h100.memory_used = 615 * 1024**2

    busy, gpu = probe.read().gpus

    assert gpu.memory_reserved == 615 * 1024**2
    assert gpu.memory_used == 0
    assert gpu.memory_total == 80 * GIB and gpu.memory_usable == 80 * GIB - 615 * 1024**2
    assert busy.memory_used == 20 * GIB - 615 * 1024**2  # (its process's 19 GiB, and more)


def test_a_driver_without_the_v2_memory_read_is_read_v1_and_not_asked_again(
    fake_nvml: FakeNvml, probe: NvmlProbe
) -> None:
    first = probe.read()
    calls = fake_nvml.call_count("nvmlDeviceGetMemoryInfo")
    second = probe.read()

    assert [g.memory_used for g in (*first.gpus, *second.gpus)] == [20 * GIB, 512 * 1024**2] * 2
    assert all(g.memory_reserved is None and g.error is None for g in second.gpus)
    assert all(g.memory_usable == g.memory_total for g in second.gpus)
    # (one read per GPU once the driver said it has no v2: not two calls each tick)
    assert fake_nvml.call_count("nvmlDeviceGetMemoryInfo") - calls == 2
