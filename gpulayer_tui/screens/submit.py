"""The submit form: the same spec and rules as ``gpulayer-tui submit``."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Static


class SubmitScreen(ModalScreen[dict[str, Any] | None]):
    """New job form (placeholder until the form lands)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Cancel")]

    class Submitted(Message):
        """A job was accepted by the engine (it may have failed over capacity)."""

        def __init__(self, job: dict[str, Any]) -> None:
            super().__init__()
            self.job = job

    def compose(self) -> ComposeResult:
        yield Static("new job", classes="dialog")
