"""``gpulayer-tui --serve``: the engine and its API, headless, until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import sys
import time
from typing import Any

from ..fields import printable
from ..unixsock import SocketPath
from . import launch_client
from .api import ApiServer
from .config import ConfigError, Paths, absent_words
from .engine import Engine
from .errors import StoreError
from .lock import EngineBusy, EngineLock
from .probes import make_probe
from .sdnotify import SystemdNotifier
from .tasks import cancel_and_wait

log = logging.getLogger(__name__)
OPEN_FILES_WANTED = 1 << 16
REPEAT_EVERY_S = 10.0


async def serve(
    paths: Paths,
    simulate: str | None = None,
    simulate_if_no_gpu: str | None = None,
    lock: EngineLock | None = None,
    stop_asked: list[int] | None = None,
) -> int:
    """Run an engine on ``paths`` until asked to stop; return the process exit code.

    Running jobs are left running on shutdown: a later engine re-attaches to them. Under
    systemd (``Type=notify``) it says ``READY=1`` once its socket answers and
    ``STOPPING=1`` when asked to stop. ``lock`` is the state dir's lock when the caller
    took it already (:func:`.statedir.claim_state_dir`); ``stop_asked``, if given, fills
    with the signals that asked it to stop before it served (it stops once it does).
    """
    systemd = SystemdNotifier.from_environ()
    raise_open_files_limit()
    try:
        probe = make_probe(simulate, paths.state_dir, simulate_if_no_gpu)
        engine = Engine(paths, probe=probe, lock=lock)
    except (ConfigError, ValueError) as err:
        # (Escaped: a domain name's escape sequences reached the terminal raw.)
        print(f"gpulayer-tui: {printable(str(err), keep=chr(10))}", file=sys.stderr)
        return 2
    try:
        await engine.start()
    except EngineBusy as err:
        print(f"gpulayer-tui: {err}", file=sys.stderr)
        return 1
    except (ConfigError, StoreError) as err:
        print(f"gpulayer-tui: {printable(str(err), keep=chr(10))}", file=sys.stderr)
        return 2
    except OSError as err:  # the launcher could not be started or reached
        print(f"gpulayer-tui: cannot start jobs: {err}", file=sys.stderr)
        return 1
    server = ApiServer(engine, paths.socket)
    try:
        await server.start()
    except OSError as err:
        await engine.stop()
        print(f"gpulayer-tui: cannot listen on {paths.socket}: {err}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(QuietRepeats())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if stop_asked:
        stop.set()
    # SIGHUP (the terminal it was started from went away: `&` without nohup, an ssh
    # logout) must not end it: a daemon's convention, the config is read again.
    reloads: set[asyncio.Task[None]] = set()

    def hangup() -> None:
        task = loop.create_task(_reload_on_hangup(engine))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, hangup)
    gpus = len(engine.scheduler.gpu_domains)
    notice = f" ({engine.no_gpu_notice})" if engine.no_gpu_notice else ""
    if paths.config_file.is_symlink() and not paths.config_file.exists():
        # A broken link (a dotfile manager's, an /etc link) started an engine on the
        # defaults, no domains, limits or access lists, with no word (tester h193).
        gone = printable(absent_words(paths.config_file))
        print(
            f"gpulayer-tui: warning: the config file {paths.config_file} is {gone}: "
            "the defaults apply",
            file=sys.stderr,
        )
    print(
        f"gpulayer-tui engine serving {paths.state_dir} on {paths.socket} "
        f"[{engine.probe.backend}, {gpus} GPU domain{'s' * (gpus != 1)}]{notice}",
        file=sys.stderr,
        flush=True,
    )
    if systemd.enabled:
        if await _answers(str(paths.socket)):
            where = str(paths.socket).replace("\n", "\\n")  # (one line per state)
            systemd.notify("READY=1", f"STATUS=serving on {where}")
        else:
            log.warning("the API socket %s does not answer; not telling systemd", paths.socket)
    try:
        await stop.wait()
        systemd.notify("STOPPING=1", "STATUS=stopping; running jobs keep running")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        engine.mark_stopping()  # (before the API's connections are waited for)
        for task in list(reloads):
            await cancel_and_wait(task)
        await server.stop()
        await engine.stop()
    print("gpulayer-tui engine stopped; running jobs keep running", file=sys.stderr)
    return 0


def raise_open_files_limit() -> None:
    """Let the engine hold as many files as its hard limit allows (the soft limit is
    often 1024: a thousand waiting clients, each a socket, made it unreachable)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return
    launch_client.JOBS_OPEN_FILES = soft  # (jobs keep the limit they would have had)


class QuietRepeats:
    """The loop's exception handler: each message logged at most once per
    :data:`REPEAT_EVERY_S`, then how many more there were. Out of file descriptors,
    asyncio reported every failed accept (tens of thousands of tracebacks a minute)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        now = time.monotonic()
        at, hidden = self._last.get(message, (-REPEAT_EVERY_S, 0))
        if now - at < REPEAT_EVERY_S:
            self._last[message] = (at, hidden + 1)
            return
        if len(self._last) > 256:
            self._last.clear()
        self._last[message] = (now, 0)
        if hidden:
            context = {**context, "message": f"{message} (and {hidden} more like it)"}
        loop.default_exception_handler(context)


async def _reload_on_hangup(engine: Engine) -> None:
    result = await engine.config_reload.reload()
    outcome = "applied" if result.get("applied") else f"refused ({result.get('error')})"
    log.warning(
        "SIGHUP: the engine keeps running (stop it with `gpulayer-tui stop`); the config "
        "was read again: %s",
        outcome,
    )


async def _answers(socket_path: str, timeout: float = 10.0) -> bool:
    """Whether the API on ``socket_path`` answers a request (what a client would do)."""
    try:
        async with asyncio.timeout(timeout):
            with SocketPath(socket_path) as where:
                reader, writer = await asyncio.open_unix_connection(where.path)
            try:
                writer.write(
                    b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                )
                await writer.drain()
                status = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return False
    return status.startswith(b"HTTP/1.1 200")


class PrintableFormatter(logging.Formatter):
    """Log lines as text: the job names, commands and messages they carry are the users',
    and a control character among them (an escape sequence in a name) is written as
    ``\\xNN``, never sent to the terminal or log reader as such."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep="\n")


def run_serve(
    paths: Paths,
    simulate: str | None = None,
    simulate_if_no_gpu: str | None = None,
    verbose: bool = False,
    lock: EngineLock | None = None,
    stop_asked: list[int] | None = None,
) -> int:
    """Blocking entry point for ``--serve`` (``lock``: as for :func:`serve`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    # ("N changes detected" every few seconds under -v buried the engine's own lines: the
    # config watcher's events are said by the reload itself)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    # (when a new configuration took effect belongs in the log without -v: only its
    # refusals were there, tester h79)
    logging.getLogger("gpulayer_tui.engine.reload").setLevel(logging.INFO)
    # (nor did what `[history]` removed: 1,200 jobs and their logs went without a line,
    # tester h123)
    logging.getLogger("gpulayer_tui.engine.retention").setLevel(logging.INFO)
    # (and a domain's changes: quarantine, a lost GPU, drain, release: tester h125)
    logging.getLogger("gpulayer_tui.engine.health").setLevel(logging.INFO)
    return asyncio.run(serve(paths, simulate, simulate_if_no_gpu, lock, stop_asked))
