"""The engine over the NVML probe with a faked pynvml: accounting, errors, deadlines."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import psutil
import pynvml
import pytest

from gpulayer_tui.engine import sampler as sampler_module
from gpulayer_tui.engine.gpus import GIB, ProbeStatus
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.nvml import NvmlProbe
from gpulayer_tui.engine.procs import HostUse
from gpulayer_tui.engine.spec import SpecError

from .conftest import EngineFactory, eventually, make_config, wait_for

if TYPE_CHECKING:
    from .fake_nvml import FakeNvml


async def test_domains_and_vram_split_from_nvml(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    fake_nvml.devices[1].compute = [(fake_nvml.no_such_pid, None)]  # usage "not available"
    fake_nvml.devices[1].memory_used = 3 * GIB
    engine = await make_engine(probe=NvmlProbe())
    view = engine.gpus()
    assert view["backend"] == "nvml" and view["driver_version"] == "550.54.15"
    gpu0, gpu1, cpu = view["domains"]
    assert (gpu0["name"], gpu0["gpu_uuid"]) == ("gpu0", fake_nvml.devices[0].uuid)
    assert gpu0["gpu"]["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu0["gpu"]["utilization"] == 57 and gpu0["gpu"]["power_watts"] == 250.5
    # 20 GiB used; the stray (not ours) lists 19 GiB: 19 unregistered, 1 unattributed
    assert gpu0["vram"]["unregistered"] == 19 * GIB
    assert gpu0["vram"]["unattributed"] == 1 * GIB
    assert gpu0["vram"]["free"] == 60 * GIB
    # a process whose usage is unavailable shows None and is counted through memory.used
    assert gpu1["processes"] == [
        {
            "pid": fake_nvml.no_such_pid,
            "used_bytes": None,
            "gpu_util": None,
            "job_id": None,
            "user": "",
            "command": "",
            "start_ticks": None,
            "ppid": None,
            "started_at": None,
            "cpu_percent": None,
            "rss": None,
        }
    ]
    assert gpu1["vram"]["unregistered"] == 0 and gpu1["vram"]["unattributed"] == 3 * GIB
    assert view["unregistered_total"] == 19 * GIB
    assert cpu["name"] == "cpu" and cpu["gpu"] is None


async def test_hung_nvml_times_out_and_engine_keeps_working(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    config = make_config(engine={"probe_timeout": 0.2, "sample_interval": 60})
    engine = await make_engine(probe=NvmlProbe(), config=config)
    hang = fake_nvml.hang("nvmlDeviceGetCount")
    sample = await engine.sampler.sample_once()
    assert sample.result.status is ProbeStatus.ERROR
    assert sample.result.message == "GPU probe did not answer within 0.2 s"
    again = await engine.sampler.sample_once()
    assert again.result.message == "GPU probe still busy with a read that timed out"
    assert engine.scheduler.capacity.value == "unknown"
    # CPU work goes on; GPU work waits instead of failing wrongly
    cpu = await engine.submit({"command": ["true"]})
    assert (await engine.wait(cpu.id, timeout=10)).status is JobStatus.COMPLETED
    gpu = await engine.submit({"command": ["true"], "gpus": 1})
    assert gpu.status is JobStatus.QUEUED
    assert gpu.message == "GPU capacity unknown: GPU probe still busy with a read that timed out"
    hang.release()
    await hang_done(engine)
    assert (await engine.wait(gpu.id, timeout=10)).status is JobStatus.COMPLETED


async def hang_done(engine: object) -> None:
    from .conftest import eventually

    async def recovered() -> bool:
        sample = await engine.sampler.sample_once()  # type: ignore[attr-defined]
        return sample.result.status is ProbeStatus.OK

    await eventually(recovered, timeout=10, interval=0.05)


async def test_lost_gpu_only_affects_its_domain(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    engine = await make_engine(probe=NvmlProbe())
    fake_nvml.devices[1].lost = True
    await engine.sampler.sample_once()
    view = engine.gpus()
    assert view["domains"][1]["gpu"]["lost"] is True
    assert "lost" in view["domains"][1]["gpu"]["error"].lower()
    assert view["domains"][0]["gpu"]["lost"] is False
    assert view["domains"][0]["vram"]["free"] == 60 * GIB
    # a lost GPU quarantines its domain at once: work pinned there is refused
    with pytest.raises(SpecError, match="domain gpu1 is quarantined: GPU is lost"):
        await engine.submit({"command": ["true"], "vram_gb": 10, "domain": "gpu1"})
    elsewhere = await engine.submit({"command": ["true"], "vram_gb": 10})
    done = await engine.wait(elsewhere.id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.domains == ["gpu0"]


async def test_history_is_bounded(make_engine: EngineFactory) -> None:
    engine = await make_engine(config=make_config(engine={"history": 5, "sample_interval": 60}))
    for _ in range(8):
        await engine.sampler.sample_once()
    assert len(engine.sampler.history[0]) == 5
    assert len(engine.gpus()["domains"][0]["history"]) == 5


async def test_nvml_errors_at_field_level_do_not_break_sampling(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    fake_nvml.fail("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_NOT_SUPPORTED, index=1)
    fake_nvml.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION)
    engine = await make_engine(probe=NvmlProbe())
    gpu0, gpu1, _ = engine.gpus()["domains"]
    assert gpu1["gpu"]["utilization"] is None and gpu0["gpu"]["utilization"] == 57
    # without the process list, used memory is all unattributed, not ignored
    assert gpu0["vram"]["unattributed"] == 20 * GIB and gpu0["vram"]["unregistered"] == 0
    assert "not permitted" in gpu0["gpu"]["error"]


async def test_without_a_process_list_a_jobs_memory_is_not_counted_twice(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Not permitted (as in many containers): the 20 GiB in use is taken as the running
    # job's declared 20 GiB, not as its reservation *and* 20 GiB of unattributed memory.
    fake_nvml.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION)
    engine = await make_engine(probe=NvmlProbe())
    job = await engine.submit({"command": ["sleep", "60"], "vram_gb": 20, "domain": "gpu0"})
    assert job.status is JobStatus.RUNNING
    await engine.sampler.sample_once()
    vram = engine.gpus()["domains"][0]["vram"]
    assert (vram["owned"], vram["unattributed"], vram["reserved_extra"]) == (20 * GIB, 0, 0)
    assert vram["free"] == 60 * GIB  # (was 40: 80 - 20 declared - 20 unattributed)
    # Memory beyond what our jobs declared is still unattributed, never hidden.
    fake_nvml.devices[0].memory_used = 30 * GIB
    await engine.sampler.sample_once()
    vram = engine.gpus()["domains"][0]["vram"]
    assert (vram["owned"], vram["unattributed"], vram["free"]) == (20 * GIB, 10 * GIB, 50 * GIB)
    # With the list back, the formula is the usual one: the stray's 19 GiB listed again.
    fake_nvml.clear_failures()
    await engine.sampler.sample_once()
    vram = engine.gpus()["domains"][0]["vram"]
    assert vram["unregistered"] == 19 * GIB and vram["reserved_extra"] == 20 * GIB
    await engine.cancel(job.id)


async def test_a_gpu_hanging_mid_sweep_leaves_the_later_gpus_read_in_the_same_tick(
    fake_nvml: FakeNvml,
) -> None:
    # The sampler reads GPUs one after another in one thread; when GPU 0 hangs, GPUs 1
    # and 2 must still be read in that tick (in parallel), within two deadlines.

    from gpulayer_tui.engine.sampler import Sampler

    from .fake_nvml import default_devices

    fake_nvml.devices.append(default_devices()[1])
    fake_nvml.devices[2].uuid = "GPU-22222222-2222-2222-2222-222222222222"
    samples = []
    sampler = Sampler(NvmlProbe(), 60.0, 0.2, 10, dict, samples.append)
    await sampler.sample_once()  # a good read first: identities are known
    hang = fake_nvml.hang("nvmlDeviceGetMemoryInfo", index=0)
    # The tick returns while GPU 0's read still hangs (the hang is released only below):
    # it did not wait for it, and the other GPUs were read. (How fast is the benchmark's
    # business, not a timed assert's.)
    tick = await sampler.sample_once()
    gpus = {g.index: g for g in tick.result.gpus}
    assert gpus[0].failed and gpus[0].error == "GPU 0 did not answer within 0.2 s"
    assert not gpus[1].failed and not gpus[2].failed
    assert gpus[2].memory_total == 80 * GIB
    later = await sampler.sample_once()
    assert "still busy" in (later.result.gpus[0].error or "")
    assert not later.result.gpus[1].failed and not later.result.gpus[2].failed
    hang.release()
    # Once the abandoned read returns, stop() may close the probe.
    await eventually(lambda: all(f.done() for f in sampler._threads.values()))
    await sampler.stop()


def test_process_cache_attributes_by_incarnation(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ancestry and description are read once per process incarnation; a recycled pid
    # (same pid, new start time) is walked again and never inherits the old owner.
    from gpulayer_tui.engine import procs
    from gpulayer_tui.engine.sampler import ProcessCache

    table = {300: procs.ProcStat(300, "S", 200, 7), 200: procs.ProcStat(200, "S", 1, 5)}
    reads: list[int] = []

    def read_stat(pid: int) -> procs.ProcStat | None:
        reads.append(pid)
        return table.get(pid)

    monkeypatch.setattr(procs, "read_stat", read_stat)
    cache = ProcessCache()
    roots = {200: (42, 5)}
    assert cache.attribute(300, roots).owner == 42
    assert reads == [300, 200]
    reads.clear()
    assert cache.attribute(300, roots).owner == 42
    assert reads == [300]  # only the pid itself is re-checked
    assert cache.attribute(300, {200: (42, 6)}).owner is None  # root's start time differs
    table[300] = procs.ProcStat(300, "S", 1, 9)  # pid 300 recycled, not under 200 now
    assert cache.attribute(300, roots).owner is None
    cache.keep_only(set())
    reads.clear()
    cache.attribute(300, roots)
    assert reads == [300]  # forgotten, then re-read (its parent is init: no walk)


def test_process_cache_walks_again_when_a_process_is_given_a_new_parent() -> None:
    # Its ancestry was read once: a process whose parent ended (given to init) stayed the
    # job's, while adopt and signal, walking the live chain, called it a stray.
    from gpulayer_tui.engine import procs
    from gpulayer_tui.engine.sampler import ProcessCache

    script = "sleep 600 & echo $!; read line"
    with subprocess.Popen(
        ["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as shell:
        assert shell.stdin is not None and shell.stdout is not None
        sleeper = int(shell.stdout.readline())
        try:
            stat = procs.read_stat(shell.pid)
            assert stat is not None
            roots = {shell.pid: (42, stat.start_ticks)}
            cache = ProcessCache()
            assert cache.attribute(sleeper, roots).owner == 42
            shell.stdin.write("\n")
            shell.stdin.flush()
            shell.wait()
            wait_for(lambda: psutil.Process(sleeper).ppid() != shell.pid)
            cache.next_tick()
            assert cache.attribute(sleeper, roots).owner is None
        finally:
            os.kill(sleeper, signal.SIGKILL)


EXECS_ON_INPUT = "import os, sys; sys.stdin.readline(); os.execvp('sleep', ['sleep', '30'])"


def test_process_cache_describes_a_process_again_after_it_runs_exec() -> None:
    # An exec keeps the pid and the start time (the same incarnation) but not the
    # command: the cache notices through the stat's command name, read every tick anyway.
    from gpulayer_tui.engine.sampler import ProcessCache

    with subprocess.Popen([sys.executable, "-c", EXECS_ON_INPUT], stdin=subprocess.PIPE) as proc:
        try:
            cache = ProcessCache()

            def described() -> Any:
                # (Read in the instant of its exec, a process has a name, no command line
                # yet: the cache reads it again at the next tick.)
                cache.next_tick()
                seen = cache.attribute(proc.pid, {})
                return seen if seen.info.command.startswith(sys.executable) else None

            before = wait_for(described)
            assert "execvp" in before.info.command
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            wait_for(lambda: psutil.Process(proc.pid).cmdline() == ["sleep", "30"])
            cache.next_tick()
            after = cache.attribute(proc.pid, {})
            assert after.info.command == "sleep 30"
            assert after.info.start_ticks == before.info.start_ticks
        finally:
            proc.kill()


BURNER = """
import sys, time
block = bytearray(200 * 1024 * 1024)  # touched: resident, not just reserved
for i in range(0, len(block), 4096):
    block[i] = 1
print("ready", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    pass
"""


async def test_gpu_processes_carry_host_cpu_memory_and_start_time(
    make_engine: EngineFactory, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real process that burns a core and holds 200 MiB, listed on two GPUs: the sample
    # gives its CPU % over the last tick (none on the first), its RSS and start time, its
    # real user; it is measured once per tick, and forgotten once it is gone.
    config = make_config(engine={"sample_interval": 60})
    engine = await make_engine(probe=NvmlProbe(), config=config)
    monkeypatch.setattr(sampler_module, "HOST_EVERY_S", 0.0)  # (2 s: read each tick here)
    burner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BURNER, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert burner.stdout is not None and await burner.stdout.readline() == b"ready\n"
        fake_nvml.devices[0].compute = [(burner.pid, GIB)]
        fake_nvml.devices[1].compute = [(burner.pid, 2 * GIB)]
        first = await engine.sampler.sample_once()
        assert first.host[burner.pid].cpu_percent is None  # no interval yet
        await asyncio.sleep(0.5)
        second = await engine.sampler.sample_once()
        use = second.host[burner.pid]
        # (some: how much a burner gets of 2 shared cores depends on the machine's load;
        # "> 20" failed a full suite at 19.3)
        assert use.cpu_percent is not None and use.cpu_percent > 0
        # Read at most every HOST_EVERY_S: within it, a tick reuses the last figures.
        monkeypatch.setattr(sampler_module, "HOST_EVERY_S", 3600.0)
        assert (await engine.sampler.sample_once()).host[burner.pid] == use
        assert use.rss is not None and use.rss > 200 * 1024 * 1024
        view = engine.gpus()
        on_gpus = [p for d in view["domains"][:2] for p in d["processes"]]
        assert len(on_gpus) == 2
        created = psutil.Process(burner.pid).create_time()
        for proc in on_gpus:
            # One measure per tick: both GPUs' rows carry the same figures.
            assert (proc["cpu_percent"], proc["rss"]) == (use.cpu_percent, use.rss)
            assert proc["started_at"] == pytest.approx(created, abs=0.02)
            assert proc["user"] == pwd.getpwuid(os.getuid()).pw_name
            assert proc["command"].startswith(f"{sys.executable} -c")
    finally:
        burner.kill()
        await burner.communicate()  # (reaps it and closes its pipe)
    gone = await engine.sampler.sample_once()
    assert gone.host[burner.pid] == HostUse(None, None)  # listed by the driver, but gone
    fake_nvml.devices[0].compute = []
    fake_nvml.devices[1].compute = []
    later = await engine.sampler.sample_once()
    assert burner.pid not in later.host


async def test_two_samples_asked_at_once_take_turns(make_engine: EngineFactory) -> None:
    # (The second used to find the probe busy and publish a failed sample, with no GPU
    # processes, after the first's good one.)
    engine = await make_engine("2xA100-80GB")
    first, second = await asyncio.gather(engine.sampler.sample_once(), engine.sampler.sample_once())
    assert first.result.status is ProbeStatus.OK, first.result.message
    assert second.result.status is ProbeStatus.OK, second.result.message
    assert second.taken_at >= first.taken_at + first.duration - 0.001  # begun after the first


async def test_a_failing_sample_handler_never_stops_sampling_and_is_reported(
    tmp_path: Any,
) -> None:
    # What the engine does with a sample (health, capacity, a scheduling pass) raised
    # once, and the sampler's task ended: no more samples, no more health checks, while
    # /ready and doctor still said all was well. Now sampling goes on, and the failure
    # is reported by stalled() (readiness, doctor) until a sample is handled again.
    from gpulayer_tui.engine.sampler import Sampler
    from gpulayer_tui.engine.simulate import SimulatedProbe, parse_simulate_spec

    failing = True
    handled: list[float] = []

    def on_sample(sample: Any) -> None:
        if failing:
            raise KeyError("gpu0")
        handled.append(sample.taken_at)

    probe = SimulatedProbe(parse_simulate_spec("1xA100-80GB"), tmp_path)
    sampler = Sampler(probe, 0.05, 1.0, 10, dict, on_sample)
    first = await sampler.sample_once()
    assert first.result.gpus
    assert sampler.stalled() == "handling GPU samples fails: KeyError: 'gpu0'"
    sampler.start()
    try:
        reads = sampler.reads
        await eventually(lambda: sampler.reads >= reads + 3, timeout=10)  # ticking on
        assert sampler.stalled() is not None
        failing = False
        await eventually(lambda: len(handled) >= 2, timeout=10)
        assert sampler.stalled() is None
        # A sample older than a tick can take is reported too (a wedged tick).
        assert sampler.latest is not None
        later = sampler.latest.taken_at + 2 * 0.05 + 2 * 1.0 + 5
        assert "no GPU sample for" in (sampler.stalled(later) or "")
    finally:
        await sampler.stop()
