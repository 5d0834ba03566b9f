"""The new-job form's command line: one line, so a pasted script is refused, not cut."""

from __future__ import annotations

from textual import events
from textual.message import Message

from .field_input import FieldInput


class CommandInput(FieldInput):
    """An :class:`~textual.widgets.Input` for a command line.

    Textual's ``Input`` keeps only the first line of a paste: a pasted two-line script
    became a job running its first line, with no word said. Here a paste of several
    lines is not inserted; :class:`CommandInput.ManyLinesPasted` tells the form, which
    says why.
    """

    class ManyLinesPasted(Message):
        """A paste of ``lines`` lines (more than one) was refused."""

        def __init__(self, command_input: CommandInput, lines: int) -> None:
            super().__init__()
            self.command_input = command_input
            self.lines = lines

        @property
        def control(self) -> CommandInput:
            """The input that refused the paste."""
            return self.command_input

    def _on_paste(self, event: events.Paste) -> None:
        lines = [line for line in event.text.splitlines() if line.strip()]
        if len(lines) > 1:
            event.prevent_default()  # (Input's own handler would insert the first line)
            event.stop()
            self.post_message(self.ManyLinesPasted(self, len(lines)))
