"""Cancelling many jobs at once: ``POST /v1/jobs/cancel`` and ``gpulayer-tui cancel`` of
many ids, over a real engine on its real socket (one request per id took 19 s for
15,000 ids, and an engine lost in the middle left the caller unable to tell which were
cancelled: tester h106)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from .conftest import REPO, Served, wait_for
from .raw_http import request


def _submit_many(served: Served, count: int) -> list[int]:
    lines = "".join(f"sleep 600 # {n}\n" for n in range(count))
    out = served.cli("submit", "--file", "-", "--json", input=lines)
    assert out.returncode == 0, out.stderr
    return [int(row["id"]) for row in json.loads(out.stdout)]


def _statuses(served: Served) -> dict[int, str]:
    rows = json.loads(served.cli("jobs", "--json", "--limit", "100000").stdout)
    return {int(row["id"]): str(row["status"]) for row in rows}


def test_the_api_cancels_many_ids_in_one_request_each_answered(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    done = int(served.cli("submit", "--", "true").stdout.strip())
    assert served.cli("wait", str(done)).returncode == 0
    assert served.cli("pause").returncode == 0
    queued = _submit_many(served, 3)
    socket = served.home / "engine.sock"
    status, data = request(socket, "POST", "/v1/jobs/cancel", {"ids": [*queued, done, 999]})
    assert status == 200, data
    answers = data["jobs"]
    assert [a.get("id") for a in answers] == [*queued, done, 999]
    assert [a.get("status") for a in answers[:3]] == ["cancelled"] * 3
    assert answers[3]["status"] == 409 and answers[3]["job"]["id"] == done
    assert "already" in answers[3]["error"]
    assert answers[4] == {"id": 999, "error": "no job 999", "status": 404}
    # Asked again: each is cancelled already (the state asked for), its job said.
    status, data = request(socket, "POST", "/v1/jobs/cancel", {"ids": queued})
    assert [(a["status"], a["job"]["status"]) for a in data["jobs"]] == [(409, "cancelled")] * 3
    for body, said in (
        ({"ids": []}, "ids is empty: give the jobs to cancel"),
        ({"ids": [1, "2"]}, 'ids: a job id is a positive integer, not "2"'),
        ({"ids": [True]}, "ids: a job id is a positive integer, not true"),
        ({"ids": [0]}, "ids: a job id is a positive integer, not 0"),
        ([1, 2], 'expected {"ids": [job ids]}'),
        ({}, 'expected {"ids": [job ids]}'),
    ):
        status, data = request(socket, "POST", "/v1/jobs/cancel", body)
        assert (status, data) == (400, {"error": said, "field": "ids"}), body
    # A field it does not take is named (it was "ids" at fault: tester h111).
    for body, field in (({"jobs": [1]}, "jobs"), ({"ids": [1], "force": True}, "force")):
        status, data = request(socket, "POST", "/v1/jobs/cancel", body)
        said = f"expected {{\"ids\": [job ids]}}: unknown key '{field}'"
        assert (status, data) == (400, {"error": said, "field": field}), body


def test_cli_cancels_thousands_of_ids_and_waits_out_an_engine_lost_midway(
    served: Served,
) -> None:
    served.start("--simulate", "1xA100-80GB")
    assert served.cli("pause").returncode == 0
    ids = _submit_many(served, 2500)
    out = served.cli("cancel", ",".join(map(str, ids[:1200])))
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout.splitlines()) == 1200
    statuses = _statuses(served)
    assert {statuses[i] for i in ids[:1200]} == {"cancelled"}
    assert {statuses[i] for i in ids[1200:]} == {"queued"}

    # The engine stops answering as the CLI asks (frozen): the CLI says so, waits for it
    # and asks again; every cancel is made once, none is unknown.
    assert served.proc is not None
    engine_pid = served.proc.pid
    os.kill(engine_pid, signal.SIGSTOP)
    resumed = threading.Event()
    try:
        cancel = subprocess.Popen(
            [sys.executable, "-m", "gpulayer_tui", "cancel", ",".join(map(str, ids[1200:]))],
            env={**served.env, "GPULAYER_TIMEOUT": "3"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        assert cancel.stderr is not None
        said = cancel.stderr.readline()
        assert said.startswith("gpulayer-tui: lost the engine; asking again for the 1,300 "), said
        os.kill(engine_pid, signal.SIGCONT)
        resumed.set()
        out_text, err_text = cancel.communicate(timeout=120)
    finally:
        if not resumed.is_set():
            os.kill(engine_pid, signal.SIGCONT)
    assert cancel.returncode == 0, err_text[-2000:]
    # (each said once: cancelled by this ask, or found cancelled by the first one)
    told = [*out_text.splitlines(), *err_text.splitlines()]  # (its first line was read)
    assert len(told) == 1300, (out_text[-500:], err_text[-500:])
    assert all(" cancelled: " in line or "was cancelled already" in line for line in told)
    wait_for(lambda: set(_statuses(served).values()) == {"cancelled"}, timeout=30)


def test_a_chain_cancelled_by_all_its_ids_names_each_once(served: Served) -> None:
    # `cancel A B C` of C --after B --after A named B and C as going with A, B again with
    # its own cause, C as going with B, then as cancelled already (tester h111).
    served.start("--simulate", "1xA100-80GB")
    # With its head running or waiting, each is cancelled by the user, not found
    # "cancelled already" by this request's cascade (tester h113).
    for head in (["--", "sleep", "600"], ["--gpus", "1", "--after", "999999", "--", "true"]):
        first = served.cli("submit", *head).stdout.strip()
        if not first:  # (an unknown --after is refused: a paused queue holds it instead)
            assert served.cli("pause").returncode == 0
            first = served.cli("submit", "--", "sleep", "600").stdout.strip()
        second = served.cli("submit", "--after", first, "--", "true").stdout.strip()
        third = served.cli("submit", "--after", second, "--", "true").stdout.strip()
        out = served.cli("cancel", "--no-wait", first, second, third)
        assert out.returncode == 0, out.stderr
        said = out.stdout + out.stderr
        lines = [line.removeprefix("gpulayer-tui: ") for line in said.splitlines()]
        for job_id in (first, second, third):  # (each the subject of one line)
            assert sum(line.startswith(f"job {job_id} ") for line in lines) == 1, said
        assert len(lines) == 3 and "cancelled too" not in said, said
        assert "already" not in said, said
        statuses = _statuses(served)
        assert {statuses[int(i)] for i in (first, second, third)} == {"cancelled"}
