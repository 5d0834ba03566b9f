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
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from textual import events
from textual.app import ScreenStackError, UnknownModeError
from textual.command import CommandPalette
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Input, TextArea

from . import keymap

if TYPE_CHECKING:
    from textual.app import App
    from textual.timer import Timer

Typed = events.Key | events.Paste
"""What the terminal hands on that a hold keeps: keys, and pastes (a paste right after
``n`` was dropped whole: tester h133)."""

FORM_ACTIONS = frozenset({"new_job", "edit_job", "adopt_selected"})
"""The actions whose key opens a form (typed-ahead text is meant for it). The lines opened
in place (``/``, ``p``) need no hold: theirs are priority bindings whose actions focus at
once (docs/architecture.md, "Keys")."""

SCREEN_ACTIONS = frozenset(
    {
        "open_job",
        "cancel_job",
        "restart_job",
        "signal_process",
        "command_palette",
        "help",
        "quit_app",
        "show_area",
        "back",
    }
)
"""The actions whose key may open (or leave) a screen or dialog: the keys typed after it
are meant for what it opens. ``enter c n`` on a job ran the cancel on the table and typed
``n`` into a new-job form, ``: cancel`` lost its first letters to the table, ``1 g`` moved
the cursor of the area left (tester h132)."""

SEND_ACTIONS = frozenset({"submit", "save", "adopt"})
"""The forms' ``ctrl+s``: it reads the fields once the keys typed before it have reached
them, and the keys after it are for the screen the form leaves (``n 'sleep 81' ctrl+s j``
submitted ``sleep 81j``: tester h137). They wait until the form is gone, or it shows a
problem or the engine's refusal (:func:`release_keys`), or :data:`HOLD_LIMIT` (an engine
slow to answer: they go to the form, where esc says what it waits for; at 0.3 s a second
form typed in the same burst went into the first one, still waiting, and was lost)."""

SCREEN_SETTLE_S = 0.3
"""Seconds after a screen key's binding has run that the keys after it are still held when
no screen comes (a cancel of a job that has ended only says so): its action may run a
moment after its binding (``enter`` opens the row the keys before it moved to)."""

SCREEN_CHECK_S = 0.01
"""How often a hold for a screen being built looks whether it is mounted."""

HOLD_LIMIT = 1.5
"""Seconds keys are held at most for a form or screen that has not come: the edit form
first fetches its job from the engine."""

HOLD_CAP = 10.0
"""Seconds keys are held at most for a form or screen that has come, but is still being
built, or has not taken them yet: the app itself is slow then (a loaded machine), and the
keys are its. At :data:`HOLD_LIMIT` a form mounted under CI's load, its keys asked for and
on their way behind its build, lost them all (": new job enter sleep 7" gave an empty
form)."""

HOLD_RECHECK_S = 0.1
"""How often a hold past :data:`HOLD_LIMIT` looks again whether its screen is up."""


def _form_keys(actions: frozenset[str]) -> dict[str, frozenset[str]]:
    """Key name -> the scopes in which it runs one of ``actions``."""
    keys: dict[str, set[str]] = {}
    for key in keymap.KEYMAP:
        if key.action.partition("(")[0] in actions:
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

    def __init__(self, app: App[Any], replay: Callable[[Typed], Awaitable[None]]) -> None:
        self._app = app
        self._replay = replay
        self._form_keys = _form_keys(FORM_ACTIONS)
        self._screen_keys = _form_keys(SCREEN_ACTIONS)
        self._send_keys = _form_keys(SEND_ACTIONS)
        self._held: list[Typed] | None = None
        self._held_since = 0.0  # (monotonic)
        self._held_on: Screen[Any] | None = None  # the screen the hold started on
        self._releasing: list[Typed] | None = None  # the hold whose release is on its way
        self._opener: events.Key | None = None
        self._form_coming = False
        self._timer: Timer | None = None
        self._opened_from: Screen[Any] | None = None  # the screen an opener was pressed on
        self._screen_opener: events.Key | None = None  # the key that may open a screen
        self._typed_on: WeakKeyDictionary[events.Key, Screen[Any]] = WeakKeyDictionary()

    @property
    def holding(self) -> bool:
        """Whether keys are being held now."""
        return self._held is not None

    def take(self, event: Typed) -> bool:
        """A key (or a paste) just came from the terminal: hold it (True), or let it go
        on (False).

        One that opens a form on the current screen goes on, and starts a hold.
        """
        if self._held is not None:
            self._held.append(event)
            return True
        screen = self.current_screen()
        if screen is None:
            return True  # (the app is ending: a key has no screen to go to)
        if isinstance(event, events.Key):
            self._typed_on[event] = screen
        if not screen.is_mounted:
            self.hold_for_screen(event)
            return True
        if isinstance(event, events.Paste):
            return False  # (a paste opens nothing)
        if self._enter_opens_a_screen(event, screen):
            # (enter on a palette's command, or in a field whose enter opens a dialog: it
            # never reaches the app; the screen or form that comes takes the keys)
            held = self._start_hold([], opener=None)
            self._opened_from = screen
            self._app.set_timer(SCREEN_CHECK_S, partial(self._when_opened, held))
        elif event.key in getattr(self._app.focused, "keys_that_apply_later", ()):
            # (it leaves its line at once, and the line applies once the keys before it
            # reached it: the keys after it wait for that, not for a screen)
            self._start_hold([], opener=None)
        elif self._opens(event.key, self._form_keys):
            self._start_hold([], opener=event)
        elif self._opens(event.key, self._screen_keys):
            # Let go once the screen it opens (or goes back to) is mounted, or when none
            # has come for a moment; not when its binding has run (the tables' enter never
            # reaches the app, and opens its row only once the keys before it moved there).
            # (the moment counts from its binding's end: from the key's arrival, a loaded
            # machine let the keys go before the binding had run, to the screen left)
            held = self._start_hold([], opener=None)
            self._screen_opener = event
            self._opened_from = screen
            self._app.set_timer(SCREEN_CHECK_S, partial(self._when_opened, held))
        return False

    def _start_hold(self, held: list[Typed], opener: events.Key | None) -> list[Typed]:
        """Hold keys from now (``held`` first), until :data:`HOLD_LIMIT` at most.

        The list is the hold's identity: every timer and check started for it lets go of
        that hold only. (A check left from the hold before let go of the one a replayed
        ``3`` had just started, before its area came: the keys after it went to the area
        being left, under load.)
        """
        self._held, self._opener, self._form_coming = held, opener, False
        self._held_since, self._held_on = monotonic(), self.current_screen()
        self._timer = self._app.set_timer(HOLD_LIMIT, partial(self._limit_reached, held))
        return held

    def _limit_reached(self, held: list[Typed]) -> None:
        """:data:`HOLD_LIMIT` passed: the keys go on where they are, but for a form still
        on its way (the edit form waits for its job from a slow engine): those keys were
        meant for its fields, and went to the table under it, silently (``e 3 Tab ...``
        there could cancel or restart the row: tester h133). They are dropped, saying so.

        A screen that came and is still being built, or a form that came and has not
        taken its keys yet, is waited for up to :data:`HOLD_CAP`: the limit's timer fires
        on time, but a busy app handles it late, behind its build (CI's coverage run)."""
        if self._held is not held or self._releasing is held:
            return  # (let go already, or its release is queued behind a busy app)
        screen = self.current_screen()
        came = screen is not None and screen is not self._held_on
        building = screen is not None and not screen.is_mounted
        if (building or (came and self._form_coming)) and (
            monotonic() - self._held_since < HOLD_CAP
        ):
            self._timer = self._app.set_timer(HOLD_RECHECK_S, partial(self._limit_reached, held))
            return
        if not (self._form_coming and held) or came:
            self.release(held)
            return
        if self._timer is not None:
            self._timer.stop()
        self._held, self._opener, self._form_coming, self._timer = None, None, False, None
        self._opened_from = self._screen_opener = None
        self._app.notify(
            f"the form took more than {HOLD_LIMIT:g} s to open: the {len(held)} "
            f"key{'s' if len(held) > 1 else ''} typed meanwhile went nowhere",
            title="keys",
            severity="warning",
        )

    def typed_on_another_screen(self, event: events.Key) -> bool:
        """Whether ``event``, on its way back up to the app's bindings, was typed on a
        screen that is no longer the current one: a priority key typed after it opened
        another meanwhile (``esc j enter`` on the jobs table opened the row, and the
        ``esc``, declined there, then ran the detail's back: tester h139). Its bindings
        would be the new screen's."""
        typed_on = self._typed_on.get(event)
        return typed_on is not None and typed_on is not self.current_screen()

    def current_screen(self) -> Screen[Any] | None:
        """The screen now; ``None`` while the app ends (a check's timer may fire then, and
        held keys be let go: ``q`` then more keys ended the app in ``ScreenStackError``,
        and a held ``3`` switched to a new area while the app closed its screens)."""
        if not self._app.is_running:
            return None
        try:
            return self._app.screen
        except (ScreenStackError, UnknownModeError):
            return None

    def _enter_opens_a_screen(self, event: events.Key, screen: Screen[Any]) -> bool:
        if isinstance(screen, CommandPalette):
            # (enter runs a command; esc closes it, and "j j" after it were lost: h137)
            return event.key in ("enter", "escape")
        scopes = self._send_keys.get(event.key)
        if scopes and getattr(screen, "KEYMAP_SCOPE", None) in scopes:
            return True  # (a form sent: what follows is for the screen under it)
        return event.key == "enter" and bool(
            getattr(self._app.focused, "enter_opens_a_screen", False)
        )

    def _when_opened(self, held: list[Typed]) -> None:
        if self._held is not held or self._opened_from is None:
            return  # (let go already)
        screen = self.current_screen()
        if screen is None:
            return
        if screen is not self._opened_from and screen.is_mounted and not self._form_coming:
            # (after what is queued now: a palette's command runs once the palette is
            # gone, and may open a form or focus a line)
            self._app.call_later(partial(self._opened, held))
        else:
            self._app.set_timer(SCREEN_CHECK_S, partial(self._when_opened, held))

    def _opened(self, held: list[Typed]) -> None:
        screen = self.current_screen()
        if self._held is not held or screen is None:
            return
        if screen.is_mounted and not self._form_coming:
            self.release(held)
        else:  # (the command opened a screen, or a form is on its way)
            self._app.set_timer(SCREEN_CHECK_S, partial(self._when_opened, held))

    def _opens(self, key: str, keys: dict[str, frozenset[str]]) -> bool:
        scopes = keys.get(key)
        if not scopes:
            return False
        screen = self._app.screen
        if isinstance(screen, ModalScreen) or isinstance(self._app.focused, (Input, TextArea)):
            return False  # (there the key is text, or the form is open already)
        scope = getattr(screen, "KEYMAP_SCOPE", None)
        return keymap.APP in scopes or scope in scopes

    def hold_for_screen(self, event: Typed) -> None:
        """``event`` came while the current screen is being built (from the terminal, or
        bubbled up from the screen before it to the app, whose bindings are the new
        screen's now): it goes on, before any key held after it, once that screen is
        mounted."""
        again: Typed  # (a fresh one: this one is spent)
        if isinstance(event, events.Paste):
            again = events.Paste(event.text)
        else:
            again = events.Key(event.key, event.character)
        if self._held is not None:
            self._held.insert(0, again)
            return
        held = self._start_hold([again], opener=None)
        self._app.set_timer(SCREEN_CHECK_S, partial(self._when_screen_mounted, held))

    def _when_screen_mounted(self, held: list[Typed]) -> None:
        if self._held is not held or self._opener is not None:
            return  # (let go already, or a form's hold now)
        screen = self.current_screen()
        if screen is None:
            return
        if screen.is_mounted:
            self.release(held)
        else:
            self._app.set_timer(SCREEN_CHECK_S, partial(self._when_screen_mounted, held))

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
        elif event is self._screen_opener:
            self._app.call_next(self._settle, event)

    def _settle(self, event: events.Key) -> None:
        """A screen key's binding has run: if no screen comes within a moment, the keys
        after it go on where they are."""
        if event is not self._screen_opener or self._held is None:
            return
        if self._timer is not None:
            self._timer.stop()
        self._timer = self._app.set_timer(SCREEN_SETTLE_S, partial(self.release, self._held))

    async def _after_opener(self, event: events.Key) -> None:
        if event is not self._opener or self._form_coming:
            return
        screen = self.current_screen()
        if screen is None:
            return
        if screen.is_mounted:
            if self._held is not None:
                await self._let_go(self._held)
        elif self._held is not None:  # (its action opened a screen: the keys are for it)
            self._opener = None
            self._app.set_timer(SCREEN_CHECK_S, partial(self._when_screen_mounted, self._held))

    def release(self, held: list[Typed] | None = None) -> None:
        """Let the held keys go on, in the order they came (to the form now up, if one
        is), from the app's own message loop: keys that come meanwhile join the held ones.

        Args:
            held: The hold to let go of (a timer's or a check's own); ``None``: the one now.
        """
        current = self._held
        if current is not None and (held is None or held is current):
            self._releasing = current
            self._app.call_next(self._let_go, current)

    async def _let_go(self, held: list[Typed]) -> None:
        """Let the held keys go on, one at a time: each after the one before it has been
        handled (its binding may open a screen, which the rest are for: replayed at once,
        a key overtook the dialog the one before it opened, and went to the screen under
        it: tester h132)."""
        if self._held is not held:
            return  # (let go already: two asked, the second would let go of a later hold)
        if self._timer is not None:
            self._timer.stop()
        self._held, self._opener, self._form_coming, self._timer = None, None, False, None
        self._opened_from = self._screen_opener = None
        if not held or self.current_screen() is None:
            return
        first, rest = held[0], held[1:]
        await self._replay(first)  # (one that opens a form or a screen holds what follows)
        if not rest:
            return
        if self._held is not None:  # (it started a hold: the rest wait behind it, in order)
            self._held.extend(rest)
            return
        self._start_hold(rest, opener=None)
        self._app.call_after_refresh(partial(self._when_screen_mounted, rest))


def esc_then_key(event: events.Key, screen: Screen[Any]) -> list[events.Key] | None:
    """``esc`` and a key typed within the terminal parser's escape delay (0.1 s) come as
    one ``alt+`` key: "esc j" (back, then the next row) did nothing at all (tester h133).
    Where nothing binds that ``alt+`` key, it is the two keys again (else ``None``)."""
    if not event.key.startswith("alt+") or event.key in screen.active_bindings:
        return None
    character = event.character
    if character is None or len(character) != 1 or not character.isprintable():
        return None
    name = event.key.removeprefix("alt+")
    if name.startswith("shift+"):
        name = character  # (an upper-case letter's key is the letter)
    return [events.Key("escape", "\x1b"), events.Key(name, character)]


def release_keys(screen: Screen[Any]) -> None:
    """A form sent with ``ctrl+s`` stays open (a problem in a field, the engine's refusal):
    the keys typed after it are for the form after all."""
    hold = getattr(screen.app, "key_hold", None)
    if isinstance(hold, KeyHold):
        hold.release()


def focus_first_field(screen: Screen[Any], field: Widget) -> None:
    """Focus a form's first field now, and let the keys held for the form go into it."""
    screen.set_focus(field)  # (now: Widget.focus waits behind the keys on their way)
    hold = getattr(screen.app, "key_hold", None)
    if isinstance(hold, KeyHold):
        hold.release()
