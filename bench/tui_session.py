"""The attached TUI under Textual's Pilot, timed from a key press to the frame that shows
its result. ``bench_tui.py`` runs it as a child process against its ``--serve`` engine.

Usage: ``python bench/tui_session.py launch|keys T0 OPTIONS_JSON`` with ``GPULAYER_HOME``
pointing at a running engine; prints one JSON line. It imports ``gpulayer_tui`` from
``PYTHONPATH`` (not from this checkout), so the same script times an older checkout's TUI
(``bench_tui.py --baseline DIR``).

Why not ``pilot.press`` + ``pilot.pause``: both wait for the process to look idle, in
slices of 20 ms (``textual._wait``), so a press costs 40-60 ms under the pilot before
anything of ours runs. Here a key goes to the app as the terminal driver sends it, and
the clock stops at the first frame composed after the screen is ready (a condition per
target, below). That frame is also turned into the bytes a terminal would get (the
headless driver writes nothing), so drawing and encoding are in the figure; writing to a
real terminal is not.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from textual import events
from textual._compositor import CompositorUpdate
from textual.app import App


class Frames:
    """Counts the frames the app composes for its current screen, and encodes each.

    A waiter (:func:`ready`) is told of the first frame composed while its condition
    holds. The check runs inside the frame hook, not by polling: the app and this script
    share one event loop, so on a loaded machine the state change and its frame can both
    happen between two polls, and a poller would then wait for a frame that never comes.
    """

    def __init__(self, app: App[Any]) -> None:
        self.count = 0
        self.at = 0.0
        self.waiter: tuple[Callable[[], bool], asyncio.Future[float]] | None = None
        original = app._display

        def display(screen: Any, renderable: Any) -> None:
            original(screen, renderable)
            if renderable is None or app._batch_count or screen is not app.screen:
                return
            if isinstance(renderable, CompositorUpdate):
                renderable.render_segments(app.console)  # what a terminal would be sent
            self.count += 1
            self.at = time.perf_counter()
            if self.waiter is not None:
                condition, done = self.waiter
                if not done.done() and condition():
                    done.set_result(self.at)

        app._display = display  # type: ignore[method-assign]


def press(app: App[Any], key: str) -> float:
    """Send ``key`` as the terminal driver does; the time it was sent."""
    event = events.Key(key, key if len(key) == 1 else None)
    event.set_sender(app)
    t = time.perf_counter()
    assert app._driver is not None
    app._driver.send_message(event)
    return t


async def ready(frames: Frames, condition: Callable[[], bool], timeout: float = 30.0) -> float:
    """The time of the first frame composed from now on while ``condition`` holds."""
    done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    frames.waiter = (condition, done)
    try:
        return await asyncio.wait_for(done, timeout)
    except TimeoutError:
        what = "no frame came" if condition() else "the screen did not get ready"
        raise TimeoutError(f"{what} within {timeout:.0f} s") from None
    finally:
        frames.waiter = None


async def timed(app: App[Any], frames: Frames, key: str, condition: Callable[[], bool]) -> float:
    """Seconds from pressing ``key`` to the first frame after ``condition`` holds."""
    t = press(app, key)
    return await ready(frames, condition) - t


async def settle(seconds: float = 0.05) -> None:
    """Let the app go quiet between presses (a person does not type at 1 kHz)."""
    await asyncio.sleep(seconds)


def build() -> tuple[App[Any], Any]:
    from gpulayer_tui.app import build_app
    from gpulayer_tui.backend import SocketBackend
    from gpulayer_tui.engine.paths import resolve_paths

    backend = SocketBackend(resolve_paths())
    return build_app(backend), backend


def panels(app: App[Any]) -> int:
    from gpulayer_tui.widgets.gpu_panel import GpuPanel

    return len(app.screen.query(GpuPanel))


async def launch(t_start: float, opts: dict[str, Any]) -> dict[str, Any]:
    """Launch to the first frame with every GPU panel, then the idle CPU per size."""
    app, backend = build()
    out: dict[str, Any] = {}
    frames = Frames(app)
    gpus = int(opts["gpus"])
    async with app.run_test(size=tuple(opts["sizes"][0])) as pilot:
        frame = await ready(frames, lambda: panels(app) >= gpus)
        out["first_frame_s"] = frame + (time.time() - time.perf_counter()) - t_start
        out["jobs_loaded"] = len(app.job_store.jobs)  # type: ignore[attr-defined]
        out["idle"] = []
        for n, size in enumerate(opts["sizes"]):
            if n:
                await pilot.resize_terminal(*size)
            await asyncio.sleep(2.0)  # settle
            c0, w0, f0 = time.process_time(), time.monotonic(), frames.count
            await asyncio.sleep(float(opts["idle_s"]))
            c1, w1 = time.process_time(), time.monotonic()
            out["idle"].append(
                {
                    "size": list(size),
                    "cpu_pct": 100.0 * (c1 - c0) / (w1 - w0),
                    "window_s": w1 - w0,
                    "frames_per_s": (frames.count - f0) / (w1 - w0),
                }
            )
        if opts.get("busy"):
            out["busy"] = await busy_window(app, backend, frames, pilot, opts)
    await backend.close()
    return out


async def busy_window(
    app: App[Any], backend: Any, frames: Frames, pilot: Any, opts: dict[str, Any]
) -> dict[str, Any]:
    """Idle CPU while every GPU runs a job: simulated load moves every sample, so each
    sample changes what the panels and the process table show."""
    gpus = int(opts["gpus"])
    size = tuple(opts["sizes"][0])
    await pilot.resize_terminal(*size)
    ids = [
        (await backend.submit({"command": ["sleep", "600"], "gpus": 1, "vram_gb": 10}))["id"]
        for _ in range(gpus)
    ]
    try:
        store = app.job_store  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while sum(1 for i in ids if store.jobs.get(i, {}).get("status") == "running") < gpus:
            if time.monotonic() > deadline:
                raise TimeoutError("the busy jobs did not all start")
            await asyncio.sleep(0.05)
        await asyncio.sleep(3.0)  # settle: their processes show up in the samples
        c0, w0, f0 = time.process_time(), time.monotonic(), frames.count
        await asyncio.sleep(float(opts["idle_s"]))
        c1, w1 = time.process_time(), time.monotonic()
    finally:
        for job_id in ids:
            await backend.cancel(job_id)
    return {
        "size": list(size),
        "jobs": gpus,
        "cpu_pct": 100.0 * (c1 - c0) / (w1 - w0),
        "window_s": w1 - w0,
        "frames_per_s": (frames.count - f0) / (w1 - w0),
    }


async def keys(opts: dict[str, Any]) -> dict[str, Any]:
    """Screen switches, job detail open, PageDown (near the top, then with every row)."""
    from gpulayer_tui.screens.job_detail import JobDetailScreen
    from gpulayer_tui.widgets.job_table import JobTable
    from gpulayer_tui.widgets.log_tail import LogTail
    from gpulayer_tui.widgets.timeline import Timeline

    presses, gpus = int(opts["presses"]), int(opts["gpus"])
    app, backend = build()
    frames = Frames(app)
    out: dict[str, Any] = {}
    async with app.run_test(size=(200, 50)):
        await ready(frames, lambda: panels(app) >= gpus)
        await settle(0.5)

        def table() -> JobTable:
            return app.screen.query_one(JobTable)

        def has_rows() -> bool:
            found = app.screen.query(JobTable)
            return bool(found) and found.first().row_count > 0

        modes = {
            "2": lambda: app.current_mode == "jobs" and has_rows(),
            "3": lambda: app.current_mode == "strays",
            "1": lambda: app.current_mode == "dashboard" and panels(app) >= gpus,
        }
        first: dict[str, float] = {}
        switches: list[float] = []
        while len(switches) < presses:
            for key, condition in modes.items():
                took = await timed(app, frames, key, condition)
                if key in first or key == "1":
                    switches.append(took)
                else:
                    first[key] = took  # the screen is built on its first visit
                await settle()
        out["switch_s"] = switches
        out["switch_first_s"] = first

        # The job detail: enter on a row until its fields, timeline and log are shown.
        await timed(app, frames, "2", modes["2"])
        await settle()

        def detail_ready() -> bool:
            screen = app.screen
            if not isinstance(screen, JobDetailScreen) or screen.job is None:
                return False
            log = screen.query_one(LogTail)
            return (
                "spec" in screen.job
                and bool(screen.query_one(Timeline).events)
                and bool(getattr(screen, "_log_done", False))
                and (log.line_count > 0 or log.bytes_read == 0)
            )

        opened: list[float] = []
        lines: list[int] = []
        for _ in range(presses):
            opened.append(await timed(app, frames, "enter", detail_ready))
            lines.append(app.screen.query_one(LogTail).line_count)
            await settle()
            await timed(
                app,
                frames,
                "escape",
                lambda: app.current_mode == "jobs" and not isinstance(app.screen, JobDetailScreen),
            )
            row = table().cursor_row
            await timed(app, frames, "down", lambda r=row: table().cursor_row == r + 1)
            await settle()
        out["detail_s"] = opened
        out["detail_log_lines"] = lines

        # PageDown from the top: pages of history load as the cursor nears the end.
        await timed(app, frames, "home", lambda: table().cursor_row == 0)
        await settle()
        out["pagedown_s"] = await page_downs(app, frames, table, presses)
        out["rows_after_pagedown"] = table().row_count

        # Every row of the history in the table, then PageDown deep in it.
        t0 = time.perf_counter()
        total = int(opts["history"])
        while table().row_count < total and time.perf_counter() - t0 < 120:
            await timed(app, frames, "end", lambda: table().cursor_row == table().row_count - 1)
            await settle(0.2)
        out["rows_loaded"] = table().row_count
        out["load_all_s"] = time.perf_counter() - t0
        middle = table().row_count // 2
        table().move_cursor(row=middle)
        await ready(frames, lambda: table().cursor_row == middle)
        await settle(0.3)
        out["pagedown_all_s"] = await page_downs(app, frames, table, presses)
    await backend.close()
    return out


async def page_downs(
    app: App[Any], frames: Frames, table: Callable[[], Any], n: int
) -> list[float]:
    times = []
    for _ in range(n):
        row = table().cursor_row
        times.append(await timed(app, frames, "pagedown", lambda r=row: table().cursor_row > r))
        await settle()
    return times


def main() -> None:
    what, t_start, opts = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
    result = asyncio.run(launch(t_start, opts) if what == "launch" else keys(opts))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
