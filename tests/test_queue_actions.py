"""Actions users reach for (issue 20): pause and resume the queue, restart an ended job,
edit a waiting one (its dependencies too)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from gpulayer_tui.engine.engine import EditRecord
from gpulayer_tui.engine.errors import SpecError
from gpulayer_tui.engine.models import JobStatus

from .conftest import EngineFactory, Served
from .raw_http import request


def _status(served: Served, job_id: str) -> dict[str, object]:
    return dict(json.loads(served.cli("status", job_id, "--json").stdout)["job"])


def test_pause_holds_new_starts_across_a_restart_and_resume_lets_them_go(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    running = served.cli("submit", "--", "sleep", "30").stdout.strip()
    paused = served.cli("pause")
    assert paused.returncode == 0 and paused.stdout.startswith("queue paused since")
    # A second pause says it was paused already (the same words as the first: h147).
    again = served.cli("pause")
    assert again.returncode == 0
    assert again.stdout.startswith("the queue was already paused since "), again.stdout
    assert again.stdout.split(" since ")[1] == paused.stdout.split(" since ")[1]
    waiting = served.cli("submit", "--", "true").stdout.strip()
    job = _status(served, waiting)
    assert job["status"] == "queued"
    assert str(job["message"]).startswith("the queue has been paused since")
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
    unknown = served.cli("restart", "999")
    assert unknown.returncode != 0 and "no job 999" in unknown.stderr, unknown.stderr
    # A restart that would end as it is made (its dependency was cancelled) is refused,
    # no id spent; once that dependency is restarted, it waits for the new one.
    dependent = served.cli("submit", "--after", busy, "--", "true").stdout.strip()
    assert served.cli("cancel", busy).returncode == 0
    assert served.cli("wait", dependent).returncode == 1
    again = served.cli("restart", dependent)
    assert again.returncode == 2 and f"restart job {busy} first" in again.stderr, again.stderr
    busy_again = served.cli("restart", busy).stdout.strip()
    again = served.cli("restart", dependent)
    assert again.returncode == 0, again.stderr
    assert _status(served, again.stdout.strip())["spec"]["depends_on"] == [int(busy_again)]  # type: ignore[index]
    assert served.cli("cancel", busy_again).returncode == 0
    # So is one that would fail over capacity again: it made a job that failed at once
    # (tester h192 #5).
    big = served.cli("submit", "--gpus", "3", "--", "true")
    assert big.returncode == 1, big.stderr
    big_id = big.stderr.split("job ")[1].split()[0]
    jobs_before = served.cli("jobs", "--json").stdout
    again = served.cli("restart", big_id)
    assert again.returncode == 2, again
    assert again.stderr == (
        f"gpulayer-tui: job {big_id} would fail again at once, over capacity: requested 3 "
        f"GPUs, but this machine has 1 (submit --like {big_id} with a request this machine can "
        "run)\n"
    )
    assert served.cli("jobs", "--json").stdout == jobs_before  # (no job made)


def test_a_second_restart_while_the_first_runs_is_made_and_said(served: Served) -> None:
    # Two clients restarted one failed job and made two runs of it, neither told (h162).
    served.start("--simulate", "1xA100-80GB")
    first = served.cli("submit", "--", "sleep", "600").stdout.strip()
    assert served.cli("cancel", first).returncode == 0
    once = served.cli("restart", first)
    assert once.returncode == 0 and once.stderr == "", once.stderr
    new = once.stdout.strip()
    twice = served.cli("restart", first)
    assert twice.returncode == 0, twice.stderr
    second = twice.stdout.strip()
    assert twice.stderr == (
        f"gpulayer-tui: warning: job {first} was restarted already: job {new} (running) has "
        f"not ended; job {second} runs it again\n"
    )
    # Every restart that has not ended, not the newest alone: the newest ended, an older
    # one still runs (it went unsaid: tester h166).
    assert served.cli("cancel", second).returncode == 0
    third = served.cli("restart", "--json", first)
    answer = json.loads(third.stdout)
    assert answer["spec"]["restart_of"] == int(first)
    assert f"job {new} (running) has not ended; job {answer['id']} runs" in third.stderr
    for job in (new, str(answer["id"])):
        assert served.cli("cancel", job).returncode == 0
    # Its restarts all ended: a restart now is the usual retry, with nothing to say.
    again = served.cli("restart", first)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    # A restart of a restart runs the same spec: said too.
    assert served.cli("cancel", again.stdout.strip()).returncode == 0
    line = served.cli("restart", new).stdout.strip()
    after = served.cli("restart", first)
    assert f"job {line} (running, a restart of job {new}) has not ended" in after.stderr, after
    for job in (line, after.stdout.strip()):
        assert served.cli("cancel", job).returncode == 0


async def test_two_restarts_of_one_job_at_one_moment_tell_the_second(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine("1xA100-80GB")
    job = await engine.submit({"command": ["sleep", "600"]})
    await engine.cancel(job.id)
    assert (await engine.wait(job.id, timeout=10)).status is JobStatus.CANCELLED
    said: tuple[list[str], list[str]] = ([], [])
    made = await asyncio.gather(
        engine.restart(job.id, warnings=said[0]), engine.restart(job.id, warnings=said[1])
    )
    # One is told at least (it saw the other being made, or made); both may be, each
    # rightly (the other was being made when it looked, and made when it ended).
    assert said[0] or said[1], said
    for words, new in zip(said, made, strict=True):
        assert len(words) <= 1
        for warning in words:
            assert warning.startswith(f"job {job.id} ")
            assert warning.endswith(f"; job {new.id} runs it again")
    assert made[0].id != made[1].id
    for new in made:
        await engine.cancel(new.id)


def test_edit_changes_a_waiting_job_and_refuses_what_cannot_be(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    served.cli("submit", "--gpus", "1", "--", "sleep", "30")
    low = served.cli("submit", "--gpus", "1", "--", "true").stdout.strip()
    high = served.cli("submit", "--gpus", "1", "--", "true").stdout.strip()
    edited = served.cli("edit", low, "--priority", "5", "--vram-gb", "10", "--name", "urgent")
    assert edited.returncode == 0, edited.stderr
    # It says what changed, as the timeline does (only the status was said: tester h89).
    said = edited.stdout.splitlines()
    assert said[0] == (
        f"job {low} edited: priority 0 -> 5, vram_gb none -> 10, name true -> urgent"
    ), said
    assert said[1].startswith("  queued: waiting"), said
    job = _status(served, low)
    assert job["priority"] == 5 and job["name"] == "urgent" and job["status"] == "queued"
    assert job["spec"]["vram_gb"] == 10  # type: ignore[index]
    why = json.loads(served.cli("why", high, "--json").stdout)
    assert why["ahead"] == [int(low)]  # priority 5 now goes before
    detail = json.loads(served.cli("status", low, "--json").stdout)
    edits = [e for e in detail["events"] if e["kind"] == "job.edited"]
    assert edits and "priority 0 -> 5" in edits[0]["message"]
    # A field left out is its default in the record ("gpus none -> 1" read as unset).
    later = served.cli("submit", "--after", "1", "--", "true").stdout.strip()
    assert served.cli("edit", later, "--gpus", "1").returncode == 0
    detail = json.loads(served.cli("status", later, "--json").stdout)
    edits = [e for e in detail["events"] if e["kind"] == "job.edited"]
    assert edits and "gpus 0 -> 1" in edits[0]["message"], edits
    # A VRAM figure given to a CPU job makes it a GPU job: said (it went unsaid: h192 #7),
    # and back again.
    cpu = served.cli("submit", "--after", "1", "--", "true").stdout.strip()
    made = served.cli("edit", cpu, "--vram-gb", "20")
    assert made.stdout.splitlines()[0] == f"job {cpu} edited: vram_gb none -> 20, gpus 0 -> 1"
    back = served.cli("edit", cpu, "--no-vram")
    assert back.stdout.splitlines()[0] == f"job {cpu} edited: vram_gb 20 -> none, gpus 1 -> 0"
    detail = json.loads(served.cli("status", cpu, "--json").stdout)
    edits = [e["message"] for e in detail["events"] if e["kind"] == "job.edited"]
    assert edits == [
        "edited: vram_gb none -> 20, gpus 0 -> 1 (implied: VRAM or a GPU domain asks for a GPU)",
        "edited: vram_gb 20 -> none, gpus 1 -> 0 (implied: with no VRAM or GPU domain it runs "
        "in the cpu pool)",
    ], edits
    # Refused, the job unchanged: more GPUs than the machine has, a field not editable.
    too_big = served.cli("edit", low, "--gpus", "4")
    assert too_big.returncode == 2 and "unable to ever run" in too_big.stderr
    assert _status(served, low)["spec"].get("gpus") == 1  # type: ignore[union-attr]
    running = served.cli("edit", "1", "--priority", "1")
    assert running.returncode != 0 and "only a waiting job is edited" in running.stderr
    # Dependencies: replaced as a whole, or cleared.
    waits = served.cli("edit", high, "--after", low, "--after-any", "1")
    assert waits.returncode == 0, waits.stderr
    assert _status(served, high)["message"] == f"waiting for jobs 1, {low}"
    both = served.cli("edit", high, "--after", low, "--no-deps")
    assert both.returncode == 2 and "--no-deps contradicts" in both.stderr
    assert served.cli("edit", high, "--no-deps").returncode == 0
    assert _status(served, high)["spec"]["depends_on"] == []  # type: ignore[index]
    served.stop()  # the edit is stored: a restarted engine has it
    served.start("--simulate", "1xA100-80GB")
    job = _status(served, low)
    assert job["priority"] == 5 and job["name"] == "urgent"


_THREAD_ID = (
    "import sys, threading\n"
    "t = threading.Thread(target=lambda: (print(threading.get_native_id(), flush=True),"
    " sys.stdin.read()))\n"
    "t.start(); t.join()\n"
)


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
    assert owned.returncode == 2 and f"is job {job}'s" in owned.stderr
    assert f"cancel job {job} instead" in owned.stderr
    # A thread's id: /proc answers for it, but it is not a process ("no process" was said).
    with subprocess.Popen(
        [sys.executable, "-c", _THREAD_ID], stdout=subprocess.PIPE, stdin=subprocess.PIPE
    ) as threaded:
        assert threaded.stdout is not None
        tid = int(threaded.stdout.readline())
        thread = served.cli("signal", str(tid))
        assert thread.returncode == 2
        assert f"pid {tid} is a thread of process {threaded.pid}, not a process" in thread.stderr
        adopted = served.cli("adopt", "--pid", str(tid))
        assert f"pid {tid} is a thread of process {threaded.pid}: adopt {threaded.pid}" in (
            adopted.stdout + adopted.stderr
        )
        # What the TUI's adopt dialog asks first says so too (it described the thread as
        # a process, with its process's command line: tester h197).
        status, info = request(served.home / "engine.sock", "GET", f"/v1/processes/{tid}")
        assert status == 200 and info["refused"] == (
            f"pid {tid} is a thread of process {threaded.pid}: adopt {threaded.pid} instead"
        ), info
        threaded.kill()
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
    # A long command line is cut with a mark (cut bare, it read as a whole command that
    # ended "signal.signal(signal.SIGTERM,)": tester h97).
    wait = "import time; time.sleep(600)"
    long_line = [sys.executable, "-c", wait, *(f"arg{n:03d}" for n in range(40))]
    with subprocess.Popen(long_line, stderr=subprocess.DEVNULL) as wordy:
        SimLedger(served.home).hold(0, wordy.pid, 1.0)
        wait_for(lambda: str(wordy.pid) in served.cli("gpus").stdout)
        said = served.cli("signal", str(wordy.pid)).stdout.strip()
        wordy.wait(timeout=20)
    assert said.endswith("…)") and "arg039" not in said, said


async def test_edit_replaces_a_waiting_jobs_dependencies_and_refuses_circles(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine("1xA100-80GB")
    blocker = await engine.submit({"command": ["sleep", "600"], "gpus": 1})
    other = await engine.submit({"command": ["sleep", "600"]})  # a CPU job, running
    after = await engine.submit({"command": ["true"], "depends_on": [blocker.id]})
    assert after.message == f"waiting for job {blocker.id}"
    # Nothing to wait for any more: it runs now.
    edited = await engine.edit(after.id, {"depends_on": []})
    assert edited.spec["depends_on"] == []
    assert (await engine.wait(after.id, timeout=10)).status is JobStatus.COMPLETED
    # A job queued for the GPU is made to wait for another job (any outcome) as well.
    queued = await engine.submit({"command": ["true"], "gpus": 1})
    assert queued.status is JobStatus.QUEUED
    twice = {"job": other.id, "any_exit": True}
    await engine.edit(queued.id, {"depends_on": [twice, twice]})  # (one dependency)
    assert engine.book.get(queued.id).job.message == f"waiting for job {other.id}"
    said = [
        e["data"]["message"] for e in await engine.events_of(queued.id) if e["kind"] == "job.edited"
    ]
    # (as kept: it said "none -> 7 (any end), 7 (any end)" of one dependency: tester h47)
    assert said == [f"edited: after none -> {other.id} (any end)"], said
    follower = await engine.submit({"command": ["true"], "depends_on": [queued.id]})
    # Refused, the job unchanged: itself, a circle, an unknown id, a failed dependency.
    answers: dict[str, str] = {}
    expected: dict[str, str] = {}
    for deps, words in [
        ([queued.id], f"job {queued.id} cannot wait for itself"),
        ([follower.id], f"job {follower.id} waits for job {queued.id}"),
        ([999], "no job 999"),
    ]:
        try:
            await engine.edit(queued.id, {"depends_on": deps})
        except SpecError as refused:
            answers[str(deps)] = words if words in str(refused) else str(refused)
        else:
            answers[str(deps)] = "accepted"
        expected[str(deps)] = words
    # Every case is tried before one assertion: a failing case does not hide the rest.
    assert answers == expected
    failed = await engine.submit({"command": ["false"]})
    assert (await engine.wait(failed.id, timeout=10)).status is JobStatus.FAILED
    with pytest.raises(SpecError, match=f"job {failed.id} ended failed"):
        await engine.edit(queued.id, {"depends_on": [failed.id]})
    assert engine.book.get(queued.id).job.message == f"waiting for job {other.id}"
    timeline = await engine.events_of(queued.id)
    assert any("edited: after " in str(e["data"].get("message")) for e in timeline)
    # The GPU frees up, but it still waits for the other job; that one's end lets it go.
    await engine.cancel(blocker.id)
    await engine.wait(blocker.id, timeout=10)
    later = await engine.submit({"command": ["true"], "gpus": 1})  # (were it ready, it'd go first)
    assert (await engine.wait(later.id, timeout=10)).status is JobStatus.COMPLETED
    assert engine.book.get(queued.id).job.status is JobStatus.QUEUED
    await engine.cancel(other.id)
    assert (await engine.wait(queued.id, timeout=10)).status is JobStatus.COMPLETED
    assert (await engine.wait(follower.id, timeout=10)).status is JobStatus.COMPLETED


async def test_signalling_another_users_stray_is_forbidden_not_a_bad_request(
    make_engine: EngineFactory, sleeper: int
) -> None:
    from gpulayer_tui.engine.access import Forbidden
    from gpulayer_tui.engine.simulate import SimLedger

    engine = await make_engine("1xA100-80GB")
    SimLedger(engine.paths.state_dir).hold(0, sleeper, 10.0)
    await engine.sampler.sample_once()
    # (It was a SpecError: a 400 naming the pid, where the API says 403 for "this uid
    # may not do that".)
    with pytest.raises(Forbidden, match="may signal only its own processes"):
        engine.signal_process(sleeper, "TERM", None, requester_uid=os.geteuid() + 12345)


async def test_a_waiting_gpu_job_edited_to_no_gpu_drops_its_vram(
    make_engine: EngineFactory,
) -> None:
    # "vram_gb is per GPU, but gpus is 0", and vram_gb 0 is no value: it could not be made
    # a CPU job at all.
    engine = await make_engine()
    first = await engine.submit({"command": ["sleep", "60"]})
    waiting = await engine.submit(
        {"command": ["true"], "gpus": 1, "vram_gb": 20, "depends_on": [first.id]}
    )
    edited = await engine.edit(waiting.id, {"gpus": 0})
    assert edited.spec.get("gpus") == 0 and edited.spec.get("vram_gb") is None
    timeline = [e.get("message", "") for e in await engine.events_of(waiting.id)]
    assert any("vram_gb 20 -> none" in m for m in timeline), timeline
    await engine.cancel(first.id)


async def test_a_gpu_count_left_out_is_said_as_the_one_its_vram_asks_for(
    make_engine: EngineFactory,
) -> None:
    # A job asking for a GPU by its VRAM alone: "gpus 0 -> 2" (read as a CPU job made a
    # GPU one), and its count cleared "gpus 2 -> 0" (tester h103); it asks for 1.
    engine = await make_engine("2xA100-80GB")
    await engine.pause()
    waiting = await engine.submit({"command": ["true"], "vram_gb": 10})
    await engine.edit(waiting.id, {"gpus": 2})
    await engine.edit(waiting.id, {"gpus": None})
    timeline = [
        e["message"] for e in await engine.events_of(waiting.id) if e["kind"] == "job.edited"
    ]
    assert timeline == ["edited: gpus 1 -> 2", "edited: gpus 2 -> 1"], timeline
    await engine.resume()


async def test_a_null_gpu_count_that_is_the_jobs_own_changes_nothing(
    make_engine: EngineFactory,
) -> None:
    # gpus: null (back to the default) of a 1-GPU job with a VRAM amount answered
    # "changed" and wrote "gpus 1 -> 1" (tester h143); of a 2-GPU job it is 0 GPUs (the
    # default, as documented), said as such.
    engine = await make_engine("2xA100-80GB")
    await engine.pause()
    one = await engine.submit({"command": ["true"], "gpus": 1, "vram_gb": 10})
    record = EditRecord()
    await engine.edit(one.id, {"gpus": None}, record)
    assert record.after == record.before, (record.before, record.after)
    assert [e for e in await engine.events_of(one.id) if e["kind"] == "job.edited"] == []
    two = await engine.submit({"command": ["true"], "gpus": 2})
    await engine.edit(two.id, {"gpus": None})
    timeline = [e["message"] for e in await engine.events_of(two.id) if e["kind"] == "job.edited"]
    assert timeline == ["edited: gpus 2 -> 0"], timeline
    await engine.resume()


async def test_renaming_a_default_named_job_says_the_name_it_had(
    make_engine: EngineFactory,
) -> None:
    # A job named after its program shows "sleep" everywhere; its rename read
    # "name none -> nightly".
    engine = await make_engine()
    first = await engine.submit({"command": ["sleep", "60"]})
    waiting = await engine.submit({"command": ["sleep", "1"], "depends_on": [first.id]})
    assert waiting.name == "sleep"
    renamed = await engine.edit(waiting.id, {"name": "nightly"})
    assert renamed.name == "nightly"
    timeline = [e.get("message", "") for e in await engine.events_of(waiting.id)]
    assert "edited: name sleep -> nightly" in timeline, timeline
    await engine.cancel(first.id)


async def test_actions_that_take_no_fields_refuse_them_and_do_nothing(
    make_engine: EngineFactory,
) -> None:
    # A restart "with" other GPUs ran the old spec; a cancel or pause with fields did its
    # plain thing: the fields were dropped without a word.
    import asyncio

    from gpulayer_tui.engine.api import ApiServer

    from .raw_http import request

    engine = await make_engine()
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    try:
        sock = engine.paths.socket
        done = await engine.submit({"command": ["true"], "gpus": 0})
        await engine.wait(done.id, timeout=10)
        running = await engine.submit({"command": ["sleep", "60"], "gpus": 0})
        asks = [
            (f"/v1/jobs/{done.id}/restart", {"gpus": 2}, "gpus", "a restart takes no fields"),
            (f"/v1/jobs/{running.id}/cancel", {"force": True}, "force", "a cancel takes no"),
            ("/v1/queue/pause", {"until": 5}, "until", "pausing the queue takes no fields"),
            ("/v1/queue/resume", [1], None, "resuming the queue takes no fields"),
        ]
        for path, body, field, says in asks:
            status, data = await asyncio.to_thread(request, sock, "POST", path, body)
            assert status == 400 and says in data["error"], (path, data)
            assert data.get("field") == field, data
        # A JSON null is refused as [] is (it cancelled: tester h128).
        from .raw_http import UnixHTTPConnection

        conn = UnixHTTPConnection(sock)
        try:
            cancel = f"/v1/jobs/{running.id}/cancel"
            status, data, _ = await asyncio.to_thread(conn.call, "POST", cancel, b"null")
        finally:
            conn.close()
        assert status == 400 and "a cancel takes no fields, and was given a body" in data["error"]
        assert len(await engine.list_jobs()) == 2  # (no restart made)
        assert (await engine.get(running.id)).status is JobStatus.RUNNING
        assert engine.paused_at is None
        # Empty bodies (and none) are the plain actions.
        status, _ = await asyncio.to_thread(request, sock, "POST", "/v1/queue/pause", {})
        assert status == 200 and engine.paused_at is not None
        status, _ = await asyncio.to_thread(request, sock, "POST", "/v1/queue/resume")
        assert status == 200 and engine.paused_at is None
        status, _ = await asyncio.to_thread(
            request, sock, "POST", f"/v1/jobs/{running.id}/cancel", {}
        )
        assert status == 202
    finally:
        await server.stop()


def test_why_says_a_capacity_the_reason_says_already_once() -> None:
    # `why` printed the same words on its reason and capacity lines (tester h169).
    from gpulayer_tui.formatting import why_rows

    words = "waiting for GPU 1 (dev): not found by the driver"
    data = {"job": 39, "reason": words, "capacity": words}
    assert "capacity" not in [label for label, _ in why_rows(data)]
    other = {**data, "capacity": "needs 2 GPUs; 1 is here"}
    assert ("capacity", "needs 2 GPUs; 1 is here") in why_rows(other)


async def test_a_stopped_stray_is_continued_to_take_a_sigterm(
    make_engine: EngineFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # "SIGTERM sent to pid N", and nothing happened to a stray stopped with ctrl+z: the
    # signal waits until it is continued (tester h171).
    import signal

    from gpulayer_tui.engine.simulate import SimLedger

    engine = await make_engine("1xA100-80GB")
    SimLedger(engine.paths.state_dir).hold(0, sleeper_proc.pid, 10.0)
    await engine.sampler.sample_once()
    os.kill(sleeper_proc.pid, signal.SIGSTOP)
    said = engine.signal_process(sleeper_proc.pid, "TERM", None, requester_uid=os.geteuid())
    assert said.startswith(f"SIGTERM sent to pid {sleeper_proc.pid}")
    assert sleeper_proc.wait(timeout=10) == -signal.SIGTERM
