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

YOU = " (you)"
"""Said after this TUI's user's name (its row is also in the accent colour)."""


class UserTable(OwnKeys, DataTable[Any]):
    """One row per user (keyed by uid) in the engine's order: USER, GPU-H, SHARE, RUNNING,
    GPUS/MAX, VRAM GB/MAX, WAITING/MAX, MAX PRIO; this TUI's user's row is marked."""

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

    def on_mount(self) -> None:
        for head, key in zip(USER_HEADS, COLUMN_KEYS, strict=True):
            # (the figures' heads over their right edge, as the figures are)
            self.add_column(Text(head, justify="left" if key == "user" else "right"), key=key)

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
        self._style_seen = you = self._you()
        self.clear()
        self.rows_by_uid = {}
        for user in self._users:
            uid = int(user["uid"])
            self.rows_by_uid[uid] = user
            mine = uid == me
            style = you if mine else Style()
            name, *figures = user_cells(user)
            # (Text: a user name is shown as written, never read as markup)
            first = Text(name, style=style, no_wrap=True, overflow="ellipsis")
            if mine:
                first.append(YOU, style)
            cells = [Text(cell, style=style, justify="right") for cell in figures]
            self.add_row(first, *cells, key=str(uid))
        if current in self.rows_by_uid:
            self.move_cursor(row=self.get_row_index(str(current)))

    @property
    def cursor_uid(self) -> int | None:
        """The uid on the cursor row, if any."""
        return cursor_number(self)

    def _you(self) -> Style:
        # Colour and weight only: a background would hide the cursor and zebra stripes
        # (the full style, so a translucent colour is blended with the table's background).
        full = self.get_component_rich_style("user-table--you")
        return Style(color=full.color, bold=full.bold)
