"""Actions users reach for (issue 20): pause and resume the queue, restart an ended job."""

from __future__ import annotations

import json

from .conftest import Served


def _status(served: Served, job_id: str) -> dict[str, object]:
    return dict(json.loads(served.cli("status", job_id, "--json").stdout)["job"])


def test_pause_holds_new_starts_across_a_restart_and_resume_lets_them_go(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    running = served.cli("submit", "--", "sleep", "30").stdout.strip()
    paused = served.cli("pause")
    assert paused.returncode == 0 and "queue paused since" in paused.stdout
    waiting = served.cli("submit", "--", "true").stdout.strip()
    job = _status(served, waiting)
    assert job["status"] == "queued"
    assert str(job["message"]).startswith("the queue is paused since")
    assert _status(served, running)["status"] == "running"  # (running jobs go on)
    served.stop()
    served.start("--simulate", "1xA100-80GB")  # still paused after a restart
    assert _status(served, waiting)["status"] == "queued"
    assert served.cli("resume").returncode == 0
    assert served.cli("wait", waiting).returncode == 0


def test_restart_submits_an_ended_job_again_and_refuses_an_active_one(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    first = served.cli("submit", "--name", "again", "--", "sh", "-c", "echo run").stdout.strip()
    assert served.cli("wait", first).returncode == 0
    again = served.cli("restart", first)
    assert again.returncode == 0, again.stderr
    new_id = again.stdout.strip()
    assert new_id != first
    assert served.cli("wait", new_id).returncode == 0
    job = _status(served, new_id)
    assert job["name"] == "again"
    assert job["spec"]["restart_of"] == int(first)  # type: ignore[index]
    assert served.cli("logs", new_id).stdout == "run\n"
    busy = served.cli("submit", "--", "sleep", "30").stdout.strip()
    refused = served.cli("restart", busy)
    assert refused.returncode != 0 and "only an ended job restarts" in refused.stderr
    assert (
        "no job 999" in served.cli("restart", "999").stderr
        or served.cli("restart", "999").returncode != 0
    )


def test_edit_changes_a_waiting_job_and_refuses_what_cannot_be(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    served.cli("submit", "--gpus", "1", "--", "sleep", "30")
    low = served.cli("submit", "--gpus", "1", "--", "true").stdout.strip()
    high = served.cli("submit", "--gpus", "1", "--", "true").stdout.strip()
    edited = served.cli("edit", low, "--priority", "5", "--vram-gb", "10", "--name", "urgent")
    assert edited.returncode == 0, edited.stderr
    job = _status(served, low)
    assert job["priority"] == 5 and job["name"] == "urgent" and job["status"] == "queued"
    assert job["spec"]["vram_gb"] == 10  # type: ignore[index]
    why = json.loads(served.cli("why", high, "--json").stdout)
    assert why["ahead"] == [int(low)]  # priority 5 now goes before
    detail = json.loads(served.cli("status", low, "--json").stdout)
    edits = [e for e in detail["events"] if e["kind"] == "job.edited"]
    assert edits and "priority 0 -> 5" in edits[0]["message"]
    # Refused, the job unchanged: more GPUs than the machine has, a field not editable.
    too_big = served.cli("edit", low, "--gpus", "4")
    assert too_big.returncode == 2 and "unable to ever run" in too_big.stderr
    assert _status(served, low)["spec"].get("gpus") == 1  # type: ignore[union-attr]
    running = served.cli("edit", "1", "--priority", "1")
    assert running.returncode != 0 and "only a waiting job is edited" in running.stderr
    served.stop()  # the edit is stored: a restarted engine has it
    served.start("--simulate", "1xA100-80GB")
    job = _status(served, low)
    assert job["priority"] == 5 and job["name"] == "urgent"


def test_signal_a_stray_gpu_process_and_nothing_else(served: Served, sleeper: int) -> None:
    import subprocess

    from gpulayer_tui.engine.simulate import SimLedger

    from .conftest import pid_gone, wait_for

    served.start("--simulate", "1xA100-80GB")
    SimLedger(served.home).hold(0, sleeper, 10.0)
    wait_for(lambda: str(sleeper) in served.cli("gpus").stdout)
    bad = served.cli("signal", str(sleeper), "--signal", "SEGV")
    assert bad.returncode == 2 and "signal: one of TERM" in bad.stderr
    init = served.cli("signal", "1")
    assert init.returncode == 2 and "init process" in init.stderr
    job = served.cli("submit", "--", "sleep", "30").stdout.strip()
    job_pid = str(_status(served, job)["pid"])
    owned = served.cli("signal", job_pid)
    assert owned.returncode == 2 and f"belongs to job {job}" in owned.stderr
    with subprocess.Popen(["sleep", "60"]) as elsewhere:
        not_gpu = served.cli("signal", str(elsewhere.pid))
        elsewhere.kill()
    assert not_gpu.returncode == 2 and "not a stray GPU process" in not_gpu.stderr
    wrong = served.cli("signal", str(sleeper), "--start-ticks", "1")
    assert wrong.returncode == 2 and "the pid was reused" in wrong.stderr
    done = served.cli("signal", str(sleeper))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"SIGTERM sent to pid {sleeper} (sleep 600")
    wait_for(lambda: pid_gone(sleeper))
