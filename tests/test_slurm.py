"""Cluster jobs on a real Slurm (issue 16): one node, 4 fake GPUs, partition "gpu".

tests/slurm/cluster.sh starts munged, slurmctld and slurmd without systemd (root and the
Debian packages slurm-wlm and munge needed; .ci/run installs them and sets
GPULAYER_REQUIRE_SLURM=1 so these tests cannot silently skip there). All of them run on
one xdist worker: they share the cluster, and one fills its node on purpose.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.errors import SpecError
from gpulayer_tui.engine.models import JobStatus, TerminationReason
from gpulayer_tui.engine.paths import resolve_paths
from gpulayer_tui.engine.slurm import (
    SlurmJob,
    end_of,
    gres_gpus,
    parse_jobs,
    parse_sacct,
    pending_words,
    slurm_time,
)

from .conftest import REPO, EngineFactory, eventually, make_config, pid_gone
from .ui_support import until

pytestmark = [pytest.mark.needs_slurm, pytest.mark.xdist_group(name="slurm")]

CLUSTER_DIR = Path(f"/tmp/gpulayer-slurm-test-{os.getuid()}")
SCRIPT = REPO / "tests" / "slurm" / "cluster.sh"


@pytest.fixture(scope="module")
def slurm_conf() -> Iterator[str]:
    """A running single-node cluster; its SLURM_CONF."""
    if shutil.which("sbatch") is None or shutil.which("munged") is None:
        pytest.skip("Slurm is not installed (Debian: slurm-wlm, munge)")
    if os.geteuid() != 0:
        pytest.skip("a test Slurm needs root (slurmd runs jobs as their users)")
    CLUSTER_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER_DIR.parent / f"{CLUSTER_DIR.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (one start, whichever worker comes first)
        done = subprocess.run(
            [str(SCRIPT), "start", str(CLUSTER_DIR)], capture_output=True, text=True, timeout=120
        )
    if done.returncode != 0:
        pytest.fail(f"the test Slurm did not start: {done.stderr[-2000:]}")
    yield done.stdout.strip().split("=", 1)[1]


def _cluster_config() -> Any:
    return make_config(
        clusters={"test": {"partition": "gpu", "poll_interval": 0.3, "command_timeout": 3}}
    )


@pytest.fixture
async def cluster_engine(
    make_engine: EngineFactory, slurm_conf: str, monkeypatch: pytest.MonkeyPatch
) -> Any:
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    engine = await make_engine("1xA100-80GB", config=_cluster_config())
    await eventually(lambda: engine.clusters.views()[0].get("nodes") == 1, timeout=20)
    return engine


def _spec(command: str, **extra: Any) -> dict[str, Any]:
    return {"shell": command, "cluster": "test", "cwd": "/tmp", **extra}


async def test_a_cluster_job_runs_with_its_gpus_and_its_exit_code(cluster_engine: Any) -> None:
    engine = cluster_engine
    ok = await engine.submit(_spec("echo gpus=$CUDA_VISIBLE_DEVICES job=$GPULAYER_JOB_ID", gpus=2))
    bad = await engine.submit(_spec("echo failing; exit 3"))
    done = await engine.wait(ok.id, timeout=60)
    assert done.status is JobStatus.COMPLETED, done.message
    assert done.cluster_job_id is not None
    log = engine.log_path(ok.id).read_text()
    assert f"gpus=0,1 job={ok.id}" in log  # Slurm set the GPUs; we set our job id
    failed = await engine.wait(bad.id, timeout=60)
    assert failed.status is JobStatus.FAILED and failed.exit_code == 3
    assert failed.termination_reason is TerminationReason.EXIT_CODE
    detail, events = await engine.job_detail(ok.id)
    assert detail["cluster"] == "test" and detail["cluster_job_id"] == done.cluster_job_id
    statuses = [e["status"] for e in events if e["status"]]
    assert statuses[:2] == ["pending", "queued"] and statuses[-2:] == ["running", "completed"]
    view = engine.gpus()["clusters"][0]
    assert view["gpus_total"] == 4 and view["partition"] == "gpu" and view["answering"]


async def test_a_request_no_node_can_hold_fails_over_capacity_at_once(cluster_engine: Any) -> None:
    engine = cluster_engine
    too_many = await engine.submit(_spec("true", gpus=8))
    assert too_many.status is JobStatus.FAILED
    assert too_many.termination_reason is TerminationReason.OVER_CAPACITY
    assert too_many.message == (
        "requested 8 GPUs on one node, but the largest node in partition gpu has 4"
    )
    too_long = await engine.submit(_spec("true", timeout=7200))
    assert (
        too_long.message == "asks for 120 min of run time, but partition gpu allows at most 60 min"
    )
    with pytest.raises(Exception, match="unknown cluster 'nowhere'"):
        await engine.submit({"shell": "true", "cluster": "nowhere"})
    with pytest.raises(Exception, match="vram_gb: Slurm places a cluster job by its GPU count"):
        await engine.submit(_spec("true", gpus=1, vram_gb=40))


async def test_memory_under_a_mib_is_asked_as_one_mib_not_zero(
    cluster_engine: Any, slurm_conf: str
) -> None:
    """``--mem=0`` would ask Slurm for all of the node's memory."""
    engine = cluster_engine
    job = await engine.submit(_spec("sleep 5", mem_gb=0.0001))
    await eventually(lambda: engine.book.get(job.id).job.status is JobStatus.RUNNING, timeout=30)
    cluster_id = engine.book.get(job.id).job.cluster_job_id
    shown = await asyncio.to_thread(_slurm, slurm_conf, "scontrol", "show", "job", cluster_id)
    assert "MinMemoryNode=1M" in shown
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=60)


async def test_a_state_dir_with_slurm_patterns_and_an_env_name_sh_refuses(
    slurm_conf: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # "-o .../h%j/jobs/1.log" sent the log to "h428" (Slurm's patterns), and the job died
    # "killed by signal 53"; an environment name Python takes but sh does not ("café")
    # ended the job's script at its export (exit 2). And a partition that does not exist
    # read "not answering: scontrol: exit code 1", waiting for ever.
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "h%j"))
    clusters = {
        "test": {"partition": "gpu", "poll_interval": 0.3, "command_timeout": 3},
        "typo": {"partition": "nope", "poll_interval": 0.3, "command_timeout": 3},
    }
    engine = Engine(resolve_paths(), simulate="1xA100-80GB", config=make_config(clusters=clusters))
    await engine.start()
    try:
        await eventually(lambda: engine.clusters.views()[0].get("nodes") == 1, timeout=20)
        spec = _spec("echo ran $GREETING", env={"café": "1", "GREETING": "hi"})
        job = await engine.submit(spec)
        done = await engine.wait(job.id, timeout=60)
        assert done.status is JobStatus.COMPLETED, done.message
        assert engine.log_path(job.id).read_text() == "ran hi\n"
        typo = await engine.submit({**_spec("true"), "cluster": "typo"})
        failed = await engine.wait(typo.id, timeout=30)
        assert failed.termination_reason is TerminationReason.OVER_CAPACITY
        assert "Partition nope not found" in failed.message, failed.message
    finally:
        await engine.stop()


async def test_pending_reason_in_plain_words_and_cancel_pending_and_running(
    cluster_engine: Any,
) -> None:
    engine = cluster_engine
    hog = await engine.submit(_spec("sleep 120", gpus=4))
    await eventually(lambda: engine.book.get(hog.id).job.status is JobStatus.RUNNING, timeout=30)
    waiting = await engine.submit(_spec("true", gpus=1))
    await eventually(
        lambda: "waiting for resources" in engine.book.get(waiting.id).job.message, timeout=30
    )
    live = engine.book.get(waiting.id).job
    assert live.status is JobStatus.QUEUED
    assert live.message.startswith(f"cluster test job {live.cluster_job_id}: waiting for resources")
    # `why` (and the TUI's detail) leave this box's limits, fair share and line out: Slurm
    # places it (they said "limits none; running jobs hold 0 GPU slots": tester h195).
    from gpulayer_tui.formatting import why_lines

    explained = engine.queue.explain(waiting.id)
    assert explained["cluster"] == "test" and explained["limits"] is None
    said = "\n".join(why_lines(explained))
    assert "waiting for resources" in said
    assert "limits" not in said and "fair share" not in said and "in line" not in said, said
    await engine.cancel(waiting.id)
    await engine.cancel(hog.id)
    for job in (waiting, hog):
        ended = await engine.wait(job.id, timeout=60)
        assert ended.status is JobStatus.CANCELLED and ended.message == "cancelled by user"


async def test_a_cluster_jobs_runtime_is_slurms(cluster_engine: Any, slurm_conf: str) -> None:
    # Its start was stamped within the second it was queued, its end Slurm's whole
    # second: a 3 s job ran "2 s" (tester h195 #3).
    engine = cluster_engine
    job = await engine.submit(_spec("sleep 2"))
    done = await engine.wait(job.id, timeout=60)
    assert done.status is JobStatus.COMPLETED
    assert done.started_at is not None and done.ended_at is not None
    argv = ["sacct", "-c", "-j", str(done.cluster_job_id), "-n", "-X", "-P", "-o", "Elapsed"]
    said: list[str] = []

    async def accounted() -> bool:
        said[:] = (await asyncio.to_thread(_slurm, slurm_conf, *argv)).split()
        return bool(said)

    deadline = time.monotonic() + 30
    while not await accounted():
        assert time.monotonic() < deadline, "no accounting record"
        await asyncio.sleep(0.2)
    hours, minutes, seconds = map(int, said[0].split(":"))
    elapsed = hours * 3600 + minutes * 60 + seconds
    assert abs((done.ended_at - done.started_at) - elapsed) < 0.01, said


async def test_an_engine_restart_finds_every_cluster_job_again(
    cluster_engine: Any, make_engine: EngineFactory
) -> None:
    engine = cluster_engine
    job = await engine.submit(_spec("sleep 3; echo finished"))
    await eventually(lambda: engine.book.get(job.id).job.cluster_job_id is not None, timeout=30)
    cluster_id = engine.book.get(job.id).job.cluster_job_id
    await engine.stop()
    again = await make_engine("1xA100-80GB", config=engine.config)
    done = await again.wait(job.id, timeout=60)
    assert done.status is JobStatus.COMPLETED and done.cluster_job_id == cluster_id
    assert "finished" in again.log_path(job.id).read_text()


async def test_a_batch_reaches_the_cluster_in_its_order(cluster_engine: Any) -> None:
    # Eight sbatch calls at once reached the controller in any order: a `submit --file`'s
    # later lines got the lower ids and ran first on a first-in-first-out partition
    # (tester h150).
    engine = cluster_engine
    jobs = await engine.submit_many([_spec(f"exit {n}", gpus=0) for n in range(12)])
    ids = [job.id for job in jobs]
    done = [await engine.wait(i, timeout=60) for i in ids]
    cluster_ids = [int(job.cluster_job_id) for job in done]
    assert cluster_ids == sorted(cluster_ids), list(zip(ids, cluster_ids, strict=True))


async def test_a_cluster_removed_from_the_config_still_follows_and_cancels_its_jobs(
    cluster_engine: Any, paths: Any, slurm_conf: str
) -> None:
    # Its jobs froze at their last state for ever, and a cancel said "scancel sent" and
    # was never sent: the Slurm job ran on (tester h150).
    engine = cluster_engine
    ran = await engine.submit(_spec("true", gpus=0))
    job = await engine.submit(_spec("sleep 300", gpus=0))
    await eventually(lambda: engine.book.get(job.id).job.status is JobStatus.RUNNING, timeout=30)
    paths.config_file.write_text("[engine]\nsample_interval = 0.2\n")  # (no cluster)
    answer = await engine.config_reload.reload()
    assert answer["applied"] and "clusters.test removed" in answer["changes"], answer
    assert engine.clusters.names == [] and engine.clusters.views() == []
    with pytest.raises(SpecError, match="test"):
        await engine.submit(_spec("true", gpus=0))  # (nothing new goes to it)
    assert (await engine.wait(ran.id, timeout=30)).status is JobStatus.COMPLETED
    await engine.cancel(job.id)
    done = await engine.wait(job.id, timeout=30)
    assert done.status is JobStatus.CANCELLED, done.message
    sacct = ("sacct", "-c", "-X", "-P", "-n", "-o", "State", "-j", done.cluster_job_id)
    state = await asyncio.to_thread(_slurm, slurm_conf, *sacct)
    assert state.split() == ["CANCELLED"]  # (scancel reached Slurm)
    await eventually(lambda: "test" not in engine.clusters._clusters, timeout=10)


def _slurm(slurm_conf: str, *argv: str) -> str:
    """A Slurm command's output (run in a thread by the tests: it blocks)."""
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": slurm_conf},
        timeout=10,
    )
    return done.stdout


def _forgotten(slurm_conf: str, cluster_id: str) -> bool:
    """Whether the controller no longer knows a job (MinJobAge: 10 s in the test Slurm)."""
    return cluster_id not in _slurm(
        slurm_conf, "squeue", "-h", "-t", "all", "-j", cluster_id, "-o", "%i"
    )


@pytest.mark.timeout(150)
async def test_ends_the_controller_forgot_come_from_accounting_after_a_restart(
    cluster_engine: Any, make_engine: EngineFactory, slurm_conf: str
) -> None:
    engine = cluster_engine
    ok = await engine.submit(_spec("echo done"))
    bad = await engine.submit(_spec("exit 3"))
    killed = await engine.submit(_spec("kill -9 $$"))
    jobs = (ok, bad, killed)
    await eventually(
        lambda: all(engine.book.get(j.id).job.cluster_job_id for j in jobs), timeout=30
    )
    cluster_ids = [engine.book.get(j.id).job.cluster_job_id for j in jobs]
    await engine.stop()  # (they end while no engine follows them)
    for cluster_id in cluster_ids:
        await eventually(
            lambda c=cluster_id: asyncio.to_thread(_forgotten, slurm_conf, c),
            timeout=90,
            interval=1,
        )
    again = await make_engine("1xA100-80GB", config=engine.config)
    done = await again.wait(ok.id, timeout=30)
    assert done.status is JobStatus.COMPLETED and done.exit_code == 0, done.message
    failed = await again.wait(bad.id, timeout=30)
    assert (failed.status, failed.termination_reason) == (
        JobStatus.FAILED,
        TerminationReason.EXIT_CODE,
    )
    assert failed.exit_code == 3, failed.message
    signalled = await again.wait(killed.id, timeout=30)
    assert signalled.termination_reason is TerminationReason.SIGNAL
    assert signalled.message == "killed by signal 9"
    assert again.clusters._clusters["test"].accounting == "jobcomp"  # (sacct -c)


async def test_a_cluster_job_whose_folder_is_gone_fails_instead_of_running_in_tmp(
    cluster_engine: Any, tmp_path: Path
) -> None:
    # Slurm ran it in /tmp ("couldn't chdir ... going to /tmp instead") and it showed
    # "completed": a command meant for one folder ran in another.
    engine = cluster_engine
    gone = tmp_path / "gone"  # (a folder on the node: not checked here)
    job = await engine.submit(_spec("pwd > where", cwd=str(tmp_path)))
    assert (await engine.wait(job.id, timeout=60)).status is JobStatus.COMPLETED
    assert (tmp_path / "where").read_text() == f"{tmp_path}\n"
    marker = f"ran-here-{tmp_path.name}"  # (a name of this run's: /tmp is shared)
    doomed = await engine.submit(_spec(f"pwd; touch {marker}", cwd=str(gone)))
    done = await engine.wait(doomed.id, timeout=60)
    assert (done.status, done.exit_code) == (JobStatus.FAILED, 1), done.message
    said = engine.log_path(doomed.id).read_text()
    assert f"gpulayer-tui: working directory does not exist on the node: {gone}" in said
    assert marker not in os.listdir("/tmp")


@pytest.mark.timeout(150)
async def test_a_submission_the_controller_forgot_is_found_in_accounting(
    cluster_engine: Any, slurm_conf: str
) -> None:
    # A restarted engine looked up an unrecorded submission in squeue alone: run and
    # forgotten (MinJobAge) before it looked, the job was submitted again and ran twice.
    engine = cluster_engine
    job = await engine.submit(_spec("echo once"))
    done = await engine.wait(job.id, timeout=60)
    cluster_id = done.cluster_job_id
    assert cluster_id is not None
    await eventually(
        lambda: asyncio.to_thread(_forgotten, slurm_conf, cluster_id), timeout=90, interval=1
    )
    cluster = engine.clusters._clusters["test"]
    found = await cluster.find(engine.clusters.slurm_name(job.id), done.created_at)
    assert [j.job_id for j in found] == [cluster_id]


async def test_without_accounting_exit_codes_come_from_the_controller(
    cluster_engine: Any,
) -> None:
    engine = cluster_engine
    engine.clusters._clusters["test"].accounting = "none"  # (as a cluster that keeps none)
    bad = await engine.submit(_spec("exit 4"))
    failed = await engine.wait(bad.id, timeout=60)
    assert failed.status is JobStatus.FAILED and failed.exit_code == 4, failed.message


@pytest.mark.timeout(200)  # (Slurm's time limits are whole minutes, checked every 30 s)
# Its own test worker: Slurm enforces time limits in whole minutes, checked every 30 s, so
# this test waits over a minute; the others run beside it (on the same cluster, which has
# the CPUs for both; it takes no GPU, and each engine counts only its own jobs).
@pytest.mark.xdist_group(name="slurm-timeout")
async def test_a_cluster_timeout_ends_like_a_local_one(cluster_engine: Any) -> None:
    engine = cluster_engine
    local = await engine.submit({"shell": "sleep 60", "timeout": 1})
    remote = await engine.submit(_spec("sleep 600", timeout=30))  # (--time=1: whole minutes)
    local_end = await engine.wait(local.id, timeout=30)
    remote_end = await engine.wait(remote.id, timeout=150)
    assert (
        (remote_end.status, remote_end.termination_reason)
        == (
            local_end.status,
            local_end.termination_reason,
        )
        == (JobStatus.FAILED, TerminationReason.TIMEOUT)
    )
    assert remote_end.message.startswith("timed out: Slurm stopped it at its time limit of 1 min")
    assert remote_end.exit_code is None  # (Slurm's 0:0 read "exit code 0")
    assert remote_end.started_at is not None and remote_end.ended_at is not None
    # (Slurm's end is in whole seconds, the start the engine's own reading of it: 59.93 s
    # came out of a minute's limit, Slurm's start having been cut to its second too)
    assert remote_end.ended_at - remote_end.started_at >= 59


async def test_a_silent_controller_keeps_jobs_as_they_are(
    cluster_engine: Any, slurm_conf: str
) -> None:
    engine = cluster_engine
    job = await engine.submit(_spec("sleep 8"))
    await eventually(lambda: engine.book.get(job.id).job.status is JobStatus.RUNNING, timeout=30)
    pid = int((CLUSTER_DIR / "slurmctld.pid").read_text())
    os.kill(pid, 19)  # SIGSTOP: the controller hangs (no answer, no refusal)
    try:

        def message() -> str:
            act = engine.book.get(job.id)
            return act.job.message if act is not None else f"ended: {act}"

        await eventually(lambda: "not answering since" in message(), timeout=60)
        assert engine.book.get(job.id).job.status is JobStatus.RUNNING  # nothing guessed
    finally:
        os.kill(pid, 18)  # SIGCONT
    done = await engine.wait(job.id, timeout=60)
    assert done.status is JobStatus.COMPLETED


async def test_a_silent_controller_loses_no_submission_and_no_cancel(
    cluster_engine: Any, slurm_conf: str
) -> None:
    """A job decided, and two cancels asked, while the controller does not answer: once it
    answers again the job is submitted (once) and both cancels reach it."""
    engine = cluster_engine

    def message(job_id: int) -> str:
        act = engine.book.get(job_id)
        return act.job.message if act is not None else "ended"

    hog = await engine.submit(_spec("sleep 120", gpus=4))
    await eventually(lambda: engine.book.get(hog.id).job.status is JobStatus.RUNNING, timeout=30)
    pending = await engine.submit(_spec("sleep 30", gpus=1))
    await eventually(lambda: "waiting for resources" in message(pending.id), timeout=30)
    pid = int((CLUSTER_DIR / "slurmctld.pid").read_text())
    os.kill(pid, 19)  # SIGSTOP: the controller hangs (no answer, no refusal)
    try:
        late = await engine.submit(_spec("echo late-ran"))
        doomed = await engine.submit(_spec("sleep 30; echo doomed-ran"))
        await engine.cancel(pending.id)
        await engine.cancel(hog.id)
        await eventually(lambda: "not answering since" in message(late.id), timeout=60)
        # Still "submitting": the next poll (or a restarted engine) knows it was decided.
        assert message(late.id).startswith("submitting to cluster test, not answering since")
        await engine.cancel(doomed.id)  # (its sbatch went unanswered: the cluster may have it)
        await eventually(lambda: "sent again at the next poll" in message(hog.id), timeout=60)
        assert engine.book.get(hog.id).job.status is JobStatus.RUNNING
        # (the cancel is said while the cluster is silent: it read "queued: cluster test
        # not answering since", as if the cancel was lost: tester h150)
        await eventually(lambda: "not answering since" in message(pending.id), timeout=60)
        assert message(pending.id).startswith("stopping (cancelled by user): cluster test not")
        # Several polls while it is stopped: a stopped controller keeps every sbatch it
        # was sent and takes them all when it wakes; none may be sent twice.
        await asyncio.sleep(8)
    finally:
        os.kill(pid, 18)  # SIGCONT

    def answering() -> bool:
        view = engine.gpus()["clusters"][0]
        return bool(view["answering"]) and view["error"] is None

    # Once it answers, no job still says it does not, and a cancel given meanwhile is
    # still said (both went for 15 s: tester h195).
    await eventually(lambda: engine.gpus()["clusters"][0]["answering"], timeout=60)
    for job_id in (late.id, doomed.id):
        assert "not answering since" not in message(job_id), message(job_id)
    assert message(doomed.id) == "ended" or "cancelled by user" in message(doomed.id)
    ended = await engine.wait(pending.id, timeout=90)
    assert ended.status is JobStatus.CANCELLED and ended.message == "cancelled by user"
    assert ended.exit_code is None  # (it never ran: Slurm's 0:0 is no exit status)
    stopped = await engine.wait(hog.id, timeout=90)
    assert stopped.status is JobStatus.CANCELLED and stopped.exit_code != 0  # (None or 128+N)
    done = await engine.wait(late.id, timeout=90)
    assert done.status is JobStatus.COMPLETED, done.message
    assert engine.log_path(late.id).read_text().count("late-ran") == 1
    gone = await engine.wait(doomed.id, timeout=90)
    assert gone.status is JobStatus.CANCELLED, gone.message
    # What the cluster ran under each one's name: late once, doomed never to its end.
    ran = await asyncio.to_thread(
        _slurm, slurm_conf, "sacct", "-c", "-n", "-X", "-P", "-o", "JobName,State"
    )
    names = [line.split("|") for line in ran.splitlines() if "|" in line]
    slurm_name = engine.clusters.slurm_name
    assert [state for n, state in names if n == slurm_name(late.id)] == ["COMPLETED"]
    assert "COMPLETED" not in [state for n, state in names if n == slurm_name(doomed.id)]
    await eventually(answering, timeout=30)  # (at the next poll and partition read)


async def test_a_prefix_that_runs_a_remote_shell_gets_every_argument_quoted(
    make_engine: EngineFactory, slurm_conf: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ssh hands its arguments, joined by spaces, to a shell on the login node: a cwd
    holding shell code, spaces and quotes (and squeue's ``%i|%T`` format) stay text."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    ssh = tmp_path / "bin" / "ssh"  # what ssh does with its arguments, on this machine
    ssh.parent.mkdir()
    ssh.write_text(f'#!/bin/sh\nshift\ncd {shlex.quote(str(tmp_path))}\nexec sh -c "$*"\n')
    ssh.chmod(0o755)
    settings = {"partition": "gpu", "poll_interval": 0.3, "command_timeout": 5}
    config = make_config(clusters={"remote": {**settings, "command_prefix": [str(ssh), "login1"]}})
    engine = await make_engine("1xA100-80GB", config=config)
    await eventually(lambda: engine.clusters.views()[0].get("nodes") == 1, timeout=20)
    planted = tmp_path / "PLANTED"
    cwd = tmp_path / "it's a dir $(touch PLANTED) `touch PLANTED`; touch PLANTED"
    cwd.mkdir()
    job = await engine.submit({"command": ["pwd"], "cluster": "remote", "cwd": str(cwd)})
    done = await engine.wait(job.id, timeout=60)
    assert done.status is JobStatus.COMPLETED, done.message
    assert engine.log_path(job.id).read_text().strip() == str(cwd)
    assert not planted.exists()


# -- translating Slurm's words --------------------------------------------------------------


def test_slurm_words_and_numbers() -> None:
    assert gres_gpus("gpu:4") == 4 and gres_gpus("gpu:a100:2(S:0-1)") == 2
    assert gres_gpus("gpu:(null):1(IDX:0)") == 1 and gres_gpus(None) == 0
    assert slurm_time("01:00:00") == 3600 and slurm_time("2-00:00:00") == 172800
    assert slurm_time("30") == 1800 and slurm_time("UNLIMITED") is None
    assert (
        pending_words("Priority", "gpu") == "waiting behind higher-priority jobs in partition gpu"
    )
    assert pending_words("QOSMaxGRESPerUser", "gpu") == (
        "held by a QOS or association limit (QOSMaxGRESPerUser)"
    )
    job = {"job_id": 7, "job_state": "FAILED", "exit_code": 3 << 8, "state_reason": "x"}
    (parsed,) = parse_jobs(json.dumps({"jobs": [job]}))
    assert parsed.exit_code == 3 and parsed.signal is None
    newer = {
        "job_id": 8,
        "job_state": ["TIMEOUT"],
        "exit_code": {
            "return_code": {"set": True, "number": 0},
            "signal": {"id": {"set": True, "number": 15}},
        },
    }
    (later,) = parse_jobs(json.dumps({"jobs": [newer]}))
    assert later.state == "TIMEOUT" and later.signal == 15


def test_sacct_lines() -> None:
    text = (
        "12|FAILED|3:0|2026-12-01T03:12:20|2026-12-01T03:12:21|gpulayer-x-1\n"
        "13|CANCELLED by 0|0:0|None|2026-12-01T03:12:21|a|b\n"
        "14|FAILED|0:9|2026-12-01T03:12:20|Unknown|n\n"
    )
    failed, cancelled, killed = parse_sacct(text)
    assert (failed.job_id, failed.exit_code, failed.signal) == ("12", 3, None)
    assert failed.name == "gpulayer-x-1" and failed.end_time is not None
    assert cancelled.state == "CANCELLED" and cancelled.name == "a|b"
    assert cancelled.start_time is None
    assert (killed.exit_code, killed.signal, killed.end_time) == (None, 9, None)
    assert end_of(killed, "")[1:] == (TerminationReason.SIGNAL, "killed by signal 9")
    unknown = SlurmJob("7", "FAILED", "", None, None, None, None)
    assert end_of(unknown, "")[2] == "failed (failed); exit status unknown"  # (not "code None")


def test_a_start_moved_to_its_queueing_moves_its_end_as_far() -> None:
    # Slurm's whole-second start fell before the moment it was queued here (within that
    # second): the start is the queueing, and the end moves with it, so the runtime is
    # Slurm's (3 s ran "2 s": tester h195 #3).
    from gpulayer_tui.engine.cluster_runner import _began, _ended
    from gpulayer_tui.engine.models import Job, JobKind

    job = Job(id=1, name="x", kind=JobKind.COMMAND, spec={}, priority=0)
    job.created_at = job.queued_at = 100.7
    found = SlurmJob("5", "COMPLETED", "", 0, None, 100.0, 103.0)
    job.started_at = _began(job, found)
    assert job.started_at == 100.7
    assert _ended(job, found) == pytest.approx(103.7)
    later = SlurmJob("5", "COMPLETED", "", 0, None, 102.0, 105.0)  # (started after it)
    job.started_at = _began(job, later)
    assert (job.started_at, _ended(job, later)) == (102.0, 105.0)


@pytest.mark.parametrize(
    ("state", "status", "reason"),
    [
        ("COMPLETED", JobStatus.COMPLETED, TerminationReason.EXIT_CODE),
        ("TIMEOUT", JobStatus.FAILED, TerminationReason.TIMEOUT),
        ("NODE_FAIL", JobStatus.FAILED, TerminationReason.DOMAIN_LOST),
        ("OUT_OF_MEMORY", JobStatus.FAILED, TerminationReason.SIGNAL),
        ("CANCELLED", JobStatus.CANCELLED, TerminationReason.CANCELLED),
        ("PREEMPTED", JobStatus.FAILED, TerminationReason.PREEMPTED),
    ],
)
def test_slurm_ends_map_to_the_local_reasons(
    state: str, status: JobStatus, reason: TerminationReason
) -> None:
    job = SlurmJob("1", state, "", 0, None, None, None)
    assert end_of(job, "")[:2] == (status, reason)


def test_the_cli_submits_to_a_cluster_and_shows_it(slurm_conf: str, served: Any) -> None:
    served.env["SLURM_CONF"] = slurm_conf
    served.home.mkdir(mode=0o700, exist_ok=True)
    (served.home / "config.toml").write_text(
        '[clusters.test]\npartition = "gpu"\npoll_interval = 0.3\ncommand_timeout = 5\n'
    )
    served.start("--simulate", "1xA100-80GB")
    out = served.cli(
        "submit",
        "--cluster",
        "test",
        "--gpus",
        "1",
        "--cpus",
        "1",
        "--mem-gb",
        "1",
        "--cwd",
        "/tmp",
        "--",
        "sh",
        "-c",
        "echo on-the-cluster",
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    assert served.cli("wait", job_id).returncode == 0
    status = json.loads(served.cli("status", job_id, "--json").stdout)["job"]
    assert status["cluster"] == "test" and status["cluster_job_id"]
    assert "on-the-cluster" in served.cli("logs", job_id).stdout
    gpus = served.cli("gpus").stdout
    assert "CLUSTER" in gpus and "test" in gpus and "gpu" in gpus
    refused = served.cli("submit", "--cpus", "2", "--", "true")
    assert refused.returncode == 2
    assert "--cpus applies to cluster jobs only: add --cluster NAME" in refused.stderr
    # A cancel of a running cluster job says Slurm stops it (no SIGKILL of ours).
    long = served.cli("submit", "--cluster", "test", "--cwd", "/tmp", "--", "sleep", "60")
    long_id = long.stdout.strip()
    deadline = time.monotonic() + 30
    while json.loads(served.cli("status", long_id, "--json").stdout)["job"]["status"] != "running":
        assert time.monotonic() < deadline, "the cluster job did not start"
        time.sleep(0.1)
    cancel = served.cli("cancel", "--no-wait", long_id)
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.startswith(f"job {long_id} is stopping on cluster test: stopping")
    assert "SIGKILL" not in cancel.stdout
    assert served.cli("wait", long_id).returncode == 1  # (cancelled)


async def test_dependencies_between_cluster_jobs_are_slurms_own(cluster_engine: Any) -> None:
    engine = cluster_engine
    first = await engine.submit(_spec("sleep 2"))
    await eventually(lambda: engine.book.get(first.id).job.cluster_job_id is not None, timeout=30)
    after = await engine.submit(_spec("echo after", depends_on=[first.id]))
    # Submitted at once, held by Slurm (not by the engine) until the first completes.
    await eventually(
        lambda: "waiting for its Slurm dependencies" in engine.book.get(after.id).job.message,
        timeout=30,
    )
    assert (await engine.wait(after.id, timeout=60)).status is JobStatus.COMPLETED
    failing = await engine.submit(_spec("sleep 3; exit 1"))  # (still there to depend on)
    await eventually(lambda: engine.book.get(failing.id).job.cluster_job_id is not None, timeout=30)
    doomed = await engine.submit(_spec("echo never", depends_on=[failing.id]))
    ended = await engine.wait(doomed.id, timeout=60)
    assert ended.status is JobStatus.CANCELLED
    assert ended.termination_reason is TerminationReason.DEPENDENCY_FAILED
    assert f"dependency job {failing.id}" in ended.message


# -- the TUI --------------------------------------------------------------------------------


async def test_the_tui_shows_the_cluster_and_its_jobs_with_logs_and_cancel(
    embedded_app: Any, slurm_conf: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer_tui.screens.dialogs import ConfirmScreen
    from gpulayer_tui.screens.job_detail import JobDetailScreen
    from gpulayer_tui.screens.jobs import JobsScreen
    from gpulayer_tui.widgets.cluster_panel import ClusterPanel
    from gpulayer_tui.widgets.field_list import FieldList
    from gpulayer_tui.widgets.job_table import JobTable
    from gpulayer_tui.widgets.log_tail import LogTail

    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    app = await embedded_app("1xA100-80GB", config=_cluster_config())
    async with app.run_test(size=(160, 45)) as pilot:
        panel = app.screen.query_one(ClusterPanel)

        def panel_text() -> str:
            return str(panel.content) if panel.display else ""

        await until(pilot, lambda: "4 total" in panel_text(), "the cluster panel", timeout=30)
        assert panel_text().startswith("● cluster test · partition gpu · up · 1 node")
        job = await app.backend.submit(_spec("echo from-slurm; sleep 300", gpus=1))
        # The panel follows the cluster: one GPU allocated (partitions are read every
        # few polls), one job.
        await until(
            pilot,
            lambda: "1 allocated · 3 idle · 1 job" in panel_text(),
            "the allocated GPU",
            timeout=30,
        )

        await pilot.press("2")
        assert isinstance(app.screen, JobsScreen)
        table = app.screen.query_one(JobTable)

        def cell(column: str) -> str:
            try:
                return str(table.get_cell(str(job["id"]), column))
            except Exception:
                return ""

        await until(pilot, lambda: cell("status") == "running", "the running row", timeout=30)
        assert cell("domains") == "@test"
        assert "running on cluster test job" in cell("message")

        # Its log and its cancel, as for a local job: open it, read, c then y.
        await pilot.press("g", "enter")
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        await until(pilot, lambda: detail.job is not None, "the job to load")
        assert "cluster test, Slurm job " in detail.query_one("#fields", FieldList).text("domains")
        log = detail.query_one(LogTail)
        await until(pilot, lambda: "from-slurm" in log.lines, "the Slurm output", timeout=20)
        await pilot.press("c")
        confirm = await until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, "confirm"
        )
        # (scancel, not signals: it said "It gets SIGTERM, then SIGKILL": tester h150)
        assert "It is cancelled on cluster test (scancel)." in confirm._question
        await pilot.press("y")
        await until(
            pilot,
            lambda: detail.job is not None and detail.job["status"] == "cancelled",
            "the detail to show cancelled",
            timeout=30,
        )
        assert detail.job["message"] == "cancelled by user"
        cluster_id = detail.job["cluster_job_id"]
        await pilot.press("escape")
        await until(pilot, lambda: cell("status") == "cancelled", "the cancelled row")
    state = await asyncio.to_thread(
        _slurm, slurm_conf, "sacct", "-c", "-X", "-P", "-n", "-o", "State", "-j", cluster_id
    )
    assert state.split() == ["CANCELLED"]  # (scancel reached Slurm)


async def test_a_command_cancelled_in_flight_is_killed_not_left_running(tmp_path: Path) -> None:
    # The engine stopping while a poll ran cancelled it: the command ran on, unreaped, and
    # its open pipes were collected with warnings (a later test's setup failed on them).
    from gpulayer_tui.engine.config import ClusterSettings
    from gpulayer_tui.engine.slurm import SlurmCluster

    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; exec sleep 600"
    cluster = SlurmCluster(
        "c", ClusterSettings(partition="p", command_prefix=["sh", "-c", script, "x"])
    )
    task = asyncio.create_task(cluster.run("squeue"))
    await eventually(lambda: pidfile.exists() and pidfile.read_text().strip())
    pid = int(pidfile.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: pid_gone(pid))


async def test_sbatch_answers_are_read_for_their_job_id_alone(tmp_path: Path) -> None:
    # A login banner a command_prefix's shell printed was kept with the id, and every
    # later squeue and sacct of the cluster, given it, failed: no job of it was followed
    # again, even after a restart (tester h150).
    from gpulayer_tui.engine.config import ClusterSettings
    from gpulayer_tui.engine.slurm import ClusterError, SlurmCluster, parsable_id

    assert parsable_id("Welcome to login1 - maintenance Friday\n64\n") == "64"
    assert parsable_id("812;fed-b\n") == "812"
    with pytest.raises(ClusterError, match=r"printed no job id .*'Submitted batch job banana'"):
        parsable_id("Submitted batch job banana\n")

    def answering(text: str) -> SlurmCluster:
        script = f"cat > /dev/null; printf {shlex.quote(text)}"
        prefix = ["sh", "-c", script, "x"]
        return SlurmCluster("c", ClusterSettings(partition="p", command_prefix=prefix))

    banner = answering("motd: be nice\\n4242\\n")
    assert await banner.submit(["true"], [], {}) == "4242"
    with pytest.raises(ClusterError, match="printed no job id"):
        await answering("\\n").submit(["true"], [], {})
    # (ids that are no number, stored before this, are not given to squeue or sacct)
    assert await answering("").jobs(["Submitted batch job banana"]) == []
    # A refusal is said once as Slurm says it ("sbatch: sbatch: error: ...": h150)
    said = "sbatch: error: Batch job submission failed: Invalid account"
    script = f"cat > /dev/null; echo {shlex.quote(said)} >&2; exit 1"
    refusing = SlurmCluster(
        "c", ClusterSettings(partition="p", command_prefix=["sh", "-c", script, "x"])
    )
    with pytest.raises(ClusterError) as refused:
        await refusing.submit(["true"], [], {})
    assert str(refused.value) == said
