"""Strays: GPU processes the engine does not own, adopting them (record 004) and
signalling them."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.screen import Screen
from textual.widgets import Input, Static

from .. import keymap, wire
from ..backend import BackendError
from ..view import view_of
from ..widgets.engine_status import EngineStatus
from ..widgets.field_input import FieldInput, after_typed
from ..widgets.key_footer import KeyFooter
from ..widgets.stray_table import StrayTable, strays_from
from ..wire import JobJSON
from .actions import ask_to_signal
from .adopt import AdoptScreen
from .resume import KeepsStylesOnResume
from .stale import mark_while_no_engine


class StraysScreen(KeepsStylesOnResume, Screen[None]):
    """Lists foreign GPU processes; ``a`` adopts the selected one, ``p`` any pid, ``x``
    signals the selected one."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("strays"))
    KEYMAP_SCOPE: ClassVar[str] = "strays"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    DEFAULT_CSS = """
    StraysScreen #strays-hint { height: auto; padding: 0 1; color: $text-muted; }
    StraysScreen #strays-empty { padding: 1 2; color: $text-muted; }
    StraysScreen.-no-engine StrayTable { text-opacity: 50%; }
    StraysScreen #pid-input { display: none; margin: 0 1; }
    StraysScreen #pid-input.visible { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield EngineStatus("strays")
        yield Static(
            # (a job's process on a GPU its job does not hold is listed too: the header
            # said "that no job owns" above it: tester h187)
            "GPU processes that no job on their GPU owns (unregistered memory). "
            "a: adopt · p: adopt any pid · x: signal",
            id="strays-hint",
        )
        # Disabled while hidden, so it never takes the focus (and the keys) from the table.
        # Text, checked on enter: an integer field dropped what was not a digit, and
        # "12 34" became pid 1234, another process (tester h165).
        pid_input = FieldInput(
            placeholder="pid to adopt, then enter (esc: close)",
            id="pid-input",
            disabled=True,
        )
        pid_input.enter_opens_a_screen = True  # (the adopt dialog: `p 4242 enter` + name)
        yield pid_input
        yield StrayTable(id="strays")
        yield Static("No unregistered GPU processes.", id="strays-empty")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        app = view_of(self)
        self.watch(self.app, "gpu_state", self._refresh, init=True)
        mark_while_no_engine(self)
        self.query_one("#pid-input", Input).cursor_blink = bool(getattr(app, "cursor_blink", True))
        self.query_one(StrayTable).focus()

    def _refresh(self, _state: object = None) -> None:
        app = view_of(self)
        strays = strays_from(app.gpu_state)
        self.query_one(StrayTable).show(strays, app.clock())
        empty = self.query_one("#strays-empty", Static)
        empty.display = not strays
        self.refresh_bindings()  # (a and x: dimmed with no process to act on)
        if not strays:
            state = app.gpu_state
            simulated = state is not None and state.get("backend") == "simulated"
            # (a `sleep 600 &` never showed here, with no word why: tester h67)
            empty.update(
                "No unregistered GPU processes."
                + (
                    " The GPUs are simulated: a process shows here only while the simulator "
                    "books GPU memory to it (sim-ledger.json in the state dir, as the "
                    "README shows); p adopts any process by its pid."
                    if simulated
                    else ""
                )
            )

    def on_key(self, event: events.Key) -> None:
        # Dimmed with no process listed, a and x did nothing at all, their actions'
        # words never said (tester h120): pressed, they say why.
        action = {"a": "adopt_selected", "x": "signal_process"}.get(event.key)
        if action is not None and self.check_action(action, ()) is None:
            event.stop()
            event.prevent_default()
            getattr(self, f"action_{action}")()

    def action_adopt_selected(self) -> None:
        """Adopt the process on the cursor row."""
        if self.query_one(StrayTable).cursor_process is None:
            # (as `x` says: with no stray listed, `a` did nothing at all)
            self.app.notify("no process selected (p adopts one by its pid)", severity="warning")
            return
        view_of(self).key_hold.form_coming()  # (the keys typed after a wait for the dialog)
        self.query_one(StrayTable).action_adopt()

    def action_signal_process(self) -> None:
        """Signal the process on the cursor row (after a confirmation)."""
        process = self.query_one(StrayTable).cursor_process
        if process is None:
            self.app.notify("no process selected", severity="warning")
            return
        ask_to_signal(self, process)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``p`` (a priority key), ``a`` and ``x`` are text in the pid line, where the
        footer says enter and esc instead."""
        typing = isinstance(self.focused, Input) and self.focused.id == "pid-input"
        if action in ("adopt_selected", "signal_process") and not typing:
            # (dimmed with no process listed, as c and e are with no job: tester h95)
            tables = self.query(StrayTable)
            return True if not tables or tables.first().cursor_process is not None else None
        if action in ("adopt_pid", "adopt_selected", "signal_process"):
            return not typing
        if action == "submit_pid":
            return typing
        if action == "close_pid":
            return self.query_one("#pid-input").has_class("visible")
        return True

    def action_submit_pid(self) -> None:
        """Adopt the pid typed (enter, while the pid line is open), once the digits typed
        before it are in the field: a pid pasted with its Enter was "empty" (tester h97)."""
        field = self.query_one("#pid-input", Input)

        def submit() -> None:
            field.post_message(Input.Submitted(field, field.value))

        after_typed(self, submit)

    def action_adopt_pid(self) -> None:
        """Type a pid to adopt (any process, e.g. one not on a GPU yet)."""
        field = self.query_one("#pid-input", Input)
        field.disabled = False
        field.add_class("visible")
        self.set_focus(field)  # (now: Widget.focus waits behind the keys on their way)
        self.refresh_bindings()

    def action_close_pid(self) -> None:
        """Hide the pid field."""
        field = self.query_one("#pid-input", Input)
        field.remove_class("visible")
        field.value = ""
        field.disabled = True
        self.query_one(StrayTable).focus()
        self.refresh_bindings()

    @on(Input.Submitted, "#pid-input")
    def _pid_entered(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            self.app.notify("type a process id (digits 0-9), then enter", title="pid")
            return
        try:
            pid = wire.parse_field("pid", event.value)
        except wire.FieldError as err:
            self.app.notify(err.detail, title="pid", severity="error")
            return
        known = self.query_one(StrayTable).rows_by_pid.get(pid)
        if known is not None:
            self.action_close_pid()
            self.app.push_screen(AdoptScreen(known), self._confirmed)
        else:
            self._confirm_any(pid)

    @work(exclusive=True, group="adopt", exit_on_error=False)
    async def _confirm_any(self, pid: int) -> None:
        """Ask the engine what the process is (it reads /proc, and knows its jobs and the
        GPU memory it holds), then confirm. One that can never be adopted is said, not
        offered: the dialog said "no GPU memory seen" of a job's process holding 5 GiB,
        and adopting it, or a pid that is gone, only added a failed job to the history.
        The pid field stays open with the pid until the dialog opens: a refusal closed it,
        and the pid typed was lost."""
        known: dict[str, Any] = {"pid": pid, "gpus": [], "used_bytes": 0}
        try:
            known.update(await view_of(self).backend.process(pid))
        except BackendError as err:
            if err.status == 404:
                err = BackendError(f"no process with pid {pid} (it exited, or never was)")
            self.app.notify(str(err), title="adopt", severity="error")
            return
        if known.get("refused"):
            self.app.notify(str(known["refused"]), title="adopt", severity="error")
            return
        self.action_close_pid()
        self.app.push_screen(AdoptScreen(known), self._confirmed)

    @on(StrayTable.AdoptRequested)
    def _adopt_requested(self, message: StrayTable.AdoptRequested) -> None:
        self._confirm_selected(dict(message.process))

    @work(exclusive=True, group="adopt", exit_on_error=False)
    async def _confirm_selected(self, process: dict[str, Any]) -> None:
        """Ask the engine about the selected stray first, as for a typed pid: one it can
        never adopt (another user's, pid 1, the engine) is said before the dialog. The
        dialog opened, and its refusal after ctrl+s was a failed job in the history
        (tester h171)."""
        app = view_of(self)
        pid = int(process["pid"])
        try:
            info = dict(await app.backend.process(pid))
        except BackendError as err:
            if err.status == 404:
                err = BackendError(f"no process with pid {pid} (it exited)")
            self.app.notify(str(err), title="adopt", severity="error")
            app.key_hold.release()  # (no dialog: what was typed after a goes on)
            return
        refused = info.get("refused")
        ticks = process.get("start_ticks")
        if not refused and ticks is not None and info.get("start_ticks") != ticks:
            refused = f"pid {pid} is a different process now: the pid was reused"
        if refused:
            self.app.notify(str(refused), title="adopt", severity="error")
            app.key_hold.release()
            return
        # (the row as listed, what it holds and its start time, over the engine's facts)
        self.app.push_screen(AdoptScreen({**info, **process}), self._confirmed)

    def _confirmed(self, job: JobJSON | None) -> None:
        if job is not None:
            said = f"pid {job.get('pid')} adopted as job {job['id']}"
            # (a warning it was adopted with: a quarantined GPU, more VRAM than was free)
            _, warned, warning = str(job.get("message") or "").partition("; warning: ")
            if warned:
                self.app.notify(f"{said}; {warning}", title="adopt", severity="warning")
            else:
                self.app.notify(said, title="adopt")
