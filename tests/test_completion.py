"""Shell completion: the scripts (`gpulayer-tui completion bash|zsh|fish`) run in the real
shells, against a real engine for job ids and domain names; `__complete` without one."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulayer_tui.cli.grammar import build_parser
from tests.conftest import REPO, Served


@pytest.fixture
def command(tmp_path: Path) -> Path:
    """A `gpulayer-tui` for the shells to call (the completion scripts call the command as
    typed, COMP_WORDS[0], for `__complete`)."""
    path = tmp_path / "bin" / "gpulayer-tui"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m gpulayer_tui "$@"\n')
    path.chmod(0o755)
    return path


def script(shell: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "completion", shell],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert out.stderr == ""
    return out.stdout


def bash_complete(
    tmp_path: Path, command: Path, words: list[str], env: dict[str, str] | None = None
) -> list[str]:
    """COMPREPLY for the command line ``gpulayer-tui WORDS`` (the last word is the one
    being completed), from the completion function bash was given."""
    source = tmp_path / "completion.bash"
    source.write_text(script("bash"))
    line = " ".join(shlex.quote(w) for w in [str(command), *words])
    code = (
        f"source {shlex.quote(str(source))}\n"
        "complete -p gpulayer-tui >/dev/null || exit 9\n"
        f"COMP_WORDS=({line}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n"
        "_gpulayer_tui\n"
        "printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env=env or os.environ,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return [w for w in out.stdout.split("\n") if w]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_bash_completes_subcommands_and_every_options_of_the_grammar(
    tmp_path: Path, command: Path
) -> None:
    assert bash_complete(tmp_path, command, ["st"]) == ["status", "stop"]
    assert set(bash_complete(tmp_path, command, [""])) == set(subparsers())
    assert "--simulate-if-no-gpu" in bash_complete(tmp_path, command, ["--sim"])
    # Every option of every subcommand, read from the grammar: the lists cannot drift.
    for name, parser in subparsers().items():
        flags = {f for a in parser._actions for f in a.option_strings if f.startswith("--")}
        assert set(bash_complete(tmp_path, command, [name, "--"])) == flags, name
    assert bash_complete(tmp_path, command, ["status", "--j"]) == ["--json"]
    assert bash_complete(tmp_path, command, ["jobs", "--sort", "ru"]) == ["runtime"]
    assert bash_complete(tmp_path, command, ["jobs", "--status", "c"]) == [
        "completed",
        "cancelled",
    ]
    assert bash_complete(tmp_path, command, ["submit", "--restart", ""]) == [
        "always",
        "on_failure",
    ]
    assert bash_complete(tmp_path, command, ["domain", "d"]) == ["drain"]
    assert bash_complete(tmp_path, command, ["completion", "z"]) == ["zsh"]
    # A global option's value is not a subcommand; submit's command is not our option.
    assert bash_complete(tmp_path, command, ["--config", "x", "jobs", "--rev"]) == ["--reverse"]
    assert bash_complete(tmp_path, command, ["submit", "--", "true", "--js"]) == []


def test_bash_completes_file_names_with_spaces_whole(tmp_path: Path, command: Path) -> None:
    # compgen's output was split on spaces: "my spec.toml" was offered as "my" and
    # "spec.toml", and a typed "my\\ s" was looked up with its backslash. COMP_WORDS holds
    # the word as typed (a backslash before the space), as bash gives it.
    folder = tmp_path / "sp"
    (folder / "dir with space").mkdir(parents=True)
    for name in ("my spec.toml", "my other.toml", "a*b"):
        (folder / name).touch()
    spec = bash_complete(tmp_path, command, ["submit", "--spec", f"{folder}/my"])
    assert sorted(spec) == [f"{folder}/my other.toml", f"{folder}/my spec.toml"]
    typed = bash_complete(tmp_path, command, ["submit", "--spec", f"{folder}/my\\ s"])
    assert typed == [f"{folder}/my spec.toml"]
    quoted = bash_complete(tmp_path, command, ["submit", "--spec", f"'{folder}/my s"])
    assert quoted == [f"{folder}/my spec.toml"]
    assert bash_complete(tmp_path, command, ["submit", "--cwd", f"{folder}/d"]) == [
        f"{folder}/dir with space"
    ]
    # the command's arguments; a name with a glob character is not expanded
    args = bash_complete(tmp_path, command, ["submit", "--", "cat", f"{folder}/a"])
    assert args == [f"{folder}/a*b"]


def test_bash_completes_job_ids_and_domains_from_a_running_engine(
    tmp_path: Path, command: Path, served: Served
) -> None:
    served.start("--simulate", "1xA100-80GB")
    done = served.cli("submit", "--name", "first", "--", "true").stdout.strip()
    assert served.cli("wait", done).returncode == 0
    running = served.cli("submit", "--name", "train", "--", "sleep", "60").stdout.strip()
    env = served.env
    ids = bash_complete(tmp_path, command, ["status", ""], env)
    assert ids == [running, done]  # active first, then the most recent
    assert bash_complete(tmp_path, command, ["logs", running], env) == [running]
    assert bash_complete(tmp_path, command, ["submit", "--after", ""], env) == ids
    assert bash_complete(tmp_path, command, ["submit", "--after", "=", ""], env) == ids  # --after=
    # (cancel offers the active jobs alone: ended ones, which it refuses, were: h153)
    assert bash_complete(tmp_path, command, ["cancel", "--no-wait", ""], env) == [running]
    # (cancel takes several: only its first was completed: tester h49)
    assert bash_complete(tmp_path, command, ["cancel", done, ""], env) == [running]
    assert bash_complete(tmp_path, command, ["cancel", done], env) == []
    assert bash_complete(tmp_path, command, ["status", done, ""], env) == []  # (takes one)
    # After a comma: the ids not in the list yet, as the whole word (tester h69).
    assert bash_complete(tmp_path, command, ["wait", f"{running},"], env) == [f"{running},{done}"]
    assert bash_complete(tmp_path, command, ["cancel", f"{done},{running[0]}"], env) == [
        f"{done},{running}"
    ]
    assert bash_complete(tmp_path, command, ["submit", "--after", f"{done},"], env) == [
        f"{done},{running}"
    ]
    assert bash_complete(tmp_path, command, ["submit", "--domain", ""], env) == ["gpu0", "cpu"]
    # (a choice of domains goes on after its comma: nothing was offered, h153)
    assert bash_complete(tmp_path, command, ["submit", "--domain", "gpu0,"], env) == ["gpu0,cpu"]
    assert bash_complete(tmp_path, command, ["domain", "drain", "g"], env) == ["gpu0"]
    # (each action offers the domains it applies to: release offered those in service)
    assert bash_complete(tmp_path, command, ["domain", "release", ""], env) == []
    assert served.cli("domain", "drain", "gpu0").returncode == 0
    assert bash_complete(tmp_path, command, ["domain", "release", ""], env) == ["gpu0"]
    assert bash_complete(tmp_path, command, ["domain", "drain", ""], env) == ["cpu"]
    assert bash_complete(tmp_path, command, ["domain", "list", ""], env) == ["gpu0", "cpu"]
    assert bash_complete(tmp_path, command, ["domain", "forget", ""], env) == []
    # A comma list of statuses goes on after its comma (nothing was offered: h153).
    assert bash_complete(tmp_path, command, ["jobs", "--status", "queued,r"], env) == [
        "queued,running"
    ]
    assert "failed" in bash_complete(tmp_path, command, ["jobs", "--status", ""], env)
    # What is in the list already is not offered again ("queued,queued": tester h172).
    offered = bash_complete(tmp_path, command, ["jobs", "--status", "queued,"], env)
    assert "queued,running" in offered and "queued,queued" not in offered, offered
    # zsh and fish get the job's status and name too.
    out = served.cli("__complete", "jobs")
    assert out.stdout.splitlines() == [f"{running}\trunning train", f"{done}\tcompleted first"]
    assert served.cli("__complete", "jobs", "x").stdout == ""
    assert (
        served.cli("__complete", "jobs", f"{done},").stdout == f"{done},{running}\trunning train\n"
    )
    assert served.cli("__complete", "jobs", "x,").stdout == ""
    assert served.cli("__complete", "jobs:active", done).stdout == ""  # (typed whole: ended)
    assert served.cli("cancel", running).returncode == 0


def test_a_job_id_typed_whole_is_offered_however_old(tmp_path: Path, served: Served) -> None:
    # Only the newest 300 were offered: an older id typed whole was left out, and the one
    # newer id extending it was completed in its place (`cancel 53<Tab>` became 530).
    served.start("--simulate", "1xA100-80GB")
    old = served.cli("submit", "--name", "old", "--", "true").stdout.strip()
    batch = tmp_path / "jobs.txt"
    batch.write_text("true\n" * 320)
    assert served.cli("submit", "--file", str(batch)).returncode == 0
    lines = served.cli("__complete", "jobs", old).stdout.splitlines()
    assert lines and lines[0].split("\t")[0] == old, lines[:3]
    assert served.cli("__complete", "jobs", "0" + old).stdout == ""  # (not the same text)


def test_complete_without_an_engine_is_quick_and_quiet(tmp_path: Path) -> None:
    env = dict(os.environ, GPULAYER_HOME=str(tmp_path / "nothing"))
    for what in (["jobs"], ["jobs", "1"], ["domains"], ["bogus"], []):
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "gpulayer_tui", "__complete", *what],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=30,
        )
        assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
        assert time.monotonic() - started < 5


def test_complete_loads_no_argparse_and_no_engine_stack(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gpulayer_tui.cli.main import main\n"
        "assert main(['__complete', 'jobs']) == 0\n"
        "print(','.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=dict(os.environ, GPULAYER_HOME=str(tmp_path / "h")),
    )
    loaded = set(out.stdout.strip().split(","))
    heavy = {
        "argparse",
        "aiohttp",
        "textual",
        "pydantic",
        "aiosqlite",
        "gpulayer_tui.engine.engine",
    }
    assert heavy & loaded == set()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_parses_registers_and_scans(tmp_path: Path) -> None:
    source = tmp_path / "completion.zsh"
    source.write_text(script("zsh"))
    assert subprocess.run(["zsh", "-n", str(source)], capture_output=True).returncode == 0
    code = (
        "autoload -U compinit; compinit -u -D\n"
        f"source {shlex.quote(str(source))}\n"
        "print -r -- ${_comps[gpulayer-tui]}\n"
        "_gpulayer_tui_scan --config x submit --gpus 1 --after; print -r -- $_gpl_sub $_gpl_want\n"
        "_gpulayer_tui_scan domain drain; print -r -- $_gpl_sub $_gpl_pos\n"
    )
    out = subprocess.run(
        ["zsh", "-f", "-c", code], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert out.stdout.splitlines() == ["_gpulayer_tui", "submit jobs", "domain 1"], out.stderr


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_script_parses_and_completes(tmp_path: Path, command: Path, served: Served) -> None:
    source = tmp_path / "completion.fish"
    source.write_text(script("fish"))
    assert subprocess.run(["fish", "-n", str(source)], capture_output=True).returncode == 0
    served.start("--simulate", "1xA100-80GB")
    job = served.cli("submit", "--name", "train", "--", "sleep", "60").stdout.strip()
    env = dict(served.env, PATH=f"{command.parent}:{os.environ['PATH']}")

    def complete(line: str) -> list[str]:
        code = f"source {shlex.quote(str(source))}; complete -C {shlex.quote(line)}"
        out = subprocess.run(
            ["fish", "--no-config", "-c", code], capture_output=True, text=True, env=env, timeout=30
        )
        assert out.stderr == "", out.stderr
        return out.stdout.splitlines()

    assert complete("gpulayer-tui sto") == [
        "stop\tstop the background engine (--serve); its running jobs go on"
    ]
    assert complete("gpulayer-tui status ") == [f"{job}\trunning train"]
    assert complete("gpulayer-tui jobs --so") == [
        "--sort\torder (default id, newest first; name, status, user and kind ascend, the "
        "others start with the biggest)"
    ]
    assert [c.split("\t")[0] for c in complete("gpulayer-tui domain drain ")] == ["gpu0", "cpu"]
    assert complete("gpulayer-tui domain release ") == []
    said = complete("gpulayer-tui jobs --status queued,r")
    assert [c.split("\t")[0] for c in said] == ["queued,running"]
    offered = [c.split("\t")[0] for c in complete("gpulayer-tui jobs --status queued,")]
    assert "queued,running" in offered and "queued,queued" not in offered, offered
    assert complete("gpulayer-tui cancel ") == [f"{job}\trunning train"]
    assert served.cli("cancel", job).returncode == 0
    assert complete("gpulayer-tui cancel ") == []  # (ended: not offered)
