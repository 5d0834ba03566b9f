"""Adopting running processes (record 004), with real processes and a real engine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer_tui.engine import procs
from gpulayer_tui.engine.models import JobKind, JobStatus, TerminationReason
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.engine.spec import SpecError
from gpulayer_tui.engine.supervisor import Supervisor, _Watch
from gpulayer_tui.wire import FieldError

from .conftest import (
    REPO,
    EngineFactory,
    Served,
    adopt,
    eventually,
    make_config,
    pid_gone,
    wait_for,
)

GIB = 1024**3


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start foreign processes (not the engine's); all are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        # The whole group, even when its leader has already ended: a sibling left in it
        # keeps the group id from being reused, so this reaches only what the test started.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.kill()
        proc.wait()


def _zombie(spawned: list[subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], int]:
    """A process and its child, exited and not reaped (a zombie), by pid."""
    script = "import os, time\nchild = os.fork()\nif child == 0: os._exit(0)\n"
    script += "print(child, flush=True); time.sleep(600)"
    parent = subprocess.Popen(["python3", "-c", script], stdout=subprocess.PIPE)
    spawned.append(parent)
    assert parent.stdout is not None
    zombie = int(parent.stdout.readline())
    parent.stdout.close()
    wait_for(lambda: (stat := procs.read_stat(zombie)) is not None and stat.state == "Z")
    return parent, zombie


def start(
    spawned: list[subprocess.Popen[bytes]], *argv: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(list(argv), start_new_session=True, env=env)
    spawned.append(proc)
    # Popen returns as the exec closes its pipe, a moment before the kernel shows the new
    # command line: wait for it, as a user who found the process in a list would have.
    wait_for(lambda: not procs.read_cmdline(proc.pid).startswith("["))
    return proc


def unused_pid() -> int:
    """A pid no process has, just below the newest one: the kernel hands out pids upward,
    so it is not given again until the pids wrap around (32000, the old choice, was given
    to another test's process in CI, as the pids came round to it)."""
    probe = subprocess.Popen(["true"])
    probe.wait()
    pid = probe.pid - 1
    while pid > 300 and os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


async def test_adopted_process_runs_until_it_exits_then_is_orphaned(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    engine = await make_engine()
    proc = start(spawn, "sleep", "600")
    job = await adopt(engine, proc.pid, name="nohup-run")
    assert job.status is JobStatus.RUNNING and job.kind is JobKind.ADOPTED
    assert job.name == "nohup-run" and job.pid == proc.pid and job.domains == ["cpu"]
    assert job.spec["command"] == "sleep 600" and job.spec["start_ticks"] == procs.start_ticks(
        proc.pid
    )
    assert [e["status"] for e in await engine.events_of(job.id)] == ["pending", "running"]
    proc.kill()
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.ORPHANED
    assert done.termination_reason is TerminationReason.ADOPTED_EXIT_UNOBSERVED
    assert done.exit_code is None
    assert "cannot be observed" in done.message


async def test_a_process_adopted_before_the_next_sample_is_placed_on_its_gpu(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # Adopted within a sample of taking GPU memory, it was put on the cpu pool for good,
    # its memory "outside its GPUs" (tester h171): a sample is taken for the adoption.
    engine = await make_engine("2xA100-80GB", config=make_config(engine={"sample_interval": 60}))
    await engine.sampler.sample_once()
    proc = start(spawn, "sleep", "600")
    SimLedger(engine.paths.state_dir).hold(1, proc.pid, 20.0)  # (after the last sample)
    job = await adopt(engine, proc.pid, name="quick")
    assert job.status is JobStatus.RUNNING and job.domains == ["gpu1"], job.message


async def test_refusals_are_recorded_failed_jobs(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    engine = await make_engine()
    gone = await adopt(engine, unused_pid())
    assert gone.status is JobStatus.FAILED
    assert gone.termination_reason is TerminationReason.ADOPT_PID_GONE
    assert gone.message.startswith("refused to adopt: no process with pid")
    # A zombie is said as one (ps lists it: "it exited, or never was" read wrong: h184).
    parent, zombie = _zombie(spawn)
    dead = await adopt(engine, zombie)
    assert dead.termination_reason is TerminationReason.ADOPT_PID_GONE
    assert dead.message == (
        f"refused to adopt: pid {zombie} has exited (a zombie its parent, pid {parent.pid}, "
        "has not reaped yet)"
    )

    proc = start(spawn, "sleep", "600")
    ticks = procs.start_ticks(proc.pid)
    assert ticks is not None
    reused = await adopt(engine, proc.pid, start_ticks=ticks - 1)
    assert reused.termination_reason is TerminationReason.ADOPT_PID_MISMATCH
    assert "the pid was reused" in reused.message
    # (recorded as asked, not as found there: tester h116)
    assert reused.spec["start_ticks"] == ticks - 1

    stranger = await adopt(engine, proc.pid, requester_uid=os.getuid() + 4242)
    assert stranger.termination_reason is TerminationReason.ADOPT_UID_MISMATCH
    # refusals stay in history and nothing was signalled
    listed = {j.id: j.status for j in await engine.list_jobs()}
    assert listed == {
        gone.id: JobStatus.FAILED,
        dead.id: JobStatus.FAILED,
        reused.id: JobStatus.FAILED,
        stranger.id: JobStatus.FAILED,
    }
    assert proc.poll() is None


@pytest.mark.needs_root
async def test_process_of_another_user_is_refused(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start a process as another user")
    engine = await make_engine()
    proc = start(
        spawn, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "600"
    )
    await eventually(lambda: procs.read_real_uid(proc.pid) == 65534)
    # What the adopt dialog asks first says so (it offered the adoption: tester h80).
    info = engine.process_info(proc.pid)
    assert info is not None and "belongs to nobody" in info.get("refused", "")
    job = await adopt(engine, proc.pid)
    assert job.termination_reason is TerminationReason.ADOPT_UID_MISMATCH
    assert "belongs to nobody" in job.message
    # (as root: not "could neither watch nor stop it", which root could)
    assert job.message.endswith("an engine adopts only its own user's processes")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"pid": 0}, FieldError, "pid: must be a process id"),
        ({"pid": "12"}, FieldError, "pid: must be a whole number"),
        # (said as it was sent, not as Python writes it: "not True": tester h125)
        ({"pid": os.getpid(), "start_ticks": True}, FieldError, "must be a whole number, not true"),
        ({"pid": os.getpid(), "vram_gb": -1}, FieldError, "vram_gb: must be greater than 0"),
        ({"pid": os.getpid(), "vram_gb": 1e9}, FieldError, "vram_gb: must be at most"),
        ({"pid": os.getpid(), "domain": "gpu9"}, SpecError, "unknown domain 'gpu9'"),
        ({"pid": os.getpid(), "domain": ["cpu", "cpu"]}, SpecError, "cpu is named twice"),
    ],
)
async def test_bad_arguments_record_nothing(
    make_engine: EngineFactory, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    engine = await make_engine()
    arguments = dict(kwargs)
    pid = arguments.pop("pid")
    with pytest.raises(error, match=message):
        await adopt(engine, pid, **arguments)
    assert await engine.list_jobs() == []


async def test_declared_vram_beyond_the_gpu_is_refused_and_records_nothing(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # `adopt --vram-gb 200` on an 80 GiB GPU was accepted: the ledger then showed 200 GiB
    # owned on it (a submitted job asking that much fails over capacity).
    engine = await make_engine("1xA100-80GB")
    proc = start(spawn, "sleep", "600")
    with pytest.raises(SpecError, match=r"vram_gb: 200 GiB is more than gpu0 has \(80.0 GiB\)"):
        await adopt(engine, proc.pid, vram_gb=200, gpu=True)
    with pytest.raises(SpecError, match="vram_gb: domain cpu has no GPU memory to declare"):
        await adopt(engine, proc.pid, vram_gb=2, domain="cpu")
    assert await engine.list_jobs() == []
    job = await adopt(engine, proc.pid, vram_gb=80, gpu=True)  # all of it: fine
    assert job.status is JobStatus.RUNNING and job.domains == ["gpu0"]


async def test_cancel_sigterm_then_sigkill_only_that_pid(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    engine = await make_engine(config=make_config(engine={"adopt_grace_period": 0.5}))
    ready = tmp_path / "ready"
    # A group of two: a sleep sibling, and the process we adopt, which ignores SIGTERM.
    leader = start(
        spawn,
        "sh",
        "-c",
        f'sleep 600 & exec {sys.executable} -c "import signal, time, pathlib; '
        f"signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path('{ready}').touch(); "
        'time.sleep(600)"',
    )
    await eventually(ready.exists)
    sibling = next(c.pid for c in psutil.Process(leader.pid).children() if c.name() == "sleep")
    job = await adopt(engine, leader.pid)
    sub = engine.subscribe()
    await engine.cancel(job.id)
    stopping = await anext(e async for e in sub if e.kind.value == "job.reason")
    sub.close()
    assert "SIGKILL after 0.5 s" in stopping.data["message"]
    assert stopping.job is not None and stopping.job["kill_at"] is not None
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.CANCELLED
    assert done.termination_reason is TerminationReason.CANCELLED
    assert leader.wait(timeout=5) == -signal.SIGKILL  # SIGTERM was ignored
    assert not pid_gone(sibling)  # its process group was not touched


async def test_a_cancel_names_the_children_left_holding_gpu_memory(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # A cancel signals the adopted pid alone: its children ran on holding 6 GiB, now
    # unregistered, and the job said only "cancelled by user" (tester h184 #1).
    engine = await make_engine()
    leader = start(spawn, "bash", "-c", "sleep 600 & sleep 601 & wait")
    await eventually(lambda: len(psutil.Process(leader.pid).children()) == 2)
    children = sorted(c.pid for c in psutil.Process(leader.pid).children())
    try:
        ledger = SimLedger(engine.paths.state_dir)
        for pid in children:
            ledger.hold(0, pid, 3.0)
        job = await adopt(engine, leader.pid)
        assert job.status is JobStatus.RUNNING, job.message
        await engine.sampler.sample_once()
        await engine.cancel(job.id)
        done = await engine.wait(job.id, timeout=20)
        assert done.status is JobStatus.CANCELLED
        assert done.message.endswith(
            f"; pids {children[0]}, {children[1]} it started still hold 6.0 GiB of GPU "
            "memory, now unregistered (a cancel signals the adopted pid alone: "
            "`gpulayer-tui signal PID`)"
        ), done.message
        # So does one that ends by itself (tester h187 #3).
        again = start(spawn, "bash", "-c", "sleep 602 & wait")
        await eventually(lambda: len(psutil.Process(again.pid).children()) == 1)
        (child,) = [c.pid for c in psutil.Process(again.pid).children()]
        children.append(child)
        ledger.hold(1, child, 4.0)
        job = await adopt(engine, again.pid)
        await engine.sampler.sample_once()
        again.kill()
        done = await engine.wait(job.id, timeout=20)
        assert done.status is JobStatus.ORPHANED
        assert done.message.endswith(
            f"; pid {child} it started still holds 4.0 GiB of GPU memory, now unregistered "
            "(`gpulayer-tui signal PID` stops one)"
        ), done.message
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_stopped_adopted_process_is_continued_to_take_its_sigterm(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # Stopped with ctrl+z, it sat the whole grace period and was SIGKILLed: its SIGTERM
    # handler never ran (tester h171).
    engine = await make_engine(config=make_config(engine={"adopt_grace_period": 30}))
    ready, said = tmp_path / "ready", tmp_path / "said"
    proc = start(
        spawn,
        sys.executable,
        "-c",
        "import pathlib, signal, sys, time\n"
        f"def bye(*_):\n    pathlib.Path('{said}').touch()\n    sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"pathlib.Path('{ready}').touch()\n"
        "time.sleep(600)",
    )
    await eventually(ready.exists)
    os.kill(proc.pid, signal.SIGSTOP)
    await eventually(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED)
    job = await adopt(engine, proc.pid)
    await engine.cancel(job.id)
    done = await engine.wait(job.id, timeout=20)  # (well inside the 30 s grace period)
    assert done.status is JobStatus.CANCELLED
    assert said.exists() and proc.wait(timeout=5) == 7


async def test_a_recycled_pid_is_never_signalled(
    spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # Without a pidfd, a pid is signalled only if its start time still matches: a process
    # that took over the pid (same pid, other start time) is left alone.
    proc = start(spawn, "sleep", "600")
    ticks = procs.start_ticks(proc.pid)
    assert ticks is not None
    stranger = _Watch(lambda exit: None, proc.pid, None, None, group=False, ticks=ticks + 1)
    Supervisor._signal(stranger, signal.SIGKILL)
    assert proc.poll() is None
    same = _Watch(lambda exit: None, proc.pid, None, None, group=False, ticks=ticks)
    Supervisor._signal(same, signal.SIGKILL)
    assert proc.wait(timeout=5) == -signal.SIGKILL


async def test_polling_fallback_without_pidfd(
    make_engine: EngineFactory,
    spawn: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import errno

    engine = await make_engine()

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open not supported")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    proc = start(spawn, "sleep", "600")
    job = await adopt(engine, proc.pid)
    assert job.status is JobStatus.RUNNING
    proc.kill()
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.ORPHANED


async def test_dependents_of_an_adopted_job(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    engine = await make_engine()
    proc = start(spawn, "sleep", "600")
    adopted = await adopt(engine, proc.pid)
    strict = await engine.submit({"command": ["true"], "depends_on": [adopted.id]})
    lenient = await engine.submit(
        {"command": ["true"], "depends_on": [{"job": adopted.id, "any_exit": True}]}
    )
    proc.kill()
    strict_done = await engine.wait(strict.id, timeout=10)
    assert strict_done.termination_reason is TerminationReason.DEPENDENCY_FAILED
    assert strict_done.message == (
        f"dependency job {adopted.id} orphaned (adopted: its exit status could not be seen, "
        "so whether it completed is unknown)"
    )
    assert (await engine.wait(lenient.id, timeout=10)).status is JobStatus.COMPLETED


async def test_engine_restart_relearns_adopted_jobs(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    first = await make_engine()
    alive = start(spawn, "sleep", "600")
    vanishing = start(spawn, "sleep", "600")
    kept = await adopt(first, alive.pid)
    lost = await adopt(first, vanishing.pid)
    await first.stop()
    stopped = time.time()
    assert alive.poll() is None  # shutdown leaves adopted processes alone
    vanishing.kill()
    vanishing.wait()

    second = await make_engine()
    assert (await second.get(kept.id)).status is JobStatus.RUNNING
    gone = await second.get(lost.id)
    assert gone.status is JobStatus.ORPHANED
    assert "while no engine was watching (after " in gone.message
    assert "when the last engine stopped); exit status unknown" in gone.message
    # Its end is when it was last watched, not when the next engine found it gone (its
    # runtime took in all the time no engine ran).
    assert gone.ended_at is not None and gone.ended_at <= stopped
    alive.kill()
    assert (await second.wait(kept.id, timeout=10)).status is JobStatus.ORPHANED


async def test_adopted_memory_moves_from_unregistered_to_owned(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    engine = await make_engine("1xA100-80GB")
    # a shell whose child holds the memory: descendants count for the adopted pid
    shell = start(spawn, "sh", "-c", "sleep 600 & wait")
    child = await eventually(lambda: [c.pid for c in psutil.Process(shell.pid).children()])
    SimLedger(engine.paths.state_dir).hold(0, child[0], 20.0)
    await engine.sampler.sample_once()
    before = engine.gpus()["domains"][0]["vram"]
    assert before["unregistered"] == 20 * GIB and before["owned"] == 0
    job = await adopt(engine, shell.pid, vram_gb=30, gpu=True)
    assert job.status is JobStatus.RUNNING and job.domains == ["gpu0"] and job.gpus == [0]
    # As the answer comes, not at the next tick ("adopt" then "gpus" showed it both).
    after = engine.gpus()["domains"][0]
    assert after["vram"]["unregistered"] == 0 and after["vram"]["owned"] == 20 * GIB
    assert after["vram"]["reserved_extra"] == 10 * GIB  # max(0, declared 30 - held 20)
    assert after["processes"][0]["job_id"] == job.id
    # the domain is full now (its one slot): new GPU work waits
    queued = await engine.submit({"command": ["true"], "gpus": 1})
    assert queued.status is JobStatus.QUEUED
    assert queued.message == f"waiting for gpu0: slot held by job {job.id}"
    await engine.cancel(queued.id)
    # A restarted engine's first answer has it owned too: its first sample was read before
    # the jobs were taken back, and said the memory unregistered (tester h200).
    await engine.stop()
    again = await make_engine("1xA100-80GB")
    first = again.gpus()["domains"][0]
    assert first["vram"]["unregistered"] == 0 and first["vram"]["owned"] == 20 * GIB, first
    assert first["processes"][0]["job_id"] == job.id
    await again.cancel(job.id)


async def test_declaring_more_vram_than_is_free_adopts_with_a_warning(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # 135 GiB declared on an 80 GiB GPU, taken without a word: its free memory read 0.
    engine = await make_engine("1xA100-80GB")
    running = await engine.submit({"command": ["sleep", "600"], "gpus": 1, "vram_gb": 50})
    assert running.status is JobStatus.RUNNING
    ledger = SimLedger(engine.paths.state_dir)
    shell = start(spawn, "sh", "-c", "sleep 600 & wait")
    (child,) = await eventually(lambda: [c.pid for c in psutil.Process(shell.pid).children()])
    ledger.hold(0, child, 20.0)  # (its child's: it counts as its own)
    await engine.sampler.sample_once()
    # 10 GiB free, and the 20 it holds: 30 is room, 30.5 is not.
    fits = await adopt(engine, shell.pid, vram_gb=30, gpu=True)
    assert fits.message == f"adopted pid {shell.pid} on gpu0", fits.message
    await engine.cancel(fits.id)
    await eventually(lambda: engine.book.get(fits.id) is None)
    os.kill(child, signal.SIGKILL)  # (a cancel ends the adopted pid only, not its child)
    shell = start(spawn, "sh", "-c", "sleep 600 & wait")
    (child,) = await eventually(lambda: [c.pid for c in psutil.Process(shell.pid).children()])
    ledger.hold(0, child, 20.0)
    await engine.sampler.sample_once()
    job = await adopt(engine, shell.pid, vram_gb=30.5, gpu=True)
    assert job.status is JobStatus.RUNNING
    assert job.message == (
        f"adopted pid {shell.pid} on gpu0; warning: 30.5 GiB declared, but gpu0 had 30 GiB "
        "free for it: nothing else starts there until memory frees"
    )
    await engine.cancel(running.id)


async def test_a_process_adopted_on_a_quarantined_gpu_is_warned_of_it(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # The jobs already there said "warning: domain gpu0 quarantined"; the adopted one not.
    engine = await make_engine("1xA100-80GB")
    ledger = SimLedger(engine.paths.state_dir)
    ledger.set_gpu(0, lost=True, error="GPU is lost")
    await engine.sampler.sample_once()
    ledger.set_gpu(0, lost=False, error=None)  # (it answers again; still quarantined)
    proc = start(spawn, "sleep", "600")
    ledger.hold(0, proc.pid, 4.0)
    await engine.sampler.sample_once()
    assert engine.scheduler.domains["gpu0"].state.value == "quarantined"
    job = await adopt(engine, proc.pid, gpu=True)
    assert job.status is JobStatus.RUNNING
    assert job.message.startswith(
        f"adopted pid {proc.pid} on gpu0; warning: domain gpu0 quarantined"
    )


async def test_adopting_onto_a_full_domain_and_on_several_gpus(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    engine = await make_engine("2xA100-80GB")
    busy = await engine.submit({"command": ["sleep", "600"], "domain": "gpu0"})
    assert busy.status is JobStatus.RUNNING
    proc = start(spawn, "sleep", "600")
    ledger = SimLedger(engine.paths.state_dir)
    ledger.hold(0, proc.pid, 5.0)
    ledger.hold(1, proc.pid, 7.0)
    await engine.sampler.sample_once()
    # What the adopt dialog is told of a pid typed in (it said "no GPU memory seen").
    info = engine.process_info(proc.pid)
    assert info is not None and "refused" not in info
    assert (info.get("gpus"), info.get("used_bytes"), info.get("most_on_a_gpu")) == (
        [0, 1],
        12 * GIB,
        7 * GIB,
    )
    job = await adopt(engine, proc.pid, gpu=True)
    assert job.status is JobStatus.RUNNING
    assert job.domains == ["gpu0", "gpu1"]
    # It holds both: its spec says 2 GPUs, and `status` does not offer a choice of one
    # ("on gpu0 or gpu1").
    from gpulayer_tui.cli.format import format_job

    assert job.spec["gpus"] == 2
    shown = format_job(job.to_json(), [], time.time())
    assert "on gpu0 and gpu1" in shown and " or " not in shown, shown
    info = engine.process_info(proc.pid)
    assert info is not None and info.get("refused", "").startswith(
        f"pid {proc.pid} belongs to job {job.id} already"
    )
    gpu0 = engine.scheduler.domains["gpu0"]
    assert set(gpu0.holdings) == {busy.id, job.id} and gpu0.free_slots == 0
    await engine.cancel(busy.id)


async def test_a_process_only_on_a_gpu_without_a_domain_is_not_adopted_as_a_cpu_job(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    config = make_config(engine={"auto_domains": False}, domains={"train": {"gpu": 0}})
    engine = await make_engine("2xA100-80GB", config=config)
    proc = start(spawn, "sleep", "600")
    SimLedger(engine.paths.state_dir).hold(1, proc.pid, 5.0)
    await engine.sampler.sample_once()
    # Taken as a CPU job (no GPU named), it held no GPU here and its memory was no one's.
    with pytest.raises(SpecError, match="holds memory only on GPU 1, which has no domain"):
        await adopt(engine, proc.pid)
    assert await engine.list_jobs() == []


async def test_domains_named_for_a_process_must_cover_where_it_holds_memory(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # Adopted on gpu0 while it held 10 GiB on gpu1: it took gpu0's slot, and its memory
    # still counted as unregistered on gpu1.
    engine = await make_engine("2xA100-80GB")
    proc = start(spawn, "sleep", "600")
    SimLedger(engine.paths.state_dir).hold(1, proc.pid, 10.0)
    await engine.sampler.sample_once()
    for pins in (["gpu0"], ["cpu"]):
        with pytest.raises(SpecError, match=f"pid {proc.pid} holds memory on gpu1, which the"):
            await adopt(engine, proc.pid, domain=pins)
    with pytest.raises(FieldError, match="an empty list names no domain"):
        await adopt(engine, proc.pid, domain=[])
    assert await engine.list_jobs() == []
    job = await adopt(engine, proc.pid, domain=["gpu0", "gpu1"])  # (more is the user's say)
    assert job.status is JobStatus.RUNNING and job.domains == ["gpu0", "gpu1"]
    # One holding no memory yet is placed where it is told.
    idle = start(spawn, "sleep", "600")
    placed = await adopt(engine, idle.pid, domain="gpu0")
    assert placed.status is JobStatus.RUNNING and placed.domains == ["gpu0"]


async def test_an_adopted_job_keeps_saying_so_through_a_quarantine_of_its_gpu(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # Its reason became "running on gpu1", a batch job's words, once the warning of its
    # GPU's trouble was taken away (tester h97).
    engine = await make_engine("2xA100-80GB")
    ledger = SimLedger(engine.paths.state_dir)
    proc = start(spawn, "sleep", "600")
    ledger.hold(1, proc.pid, 5.0)
    await engine.sampler.sample_once()
    job = await adopt(engine, proc.pid)
    assert job.message == f"adopted pid {proc.pid} on gpu1"
    ledger.set_gpu(1, lost=True, error="GPU is lost: fell off the bus")
    await engine.sampler.sample_once()
    live = engine.book.get(job.id).job
    assert live.message.startswith(
        f"adopted pid {proc.pid} on gpu1; warning: domain gpu1 quarantined: GPU is lost"
    ), live.message
    ledger.set_gpu(1, lost=False, error=None)
    for _ in range(50):  # (a read begun before counts for nothing: until one answers)
        await engine.sampler.sample_once()
        if engine.scheduler.domains["gpu1"].answers:
            break
    await engine.domain_ops.release("gpu1")
    assert engine.book.get(job.id).job.message == f"adopted pid {proc.pid} on gpu1"


async def test_comm_with_spaces_and_parenthesis(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    weird = tmp_path / "my )weird( sleep"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", weird)
    proc = start(spawn, str(weird), "600")
    await eventually(lambda: procs.read_stat(proc.pid) is not None)
    stat = procs.read_stat(proc.pid)
    assert stat is not None and stat.ppid == os.getpid() and stat.state in "SR"
    expected = round(
        (psutil.Process(proc.pid).create_time() - psutil.boot_time()) * os.sysconf("SC_CLK_TCK")
    )
    assert abs(stat.start_ticks - expected) <= 1
    engine = await make_engine()
    job = await adopt(engine, proc.pid, start_ticks=stat.start_ticks)
    assert job.status is JobStatus.RUNNING
    # Its program's name, whole: the command line's first word was "my" (tester h163).
    assert job.name == "my )weird( sleep"
    assert job.spec["command"] == f"{weird} 600"


def test_an_adopted_process_gone_after_the_engine_was_killed_ends_when_last_seen(
    served: Served, spawn: list[subprocess.Popen[bytes]]
) -> None:
    engine = served.start("--simulate", "1xA100-80GB")
    proc = start(spawn, "sleep", "600")
    job_id = served.cli("adopt", "--pid", str(proc.pid)).stdout.strip()
    assert job_id.isdigit()
    engine.kill()  # (SIGKILL: no stop time is stored)
    engine.wait()
    killed = time.time()
    proc.kill()
    proc.wait()
    served.start("--simulate", "1xA100-80GB")
    job = json.loads(served.cli("status", job_id, "--json").stdout)["job"]
    assert job["status"] == "orphaned"
    assert "when the last engine, since killed, last wrote); exit status" in job["message"]
    assert job["started_at"] <= job["ended_at"] <= killed


async def test_an_idle_engine_notes_it_is_alive_so_a_kill_is_placed_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A killed engine was last known alive at its last event: an adopted process that
    # ended while none ran was taken to have ended then, an hour early for an engine
    # idle an hour (tester h97). An idle engine now notes that it is alive.
    import sqlite3

    from gpulayer_tui import __version__
    from gpulayer_tui.engine import store as store_module
    from gpulayer_tui.engine.store import SEEN_AT_SETTING, SEEN_RUN_SETTING, Store

    monkeypatch.setattr(store_module, "ALIVE_NOTE_S", 0.05)
    database = tmp_path / "state.db"
    first = Store(database, lambda _event: None)
    await first.open(__version__, os.getpid())

    async def noted() -> bool:
        return await first.setting(SEEN_RUN_SETTING) == first.run_id

    await eventually(noted)
    await first.close()
    with sqlite3.connect(database) as db:  # (as if killed: no stop time, noted later)
        db.execute("UPDATE engine_runs SET stopped_at = NULL")
        started = db.execute("SELECT started_at FROM engine_runs").fetchone()[0]
        db.execute(
            "UPDATE counters SET value = ? WHERE name = ?", (int(started) + 3600, SEEN_AT_SETTING)
        )
    second = Store(database, lambda _event: None)
    await second.open(__version__, os.getpid())
    assert second.previous_run_seen_until == (float(int(started) + 3600), False)
    await second.close()


async def test_a_busy_engine_notes_it_is_alive_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Woken more often than the note was due (its writes rows, not events), it never
    # noted it: an adopted process that ended while no engine ran got 0 s (tester h112).
    from gpulayer_tui import __version__
    from gpulayer_tui.engine import store as store_module
    from gpulayer_tui.engine.store import SEEN_RUN_SETTING, Store

    monkeypatch.setattr(store_module, "ALIVE_NOTE_S", 0.3)
    store = Store(tmp_path / "state.db", lambda _event: None)
    await store.open(__version__, os.getpid())

    async def noted_while_busy() -> bool:
        store.save_setting("busy", time.monotonic_ns())  # (a write: it wakes the writer)
        return await store.setting(SEEN_RUN_SETTING) == store.run_id

    await eventually(noted_while_busy, timeout=5, interval=0.05)
    await store.close()


def test_cli_adopt(served: Served, spawn: list[subprocess.Popen[bytes]]) -> None:
    served.start("--simulate", "2xA100-80GB")
    proc = start(spawn, "sleep", "600")
    out = served.cli("adopt", "--pid", str(proc.pid), "--name", "tmux-run")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    status = json.loads(served.cli("status", job_id, "--json").stdout)["job"]
    assert status["kind"] == "adopted" and status["status"] == "running"
    assert status["owner_uid"] == os.getuid()
    refused = served.cli("adopt", "--pid", str(unused_pid()))
    assert refused.returncode == 1 and "adopt_pid_gone" in refused.stderr
    bad = served.cli("adopt", "--pid", str(proc.pid), "--gpu", "--vram-gb", "3")
    assert bad.returncode == 2 and "not allowed with argument" in bad.stderr
    # An empty name was dropped and the process adopted under its program's (h51).
    other = start(spawn, "sleep", "601")
    unnamed = served.cli("adopt", "--pid", str(other.pid), "--name", "")
    assert unnamed.returncode == 2 and "name: must be text of 1 to 200" in unnamed.stderr
    # Nor one that shows nothing, as a submission's (taken, shown empty: tester h166);
    # nothing is stored, not even a refused job.
    before = len(json.loads(served.cli("jobs", "--json").stdout))
    for blank in ("\u0301\u0301", "   ", "\u3164", "\u0301abc"):
        named = served.cli("adopt", "--pid", str(other.pid), "--name", blank)
        assert named.returncode == 2, (blank, named)
        assert "name: " in named.stderr and ("visible" in named.stderr or "U+0301" in named.stderr)
    assert len(json.loads(served.cli("jobs", "--json").stdout)) == before
    # `logs -f` says at once where its output is (it waited, silent, till the end).
    follow = served.cli("logs", "-f", job_id, timeout=20)
    assert "its output goes where it was started" in follow.stderr
    proc.kill()
    waited = served.cli("wait", job_id)
    assert waited.returncode == 1 and "orphaned" in waited.stdout
    assert served.cli("status", job_id).returncode == 1
    # Its command line is shown as /proc has it (it was "s l e e p   6 0 0").
    assert "command     sleep 600\n" in served.cli("status", job_id).stdout
    # Nobody has its command to run: neither restart nor --like runs it.
    for argv in (["restart", job_id], ["submit", "--like", job_id]):
        again = served.cli(*argv)
        assert again.returncode == 2 and "Traceback" not in again.stderr, argv
        assert f"job {job_id} is an adopted process" in again.stderr, argv
    assert served.cli("jobs", "--json").stdout.count('"id"') == 2  # (no job was made)
    # What it was adopted with a warning of is said too (only the id was: tester h87).
    held = served.cli("submit", "--domain", "gpu1", "--vram-gb", "30", "--", "sleep", "600")
    third = start(spawn, "sleep", "602")
    warned = served.cli("adopt", "--pid", str(third.pid), "--domain", "gpu1", "--vram-gb", "60")
    assert warned.returncode == 0 and warned.stdout.strip().isdigit(), warned.stderr
    assert warned.stderr == (
        "gpulayer-tui: warning: 60 GiB declared, but gpu1 had 50 GiB free for it: nothing "
        "else starts there until memory frees\n"
    )
    served.cli("cancel", held.stdout.strip(), warned.stdout.strip())
    # `adopt --pid $$` in a shell: the shell it was typed in, whose cancel would end the
    # terminal (tester h75). Refused, and kept in history as refusals are.
    shell = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -m gpulayer_tui adopt --pid $$; echo "exit $?"'],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert shell.stdout.endswith("exit 1\n"), (shell.stdout, shell.stderr)
    assert "(adopt_refused): refused to adopt: pid " in shell.stderr, shell.stderr
    assert ") runs the command that asked to adopt it: stopping it" in shell.stderr
    # The TUI's confirmation asks about the pid first: its dialog opened for the shell
    # the TUI ran in, and each try was stored as a failed job (tester h99). The look-up
    # says the refusal, without the CLI's words about $$.
    reader = (
        "import json, sys\n"
        "from gpulayer_tui.client import Client\n"
        "from gpulayer_tui.engine.paths import resolve_paths\n"
        "print(json.dumps(Client(resolve_paths()).request('GET', '/processes/' + sys.argv[1])))\n"
    )
    asked = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "$0" $$', reader],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert asked.returncode == 0, asked.stderr
    refused = json.loads(asked.stdout)["refused"]
    assert ") runs the command that asked to adopt it: stopping it would end" in refused
    assert refused.endswith("and likely your terminal")


async def test_what_no_one_may_adopt_is_refused_with_its_reason(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    engine = await make_engine()
    refused: dict[str, int] = {"init": 1, "this engine": os.getpid()}
    kernel = next(
        (
            pid
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit())
            if (st := procs.read_stat(pid)) is not None and st.flags & procs.PF_KTHREAD
        ),
        None,
    )
    if kernel is not None:  # (a container may show none)
        refused["kernel thread"] = kernel
    launched = await engine.submit({"shell": "sleep 600 & wait", "gpus": 0})
    await eventually(lambda: engine.book.get(launched.id).job.pid is not None)  # type: ignore[union-attr]
    root = engine.book.get(launched.id).job.pid  # type: ignore[union-attr]
    assert root is not None
    refused["a job's own process"] = root
    adopted = start(spawn, "sleep", "600")
    first = await adopt(engine, adopted.pid)
    assert first.status is JobStatus.RUNNING
    refused["a pid adopted already"] = adopted.pid
    # A gpulayer-tui client (the TUI, web, wait, logs -f: its console script): cancelling
    # it as a job would stop it.
    script = tmp_path / "gpulayer-tui"
    script.write_text("import time\ntime.sleep(600)\n")
    refused["a gpulayer-tui client"] = start(spawn, sys.executable, str(script), "web").pid
    # The parent of an adopted process: two jobs would own the same processes.
    parent = start(spawn, "bash", "-c", "sleep 600 & wait")
    child = wait_for(lambda: [c.pid for c in psutil.Process(parent.pid).children()])[0]
    below = await adopt(engine, child)
    assert below.status is JobStatus.RUNNING
    refused["the parent of an adopted process"] = parent.pid
    # What runs the engine (its shell, a tmux pane, pytest here): adopted and cancelled,
    # it took the engine's console and log pipe with it (tester h72).
    if os.getppid() > 1:
        refused["the engine's parent"] = os.getppid()
    says = {
        "init": "pid 1 is the init process",
        "this engine": "is this engine",
        "kernel thread": "is a kernel thread",
        "a job's own process": f"belongs to job {launched.id} already",
        "a pid adopted already": f"belongs to job {first.id} already",
        "a gpulayer-tui client": "is part of gpulayer-tui itself",
        "the parent of an adopted process": f"has job {below.id}'s process (pid {child}) below",
        "the engine's parent": "runs this engine below it",
    }
    for what, pid in refused.items():
        job = await adopt(engine, pid)
        assert job.status is JobStatus.FAILED, what
        assert job.termination_reason is TerminationReason.ADOPT_REFUSED, what
        assert says[what] in job.message, (what, job.message)
    # Nothing was signalled: the adopted process and the job run on.
    assert adopted.poll() is None
    assert engine.book.get(launched.id) is not None and engine.book.get(first.id) is not None


def _python_as(spawned: list[subprocess.Popen[bytes]], argv0: bytes) -> subprocess.Popen[bytes]:
    import sys

    argv = [argv0, b"-c", b"import time; time.sleep(60)"]
    proc = subprocess.Popen(argv, executable=sys.executable, start_new_session=True)
    spawned.append(proc)
    wait_for(lambda: "time.sleep" in procs.read_cmdline(proc.pid))
    return proc


async def test_an_adopted_process_named_after_a_hostile_argv0_gets_a_printable_name(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # Its name came from its argv0 raw: a terminal escape reached the API and --json.
    engine = await make_engine()
    proc = _python_as(spawn, b"/tmp/e\x1b[31mvil")
    job = await adopt(engine, proc.pid)
    assert job.status is JobStatus.RUNNING
    # What a name may hold of it, the escape sequence gone whole: kept as the text
    # "\\x1b" it read like an escaped real one in every view (tester h163), and its ESC
    # alone dropped left "[31m" (tester h166).
    assert job.name == "evil"
    await engine.cancel(job.id)
    # The name offered for it before (the TUI's dialog) is the one it gets.
    spaced = _python_as(spawn, b"/opt/my tool/run thing")
    info = engine.process_info(spaced.pid)
    assert info is not None and info["name"] == "run thing", info
    job = await adopt(engine, spaced.pid)
    assert job.name == "run thing", job.name
    await engine.cancel(job.id)
    nothing = _python_as(spawn, b"\x1b\x07")
    job = await adopt(engine, nothing.pid)
    assert job.name == f"pid {nothing.pid}", job.name
    await engine.cancel(job.id)
    # A renamed process whose name is no path keeps it whole: `exec -a '[red]stray[/]'`
    # was named "]", after its last "/" (tester h54).
    renamed = _python_as(spawn, b"[red]stray[/]")
    job = await adopt(engine, renamed.pid)
    assert job.name == "[red]stray[/]", job.name
    await engine.cancel(job.id)


async def test_adoptions_of_one_pid_at_once_make_one_job(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # Each passed the checks while another waited on /proc: several running jobs owned
    # one process (a parent and its child adopted at once too).
    import asyncio

    engine = await make_engine("2xA100-80GB")
    proc = start(spawn, "sleep", "600")
    results = await asyncio.gather(*(adopt(engine, proc.pid) for _ in range(8)))
    running = [job for job in results if job.status is JobStatus.RUNNING]
    assert len(running) == 1
    assert all("belongs to job" in job.message for job in results if job not in running)
    parent = start(spawn, "sh", "-c", "sleep 600 & wait")
    child = await eventually(lambda: next(iter(psutil.Process(parent.pid).children()), None))
    both = await asyncio.gather(adopt(engine, parent.pid), adopt(engine, child.pid))
    assert [job.status for job in both].count(JobStatus.RUNNING) == 1


async def test_a_process_on_a_managed_and_an_unmanaged_gpu_is_refused_either_way(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # Adopted on its managed GPU alone (no --domain), its memory on the other counted as
    # no job's while `gpus` named it as the job's.
    config = make_config(engine={"auto_domains": False}, domains={"train": {"gpu": 0}})
    engine = await make_engine("2xA100-80GB", config=config)
    proc = start(spawn, "sleep", "600")
    ledger = SimLedger(engine.paths.state_dir)
    ledger.hold(0, proc.pid, 2.0)
    ledger.hold(1, proc.pid, 2.0)
    await engine.sampler.sample_once()
    for fields in ({}, {"gpu": True}, {"domain": ["train"]}):
        with pytest.raises(SpecError, match="holds memory on GPU 1, which has no domain"):
            await adopt(engine, proc.pid, **fields)
    assert await engine.list_jobs() == []


async def test_a_process_holding_nothing_is_not_placed_on_a_domain_out_of_service(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # A submission there is refused or waits; an adoption was placed there at once.
    engine = await make_engine("2xA100-80GB")
    await engine.domain_ops.drain("gpu1", "fan")
    proc = start(spawn, "sleep", "600")
    await engine.sampler.sample_once()
    with pytest.raises(SpecError, match=r"domain: gpu1 is draining \(fan\) and pid \d+ holds"):
        await adopt(engine, proc.pid, domain=["gpu1"])
    # With no domain named it goes on the cpu pool: not while that is drained either (it
    # was placed there, named it was refused: tester h121).
    await engine.domain_ops.drain("cpu", "reboot")
    with pytest.raises(SpecError, match=r"domain: cpu is draining \(reboot\) and pid \d+ holds"):
        await adopt(engine, proc.pid)
    assert await engine.list_jobs() == []
    await engine.domain_ops.release("cpu")
    SimLedger(engine.paths.state_dir).hold(1, proc.pid, 3.0)  # (it is there: tracked)
    await engine.sampler.sample_once()
    held = await adopt(engine, proc.pid, domain=["gpu1"])
    assert held.status is JobStatus.RUNNING


async def test_a_job_of_another_engine_is_not_adopted(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # Adopted by a second engine of the same user, its cancel killed the first's job.
    engine = await make_engine()
    task = {**os.environ, "GPULAYER_TASK": f"{tmp_path}/other-state/7"}
    other = start(spawn, "sleep", "600", env=task)
    info = engine.process_info(other.pid)  # (the TUI's adopt-by-pid offered it)
    assert info is not None and "is a job of another gpulayer-tui engine" in info.get("refused", "")
    job = await adopt(engine, other.pid)
    assert job.status is JobStatus.FAILED
    assert f"is a job of another gpulayer-tui engine (state dir {tmp_path}/other-state)" in (
        job.message
    )


def test_what_reads_the_engines_output_is_not_adopted(served: Served, tmp_path: Path) -> None:
    # `--serve | tee engine.log`: the tee was adopted, and its cancel would have taken the
    # engine's log with it (its next write a SIGPIPE: tester h80).
    engine = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "--serve", "--simulate", "1xA100-80GB"],
        env=served.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    served.proc = engine  # type: ignore[assignment]  # (stopped by the fixture)
    assert engine.stdout is not None
    with open(tmp_path / "engine.log", "wb") as log:
        tee = subprocess.Popen(["cat"], stdin=engine.stdout, stdout=log)
    engine.stdout.close()
    try:
        wait_for(lambda: served.cli("gpus").returncode == 0, timeout=20, interval=0.05)
        said = served.cli("adopt", "--pid", str(tee.pid), "--json")
        job = json.loads(said.stdout)
        assert job["status"] == "failed", said
        assert "reads this engine's output through a pipe (cat)" in job["message"]
        assert tee.poll() is None and engine.poll() is None
    finally:
        tee.kill()
        tee.wait()


async def test_the_one_gpu_taken_for_a_process_holding_nothing_must_be_in_service(
    make_engine: EngineFactory, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # `adopt --gpu` of a process holding no memory yet takes the box's one GPU: not while
    # it is drained (it was, the same placement named was refused).
    engine = await make_engine("1xA100-80GB")
    await engine.domain_ops.drain("gpu0", "fan")
    proc = start(spawn, "sleep", "600")
    await engine.sampler.sample_once()
    with pytest.raises(SpecError, match=r"domain: gpu0 is draining \(fan\) and pid \d+ holds"):
        await adopt(engine, proc.pid, gpu=True)
    await engine.domain_ops.release("gpu0")
    job = await adopt(engine, proc.pid, gpu=True)
    assert job.status is JobStatus.RUNNING and job.domains == ["gpu0"]
