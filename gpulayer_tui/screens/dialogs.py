"""Small modal dialogs: a yes/no confirmation and the quit choice."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Label, Static

from .. import keymap


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True only on an explicit yes."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("confirm"))
    KEYMAP_SCOPE: ClassVar[str] = "confirm"

    def __init__(self, title: str, question: str, yes_label: str = "Yes") -> None:
        super().__init__()
        self._title = title
        self._question = question
        self._yes = yes_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._title, classes="dialog-title")
            yield Static(self._question)
            with Horizontal(classes="buttons"):
                yield Button(f"{self._yes} (y)", id="yes", variant="error")
                yield Button("No (n)", id="no", variant="primary")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        """Close the dialog with the answer."""
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class QuitChoice(StrEnum):
    """What to do with an embedded engine's work when quitting."""

    HANDOVER = "handover"
    STOP = "stop"
    STAY = "stay"


class QuitScreen(ModalScreen[QuitChoice]):
    """Quitting with jobs in flight in an embedded engine: keep them, stop them, or stay."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("quit"))
    KEYMAP_SCOPE: ClassVar[str] = "quit"

    def __init__(self, active: int) -> None:
        super().__init__()
        self.active = active

    def compose(self) -> ComposeResult:
        noun = "job is" if self.active == 1 else "jobs are"
        with Vertical(classes="dialog", id="quit-dialog"):
            yield Label("Quit gpulayer-tui?", classes="dialog-title")
            yield Static(
                f"{self.active} {noun} running or queued in this window's engine.\n\n"
                "Keep running: a background engine (gpulayer-tui --serve) takes them over; "
                "reopen gpulayer-tui later to attach to it.\n\n"
                "Stop them: cancel every job, then quit. Adopted processes are left alone "
                "(a later engine re-learns them)."
            )
            with Horizontal(classes="buttons"):
                yield Button("Keep running (k)", id="handover", variant="primary")
                yield Button("Stop them (s)", id="stop", variant="error")
                yield Button("Stay (esc)", id="stay")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#handover", Button).focus()

    def action_choose(self, choice: str) -> None:
        """Close the dialog with a choice."""
        self.dismiss(QuitChoice(choice))

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(QuitChoice(event.button.id or "stay"))
