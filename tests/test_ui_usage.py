"""A job's GPU usage in the TUI (issue 17): the detail's usage panel fills live from a real
engine on simulated GPUs, shows a finished job's stored usage, none for a CPU job, and
survives the engine going away; the jobs table's usage columns; the dashboard's idle
count; then deterministic snapshots over the static fake."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpulayer_tui.app import build_app
from gpulayer_tui.backend import SocketBackend
from gpulayer_tui.engine.paths import resolve_paths
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.widgets.field_list import FieldList
from gpulayer_tui.widgets.job_table import JobTable
from gpulayer_tui.widgets.level_line import LevelLine
from gpulayer_tui.widgets.log_tail import LogTail
from gpulayer_tui.widgets.summary_line import SummaryLine
from gpulayer_tui.widgets.timeline import Timeline
from gpulayer_tui.widgets.usage_panel import UsagePanel

from .conftest import Served, eventually, make_config
from .ui_support import FIXED_NOW, StaticBackend, until

AppFactory = Callable[..., Any]


@pytest.fixture(autouse=True)
def quick_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    # (the engine samples every 0.2 s in tests: read its usage about as often)
    monkeypatch.setattr("gpulayer_tui.screens.job_detail.USAGE_POLL_INTERVAL", 0.1)


def _text(widget: Static | FieldList) -> str:
    return str(widget.render())


def _panel(pilot: Pilot[Any]) -> UsagePanel:
    return pilot.app.screen.query_one(UsagePanel)


async def _open(pilot: Pilot[Any], job_id: int) -> JobDetailScreen:
    pilot.app.open_job(job_id)  # type: ignore[attr-defined]
    screen = await until(
        pilot,
        lambda: isinstance(pilot.app.screen, JobDetailScreen) and pilot.app.screen,
        "the detail",
    )
    await until(pilot, lambda: screen.job is not None, "the job")
    return screen


# A series point every sampling tick (0.2 s in tests), not every 5 s: the panels fill in
# a second instead of half a minute, through the same reads.
TICK_POINTS = {"point_interval": 0}


def _gpu_job(name: str) -> dict[str, Any]:
    return {"command": ["sleep", "60"], "gpus": 1, "vram_gb": 8, "name": name}


async def test_a_running_gpu_jobs_usage_fills_as_ticks_come_then_is_stored(
    embedded_app: AppFactory,
) -> None:
    # (only the ledger puts memory on the GPU: the simulated job's own 8 GiB, sampled
    # before the ledger's hold is written, would be its peak)
    app = await embedded_app(
        "2xA100-80GB", config=make_config(usage=TICK_POINTS, simulate={"jobs": False})
    )
    job = await app.backend.submit(_gpu_job("trainer"))
    await eventually(lambda: app.backend.engine.book.live(job["id"]).job.pid, timeout=10)
    act = app.backend.engine.book.live(job["id"])
    SimLedger(app.backend.engine.paths.state_dir).hold(act.job.gpus[0], act.job.pid, 4.0)
    async with app.run_test(size=(140, 40)) as pilot:
        await _open(pilot, job["id"])
        panel = _panel(pilot)
        assert panel.display and panel.expanded  # 40 lines: lines and plots
        await until(pilot, lambda: panel.points >= 3, "a few points")
        gpu = act.job.gpus[0]
        # (a plot row mounts its plots a moment after the read that made it)
        await until(pilot, lambda: panel.query(f"#usage-util-{gpu}"), "the plots")
        vram = panel.query_one(f"#usage-vram-{gpu}", LevelLine)
        util = panel.query_one(f"#usage-util-{gpu}", LevelLine)
        seen = panel.points
        # The sparklines fill as ticks come (each read brings the engine's new points).
        await until(pilot, lambda: panel.points >= seen + 3, "more points", timeout=20)
        await until(pilot, lambda: vram.data and len(vram.data) >= seen + 3, "the VRAM plot")
        assert max(v or 0 for v in vram.data) == 4 * 1024  # MiB: what the job holds
        assert max(v or 0 for v in util.data) == 40  # the simulator's 40 % per process
        text = _text(panel.query_one("#usage-text", FieldList))
        # (the mean may be under 40 %: a tick between the start and the hold read 0 %)
        assert "peak 4.0 GiB" in text and "util mean " in text and "GPU-" in text
        assert "live" in str(panel.border_subtitle)
        # The job ends: one more read, its stored usage, and the reads stop.
        await app.backend.cancel(job["id"])
        await until(pilot, lambda: not panel.active, "the stored usage", timeout=20)
        assert "stored" in str(panel.border_subtitle)
        stored = panel.points
        assert stored >= seen + 3
        assert str(panel.border_subtitle).startswith(f"{stored} points over ")
        # One point has no span ("1 points over 0s" was said: tester h131).
        one = {**panel.usage["series"][0], "t": [0.0]}
        panel.usage = {**panel.usage, "series": [one]}
        panel._update_subtitle()
        assert str(panel.border_subtitle) == "1 point · stored · u: fewer"
        # Small screens show one line; u shows the lines and plots (and hides them again).
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: not panel.expanded, "one line at 80x24")
        line = _text(panel.query_one("#usage-line", Static))
        assert "peak 4.0 GiB" in line and "util " in line and " Wh" in line
        await pilot.press("u")
        assert panel.expanded
        await pilot.press("u")
        assert not panel.expanded


async def test_a_finished_jobs_stored_usage_and_a_cpu_job_without_any(
    embedded_app: AppFactory,
) -> None:
    # (only the ledger puts memory on the GPU: the simulated job's own 8 GiB, sampled
    # before the ledger's hold is written, would be its peak)
    app = await embedded_app(
        "2xA100-80GB", config=make_config(usage=TICK_POINTS, simulate={"jobs": False})
    )
    engine = app.backend.engine
    job = await app.backend.submit(_gpu_job("finished"))
    await eventually(lambda: engine.book.live(job["id"]).job.pid, timeout=10)
    act = engine.book.live(job["id"])
    SimLedger(engine.paths.state_dir).hold(act.job.gpus[0], act.job.pid, 2.5)

    async def some_points() -> bool:
        usage = await app.backend.usage(job["id"])
        return bool(usage["series"]) and len(usage["series"][0]["t"]) >= 3

    await eventually(some_points, timeout=20)
    await app.backend.cancel(job["id"])

    async def ended() -> bool:
        return (await app.backend.job(job["id"]))["job"]["status"] == "cancelled"

    await eventually(ended, timeout=20)
    cpu = await app.backend.submit({"command": ["sleep", "60"], "gpus": 0, "name": "cpu"})
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await _open(pilot, job["id"])
        panel = _panel(pilot)
        await until(pilot, lambda: panel.points >= 3, "the stored series")
        assert not panel.active and "stored" in str(panel.border_subtitle)
        assert "peak 2.5 GiB" in _text(panel.query_one("#usage-text", FieldList))
        await pilot.press("escape")
        screen = await _open(pilot, cpu["id"])
        await until(pilot, lambda: screen.query_one(Timeline).events, "the timeline")
        assert not _panel(pilot).display  # a CPU job: no usage panel
        assert not screen.check_action("toggle_usage", ())
        assert _panel(pilot).usage is None  # and no usage was asked for
        await app.backend.cancel(cpu["id"])


async def test_the_usage_panel_survives_the_engine_going_away(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    submitted = served.cli("submit", "--gpus", "1", "--", "sleep", "60")
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout)
    backend = SocketBackend(resolve_paths())
    app = build_app(backend, refresh_interval=0.05)
    async with app.run_test(size=(140, 40)) as pilot:
        await _open(pilot, job_id)
        await until(
            pilot, lambda: app.screen.job and app.screen.job["status"] == "running", "running"
        )
        assert served.proc is not None
        served.proc.kill()
        served.proc.wait()

        panel = _panel(pilot)
        await until(
            pilot,
            lambda: "no engine answers" in str(panel.border_subtitle),
            "the lost engine said on the panel",
            timeout=20,
        )
        assert isinstance(app.screen, JobDetailScreen) and app.screen.is_attached
        # (not in a toast: the header says it, and a background read's toast read as if
        # the user had asked something: tester h91)
        assert not [n for n in app._notifications if n.title == f"usage of job {job_id}"]
    await backend.close()


async def test_an_idle_gpu_job_is_counted_on_the_dashboard_and_warned_in_its_detail(
    embedded_app: AppFactory,
) -> None:
    # The job's simulated process keeps its GPU 0 % busy ([simulate]): idle at once.
    config = make_config(policy={"idle_after": 1}, simulate={"utilization": 0})
    app = await embedded_app("2xA100-80GB", config=config)
    job = await app.backend.submit(_gpu_job("idler"))
    async with app.run_test(size=(140, 40)) as pilot:
        counts = app.screen.query_one(SummaryLine)
        await until(pilot, lambda: "1 idle" in str(counts.counts()), "the idle count", timeout=20)
        await _open(pilot, job["id"])
        panel = _panel(pilot)
        await until(
            pilot,
            lambda: (
                "warning    idle: its GPUs were under 5%"
                in _text(panel.query_one("#usage-text", FieldList))
            ),
            "the warning in the usage",
        )
        await app.backend.cancel(job["id"])
        await pilot.press("escape")
        await until(pilot, lambda: "idle" not in str(counts.counts()), "no idle job left")


def _row(pilot: Pilot[Any], job_id: int) -> list[str]:
    table = pilot.app.screen.query_one(JobTable)
    return [str(cell) for cell in table.get_row(str(job_id))]


async def test_wide_tables_show_what_gpu_jobs_used() -> None:
    app = _static_app()
    async with app.run_test(size=(180, 30)) as pilot:
        await pilot.press("2")
        table = await until(
            pilot, lambda: app.screen.query(JobTable) and app.screen.query_one(JobTable)
        )
        await until(pilot, lambda: table.row_count == 10, "rows")
        labels = [str(c.label).split()[0] for c in table.ordered_columns]
        assert labels[labels.index("VRAM") + 1 :][:3] == ["PEAK", "UTIL", "ENERGY"]
        assert _row(pilot, 10)[labels.index("PEAK") : labels.index("ENERGY") + 1] == [
            "20.0",
            "63%",
            "118.5Wh",
        ]
        assert _row(pilot, 3)[labels.index("PEAK")] == ""  # a CPU job used no GPU
        await pilot.resize_terminal(140, 30)  # narrower: no usage columns
        await until(pilot, lambda: len(table.ordered_columns) == len(labels) - 3, "fewer")


# -- snapshots (fixed data, fixed clock) ----------------------------------------------------


def _static_app() -> Any:
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW)
    app.cursor_blink = False
    return app


def _detail(job_id: int, *keys: str) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        screen = await _open(pilot, job_id)
        await until(pilot, lambda: screen.query_one(Timeline).events, "the timeline")
        await until(pilot, lambda: _panel(pilot).points > 0, "the usage")
        if job_id == 10:
            await until(pilot, lambda: screen.query_one(LogTail).line_count == 2, "log lines")
        if keys:
            await pilot.press(*keys)
        await pilot.pause()

    return run_before


def test_snapshot_usage_one_line_80x24(snap_compare: Any) -> None:
    assert snap_compare(_static_app(), terminal_size=(80, 24), run_before=_detail(10))


def test_snapshot_usage_expanded_80x24(snap_compare: Any) -> None:
    assert snap_compare(_static_app(), terminal_size=(80, 24), run_before=_detail(10, "u"))


def test_snapshot_usage_running_200x50(snap_compare: Any) -> None:
    assert snap_compare(_static_app(), terminal_size=(200, 50), run_before=_detail(10))


def test_snapshot_usage_stored_with_advice_and_idle_warning_120x40(snap_compare: Any) -> None:
    assert snap_compare(_static_app(), terminal_size=(120, 40), run_before=_detail(14))


async def test_usage_lines_share_a_fixed_scale_and_leave_gaps() -> None:
    # Textual's Sparkline scaled each series from its own lowest value: a steady 70 %
    # drew as empty bars, like an idle GPU, and an unknown reading as 0.
    from textual.app import App, ComposeResult

    class Lines(App[None]):
        def compose(self) -> ComposeResult:
            yield LevelLine((70.0,) * 8, top=100, id="busy")
            yield LevelLine((0.0,) * 8, top=100, id="idle")
            yield LevelLine((100.0, None, 50.0, 0.0), top=100, id="gaps")
            yield LevelLine((2048.0, 4096.0), id="vram")

    app = Lines()
    async with app.run_test(size=(8, 4)):
        drawn = {w.id: w.render_line(0).text for w in app.query(LevelLine)}
    assert drawn == {
        "busy": "▆" * 8,
        "idle": "▁" * 8,
        "gaps": "██  ▅▅▁▁",  # (4 points over 8 cells: each two wide)
        "vram": "▅▅▅▅████",
    }


async def test_a_read_that_comes_while_the_plots_mount_updates_them() -> None:
    # (the plot rows mount their plots a moment after the read that made them; the next
    # read, coming in between, found no plot and the usage reads stopped for good)
    from textual.app import App

    from gpulayer_tui import themes

    def usage(vram: list[int]) -> Any:
        return {
            "summary": None,
            "series": [{"gpu": 1, "t": list(range(len(vram))), "vram_mib": vram, "util": [40]}],
        }

    class PanelApp(App[None]):
        def compose(self) -> Any:
            yield UsagePanel(id="usage")

    app = PanelApp()
    app.register_theme(themes.DARK)  # (its $memory-* colours)
    app.theme = themes.DARK.name
    async with app.run_test(size=(160, 30)) as pilot:
        panel = app.query_one(UsagePanel)
        panel.show(usage([1024]), active=True)
        panel.show(usage([1024, 3072]), active=True)  # before the first read's plots mount
        await pilot.pause()
        vram = panel.query_one("#usage-vram-1", LevelLine)
        assert vram.data == (1024.0, 3072.0)
        assert "peak 3.0 GiB" in str(panel.query_one("#usage-vram-figure-1", Static).render())
