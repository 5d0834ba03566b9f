"""The header line: which engine this is (embedded or attached) and whether it is healthy."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label

from ..view import view_of


class EngineStatus(Horizontal):
    """``gpulayer-tui · dashboard · embedded engine /state · simulated · ok``.

    The location gives way first (cut with an ellipsis): the backend word (``simulated``)
    and the health keep their room at 80 columns. Every part is text, never markup.
    """

    DEFAULT_CSS = """
    EngineStatus {
        height: 1;
        background: $panel;
        color: $foreground;
    }
    EngineStatus > #title { text-style: bold; padding: 0 1; color: $text-primary; }
    EngineStatus > #area { padding: 0 1; text-style: bold; }
    EngineStatus > #where {
        width: 1fr;
        padding: 0 0 0 1;
        color: $text-muted;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    EngineStatus > #backend { padding: 0 1 0 0; color: $text-muted; }
    EngineStatus > #backend.-simulated { color: $text-warning; }
    EngineStatus > #health { padding: 0 1; color: $text-success; }
    EngineStatus > #health.problem { color: $text-error; text-style: bold; }
    """

    def __init__(self, area: str) -> None:
        super().__init__()
        self.area = area
        self._shown: dict[str, str] = {}  # label selector -> text shown

    def compose(self) -> ComposeResult:
        yield Label("gpulayer-tui", id="title")
        yield Label(self.area, id="area")
        yield Label("", id="where")
        yield Label("", id="backend")
        yield Label("", id="health")

    def on_mount(self) -> None:
        self.watch(self.app, "health", self._refresh, init=True)
        self.watch(self.app, "connection_problem", self._refresh, init=False)

    def _refresh(self, _value: object = None) -> None:
        app = view_of(self)
        backend = app.backend
        health: dict[str, Any] = dict(app.health or {})
        mode = "attached to" if backend.mode == "attached" else "embedded engine"
        backend_name = str(health.get("backend") or "")
        self._show("#where", f"{mode} {backend.location}")
        self._show("#backend", f" · {backend_name}" if backend_name else "")
        self.query_one("#backend", Label).set_class(backend_name == "simulated", "-simulated")
        label = self.query_one("#health", Label)
        problem = (
            app.connection_problem
            or health.get("store_failure")
            or health.get("launcher_problem")
            or ""
        )
        # (where it attaches gives way to the problem: at 80 columns "start one with
        # `gpulay" was all that was left of it: tester h130)
        for part in ("#where", "#backend"):
            self.query_one(part, Label).display = not app.connection_problem
        if problem:
            self._show("#health", f"⚠ {_header_words(str(problem))}")
            label.add_class("problem")
        elif health.get("paused_at"):
            # The queue holds new starts (gpulayer-tui pause): say it where it is seen.
            self._show("#health", "⏸ queue paused (ctrl+p: resume)")
            label.add_class("problem")
        else:
            self._show("#health", "● engine ok" if health else "connecting…")
            label.remove_class("problem")

    def _show(self, selector: str, text: str) -> None:
        """Set a label's text (as text, never markup) only when it changed: an update
        re-lays the screen out, and the health poll repeats the same words every 2 s."""
        if self._shown.get(selector) != text:
            self._shown[selector] = text
            self.query_one(selector, Label).update(Content(text))


def _header_words(problem: str) -> str:
    """A problem as the header says it: no engine is said without its socket's path (the
    header shows where it attaches), so that "start one" fits in 80 columns; it read "no
    engine answers at /tmp/h56/home/eng" there, cut (tester h56)."""
    if problem.startswith("no engine answers at "):
        return "no engine answers: run `gpulayer-tui --serve`"
    return problem
