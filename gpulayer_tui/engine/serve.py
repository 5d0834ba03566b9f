"""``gpulayer-tui --serve``: the engine and its API, headless, until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from ..unixsock import SocketPath
from .api import ApiServer
from .config import ConfigError, Paths
from .engine import Engine
from .errors import StoreError
from .lock import EngineBusy
from .probes import make_probe
from .sdnotify import SystemdNotifier

log = logging.getLogger(__name__)


async def serve(
    paths: Paths, simulate: str | None = None, simulate_if_no_gpu: str | None = None
) -> int:
    """Run an engine on ``paths`` until asked to stop; return the process exit code.

    Running jobs are left running on shutdown: a later engine re-attaches to them. Under
    systemd (``Type=notify``) it says ``READY=1`` once its socket answers and
    ``STOPPING=1`` when asked to stop.
    """
    systemd = SystemdNotifier.from_environ()
    try:
        probe = make_probe(simulate, paths.state_dir, simulate_if_no_gpu)
        engine = Engine(paths, probe=probe)
    except (ConfigError, ValueError) as err:
        print(f"gpulayer-tui: {err}", file=sys.stderr)
        return 2
    try:
        await engine.start()
    except EngineBusy as err:
        print(f"gpulayer-tui: {err}", file=sys.stderr)
        return 1
    except (ConfigError, StoreError) as err:
        print(f"gpulayer-tui: {err}", file=sys.stderr)
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
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gpus = len(engine.scheduler.gpu_domains)
    notice = f" ({engine.no_gpu_notice})" if engine.no_gpu_notice else ""
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
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
        await engine.stop()
    print("gpulayer-tui engine stopped; running jobs keep running", file=sys.stderr)
    return 0


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


def run_serve(
    paths: Paths,
    simulate: str | None = None,
    simulate_if_no_gpu: str | None = None,
    verbose: bool = False,
) -> int:
    """Blocking entry point for ``--serve``."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(serve(paths, simulate, simulate_if_no_gpu))
