"""Strays: GPU processes the engine does not own, and adopting them (record 004)."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from ..backend import BackendError
from ..engine.procs import read_cmdline, read_uid, start_ticks, started_at, user_name
from ..widgets.engine_status import EngineStatus
from ..widgets.stray_table import StrayTable, strays_from
from .adopt import AdoptScreen


class StraysScreen(Screen[None]):
    """Lists foreign GPU processes; ``a`` adopts the selected one, ``p`` any pid."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "adopt_selected", "Adopt"),
        Binding("p", "adopt_pid", "Adopt a pid"),
        Binding("escape", "close_pid", "Close", show=False),
    ]

    DEFAULT_CSS = """
    StraysScreen #strays-hint { height: auto; padding: 0 1; color: $text-muted; }
    StraysScreen #strays-empty { padding: 1 2; color: $text-muted; }
    StraysScreen #pid-input { display: none; margin: 0 1; }
    StraysScreen #pid-input.visible { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield EngineStatus("strays")
        yield Static(
            "GPU processes that no job owns (their memory shows as unregistered). "
            "a: adopt the selected one · p: adopt any pid",
            id="strays-hint",
        )
        # Disabled while hidden, so it never takes the focus (and the keys) from the table.
        yield Input(
            placeholder="pid to adopt, then enter", id="pid-input", type="integer", disabled=True
        )
        yield StrayTable(id="strays")
        yield Static("No unregistered GPU processes.", id="strays-empty")
        yield Footer()

    def on_mount(self) -> None:
        app: Any = self.app
        self.watch(app, "gpu_state", self._refresh, init=True)
        self.query_one("#pid-input", Input).cursor_blink = bool(getattr(app, "cursor_blink", True))
        self.query_one(StrayTable).focus()

    def _refresh(self, _state: object = None) -> None:
        app: Any = self.app
        strays = strays_from(app.gpu_state)
        self.query_one(StrayTable).show(strays, app.clock())
        self.query_one("#strays-empty").display = not strays

    def action_adopt_selected(self) -> None:
        """Adopt the process on the cursor row."""
        self.query_one(StrayTable).action_adopt()

    def action_adopt_pid(self) -> None:
        """Type a pid to adopt (any process, e.g. one not on a GPU yet)."""
        field = self.query_one("#pid-input", Input)
        field.disabled = False
        field.add_class("visible")
        field.focus()

    def action_close_pid(self) -> None:
        """Hide the pid field."""
        field = self.query_one("#pid-input", Input)
        field.remove_class("visible")
        field.value = ""
        field.disabled = True
        self.query_one(StrayTable).focus()

    @on(Input.Submitted, "#pid-input")
    def _pid_entered(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text.isdigit() or int(text) < 1:
            self.app.notify(f"a pid is a positive number, not {text!r}", severity="error")
            return
        pid = int(text)
        self.action_close_pid()
        known = self.query_one(StrayTable).rows_by_pid.get(pid)
        if known is None:
            ticks = start_ticks(pid)
            uid = read_uid(pid)
            known = {
                "pid": pid,
                "start_ticks": ticks,
                "started_at": started_at(ticks) if ticks is not None else None,
                "command": read_cmdline(pid),
                "user": user_name(uid) if uid is not None else "",
                "gpus": [],
                "used_bytes": 0,
            }
        self.app.push_screen(AdoptScreen(known), self._confirmed)

    @on(StrayTable.AdoptRequested)
    def _adopt_requested(self, message: StrayTable.AdoptRequested) -> None:
        self.app.push_screen(AdoptScreen(message.process), self._confirmed)

    def _confirmed(self, request: dict[str, Any] | None) -> None:
        if request is not None:
            self._adopt(request)

    @work(exclusive=True, group="adopt", exit_on_error=False)
    async def _adopt(self, request: dict[str, Any]) -> None:
        app: Any = self.app
        try:
            job = await app.backend.adopt(request)
        except BackendError as err:
            app.notify(str(err), title="adopt", severity="error")
            return
        app.job_store.apply(job)
        if job["status"] == "running":
            app.notify(f"pid {request['pid']} adopted as job {job['id']}", title="adopt")
        else:
            app.notify(job["message"], title=f"job {job['id']} {job['status']}", severity="error")
