"""The adopt dialog: name and declared VRAM for a process about to become a job."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from .. import keymap, wire
from ..formatting import GIB
from ..widgets.key_footer import KeyFooter


class AdoptScreen(ModalScreen[dict[str, Any] | None]):
    """Confirm an adoption; dismisses with the adopt request, or ``None`` if cancelled.

    Args:
        process: The stray as the strays table knows it: ``pid``, ``start_ticks``,
            ``command``, ``user``, ``gpus`` (indices) and ``used_bytes`` (held now).
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("adopt"))
    KEYMAP_SCOPE: ClassVar[str] = "adopt"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    def __init__(self, process: dict[str, Any]) -> None:
        super().__init__()
        self.process = process

    def compose(self) -> ComposeResult:
        proc = self.process
        held = proc.get("used_bytes")
        gpus = ", ".join(f"gpu{g}" for g in proc.get("gpus", [])) or "no GPU memory seen"
        program = (proc.get("command") or "").split(" ", 1)[0]
        with Vertical(classes="dialog", id="adopt-dialog"):
            yield Label(f"Adopt pid {proc['pid']}?", classes="dialog-title")
            # (Content: a command line and a user name are shown as written, never as
            # markup: "[/bold]" in an argv would end the app)
            yield Static(
                Content(
                    f"{proc.get('command') or '(command unknown)'}\n"
                    f"user {proc.get('user') or '?'} · {gpus}"
                    + (f" · holds {held / GIB:.1f} GiB" if held else "")
                ),
                id="adopt-what",
            )
            yield Static(
                "It becomes a running job: its GPU memory counts as owned, it can be waited "
                "on and cancelled (SIGTERM, then SIGKILL). gpulayer-tui never runs its "
                "command again.",
                classes="muted",
            )
            yield Label("Name")
            yield Input(value=os.path.basename(program) or "", id="adopt-name")
            yield Label("Declared VRAM per GPU (GiB, empty for what it holds)")
            # (per GPU: the most it holds on one; the sum over its GPUs was offered, and a
            # process on two GPUs was over-reserved on each, or refused as too big)
            per_gpu = proc.get("most_on_a_gpu", held)
            yield Input(
                value=f"{per_gpu / GIB:.1f}" if per_gpu else "",
                id="adopt-vram",
                placeholder="e.g. 24",
            )
            yield Static("", id="adopt-error", classes="error-text")
            with Horizontal(classes="buttons"):
                yield Button("Adopt (ctrl+s)", id="adopt", variant="primary")
                yield Button("Cancel (esc)", id="cancel")
        yield KeyFooter()

    def on_mount(self) -> None:
        blink = bool(getattr(self.app, "cursor_blink", True))
        for field in self.query(Input):
            field.cursor_blink = blink
        self.query_one("#adopt-name", Input).focus()

    def _request(self) -> dict[str, Any] | None:
        error = self.query_one("#adopt-error", Static)
        name = self.query_one("#adopt-name", Input).value.strip()
        raw = self.query_one("#adopt-vram", Input).value.strip()
        request: dict[str, Any] = {"pid": self.process["pid"]}
        if self.process.get("start_ticks") is not None:
            request["start_ticks"] = self.process["start_ticks"]
        if name:
            try:  # (the engine's refusal closed the dialog, and what was typed was lost)
                request["name"] = wire.parse_field("name", name)
            except wire.FieldError as err:
                error.update(Content(f"name: {err.detail}"))
                return None
        if raw:
            try:
                request["vram_gb"] = wire.parse_field("vram_gb", raw)
            except wire.FieldError as err:
                error.update(Content(f"declared VRAM: {err.detail}"))  # (quotes the input)
                return None
        if self.process.get("gpus"):
            request["gpu"] = True
        error.update("")
        return request

    def action_adopt(self) -> None:
        """Adopt with the values in the form."""
        request = self._request()
        if request is not None:
            self.dismiss(request)

    def action_cancel(self) -> None:
        """Close without adopting."""
        self.dismiss(None)

    @on(Input.Submitted)
    def _enter(self) -> None:
        self.action_adopt()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "adopt":
            self.action_adopt()
        else:
            self.dismiss(None)
