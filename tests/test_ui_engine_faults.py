"""The attached TUI under a misbehaving engine: it says "not answering" within seconds of
a frozen engine, and after the engine is killed mid-stream and started again it
reconnects and its tables follow the new engine (issue 14)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpulayer_tui.app import build_app
from gpulayer_tui.backend import SocketBackend
from gpulayer_tui.engine.paths import resolve_paths
from gpulayer_tui.screens.job_detail import JobDetailScreen

from .conftest import Served
from .ui_support import until


async def test_a_frozen_then_killed_engine_is_said_and_survived(served: Served, home: Path) -> None:
    served.start("--simulate", "1xA100-80GB")
    backend = SocketBackend(resolve_paths())
    app = build_app(backend, refresh_interval=0.05)  # the default health poll: every 2 s
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.health is not None, "the first health answer")
        assert served.proc is not None
        pid = served.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await until(
                pilot,
                lambda: "not answering" in app.connection_problem,
                "a frozen engine said",
                timeout=5,
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        await until(pilot, lambda: app.connection_problem == "", "the engine back", timeout=10)

        # Killed mid-stream (SIGKILL: no goodbye), then started again.
        served.proc.kill()
        served.proc.wait()
        await until(pilot, lambda: app.connection_problem != "", "the lost engine said")
        # Said as what it is for as long as it lasts: "event stream lost; reconnecting"
        # replaced "no engine answers ... start one" at each reconnect try, every second
        # (tester h54).
        await until(
            pilot,
            lambda: app.connection_problem.startswith("no engine answers at "),
            "no engine said",
        )
        said = set()
        for _ in range(60):  # (3 s: three reconnect tries)
            await pilot.pause(0.05)
            said.add(app.connection_problem)
        assert len(said) == 1 and "start one with `gpulayer-tui --serve`" in said.pop(), said
        # The header says it without the socket's path, so that it fits 80 columns.
        from textual.widgets import Label

        health = app.screen.query_one("#health", Label)
        shown = str(health.render())
        assert shown == "⚠ no engine answers: run `gpulayer-tui --serve`", shown
        await pilot.resize_terminal(80, 24)  # (all of it in sight: tester h130)
        await until(pilot, lambda: health.region.right <= 80 and health.region.width >= 49)
        assert health.region.width == len(shown) + 2  # (its padding)
        # The last readings are dimmed: they read as live (tester h130).
        dashboard = app.screen
        assert dashboard.has_class("-no-engine")
        grid = dashboard.query_one("#gpu-grid")
        assert grid.styles.text_opacity < 1
        # Each view change asks the engine again: one toast says it is gone (five alike
        # stacked up, one per key).
        await pilot.press("2")
        # So are the jobs table's rows: they kept reading "running" (testers h162, h167).
        jobs_screen = app.screen
        await until(pilot, lambda: jobs_screen.has_class("-no-engine"), "jobs dimmed")
        assert jobs_screen.query_one("JobTable").styles.text_opacity < 1
        for key in ("s", "S", "o", "O"):  # (and back: the view as it was)
            await pilot.press(key)
            await pilot.pause(0.05)
        messages = [(n.title, n.message) for n in app._notifications]
        assert len(messages) == len(set(messages)), messages
        served.start("--simulate", "1xA100-80GB")
        submitted = served.cli("submit", "--", "true")
        assert submitted.returncode == 0, submitted.stderr
        job_id = int(submitted.stdout)
        await until(
            pilot,
            lambda: app.job_store.jobs.get(job_id, {}).get("status") == "completed",
            "the new engine's job, through the reconnected stream",
            timeout=20,
        )
        assert app.connection_problem == ""
        await until(pilot, lambda: not dashboard.has_class("-no-engine"), "not dimmed again")
        assert not jobs_screen.has_class("-no-engine")
        assert jobs_screen.query_one("JobTable").styles.text_opacity == 1
    await backend.close()


async def test_an_engine_restart_keeps_the_finished_jobs_in_an_attached_table(
    served: Served, home: Path
) -> None:
    # The reload after a reconnect asked for the page after the one shown (where its last
    # page had ended) and replaced every row with it: only the running jobs stayed.
    served.start("--simulate", "1xA100-80GB")
    done: list[int] = []
    for _ in range(3):  # one after another: the first by id also ended first
        done.append(int(served.cli("submit", "--", "true").stdout))
        assert served.cli("wait", str(done[-1])).returncode == 0
    backend = SocketBackend(resolve_paths())
    app = build_app(backend, refresh_interval=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: set(done) <= set(app.job_store.jobs), "the finished jobs")
        assert served.proc is not None
        served.proc.kill()
        served.proc.wait()
        await until(pilot, lambda: app.connection_problem != "", "the lost engine said")
        served.start("--simulate", "1xA100-80GB")
        await until(pilot, lambda: app.connection_problem == "", "reconnected", timeout=20)
        await until(pilot, lambda: set(done) <= set(app.job_store.jobs), "still listed")
        # One cleaned while the TUI was not connected (no jobs.removed event reached it):
        # its open detail closes at the reload, as for the event.
        app.open_job(done[0])
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail")
        assert served.proc is not None
        served.proc.kill()
        served.proc.wait()
        await until(pilot, lambda: app.connection_problem != "", "the lost engine said again")
        served.home.joinpath("config.toml").write_text("[history]\nkeep_jobs = 2\n")
        served.start("--simulate", "1xA100-80GB")
        said = f"job {done[0]} was removed from the history"
        await until(
            pilot, lambda: any(n.message == said for n in app._notifications), said, timeout=20
        )
        await until(pilot, lambda: not isinstance(app.screen, JobDetailScreen), "closed")
    await backend.close()


async def test_a_change_with_no_engine_says_nothing_was_sent_and_one_unanswered_may_be_done(
    served: Served, home: Path
) -> None:
    # Both said "lost the connection to the engine": with no engine the request was never
    # sent, and an unanswered one may have been acted on.
    import pytest

    from gpulayer_tui.backend import ConnectionLost

    backend = SocketBackend(resolve_paths())
    try:
        with pytest.raises(ConnectionLost, match=r"no engine answers at .*: nothing was sent"):
            await backend.submit({"command": ["true"]})
        served.start("--simulate", "1xA100-80GB")
        assert served.proc is not None
        os.kill(served.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(ConnectionLost, match="it may have been done"):
                await backend._request("POST", "/jobs", 1.0, json={"command": ["true"]})
        finally:
            os.kill(served.proc.pid, signal.SIGCONT)
    finally:
        await backend.close()


async def test_an_event_stream_refused_says_the_engines_reason(served: Served, home: Path) -> None:
    # Past [limits] streams_per_user the header said "event stream lost; reconnecting"
    # for as long as the other streams stayed open, where the CLI says why (tester h156).
    import socket

    _write_config(home, "[limits]\nstreams_per_user = 1\n")
    served.start("--simulate", "1xA100-80GB")
    held = socket.socket(socket.AF_UNIX)
    held.connect(str(home / "engine.sock"))
    held.sendall(b"GET /v1/events HTTP/1.1\r\nHost: engine\r\n\r\n")
    assert held.recv(64).startswith(b"HTTP/1.1 200")
    backend = SocketBackend(resolve_paths())
    try:
        app = build_app(backend, refresh_interval=0.05)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(
                pilot,
                lambda: (
                    app.connection_problem.startswith("event stream refused: ")
                    and "streams_per_user = 1" in app.connection_problem
                ),
                "the refusal said",
            )
            held.close()
            await until(pilot, lambda: app.connection_problem == "", "the stream taken")
    finally:
        held.close()
        await backend.close()


def _write_config(home: Path, text: str) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)


async def test_a_silent_jobs_output_stops_saying_the_lost_connection_once_read_again(
    served: Served, home: Path
) -> None:
    # The job wrote nothing: "lost the connection to the engine" stayed under its output
    # after the engine was back, with nothing read to replace it (tester h176 #4).
    from gpulayer_tui.widgets.log_tail import LogTail

    served.start("--simulate", "1xA100-80GB")
    job_id = int(served.cli("submit", "--", "sleep", "600").stdout)
    backend = SocketBackend(resolve_paths())
    app = build_app(backend, refresh_interval=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_job(job_id)
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        log = await until(pilot, lambda: next(iter(detail.query(LogTail)), None))
        assert served.proc is not None
        served.proc.kill()
        served.proc.wait()
        lost = "lost the connection to the engine"
        await until(pilot, lambda: lost in str(log.border_subtitle), "the loss said", timeout=20)
        served.start("--simulate", "1xA100-80GB")
        await until(pilot, lambda: app.connection_problem == "", "reconnected", timeout=20)
        await until(pilot, lambda: lost not in str(log.border_subtitle), "no longer said", 20)
        served.cli("cancel", str(job_id))
    await backend.close()


async def test_a_view_whose_pages_no_engine_answered_is_not_counted_as_whole(
    served: Served, home: Path, tmp_path: Path
) -> None:
    # A filter cleared while no engine answered: the table showed the rows loaded before
    # (the filter's, the newest page's) and counted them "1,500 jobs", as if the whole
    # history (tester h191).
    from textual.widgets import Label

    from gpulayer_tui.job_feed import PAGE

    served.start("--simulate", "1xA100-80GB")
    lines = tmp_path / "jobs.txt"
    lines.write_text("true\n" * (PAGE + 20))
    assert served.cli("submit", "--file", str(lines)).returncode == 0
    backend = SocketBackend(resolve_paths())
    app = build_app(backend, refresh_interval=0.05)
    async with app.run_test(size=(140, 40)) as pilot:

        def count() -> str:
            return str(app.screen.query_one("#jobs-count", Label).render())

        await pilot.press("2")
        await until(pilot, lambda: count() == f"{PAGE:,}+ jobs", "the newest page", timeout=20)
        await pilot.press("slash", *"51", "enter")
        await until(pilot, lambda: "matching" in count(), "the filtered view")
        assert served.proc is not None
        served.proc.kill()
        served.proc.wait()
        await until(pilot, lambda: app.connection_problem != "", "the lost engine said")
        await pilot.press("escape")  # (the filter cleared: its first page is not answered)
        await until(pilot, lambda: "matching" not in count(), "the whole view")
        await until(pilot, lambda: count().endswith("+ jobs"), "counted as partial")
        assert app.job_feed.unanswered
    await backend.close()
