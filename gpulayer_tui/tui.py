"""Running the TUI: attach to a serving engine, or embed one; hand over on quit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .backend import (
    EmbeddedBackend,
    EngineBackend,
    EngineRefused,
    SocketBackend,
    engine_is_serving,
)
from .engine.paths import Paths


async def _connect(
    paths: Paths, simulate: str | None, simulate_if_no_gpu: str | None, attach_only: bool = False
) -> EngineBackend | None:
    """The backend the app uses: the engine serving ``paths``, else (unless
    ``attach_only``, then ``None``) a new engine embedded in this process."""
    if await engine_is_serving(paths):
        return SocketBackend(paths)
    if attach_only:
        return None
    from .engine.engine import Engine
    from .engine.lock import EngineBusy
    from .engine.probes import make_probe

    probe = make_probe(simulate, paths.state_dir, simulate_if_no_gpu)
    backend = EmbeddedBackend(Engine(paths, probe=probe))
    try:
        await backend.start()
    except EngineBusy:
        # Another TUI (or --serve) took the state dir as this one looked: two windows
        # opened at once, a restored tmux layout. It serves once it has started; attach.
        deadline = time.monotonic() + RACE_ATTACH_S
        while time.monotonic() < deadline:
            if await engine_is_serving(paths):
                return SocketBackend(paths)
            await asyncio.sleep(0.1)
        raise
    return backend


RACE_ATTACH_S = 30.0
"""How long a TUI that found its state dir taken as it started an engine waits for that
engine to answer (an engine's start reads the GPUs and restores its jobs)."""


def start_background_engine(
    paths: Paths, simulate: str | None, simulate_if_no_gpu: str | None, timeout: float = 20.0
) -> subprocess.Popen[bytes]:
    """Start ``gpulayer-tui --serve`` detached (own session, log in the state dir).

    Returns its process once its socket answers (the caller may simply exit: the engine
    lives on in its own session).

    Raises:
        RuntimeError: It exited or did not answer in time (the message has its log's tail).
    """
    args = [sys.executable, "-m", "gpulayer_tui", "--serve"]
    if paths.config_file.is_file():
        # (when there is none, it is the default path, which the engine finds by itself:
        # a --config naming no file is refused)
        args += ["--config", str(paths.config_file)]
    if simulate:
        args += ["--simulate", simulate]
    elif simulate_if_no_gpu:
        args += ["--simulate-if-no-gpu", simulate_if_no_gpu]
    log_path = paths.state_dir / "serve.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=dict(os.environ, GPULAYER_HOME=str(paths.state_dir))
            if os.environ.get("GPULAYER_HOME")
            else None,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the background engine exited: {_tail(log_path)}")
        if asyncio.run(engine_is_serving(paths)):
            return proc
        time.sleep(0.05)
    raise RuntimeError(f"the background engine did not answer in {timeout:g} s: {_tail(log_path)}")


def _tail(path: Path) -> str:
    try:
        return path.read_text()[-500:].strip()
    except OSError:
        return "(no log)"


def no_engine_text(paths: Paths) -> str:
    """What an attach-only TUI (a browser session) says when no engine serves."""
    import shlex

    # (the state dir named in the command: "gpulayer-tui --serve" in another shell started
    # one on that shell's own state dir, not this one: tester h181)
    home = shlex.quote(paths.state_text)
    return (
        f"No gpulayer-tui engine serves {paths.state_text}.\n\n"
        "The TUI in a browser attaches to a running engine; it never starts one (a browser "
        "tab must not own the GPUs and their jobs). Start one on this machine:\n\n"
        f"    GPULAYER_HOME={home} gpulayer-tui --serve\n\n"
        "or run it as a service (gpulayer-tui install-service prints how), then reload "
        "this page.\n\n(q closes this session)"
    )


def _refusal(paths: Paths) -> str | None:
    """The refusal of an engine that serves ``paths`` and refuses this user, asked with
    the CLI's standard-library client before the app and its libraries load (a user it
    refuses may not even be able to read those); ``None`` otherwise."""
    from .client import ApiError, Client

    try:
        Client(paths, timeout=5.0).request("GET", "/health")
    except ApiError as err:
        return str(err) if err.status == 403 else None
    except PermissionError:
        # (the socket, or a folder above it, is closed to this user: the CLI's words)
        return (
            f"cannot reach the engine's socket {paths.socket}: permission denied; an engine "
            "serves only its own user unless its config lists yours in [security]"
        )
    except Exception:  # (no engine, or one not answering: the TUI's own path says so)
        return None
    return None


TERMINAL_CHECK_S = 2.0
"""How often the TUI looks whether its terminal is still there."""


async def _exit_when_terminal_goes(exit_app: Callable[[], object]) -> None:
    """End the app once its terminal is gone with no SIGHUP to say so (a TUI started
    under ``setsid`` or ``runuser``, its tmux server killed): Textual's input thread then
    read end-of-file in a loop, half a core for ever (tester h179). A terminal that hung
    up is no longer a terminal to ``isatty``. A browser session's input is a pipe from
    ``gpulayer-tui web``: killed (SIGKILL, out of memory), its sessions lived on, each
    attached to the engine (tester h181); the pipe's hang-up ends them."""
    import select
    import stat

    try:
        fd = sys.stdin.fileno()
        terminal = os.isatty(fd)
        piped = stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)
    except (OSError, ValueError):
        return
    if not (terminal or piped):
        return  # (a file, /dev/null: a test)
    hangup = select.POLLHUP | select.POLLERR | select.POLLNVAL
    watch = select.poll()
    # (hang-up and error are reported whatever the mask: no POLLIN, which would be the
    # input the app itself reads)
    watch.register(fd, hangup)
    while True:
        await asyncio.sleep(TERMINAL_CHECK_S)
        try:
            gone = not os.isatty(fd) if terminal else any(e & hangup for _, e in watch.poll(0))
        except (OSError, ValueError):
            gone = True
        if gone:
            exit_app()
            return


def run_tui(
    paths: Paths,
    simulate: str | None,
    simulate_if_no_gpu: str | None,
    *,
    attach_only: bool = False,
) -> int:
    """Open the TUI; return the process exit code.

    With ``attach_only`` (a browser session) it only attaches to a serving engine; without
    one it shows :func:`no_engine_text` and returns 3 (the CLI's "no engine" code).
    """
    from .engine.simulate import simulate_problem

    # (the spec is read whether or not an engine already serves: attached, one with an
    # escape in it was said to "apply only to a new engine", and the TUI opened: h163)
    refused = _refusal(paths) or simulate_problem(simulate, simulate_if_no_gpu)
    if refused is not None:
        from .fields import printable

        print(f"gpulayer-tui: {printable(refused, keep=chr(10))}", file=sys.stderr)
        return 2
    from . import paste_guard
    from .app import StartNotice, build_app
    from .engine.config import ConfigError, load_config
    from .engine.errors import StoreError
    from .engine.lock import EngineBusy

    config = paths.config_file
    bad_config: str | None = None
    theme: str | None = None
    try:
        # Another user's engine may keep its config unreadable to the users it serves (it
        # holds webhook URLs): the TUI then attaches with the default theme.
        readable = not config.exists() or os.access(config, os.R_OK)
        theme = load_config(config).ui.theme if readable else None
    except ConfigError as err:
        # An engine that serves runs on the config it last accepted: attached, the TUI
        # says what is wrong (a typo in a live edit locked the user out of it). Without
        # one, the engine this would start refuses the file, and that is said below.
        bad_config = str(err)

    crashed = False

    async def main() -> str:
        nonlocal crashed
        backend = await _connect(paths, simulate, simulate_if_no_gpu, attach_only)
        if backend is None:
            from .app import MessageApp

            if not attach_only:
                # (a browser session's stderr is the `web` server's terminal: one bare line
                # per tab landed there; the page itself says it: tester h64)
                print(f"gpulayer-tui: no engine serves {paths.state_text}", file=sys.stderr)
            await MessageApp(no_engine_text(paths)).run_async()
            return "no-engine"
        notices = []
        if bad_config is not None:
            text = f"{bad_config} (the engine goes on with the configuration it last accepted)"
            notices.append(StartNotice("config", text, "error"))
        # (EmbeddedBackend is a SocketBackend too: the README's own first command was
        # told its --simulate-if-no-gpu was ignored, by the engine it had just started: h94)
        attached = not isinstance(backend, EmbeddedBackend)
        if attached and (simulate or simulate_if_no_gpu):
            # (printed before the app drew, it was hidden by it: the user saw the engine's
            # GPUs and never learned that the ones asked for were not made: tester h89)
            flag = "--simulate" if simulate else "--simulate-if-no-gpu"
            said = (
                f"an engine already serves {paths.state_text}: attached to it and its GPUs; "
                f"{flag} applies only to a new engine (gpulayer-tui stop, then start again)"
            )
            print(f"gpulayer-tui: {said}", file=sys.stderr)
            notices.append(StartNotice(flag, said))
        paste_guard.install()  # (a paste is text, never keys: tester h151)
        watch: asyncio.Task[None] | None = None
        try:
            app = build_app(backend, theme=theme, config_file=paths.config_file, notices=notices)
            watch = asyncio.get_running_loop().create_task(_exit_when_terminal_goes(app.exit))
            result = await app.run_async() or ""
            # (An app that ended on an error printed its traceback, and the shell saw 0.)
            crashed = bool(app.return_code)
            return result
        finally:
            if watch is not None:
                watch.cancel()
            await backend.close()

    try:
        result = asyncio.run(main())
    except (ConfigError, StoreError, EngineBusy, ValueError, EngineRefused) as err:
        from .fields import printable

        print(f"gpulayer-tui: {printable(str(err), keep=chr(10))}", file=sys.stderr)
        return 2
    if crashed:
        return 1
    if result == "no-engine":
        return 3
    if result == "handover":
        try:
            pid = start_background_engine(paths, simulate, simulate_if_no_gpu).pid
        except RuntimeError as err:
            print(f"gpulayer-tui: {err}", file=sys.stderr)
            print(
                "gpulayer-tui: your jobs keep running; start an engine with "
                "`gpulayer-tui --serve` to follow them",
                file=sys.stderr,
            )
            return 1
        print(
            # (said of no jobs too: "jobs handed over" then read wrong)
            f"gpulayer-tui: the engine goes on in the background (pid {pid}), with any jobs; "
            f"run gpulayer-tui again to attach (its log: {paths.state_dir / 'serve.log'}; "
            "`gpulayer-tui stop` stops it)"
        )
    return 0
