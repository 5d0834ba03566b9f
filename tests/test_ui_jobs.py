"""Jobs UI: the table, the detail view, the submit form and cancelling.

Pilot tests drive the real app over a real embedded engine on simulated GPUs; the
10,000-row test feeds a JobTable directly; snapshots use the fixed StaticBackend data.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.app import App, ComposeResult
from textual.content import Content
from textual.pilot import Pilot
from textual.widgets import Input, Label
from textual.widgets.data_table import ColumnKey

from gpulayer_tui.backend import BackendError
from gpulayer_tui.job_store import JobStore
from gpulayer_tui.screens.dashboard import DashboardScreen
from gpulayer_tui.screens.dialogs import ConfirmScreen
from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.screens.jobs import JobsScreen
from gpulayer_tui.screens.submit import SubmitScreen
from gpulayer_tui.widgets.field_list import FieldList
from gpulayer_tui.widgets.job_columns import SORTS
from gpulayer_tui.widgets.job_table import JobTable
from gpulayer_tui.widgets.log_tail import LogTail
from gpulayer_tui.widgets.timeline import Timeline
from gpulayer_tui.widgets.why_panel import WhyPanel
from tests.conftest import eventually, make_config, pid_gone
from tests.ui_support import FIXED_NOW, StaticBackend

# -- helpers --------------------------------------------------------------------------------
from .ui_support import click_head, type_text, until


def table_of(app: App[Any]) -> JobTable:
    screen = app.screen
    assert isinstance(screen, JobsScreen), screen
    return screen.query_one(JobTable)


def cell(table: JobTable, job_id: int, column: str) -> str:
    return str(table.get_cell(str(job_id), column))


def status_of(table: JobTable, job_id: int) -> str | None:
    try:
        return cell(table, job_id, "status")
    except Exception:
        return None


def spec(shell: str, **extra: Any) -> dict[str, Any]:
    return {"shell": shell, "cwd": os.getcwd(), **extra}


async def open_form(pilot: Pilot[Any]) -> SubmitScreen:
    await pilot.press("n")
    screen = await until(
        pilot, lambda: isinstance(pilot.app.screen, SubmitScreen) and pilot.app.screen, "form"
    )
    assert isinstance(screen, SubmitScreen)
    return screen


async def fill(pilot: Pilot[Any], form: SubmitScreen, field: str, text: str) -> None:
    form.query_one(f"#{field}", Input).focus()
    await pilot.pause()
    await type_text(pilot, text)


async def clear(pilot: Pilot[Any], form: SubmitScreen, field: str) -> None:
    form.query_one(f"#{field}", Input).focus()
    await pilot.press("end", "ctrl+u")


def field_error(form: SubmitScreen, field: str) -> str:
    label = form.query_one(f"#{field}-error", Label)
    return str(label.content) if label.has_class("-shown") else ""


# -- with the real engine -------------------------------------------------------------------


async def test_submit_through_the_form_then_follow_it_to_completed(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "echo hello-from-form")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form to close")
        table = table_of(app)
        job_id = await until(pilot, lambda: table.cursor_job_id, "the new row")
        assert cell(table, job_id, "name") == "echo"
        await until(pilot, lambda: status_of(table, job_id) == "completed", "completed row")
        assert cell(table, job_id, "exit") == "0"
        assert form.is_attached is False

        await pilot.press("g", "enter")
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        assert detail.job_id == job_id
        log = detail.query_one(LogTail)
        await until(pilot, lambda: "hello-from-form" in log.lines, "the log line")
        timeline = detail.query_one(Timeline)
        await until(
            pilot,
            lambda: [e["status"] for e in timeline.events][-1:] == ["completed"],
            "the completed transition",
        )
        statuses = [e["status"] for e in timeline.events]
        assert statuses[0] == "pending" and "running" in statuses
        await until(pilot, lambda: "complete" in str(log.border_title), "the drained log")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "back to the table")


async def test_marked_jobs_are_cancelled_together_and_the_rest_go_on(ui_app: Any) -> None:
    """space marks the job under the cursor (and moves down), c cancels every marked job
    in one request after one question that names them, a job that ended cannot be
    marked, a marks ends with its job, and esc unmarks; the unmarked job runs on."""
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(160, 40)) as pilot:
        ended = await app.backend.submit(spec("true", name="quick", gpus=0))
        jobs = [  # (the cpu pool runs two at a time: one on a GPU)
            await app.backend.submit(spec("sleep 600", name=f"sleeper-{n}", gpus=int(n == 0)))
            for n in range(3)
        ]
        await pilot.press("2")
        table = table_of(app)
        for job in jobs:
            await until(pilot, lambda job=job: status_of(table, job["id"]) == "running", "running")
        await until(pilot, lambda: status_of(table, ended["id"]) == "completed", "completed")
        pids = [app.job_store.jobs[job["id"]]["pid"] for job in jobs]

        def count() -> str:
            return str(app.screen.query_one("#jobs-count", Label).render())

        # Newest first: sleeper-2, sleeper-1, sleeper-0, quick. Mark the first two.
        await pilot.press("g", "space", "space")
        assert table.marked == [jobs[2]["id"], jobs[1]["id"]]
        assert table.cursor_job_id == jobs[0]["id"]  # (each space moved down)
        assert cell(table, jobs[2]["id"], "name") == "● sleeper-2"
        assert cell(table, jobs[0]["id"], "name") == "sleeper-0"
        assert count().startswith("2 marked · ")
        # A job that ended is not marked: it says why.
        await pilot.press("down", "space")
        said = f"job {ended['id']} already completed"
        await until(pilot, lambda: any(said in n.message for n in app._notifications), said)
        assert table.marked == [jobs[2]["id"], jobs[1]["id"]]
        # Passed over, the cursor still moves on (it stayed, and every space after it was
        # refused on that row: tester h146). Oldest first, the ended job leads.
        await pilot.press("r", "g")
        await until(pilot, lambda: table.cursor_job_id == ended["id"], "the ended job first")
        await pilot.press("space")
        await until(pilot, lambda: table.cursor_job_id == jobs[0]["id"], "past the ended row")
        assert table.marked == [jobs[2]["id"], jobs[1]["id"]]
        await pilot.press("r")

        await pilot.press("c")
        dialog = await until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, "confirm"
        )
        question = str(dialog.query_one("#question").render())
        assert "sleeper-2" in question and "sleeper-1" in question
        assert "sleeper-0" not in question
        # (SIGKILL only if still running: tester h162)
        assert "The 2 running get SIGTERM, and SIGKILL if still running after the grace" in (
            question
        )
        await pilot.press("y")
        for job in jobs[1:]:
            await until(
                pilot, lambda job=job: status_of(table, job["id"]) == "cancelled", "cancelled"
            )
        for pid in pids[1:]:
            await until(pilot, lambda pid=pid: pid_gone(pid), "the process to go", timeout=15)
        await until(pilot, lambda: not table.marked, "the marks to go")
        assert status_of(table, jobs[0]["id"]) == "running" and not pid_gone(pids[0])
        assert "marked" not in count()

        # * marks every active job shown; esc unmarks them; a job that ends is unmarked.
        await pilot.press("asterisk")
        assert table.marked == [jobs[0]["id"]]
        await pilot.press("escape")
        assert not table.marked
        await pilot.press("asterisk")
        await app.backend.cancel(jobs[0]["id"])
        await until(pilot, lambda: not table.marked, "an ended job's mark to go")
        assert cell(table, jobs[0]["id"], "name") == "sleeper-0"


async def test_cancel_from_the_table_and_from_the_detail(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        first = await app.backend.submit(spec("sleep 600", name="sleeper-1", gpus=0))
        second = await app.backend.submit(spec("sleep 600", name="sleeper-2", gpus=0))
        await pilot.press("2")
        table = table_of(app)
        for job in (first, second):
            await until(pilot, lambda job=job: status_of(table, job["id"]) == "running", "running")
        pid = app.job_store.jobs[first["id"]]["pid"]
        second_pid = app.job_store.jobs[second["id"]]["pid"]
        assert pid and second_pid and not pid_gone(pid)

        # Newest first: the second job is on top; go down to the first one.
        await pilot.press("g", "down")
        assert table.cursor_job_id == first["id"]
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "confirm")
        await pilot.press("y")
        await until(pilot, lambda: status_of(table, first["id"]) == "cancelled", "cancelled row")
        await until(pilot, lambda: pid_gone(pid), "the process to go", timeout=15)
        assert table.cursor_job_id == first["id"]

        # From the detail view: c, then y.
        await pilot.press("g", "enter")
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        assert detail.job_id == second["id"]
        await until(pilot, lambda: detail.job is not None, "the job to load")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "confirm")
        await pilot.press("y")
        await until(
            pilot,
            lambda: detail.job is not None and detail.job["status"] == "cancelled",
            "the detail to show cancelled",
            timeout=15,
        )
        await pilot.press("escape")
        await until(pilot, lambda: status_of(table, second["id"]) == "cancelled", "row update")
        await until(pilot, lambda: pid_gone(second_pid), "the second process to go")

        # Cancelling an ended job is refused politely: no dialog.
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, JobsScreen)


async def test_filter_as_you_type_and_by_status(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        ids = {}
        for name, shell in (
            ("alpha-train", "true"),
            ("beta-eval", "true"),
            ("gamma-train", "true"),
            ("delta", "exit 3"),
        ):
            ids[name] = (await app.backend.submit(spec(shell, name=name, gpus=0)))["id"]
        await pilot.press("2")
        screen = app.screen
        table = table_of(app)
        await until(
            pilot,
            lambda: (
                table.row_count == 4
                and {status_of(table, i) for i in ids.values()} == {"completed", "failed"}
            ),
            "four ended rows",
        )

        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await type_text(pilot, "train")
        await until(pilot, lambda: table.row_count == 2, "the text filter")
        shown = {table.get_row_at(i)[0].__str__() for i in range(table.row_count)}
        assert shown == {str(ids["alpha-train"]), str(ids["gamma-train"])}
        # (matching, not "of" the rows loaded, which an engine restart changed: h105)
        assert str(screen.query_one("#jobs-count", Label).content) == "2 matching jobs"

        # By status and by domain name, too (issue 20): "fail" is delta, "cpu" all four.
        await pilot.press(*["backspace"] * 5)
        await type_text(pilot, "fail")
        await until(pilot, lambda: table.row_count == 1, "the status filter by text")
        assert table.cursor_job_id == ids["delta"]
        await pilot.press(*["backspace"] * 4)
        await type_text(pilot, "cpu")
        await until(pilot, lambda: table.row_count == 4, "the domain filter")
        await pilot.press(*["backspace"] * 3)
        await type_text(pilot, "train")
        await until(pilot, lambda: table.row_count == 2, "the text filter again")

        # By id, too, and escape clears and returns to the table.
        await pilot.press(*["backspace"] * 5)
        await type_text(pilot, str(ids["delta"]))
        await until(pilot, lambda: table.row_count == 1, "the id filter")
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == 4, "the cleared filter")
        assert app.focused is table
        assert not screen.query_one("#filter-row").has_class("-open")

        # f cycles all -> active -> queued -> running -> failed.
        await pilot.press("s")
        assert table.status_filter == "active" and table.row_count == 0
        # (enter dimmed with no row, as c, R and e are: it said "no job selected": h95)
        assert app.screen.check_action("open_job", ()) is None
        await pilot.press("s", "s", "s")
        assert table.status_filter == "failed"
        assert table.row_count == 1 and table.cursor_job_id == ids["delta"]
        assert app.screen.check_action("open_job", ()) is True
        await pilot.press("s")
        assert table.status_filter == "completed" and table.row_count == 3
        await pilot.press("S")
        assert table.status_filter == "failed"

        # Escape clears the text first, then (pressed again) the status filter.
        await pilot.press("slash")
        await type_text(pilot, "zzz")
        await until(pilot, lambda: table.row_count == 0, "no match")
        # The empty table says why (it showed its header alone).
        empty = app.screen.query_one("#jobs-empty")
        await until(pilot, lambda: empty.display, "the empty view's words")
        assert "No job matches this view" in str(empty.render())
        assert "s changes the status shown" in str(empty.render())  # (its key: s, not f)
        await pilot.press("escape")
        assert (table.status_filter, table.filter_text, table.row_count) == ("failed", "", 1)

        # o cycles the sort, r reverses it.
        await pilot.press("escape", "o", "o")
        assert table.sort_key == "priority" and table.sort_reverse  # (the highest first)
        await pilot.press("o")
        assert table.sort_key == "name" and not table.sort_reverse
        assert cell(table, int(str(table.get_row_at(0)[0])), "name") == "alpha-train"
        await pilot.press("r")
        assert cell(table, int(str(table.get_row_at(0)[0])), "name") == "gamma-train"
        await pilot.press("O")
        assert table.sort_key == "priority"


async def test_a_click_on_a_head_sorts_by_it_and_again_the_other_way(ui_app: Any) -> None:
    # A click on a head did nothing: o / O were the only ways (tester h165).
    app = await ui_app("1xA100-80GB")
    async with app.run_test(size=(140, 30)) as pilot:
        for name in ("bee", "ant", "cat"):
            await app.backend.submit(spec("true", name=name, gpus=0))
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: table.row_count == 3, "the rows")

        def names() -> list[str]:
            return [table.job(int(row.key.value))["name"] for row in table.ordered_rows]

        await click_head(pilot, table, "name")
        await until(pilot, lambda: table.sort_key == "name", "sorted by name")
        assert names() == ["ant", "bee", "cat"] and not table.sort_reverse
        await click_head(pilot, table, "name")
        await until(pilot, lambda: table.sort_reverse, "the other way")
        assert names() == ["cat", "bee", "ant"]
        await click_head(pilot, table, "message")  # (no sort: nothing changes)
        assert table.sort_key == "name" and table.sort_reverse
        await click_head(pilot, table, "id")
        await until(pilot, lambda: table.sort_key == "id", "by id, newest first")
        assert names() == ["cat", "ant", "bee"] and table.sort_reverse


async def test_sort_keys_cycle_through_the_columns_shown(ui_app: Any) -> None:
    # At 80 columns STARTED and VRAM are hidden: o / O never pick them (issue 20). A
    # resize that hides the sorted column keeps the order and says so.
    app = await ui_app("1xA100-80GB")
    async with app.run_test(size=(80, 24)) as pilot:
        await app.backend.submit(spec("true", name="one", gpus=0))
        await pilot.press("2")
        screen = app.screen
        table = table_of(app)
        await until(pilot, lambda: table.row_count == 1, "the row")
        bar = screen.query_one("#jobs-view", Label)
        seen = []
        for _ in range(5):
            await pilot.press("o")
            seen.append(table.sort_key)
        assert seen == ["status", "name", "runtime", "id", "status"]
        backwards = []
        for _ in range(4):
            await pilot.press("O")
            backwards.append(table.sort_key)
        assert backwards == ["id", "runtime", "name", "status"]

        await pilot.resize_terminal(140, 30)
        await pilot.pause()
        assert table.visible_sorts == list(SORTS)
        await pilot.press("o", "o", "o", "o", "o")
        assert table.sort_key == "vram"
        # Every sorted column's header keeps its arrow (a long label hid it: "VRAM…").
        for key in SORTS:
            table.set_sort(key)
            await pilot.pause()
            label = table.columns[ColumnKey(key)].label.plain
            width = table.columns[ColumnKey(key)].width
            assert label.endswith(("▲", "▼")) and len(label) <= width, (key, label, width)
            narrow = {
                "exit": "EXIT",
                "started": "STARTED",
                "priority": "PRIO",
                "runtime": "RUNTIME",
            }
            if key in narrow:  # (the arrow right after it, not "E… ▼")
                assert label[:-1] == narrow[key], label
        # Narrow terminals: the table fits the screen, its last column and arrow in view
        # (at 60-65 columns it was wider than the terminal: RUNTIME fell off it).
        for width in (60, 64, 69):
            await pilot.resize_terminal(width, 24)
            await pilot.pause()
            table.set_sort("runtime")
            await pilot.pause()
            assert table.virtual_size.width <= table.size.width, width
            label = table.columns[ColumnKey("runtime")].label.plain
            assert label in ("RUNTIME▲", "RUNTIME▼"), (width, label)
        await pilot.resize_terminal(140, 30)
        table.set_sort("vram")
        await pilot.pause()
        assert "hidden" not in str(bar.content)
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: "hidden" in str(bar.content), "the bar says the column hides")
        assert "VRAM" in str(bar.content) and table.sort_key == "vram"
        # A filter's text comes before the sort: at 80 columns the bar was cut in the
        # sort's note and the filter never showed (tester h70).
        await pilot.press("slash", *"one", "enter")
        await until(pilot, lambda: "filter one" in str(bar.content), "the filter in the bar")
        shown = str(bar.content)
        assert shown.index("filter one") < shown.index("sort") and len(shown) <= 60, shown
        # A long one is cut in the bar (it ran the sort into the count: tester h73).
        await pilot.press("slash", "ctrl+u", *"a-very-long-filter-text-here", "enter")
        await until(pilot, lambda: "filter a-very-long-filter-…" in str(bar.content), "cut")
        assert len(str(bar.content)) <= 64, str(bar.content)
        await pilot.press("slash", "ctrl+u", "enter")
        await until(pilot, lambda: "filter" not in str(bar.content), "the filter cleared")
        await pilot.press("o")  # on to the first shown column after it
        assert table.sort_key == "id" and "hidden" not in str(bar.content)


async def test_a_new_order_is_shown_from_its_first_row(ui_app: Any) -> None:
    # The view stayed on the row the cursor was on: the first rows seen were not the first
    # of the new order, and it read as a wrong sort (tester h67).
    app = await ui_app("1xA100-80GB")
    async with app.run_test(size=(100, 14)) as pilot:
        for n in range(30):
            await app.backend.submit(spec("true", name=f"job-{n:02d}", gpus=0))
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: table.row_count == 30, "the rows")
        for key in ("o", "O", "r"):
            await pilot.press("G")  # (to the last row)
            await until(pilot, lambda: table.cursor_row == 29 and table.scroll_y > 0, "the end")
            await pilot.press(key)
            await until(pilot, lambda: table.cursor_row == 0 and table.scroll_y == 0, key)


async def test_over_capacity_shows_the_engines_message(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "python big.py")
        await fill(pilot, form, "gpus", "3")
        await pilot.press("ctrl+s")
        message = "requested 3 GPUs, but this machine has 2"
        await until(pilot, lambda: message in form.form_message, "the engine's message")
        assert app.screen is form
        assert "(over capacity)" in form.form_message  # (it said "over_capacity": h124)

        await pilot.press("escape")
        table = table_of(app)
        job_id = await until(pilot, lambda: table.cursor_job_id, "the failed row")
        await until(pilot, lambda: status_of(table, job_id) == "failed", "the failed row")
        assert message in cell(table, job_id, "message")
        assert "over capacity" in cell(table, job_id, "message")


async def test_an_over_capacity_message_is_scrolled_into_view(ui_app: Any) -> None:
    # Scrolled down to a late field, the form showed only the message's last line, its
    # title above the view (tester h124).
    from textual.containers import VerticalScroll

    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 20)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "python big.py")
        await fill(pilot, form, "gpus", "3")
        scroller = form.query_one(VerticalScroll)
        scroller.scroll_end(animate=False)
        await pilot.pause()
        assert scroller.scroll_y > 0  # (the form is taller than the window)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "this machine has 2" in form.form_message, "the message")
        box = form.query_one("#form-error")
        await until(
            pilot,
            lambda: scroller.scrollable_content_region.contains_region(box.region),
            "the message in view",
        )


async def test_a_waiting_pinned_job_shows_where_it_may_run(ui_app: Any) -> None:
    # Its DOMAINS cell was empty until it ran; only the detail said "pinned to gpu1"
    # (tester h87).
    app = await ui_app("2xA100-80GB")
    busy = await app.backend.submit(spec("sleep 60", gpus=1, domain="gpu1"))
    pinned = await app.backend.submit(spec("true", gpus=1, domain="gpu1"))
    either = await app.backend.submit(spec("true", gpus=2, domain=["gpu0", "gpu1"]))
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.press("2")
        table = await until(pilot, lambda: isinstance(app.screen, JobsScreen) and table_of(app))
        await until(pilot, lambda: status_of(table, either["id"]) is not None, "rows")
        assert cell(table, busy["id"], "domains") == "gpu1"
        assert cell(table, pinned["id"], "domains") == "gpu1"
        assert cell(table, either["id"], "domains") == "gpu0,gpu1"
        await app.backend.cancel(busy["id"])
        await until(pilot, lambda: status_of(table, pinned["id"]) == "completed", "it ran")


async def test_tab_goes_through_every_field_in_sight_before_the_buttons(ui_app: Any) -> None:
    # The buttons were docked over the fields' bottom: at 80x24 Tab went VRAM -> Submit
    # -> Cancel -> Domain, Enter there submitted a half-filled form, and fields under
    # the bar never came into sight (tester h87).
    from textual.widgets import Button, Checkbox

    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(80, 24)) as pilot:
        for size in ((80, 24), (160, 40), (100, 30)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            form = await open_form(pilot)
            fields = form.query_one("#submit-fields")
            buttons = form.query_one(".buttons")
            order = []
            for _ in range(20):
                focused = pilot.app.focused
                assert focused is not None
                if isinstance(focused, Button):
                    break
                await until(
                    pilot,
                    lambda f=focused, box=fields, bar=buttons: (
                        box.region.contains_region(f.region) and f.region.bottom <= bar.region.y
                    ),
                    f"{focused.id} in sight above the buttons at {size}",
                )
                order.append(focused.id)
                await pilot.press("tab")
                await pilot.pause()
            enabled = [
                w.id
                for w in form.query("#submit-fields Input, #submit-fields Checkbox")
                if not w.disabled and (isinstance(w, (Input, Checkbox)))
            ]
            assert order == enabled, (size, order)
            assert isinstance(pilot.app.focused, Button) and pilot.app.focused.id == "submit"
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(pilot.app.screen, SubmitScreen), "closed")


# (~30 s alone: it types every field; under a loaded full run it passed the 60 s default)
@pytest.mark.timeout(150)
async def test_the_form_sets_a_jobs_project_folder_and_environment(
    ui_app: Any, tmp_path: Path
) -> None:
    # Tester h69: the form had no field for any of them (the CLI's --project, --cwd and
    # --env): a job from the TUI ran where the TUI started, with its environment.
    app = await ui_app("2xA100-80GB")
    folder = tmp_path / "exp 1"
    folder.mkdir()
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, 'echo "$GREETING|$LR|$(pwd)"')
        await fill(pilot, form, "project", "sweep-a")
        await fill(pilot, form, "cwd", str(tmp_path / "missing"))
        assert field_error(form, "cwd") == f"no such folder: {tmp_path / 'missing'}"
        # ctrl+s with it so: the field and its error come into sight (they stayed below
        # the fold under "fix the fields marked in red": tester h73)
        await pilot.resize_terminal(130, 30)
        await until(pilot, lambda: form.size.height <= 30, "the form drawn at its new size")
        form.query_one("#project", Input).focus()
        form.query_one("#submit-fields").scroll_home(animate=False)
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: form.form_message == "fix the fields marked in red")
        error_line = form.query_one("#cwd-error")
        buttons = form.query_one(".buttons")
        dialog = form.query_one("#submit-fields")
        await until(
            pilot,
            lambda: (
                dialog.region.contains_region(error_line.region)
                and error_line.region.bottom <= buttons.region.y
            ),
            "the error line in sight, above the buttons",
        )
        await pilot.resize_terminal(140, 50)
        await clear(pilot, form, "cwd")
        await fill(pilot, form, "cwd", str(folder))
        assert field_error(form, "cwd") == ""
        await fill(pilot, form, "env", "CUDA_VISIBLE_DEVICES=1")
        assert field_error(form, "env") == (
            "CUDA_VISIBLE_DEVICES: the engine sets it to the job's GPUs; ask for GPUs in the "
            "GPUs field (and Domain for which ones)"
        )  # (in the form's words, not the CLI's flags: tester h73)
        await clear(pilot, form, "env")
        await fill(pilot, form, "env", "GREETING='hello there' LR")
        assert field_error(form, "env") == "expected KEY=VALUE, got 'LR'"
        await clear(pilot, form, "env")
        await fill(pilot, form, "env", "A=1 A=2")  # (A=2 was kept without a word: h103)
        assert field_error(form, "env") == "A is given twice, with two values"
        await clear(pilot, form, "env")
        await fill(pilot, form, "env", "FOO='unterminated =x")
        # (shlex's own "No closing quotation": tester h83)
        assert field_error(form, "env") == (
            "a quote is never closed: KEY='a value' needs its closing quote"
        )
        await clear(pilot, form, "env")
        await fill(pilot, form, "env", "GREETING='hello there' LR")
        await type_text(pilot, "=0.1")
        assert field_error(form, "env") == ""
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form to close")
        table = table_of(app)
        job_id = await until(pilot, lambda: table.cursor_job_id, "the new row")
        await until(pilot, lambda: status_of(table, job_id) == "completed", "completed row")
        chunk = await app.backend.read_log(job_id, 0)
        assert chunk.data.decode().strip() == f"hello there|0.1|{folder}"
        spec_of = (await app.backend.job(job_id))["job"]["spec"]
        assert spec_of["project"] == "sweep-a" and spec_of["cwd"] == str(folder)
        assert spec_of["env"]["PATH"] == os.environ["PATH"]  # (over the TUI's environment)


async def test_the_detail_says_a_jobs_project_and_what_it_restarts(ui_app: Any) -> None:
    # `status` said both; the detail neither (tester h74).
    app = await ui_app("2xA100-80GB")
    first = await app.backend.submit(spec("true", project="[i]demo[/i]", gpus=0))
    plain = await app.backend.submit(spec("true", gpus=0))
    async with app.run_test(size=(140, 40)) as pilot:
        await until(
            pilot,
            lambda: app.job_store.jobs.get(first["id"], {}).get("status") == "completed",
            "the first job's end",
        )
        again = (await app.backend.restart(first["id"]))["job"]
        expected = {
            first["id"]: ("[i]demo[/i]", None),
            again["id"]: ("[i]demo[/i]", f"job {first['id']}"),
            plain["id"]: (None, None),
        }
        for job_id, (project, restart) in expected.items():
            app.open_job(job_id)
            detail = await until(
                pilot,
                lambda job_id=job_id: (
                    isinstance(app.screen, JobDetailScreen)
                    and app.screen.job_id == job_id
                    and app.screen
                ),
                "the detail",
            )
            fields = await until(
                pilot,
                lambda detail=detail: next(iter(detail.query("#fields").results(FieldList)), None),
                "the fields block",
            )
            await until(pilot, lambda fields=fields: fields.text("status"), "the fields")
            await until(
                pilot,
                lambda fields=fields, project=project: fields.shown("project") == bool(project),
                "the project shown or not",
            )
            if project:
                assert fields.text("project") == project  # (the user's text, not markup)
            # (a row's spec has no restart_of: it comes with the whole job, fetched after)
            await until(
                pilot,
                lambda fields=fields, restart=restart: fields.shown("restart") == bool(restart),
                "restart of, shown or not",
            )
            if restart:
                assert fields.text("restart") == restart
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, JobDetailScreen), "closed")


async def test_inline_validation_and_engine_errors_submit_nothing(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)

        # As you type, with the CLI's own messages.
        await fill(pilot, form, "gpus", "two")
        assert field_error(form, "gpus") == "expected a whole number, got 'two'"
        assert form.query_one("#gpus", Input).has_class("-invalid")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert field_error(form, "command") == "a command is needed"
        assert app.focused is form.query_one("#command", Input)
        await clear(pilot, form, "gpus")
        assert field_error(form, "gpus") == ""
        await fill(pilot, form, "vram", "-1")
        assert field_error(form, "vram") == "must be greater than 0, got -1"
        await clear(pilot, form, "vram")
        await fill(pilot, form, "after", "1, x")
        assert field_error(form, "after") == "a job id is a number of 1 or more, got 'x'"
        await clear(pilot, form, "after")
        await fill(pilot, form, "gpus", "0")
        await fill(pilot, form, "vram", "8")
        assert field_error(form, "vram") == "VRAM is per GPU, but GPUs is 0 (a CPU job)"
        await clear(pilot, form, "vram")
        await clear(pilot, form, "gpus")

        # What only the engine knows comes back at the top of the form.
        await fill(pilot, form, "command", "true")
        await fill(pilot, form, "after", "999")
        await pilot.press("ctrl+s")
        # (in the form's words: its label, not the spec's depends_on: tester h83)
        await until(pilot, lambda: "Depends on: no job 999" in form.form_message, "the refusal")
        assert form.query_one("#after", Input).has_class("-invalid")
        await clear(pilot, form, "after")
        await fill(pilot, form, "domain", "gpu9")
        # Enter moves to the next field (domain, depends on, timeout, priority, directory,
        # environment; replicas is off for a batch job), then submits.
        await pilot.press("enter", "enter", "enter", "enter", "enter", "enter")
        await until(
            pilot, lambda: "Domain: unknown domain 'gpu9'" in form.form_message, "the refusal"
        )
        assert app.screen is form
        assert await app.backend.jobs() == []


async def test_a_refusal_the_engine_makes_under_load_is_shown_not_raised(ui_app: Any) -> None:
    # Past [limits] active_jobs the engine answers 429. An embedded TUI used to call the
    # engine in-process, where that refusal was not mapped, and the form's worker ended the
    # app (WorkerFailed); one client path now gives both modes the same answer.
    app = await ui_app(config=make_config(limits={"active_jobs": 2}))
    async with app.run_test(size=(140, 40)) as pilot:
        for name in ("first", "second"):
            await app.backend.submit(spec("sleep 600", name=name, gpus=0))
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "true")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "too many active jobs" in form.form_message, "the refusal")
        assert "[limits] active_jobs" in form.form_message
        assert app.is_running and app.screen is form
        assert len(await app.backend.jobs()) == 2


async def test_the_engine_names_the_field_it_refuses_and_the_form_marks_it(
    ui_app: Any,
) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        with pytest.raises(BackendError) as refused:
            await app.backend.submit(spec("true", domain="gpu9"))
        assert refused.value.status == 400 and refused.value.field == "domain"
        with pytest.raises(BackendError) as refused:
            await app.backend.submit(spec("true", gpus=65))
        assert refused.value.field == "gpus" and "gpus: must be from 0 to 64" in str(refused.value)
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "true")
        await fill(pilot, form, "domain", "gpu9")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "unknown domain 'gpu9'" in form.form_message, "the refusal")
        assert form.query_one("#domain", Input).has_class("-invalid")
        assert field_error(form, "domain") == "unknown domain 'gpu9' (known: gpu0, gpu1, cpu)"
        assert form.focused is form.query_one("#domain", Input)


async def test_a_refusal_is_said_where_it_can_be_seen_at_80x24(ui_app: Any) -> None:
    # The engine's message was at the form's top, scrolled away: ctrl+s seemed to do
    # nothing (tester h130).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "sleep 1")
        await fill(pilot, form, "after", "999")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: field_error(form, "after") == "no job 999", "under the field")
        fields = form.query_one("#submit-fields")
        said = form.query_one("#after-error", Label)

        def in_sight() -> bool:
            return fields.region.y <= said.region.y < fields.region.bottom

        await until(pilot, in_sight, "the field's message in sight")
        assert form.focused is form.query_one("#after", Input)
        # One the form cannot put under a field shows the message at the top, in sight.
        await clear(pilot, form, "after")
        await until(pilot, lambda: field_error(form, "after") == "", "cleared")
        await fill(pilot, form, "gpus", "2")
        await fill(pilot, form, "vram", "90")
        await pilot.press("ctrl+s")
        box = form.query_one("#form-error")
        await until(pilot, lambda: "over capacity" in form.form_message, "the refusal")
        await until(pilot, lambda: fields.region.y <= box.region.y, "the message in sight")
        assert app.screen is form


async def test_a_key_typed_right_after_tab_goes_to_the_next_field(ui_app: Any) -> None:
    # Typed fast (or pasted), "-1", tab, "5" read GPUs "-15": tab was a plain binding,
    # run once the key had bubbled up past the form's checks of "-1", and the "5" had
    # gone to GPUs meanwhile (tester h46). Keys are sent here as the terminal driver
    # sends them, all at once, not one per pilot pause.
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        form.query_one("#gpus", Input).focus()
        await pilot.pause()
        for key, char in [("minus", "-"), ("1", "1"), ("tab", None), ("5", "5")]:
            app.post_message(events.Key(key, char))
        await until(pilot, lambda: form.query_one("#vram", Input).value == "5", "VRAM 5")
        assert form.query_one("#gpus", Input).value == "-1"
        # (said once the check of the field left has run: under load, after VRAM's 5)
        await until(pilot, lambda: field_error(form, "gpus") != "", "the GPUs field's error")
        for key, char in [("shift+tab", None), ("end", None), ("backspace", None)]:
            app.post_message(events.Key(key, char))
        await until(pilot, lambda: form.query_one("#gpus", Input).value == "-", "GPUs -")
        assert form.query_one("#vram", Input).value == "5"


async def test_ctrl_s_right_after_typing_sends_what_was_typed(ui_app: Any) -> None:
    # ctrl+s (a priority key, run as the App reads it) right after "5" in the VRAM field
    # sent the job without its VRAM: the "5" still waited in the field's queue (h56).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await fill(pilot, form, "command", "true")
        form.query_one("#vram", Input).focus()
        await pilot.pause()
        for key, char in [("1", "1"), ("2", "2"), ("ctrl+s", None)]:
            app.post_message(events.Key(key, char))
        job = await until(pilot, lambda: next(iter(app.job_store.jobs.values()), None), "a job")
        assert job["spec"].get("vram_gb") == 12, job["spec"]


async def test_keys_typed_right_after_enter_go_to_the_next_field(ui_app: Any) -> None:
    # "sleep 5", enter, "nm" in one burst read "sleep 5nm": enter moved on once the
    # field's message reached the screen, behind the keys typed after it (tester h56).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        form.query_one("#command", Input).focus()
        await pilot.pause()
        burst = [(c, c) for c in "true"] + [("enter", "\r"), ("n", "n"), ("m", "m")]
        for key, char in burst:
            app.post_message(events.Key(key, char))
        name = form.query_one("#name", Input)
        await until(pilot, lambda: name.value == "nm", "the name typed")
        assert form.query_one("#command", Input).value == "true"


async def test_keys_typed_right_after_slash_go_into_the_filter(ui_app: Any) -> None:
    # "/q" in one burst (a paste, a laggy link) quit the app: "/" opened the filter once
    # the key had bubbled up, and the "q" had gone to the table meanwhile (tester h50).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        screen = await until(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen)
        await pilot.pause()
        for key, char in [("slash", "/"), ("q", "q"), ("slash", "/"), ("n", "n")]:
            app.post_message(events.Key(key, char))
        field = screen.query_one("#filter", Input)
        await until(pilot, lambda: field.value == "q/n", "the filter's text")
        assert app.is_running and app.screen is screen


@pytest.mark.parametrize("move", ["home", "down"])
async def test_a_key_reaching_a_screen_still_being_built_waits_for_it(
    ui_app: Any, move: str
) -> None:
    # esc, home, enter in one burst: the terminal's parser hands the lone esc on last, it
    # reached the job's detail before its widgets were, and the app ended in NoMatches
    # (tester h127).
    from gpulayer_tui.screens.job_detail import JobDetailScreen

    app = await ui_app("2xA100-80GB")
    await app.backend.submit({"command": ["sleep", "60"]})
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        screen = await until(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen)
        await until(pilot, lambda: screen.table.row_count > 0, "the job listed")
        shown: list[Any] = []
        app.screen_change_signal.subscribe(screen, shown.append)
        for key, char in [(move, None), ("enter", "\r"), ("escape", "\x1b")]:
            app.post_message(events.Key(key, char))
        # The detail opened, then the esc it got closed it.
        await until(pilot, lambda: [type(s) for s in shown] == [JobDetailScreen, JobsScreen])
        await until(pilot, lambda: not app.key_hold.holding, "let go")
        assert app.is_running and app._exception is None, app._exception
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "it opens again")
        await app.backend.cancel(1)


async def test_keys_typed_after_one_that_opens_a_screen_are_for_that_screen(ui_app: Any) -> None:
    # One burst (a slow link, tmux): "enter c n" opened the detail, and "c" and "n" went
    # past the cancel dialog into a new-job form that ran "c"; "enter j j" opened the job
    # two rows down; ": cancel" lost its first letters to the table (tester h132).
    from gpulayer_tui.screens.job_detail import JobDetailScreen
    from gpulayer_tui.screens.submit import SubmitScreen

    app = await ui_app("2xA100-80GB")
    jobs = [await app.backend.submit({"command": ["sleep", "60"], "gpus": 0}) for _ in range(3)]
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        screen = await until(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen)
        await until(pilot, lambda: screen.table.row_count == 3, "the jobs listed")
        shown: list[Any] = []
        app.screen_change_signal.subscribe(screen, shown.append)

        def burst(*keys: tuple[str, str | None]) -> None:
            for key, char in keys:
                app.post_message(events.Key(key, char))

        top = screen.table.cursor_job_id
        burst(("enter", "\r"), ("c", "c"), ("n", "n"))
        await until(pilot, lambda: ConfirmScreen in [type(s) for s in shown], "the dialog")
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "answered no")
        assert app.screen.job_id == top and not app.key_hold.holding
        assert SubmitScreen not in [type(s) for s in shown], shown
        statuses = [j["status"] for j in await app.backend.jobs()]
        assert "cancelled" not in statuses, statuses
        # esc back, two rows down, that job's detail; then enter j j: the detail of the row
        # the cursor was on (the j's are the detail's), not of the row two down.
        burst(("escape", "\x1b"), ("j", "j"), ("j", "j"), ("enter", "\r"))
        await until(pilot, lambda: [type(s) for s in shown][-2:] == [JobsScreen, JobDetailScreen])
        await until(pilot, lambda: not app.key_hold.holding, "all let go")
        third = screen.table.cursor_job_id
        assert app.screen.job_id == third != top
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, "back")
        await pilot.press("g")
        await until(pilot, lambda: screen.table.cursor_job_id == top, "the first row")
        burst(("enter", "\r"), ("j", "j"), ("j", "j"))
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail")
        await until(pilot, lambda: not app.key_hold.holding, "all let go")
        assert app.screen.job_id == top
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, "back")
        assert screen.table.cursor_job_id == top  # (the j's did not reach the table)
        burst(("colon", ":"), *((c, c) for c in "cancel"))
        await until(pilot, lambda: app.screen.id == "--command-palette", "the palette")
        from textual.widgets import Input as Field

        field = app.screen.query_one(Field)
        await until(pilot, lambda: field.value == "cancel", "every letter in the palette")
        await pilot.press("escape")
        for job in jobs:
            await app.backend.cancel(job["id"])


async def test_keys_typed_right_after_enter_or_down_in_the_filter_go_to_the_table(
    ui_app: Any,
) -> None:
    # "/logger", enter, "j" in one burst filtered "loggerj" (so did down): the line was
    # left once its message reached the screen, behind the "j" (tester h56).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        screen = await until(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen)
        await pilot.pause()
        field = screen.query_one("#filter", Input)
        for leave in (("enter", "\r"), ("down", None)):
            burst = [("slash", "/"), ("a", "a"), ("b", "b"), leave, ("j", "j")]
            for key, char in burst:
                app.post_message(events.Key(key, char))
            await until(pilot, lambda: app.focused is screen.table, f"the table after {leave[0]}")
            await until(pilot, lambda: screen.table.filter_text == "ab", "the filter applied")
            assert field.value == "ab", (leave, field.value)
            await pilot.press("escape")  # (the filter cleared)
            await until(pilot, lambda: field.value == "", "cleared")


async def test_esc_asks_again_before_it_throws_away_a_typed_form(ui_app: Any) -> None:
    # One esc (also how a search is left, so pressed by reflex) threw away a whole form
    # (tester h46).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await pilot.press("escape")  # nothing typed: closes at once
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        form = await open_form(pilot)
        await type_text(pilot, "python train.py")
        await pilot.press("escape")
        assert app.screen is form
        assert form.form_message == "esc again throws away what you typed (ctrl+s submits it)"
        await type_text(pilot, " --lr 3")  # (typed on: the next esc asks again)
        await pilot.press("escape")
        assert app.screen is form and form.query_one("#command", Input).value.endswith("3")
        # A key's Changed handled only after the first esc (a loaded machine) is no
        # typing on: the second esc closes (it only asked again, and the next `n` and
        # text landed in this form: tester h103).
        command = form.query_one("#command", Input)
        command.post_message(Input.Changed(command, command.value))
        await pilot.pause()
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        form = await open_form(pilot)
        await type_text(pilot, "true")
        await pilot.click("#cancel")  # (a click on Cancel is no reflex: it closes)
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")


async def test_the_esc_question_is_scrolled_into_sight_at_80x24(ui_app: Any) -> None:
    # Asked with a field further down focused, the question was at the top of the
    # scrolled fields, out of sight: the screen looked unchanged, and the next esc threw
    # the form away (tester h142).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "sleep 5")
        fields = form.query_one("#submit-fields")
        for _ in range(8):  # (to the options below Directory and Environment)
            await pilot.press("tab")
        await until(pilot, lambda: fields.scroll_y > 0, "the fields scrolled down")
        box = form.query_one("#form-error")
        await pilot.press("escape")
        await until(pilot, lambda: form.form_message == form.DISCARD_WORDS, "the question")
        await until(
            pilot,
            lambda: box.region.height > 0 and form.screen.region.contains_region(box.region),
            "the question in sight",
        )
        assert app.screen is form


async def test_ctrl_c_asks_again_before_it_quits_over_a_typed_form(ui_app: Any) -> None:
    # ctrl+c (copy, to many) quit the app at once, the typed form lost (tester h120).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "important command")
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.is_running and app.screen is form
        assert form.form_message == (
            "ctrl+c again quits, throwing away what you typed (ctrl+s submits it)"
        )
        assert form.query_one("#command", Input).value == "important command"
        await type_text(pilot, "!")  # (typed on: the next ctrl+c asks again)
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.is_running and app.screen is form
        # An esc between them is no ctrl+c twice in a row: it asks again (the app quit,
        # the form lost: tester h124); and a ctrl+c no second esc.
        await pilot.press("escape")
        await pilot.pause()
        assert form.form_message.startswith("esc again throws away")
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.is_running and app.screen is form
        assert form.form_message.startswith("ctrl+c again quits")
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is form
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.is_running and app.screen is form
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, "the app quit", timeout=10)


async def test_unicode_digits_in_the_forms_are_refused_not_the_end_of_the_app(
    ui_app: Any,
) -> None:
    # "²".isdigit() is true and int("²") raises: typed into GPUs with VRAM filled (or VRAM
    # with GPUs "²"), the app ended with a ValueError; so did "²" in the edit form's
    # "After jobs" (parse_dependencies).
    from gpulayer_tui.fields import FieldError
    from gpulayer_tui.screens.edit import parse_dependencies

    with pytest.raises(FieldError, match="is not a job id"):
        parse_dependencies("12, ²")
    assert parse_dependencies("12, 13 any") == [(12, False), (13, True)]
    # One word for it, as the timeline and the CLI say it (the form wrote "(any outcome)":
    # tester h87); the old one is still read.
    from gpulayer_tui.formatting import dependencies_text

    written = dependencies_text({"depends_on": [12, {"job": 13, "any_exit": True}]})
    assert written == "12, 13 (any end)"
    assert parse_dependencies(written) == parse_dependencies("12, 13 (any outcome)")
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "true")
        await fill(pilot, form, "vram", "10")
        await fill(pilot, form, "gpus", "²")
        await pilot.pause()
        assert app.is_running and app._exception is None
        await fill(pilot, form, "vram", "12")  # (its check reads GPUs)
        await pilot.pause()
        assert app.is_running and app._exception is None
        assert form.query_one("#gpus", Input).has_class("-invalid")


async def test_a_pasted_script_is_refused_in_the_command_not_cut_to_its_first_line(
    ui_app: Any,
) -> None:
    # Textual's Input keeps a paste's first line: a pasted two-line script ran "echo a".
    from textual import events

    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        command = form.query_one("#command", Input)
        command.post_message(events.Paste("echo a\necho b\n"))
        await until(pilot, lambda: command.has_class("-invalid"), "the refusal")
        assert command.value == ""
        error = str(form.query_one("#command-error", Label).render())
        assert "pasted 2 lines: a command is one line" in error
        command.post_message(events.Paste("echo one line\n"))  # one line (and its newline)
        await until(pilot, lambda: command.value == "echo one line", "the paste")
        # A copied coloured line is its words: the escapes stayed in the value (h151).
        name = form.query_one("#name", Input)
        name.focus()
        name.post_message(events.Paste("run\x1b[31m-a\x1b[0m\x07\n"))
        await until(pilot, lambda: name.value == "run-a", "the paste without its escapes")
        command.post_message(events.Paste("\x1b[1ma\x1b[0m\n\x1b[1mb\n"))  # (2 lines)
        await until(pilot, lambda: command.has_class("-invalid"), "the refusal")
        assert command.value == "echo one line"
        # Any field: several lines are refused, said (the first was kept and the rest
        # dropped without a word), and a tab is a space (it stayed, and the field said
        # "control characters are not allowed": tester h160).
        name.post_message(events.Paste("N\x1b[31mRED\trest\rCR\nNL"))
        await until(
            pilot,
            lambda: any(
                "pasted 3 lines: this field takes one" in str(n.message) for n in app._notifications
            ),
            "the refusal said",
        )
        assert name.value == "run-a"
        name.value = ""
        name.post_message(events.Paste("a\tb"))
        await until(pilot, lambda: name.value == "a b", "the tab as a space")


async def test_a_checkbox_says_whether_it_is_ticked_without_colour(ui_app: Any) -> None:
    # Textual's box drew "X" ticked or not, told apart by colour alone: "run without a
    # shell" read as ticked, and a command went as argv by mistake (tester h151).
    from textual.widgets import Checkbox

    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        box = form.query_one("#no-shell", Checkbox)
        assert not box.value and str(box.render()).startswith("▐ ▌")
        box.value = True
        await pilot.pause()
        assert str(box.render()).startswith("▐X▌")


@pytest.mark.both_ui_modes
async def test_adopt_rules_are_the_same_in_both_modes(ui_app: Any, sleeper: int) -> None:
    # vram_gb = 1e9 was refused over the socket but accepted by an embedded engine.
    app = await ui_app("2xA100-80GB")
    answers: dict[str, tuple[object, str | None]] = {}
    expected: dict[str, tuple[object, str | None]] = {}
    async with app.run_test(size=(140, 40)):
        for body, field in [
            ({"pid": sleeper, "vram_gb": 1e9}, "vram_gb"),
            ({"pid": sleeper, "vram_gb": 0}, "vram_gb"),
            ({"pid": 0}, "pid"),
            ({"pid": sleeper, "bogus": 1}, "bogus"),
            ({"pid": sleeper, "domain": "gpu9"}, "domain"),
        ]:
            try:
                await app.backend.adopt(body)
            except BackendError as refused:
                answers[str(body)] = (refused.status, refused.field)
            else:
                answers[str(body)] = ("accepted", None)
            expected[str(body)] = (400, field)
        # Every case is tried before one assertion: a failing case does not hide the rest.
        assert answers == expected
        assert await app.backend.jobs() == []


# -- 10,000 rows, no engine -----------------------------------------------------------------


def _job(job_id: int, status: str = "completed") -> dict[str, Any]:
    running = status == "running"
    return {
        "id": job_id,
        "name": f"sweep-{job_id}",
        "kind": "command",
        "status": status,
        "termination_reason": None if running else "exit_code",
        "exit_code": None if running else 0,
        "message": "running on gpu0" if running else "exited with code 0",
        "domains": ["gpu0"],
        "gpus": [0],
        "priority": 0,
        "pid": None,
        "created_at": FIXED_NOW - 20_000 + job_id,
        "queued_at": FIXED_NOW - 20_000 + job_id,
        "started_at": FIXED_NOW - 20_000 + job_id,
        "ended_at": None if running else FIXED_NOW - 19_000 + job_id,
        "owner_uid": 1000,
        "spec": {"shell": f"python sweep.py --seed {job_id}", "vram_gb": 8},
    }


class _TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield JobTable(clock=lambda: FIXED_NOW)


async def test_ten_thousand_rows_load_and_update_in_place() -> None:
    store = JobStore()
    store.load([_job(i) for i in range(10_000, 0, -1)])
    app = _TableApp()
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.query_one(JobTable)
        version = table.sync(store, 0)
        await pilot.pause()
        assert table.row_count == 10_000
        assert str(table.get_row_at(0)[0]) == "10000"  # newest first
        assert str(table.get_row_at(9_999)[0]) == "1"
        assert cell(table, 4321, "name") == "sweep-4321"
        assert cell(table, 4321, "status") == "completed"
        assert cell(table, 4321, "vram") == "8"
        assert cell(table, 4321, "runtime") == "16m40s"

        await pilot.press("down", "down")
        assert table.cursor_job_id == 9_998
        for job_id in range(1, 10_001, 20):  # 500 changes
            store.apply(_job(job_id, "running"))
        store.apply(_job(10_001, "running"))  # and one new job
        version = table.sync(store, version)
        await pilot.pause()
        assert table.row_count == 10_001
        assert str(table.get_row_at(0)[0]) == "10001"
        assert table.cursor_job_id == 9_998  # the cursor stayed on its job
        assert cell(table, 4321, "status") == "running"
        assert cell(table, 4321, "runtime") == "4h21m"  # 15,679 s by the app clock
        assert cell(table, 4322, "status") == "completed"

        table.set_filters(status="running")
        assert table.row_count == 501
        assert table.sync(store, version) == version
        table.set_filters(status="all")

        # A reload (after the event stream was cut) replaces everything.
        store.load([_job(i) for i in range(9_000, 0, -1)])
        table.sync(store, version)
        await pilot.pause()
        assert table.row_count == table.total_count == 9_000
        assert str(table.get_row_at(0)[0]) == "9000"
        assert cell(table, 4321, "status") == "completed"


class _LogApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LogTail()


async def test_log_tail_shows_lines_like_a_terminal_would() -> None:
    app = _LogApp()
    async with app.run_test() as pilot:
        log = app.query_one(LogTail)
        snowman = "☃".encode()
        chunks = [
            b"\x1b[32mok\x1b[0m\r\nstep 1\rstep 2\rstep 3\n10%|#",
            b"\r50%|#####",
            b"\r100%\ndone " + snowman[:1],  # a character split across reads
            snowman[1:] + b"\nno newline",
        ]
        log.feed(chunks[0])
        log.feed(chunks[1])
        await pilot.pause()
        assert list(log.lines[:2]) == ["ok", "step 3"]
        assert log.partial_line == "50%|#####"  # the live progress line, in the subtitle
        assert str(log.border_subtitle) == "50%|#####"
        log.feed(chunks[2])
        log.feed(chunks[3])
        log.finish()
        # (A shorter rewrite leaves the end of a longer one showing, as on a terminal:
        # "tab\there\rCR-over" showed "CR-over", its " here" lost.)
        assert list(log.lines) == ["ok", "step 3", "100%#####", "done ☃", "no newline"]
        assert log.bytes_read == sum(len(c) for c in chunks)
        log.reset()
        log.feed(b"tab\there\rCR-over\n")
        # Erase-line clears what a progress line showed; tabs move, wide characters take
        # two columns ("doneloading 100%" was shown, and "ab" over "日本語" hid "本").
        log.feed(b"Downloading 100%\r\x1b[Kdone\n")
        log.feed("日本語\rab\nabcdefghijkl\rx\ty\n".encode())
        assert log.source_lines == ["CR-over here", "done", "ab本語", "xbcdefghyjkl"]


async def test_a_line_longer_than_the_log_is_marked_where_it_is_cut() -> None:
    # It was cut at the right edge without a mark: a reader took it for the whole line
    # (tester h61's list). `w` wraps it; scrolled to its end, the mark goes.
    from gpulayer_tui.widgets.log_tail import MORE_MARK

    app = _LogApp()
    async with app.run_test(size=(40, 10)) as pilot:
        log = app.query_one(LogTail)
        # (more lines than the view: a vertical scrollbar, under which the mark was drawn)
        log.feed(b"short\n" + b"x" * 100 + b"\n" + b"".join(b"y\n" for _ in range(30)))
        log.finish()
        await until(pilot, lambda: len(log.lines) == 32, "the lines")
        await until(pilot, lambda: log.max_scroll_y > 0, "more lines than the view")
        log.scroll_to_top()
        await until(pilot, lambda: log.scroll_offset.y == 0, "the top")
        width = log.scrollable_content_region.width

        def row_text(y: int) -> str:
            return "".join(segment.text for segment in log.render_line(y))

        await until(pilot, lambda: row_text(1).rstrip().endswith(MORE_MARK), "the mark")
        assert row_text(1).rstrip() == "x" * (width - 1) + MORE_MARK
        assert MORE_MARK not in row_text(0)
        await until(pilot, lambda: log.virtual_size.width >= 100, "the line's width measured")
        log.scroll_to(x=200, animate=False)
        await until(pilot, lambda: log.scroll_offset.x > 0, "scrolled right")
        assert MORE_MARK not in row_text(1)
        log.wrap = True
        await until(pilot, lambda: len(log.lines) > 2, "wrapped rows")
        assert all(MORE_MARK not in row_text(y) for y in range(len(log.lines)))


# -- snapshots (fixed data, fixed clock) ----------------------------------------------------


def _static_app() -> Any:
    from gpulayer_tui.app import build_app

    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW)
    app.cursor_blink = False  # read by the form and the filter line
    return app


async def _show_jobs(pilot: Pilot[Any]) -> None:
    await pilot.press("2")
    await until(pilot, lambda: table_of(pilot.app).row_count == 10, "rows")


def _open_detail(down: int) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        await _show_jobs(pilot)
        await pilot.press(*["down"] * down, "enter")
        screen = await until(
            pilot,
            lambda: isinstance(pilot.app.screen, JobDetailScreen) and pilot.app.screen,
            "detail",
        )
        await until(pilot, lambda: screen.job is not None, "the job")
        await until(pilot, lambda: screen.query_one(Timeline).events, "the timeline")
        if screen.job_id == 10:
            await until(pilot, lambda: screen.query_one(LogTail).line_count == 2, "log lines")

    return run_before


def test_snapshot_jobs_table(snap_compare: Any) -> None:
    assert snap_compare(_static_app(), terminal_size=(140, 30), run_before=_show_jobs)


def test_snapshot_jobs_table_narrow(snap_compare: Any) -> None:
    assert snap_compare(_static_app(), terminal_size=(80, 24), run_before=_show_jobs)


def test_snapshot_job_detail_running_with_output(snap_compare: Any) -> None:
    # Rows: 14 13 12 11 10 ...: job 10 is four down.
    assert snap_compare(_static_app(), terminal_size=(140, 40), run_before=_open_detail(4))


def test_snapshot_job_detail_over_capacity(snap_compare: Any) -> None:
    assert snap_compare(_static_app(), terminal_size=(140, 40), run_before=_open_detail(5))


def test_snapshot_a_waiting_job_at_80x24_shows_why_it_waits_not_an_empty_log(
    snap_compare: Any,
) -> None:
    # (its empty output box took 9 of the 24 rows, and "why it waits" was cut: h141)
    assert snap_compare(_static_app(), terminal_size=(80, 24), run_before=_open_detail(2))


async def test_a_long_field_error_wraps_inside_the_form() -> None:
    # (a priority of 23 digits: its error ran past the dialog's edge, cut off)
    app = _static_app()
    async with app.run_test(size=(80, 40)) as pilot:
        await _show_jobs(pilot)
        form = await open_form(pilot)
        await fill(pilot, form, "priority", "9" * 23)
        said = await until(pilot, lambda: field_error(form, "priority"), "the error")
        assert "9" * 23 in said
        label = form.query_one("#priority-error", Label)
        await pilot.pause()
        dialog = label.parent
        assert dialog is not None
        assert label.region.right <= dialog.region.right and label.region.height > 1


def test_snapshot_submit_form_with_an_error(snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await _show_jobs(pilot)
        form = await open_form(pilot)
        await type_text(pilot, "python train.py --epochs 10")
        await fill(pilot, form, "gpus", "two")
        await until(pilot, lambda: field_error(form, "gpus"), "the error")

    assert snap_compare(_static_app(), terminal_size=(100, 40), run_before=run_before)


async def test_the_table_loads_history_a_page_at_a_time_and_asks_the_engine_per_view(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpulayer_tui.job_feed.PAGE", 20)
    monkeypatch.setattr("gpulayer_tui.widgets.job_table.NEAR_END_ROWS", 3)
    app = await ui_app("1xA100-80GB")
    for n in range(60):
        await app.backend.submit(spec("true", name=f"run-{n:02d}", gpus=0))

    async def all_ended() -> bool:
        return not (await app.backend.jobs_page(status="pending,queued,running"))["jobs"]

    await eventually(all_ended, timeout=30)
    async with app.run_test(size=(140, 20)) as pilot:
        await pilot.press("2")
        screen = app.screen
        table = table_of(app)
        count = screen.query_one("#jobs-count", Label)
        # Only the newest page is loaded ...
        await until(pilot, lambda: table.row_count == 20, "the newest page")
        assert str(count.content) == "20+ jobs"
        assert "run-03" not in {j["name"] for j in app.job_store.jobs.values()}
        # ... but a filter is a view the engine serves: it finds an old job never loaded.
        await pilot.press("slash")
        await type_text(pilot, "run-03")
        await until(pilot, lambda: table.row_count == 1, "the old job, found by the engine")
        await pilot.press("escape")
        # So is a sort: by name, the first names of all history come on top.
        await pilot.press("o", "o", "o")
        assert table.sort_key == "name"
        await until(
            pilot,
            lambda: table.row_count > 0 and str(table.get_row_at(0)[1]) == "run-00",
            "the first name of all history on top",
        )
        # Back to newest first: reaching the end of the table loads the next page, until
        # there is no more.
        for _ in SORTS:  # (o cycles on round to it)
            if table.sort_key == "id":
                break
            await pilot.press("o")
        assert table.sort_key == "id"
        for _ in range(6):
            await pilot.press("G")
            await pilot.pause(0.05)
        await until(pilot, lambda: table.row_count == 60, "every page, reached by scrolling")
        await until(pilot, lambda: str(count.content) == "60 jobs", "no '+' once all are in")


async def test_rows_known_past_the_pages_loaded_wait_for_their_page(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Today's failed jobs are loaded for the dashboard, past the newest page: the table
    # showed them under it as if the list ended there, its bottom failed jobs only, and
    # its count "7,536+ jobs" of 20,628 (tester h76). Now they wait for their page.
    monkeypatch.setattr("gpulayer_tui.job_feed.PAGE", 20)
    monkeypatch.setattr("gpulayer_tui.widgets.job_table.NEAR_END_ROWS", 3)
    app = await ui_app("1xA100-80GB")
    for n in range(60):
        await app.backend.submit(spec("true" if n % 3 else "false", name=f"r{n:02d}", gpus=0))

    async def all_ended() -> bool:
        return not (await app.backend.jobs_page(status="pending,queued,running"))["jobs"]

    await eventually(all_ended, timeout=30)
    async with app.run_test(size=(140, 20)) as pilot:
        await pilot.press("2")
        table = table_of(app)
        count = app.screen.query_one("#jobs-count", Label)
        await until(pilot, lambda: len(app.job_store.jobs) > 20, "older failed jobs loaded")
        await until(pilot, lambda: str(count.content) == "20+ jobs", "the newest page alone")
        assert table.row_count == 20
        ids = [int(str(table.get_row_at(n)[0])) for n in range(table.row_count)]
        assert ids == list(range(60, 40, -1))  # (no failed job from below the page)
        # Another order shows every row known: re-sorted in place, those below the page
        # stayed hidden ("1,143 of 1,148 jobs", a queued job never shown: tester h95).
        old_failed = {j for j, job in app.job_store.jobs.items() if j <= 40}
        assert old_failed  # (known, from the dashboard's load)
        while table.sort_key != "status":
            await pilot.press("o")
        await until(
            pilot,
            lambda: (
                old_failed <= {int(str(table.get_row_at(n)[0])) for n in range(table.row_count)}
            ),
            "the failed jobs below the page, in the status order",
        )
        while table.sort_key != "id":  # (newest first again: no row out of its page)
            await pilot.press("o")

        def shown_ids() -> list[int]:
            return [int(str(table.get_row_at(n)[0])) for n in range(table.row_count)]

        await until(pilot, lambda: table.row_count >= 20, "the newest page")
        assert shown_ids() == list(range(60, 60 - table.row_count, -1))
        for _ in range(6):
            await pilot.press("G")
            await pilot.pause(0.05)
        await until(pilot, lambda: table.row_count == 60, "every page, reached by scrolling")
        ids = [int(str(table.get_row_at(n)[0])) for n in range(table.row_count)]
        assert ids == list(range(60, 0, -1)) and str(count.content) == "60 jobs"


async def test_leaving_a_detail_while_its_log_grows_never_ends_the_app(ui_app: Any) -> None:
    # The Log widget measures new lines in a thread that outlived the detail screen and
    # raised NoActiveAppError, which ended the app (issue 20).
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(spec("while true; do echo line $RANDOM; done", gpus=0))
    async with app.run_test(size=(100, 30)) as pilot:
        for _ in range(6):
            app.open_job(job["id"])
            await pilot.pause(0.1)
            await pilot.press("escape")
            await pilot.pause(0.02)
        await pilot.pause(0.3)
        assert app.is_running
        await app.backend.cancel(job["id"])


async def test_jobs_cleaned_from_the_history_leave_an_attached_tui(ui_app: Any) -> None:
    # `gpulayer-tui clean` removed them, and the TUI kept showing them (and their failures
    # in "failed today"); their detail answered every action "no job N".
    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    ended = [await app.backend.submit(spec(line, gpus=0)) for line in ("true", "exit 3")]
    for job in ended:
        await engine.wait(job["id"], timeout=20)
    kept = await app.backend.submit(spec("sleep 600", gpus=0))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: all(j["id"] in app.job_store.jobs for j in ended))
        assert app.job_store.summary()["failed_today"] == 1
        app.open_job(ended[1]["id"])
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen))
        assert (await engine.retention.clean(None, keep=0))["jobs"] == 2
        said = f"job {ended[1]['id']} was removed from the history"
        await until(pilot, lambda: any(n.message == said for n in app._notifications), said)
        await until(pilot, lambda: not isinstance(app.screen, JobDetailScreen), "closed")
        assert not any(j["id"] in app.job_store.jobs for j in ended)
        assert kept["id"] in app.job_store.jobs
        assert app.job_store.summary()["failed_today"] == 0
        await pilot.press("2")
        table = await until(pilot, lambda: app.screen.query_one(JobTable))
        await until(pilot, lambda: table.row_count == 1, "only the running job listed")
    await app.backend.cancel(kept["id"])


async def test_an_areas_key_leaves_a_detail_opened_in_that_area(ui_app: Any) -> None:
    # "1/2/3 go to the dashboard / jobs / strays, everywhere": from a job's detail opened
    # on the jobs screen, 2 did nothing (it was the jobs area already).
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(spec("true", gpus=0))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen))
        for area, home in (("2", JobsScreen), ("1", DashboardScreen)):
            if area == "1":
                await pilot.press("1")
                await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
            app.open_job(job["id"])
            await until(pilot, lambda: isinstance(app.screen, JobDetailScreen))
            await pilot.press(area)
            await until(pilot, lambda: isinstance(app.screen, home), f"back to {home}")  # noqa: B023
            assert app.is_running
        # From another area, 2 shows the jobs table, not the detail left open there (it
        # came back, and a filter typed then searched the job's log: tester h67).
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen))
        app.open_job(job["id"])
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen))
        await pilot.press("1")
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the table itself")
        await pilot.press("1", "2")  # (and again: nothing is left above it)
        await until(pilot, lambda: isinstance(app.screen, JobsScreen))


async def test_a_followed_log_shows_its_end_and_a_finished_one_opens_there(ui_app: Any) -> None:
    # The title said "following" while the view stayed on line 1 (issue 20).
    app = await ui_app("1xA100-80GB")
    lines = "for i in $(seq 1 80); do echo line $i; done"
    running = await app.backend.submit(spec(f"{lines}; sleep 60", gpus=0))
    failed = await app.backend.submit(spec(f"{lines}; exit 3", gpus=0))
    async with app.run_test(size=(100, 30)) as pilot:
        for job in (running, failed):
            app.open_job(job["id"])
            await pilot.pause()
            log = app.screen.query_one(LogTail)
            await until(pilot, lambda: log.line_count >= 80, "the output")  # noqa: B023
            await until(
                pilot,
                lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y,  # noqa: B023
                "the last line in view",
            )
            await pilot.press("escape")
        await app.backend.cancel(running["id"])


async def test_a_running_gpu_jobs_usage_columns_follow_it_and_its_end(ui_app: Any) -> None:
    # PEAK / UTIL / ENERGY stayed as the first page brought them (blank for a job started
    # since), also after the job ended.
    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    async with app.run_test(size=(200, 40)) as pilot:
        job = await app.backend.submit(spec("sleep 60", gpus=1))
        await until(pilot, lambda: app.job_store.jobs.get(job["id"], {}).get("status") == "running")
        for _tick in range(3):
            await engine.sampler.sample_once()
        await app.refresh_running_use()
        use = app.job_store.jobs[job["id"]]["use"]
        assert use["peak_vram"] and use["util_mean"] is not None
        await engine.sampler.sample_once()
        await app.backend.cancel(job["id"])
        await until(
            pilot, lambda: app.job_store.jobs[job["id"]]["status"] == "cancelled", "its end"
        )
        final = (await app.backend.jobs_page(limit=5))["jobs"]
        (row,) = [r for r in final if r["id"] == job["id"]]
        assert app.job_store.jobs[job["id"]]["use"] == row["use"]


async def test_small_words_say_what_is_true(ui_app: Any) -> None:
    # "1 jobs", "failed (exit_code)", "c" offered on an ended job, "no events yet" while
    # loading (issue 20).
    app = await ui_app("1xA100-80GB")
    failed = await app.backend.submit(spec("exit 3", gpus=0))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        screen = app.screen
        table = table_of(app)
        await until(pilot, lambda: status_of(table, failed["id"]) == "failed", "the ended job")
        assert str(screen.query_one("#jobs-count", Label).content) == "1 job"
        assert screen.check_action("cancel_job", ()) is None  # shown, but dimmed
        running = await app.backend.submit(spec("sleep 60", gpus=0))
        await until(pilot, lambda: status_of(table, running["id"]) == "running", "a running job")
        await pilot.press("home")  # newest first: the running job
        await pilot.pause()
        assert screen.check_action("cancel_job", ()) is True
        app.open_job(failed["id"])
        await pilot.pause()
        await until(pilot, lambda: app.screen.query_one(Timeline).events, "the timeline")
        status = app.screen.query_one("#fields", FieldList).text("status")
        assert status == "failed: exited with code 3"  # (not "failed (exit_code)")
        await app.backend.cancel(running["id"])
        await pilot.press("escape")
        app.open_job(running["id"])
        await until(
            pilot,
            lambda: (
                [f.text("status") for f in app.screen.query("#fields").results(FieldList)]
                == ["cancelled by user"]
            ),
            "a cancelled job's status in plain words",
        )


def test_a_timeline_says_loading_until_its_first_answer() -> None:
    timeline = Timeline()
    assert str(timeline.render()) == "loading…"
    timeline.set_events([])
    assert str(timeline.render()) == "no events yet"


def test_a_timeline_names_edits_log_cuts_and_idle_warnings_in_words() -> None:
    # "job.edited" stood beside "queued" and "running" (tester h67).
    timeline = Timeline(clock=lambda: FIXED_NOW)
    timeline.set_events(
        [
            {"at": FIXED_NOW - 3, "kind": kind, "status": None, "reason": None, "message": "m"}
            for kind in ("job.edited", "job.log", "job.idle")
        ]  # type: ignore[misc]
    )
    lines = str(timeline.render()).splitlines()
    assert [line.split()[-2] for line in lines] == ["edited", "cut", "idle"]
    assert " log cut " in lines[1] and "job." not in str(timeline.render())
    # A reason the message says already is left out ("completed  exit code · exited with
    # code 0" read as a number missing: tester h87); one it does not say leads.
    timeline.set_events(
        [
            {"at": FIXED_NOW - 2, "kind": "job.ended", "status": "completed",
             "reason": "exit_code", "message": "exited with code 0"},
            {"at": FIXED_NOW - 1, "kind": "job.ended", "status": "failed",
             "reason": "oom", "message": "killed"},
        ]  # type: ignore[list-item]
    )  # fmt: skip
    shown = str(timeline.render())
    assert "exit code" not in shown and "completed  exited with code 0" in shown, shown
    assert "oom · killed" in shown, shown


class _TimelineApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Timeline(clock=lambda: FIXED_NOW)


@pytest.mark.parametrize("columns", [60, 100])
async def test_timeline_messages_wrap_by_cells_within_the_width(columns: int) -> None:
    # Wide characters overran the width (wrapped by characters, not cells), and at 60
    # columns an event of another day left its message a column of a few characters.
    app = _TimelineApp()
    wide = "学習が終わりました " * 12
    long_word = "x" * 90
    async with app.run_test(size=(columns, 40)) as pilot:
        timeline = app.query_one(Timeline)
        timeline.set_events(
            [
                {"at": FIXED_NOW - 86400 * 3, "kind": "job.submitted", "status": "queued",
                 "reason": None, "message": "waiting for a GPU " * 6},
                {"at": FIXED_NOW - 5, "kind": "job.ended", "status": "failed",
                 "reason": "timeout", "message": f"{wide} {long_word}"},
            ]  # type: ignore[list-item]
        )  # fmt: skip
        await pilot.pause()
        rendered = timeline.render()
        assert isinstance(rendered, Content)
        width = timeline.content_region.width
        lines = rendered.split("\n")
        assert all(line.cell_length <= width for line in lines), [
            (line.cell_length, line.plain) for line in lines if line.cell_length > width
        ]
        text = "".join(line.plain.strip() for line in lines)
        # Nothing lost in the wrapping (spaces aside), the reason first in its colour.
        assert "学習が終わりました" * 12 in text.replace(" ", "") and long_word in text
        assert "waiting for a GPU" in text and "timeout ·" in text
        if columns == 60:
            # The other day's message goes under its head, not into a narrow column.
            first = lines[0].plain
            assert first.rstrip().endswith("queued") and lines[1].plain.startswith("    waiting")


def test_a_job_waiting_again_shows_no_runtime() -> None:
    # A preempted job requeued, or a service being placed again, kept its last start:
    # its runtime went on counting in the table, the detail and the CLI while it waited.
    from gpulayer_tui.cli.format import format_jobs
    from gpulayer_tui.widgets.job_columns import runtime_seconds

    row: Any = {
        "id": 7, "name": "svc", "kind": "service", "status": "queued", "termination_reason": None,
        "exit_code": None, "message": "waiting for a GPU", "domains": [], "gpus": [],
        "pid": None, "started_at": FIXED_NOW - 600, "ended_at": None, "spec": {}, "owner_uid": 0,
    }  # fmt: skip
    assert runtime_seconds(row, FIXED_NOW) is None
    assert "10m" not in format_jobs([row], FIXED_NOW)
    running = {**row, "status": "running"}
    assert runtime_seconds(running, FIXED_NOW) == 600
    assert "10m" in format_jobs([running], FIXED_NOW)
    # A launch that failed was recorded running first, but nothing ran: no start, no
    # runtime ("started 15:44:52 runtime 0s").
    from gpulayer_tui.screens.job_detail import job_fields

    never = {**row, "kind": "batch", "status": "failed", "termination_reason": "launch_failed",
             "started_at": FIXED_NOW - 1, "ended_at": FIXED_NOW - 1}  # fmt: skip
    assert runtime_seconds(never, FIXED_NOW) is None
    assert "started" not in job_fields(never, FIXED_NOW)["times"].plain


def test_failed_today_counts_runs_not_refused_submissions() -> None:
    store = JobStore()
    now = FIXED_NOW
    base: dict[str, Any] = {"kind": "command", "spec": {}, "ended_at": now - 60}
    store.load(
        [
            {**base, "id": 1, "status": "failed", "termination_reason": "exit_code"},
            {**base, "id": 2, "status": "failed", "termination_reason": "over_capacity"},
            {**base, "id": 3, "status": "running", "termination_reason": None, "ended_at": None},
            {**base, "id": 4, "status": "queued", "termination_reason": None, "ended_at": None},
            # refused adoptions never ran either (each one added to the count)
            {**base, "id": 5, "kind": "adopted", "status": "failed",
             "termination_reason": "adopt_refused"},
            {**base, "id": 6, "kind": "adopted", "status": "failed",
             "termination_reason": "adopt_pid_gone"},
            # (an adopted process that was watched and then went: its exit unseen, a run)
            {**base, "id": 7, "kind": "adopted", "status": "failed",
             "termination_reason": "adopted_exit_unobserved"},
        ]  # type: ignore[list-item]
    )  # fmt: skip
    assert store.summary(now) == {
        "running": 1,
        "queued": 1,
        "failed_today": 2,
        "refused_today": 3,  # (said apart: the two add up to the table's "failed", h67)
    }


async def test_a_waiting_jobs_detail_says_why_it_waits_until_it_runs(ui_app: Any) -> None:
    app = await ui_app("1xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        holder = await app.backend.submit(spec("sleep 600", name="holder", gpus=1))
        waiting = await app.backend.submit(spec("true", name="[b]next[/b]", gpus=1))
        app.open_job(waiting["id"])
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        panel = await until(
            pilot,
            lambda: next((p for p in detail.query(WhyPanel) if p.has_class("-waiting")), None),
            "the why panel",
        )
        await until(pilot, lambda: panel.size.width > 40, "the panel laid out")
        text = str(panel.render())
        assert text.startswith("why it waits\n")
        assert "place       1 of 1 in line (ahead: none)" in text
        assert "fair share" in text and "GPU-h" in text
        # In view at 120x40: first in the wider column, no empty usage panel above the log
        # (under the fields it was below the fold, its lines cut: tester h67).
        assert panel.parent is not None and panel.parent.id == "timeline-box"
        assert not detail.query_one("#usage").display
        # Another job's change is asked about again: one submitted later goes ahead.
        ahead = await app.backend.submit(spec("true", name="urgent", gpus=1, priority=5))
        await until(
            pilot,
            lambda: f"2 of 2 in line (ahead: {ahead['id']})" in str(panel.render()),
            "the job now ahead of it",
        )
        await app.backend.cancel(holder["id"])
        await until(pilot, lambda: not panel.has_class("-waiting"), "the panel gone once it runs")
        await until(pilot, lambda: detail.query_one("#usage").display, "its usage once it ran")


async def test_the_fields_block_wraps_each_value_beside_its_label() -> None:
    class Fields(App[None]):
        def compose(self) -> ComposeResult:
            yield FieldList([("name", "name"), ("command", "command"), ("replicas", "replicas")])

    app = Fields()
    async with app.run_test(size=(30, 8)) as pilot:
        fields = app.query_one(FieldList)
        values = {"name": Content("[b]x[/b]"), "command": Content("aaaa bbbb cccc dddd eeee")}
        fields.update(values, hidden=["replicas"])
        await pilot.pause()
        assert fields.render().plain.splitlines() == [
            "name       [b]x[/b]",  # the user's text, never markup
            "command    aaaa bbbb cccc dddd",
            "           eeee",  # a value's later lines stay in its column
        ]
        assert fields.size.height == 3
        assert fields.text("name") == "[b]x[/b]" and not fields.shown("replicas")
        fields.hide([])
        fields.set("replicas", Content("0 up\n1 starting"))
        await pilot.pause()
        assert fields.shown("replicas") and fields.size.height == 5
        # Rows whose labels change (usage lines, why it waits), under a heading that
        # takes the whole width: a long value goes on under itself, not at the left edge.
        fields.set_rows(
            [("advice", Content("held at most 1 GiB per GPU; declare vram_gb"))],
            heading=Content("why it waits, at full width"),
        )
        await pilot.pause()
        assert fields.render().plain.splitlines() == [
            "why it waits, at full width",
            "advice     held at most 1 GiB",
            "           per GPU; declare",
            "           vram_gb",
        ]
        assert fields.size.height == 4


async def test_a_long_name_keeps_the_rows_after_it_in_view() -> None:
    # At 80x24 a long name wrapped over 7 lines and pushed the status below the fold.
    class Fields(App[None]):
        def compose(self) -> ComposeResult:
            yield FieldList([("name", "name"), ("status", "status")], max_lines={"name": 2})

    app = Fields()
    async with app.run_test(size=(24, 8)) as pilot:
        fields = app.query_one(FieldList)
        fields.update({"name": Content("abcd " * 12), "status": Content("running")})
        await pilot.pause()
        assert fields.render().plain.splitlines() == [
            "name       abcd abcd",
            "           abcd abcd…",
            "status     running",
        ]
        assert fields.text("name") == "abcd " * 12  # (what it holds is whole)
        fields.set("name", Content("short"))
        await pilot.pause()
        assert fields.render().plain.splitlines()[0] == "name       short"
        assert fields.size.height == 2


async def test_end_reaches_old_finished_jobs_behind_pages_of_waiting_ones(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With more waiting jobs than a page, every page asked for held only rows shown
    # already (the active jobs load first), and no page was asked for after it: G never
    # reached the older finished jobs. The dashboard's "failed today" counted only the
    # rows loaded, so it said 0.
    monkeypatch.setattr("gpulayer_tui.job_feed.PAGE", 20)
    monkeypatch.setattr("gpulayer_tui.widgets.job_table.NEAR_END_ROWS", 3)
    app = await ui_app("1xA100-80GB")
    failed = await app.backend.submit(spec("exit 3", name="old-failure", gpus=0))
    done = await app.backend.submit(spec("true", name="old-success", gpus=0))

    async def ended() -> bool:
        rows = (await app.backend.jobs_page(status="failed,completed"))["jobs"]
        return {r["id"] for r in rows} == {failed["id"], done["id"]}

    await eventually(ended, timeout=30)
    blocker = await app.backend.submit(spec("sleep 600", gpus=1))
    waiting = [await app.backend.submit(spec("true", gpus=1)) for _ in range(45)]
    async with app.run_test(size=(140, 20)) as pilot:
        assert app.job_store.summary()["failed_today"] == 1
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: table.row_count >= 20, "the first rows")
        await pilot.press("G")  # (once: the pages in between hold nothing new)
        await until(pilot, lambda: table.row_count == 48, "the old finished jobs, at the end")
    for job in [*waiting, blocker]:
        await app.backend.cancel(job["id"])


async def test_failed_today_counts_past_a_page_of_failures(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The newest page of failures was loaded, no more: 620 failed today read as 500.
    monkeypatch.setattr("gpulayer_tui.app.PAGE", 20)
    monkeypatch.setattr("gpulayer_tui.job_feed.PAGE", 20)
    app = await ui_app("1xA100-80GB")
    for _ in range(25):
        await app.backend.submit(spec("exit 3", gpus=0))

    async def all_failed() -> bool:
        page = await app.backend.jobs_page(status="failed", limit=100)
        return len(page["jobs"]) == 25

    await eventually(all_failed, timeout=30)
    async with app.run_test(size=(140, 30)):
        assert app.job_store.summary()["failed_today"] == 25


async def test_the_form_stays_while_its_submission_waits_for_the_engine() -> None:
    # Closed with esc while "submitting…", the job was made all the same and nothing said
    # so (a retry made it twice).
    import asyncio

    from gpulayer_tui.app import build_app

    class SlowBackend(StaticBackend):
        answer = asyncio.Event()

        async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
            await self.answer.wait()
            return await super().submit(spec)

    backend = SlowBackend()
    app = build_app(backend, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        await fill(pilot, form, "command", "sleep 8")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: form._busy, "submitting")
        await pilot.press("escape")
        # (the keys after ctrl+s wait a moment for the form to close: then go to it)
        await until(
            pilot, lambda: "wait for its answer" in str(form.query_one("#form-error").render())
        )
        assert app.screen is form  # (still open: it waits for the answer)
        backend.answer.set()
        await until(pilot, lambda: app.screen is not form, "closed once answered")
        await until(  # (the toast may come a frame after the form closes)
            pilot, lambda: any("job " in n.message for n in app._notifications), "the toast"
        )


async def test_a_view_changed_while_a_page_is_on_its_way_gets_its_own_first_page(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The page on its way was cancelled, but a cancelled worker is not finished at once:
    # the new view's first page was never asked for (after an engine restart the table
    # then kept its active jobs alone, whatever the filter or sort).
    from gpulayer_tui.job_feed import JobView

    app = await ui_app("1xA100-80GB")
    for n in range(3):
        await app.backend.submit(spec("true", name=f"run-{n:02d}", gpus=0))
    async with app.run_test(size=(140, 30)) as pilot:
        held = asyncio.Event()
        asked: list[dict[str, Any]] = []
        real = app.backend.jobs_page

        async def slow_page(**query: Any) -> Any:
            asked.append(query)
            if len(asked) == 1:
                await held.wait()  # (the first view's page stays on its way)
            return await real(**query)

        monkeypatch.setattr(app.backend, "jobs_page", slow_page)
        app.show_jobs(JobView(sort="status", descending=False))
        await until(pilot, lambda: len(asked) == 1, "the first view's page asked")
        app.show_jobs(JobView(sort="name", descending=False))
        await until(pilot, lambda: len(asked) == 2, "the second view's page asked")
        assert asked[1]["sort"] == "name"
        held.set()


async def test_the_runtime_sort_moves_a_running_job_as_its_runtime_passes_others(
    ui_app: Any,
) -> None:
    # Sorted once, a running job stayed below ended jobs it had long outrun (the CLI's
    # `jobs --sort runtime` put it first).
    now = [time.time()]
    app = await ui_app("1xA100-80GB", clock=lambda: now[0])
    short = await app.backend.submit(spec("sleep 0.3", name="short", gpus=0))
    await eventually(lambda: app.backend.engine.book.get(short["id"]) is None, timeout=20)
    runner = await app.backend.submit(spec("sleep 600", name="runner", gpus=0))
    now[0] = time.time()
    async with app.run_test(size=(140, 20)) as pilot:
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: table.row_count == 2, "both rows")
        table.set_sort("runtime", True)
        await pilot.pause()
        first = lambda: int(str(table.get_row_at(0)[0]))  # noqa: E731
        assert first() == short["id"]  # (0.3 s ended, the runner's just begun)
        now[0] += 100
        await until(pilot, lambda: first() == runner["id"], "the runner on top", timeout=5)
    await app.backend.cancel(runner["id"])


def test_a_vram_figure_too_long_for_its_column_is_not_cut_to_a_smaller_one() -> None:
    # 100000 GiB showed "1000…" in the 5-cell column: read as 1000 (tester h46).
    from gpulayer_tui.widgets.job_columns import vram_text

    def row(vram: float | None) -> Any:
        return {"spec": {} if vram is None else {"vram_gb": vram}}

    values = (None, 20, 0.5, 80000, 100000, 1e6, 0.0001, 12.345, 0.0625, 123456.789, 99999.5)
    assert [vram_text(row(v)) for v in values] == [
        "",
        "20",
        "0.5",
        "80000",
        "100k",
        "1000k",
        "1e-04",
        "12.35",  # (it read "1e+01": tester h50)
        "0.062",
        "123k",
        "100k",
    ]


async def test_a_narrow_detail_stacks_its_fields_over_the_timeline(ui_app: Any) -> None:
    # Side by side at 60 columns a field's value had 9 cells: "complete|d:", "longslee|p"
    # (tester h46).
    from gpulayer_tui.screens.job_detail import JobDetailScreen

    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(60, 20)) as pilot:
        job = await app.backend.submit({"shell": "true", "cwd": "/tmp", "name": "longsleep"})
        app.open_job(job["id"])
        screen = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        await pilot.pause()
        assert screen.has_class("-narrow")
        assert screen.query_one("#fields-box").size.width >= 50
        await pilot.resize_terminal(100, 30)
        await until(pilot, lambda: not screen.has_class("-narrow"), "side by side again")


def test_an_explicit_priority_0_is_asked_for_by_the_cli_and_the_form() -> None:
    # Left out as if not given, "--priority 0" of a user held to max_priority -5 was
    # stored as -5, silently (tester h47): the engine refuses 0 when it is asked for.
    from gpulayer_tui.cli.commands import _spec_from_args
    from gpulayer_tui.cli.grammar import build_parser
    from gpulayer_tui.cli.quick import parse

    parser = build_parser()
    words = ["submit", "--priority", "0", "--", "true"]
    for args in (parse(words), parser.parse_args(words)):
        assert args is not None and _spec_from_args(args, parser)["priority"] == 0
    assert "priority" not in _spec_from_args(parser.parse_args(["submit", "true"]), parser)


async def test_the_forms_priority_0_is_asked_for(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await type_text(pilot, "true")
        assert "priority" not in form.build_spec()
        await fill(pilot, form, "priority", "0")
        assert form.build_spec()["priority"] == 0


async def test_marks_follow_the_keys_typed_and_star_leaves_hidden_marks_alone() -> None:
    # "space j space" typed in one burst marked rows 2 and 3 (the j overtook the first
    # space); "*" with nothing active shown, or all shown marked, took every mark away,
    # those a filter hid too (tester h112).
    app = _static_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: table.row_count == 10, "the rows")
        await pilot.press("g", "j", "j")
        assert table.cursor_job_id == 12
        for key, char in [("space", " "), ("j", "j"), ("space", " ")]:
            app.post_message(events.Key(key, char))
        await until(pilot, lambda: len(table.marked) == 2, "two marks")
        assert table.marked == [12, 10]
        await pilot.press("slash", *"train", "enter")
        await until(pilot, lambda: table.row_count == 3, "the train jobs alone")
        await pilot.press("asterisk")  # (11 added: not all shown were marked)
        assert sorted(table.marked) == [10, 11, 12]
        await pilot.press("asterisk")  # (all shown marked: those shown unmarked)
        assert table.marked == [12]
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == 10, "every row again")
        for _ in range(5):
            await pilot.press("s")
        await until(pilot, lambda: table.status_filter == "completed", "completed")
        await pilot.press("asterisk")
        said = "no waiting or running job is shown"
        await until(pilot, lambda: any(n.message == said for n in app._notifications), said)
        assert table.marked == [12]


def test_a_job_cancelled_for_its_dependency_says_how_that_one_ended() -> None:
    # "cancelled: a job it depends on failed" of one whose dependency was cancelled, not
    # failed (tester h146): the engine's words say which, and how it ended.
    from gpulayer_tui.screens.job_detail import status_words

    for how in ("cancelled", "failed", "timed_out"):
        job = {
            "status": "cancelled",
            "termination_reason": "dependency_failed",
            "message": f"dependency job 5 {how}",
        }
        assert status_words(job) == f"cancelled: dependency job 5 {how}"  # type: ignore[arg-type]


async def test_a_shared_boxs_table_keeps_user_where_the_width_would_hide_it() -> None:
    # At 100-129 columns USER was hidden: a shared box's users could not tell whose a row
    # was (tester h179). Once the table holds two users' jobs, DOMAINS goes instead.
    from gpulayer_tui.app import build_app
    from tests.ui_support import jobs_fixture

    jobs = jobs_fixture()
    app = build_app(StaticBackend(jobs=jobs), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 30)) as pilot:
        await _show_jobs(pilot)
        table = table_of(app)
        keys = [str(c.key.value) for c in table.columns.values()]
        assert "user" not in keys and "domains" in keys  # (one user: nothing to tell apart)
        theirs = {**jobs[0], "id": 99, "name": "theirs", "owner_uid": 0}
        app.job_store.apply(theirs)
        await until(
            pilot,
            lambda: "user" in [str(c.key.value) for c in table.columns.values()],
            "USER shown",
        )
        keys = [str(c.key.value) for c in table.columns.values()]
        assert "domains" not in keys
