"""The footer of every screen: Textual's, rebuilt only when what it shows changes."""

from __future__ import annotations

from typing import Any

from textual.geometry import Size
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from ..keymap import APP, KEYMAP

HELP_KEY = "question_mark"
"""The key of help, which lists every other: the last a narrow footer gives up."""

KEPT_KEYS = (HELP_KEY, "escape")
"""Help, and the key that backs out of where one is (esc: end the search, clear the
filter, back): at 80 columns the way out fell off first (tester h95)."""


_APP_ACTIONS = frozenset(key.action for key in KEYMAP if APP in key.scopes)
"""The App's keys (screens, new job, help, quit): a screen's own come before them."""


class KeyFooter(Footer):
    """Textual's :class:`~textual.widgets.Footer`, which removes and mounts all of its keys
    (20-odd widgets, each styled) on every refresh of the bindings: on each screen switch,
    focus change and ``refresh_bindings``. This one does so only when the keys it would
    show (their keys, words, enabled state, tooltips) differ from those it shows.

    Keys that do not fit whole before the palette's key are hidden (the screen's own come
    first), so a narrow terminal shows no key cut in half.
    """

    # Compact, every key has a 1-cell right margin, the palette's too: docked right, it
    # then left the last column to whatever key ran under it (a stray letter at 80 cols).
    DEFAULT_CSS = """
    KeyFooter.-compact FooterKey.-command-palette { margin-right: 0; }
    """

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
        self._fit_keys()

    def on_resize(self) -> None:
        self._fit_keys()

    def _fit_keys(self) -> None:
        """Show the keys that fit whole before the palette's key, in their order. When not
                all fit, ``?`` (help, which lists them all: it fell off the end at 80 columns,
                tester h70) and ``esc`` (the way out) are kept first, then the screen's own keys
                (those that act now before the dimmed ones), then the App's (the areas' 1 2 3 4
        last), each in order."""
        keys = [child for child in self.children if isinstance(child, FooterKey)]
        palette = next((k for k in keys if k.has_class("-command-palette")), None)
        room = self.size.width
        if palette is not None:
            room -= self._width_of(palette)
        listed = [key for key in keys if key is not palette]
        widths = [self._width_of(key) for key in listed]
        slack = max((k.styles.margin.right for k in listed), default=0)  # (the last's)
        if sum(widths) <= room + slack:
            fits = [True] * len(listed)
        else:
            rank = sorted(
                range(len(listed)),
                key=lambda n: (
                    listed[n].key not in KEPT_KEYS,
                    listed[n].action in _APP_ACTIONS,
                    # (the areas' keys after the App's others: the fourth, 4 Users, took
                    # q Quit's place at 80 columns)
                    listed[n].action.startswith("show_area"),
                    listed[n].has_class("-disabled"),
                    n,
                ),
            )
            fits = [False] * len(listed)
            used = 0
            for n in rank:
                if used + widths[n] <= room:  # (no slack: the last shown is not known yet)
                    used += widths[n]
                    fits[n] = True
        for key, ok in zip(listed, fits, strict=True):
            if key.display != ok:
                key.display = ok

    def _width_of(self, key: FooterKey) -> int:
        styles = key.styles
        width = key.get_content_width(self.size, Size(0, 0)) + styles.gutter.width
        return width + styles.margin.width
