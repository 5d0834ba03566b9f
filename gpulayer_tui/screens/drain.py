"""The drain dialog: take a GPU domain out of service, with the reason every user reads.

A drain from the palette was a yes/no question, and the reason stored was "drained from
the TUI": on a shared box nobody could tell why a GPU took no work, nor until when, as
``gpulayer-tui domain drain NAME --reason ...`` lets the CLI say (tester h141)."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from .. import keymap
from ..fields import DRAIN_REASON_MAX, FieldError, check_label
from ..key_hold import focus_first_field, release_keys
from ..widgets.field_input import FieldInput, after_typed
from ..widgets.key_footer import KeyFooter
from .narrow import StacksButtonsWhenNarrow


class DrainScreen(StacksButtonsWhenNarrow, ModalScreen[str | None]):
    """Ask before draining a domain, with an optional reason. Dismisses with the reason
    (``""``: none given) or ``None`` when cancelled.

    Args:
        domain: The domain's name.
    """

    DEFAULT_CSS = """
    DrainScreen #drain-dialog Input {
        background: $panel;
        padding: 0 1;
    }
    DrainScreen #drain-dialog Input:focus { background: $primary 30%; }
    DrainScreen #drain-error { height: auto; }
    DrainScreen #drain-label { margin-top: 1; color: $text-muted; }
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("drain"))
    KEYMAP_SCOPE: ClassVar[str] = "drain"

    def __init__(self, domain: str) -> None:
        super().__init__()
        self.domain = domain

    def compose(self) -> ComposeResult:
        name = self.domain
        with Vertical(classes="dialog -scrolls", id="drain-dialog"):
            yield Label(Content(f"Drain {name}?"), classes="dialog-title")
            yield Static(
                Content(
                    f"No new job is placed on {name} until it is released; running jobs "
                    "stay until they end, and a service moves off when a replica there "
                    "exits. This holds for every user of the box."
                ),
                id="question",
            )
            yield Label(
                "Reason (every user sees it; empty: drained from the TUI)", id="drain-label"
            )
            yield FieldInput(
                id="drain-reason",
                placeholder="e.g. fan replacement, back by 14:00",
                compact=True,
            )
            yield Static("", id="drain-error", classes="error-text")
            with Horizontal(classes="buttons"):
                yield Button("Drain (ctrl+s)", id="drain", variant="error")
                yield Button("Cancel (esc)", id="cancel", variant="primary")
        yield KeyFooter()

    def on_mount(self) -> None:
        field = self.query_one("#drain-reason", Input)
        field.cursor_blink = bool(getattr(self.app, "cursor_blink", True))
        focus_first_field(self, field)

    def action_drain(self) -> None:
        """Drain, with the reason typed (once the keys typed before are in the field)."""
        after_typed(self, self._drain_now)

    def _drain_now(self) -> None:
        reason = self.query_one("#drain-reason", Input).value.strip()
        if reason:
            try:
                check_label("reason", reason, DRAIN_REASON_MAX)
            except FieldError as err:
                # (the engine would refuse it after the dialog closed, the reason lost)
                self.query_one("#drain-error", Static).update(Content(f"reason: {err.detail}"))
                release_keys(self)
                return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        """Close without draining."""
        self.dismiss(None)

    @on(Input.Submitted)
    def _entered(self) -> None:
        self.action_drain()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "drain":
            self.action_drain()
        else:
            self.action_cancel()
