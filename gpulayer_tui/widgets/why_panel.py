"""Why a waiting job waits, in the job detail: ``gpulayer-tui why`` as a panel."""

from __future__ import annotations

from typing import Any

from textual.content import Content

from ..formatting import why_rows
from .field_list import FieldList


class WhyPanel(FieldList):
    """Where a waiting job stands: its place among the jobs ready to run, what it waits
    for, the reservation, its user's limits and the fair-share order (the engine's
    ``GET /v1/jobs/ID/why``), each fact's text wrapped beside its label. Hidden for a job
    that does not wait."""

    DEFAULT_CSS = """
    WhyPanel {
        height: auto;
        display: none;
        padding: 0 1;
        margin-bottom: 1;
        color: $text-muted;
    }
    WhyPanel.-waiting { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__((), label_width=12, id=id)

    def show_why(self, data: dict[str, Any] | None) -> None:
        """Show ``data`` (the engine's answer), or hide the panel (``None``, or a job
        that no longer waits)."""
        waiting = data is not None and bool(data.get("waiting"))
        self.set_class(waiting, "-waiting")
        if not waiting or data is None:
            return
        # (the job itself the detail names already; users' text in the facts, reasons
        # and user names, is shown as text, never markup)
        self.set_rows(
            ((label, Content(text)) for label, text in why_rows(data)),
            heading=Content("why it waits"),
        )
