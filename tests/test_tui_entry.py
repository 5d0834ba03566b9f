"""The TUI's entry point (``gpulayer-tui`` with no subcommand, ``tui.run_tui``) in a real
terminal (tmux): it embeds an engine, and on quit hands running jobs to a background engine;
when that engine cannot start it says so, says the jobs keep running, and exits 1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, Served, wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


class Terminal:
    """A tmux session of its own (own server socket) running one command."""

    def __init__(self, socket: Path, env: dict[str, str]) -> None:
        self.socket = str(socket)
        self.env = env

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args], capture_output=True, text=True, env=self.env
        )
        return done.stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-x", "400", "-y", "40", "-s", "t", command)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_for_text(self, text: str, timeout: float) -> None:
        """Wait until ``text`` shows on the pane; a timeout shows what the pane has."""
        try:
            wait_for(lambda: text in self.screen(), timeout=timeout)
        except AssertionError:
            raise AssertionError(
                f"{text!r} not shown within {timeout} s; the pane:\n" + self.screen()
            ) from None


@pytest.fixture
def terminal(served: Served, tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(tmp_path / "tmux.sock", dict(served.env, TERM="xterm-256color"))
    yield term
    term.tmux("kill-server")


def test_quit_handover_that_cannot_start_an_engine_says_the_jobs_go_on(
    served: Served, terminal: Terminal, tmp_path: Path
) -> None:
    served.home.mkdir(parents=True)
    config = served.home / "config.toml"
    config.write_text("[engine]\nsample_interval = 0.5\n")
    # (Textual draws on stderr: what the entry point says after the app shows on the pane)
    terminal.start(
        f"{sys.executable} -m gpulayer_tui --simulate 1xA100-80GB; echo EXIT=$?; sleep 600"
    )
    wait_for(lambda: served.cli("gpus").returncode == 0, timeout=30)  # embedded, serving
    submitted = served.cli("submit", "--", "sleep", "600")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(served.cli("status", submitted.stdout.strip(), "--json").stdout)["job"]
    # The config goes bad while the TUI runs (the live engine keeps its own): the
    # background engine the hand-over starts refuses it and exits.
    config.write_text("[engine]\nsample_interval = 'often'\n")
    terminal.wait_for_text("1 running", timeout=30)  # the app has it
    terminal.keys("q")
    terminal.wait_for_text("Keep running", timeout=20)
    terminal.keys("k")
    terminal.wait_for_text("EXIT=", timeout=60)
    err = " ".join(terminal.screen().split())  # (400 columns: no line of it wraps)
    assert "EXIT=1" in err
    assert "gpulayer-tui: the background engine exited:" in err
    assert "sample_interval" in err  # its log's tail says why
    assert "your jobs keep running; start an engine with `gpulayer-tui --serve` to follow" in err
    assert Path(f"/proc/{job['pid']}").exists()  # and they do


def test_a_bad_simulate_spec_is_refused_with_an_engine_serving_too(served: Served) -> None:
    # Attached, "X<ESC>..." was said to "apply only to a new engine" and the TUI opened,
    # the spec never read (tester h163).
    served.start("--simulate", "1xA100-80GB")
    out = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "--simulate", "X\x1b]0;T"],
        env=served.env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "--simulate: cannot read 'X\\x1b]0;T'; expected COUNTxMODEL-MEMGB" in out.stderr
    assert "\x1b" not in out.stderr and "applies only" not in out.stderr
    # A second --serve is told the engine serves, and that its spec is bad too.
    serve = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "--serve", "--simulate", "3xFOO"],
        env=served.env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert serve.returncode == 1, serve
    assert "already" in serve.stderr and "cannot read '3xFOO'" in serve.stderr, serve.stderr


def test_a_bad_config_stops_the_tui_before_it_starts(served: Served, terminal: Terminal) -> None:
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text("[ui]\ntheme = 3\n")
    out = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "--simulate", "1xA100-80GB"],
        env=served.env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 2
    assert "ui.theme" in out.stderr and "Traceback" not in out.stderr


def test_a_config_gone_bad_under_a_running_engine_still_lets_the_tui_attach(
    served: Served, terminal: Terminal
) -> None:
    # A typo in a live edit (the engine keeps the config it last accepted) locked the
    # user out of the TUI: "unknown key 'engine.bogus'", exit 2, no UI.
    served.start("--simulate", "1xA100-80GB")
    (served.home / "config.toml").write_text("[engine]\nbogus = 1\n")
    terminal.start(f"{sys.executable} -m gpulayer_tui; echo EXIT=$?; sleep 600")
    # (a toast wraps its text where the path before it ends: its words are looked for)
    terminal.wait_for_text("attached to", timeout=30)
    terminal.wait_for_text("'engine.bogus'", timeout=15)
    assert "accepted)" in terminal.screen()
    terminal.keys("q")
    terminal.wait_for_text("EXIT=0", timeout=30)


def test_simulate_given_to_a_tui_that_attaches_is_said_in_the_app(
    served: Served, terminal: Terminal
) -> None:
    # (it was printed before the app drew, and the app hid it: the user saw one GPU and
    # never learned that the eight asked for were not made: tester h89)
    served.start("--simulate", "1xA100-80GB")
    terminal.start(
        f"{sys.executable} -m gpulayer_tui --simulate 8xH100-80GB; echo EXIT=$?; sleep 600"
    )

    # (the toast wraps its lines, each after its border: its words are looked for)
    def shown() -> str:
        return " ".join(terminal.screen().replace("▌", " ").split())

    # (both from one capture: a capture of the pane now and then comes back empty)
    said = ("applies only to a new engine", "attached to it and its GPUs")
    try:
        wait_for(lambda: all(words in shown() for words in said), timeout=30)
    except AssertionError:
        raise AssertionError(f"not said; the pane:\n{terminal.screen()}") from None
    terminal.keys("q")
    terminal.wait_for_text("EXIT=0", timeout=30)
    terminal.wait_for_text("attached to it and its GPUs", timeout=10)  # (stderr, after it)


def test_simulate_given_to_a_tui_that_starts_its_own_engine_is_not_said_ignored(
    served: Served, terminal: Terminal
) -> None:
    # (the README's first command, on a fresh machine: its engine is the TUI's own, and it
    # was told "an engine already serves ...: --simulate-if-no-gpu applies only to a new
    # engine", false; both the toast and stderr said it: tester h94)
    terminal.start(
        f"{sys.executable} -m gpulayer_tui --simulate-if-no-gpu 2xA100-80GB; echo EXIT=$?; "
        "sleep 600"
    )
    terminal.wait_for_text("embedded engine", timeout=30)
    terminal.wait_for_text("gpu1", timeout=30)  # (its own two simulated GPUs)
    assert "already serves" not in " ".join(terminal.screen().replace("▌", " ").split())
    terminal.keys("q")
    terminal.wait_for_text("EXIT=0", timeout=30)
    # (the stderr line is printed before the app runs: after it, it would still show)
    assert "applies only to a new engine" not in terminal.screen()


def test_a_paste_holding_escape_sequences_is_text_never_keys(
    served: Served, terminal: Terminal, tmp_path: Path
) -> None:
    # Textual's parser handed the part of a paste after an ESC to the app as keys: a
    # copied coloured line ending in "cy" cancelled the job under the cursor, one with
    # "q" asked to quit, and a form's field got the text out of order (tester h151).
    served.start("--simulate", "1xA100-80GB")
    submitted = served.cli("submit", "--name", "keep-me", "--", "sleep", "600")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    terminal.start(f"{sys.executable} -m gpulayer_tui; echo EXIT=$?; sleep 600")
    terminal.wait_for_text("1 running", timeout=30)

    def paste(text: str) -> None:
        # (a bracketed paste, as a terminal sends one: the app asked for the mode)
        clip = tmp_path / "clip"
        clip.write_bytes(text.encode())
        terminal.tmux("load-buffer", "-b", "clip", str(clip))
        terminal.tmux("paste-buffer", "-p", "-d", "-b", "clip", "-t", "t")

    terminal.keys("2")
    terminal.wait_for_text("keep-me", timeout=20)
    paste("hello \x1b[0mcy")
    paste("x \x1b[0mq")
    terminal.keys("n")  # (a key after the pastes: once its form shows, they were read,
    terminal.wait_for_text("New job", timeout=20)  # and the app did not quit)
    status = json.loads(served.cli("status", job_id, "--json").stdout)["job"]["status"]
    assert status == "running"
    paste("A1 B2\x1b[31mC3 D4\x1b]0;title\x07E5")  # (into the command field, which has focus)
    terminal.wait_for_text("A1 B2C3 D4E5", timeout=20)
    assert "^[" not in terminal.screen()
    terminal.keys("Escape")
    terminal.wait_for_text("esc again throws away", timeout=20)
    terminal.keys("Escape")
    # (a capture now and then comes back empty: the table must show, the form not)
    wait_for(
        lambda: "keep-me" in (s := terminal.screen()) and "Submit (ctrl+s)" not in s, timeout=20
    )
    terminal.keys("q")
    terminal.wait_for_text("EXIT=0", timeout=30)


def test_input_that_is_not_utf8_is_text_and_never_ends_the_tui(
    served: Served, terminal: Terminal, tmp_path: Path
) -> None:
    # One byte that is not UTF-8 (a Latin-1 terminal's é, an 8-bit Meta key, a pasted
    # binary) ended the TUI in a UnicodeDecodeError, exit 0, and an embedded engine with
    # it (tester h160). It is read as U+FFFD.
    served.start("--simulate", "1xA100-80GB")
    terminal.start(f"{sys.executable} -m gpulayer_tui; echo EXIT=$?; sleep 600")
    terminal.wait_for_text("engine ok", timeout=30)
    terminal.tmux("send-keys", "-t", "t", "-H", "e9", "41")  # (typed: Latin-1 é, then A)
    terminal.keys("n")
    terminal.wait_for_text("New job", timeout=20)
    clip = tmp_path / "clip"
    clip.write_bytes(b"abc\xffdef")
    terminal.tmux("load-buffer", "-b", "clip", str(clip))
    terminal.tmux("paste-buffer", "-p", "-d", "-b", "clip", "-t", "t")
    terminal.wait_for_text("abc\ufffddef", timeout=20)
    assert "Traceback" not in terminal.screen() and "EXIT=" not in terminal.screen()
    terminal.keys("Escape")
    terminal.wait_for_text("esc again throws away", timeout=20)
    terminal.keys("Escape")
    wait_for(lambda: "Submit (ctrl+s)" not in terminal.screen(), timeout=20)
    terminal.keys("q")
    terminal.wait_for_text("EXIT=0", timeout=30)


def test_a_tui_whose_terminal_goes_without_a_hangup_ends(
    served: Served, terminal: Terminal, tmp_path: Path
) -> None:
    # Started where no SIGHUP reaches it (setsid, runuser) and its tmux server killed,
    # it read end-of-file in a loop at half a core, for ever (tester h179). Its terminal
    # no longer a terminal, it ends (as a hung-up one would).
    served.start("--simulate", "1xA100-80GB")
    pid_file = tmp_path / "tui.pid"
    terminal.start(f"setsid -w sh -c 'echo $$ > {pid_file}; exec {sys.executable} -m gpulayer_tui'")
    terminal.wait_for_text("engine ok", timeout=30)
    pid = int(pid_file.read_text())
    terminal.tmux("kill-server")
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout=30)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
