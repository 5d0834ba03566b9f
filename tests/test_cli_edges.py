"""The CLI at its edges, against a real ``--serve`` engine: a wait that runs out, input
that holds nothing or too much, a reader that leaves early, and Ctrl-C (issue 21)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, Served, wait_for


@pytest.fixture
def engine(served: Served) -> Served:
    served.start("--simulate", "1xA100-80GB")
    return served


def _submit(served: Served, *argv: str) -> str:
    out = served.cli("submit", *argv)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_wait_with_a_timeout_that_runs_out_exits_1_and_says_so(engine: Served) -> None:
    job = _submit(engine, "--", "sleep", "600")
    out = engine.cli("wait", job, "--timeout", "0.3")
    assert out.returncode == 1
    assert out.stderr == f"gpulayer-tui: job {job} still running after 0.3 s\n"
    engine.cli("cancel", job, "--no-wait")


def test_a_batch_file_of_only_comments_is_refused_and_submits_nothing(
    engine: Served, tmp_path: Path
) -> None:
    batch = tmp_path / "jobs.txt"
    batch.write_text("# nothing to run yet\n\n   # still nothing\n")
    out = engine.cli("submit", "--file", str(batch))
    assert (out.returncode, out.stdout) == (2, "")
    assert f"{batch}: no command lines found" in out.stderr
    assert engine.cli("jobs", "--json").stdout.strip() in ("[]", "")


def test_a_spec_file_and_a_command_together_are_refused(engine: Served, tmp_path: Path) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('command = ["true"]\n')
    out = engine.cli("submit", "--spec", str(spec), "--", "true")
    assert out.returncode == 2
    assert "give either --spec, --file or a command, not two of them" in out.stderr


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


@pytest.mark.parametrize("words", [["wait"], ["logs", "-f"]], ids=["wait", "logs-follow"])
def test_ctrl_c_exits_130_without_a_traceback(engine: Served, words: list[str]) -> None:
    job = _submit(engine, "--", "sleep", "600")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", *words, job],
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
    assert lines[1].split() == [
        "start",
        "one",
        "with:",
        "gpulayer-tui",
        "--serve",
        "(real",
        "GPUs)",
    ]
    assert "\\x0a" not in out.stderr  # (line breaks are ours, not escaped as a user's text)
