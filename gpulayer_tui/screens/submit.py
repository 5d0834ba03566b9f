"""The submit form: the same spec and rules as ``gpulayer-tui submit``.

Each field is checked as you type by the wire contract's rules (:mod:`gpulayer_tui.wire`),
the same ones the engine's spec and the CLI apply, so the messages match; what only the
engine can judge (unknown domain, missing dependency, over capacity) comes back from it,
is shown at the top of the form, and marks the field the engine names.

Why this module is over ~400 lines: the form has fifteen fields in three groups (job,
service, placement), each with its widget, its check and its error line; the field
rules themselves live in :mod:`gpulayer_tui.wire`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any, ClassVar

from textual import on, work
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.suggester import Suggester
from textual.widgets import Button, Checkbox, Input, Label, Static

from .. import keymap, wire
from ..backend import BackendError
from ..fields import engine_sets_env, env_name_shown, typed_folder
from ..view import view_of
from ..widgets.check_box import CheckBox
from ..widgets.field_input import FieldInput, after_typed
from ..widgets.key_footer import KeyFooter
from ..widgets.one_line_input import OneLineInput
from ..wire import JobJSON
from .form import FormScreen, form_field

_FIELDS = (
    "command",
    "name",
    "project",
    "gpus",
    "vram",
    "domain",
    "after",
    "timeout",
    "priority",
    "cwd",
    "env",
    "replicas",
)
"""Input ids in form order (enter moves along them; enter on the last one submits)."""

_REFUSED_AT_ADMISSION = frozenset({"over_capacity", "dependency_failed"})
"""Termination reasons of a job the engine ended as it was submitted."""

_SPEC_FIELD = {
    "command": "command",
    "shell": "command",
    "name": "name",
    "gpus": "gpus",
    "vram_gb": "vram",
    "domain": "domain",
    "depends_on": "after",
    "timeout": "timeout",
    "priority": "priority",
    "project": "project",
    "cwd": "cwd",
    "env": "env",
    "replicas": "replicas",
}
"""Spec field (as named in the engine's messages) -> the input that sets it."""


def _folder_problem(text: str) -> str:
    """What is wrong with a job's folder as typed ("" when nothing): it must be there
    (the engine would fail the job at its start, maybe hours later)."""
    try:
        path = typed_folder(text)
    except ValueError as err:
        return str(err)
    if not os.path.exists(path):
        return f"no such folder: {path}"
    if not os.path.isdir(path):
        return f"not a folder: {path}"
    return ""


def _env_pairs(text: str) -> list[tuple[str, str]]:
    """``KEY=VALUE ...`` as typed, split as a shell would (a value may be quoted).

    Raises:
        ValueError: A quote is never closed, or a word is no ``KEY=VALUE``.
    """
    pairs = []
    try:
        words = shlex.split(text)
    except ValueError as err:  # (shlex's "No closing quotation" named nothing: h83)
        if "quotation" in str(err):
            raise ValueError(
                "a quote is never closed: KEY='a value' needs its closing quote"
            ) from None
        raise ValueError("it ends in a backslash: nothing follows it to escape") from None
    given: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {word!r}")
        if given.get(key, value) != value:
            # (the last was kept without a word, as --env is refused: tester h103)
            raise ValueError(f"{key} is given twice, with two values")
        given[key] = value
        pairs.append((key, value))
    return pairs


def _env_problem(text: str, *, port_service: bool) -> str:
    """What is wrong with the environment field ("" when nothing): as ``--env`` is
    checked (:func:`~gpulayer_tui.fields.engine_sets_env`)."""
    try:
        pairs = _env_pairs(text)
    except ValueError as err:
        return str(err)
    for key, _ in pairs:
        refused = engine_sets_env(
            key,
            port_service,
            "from the CLI, submit --no-port",
            "ask for GPUs in the GPUs field (and Domain for which ones)",
        )
        if refused:
            return f"{env_name_shown(key)}: {refused}"
    return ""


_REPLICAS_HINT = {
    False: "service copies, each with its own GPUs (tick 'service' first)",
    True: "service copies, each with its own GPUs (none: a CPU slot each)",
}
"""The replicas field's hint, by whether 'service' is ticked (it said "tick 'service'
first" once it was: tester h70). Each copy takes the GPUs field's count (a CPU service's
copies a CPU slot each: "each on its own GPU" misled, tester h89)."""


def split_list(text: str) -> list[str]:
    return [item for item in text.replace(",", " ").split() if item]


class ListSuggester(Suggester):
    """Completes the last item of a comma-separated list from known names."""

    def __init__(self, names: Callable[[], list[str]]) -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self._names = names

    async def get_suggestion(self, value: str) -> str | None:
        head, sep, last = value.rpartition(",")
        prefix = head + sep + (" " if sep and last.startswith(" ") else "")
        stem = last.strip()
        if not stem:
            return None
        for name in self._names():
            if name.startswith(stem) and name != stem:
                return prefix + name
        return None


class SubmitScreen(FormScreen[JobJSON | None]):
    """The new-job form: validated as you type, submitted to the engine in a worker.

    Dismisses with the accepted job, or None when cancelled. A job the engine accepted but
    failed at once (over capacity) keeps the form open with the engine's message.
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("submit"))
    KEYMAP_SCOPE: ClassVar[str] = "submit"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    def __init__(self) -> None:
        super().__init__()
        self._busy = False

    # -- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="submit-dialog"):
            # (the fields scroll; the buttons stay below them, in sight and last
            # in the tab order: docked over the fields, they hid the last ones and
            # took the focus between two: tester h87)
            with VerticalScroll(classes="form-fields", id="submit-fields"):
                yield Label("New job", classes="dialog-title")
                yield Static("", id="form-error")
                yield form_field(
                    "Command",
                    OneLineInput(placeholder="python train.py --epochs 10", id="command"),
                )
                with Horizontal(classes="option-row"):
                    yield CheckBox(
                        "run without a shell (split into argv)", id="no-shell", compact=True
                    )
                yield form_field(
                    "Name", FieldInput(placeholder="default: the program's name", id="name")
                )
                yield form_field(
                    "Project",
                    FieldInput(placeholder="-", id="project"),
                    "to group and filter by",
                )
                yield form_field(
                    "GPUs",
                    FieldInput(placeholder="auto", id="gpus", classes="short"),
                    "0 = CPU job · empty: 1 if VRAM or a GPU domain is set",
                )
                yield form_field(
                    "VRAM GiB",
                    FieldInput(placeholder="-", id="vram", classes="short"),
                    "needed on each GPU",
                )
                yield form_field(
                    "Domain",
                    FieldInput(
                        placeholder="any",
                        id="domain",
                        suggester=ListSuggester(self._domain_names),
                    ),
                    "",
                    hint_id="domain-hint",
                )
                yield form_field(
                    "Depends on",
                    FieldInput(placeholder="job ids, e.g. 12, 13", id="after"),
                )
                with Horizontal(classes="option-row"):
                    yield CheckBox(
                        "run even if they fail or are cancelled",
                        id="after-any",
                        compact=True,
                    )
                yield form_field(
                    "Timeout",
                    FieldInput(placeholder="none", id="timeout", classes="short"),
                    "of running (90m, 2h, 1h30m, or seconds), then SIGTERM",
                )
                yield form_field(
                    "Priority",
                    FieldInput(placeholder="0", id="priority", classes="short"),
                    "higher starts first",
                )
                yield form_field(
                    "Directory",
                    # (not the folder itself: the form's look would depend on where it ran)
                    FieldInput(placeholder="where this TUI started", id="cwd"),
                    "where it runs (~ and relative paths too)",
                )
                yield form_field(
                    "Environment",
                    FieldInput(placeholder="KEY=VALUE ...", id="env"),
                    "over this TUI's own ('quote' a value with spaces)",
                )
                with Horizontal(classes="option-row"):
                    yield CheckBox(
                        "service: keep it running (restarts, $PORT)",
                        id="service",
                        compact=True,
                    )
                yield form_field(
                    "Replicas",
                    # (Off until 'service' is ticked: its placeholder invited a 1 the form then
                    # refused, "replicas are for services".)
                    FieldInput(placeholder="1", id="replicas", classes="short", disabled=True),
                    _REPLICAS_HINT[False],
                    hint_id="replicas-hint",
                )
            with Horizontal(classes="buttons"):
                yield Button("Submit (ctrl+s)", id="submit", variant="primary")
                yield Button("Cancel (esc)", id="cancel")
        yield KeyFooter()  # the form's keys, visible however far the form scrolls

    def on_mount(self) -> None:
        blink = bool(getattr(self.app, "cursor_blink", True))
        for field in self.query(Input):
            field.cursor_blink = blink
        names = self._domain_names()
        if names:
            self.query_one("#domain-hint", Label).update(", ".join(names))
        self.focus_first(self.query_one("#command", Input))

    def _domain_names(self) -> list[str]:
        state = getattr(self.app, "gpu_state", None) or {}
        return [str(d["name"]) for d in state.get("domains", []) if d.get("name")]

    # -- validation -------------------------------------------------------------------------

    def _checked(self, checkbox_id: str) -> bool:
        return self.query_one(f"#{checkbox_id}", Checkbox).value

    def _problem(self, field_id: str) -> str:
        """What is wrong with one field ("" when nothing)."""
        text = self._value(field_id)
        try:
            if field_id == "command":
                if not text:
                    return "a command is needed"
                if self._checked("no-shell"):
                    try:
                        words = shlex.split(text)
                    except ValueError as err:
                        return f"cannot split into words: {err}"
                    wire.check_command(words)
                else:
                    wire.check_shell(text)
            elif not text:
                return ""
            elif field_id in ("name", "project"):
                wire.check_label(field_id, text)
            elif field_id == "cwd":
                # (a job that waits for others may run in a folder one of them makes)
                return "" if self._value("after") else _folder_problem(text)
            elif field_id == "env":
                return _env_problem(text, port_service=self._checked("service"))
            elif field_id == "vram":
                wire.parse_field("vram_gb", text)
                gpus = self._value("gpus")
                if gpus.isascii() and gpus.isdigit() and int(gpus) == 0:
                    return "VRAM is per GPU, but GPUs is 0 (a CPU job)"
            elif field_id == "domain":
                if not split_list(text):
                    return "name a domain, or leave it empty"
            elif field_id == "after":
                wire.parse_job_ids(text)
            elif field_id == "replicas":
                if not self._checked("service"):
                    return ""  # (off, and left out of the spec: never a refusal to fix)
                wire.parse_field("replicas", text)
            elif field_id in ("gpus", "timeout", "priority"):
                wire.parse_field(field_id, text)
        except wire.FieldError as err:
            return err.detail
        return ""

    def _check(self, field_id: str, *, empty_is_fine: bool = False) -> bool:
        problem = self._problem(field_id)
        if empty_is_fine and not self._value(field_id):
            problem = ""
        self._show_problem(field_id, problem)
        return not problem

    @on(OneLineInput.ManyLinesPasted)
    def _many_lines(self, event: OneLineInput.ManyLinesPasted) -> None:
        self._show_problem(
            "command",
            f"pasted {event.lines} lines: a command is one line (put them in a script, or "
            "join them with ';'); nothing was pasted",
        )

    @on(Input.Changed)
    def _typed(self, event: Input.Changed) -> None:
        field_id = event.input.id or ""
        if field_id not in _FIELDS:
            return
        # An empty command is only an error once the user tries to submit.
        self._check(field_id, empty_is_fine=field_id == "command")
        if field_id == "gpus":
            self._check("vram")
        if field_id == "after":
            self._check("cwd", empty_is_fine=True)
        self._show_form_message("")

    @on(Checkbox.Changed, "#no-shell")
    def _shell_toggled(self, event: Checkbox.Changed) -> None:
        self._check("command", empty_is_fine=True)

    @on(Checkbox.Changed, "#service")
    def _service_toggled(self, event: Checkbox.Changed) -> None:
        self.query_one("#replicas", Input).disabled = not event.value
        self.query_one("#replicas-hint", Label).update(_REPLICAS_HINT[event.value])
        self._check("replicas")
        self._check("env")  # (PORT is the engine's for a service)

    # -- the spec ---------------------------------------------------------------------------

    def build_spec(self) -> dict[str, Any]:
        """The spec the form describes, built like the CLI's ``submit`` builds it.

        Raises:
            wire.FieldError: A field does not parse (validate first).
        """
        spec: dict[str, Any] = {}
        command = self._value("command")
        if self._checked("no-shell"):
            spec["command"] = shlex.split(command)
        else:
            spec["shell"] = command
        if name := self._value("name"):
            spec["name"] = name
        if project := self._value("project"):
            spec["project"] = project
        if gpus := self._value("gpus"):
            spec["gpus"] = wire.parse_field("gpus", gpus)
        if vram := self._value("vram"):
            spec["vram_gb"] = wire.parse_field("vram_gb", vram)
        domains = split_list(self._value("domain"))
        if domains:
            spec["domain"] = domains[0] if len(domains) == 1 else domains
        ids = wire.parse_job_ids(self._value("after"))
        if ids:
            any_exit = self._checked("after-any")
            spec["depends_on"] = [{"job": i, "any_exit": True} for i in ids] if any_exit else ids
        if timeout := self._value("timeout"):
            spec["timeout"] = wire.parse_field("timeout", timeout)
        if priority := self._value("priority"):  # ("0" too: asked for, not the default)
            spec["priority"] = wire.parse_field("priority", priority)
        if self._checked("service"):
            spec["kind"] = "service"
            if replicas := self._value("replicas"):
                spec["replicas"] = wire.parse_field("replicas", replicas)
        folder = self._value("cwd")
        spec["cwd"] = typed_folder(folder) if folder else os.getcwd()
        env = dict(os.environ)
        env.update(_env_pairs(self._value("env")))
        if env:
            spec["env"] = env
        return spec

    # -- submitting -------------------------------------------------------------------------

    def action_submit(self) -> None:
        """Validate every field, then send the job to the engine (once the keys typed
        before are in their fields: see :func:`after_typed`)."""
        after_typed(self, self._submit_now)

    def _submit_now(self) -> None:
        if self._busy:
            return
        bad = [f for f in _FIELDS if not self._check(f)]
        if bad:
            # (the message first: shown after the scroll was worked out, its line pushed
            # the field's error line back under the buttons, under CI's load)
            self._show_form_message("fix the fields marked in red")
            self.query_one(f"#{bad[0]}", Input).focus(scroll_visible=False)
            # (the field with its error line, in sight: the message at the top said "fix
            # the fields marked in red" of one scrolled off below: tester h73)
            self.call_after_refresh(
                self.query_one(f"#{bad[0]}-field").scroll_visible, animate=False
            )
            return
        self._submit(self.build_spec())

    @work(exclusive=True, group="submit", exit_on_error=False)
    async def _submit(self, spec: dict[str, Any]) -> None:
        app = view_of(self)
        self._set_busy(True)
        try:
            job = await app.backend.submit(spec)
        except BackendError as err:
            self._engine_refused(str(err), err.field)
            return
        finally:
            self._set_busy(False)
        app.job_submitted(job)  # (in the table before the keys after ctrl+s go on)
        job_id, status = job["id"], job.get("status", "")
        reason = job.get("termination_reason")
        if reason not in _REFUSED_AT_ADMISSION:
            # Queued or running; or a quick command that already ended on its own.
            self.app.notify(f"job {job_id} {status}")
            self.dismiss(job)
            return
        # Accepted, but the engine ended it at admission (it can never fit, or a
        # dependency already failed): the job is in the table; keep the form so the
        # request can be fixed.
        message = job.get("message") or status
        self._take_opened()  # (what it shows made a job: esc loses nothing)
        said = str(reason).replace("_", " ")  # ("over_capacity" was the wire's word: h124)
        self._show_form_message(f"job {job_id} {status} ({said}): {message}")
        # (a form scrolled down to its last field showed the message's last line only,
        # the form's title above the view: tester h124)
        box = self.query_one("#form-error", Static)
        self.call_after_refresh(box.scroll_visible, animate=False, top=True)
        self.app.notify(message, title=f"job {job_id} {status}", severity="error")

    def _engine_refused(self, message: str, field: str | None) -> None:
        self.show_refusal(message, field, _SPEC_FIELD.get(field or ""))

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.query_one("#submit", Button).disabled = busy
        if busy:
            self._show_form_message("submitting…", busy=True)
        else:
            self.query_one("#form-error").remove_class("-busy")

    # -- keys -------------------------------------------------------------------------------

    def action_enter_field(self) -> None:
        """Enter in a field (a priority key: see keymap): the next field, or submit."""
        focused = self.focused
        if not isinstance(focused, Input) or (focused.id or "") not in _FIELDS:
            raise SkipAction()
        self._after_field(focused.id or "")

    @on(Input.Submitted)
    def _enter(self, event: Input.Submitted) -> None:
        field_id = event.input.id or ""
        if field_id not in _FIELDS:
            return
        event.stop()
        self._after_field(field_id)

    def _after_field(self, field_id: str) -> None:
        # The next field, not the next widget: enter must not land on a checkbox (where
        # the next enter would toggle it); nor on one that is off (replicas, for a batch
        # job: enter stayed put). Past the last, it submits.
        later = [self.query_one(f"#{f}", Input) for f in _FIELDS[_FIELDS.index(field_id) + 1 :]]
        following = next((field for field in later if not field.disabled), None)
        if following is None:
            self.action_submit()
        else:
            self.set_focus(following)  # (at once: Widget.focus waits behind queued keys)

    @on(Button.Pressed, "#submit")
    def _submit_pressed(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel(confirmed=True)  # (a click on Cancel is no reflex)

    def action_cancel(self, confirmed: bool = False) -> None:
        """Close the form without submitting (not while a submission waits for the
        engine's answer: closed then, the job was made all the same and nothing said so,
        and a retry made it twice). With something typed, esc asks to be pressed again."""
        if self._busy:
            self._show_form_message(
                "submitting…: the engine has the request; wait for its answer "
                "(it says whether the job was made)",
                busy=True,
            )
            return
        if confirmed or self.may_discard():
            self.dismiss(None)
