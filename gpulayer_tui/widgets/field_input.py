"""A one-line text field whose own editing keys act on it, whatever has focus by then."""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class FieldInput(Input):
    """An :class:`~textual.widgets.Input` that runs its own key bindings (ctrl+u,
    backspace, the arrows, ...) as the key reaches it.

    Textual checks a widget's non-priority bindings only once the key has bubbled back up
    to the App, and then from the widget focused *at that moment*. Keys typed in one burst
    (fast typing, a paste, a laggy link) are dispatched before any of them is handled, so
    a field left with Tab (a priority key, done at once) had its ctrl+u run on the next
    field, clearing what had just been typed there: "ab", Tab, "dom" after a ctrl+u
    left the domain empty (tester h54), and a backspace in such a burst was lost the
    same way.
    """

    async def _on_key(self, event: events.Key) -> None:
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            if binding.priority:
                continue  # (done by the App before the key came here)
            if await self.app.run_action(binding.action, self):
                event.stop()
                event.prevent_default()
                return
        await super()._on_key(event)
