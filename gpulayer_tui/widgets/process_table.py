"""Every GPU process, as nvitop users expect: pid, user, GPU, VRAM, owner and command
(the program's basename and its arguments; the whole command line in the tooltip)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import on
from textual.binding import BindingType
from textual.content import Content
from textual.message import Message
from textual.widgets import DataTable

from .. import keymap
from ..formatting import GIB, short_command


@dataclass(frozen=True)
class ProcessRow:
    """One process on one GPU (a process on two GPUs is two rows)."""

    gpu: int
    pid: int
    user: str
    used_bytes: int | None
    job_id: int | None
    command: str
    start_ticks: int | None = None
    """When the process started (with the pid, it names this very process)."""

    @property
    def key(self) -> str:
        """The row's key in the table."""
        return f"{self.gpu}:{self.pid}"


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
    SortColumn("owner", "OWNER", 12, False, False, _owner_order),
    SortColumn("command", "COMMAND", 0, False, False, lambda r: short_command(r.command)),
)
"""Columns in display order; COMMAND (width 0) takes the rest of the width."""

SORT_ORDER = ("vram", "pid", "user", "gpu", "owner", "command")
"""The order ``s`` cycles through."""


def rows_from_state(gpu_state: Mapping[str, Any] | None) -> list[ProcessRow]:
    """Every process of every GPU domain of a ``/gpus`` view."""
    rows = []
    for domain in (gpu_state or {}).get("domains", []):
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
                )
            )
    return rows


class ProcessTable(DataTable[Text]):
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
        & > .process-table--unregistered { color: $error; text-style: bold; }
        & > .process-table--job { color: $primary; }
        & > .process-table--muted { color: $text-muted; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True, cell_padding=1)
        self.processes: list[ProcessRow] = []
        self.sort_key = "vram"
        self.sort_reverse = False
        self._shown: list[tuple[str, tuple[str, ...]]] = []
        self._columns_for: tuple[int, str, bool] | None = None
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

    def update_processes(self, rows: list[ProcessRow]) -> None:
        """Show a new list of processes (keeps the cursor on the same process)."""
        self.processes = list(rows)
        self._rebuild()

    def cycle_sort(self, step: int = 1) -> str:
        """Sort by the next (or previous) column; returns the column's label."""
        index = SORT_ORDER.index(self.sort_key)
        self.sort_key = SORT_ORDER[(index + step) % len(SORT_ORDER)]
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
        """The job owning the process under the cursor, if any."""
        row = self.cursor_process()
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

    def _command_width(self) -> int:
        fixed = sum(c.width + 2 * self.cell_padding for c in COLUMNS if c.width)
        return max(12, self.size.width - fixed - 2 * self.cell_padding - 1)

    def _rebuild(self, force: bool = False) -> None:
        """Redraw what changed: columns (width, sort arrow, theme) and rows (new sample)."""
        if not self.is_mounted:
            return
        # Where the cursor is, so it stays on the same process (or at the same place
        # when that process is gone) across samples, sorts and resizes.
        cursor_key, cursor_row = None, self.cursor_row
        if self.row_count:
            cursor_key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        columns_for = (self._command_width(), self.sort_key, self._descending)
        if force or columns_for != self._columns_for:
            self._columns_for = columns_for
            self._styles_seen = self._cell_styles()
            self.clear(columns=True)
            self._shown = []
            for column in COLUMNS:
                label = column.label
                if column.key == self.sort_key:
                    label += f" {self._arrow}"
                self.add_column(
                    Text(label, justify="right" if column.right else "left"),
                    width=column.width or columns_for[0],
                    key=column.key,
                )
        rows = self.sorted_rows()
        shown = [(r.key, self._plain_cells(r)) for r in rows]
        count = len(rows)
        title = f" GPU processes · {count} " if count else " GPU processes · none "
        if self.border_title != title:
            self.border_title = title
        if shown == self._shown:
            return
        self.clear()
        for row in rows:
            self.add_row(*self._cells(row), key=row.key)
        self._shown = shown
        keys = [r.key for r in rows]
        if keys:
            if cursor_key in keys:
                target = keys.index(cursor_key)
            else:
                target = min(cursor_row, len(keys) - 1)
            self.move_cursor(row=target, animate=False, scroll=True)

    @staticmethod
    def _plain_cells(row: ProcessRow) -> tuple[str, ...]:
        return (
            str(row.pid),
            row.user,
            str(row.gpu),
            _vram(row.used_bytes),
            _owner(row.job_id),
            short_command(row.command),
        )

    def _cells(self, row: ProcessRow) -> list[Text]:
        muted = self._cell_style("process-table--muted")
        owner_style = self._cell_style(
            "process-table--unregistered" if row.job_id is None else "process-table--job"
        )
        return [
            Text(str(row.pid), justify="right"),
            Text(row.user or "-", style=Style() if row.user else muted, overflow="ellipsis"),
            Text(str(row.gpu), justify="right"),
            Text(
                _vram(row.used_bytes),
                justify="right",
                style=muted if row.used_bytes is None else Style(bold=True),
            ),
            Text(_owner(row.job_id), style=owner_style),
            # The program's basename and its arguments (the whole line: the tooltip).
            Text(
                short_command(row.command) or "?",
                style=Style() if row.command else muted,
                overflow="ellipsis",
            ),
        ]

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self) -> None:
        """The tooltip holds the whole command line of the process under the cursor (as
        text, never markup)."""
        row = self.cursor_process()
        self.tooltip = Content(row.command) if row is not None and row.command else None

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        job_id = self.chosen_job()
        if job_id is not None:
            self.post_message(self.JobChosen(job_id))
        else:
            self.notify("this process is not a gpulayer job", timeout=2)


def _column(key: str) -> SortColumn:
    return next(c for c in COLUMNS if c.key == key)


def _vram(used: int | None) -> str:
    return "?" if used is None else f"{used / GIB:.1f}"


def _owner(job_id: int | None) -> str:
    return "unregistered" if job_id is None else f"job {job_id}"
