"""The adopt dialog: name, declared VRAM and domain for a process about to become a job.

The dialog sends the adoption itself and stays open on a refusal, with the engine's words
under the form and the field it names focused: it used to close first, and what was typed
was lost when the engine asked for a domain the dialog had no field for."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from .. import keymap, wire
from ..backend import BackendError
from ..fields import default_job_name
from ..formatting import GIB, gpus_named
from ..key_hold import focus_first_field, release_keys
from ..view import view_of
from ..widgets.field_input import FieldInput, after_typed
from ..widgets.key_footer import KeyFooter
from ..wire import JobJSON
from .submit import ListSuggester, split_list

_FIELD_INPUT = {"name": "adopt-name", "vram_gb": "adopt-vram", "domain": "adopt-domain"}
"""Request field (as the engine's refusals name it) -> the input that sets it."""

_FIELD_WORDS = {"vram_gb": "declared VRAM"}
"""Request field -> how the form says it, where its label differs ("declared VRAM: ..."
for a typo, "vram_gb: ..." for the engine's refusal of the same field: tester h97)."""


class AdoptScreen(ModalScreen[JobJSON | None]):
    """Confirm an adoption and send it; dismisses with the running job, or ``None``.

    A refusal (the engine's words) keeps the dialog open with what was typed. So does an
    adoption the engine recorded as failed (the pid was gone, or recycled): that job is in
    the table, and the dialog says why.

    Args:
        process: The stray as the strays table knows it: ``pid``, ``start_ticks``,
            ``command``, ``user``, ``gpus`` (indices) and ``used_bytes`` (held now).
    """

    DEFAULT_CSS = """
    AdoptScreen #adopt-dialog Input {
        background: $panel;
        padding: 0 1;
        margin-bottom: 1;
    }
    AdoptScreen #adopt-dialog Input:focus { background: $primary 30%; }
    """
    # (compact fields: with a third one, the bordered inputs pushed the buttons out of
    # a 32-row terminal)

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("adopt"))
    KEYMAP_SCOPE: ClassVar[str] = "adopt"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    def __init__(self, process: dict[str, Any]) -> None:
        super().__init__()
        self.process = process
        self._busy = False
        self._refused_for_good = ""
        self._as_opened: tuple[str, ...] = ()
        self._discard_armed = False
        self._quit_armed = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="adopt-dialog"):
            yield Label(f"Adopt pid {self.process['pid']}?", classes="dialog-title")
            yield from self._fields()
            # (outside the fields' scroll, as the buttons: at 80x24 a refusal and both
            # buttons were below the screen's edge, and Tab went to buttons out of sight:
            # tester h142)
            yield Static("", id="adopt-error", classes="error-text")
            with Horizontal(classes="buttons"):
                yield Button("Adopt (ctrl+s)", id="adopt", variant="primary")
                yield Button("Cancel (esc)", id="cancel")
        yield KeyFooter()

    def _fields(self) -> ComposeResult:
        proc = self.process
        held = proc.get("used_bytes")
        state = view_of(self).gpu_state
        gpus = gpus_named(proc.get("gpus") or [], state) or "no GPU memory seen"
        with VerticalScroll(classes="form-fields", id="adopt-fields"):
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
            yield FieldInput(value=self._suggested_name(), id="adopt-name", compact=True)
            yield Label("Declared VRAM per GPU (GiB, empty for what it holds)")
            # (per GPU: the most it holds on one; the sum over its GPUs was offered, and a
            # process on two GPUs was over-reserved on each, or refused as too big)
            per_gpu = proc.get("most_on_a_gpu", held)
            yield FieldInput(
                value=f"{per_gpu / GIB:.1f}" if per_gpu else "",
                id="adopt-vram",
                # (emptied, it said "e.g. 24" beside a label saying empty is what it holds:
                # tester h124)
                placeholder=f"{per_gpu / GIB:.1f}: what it holds" if per_gpu else "e.g. 24",
                compact=True,
            )
            yield Label("Domain (empty: where it holds GPU memory, else the cpu pool)")
            yield FieldInput(
                id="adopt-domain",
                placeholder=self._domain_hint(),
                suggester=ListSuggester(self._domain_names),
                compact=True,
            )
            yield Static("", id="adopt-note", classes="muted")

    CHROME = 10
    """Rows of the dialog that are not its fields or its message: border and padding
    (4), the title and the row under it (2), the buttons and the row above them (4)."""

    def _say(self, message: str) -> None:
        """The dialog's message (text: it quotes what was typed), above the buttons."""
        self.query_one("#adopt-error", Static).update(Content(message))
        self.call_after_refresh(self._fit)

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """Give the fields what the dialog (at most 90% of the screen) leaves beside its
        message and buttons, which stay in sight; the focused field is scrolled to."""
        said = self.query_one("#adopt-error", Static).outer_size.height
        room = max(3, self.size.height * 9 // 10 - self.CHROME - said)
        self.query_one("#adopt-fields").styles.max_height = room
        focused = self.focused
        if focused is not None:
            self.call_after_refresh(focused.scroll_visible, animate=False)

    def on_mount(self) -> None:
        blink = bool(getattr(self.app, "cursor_blink", True))
        for field in self.query(Input):
            field.cursor_blink = blink
        self._as_opened = self._values()  # (before the keys typed after a go in)
        self._say_busy_domains()
        focus_first_field(self, self.query_one("#adopt-name", Input))
        if not self.process.get("name"):
            self._ask_name()

    def _suggested_name(self) -> str:
        """The name offered: the engine's for the process where it said one, else its
        command's first word, less what a name may not hold."""
        if self.process.get("name"):
            return str(self.process["name"])
        return default_job_name((self.process.get("command") or "").split(" ", 1)[0], "")

    @work(exclusive=True, group="adopt-name", exit_on_error=False)
    async def _ask_name(self) -> None:
        """Offer the engine's name for the process (from its argv[0] whole) instead of
        the one made here from a table row's command: that text joins the words with
        spaces (a program under "/tmp/my proj/" was offered "my") and shows escapes as
        text, kept as such in the name (tester h163). Only while the name is untouched."""
        field = self.query_one("#adopt-name", Input)
        offered = field.value
        try:
            info = await view_of(self).backend.process(int(self.process["pid"]))
        except BackendError:
            return  # (gone, or no engine: the adoption says so when it is asked)
        ticks = self.process.get("start_ticks")
        if ticks is not None and info.get("start_ticks") != ticks:
            return  # (another process now has the pid: the adoption refuses it)
        name = info.get("name")
        if not name or field.value != offered or name == offered:
            return
        untouched = self._values() == self._as_opened
        field.value = name
        field.cursor_position = len(name)
        if untouched:
            self._as_opened = self._values()  # (esc closes without asking, as before)

    @on(Input.Changed, "#adopt-domain")
    def _domain_typed(self) -> None:
        self._say_busy_domains()

    def _say_busy_domains(self) -> None:
        """Say which of the domains it would be adopted on have every slot taken: it runs
        there already, so adopting takes one more (``slots 2/1``) and new jobs wait for
        it; the dialog said nothing (tester h70)."""
        state = getattr(self.app, "gpu_state", None) or {}
        domains = {str(d.get("name")): d for d in state.get("domains", [])}
        typed = split_list(self.query_one("#adopt-domain", Input).value)
        if typed:
            targets = [domains[name] for name in typed if name in domains]
        else:
            held = set(self.process.get("gpus") or [])
            targets = [d for d in domains.values() if d.get("gpu_index") in held]
        full = [
            f"{d['name']} ({d['used_slots']}/{d['slots']})"
            for d in targets
            if d.get("slots") and d.get("used_slots", 0) >= d["slots"]
        ]
        notes = []
        if full:
            notes.append(
                f"every slot of {', '.join(full)} is taken: adopted, it counts as one more "
                "there (it runs already), and jobs wait for its end"
            )
        # (adopted onto a drained GPU without a word: tester h107; it runs there already,
        # so the drain does not refuse it, but the one who drained it may not expect it)
        draining = [d for d in targets if d.get("state") == "draining"]
        for dom in draining:
            why = f" ({dom['state_reason']})" if dom.get("state_reason") else ""
            notes.append(
                f"{dom['name']} is draining{why}: adopted, the process keeps running there "
                "and holds its slot until it ends"
            )
        self.query_one("#adopt-note", Static).update(Content("\n".join(notes)))

    def _values(self) -> tuple[str, ...]:
        return tuple(field.value for field in self.query(Input))

    def _domain_names(self) -> list[str]:
        state = getattr(self.app, "gpu_state", None) or {}
        return [str(d["name"]) for d in state.get("domains", []) if d.get("name")]

    def _domain_hint(self) -> str:
        names = self._domain_names()
        return "e.g. " + ", ".join(names[:6]) if names else "e.g. gpu0"

    def _request(self) -> dict[str, Any] | None:
        name = self.query_one("#adopt-name", Input).value.strip()
        raw = self.query_one("#adopt-vram", Input).value.strip()
        request: dict[str, Any] = {"pid": self.process["pid"]}
        if self.process.get("start_ticks") is not None:
            request["start_ticks"] = self.process["start_ticks"]
        if name:
            try:  # (the engine's refusal closed the dialog, and what was typed was lost)
                request["name"] = wire.parse_field("name", name)
            except wire.FieldError as err:
                # (with its field focused, as the engine's refusals are: the next keys
                # went to the field focused before, and wrote over it: tester h144)
                self._refused(f"name: {err.detail}", "name")
                return None
        if raw:
            try:
                request["vram_gb"] = wire.parse_field("vram_gb", raw)
            except wire.FieldError as err:
                self._refused(f"vram_gb: {err.detail}", "vram_gb")  # (quotes the input)
                return None
        domains = split_list(self.query_one("#adopt-domain", Input).value)
        if domains:
            request["domain"] = domains
        elif self.process.get("gpus"):
            request["gpu"] = True
        try:
            wire.parse_adopt_request(request)
        except wire.FieldError as err:
            self._refused(f"{err.field}: {err.detail}", err.field)
            return None
        self._say("")
        return request

    def action_adopt(self) -> None:
        """Adopt with the values in the form (once the keys typed before are in their
        fields: see :func:`after_typed`)."""
        after_typed(self, self._adopt_now)

    def _adopt_now(self) -> None:
        if self._busy:
            return
        if self._refused_for_good:
            # (each retry stored one more failed job for a process no field change could
            # make adoptable: another user's, or gone: tester h97)
            self._refused(self._refused_for_good, None)
            return
        request = self._request()
        if request is not None:
            self._adopt(request)

    @work(exclusive=True, group="adopt", exit_on_error=False)
    async def _adopt(self, request: dict[str, Any]) -> None:
        app = view_of(self)
        self._set_busy(True)
        try:
            job = await app.backend.adopt(request)
        except BackendError as err:
            self._refused(str(err), err.field)
            return
        finally:
            self._set_busy(False)
        app.job_store.apply(job)
        if job["status"] == "running":
            self.dismiss(job)
            return
        message = job.get("message") or job["status"]
        self._refused_for_good = f"job {job['id']} {job['status']}: {message}"
        self.query_one("#adopt", Button).disabled = True
        self._refused(self._refused_for_good, None)
        self.app.notify(message, title=f"job {job['id']} {job['status']}", severity="error")

    def _refused(self, message: str, field: str | None) -> None:
        words = _FIELD_WORDS.get(field or "")
        if words is not None and message.startswith(f"{field}:"):
            message = words + message[len(str(field)) :]
        self._say(message)
        release_keys(self)  # (typed after ctrl+s: for the dialog, still open)
        input_id = _FIELD_INPUT.get(field or "")
        if input_id is not None:
            self.query_one(f"#{input_id}", Input).focus()

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.query_one("#adopt", Button).disabled = busy or bool(self._refused_for_good)
        if busy:
            self._say("adopting…")

    def action_cancel(self) -> None:
        """Close without adopting (not while the engine is answering: closed then, the
        process was adopted all the same and nothing said so); once something was typed,
        the first esc asks, as the job forms do (one esc dropped it: tester h61)."""
        if self._busy:
            return
        if not self._discard_armed and self._values() != self._as_opened:
            self._discard_armed = True
            self._quit_armed = False  # (in a row: h124)
            self._say("esc again throws away what you typed (ctrl+s adopts)")
            return
        self.dismiss(None)

    @on(Input.Changed)
    def _typed_on(self) -> None:
        self._discard_armed = False  # (the next esc asks again)
        self._quit_armed = False

    def may_quit(self) -> bool:
        """Whether ctrl+c may quit the app now: nothing typed, or ctrl+c twice in a row
        (it quit at once, what was typed lost: tester h120)."""
        if self._quit_armed or self._values() == self._as_opened:
            return True
        self._quit_armed = True
        self._discard_armed = False
        self._say("ctrl+c again quits, throwing away what you typed (ctrl+s adopts)")
        return False

    def action_enter_field(self) -> None:
        """Enter in a field (a priority key: see keymap): the next field; past the last,
        adopt. It adopted from the first: text meant for the pid line before it, typed
        with its enter as the dialog opened, adopted the process (tester h61)."""
        focused = self.focused
        if not isinstance(focused, Input):
            raise SkipAction()
        fields = list(self.query(Input))
        if focused is fields[-1]:
            self.action_adopt()
        else:
            self.set_focus(fields[fields.index(focused) + 1])  # (now: see keymap)

    @on(Input.Submitted)
    def _enter(self) -> None:
        self.action_adopt()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "adopt":
            self.action_adopt()
        else:
            self.action_cancel()
