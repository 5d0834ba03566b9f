"""The jobs table draws its cells on a short path of its own (for PageDown speed): the
segments must be the very ones DataTable's general path makes, for every cell, column
layout, cursor and hover state, and odd text (cut with an ellipsis, wide characters,
spaces at the ends, empty cells)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.segment import Segment
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from gpulayer_tui.job_store import JobStore
from gpulayer_tui.widgets.job_table import JobTable
from tests.ui_support import FIXED_NOW, jobs_fixture


def _odd_jobs() -> list[dict[str, Any]]:
    jobs = jobs_fixture()
    base = dict(jobs[0])
    odd = [
        {"name": "x" * 300, "message": "a very long message " * 20},
        {"name": "训练-模型-大型-数据集-第二轮", "message": "显存不足 " * 10},
        {"name": "  spaced  ", "message": "  trailing  "},
        {"name": "", "message": ""},
        {"name": "[bold]not markup[/]", "message": "100% [red]done[/red]"},
    ]
    top = max(j["id"] for j in jobs)
    for n, extra in enumerate(odd, 1):
        jobs.append({**base, **extra, "id": top + n})
    return jobs


class _TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield JobTable(clock=lambda: FIXED_NOW)


def _both(table: JobTable, row: int, column: int, width: int, **state: Any) -> tuple[Any, Any]:
    style = table.rich_style
    table._cell_render_cache.clear()
    ours = table._render_cell(row, column, style, width, **state)
    table._cell_render_cache.clear()
    theirs = DataTable._render_cell(table, row, column, style, width, **state)
    table._cell_render_cache.clear()
    return ours, theirs


def _plain(lines: list[list[Segment]]) -> list[list[tuple[str, Any]]]:
    return [[(seg.text, seg.style) for seg in line] for line in lines]


@pytest.mark.parametrize("width", [200, 140, 90, 60])
async def test_cells_are_drawn_as_datatable_draws_them(width: int) -> None:
    store = JobStore()
    store.load(_odd_jobs())
    app = _TableApp()
    async with app.run_test(size=(width, 30)) as pilot:
        table = app.query_one(JobTable)
        table.sync(store, 0)
        await pilot.pause()
        columns = [c.get_render_width(table) for c in table.ordered_columns]
        checked = 0
        for row in range(table.row_count):
            for column, cell_width in enumerate(columns):
                for state in ({}, {"cursor": True}, {"hover": True}):
                    ours, theirs = _both(table, row, column, cell_width, **state)
                    assert _plain(ours) == _plain(theirs), (row, column, state)
                    checked += 1
        assert checked > 100
        # The header and a row label still take DataTable's own path.
        ours, theirs = _both(table, -1, 0, columns[0])
        assert _plain(ours) == _plain(theirs)


async def test_the_next_page_is_drawn_ahead_as_a_draw_would_draw_it() -> None:
    store = JobStore()
    jobs = jobs_fixture()
    base = dict(jobs[0])
    store.load([{**base, "id": n, "name": f"job-{n}"} for n in range(1, 301)])
    app = _TableApp()
    async with app.run_test(size=(140, 30)) as pilot:
        table = app.query_one(JobTable)
        table.sync(store, 0)
        await pilot.pause()
        table.focus()
        drawn: list[int] = []
        draw = table._cell_segments

        def counting(*args: Any) -> Any:
            drawn.append(args[1])  # the row index
            return draw(*args)

        table._cell_segments = counting  # type: ignore[method-assign]
        await pilot.press("pagedown")
        await pilot.pause()
        page = table.scrollable_content_region.height
        top = int(table.scroll_y)
        # After the frame: the page below was drawn ahead.
        assert set(range(top + page, top + 2 * page)) - {table.cursor_row} <= set(drawn)
        drawn.clear()
        await pilot.press("pagedown")
        await pilot.pause()
        shown = set(range(int(table.scroll_y), int(table.scroll_y) + page))
        # Showing it drew none of its cells again, but the cursor's row (another style).
        assert not (set(drawn) & shown) - {table.cursor_row}
        # And what shows is what a table without anything drawn ahead shows.
        ahead = [table.render_line(y) for y in range(table.size.height)]
        for cache in (table._cell_render_cache, table._row_render_cache, table._line_cache):
            cache.clear()
        fresh = [table.render_line(y) for y in range(table.size.height)]
        assert [list(s) for s in ahead] == [list(s) for s in fresh]
        # Scrolling up draws the page above ahead.
        drawn.clear()
        await pilot.press("pageup")
        await pilot.pause()
        top = int(table.scroll_y)
        assert set(range(max(0, top - page), top)) - {table.cursor_row} <= set(drawn)


@pytest.mark.parametrize(("width", "name_cells"), [(220, 28), (180, 16), (140, 16)])
async def test_a_wide_terminal_gives_names_more_room(width: int, name_cells: int) -> None:
    # At 200 columns a 20-character name was cut at 16, beside a message with room to spare.
    store = JobStore()
    jobs = jobs_fixture()
    jobs[0] = {**jobs[0], "name": "sweep-lr3e-4-bs512-seed7"}  # (24 characters)
    store.load(jobs)
    app = _TableApp()
    async with app.run_test(size=(width, 30)) as pilot:
        table = app.query_one(JobTable)
        table.sync(store, 0)
        await pilot.pause()
        name = next(c for c in table.ordered_columns if str(c.key.value) == "name")
        assert name.get_render_width(table) - 2 * table.cell_padding == name_cells
        column = list(table.columns).index(name.key)
        lines = table._render_cell(0, column, table.rich_style, name.get_render_width(table))
        shown = "".join(seg.text for seg in lines[0]).strip()
        whole = name_cells >= len("sweep-lr3e-4-bs512-seed7")
        assert shown == ("sweep-lr3e-4-bs512-seed7" if whole else "sweep-lr3e-4-bs…"), shown
