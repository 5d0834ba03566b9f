"""Small modal dialogs: a yes/no confirmation, signalling a process and the quit choice.

Their texts quote job names, commands and users: they are shown as text (``Content``),
never read as markup.
"""

from __future__ import annotations

import os
from dataclasses import replace
from enum import StrEnum
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Label, Static

from .. import keymap
from ..formatting import GIB, gpus_named
from ..widgets.check_box import CheckBox
from ..widgets.key_footer import KeyFooter
from .narrow import StacksButtonsWhenNarrow


class ConfirmScreen(StacksButtonsWhenNarrow, ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True only on an explicit yes."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("confirm"))
    KEYMAP_SCOPE: ClassVar[str] = "confirm"

    def __init__(self, title: str, question: str, yes_label: str = "Yes") -> None:
        super().__init__()
        self._title = title
        self._question = question
        self._yes = yes_label
        # The footer names y as the button does ("y Yes" beside "Drain (y)" was two
        # names for one answer).
        self._bindings.key_to_bindings = {
            key: [
                replace(b, description=yes_label) if b.action == "answer(True)" else b
                for b in found
            ]
            for key, found in self._bindings.key_to_bindings.items()
        }

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -scrolls"):
            yield Label(Content(self._title), classes="dialog-title")
            yield Static(Content(self._question), id="question")
            with Horizontal(classes="buttons"):
                yield Button(f"{self._yes} (y)", id="yes", variant="error")
                yield Button("No (n)", id="no", variant="primary")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def add_note(self, note: str) -> None:
        """Say more under the question (what was learnt after it was asked; text)."""
        self._question = f"{self._question}\n\n{note}"  # (not composed yet: it is then)
        for question in self.query("#question").results(Static):
            question.update(Content(self._question))

    def action_answer(self, yes: bool) -> None:
        """Close the dialog with the answer."""
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


def _user_name() -> str:
    """This TUI's user, as the engine names users (its name, else its uid)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


class SignalScreen(StacksButtonsWhenNarrow, ModalScreen[str | None]):
    """Signal a stray GPU process: SIGTERM, or SIGKILL when chosen. Dismisses with the
    signal's name (``"TERM"`` / ``"KILL"``), or ``None`` when cancelled.

    Args:
        process: ``pid``, ``user``, ``command`` and, when known, ``gpus`` (indices) and
            ``used_bytes`` (held now).
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("signal"))
    KEYMAP_SCOPE: ClassVar[str] = "signal"

    def __init__(self, process: dict[str, Any]) -> None:
        super().__init__()
        self.process = process

    def compose(self) -> ComposeResult:
        proc = self.process
        user = str(proc.get("user") or "")
        gpus = gpus_named(proc.get("gpus") or [], getattr(self.app, "gpu_state", None))
        held = proc.get("used_bytes")
        facts = [f"pid {proc['pid']}", f"user {user or '?'}"]
        if gpus:
            facts.append(gpus)
        if held:
            facts.append(f"holds {held / GIB:.1f} GiB")
        with Vertical(classes="dialog -scrolls", id="signal-dialog"):
            yield Label(f"Signal pid {proc['pid']}?", classes="dialog-title")
            yield Static(Content(str(proc.get("command") or "(command unknown)")), id="signal-what")
            yield Static(Content(" · ".join(facts)), classes="muted")
            me = _user_name()
            if user and user != me and os.getuid() != 0:
                yield Static(
                    Content(
                        f"This is {user}'s process and you are {me}: the engine signals "
                        "only its caller's own processes (anyone's for root), so it will "
                        "most likely refuse."
                    ),
                    id="signal-owner",
                    classes="error-text",
                )
            yield CheckBox("SIGKILL instead of SIGTERM (k): no chance to clean up", id="kill")
            with Horizontal(classes="buttons"):
                yield Button("Send SIGTERM (y)", id="send", variant="error")
                yield Button("No (n)", id="no", variant="primary")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @property
    def signal_name(self) -> str:
        """The signal the dialog would send now."""
        return "KILL" if self.query_one("#kill", Checkbox).value else "TERM"

    @on(Checkbox.Changed, "#kill")
    def _kill_toggled(self) -> None:
        self.query_one("#send", Button).label = f"Send SIG{self.signal_name} (y)"

    def action_toggle_kill(self) -> None:
        """SIGKILL instead of SIGTERM, or back."""
        box = self.query_one("#kill", Checkbox)
        box.value = not box.value

    def action_send(self) -> None:
        """Close the dialog: send the chosen signal."""
        self.dismiss(self.signal_name)

    def action_cancel(self) -> None:
        """Close the dialog without signalling."""
        self.dismiss(None)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "send":
            self.action_send()
        else:
            self.action_cancel()


class QuitChoice(StrEnum):
    """What to do with an embedded engine's work when quitting."""

    HANDOVER = "handover"
    STOP = "stop"
    STAY = "stay"


class QuitScreen(StacksButtonsWhenNarrow, ModalScreen[QuitChoice]):
    """Quitting with jobs in flight in an embedded engine: keep them, stop them, or stay."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("quit"))
    KEYMAP_SCOPE: ClassVar[str] = "quit"

    def __init__(self, active: int, elsewhere: int = 0, adopted: int = 0) -> None:
        """``active``: jobs it started or will start; ``adopted``: adopted processes it
        watches (counted apart: "Stop" leaves them alone, and "3 jobs" of one job and two
        adopted processes read as three to cancel: tester h182)."""
        super().__init__()
        self.active = active
        self.elsewhere = elsewhere
        self.adopted = adopted

    def compose(self) -> ComposeResult:
        facts = []
        if self.active:
            noun = "job is" if self.active == 1 else "jobs are"
            facts.append(f"{self.active} {noun} running or queued in this window's engine.")
        if self.adopted:
            noun = "process is" if self.adopted == 1 else "processes are"
            facts.append(f"{self.adopted} adopted {noun} watched by it.")
        every = self.active + self.adopted
        if self.elsewhere:
            windows = "window is" if self.elsewhere == 1 else "windows are"
            facts.append(f"{self.elsewhere} other {windows} attached to it.")
        # ("1 job is running ... takes them over": tester h170)
        takes = ("takes it over" if every == 1 else "takes them over") if every else "takes over"
        if self.elsewhere:
            takes += " and the other windows stay attached"
        keep = (
            f"Keep running: a background engine (gpulayer-tui --serve) {takes}; reopen "
            "gpulayer-tui later to attach to it."
        )
        left = (
            " Adopted processes are left alone (a later engine re-learns them)."
            if self.adopted
            else ""
        )
        stop = (
            ("Stop: cancel every job, then quit." if self.active else "Stop: quit.") + left
            if every
            else "Stop: quit; the other windows lose their engine."
        )
        with Vertical(classes="dialog -scrolls", id="quit-dialog"):
            yield Label("Quit gpulayer-tui?", classes="dialog-title")
            yield Static(" ".join(facts) + f"\n\n{keep}\n\n{stop}")
            with Horizontal(classes="buttons"):
                yield Button("Keep running (k)", id="handover", variant="primary")
                # (one word for both cases: the footer's key says the same as the button)
                yield Button("Stop (s)", id="stop", variant="error")
                yield Button("Stay (esc)", id="stay")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#handover", Button).focus()

    def action_choose(self, choice: str) -> None:
        """Close the dialog with a choice."""
        self.dismiss(QuitChoice(choice))

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(QuitChoice(event.button.id or "stay"))
