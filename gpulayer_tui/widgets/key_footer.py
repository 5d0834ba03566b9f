"""The footer of every screen: Textual's, rebuilt only when what it shows changes."""

from __future__ import annotations

from typing import Any

from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's :class:`~textual.widgets.Footer`, which removes and mounts all of its keys
    (20-odd widgets, each styled) on every refresh of the bindings: on each screen switch,
    focus change and ``refresh_bindings``. This one does so only when the keys it would
    show (their keys, words, enabled state, tooltips) differ from those it shows."""

    _shown: Any = None

    def _keys_shown(self) -> Any:
        """What :meth:`Footer.compose` would show, comparable."""
        if not self._bindings_ready:
            return None
        app = self.app
        return (
            self.show_command_palette and app.ENABLE_COMMAND_PALETTE,
            tuple(
                (key, binding, enabled, tooltip, app.get_key_display(binding))
                for key, (_, binding, enabled, tooltip) in self.screen.active_bindings.items()
                if binding.show or key == app.COMMAND_PALETTE_BINDING
            ),
        )

    async def recompose(self) -> None:
        if not self.is_attached or self._pruning:
            return
        shown = self._keys_shown()
        if shown is not None and shown == self._shown:
            return
        self._shown = shown
        await super().recompose()
