"""The edit form: change a waiting job's priority, GPUs, VRAM, timeout and the jobs it
waits for (``PATCH /v1/jobs/ID``, as ``gpulayer-tui edit`` does); a running service's
form has its replicas alone (it is scaled).

Fields start from the job's spec and are checked as you type by the wire contract's rules;
only the fields that differ are sent. What only the engine can judge (a change it could
never run with, a job that started meanwhile) comes back from it and is shown at the top
of the form, which stays open.
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Button, Input, Label, Static

from .. import keymap, wire
from ..backend import BackendError
from ..fields import EDIT_WORDS, duration_typed, edit_value, wanted_gpus
from ..formatting import dependencies_text
from ..view import view_of
from ..widgets.field_input import FieldInput, after_typed
from ..widgets.key_footer import KeyFooter
from ..wire import JobJSON
from .form import FormScreen, form_field

EDITED = (
    ("priority", "priority", "Priority", "higher starts first"),
    ("gpus", "gpus", "GPUs", "0 = CPU job · empty: 1 if VRAM or a GPU domain is set"),
    ("vram", "vram_gb", "VRAM GiB", "needed on each GPU · empty: none declared"),
    (
        "timeout",
        "timeout",
        "Timeout",
        "of running (90m, 2h, 1h30m, or seconds), then SIGTERM · empty: none",
    ),
    # (the hint read as if every id waited for any outcome: tester h61)
    ("after", "depends_on", "After jobs", "ids · 13 any: after 13 ends any way · empty: none"),
    # (the CLI's edit had them, the form not: tester h70)
    ("name", "name", "Name", "empty: the program's name"),
    ("project", "project", "Project", "empty: none"),
)
"""The form's inputs: input id, spec field, label and hint, in form order."""

REPLICAS_FIELD = ("replicas", "replicas", "Replicas", "a waiting service's copies")
"""The last input of a service's form."""

SCALED_FIELD = (
    "replicas",
    "replicas",
    "Replicas",
    "more start now on what is free · fewer: the highest-numbered stop",
)
"""The one input of a running service's form (it is scaled)."""

_INPUT_OF = {spec_field: input_id for input_id, spec_field, _, _ in (*EDITED, REPLICAS_FIELD)}


ANY_OUTCOME = "(any end)"
"""How the form writes a dependency whose any end will do (the timeline's and the CLI's
words; "(any outcome)" is still read: tester h87 found both)."""
_ANY_SUFFIXES = (ANY_OUTCOME, "(any outcome)", " any")


def parse_dependencies(text: str) -> list[tuple[int, bool]]:
    """``12, 13 (any end)`` (as :func:`~gpulayer_tui.formatting.dependencies_text`
    writes it; ``13 any`` too) as ``[(12, False), (13, True)]``.

    Raises:
        wire.FieldError: A part is not a job id.
    """
    deps: list[tuple[int, bool]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        any_exit = part.endswith(_ANY_SUFFIXES)
        number = part
        for suffix in _ANY_SUFFIXES:
            number = number.removesuffix(suffix)
        number = number.strip()
        if not (number.isascii() and number.isdigit()) or not 0 < int(number) < 2**63:
            raise wire.FieldError("depends_on", f"{part!r} is not a job id: ids, e.g. 12, 13 any")
        deps.append((int(number), any_exit))
    return deps


def _spec_dependencies(spec: dict[str, Any]) -> list[tuple[int, bool]]:
    deps = spec.get("depends_on")
    out = []
    for dep in deps if isinstance(deps, list) else []:
        if isinstance(dep, dict):
            out.append((int(dep.get("job") or 0), bool(dep.get("any_exit"))))
        else:
            out.append((int(dep), False))
    return out


def _shown(value: Any) -> str:
    """A spec value as its input shows it (``""`` for none)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class EditScreen(FormScreen[JobJSON | None]):
    """Edit a waiting job; dismisses with the job as the engine stored it, or ``None``.

    Args:
        job: The whole job (its spec: a table's row carries only part of it).
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("edit"))
    KEYMAP_SCOPE: ClassVar[str] = "edit"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""
    DISCARD_WORDS = "esc again throws away your changes (ctrl+s saves them)"
    QUIT_WORDS = "ctrl+c again quits, throwing away your changes (ctrl+s saves them)"

    def __init__(self, job: JobJSON) -> None:
        super().__init__()
        self.job = job
        self._busy = False
        service = job.get("kind") == "service"
        self.scaling = service and job.get("status") == "running"
        """A running service's form: its replicas alone (``PATCH`` scales it)."""
        if self.scaling:
            self.fields: tuple[tuple[str, str, str, str], ...] = (SCALED_FIELD,)
        else:
            self.fields = (*EDITED, REPLICAS_FIELD) if service else EDITED
        """Its inputs (:data:`EDITED`, and a service's replicas)."""

    @property
    def spec(self) -> dict[str, Any]:
        """The job's spec as it was when the form opened."""
        return dict(self.job.get("spec") or {})

    def compose(self) -> ComposeResult:
        spec = self.spec
        with Vertical(classes="dialog", id="edit-dialog"):
            # (the fields scroll; the buttons stay below them, in sight and last
            # in the tab order: docked over the fields, they hid the last ones and
            # took the focus between two: tester h87)
            with VerticalScroll(classes="form-fields", id="edit-fields"):
                # (Content: the name is the user's text, never markup)
                verb = "Scale" if self.scaling else "Edit"
                yield Label(
                    Content(f"{verb} job {self.job['id']} · {self.job.get('name', '')}"),
                    classes="dialog-title",
                )
                yield Static("", id="form-error")
                for input_id, spec_field, label, hint in self.fields:
                    value = spec.get(spec_field)
                    if spec_field == "priority":
                        value = self.job.get("priority", value)
                    if spec_field == "depends_on":
                        shown = dependencies_text(spec)
                    elif spec_field == "timeout" and value is not None:
                        shown = duration_typed(float(value))
                    else:
                        shown = _shown(value)
                    placeholder = {
                        "name": str(self.job.get("name") or ""),
                        "replicas": "1",
                        # (what it asks for: "none" beside "x1" in the table, a job that
                        # asks for one GPU by its VRAM; tester h103)
                        "gpus": str(wanted_gpus(spec)),
                    }
                    yield form_field(
                        label,
                        FieldInput(
                            value=shown,
                            placeholder=placeholder.get(spec_field) or "none",
                            id=input_id,
                            classes=""
                            if spec_field in ("depends_on", "name", "project")
                            else "short",
                        ),
                        hint,
                    )
            with Horizontal(classes="buttons"):
                yield Button("Save (ctrl+s)", id="save", variant="primary")
                yield Button("Cancel (esc)", id="cancel")
        yield KeyFooter()  # the form's keys

    def on_mount(self) -> None:
        blink = bool(getattr(self.app, "cursor_blink", True))
        for field in self.query(Input):
            field.cursor_blink = blink
        self._focus_first_field(20)

    def _focus_first_field(self, tries: int) -> None:
        """Focus the first field once it is mounted (under load, CI's coverage pass once
        ran this before it was, and raised NoMatches)."""
        for field in self.query(f"#{self.fields[0][0]}").results(Input):
            self.focus_first(field)
            return
        if tries > 0:
            self.call_after_refresh(self._focus_first_field, tries - 1)

    # -- validation -------------------------------------------------------------------------

    def _parsed(self, input_id: str, spec_field: str) -> Any:
        """The field's value as the spec takes it (``None`` when empty).

        Raises:
            wire.FieldError: It does not parse.
        """
        text = self._value(input_id)
        if spec_field == "depends_on":
            return parse_dependencies(text)
        if not text and spec_field == "replicas":
            raise wire.FieldError(spec_field, "a service has 1 replica or more")
        if not text:
            return 0 if spec_field == "priority" else None
        value = wire.parse_field(spec_field, text)
        if spec_field == "vram_gb" and self._value("gpus") == "0":
            raise wire.FieldError(spec_field, "VRAM is per GPU, but GPUs is 0 (a CPU job)")
        return value

    def _check(self, input_id: str, spec_field: str) -> bool:
        try:
            self._parsed(input_id, spec_field)
        except wire.FieldError as err:
            self._show_problem(input_id, err.detail)
            return False
        self._show_problem(input_id, "")
        return True

    @on(Input.Changed)
    def _typed(self, event: Input.Changed) -> None:
        for input_id, spec_field, _, _ in self.fields:
            if input_id == event.input.id or (input_id == "vram" and event.input.id == "gpus"):
                self._check(input_id, spec_field)
        self._show_form_message("")

    def changes(self) -> dict[str, Any]:
        """The fields whose value differs from the job's (validate first).

        Raises:
            wire.FieldError: A field does not parse.
        """
        spec = self.spec
        out: dict[str, Any] = {}
        for input_id, spec_field, _, _ in self.fields:
            value = self._parsed(input_id, spec_field)
            before = spec.get(spec_field)
            if spec_field == "priority":
                before = self.job.get("priority", before) or 0
            if spec_field == "depends_on":
                # (the same jobs in another order, or one twice, is no change: the engine
                # records none, and the toast said "edited")
                if set(value) != set(_spec_dependencies(spec)):
                    out[spec_field] = [
                        {"job": job, "any_exit": True} if any_exit else job
                        for job, any_exit in value
                    ]
                continue
            if value != before:
                out[spec_field] = value
        return out

    # -- saving -----------------------------------------------------------------------------

    def action_save(self) -> None:
        """Validate every field, then send the changes to the engine (once the keys typed
        before are in their fields: see :func:`after_typed`)."""
        after_typed(self, self._save_now)

    def _save_now(self) -> None:
        if self._busy:
            return
        bad = [i for i, f, _, _ in self.fields if not self._check(i, f)]
        if bad:
            self.query_one(f"#{bad[0]}", Input).focus()
            self._show_form_message("fix the fields marked in red")
            return
        changes = self.changes()
        if not changes:
            self._show_form_message("nothing changed")
            self._take_opened()  # (what it shows is the job: esc loses nothing)
            return
        self._save(changes)

    @work(exclusive=True, group="edit", exit_on_error=False)
    async def _save(self, changes: dict[str, Any]) -> None:
        app = view_of(self)
        job_id = int(self.job["id"])
        self._busy = True
        self.query_one("#save", Button).disabled = True
        self._show_form_message("saving…", busy=True)
        try:
            edited = await app.backend.edit(job_id, changes)
        except BackendError as err:
            self.show_refusal(str(err), err.field, _INPUT_OF.get(err.field or ""))
            return
        finally:
            self._busy = False
            self.query_one("#save", Button).disabled = False
        app.job_store.apply(edited)
        verb = "scaled" if self.scaling else "edited"
        self.app.notify(f"job {job_id} {verb}: {self._what_changed(changes, edited)}")
        self.dismiss(edited)

    def _what_changed(self, changes: dict[str, Any], edited: JobJSON) -> str:
        """What the edit changed, as its timeline and the CLI say it, then where the job
        stands (the toast said only "edited: the queue is paused ...": tester h93)."""
        old, new = self.job.get("spec") or {}, edited.get("spec") or {}
        said = ", ".join(
            f"{EDIT_WORDS.get(key, key)} {edit_value(key, old.get(key), self.job['name'], old)}"
            f" -> {edit_value(key, new.get(key), edited['name'], new)}"
            for key in changes
            if old.get(key) != new.get(key)
        )
        standing = f"{edited['status']}: {edited.get('message')}" if edited.get("message") else ""
        return "; ".join(part for part in (said, standing) if part) or str(edited["status"])

    # -- keys -------------------------------------------------------------------------------

    def action_enter_field(self) -> None:
        """Enter in a field (a priority key: see keymap): the next field, or save."""
        focused = self.focused
        if not isinstance(focused, Input):
            raise SkipAction()
        self._after_field(focused.id or "")

    @on(Input.Submitted)
    def _enter(self, event: Input.Submitted) -> None:
        event.stop()
        self._after_field(event.input.id or "")

    def _after_field(self, field_id: str) -> None:
        ids = [i for i, _, _, _ in self.fields]
        here = ids.index(field_id) if field_id in ids else 0
        if here == len(ids) - 1:
            self.action_save()
        else:
            # (at once: Widget.focus waits behind the keys already queued)
            self.set_focus(self.query_one(f"#{ids[here + 1]}", Input))

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel(confirmed=True)  # (a click on Cancel is no reflex)

    def action_cancel(self, confirmed: bool = False) -> None:
        """Close the form without saving (with a change made, esc asks to be pressed
        again); not while the engine has the edit: closed then, "esc again throws away
        your changes" was said of changes it applied (tester h50)."""
        if self._busy:
            self._show_form_message(
                "saving…: the engine has the edit; wait for its answer (it says whether the "
                "job was changed)",
                busy=True,
            )
            return
        if confirmed or self.may_discard():
            self.dismiss(None)
