"""A one-line field (the new-job form's command, the jobs filter): a pasted script is
refused, not cut."""

from __future__ import annotations

from textual import events
from textual.message import Message

from ..paste_guard import pasted_text
from .field_input import FieldInput


class OneLineInput(FieldInput):
    """An :class:`~textual.widgets.Input` for one line.

    Textual's ``Input`` keeps only the first line of a paste: a pasted two-line script
    became a job running its first line, with no word said (and a filter its first
    line: tester h139). Here a paste of several lines is not inserted;
    :class:`OneLineInput.ManyLinesPasted` tells the screen, which says why.
    """

    class ManyLinesPasted(Message):
        """A paste of ``lines`` lines (more than one) was refused."""

        def __init__(self, field: OneLineInput, lines: int) -> None:
            super().__init__()
            self.field = field
            self.lines = lines

        @property
        def control(self) -> OneLineInput:
            """The input that refused the paste."""
            return self.field

    def _on_paste(self, event: events.Paste) -> None:
        lines = [line for line in pasted_text(event.text).splitlines() if line.strip()]
        if len(lines) > 1:
            event.prevent_default()  # (Input's own handler would insert the first line)
            event.stop()
            self.post_message(self.ManyLinesPasted(self, len(lines)))
