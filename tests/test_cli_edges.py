"""The CLI at its edges, against a real ``--serve`` engine: a wait that runs out, input
that holds nothing or too much, a reader that leaves early, and Ctrl-C (issue 21)."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.engine.paths import Paths

from .conftest import REPO, Served, wait_for


@pytest.fixture
def engine(served: Served) -> Served:
    served.start("--simulate", "1xA100-80GB")
    return served


def _submit(served: Served, *argv: str) -> str:
    out = served.cli("submit", *argv)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_wait_with_a_timeout_that_runs_out_exits_5_and_says_so(engine: Served) -> None:
    # 5, not 1: a script must tell a job still running from one that failed.
    job = _submit(engine, "--", "sleep", "600")
    out = engine.cli("wait", job, "--timeout", "0.3")
    assert out.returncode == 5
    assert out.stderr == f"gpulayer-tui: job {job} still running after 0.3 s\n"
    # --json prints its document all the same (it printed nothing).
    out = engine.cli("wait", job, "--timeout", "0.3", "--json")
    assert out.returncode == 5
    shown = json.loads(out.stdout)
    assert shown["timed_out"] is True and shown["job"]["id"] == int(job)
    # 0 only asks (a poll a script makes), and a duration is taken as --timeout takes one
    # at submission (both refused: tester h71).
    out = engine.cli("wait", job, "--timeout", "0")
    assert (
        out.returncode == 5 and out.stderr == f"gpulayer-tui: job {job} still running after 0 s\n"
    )
    done = _submit(engine, "--", "true")
    assert engine.cli("wait", done, "--timeout", "1m").returncode == 0
    assert engine.cli("wait", done, "--timeout", "0").returncode == 0
    refused = engine.cli("wait", done, "--timeout", "-1")
    assert refused.returncode == 2 and "must be 0 or more, got -1" in refused.stderr
    assert engine.cli("cancel", job, "--timeout", "1m").returncode == 0


def test_output_that_cannot_be_written_is_no_bad_input_and_a_closed_one_acts_not(
    engine: Served,
) -> None:
    # `submit > /dev/full` submitted the job, then said "No space left on device" with exit
    # 2 (bad input: nothing changed); `submit >&-` submitted it and exited 0 (tester h62).
    argv = [sys.executable, "-m", "gpulayer_tui", "submit", "--name", "full", "--", "true"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            argv, env=engine.env, cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert done.returncode == 1, done.stderr
    job = json.loads(engine.cli("jobs", "--json").stdout)[0]
    assert job["name"] == "full"
    # (and it names the job it made: its id was only in `jobs`: tester h114)
    assert done.stderr == (
        "gpulayer-tui: cannot write the output: No space left on device (the command ran: "
        f"job {job['id']} was submitted; only its output was lost)\n"
    )
    closed = subprocess.run(
        [*argv[:4], "--name", "closed", "--", "true"],
        env=engine.env, cwd=REPO, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert closed.returncode == 2
    assert closed.stderr.startswith("gpulayer-tui: standard output is closed (>&-): nothing ")
    names = [job["name"] for job in json.loads(engine.cli("jobs", "--json").stdout)]
    assert names == ["full"]


def test_wait_for_several_jobs_waits_for_each_and_exits_with_the_worst(engine: Served) -> None:
    done, failed = _submit(engine, "--", "true"), _submit(engine, "--", "false")
    out = engine.cli("wait", done, failed)
    assert out.returncode == 1, out
    assert out.stdout.splitlines() == [
        f"job {done} completed, exit code 0: exited with code 0",
        f"job {failed} failed, exit code 1: exited with code 1",
    ]
    repeated = engine.cli("wait", done, done)  # (told, as "done,done" is: h92, h94)
    assert repeated.returncode == 2 and f"job {done} is named twice" in repeated.stderr
    # An unknown id is said and the others are still waited for (exit 2: bad input).
    out = engine.cli("wait", done, "999", failed)
    assert out.returncode == 2 and out.stderr == "gpulayer-tui: no job 999\n"
    assert len(out.stdout.splitlines()) == 2
    # With --json, one object for each id in the order given, as cancel's (the unknown
    # one was left out; alone, nothing was printed: tester h122).
    out = engine.cli("wait", done, "999", failed, "--json")
    assert out.returncode == 2, out
    shown = json.loads(out.stdout)
    assert [d.get("job", d).get("id") for d in shown] == [int(done), 999, int(failed)]
    assert shown[1] == {"id": 999, "error": "no job 999"}
    out = engine.cli("wait", "999", "--json")
    assert out.returncode == 2 and json.loads(out.stdout) == {"id": 999, "error": "no job 999"}
    # So do `status` and `why` (they printed nothing on stdout: tester h178), and a refusal
    # of another command's, with no id to name.
    for command in ("status", "why"):
        out = engine.cli(command, "999", "--json")
        assert (out.returncode, out.stderr) == (2, "gpulayer-tui: no job 999\n"), out
        assert json.loads(out.stdout) == {"id": 999, "error": "no job 999"}, command
    out = engine.cli("domain", "drain", "nosuchgpu", "--json")
    assert out.returncode == 2 and json.loads(out.stdout)["error"] in out.stderr, out
    assert "id" not in json.loads(out.stdout)
    # One deadline for all: the one still running is said, exit 5; --json is one list.
    running = _submit(engine, "--", "sleep", "600")
    out = engine.cli("wait", running, done, "--timeout", "0.3", "--json")
    assert out.returncode == 5
    assert out.stderr == f"gpulayer-tui: job {running} still running after 0.3 s\n"
    shown = json.loads(out.stdout)
    assert [(d["job"]["id"], d.get("timed_out")) for d in shown] == [
        (int(running), True),
        (int(done), False),
    ]
    engine.cli("cancel", running, "--no-wait")


def test_wait_does_not_call_an_end_stored_a_moment_later_a_database_failure(
    engine: Served, tmp_path: Path
) -> None:
    # An end is stored with the next group commit, a moment after it happens: `wait` asked
    # in that moment said "its database cannot be written" of a database that was fine
    # (tester h192). Here the moment is stretched: another connection holds the write
    # lock for a second (the engine's writer waits on it; nothing fails).
    import sqlite3

    go = tmp_path / "go"
    job = _submit(engine, "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done")
    wait_for(lambda: '"running"' in engine.cli("status", job, "--json").stdout)
    lock = sqlite3.connect(engine.home / "gpulayer.db", timeout=10, isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        go.touch()
        wait_for(lambda: '"completed"' in engine.cli("status", job, "--json").stdout)
        waiter = subprocess.Popen(
            [sys.executable, "-m", "gpulayer_tui", "wait", job],
            env=engine.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)  # (the lock held: the end stays unstored this long)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, (out, err)
    assert err == "", err
    assert out.startswith(f"job {job} completed"), out


def test_wait_on_a_service_that_restarts_always_says_it_may_never_end(engine: Served) -> None:
    # It waited in silence, for ever (tester h58).
    svc = _submit(engine, "--service", "--gpus", "0", "--no-port", "--", "sleep", "600")
    out = engine.cli("wait", svc, "--timeout", "0.5")
    assert out.returncode == 5
    assert out.stderr.splitlines()[0] == (
        f"gpulayer-tui: job {svc} is a service that restarts always: it ends only when it is "
        "cancelled, times out, or is placed again no more; waiting (ctrl+c stops waiting, "
        "not the service)"
    )
    batch = _submit(engine, "--", "sleep", "600")
    out = engine.cli("wait", batch, "--timeout", "0.5")
    assert out.stderr == f"gpulayer-tui: job {batch} still running after 0.5 s\n"
    engine.cli("cancel", svc, batch, "--no-wait")


def test_logs_of_a_job_requeued_after_a_preemption_does_not_say_it_never_started(
    served: Served,
) -> None:
    # "job 35 has not started yet" of a job that had run 19 s, then been preempted and
    # requeued (tester h59).
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text(
        '[scheduling]\npreempt_after = 0\ncheckpoint_signal = ""\ncheckpoint_grace = 0\n'
    )
    served.start("--simulate", "1xA100-80GB")
    victim = _submit(served, "--gpus", "1", "--preemptible", "--", "sleep", "600")
    urgent = _submit(served, "--gpus", "1", "--priority", "5", "--", "sleep", "600")
    wait_for(
        lambda: json.loads(served.cli("status", victim, "--json").stdout)["job"].get("attempt"),
        timeout=30,
        interval=0.2,
    )
    out = served.cli("logs", victim)
    assert out.returncode == 0 and "has not started" not in out.stderr
    # Its run wrote nothing but the line saying it was stopped (the log said no word).
    assert out.stdout.startswith("--- gpulayer-tui sent SIGTERM (SIGKILL "), out.stdout
    served.cli("cancel", victim, urgent, "--no-wait")


def test_cancel_of_a_whole_chain_in_its_order_succeeds(engine: Served) -> None:
    # Y's cancel cancelled Z (its dependent) before Z's turn came: "job Z already
    # cancelled", exit 1, for the very state asked for (tester h62). Then it was said
    # "cancelled already" with its cause; each is now cancelled by the user, Z before Y
    # before X, and said once (testers h111, h113).
    x = _submit(engine, "--", "sleep", "600")
    y = _submit(engine, "--after", x, "--", "true")
    z = _submit(engine, "--after", y, "--", "true")
    out = engine.cli("cancel", x, y, z, "--json")
    assert out.returncode == 0, out.stderr
    assert [j["status"] for j in json.loads(out.stdout)] == ["cancelled"] * 3
    assert [j["id"] for j in json.loads(out.stdout)] == sorted(int(i) for i in (x, y, z))
    assert out.stderr == ""
    for job_id in (y, z):
        job = json.loads(engine.cli("status", job_id, "--json").stdout)["job"]
        assert job["message"] == "cancelled by user", job


def test_cancel_says_the_waiting_jobs_it_takes_with_it(engine: Served) -> None:
    # Cancelling a job cancelled those waiting for it to complete, unsaid (tester h83).
    x = _submit(engine, "--", "sleep", "600")
    y = _submit(engine, "--after", x, "--", "true")
    z = _submit(engine, "--after", y, "--", "true")
    runs_anyway = _submit(engine, "--after-any", x, "--", "true")
    after_any_of_y = _submit(engine, "--after-any", y, "--", "true")
    detail = json.loads(engine.cli("status", x, "--json").stdout)["job"]
    assert detail["cancels_dependents"] == [int(y), int(z)]
    # An active job with none says so, `[]` (it was left out, as for an ended job: h178).
    assert json.loads(engine.cli("status", z, "--json").stdout)["job"]["cancels_dependents"] == []
    out = engine.cli("cancel", x)
    assert out.returncode == 0, out.stderr
    said = f"jobs {y}, {z} waited (directly or through one another) for job {x} to complete"
    assert f"{said}: cancelled too" in out.stderr, out.stderr
    for job_id, status in ((y, "cancelled"), (z, "cancelled")):
        assert json.loads(engine.cli("status", job_id, "--json").stdout)["job"]["status"] == status
    for job_id in (runs_anyway, after_any_of_y):
        assert engine.cli("wait", job_id, "--timeout", "30").returncode == 0
    assert "cancels_dependents" not in json.loads(engine.cli("status", x, "--json").stdout)["job"]
    # A chain cancelled by two of its ids: the last is said once, of the job asked for it
    # waited on (it was said twice, once of a job it did not wait on: tester h197).
    a = _submit(engine, "--", "sleep", "600")
    b = _submit(engine, "--after", a, "--", "true")
    c = _submit(engine, "--after", b, "--", "true")
    out = engine.cli("cancel", "--no-wait", f"{a},{b}")
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "cancelled too" in line]
    assert said == [f"gpulayer-tui: job {c} waited for job {b} to complete: cancelled too"], said


def test_the_jobs_a_running_cancel_takes_with_it_are_cancelled_at_once(
    engine: Served, tmp_path: Path
) -> None:
    # Said "cancelled too", they read "waiting for job N" for the whole grace period of a
    # job that ignores SIGTERM (tester h192 #3): it ends cancelled whatever its exit.
    ready = tmp_path / "trap-set"
    x = _submit(engine, "--", "sh", "-c", f"trap '' TERM; touch {ready}; sleep 600 & wait; wait")
    y = _submit(engine, "--after", x, "--", "true")
    z = _submit(engine, "--after", y, "--", "true")
    runs_anyway = _submit(engine, "--after-any", x, "--", "true")
    wait_for(ready.exists)
    out = engine.cli("cancel", x, "--no-wait")
    assert out.returncode == 0, out.stderr
    assert f"jobs {y}, {z} waited" in out.stderr and "cancelled too" in out.stderr, out.stderr
    stopping = json.loads(engine.cli("status", x, "--json").stdout)["job"]
    assert stopping["status"] == "running", stopping  # (in its grace period)
    for job_id, message in ((y, f"dependency job {x} cancelled"),
                            (z, f"dependency job {y} cancelled")):  # fmt: skip
        job = json.loads(engine.cli("status", job_id, "--json").stdout)["job"]
        assert (job["status"], job["message"]) == ("cancelled", message), job
    assert json.loads(engine.cli("status", runs_anyway, "--json").stdout)["job"]["status"] == (
        "queued"
    )
    assert stopping["pid"]
    os.killpg(stopping["pid"], signal.SIGKILL)
    assert engine.cli("wait", runs_anyway, "--timeout", "30").returncode == 0


def test_cancel_says_a_stop_under_way_as_such(engine: Served) -> None:
    # --no-wait returns once SIGTERM is sent: that is success, not a process stuck in
    # the kernel; a --timeout that runs out before the SIGKILL is due says that.
    job = _submit(engine, "--", "sleep", "600")
    out = engine.cli("cancel", job, "--no-wait")
    assert out.returncode == 0, out.stderr
    assert f"job {job} " in out.stdout and "stuck" not in out.stdout + out.stderr
    stubborn = _submit(engine, "--", "sh", "-c", "trap '' TERM; while :; do sleep 0.05; done")
    pid = int(json.loads(engine.cli("status", stubborn, "--json").stdout)["job"]["pid"])
    wait_for(lambda: _ignores_sigterm(pid))  # (its trap is set: SIGTERM cannot end it)
    out = engine.cli("cancel", stubborn, "--timeout", "0.3")
    assert out.returncode == 5
    assert "is stopping: SIGTERM sent, SIGKILL at" in out.stderr
    assert "still running after --timeout 0.3 s" in out.stderr and "stuck" not in out.stderr


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        (
            "deep.json",
            b"[" * 100_000 + b"]" * 100_000,
            "deep.json: not valid JSON: nested too deeply",
        ),
        (
            "when.toml",
            b'command = ["true"]\ntimeout = 1979-05-27T07:32:00Z\n',
            "when.toml: timeout: a TOML date or time (1979-05-27T07:32:00+00:00) is not a spec "
            "value (a number of seconds)",
        ),
        ("env.toml", b'command = ["true"]\n[env]\nA = 12:00:00\n', "env.toml: env.A: a TOML"),
        ("lines.txt", b"echo a\n\xff\xfebinary\n", "lines.txt: line 2 is not UTF-8 text: \\xff"),
        ("nul.txt", b"echo a\n\necho \0b\n", "nul.txt: line 3 holds a NUL byte"),
        ("jobs.json", b'{"jobs": {}}', "jobs.json: 'jobs' is a list of spec tables"),
    ],
    ids=["deep-json", "toml-datetime", "toml-time", "not-utf8", "nul", "jobs-not-a-list"],
)
def test_spec_and_batch_files_that_cannot_be_read_are_refused_by_name(
    engine: Served, tmp_path: Path, name: str, content: bytes, said: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    option = "--file" if name.endswith(".txt") else "--spec"
    out = engine.cli("submit", option, str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert said in out.stderr
    assert engine.cli("jobs", "--json").stdout.strip() == "[]"  # nothing was submitted


def test_a_spec_is_read_by_its_content_when_its_name_does_not_say(
    engine: Served, tmp_path: Path
) -> None:
    (tmp_path / "spec.txt").write_text('{"command": ["true"], "name": "from-txt"}')
    out = engine.cli("submit", "--spec", str(tmp_path / "spec.txt"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["name"] == "from-txt"
    piped = engine.cli(
        "submit", "--spec", "-", "--json", input='name = "from-stdin"\ncommand = ["true"]\n'
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)[0]["name"] == "from-stdin"


def test_a_batch_file_of_only_comments_is_refused_and_submits_nothing(
    engine: Served, tmp_path: Path
) -> None:
    batch = tmp_path / "jobs.txt"
    batch.write_text("# nothing to run yet\n\n   # still nothing\n")
    out = engine.cli("submit", "--file", str(batch))
    assert (out.returncode, out.stdout) == (2, "")
    assert f"{batch}: no command lines found" in out.stderr
    # One that cannot be read is said with the flag ("No such file or directory: X": h114).
    for path, why in ((tmp_path / "gone.txt", "No such file or directory"), (tmp_path, "Is a")):
        out = engine.cli("submit", "--file", str(path))
        assert (out.returncode, out.stdout) == (2, "")
        assert out.stderr.startswith(f"gpulayer-tui: --file: cannot read {path}: {why}"), out
    # One without end (/dev/zero, an endless pipe) is refused past what the engine takes:
    # read whole, it grew the CLI to a MemoryError traceback (tester h122).
    for flag in ("--file", "--spec"):
        out = engine.cli("submit", flag, "/dev/zero")
        assert (out.returncode, out.stdout) == (2, ""), out
        assert "/dev/zero: over 64 MiB (the engine takes no larger request" in out.stderr, out
        assert "Traceback" not in out.stderr
    assert engine.cli("jobs", "--json").stdout.strip() in ("[]", "")


def test_a_batch_files_errors_name_its_line_and_a_byte_order_mark_is_no_command(
    engine: Served, tmp_path: Path
) -> None:
    # The engine's "job 2 of 2" was the second command, not the file's line 5; and a
    # UTF-8 byte order mark (some editors write one) became part of the first command,
    # which then failed with 127.
    batch = tmp_path / "jobs.txt"
    batch.write_bytes(b"# header\n\necho a\n# c\necho " + b"b" * 70_000 + b"\n")  # (too long)
    out = engine.cli("submit", "--file", str(batch))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{batch}: line 5: at most 65536" in out.stderr and "job 2 of 2" not in out.stderr
    assert engine.cli("jobs", "--json").stdout.strip() in ("[]", "")
    batch.write_bytes(b"\xef\xbb\xbfecho bom\ntrue\n")
    out = engine.cli("submit", "--file", str(batch), "--json")
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)[0]
    assert first["spec"]["shell"] == "echo bom"
    assert engine.cli("wait", str(first["id"])).returncode == 0
    # A line ending with a backslash ran as a job of its own, the next line as another
    # (an escaped one, "echo a \\", is a whole line).
    batch.write_bytes(b"true\necho a \\\\\n# a comment \\\necho cont \\\n  next\n")
    out = engine.cli("submit", "--file", str(batch))
    assert out.returncode == 2
    assert f"{batch}: line 4 ends with a backslash: each line is one job's whole" in out.stderr
    assert len(json.loads(engine.cli("jobs", "--json").stdout)) == 2  # (the two above)
    # The same mark before a TOML spec (JSON ones were taken): "not valid TOML".
    spec = tmp_path / "spec.toml"
    spec.write_bytes(b'\xef\xbb\xbfcommand = ["echo", "bom"]\r\n')
    out = engine.cli("submit", "--spec", str(spec), "--json")
    assert out.returncode == 0, out.stderr
    # As --help says, rows as `jobs --json` lists them (one spec came whole: the
    # submitter's whole environment with it).
    (row,) = json.loads(out.stdout)
    listed = json.loads(engine.cli("jobs", "--json").stdout)
    assert set(row) == set(listed[0])
    assert row["spec"] == {"command": ["echo", "bom"], "priority": 0}
    assert engine.cli("wait", str(row["id"])).returncode == 0


@pytest.mark.parametrize(
    ("line", "closed"),
    [
        ('echo "unclosed', False),
        ("echo 'it''s", False),
        ('python x.py --tag "a b"\'', False),
        ("echo \"a 'b' c\"", True),
        ("echo hi # it's a comment", True),
        ("echo \"$(date '+%s')\"", True),
        ("printf '%s\\n' \"it's\"", True),
        ("cat <<EOF\nit's\nEOF", True),  # (a here-document's text is no shell words)
        ("echo $'bash quoting: it\\'s'", True),  # (bash's own: not judged)
        ("echo 'a\nb'", True),  # (a quote may span lines)
    ],
)
def test_a_shell_line_with_a_quote_never_closed_is_refused_at_submission(
    line: str, closed: bool
) -> None:
    # `submit --file` took `echo "oops` and the job failed at run time (sh: exit 2).
    from gpulayer_tui.fields import FieldError, check_shell

    if closed:
        assert check_shell(line) == line
        return
    with pytest.raises(FieldError, match="a quote is not closed: sh would refuse it"):
        check_shell(line)
    ran = subprocess.run(["sh", "-n", "-c", line], capture_output=True)  # (as sh judges)
    assert ran.returncode != 0


def test_a_batch_refused_for_an_option_is_not_blamed_on_its_first_line(
    engine: Served, tmp_path: Path
) -> None:
    # "jobs.txt: line 1: --after: no job 99999": the --after came from the command line,
    # for every line (tester h111).
    batch = tmp_path / "jobs.txt"
    for text in ("echo one\necho two\n", "echo one\n"):
        batch.write_text(text)
        out = engine.cli("submit", "--file", str(batch), "--after", "99999")
        assert (out.returncode, out.stderr) == (2, "gpulayer-tui: --after: no job 99999\n")


def test_a_batch_line_with_a_quote_never_closed_is_refused_by_its_line(
    engine: Served, tmp_path: Path
) -> None:
    batch = tmp_path / "jobs.txt"
    batch.write_text("echo fine\n# it's a comment\necho \"oops\ntrue\n")
    out = engine.cli("submit", "--file", str(batch))
    assert out.returncode == 2
    assert out.stderr == (
        f"gpulayer-tui: {batch}: line 3: a quote is not closed: sh would refuse it "
        "(Unterminated quoted string)\n"
    )
    # A file of one line (sent as one spec) is told by its line too: it named neither
    # the file nor the line (tester h100).
    batch.write_text('# one job\necho "oops\n')
    out = engine.cli("submit", "--file", str(batch))
    assert out.returncode == 2
    assert out.stderr == (
        f"gpulayer-tui: {batch}: line 2: a quote is not closed: sh would refuse it "
        "(Unterminated quoted string)\n"
    )
    # A spec file given to --file: each of its lines ran as a command (`[[jobs]]`,
    # `name = "prep"`, ...); it is refused, naming the flag it wants.
    for name in ("jobs.toml", "jobs.JSON", "jobs.txt"):
        spec = tmp_path / name
        spec.write_text('# pipeline\n[[jobs]]\nname = "prep"\ncommand = ["true"]\n')
        out = engine.cli("submit", "--file", str(spec))
        assert out.returncode == 2
        assert out.stderr == (
            f"gpulayer-tui: {spec} is a spec file: submit it with --spec {spec} (--file "
            "takes one shell command line per line)\n"
        )
    assert engine.cli("jobs", "--json").stdout.strip() in ("[]", "")
    # The engine's refusal of the command after -- names no flag there is none of.
    out = engine.cli("submit", "--service", "--", "sleep", "10", "$PORT")
    assert out.returncode == 2
    assert out.stderr.startswith("gpulayer-tui: the command: '$PORT': nothing expands $PORT")


def test_a_spec_files_jobs_wait_for_earlier_ones_by_name(engine: Served, tmp_path: Path) -> None:
    # A pipeline in one file: its ids are given only as it is submitted, so they were
    # impossible to write in it.
    spec = tmp_path / "pipeline.toml"
    spec.write_text(
        '[[jobs]]\nname = "prep"\ncommand = ["true"]\n'
        '[[jobs]]\nname = "eval"\ncommand = ["false"]\ndepends_on = ["prep"]\n'
        '[[jobs]]\nname = "report"\ncommand = ["true"]\n'
        'depends_on = [{ job = "eval", any_exit = true }, "prep"]\n'
    )
    out = engine.cli("submit", "--spec", str(spec))
    assert out.returncode == 0, out.stderr
    prep, evaluation, report = out.stdout.split()
    assert engine.cli("wait", report).returncode == 0
    shown = engine.cli("status", report).stdout
    assert f"after       job {prep}; job {evaluation} (any end)" in shown, shown
    # A name no earlier job of the file has (or a later one's): refused, nothing stored.
    before = engine.cli("jobs", "--json").stdout
    spec.write_text(
        '[[jobs]]\nname = "a"\ncommand = ["true"]\ndepends_on = ["b"]\n'
        '[[jobs]]\nname = "b"\ncommand = ["true"]\n'
    )
    out = engine.cli("submit", "--spec", str(spec))
    assert out.returncode == 2
    assert out.stderr == (
        f"gpulayer-tui: {spec}: job 1 (a): depends_on 'b': no job before it in the file has "
        "that name (a name waits for an earlier job of the same file; an id, for any job)\n"
    )
    assert engine.cli("jobs", "--json").stdout == before
    spec.write_text(
        '[[jobs]]\nname = "a"\ncommand = ["true"]\n[[jobs]]\nname = "a"\ncommand = ["true"]\n'
        '[[jobs]]\nname = "c"\ncommand = ["true"]\ndepends_on = ["a"]\n'
    )
    out = engine.cli("submit", "--spec", str(spec))
    assert out.returncode == 2
    assert "depends_on 'a': 2 jobs before it in the file have that name" in out.stderr
    # One name with two conditions: one was kept (the job was cancelled when "prep"
    # failed, though it asked to run whatever its end; tester h100).
    spec.write_text(
        '[[jobs]]\nname = "prep"\nshell = "exit 3"\n[[jobs]]\nname = "train"\n'
        'command = ["true"]\ndepends_on = ["prep", {job = "prep", any_exit = true}]\n'
    )
    out = engine.cli("submit", "--spec", str(spec))
    assert out.returncode == 2
    assert out.stderr == (
        f"gpulayer-tui: {spec}: job 2 (train): depends_on names 'prep' twice, once to run "
        "whatever its outcome (any_exit) and once only if it completes\n"
    )
    assert engine.cli("jobs", "--json").stdout == before


def test_a_folder_that_is_not_there_is_refused_at_submission(
    engine: Served, tmp_path: Path
) -> None:
    # It was stored, and failed at its start (maybe hours later, behind the queue): tester
    # h71. Nothing is stored now.
    before = engine.cli("jobs", "--json").stdout
    out = engine.cli("submit", "--cwd", str(tmp_path / "gone"), "--", "true")
    assert out.returncode == 2
    assert f"--cwd {tmp_path / 'gone'}: no such folder" in out.stderr
    (tmp_path / "file").write_text("")
    out = engine.cli("submit", "--cwd", str(tmp_path / "file"), "--", "true")
    assert out.returncode == 2 and "not a folder" in out.stderr
    # ~user of no user (taken as ./~nouser/x: "no such folder" in the current one), and
    # ~ after = (no shell expands it there: --cwd=~/x was ./~/x).
    out = engine.cli("submit", "--cwd", "~nouser-h/x", "--", "true")
    assert out.returncode == 2
    assert "--cwd ~nouser-h/x: no user 'nouser-h' (a folder named so: ./~nouser-h/x)" in (
        out.stderr
    )
    # A spec file's cwd too, relative ones from the file's folder (it was stored, and
    # failed "launch_failed": tester h122).
    spec = tmp_path / "job.json"
    for cwd, what in ((str(tmp_path / "gone"), "no such folder"), ("file", "not a folder")):
        spec.write_text(json.dumps({"shell": "true", "cwd": cwd}))
        out = engine.cli("submit", "--spec", str(spec))
        assert out.returncode == 2, out
        assert f"{spec}: cwd {tmp_path / Path(cwd).name}: {what}" in out.stderr, out
    assert engine.cli("jobs", "--json").stdout == before
    out = engine.cli("submit", "--cwd=~", "--json", "--", "true")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    job = json.loads(engine.cli("status", str(row["id"]), "--json").stdout)["job"]
    assert "~" not in job["spec"]["cwd"] and os.path.isabs(job["spec"]["cwd"])
    # A job that waits for another may run in a folder that one makes.
    made = tmp_path / "made"
    first = _submit(engine, "--", "mkdir", str(made))
    second = _submit(engine, "--after", first, "--cwd", str(made), "--", "pwd")
    assert engine.cli("wait", second).returncode == 0
    assert engine.cli("logs", second).stdout.strip() == str(made)


def test_an_edit_that_changes_nothing_says_so(
    engine: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An empty object was told "expected a JSON object of the fields to change" (tester
    # h71): it is one.
    from gpulayer_tui.client import ApiError, Client
    from gpulayer_tui.engine.paths import resolve_paths

    assert engine.cli("pause").returncode == 0
    job = _submit(engine, "--", "true")
    monkeypatch.setenv("GPULAYER_HOME", str(engine.home))  # (the served engine's)
    client = Client(resolve_paths())
    with pytest.raises(ApiError, match=r"no fields given to change \(one or more of: priority"):
        client.request("PATCH", f"/jobs/{job}", {})
    with pytest.raises(ApiError, match="expected a JSON object of the fields to change"):
        client.request("PATCH", f"/jobs/{job}", [1])
    assert engine.cli("resume").returncode == 0
    # An ended job's empty edit: that it ended is what is wrong, said first (it was told
    # "no fields given": tester h81).
    assert engine.cli("wait", job).returncode == 0
    with pytest.raises(ApiError, match=rf"job {job} has ended \(completed\): only a waiting"):
        client.request("PATCH", f"/jobs/{job}", {})


def test_service_options_with_a_service_spec_file_apply_without_service(
    engine: Served, tmp_path: Path
) -> None:
    # A file that says kind = "service" was told "--replicas only applies to services:
    # add --service" (tester h68).
    service = tmp_path / "svc.toml"
    service.write_text('kind = "service"\ncommand = ["sleep", "60"]\nreplicas = 2\n')
    out = engine.cli("submit", "--spec", str(service), "--replicas", "2", "--no-port", "--json")
    assert out.returncode == 0, out.stderr
    job_id = str(json.loads(out.stdout)[0]["id"])
    shown = json.loads(engine.cli("status", job_id, "--json").stdout)["job"]
    assert shown["kind"] == "service" and shown["spec"]["port"] is False
    assert engine.cli("cancel", job_id).returncode == 0
    out = engine.cli("submit", "--spec", str(service), "--replicas", "3")
    assert out.returncode == 2 and "--replicas 3, but its spec says replicas = 2" in out.stderr
    plain = tmp_path / "plain.toml"
    plain.write_text('command = ["true"]\n')
    out = engine.cli("submit", "--spec", str(plain), "--replicas", "2")
    assert out.returncode == 2
    assert out.stderr == (
        f"gpulayer-tui: {plain} is not a service, and --replicas only applies to services: "
        'add --service, or kind = "service" in the file\n'
    )


def test_a_timeout_is_taken_as_a_duration_too(engine: Served) -> None:
    # `--timeout 2h` was refused, "expected a number" (tester h69).
    assert engine.cli("pause").returncode == 0
    job = _submit(engine, "--timeout", "1h30m", "--", "true")
    shown = json.loads(engine.cli("status", job, "--json").stdout)["job"]
    assert shown["spec"]["timeout"] == 5400
    assert engine.cli("edit", job, "--timeout", "2d").returncode == 0
    shown = json.loads(engine.cli("status", job, "--json").stdout)["job"]
    assert shown["spec"]["timeout"] == 172800
    out = engine.cli("submit", "--timeout", "2x", "--", "true")
    assert out.returncode == 2
    assert "expected seconds or a duration such as 90m, 2h, 1h30m, 1d; got '2x'" in out.stderr
    assert engine.cli("resume").returncode == 0


def test_a_spec_file_and_a_command_together_are_refused(engine: Served, tmp_path: Path) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('command = ["true"]\n')
    out = engine.cli("submit", "--spec", str(spec), "--", "true")
    assert out.returncode == 2
    assert "give either --spec, --file or a command, not two of them" in out.stderr


def test_options_given_with_a_spec_file_fill_in_and_never_silently_lose(
    engine: Served, tmp_path: Path
) -> None:
    # --name X was dropped for specs that name themselves, while --gpus 1 reached those
    # that set no gpus (tester h62): an option a spec sets otherwise is now refused.
    spec = tmp_path / "jobs.toml"
    spec.write_text(
        '[[jobs]]\nname = "one"\ncommand = ["true"]\n'
        '[[jobs]]\nname = "two"\ncommand = ["true"]\npriority = 3\n'
    )
    out = engine.cli("submit", "--spec", str(spec), "--name", "X")
    assert out.returncode == 2
    assert out.stderr == (
        f"gpulayer-tui: {spec}, job 1: --name 'X', but its spec says name = 'one' (options "
        "given with --spec fill in what a spec leaves out; leave the option out, or the "
        "field)\n"
    )
    assert engine.cli("jobs", "--json").stdout.strip() == "[]"  # (nothing submitted)
    out = engine.cli("submit", "--spec", str(spec), "--priority", "3", "--json")
    assert out.returncode == 0, out.stderr
    ids = [str(j["id"]) for j in json.loads(out.stdout)]
    shown = [json.loads(engine.cli("status", i, "--json").stdout)["job"] for i in ids]
    assert [j["priority"] for j in shown] == [3, 3]  # (one filled in, one agreeing)
    # A refusal of the engine's names the file ("unknown field 'bogus'" named nothing).
    bad = tmp_path / "bad.json"
    bad.write_text('{"command": ["true"], "bogus": 1}')
    out = engine.cli("submit", "--spec", str(bad))
    assert out.returncode == 2 and out.stderr.startswith(f"gpulayer-tui: {bad}: "), out.stderr
    assert "bogus" in out.stderr


def test_a_reader_that_leaves_early_ends_the_cli_quietly(engine: Served) -> None:
    for _ in range(3):
        _submit(engine, "--", "true")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "jobs"],
        env=engine.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -0`: the first write meets a closed pipe
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 0
    assert err == ""


def _unread(sock: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def test_log_readers_that_leave_early_are_no_error_in_the_engines_log(engine: Served) -> None:
    # `logs N | head -2`: the engine logged an ERROR with a traceback ("Connection lost"),
    # 4 times in 10 such reads; a reader leaving is ordinary use.
    job = _submit(engine, "--", "seq", "1", "400000")
    wait_for(lambda: engine.cli("status", job).returncode == 0)
    for _ in range(10):
        sock = socket.socket(socket.AF_UNIX)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(str(engine.home / "engine.sock"))
        sock.sendall(f"GET /v1/jobs/{job}/logs HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert sock.recv(100)
        # Until the engine waits to write more (this reader's buffer full): the moment
        # `head` leaves in.
        wait_for(lambda s=sock: _unread(s) >= 4096)
        sock.close()  # (with unread data: the engine's next write meets a reset)
    # Each reader's end has been met once the engine serves every log to its end again.
    assert engine.cli("logs", job).stdout.count("\n") == 400000
    text = engine.log.read_text()
    assert "Error handling request" not in text and "Traceback" not in text


# The CLI as a shell starts it in the foreground: SIGINT at its default action. (Started
# from the test process as it is, it inherited SIGINT and SIGQUIT ignored when some other
# part of that process had them ignored at that moment, as glibc's system() does while its
# child runs; seen in full-suite runs only, and never in a terminal.)
_FOREGROUND = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('gpulayer_tui', run_name='__main__')"
)


@pytest.mark.parametrize("words", [["wait"], ["logs", "-f"]], ids=["wait", "logs-follow"])
def test_ctrl_c_exits_130_without_a_traceback(engine: Served, words: list[str]) -> None:
    job = _submit(engine, "--", "sleep", "600")
    proc = subprocess.Popen(
        [sys.executable, "-c", _FOREGROUND, *words, job],
        env=engine.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    # Interrupt once it is waiting (connected to the engine): its socket shows in /proc.
    wait_for(lambda: _has_socket(proc.pid), timeout=20)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"Traceback" not in err
    engine.cli("cancel", job, "--no-wait")


def _ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def _has_socket(pid: int) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(fd.readlink().as_posix().startswith("socket:") for fd in fds.iterdir())
    except OSError:
        return False


def test_without_an_engine_the_advice_is_on_lines_of_its_own(served: Served) -> None:
    out = served.cli("jobs")  # (no engine started)
    assert out.returncode == 3
    lines = out.stderr.splitlines()
    assert lines[0] == f"gpulayer-tui: no engine is serving {served.home}"
    assert lines[1].split() == ["start", "one", "with:", "gpulayer-tui", "--serve"]
    # Simulated GPUs are offered only where no driver is (a GPU box was offered them too).
    if not os.path.exists("/proc/driver/nvidia/version"):
        assert lines[2].strip() == (
            "(no NVIDIA driver here: --simulate 2xA100-80GB runs it on simulated GPUs)"
        )
    assert "\\x0a" not in out.stderr  # (line breaks are ours, not escaped as a user's text)


def test_a_state_dir_that_is_a_file_is_said_by_every_command(served: Served) -> None:
    # `doctor` died with a traceback, `jobs`/`gpus` said only "Not a directory", `stop`
    # "no engine is serving", each with another exit code.
    home = served.home.parent / "a-file"
    home.write_text("hi\n")
    for where in (home, home / "below"):
        served.env["GPULAYER_HOME"] = str(where)
        commands = (
            ["doctor"],
            ["doctor", "--json"],
            ["jobs"],
            ["gpus"],
            ["stop"],
            ["logs", "1"],
            ["--serve"],  # (it said ".../config.toml: cannot read: Not a directory")
            ["install-service", "--print"],  # (it wrote a unit for it)
        )
        for words in commands:
            out = served.cli(*words)
            assert out.returncode == 2, (words, out.stderr)
            said = f"gpulayer-tui: the state dir {where} (GPULAYER_HOME) is not a directory\n"
            assert out.stderr == said, words
    assert home.read_text() == "hi\n"


def test_a_batch_environment_is_sent_per_job_to_an_engine_from_before_it(
    paths: Paths, tmp_path: Path
) -> None:
    # An engine still serving across an upgrade (from before batch environments) takes
    # {"jobs", "env"} for one spec and refuses it naming 'jobs', storing nothing; the
    # client then sends each job the environment itself. One HTTP answer per connection,
    # as that engine gives them, played from a socket (the old version is not installed).
    import json
    import socket
    import threading

    from gpulayer_tui.client import Client

    bodies: list[dict[str, object]] = []
    answers = [
        (400, {"error": "unknown field 'jobs'", "field": "jobs"}),
        (201, {"jobs": [{"id": 1}, {"id": 2}]}),
    ]
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(paths.socket_file))
    listener.listen(2)

    def serve() -> None:
        for status, answer in answers:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(body) < length:
                    body += conn.recv(65536)
                bodies.append(json.loads(body))
                payload = json.dumps(answer).encode()
                conn.sendall(
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload
                )

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    specs = [{"shell": "true"}, {"shell": "true", "env": {"A": "own"}}]
    jobs = Client(paths, timeout=10).submit_many(specs, key="k", env={"A": "x", "B": "y"})
    server.join(timeout=10)
    listener.close()
    assert [job["id"] for job in jobs] == [1, 2]
    assert bodies[0] == {"jobs": specs, "env": {"A": "x", "B": "y"}}
    assert bodies[1] == {
        "jobs": [
            {"shell": "true", "env": {"A": "x", "B": "y"}},
            {"shell": "true", "env": {"A": "own", "B": "y"}},
        ]
    }


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["jobs", "--limit", "0"], "--limit: must not be less than 1, got 0"),
        (["jobs", "--page", "0"], "--page: must not be less than 1, got 0"),
        # (in argparse's words, as the others: a sentence of its own after parsing, h181)
        (["web", "--port", "65536"], "argument --port: must be at most 65535, got 65536"),
        (
            ["clean", "--keep", "99999999999999999999"],
            "--keep: must be at most 9223372036854775807",
        ),
        (
            ["jobs", "--page", str(2**63 - 1)],
            f"--page {2**63 - 1} is past any list (at most {(2**63 - 1) // 50 + 1})",
        ),
        # (float() reads "1_6" as 16, and digits of other scripts)
        (["submit", "--vram-gb", "1_6", "--", "true"], "expected a number, got '1_6'"),
        # (a unit after it, as `--simulate 2xA100-80GB` writes one: said so, h182 #7)
        (
            ["submit", "--vram-gb", "10GB", "--", "true"],
            "--vram-gb: expected a number of GiB without its unit (10), got '10GB'",
        ),
        (
            ["submit", "--vram-gb", "1.5 GiB", "--", "true"],
            "--vram-gb: expected a number of GiB without its unit (1.5), got '1.5 GiB'",
        ),
        (
            ["submit", "--vram-gb", "512MB", "--", "true"],
            "--vram-gb: expected a number of GiB, without a unit, got '512MB'",
        ),
        (
            ["submit", "--timeout", "\u0663", "--", "true"],
            "expected seconds or a duration such as 90m, 2h, 1h30m, 1d; got '\u0663'",
        ),
        # (inf and 1e300 ended `cancel --timeout` in an OverflowError)
        (["cancel", "1", "--timeout", "inf"], "must be at most 315360000 (10 years)"),
        (["wait", "1", "--timeout", "1e300"], "must be at most 315360000 (10 years)"),
        (["wait", "1", "--timeout", "315360001"], "must be at most 315360000 (10 years)"),
        (["wait", "1", "--timeout", "nan"], "must be a number of seconds, got nan"),
        # (taken as given: "the pid was reused", of a process never reused)
        (["signal", "1234", "--start-ticks", "-5"], "must be from 0 to"),
        # ("must be at most 3.1536e+08 s, got 3.1536e+08")
        (["submit", "--timeout", "315360001", "--", "true"], "at most 315360000 s, got 315360001"),
        # (as typed: "got 1e+20" of twenty digits, h151)
        (
            ["submit", "--timeout", "100000000000000000000", "--", "true"],
            "at most 315360000 s, got 100000000000000000000",
        ),
        # (what was typed, then its seconds: it said only "got 8639999913600", h86)
        (
            ["submit", "--timeout", "99999999d", "--", "true"],
            "at most 315360000 s, got 99999999d (8639999913600 s)",
        ),
        # (too large for a float: "must be a finite number, not inf", of what was typed)
        (["submit", "--vram-gb", "1e400", "--", "true"], "must be at most 1000000 GiB, got 1e400"),
        (["submit", "--timeout=-1e400", "--", "true"], "must be greater than 0, got -1e400"),
        # (a duration with a minus was "expected one argument": its unit made it an option)
        (["jobs", "--since", "-1h"], "--since: expected seconds or a duration such as"),
        (["submit", "--timeout", "-1h", "--", "true"], "--timeout: expected seconds or a"),
        (["submit", "--", "   "], "command: the program name (first word) is empty"),
        # (checked as seconds: "about 31 years", and past the engine's own limit)
        (["submit", "--mem-gb", "2000000", "--", "true"], "at most 1000000 GB, got 2000000"),
        # (taken, and meant nothing: there is no wait for it to bound)
        (["cancel", "1", "--no-wait", "--timeout", "5"], "--timeout: not allowed with"),
        # (a prefix was taken for the option: --cpu 4 read as --cpus 4: h66)
        (["submit", "--cpu", "4", "--", "true"], "unrecognized arguments: --cpu"),
        (["jobs", "--stat", "failed"], "unrecognized arguments: --stat failed"),
    ],
    ids=[
        "limit-0",
        "page-0",
        "port-past-65535",
        "keep-huge",
        "page-huge",
        "underscore",
        "gb-unit",
        "gib-unit-spaced",
        "mb-unit",
        "arabic-indic",
        "cancel-inf",
        "wait-huge",
        "wait-past-engine",
        "wait-nan",
        "start-ticks-negative",
        "timeout-past-ceiling",
        "timeout-twenty-digits",
        "timeout-days-past-ceiling",
        "vram-overflow",
        "timeout-overflow",
        "since-negative-duration",
        "timeout-negative-duration",
        "blank-program",
        "mem-gb",
        "cancel-no-wait-timeout",
        "option-prefix-submit",
        "option-prefix-jobs",
    ],
)
def test_counts_out_of_range_are_refused_by_name(
    engine: Served, argv: list[str], said: str
) -> None:
    out = engine.cli(*argv)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "1e9", "1_0", "\u0661\u0660"])
def test_a_bad_gpulayer_timeout_is_refused_not_ignored(engine: Served, value: str) -> None:
    engine.env["GPULAYER_TIMEOUT"] = value
    out = engine.cli("jobs")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        "gpulayer-tui: GPULAYER_TIMEOUT must be seconds, more than 0 and at most 86400, "
        f"not '{value}'\n"
    )


def test_the_api_refuses_an_empty_page_a_keep_past_sqlite_and_a_batch_with_more(
    engine: Served, paths: Paths
) -> None:
    from .raw_http import request

    socket_path = paths.socket
    status, body = request(socket_path, "GET", "/v1/jobs?limit=0")
    assert status == 400 and "limit must be 1 or more" in body["error"]
    # A route asked for without its /v1 says where the routes are (a bare 404: h182 #8).
    status, body = request(socket_path, "GET", "/health")
    assert status == 404 and body["error"] == (
        "GET /health: Not Found; the API's routes are under /v1 (GET /v1/health)"
    )
    status, body = request(socket_path, "GET", "/v1/nothing")
    assert (status, body["error"]) == (404, "GET /v1/nothing: Not Found")
    status, body = request(socket_path, "GET", "/v1")  # (not "the routes are under /v1")
    assert (status, body["error"]) == (404, "GET /v1: Not Found")
    # A negative pid is out of range, not "not a whole number" (tester h171 #6).
    status, body = request(socket_path, "GET", "/v1/processes/-1")
    assert (status, body["error"]) == (400, "pid: must be a process id from 1 to 4194304")
    # A zombie is said as one, as the adopt and signal routes say it (a bare "no process
    # with pid Z" beside them: tester h191 #2).
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os,sys,time; p=os.fork()\nif p==0: os._exit(0)\n"
         "print(p, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        wait_for(lambda: Path(f"/proc/{zombie}/stat").read_text().split(") ")[1][0] == "Z")
        status, body = request(socket_path, "GET", f"/v1/processes/{zombie}")
        assert (status, body["error"]) == (
            404,
            f"pid {zombie} has exited (a zombie its parent, pid {parent.pid}, has not reaped yet)",
        )
    finally:
        parent.kill()
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()
    status, body = request(socket_path, "POST", "/v1/clean", {"keep": 2**63})
    assert status == 400 and "keep must be a whole number" in body["error"]
    # A key it does not take is named (the typo "older_than" was not: tester h111).
    status, body = request(socket_path, "POST", "/v1/clean", {"keep": 3, "older_than": 2})
    assert status == 400 and body["field"] == "older_than", body
    assert body["error"].endswith("unknown key 'older_than'"), body
    batch = {"jobs": [{"command": ["true"]}], "extra": 1}
    status, body = request(socket_path, "POST", "/v1/jobs", batch)
    assert status == 400 and body["error"].endswith("unknown key 'extra'"), body


@pytest.mark.parametrize(
    ("words", "usage"),
    [
        (["status", "1", "\x1b]0;PWN\x07"], "usage: gpulayer-tui status"),
        (["submit", "--\x1b]0;PWN\x07", "--", "true"], "usage: gpulayer-tui submit"),
        (["jobs", "--x\x1b[2J"], "usage: gpulayer-tui jobs"),
        (["submit", "--env", "A\x1b[2J", "--", "true"], "usage: gpulayer-tui submit"),
        (["domain", "drain"], "usage: gpulayer-tui domain"),
        # (taken and dropped without a word: tester h131)
        (["domain", "release", "gpu0", "--reason", "x"], "usage: gpulayer-tui domain"),
        (["submit", "--gpu", "1", "--", "true"], "usage: gpulayer-tui submit"),
        # (it served with --simulate, the other ignored: h131)
        (["--serve", "--simulate", "1xL4-24GB", "--simulate-if-no-gpu", "1xL4-24GB"], "usage:"),
    ],
)
def test_usage_errors_show_what_was_typed_as_text_with_the_subcommands_usage(
    tmp_path: Path, words: list[str], usage: str
) -> None:
    # argparse echoed an unknown argument raw: an OSC sequence retitled the terminal, a
    # CSI one cleared it; and errors about a subcommand's arguments showed the top level's
    # usage.
    out = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", *words],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "GPULAYER_HOME": str(tmp_path)},
        timeout=60,
    )
    assert out.returncode == 2
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr
    assert out.stderr.startswith(usage), out.stderr
    # (the usage cut to its first lines: submit's 13 buried the error: tester h131)
    assert len(out.stderr.splitlines()) <= 5, out.stderr
    if "--gpu" in words:  # (a near miss is named: tester h131)
        assert "unrecognized arguments: --gpu (did you mean --gpus?)" in out.stderr
    if "--serve" in words:
        assert "give --simulate or --simulate-if-no-gpu, not both" in out.stderr
    if "--reason" in words:
        assert "--reason goes with drain (the reason said for it), not release" in out.stderr
    if "\x1b" in "".join(words):
        assert "\\x1b" in out.stderr


def test_small_cli_mistakes_are_told_not_ignored(engine: Served, tmp_path: Path) -> None:
    # Each of these ran quietly on something else than what was typed.
    first = _submit(engine, "--", "true")
    second = _submit(engine, "--", "true")
    both = engine.cli("submit", "--after", f"{first},{second}", "--json", "--", "true")
    assert both.returncode == 0, both.stderr  # a comma list, as `jobs --status a,b`
    assert json.loads(both.stdout)["spec"]["depends_on"] == [int(first), int(second)]
    for typed, told in (("3,,4", "missing between the commas"), ("3,3", "job 3 is named twice")):
        out = engine.cli("submit", "--after", typed, "--", "true")
        assert out.returncode == 2 and told in out.stderr, out.stderr  # (read as 3,4 and 3)
    # A repeat across words or flags is the same slip as one inside a comma list (h92:
    # `wait 5,5` was refused and `wait 5 5` taken; `--after 3 --after 3` went through).
    for words in (
        ("wait", first, first),
        ("cancel", first, f"{second},{first}"),
        ("submit", "--after", first, "--after", first, "--", "true"),
        ("edit", second, "--after-any", first, "--after-any", f"{first}"),
    ):
        out = engine.cli(*words)
        assert out.returncode == 2, (words, out.stderr)
        assert f"job {first} is named twice" in out.stderr, (words, out.stderr)
    assert len(json.loads(engine.cli("jobs", "--json").stdout)) == 3  # (none stored)
    # The engine's refusals name the flag typed, not the spec field ("depends_on: no job
    # 999" for --after-any 999: tester h94); a spec file keeps its own field names.
    held = _submit(engine, "--", "sleep", "60")
    waiting = _submit(engine, "--after", held, "--", "true")
    for words, said in (
        (["submit", "--after-any", "999", "--", "true"], "--after-any: no job 999"),
        (["submit", "--domain", "gpu9", "--", "true"], "--domain: unknown domain 'gpu9'"),
        (["edit", waiting, "--replicas", "2"], f"--replicas: job {waiting} is not a service"),
        # (a running one too: "only a waiting job is edited" was said: tester h117)
        (["edit", held, "--replicas", "2"], f"--replicas: job {held} is not a service"),
    ):
        out = engine.cli(*words)
        assert out.returncode in (1, 2) and out.stderr.startswith(f"gpulayer-tui: {said}"), (
            words,
            out.stderr,
        )
    spec_file = tmp_path / "job.toml"
    spec_file.write_text('command = ["true"]\ndomain = "gpu9"\n')
    out = engine.cli("submit", "--spec", str(spec_file))
    assert f"{spec_file}: domain: unknown domain 'gpu9'" in out.stderr, out.stderr
    engine.cli("cancel", held)
    for typed in ("1_0", "\u0663", "1e1", "-1"):  # int() read "1_0" as 10 and "٣" as 3
        out = engine.cli("status", typed)
        assert out.returncode == 2 and "a job id is a number" in out.stderr, typed
    out = engine.cli("submit", "--cwd=", "--", "true")
    assert out.returncode == 2 and "--cwd needs a folder" in out.stderr
    out = engine.cli("--config", str(tmp_path / "nope.toml"), "jobs")
    assert out.returncode == 2 and "--config: no such file" in out.stderr
    out = engine.cli("--config", str(tmp_path / "nope.toml"), "install-service", "--print")
    assert out.returncode == 2 and "--config: no such file" in out.stderr  # (a dead unit)
    out = engine.cli("--config", str(tmp_path), "jobs")
    assert out.returncode == 2 and "--config: not a regular file" in out.stderr
    out = engine.cli("--config=", "jobs")
    assert out.returncode == 2 and "--config needs a file (it was empty)" in out.stderr
    listed = engine.cli("domain", "list", "gpu0", "--json")
    assert [d["name"] for d in json.loads(listed.stdout)] == ["gpu0"]
    out = engine.cli("domain", "list", "gpu7")
    assert out.returncode == 2 and "unknown domain 'gpu7'" in out.stderr
    out = engine.cli("submit", "--replicas", "2", "--", "true")
    assert "--replicas only applies to services: add --service" in out.stderr


def test_bytes_that_were_not_utf8_are_shown_as_those_bytes() -> None:
    from gpulayer_tui.fields import printable

    # (a non-UTF-8 argv or environment arrives with surrogateescape: \udcff for 0xff)
    assert printable("a\udcff\udcfeb") == "a\\xff\\xfeb"
    assert printable("\x1b\u202e") == "\\x1b\\u202e"


def test_submit_from_a_removed_folder_says_so(engine: Served, tmp_path: Path) -> None:
    # It said only "No such file or directory", naming nothing.
    gone = tmp_path / "gone"
    gone.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", f"import os, sys, runpy; os.chdir({str(gone)!r}); "
         f"os.rmdir({str(gone)!r}); sys.argv = ['gpulayer-tui', 'submit', '--', 'true']; "
         "runpy.run_module('gpulayer_tui', run_name='__main__')"],
        capture_output=True, text=True, env=engine.env, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "the current folder no longer exists" in out.stderr
    # --like runs in the job's own folder: a removed one here is no matter.
    first = _submit(engine, "--", "true")
    gone.mkdir()
    like = subprocess.run(
        [sys.executable, "-c", f"import os, sys, runpy; os.chdir({str(gone)!r}); "
         f"os.rmdir({str(gone)!r}); sys.argv = ['gpulayer-tui', 'submit', '--like', "
         f"'{first}']; runpy.run_module('gpulayer_tui', run_name='__main__')"],
        capture_output=True, text=True, env=engine.env, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert like.returncode == 0, like.stderr


def test_logs_replica_0_of_a_batch_job_is_its_log(engine: Served) -> None:
    # 0 is the documented default, yet asked for it was refused: "is not a service".
    job = _submit(engine, "--", "echo", "hello")
    assert engine.cli("wait", job).returncode == 0
    read = engine.cli("logs", job, "--replica", "0")
    assert (read.returncode, read.stdout) == (0, "hello\n"), read.stderr
    other = engine.cli("logs", job, "--replica", "1")
    assert other.returncode == 2
    assert f"job {job} is not a service; its one log is replica 0, not 1" in other.stderr


def test_a_job_whose_dependency_was_cleaned_restarts_and_is_copied(engine: Served) -> None:
    # Its dependency had completed before it ran; cleaned from the history since, restart
    # and --like were refused for ever: "depends_on: no job 1" (a field never typed).
    first = _submit(engine, "--", "true")
    assert engine.cli("wait", first).returncode == 0
    second = _submit(engine, "--after", first, "--", "true")
    assert engine.cli("wait", second).returncode == 0
    cleaned = engine.cli("clean", "--keep", "1")
    assert cleaned.returncode == 0 and "removed 1 finished job" in cleaned.stdout, cleaned
    restarted = engine.cli("restart", second)
    assert restarted.returncode == 0, restarted.stderr
    new = restarted.stdout.strip()
    # Said, here and in its timeline (its spec just had fewer, no word why: tester h145).
    assert restarted.stderr == (
        f"gpulayer-tui: note: job {new} does not wait for job {first}, which job {second} "
        "depended on: cleaned from the history (it had ended before that job ran)\n"
    )
    events = json.loads(engine.cli("status", "--json", new).stdout)["events"]
    assert events[0]["kind"] == "job.submitted" and events[0]["message"] == (
        f"restart of job {second}: its dependency on job {first} left out (cleaned from the "
        f"history; ended before job {second} ran)"
    )
    gone = engine.cli("status", first)  # (it said "no job 1", as of an id never given)
    assert f"no job {first} (no longer in the history: cleaned)" in gone.stderr
    again = json.loads(engine.cli("status", "--json", restarted.stdout.split()[-1]).stdout)
    assert again["job"]["spec"]["depends_on"] == []
    like = engine.cli("submit", "--like", second, "--", "echo", "hi")
    assert like.returncode == 0, like.stderr
    assert (
        f"--like {second}: its dependency job {first} is no longer in the history "
        "(cleaned): left out" in like.stderr
    )
    # Named directly, it is refused with the reason.
    direct = engine.cli("submit", "--after", first, "--", "true")
    assert direct.returncode == 2
    assert f"--after: no job {first} (no longer in the history: cleaned)" in direct.stderr
    unknown = engine.cli("submit", "--after", "999", "--", "true")
    assert "--after: no job 999\n" in unknown.stderr


def test_ids_and_numbers_of_thousands_of_digits_are_refused_by_name(engine: Served) -> None:
    # Past 4,300 digits int() raises: these printed a Python traceback.
    huge = "1" + "0" * 5000
    for argv in (["status", huge], ["submit", "--after", huge, "--", "true"], ["cancel", huge]):
        out = engine.cli(*argv)
        assert out.returncode == 2, (argv[0], out.stderr[-500:])
        assert "Traceback" not in out.stderr
        assert "at most 9223372036854775807, got 100000000000... (5001 digits)" in out.stderr


def test_a_long_filter_is_refused_in_the_engines_words_and_a_bare_http_error_says_more(
    engine: Served,
) -> None:
    # A request line past aiohttp's 8190 bytes was refused by aiohttp itself in
    # text/plain, and the CLI said only "HTTP 400".
    out = engine.cli("jobs", "--filter", "a" * 9000)
    assert out.returncode == 2
    assert "the text filter is over 1000 characters" in out.stderr, out.stderr
    from gpulayer_tui.client import ApiError, Client

    client = Client(Paths(engine.home, engine.home / "config.toml"), timeout=10)
    with pytest.raises(ApiError) as refused:  # (past even the raised limit: aiohttp's own)
        client.jobs_page(q="a" * 70_000)
    assert refused.value.status == 400
    assert str(refused.value).startswith("HTTP 400: ") and len(str(refused.value)) > 10
    assert "bytearray" not in str(refused.value)  # (aiohttp's repr of what it read)


def test_status_shows_what_a_job_asked_for(engine: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    # It showed none of what `edit` changes: the only way to see it was --json.
    first = _submit(engine, "--", "sleep", "60")
    waiting = _submit(engine, "--after", first, "--gpus", "1", "--", "true")
    edited = engine.cli(
        "edit", waiting, "--priority", "7", "--vram-gb", "20", "--timeout", "100",
        "--after-any", first,
    )  # fmt: skip
    assert edited.returncode == 0, edited.stderr
    shown = engine.cli("status", waiting).stdout
    assert "  asks for    1 GPU, 20 GiB VRAM per GPU\n" in shown, shown
    assert "  priority    7\n" in shown and "  timeout     1m40s\n" in shown
    assert f"  after       job {first} (any end)\n" in shown
    assert f"  cwd         {REPO}\n" in shown
    plain = engine.cli("status", first).stdout
    assert "asks for" not in plain and "priority" not in plain and "after " not in plain
    # A list of domains: which of them, or all of them ("or" was said of both).
    from gpulayer_tui.cli.format import _request_lines

    def asks(spec: dict[str, object]) -> str:
        return next(line for line in _request_lines(spec) if "asks for" in line).split("    ")[-1]

    assert asks({"gpus": 1, "domain": ["gpu0", "gpu1"]}).endswith("on gpu0 or gpu1")
    assert asks({"gpus": 2, "domain": ["gpu0", "gpu1"]}).endswith("on gpu0 and gpu1")
    assert asks({"gpus": 2, "domain": ["a", "b", "c"]}).endswith("on 2 of a, b, c")
    # A count left out is the engine's: one GPU for a GPU pin ("on gpu3": tester h91).
    assert asks({"domain": "gpu3"}) == "1 GPU, on gpu3"
    assert asks({"domain": "cpu"}) == "on cpu"
    # What was set can be taken away again (only the TUI's form could, with an empty field).
    engine.cli("edit", waiting, "--project", "p1").check_returncode()
    cleared = engine.cli("edit", waiting, "--no-timeout", "--no-vram", "--no-project")
    assert cleared.returncode == 0, cleared.stderr
    spec = json.loads(engine.cli("status", "--json", waiting).stdout)["job"]["spec"]
    assert (spec.get("timeout"), spec.get("vram_gb"), spec.get("project")) == (None, None, None)
    assert spec["priority"] == 7 and spec["gpus"] == 1
    both = engine.cli("edit", waiting, "--timeout", "5", "--no-timeout")
    assert both.returncode == 2 and "--no-timeout contradicts --timeout" in both.stderr
    # A GPU job made a CPU one loses its vram_gb: said (it went unsaid: tester h86); the
    # API answers every field that changed.
    engine.cli("edit", waiting, "--vram-gb", "20").check_returncode()
    to_cpu = engine.cli("edit", waiting, "--gpus", "0")
    assert to_cpu.returncode == 0, to_cpu.stderr
    assert f"job {waiting}: vram_gb 20 dropped: a job on no GPU" in to_cpu.stderr
    back = json.loads(engine.cli("edit", waiting, "--gpus", "1", "--json").stdout)
    assert back["changed"] is True
    from gpulayer_tui.client import Client
    from gpulayer_tui.engine.paths import resolve_paths

    monkeypatch.setenv("GPULAYER_HOME", str(engine.home))  # (the served engine's)
    answer = Client(resolve_paths()).request(
        "PATCH", f"/jobs/{waiting}", {"gpus": 0, "priority": 3}
    )
    assert answer["fields"] == {"gpus": [1, 0], "priority": [7, 3]}
    assert engine.cli("cancel", first).returncode == 0


def test_like_of_a_service_takes_service_options_without_service(engine: Served) -> None:
    # "--replicas only applies to services: add --service", of a copy that is a service.
    service = _submit(engine, "--service", "--replicas", "2", "--no-port", "--", "sleep", "60")
    copy = engine.cli("submit", "--like", service, "--replicas", "1", "--max-restarts", "3")
    assert copy.returncode == 0, copy.stderr
    made = json.loads(engine.cli("status", "--json", copy.stdout.strip()).stdout)["job"]
    assert made["kind"] == "service"
    assert (made["spec"]["replicas"], made["spec"]["max_restarts"]) == (1, 3)
    batch = _submit(engine, "--", "true")
    refused = engine.cli("submit", "--like", batch, "--replicas", "2")
    assert refused.returncode == 2
    assert f"--like {batch}: job {batch} is not a service, and --replicas only applies" in (
        refused.stderr
    )
    for job in (service, copy.stdout.strip()):
        assert engine.cli("cancel", job).returncode == 0


def test_resume_says_when_nothing_was_paused_and_edits_say_dependencies_in_words(
    engine: Served,
) -> None:
    assert engine.cli("pause").returncode == 0
    assert engine.cli("resume").stdout == "queue resumed\n"
    assert engine.cli("resume").stdout == "the queue was not paused\n"  # (it said "resumed")
    first = _submit(engine, "--", "sleep", "60")
    waiting = _submit(engine, "--after", first, "--", "true")
    other = _submit(engine, "--", "true")
    edited = engine.cli("edit", waiting, "--after", first, "--after-any", other)
    assert edited.returncode == 0, edited.stderr
    timeline = engine.cli("status", waiting).stdout
    # (it read "depends_on [1] -> [1, {'job': 3, 'any_exit': True}]")
    assert f"after {first} -> {first}, {other} (any end)" in timeline, timeline
    assert engine.cli("cancel", first).returncode == 0


def test_an_empty_status_filter_a_negative_wait_and_a_body_too_large_are_said(
    engine: Served, paths: Paths
) -> None:
    from .raw_http import request

    out = engine.cli("jobs", "--status", "")
    assert out.returncode == 2 and "--status needs a status" in out.stderr  # (it listed all)
    job = _submit(engine, "--", "true")
    status, body = request(paths.socket, "GET", f"/v1/jobs/{job}/wait?timeout=-1")
    assert status == 400
    assert body["error"].startswith("timeout must be a number of seconds from 0 to ")
    from .raw_http import UnixHTTPConnection

    big = b'{"command": ["true"], "name": "' + b"x" * (65 * 2**20) + b'"}'
    conn = UnixHTTPConnection(paths.socket)
    try:
        status, body, _ = conn.call("POST", "/v1/jobs", big)
    finally:
        conn.close()
    assert status == 413 and "the request body is over 64 MiB" in body["error"], body


def _on_a_terminal(
    engine: Served, columns: int, *argv: str, rows: int = 24, env: dict[str, str] | None = None
) -> str:
    """What ``gpulayer-tui ARGV`` shows on a terminal ``columns`` wide (``env``: over the
    engine's, ``COLUMNS`` left out unless given)."""
    import os
    import pty

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpulayer_tui", *argv],
            stdout=follower,
            stderr=subprocess.PIPE,
            env={**{k: v for k, v in engine.env.items() if k != "COLUMNS"}, **(env or {})},
            cwd=REPO,
            timeout=60,
        )
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0, done.stderr
    return shown.decode().replace("\r\n", "\n")


def test_jobs_on_a_terminal_that_says_0_columns_takes_columns(engine: Served) -> None:
    # Under `script` or some CI the terminal says 0 columns: every row was cut to "I…".
    _submit(engine, "--name", "a-visible-name", "--", "true")
    shown = _on_a_terminal(engine, 0, "jobs", rows=0, env={"COLUMNS": "150"})
    assert "a-visible-name" in shown, shown


def test_the_jobs_table_shows_priorities_and_keeps_exit_at_80_columns(engine: Served) -> None:
    # Tester h69: no column said a job's priority, and at 80 columns the cut at the edge
    # took EXIT (a failed sweep's codes) while empty columns kept their room.
    first = _submit(engine, "--name", "low", "--", "sh", "-c", "exit 3")
    assert engine.cli("wait", first).returncode == 1
    urgent = _submit(engine, "--priority", "5", "--name", "urgent", "--", "true")
    assert engine.cli("wait", urgent).returncode == 0
    piped = engine.cli("jobs").stdout.splitlines()
    every = "ID NAME USER STATUS PRIO DOMAINS GPUS VRAM RUNTIME EXIT REASON".split()
    assert piped[0].split() == every  # (piped: every column, whole)
    import getpass

    assert piped[1].split()[:5] == [urgent, "urgent", getpass.getuser(), "completed", "+5"]
    narrow = _on_a_terminal(engine, 80, "jobs").splitlines()
    assert narrow[0].split() == [c for c in every if c not in ("GPUS", "VRAM")]  # (empty)
    assert all(len(line) <= 80 for line in narrow)
    exit_at = narrow[0].index("EXIT")
    assert narrow[2][exit_at] == "3", narrow
    # No job listed has a priority: no PRIO column.
    assert "PRIO" not in engine.cli("jobs", "--filter", "low").stdout


def test_jobs_status_active_is_every_waiting_or_running_job(engine: Served) -> None:
    # The TUI's `s` filter has "active"; the CLI refused it, "unknown status" (tester h74).
    assert engine.cli("pause").returncode == 0
    waiting = _submit(engine, "--", "true")
    done = _submit(engine, "--name", "x", "--", "true")
    assert engine.cli("cancel", done).returncode == 0
    shown = json.loads(engine.cli("jobs", "--status", "active", "--json").stdout)
    assert [row["id"] for row in shown] == [int(waiting)]
    both = json.loads(engine.cli("jobs", "--status", "active,cancelled", "--json").stdout)
    assert [row["id"] for row in both] == [int(done), int(waiting)]
    assert engine.cli("resume").returncode == 0


def test_cancel_waits_on_through_an_engine_restart(served: Served) -> None:
    # The cancel was stored and done, but its wait exited 3 ("no engine") when the engine
    # restarted meanwhile.
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text("[engine]\ngrace_period = 6.0\n")
    served.start("--simulate", "1xA100-80GB")
    job = _submit(served, "--", "sh", "-c", "trap '' TERM; while :; do sleep 0.1; done")
    wait_for(
        lambda: json.loads(served.cli("status", "--json", job).stdout)["job"]["pid"], timeout=20
    )
    cancel = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "cancel", job],
        env=served.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert cancel.stderr is not None
    assert "waiting until" in cancel.stderr.readline()  # (it waits for the SIGKILL)
    served.stop()
    served.start("--simulate", "1xA100-80GB")
    out, err = cancel.communicate(timeout=60)
    assert cancel.returncode == 0, err
    assert out.startswith(f"job {job} cancelled"), (out, err)


def test_domain_takes_a_comma_list_as_after_does(served: Served) -> None:
    # `--domain gpu0,gpu1` was refused as one (unknown) domain name (tester h84).
    engine = served
    engine.start("--simulate", "2xA100-80GB")

    def pinned(*words: str) -> object:
        job = _submit(engine, *words, "--", "true")
        status = engine.cli("status", "--json", job)
        return json.loads(status.stdout)["job"]["spec"].get("domain")

    assert pinned("--gpus", "2", "--domain", "gpu0,gpu1") == ["gpu0", "gpu1"]
    assert pinned("--domain", "gpu1, gpu0") == ["gpu1", "gpu0"]
    assert pinned("--domain", "gpu1,") == "gpu1"
    # A name given twice is told, as a repeated --after id is (it was taken once, silently:
    # most often it is a slip for another name; tester h114).
    for words in (["gpu0,gpu0"], ["gpu1, gpu0", "--domain", "gpu1"]):
        twice = engine.cli("submit", "--domain", *words, "--", "true")
        assert twice.returncode == 2 and "is named twice" in twice.stderr, twice.stderr
    # No name at all is said so ("unknown domain ','" was: tester h117).
    empty = engine.cli("submit", "--domain", ",", "--", "true")
    assert empty.returncode == 2 and "--domain: no domain name in ','" in empty.stderr
    refused = engine.cli("submit", "--domain", "gpu0,nope", "--", "true")
    assert refused.returncode != 0 and "nope" in refused.stderr, refused.stderr


def test_like_of_a_gpu_job_as_a_cpu_job_leaves_its_vram_out(engine: Served) -> None:
    # Refused: "vram_gb is per GPU, but gpus is 0", with no way to leave vram_gb out.
    gpu_job = _submit(engine, "--gpus", "1", "--vram-gb", "10", "--domain", "gpu0", "--", "true")
    copy = engine.cli("submit", "--like", gpu_job, "--gpus", "0", "--", "true")
    assert copy.returncode == 0, copy.stderr
    spec = json.loads(engine.cli("status", "--json", copy.stdout.strip()).stdout)["job"]["spec"]
    assert spec.get("gpus") == 0 and "vram_gb" not in spec and "domain" not in spec


def test_like_takes_every_option_given_over_the_jobs_own(engine: Served) -> None:
    # --notify, --preemptible, --no-requeue and --priority 0 were dropped without a word.
    old = _submit(engine, "--priority", "7", "--", "true")
    copy = engine.cli(
        "submit", "--like", old, "--priority", "0", "--notify", "--preemptible", "--no-requeue"
    )
    assert copy.returncode == 0, copy.stderr
    job = json.loads(engine.cli("status", "--json", copy.stdout.strip()).stdout)["job"]
    spec = job["spec"]
    assert (job["priority"], spec.get("notify"), spec.get("preemptible")) == (0, True, True)
    assert spec.get("requeue") is False
    kept = engine.cli("submit", "--like", old)  # (nothing given: its own priority stays)
    shown = json.loads(engine.cli("status", "--json", kept.stdout.strip()).stdout)["job"]
    assert shown["priority"] == 7


def test_like_of_a_restarted_job_is_no_restart(engine: Served) -> None:
    # --like copied the job's restart_of: the new job claimed to restart job 1 (and the
    # engine now refuses a submission that names one).
    old = _submit(engine, "--", "true")
    assert engine.cli("wait", old).returncode == 0
    restarted = engine.cli("restart", old)
    assert restarted.returncode == 0, restarted.stderr
    copy = engine.cli("submit", "--like", restarted.stdout.strip())
    assert copy.returncode == 0, copy.stderr
    job = json.loads(engine.cli("status", "--json", copy.stdout.strip()).stdout)["job"]
    assert "restart_of" not in job["spec"]


def test_like_runs_with_this_shells_environment_not_the_jobs(
    engine: Served, tmp_path: Path
) -> None:
    # The copy took the old job's environment: a PATH that found another program first
    # ran it again, and --no-inherit-env was not honoured.
    import os

    old = engine.cli("submit", "--env", "MYV=one", "--", "sh", "-c", "echo $MYV")
    old_id = old.stdout.strip()
    env = {**engine.env, "MYV": "two"}
    copy = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "submit", "--like", old_id],
        env=env, capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert copy.returncode == 0, copy.stderr
    bare = engine.cli("submit", "--like", old_id, "--no-inherit-env", "--env", "B=1")
    shown = {}
    for ident in (old_id, copy.stdout.strip(), bare.stdout.strip()):
        assert engine.cli("wait", ident).returncode == 0
        shown[ident] = json.loads(engine.cli("status", ident, "--json").stdout)["job"]["spec"]
    assert engine.cli("logs", copy.stdout.strip()).stdout == "two\n"
    assert shown[bare.stdout.strip()].get("env") == {"B": "1"}
    assert "PATH" in shown[old_id]["env"] and os.environ.get("PATH")


def test_status_of_a_job_waiting_again_says_so_instead_of_an_empty_runtime() -> None:
    # A service being placed again printed "started 2026-12-02 10:47:26  runtime ".
    from gpulayer_tui.cli.format import format_job

    job: dict[str, Any] = {
        "id": 7, "name": "svc", "kind": "service", "status": "queued",
        "termination_reason": None, "exit_code": None, "message": "placing again",
        "domains": [], "gpus": [], "pid": None, "started_at": 100.0, "ended_at": None,
        "spec": {"command": ["sleep", "60"], "cwd": "/"}, "priority": 0, "created_at": 90.0,
        "queued_at": 150.0, "owner_uid": 0, "kill_at": None, "stop_reason": None,
        "replicas": [],
    }  # fmt: skip
    shown = format_job(job, [], 200.0)  # type: ignore[arg-type]
    started = next(line for line in shown.splitlines() if line.startswith("  started"))
    assert started.endswith("  (last start; waiting again)"), started
    job["status"] = "running"
    running = format_job(job, [], 200.0)  # type: ignore[arg-type]
    assert "  runtime 1m40s" in running, running
    # An ended service says none of the replicas it ran is up ("replicas    -"; then "2": h96).
    job.update(status="completed", ended_at=160.0, spec={**job["spec"], "replicas": 2})
    assert "  replicas    0/2 up  restart always" in format_job(job, [], 200.0)  # type: ignore[arg-type]
    # A crash loop's timeline is cut to its last entries, and says so (164 entries in
    # 28 s were printed whole: tester h127).
    events: Any = [
        {"at": 100.0 + n, "kind": "replica", "status": None, "reason": None,
         "message": f"replica 0: restart #{n}"}
        for n in range(100)
    ]  # fmt: skip
    shown = format_job(job, events, 200.0, last=40).splitlines()  # type: ignore[arg-type]
    timeline = shown[shown.index("  timeline") + 1 :]
    assert timeline[0] == "    ... 60 earlier (status 7 --last 0 shows all)", timeline[0]
    assert len(timeline) == 41 and timeline[-1].endswith("replica 0: restart #99")
    whole = format_job(job, events, 200.0, last=0).splitlines()  # type: ignore[arg-type]
    assert len(whole) == len(shown) + 59


@pytest.mark.parametrize(
    ("status", "reason", "gpus", "shown"),
    [
        ("cancelled", "cancelled", [1], "cancelled\n  message     cancelled by user"),
        ("failed", "exit_code", [0, 1], "failed\n  message"),
        ("failed", "over_capacity", [], "failed (over capacity)\n"),
        ("cancelled", "dependency_failed", [], "cancelled\n"),
    ],
)
def test_status_says_a_reason_the_message_does_not_and_counts_gpus_right(
    status: str, reason: str, gpus: list[int], shown: str
) -> None:
    # "cancelled (cancelled)", "(GPUs 1)" for one GPU (tester h89)
    from gpulayer_tui.cli.format import format_job

    job: dict[str, Any] = {
        "id": 7, "name": "j", "kind": "command", "status": status,
        "termination_reason": reason, "exit_code": None, "message": "cancelled by user",
        "domains": [f"gpu{g}" for g in gpus], "gpus": gpus, "pid": None, "started_at": None,
        "ended_at": 150.0, "spec": {"command": ["true"]}, "priority": 0, "created_at": 90.0,
        "queued_at": 100.0, "owner_uid": 0, "kill_at": None, "stop_reason": None,
    }  # fmt: skip
    text = format_job(job, [], 200.0)  # type: ignore[arg-type]
    assert f"  status      {shown}" in text, text
    where = {0: "", 1: "  (GPU 1)", 2: "  (GPUs 0,1)"}[len(gpus)]
    assert f"\n  domains     {', '.join(job['domains']) or '-'}{where}\n" in text, text


def test_status_of_a_service_counts_its_gpus_per_replica() -> None:
    # "asks for 1 GPU" beside the three GPUs its replicas hold (tester h93).
    from gpulayer_tui.cli.format import format_job

    job: dict[str, Any] = {
        "id": 7, "name": "s", "kind": "service", "status": "running",
        "termination_reason": None, "exit_code": None, "message": "3/3 up",
        "domains": ["gpu0", "gpu1", "gpu2"], "gpus": [0, 1, 2], "pid": None,
        "started_at": 100.0, "ended_at": None, "priority": 0, "created_at": 90.0,
        "spec": {"command": ["srv"], "kind": "service", "gpus": 1, "replicas": 3},
        "queued_at": 95.0, "owner_uid": 0, "kill_at": None, "stop_reason": None,
        "replicas": [],
    }  # fmt: skip
    text = format_job(job, [], 200.0)  # type: ignore[arg-type]
    assert "  asks for    1 GPU per replica (3 in all)\n" in text, text
    job["spec"]["replicas"] = 1
    assert "  asks for    1 GPU\n" in format_job(job, [], 200.0), text  # type: ignore[arg-type]


def test_logs_of_a_job_that_has_not_started_says_so(engine: Served) -> None:
    # It printed nothing and exited 0, as for a job that wrote nothing.
    blocker = _submit(engine, "--gpus", "1", "--", "sleep", "60")
    waiting = _submit(engine, "--gpus", "1", "--", "true")
    out = engine.cli("logs", waiting)
    assert out.returncode == 0 and out.stdout == ""
    assert (
        out.stderr
        == f"gpulayer-tui: job {waiting} has not started yet: no output (logs -f waits for it)\n"
    )
    quiet = _submit(engine, "--", "true")
    assert engine.cli("wait", quiet).returncode == 0
    assert engine.cli("logs", quiet).stderr == ""
    # Ended without ever starting: said, exit 1 (`logs -f` said it "waits for it").
    engine.cli("cancel", waiting)
    for follow in ([], ["-f"]):
        out = engine.cli("logs", *follow, waiting)
        assert out.returncode == 1 and out.stdout == "", out
        assert out.stderr.startswith(
            f"gpulayer-tui: job {waiting} ended without starting (cancelled"
        )
        assert out.stderr.endswith("): no output\n")
    engine.cli("cancel", blocker)


def _line_from(proc: subprocess.Popen[str], within: float = 30.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], within)
    assert ready, "no line came"
    return proc.stdout.readline()


def test_logs_tail_prints_the_last_lines_then_follows_from_there(served: Served) -> None:
    # Two followers hold two streams: at the limit, a third is refused, and each of them
    # has had its start read by then (the engine reads it before it counts the stream).
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text("[limits]\nstreams_per_user = 2\n")
    served.start("--simulate", "1xA100-80GB")
    gate = served.home.parent / "gate"
    script = f"printf 'a\\nb\\n'; while [ ! -e {gate} ]; do sleep 0.05; done; printf 'c\\nd'"
    job = _submit(served, "--", "sh", "-c", script)
    done = _submit(served, "--", "true")
    wait_for(lambda: served.cli("logs", job).stdout == "a\nb\n")
    assert served.cli("logs", job, "-n", "1").stdout == "b\n"
    assert served.cli("logs", job, "--tail", "5").stdout == "a\nb\n"
    out = served.cli("logs", job, "-n", "0")
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")

    def follow(*argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "gpulayer_tui", "logs", job, "-f", *argv],
            env=served.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    last_line, only_new = follow("-n", "1"), follow("-n", "0")
    assert _line_from(last_line) == "b\n"

    def both_held() -> bool:
        # A probe that came before only_new's stream takes the slot for a moment, and
        # only_new is refused at the limit (CI, once): it is started again (-n 0, before
        # the gate: it still reads only what comes after it).
        nonlocal only_new
        if only_new.poll() is not None:
            only_new.communicate()
            only_new = follow("-n", "0")
            return False
        return "2 streams open" in served.cli("logs", "-f", done).stderr

    wait_for(both_held, timeout=30)
    assert only_new.poll() is None
    gate.touch()
    out, err = last_line.communicate(timeout=30)
    assert (last_line.returncode, out) == (0, "c\nd"), err  # (after the "b" read above)
    out, err = only_new.communicate(timeout=30)
    assert (only_new.returncode, out) == (0, "c\nd"), err  # never the lines before it
    # Not a number of lines: refused by name, nothing printed.
    bad = served.cli("logs", job, "-n", "-2")
    assert bad.returncode == 2 and "argument -n/--tail: must not be negative" in bad.stderr


def test_logs_follow_of_a_waiting_job_says_it_waits_then_follows_its_start(
    engine: Served,
) -> None:
    # `logs -f` of a queued job printed nothing at all, for as long as it waited (h69).
    assert engine.cli("pause").returncode == 0
    job = _submit(engine, "--", "echo", "hello")
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "logs", "-f", job],
        env=engine.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stderr is not None
    said = follower.stderr.readline()
    assert said.startswith(f"gpulayer-tui: job {job} waits to start (the queue has been paused")
    assert said.endswith("): following it from its start\n")
    assert engine.cli("resume").returncode == 0
    out, _ = follower.communicate(timeout=30)
    assert (follower.returncode, out) == (0, "hello\n")


def test_logs_of_a_job_whose_launch_failed_says_it_never_ran(engine: Served) -> None:
    # It printed nothing and exited 0, as for a job that ran and wrote nothing.
    job_id = engine.cli("submit", "--", "/no/such/program").stdout.strip()
    engine.cli("wait", job_id)
    out = engine.cli("logs", job_id)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"gpulayer-tui: job {job_id} ended without starting (failed")
    # ("job 2 is failed" was said)
    assert engine.cli("why", job_id).stdout.startswith(f"job {job_id} failed: command not found")
    # Nor does `status` or `jobs` say it started (recorded running before the launcher
    # was asked: "started 15:44:52  runtime 0s").
    status = engine.cli("status", job_id).stdout
    assert "  started     - (never: its launch failed)" in status and "runtime" not in status
    (row,) = [line for line in engine.cli("jobs").stdout.splitlines() if line.startswith(job_id)]
    assert " 0s " not in row, row
    # `domain` alone lists, as its help says.
    listed = engine.cli("domain")
    assert listed.returncode == 0 and listed.stdout.startswith("DOMAIN")


def test_flags_that_cannot_go_together_are_refused_by_their_names(engine: Served) -> None:
    # `status --json --plot` wrote the plot after the JSON (unreadable, exit 0); `jobs
    # --before N --reverse` was refused as "order=desc", and --after ignored --reverse.
    job_id = _submit(engine, "--", "true")
    out = engine.cli("status", "--json", "--plot", job_id)
    assert out.returncode == 2
    assert "--plot draws text: it does not go with --json" in out.stderr
    # (with --json, bad usage is a document on stdout too, as any refusal: h187 #8)
    assert json.loads(out.stdout) == {"error": "--plot draws text: it does not go with --json"}
    out = engine.cli("adopt", "999999", "--json")  # (no --pid)
    assert out.returncode == 2 and "required: --pid" in json.loads(out.stdout)["error"]
    out = engine.cli("submit", "--", "echo", "--json", "--x")  # (the command's own)
    assert out.returncode == 0 and out.stdout.strip().isdigit(), out
    for paging in ("--before", "--after"):
        out = engine.cli("jobs", paging, job_id, "--reverse")
        assert out.returncode == 2 and "--reverse does not go with --before/--after" in out.stderr
        assert "order=" not in out.stderr


def test_a_stop_under_way_counts_down_to_its_sigkill(engine: Served) -> None:
    # `jobs` and `status` said "SIGKILL after 10 s" however long after the cancel.
    from gpulayer_tui.formatting import live_message

    job_id = _submit(engine, "--shell", "--", "trap '' TERM; sleep 60")
    assert engine.cli("cancel", "--no-wait", job_id).returncode == 0
    # (and `why`: it said the stored "SIGTERM in 8 s" of a preemption for as long: h154)
    shown = [
        engine.cli(*words).stdout for words in (("status", job_id), ("jobs",), ("why", job_id))
    ]
    for out in shown:
        assert "SIGKILL after" not in out and "SIGKILL in " in out, out
    row = {"status": "running", "message": "stopping (x): SIGTERM sent, SIGKILL after 10 s"}
    assert live_message({**row, "kill_at": 100.0}, 96.8) == (
        "stopping (x): SIGTERM sent, SIGKILL in 3 s"
    )
    assert live_message({**row, "kill_at": 100.0}, 101.0).endswith("SIGKILL due")
    assert live_message({**row, "kill_at": None}, 0.0) == row["message"]  # (not stopping)
    # A preemption: its SIGTERM still to come, then sent.
    head = "stopping (preempted by job 9 (priority 5)): SIGUSR1 sent, "
    row = {"status": "running", "kill_at": 140.0}
    row["message"] = head + "SIGTERM in 30 s, SIGKILL 10 s after that"
    assert live_message(row, 105.0) == head + "SIGTERM in 25 s, SIGKILL 10 s after that"
    assert live_message(row, 133.0) == head + "SIGTERM sent, SIGKILL in 7 s"
    assert live_message(row, 141.0) == head + "SIGTERM sent, SIGKILL due"


def test_clean_says_which_jobs_it_kept_for_waiting_dependents(engine: Served) -> None:
    # They were kept with no word: `clean --keep 0` left jobs in `jobs` unexplained.
    needed, other = _submit(engine, "--", "true"), _submit(engine, "--", "true")
    engine.cli("wait", needed, other)
    engine.cli("pause")
    waiting = _submit(engine, "--after", needed, "--", "true")
    said = engine.cli("clean", "--keep", "0", "--dry-run").stdout
    assert said.startswith(f"would remove 1 finished job (job {other})")
    # (each with why: which job depends on it, or its notification: tester h123)
    assert said.endswith(
        f"; would keep 1 still needed: job {needed} (job {waiting} depends on it); nothing "
        "was removed\n"
    )
    out = engine.cli("clean", "--keep", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("removed 1 finished job")
    assert out.stdout.endswith(
        f"; kept 1 still needed: job {needed} (job {waiting} depends on it)\n"
    )
    engine.cli("resume")
    assert engine.cli("wait", waiting).returncode == 0


def test_an_edit_that_changes_nothing_says_so_and_records_nothing(engine: Served) -> None:
    # Each one printed the job as an edit did and added "edited: nothing changed".
    blocker = _submit(engine, "--gpus", "1", "--", "sleep", "60")
    waiting = _submit(engine, "--gpus", "1", "--", "true")
    for change in (["--no-timeout"], ["--no-deps"], ["--priority", "0"]):
        out = engine.cli("edit", waiting, *change)
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"job {waiting}: nothing to change (it has what was asked)\n", change
    assert "edited" not in engine.cli("status", waiting).stdout
    as_json = json.loads(engine.cli("edit", waiting, "--priority", "0", "--json").stdout)
    assert as_json["id"] == int(waiting) and as_json["changed"] is False
    # The same dependencies in another order are no change either.
    first, second = _submit(engine, "--", "true"), _submit(engine, "--", "true")
    engine.cli("wait", first, second)
    assert engine.cli("edit", waiting, "--after", first, "--after", second).returncode == 0
    out = engine.cli("edit", waiting, "--after", second, "--after", first)
    assert out.stdout == f"job {waiting}: nothing to change (it has what was asked)\n"
    # 0 GPUs asked of a job with none set: "gpus 0 -> 0" was said and recorded (h110).
    cpu = _submit(engine, "--after", blocker, "--", "true")
    out = engine.cli("edit", cpu, "--gpus", "0")
    assert out.stdout == f"job {cpu}: nothing to change (it has what was asked)\n"
    assert "edited" not in engine.cli("status", cpu).stdout
    # Nor 1 GPU asked of one pinned to a GPU with none set: "gpus 1 -> 1" (tester h115).
    pinned = _submit(engine, "--domain", "gpu0", "--after", blocker, "--", "true")
    out = engine.cli("edit", pinned, "--gpus", "1")
    assert out.stdout == f"job {pinned}: nothing to change (it has what was asked)\n"
    assert "edited" not in engine.cli("status", pinned).stdout
    out = engine.cli("edit", pinned, "--gpus", "0")  # (no "nothing to change": refused)
    assert out.returncode == 2 and "gpus is 0 but domain gpu0 is a GPU domain" in out.stderr
    real = engine.cli("edit", waiting, "--priority", "2", "--json")
    assert real.returncode == 0 and json.loads(real.stdout)["changed"] is True
    said = engine.cli("status", waiting).stdout
    # (the timeline as the TUI's says it: "job.edited: edited: priority 0 -> 2" was the
    # wire's kind and the message's own lead: tester h94)
    assert "  edited: priority 0 -> 2\n" in said and said.count("  edited: ") == 2, said
    assert "job.edited" not in said
    # A timeout as typed, dependencies as the flag names them ("timeout none -> 5400,
    # depends_on none -> 1, 3": tester h94); in --json, what changed by field.
    out = engine.cli("edit", waiting, "--timeout", "90m", "--json")
    assert json.loads(out.stdout)["fields"] == {"timeout": [None, 5400]}, out.stdout
    out = engine.cli("edit", waiting, "--timeout", "2h", "--no-deps")
    assert out.stdout.startswith(
        f"job {waiting} edited: timeout 1h30m -> 2h, after {first}, {second} -> none\n"
    ), out.stdout
    engine.cli("cancel", blocker)
    engine.cli("wait", waiting)
    said = engine.cli("status", waiting).stdout
    assert "  completed: exited with code 0\n" in said, said  # (not "(exit_code)")


def test_quiet_followers_are_not_refused_by_their_own_old_streams(served: Served) -> None:
    # After a quiet spell each `logs -f` asks again, and the stream it left still counted
    # for a moment: followers of a quiet job were refused ("64 streams open") with few open.
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text("[limits]\nstreams_per_user = 2\n")
    served.start("--simulate", "1xA100-80GB")
    quiet = served.cli("submit", "--", "sleep", "600").stdout.strip()
    env = {**served.env, "GPULAYER_TIMEOUT": "1"}  # (asked again after 1 s of quiet)
    followers = [
        subprocess.Popen(
            [sys.executable, "-m", "gpulayer_tui", "logs", "-f", quiet],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        began = time.monotonic()
        wait_for(
            lambda: time.monotonic() - began > 5 or any(f.poll() is not None for f in followers)
        )
        assert [f.poll() for f in followers] == [None, None], [
            f.stderr.read() if f.stderr else "" for f in followers if f.poll() is not None
        ]
    finally:
        for f in followers:
            f.kill()
            f.communicate()
        served.cli("cancel", quiet)


def test_a_wait_with_microseconds_left_is_a_timeout_not_a_refusal(engine: Served) -> None:
    # What was left went out as "8.78e-05", refused as no number: `cancel` of a job it had
    # cancelled exited 2, and `wait` 2 instead of 5.
    job = _submit(engine, "--", "sleep", "60")
    out = engine.cli("wait", job, "--timeout", "0.00009")
    assert out.returncode == 5, out.stderr
    out = engine.cli("cancel", job, "--timeout", "0.00009")
    assert "must be a number" not in out.stderr and out.returncode in (0, 5), out.stderr


@pytest.mark.parametrize(
    ("words", "told"),
    [
        (["--env", "CUDA_VISIBLE_DEVICES=1"], "--env CUDA_VISIBLE_DEVICES: the engine sets it"),
        (["--env", "GPULAYER_JOB_ID=7"], "--env GPULAYER_JOB_ID: the engine sets it"),
        (["--env", "PWD=/x"], "--env PWD: the engine sets it to the folder the job runs in"),
        (["--service", "--env", "PORT=80"], "--env PORT: each start of a replica gets a free"),
        # (a variable "LR " that the job's $LR never read; an escape is shown as one)
        (["--env", "LR =0.1"], "--env 'LR ': a variable's name has no spaces or control"),
        (["--env", "A\x1b[2JB=1"], "--env 'A\\x1b[2JB': a variable's name has no spaces"),
        # (the last was kept without a word; tester h100)
        (["--env", "LR=1", "--env", "LR=2"], "--env LR is given twice, with two values"),
    ],
)
def test_env_the_engine_sets_is_refused_naming_it(
    engine: Served, words: list[str], told: str
) -> None:
    # The engine sets these over the job's environment: the value given was dropped
    # without a word (a service's `--env PORT=80` ran on another port).
    out = engine.cli("submit", *words, "--", "true")
    assert out.returncode == 2 and told in out.stderr, out.stderr
    assert json.loads(engine.cli("jobs", "--json").stdout) == []


@pytest.mark.parametrize(
    ("words", "told"),
    [
        (["--no-requeue"], "--no-requeue applies to --preemptible jobs only: add --preemptible"),
        (["--cpus", "2"], "--cpus applies to cluster jobs only: add --cluster NAME"),
        (["--mem-gb", "8"], "--mem-gb applies to cluster jobs only: add --cluster NAME"),
    ],
)
def test_a_flag_that_needs_another_is_refused_in_flags(
    engine: Served, words: list[str], told: str
) -> None:
    # (the engine's words name its spec fields: "requeue: ... (add preemptible)")
    out = engine.cli("submit", *words, "--", "true")
    assert out.returncode == 2 and told in out.stderr, out.stderr


def test_env_port_passes_for_a_service_without_a_port_and_a_batch_job(engine: Served) -> None:
    service = _submit(engine, "--service", "--no-port", "--env", "PORT=4123", "--", "sleep", "60")
    job = _submit(engine, "--env", "PORT=4124", "--", "sleep", "60")
    for ident, port in ((service, "4123"), (job, "4124")):
        shown = json.loads(engine.cli("status", ident, "--json").stdout)["job"]
        assert shown["spec"]["env"]["PORT"] == port
        engine.cli("cancel", ident, "--no-wait")


@pytest.mark.parametrize(
    "words", [["jobs", "--filter", "ab\udcffc"], ["domain", "drain", "g\udcff"]]
)
def test_an_argument_that_is_not_utf8_is_refused_naming_it(
    engine: Served, words: list[str]
) -> None:
    # (a byte the shell passes that is not UTF-8 ended the CLI in a traceback)
    out = engine.cli(*words)
    assert out.returncode == 2, out.stderr
    assert "is not UTF-8 text (it holds the byte 0xFF)" in out.stderr
    assert "Traceback" not in out.stderr


def test_cancel_takes_several_ids_and_says_each(engine: Served) -> None:
    first = _submit(engine, "--", "sleep", "600")
    second = _submit(engine, "--", "sleep", "600")
    out = engine.cli("cancel", first, "999", second)
    # (an unknown id among them: said, the others cancelled; so not 2, "nothing was
    # changed", as it was: h86)
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"job {first} cancelled: cancelled by user",
        f"job {second} cancelled: cancelled by user",
    ]
    assert "no job 999" in out.stderr
    third = _submit(engine, "--", "sleep", "600")
    fourth = _submit(engine, "--", "sleep", "600")
    shown = json.loads(engine.cli("cancel", third, fourth, "--json").stdout)
    assert [(j["id"], j["status"]) for j in shown] == [
        (int(third), "cancelled"),
        (int(fourth), "cancelled"),
    ]
    # Ids separated by commas, as --after takes them (refused: "a job id is a number").
    fifth = _submit(engine, "--", "sleep", "600")
    sixth = _submit(engine, "--", "sleep", "600")
    out = engine.cli("cancel", f"{fifth},{sixth}", first)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == [
        f"job {fifth} cancelled: cancelled by user",
        f"job {sixth} cancelled: cancelled by user",
    ]
    out = engine.cli("wait", f"{fifth},{sixth}")
    assert out.returncode == 1 and len(out.stdout.splitlines()) == 2
    # --json: one object per id given, the refused ones with their error (h86: they were
    # left out).
    done = _submit(engine, "--", "true")
    engine.cli("wait", done)
    seventh = _submit(engine, "--", "sleep", "600")
    out = engine.cli("cancel", "998", done, seventh, "--json")
    assert out.returncode == 1
    shown = json.loads(out.stdout)
    assert [(j["id"], j.get("status")) for j in shown] == [
        (998, None),
        (int(done), "completed"),
        (int(seventh), "cancelled"),
    ]
    assert "no job 998" in shown[0]["error"] and "completed" in shown[1]["error"]
    assert "error" not in shown[2]
    assert engine.cli("cancel", "998", "997").returncode == 2  # (nothing changed)
    # One id refused: its one object, with the error (it printed nothing: tester h92).
    for job_id, code, word in (("998", 2, "no job 998"), (done, 1, "completed")):
        out = engine.cli("cancel", job_id, "--json")
        assert out.returncode == code, out.stderr
        one = json.loads(out.stdout)
        assert one["id"] == int(job_id) and word in one["error"], one


def test_a_spec_files_env_the_engine_sets_is_refused_naming_it(
    engine: Served, tmp_path: Path
) -> None:
    spec = tmp_path / "svc.toml"
    spec.write_text('kind = "service"\ncommand = ["sleep", "60"]\nenv = { PORT = "8000" }\n')
    out = engine.cli("submit", "--spec", str(spec))
    assert out.returncode == 2
    assert f"{spec}: env PORT: each start of a replica gets a free port" in out.stderr
    # (a file's way, not the flag's: it said "add --no-port" of a spec file)
    assert "set port = false to give your own" in out.stderr and "--no-port" not in out.stderr
    assert json.loads(engine.cli("jobs", "--json").stdout) == []
    spec.write_text(
        'kind = "service"\ncommand = ["sleep", "60"]\nport = false\nenv = { PORT = "8000" }\n'
    )
    ok = engine.cli("submit", "--spec", str(spec))
    assert ok.returncode == 0, ok.stderr
    engine.cli("cancel", ok.stdout.strip(), "--no-wait")
    spec.write_text('command = ["true"]\nenv = { "LR " = "0.1" }\n')
    out = engine.cli("submit", "--spec", str(spec))
    assert out.returncode == 2
    assert f"{spec}: env 'LR ': a variable's name has no spaces" in out.stderr, out.stderr


def test_a_request_the_engine_does_not_know_says_it_may_be_older(engine: Served) -> None:
    # A new CLI against an older engine: "POST /v1/domains/gpu1/forget: Not Found" read
    # as an unknown domain (tester h48).
    from gpulayer_tui.client import ApiError, Client

    client = Client(Paths(engine.home, engine.home / "config.toml"), timeout=10)
    with pytest.raises(ApiError) as refused:
        client.request("POST", "/domains/gpu0/frobnicate")
    assert refused.value.status == 404
    assert str(refused.value).startswith("POST /v1/domains/gpu0/frobnicate: Not Found: this")
    assert "one older than this gpulayer-tui?" in str(refused.value)
    with pytest.raises(ApiError) as unknown:  # (an unknown job is said as before)
        client.request("GET", "/jobs/424242")
    assert "older" not in str(unknown.value) and "424242" in str(unknown.value)


def test_a_full_jobs_table_keeps_runtime_and_exit_on_80_columns() -> None:
    # Every column filled (a 40-character name, a priority of -1000000, GPUs, VRAM): the
    # cut at the edge took RUNTIME and EXIT (tester h73). Narrower columns go first.
    from gpulayer_tui.cli.format import REASON_ROOM, fit, format_jobs

    def row(job_id: int, name: str, status: str, code: int | None) -> dict[str, object]:
        return {
            "id": job_id,
            "name": name,
            "kind": "command",
            "status": status,
            "termination_reason": None,
            "exit_code": code,
            "message": f"exited with code {code}" if code is not None else "running on gpu0",
            "domains": ["gpu0"],
            "gpus": [0],
            "pid": None,
            "started_at": 100.0,
            "ended_at": 160.0 if code is not None else None,
            "owner_uid": 0,
            "spec": {"gpus": 1, "vram_gb": 10, "priority": -1000000},
        }

    rows = [row(1, "a-rather-long-name-for-a-job-in-a-sweep-1", "failed", 3)]
    rows += [row(2, "train.py", "running", None)]
    wide = format_jobs(rows, 200.0)  # type: ignore[arg-type]
    assert wide.splitlines()[0].split()[:6] == ["ID", "NAME", "USER", "STATUS", "PRIO", "DOMAINS"]
    shown = fit(format_jobs(rows, 200.0, 80), 80).splitlines()  # type: ignore[arg-type]
    header = shown[0]
    assert "RUNTIME" in header and "EXIT" in header and "REASON" in header, header
    assert header.index("REASON") <= 80 - REASON_ROOM
    assert shown[1][header.index("EXIT")] == "3" and "1m00s" in shown[1], shown
    assert all(len(line) <= 80 for line in shown)
    assert "VRAM" not in header  # (gone first)
    # The column it is sorted by stays (--sort vram dropped VRAM: tester h94).
    for sort, column in (("vram", "VRAM"), ("priority", "PRIO")):
        header = fit(format_jobs(rows, 200.0, 80, sort), 80).splitlines()[0]  # type: ignore[arg-type]
        assert column in header and "REASON" in header, (sort, header)


def test_a_command_past_the_connection_limit_says_why(served: Served) -> None:
    # The engine answers such a connection before it reads the request, and closes it:
    # the CLI's write may fail on the closed socket, and it said the engine had gone.
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text("[limits]\nconnections_per_user = 2\n")
    served.start("--simulate", "1xA100-80GB")
    held = []
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(served.home / "engine.sock"))
            held.append(sock)
        for argv in (("jobs",), ("submit", "--", "true")):
            out = served.cli(*argv)
            assert out.returncode != 0 and out.stdout == ""
            assert "connections_per_user = 2 allows" in out.stderr, out.stderr
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: served.cli("jobs").returncode == 0)
    assert json.loads(served.cli("jobs", "--json").stdout) == []  # (nothing was submitted)


def _fake_engine(sock_path: Path, version: str) -> socket.socket:
    """A stand-in engine of ``version`` on ``sock_path``: /v1/health answers, anything
    else is refused 409 as an older engine refused an edit of a running service."""
    import threading

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                line = data.split(b"\r\n", 1)[0].decode()
                if line.startswith("GET /v1/health "):
                    status, body = "200 OK", {"version": version, "pid": 1}
                else:
                    status = "409 Conflict"
                    body = {"error": "job 3 is running: only a waiting job is edited"}
                payload = json.dumps(body).encode()
                conn.sendall(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload
                )

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_refusal_from_an_engine_of_another_version_says_so(tmp_path: Path) -> None:
    # A new CLI against an engine not restarted since the upgrade: its refusal read as
    # "not allowed", with no word that the engine was older (tester h157).
    from gpulayer_tui import __version__

    for version, hinted in (("0.0.1", True), (__version__, False)):
        home = tmp_path / version
        home.mkdir(mode=0o700)
        server = _fake_engine(home / "engine.sock", version)
        try:
            out = subprocess.run(
                [sys.executable, "-m", "gpulayer_tui", "edit", "3", "--priority", "2"],
                env=dict(os.environ, GPULAYER_HOME=str(home)),
                capture_output=True,
                text=True,
                timeout=30,
                cwd=REPO,
            )
        finally:
            server.close()
        assert out.returncode == 1, out.stderr
        assert out.stderr.startswith("gpulayer-tui: job 3 is running: only a waiting job")
        said = f"(the engine runs gpulayer-tui 0.0.1, this command is {__version__}: an engine"
        assert (said in out.stderr) is hinted, out.stderr


def test_a_reader_gone_early_leaves_wait_and_status_their_exit_status(engine: Served) -> None:
    # `wait A B | head -1` exited 0 at once: B not waited for, A's failure not told; and
    # `status ID | true` exited 0 for a failed job (tester h159). The output is lost, the
    # status is still the jobs'.
    failed = _submit(engine, "--", "false")
    slow = _submit(engine, "--", "sleep", "2")

    def closed_reader(*args: str) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpulayer_tui", *args],
            env=engine.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
        )
        assert proc.stdout is not None
        proc.stdout.close()  # (the reader is gone before anything is written)
        return proc.wait(timeout=60)

    assert closed_reader("wait", failed, slow) == 1
    done = json.loads(engine.cli("status", slow, "--json").stdout)["job"]
    assert done["status"] == "completed"  # (waited for, though nothing could be said)
    assert closed_reader("wait", "--json", failed, slow) == 1
    assert closed_reader("status", failed) == 1
    assert closed_reader("status", "--json", failed) == 1
    assert closed_reader("status", slow) == 0


def test_logs_follow_ends_when_its_reader_goes_even_with_the_job_silent(engine: Served) -> None:
    # `logs -f ID | grep -q READY` returned only once the job next wrote: never, for a
    # server that said READY and went quiet (tester h178). Its reader gone, it exits 0.
    job = _submit(engine, "--shell", "--", "echo READY; exec sleep 600")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "logs", "-f", job],
        env=engine.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"READY\n"
    proc.stdout.close()  # (as grep -q does once it has its line)
    assert proc.wait(timeout=20) == 0
    assert json.loads(engine.cli("status", job, "--json").stdout)["job"]["status"] == "running"
    engine.cli("cancel", job)


def test_wait_says_an_unknown_id_before_it_waits_for_the_others(engine: Served) -> None:
    # `wait ID 99999` waited for ID to end, then said "no job 99999" (tester h159): a
    # typo among the ids was found hours later.
    slow = _submit(engine, "--", "sleep", "3")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "wait", slow, "99999"],
        env=engine.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # (said while job `slow` still runs)
    assert first == "gpulayer-tui: no job 99999\n"
    assert json.loads(engine.cli("status", slow, "--json").stdout)["job"]["status"] == "running"
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err == "", err  # (said once)
    assert f"job {slow} completed" in out


def test_a_snapshot_of_one_file_is_said_in_the_singular() -> None:
    # "1 files, 12 bytes" (tester h164).
    from gpulayer_tui.cli.format import _snapshot_lines

    one = {"snapshot": {"commit": "36f5aaeea416aa", "dirty": False, "files": 1, "bytes": 1}}
    assert "commit 36f5aaeea416 (clean)  1 file, 1 byte" in _snapshot_lines(one)[0]
    two = {"snapshot": {"commit": None, "dirty": None, "files": 2, "bytes": 12}}
    assert "not a git tree  2 files, 12 bytes" in _snapshot_lines(two)[0]


def test_domain_list_says_a_missing_gpu_whose_name_another_gpu_has_now(served: Served) -> None:
    # Started over on other simulated GPUs, the old ones were missing (ready false), and
    # `domain list` said nothing of them: their names were the new GPUs' (tester h164).
    served.start("--simulate", "1xA100-80GB")
    old = json.loads(served.cli("gpus", "--json").stdout)["domains"]
    uuid = next(d["gpu_uuid"] for d in old if d["name"] == "gpu0")
    served.stop()
    served.start("--simulate", "1xH100-80GB")
    listed = served.cli("domain", "list")
    assert listed.returncode == 0, listed.stderr
    said = (
        f"gpulayer-tui: the GPU domain 'gpu0' had before ({uuid}) is not found by the driver "
        f"now; gpu0 is another GPU's domain since (`gpulayer-tui domain forget {uuid}` if it "
        "was removed for good)\n"
    )
    assert listed.stderr == said
    one = served.cli("domain", "list", "gpu0")  # (the live domain, and the note)
    assert one.returncode == 0 and one.stdout.splitlines()[1].startswith("gpu0 "), one
    assert one.stderr == said
    # --json lists the live domains and says the missing GPU all the same (it said nothing).
    as_json = served.cli("domain", "list", "--json")
    assert [d["name"] for d in json.loads(as_json.stdout)] == ["gpu0", "cpu"]
    assert as_json.stderr == said
    # `gpus` and `doctor` give the same advice (they said `domain forget gpu0`).
    assert f"`gpulayer-tui domain forget {uuid}`" in served.cli("gpus").stdout
    doctor = served.cli("doctor").stdout
    assert f"`gpulayer-tui domain forget {uuid}`" in doctor, doctor
    assert served.cli("domain", "forget", uuid).returncode == 0
    assert served.cli("domain", "list").stderr == ""


def test_users_with_nobody_to_list_says_why(engine: Served) -> None:
    # A header alone said nothing of why it was empty (tester h167).
    out = engine.cli("users")
    assert out.returncode == 0 and out.stdout.startswith("USER "), out
    assert len(out.stdout.splitlines()) == 1
    assert out.stderr == (
        "gpulayer-tui: no user has used the GPUs recently, and no job runs or waits\n"
    )
    assert json.loads(engine.cli("users", "--json").stdout) == {"users": []}


def test_logs_of_a_fast_writer_without_follow_prints_its_output_as_long_as_it_was(
    served: Served,
) -> None:
    # Not following, the log was read on until its end was caught up with: a fast
    # writer's never was, and `logs -n 2` of `yes` printed 12 million lines (h186 #2).
    served.start("--simulate", "1xA100-80GB")
    job = _submit(served, "--", "sh", "-c", "while :; do echo line; done")
    wait_for(lambda: len(served.cli("logs", job, "-n", "3").stdout) > 0)
    for _ in range(3):
        tail = served.cli("logs", job, "-n", "2")
        assert (tail.returncode, tail.stdout) == (0, "line\nline\n"), tail.stdout[:200]
    assert served.cli("cancel", job).returncode == 0
