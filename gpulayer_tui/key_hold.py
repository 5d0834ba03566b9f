"""Keys typed right after one that opens a form go into that form.

A terminal hands the app a burst at once: ``n`` then ``python train.py`` typed quickly (or
pasted after ``n``) arrive together. Textual forwards each key to the focused widget as it
comes, before the ``n`` has reached the binding that opens the form, so the rest went to
the table underneath, and were lost. A key that opens a form therefore *holds* the keys
after it. They are let go, in order, once the form has focused its first field (it calls
:meth:`KeyHold.release`), once the key's binding ran and opened no form, or after
:data:`HOLD_LIMIT` seconds whatever happened (a form that never came must not swallow the keyboard).

A key that comes while the current screen is still being built (pushed, its widgets not
composed yet) is held the same way, until that screen is mounted: ``home``, ``enter``
and a lone ``esc`` (which the terminal's parser hands on last) in one burst opened a
job's detail and ran its ``esc`` there before it had widgets, and the app ended in
``NoMatches`` (tester h127).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from textual import events
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Input, TextArea

from . import keymap

if TYPE_CHECKING:
    from textual.app import App
    from textual.timer import Timer

FORM_ACTIONS = frozenset({"new_job", "edit_job", "adopt_selected"})
"""The actions whose key opens a form (typed-ahead text is meant for it). The lines opened
in place (``/``, ``p``) need no hold: theirs are priority bindings whose actions focus at
once (docs/architecture.md, "Keys")."""

SCREEN_CHECK_S = 0.01
"""How often a hold for a screen being built looks whether it is mounted."""

HOLD_LIMIT = 1.5
"""Seconds keys are held at most: the edit form first fetches its job from the engine."""


def _form_keys() -> dict[str, frozenset[str]]:
    """Key name -> the scopes in which it opens a form."""
    keys: dict[str, set[str]] = {}
    for key in keymap.KEYMAP:
        if key.action in FORM_ACTIONS:
            for name in keymap.key_names(key):
                keys.setdefault(name, set()).update(key.scopes)
    return {name: frozenset(scopes) for name, scopes in keys.items()}


class KeyHold:
    """Holds the keys typed after one that opens a form, until the form can take them.

    Args:
        app: The app whose keys these are.
        replay: Handles one held key as it would have been when it came (the app's
            ``on_event``; a held key that opens a form again holds the ones after it).
    """

    def __init__(self, app: App[Any], replay: Callable[[events.Key], Awaitable[None]]) -> None:
        self._app = app
        self._replay = replay
        self._form_keys = _form_keys()
        self._held: list[events.Key] | None = None
        self._opener: events.Key | None = None
        self._form_coming = False
        self._timer: Timer | None = None

    @property
    def holding(self) -> bool:
        """Whether keys are being held now."""
        return self._held is not None

    def take(self, event: events.Key) -> bool:
        """A key just came from the terminal: hold it (True), or let it go on (False).

        One that opens a form on the current screen goes on, and starts a hold.
        """
        if self._held is not None:
            self._held.append(event)
            return True
        if not self._app.screen.is_mounted:
            self.hold_for_screen(event)
            return True
        if self._opens_form(event.key):
            self._held, self._opener, self._form_coming = [], event, False
            self._timer = self._app.set_timer(HOLD_LIMIT, self.release)
        return False

    def _opens_form(self, key: str) -> bool:
        scopes = self._form_keys.get(key)
        if not scopes:
            return False
        screen = self._app.screen
        if isinstance(screen, ModalScreen) or isinstance(self._app.focused, (Input, TextArea)):
            return False  # (there the key is text, or the form is open already)
        scope = getattr(screen, "KEYMAP_SCOPE", None)
        return keymap.APP in scopes or scope in scopes

    def hold_for_screen(self, event: events.Key) -> None:
        """``event`` came while the current screen is being built (from the terminal, or
        bubbled up from the screen before it to the app, whose bindings are the new
        screen's now): it goes on, before any key held after it, once that screen is
        mounted."""
        again = events.Key(event.key, event.character)  # (a fresh one: this one is spent)
        if self._held is not None:
            self._held.insert(0, again)
            return
        self._held, self._opener, self._form_coming = [again], None, False
        self._timer = self._app.set_timer(HOLD_LIMIT, self.release)
        self._app.set_timer(SCREEN_CHECK_S, self._when_screen_mounted)

    def _when_screen_mounted(self) -> None:
        if self._held is None or self._opener is not None:
            return  # (let go already, or a form's hold now)
        if self._app.screen.is_mounted:
            self.release()
        else:
            self._app.set_timer(SCREEN_CHECK_S, self._when_screen_mounted)

    def form_coming(self) -> None:
        """The key's action will open a form (now, or once a worker has what it needs):
        hold on until it calls :meth:`release`."""
        if self._held is not None:
            self._form_coming = True

    def key_reached_app(self, event: events.Key) -> None:
        """``event`` reached the app, whose bindings run it next: if it started the hold
        and its action opens no form, the held keys go on after that."""
        if event is self._opener:
            self._app.call_next(self._after_opener, event)

    async def _after_opener(self, event: events.Key) -> None:
        if event is self._opener and not self._form_coming:
            await self._let_go()

    def release(self) -> None:
        """Let the held keys go on, in the order they came (to the form now up, if one
        is), from the app's own message loop: keys that come meanwhile join the held ones."""
        if self._held is not None:
            self._app.call_next(self._let_go)

    async def _let_go(self) -> None:
        held = self._held
        if held is None:
            return
        if self._timer is not None:
            self._timer.stop()
        self._held, self._opener, self._form_coming, self._timer = None, None, False, None
        for key in held:
            await self._replay(key)  # (one that opens a form again holds those after it)


def focus_first_field(screen: Screen[Any], field: Widget) -> None:
    """Focus a form's first field now, and let the keys held for the form go into it."""
    screen.set_focus(field)  # (now: Widget.focus waits behind the keys on their way)
    hold = getattr(screen.app, "key_hold", None)
    if isinstance(hold, KeyHold):
        hold.release()
