"""The command palette's actions, generated from :mod:`.keymap` for the screen it was
opened on: every action of that screen and every global one, each with its key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from textual import events, on
from textual.actions import parse
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.command import (
    CommandInput,
    CommandList,
    CommandPalette,
    DiscoveryHit,
    Hit,
    Hits,
    Provider,
    SearchIcon,
)
from textual.containers import Horizontal, Vertical
from textual.dom import DOMNode
from textual.widgets import Button, Input, LoadingIndicator, OptionList

from .keymap import APP, SCREEN_TITLES, Key, keys_of
from .widgets.own_keys import run_own_binding


def _offered(node: DOMNode, key: Key) -> bool:
    """False when the node hides the action now (a dimmed one is still offered)."""
    _, name, params = parse(key.action)
    return node.check_action(name, params) is not False


class KeymapCommands(Provider):
    """Every keymap action of the current screen and of the App, with its key."""

    def _commands(self) -> Iterator[tuple[str, str, Callable[[], Any]]]:
        screen = self.screen
        scope = getattr(screen, "KEYMAP_SCOPE", None)
        targets: list[tuple[str, DOMNode]] = [(APP, self.app)]
        if scope is not None:
            targets.insert(0, (scope, screen))
        for name, node in targets:
            # A screen may title an action as it stands now (f: "Stop following output"
            # while following; "Follow output" was offered, and stopped it: tester h173).
            now = getattr(node, "palette_title", None)
            for key in keys_of(name):
                if key.palette and _offered(node, key):
                    yield (
                        (now(parse(key.action)[1]) if now is not None else None) or key.description,
                        f"{SCREEN_TITLES[name]} · key {key.shown_keys}",
                        partial(self.app.run_action, key.action, node),
                    )

    async def discover(self) -> Hits:
        """Every command, before anything is typed."""
        for title, help_text, run in self._commands():
            yield DiscoveryHit(title, run, help=help_text)

    async def search(self, query: str) -> Hits:
        """The commands whose title matches what was typed."""
        matcher = self.matcher(query)
        for title, help_text, run in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), run, help=help_text)


class OwnKeysCommandInput(CommandInput):
    """The palette's search line, running its own editing keys as each reaches it (see
    :class:`~gpulayer_tui.widgets.field_input.FieldInput`): ``ctrl+u`` then ``pause`` in
    one burst ran the ctrl+u after the letters, and the line came out empty (tester
    h198)."""

    async def _on_key(self, event: events.Key) -> None:
        if not await run_own_binding(self, event):
            await super()._on_key(event)


class SafeCommandPalette(CommandPalette):
    """Textual's command palette, which cannot end the app at any size, and whose search
    line loses no key typed in a burst."""

    def compose(self) -> ComposeResult:
        """Textual's own layout, with :class:`OwnKeysCommandInput` for its input."""
        with Vertical(id="--container"):
            with Horizontal(id="--input"):
                yield SearchIcon()
                yield OwnKeysCommandInput(placeholder=self._placeholder, select_on_focus=False)
                if not self.run_on_select:
                    yield Button("\u25b6")
            with Vertical(id="--results"):
                yield CommandList()
                yield LoadingIndicator()

    # At a width that leaves its list no column (4 cells), Textual 8's OptionList divides
    # by its content width (a ValueError as it opens): the list is never that narrow.
    DEFAULT_CSS = """
    SafeCommandPalette CommandList {
        min-width: 12;
    }
    """

    _dismissed_once = False  # dismissed once: it runs its command once, and pops itself once

    def dismiss(self, result: Any = None) -> AwaitComplete:
        """Close the palette (the first time only)."""
        self._dismissed_once = True
        return super().dismiss(result)

    @on(Input.Submitted)
    @on(Button.Pressed)
    @on(OptionList.OptionSelected)
    def _after_closing(
        self, event: Input.Submitted | Button.Pressed | OptionList.OptionSelected
    ) -> None:
        # Two Enters read together (typing ahead, key repeat, a slow ssh link) each
        # selected the command; the first selection dismissed the palette, the second
        # dismissed it again (ScreenStackError: the app ended) and would have run the
        # command twice. This handler runs before Textual's own; once the palette is
        # dismissed, the event goes no further.
        if self._dismissed_once:
            event.prevent_default()
            event.stop()

    def _action_command_list(self, action: str) -> None:
        try:
            super()._action_command_list(action)
        except (KeyError, IndexError):
            # Textual 8's OptionList pages through its lines by the index of the
            # highlighted one, which a list too small to show any line never computed
            # (a 12x3 terminal): PageDown raised and the app exited. It does nothing now.
            pass
