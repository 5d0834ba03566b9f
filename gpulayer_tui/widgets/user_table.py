"""The users table: who uses the box, in fair-share order, with what they hold and their
limits (``GET /v1/users``, as ``gpulayer-tui users`` lists them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import BindingType
from textual.widgets import DataTable

from .. import keymap
from ..formatting import USER_HEADS, user_cells
from ..wire import UserJSON
from .own_keys import OwnKeys
from .row_keys import cursor_number

COLUMN_KEYS = ("user", "gpu_hours", "share", "running", "gpus", "vram", "waiting", "max_prio")
"""The columns' keys, one per :data:`~gpulayer_tui.formatting.USER_HEADS`."""

SHORT_HEADS = ("USER", "GPU-H", "SHARE", "RUN", "GPUS", "VRAM GiB", "WAITING", "PRIO")
"""The heads used where the full ones would not fit: the cells still say ``held/limit``.
(At 80 columns the last column was cut, and a max priority of 10 read "1": tester h167.)"""

MIN_NAME_WIDTH = 8
"""The USER column is cut no narrower than this (the figures then scroll)."""

CELL_PADDING = 2
"""What a column adds to its widest cell (a space each side)."""

YOU = " (you)"
"""Said after this TUI's user's name (its row is also in the accent colour)."""


class UserTable(OwnKeys, DataTable[Any]):
    """One row per user (keyed by uid) in the engine's order: USER, GPU-H, SHARE, RUNNING,
    GPUS/MAX, VRAM GiB/MAX, WAITING/MAX, MAX PRIO; this TUI's user's row is marked."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings(keymap.TABLE))

    COMPONENT_CLASSES: ClassVar[set[str]] = {"user-table--you"}

    DEFAULT_CSS = """
    UserTable { height: 1fr; }
    UserTable > .user-table--you { color: $text-accent; text-style: bold; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.rows_by_uid: dict[int, UserJSON] = {}
        """The users shown, by uid."""
        self.me: int | None = None
        """The uid whose row is marked (this TUI's user)."""
        self._users: list[UserJSON] = []
        self._style_seen: Style | None = None
        self.heads: tuple[str, ...] = USER_HEADS
        """The column heads shown: :data:`USER_HEADS`, or :data:`SHORT_HEADS` where
        those would not fit."""
        self.name_width: int | None = None
        """The USER column's width where long names are cut to fit (None: not cut)."""

    def on_mount(self) -> None:
        self._add_columns(USER_HEADS)

    def _add_columns(self, heads: Sequence[str], name_width: int | None = None) -> None:
        self.heads = tuple(heads)
        self.name_width = name_width
        for head, key in zip(heads, COLUMN_KEYS, strict=True):
            # (the figures' heads over their right edge, as the figures are)
            label = Text(head, justify="left" if key == "user" else "right")
            self.add_column(label, key=key, width=name_width if key == "user" else None)

    def on_resize(self) -> None:
        if self._users and self._fit(self._rows()) != (self.heads, self.name_width):
            self.show(self._users, self.me)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        # The marked row's cells are Rich Text with resolved colours: drawn again when
        # the theme changes them. Looked at once the styles are all updated: asked here,
        # the component's style was still the old theme's, and the row kept its colour
        # until the next ask of the engine (tester h167).
        if self.is_mounted and self._style_seen is not None:
            self.call_after_refresh(self._restyle)

    def _restyle(self) -> None:
        if self._style_seen is not None and self._you() != self._style_seen:
            self.show(self._users, self.me)

    def show(self, users: Sequence[UserJSON], me: int | None) -> None:
        """Replace the rows (one per user: a handful), in the order given, keeping the
        cursor on the same user; ``me``'s row is marked."""
        current = self.cursor_uid
        self._users, self.me = list(users), me
        self._style_seen = self._you()
        self.rows_by_uid = {}
        rows = self._rows()
        # The columns are made again each time: a DataTable's columns only ever widen, so
        # a long name gone kept its width (tester h167); a handful of rows, so cheap.
        self.clear(columns=True)
        self._add_columns(*self._fit(rows))
        for uid, cells in rows:
            self.add_row(*cells, key=str(uid))
        if current in self.rows_by_uid:
            self.move_cursor(row=self.get_row_index(str(current)))

    def _rows(self) -> list[tuple[int, list[Text]]]:
        rows = []
        for user in self._users:
            uid = int(user["uid"])
            self.rows_by_uid[uid] = user
            mine = uid == self.me
            style = self._style_seen if mine and self._style_seen else Style()
            name, *figures = user_cells(user)
            # (Text: a user name is shown as written, never read as markup)
            first = Text(name, style=style, no_wrap=True, overflow="ellipsis")
            if mine:
                first.append(YOU, style)
            rows.append((uid, [first, *(Text(c, style=style, justify="right") for c in figures)]))
        return rows

    def _fit(self, rows: list[tuple[int, list[Text]]]) -> tuple[tuple[str, ...], int | None]:
        """The heads and the USER column's width (None: as wide as its widest name) that
        fit the table's width: the full heads, else the short ones, else the short ones
        with long names cut (with an ellipsis; the figures are never cut)."""
        width = self.scrollable_content_region.width
        if not width:  # (not laid out yet)
            return USER_HEADS, None
        for heads in (USER_HEADS, SHORT_HEADS):
            widest = [len(head) for head in heads]
            for _uid, cells in rows:
                widest = [max(w, cell.cell_len) for w, cell in zip(widest, cells, strict=True)]
            needed = sum(widest) + CELL_PADDING * len(widest)
            if needed <= width:
                return heads, None
        return SHORT_HEADS, max(MIN_NAME_WIDTH, widest[0] - (needed - width))

    @property
    def cursor_uid(self) -> int | None:
        """The uid on the cursor row, if any."""
        return cursor_number(self)

    def _you(self) -> Style:
        # Colour and weight only: a background would hide the cursor and zebra stripes
        # (the full style, so a translucent colour is blended with the table's background).
        full = self.get_component_rich_style("user-table--you")
        return Style(color=full.color, bold=full.bold)
