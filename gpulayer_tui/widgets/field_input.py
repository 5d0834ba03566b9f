"""A one-line text field whose own editing keys act on it, whatever has focus by then."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual import events
from textual.screen import Screen
from textual.widgets import Input

from ..paste_guard import pasted_text
from .own_keys import run_own_binding


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

    enter_opens_a_screen = False
    """Whether ``enter`` here opens a dialog (the keys typed after it are for that: see
    :mod:`~gpulayer_tui.key_hold`)."""

    keys_that_apply_later: frozenset[str] = frozenset()
    """Keys that leave this line at once and apply it only once the keys typed before
    them have reached it: the keys typed after one are held until the screen has applied
    it and calls :func:`~gpulayer_tui.key_hold.release_keys` (``/ sleep enter c`` in
    the jobs filter cancelled a job the filter hid: tester h139)."""

    async def _on_key(self, event: events.Key) -> None:
        if not await run_own_binding(self, event):
            await super()._on_key(event)

    def _on_paste(self, event: events.Paste) -> None:
        # A copied coloured line or terminal output is taken as its words: its escape
        # sequences and control characters stayed in the value (an environment value
        # with "^[[31m" in it: tester h151). A tab is a space here. A paste of several
        # lines is refused, said: Input kept the first without a word, the rest dropped
        # (tester h160).
        text = pasted_text(event.text)
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) > 1:
            event.prevent_default()
            event.stop()
            self.app.notify(
                f"pasted {len(lines)} lines: this field takes one line; nothing was pasted",
                severity="warning",
                timeout=6,
            )
            return
        line = (lines[0] if lines else "").replace("\t", " ")
        if line == event.text:
            return  # (Input's own handler takes it)
        event.prevent_default()
        event.stop()
        if line:  # (at the cursor, or over the selection)
            if self.selection.is_empty:
                self.insert_text_at_cursor(line)
            else:
                self.replace(line, *self.selection)


def after_typed(screen: Screen[Any], then: Callable[[], None]) -> None:
    """Run ``then`` once every key typed before now has reached its field.

    A priority key (ctrl+s: submit, save, adopt) runs as soon as the App reads it, while
    the keys typed before it in the same burst still wait in their fields' queues: ctrl+s
    right after "5" in the VRAM field sent the job without its VRAM (tester h56). A call
    queued behind each field's pending keys, one field after the other, runs ``then``
    after them all.
    """
    fields = [w for w in screen.query("*") if w.focusable]

    def step(index: int) -> None:
        if index == len(fields):
            then()
        elif not fields[index].call_later(step, index + 1):
            step(index + 1)  # (a field being removed: nothing waits there)

    step(0)
