"""Dashboard: one panel per domain, a summary line and the GPU process table."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.screen import Screen
from textual.widgets import Footer, Static

from ..widgets.engine_status import EngineStatus


class DashboardScreen(Screen[None]):
    """The GPU dashboard (placeholder until the panels land)."""

    BINDINGS: ClassVar[list[BindingType]] = []

    def compose(self) -> ComposeResult:
        yield EngineStatus("dashboard")
        yield Static("dashboard", id="dashboard-body")
        yield Footer()
