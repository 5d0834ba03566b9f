"""Jobs: the table of every job, with sort, filter and status filter."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.screen import Screen
from textual.widgets import Footer, Static

from ..widgets.engine_status import EngineStatus


class JobsScreen(Screen[None]):
    """The jobs table (placeholder until the table lands)."""

    BINDINGS: ClassVar[list[BindingType]] = []

    def compose(self) -> ComposeResult:
        yield EngineStatus("jobs")
        yield Static("jobs", id="jobs-body")
        yield Footer()
