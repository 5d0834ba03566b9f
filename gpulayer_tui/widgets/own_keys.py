"""Widgets that run their own key bindings as a key reaches them, not once it is back up."""

from __future__ import annotations

from textual import events
from textual.widget import Widget


async def run_own_binding(widget: Widget, event: events.Key) -> bool:
    """Run ``widget``'s own (non-priority) binding of ``event``'s key now; whether one ran.

    Textual checks a widget's non-priority bindings only once the key has bubbled back up
    to the App, and then from the widget focused *at that moment*, while a priority key
    runs as soon as the App reads it. In a burst (fast typing, a paste, a slow link) the
    keys are dispatched before any is handled: ``j j j`` then enter opened the row the
    cursor had left, and ``j R`` restarted it (tester h61); in a field, a ctrl+u ran on
    the next field after a Tab (tester h54).
    """
    for binding in widget._bindings.key_to_bindings.get(event.key, ()):
        if binding.priority:
            continue  # (done by the App before the key came here)
        if await widget.app.run_action(binding.action, widget):
            event.stop()
            event.prevent_default()
            return True
    return False


class OwnKeys:
    """A mixin for a widget: its own bindings run as each key reaches it (its keys queue
    in its own order), so an action that reads its state after them, queued behind them
    (``call_later``, :func:`~.field_input.after_typed`), sees every key typed before.
    (Not a Widget itself: one early in the bases hid DataTable's COMPONENT_CLASSES.)"""

    async def _on_key(self, event: events.Key) -> None:
        assert isinstance(self, Widget)
        await run_own_binding(self, event)
