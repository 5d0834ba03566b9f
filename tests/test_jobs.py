"""Batch jobs through a real in-process engine: real processes, real SQLite, simulated GPUs."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from gpulayer_tui.engine.models import JobStatus, TerminationReason
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.engine.spec import SpecError, parse_spec
from gpulayer_tui.formatting import why_lines

if TYPE_CHECKING:
    from .fake_nvml import FakeNvml

from .conftest import EngineFactory, eventually, make_config, pid_gone


async def test_completed_job_records_exit_code_and_output(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    job = await engine.submit({"command": ["sh", "-c", "echo hello; echo oops >&2"]})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.COMPLETED
    assert done.termination_reason is TerminationReason.EXIT_CODE
    assert done.exit_code == 0
    assert done.domains == ["cpu"]
    assert engine.log_path(job.id).read_text() == "hello\noops\n"
    timeline = [e["status"] for e in await engine.events_of(job.id)]
    assert timeline == ["pending", "running", "completed"]


async def test_nonzero_exit_fails_with_code(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    job = await engine.submit({"shell": "exit 3"})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.FAILED
    assert done.termination_reason is TerminationReason.EXIT_CODE
    assert done.exit_code == 3
    assert done.message == "exited with code 3"


async def test_killed_by_signal_is_named(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    job = await engine.submit({"shell": "kill -KILL $$"})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.FAILED
    assert done.termination_reason is TerminationReason.SIGNAL
    assert done.exit_code == 137
    assert "SIGKILL" in done.message


async def test_launch_failures_fail_the_job_and_engine_carries_on(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    missing = await engine.submit({"command": ["no-such-program-xyz"]})
    assert missing.status is JobStatus.FAILED
    assert missing.termination_reason is TerminationReason.LAUNCH_FAILED
    assert "command not found" in missing.message and "no-such-program-xyz" in missing.message
    nodir = await engine.submit({"command": ["true"], "cwd": str(tmp_path / "nope")})
    assert nodir.termination_reason is TerminationReason.LAUNCH_FAILED
    assert "working directory does not exist" in nodir.message
    ok = await engine.submit({"command": ["true"]})
    assert (await engine.wait(ok.id, timeout=10)).status is JobStatus.COMPLETED


async def test_over_capacity_messages_are_terminal_and_kept(make_engine: EngineFactory) -> None:
    engine = await make_engine("1xH200-141GB,1xL4-24GB")
    too_many = await engine.submit({"command": ["true"], "gpus": 3})
    assert too_many.status is JobStatus.FAILED
    assert too_many.termination_reason is TerminationReason.OVER_CAPACITY
    assert too_many.message == "requested 3 GPUs, but this machine has 2"
    too_big = await engine.submit({"command": ["true"], "vram_gb": 200})
    assert too_big.message == "requested 200 GiB per GPU, but the largest GPU has 141 GiB"
    pinned = await engine.submit({"command": ["true"], "vram_gb": 40, "domain": "gpu1"})
    assert pinned.message == "requested 40 GiB per GPU, but gpu1 (Simulated L4) has 24 GiB"
    pair = await engine.submit({"command": ["true"], "gpus": 2, "vram_gb": 40})
    assert pair.message == "requested 2 GPUs with 40 GiB each, but only 1 GPU has that much"
    # With no cluster set up, the next step is said (tester h131).
    with pytest.raises(SpecError, match=r"none configured: \[clusters\.lab\] in config.toml"):
        await engine.submit({"shell": "true", "cluster": "lab"})
    # A request just over a size says as much ("requested 141 GiB ... has 141 GiB").
    just = await engine.submit({"command": ["true"], "vram_gb": 141.04})
    assert just.message == "requested 141.04 GiB per GPU, but the largest GPU has 141 GiB"
    hair = await engine.submit({"command": ["true"], "vram_gb": 24.001, "domain": "gpu1"})
    assert hair.message == "requested 24.001 GiB per GPU, but gpu1 (Simulated L4) has 24 GiB"
    closer = await engine.submit({"command": ["true"], "vram_gb": 24.0000001, "domain": "gpu1"})
    assert closer.message == (  # (it said "24 GiB" of both: tester h45)
        "requested 25,769,803,883 bytes per GPU, but gpu1 (Simulated L4) has 25,769,803,776 bytes"
    )
    # the rows stay in history with their status and message
    listed = {j.id: j for j in await engine.list_jobs()}
    assert listed[too_many.id].status is JobStatus.FAILED
    assert listed[too_many.id].message == too_many.message
    stored = await engine.events_of(too_big.id)
    assert [e["status"] for e in stored] == ["pending", "failed"]
    assert stored[-1]["reason"] == "over_capacity"


async def test_no_driver_means_gpu_jobs_are_over_capacity(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    import pynvml

    from gpulayer_tui.engine.nvml import NvmlProbe

    fake_nvml.fail("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    engine = await make_engine(probe=NvmlProbe())
    assert engine.scheduler.gpu_domains == []
    assert engine.no_gpu_notice and "No NVIDIA driver" in engine.no_gpu_notice
    job = await engine.submit({"command": ["true"], "gpus": 1})
    assert job.status is JobStatus.FAILED
    assert job.message.startswith("requested 1 GPU, but this machine has no GPUs")
    cpu = await engine.submit({"command": ["true"]})
    assert (await engine.wait(cpu.id, timeout=10)).status is JobStatus.COMPLETED


async def test_jobs_wait_for_the_gpus_a_machine_had_when_its_driver_is_gone(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # An engine started without the driver (a driver upgrade not loaded until a reboot)
    # failed every queued GPU job for good: "this machine has no GPUs" (tester h140).
    import pynvml

    from gpulayer_tui.engine.nvml import NvmlProbe

    first = await make_engine(probe=NvmlProbe())
    await first.pause()
    one = await first.submit({"command": ["true"], "gpus": 1})
    pinned = await first.submit({"command": ["true"], "domain": "gpu1"})
    big = await first.submit({"command": ["true"], "gpus": 1, "vram_gb": 70})
    await first.stop()

    fake_nvml.fail("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    second = await make_engine(probe=NvmlProbe())
    assert second.scheduler.gpu_domains == []
    for job in (one, pinned, big):
        waiting = await second.get(job.id)
        assert waiting.status is JobStatus.QUEUED, waiting.message
    assert (await second.get(one.id)).message.startswith(
        "waiting for the GPUs of gpu0, gpu1: not found by the driver (0 here, 2 missing;"
    )
    assert "GPU 1 (gpu1)" in (await second.get(pinned.id)).message
    # Past what it had: no wait.
    three = await second.submit({"command": ["true"], "gpus": 3})
    assert three.status is JobStatus.FAILED
    assert three.message.startswith("requested 3 GPUs, but this machine has no GPUs")
    huge = await second.submit({"command": ["true"], "gpus": 1, "vram_gb": 90})
    assert huge.status is JobStatus.FAILED, huge.message
    await second.stop()

    fake_nvml.clear_failures()
    third = await make_engine(probe=NvmlProbe())
    await third.resume()
    for job in (one, pinned, big):
        assert (await third.wait(job.id, timeout=10)).status is JobStatus.COMPLETED


async def test_capacity_unknown_keeps_job_queued_then_runs(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    import pynvml

    from gpulayer_tui.engine.nvml import NvmlProbe

    engine = await make_engine(probe=NvmlProbe())
    assert len(engine.scheduler.gpu_domains) == 2
    fake_nvml.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
    await engine.sampler.sample_once()
    job = await engine.submit({"command": ["true"], "gpus": 2, "vram_gb": 1})
    assert job.status is JobStatus.QUEUED
    assert job.message.startswith("GPU capacity unknown")
    fake_nvml.clear_failures()
    await engine.sampler.sample_once()
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.COMPLETED


async def test_queued_reasons_name_the_blocker(make_engine: EngineFactory) -> None:
    engine = await make_engine("3xA100-80GB")
    first = await engine.submit(
        {"kind": "service", "command": ["sleep", "30"], "gpus": 1, "port": False}
    )
    second = await engine.submit({"command": ["sleep", "30"], "gpus": 1})
    # (a service with a timeout ends by then: "runs until stopped" was said of it: h158)
    timed = await engine.submit(
        {"kind": "service", "command": ["sleep", "30"], "gpus": 1, "port": False, "timeout": 60}
    )
    third = await engine.submit({"command": ["true"], "gpus": 1})
    assert first.status is JobStatus.RUNNING and second.status is JobStatus.RUNNING
    assert third.status is JobStatus.QUEUED
    assert third.message == ("all 3 GPU slots busy")
    # `why` names who holds them (the row does not: it would change at each job end).
    why = await engine.why(third.id)
    assert why["held_by"] == [
        {"domain": "gpu0", "jobs": [first.id], "services": [first.id]},
        {"domain": "gpu1", "jobs": [second.id], "services": []},
        {"domain": "gpu2", "jobs": [timed.id], "services": []},
    ]
    # (a service holds its GPU until stopped: the wait has no end of its own: tester h47)
    assert (
        f"  held by     gpu0: job {first.id} (a service: runs until stopped); gpu1: job {second.id}"
        f"; gpu2: job {timed.id}"
    ) in why_lines(why)
    # (and it is reserved for, ending by its timeout)
    assert why["reservation"] and why["reservation"]["domains"] == ["gpu2"], why["reservation"]
    dependent = await engine.submit({"command": ["true"], "depends_on": [third.id]})
    assert dependent.message == f"waiting for job {third.id}"
    assert (await engine.why(dependent.id))["held_by"] == []  # (it waits for a job)
    await engine.cancel(first.id)
    await engine.cancel(second.id)
    await engine.cancel(timed.id)
    assert (await engine.wait(third.id, timeout=10)).status is JobStatus.COMPLETED


async def test_why_names_no_holder_where_there_is_room(make_engine: EngineFactory) -> None:
    # Paused, a 3-GPU service was told "held by gpu3: job 57" with gpu0-2 free (h86).
    engine = await make_engine("4xA100-80GB")
    busy = await engine.submit({"command": ["sleep", "30"], "gpus": 1, "domain": "gpu3"})
    await engine.pause()
    svc = await engine.submit(
        {"kind": "service", "command": ["sleep", "30"], "gpus": 1, "replicas": 3, "port": False}
    )
    assert svc.status is JobStatus.QUEUED
    assert (await engine.why(svc.id))["held_by"] == []
    # Four replicas need gpu3 too: its holder is named.
    await engine.edit(svc.id, {"replicas": 4})
    held = (await engine.why(svc.id))["held_by"]
    assert held == [{"domain": "gpu3", "jobs": [busy.id], "services": []}], held
    await engine.cancel(svc.id)
    await engine.cancel(busy.id)


async def test_why_names_no_holder_of_a_gpu_too_small_for_the_job(
    make_engine: EngineFactory,
) -> None:
    # "held by g0: job 32; g1: job 33; g2: job 10; g3: job 14" of a 2 x 30 GiB job, g2 and
    # g3 24 GiB cards it can never use (tester h129).
    engine = await make_engine("2xA100-80GB,2xL4-24GB")
    busy = [
        await engine.submit({"command": ["sleep", "30"], "gpus": 1, "domain": f"gpu{n}"})
        for n in range(4)
    ]
    big = await engine.submit({"command": ["true"], "gpus": 2, "vram_gb": 30})
    assert big.status is JobStatus.QUEUED, big.message
    held = (await engine.why(big.id))["held_by"]
    assert [h["domain"] for h in held] == ["gpu0", "gpu1"], held
    for job in (big, *busy):
        await engine.cancel(job.id)


async def test_why_names_who_holds_the_cpu_slots_a_service_waits_for(
    make_engine: EngineFactory,
) -> None:
    # A 2-replica CPU service waiting with 1 of 2 slots free named no holder (the pool
    # was not full), while a GPU wait did (tester h58).
    engine = await make_engine("1xA100-80GB", cpu_count=2)
    one = await engine.submit({"command": ["sleep", "30"], "gpus": 0})
    svc = await engine.submit(
        {"kind": "service", "command": ["sleep", "30"], "replicas": 2, "port": False}
    )
    assert svc.status is JobStatus.QUEUED, svc.message
    why = await engine.why(svc.id)
    assert why["held_by"] == [{"domain": "cpu", "jobs": [one.id], "services": []}], why
    await engine.cancel(one.id)
    await engine.cancel(svc.id)


async def test_vram_blocker_names_the_foreign_pid(make_engine: EngineFactory, sleeper: int) -> None:
    engine = await make_engine("2xA100-80GB")
    SimLedger(engine.paths.state_dir).hold(1, sleeper, 70.0)
    await engine.sampler.sample_once()
    gpus = engine.gpus()
    gpu1 = gpus["domains"][1]
    assert gpu1["vram"]["unregistered"] == 70 * 1024**3
    assert gpus["unregistered_total"] == 70 * 1024**3
    assert gpu1["processes"][0]["pid"] == sleeper
    assert gpu1["processes"][0]["job_id"] is None
    assert "sleep" in gpu1["processes"][0]["command"]
    job = await engine.submit({"command": ["sleep", "30"], "vram_gb": 20, "domain": "gpu1"})
    assert job.status is JobStatus.QUEUED
    assert job.message.startswith(f"waiting for gpu1: 70.0 GiB held by pid {sleeper} (sleep 600")
    assert job.message.endswith("needs 20.0 GiB, 10.0 GiB free")
    # an unpinned job goes to the GPU with room
    other = await engine.submit({"command": ["sleep", "30"], "vram_gb": 20})
    assert other.status is JobStatus.RUNNING and other.domains == ["gpu0"]
    # the foreign process exits: its memory frees, the queued job starts
    os.kill(sleeper, signal.SIGKILL)
    await eventually(lambda: pid_gone(sleeper))
    await engine.sampler.sample_once()
    await eventually(lambda: _status_is(engine, job.id, JobStatus.RUNNING))
    await engine.cancel(job.id)
    await engine.cancel(other.id)


async def _status_is(engine: object, job_id: int, status: JobStatus) -> bool:
    return (await engine.get(job_id)).status is status


async def test_owned_memory_is_not_unregistered(make_engine: EngineFactory) -> None:
    engine = await make_engine("1xA100-80GB")
    job = await engine.submit({"shell": "sleep 30 & wait", "gpus": 1, "vram_gb": 10})
    assert job.status is JobStatus.RUNNING and job.pid
    child = await eventually(lambda: _child_of(job.pid or 0))
    SimLedger(engine.paths.state_dir).hold(0, child, 25.0)
    await engine.sampler.sample_once()
    vram = engine.gpus()["domains"][0]["vram"]
    assert vram["owned"] == 25 * 1024**3
    assert vram["unregistered"] == 0
    # reservation = max(declared 10, held 25): nothing extra reserved beyond what is held
    assert vram["reserved_extra"] == 0
    assert vram["free"] == 55 * 1024**3
    assert engine.gpus()["domains"][0]["processes"][0]["job_id"] == job.id


def _child_of(pid: int) -> int | None:
    children = psutil.Process(pid).children()
    return children[0].pid if children else None


async def test_multi_gpu_holds_are_all_or_nothing(make_engine: EngineFactory) -> None:
    engine = await make_engine("2xA100-80GB")
    blocker = await engine.submit({"command": ["sleep", "30"], "domain": "gpu0"})
    assert blocker.status is JobStatus.RUNNING
    pair = await engine.submit({"command": ["true"], "gpus": 2})
    assert pair.status is JobStatus.QUEUED
    assert pair.message == "needs 2 GPUs, 1 available now; gpu0 busy"
    # the waiting 2-GPU job holds nothing (gpu1 stays empty), but it reserves gpu0 and
    # gpu1 (issue 18): a later 1-GPU job with no time limit waits rather than starve it
    gpu1 = engine.scheduler.domains["gpu1"]
    assert gpu1.holdings == {}
    single = await engine.submit({"command": ["sleep", "30"], "gpus": 1})
    assert single.status is JobStatus.QUEUED
    assert single.message.startswith(f"waiting: gpu0, gpu1 reserved for job {pair.id} ")
    await engine.cancel(blocker.id)
    done = await engine.wait(pair.id, timeout=15)
    assert done.status is JobStatus.COMPLETED
    assert sorted(done.domains) == ["gpu0", "gpu1"] and sorted(done.gpus) == [0, 1]
    # the pair done, the single job runs
    await eventually(lambda: engine.book.get(single.id).job.status is JobStatus.RUNNING)  # type: ignore[union-attr]
    await engine.cancel(single.id)


async def test_gpu_env_is_set(make_engine: EngineFactory) -> None:
    engine = await make_engine("2xA100-80GB")
    job = await engine.submit(
        {
            "shell": 'echo "$CUDA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER|$GPULAYER_JOB_ID|$EXTRA"',
            "gpus": 2,
            "env": {"EXTRA": "x y"},
        }
    )
    await engine.wait(job.id, timeout=10)
    assert engine.log_path(job.id).read_text() == f"0,1|PCI_BUS_ID|{job.id}|x y\n"
    cpu = await engine.submit({"shell": 'echo "[$CUDA_VISIBLE_DEVICES]"'})
    await engine.wait(cpu.id, timeout=10)
    assert engine.log_path(cpu.id).read_text() == "[]\n"


async def test_a_multi_gpu_jobs_gpus_are_in_index_order(make_engine: EngineFactory) -> None:
    # The smallest GPU that fits comes first when choosing (here the L4, gpu1); the job
    # saw CUDA_VISIBLE_DEVICES=1,0 and its rank 0 on gpu1 (tester h84).
    engine = await make_engine("1xA100-80GB,1xL4-24GB")
    job = await engine.submit({"shell": 'echo "$CUDA_VISIBLE_DEVICES"', "gpus": 2, "vram_gb": 10})
    done = await engine.wait(job.id, timeout=10)
    assert engine.log_path(job.id).read_text() == "0,1\n"
    assert done.gpus == [0, 1] and done.domains == ["gpu0", "gpu1"]


async def test_a_job_gets_its_submitters_environment_never_the_engines(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Every job got the engine's whole environment under its spec's: its PYTHONPATH, its
    # virtualenv, what its service unit set; with `--no-inherit-env` too.
    import pwd

    monkeypatch.setenv("ENGINE_ONLY", "from-the-engine")
    engine = await make_engine()
    dump = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
    bare = await engine.submit({"command": dump})
    given = await engine.submit({"command": dump, "env": {"A": "1", "PATH": "/opt/x:/usr/bin"}})
    # $PWD is where it runs, not the submitting shell's (a plain command read the shell's
    # PWD, a shell line sh's: tester h126).
    there = tmp_path / "dir with space"
    there.mkdir()
    moved = await engine.submit({"command": dump, "cwd": str(there), "env": {"PWD": "/elsewhere"}})
    seen = {}
    for job in (bare, given, moved):
        await engine.wait(job.id, timeout=20)
        seen[job.id] = json.loads(engine.log_path(job.id).read_text())
    me = pwd.getpwuid(os.geteuid())
    own = {"GPULAYER_JOB_ID", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPULAYER_TASK", "PWD"}
    basics = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PYTHONUNBUFFERED"}
    assert set(seen[bare.id]) - {"LC_CTYPE"} == basics | own  # (Python may set LC_CTYPE)
    assert seen[bare.id]["HOME"] == me.pw_dir and seen[bare.id]["USER"] == me.pw_name
    assert "/usr/bin" in seen[bare.id]["PATH"].split(":")
    assert seen[given.id]["A"] == "1" and seen[given.id]["PATH"] == "/opt/x:/usr/bin"
    assert "ENGINE_ONLY" not in seen[given.id]
    assert seen[bare.id]["PWD"] == me.pw_dir and seen[moved.id]["PWD"] == str(there)


async def test_dependency_cascade_and_any_exit(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    gate = await engine.submit({"command": ["sleep", "30"]})
    strict = await engine.submit({"command": ["true"], "depends_on": [gate.id]})
    grandchild = await engine.submit({"command": ["true"], "depends_on": [strict.id]})
    lenient = await engine.submit(
        {"command": ["true"], "depends_on": [{"job": gate.id, "any_exit": True}]}
    )
    assert strict.status is JobStatus.QUEUED and lenient.status is JobStatus.QUEUED
    await engine.cancel(gate.id)
    strict_done = await engine.wait(strict.id, timeout=10)
    assert strict_done.status is JobStatus.CANCELLED
    assert strict_done.termination_reason is TerminationReason.DEPENDENCY_FAILED
    assert strict_done.message == f"dependency job {gate.id} cancelled"
    grand_done = await engine.wait(grandchild.id, timeout=10)
    assert grand_done.termination_reason is TerminationReason.DEPENDENCY_FAILED
    assert (await engine.wait(lenient.id, timeout=10)).status is JobStatus.COMPLETED
    # a dependency that already failed cancels a new dependent at once
    late = await engine.submit({"command": ["true"], "depends_on": [gate.id]})
    assert late.status is JobStatus.CANCELLED
    assert late.termination_reason is TerminationReason.DEPENDENCY_FAILED
    # and one that completed lets it run
    ok = await engine.submit({"command": ["true"], "depends_on": [lenient.id]})
    assert (await engine.wait(ok.id, timeout=10)).status is JobStatus.COMPLETED


async def test_jobs_of_one_request_wait_for_earlier_ones_by_their_place(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A pipeline in one request (a spec file's jobs): ids are given only as it is
    # admitted, so a job names an earlier one by its place, {"batch": K}.
    engine = await make_engine()
    gate = tmp_path / "gate"
    prep, train, broken, report, never = await engine.submit_many(
        [
            {"shell": f"while [ ! -e {gate} ]; do sleep 0.05; done"},
            {"command": ["true"], "depends_on": [{"batch": 0}, {"batch": 0}]},  # (one)
            {"command": ["false"], "depends_on": [{"batch": 1}]},
            {"command": ["true"], "depends_on": [{"batch": 2, "any_exit": True}]},
            {"command": ["true"], "depends_on": [{"batch": 2}]},
        ]
    )
    assert train.status is JobStatus.QUEUED and train.spec["depends_on"] == [
        {"job": prep.id, "any_exit": False}
    ]  # (stored by id: a restart waits for the same job)
    assert (await engine.get(report.id)).message == f"waiting for job {broken.id}"
    gate.touch()
    assert (await engine.wait(train.id, timeout=15)).status is JobStatus.COMPLETED
    assert (await engine.wait(broken.id, timeout=15)).status is JobStatus.FAILED
    assert (await engine.wait(report.id, timeout=15)).status is JobStatus.COMPLETED
    ended = await engine.wait(never.id, timeout=15)
    assert ended.termination_reason is TerminationReason.DEPENDENCY_FAILED
    done = await engine.get(prep.id)
    assert done.ended_at is not None
    started = (await engine.get(train.id)).started_at
    assert started is not None and started >= done.ended_at
    # Only earlier jobs of the same request; refused by place, nothing stored.
    before = len(await engine.list_jobs())
    for items, said in (
        ([{"command": ["true"], "depends_on": [{"batch": 0}]}], "may wait only for jobs before"),
        (
            [{"command": ["true"]}, {"command": ["true"], "depends_on": [{"batch": 1}]}],
            "job 2 of 2: depends_on.0: batch must name a job before it in the request, "
            "counted from 0 (job 1 is batch 0): 0 to 0, not 1",
        ),
        (
            [{"command": ["true"]}, {"command": ["true"], "depends_on": [{"batch": "0"}]}],
            'not "0"',
        ),
        (
            [
                {"kind": "service", "command": ["sleep", "60"], "port": False},
                {"command": ["true"], "depends_on": [{"batch": 0}]},
            ],
            "batch 0 is a service that restarts always: it never completes",
        ),
        (
            # (one of the two was kept: it was cancelled when batch 0 failed, h100)
            [
                {"command": ["false"]},
                {"command": ["true"], "depends_on": [{"batch": 0, "any_exit": True}, {"batch": 0}]},
            ],
            "job 2 of 2: depends_on.1: batch 0 is named twice, once to run whatever its "
            "outcome (any_exit) and once only if it completes",
        ),
        (
            [{"command": ["true"]}, {"command": ["true"], "depends_on": [{"batch": 0, "x": 1}]}],
            'is {"batch": K, "any_exit"?: true|false} (K: its place',
        ),
    ):
        with pytest.raises(SpecError, match=re.escape(said)):
            await engine.submit_many(items)
    assert len(await engine.list_jobs()) == before


async def test_cancel_kills_the_whole_process_group(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    job = await engine.submit({"shell": "sleep 300 & sleep 300 & wait"})
    assert job.pid
    children = await eventually(
        lambda: _children(job.pid or 0) if len(_children(job.pid or 0)) >= 1 else None
    )
    sub = engine.subscribe()
    await engine.cancel(job.id)
    stopping = await anext(e async for e in sub if e.kind.value == "job.reason")
    assert "SIGTERM sent, SIGKILL after 2 s" in stopping.data["message"]
    sub.close()
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.CANCELLED
    assert done.termination_reason is TerminationReason.CANCELLED
    for pid in children:
        await eventually(lambda pid=pid: pid_gone(pid))


def _children(pgid: int) -> list[int]:
    """Other members of the process group ``pgid``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != pgid and os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


async def test_cancel_escalates_to_sigkill_after_grace(make_engine: EngineFactory) -> None:
    engine = await make_engine(config=make_config(engine={"grace_period": 0.5}))
    job = await engine.submit(
        {
            "command": [
                "python3",
                "-c",
                "import signal, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\n"
                "time.sleep(300)",
            ]
        }
    )
    await eventually(
        lambda: engine.log_path(job.id).exists() and "ready" in engine.log_path(job.id).read_text()
    )
    await engine.cancel(job.id)
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.CANCELLED
    assert done.exit_code == 137
    # (it said only "cancelled by user")
    assert done.message == (
        "cancelled by user; SIGTERM did not end it: SIGKILL did, after the grace period"
    )


async def test_a_program_under_a_shell_gets_its_grace_period_when_the_shell_dies_first(
    make_engine: EngineFactory,
) -> None:
    # `sh -c 'server; echo after'`: the shell died of SIGTERM at once and the launcher
    # SIGKILLed the rest of its group with it, the program's shutdown cut short, under a
    # log saying "SIGKILL 10 s later if it still runs" (tester h185 #1). An ignoring one
    # is still SIGKILLed when the grace period ends.
    engine = await make_engine(config=make_config(engine={"grace_period": 20}))
    drains = (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    print('draining', flush=True); time.sleep(1); print('drained', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)"
    )
    job = await engine.submit({"shell": f"python3 -c {shlex.quote(drains)}; echo after"})
    log = engine.log_path(job.id)
    await eventually(lambda: log.exists() and "ready" in log.read_text())
    await engine.cancel(job.id)
    done = await engine.wait(job.id, timeout=15)  # (well inside the 20 s grace period)
    assert done.status is JobStatus.CANCELLED
    said = log.read_text()
    assert "draining" in said and "drained" in said, said
    assert "sent SIGKILL" not in said, said


async def test_a_program_under_a_shell_that_ignores_sigterm_is_killed_when_its_grace_ends(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(config=make_config(engine={"grace_period": 1}))
    ignores = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)"
    )
    job = await engine.submit({"shell": f"python3 -c {shlex.quote(ignores)}; echo after"})
    log = engine.log_path(job.id)
    await eventually(lambda: log.exists() and "ready" in log.read_text())
    running = await engine.get(job.id)
    assert running.pid is not None
    (program,) = _children(running.pid)
    await engine.cancel(job.id)
    done = await engine.wait(job.id, timeout=15)
    assert done.status is JobStatus.CANCELLED
    assert "sent SIGKILL (it still ran)" in log.read_text()
    await eventually(lambda: pid_gone(program))


async def test_a_stopped_job_is_continued_to_take_its_sigterm(make_engine: EngineFactory) -> None:
    # Stopped (ctrl+z, SIGSTOP), it never ran its SIGTERM handler: SIGKILLed after the
    # grace period and said to have outlived a SIGTERM it never saw (tester h171).
    engine = await make_engine(config=make_config(engine={"grace_period": 30}))
    job = await engine.submit(
        {
            "command": [
                "python3",
                "-c",
                "import signal, sys, time\n"
                "def bye(*_):\n"
                "    print('got TERM', flush=True)\n"
                "    sys.exit(7)\n"
                "signal.signal(signal.SIGTERM, bye)\n"
                "print('ready', flush=True)\n"
                "time.sleep(300)",
            ]
        }
    )
    log = engine.log_path(job.id)
    await eventually(lambda: log.exists() and "ready" in log.read_text())
    running = await engine.get(job.id)
    assert running.pid is not None
    os.killpg(running.pid, signal.SIGSTOP)
    await eventually(lambda: psutil.Process(running.pid).status() == psutil.STATUS_STOPPED)
    await engine.cancel(job.id)
    done = await engine.wait(job.id, timeout=20)  # (well inside the 30 s grace period)
    assert (done.status, done.exit_code) == (JobStatus.CANCELLED, 7)
    assert "got TERM" in log.read_text()
    assert done.message == "cancelled by user"


async def test_cancel_queued_and_finished_jobs(make_engine: EngineFactory) -> None:
    from gpulayer_tui.engine.engine import JobNotActive, UnknownJob

    engine = await make_engine("1xA100-80GB")
    running = await engine.submit({"command": ["sleep", "30"], "gpus": 1})
    queued = await engine.submit({"command": ["true"], "gpus": 1})
    cancelled = await engine.cancel(queued.id)
    assert cancelled.status is JobStatus.CANCELLED
    with pytest.raises(JobNotActive, match=f"job {queued.id} already cancelled"):
        await engine.cancel(queued.id)
    with pytest.raises(UnknownJob, match="no job 999"):
        await engine.cancel(999)
    await engine.cancel(running.id)


async def test_timeout_kills_and_fails(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    job = await engine.submit({"command": ["sleep", "30"], "timeout": 0.3})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.FAILED
    assert done.termination_reason is TerminationReason.TIMEOUT
    assert done.message == "timed out after 0.3 s"
    assert done.exit_code == 143
    # One that SIGTERM did not end says so, as a cancel does ("timed out after 2 s" alone,
    # exit 137: tester h126).
    await engine.stop()
    graced = await make_engine(config=make_config(engine={"grace_period": 0.5}))
    stubborn = await graced.submit(
        {"shell": "trap '' TERM; echo ready; while :; do sleep 0.05; done", "timeout": 1}
    )
    done = await graced.wait(stubborn.id, timeout=10)
    assert done.exit_code == 137
    assert done.message == (
        "timed out after 1 s; SIGTERM did not end it: SIGKILL did, after the grace period"
    )


async def test_a_timeout_shorter_than_the_start_is_still_a_timeout(
    make_engine: EngineFactory,
) -> None:
    # It may end the job before its process is even asked for: that is no launch failure.
    engine = await make_engine()
    for _ in range(5):
        job = await engine.submit({"command": ["sleep", "30"], "timeout": 1e-9})
        done = await engine.wait(job.id, timeout=10)
        assert done.status is JobStatus.FAILED
        assert done.termination_reason is TerminationReason.TIMEOUT, done.message
        assert done.message.startswith("timed out after 1e-09 s")


async def test_priority_then_fifo(make_engine: EngineFactory, tmp_path: Path) -> None:
    engine = await make_engine(cpu_count=1)
    order = tmp_path / "order"
    gate = await engine.submit({"command": ["sleep", "30"]})
    jobs = [
        await engine.submit({"shell": f"echo {name} >> {order}", "name": name, **extra})
        for name, extra in [("low", {}), ("high", {"priority": 5}), ("low2", {})]
    ]
    assert {job.status for job in jobs} == {JobStatus.QUEUED}
    assert jobs[0].message == "the only cpu slot is busy"
    await engine.cancel(gate.id)
    for job in jobs:
        await engine.wait(job.id, timeout=10)
    # One slot: each ran alone, so the file's lines are the order they ran in.
    assert order.read_text().split() == ["high", "low", "low2"]


async def test_exclusive_waits_for_an_empty_domain(make_engine: EngineFactory) -> None:
    config = make_config(domains={"shared": {"gpu": 0, "slots": 2}})
    engine = await make_engine("1xA100-80GB", config=config)
    first = await engine.submit({"command": ["sleep", "30"], "gpus": 1})
    bench = await engine.submit({"command": ["true"], "gpus": 1, "exclusive": True})
    assert bench.status is JobStatus.QUEUED
    assert (
        bench.message
        == f"waiting for shared: job {first.id} running (an exclusive job needs it empty)"
    )
    await engine.cancel(first.id)
    assert (await engine.wait(bench.id, timeout=10)).status is JobStatus.COMPLETED


async def test_a_job_pinned_to_a_reserved_domain_and_a_free_one_waits(
    make_engine: EngineFactory,
) -> None:
    # Its placement around the reservation left one domain, free, and no blocker: the
    # reason's text ended the submission with an IndexError.
    engine = await make_engine("2xA100-80GB")
    running = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    ahead = await engine.submit({"command": ["true"], "domain": "gpu1"})  # (gpu1 reserved)
    both = await engine.submit({"command": ["true"], "gpus": 2, "domain": ["gpu0", "gpu1"]})
    assert both.status is JobStatus.QUEUED
    await engine.cancel(running.id)
    assert (await engine.wait(ahead.id, timeout=10)).status is JobStatus.COMPLETED
    assert (await engine.wait(both.id, timeout=10)).status is JobStatus.COMPLETED


async def test_invalid_specs_change_nothing(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    bad = [
        ({}, "exactly one of 'command'"),
        ({"command": ["true"], "gpu": 1}, "unknown field 'gpu'"),
        ({"command": ["true"], "gpus": "2"}, "gpus"),
        ({"command": ["true"], "gpus": -1}, "gpus"),
        ({"command": ["true"], "domain": "gpu7"}, "unknown domain 'gpu7'"),
        ({"command": ["true"], "depends_on": [42]}, "depends_on: no job 42"),
        (
            {"command": ["true"], "depends_on": [7, {"job": 7, "any_exit": True}]},
            "depends_on: job 7 is named twice, once to run whatever its outcome",
        ),
        ({"command": ["true"], "cwd": "relative/dir"}, "not an absolute path"),
        ({"command": ["true"], "vram_gb": 0}, "vram_gb"),
        ({"command": ["true"], "vram_gb": 1e-300}, "vram_gb: must be at least 0.000976562 GiB"),
        ({"command": ["true"], "gpus": 0, "domain": "gpu0"}, "gpus is 0"),
        # More than Linux passes a program in all (ARG_MAX): it failed at launch only.
        ({"command": ["true", *["a" * 120_000] * 20]}, "command: the command and its env"),
        (
            {"command": ["true"], "env": {f"V{i}": "v" * 120_000 for i in range(20)}},
            "env: the command and its environment are",
        ),
        ("not an object", "must be a JSON object"),
    ]
    for spec, expected in bad:
        with pytest.raises(SpecError, match=expected.replace("(", r"\(")):
            await engine.submit(spec)
    with pytest.raises(SpecError, match="job 2 of 2"):
        await engine.submit_many([{"command": ["true"]}, {"command": []}])
    assert await engine.list_jobs() == []


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"cwd": "rel"}, "cwd", "cwd: 'rel' is not an absolute path"),
        ({"cwd": "/tmp\0"}, "cwd", "cwd contains a NUL byte"),
        ({"env": {"A=B": "x"}}, "env", "env: 'A=B' is not a valid variable name"),
        ({"env": {"A": "x\0"}}, "env", "env[A] contains a NUL byte"),
        ({"domain": []}, "domain", "domain: an empty list pins to nothing; omit it instead"),
        ({"shell": "true"}, "command", "command: give exactly one of 'command'"),
        ({"replicas": 2}, "replicas", "replicas: only services have this"),
        # (pydantic's words: "a valid dictionary or instance of RetrySpec", "a valid boolean")
        ({"kind": "service", "retry": 3}, "retry", 'retry: must be an object such as {"max'),
        ({"kind": "service", "port": 70000}, "port", "port: must be true (each replica gets"),
        ({"requeue": False}, "requeue", "requeue: only a preemptible job is requeued"),
        # ("mem_gb: cpus, mem_gb: only cluster jobs have these": named twice, and the other)
        ({"mem_gb": 3}, "mem_gb", "mem_gb: only cluster jobs have this (set cluster)"),
        # Linux passes no string this long to a program: it could only fail at launch.
        ({"env": {"A": "x" * 200_000}}, "env", "env[A]: 200002 bytes; Linux passes no"),
        # (a long name is cut in the message: a 1 MB name was echoed whole)
        ({"env": {"A" * 1_000_000: "x"}}, "env", f"env[{'A' * 100}...]: 1000002 bytes"),
        ({"command": ["true", "y" * 131_072]}, "command", "command: 131072 bytes; Linux"),
        # Fields of two types were told why the value is neither, in pydantic's words
        # ("snapshot.bool: Input should be a valid boolean; snapshot.SnapshotInfo: ...").
        ({"snapshot": "yes"}, "snapshot", "snapshot: must be true (run a copy of cwd"),
        ({"snapshot": {"path": "/x"}}, "snapshot", "snapshot: must be true (run a copy"),
        ({"snapshot": {"dir": "/etc"}}, "snapshot", "snapshot: must be true (run a copy"),
        ({"domain": 5}, "domain", "domain: must be a domain's name or a list of names"),
        ({"domain": ["gpu0", 1]}, "domain", "domain: must be a domain's name or a list"),
        # Types in the words of the rest (pydantic's "Input should be a valid integer":
        # tester h86).
        ({"gpus": True}, "gpus", "gpus: must be a whole number, not true"),
        ({"gpus": 1.5}, "gpus", "gpus: must be a whole number, not 1.5"),
        ({"name": 5}, "name", "name: must be text, not 5"),
        ({"exclusive": "maybe"}, "exclusive", 'exclusive: must be true or false, not "maybe"'),
    ],
)
def test_a_whole_spec_problem_names_its_field(
    spec: dict[str, object], field: str, message: str
) -> None:
    # These said what was wrong but named no field: an API client got no "field".
    with pytest.raises(SpecError) as refused:
        parse_spec({"command": ["true"], **spec})
    assert refused.value.field == field
    assert str(refused.value).startswith(message)


def test_an_environment_is_judged_by_its_contents_whichever_came_before() -> None:
    # A batch's shared environment is checked once, not once per job (two fifths of a
    # 500-line batch's admission): the verdict kept is for equal contents only.
    shell = {f"VAR{n}": "v" * 50 for n in range(60)}
    parse_spec({"command": ["true"], "env": shell})
    parse_spec({"command": ["true"], "env": dict(shell)})  # equal, another dict: known good
    for bad, message in [
        ({**shell, "VAR7": "x\0"}, "env[VAR7] contains a NUL byte"),
        ({**shell, "A=B": "x"}, "env: 'A=B' is not a valid variable name"),
        ({**shell, "BIG": "x" * 200_000}, "env[BIG]: 200004 bytes; Linux passes no"),
    ]:
        with pytest.raises(SpecError, match=re.escape(message)):
            parse_spec({"command": ["true"], "env": bad})
        parse_spec({"command": ["true"], "env": shell})  # (and the good one stays good)
    # What the batch's environment costs a program's start is that environment's.
    from gpulayer_tui.engine.spec import env_exec_bytes, exec_bytes

    other = {"ONLY": "1"}
    assert env_exec_bytes(shell) == exec_bytes(f"{k}={v}" for k, v in shell.items())
    assert env_exec_bytes(other) == len("ONLY=1") + 1 + 8


async def test_only_the_engine_names_the_job_a_job_restarts(make_engine: EngineFactory) -> None:
    # A submission could set restart_of: `status` then said "restart of job 1" of a job
    # that never was one (and `submit --like` of a restarted job copied its lineage).
    engine = await make_engine()
    first = await engine.submit({"command": ["true"]})

    async def ended(job_id: int) -> bool:
        return (await engine.get(job_id)).status.is_terminal

    await eventually(lambda: ended(first.id))
    with pytest.raises(SpecError, match=r"restart_of: the engine sets it") as refused:
        await engine.submit({"command": ["true"], "restart_of": first.id})
    assert refused.value.field == "restart_of"
    again = await engine.restart(first.id)
    assert again.spec["restart_of"] == first.id
    # Its spec, lineage included, still loads (a restore, a requeue, a restart of it).
    assert parse_spec(again.spec).restart_of == first.id
    await eventually(lambda: ended(again.id))
    assert (await engine.restart(again.id)).spec["restart_of"] == again.id
    assert len(await engine.list_jobs()) == 3


async def test_a_chain_cancelled_by_its_first_job_restarts_as_a_chain(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Restarting the dependent made a job cancelled at once ("dependency job 1
    # cancelled"), a new id spent, even after the failed job itself was restarted: a
    # chain could never be run again (tester h44).
    engine = await make_engine()
    await engine.pause()
    fixed_yet = tmp_path / "fixed"
    first = await engine.submit({"shell": f"test -e {fixed_yet}", "gpus": 0})
    second = await engine.submit({"shell": "echo second", "gpus": 0, "depends_on": [first.id]})
    anyway = await engine.submit(
        {"command": ["true"], "gpus": 0, "depends_on": [{"job": first.id, "any_exit": True}]}
    )
    await engine.resume()
    assert (await engine.wait(second.id, timeout=10)).status is JobStatus.CANCELLED
    assert (await engine.wait(anyway.id, timeout=10)).status is JobStatus.COMPLETED
    listed = len(await engine.list_jobs())
    with pytest.raises(SpecError, match=rf"job {second.id} waited for job {first.id}, which "
                       r"ended failed: its restart would be cancelled at once \(restart job "
                       rf"{first.id} first") as refused:  # fmt: skip
        await engine.restart(second.id)
    assert refused.value.field == "depends_on"
    assert len(await engine.list_jobs()) == listed  # no id spent
    # Restarted, the first job fails again: its restart is the one named.
    first_again = await engine.restart(first.id)
    await engine.wait(first_again.id, timeout=10)
    with pytest.raises(SpecError, match=rf"whose newest restart, job {first_again.id}, ended"):
        await engine.restart(second.id)
    # Fixed, and restarted once more: the dependent's restart waits for that one.
    fixed_yet.touch()
    await engine.pause()
    fixed = await engine.restart(first_again.id)
    second_again = await engine.restart(second.id)
    assert second_again.spec["depends_on"] == [fixed.id]
    # An any-exit dependency keeps its job: it had its end.
    assert (await engine.restart(anyway.id)).spec["depends_on"] == [
        {"job": first.id, "any_exit": True}
    ]
    await engine.resume()
    assert (await engine.wait(fixed.id, timeout=10)).status is JobStatus.COMPLETED
    assert (await engine.wait(second_again.id, timeout=10)).status is JobStatus.COMPLETED
    assert engine.log_path(second_again.id).read_text() == "second\n"


async def test_restarting_a_job_whose_adopted_dependency_died_does_not_say_restart_it(
    make_engine: EngineFactory, sleepers: Any
) -> None:
    # "restart job 10 first" of an adopted process, which is never run again (h51).
    from gpulayer_tui.wire import parse_adopt_request

    engine = await make_engine()
    proc = sleepers()
    adopted = await engine.adopt(parse_adopt_request({"pid": proc.pid}))
    after = await engine.submit({"command": ["true"], "gpus": 0, "depends_on": [adopted.id]})
    proc.kill()
    assert (await engine.wait(adopted.id, timeout=20)).status is JobStatus.ORPHANED
    assert (await engine.wait(after.id, timeout=10)).status is JobStatus.CANCELLED
    with pytest.raises(SpecError, match="ended orphaned: its restart would be cancelled") as no:
        await engine.restart(after.id)
    assert "restart job" not in str(no.value) and f"submit --like {after.id}" in str(no.value)


async def test_waiting_for_a_service_that_restarts_always_to_complete_is_refused(
    make_engine: EngineFactory,
) -> None:
    # It never completes: the dependent waited until the service was stopped, then was
    # cancelled (tester h47). --after-any, or a service that may end by itself, is fine.
    engine = await make_engine()
    service = {"kind": "service", "command": ["sleep", "600"], "gpus": 0, "port": False}
    always = await engine.submit(service)
    once = await engine.submit({**service, "restart": "on_failure"})
    before = len(await engine.list_jobs())
    with pytest.raises(SpecError, match=f"job {always.id} is a service that restarts always"):
        await engine.submit({"command": ["true"], "gpus": 0, "depends_on": [always.id]})
    assert len(await engine.list_jobs()) == before  # (nothing stored)
    anyway = {"job": always.id, "any_exit": True}
    ok = await engine.submit({"command": ["true"], "gpus": 0, "depends_on": [anyway, once.id]})
    with pytest.raises(SpecError, match="restarts always: it never completes"):
        await engine.edit(ok.id, {"depends_on": [always.id]})
    await engine.cancel(always.id)
    await engine.cancel(once.id)


async def test_a_dependency_named_twice_alike_is_one(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    gate = await engine.submit({"command": ["sleep", "30"]})
    job = await engine.submit({"command": ["true"], "depends_on": [gate.id, {"job": gate.id}]})
    assert job.spec["depends_on"] == [gate.id]
    await engine.cancel(job.id)
    await engine.cancel(gate.id)


async def test_batch_submit_drains(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    jobs = await engine.submit_many([{"command": ["true"]} for _ in range(50)])
    assert [j.id for j in jobs] == list(range(1, 51))
    for job in jobs:
        assert (await engine.wait(job.id, timeout=20)).status is JobStatus.COMPLETED
    counts = await engine.store.count_by_status()
    assert counts == {"completed": 50}


async def test_a_job_killed_by_a_signal_leaves_nothing_of_itself_running(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    pidfile = tmp_path / "child.pid"
    # The job runs without a shell of ours: its pid is the command's own.
    job = await engine.submit({"shell": f"sleep 300 & echo $! > {pidfile}; wait", "gpus": 1})
    # Non-empty, not just there: the shell creates the file before `echo` writes to it.
    await eventually(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    assert psutil.Process(job.pid).name() == "sh"
    child = int(pidfile.read_text())
    os.kill(job.pid, signal.SIGKILL)
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.FAILED and done.exit_code == 137
    assert done.termination_reason is TerminationReason.SIGNAL
    await eventually(lambda: pid_gone(child))  # the GPU slot is not given away to it


async def test_background_children_do_not_outlive_their_job(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    pidfile = tmp_path / "bg.pid"
    job = await engine.submit({"shell": f"sleep 300 & echo $! > {pidfile}; exit 0"})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.COMPLETED
    await eventually(lambda: pidfile.exists() and pid_gone(int(pidfile.read_text())))


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ({"shell": "exec python3 -m http.server $PORT"}, "http.server"),
        ({"shell": "FOO=1 env BAR=2 nohup ./train.sh --lr 3"}, "train.sh"),
        (
            {"shell": "nice -n 10 time -p /opt/venv/bin/python -u -m torch.distributed.run"},
            "torch.distributed.run",
        ),
        ({"shell": "sudo -u ana -E nohup python3 train.py"}, "train.py"),
        ({"shell": "env -u DISPLAY CUDA_VISIBLE_DEVICES=0 ./serve --port $PORT"}, "serve"),
        ({"shell": "exec /usr/bin/time -f %e nice -5 ionice -c 3 ./bench"}, "bench"),
        ({"shell": "python3 -c 'print(1)' -m x"}, "python3"),
        ({"shell": "exec"}, "shell"),
        # A wrapper that runs nothing is the program (it was "shell": tester h83).
        ({"shell": "env | grep FOO; pwd"}, "env"),
        ({"command": ["/usr/bin/env"]}, "env"),
        ({"shell": "nice -n 5"}, "nice"),
        ({"command": ["/usr/bin/env", "python3", "-m", "http.server", "8000"]}, "http.server"),
        ({"command": ["nohup", "/usr/bin/python3", "x.py"]}, "x.py"),
        ({"command": ["A=1"]}, "A=1"),
        ({"shell": "  exec  "}, "shell"),
        ({"command": ["/usr/bin/python3", "x.py"]}, "x.py"),
        # A sweep's jobs were all "python" (tester h69): an interpreter or a launcher is
        # named by its script, past its own options (those with a value too).
        ({"command": ["python3", "-u", "-W", "ignore", "sweep/train.py", "--lr", "3"]}, "train.py"),
        ({"shell": "python3.11 -E eval.py"}, "eval.py"),
        ({"shell": "uv run torchrun --nproc_per_node 8 sft.py"}, "sft.py"),
        ({"shell": "accelerate launch --config_file cfg.yaml finetune.py"}, "finetune.py"),
        ({"shell": "conda run -n lab python -m pkg.main"}, "pkg.main"),
        ({"shell": "mpirun -np 4 ./a.out"}, "a.out"),
        ({"shell": "bash -e run.sh"}, "run.sh"),
        ({"shell": "bash -c 'echo hi'"}, "bash"),
        ({"shell": "node -e 1"}, "node"),
        ({"shell": "uv run serve"}, "uv"),
        ({"shell": "python3 -"}, "python3"),
        # A shell line is split as sh splits it, up to its first operator (on spaces,
        # `python3 "my script.py"` was named `"my`: tester h73).
        ({"shell": 'FOO=1 BAR="a b" python3 train.py --x'}, "train.py"),
        ({"shell": 'python3 "my script.py"'}, "my script.py"),
        ({"shell": "python3 train.py; python3 eval.py"}, "train.py"),
        ({"shell": "python3 'ü 日本.py' > log"}, "ü 日本.py"),
        ({"shell": "bash -lc 'echo hi'"}, "bash"),
        ({"shell": "python3 -mpkg"}, "pkg"),
        ({"shell": "python3 -X dev -m torch.distributed.run --nproc_per_node 8 sft.py"}, "sft.py"),
        ({"shell": "timeout -s KILL 10 python3 train.py"}, "train.py"),
        ({"shell": "srun python train.py"}, "train.py"),
        ({"command": ["python3", "train.py/"]}, "train.py"),
        ({"command": ["./a\x1b[2Jb"]}, "a\\x1b[2Jb"),
    ],
)
def test_a_default_name_is_the_program_a_job_runs(spec: dict[str, Any], name: str) -> None:
    from gpulayer_tui.engine.spec import parse_spec

    assert parse_spec(spec).default_name() == name


async def test_a_python_jobs_prints_reach_its_log_as_they_happen_and_survive_a_cancel(
    make_engine: EngineFactory,
) -> None:
    # Its output is a file: Python kept prints in an 8 KiB buffer, `logs -f` showed
    # nothing, and a cancel (SIGTERM: no flush) lost all of it (tester h69).
    engine = await make_engine()
    script = "import time\nprint('epoch 1')\ntime.sleep(60)"
    job = await engine.submit({"command": [sys.executable, "-c", script], "gpus": 0, "env": {}})
    log = engine.log_path(job.id)
    await eventually(lambda: log.exists() and "epoch 1" in log.read_text(), timeout=20)
    await engine.cancel(job.id)
    assert (await engine.wait(job.id, timeout=20)).status is JobStatus.CANCELLED
    assert "epoch 1" in log.read_text()
    # Asked for (an empty PYTHONUNBUFFERED in its spec), the buffer is Python's again.
    buffered = await engine.submit(
        {"command": [sys.executable, "-c", script], "gpus": 0, "env": {"PYTHONUNBUFFERED": ""}}
    )

    async def pid() -> int | None:
        return (await engine.get(buffered.id)).pid

    running = await eventually(pid, timeout=20)
    # (read once its exec is done: until then /proc may show no environment yet)
    environ = await eventually(lambda: psutil.Process(running).environ(), timeout=20)
    assert environ.get("PYTHONUNBUFFERED") == ""
    await engine.cancel(buffered.id)


async def test_a_stopped_jobs_log_says_where_and_when_it_was_stopped(
    make_engine: EngineFactory,
) -> None:
    # A cancelled or timed-out run's log just ended: no word of why (tester h69).
    engine = await make_engine()
    script = "print('step 1', flush=True); import time; time.sleep(60)"
    job = await engine.submit({"command": [sys.executable, "-c", script], "gpus": 0})
    log = engine.log_path(job.id)
    await eventually(lambda: log.exists() and "step 1" in log.read_text(), timeout=20)
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=20)
    lines = log.read_text().splitlines()
    assert lines[0] == "step 1"
    said = "--- gpulayer-tui sent SIGTERM (SIGKILL 2 s later if it still runs) at "
    assert lines[1].startswith(said)
    assert lines[1].endswith(" ---") and len(lines) == 2
    # One that ignores SIGTERM: its SIGKILL is said too (it was in the timeline only:
    # tester h127).
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    stubborn = await engine.submit({"command": [sys.executable, "-c", script], "gpus": 0})
    log = engine.log_path(stubborn.id)
    await eventually(lambda: log.exists() and "up" in log.read_text(), timeout=20)
    await engine.cancel(stubborn.id)
    await engine.wait(stubborn.id, timeout=20)
    lines = log.read_text().splitlines()
    assert lines[1].startswith(said)
    assert lines[2].startswith("--- gpulayer-tui sent SIGKILL (it still ran) at ")
    assert len(lines) == 3


async def test_a_batchs_jobs_share_one_environment_while_they_wait(
    make_engine: EngineFactory,
) -> None:
    # Each waiting job kept a copy of the shell environment a batch sent once (and its
    # validated spec another): a queue of 20,000 held hundreds of MB (tester h76).
    engine = await make_engine()
    shell = {f"VAR{n}": "v" * 50 for n in range(60)}
    items: list[dict[str, Any]] = [
        {"command": ["sleep", "600"], "gpus": 0, "env": dict(shell)} for _ in range(4)
    ]
    items.append({"command": ["sleep", "600"], "gpus": 0, "env": {**shell, "OWN": "1"}})
    jobs = await engine.submit_many(items)
    acts = [engine.book.get(job.id) for job in jobs]
    first = acts[0].job.spec["env"]
    assert first == shell
    for act in acts[1:4]:
        assert act.job.spec["env"] is first and act.spec.env is first
    assert acts[4].job.spec["env"] == {**shell, "OWN": "1"}  # (its own stays its own)
    assert acts[4].job.spec["env"] is not first
    # The CPU pool forgets the jobs that left it (it kept every one, for good).
    for job in jobs:
        await engine.cancel(job.id)
    for job in jobs:
        await engine.wait(job.id, timeout=10)
    assert engine.scheduler.domains["cpu"]._left == set()


async def test_a_timeline_entry_learnt_late_is_listed_when_it_happened(
    make_engine: EngineFactory,
) -> None:
    # An end learnt late (a replica killed while no engine ran) is stamped when it
    # happened: the timeline listed it after later entries ("09:27:54 scaled down ...
    # replica 2 ended", then "09:27:48 replica 1 stopped"; tester h121).
    from gpulayer_tui.engine.models import EventKind

    engine = await make_engine()
    job = await engine.submit({"command": ["sleep", "600"]})
    act = engine.book.get(job.id)
    assert act is not None and job.started_at is not None
    first = (await engine.events_of(job.id))[0]
    assert first["status"] == "pending"
    late = first["at"]  # (before its start)
    for queued in (True, False):  # (read while still queued for commit, then stored)
        engine.book.record(act, EventKind.REPLICA, {"message": f"late {queued}"}, at=late)
        if not queued:
            await engine.store.flush()
        messages = [e["message"] for e in await engine.events_of(job.id)]
        ats = [e["at"] for e in await engine.events_of(job.id)]
        assert ats == sorted(ats), messages
    statuses = [e["status"] for e in await engine.events_of(job.id)]
    assert statuses[:3] == ["pending", None, None] and "running" in statuses[3:]
    assert messages[1:3] == ["late True", "late False"]  # (same time: as stored)
    await engine.cancel(job.id)
