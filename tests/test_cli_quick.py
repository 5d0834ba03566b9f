"""The CLI's quick path (cli/quick.py) reads a command line exactly as argparse does, or
leaves it to argparse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer_tui.cli.grammar import build_parser
from gpulayer_tui.cli.quick import parse

REPO = Path(__file__).resolve().parent.parent

# Command lines the quick path reads: its namespace must be argparse's, value for value.
READ = [
    ["submit", "--", "true"],
    ["submit", "true"],
    ["submit", "python", "train.py", "--lr", "3e-4"],
    ["submit", "--gpus", "2", "--vram-gb", "40", "--", "python", "train.py"],
    ["submit", "--gpus=0", "--vram-gb=0.5", "--name=x", "--", "true"],
    ["submit", "--name", "[/bold]x", "--project", "p", "--priority", "7", "--", "sleep", "1"],
    ["submit", "--domain", "gpu0", "--domain", "gpu1", "--exclusive", "--", "true"],
    ["submit", "--notify", "--gpus", "1", "--", "python", "train.py"],
    ["submit", "--snapshot", "--gpus", "1", "--", "python", "train.py"],
    ["submit", "--no-snapshot", "--cwd", "/tmp", "--", "true"],
    ["submit", "--after", "3", "--after", "4", "--after-any", "5", "--", "true"],
    ["submit", "--timeout", "3600", "--cwd", "/tmp", "--env", "A=1", "--env", "B=", "x"],
    ["submit", "--no-inherit-env", "--shell", "--json", "--", "echo $HOME"],
    ["submit", "--file", "jobs.txt"],
    ["submit", "--gpus", "1", "--name", "sweep", "--file=jobs.txt", "--json"],
    ["submit", "--", "--weird", "-x"],
    ["submit", "--name", "n", "cmd", "--name", "m"],  # after the command: the command's
    ["status", "12"],
    ["status", "12", "--json"],
    ["status", "--json", "12"],
    ["jobs"],
    ["jobs", "--json", "--limit", "10000"],
    ["jobs", "--status", "queued,running", "--status", "failed", "--limit", "1"],
]

# Command lines left to argparse (its messages, its exit code 2, its other options).
LEFT = [
    [],
    ["submit"],
    ["submit", "--"],
    ["submit", "--help"],
    ["submit", "--gpus", "x", "--", "true"],  # breaks the rule: argparse says so
    ["submit", "--gpus", "65", "--", "true"],
    ["submit", "--vram-gb", "nan", "--", "true"],
    ["submit", "--priority", "-5", "--", "true"],  # a dash value: argparse's call
    ["submit", "--exc", "--", "true"],  # an abbreviation
    ["submit", "--file", "jobs.txt", "--", "true"],  # a file and a command: refused there
    ["submit", "--file", "-"],  # (standard input: a dash value is argparse's call)
    ["submit", "--spec", "jobs.toml"],
    ["submit", "--service", "--", "x"],
    ["submit", "--name"],
    ["submit", "--exclusive=1", "--", "true"],
    ["submit", "--notify=yes", "--", "true"],
    ["submit", "--snapshot=1", "--", "true"],
    ["submit", "--snap", "--", "true"],  # an abbreviation
    ["status"],
    ["status", "x"],
    ["status", "0"],
    ["status", "1", "2"],
    ["jobs", "--before", "5"],
    ["jobs", "--limit", "-1"],
    ["jobs", "extra"],
    ["--config", "c.toml", "submit", "--", "true"],
    ["logs", "3"],
]


@pytest.mark.parametrize("words", READ, ids=" ".join)
def test_the_quick_path_reads_as_argparse_does(words: list[str]) -> None:
    quick = parse(words)
    assert quick is not None, "left to argparse"
    assert vars(quick) == vars(build_parser().parse_args(words))


@pytest.mark.parametrize("words", LEFT, ids=lambda w: " ".join(w) or "(nothing)")
def test_what_the_quick_path_does_not_read_is_left_to_argparse(words: list[str]) -> None:
    assert parse(words) is None


def test_a_refused_value_still_gets_argparses_message_and_exit_code(tmp_path: Path) -> None:
    env = dict(os.environ, GPULAYER_HOME=str(tmp_path))

    def cli(*words: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "gpulayer_tui", *words]
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)

    done = cli("submit", "--gpus", "65", "--", "true")
    assert done.returncode == 2
    assert "argument --gpus: must be from 0 to 64, not 65" in done.stderr
    assert done.stderr.startswith("usage: ")
    # A handler's own refusal on the quick path builds the parser for its usage line.
    bad_env = cli("submit", "--env", "NOEQUALS", "--", "true")
    assert bad_env.returncode == 2
    assert "--env expects KEY=VALUE, got 'NOEQUALS'" in bad_env.stderr
    assert bad_env.stderr.startswith("usage: ")
