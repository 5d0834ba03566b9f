"""A checkbox whose mark says whether it is ticked, without colour."""

from __future__ import annotations

from textual.widgets import Checkbox


class CheckBox(Checkbox):
    """Textual's :class:`~textual.widgets.Checkbox` draws ``▐X▌`` ticked or not, told apart
    by colour alone: on a monochrome terminal, a screen reader's text, or a screenshot,
    "run without a shell" read as ticked when it was not, and a command was sent as argv
    by mistake (tester h151). Here an unticked box is empty: ``▐ ▌``."""

    @property
    def BUTTON_INNER(self) -> str:  # type: ignore[override]
        """The mark inside the box: ``X`` when ticked, a space when not."""
        return "X" if self.value else " "
