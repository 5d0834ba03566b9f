"""Jobs: the table of jobs, with sort, filter as you type and a status filter.

The table holds the active jobs and the pages of history reached so far: a filter or sort
asks the engine for that view's first page, and nearing the end of the table loads the
next one (see :mod:`..job_feed`).
"""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Input, Label, Static

from .. import keymap
from ..cells import cut_to_width
from ..fields import printable
from ..job_feed import JobView
from ..key_hold import release_keys
from ..view import view_of
from ..widgets.engine_status import EngineStatus
from ..widgets.field_input import after_typed
from ..widgets.job_columns import SORTS, STATUS_FILTERS
from ..widgets.job_table import JobTable
from ..widgets.key_footer import KeyFooter
from ..widgets.one_line_input import OneLineInput
from ..wire import ACTIVE_STATUSES, JobJSON, JobRowJSON
from .actions import (
    SaysWhyKeysAreDimmed,
    ask_to_cancel,
    ask_to_cancel_many,
    ask_to_edit,
    ask_to_restart,
    can_edit,
    can_restart,
    not_yours,
)
from .resume import KeepsStylesOnResume
from .stale import mark_while_no_engine

FILTER_DEBOUNCE = 0.15
"""Seconds of quiet typing before the filter is applied (each apply rebuilds the rows)."""


class JobsScreen(SaysWhyKeysAreDimmed, KeepsStylesOnResume, Screen[None]):
    """Every job in a table: ``/`` filters as you type, ``s`` by status, ``o``/``r`` sort."""

    # The table from the first frame: Textual's default focused the first focusable widget,
    # the hidden filter, until on_mount moved on, and keys typed in between (2 then k j k,
    # or q) went into it, emptying the table.
    AUTO_FOCUS = "JobTable"

    DEFAULT_CSS = """
    JobsScreen #jobs-bar {
        height: 1;
        padding: 0 1;
        background: $surface;
    }
    JobsScreen #jobs-view { width: 1fr; }
    JobsScreen.-no-engine JobTable { text-opacity: 50%; }
    JobsScreen #jobs-count { width: auto; color: $text-muted; }
    JobsScreen #filter-row {
        height: 1;
        display: none;
        background: $surface;
    }
    JobsScreen #filter-row.-open { display: block; }
    JobsScreen #filter-prompt { width: 3; padding: 0 1; color: $text-accent; text-style: bold; }
    JobsScreen #filter {
        width: 1fr;
        background: $surface;
    }
    JobsScreen #filter:focus { background: $boost; }
    JobsScreen #jobs-empty { display: none; height: 1fr; padding: 1 2; color: $text-muted; }
    JobsScreen.-empty #jobs-empty { display: block; }
    JobsScreen.-empty JobTable { height: auto; }
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("jobs"))
    KEYMAP_SCOPE: ClassVar[str] = "jobs"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen_version = 0
        self._filter_timer: Timer | None = None
        self._select_when_shown: int | None = None  # a restarted job's new id

    def compose(self) -> ComposeResult:
        yield EngineStatus("jobs")
        with Horizontal(id="jobs-bar"):
            yield Label("", id="jobs-view")
            yield Label("", id="jobs-count")
        with Horizontal(id="filter-row"):
            yield Label("/", id="filter-prompt")
            filter_input = OneLineInput(
                placeholder=(
                    "filter on id, name, command, message, status, project or domain (esc clears)"
                ),
                compact=True,
                id="filter",
            )
            # (the keys after them are for the table the filter leaves, filtered)
            filter_input.keys_that_apply_later = frozenset({"enter", "down"})
            yield filter_input
        yield JobTable(id="jobs-table")
        # (an empty table showed its header alone: no word of why)
        yield Static("", id="jobs-empty")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        app = view_of(self)
        self.query_one("#filter", Input).cursor_blink = getattr(app, "cursor_blink", True)
        self.watch(self.app, "jobs_version", self._jobs_changed, init=True)
        self.watch(self.app, "job_pages", self._pages_changed, init=False)
        mark_while_no_engine(self)
        self.query_one(JobTable).focus()

    @property
    def table(self) -> JobTable:
        """The jobs table."""
        return self.query_one(JobTable)

    # -- keeping current --------------------------------------------------------------------

    def _jobs_changed(self, _version: int = 0) -> None:
        app = view_of(self)
        self._seen_version = self.table.sync(app.job_store, self._seen_version)
        self.table.set_frontier(app.job_feed.frontier)
        if self._select_when_shown is not None and self.table.select_job(self._select_when_shown):
            self._select_when_shown = None
        self._update_bar()

    def _pages_changed(self, _pages: int = 0) -> None:
        self.table.set_frontier(view_of(self).job_feed.frontier)
        self._update_bar()

    def _view_changed(self) -> None:
        """The filter or sort changed: the bar says so, and the engine serves the view's
        first page (across all of history, not only what is loaded)."""
        table = self.table
        statuses = STATUS_FILTERS[table.status_filter]
        view_of(self).show_jobs(
            JobView(
                text=table.filter_text,
                statuses=tuple(sorted(statuses or ())),
                sort=table.sort_key,
                descending=table.sort_reverse,
            )
        )
        # (a restarted job the filter hid: the view that shows it puts the cursor on it)
        if self._select_when_shown is not None and table.select_job(self._select_when_shown):
            self._select_when_shown = None
        self._update_bar()

    @on(JobTable.ColumnsChanged)
    def _columns_changed(self) -> None:
        self._update_bar()

    @on(JobTable.NearEnd)
    def _near_end(self) -> None:
        view_of(self).fetch_more_jobs()

    @on(JobTable.RowHighlighted)
    def _row_moved(self) -> None:
        self.refresh_bindings()  # "cancel" follows the job under the cursor

    def _update_bar(self, _pages: int = 0) -> None:
        table = self.table
        parts: list[str | tuple[str, str]] = [
            ("status ", "$foreground-muted"),
            (table.status_filter, "bold $text-accent"),
        ]
        # (The filter before the sort: at 80 columns the bar was cut in the sort's note and
        # the filter's text never showed, so a table it emptied looked wrong: tester h70.)
        if table.filter_text:
            # (cut: a long one ran the sort into the count at 80 columns: tester h73)
            term = cut_to_width(printable(table.filter_text), 20)
            parts += [("   filter ", "$foreground-muted"), (term, "bold $text-accent")]
        parts += [
            ("   sort ", "$foreground-muted"),
            (
                SORTS[table.sort_key][0] + (" ▼" if table.sort_reverse else " ▲"),
                "bold $text-accent",
            ),
        ]
        if table.sort_hidden:  # (a resize hid the column: the order stays, o moves on)
            parts.append((" (hidden)", "$foreground-muted"))
        self.query_one("#jobs-view", Label).update(Content.assemble(*parts))
        shown, total = table.row_count, table.total_count
        more = "+" if view_of(self).job_feed.known_more else ""  # (older pages load on scroll)
        if table.filter_text or table.status_filter != "all":
            # The engine serves a filtered view: the rows it matched, not "of" the rows
            # loaded, which depend on what was loaded before (an engine restart made "1 of
            # 23 jobs" "1 of 6 jobs", the same history: tester h105).
            noun = "job" if shown == 1 and not more else "jobs"
            count = f"{shown:,}{more} matching {noun}"
        else:
            noun = "job" if total == 1 and not more else "jobs"
            count = (
                f"{total:,}{more} {noun}"
                if shown == total
                else f"{shown:,} of {total:,}{more} {noun}"
            )
        marked = len(table.marked)
        if marked:
            # (marks can sit on rows a filter hides: the count says they are there; the
            # keys are in help: at 80 columns they pushed the filter and sort out: h112)
            count = f"{marked:,} marked · {count}"
        self.query_one("#jobs-count", Label).update(count)
        self._say_when_empty()
        self.refresh_bindings()  # (enter and c, R, e: the view may have emptied or filled)

    def _say_when_empty(self) -> None:
        table = self.table
        empty = table.row_count == 0 and view_of(self).job_store.loads > 0
        self.set_class(empty, "-empty")
        if not empty:
            return
        if table.filter_text or table.status_filter != "all":
            said = "No job matches this view: esc clears the filter, s changes the status shown."
        else:
            said = "No jobs yet: n submits one (or gpulayer-tui submit -- COMMAND)."
        self.query_one("#jobs-empty", Static).update(said)
        self.refresh_bindings()  # "clear filters" shows only while filtering

    # -- filtering --------------------------------------------------------------------------

    def action_start_filter(self) -> None:
        """Show the filter line and type into it (focused now, not after the keys already
        on their way: Widget.focus waits its turn behind them, and "/q" in one burst quit
        the app: tester h50)."""
        self.query_one("#filter-row").add_class("-open")
        self.set_focus(self.query_one("#filter", Input))
        self.refresh_bindings()

    @on(Input.Changed, "#filter")
    def _filter_typed(self, event: Input.Changed) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._filter_timer = self.set_timer(FILTER_DEBOUNCE, self._apply_filter)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        self._apply_filter()
        if not event.value.strip():
            self.query_one("#filter-row").remove_class("-open")
        self.table.focus()

    def _apply_filter(self) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None
        self.table.set_filters(text=self.query_one("#filter", Input).value)
        self._view_changed()

    def action_clear_filter(self) -> None:
        """Clear the text filter (or, with none, the status filter); back to the table."""
        filter_row = self.query_one("#filter-row")
        filter_input = self.query_one("#filter", Input)
        if (
            self.table.marked
            and not filter_row.has_class("-open")
            and not self.table.filter_text
            and self.table.status_filter == "all"
        ):
            self.table.clear_marks()
            self._update_bar()
            return
        if filter_row.has_class("-open") or self.table.filter_text:
            with filter_input.prevent(Input.Changed):
                filter_input.value = ""
            if self._filter_timer is not None:
                self._filter_timer.stop()
                self._filter_timer = None
            filter_row.remove_class("-open")
            self.table.set_filters(text="")
        else:
            self.table.set_filters(status="all")
        self.table.focus()
        self._view_changed()

    def action_focus_table(self) -> None:
        """Leave the filter line for the table (the filter stays); a priority key, so
        the focus moves before the next key is routed (see keymap)."""
        if not self._in_filter():
            raise SkipAction()
        self.set_focus(self.table)
        after_typed(self, self._filter_left)

    def _filter_left(self) -> None:
        self._apply_filter()
        release_keys(self)  # (held since the key: see FieldInput.keys_that_apply_later)

    def _in_filter(self) -> bool:
        focused = self.focused
        return isinstance(focused, Input) and focused.id == "filter"

    @on(OneLineInput.ManyLinesPasted)
    def _many_lines(self, event: OneLineInput.ManyLinesPasted) -> None:
        self.notify(
            f"pasted {event.lines} lines: the filter is one line; nothing was pasted",
            severity="warning",
        )

    def _filter_entered(self) -> None:
        self._apply_filter()
        if not self.query_one("#filter", Input).value.strip():
            self.query_one("#filter-row").remove_class("-open")
        release_keys(self)  # (held since the key: see FieldInput.keys_that_apply_later)

    def action_cycle_status(self, step: int) -> None:
        """Show the next (or previous) group of statuses."""
        names = list(STATUS_FILTERS)
        current = names.index(self.table.status_filter)
        self.table.set_filters(status=names[(current + step) % len(names)])
        self._view_changed()

    # -- sorting ----------------------------------------------------------------------------

    def action_sort(self, step: int = 1) -> None:
        """Sort by the next (or previous) column shown at this width, in the order of
        :data:`SORTS` (a hidden column is skipped)."""
        names = list(SORTS)
        shown = self.table.visible_sorts
        current = names.index(self.table.sort_key)
        for offset in range(1, len(names) + 1):
            key = names[(current + step * offset) % len(names)]
            if key in shown:
                break
        self.table.set_sort(key)
        self._to_the_top()
        self._view_changed()

    def action_reverse_sort(self) -> None:
        """Reverse the sort order."""
        self.table.set_sort(self.table.sort_key, not self.table.sort_reverse)
        self._to_the_top()
        self._view_changed()

    @on(JobTable.HeaderSelected)
    def _header_selected(self, event: JobTable.HeaderSelected) -> None:
        """A click on a column's head sorts by it (by the one sorted already, the other
        way round); the message column has no sort (tester h165: a click did nothing)."""
        event.stop()
        key = event.column_key.value
        if key not in SORTS:
            return
        if key == self.table.sort_key:
            self.action_reverse_sort()
            return
        self.table.set_sort(key)
        self._to_the_top()
        self._view_changed()

    def _to_the_top(self) -> None:
        """A new order is read from its first row: the view stayed on the row the cursor
        was on, so the first rows seen were not the first of the order, and it read as a
        wrong sort (tester h67)."""
        if self.table.row_count:
            self.table.move_cursor(row=0, animate=False)
            self.table.scroll_home(animate=False)

    # -- acting on a job --------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Offer "clear filters" only while a filter is set; "cancel", "restart" and
        "edit" (dimmed otherwise) only on a job they apply to (active, ended, waiting)."""
        if action in ("cancel_job", "restart_job", "edit_job"):
            if isinstance(self.focused, Input):
                return False  # (letters typed there are text: "R Restart" stayed: h83)
            job_id = self.table.cursor_job_id
            job = None if job_id is None else self.table.job(job_id)
            where = view_of(self).backend.location
            if not self.table.marked and job is not None and not_yours(where, job):
                return None  # (another user's: dimmed, said why when pressed; h179)
            if action == "restart_job":
                return True if can_restart(job) else None
            if action == "edit_job":
                return True if can_edit(job) else None
            if self.table.marked:
                return True  # (c cancels the marked jobs, wherever the cursor is)
            return True if job is not None and job.get("status") in ACTIVE_STATUSES else None
        if action == "open_job" and not self._in_filter():
            # (dimmed on an empty view, as c, R and e are: tester h95)
            return True if self.table.cursor_job_id is not None else None
        if action == "start_filter":  # (in the filter line, "/" is text)
            return not isinstance(self.focused, Input) or self.focused.id != "filter"
        if action in ("toggle_mark", "mark_shown"):
            # (typed in the filter line, space and a are text)
            return not isinstance(self.focused, Input)
        if action == "clear_filter":
            table = self.table
            filtering = bool(table.filter_text) or table.status_filter != "all"
            open_row = self.query_one("#filter-row").has_class("-open")
            return filtering or open_row or bool(table.marked)
        return True

    def action_open_job(self) -> None:
        """Open the job under the cursor; in the filter line (a priority key, so that the
        focus moves before the next key is routed: see keymap), apply the filter (closed
        if empty) and go back to the table."""
        if self._in_filter():
            self.set_focus(self.table)
            after_typed(self, self._filter_entered)
            return
        # The row under the cursor once the keys typed before enter have moved it, and a
        # filter entered before it applied: "j j j enter" opened the row the cursor left,
        # and "/ word enter enter" a job the filter hid (tester h61).
        after_typed(self, self._open_cursor_job)

    def _open_cursor_job(self) -> None:
        job_id = self.table.cursor_job_id
        if job_id is not None:
            self._open(job_id)

    @on(JobTable.JobChosen)
    def _job_chosen(self, event: JobTable.JobChosen) -> None:
        self._open(event.job_id)

    def _open(self, job_id: int) -> None:
        app = view_of(self)
        app.open_job(job_id)

    def action_cancel_job(self) -> None:
        """Cancel the marked jobs, or with none marked the job under the cursor (after a
        confirmation)."""
        table = self.table
        if table.marked:
            ordered = table.in_table_order(table.marked)
            jobs = [job for job in map(table.job, ordered) if job is not None]
            ask_to_cancel_many(self, jobs, self._unmark)
            return
        job = self._cursor_job()
        if job is not None:
            ask_to_cancel(self, job)

    def _unmark(self, job_ids: list[int]) -> None:
        for job_id in job_ids:
            self.table.set_marked(job_id, False)
        self._update_bar()

    def action_toggle_mark(self) -> None:
        """Mark the job under the cursor for one cancel of several (or unmark it); the
        cursor moves down, so that space space space marks three in a row."""
        table = self.table
        job_id = table.cursor_job_id
        if job_id is None:
            self.app.notify("no job selected", severity="warning")
            return
        if not table.set_marked(job_id, job_id not in table.marked):
            job = table.job(job_id)
            status = "" if job is None else job.get("status", "")
            self.app.notify(
                f"job {job_id} already {status}: only a waiting or running job is marked "
                "(c cancels the marked jobs)",
                severity="warning",
            )
            # (passed over, the cursor still moves on: it stayed, and every space after it
            # was refused on the same ended row, the run of marks lost: tester h146)
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1, animate=False)
        self._update_bar()

    def action_mark_shown(self) -> None:
        """Mark every waiting or running job the view shows (filter first: ``/`` and
        ``s``), or unmark those when each is marked already; marks the view hides stay
        (every mark went, those a filter hid too, unsaid: tester h112)."""
        table = self.table
        shown = table.shown_active()
        if not shown:
            self.app.notify("no waiting or running job is shown", severity="warning")
            return
        marked = set(table.marked)
        unmark = all(job_id in marked for job_id in shown)
        for job_id in shown:
            table.set_marked(job_id, not unmark)
        if not unmark and view_of(self).job_feed.known_more:
            # (only the rows loaded: the oldest active jobs went unmarked, unsaid: h112)
            self.app.notify(
                f"{len(shown):,} shown marked; older jobs are not loaded yet (G loads "
                "them, or s shows the active ones alone)",
                severity="warning",
            )
        self._update_bar()

    def _cursor_job(self) -> JobRowJSON | None:
        job_id = self.table.cursor_job_id
        job = None if job_id is None else self.table.job(job_id)
        if job is None:
            self.app.notify("no job selected", severity="warning")
        return job

    def action_restart_job(self) -> None:
        """Run the ended job under the cursor again (after a confirmation); the cursor
        goes to the new job."""
        job = self._cursor_job()
        if job is not None:
            ask_to_restart(self, job, self.select_new)

    def select_new(self, job: JobJSON) -> None:
        """Put the cursor on a job just made (a restart), now or once the table has it."""
        if not self.table.select_job(job["id"]):
            self._select_when_shown = job["id"]  # once the table has it (filters allowing)
            hidden_by = self.table.hides(job)
            if hidden_by:
                # (the cursor stayed on the old job and nothing said why: tester h89)
                self.notify(f"job {job['id']} is not in this view: {hidden_by}", severity="warning")

    def action_edit_job(self) -> None:
        """Edit the waiting job under the cursor (priority, GPUs, VRAM, timeout), or scale
        the running service under it."""
        job = self._cursor_job()
        if job is not None:
            ask_to_edit(self, job)
