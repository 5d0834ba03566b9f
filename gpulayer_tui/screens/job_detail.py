"""Job detail: spec, timeline, live log tail, exit code and reason."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Static

from ..widgets.engine_status import EngineStatus


class JobDetailScreen(Screen[None]):
    """One job (placeholder until the detail view lands)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id

    def compose(self) -> ComposeResult:
        yield EngineStatus(f"job {self.job_id}")
        yield Static(f"job {self.job_id}", id="detail-body")
        yield Footer()
