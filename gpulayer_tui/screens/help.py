"""Help: the keys of the current screen first, then the rest, generated from the keymap
(:mod:`..keymap`) so it cannot drift from the bindings."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from .. import keymap
from ..widgets.key_footer import KeyFooter


def _rows(scope: str) -> list[tuple[str, str]]:
    return [
        (k.shown_keys, k.description + (f" ({k.when})" if k.when else ""))
        for k in keymap.keys_of(scope)
        if k.description
    ]


def help_scopes(scope: str | None, has_table: bool) -> list[str]:
    """The keymap scopes help lists, in order: the screen's own, the tables' (when it has
    one), the global ones, then every other screen's."""
    first = [s for s in (scope, keymap.TABLE if has_table else None, keymap.APP) if s]
    rest = [s for s in keymap.SCREEN_TITLES if s not in first and s != "help"]
    return first + rest


def key_table(rows: list[tuple[str, str]]) -> Table:
    """The keys and what they do, a description too long for the dialog wrapping under
    itself (as one text it wrapped to the dialog's left edge, under the keys: h124)."""
    table = Table.grid(padding=(0, 2), pad_edge=True)
    table.add_column(no_wrap=True)
    table.add_column()
    for keys, description in rows:
        table.add_row(Text(keys), Text(description))  # (Text: never read as markup)
    return table


class HelpScreen(ModalScreen[None]):
    """Lists the keys of the screen it was opened on, the global ones, then the rest."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("help"))
    KEYMAP_SCOPE: ClassVar[str] = "help"

    def __init__(self, scope: str | None = None, has_table: bool = False) -> None:
        super().__init__()
        self.scope = scope
        self.has_table = has_table

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="help-dialog"):
            yield Label("Keys", classes="dialog-title")
            for scope in help_scopes(self.scope, self.has_table):
                rows = _rows(scope)
                if not rows:
                    continue
                title = keymap.SCREEN_TITLES[scope]
                if scope == self.scope:
                    title += " (this screen)"
                yield Label(title, classes="help-section")
                yield Static(key_table(rows), classes=f"help-{scope}")
            yield Static(
                "\nctrl+p or : opens the command palette: every action of this screen, searchable.",
                classes="muted",
            )
        yield KeyFooter(compact=True)

    def action_scroll_help(self, rows: int) -> None:
        """Scroll the keys by ``rows`` (j/k one, g/G to an end)."""
        self.query_one("#help-dialog", VerticalScroll).scroll_relative(y=rows, animate=False)

    async def action_dismiss(self, result: Any = None) -> None:
        """Close help."""
        self.dismiss(None)
