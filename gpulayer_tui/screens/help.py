"""Help: every key, per area, taken from the bindings themselves so it cannot drift."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static


def _rows(bindings: list[BindingType]) -> list[tuple[str, str]]:
    rows = []
    for item in bindings:
        if not isinstance(item, Binding) or not item.description:
            continue
        keys = item.key_display or ", ".join(k.strip() for k in item.key.split(","))
        rows.append((keys, item.description))
    return rows


class HelpScreen(ModalScreen[None]):
    """Lists the global keys and those of each area."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", key_display="esc")]

    def compose(self) -> ComposeResult:
        from .adopt import AdoptScreen
        from .dashboard import DashboardScreen
        from .job_detail import JobDetailScreen
        from .jobs import JobsScreen
        from .strays import StraysScreen
        from .submit import SubmitScreen

        sections: list[tuple[str, list[BindingType]]] = [
            ("Everywhere", list(self.app.BINDINGS)),
            ("Dashboard", list(DashboardScreen.BINDINGS)),
            ("Jobs", list(JobsScreen.BINDINGS)),
            ("Job detail", list(JobDetailScreen.BINDINGS)),
            ("New job form", list(SubmitScreen.BINDINGS)),
            ("Strays", list(StraysScreen.BINDINGS)),
            ("Adopt dialog", list(AdoptScreen.BINDINGS)),
        ]
        with VerticalScroll(classes="dialog", id="help-dialog"):
            yield Label("Keys", classes="dialog-title")
            for title, bindings in sections:
                rows = _rows(bindings)
                if not rows:
                    continue
                yield Label(title, classes="help-section")
                width = max(len(k) for k, _ in rows)
                yield Static("\n".join(f"  {k.ljust(width)}  {d}" for k, d in rows))
            yield Static(
                "\nctrl+p opens the command palette: every action, searchable.",
                classes="muted",
            )

    async def action_dismiss(self, result: Any = None) -> None:
        """Close help."""
        self.dismiss(None)
