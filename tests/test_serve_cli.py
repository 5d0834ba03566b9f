"""The headless engine and the CLI, as users run them: real processes, real Unix socket."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import resource
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer_tui.backend import SocketBackend
from gpulayer_tui.engine.paths import Paths
from gpulayer_tui.engine.serve import QuietRepeats
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.wire import ROW_SPEC_KEYS

from .conftest import REPO, EngineFactory, Served, eventually, make_config, wait_for
from .raw_http import request, send_raw


def _ids(served: Served) -> list[int]:
    out = served.cli("jobs", "--json", "--limit", "1000")
    assert out.returncode == 0, out.stderr
    return [j["id"] for j in json.loads(out.stdout)]


def test_submit_status_logs_wait_end_to_end(served: Served, tmp_path: object) -> None:
    served.start("--simulate", "2xA100-80GB")
    sub = served.cli("submit", "--name", "greet", "--", "sh", "-c", "echo hi from $PWD")
    assert sub.returncode == 0, sub.stderr
    job_id = int(sub.stdout.strip())
    waited = served.cli("wait", str(job_id))
    assert waited.returncode == 0
    assert waited.stdout.strip() == f"job {job_id} completed, exit code 0: exited with code 0"
    logs = served.cli("logs", str(job_id))
    assert logs.stdout == f"hi from {REPO}\n"  # the CLI's cwd (Served runs it in REPO)
    status = served.cli("status", str(job_id), "--json")
    data = json.loads(status.stdout)
    assert data["job"]["name"] == "greet" and data["job"]["status"] == "completed"
    assert [e["status"] for e in data["events"]] == ["pending", "running", "completed"]
    human = served.cli("status", str(job_id))
    # (the reason only where the message does not say it: "completed (exit_code)" above
    # "exited with code 0")
    assert "status      completed\n" in human.stdout and "timeline" in human.stdout
    table = served.cli("jobs")
    assert "greet" in table.stdout and "completed" in table.stdout


def test_serve_v_logs_each_job_change_and_what_a_restart_took_back(served: Served) -> None:
    # `--serve -v` logged schema migrations and the start and stop, nothing of the jobs,
    # nor what a restart re-attached (tester h140).
    served.start("--simulate", "1xA100-80GB", "-v")
    done = served.cli("submit", "--name", "[b]x[/b]", "--", "true").stdout.strip()
    assert served.cli("wait", done).returncode == 0
    running = served.cli("submit", "--", "sleep", "600").stdout.strip()
    served.stop()
    served.start("--simulate", "1xA100-80GB", "-v")
    served.cli("cancel", running)
    assert served.cli("wait", running).returncode != 0
    log = served.stop()
    assert f"job {done} '[b]x[/b]': running -> completed" in log, log
    assert f"took back 1 active job: 1 running ({running}), 0 waiting" in log, log
    assert f"job {running} 'sleep': running -> cancelled (cancelled)" in log, log


def test_the_serve_log_writes_control_characters_as_text() -> None:
    from gpulayer_tui.engine.serve import PrintableFormatter

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "said: %s", ("a\x1b[2Jb",), None)
    assert PrintableFormatter("%(message)s").format(record) == "said: a\\x1b[2Jb"


def test_failed_job_exit_codes(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    sub = served.cli("submit", "--shell", "--", "exit 4")
    job_id = sub.stdout.strip()
    assert served.cli("wait", job_id).returncode == 1
    status = served.cli("status", job_id)
    assert status.returncode == 1 and "exited with code 4" in status.stdout
    over = served.cli("submit", "--gpus", "3", "--", "true")
    assert over.returncode == 1
    assert "over_capacity): requested 3 GPUs, but this machine has 2" in over.stderr
    assert served.cli("wait", over.stdout.strip()).returncode == 1


def test_queued_reason_cancel_and_follow_logs(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    running = served.cli(
        "submit", "--gpus", "1", "--", "sh", "-c", "echo start; sleep 60"
    ).stdout.strip()
    queued = served.cli("submit", "--gpus", "1", "--", "true").stdout.strip()
    data = json.loads(served.cli("status", queued, "--json").stdout)["job"]
    assert data["status"] == "queued"
    assert data["message"] == f"waiting for gpu0: slot held by job {running}"
    # GPUS: where a job runs (#0, never a bare 0 that reads as "no GPUs"), else how many
    # it asks for (x1), as the TUI's jobs table says it.
    table = served.cli("jobs").stdout.splitlines()
    assert table[0].split()[:6] == ["ID", "NAME", "USER", "STATUS", "DOMAINS", "GPUS"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows[running][2] == pwd.getpwuid(os.getuid()).pw_name  # whose job each is
    assert "#0" in rows[running] and "\N{MULTIPLICATION SIGN}1" in rows[queued]
    follower = subprocess.Popen(
        [*_cli_argv(), "logs", "-f", running],
        env=served.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    cancelled = served.cli("cancel", running)
    assert cancelled.returncode == 0
    assert cancelled.stdout.strip() == f"job {running} cancelled: cancelled by user"
    out, _ = follower.communicate(timeout=20)
    assert follower.returncode == 0
    assert out.startswith("start\n--- gpulayer-tui sent SIGTERM (SIGKILL 10 s later "), out
    assert served.cli("wait", queued).returncode == 0
    # Cancelled already: the state asked for, said, and no failure (a cleanup of a
    # pipeline's ids under `set -e` stopped at a job a dependency's cancel had ended).
    again = served.cli("cancel", running)
    assert again.returncode == 0, again.stderr
    assert again.stderr == f"gpulayer-tui: job {running} was cancelled already: cancelled by user\n"
    done = served.cli("submit", "--", "true").stdout.strip()
    assert served.cli("wait", done).returncode == 0
    ended = served.cli("cancel", done)
    assert ended.returncode == 1 and f"job {done} already completed" in ended.stderr


def _cli_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "gpulayer_tui"]


def test_dependencies_and_batch_file(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    lines = "echo one\n# a comment\n\necho two\nexit 2\n"
    batch = served.cli("submit", "--file", "-", input=lines)
    assert batch.returncode == 0, batch.stderr
    first, second, third = batch.stdout.split()
    assert served.cli("wait", second).returncode == 0
    after = served.cli("submit", "--after", third, "--", "true").stdout.strip()
    after_any = served.cli("submit", "--after-any", third, "--", "true").stdout.strip()
    assert served.cli("wait", after).returncode == 1
    assert "dependency job" in served.cli("status", after).stdout
    assert served.cli("wait", after_any).returncode == 0
    assert served.cli("wait", first).returncode == 0


def test_gpus_shows_unregistered_vram_from_the_ledger(served: Served, sleeper: int) -> None:
    served.start("--simulate", "1xH200-141GB,1xL4-24GB")
    SimLedger(served.home).hold(1, sleeper, 20.0)
    wait_for(
        lambda: (
            json.loads(served.cli("gpus", "--json").stdout)["unregistered_total"] == 20 * 1024**3
        )
    )
    data = json.loads(served.cli("gpus", "--json").stdout)
    assert [d["name"] for d in data["domains"]] == ["gpu0", "gpu1", "cpu"]
    proc = data["domains"][1]["processes"][0]
    assert proc["pid"] == sleeper and proc["job_id"] is None and "sleep" in proc["command"]
    human = served.cli("gpus").stdout
    assert "Simulated L4" in human and "unregistered VRAM: 20.0 GiB" in human
    assert str(sleeper) in human
    # A GPU whose reads fail shows its last good read's figures as such (they read live).
    SimLedger(served.home).set_gpu(1, failed=True, error="read timed out")
    # (said once, in one pair of brackets: tester h102)
    wait_for(lambda: "(read timed out; last " in served.cli("gpus").stdout)
    row = next(line for line in served.cli("gpus").stdout.splitlines() if line.startswith("gpu1"))
    assert "%?" in row and "C?" in row and "?/" in row, row  # (its memory too: h102)


def test_a_jobs_process_on_a_gpu_it_does_not_hold_is_listed_with_the_memory_it_holds(
    served: Served,
) -> None:
    # Counted as unregistered on that GPU (no reservation there covers it), yet no row
    # showed it: "unregistered VRAM: 7.0 GiB" and nothing under it.
    served.start("--simulate", "2xA100-80GB")
    job = json.loads(served.cli("submit", "--json", "--", "sleep", "600").stdout)
    SimLedger(served.home).hold(1, job["pid"], 7.0)
    wait_for(
        lambda: json.loads(served.cli("gpus", "--json").stdout)["unregistered_total"] == 7 * 1024**3
    )
    human = served.cli("gpus").stdout
    row = next(line for line in human.splitlines() if line.startswith(str(job["pid"])))
    assert "gpu1" in row and "7.0" in row and f"job {job['id']}'s, outside its GPUs: sleep" in row
    assert served.cli("cancel", str(job["id"])).returncode == 0


def test_bad_input_is_refused_and_changes_nothing(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    assert served.cli("submit", "--", "true").returncode == 0
    before = _ids(served)
    cases = [
        (["submit", "--gpus", "two", "--", "true"], 2, "expected a whole number"),
        (["submit", "--vram-gb", "-3", "--", "true"], 2, "must be greater than 0"),
        (["submit", "--domain", "gpu9", "--", "true"], 2, "unknown domain 'gpu9'"),
        (["submit", "--after", "77", "--", "true"], 2, "--after: no job 77"),
        (["submit", "--env", "NOEQUALS", "--", "true"], 2, "--env expects KEY=VALUE"),
        (["submit"], 2, "submit needs a command"),
        (["submit", "--file", "/nonexistent/list"], 2, "No such file or directory"),
        (["status", "abc"], 2, "a job id is a number"),
        (["status", "0"], 2, "a job id is 1 or more"),
        (["status", "4040"], 2, "no job 4040"),
        (["wait", "4040"], 2, "no job 4040"),
        (["logs", "4040"], 2, "no job 4040"),
        (["cancel", "4040"], 2, "no job 4040"),
        (["jobs", "--status", "bogus"], 2, "unknown status 'bogus'"),
        # ("active" is the CLI's own: the engine's list of statuses left it out: h94)
        (["jobs", "--status", "running,bogus"], 2, "orphaned; or active: pending, queued"),
        (["--simulate", "1xA100-80GB", "jobs"], 2, "the TUI with no subcommand"),
    ]
    for args, code, message in cases:
        out = served.cli(*args)
        assert out.returncode == code, (args, out.returncode, out.stderr)
        assert message in out.stderr, (args, out.stderr)
    assert _ids(served) == before


def _post(served: Served, body: bytes, path: str = "/v1/jobs") -> tuple[int, dict[str, Any]]:
    raw = send_raw(
        str(served.home / "engine.sock"),
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body,
    )
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_api_rejects_malformed_requests(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")

    def post(body: bytes, path: str = "/v1/jobs") -> tuple[int, dict[str, Any]]:
        return _post(served, body, path)

    status, data = post(b"{not json")
    assert status == 400 and "not valid JSON" in str(data["error"])
    status, data = post(b'{"command": ["true"], "bogus": 1}')
    assert status == 400 and data["error"] == "unknown field 'bogus'"
    status, data = post(b'{"jobs": []}')
    assert status == 400 and "non-empty list" in str(data["error"]) and data["field"] == "jobs"
    # A key given twice: the last one won silently (a job ran `pwd` where `ls` came first).
    status, data = post(b'{"command": ["ls"], "command": ["pwd"]}')
    assert status == 400 and "the key 'command' is given twice" in str(data["error"])
    status, data = post(b"", "/v1/jobs/xyz/cancel")
    assert status == 400 and "positive integer" in str(data["error"])
    status, data = post(b'{"command": ["true"]}', "/v1/jobs/nope")
    assert status == 405 and "POST /v1/jobs/nope: Method Not Allowed" == data["error"]
    sock = str(served.home / "engine.sock")
    # A 405 says which methods are (its JSON rebuild dropped the Allow header).
    raw = send_raw(sock, b"DELETE /v1/jobs/1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head = raw.partition(b"\r\n\r\n")[0].decode().lower()
    assert " 405 " in head.splitlines()[0] and "\r\nallow: " in head
    # A body that is not what its Content-Encoding says: a clear 400, not a 500 with
    # tracebacks in the journal.
    raw = send_raw(
        sock,
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Encoding: gzip"
        b"\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\nnotgzip",
    )
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert int(head.split()[1]) == 400
    assert "could not be decoded as its Content-Encoding ('gzip')" in json.loads(payload)["error"]
    # An unknown domain in the path is a 404, as an unknown job id is (it was a 400).
    status, data = post(b"", "/v1/domains/nope/drain")
    assert status == 404 and data["error"].startswith("unknown domain 'nope'")
    # An unknown job id names its field, as a malformed one's 400 does (h64).
    for method, path in (("GET", "/v1/jobs/999999"), ("POST", "/v1/jobs/999999/cancel")):
        status, data = request(served.home / "engine.sock", method, path)
        assert (status, data) == (404, {"error": "no job 999999", "field": "job"}), path
    assert _ids(served) == []
    # Paging: a contradicting order is refused (before=N&order=asc gave the ids after N),
    # and a number is ASCII digits ("+5", " 5" and an Arabic-Indic 3 were taken).
    for path, field in (
        ("/v1/jobs?before=10&order=asc", "order"),
        ("/v1/jobs?after=5&order=desc", "order"),
        ("/v1/jobs?limit=%2B5", "limit"),
        ("/v1/jobs?limit=%D9%A3", "limit"),
        ("/v1/jobs/1/wait?timeout=%D9%A5", "timeout"),
        ("/v1/jobs/1/wait?timeout=%2B0.1", "timeout"),
        ("/v1/jobs/1/wait?timeout=0_1", "timeout"),
        ("/v1/jobs/1/wait?timeout=%201", "timeout"),
        ("/v1/jobs/1/wait?timeout=abc", "timeout"),
        ("/v1/jobs/1/wait?timeout=nan", "timeout"),
        ("/v1/jobs/1/wait?timeout=4e8", "timeout"),  # (past 10 years)
        ("/v1/jobs/1/wait?timeout=", "timeout"),  # (read as none: it waited for ever: h51)
        # (10,001 rows were cut to 10,000 without a word; follow=abc read as no follow)
        ("/v1/jobs?limit=10001", "limit"),
        ("/v1/jobs/1/logs?follow=abc", "follow"),
        ("/v1/jobs?status=", "status"),  # (read as no filter: every job came back)
        ("/v1/jobs?status=,", "status"),
    ):
        status, data = request(served.home / "engine.sock", "GET", path)
        assert status == 400 and data["field"] == field, (path, data)
    assert request(served.home / "engine.sock", "GET", "/v1/jobs?before=10&order=desc")[0] == 200
    # An exponent is a number ("1e3" was "timeout must be a number"): read, and then the
    # job is unknown.
    for timeout in ("1e3", "2.5E-1", "0"):
        path = f"/v1/jobs/1/wait?timeout={timeout}"
        assert request(served.home / "engine.sock", "GET", path)[0] == 404, path
    assert request(served.home / "engine.sock", "GET", "/v1/jobs?limit=-1")[1]["error"] == (
        "limit must not be negative"
    )
    assert "ERROR" not in served.stop()


def test_api_names_the_field_at_fault_and_refuses_a_body_over_the_cap_unread(
    served: Served,
) -> None:
    served.start("--simulate", "2xA100-80GB")

    def post(body: bytes, path: str = "/v1/jobs") -> tuple[int, dict[str, Any]]:
        return _post(served, body, path)

    # A batch's and a drain's unknown key is named as the field at fault (there was none),
    # and a drain reason of the wrong type is told so (it was told a length problem).
    status, data = post(b'{"jobs": [{"command": ["true"]}], "evn": {}}')
    assert (status, data["field"]) == (400, "evn") and data["error"].endswith("unknown key 'evn'")
    status, data = post(b'{"reason": 5}', "/v1/domains/gpu0/drain")
    assert (status, data["field"]) == (400, "reason")
    assert data["error"] == "reason must be text, not int"
    status, data = post(b'{"reason": "x", "why": 1}', "/v1/domains/gpu0/drain")
    assert (status, data["field"]) == (400, "why") and "unknown key 'why'" in data["error"]
    status, data = post(b'{"reason": 0}', "/v1/domains/gpu0/drain")  # (0 was read as none)
    assert status == 400 and data["error"] == "reason must be text, not int"
    # Escapes went raw into the domains' JSON and every waiting job's reason (tester h114).
    for reason, why in (
        ("\u001b[31mfan\u001b]0;PWN\u0007", "control characters are not allowed"),
        ("fan\u202e", "invisible formatting characters"),
        ("fan\u2764\ufe0f", "emoji presentation selectors are not allowed (U+FE0F)"),
        ("x" * 501, "must be at most 500 characters, not 501"),
    ):
        status, data = post(json.dumps({"reason": reason}).encode(), "/v1/domains/gpu0/drain")
        assert (status, data["field"]) == (400, "reason"), data
        assert data["error"].startswith("reason: ") and why in data["error"], data
    # Only spaces is no reason: the default (it was stored, and said as none: h117).
    status, data = post(b'{"reason": "   "}', "/v1/domains/gpu0/drain")
    assert status == 200 and data["domain"]["drain_reason"] == "drained by the operator", data
    # A release took any body, even one that was no JSON, and acted (tester h45).
    assert post(b'{"reason": "x"}', "/v1/domains/gpu0/drain")[0] == 200
    for body in (b"garbage", b"[1, 2]", b'{"x": 5}'):
        status, data = post(body, "/v1/domains/gpu0/release")
        assert status == 400, (body, data)
    assert data["field"] == "x"
    assert data["error"] == "a release request is empty or {}; unknown key 'x'"
    domains = json.loads(served.cli("domain", "--json").stdout)
    assert [d["state"] for d in domains if d["name"] == "gpu0"] == ["draining"]
    assert post(b"{}", "/v1/domains/gpu0/release")[0] == 200
    assert served.cli("domain", "drain", "gpu0").returncode == 0
    assert served.cli("domain", "release", "gpu0").returncode == 0  # (no body at all)
    # A reload did too (tester h51).
    for body in (b"garbage", b"[1, 2]", b'{"x": 5}'):
        status, data = post(body, "/v1/config/reload")
        assert status == 400, (body, data)
    assert data["error"] == "a reload request is empty or {}; unknown key 'x'"
    assert post(b"{}", "/v1/config/reload")[0] == 200
    # A body declared over the cap is refused before any of it is read: it waited for the
    # body (or, sent no further, for the 30 s idle deadline: a 408).
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(served.home / "engine.sock"))
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000000\r\n\r\n{"
        )
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert int(head.split()[1]) == 413, raw[:300]
    assert json.loads(payload)["error"] == "POST /v1/jobs: the request body is over 64 MiB"
    assert _ids(served) == []


def test_api_refuses_a_query_parameter_it_would_ignore(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    for path, field in (
        # A parameter the route does not read was ignored: `stat=failed` listed every job,
        # `folow=1` gave a log that stopped; one given twice, the first won.
        ("/v1/jobs?stat=failed", "stat"),
        ("/v1/jobs/1/logs?folow=1", "folow"),
        ("/v1/gpus?all=1", "all"),
        ("/v1/jobs?limit=1&limit=2", "limit"),
    ):
        status, data = request(served.home / "engine.sock", "GET", path)
        assert status == 400 and data["field"] == field, (path, data)
    said = request(served.home / "engine.sock", "GET", "/v1/jobs?stat=failed")[1]["error"]
    assert said == (
        "unknown query parameter 'stat' (GET /v1/jobs takes status, q, sort, order, before, "
        "after, offset, limit, since)"
    )
    said = request(served.home / "engine.sock", "GET", "/v1/gpus?all=1")[1]["error"]
    assert said == "unknown query parameter 'all' (GET /v1/gpus takes no parameters)"
    # Every parameter each route reads is still taken.
    for path in (
        "/v1/jobs?status=failed&q=x&sort=id&order=asc&after=1&offset=0&limit=5",
        "/v1/jobs?before=3",
    ):
        assert request(served.home / "engine.sock", "GET", path)[0] == 200, path
    for path in ("/v1/jobs/1/logs?follow=0&offset=0&replica=0", "/v1/jobs/1/wait?timeout=0"):
        assert request(served.home / "engine.sock", "GET", path)[0] == 404, path
    # HEAD reads what GET reads (it was refused any parameter: tester h149)
    assert request(served.home / "engine.sock", "HEAD", "/v1/jobs?limit=2")[0] == 200


def test_head_of_a_stream_is_refused_not_streamed(served: Served) -> None:
    # `HEAD /v1/events` sent the event stream after its headers, for ever (tester h149).
    served.start("--simulate", "1xA100-80GB")
    job = served.cli("submit", "--", "true").stdout.strip()
    for path in ("/v1/events", f"/v1/jobs/{job}/logs?follow=1", f"/v1/jobs/{job}/wait"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(served.home / "engine.sock"))
            sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := sock.recv(65536):  # (until the engine closes it: it must)
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 405"), (path, answer[:300])
        assert b"Allow: GET" in head and body == b"", (path, answer[:300])


def test_socket_permissions_second_engine_and_restart(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    sock = served.home / "engine.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(served.home.stat().st_mode) == 0o700
    job = served.cli("submit", "--", "true").stdout.strip()
    assert served.cli("wait", job).returncode == 0

    second = subprocess.run(
        [*_cli_argv(), "--serve", "--simulate", "2xA100-80GB"],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 1
    assert f"an engine is already serving {served.home}" in second.stderr

    history = served.cli("status", job, "--json").stdout
    err = served.stop()
    assert served.proc is not None and served.proc.returncode == 0
    assert "engine stopped" in err
    assert not sock.exists()

    down = served.cli("jobs")
    assert down.returncode == 3
    assert f"no engine is serving {served.home}" in down.stderr
    assert "gpulayer-tui --serve" in down.stderr

    served.start("--simulate", "2xA100-80GB")
    assert served.cli("status", job, "--json").stdout == history


def test_bad_simulate_spec_and_config_fail_clearly(served: Served) -> None:
    bad = subprocess.run(
        [*_cli_argv(), "--serve", "--simulate", "2xA100"],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--simulate: cannot read '2xA100'" in bad.stderr
    served.home.mkdir(parents=True, exist_ok=True)
    (served.home / "config.toml").write_text("[domains.big]\ngpu = 7\n")
    bad = subprocess.run(
        [*_cli_argv(), "--serve", "--simulate", "2xA100-80GB"],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2
    assert "domains.big: gpu 7 does not exist (the GPUs seen: GPU 0, GPU 1)" in bad.stderr
    assert "Traceback" not in bad.stderr
    # A refused name's escape sequences are shown escaped (they reached the terminal).
    hostile = '[engine]\nauto_domains = false\n[domains."x\\u001b]0;PWNED\\u0007"]\ngpu = 0\n'
    (served.home / "config.toml").write_text(hostile)
    bad = subprocess.run(
        [*_cli_argv(), "--serve", "--simulate", "2xA100-80GB"],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "a domain name is" in bad.stderr
    assert "\x1b" not in bad.stderr and "\x07" not in bad.stderr
    # (quoted as TOML writes the key, its controls escaped)
    assert 'domains."x\\u001b]0;PWNED\\u0007":' in bad.stderr


def test_serve_without_a_driver_says_so_once(served: Served) -> None:
    served.start()
    health = json.loads(served.cli("gpus", "--json").stdout)
    assert health["capacity"] == "no_gpus"
    assert "No NVIDIA driver" in health["message"]
    assert [d["name"] for d in health["domains"]] == ["cpu"]
    over = served.cli("submit", "--gpus", "1", "--", "true")
    assert over.returncode == 1 and "this machine has no GPUs" in over.stderr
    err = served.stop()
    assert err.count("No NVIDIA driver") == 1 and "Traceback" not in err


def test_a_batch_sends_its_environment_once_and_is_answered_with_rows(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    # The API: one "env" under each job's own (a job's own entries win).
    body = {
        "jobs": [{"shell": "echo $A $B", "env": {"A": "own"}}, {"shell": "echo $A $B"}],
        "env": {"A": "batch", "B": "b"},
    }
    status, data = _post(served, json.dumps(body).encode())
    assert status == 201, data
    rows = data["jobs"]
    # Rows, as GET /v1/jobs lists them: no environment echoed back, no whole-job fields.
    assert all(set(row["spec"]) <= set(ROW_SPEC_KEYS) for row in rows)
    assert all("queued_at" not in row and "stop_reason" not in row for row in rows)
    ids = [str(row["id"]) for row in rows]
    for job_id in ids:
        assert served.cli("wait", job_id).returncode == 0
    assert [served.cli("logs", job_id).stdout for job_id in ids] == ["own b\n", "batch b\n"]
    whole = json.loads(served.cli("status", ids[1], "--json").stdout)["job"]
    assert whole["spec"]["env"] == {"A": "batch", "B": "b"}
    # A batch environment that is not NAME: text is refused, naming it; nothing stored.
    for env in (["A=1"], {"A": 1}, None):
        bad = {"jobs": [{"command": ["true"]}], "env": env}
        status, data = _post(served, json.dumps(bad).encode())
        assert (status, data.get("field")) == (400, "env"), (env, data)
    assert _ids(served) == [int(i) for i in reversed(ids)]
    # The CLI: `submit --file` sends this shell's environment once for the whole file.
    served.env["GPULAYER_TEST_FROM_SHELL"] = "from the shell"
    out = served.cli("submit", "--file", "-", input="echo $GPULAYER_TEST_FROM_SHELL\ntrue\n")
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.split()
    assert served.cli("wait", first).returncode == 0
    assert served.cli("logs", first).stdout == "from the shell\n"
    job = json.loads(served.cli("status", second, "--json").stdout)["job"]
    assert job["spec"]["env"]["GPULAYER_TEST_FROM_SHELL"] == "from the shell"


def test_batch_file_lines_are_stored_as_written_and_plain_ones_skip_the_shell(
    served: Served,
) -> None:
    served.start("--simulate", "2xA100-80GB")
    lines = [
        "sleep 30",  # plain words: run as argv, no shell of ours
        'echo "$HOME"',  # quotes and expansion: a shell line
        "exit 3",  # a builtin, not a program: a shell line
        "./no-such-script.sh",  # plain, but nothing to run: fails at once, saying so
    ]
    out = served.cli("submit", "--file", "-", "--json", input="\n".join(lines) + "\n")
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)
    assert [job["spec"]["shell"] for job in jobs] == lines
    ids = [str(job["id"]) for job in jobs]
    sleeper = psutil.Process(jobs[0]["pid"])
    wait_for(lambda: sleeper.cmdline() != [])  # (argv shows a moment after the exec)
    assert sleeper.cmdline() == ["sleep", "30"]
    assert served.cli("cancel", ids[0]).returncode == 0
    assert served.cli("wait", ids[1]).returncode == 0
    assert served.cli("logs", ids[1]).stdout == os.environ["HOME"] + "\n"
    for job_id, code in ((ids[2], 3), (ids[3], None)):
        assert served.cli("wait", job_id).returncode == 1
        status = json.loads(served.cli("status", job_id, "--json").stdout)
        assert status["job"]["exit_code"] == code
    assert status["job"]["termination_reason"] == "launch_failed"
    assert status["job"]["message"].startswith("command not found: ./no-such-script.sh")


def test_malformed_requests_and_readers_leaving_log_one_line_not_a_traceback(
    served: Served,
) -> None:
    import subprocess
    import sys

    served.start("--simulate", "1xA100-80GB", "--verbose")
    sock_path = str(served.home / "engine.sock")
    for payload in (
        b"GARBAGE\r\n\r\n",
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
    ):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(sock_path)
            sock.sendall(payload)
            sock.settimeout(10)
            assert sock.recv(64).startswith(b"HTTP/1.0 400 Bad Request")
    job = served.cli("submit", "--", "sh", "-c", "while :; do echo x; sleep 0.05; done")
    follow = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "logs", "-f", job.stdout.strip()],
        env=served.env,
        stdout=subprocess.PIPE,
    )
    assert follow.stdout is not None and follow.stdout.readline() == b"x\n"
    follow.kill()  # the reader leaves mid-stream
    follow.wait()
    follow.stdout.close()
    served.cli("cancel", job.stdout.strip())
    log = served.stop()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
    assert "a client's bad request was refused" in log


def test_stop_ends_the_background_engine_and_its_jobs_go_on(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    job = served.cli("submit", "--", "sleep", "30").stdout.strip()
    stopped = served.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped the engine (pid" in stopped.stdout
    assert served.proc is not None and served.proc.wait(timeout=5) == 0
    again = served.cli("stop")
    assert again.returncode == 3 and "no engine is serving" in again.stderr
    assert again.stderr.rstrip().endswith(": nothing to stop") and "start one" not in again.stderr
    # `logs` with no engine says where the log is on disk (h123)
    read = served.cli("logs", job)
    assert read.returncode == 3
    where = served.home / "jobs" / f"{job}.log"
    assert read.stderr.rstrip().endswith(f"; job {job}'s log as last written is {where}"), read
    served.start("--simulate", "1xA100-80GB")  # the next engine takes the job back
    assert json.loads(served.cli("status", job, "--json").stdout)["job"]["status"] == "running"
    assert served.cli("cancel", job).returncode == 0


def test_stop_waits_gpulayer_timeout_for_an_engine_slow_to_stop(served: Served) -> None:
    # An "engine" that holds the lock and ignores SIGTERM: `stop` gives up after
    # GPULAYER_TIMEOUT (it waited a fixed 30 s), and --timeout still wins.
    served.home.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import pathlib, signal, sys, time\n"
            "from gpulayer_tui.engine.lock import EngineLock\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"EngineLock(pathlib.Path({str(served.home / 'engine.lock')!r})).acquire()\n"
            "print('held', flush=True)\n"
            "time.sleep(120)\n"
        ), "--serve"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        served.env["GPULAYER_TIMEOUT"] = "0.5"
        stopping = served.cli("stop", timeout=20)
        # (5: its time ran out, as wait's and cancel's; it exited 1: tester h178)
        assert stopping.returncode == 5
        assert f"the engine (pid {holder.pid}) is still stopping after 0.5 s" in stopping.stderr
        stopping = served.cli("stop", "--timeout", "0.2", timeout=20)
        assert stopping.returncode == 5
        assert "is still stopping after 0.2 s" in stopping.stderr
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_sighup_reads_the_config_again_and_the_engine_goes_on(served: Served) -> None:
    # (`--serve &` from a shell gets SIGHUP when the terminal goes: an ssh logout.)
    served.start("--simulate", "1xA100-80GB")
    assert served.proc is not None
    served.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP: the engine keeps running" in served.log.read_text(), timeout=10)
    assert served.proc.poll() is None
    assert served.cli("submit", "--", "true").returncode == 0
    assert "the config was read again: applied" in served.log.read_text()


def test_the_engine_raises_its_open_files_limit_but_not_its_jobs(served: Served) -> None:
    with open(served.log, "a") as log:
        served.proc = subprocess.Popen(
            ["sh", "-c", 'ulimit -S -n 256; exec "$@"', "sh", sys.executable, "-m",
             "gpulayer_tui", "--serve", "--simulate", "1xA100-80GB"],
            env=served.env, stdout=log, stderr=log, text=True, cwd=REPO,
        )  # fmt: skip
    wait_for(lambda: served.cli("gpus").returncode == 0, timeout=20)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    engine = psutil.Process(served.proc.pid).rlimit(psutil.RLIMIT_NOFILE)
    assert engine[0] == min(hard, 1 << 16) > 256
    job = served.cli("submit", "--shell", "--", "ulimit -n").stdout.strip()
    served.cli("wait", job)
    assert served.cli("logs", job).stdout.strip() == "256"


def test_a_repeated_loop_error_is_logged_once_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        handler = QuietRepeats()
        with caplog.at_level(logging.ERROR, "asyncio"):
            for _ in range(1000):
                handler(loop, {"message": "socket.accept() out of system resource"})
            handler(loop, {"message": "another"})
        assert caplog.text.count("out of system resource") == 1
        assert caplog.text.count("another") == 1
        handler._last["socket.accept() out of system resource"] = (-1e9, 999)  # (10 s later)
        with caplog.at_level(logging.ERROR, "asyncio"):
            handler(loop, {"message": "socket.accept() out of system resource"})
        assert "(and 999 more like it)" in caplog.text
    finally:
        loop.close()


async def test_a_state_dir_deeper_than_a_socket_path_takes_works_for_every_client(
    tmp_path: Path,
) -> None:
    # sun_path holds 108 bytes: this socket's path is longer (reached through its dir).
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    assert len(str(deep / "engine.sock")) > 108
    deep.parent.mkdir(parents=True)
    served = Served(deep)
    try:
        served.start("--simulate", "1xA100-80GB")
        job = served.cli("submit", "--", "echo", "deep")
        assert job.returncode == 0, job.stderr
        assert served.cli("wait", job.stdout.strip()).returncode == 0
        assert served.cli("logs", job.stdout.strip()).stdout == "deep\n"
        # The TUI's client (aiohttp) too.
        backend = SocketBackend(Paths(deep, deep / "config.toml"))
        try:
            assert (await backend.health())["state_dir"] == str(deep)
        finally:
            await backend.close()
    finally:
        if served.proc is not None and served.proc.poll() is None:
            served.stop()


async def test_a_job_that_just_ended_still_owns_its_processes_until_the_next_sample(
    make_engine: EngineFactory,
) -> None:
    from gpulayer_tui.cli.format import format_gpus

    # For the second until the next sample, `gpus` listed its process "job N's, outside
    # its GPUs" on the very GPU it had run on (tester h80).
    engine = await make_engine(config=make_config(engine={"sample_interval": 3600}))
    job = await engine.submit({"command": ["sleep", "600"], "gpus": 1, "vram_gb": 10})
    await eventually(lambda: (act := engine.book.get(job.id)) is not None and act.job.pid)
    await engine.sampler.sample_once()
    pid = (await engine.get(job.id)).pid
    assert any(p["pid"] == pid for d in engine.gpus()["domains"] for p in d["processes"])
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=10)
    view: Any = engine.gpus()
    gpu = next(d for d in view["domains"] if any(p["pid"] == pid for p in d["processes"]))
    assert gpu["leaving_jobs"] == [job.id] and gpu["jobs"] == []
    assert "outside its GPUs" not in format_gpus(view)
