"""The jobs table: one row per job, keyed by id, updated in place from the job store.

Built for a long history (10,000 jobs and more):

* :meth:`JobTable.sync` touches only the jobs the store reports as changed: a changed
  cell is updated in place, a new job is added, and the rows are re-sorted only when a row
  was added or a sort key moved. Nothing is cleared and re-added on a change.
* Cells are light objects that format their job only when drawn (the table caches what
  it drew); columns have set widths, so adding 10,000 rows formats and measures
  nothing, and rows are added in one batch.
* Colours come from component classes, looked up when a cell is drawn, so switching the
  theme recolours every row without touching one.
* Filtering (text and status) rebuilds the rows that match; the screen debounces typing.

Why this module is over ~400 lines: the row cache, incremental updates, sorting, filtering
and the per-cell theme lookup work on the same row store, for speed at 10,000 rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from rich.console import Console, ConsoleOptions
from rich.containers import Lines
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events, on
from textual.binding import BindingType
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable
from textual.widgets.data_table import (
    CellDoesNotExist,
    Column,
    ColumnKey,
    DuplicateKey,
    Row,
    RowDoesNotExist,
    RowKey,
)

from .. import keymap
from ..formatting import duration, live_message, run_started_at
from ..job_store import JobStore
from ..wire import ACTIVE_STATUSES, JobRowJSON
from .job_columns import (
    BY_KEY,
    COLUMNS,
    LAYOUTS,
    MIN_MESSAGE_WIDTH,
    SORTS,
    START_LAYOUT,
    STATUS_FILTERS,
    ColumnSpec,
    Layout,
    Parts,
    domains_text,
    filter_haystack,
    filter_matches,
    gpus_text,
    health_parts,
    job_spec,
    kind_parts,
    priority_text,
    reason_prefix,
    runtime_seconds,
    sort_value,
    started_text,
    use_texts,
    user_text,
    vram_text,
)
from .own_keys import OwnKeys

NEAR_END_ROWS = 100
"""How close to the last row the cursor or the view gets before more history is loaded."""

# Beyond this many rows leaving the table in one sync, rebuilding is cheaper than
# removing them one at a time (each removal renumbers every row).
_REMOVE_IN_PLACE_LIMIT = 64
# Likewise for changed rows: each in-place update touches every cell of its row.
_UPDATE_IN_PLACE_LIMIT = 2_000


class _Cell:
    """One cell of a job's row, drawn from the job when it is drawn.

    Nothing is formatted until the table draws the cell (and the table caches what it
    drew), so adding 10,000 rows costs one small object per cell. Colours come from the
    table's component classes at that moment, so a theme switch recolours every row.
    ``str(cell)`` is the cell's plain text. There is no ``__rich_measure__`` on purpose:
    every column has a set width, and a cell that cannot be measured costs DataTable
    nothing when rows arrive.
    """

    __slots__ = ("job", "key", "table")

    def __init__(self, table: JobTable, job: JobRowJSON, key: str) -> None:
        self.table = table
        self.job = job
        self.key = key

    def __str__(self) -> str:
        return "".join(text for text, _ in self.table.cell_parts(self.job, self.key))

    def text(self) -> Text:
        """The cell as styled text (one line, cut with an ellipsis, justified)."""
        table = self.table
        text = Text(no_wrap=True, overflow="ellipsis", justify=BY_KEY[self.key].justify, end="")
        for part, component in table.cell_parts(self.job, self.key):
            text.append(part, table.component_style(component) if component else None)
        return text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        yield self.text()


class JobTable(OwnKeys, DataTable[Any]):
    """Every job, one row each (keyed by job id), with sort, text filter and status filter.

    Feed it with :meth:`sync` whenever the job store changed; select a row (enter or a
    click) to post :class:`JobTable.JobChosen`.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "jobtable--pending",
        "jobtable--queued",
        "jobtable--running",
        "jobtable--completed",
        "jobtable--failed",
        "jobtable--cancelled",
        "jobtable--orphaned",
        "jobtable--reason",
        "jobtable--muted",
        "jobtable--replicas-up",
        "jobtable--replicas-down",
        "jobtable--marked",
    }

    DEFAULT_CSS = """
    JobTable {
        height: 1fr;
        max-height: 100%;
        scrollbar-gutter: stable;
        background: $surface;
    }
    JobTable > .jobtable--pending { color: $text-muted; }
    JobTable > .jobtable--queued { color: $text-warning; }
    JobTable > .jobtable--running { color: $text-primary; text-style: bold; }
    JobTable > .jobtable--completed { color: $text-success; }
    JobTable > .jobtable--failed { color: $text-error; text-style: bold; }
    JobTable > .jobtable--cancelled { color: $text-muted; text-style: italic; }
    JobTable > .jobtable--orphaned { color: $text-error; text-style: italic; }
    JobTable > .jobtable--reason { color: $text-accent; }
    JobTable > .jobtable--muted { color: $text-muted; }
    JobTable > .jobtable--replicas-up { color: $text-success; }
    JobTable > .jobtable--replicas-down { color: $text-warning; text-style: bold; }
    JobTable > .jobtable--marked { color: $text-accent; text-style: bold; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        *keymap.bindings(keymap.TABLE),
        *keymap.jobs_table_bindings(),  # (marks: in the order typed, see keymap)
    ]

    _column_order: tuple[int, list[Column]] | None = None
    """Cache of :attr:`ordered_columns` (a class default: DataTable asks during __init__)."""

    class JobChosen(Message):
        """The user chose a job (enter or click on its row)."""

        def __init__(self, job_id: int) -> None:
            super().__init__()
            self.job_id = job_id
            """The chosen job's id."""

    class ColumnsChanged(Message):
        """A resize changed which columns are shown (the sorted one may be hidden now)."""

    class NearEnd(Message):
        """The cursor or the scrolled view came within :data:`NEAR_END_ROWS` rows of the
        last row: the screen loads the next page of history."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(
            cursor_type="row",
            zebra_stripes=True,
            cell_padding=1,
            name=name,
            id=id,
            classes=classes,
        )
        self._clock = clock
        self._jobs: dict[int, JobRowJSON] = {}
        """Every job the table knows (shown or filtered out)."""
        self._shown: set[int] = set()
        """Jobs with a row in the table."""
        self._haystack: dict[int, str] = {}
        self._running_ids: set[int] = set()
        # Whose jobs it has held: once two users', USER is shown where the width hides
        # it (DOMAINS going instead), or a shared box's rows could not be told apart.
        self._owners: set[object] = set()
        self._marked: dict[int, None] = {}
        """Jobs marked (space) for one cancel, in the order marked; only active jobs."""
        self._filter_text = ""
        self._status_filter = "all"
        self._sort_key = "id"
        self._sort_reverse = True
        self._frontier: int | None = None
        """Newest first, with older pages still to load: the oldest id loaded of the view
        (rows below it are hidden until their page comes)."""
        self._layout = START_LAYOUT
        self._message_width = 40
        self._prewarm_pending = False  # a draw of the next page is scheduled
        self._prewarm_up = False  # the last scroll went up: draw the page above

    # -- public state -----------------------------------------------------------------------

    @property
    def filter_text(self) -> str:
        """The text filter (matched case-insensitively on id, name, command, message,
        status and domain names: :func:`.job_columns.filter_haystack`)."""
        return self._filter_text

    @property
    def status_filter(self) -> str:
        """The status filter: a key of :data:`STATUS_FILTERS`."""
        return self._status_filter

    @property
    def sort_key(self) -> str:
        """The sort column: a key of :data:`SORTS`."""
        return self._sort_key

    @property
    def visible_sorts(self) -> list[str]:
        """The sorts of the columns shown at this width, in cycling order (``o``/``O``
        cycle through these only; ``id`` is always shown)."""
        return [key for key in SORTS if key not in self._layout.hidden]

    @property
    def sort_hidden(self) -> bool:
        """True when the sorted column is not shown at this width (a resize hid it: the
        order stays, and the jobs screen says so)."""
        return self._sort_key in self._layout.hidden

    @property
    def sort_reverse(self) -> bool:
        """True when sorted descending."""
        return self._sort_reverse

    @property
    def total_count(self) -> int:
        """Jobs known, shown or not (down to the frontier: :meth:`set_frontier`)."""
        frontier = self._frontier
        if frontier is not None and self._frontier_applies():
            return sum(1 for job_id in self._jobs if job_id >= frontier)
        return len(self._jobs)

    def set_frontier(self, oldest_loaded: int | None) -> None:
        """Newest first, the view's pages are loaded down to ``oldest_loaded`` (``None``:
        all of them, or another order). Rows known below it (the active jobs and today's
        failed ones, loaded for the dashboard) are hidden until their page comes: shown,
        the table read as the whole list, its bottom failed jobs only (tester h76)."""
        old = self._frontier
        if oldest_loaded == old:
            return
        self._frontier = oldest_loaded
        if not (self._sort_key == "id" and self._sort_reverse):
            return  # (another order: nothing hidden either way)
        # The rows whose side of it changed, shown or hidden in place (a rebuild put the
        # view back at its top, and its empty moment asked for the next page).
        bounds = sorted(f for f in (old, oldest_loaded) if f is not None)
        low, high = (bounds[0], bounds[1]) if len(bounds) == 2 else (-1, bounds[0])
        self.apply_jobs([job for job_id, job in self._jobs.items() if low <= job_id < high])

    def _frontier_applies(self) -> bool:
        return self._frontier is not None and self._sort_key == "id" and self._sort_reverse

    @property
    def cursor_job_id(self) -> int | None:
        """The job under the cursor (None when the table is empty)."""
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except CellDoesNotExist:  # the cursor can briefly point past a shrinking table
            return None
        return None if row_key.value is None else int(row_key.value)

    def job(self, job_id: int) -> JobRowJSON | None:
        """The latest copy of one job the table knows."""
        return self._jobs.get(job_id)

    # -- marks ------------------------------------------------------------------------------

    @property
    def marked(self) -> list[int]:
        """The jobs marked for one cancel, in the order marked (each still active)."""
        return list(self._marked)

    def set_marked(self, job_id: int, marked: bool) -> bool:
        """Mark or unmark one job; False (nothing done) for a job that is not active, or
        one the table does not know: a mark is for a cancel."""
        job = self._jobs.get(job_id)
        if marked and (job is None or job.get("status") not in ACTIVE_STATUSES):
            return False
        if marked == (job_id in self._marked):
            return True
        if marked:
            self._marked[job_id] = None
        else:
            del self._marked[job_id]
        if job is not None and job_id in self._shown:
            self._update_row(job)
        return True

    def shown_active(self) -> list[int]:
        """The waiting or running jobs the view shows (the loaded rows), in table order."""
        shown = []
        for row_key in self.rows:
            job = None if row_key.value is None else self._jobs.get(int(row_key.value))
            if job is not None and job.get("status") in ACTIVE_STATUSES:
                shown.append(int(job["id"]))
        return shown

    def in_table_order(self, job_ids: Iterable[int]) -> list[int]:
        """``job_ids`` as the table lists them; those it does not show (a filter hides
        them) after, in the order given."""
        wanted = list(job_ids)
        rows = {int(k.value): i for i, k in enumerate(self.rows) if k.value is not None}
        return sorted(wanted, key=lambda j: (j not in rows, rows.get(j, 0)))

    def clear_marks(self) -> None:
        """Unmark every job."""
        for job_id in list(self._marked):
            self.set_marked(job_id, False)

    def component_style(self, component: str) -> Style:
        """The Rich style of one of our component classes (for cells as they are drawn).

        Colours are resolved against the table's background (``$text-muted`` is a
        translucent colour), but the background itself is left to the row, so zebra
        stripes and the cursor still show.
        """
        style = self.get_component_rich_style(component)
        return style.without_color + Style(color=style.color)

    # -- feeding ----------------------------------------------------------------------------

    def sync(self, job_store: JobStore, since_version: int) -> int:
        """Apply what changed in ``job_store`` after ``since_version`` (0: everything).

        Returns:
            The store's version now (pass it back next time).
        """
        changed = job_store.changed_since(since_version)
        store_jobs: dict[int, JobRowJSON] = job_store.jobs
        gone: list[int] = []
        if (
            since_version <= 0
            or len(changed) >= len(store_jobs)
            or len(self._jobs) > len(store_jobs)
        ):
            # A (re)load replaced the store: drop the jobs it no longer has.
            gone = [job_id for job_id in self._jobs if job_id not in store_jobs]
        if not changed and not gone:
            return int(job_store.version)
        self.apply_jobs((store_jobs[i] for i in changed if i in store_jobs), removed=gone)
        return int(job_store.version)

    def apply_jobs(self, jobs: Iterable[JobRowJSON], removed: Iterable[int] = ()) -> None:
        """Take new copies of ``jobs`` (added or updated) and drop the ``removed`` ids."""
        now = self._now()
        cursor_job = self.cursor_job_id
        was_empty = self.row_count == 0
        jobs = list(jobs)
        to_add: list[JobRowJSON] = []
        to_remove: list[int] = []
        resort = False
        for job_id in removed:
            self._forget(job_id)
            if job_id in self._shown:
                to_remove.append(job_id)
        if len(jobs) > _UPDATE_IN_PLACE_LIMIT and not was_empty:
            # A reload (the event stream was cut): starting over is cheaper.
            for job in jobs:
                self._remember(job)
            self._rebuild(cursor_job)
            return
        for job in jobs:
            job_id = job["id"]
            old = self._jobs.get(job_id)
            self._remember(job)
            if not self._matches(job):
                if job_id in self._shown:
                    to_remove.append(job_id)
                continue
            if job_id not in self._shown:
                to_add.append(job)
                continue
            self._update_row(job)
            if old is not None and sort_value(self._sort_key, old, now) != sort_value(
                self._sort_key, job, now
            ):
                resort = True
        if len(to_remove) > _REMOVE_IN_PLACE_LIMIT:
            self._rebuild(cursor_job)
            return
        for job_id in to_remove:
            self._remove_row(job_id)
        if to_add:
            if was_empty and not to_remove:
                # A first load: add the rows in order and skip the sort.
                to_add.sort(
                    key=lambda j: sort_value(self._sort_key, j, now), reverse=self._sort_reverse
                )
                resort = False
            else:
                resort = True
            self._add_rows(to_add)
        if resort:
            self._sort(now)
        self._restore_cursor(cursor_job)

    # -- reaching the end ------------------------------------------------------------------

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        """Scrolling near the end asks for more history; the next page is drawn ahead."""
        super().watch_scroll_y(old_value, new_value)
        self._check_near_end()
        self._prewarm_up = new_value < old_value
        if not self._prewarm_pending:
            self._prewarm_pending = True
            self.call_after_refresh(self._prewarm_next_page)

    def _prewarm_next_page(self) -> None:
        """Draw the cells of the next page (below, or above when scrolling up) into the
        table's cell cache, once the frame the user waits for is out: a PageDown then
        finds most of its ~700 cells drawn (each new cell costs ~0.03 ms: most of a
        PageDown's time)."""
        self._prewarm_pending = False
        if not self.is_mounted or not self.row_count:
            return
        height = self.scrollable_content_region.height
        top = int(self.scroll_y)
        start = max(0, top - height) if self._prewarm_up else top + height
        stop = min(self.row_count, start + height)
        if start >= stop:
            return
        base = self.rich_style
        # (What render_lines sets before drawing; part of every cell's cache key.)
        self._pseudo_class_state = self.get_pseudo_class_state()
        widths = [column.get_render_width(self) for column in self.ordered_columns]
        cursor_row = self.cursor_row
        for row_index in range(start, stop):
            if row_index == cursor_row:
                continue  # (drawn with the cursor, another key)
            row_style = self._get_row_style(row_index, base)
            for column_index, width in enumerate(widths):
                self._render_cell(row_index, column_index, row_style, width)

    def watch_cursor_coordinate(
        self, old_coordinate: Coordinate, new_coordinate: Coordinate
    ) -> None:
        """Moving the cursor near the end asks for more history."""
        super().watch_cursor_coordinate(old_coordinate, new_coordinate)
        self._check_near_end()

    def _check_near_end(self) -> None:
        last_seen = max(self.cursor_row, int(self.scroll_y) + self.scrollable_content_region.height)
        if last_seen >= self.row_count - NEAR_END_ROWS:
            self.post_message(self.NearEnd())

    def set_filters(self, text: str | None = None, status: str | None = None) -> None:
        """Change the text and/or status filter; rebuilds the rows that match."""
        new_text = self._filter_text if text is None else text.strip()
        new_status = self._status_filter if status is None else status
        if new_status not in STATUS_FILTERS:
            raise ValueError(f"unknown status filter {new_status!r}")
        if (new_text, new_status) == (self._filter_text, self._status_filter):
            return
        self._filter_text = new_text
        self._status_filter = new_status
        self._rebuild(self.cursor_job_id)

    def set_sort(self, key: str, reverse: bool | None = None) -> None:
        """Sort by ``key`` (a key of :data:`SORTS`); ``reverse`` defaults to the key's own."""
        if key not in SORTS:
            raise ValueError(f"unknown sort {key!r}")
        hid_below_frontier = self._frontier_applies()
        self._sort_key = key
        self._sort_reverse = SORTS[key][1] if reverse is None else reverse
        cursor_job = self.cursor_job_id
        self._update_labels()
        if self._frontier_applies() != hid_below_frontier:
            # The rows below the frontier are shown in any other order, hidden newest
            # first: re-sorting only the rows shown left out the queued and failed jobs
            # of older pages, sorted by status (tester h95).
            self._rebuild(cursor_job)
            return
        self._sort(self._now())
        self._restore_cursor(cursor_job)

    # -- lifecycle --------------------------------------------------------------------------

    def on_mount(self) -> None:
        self._add_columns()
        self.set_interval(1.0, self._tick_runtimes)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_columns(event.size.width)

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.JobChosen(int(event.row_key.value)))

    # -- rows -------------------------------------------------------------------------------

    def _now(self) -> float:
        clock = self._clock or getattr(self.app, "clock", None) or time.time
        return float(clock())

    def _remember(self, job: JobRowJSON) -> None:
        job_id = job["id"]
        self._jobs[job_id] = job
        owner = job.get("owner_uid")
        if owner not in self._owners:
            self._owners.add(owner)
            if len(self._owners) == 2 and self.is_mounted:
                # (at 100-129 columns a shared box's table had no USER: tester h179)
                self.call_later(self._refit)
        if job_id in self._marked and job.get("status") not in ACTIVE_STATUSES:
            del self._marked[job_id]  # (it ended: nothing left to cancel; its row redraws)
        self._haystack[job_id] = filter_haystack(job)
        if job.get("status") == "running":
            self._running_ids.add(job_id)
        else:
            self._running_ids.discard(job_id)

    def _forget(self, job_id: int) -> None:
        self._jobs.pop(job_id, None)
        self._marked.pop(job_id, None)
        self._haystack.pop(job_id, None)
        self._running_ids.discard(job_id)

    def _matches(self, job: JobRowJSON) -> bool:
        frontier = self._frontier
        if frontier is not None and self._frontier_applies() and job["id"] < frontier:
            return False
        statuses = STATUS_FILTERS[self._status_filter]
        if statuses is not None and job.get("status") not in statuses:
            return False
        if self._filter_text:
            return filter_matches(self._filter_text, self._haystack.get(job["id"], ""))
        return True

    def cell_parts(self, job: JobRowJSON, key: str) -> Parts:
        """What the ``key`` column shows for ``job``, in styled pieces."""
        if key == "id":
            return ((str(job["id"]), "jobtable--marked" if job["id"] in self._marked else ""),)
        if key == "name":
            if job["id"] in self._marked:
                return (("● ", "jobtable--marked"), (str(job.get("name", "")), ""))
            return ((str(job.get("name", "")), ""),)
        if key == "user":
            return ((user_text(job), ""),)
        if key == "kind":
            return kind_parts(job)
        if key == "status":
            # With KIND hidden (under 130 columns) a running service says its replicas'
            # health here: "running" alone hid 1 of 3 down (tester h93).
            health = health_parts(job) if "kind" in self._layout.hidden else None
            if health is not None:
                return health
            status = str(job.get("status", ""))
            return ((status, f"jobtable--{status}"),)
        if key == "message":
            # (being stopped: it counts down to the SIGKILL, refreshed every second)
            message = " ".join(live_message(job, self._now()).split())
            muted = "jobtable--muted" if job.get("status") == "completed" else ""
            prefix = reason_prefix(job)
            if not prefix:
                return ((message, muted),)
            return ((prefix, "jobtable--reason"), (" · " if message else "", ""), (message, muted))
        if key == "domains":
            pinned = job_spec(job).get("domain")
            if not job.get("domains") and pinned and job.get("status") in ("pending", "queued"):
                # Where it may run, muted until it does (empty, only the detail said
                # "pinned to gpu1": tester h87).
                names = [pinned] if isinstance(pinned, str) else [str(d) for d in pinned]
                return ((",".join(names), "jobtable--muted"),)
            return ((domains_text(job), ""),)
        if key == "gpus":
            return ((gpus_text(job), ""),)
        if key == "vram":
            return ((vram_text(job), ""),)
        if key == "priority":
            return ((priority_text(job), ""),)
        if key in ("peak", "util", "energy"):
            peak, util, energy = use_texts(job)
            return (({"peak": peak, "util": util, "energy": energy}[key], ""),)
        if key == "started":
            return ((started_text(run_started_at(job), self._now()), ""),)
        if key == "runtime":
            runtime = runtime_seconds(job, self._now())
            return (("" if runtime is None else duration(runtime), ""),)
        if key == "exit":
            code = job.get("exit_code")
            return (("" if code is None else str(code), "" if code == 0 else "jobtable--reason"),)
        raise KeyError(key)

    def _visible_columns(self) -> list[ColumnSpec]:
        return [c for c in COLUMNS if c.key not in self._layout.hidden]

    def _width(self, column: ColumnSpec) -> int:
        if column.key == "name":
            return self._layout.name_width
        return column.width or self._message_width

    def _add_rows(self, jobs: list[JobRowJSON]) -> None:
        """Add ``jobs`` at the bottom, in the order given."""
        keys = [c.key for c in self._visible_columns()]
        self._shown.update(job["id"] for job in jobs)
        self._append_rows([(str(job["id"]), [_Cell(self, job, k) for k in keys]) for job in jobs])

    def _append_rows(self, rows: list[tuple[str, list[_Cell]]]) -> None:
        """Add rows at the bottom in one go.

        This does per row what :meth:`DataTable.add_row` does (cells, row metadata and
        location), but moves the cursor, bumps the update counter and schedules the idle
        re-layout once for the whole batch instead of once a row: that bookkeeping is most
        of the cost of loading 10,000 rows. Rows are not queued for measuring, as every
        column has a set width and every row is one line high.
        """
        if not rows:
            return
        was_empty = self.row_count == 0
        keys = [column.key for column in self.ordered_columns]
        locations = self._row_locations
        data = self._data
        metadata = self.rows
        index = len(metadata)
        for key, cells in rows:
            row_key = RowKey(key)
            if row_key in locations:
                raise DuplicateKey(f"The row key {row_key!r} already exists.")
            locations[row_key] = index
            data[row_key] = dict(zip(keys, cells, strict=True))
            metadata[row_key] = Row(row_key, 1)
            index += 1
        self._require_update_dimensions = True
        self._update_count += 1
        self.cursor_coordinate = self.cursor_coordinate
        if was_empty and self.show_cursor:
            self._highlight_cursor()
        self.check_idle()
        self.refresh()

    def _update_row(self, job: JobRowJSON) -> None:
        row_key = str(job["id"])
        for column in self._visible_columns():
            self.update_cell(row_key, column.key, _Cell(self, job, column.key))

    def _remove_row(self, job_id: int) -> None:
        self._shown.discard(job_id)
        try:
            self.remove_row(str(job_id))
        except RowDoesNotExist:
            pass

    def _rebuild(self, cursor_job: int | None) -> None:
        now = self._now()
        self.clear()
        self._shown.clear()
        jobs = [job for job in self._jobs.values() if self._matches(job)]
        jobs.sort(key=lambda j: sort_value(self._sort_key, j, now), reverse=self._sort_reverse)
        self._add_rows(jobs)
        self._restore_cursor(cursor_job)

    def hides(self, job: JobRowJSON) -> str:
        """What of this view hides ``job``, and the key that shows it, or "" when the view
        would show it."""
        if self._filter_text and not filter_matches(self._filter_text, filter_haystack(job)):
            return "the text filter hides it (esc clears it)"
        statuses = STATUS_FILTERS[self._status_filter]
        if statuses is not None and job.get("status") not in statuses:
            # (esc clears a text filter first, the status filter after it)
            keys = "esc twice" if self._filter_text else "esc"
            return f"the status filter '{self._status_filter}' hides it ({keys} shows all)"
        return ""

    def select_job(self, job_id: int) -> bool:
        """Put the cursor on a job's row; False when the table does not show it (yet)."""
        if job_id not in self._shown:
            return False
        self._restore_cursor(job_id)
        return True

    def _restore_cursor(self, job_id: int | None) -> None:
        if job_id is None or job_id not in self._shown:
            return
        index = self.get_row_index(str(job_id))
        if index != self.cursor_row:
            self.move_cursor(row=index)

    def _tick_runtimes(self) -> None:
        """Running jobs' runtimes grow: redraw those cells, if they are on screen.

        Any cell update makes DataTable redraw every visible row, so off-screen rows wait
        for the tick after they scroll into view.
        """
        if not self._running_ids:
            return
        if self._sort_key == "runtime" and self._runtime_out_of_order():
            # (sorted once, running jobs stayed below ended ones they had outrun)
            cursor_job = self.cursor_job_id
            self._sort(self._now())
            self._restore_cursor(cursor_job)
        runtime_shown = "runtime" not in self._layout.hidden
        top = int(self.scroll_y)
        bottom = top + self.size.height
        for job_id in self._running_ids & self._shown:
            if top <= self.get_row_index(str(job_id)) <= bottom:
                job = self._jobs[job_id]
                if runtime_shown:
                    self.update_cell(str(job_id), "runtime", _Cell(self, job, "runtime"))
                if job.get("kill_at"):
                    self.update_cell(str(job_id), "message", _Cell(self, job, "message"))

    def _runtime_out_of_order(self) -> bool:
        """Whether a running job's growing runtime has passed a neighbour's (only they
        move under the runtime sort; checked beside each of them, not the whole table)."""
        now = self._now()
        # (the neighbours by index: `ordered_rows` is rebuilt, sorted, after any cell
        # update, and it was read each second: 11 % of a core with 10,000 rows loaded
        # and a service running, idle: tester h76)
        locations = self._row_locations
        for job_id in self._running_ids & self._shown:
            index = self.get_row_index(str(job_id))
            mine = sort_value("runtime", self._jobs[job_id], now)
            for other, after in ((index - 1, False), (index + 1, True)):
                row_key = locations.get_key(other)
                key = None if row_key is None else row_key.value
                if key is None or int(key) not in self._jobs:
                    continue
                theirs = sort_value("runtime", self._jobs[int(key)], now)
                in_order = (theirs >= mine) if after != self._sort_reverse else (theirs <= mine)
                if not in_order:
                    return True
        return False

    # -- drawing ----------------------------------------------------------------------------

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        """One cell's line, as :meth:`DataTable._render_cell` draws it, without Rich's
        general path (padding, styling and cropping renderables, one generator each).

        A page of rows is ~700 new cells, and that path cost ~0.1 ms a cell: most of a
        PageDown. Our cells are one line of text in a column of set width, so the segments
        are built here; they are the same segments, in the same order and styles
        (``tests/test_ui_jobs.py`` compares the two). Anything else (the header, a cell
        that is not ours, a line break or a tab in the text) takes DataTable's own path.
        """
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if (
            row_index < self.fixed_rows
            or column_index < self.fixed_columns
            or row_key is None
            or column_key is None
        ):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        cache_key = (
            row_key,
            column_key,
            base_style,
            cursor,
            hover,
            self._show_hover_cursor,
            self._update_count,
            self._pseudo_class_state,
        )
        cache = self._cell_render_cache
        lines = cache.get(cache_key)
        if lines is not None:
            return lines
        cell = self._data.get(row_key, {}).get(column_key)
        pad = self.cell_padding
        inner = width - 2 * pad
        row = self.rows.get(row_key)
        if not isinstance(cell, _Cell) or inner <= 0 or row is None or row.height != 1:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        text = cell.text()
        if "\n" in text.plain or "\t" in text.plain:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        lines = cache[cache_key] = [
            self._cell_segments(text, row_index, column_index, base_style, inner, cursor, hover)
        ]
        return lines

    def _cell_segments(
        self,
        text: Text,
        row_index: int,
        column_index: int,
        base_style: Style,
        inner: int,
        cursor: bool,
        hover: bool,
    ) -> list[Segment]:
        """What ``Styled(Padding(text, (0, pad)), pre, post)`` renders to, for one line."""
        component_style, post_style = self._get_styles_to_render_cell(
            False,
            False,
            False,
            hover,
            cursor,
            self.show_cursor,
            self._show_hover_cursor,
            self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css",
        )
        pre = base_style + Style.from_meta({"row": row_index, "column": column_index})
        pre = pre + component_style
        console = self.app.console
        # Text.wrap with no_wrap, for one line: justify, then cut.
        Lines([text]).justify(
            console, inner, justify=text.justify or "default", overflow=text.overflow or "ellipsis"
        )
        text.truncate(inner, overflow=text.overflow)
        null = Style.null()
        body = Segment.adjust_line_length(list(text.render(console)), inner, style=null)
        margin = Segment(" " * self.cell_padding, null)
        segments = [margin, *body, margin] if self.cell_padding else body
        post = post_style if post_style else None
        styled: list[Segment] = []
        for part, style, control in segments:
            if control:
                styled.append(Segment(part, None, control))
                continue
            combined = pre + style
            if post is not None:
                combined = combined + post if combined else post
            styled.append(Segment(part, combined))
        return styled

    # -- sorting ----------------------------------------------------------------------------

    def _sort(self, now: float) -> None:
        def key(cell: _Cell) -> tuple[Any, ...]:
            return sort_value(self._sort_key, cell.job, now)

        self.sort("id", key=key, reverse=self._sort_reverse)

    # -- columns ----------------------------------------------------------------------------

    @property
    def ordered_columns(self) -> list[Column]:
        """The columns in display order (cached: DataTable asks twice per added row)."""
        # Columns change only in _add_columns (after a clear); the count keys the cache.
        cached = self._column_order
        if cached is None or cached[0] != len(self.columns):
            cached = self._column_order = (len(self.columns), super().ordered_columns)
        return cached[1]

    def _label(self, column: ColumnSpec) -> Text:
        label = column.label
        if column.key == self._sort_key:
            # The arrow is what says the order: a label too long for its column is cut
            # before it, not the arrow after it ("STARTED…" hid it).
            arrow = "▼" if self._sort_reverse else "▲"
            width = self._width(column)
            if len(label) + 2 <= width:
                return Text(f"{label} {arrow}", justify=column.justify, no_wrap=True)
            if len(label) + 1 <= width:  # (a narrow column: "EXIT▼", not "E… ▼")
                return Text(label + arrow, justify=column.justify, no_wrap=True)
            room = width - 2
            label = label[: max(1, room - 1)] + "…" + " " + arrow
        return Text(label, justify=column.justify, no_wrap=True, overflow="ellipsis")

    def _add_columns(self) -> None:
        for column in self._visible_columns():
            self.add_column(self._label(column), width=self._width(column), key=column.key)
        self._column_order = None

    def _update_labels(self) -> None:
        for column in self._visible_columns():
            self.columns[ColumnKey(column.key)].label = self._label(column)

    def _refit(self) -> None:
        if self.is_mounted and self.size.width:
            self._fit_columns(self.size.width)

    def _fit_columns(self, width: int) -> None:
        """Choose the columns for this width and give the message column what is left.
        Once it holds two users' jobs, USER is kept where DOMAINS can go instead."""
        layout = next(layout for layout in LAYOUTS if width >= layout.min_width)
        if len(self._owners) > 1 and "user" in layout.hidden and "domains" not in layout.hidden:
            hidden = (layout.hidden - {"user"}) | {"domains"}
            layout = Layout(layout.min_width, hidden, layout.name_width)
        visible = [c for c in COLUMNS if c.key not in layout.hidden]
        fixed = sum(layout.name_width if c.key == "name" else c.width for c in visible)
        padding = 2 * self.cell_padding * len(visible)
        gutter = self.styles.scrollbar_size_vertical
        message_width = max(MIN_MESSAGE_WIDTH, width - gutter - fixed - padding)
        if layout != self._layout:
            self._layout = layout
            self._message_width = message_width
            cursor_job = self.cursor_job_id
            self.clear(columns=True)
            self._add_columns()
            self._rebuild(cursor_job)
            self.post_message(self.ColumnsChanged())
            return
        if message_width != self._message_width:
            self._message_width = message_width
            column = self.columns.get(ColumnKey("message"))
            if column is not None:
                column.width = message_width
                # DataTable has no public way to resize a column: ask it to recompute
                # its virtual size on idle, as it does after adding rows.
                self._require_update_dimensions = True
                self.check_idle()
                self.refresh()
