"""Plain shell lines run without a shell; everything else still goes through ``sh -c``."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from gpulayer_tui.engine.commandline import exec_line, plain_argv, shell_argv
from gpulayer_tui.engine.models import JobStatus, TerminationReason

from .conftest import EngineFactory, eventually


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        ("true", ["true"]),
        ("  python train.py --lr 0.1  ", ["python", "train.py", "--lr", "0.1"]),
        (
            "./run.sh data/x.csv a=1 user@host:8080 50%",
            ["./run.sh", "data/x.csv", "a=1", "user@host:8080", "50%"],
        ),
        ("echo $HOME", None),
        ("echo 'quoted'", None),
        ('echo "quoted"', None),
        ("ls *.py", None),
        ("ls ~", None),
        ("a | b", None),
        ("a && b", None),
        ("a; b", None),
        ("a > out", None),
        ("sleep 1 &", None),
        ("echo a\\ b", None),
        ("a\tb", None),
        ("a\nb", None),
        ("echo `date`", None),
        ("FOO=1 env", None),  # an assignment
        ("cd /tmp", None),  # builtins and keywords the shell runs itself
        ("exit 3", None),
        ("export A", None),
        (": nothing", None),
        (". ./env.sh", None),
        ("if", None),
        ("", None),
        ("   ", None),
    ],
)
def test_plain_lines_become_argv_and_nothing_else_does(line: str, argv: list[str] | None) -> None:
    assert plain_argv(line) == argv


async def test_a_plain_shell_line_runs_its_program_directly(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    job = await engine.submit({"shell": "sleep 30", "gpus": 0})
    proc = psutil.Process(job.pid)
    await eventually(lambda: proc.cmdline() != [])
    assert proc.cmdline() == ["sleep", "30"]  # no `sh -c` around it
    await engine.cancel(job.id)
    assert (await engine.wait(job.id, timeout=10)).status is JobStatus.CANCELLED


async def test_a_line_that_needs_the_shell_gets_it(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    job = await engine.submit({"shell": "echo $((6 * 7)) && exit 3", "gpus": 0})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.FAILED and done.exit_code == 3
    assert engine.log_path(job.id).read_text() == "42\n"
    builtin = await engine.submit({"shell": "exit 4", "gpus": 0})
    assert (await engine.wait(builtin.id, timeout=10)).exit_code == 4


async def test_a_plain_line_with_an_unknown_program_fails_at_once_as_argv_would(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # It ran through sh and failed with 127, the reason in its log alone, where the same
    # command as argv fails at once, saying why (tester h147).
    engine = await make_engine()
    job = await engine.submit({"shell": "no-such-program-gpulayer --flag", "gpus": 0})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.FAILED and done.exit_code is None
    assert done.termination_reason is TerminationReason.LAUNCH_FAILED
    assert done.message.startswith("command not found: no-such-program-gpulayer"), done.message
    # A builtin of the shell whose program is not there still runs, through the shell.
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "sh").symlink_to("/bin/sh")
    echo = await engine.submit(
        {"shell": "echo ok", "gpus": 0, "env": {"PATH": str(bare)}, "cwd": str(tmp_path)}
    )
    ran = await engine.wait(echo.id, timeout=10)
    assert ran.status is JobStatus.COMPLETED, ran.message
    assert engine.log_path(echo.id).read_text() == "ok\n"


async def test_a_line_the_shell_expands_naming_an_unknown_program_fails_at_once(
    make_engine: EngineFactory,
) -> None:
    # `vllm serve m --port $PORT` where vllm is not installed exited 127 in the shell, and
    # a service restarted it for ever (tester h152, the README's example).
    engine = await make_engine()
    job = await engine.submit({"shell": "no-such-program-gpulayer --x $HOME", "gpus": 0})
    done = await engine.wait(job.id, timeout=10)
    assert done.termination_reason is TerminationReason.LAUNCH_FAILED
    assert done.message.startswith("command not found: no-such-program-gpulayer"), done.message
    service = await engine.submit(
        {"kind": "service", "shell": "no-such-program-gpulayer serve --port $PORT", "gpus": 0}
    )
    ended = await engine.wait(service.id, timeout=10)
    assert ended.status is JobStatus.FAILED
    assert ended.termination_reason is TerminationReason.LAUNCH_FAILED, ended.message
    assert "command not found: no-such-program-gpulayer" in ended.message
    # A name the shell makes, or a PATH set before it, is the shell's to find.
    for line in ('"$0" -c true', "PATH=/usr/bin:/bin true $HOME"):
        other = await engine.submit({"shell": line, "gpus": 0})
        assert (await engine.wait(other.id, timeout=10)).termination_reason is not (
            TerminationReason.LAUNCH_FAILED
        )


@pytest.mark.parametrize(
    ("line", "runs"),
    [
        ("python3 -m http.server $PORT", "exec python3 -m http.server $PORT"),
        ('CUDA=0 A=b python x "$P" 2>&1', 'CUDA=0 A=b exec python x "$P" 2>&1'),
        ("a >> f", "exec a >> f"),
        # more than one simple command, or the shell's own words: as written
        ('A="x y" python', None),
        ("a && b", None),
        ("a | b", None),
        ("x $(y)", None),
        ("echo `date`", None),
        ("sleep 1 &", None),
        ("a &> f", None),
        ("exec foo", None),
        ("cd /x", None),
        ("{ a; }", None),
        ("exit 3", None),
        ("A=1", None),
        ("python 'unclosed", None),
        ("a\nb", None),
    ],
)
def test_one_simple_command_replaces_the_shell(line: str, runs: str | None) -> None:
    # (issue 20: the pid a job or replica shows is then its program's)
    assert exec_line(line) == runs
    assert shell_argv(line) == ["sh", "-c", runs or line]
