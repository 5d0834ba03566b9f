"""Question dialogs that stack their buttons where a row of them would not fit.

At 40 columns the quit dialog's row read "Keep running (k)  Stop (▃▃": its third button
was never seen, and Tab did not bring it into view (tester h170). Under
:data:`NARROW_BELOW` columns the screen takes the ``-narrow`` class, under which the
theme's CSS (``themes/app.tcss``) lays the buttons one above the other, each the dialog's
width; after any resize the focused widget is scrolled into sight (a dialog opened wide,
then made small, kept its buttons below the edge until Tab)."""

from __future__ import annotations

from typing import Any

from textual import events

NARROW_BELOW = 60
"""Columns under which a dialog's buttons are stacked."""


class StacksButtonsWhenNarrow:
    """Mixed into a modal question screen (before ``ModalScreen``): its ``.buttons`` row
    stacks under :data:`NARROW_BELOW` columns (Textual calls each class's handler)."""

    def on_resize(self: Any, event: events.Resize) -> None:
        self.set_class(event.size.width < NARROW_BELOW, "-narrow")
        focused = self.focused
        if focused is not None:
            self.call_after_refresh(focused.scroll_visible, animate=False, immediate=True)
