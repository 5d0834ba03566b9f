"""Every GPU process, as nvitop users expect: pid, user, GPU, VRAM, its GPU utilisation
(SM %), host CPU %, host memory (RSS), elapsed time, owner and command (the program's
basename and its arguments; the whole command line in the tooltip). ELAPSED, MEM, CPU %
and GPU% are the first to go when the table is narrow, so COMMAND keeps a useful width."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import on
from textual.binding import BindingType
from textual.content import Content
from textual.message import Message
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from .. import keymap
from ..formatting import GIB, duration, short_command
from .own_keys import OwnKeys
from .process_row import ProcessRow
from .process_tree import JobLine, tree_lines


@dataclass(frozen=True)
class SortColumn:
    """A column the table can be sorted by."""

    key: str
    label: str
    width: int
    right: bool
    descending: bool
    """The natural direction (VRAM: biggest first; the rest: ascending)."""
    value: Callable[[ProcessRow], Any]
    optional: bool = False
    """Hidden when the table is too narrow for it and a useful COMMAND."""


def _or_minus(value: float | None) -> float:
    return -1 if value is None else value


def _owner_order(row: ProcessRow) -> tuple[int, int]:
    # Unregistered first (that is what people look for), then jobs by id.
    return (0, 0) if row.job_id is None else (1, row.job_id)


COLUMNS: tuple[SortColumn, ...] = (
    SortColumn("pid", "PID", 7, True, False, lambda r: r.pid),
    SortColumn("user", "USER", 10, False, False, lambda r: r.user),
    SortColumn("gpu", "GPU", 5, True, False, lambda r: r.gpu),
    SortColumn(
        "vram", "VRAM GiB", 10, True, True, lambda r: -1 if r.used_bytes is None else r.used_bytes
    ),
    SortColumn("sm", "GPU%", 6, True, True, lambda r: _or_minus(r.gpu_util), True),
    SortColumn("cpu", "CPU%", 6, True, True, lambda r: _or_minus(r.cpu_percent), True),
    SortColumn("mem", "MEM", 6, True, True, lambda r: _or_minus(r.rss), True),
    # Longest-running first, as the arrow says of the times shown (▼: it said ▲ of that
    # order, by the start times not shown: tester h124); an unknown start sorts last.
    # (9: "ELAPSED ▼"; at 7 its arrow did not fit, and nothing said the order's column: h99)
    SortColumn(
        "elapsed",
        "ELAPSED",
        9,
        True,
        True,
        lambda r: -r.started_at if r.started_at else float("-inf"),
        True,
    ),
    SortColumn("owner", "OWNER", 12, False, False, _owner_order),
    SortColumn("command", "COMMAND", 0, False, False, lambda r: short_command(r.command)),
)
"""Columns in display order; COMMAND (width 0) takes the rest of the width."""

SORT_ORDER = tuple(column.key for column in COLUMNS)
"""The order ``o``/``O`` cycle through: the columns' own, left to right (it jumped about
the table, VRAM -> PID -> USER -> GPU -> OWNER: tester h87)."""

FITTED = ("user", "owner")
"""Text columns narrowed to their longest word once COMMAND is short of COMMAND_MIN with
every optional column hidden."""

HIDE_FIRST = ("elapsed", "mem", "cpu", "sm")
"""The optional columns, in the order they are hidden as the table narrows."""

COMMAND_MIN = 24
"""COMMAND keeps at least this width while optional columns can still be hidden."""


def rows_from_state(gpu_state: Mapping[str, Any] | None) -> list[ProcessRow]:
    """Every process of every GPU of a ``/gpus`` view (those without a domain too)."""
    rows = []
    state = gpu_state or {}
    gpus = [(d, True) for d in state.get("domains", [])]
    gpus += [(g, False) for g in state.get("gpus_without_domain", [])]
    for domain, on_domain in gpus:
        if domain.get("gpu_index") is None:
            continue
        for proc in domain.get("processes", []):
            rows.append(
                ProcessRow(
                    gpu=domain["gpu_index"],
                    pid=proc["pid"],
                    user=proc.get("user") or "",
                    used_bytes=proc.get("used_bytes"),
                    job_id=proc.get("job_id"),
                    command=proc.get("command") or "",
                    start_ticks=proc.get("start_ticks"),
                    started_at=proc.get("started_at"),
                    cpu_percent=proc.get("cpu_percent"),
                    rss=proc.get("rss"),
                    gpu_util=proc.get("gpu_util"),
                    ppid=proc.get("ppid"),
                    managed=on_domain,
                )
            )
    return rows


class ProcessTable(OwnKeys, DataTable[Text]):
    """The GPU process table, sortable, VRAM (largest first) by default.

    Press enter on a row owned by a job to get :class:`ProcessTable.JobChosen`.
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings(keymap.TABLE))

    class JobChosen(Message):
        """The user chose a process row that belongs to a job."""

        def __init__(self, job_id: int) -> None:
            super().__init__()
            self.job_id = job_id
            """The job that owns the chosen process."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "process-table--unregistered",
        "process-table--job",
        "process-table--muted",
    }

    DEFAULT_CSS = """
    ProcessTable {
        height: 1fr;
        min-height: 4;
        max-height: 100%;
        background: $background;
        border-top: solid $primary 35%;
        border-title-color: $foreground;
        border-title-style: bold;
        scrollbar-size-vertical: 1;
        & > .process-table--unregistered { color: $text-error; text-style: bold; }
        & > .process-table--job { color: $text-primary; }
        & > .process-table--muted { color: $text-muted; }
    }
    """

    def __init__(self, *, id: str | None = None, clock: Callable[[], float] | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True, cell_padding=1)
        self.processes: list[ProcessRow] = []
        self.tree_view = False
        """The tree view: each job's processes under its line, children under parents."""
        self.jobs: Mapping[int, JobLine] = {}
        self._lines: list[ProcessRow] = []  # what the rows show, in order
        self.sort_key = "vram"
        self.sort_reverse = False
        self._clock = clock
        self._shown: list[tuple[str, tuple[str, ...]]] = []
        self._columns_for: tuple[tuple[str, ...], tuple[int, ...], int, str, bool] | None = None
        self._styles_seen: tuple[Style, ...] = ()

    def on_mount(self) -> None:
        self._rebuild()

    def on_resize(self) -> None:
        self._rebuild()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        # Cells are Rich Text with resolved colours: redraw them when the theme changes.
        if self.is_mounted and self._cell_styles() != self._styles_seen:
            self.call_later(self._rebuild, force=True)

    # -- public API -----------------------------------------------------------------------

    def update_processes(
        self, rows: list[ProcessRow], jobs: Mapping[int, JobLine] | None = None
    ) -> None:
        """Show a new list of processes (keeps the cursor on the same process); ``jobs``
        names the jobs owning them (their lines in the tree view)."""
        self.processes = list(rows)
        if jobs is not None:
            self.jobs = jobs
        self._rebuild()

    def toggle_tree(self) -> bool:
        """Switch the tree view on or off; returns whether it is on."""
        self.tree_view = not self.tree_view
        self._rebuild()
        return self.tree_view

    def cycle_sort(self, step: int = 1) -> str:
        """Sort by the next (or previous) column shown at this width (a hidden column is
        skipped: sorted by it, the order had no column to explain it and no arrow);
        returns the column's label."""
        shown = self.shown_columns if self.is_mounted else tuple(SORT_ORDER)
        index = SORT_ORDER.index(self.sort_key)
        for offset in range(1, len(SORT_ORDER) + 1):
            key = SORT_ORDER[(index + step * offset) % len(SORT_ORDER)]
            if key in shown:
                break
        self.sort_key = key
        self.sort_reverse = False
        self._rebuild()
        return self.sort_label

    def sort_by(self, key: str) -> str:
        """Sort by column ``key`` (a click on its head); by the one sorted already, the
        other way round. Returns the column's label."""
        if key == self.sort_key:
            return self.reverse_sort()
        self.sort_key = key
        self.sort_reverse = False
        self._rebuild()
        return self.sort_label

    def reverse_sort(self) -> str:
        """Flip the sort direction; returns the column's label."""
        self.sort_reverse = not self.sort_reverse
        self._rebuild()
        return self.sort_label

    @property
    def sort_label(self) -> str:
        """``VRAM GiB ▼`` and the like (▼ largest/last first, ▲ smallest/first first)."""
        return f"{_column(self.sort_key).label} {self._arrow}"

    def sorted_rows(self) -> list[ProcessRow]:
        """The processes in display order."""
        column = _column(self.sort_key)
        # A stable tie-break (gpu, pid) so equal keys never swap places between samples.
        rows = sorted(self.processes, key=lambda r: (r.gpu, r.pid))
        return sorted(rows, key=column.value, reverse=self._descending)

    def chosen_job(self) -> int | None:
        """The job owning the process (or the tree view's job line) under the cursor."""
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        row = next((line for line in self._lines if line.key == key), None)
        return None if row is None else row.job_id

    def cursor_process(self) -> ProcessRow | None:
        """The process under the cursor, if any."""
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return next((row for row in self.processes if row.key == key), None)

    # -- internals ------------------------------------------------------------------------

    @property
    def _descending(self) -> bool:
        return _column(self.sort_key).descending != self.sort_reverse

    @property
    def _arrow(self) -> str:
        return "▼" if self._descending else "▲"

    def _cell_styles(self) -> tuple[Style, ...]:
        return tuple(self._cell_style(name) for name in sorted(self.COMPONENT_CLASSES))

    def _cell_style(self, name: str) -> Style:
        # Colour and weight only: a background would hide the cursor and zebra stripes.
        # (The full style, not the partial one, so alpha colours like $text-muted are
        # blended with the table's background.)
        full = self.get_component_rich_style(name)
        return Style(color=full.color, bold=full.bold, italic=full.italic)

    def _now(self) -> float:
        clock = self._clock or getattr(self.app, "clock", None) or time.time
        return float(clock())

    def _command_width(self, columns: tuple[SortColumn, ...]) -> int:
        fixed = sum(c.width + 2 * self.cell_padding for c in columns if c.width)
        return self.size.width - fixed - 2 * self.cell_padding - 1

    def _layout(self) -> tuple[tuple[SortColumn, ...], int]:
        """The columns shown at this width, and COMMAND's width: optional columns go
        (ELAPSED, then MEM, then CPU%) while COMMAND would be narrower than COMMAND_MIN."""
        hidden: set[str] = set()
        columns = COLUMNS
        for key in HIDE_FIRST:
            if self._command_width(columns) >= COMMAND_MIN:
                break
            if key == self.sort_key:
                continue  # (the order's column stays: hidden, nothing said what sorted it)
            hidden.add(key)
            columns = tuple(c for c in COLUMNS if c.key not in hidden)
        if self._command_width(columns) < COMMAND_MIN:
            # Still too narrow: USER and OWNER take only what their words need (at 80
            # columns they kept 10 and 12 cells for "ana" and "job 3", and COMMAND was
            # cut to 23: tester h87).
            columns = tuple(self._fitted(c) if c.key in FITTED else c for c in columns)
        return columns, max(12, self._command_width(columns))

    def _fitted(self, column: SortColumn) -> SortColumn:
        """``column`` no wider than its label (and sort arrow) and its longest cell."""
        label = len(column.label) + (2 if column.key == self.sort_key else 0)
        rows = self.sorted_rows()
        if self.tree_view:
            rows = tree_lines(rows, self.jobs)
        cells = self._plain_cells_of(rows, column.key)
        need = max([label, *(cell_len(cell) for cell in cells)])
        return replace(column, width=min(column.width, need))

    def _plain_cells_of(self, rows: list[ProcessRow], key: str) -> list[str]:
        now = self._now()
        return [self._plain_cells(row, now, (key,))[0] for row in rows]

    @property
    def shown_columns(self) -> tuple[str, ...]:
        """The keys of the columns shown at the table's present width."""
        return tuple(c.key for c in self._layout()[0])

    def _rebuild(self, force: bool = False) -> None:
        """Redraw what changed: columns (width, sort arrow, theme) and rows (new sample)."""
        if not self.is_mounted:
            return
        # Where the cursor is, so it stays on the same process (or at the same place
        # when that process is gone) across samples, sorts and resizes.
        cursor_key, cursor_row = None, self.cursor_row
        if self.row_count:
            cursor_key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        columns, command_width = self._layout()
        keys = tuple(c.key for c in columns)
        widths = tuple(c.width for c in columns)
        columns_for = (keys, widths, command_width, self.sort_key, self._descending)
        if force or columns_for != self._columns_for:
            self._columns_for = columns_for
            self._styles_seen = self._cell_styles()
            self.clear(columns=True)
            self._shown = []
            for column in columns:
                label = column.label
                if column.key == self.sort_key:
                    label += f" {self._arrow}"
                self.add_column(
                    Text(label, justify="right" if column.right else "left"),
                    width=column.width or command_width,
                    key=column.key,
                )
        rows = self.sorted_rows()
        if self.tree_view:
            rows = tree_lines(rows, self.jobs)
        self._lines = rows
        now = self._now()
        shown = [(r.key, self._plain_cells(r, now, keys)) for r in rows]
        count = len(self.processes)
        title = f" GPU processes · {count} " if count else " GPU processes · none "
        if self.border_title != title:
            self.border_title = title
        if shown == self._shown:
            return
        if [key for key, _ in shown] == [key for key, _ in self._shown]:
            # The same processes in the same order (a new sample): rewrite only the cells
            # that changed. Clearing and adding every row re-lays the screen out, and on a
            # busy GPU box CPU % and ELAPSED change every second.
            changed: list[tuple[str, str, Text]] = []
            for row, (key, cells), (_, before) in zip(rows, shown, self._shown, strict=True):
                if cells != before:
                    values = self._cells(row, now, keys)
                    for column_key, new, old, value in zip(
                        keys, cells, before, values, strict=True
                    ):
                        if new != old:
                            changed.append((key, column_key, value))
            self._replace_cells(changed)
            self._shown = shown
            return
        self.clear()
        for row in rows:
            self.add_row(*self._cells(row, now, keys), key=row.key)
        self._shown = shown
        row_keys = [r.key for r in rows]
        if row_keys:
            if cursor_key in row_keys:
                target = row_keys.index(cursor_key)
            else:
                target = min(cursor_row, len(row_keys) - 1)
            self.move_cursor(row=target, animate=False, scroll=True)

    def _replace_cells(self, changed: list[tuple[str, str, Text]]) -> None:
        """Put new values in cells, re-rendering only those cells.

        ``DataTable.update_cell`` bumps a table-wide counter that is part of every cell's
        render-cache key, so one changed cell re-renders all of them: with every GPU busy,
        most of the dashboard's CPU. Here only the changed cells' cached renders are
        dropped (rows and lines are recomposed from the cell cache, which is cheap). This
        reads ``DataTable``'s caches (textual 8): a test checks what the table draws after a
        new sample, so a Textual that keys them differently fails it.
        """
        if not changed:
            return
        data = self._data
        stale: set[tuple[RowKey, ColumnKey]] = set()
        for row_key, column_key, value in changed:
            cell = (RowKey(row_key), ColumnKey(column_key))
            if cell[0] not in data or cell[1] not in data[cell[0]]:
                # (Never expected: fall back to the table's own, checked path.)
                self.update_cell(row_key, column_key, value)
                continue
            data[cell[0]][cell[1]] = value
            stale.add(cell)
        cells = self._cell_render_cache
        for cell_key in [k for k in cells.keys() if (k[0], k[1]) in stale]:
            cells.discard(cell_key)
        rows = {self._row_locations.get(row_key) for row_key, _ in stale}
        renderables = self._row_renderable_cache
        for renderable_key in [k for k in renderables.keys() if k[1] in rows]:
            renderables.discard(renderable_key)
        self._row_render_cache.clear()
        self._line_cache.clear()
        self.refresh()

    @staticmethod
    def _plain_cells(row: ProcessRow, now: float, keys: tuple[str, ...]) -> tuple[str, ...]:
        if row.job_line:
            return tuple(_job_line_text(row).get(key, "") for key in keys)
        text = {
            "pid": str(row.pid),
            "user": row.user,
            "gpu": str(row.gpu),
            "vram": _vram(row.used_bytes),
            "sm": _percent(row.gpu_util),
            "cpu": _cpu(row.cpu_percent),
            "mem": _mem(row.rss),
            "elapsed": _elapsed(row.started_at, now),
            "owner": _owner(row.job_id, row.managed),
            "command": row.tree_prefix + short_command(row.command),
        }
        return tuple(text[key] for key in keys)

    def _cells(self, row: ProcessRow, now: float, keys: tuple[str, ...]) -> list[Text]:
        muted = self._cell_style("process-table--muted")
        owner_style = (
            self._cell_style("process-table--job")
            if row.job_id is not None
            else self._cell_style("process-table--unregistered")
            if row.managed
            else muted  # (no domain: not the engine's GPU, nothing to flag)
        )

        def number(text: str, known: object) -> Text:
            return Text(text, justify="right", style=Style() if known is not None else muted)

        if row.job_line:
            words = _job_line_text(row)
            right = {"pid", "gpu", "vram", "sm"}
            line = {
                key: Text(
                    words.get(key, ""),
                    justify="right" if key in right else "left",
                    style=owner_style if key in ("owner", "command") else Style(bold=True),
                    overflow="ellipsis",
                )
                for key in keys
            }
            return [line[key] for key in keys]

        cells = {
            "pid": Text(str(row.pid), justify="right"),
            "user": Text(
                row.user or "-", style=Style() if row.user else muted, overflow="ellipsis"
            ),
            "gpu": Text(str(row.gpu), justify="right"),
            "vram": Text(
                _vram(row.used_bytes),
                justify="right",
                style=muted if row.used_bytes is None else Style(bold=True),
            ),
            "sm": number(_percent(row.gpu_util), row.gpu_util),
            "cpu": number(_cpu(row.cpu_percent), row.cpu_percent),
            "mem": number(_mem(row.rss), row.rss),
            "elapsed": number(_elapsed(row.started_at, now), row.started_at),
            "owner": Text(_owner(row.job_id, row.managed), style=owner_style),
            # The program's basename and its arguments (the whole line: the tooltip).
            "command": Text.assemble(
                (row.tree_prefix, muted),
                (short_command(row.command) or "?", Style() if row.command else muted),
                overflow="ellipsis",
            ),
        }
        return [cells[key] for key in keys]

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self) -> None:
        """The tooltip holds the whole command line of the process under the cursor (as
        text, never markup)."""
        row = self.cursor_process()
        self.tooltip = Content(row.command) if row is not None and row.command else None

    @on(DataTable.HeaderSelected)
    def _header_selected(self, event: DataTable.HeaderSelected) -> None:
        # (a click on a head did nothing: `o` and `r` were the only ways; tester h165)
        event.stop()
        if event.column_key.value in SORT_ORDER:
            self.sort_by(event.column_key.value)

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        job_id = self.chosen_job()
        if job_id is not None:
            self.post_message(self.JobChosen(job_id))
        else:
            self.notify("this process is not a gpulayer job", timeout=2)


def _job_line_text(row: ProcessRow) -> dict[str, str]:
    """The words of the tree view's line for a job (the columns that say something)."""
    return {
        "pid": str(row.pid) if row.pid else "",
        "user": row.user,
        "gpu": ",".join(map(str, row.gpus)),
        "vram": _vram(row.used_bytes) if row.used_bytes is not None else "",
        "sm": _percent(row.gpu_util) if row.gpu_util is not None else "",
        "owner": _owner(row.job_id, row.managed),
        "command": row.command,
    }


def _column(key: str) -> SortColumn:
    return next(c for c in COLUMNS if c.key == key)


def _vram(used: int | None) -> str:
    return "?" if used is None else f"{used / GIB:.1f}"


def _percent(value: int | None) -> str:
    return "-" if value is None else str(value)


def _cpu(percent: float | None) -> str:
    if percent is None:
        return "-"
    return f"{percent:.0f}" if percent >= 100 else f"{percent:.1f}"


def _mem(rss: int | None) -> str:
    if rss is None:
        return "-"
    if rss >= GIB:
        return f"{rss / GIB:.1f}G"
    return f"{rss / 1024**2:.0f}M"


def _elapsed(started_at: float | None, now: float) -> str:
    return "-" if started_at is None else duration(now - started_at)


def _owner(job_id: int | None, managed: bool = True) -> str:
    if job_id is not None:
        return f"job {job_id}"
    return "unregistered" if managed else "no domain"
