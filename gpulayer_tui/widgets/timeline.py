"""A job's timeline: every stored transition with its time, status, reason and message."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.content import Content
from textual.widget import Widget

from ..formatting import event_label, event_words
from ..wire import TimelineEntryJSON

STATUS_STYLES: dict[str, str] = {
    "pending": "$foreground-muted",
    "queued": "$text-warning",
    "running": "bold $text-primary",
    "completed": "$text-success",
    "failed": "bold $text-error",
    "cancelled": "italic $foreground-muted",
    "orphaned": "italic $text-error",
}
"""How a status is drawn (theme variables only); the job detail view uses it too."""

_STATUS_WIDTH = max(len(s) for s in STATUS_STYLES)
NARROW_MESSAGE = 24
"""Fewer cells than this left beside an event's head: its message goes under the head."""
MESSAGE_UNDER_INDENT = 4

# (the message names which replica and how; what a preemption did)


def clock_time(at: float, now: float) -> str:
    """Local ``HH:MM:SS`` on ``now``'s day, else ``Mon DD HH:MM:SS``."""
    when = time.localtime(at)
    if when[:3] == time.localtime(now)[:3]:
        return time.strftime("%H:%M:%S", when)
    return time.strftime("%b %d %H:%M:%S", when)


def gap_text(seconds: float) -> str:
    """Time since the previous event: ``+0.4s``, ``+12s``, ``+20m00s``, ``+3h05m``."""
    if seconds < 10:
        return f"+{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"+{whole}s"
    if whole < 3600:
        return f"+{whole // 60}m{whole % 60:02d}s"
    return f"+{whole // 3600}h{whole % 3600 // 60:02d}m"


class Timeline(Widget):
    """The transitions of one job, oldest first.

    ``07:30:00  +20m00s  running    running on gpu0``: local time, time since the
    previous event, status, then the termination reason (when there is one) and the
    message, wrapped under itself so the first columns stay readable.
    """

    DEFAULT_CSS = """
    Timeline {
        width: 1fr;
        height: auto;
        padding: 0 1;
        color: $foreground;
    }
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._clock = clock
        self._events: list[TimelineEntryJSON] = []
        self._loaded = False  # set by the first set_events

    @property
    def events(self) -> list[TimelineEntryJSON]:
        """The events shown, oldest first."""
        return list(self._events)

    def set_events(self, events: list[TimelineEntryJSON]) -> None:
        """Show ``events`` (the API's ``{"at", "kind", "status", "reason", "message"}``)."""
        self._events = sorted(events, key=lambda e: e.get("at") or 0.0)
        self._loaded = True
        self.refresh(layout=True)

    def _now(self) -> float:
        clock = self._clock or getattr(self.app, "clock", None) or time.time
        return float(clock())

    def render(self) -> Content:
        """One block per event, the message wrapped to the width we have."""
        if not self._events:
            # (before the first answer there is nothing to say yet, not "no events")
            said = "no events yet" if self._loaded else "loading…"
            return Content.styled(said, "$foreground-muted")
        now = self._now()
        width = max(20, self.content_region.width or self.size.width or 80)
        lines: list[Content] = []
        previous: float | None = None
        for event in self._events:
            at = float(event.get("at") or 0.0)
            status = event_label(event)
            gap = "" if previous is None else gap_text(max(0.0, at - previous))
            previous = at
            head = Content.assemble(
                (clock_time(at, now), "$foreground-muted"),
                "  ",
                (gap.rjust(7), "$foreground-muted"),
                "  ",
                (status.ljust(_STATUS_WIDTH), STATUS_STYLES.get(status, "")),
                "  ",
            )
            lines.extend(self._event_lines(head, event, width))
        return Content("\n").join(lines)

    @staticmethod
    def _event_lines(head: Content, event: TimelineEntryJSON, width: int) -> list[Content]:
        # (a reason the message says already is not shown: "completed  exit code ·
        # exited with code 0" read as a missing number: tester h87)
        reason_text, message = event_words(event)
        text = f"{reason_text} · {message}" if reason_text and message else reason_text or message
        # The reason leads, in its own colour; the message is text (never markup).
        body = Content.assemble((reason_text, "$text-accent"), text[len(reason_text) :])
        indent = head.cell_length
        if width - indent >= NARROW_MESSAGE or body.cell_length <= width - indent:
            # Wrapped by cells, not characters (wide characters overran the width), and
            # a word longer than the room is folded, not left to overflow.
            wrapped = body.wrap(width - indent) or [Content("")]
            return [
                Content.assemble(head if number == 0 else " " * indent, line)
                for number, line in enumerate(wrapped)
            ]
        # Too narrow beside the head (60 columns, an event of another day) for a message
        # that needs more than a line: it goes under the head, indented, where it was a
        # column of a few characters.
        under = body.wrap(max(1, width - MESSAGE_UNDER_INDENT)) if text else []
        return [head, *(Content.assemble(" " * MESSAGE_UNDER_INDENT, line) for line in under)]
