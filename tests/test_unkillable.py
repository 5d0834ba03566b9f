"""A process that outlives SIGKILL is released with a recorded reason, never held for ever.

The processes here are really unkillable for a while: each is put in a cgroup-v1 freezer
cgroup and frozen, where the kernel holds it in uninterruptible sleep (state ``D``) and a
SIGKILL waits until it is thawed, as for a process stuck in a GPU driver.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_tui.engine.models import JobStatus, TerminationReason
from gpulayer_tui.engine.procs import read_stat

from .conftest import EngineFactory, Served, adopt, eventually, make_config, pid_gone, wait_for

FREEZER = Path("/sys/fs/cgroup/freezer")


class Freezer:
    """One freezer cgroup of this test: put pids in, freeze, thaw."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def freeze(self) -> None:
        (self.path / "freezer.state").write_text("FROZEN\n")
        wait_for(lambda: (self.path / "freezer.state").read_text().strip() == "FROZEN")

    def thaw(self) -> None:
        (self.path / "freezer.state").write_text("THAWED\n")


@pytest.fixture
def freezer(tmp_path: Path) -> Iterator[Freezer]:
    """A freezer cgroup; at the end its processes are killed and it is thawed and removed
    (request it after fixtures that wait for those processes)."""
    if os.getuid() != 0 or not (FREEZER / "freezer.state").parent.is_dir():
        pytest.skip("needs root and the cgroup-v1 freezer (/sys/fs/cgroup/freezer)")
    path = FREEZER / f"gpulayer-test-{os.getpid()}-{tmp_path.name}"
    try:
        path.mkdir()
    except OSError as err:
        pytest.skip(f"cannot create a freezer cgroup: {err}")
    frozen = Freezer(path)
    try:
        yield frozen
    finally:
        for pid in (int(p) for p in (path / "cgroup.procs").read_text().split()):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        frozen.thaw()
        wait_for(lambda: not (path / "cgroup.procs").read_text().strip())
        path.rmdir()


def released(job: object) -> bool:
    return getattr(job, "status", None) is JobStatus.ORPHANED


async def test_adopted_process_that_outlives_sigkill_is_released(
    make_engine: EngineFactory, sleeper_proc: subprocess.Popen[bytes], freezer: Freezer
) -> None:
    engine = await make_engine(
        config=make_config(engine={"adopt_grace_period": 0.2, "release_after": 0.5})
    )
    job = await adopt(engine, sleeper_proc.pid)
    freezer.add(sleeper_proc.pid)
    freezer.freeze()
    await engine.cancel(job.id)
    done = await engine.wait(job.id, timeout=15)
    assert done.status is JobStatus.ORPHANED
    assert done.termination_reason is TerminationReason.UNKILLABLE
    assert f"pid {sleeper_proc.pid} outlived SIGKILL" in done.message
    assert "uninterruptible sleep" in done.message
    assert "cancelled" in done.message  # what it was being stopped for
    stat = read_stat(sleeper_proc.pid)
    assert stat is not None and stat.state == "D"  # still there: released, not killed
    assert engine.scheduler.domains["cpu"].used_slots == 0  # its slot is free again
    assert sleeper_proc.pid not in engine.watcher.pids().values()  # no longer watched
    freezer.thaw()  # the kernel lets it go: the queued SIGKILL ends it
    assert sleeper_proc.wait(timeout=10) in (-9, -15)  # the signals it was sent, at last


async def test_launched_job_that_outlives_sigkill_is_released_and_its_slot_reused(
    make_engine: EngineFactory, freezer: Freezer
) -> None:
    engine = await make_engine(
        config=make_config(engine={"grace_period": 0.2, "release_after": 0.5}), cpu_count=1
    )
    stuck = (await engine.submit({"command": ["sleep", "600"]})).id

    async def pid() -> int | None:
        return (await engine.get(stuck)).pid

    running = await eventually(pid)
    follower = (await engine.submit({"command": ["true"]})).id
    freezer.add(running)
    freezer.freeze()
    await engine.cancel(stuck)
    done = await engine.wait(stuck, timeout=15)
    assert (done.status, done.termination_reason) == (
        JobStatus.ORPHANED,
        TerminationReason.UNKILLABLE,
    )
    assert f"pid {running} outlived SIGKILL" in done.message
    # The one slot is free: the job behind it runs, while the stuck process still lives.
    assert (await engine.wait(follower, timeout=15)).status is JobStatus.COMPLETED
    assert not pid_gone(running)
    freezer.thaw()
    await eventually(lambda: pid_gone(running))
    # Its late end changes nothing: the job stays as it was released.
    assert (await engine.get(stuck)).status is JobStatus.ORPHANED


async def test_a_restarted_engine_still_releases_on_time(
    make_engine: EngineFactory, sleeper_proc: subprocess.Popen[bytes], freezer: Freezer
) -> None:
    config = make_config(engine={"adopt_grace_period": 0.2, "release_after": 1.0})
    first = await make_engine(config=config)
    job = await adopt(first, sleeper_proc.pid)
    freezer.add(sleeper_proc.pid)
    freezer.freeze()
    await first.cancel(job.id)
    await first.stop()  # stopped while the job is being stopped: the deadline is stored
    second = await make_engine(config=config)
    done = await second.wait(job.id, timeout=15)
    assert done.termination_reason is TerminationReason.UNKILLABLE


def test_cli_cancel_waits_with_a_bound_and_says_what_it_waits_for(
    served: Served, sleeper_proc: subprocess.Popen[bytes], freezer: Freezer
) -> None:
    served.home.mkdir(parents=True, exist_ok=True)
    (served.home / "config.toml").write_text(
        "[engine]\nadopt_grace_period = 0.2\nrelease_after = 600\n"
    )
    served.start("--simulate", "1xA100-80GB")
    job_id = served.cli("adopt", "--pid", str(sleeper_proc.pid)).stdout.strip()
    freezer.add(sleeper_proc.pid)
    freezer.freeze()
    out = served.cli("cancel", job_id, "--timeout", "2")
    assert out.returncode == 5, out  # (its --timeout ran out)
    assert f"job {job_id} is stopping: SIGTERM sent, SIGKILL at" in out.stderr
    assert f"job {job_id} is still running" in out.stderr
    assert "release_after" in out.stderr
    status = json.loads(served.cli("status", job_id, "--json").stdout)["job"]
    assert status["status"] == "running" and status["kill_at"] is not None
