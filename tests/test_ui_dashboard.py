"""The dashboard: panels, memory bar, process table and summary, over a real engine.

Pilot tests run the real embedded engine on simulated GPUs (``ui_app``); a real
``sleep`` process registered in the simulated ledger plays the foreign GPU process.
Snapshots use the static backend with a fixed clock and time zone, so they never change.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpulayer_tui.app import build_app
from gpulayer_tui.engine.config import load_config
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.screens.dashboard import (
    DashboardScreen,
    choose_density,
    full_height,
    grid_columns,
)
from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.widgets.gpu_panel import GpuPanel, RowLayout, graph_lines
from gpulayer_tui.widgets.memory_bar import MemoryBar, split_cells
from gpulayer_tui.widgets.process_table import ProcessTable
from gpulayer_tui.widgets.summary_line import SummaryLine
from tests.conftest import EngineFactory, make_config
from tests.ui_support import FIXED_NOW, StaticBackend, click_head, until

GIB = 1024**3

# -- helpers ----------------------------------------------------------------------------------


def table_keys(app: Any) -> list[str]:
    """Row keys of the process table (``gpu:pid``) in display order."""
    table = app.screen.query_one(ProcessTable)
    return [table.coordinate_to_cell_key((row, 0)).row_key.value for row in range(table.row_count)]


def table_row(app: Any, key: str) -> dict[str, str]:
    """The plain cells of one process-table row, by column key (the columns shown)."""
    table = app.screen.query_one(ProcessTable)
    return dict(zip(table.shown_columns, (str(cell) for cell in table.get_row(key)), strict=True))


def drawn_row(app: Any, key: str) -> str:
    """The process-table row of ``key`` as the table draws it (its rendered line, not
    its data: a cell whose data changed but whose cached render did not shows the old
    value here)."""
    table = app.screen.query_one(ProcessTable)
    row = table.get_row_index(key)
    return table.render_line(row + table.header_height - table.scroll_offset.y).text


def summary_text(app: Any) -> str:
    """The summary line as plain text."""
    return app.screen.query_one(SummaryLine).counts().plain


async def two_processes(
    app: Any, pilot: Any, foreign: Callable[[], int]
) -> tuple[SimLedger, tuple[int, str], tuple[int, str]]:
    """Two foreign processes on the GPUs: 2 GiB on gpu0, 30 GiB on gpu1; the ledger and
    each one's pid and row key."""
    await until(pilot, lambda: app.screen.query(GpuPanel))
    small, big = foreign(), foreign()
    ledger = SimLedger(app.backend.engine.paths.state_dir)
    ledger.hold(0, small, 2.0)
    ledger.hold(1, big, 30.0)
    await app.backend.engine.sampler.sample_once()
    return ledger, (small, f"0:{small}"), (big, f"1:{big}")


@pytest.fixture
def foreign(sleepers: Callable[..., subprocess.Popen[bytes]]) -> Callable[[], int]:
    """Start foreign ``sleep 600`` processes on demand, by their full path (as an
    interpreter in a virtual environment is): their pids."""
    return lambda: sleepers(full_path=True).pid


# -- pure layout helpers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "width", "expected"),
    [
        ([20, 0, 18, 0.5, 41.5], 40, [10, 0, 9, 1, 20]),
        ([0, 0, 0, 0, 80], 10, [0, 0, 0, 0, 10]),
        ([0.001, 0, 0, 0, 80], 10, [1, 0, 0, 0, 9]),
        ([1, 1, 1, 1, 100], 4, [1, 1, 1, 0, 1]),  # too narrow: the largest win
        ([1, 2, 3], 2, [0, 1, 1]),
        ([0, 0, 0], 7, [0, 0, 7]),
        ([5, 5], 0, [0, 0]),
    ],
)
def test_split_cells(sizes: list[float], width: int, expected: list[int]) -> None:
    assert split_cells(sizes, width) == expected


def test_split_cells_always_fills_the_bar_and_shows_every_part() -> None:
    cases = 0
    for width in range(4, 90, 7):
        for a in (0, 1, 7, 40):
            for b in (0, 2, 500):
                for c in (0, 3):
                    sizes = [a * GIB, b * GIB // 100, c * GIB // 10, 80 * GIB - a * GIB]
                    cells = split_cells(sizes, width)
                    assert sum(cells) == width
                    assert all(n >= 1 for n, s in zip(cells, sizes, strict=True) if s > 0)
                    assert all(n == 0 for n, s in zip(cells, sizes, strict=True) if s == 0)
                    cases += 1
    assert cases > 100


def test_graph_lines_scale_and_alignment() -> None:
    assert graph_lines([0.0, 0.5, 1.0], 5, 1) == ["   ▄█"]
    assert graph_lines([1.0, None, 0.5], 3, 2) == ["█  ", "█ █"]
    assert graph_lines([0.25] * 10, 4, 1) == ["▂▂▂▂"]


def test_layout_choices() -> None:
    assert grid_columns(80, 8) == 1
    assert grid_columns(120, 8) == 2
    assert grid_columns(200, 8) == 4
    assert grid_columns(200, 5) == 3  # balanced: 3 + 2, not 4 + 1
    assert grid_columns(200, 1) == 1
    assert choose_density(8, 1, 12) == ("row", 1)  # 80x24
    assert choose_density(2, 1, 12) == ("compact", 1)
    assert choose_density(2, 2, 28) == ("full", 4)  # 120x40
    assert choose_density(8, 4, 48) == ("full", 4)  # 200x60
    assert choose_density(8, 4, 20) == ("full", 2)
    assert full_height(1) == 8


@pytest.mark.parametrize("width", [60, 77, 117, 197])
def test_row_header_lines_up_with_rows(width: int) -> None:
    layout = RowLayout.for_width(width)
    header = GpuPanel.row_header(width).plain
    assert len(header) == width
    assert header.index("MEMORY") == layout.stats


@pytest.mark.parametrize("width", [1, 2, 9, 10, 40])
@pytest.mark.parametrize(
    "name", ["训练模型🚀🔥長い名前の仕事 end", "plain-ascii-name-that-is-long", "e\u0301te"]
)
def test_a_row_cell_takes_its_width_in_terminal_columns(name: str, width: int) -> None:
    # Cut and padded by len(), a name of wide characters pushed the row's POWER and
    # SLOTS columns off the screen.
    from gpulayer_tui.cells import cell_width
    from gpulayer_tui.widgets.gpu_panel import _fit

    assert cell_width(_fit(name, width)) == width


# -- pilot tests over the real engine ---------------------------------------------------------


async def test_a_panel_per_gpu_with_its_model(ui_app: Any) -> None:
    app = await ui_app("1xH200-141GB,1xL4-24GB")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await until(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen)
        panels = await until(pilot, lambda: list(screen.query(GpuPanel)))
        assert [p.domain_name for p in panels] == ["gpu0", "gpu1"]
        await until(pilot, lambda: all(p.domain for p in panels))
        assert panels[0].model == "Simulated H200"
        assert panels[1].model == "Simulated L4"
        assert "gpu0 · Simulated H200" in panels[0].title().plain
        bar = panels[0].query_one(MemoryBar)
        await until(pilot, lambda: "/141.0 GiB" in bar.render().plain)
        assert {p.density for p in panels} == {"full"}
        assert "2 GPUs" in summary_text(app)
        assert "cpu pool" in str(screen.query_one("#cpu-pool").render())
        # A drained cpu pool says why, as a GPU's panel does ("draining" alone: h162).
        await app.backend.engine.domain_ops.drain("cpu", "cpu maint")
        app.gpu_state = await app.backend.gpus()
        line = screen.query_one("#cpu-pool")
        await until(pilot, lambda: "draining (cpu maint)" in str(line.render()), "the reason")


async def test_a_gpu_whose_reads_fail_shows_its_last_figures_as_stale(ui_app: Any) -> None:
    # They read as live: "70% ... 58°C" beside LOST, where the CLI says "70%?  58C?".
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    ledger = SimLedger(engine.paths.state_dir)
    async with app.run_test(size=(160, 40)) as pilot:
        ledger.set_gpu(1, utilization=70, temperature=58)
        await engine.sampler.sample_once()
        panel = await until(pilot, lambda: app.screen.query_one("#panel-gpu1", GpuPanel))
        stats = panel.query_one("#stats")
        await until(pilot, lambda: "70%" in str(stats.render()) and "58°C" in str(stats.render()))
        assert not panel.stale
        live_width = len(str(stats.render()))
        ledger.set_gpu(1, lost=True, error="GPU is lost: fell off the bus")
        await engine.sampler.sample_once()
        await until(pilot, lambda: panel.stale, "the failed read")
        await until(pilot, lambda: "70%?" in str(stats.render()), "the stale mark")
        shown = str(stats.render())
        assert "58C?" in shown and "58°C" not in shown
        assert len(shown) == live_width  # (the bars of the panels stay aligned)
        # Its memory too: used and free are the last read's (free read as live: h197).
        bar = panel.query_one(MemoryBar)
        await until(pilot, lambda: "?" in bar.legend_text(), "the memory's stale mark")
        assert "free " in bar.legend_text() and bar.legend_text().rstrip(" GiB").endswith("?")
        # Its graph has a gap, not the last figures again (from the events and the engine).
        await until(pilot, lambda: app.gpu_history[1][-1][1:] == (None, None), "a gap")
        assert list(engine.sampler.history[1])[-1].utilization is None


async def test_foreign_process_shows_as_unregistered_everywhere(
    ui_app: Any, foreign: Callable[[], int]
) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.screen.query(GpuPanel))
        pid = foreign()
        SimLedger(app.backend.engine.paths.state_dir).hold(1, pid, 20.0)
        await app.backend.engine.sampler.sample_once()
        key = f"1:{pid}"
        await until(pilot, lambda: key in table_keys(app))
        cells = table_row(app, key)
        assert (cells["pid"], cells["gpu"], cells["vram"], cells["owner"]) == (
            str(pid),
            "1",
            "20.0",
            "unregistered",
        )
        # The program's basename and its arguments; the whole line in the tooltip.
        assert cells["command"] == "sleep 600"
        table = app.screen.query_one(ProcessTable)
        table.focus()
        table.move_cursor(row=table.get_row_index(key))
        await pilot.pause()
        assert str(table.tooltip) == f"{shutil.which('sleep')} 600"
        await until(pilot, lambda: "unregistered VRAM 20.0 GiB" in summary_text(app))
        bar = app.screen.query_one("#panel-gpu1", GpuPanel).query_one(MemoryBar)
        await until(pilot, lambda: "unreg 20.0" in bar.legend_text())
        assert "unreg" not in app.screen.query_one("#panel-gpu0").query_one(MemoryBar).legend_text()
        # Narrower, whole figures, then letters, before bare numbers (four panels at 160
        # columns read "21.0 50.0 5.0 4.0", not told apart: tester h194).
        assert bar.legend_text(24) == "own 0 unreg 20 free 60"
        assert bar.legend_text(16) == "o0 u20 f60"


async def test_more_active_jobs_than_a_page_are_counted_by_the_engine(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past a page (10,000) of active jobs, the dashboard counted the rows it had loaded:
    # "10000 queued" of 20,000 (tester h104). A page of 3 here.
    import gpulayer_tui.app

    monkeypatch.setattr(gpulayer_tui.app, "MAX_PAGE", 3)
    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    await engine.pause()
    for _ in range(7):
        await engine.submit({"command": ["true"]})
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.screen.query(GpuPanel))
        assert app.active_partial
        await until(pilot, lambda: summary_text(app).startswith("0 running · 7 queued"))
    await engine.resume()


async def test_submitted_job_counts_as_running_and_enter_opens_it(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.screen.query(GpuPanel))
        assert summary_text(app).startswith("0 running")
        job = await app.backend.submit({"shell": "sleep 30; true", "gpus": 1})
        await until(pilot, lambda: summary_text(app).startswith("1 running"))
        # A child of the job's command (as a CUDA worker process would be) holds memory:
        # it is owned, not unregistered.
        leader = await until(pilot, lambda: app.job_store.jobs.get(job["id"], {}).get("pid"))
        detail = await until(
            pilot,
            lambda: [c.pid for c in psutil.Process(leader).children() if c.name() == "sleep"],
        )
        detail = detail[0]
        gpu = app.job_store.jobs[job["id"]]["gpus"][0]
        SimLedger(app.backend.engine.paths.state_dir).hold(gpu, detail, 6.0)
        await app.backend.engine.sampler.sample_once()
        key = f"{gpu}:{detail}"
        await until(pilot, lambda: key in table_keys(app))
        assert table_row(app, key)["owner"] == f"job {job['id']}"
        assert "sleep 30" in table_row(app, key)["command"]
        table = app.screen.query_one(ProcessTable)
        table.focus()
        table.move_cursor(row=table_keys(app).index(key))
        await pilot.press("enter")
        # The real detail opens, on the owning job (not the process's pid), and loads it.
        screen = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "the detail"
        )
        assert screen.job_id == job["id"]
        await until(pilot, lambda: screen.job is not None, "the job")
        assert screen.job["id"] == job["id"]


async def test_a_new_sample_updates_cells_in_place_and_a_new_order_moves_rows(
    ui_app: Any, foreign: Callable[[], int]
) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(120, 40)) as pilot:
        ledger, (small, small_key), (_big, big_key) = await two_processes(app, pilot, foreign)
        await until(pilot, lambda: table_keys(app) == [big_key, small_key])  # VRAM, largest first
        table = app.screen.query_one(ProcessTable)
        table.focus()
        table.move_cursor(row=1)
        # Same processes, same order: the changed cell is rewritten, the cursor stays put.
        assert "2.0" in drawn_row(app, small_key) and "30.0" in drawn_row(app, big_key)
        ledger.hold(0, small, 4.0)
        await app.backend.engine.sampler.sample_once()
        await until(pilot, lambda: table_row(app, small_key)["vram"] == "4.0", "the new VRAM")
        assert table_keys(app) == [big_key, small_key]
        # Drawn, not only stored: the changed cell's render is new, the others' still right.
        assert "4.0" in drawn_row(app, small_key) and "2.0" not in drawn_row(app, small_key)
        assert "30.0" in drawn_row(app, big_key)
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == small_key
        # A new order: the rows move, and the cursor goes with its process.
        ledger.hold(0, small, 40.0)
        await app.backend.engine.sampler.sample_once()
        await until(pilot, lambda: table_keys(app) == [small_key, big_key], "the new order")
        assert table_row(app, small_key)["vram"] == "40.0"
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == small_key


async def test_the_process_tree_puts_a_job_over_its_processes(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.screen.query(GpuPanel))
        job = await app.backend.submit({"shell": "sleep 30; true", "gpus": 1, "name": "tree"})
        leader = await until(pilot, lambda: app.job_store.jobs.get(job["id"], {}).get("pid"))
        # (its child once it runs sleep: forked, it is a copy of the shell until its exec)
        child = await until(
            pilot,
            lambda: [c.pid for c in psutil.Process(leader).children() if c.name() == "sleep"],
        )
        gpu = app.job_store.jobs[job["id"]]["gpus"][0]
        ledger = SimLedger(app.backend.engine.paths.state_dir)
        ledger.hold(gpu, leader, 2.0)  # the shell and its child both hold GPU memory
        ledger.hold(gpu, child[0], 6.0)
        await app.backend.engine.sampler.sample_once()
        table = app.screen.query_one(ProcessTable)
        await until(pilot, lambda: len(table_keys(app)) == 2, "both rows")
        table.focus()
        await pilot.press("T")
        assert table.tree_view
        keys = [f"job:{job['id']}", f"{gpu}:{leader}", f"{gpu}:{child[0]}"]
        await until(pilot, lambda: table_keys(app)[:3] == keys, "the tree")
        rows = [table_row(app, key) for key in keys]
        assert rows[0]["owner"] == f"job {job['id']}" and rows[0]["command"] == "tree"
        # (the leader's pid is on its own row, under the job's; the job's VRAM is the sum)
        assert rows[0]["pid"] == "" and rows[0]["gpu"] == str(gpu)
        assert rows[0]["vram"] == "8.0" and rows[1]["vram"] == "2.0"
        assert rows[1]["command"].startswith("└─ sh")
        assert rows[2]["command"] == "   └─ sleep 30"
        # The job's line opens the job; a signal asks for one of its processes.
        table.move_cursor(row=0)
        await pilot.press("x")
        assert any(f"job {job['id']}'s line" in n.message for n in app._notifications)
        await pilot.press("enter")
        screen = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "the detail"
        )
        assert screen.job_id == job["id"]
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.query(ProcessTable))
        await pilot.press("T")  # and back to the flat list
        await until(pilot, lambda: not any(k.startswith("job:") for k in table_keys(app)))


def test_snapshot_process_tree(snap_compare: Any) -> None:
    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)

    async def tree(pilot: Any) -> None:
        await settled(2)(pilot)
        await pilot.press("T")
        await until(pilot, lambda: app.screen.query_one(ProcessTable).row_count == 3)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=tree)


async def test_sort_keys_change_the_row_order(ui_app: Any, foreign: Callable[[], int]) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(120, 40)) as pilot:
        _ledger, (small, small_key), (big, big_key) = await two_processes(app, pilot, foreign)
        await until(pilot, lambda: len(table_keys(app)) == 2)
        assert table_keys(app) == [big_key, small_key]  # VRAM, largest first
        table = app.screen.query_one(ProcessTable)
        table.move_cursor(row=1)
        by_pid = [key for _pid, key in sorted([(small, small_key), (big, big_key)])]
        # PID, ascending: three columns left of VRAM (GPU, USER, PID)
        await pilot.press("less_than_sign", "less_than_sign", "less_than_sign")
        assert table_keys(app) == by_pid
        # The cursor stays on the process it was on, wherever the sort puts it.
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == small_key
        await pilot.press("r")  # reversed
        assert table_keys(app) == by_pid[::-1]
        # back to VRAM, its natural order again
        await pilot.press("greater_than_sign", "greater_than_sign", "greater_than_sign")
        assert table_keys(app) == [big_key, small_key]
        await pilot.press("r")  # VRAM, smallest first
        assert table_keys(app) == [small_key, big_key]
        header = [str(c.label) for c in app.screen.query_one(ProcessTable).columns.values()]
        assert "VRAM GiB ▲" in header
        # A click on a head sorts by it, a second the other way (it did nothing: h165).
        await click_head(pilot, table, "pid")
        await until(pilot, lambda: table_keys(app) == by_pid, "by pid on a click")
        assert table.sort_key == "pid"  # (VRAM smallest first had that order too)
        await click_head(pilot, table, "pid")
        await until(pilot, lambda: table_keys(app) == by_pid[::-1], "the other way")


BURNER = """
import time
block = bytearray(300 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident
print("ready", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    pass
"""


async def test_host_cpu_memory_and_elapsed_columns_sort(
    ui_app: Any, foreign: Callable[[], int]
) -> None:
    # Two real processes on the GPUs: an idle sleep started first, then a process that
    # burns a core and holds 300 MiB. Their host CPU %, memory and elapsed time show, and
    # each of those columns sorts (o/O cycle, r reverses).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.screen.query(GpuPanel))
        idle = foreign()
        burner = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BURNER, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            assert burner.stdout is not None and await burner.stdout.readline() == b"ready\n"
            ledger = SimLedger(app.backend.engine.paths.state_dir)
            ledger.hold(0, idle, 30.0)  # the most VRAM: first by default
            ledger.hold(1, burner.pid, 2.0)
            await app.backend.engine.sampler.sample_once()
            await asyncio.sleep(0.5)
            await app.backend.engine.sampler.sample_once()
            idle_key, busy_key = f"0:{idle}", f"1:{burner.pid}"
            await until(pilot, lambda: table_row(app, busy_key)["cpu"] not in ("-", "0.0"))
            table = app.screen.query_one(ProcessTable)
            assert table.shown_columns[4:8] == ("sm", "cpu", "mem", "elapsed")
            busy = table_row(app, busy_key)
            # (some: its share of 2 shared cores depends on the load; "> 20" failed under
            # a parallel suite)
            assert float(busy["cpu"]) > 0
            assert busy["mem"].endswith("M") and int(busy["mem"][:-1]) >= 300
            assert busy["elapsed"].endswith("s")  # seconds old, from the app's clock
            assert table_keys(app) == [idle_key, busy_key]  # VRAM, largest first
            # `>` goes left to right from VRAM: GPU%, CPU%, MEM, ELAPSED.
            await pilot.press("greater_than_sign", "greater_than_sign")  # CPU%: busiest first
            assert table.sort_label == "CPU% ▼"
            assert table_keys(app) == [busy_key, idle_key]
            await pilot.press("greater_than_sign")  # MEM: largest first
            assert table_keys(app) == [busy_key, idle_key]
            await pilot.press("greater_than_sign")  # ELAPSED: longest-running first
            assert table_keys(app) == [idle_key, busy_key]
            assert table.sort_label == "ELAPSED ▼"
            await pilot.press("less_than_sign", "less_than_sign")  # back to CPU%
            assert table.sort_label == "CPU% ▼"
            assert table_keys(app) == [busy_key, idle_key]
            await pilot.press("r")
            assert table_keys(app) == [idle_key, busy_key]
            header = [str(c.label) for c in table.columns.values()]
            assert "CPU% ▲" in header
        finally:
            burner.kill()
            await burner.communicate()


async def test_host_columns_go_first_when_the_table_narrows() -> None:
    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(140, 40)) as pilot:
        table = await until(pilot, lambda: app.screen.query_one(ProcessTable))
        await until(pilot, lambda: table.row_count == 2)
        seen = []
        for width in range(140, 69, -2):
            await pilot.resize_terminal(width, 40)
            await pilot.pause()
            shown = table.shown_columns
            optional = tuple(k for k in shown if k in ("sm", "cpu", "mem", "elapsed"))
            # ELAPSED goes first, then MEM, then CPU%, then GPU%; the rest always stays.
            assert optional == ("sm", "cpu", "mem", "elapsed")[: len(optional)], width
            assert len(shown) == 6 + len(optional)
            command = next(c for c in table.columns.values() if c.key == "command")
            if optional:
                assert command.width >= 24, width  # COMMAND keeps a useful width
            seen.append(len(optional))
        assert seen[0] == 4 and seen[-1] == 0 and seen == sorted(seen, reverse=True)
        # `o` and `O` go through the columns shown, a hidden one skipped (sorted by one,
        # the order had no column and no arrow to explain it).
        await pilot.resize_terminal(80, 40)
        await pilot.pause()
        shown = table.shown_columns
        assert "elapsed" not in shown and "command" in shown
        # Narrow: USER and OWNER as wide as their words, COMMAND the rest (they kept 10
        # and 12 cells for "ana" and "job 10", and COMMAND was cut: tester h87).
        widths = {c.key.value: c.width for c in table.columns.values()}
        owners = [table_row(app, key)["owner"] for key in ("0:5010", "1:4242")]
        assert widths["user"] == 4 and widths["owner"] == max(5, *map(len, owners))
        assert widths["command"] >= 24, widths
        for key in ("o", "O"):
            labels = []
            visited = []
            for _ in range(len(shown)):
                await pilot.press(key)
                visited.append(table.sort_key)
                labels.append(table.sort_label.split(" ▲")[0].split(" ▼")[0])
                assert table.sort_key in shown, labels
                header = [str(c.label) for c in table.columns.values()]
                assert any(label.endswith(("▲", "▼")) for label in header), labels
            assert len(set(labels)) == len(shown)  # each shown column once, then round
            # ... in the order they stand, left to right (`O`: right to left); it jumped
            # about the table (tester h87).
            start = shown.index(visited[-1])
            order = shown[start + 1 :] + shown[: start + 1]
            assert tuple(visited) == (order if key == "o" else order[::-1][1:] + order[-1:])
        # The fixed data's figures; ELAPSED from the app's clock (FIXED_NOW).
        await pilot.resize_terminal(140, 40)
        await pilot.pause()
        stray = table_row(app, "1:4242")
        assert (stray["cpu"], stray["mem"], stray["elapsed"]) == ("3.2", "870M", "2h05m")
        assert (stray["sm"], table_row(app, "0:5010")["sm"]) == ("4", "87")  # GPU%
        assert table_row(app, "0:5010")["elapsed"] == "30m00s"
        assert table_row(app, "0:5010")["mem"] == "3.0G"
        # Sorted by ELAPSED, its header shows the arrow (at 7 cells it had none), and a
        # narrower window keeps the order's column, hiding the next instead (tester h99).
        while table.sort_key != "elapsed":
            await pilot.press("o")
        header = [str(c.label) for c in table.columns.values()]
        assert "ELAPSED ▼" in header, header
        await pilot.resize_terminal(80, 40)
        await pilot.pause()
        assert "elapsed" in table.shown_columns, table.shown_columns
        assert "ELAPSED ▼" in [str(c.label) for c in table.columns.values()]


async def test_eight_gpus_at_80x24(ui_app: Any) -> None:
    app = await ui_app("7xA100-80GB,1xL4-24GB")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.screen.query(GpuPanel)) == 8)
        panels = list(app.screen.query(GpuPanel))
        await until(pilot, lambda: all(p.domain for p in panels))
        assert [p.domain_name for p in panels] == [f"gpu{i}" for i in range(8)]
        assert {p.density for p in panels} == {"row"}
        await pilot.pause()
        # Every row is on screen, and the process table keeps room under them.
        for panel in panels:
            assert panel.region.height == 1
            assert 0 < panel.region.y < 24
        assert app.screen.query_one(ProcessTable).region.height >= 4
        head = str(app.screen.query_one("#gpu-head").render())
        assert head.split()[:4] == ["GPU", "MODEL", "JOB", "UTIL"]
        # Their models tell them apart ("Simulat…" for every one of them).
        rows = [str(p.query_one("#stats").render()) for p in panels]
        assert rows[0].split()[2].startswith("A100") and rows[7].split()[2].startswith("L4")


# -- pilot tests over the static backend (fast, fixed data) -----------------------------------


async def test_layout_follows_the_terminal_and_v_overrides_it() -> None:
    app = build_app(StaticBackend(n_gpus=8), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        panels = await until(pilot, lambda: list(app.screen.query(GpuPanel)))
        await until(pilot, lambda: all(p.density == "row" for p in panels))
        await pilot.resize_terminal(200, 60)
        await until(pilot, lambda: all(p.density == "full" for p in panels))
        grid = app.screen.query_one("#gpu-grid")
        assert grid.styles.grid_size_columns == 4
        automatic = {p.graph_height for p in panels}
        assert automatic == {4}
        await pilot.press("v")
        # "full" asked for draws the graphs automatic drew (they shrank to 2: tester h87).
        assert {(p.density, p.graph_height) for p in panels} == {("full", 4)}
        await pilot.press("v")
        assert {p.density for p in panels} == {"compact"}
        await pilot.press("v", "v")  # rows, then automatic again
        assert {p.density for p in panels} == {"full"}


async def test_rows_out_of_sight_are_counted_in_the_header() -> None:
    # 8 GPUs at 40x12: three rows shown, and only a one-cell scrollbar said there were
    # more (tester h124).
    app = build_app(StaticBackend(n_gpus=8), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(40, 12)) as pilot:
        panels = await until(pilot, lambda: list(app.screen.query(GpuPanel)))
        while app.screen._density_override != "row":
            await pilot.press("v")
        head = app.screen.query_one("#gpu-head", Static)
        grid = app.screen.query_one("#gpu-grid")

        def hint() -> str:
            text = str(head.render())
            return text[text.index("+") :].strip() if "+" in text else ""

        def shown() -> int:
            bottom = grid.scroll_y + grid.scrollable_content_region.height
            return sum(p.virtual_region.bottom <= bottom for p in panels)

        await until(pilot, lambda: 0 < shown() < 8 and hint(), "some rows out of sight")
        assert hint() == f"+{8 - shown()} more ↓"
        assert head.region.right <= 40  # (on the screen)
        grid.scroll_end(animate=False)
        await until(pilot, lambda: shown() == 8 and not hint(), "the last rows in sight")
        grid.scroll_home(animate=False)
        await until(pilot, lambda: hint() == f"+{8 - shown()} more ↓", "out of sight again")
        await pilot.resize_terminal(120, 40)  # (all in sight)
        await until(pilot, lambda: shown() == 8 and not hint(), "all in sight")


async def test_the_rows_at_60_columns_show_the_memory_figures() -> None:
    # At 60 columns the rows view (chosen there) cut the bar before its USED/TOTAL: no
    # memory figure anywhere (tester h54). POWER gives way below 72.
    app = build_app(StaticBackend(n_gpus=8), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(60, 20)) as pilot:
        panels = await until(pilot, lambda: list(app.screen.query(GpuPanel)))
        await until(pilot, lambda: all(p.density == "row" for p in panels))
        # (the first GPU reading comes a moment after the panels: "no memory reading";
        # under load a panel's bar was seen empty again after all had one: each is waited
        # for, whole, in one condition)

        def figures_shown() -> bool:
            for panel in app.screen.query(GpuPanel):
                shown = panel.query_one(MemoryBar).render().plain
                if "/" not in shown or not shown.rstrip().endswith(".0"):
                    return False
            return True

        await until(pilot, figures_shown, "every panel's USED/TOTAL")
        assert_panels_laid_out(app)


async def test_theme_switch_restyles_the_table() -> None:
    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: table_keys(app))
        table = app.screen.query_one(ProcessTable)
        owner = table.shown_columns.index("owner")
        before = table.get_row("1:4242")[owner].style
        await pilot.press("t")
        await until(pilot, lambda: table.get_row("1:4242")[owner].style != before)
        assert app.theme == "gpulayer-light"


async def test_the_summary_says_its_figures_in_short_words_on_a_narrow_terminal() -> None:
    # At 60 columns the line ended "· unregistered VRAM": its figure was cut off.
    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(60, 20)) as pilot:
        summary = await until(pilot, lambda: app.screen.query_one(SummaryLine))
        counts = summary.query_one("#counts", Static)
        await until(pilot, lambda: "GPUs" in str(counts.render()), "the GPU count")
        shown = str(counts.render())
        assert shown.endswith("unreg 18.0 GiB · 2 GPUs"), shown
        assert "failed ·" in shown and len(shown) <= 58
        await pilot.resize_terminal(140, 20)
        await until(pilot, lambda: "unregistered VRAM 18.0 GiB" in str(counts.render()))
        assert "failed today" in str(counts.render())
        # Refused submissions (over capacity) are said apart: with the runs that failed
        # they add up to the jobs table's "failed" (tester h67).
        assert "1 failed today (+2 refused)" in str(counts.render())


async def test_cpu_only_notice() -> None:
    app = build_app(StaticBackend(n_gpus=0), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        summary = await until(pilot, lambda: app.screen.query_one(SummaryLine))
        await until(pilot, lambda: summary.has_class("-notice"))
        assert "No NVIDIA driver found" in summary.notice().plain
        assert "0 GPUs" in summary_text(app)
        assert not app.screen.query(GpuPanel)


# -- snapshots --------------------------------------------------------------------------------


def settled(n_gpus: int) -> Callable[[Pilot[Any]], Any]:
    """Wait until the dashboard shows every panel, drawn."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app: Any = pilot.app
        await until(pilot, lambda: app.gpu_state is not None)
        await until(pilot, lambda: len(app.screen.query(GpuPanel)) == n_gpus)
        await until(pilot, lambda: all(p.domain for p in app.screen.query(GpuPanel)))
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()

    return run_before


def _snap(snap_compare: Any, n_gpus: int, size: tuple[int, int], theme: str | None = None) -> bool:
    app = build_app(StaticBackend(n_gpus=n_gpus), clock=lambda: FIXED_NOW, theme=theme)
    return bool(snap_compare(app, terminal_size=size, run_before=settled(n_gpus)))


def test_snapshot_no_gpus_80x24(snap_compare: Any) -> None:
    assert _snap(snap_compare, 0, (80, 24))


def test_snapshot_two_gpus_120x40(snap_compare: Any) -> None:
    assert _snap(snap_compare, 2, (120, 40))


def test_snapshot_eight_gpus_80x24(snap_compare: Any) -> None:
    assert _snap(snap_compare, 8, (80, 24))


def test_snapshot_eight_gpus_200x60(snap_compare: Any) -> None:
    assert _snap(snap_compare, 8, (200, 60))


def test_snapshot_two_gpus_light_theme(snap_compare: Any) -> None:
    assert _snap(snap_compare, 2, (120, 40), theme="gpulayer-light")


# -- resizing ---------------------------------------------------------------------------------


def assert_panels_laid_out(app: Any) -> None:
    """Layout invariants of the GPU panels at the app's current size."""
    panels = list(app.screen.query(GpuPanel))
    assert panels
    densities = {p.density for p in panels}
    assert len(densities) == 1, densities
    density = densities.pop()
    heights = {p.region.height for p in panels}
    assert len(heights) == 1, f"panels of different heights: {heights}"
    for panel in panels:
        inner = panel.content_region
        stats = panel.query_one("#stats")
        graphs = panel.query_one("#graphs")
        assert stats.region.right <= inner.right, (panel.domain_name, stats.region, inner)
        if density == "row":
            assert panel.region.height == 1
            continue
        if density == "compact":
            assert not graphs.display or graphs.region.height == 0
            continue
        # full: both graphs there, graph_height lines each, inside the panel.
        assert graphs.display and graphs.region.height == 2 * panel.graph_height
        assert inner.contains_region(graphs.region), (panel.domain_name, graphs.region, inner)
        lines = [line.label + line.bars for line in graphs.lines]
        assert len(lines) == 2 * panel.graph_height
        # (each graph's top row says its scale, the next what it is; one row: only that)
        names = ("100% ", "util ") if panel.graph_height > 1 else ("util ",)
        assert tuple(line[:5] for line in lines[: len(names)]) == names, lines[:2]
        mem = lines[panel.graph_height : panel.graph_height + len(names)]
        assert mem[-1].startswith("mem  ") and (len(mem) == 1 or mem[0][4] == " "), mem
        assert all(len(line) <= graphs.region.width for line in lines)
        assert panel.region.height == full_height(panel.graph_height)


async def test_panels_mend_after_any_sequence_of_resizes(ui_app: Any) -> None:
    app = await ui_app("8xA100-80GB")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.screen.query(GpuPanel)) == 8)
        await until(pilot, lambda: all(p.domain for p in app.screen.query(GpuPanel)))
        await pilot.pause()
        assert_panels_laid_out(app)
        for size in [(200, 50), (80, 24), (200, 50), (120, 40), (80, 24), (200, 50), (100, 30)]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()
            assert app.size == size
            assert_panels_laid_out(app)
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert {p.density for p in app.screen.query(GpuPanel)} == {"full"}


async def test_panels_name_the_job_holding_each_gpu_as_text(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.screen.query(GpuPanel)) == 2)
        name = "[b]big[/b] run"  # markup in a name is shown as typed
        job = await app.backend.submit(
            {"command": ["sleep", "30"], "gpus": 1, "domain": "gpu1", "name": name}
        )
        panel = app.screen.query_one("#panel-gpu1", GpuPanel)
        jobs = panel.query_one("#jobs")
        await until(pilot, lambda: f"job {job['id']} {name}" in str(jobs.render()))
        assert str(app.screen.query_one("#panel-gpu0").query_one("#jobs").render()) == "no job"
        # The header keeps the word "simulated" at 80 columns (the location gives way).
        backend = app.screen.query_one("#backend")
        await until(pilot, lambda: "simulated" in str(backend.render()))
        assert backend.region.width > 0 and backend.region.right <= 80
        # In the one-line rows of 8 GPUs, the JOB column names it too.
        await pilot.press("v", "v", "v")  # full, compact, rows
        await until(pilot, lambda: panel.density == "row")
        stats = str(panel.query_one("#stats").render())
        assert f" {job['id']} [b]" in stats
        assert "JOB" in str(app.screen.query_one("#gpu-head").render())
        await app.backend.cancel(job["id"])


def resized(n_gpus: int, *sizes: tuple[int, int]) -> Callable[[Pilot[Any]], Any]:
    """Settle, then resize through ``sizes`` (settling after each)."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await settled(n_gpus)(pilot)
        for size in sizes:
            await pilot.resize_terminal(*size)
            await settled(n_gpus)(pilot)

    return run_before


def test_snapshot_eight_gpus_80x24_after_resizes(snap_compare: Any) -> None:
    app = build_app(StaticBackend(n_gpus=8), clock=lambda: FIXED_NOW)
    run_before = resized(8, (200, 50), (80, 24))
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_snapshot_eight_gpus_200x50_after_resizes(snap_compare: Any) -> None:
    app = build_app(StaticBackend(n_gpus=8), clock=lambda: FIXED_NOW)
    run_before = resized(8, (80, 24), (200, 50))
    assert snap_compare(app, terminal_size=(200, 50), run_before=run_before)


async def test_a_gpu_without_a_domain_is_shown_with_its_load_and_processes(
    ui_app: Any, foreign: Callable[[], int]
) -> None:
    # `auto_domains = false` and one domain: the other GPU is not the engine's to schedule
    # on, but its load, memory and processes are the machine's (it was left out).
    config = make_config(engine={"auto_domains": False}, domains={"train": {"gpu": 0}})
    app = await ui_app("2xA100-80GB", config=config)
    async with app.run_test(size=(120, 40)) as pilot:
        panels = await until(
            pilot, lambda: len(app.screen.query(GpuPanel)) == 2 and list(app.screen.query(GpuPanel))
        )
        assert [p.domain_name for p in panels] == ["train", "gpu 1"]
        other = panels[1]
        await until(pilot, lambda: other.domain)
        assert other.health() == ("○", "no domain", "$text-muted")
        assert other.title().plain == "gpu 1 · Simulated A100 · no domain: not managed"
        pid = foreign()
        SimLedger(app.backend.engine.paths.state_dir).hold(1, pid, 20.0)
        await app.backend.engine.sampler.sample_once()
        await until(pilot, lambda: f"1:{pid}" in table_keys(app))
        assert table_row(app, f"1:{pid}")["owner"] == "no domain"
        bar = other.query_one(MemoryBar)
        await until(pilot, lambda: "others 20.0" in bar.legend_text())
        assert "/80.0 GiB" in bar.render().plain
        assert "slots -" in str(other.query_one("#stats").render())
        # Its memory is nobody's to adopt here: the total counts the domains' GPUs only.
        await until(pilot, lambda: "unregistered VRAM 0.0 GiB" in summary_text(app))
        assert summary_text(app).endswith("1 GPU (+1 without a domain)")


async def test_a_gpu_gone_with_a_job_still_on_it_shows_as_missing(
    make_engine: EngineFactory, embedded_app: Any
) -> None:
    # Gone while no engine ran, with a job still running there: no panel said so.
    first = await make_engine("2xA100-80GB")
    running = await first.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    await first.stop()
    app = await embedded_app("1xA100-80GB")
    async with app.run_test(size=(120, 40)) as pilot:
        panels = await until(
            pilot, lambda: len(app.screen.query(GpuPanel)) == 2 and list(app.screen.query(GpuPanel))
        )
        gone = panels[1]
        await until(pilot, lambda: gone.domain)
        assert gone.health() == ("✖", "MISSING", "$text-error")
        # (the domain it was and its UUID: it said "unknown GPU")
        assert gone.title().plain.startswith("gpu 1 · was gpu1 · "), gone.title().plain
        assert gone.title().plain.endswith(
            f"not found by the driver; still running there: job {running.id}"
        )
        # Counted once, as missing (it was "+1 without a domain" too: tester h118).
        await until(pilot, lambda: "missing" in summary_text(app))
        assert summary_text(app).endswith("1 GPU (1 missing: gpu1; jobs needing it wait)")


async def test_a_gpu_missing_since_the_last_engine_is_said_in_the_summary(
    make_engine: EngineFactory, embedded_app: Any
) -> None:
    # Jobs that need it wait for it (it may come back): the header said "1 GPU", and
    # nothing on screen told why a 2-GPU job waited.
    first = await make_engine("2xA100-80GB")
    await first.stop()
    app = await embedded_app("1xA100-80GB")
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: "GPU" in summary_text(app) and "missing" in summary_text(app))
        assert summary_text(app).endswith("1 GPU (1 missing: gpu1; jobs needing it wait)")


async def test_a_missing_gpu_whose_name_is_another_gpus_now_is_told_by_its_uuid(
    make_engine: EngineFactory, embedded_app: Any
) -> None:
    # Two A100s gone and four H100s in their place: "2 missing: gpu0, gpu1" was said while
    # gpu0 and gpu1 (the new GPUs under those names) ran jobs (tester h115).
    first = await make_engine("2xA100-80GB")
    gone = {d.name: d.gpu_uuid for d in first.scheduler.gpu_domains}
    await first.stop()
    app = await embedded_app("4xH100-80GB")
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: "missing" in summary_text(app))
        said = [f"{name}'s old GPU {uuid[:12]}…" for name, uuid in sorted(gone.items())]
        assert summary_text(app).endswith(
            f"4 GPUs (2 missing: {', '.join(said)}; jobs needing them wait)"
        ), summary_text(app)
        assert len({uuid for uuid in gone.values()}) == 2


async def test_gpu_panels_change_while_the_dashboard_is_hidden(
    embedded_app: Any, paths: Any
) -> None:
    # A domain kept and one gone (or back) while another screen was shown: on return the
    # new panels were mounted beside the old ones, and the app ended on DuplicateIds.
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text("[domains.train]\ngpu = 0\n")
    app = await embedded_app("2xA100-80GB", config=load_config(paths.config_file))
    engine = app.backend.engine
    await engine.config_reload.stop()  # (applied by hand below, not by the watcher)

    def panels() -> list[str]:
        return [p.domain_name for p in app.screen.query(GpuPanel)]

    def told() -> list[str]:  # (what the app's GPU state says, in GPU order)
        state = app.gpu_state or {}
        named = [(d["gpu_index"], d["name"]) for d in state.get("domains", [])]
        named += [
            (g["gpu_index"], f"gpu {g['gpu_index']}") for g in state.get("gpus_without_domain", [])
        ]
        return [name for index, name in sorted(n for n in named if n[0] is not None)]

    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: panels() == ["train", "gpu1"])
        for config, shown in (
            ("[engine]\nauto_domains = false\n[domains.train]\ngpu = 0\n", ["train", "gpu 1"]),
            ("[domains.train]\ngpu = 0\n", ["train", "gpu1"]),
            ("[domains.train]\ngpu = 0\n[domains.x]\ngpu = 1\n", ["train", "x"]),
            ("[domains.train]\ngpu = 1\n[domains.x]\ngpu = 0\n", ["x", "train"]),  # swapped
        ):
            await pilot.press("2")
            await until(pilot, lambda: not isinstance(app.screen, DashboardScreen))
            paths.config_file.write_text(config)
            assert (await engine.config_reload.reload())["applied"]
            await engine.sampler.sample_once()
            await until(pilot, lambda s=shown: told() == s)  # (the hidden dashboard is told)
            await pilot.press("1")
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
            await until(pilot, lambda s=shown: panels() == s, what=f"panels {shown}")
            assert app.is_running
