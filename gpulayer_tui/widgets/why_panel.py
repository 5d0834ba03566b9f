"""Why a waiting job waits, in the job detail: ``gpulayer-tui why`` as a panel."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widgets import Static

from ..formatting import why_lines


class WhyPanel(Static):
    """Where a waiting job stands: its place among the jobs ready to run, what it waits
    for, the reservation, its user's limits and the fair-share order (the engine's
    ``GET /v1/jobs/ID/why``). Hidden for a job that does not wait."""

    DEFAULT_CSS = """
    WhyPanel {
        height: auto;
        display: none;
        margin-top: 1;
        color: $text-muted;
    }
    WhyPanel.-waiting { display: block; }
    """

    def show_why(self, data: dict[str, Any] | None) -> None:
        """Show ``data`` (the engine's answer), or hide the panel (``None``, or a job
        that no longer waits)."""
        waiting = data is not None and bool(data.get("waiting"))
        self.set_class(waiting, "-waiting")
        if not waiting or data is None:
            return
        # The first line names the job, which the detail already does; the rest, with
        # users' text in it (reasons, user names), is shown as text, never markup.
        lines = why_lines(data)[1:]
        self.update(
            Content("why it waits\n" + "\n".join(line.removeprefix("  ") for line in lines))
        )
