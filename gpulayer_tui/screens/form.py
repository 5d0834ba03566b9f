"""What the job forms (new job, edit job) share: their look, a labelled field with its
error line, and the message at the top (the engine's refusal, or a summary)."""

from __future__ import annotations

from typing import TypeVar

from textual import events, on
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Label, Static

from ..key_hold import focus_first_field, release_keys

ResultType = TypeVar("ResultType")


def form_field(
    label: str, field: Input, hint: str | None = None, hint_id: str | None = None
) -> Widget:
    """A labelled input (and a hint after it) over its error line (``#ID-error``)."""
    field.compact = True
    # Validation is the form's (see SubmitScreen._problem); Input's own would clear
    # -invalid on blur.
    field.validate_on = set()
    row: list[Widget] = [Label(label, classes="field-label"), field]
    if hint is not None:
        row.append(Label(hint, classes="field-hint", id=hint_id))
    return Vertical(
        Horizontal(*row, classes="field-row"),
        Label("", classes="field-error", id=f"{field.id}-error"),
        classes="field",
        id=f"{field.id}-field",
    )


class FormScreen(ModalScreen[ResultType]):
    """A modal job form: fields made with :func:`form_field`, a ``#form-error`` box."""

    DEFAULT_CSS = """
    FormScreen #form-error {
        display: none;
        height: auto;
        color: $text-error;
        border-left: thick $error;
        padding: 0 1;
        margin-bottom: 1;
    }
    FormScreen #form-error.-shown { display: block; }
    FormScreen #form-error.-busy { color: $text-muted; border-left: thick $primary; }
    FormScreen .field { height: auto; }
    FormScreen .field-row { height: auto; margin-top: 1; }  /* a long hint wraps */
    FormScreen #command-field .field-row { margin-top: 0; }
    FormScreen .field-label { width: 14; color: $text-muted; }
    FormScreen .field-row Input {
        width: 1fr;
        background: $panel;
        padding: 0 1;
    }
    FormScreen .field-row Input:focus { background: $primary 30%; }
    FormScreen .field-row Input.-invalid { background: $error 30%; }
    FormScreen .field-row Input.-invalid:focus { background: $error 45%; }
    FormScreen .field-row Input.short { width: 12; }
    FormScreen .field-hint { width: 1fr; color: $text-muted; padding: 0 0 0 2; }
    FormScreen .field-error {
        display: none;
        width: 1fr;  /* (wrapped: a long error ran past the dialog's edge, cut) */
        height: auto;
        margin-left: 14;
        color: $text-error;
    }
    FormScreen .field-error.-shown { display: block; }
    FormScreen .option-row { height: 1; margin-left: 14; }
    /* Narrow (under NARROW columns): the hints go, the labels shrink. At 40 columns a
       hint was wrapped into a column two characters wide. */
    FormScreen.-narrow .field-hint { display: none; }
    FormScreen.-narrow .field-label { width: 10; }
    FormScreen.-narrow .field-error, FormScreen.-narrow .option-row { margin-left: 10; }
    """

    NARROW = 70
    """Below this many columns a form drops its hints."""

    DISCARD_WORDS = "esc again throws away what you typed (ctrl+s submits it)"
    """Said at the first esc once something was typed: a reflexive esc (it also leaves a
    search) lost a whole form (tester h46)."""

    QUIT_WORDS = "ctrl+c again quits, throwing away what you typed (ctrl+s submits it)"
    """Said at the first ctrl+c once something was typed: it quit the whole app at once,
    the form lost (a ctrl+c meant as copy: tester h120)."""

    _as_opened: tuple[tuple[str, str | bool], ...] | None = None
    _discard_armed = False
    _armed_with: tuple[tuple[str, str | bool], ...] | None = None
    _quit_armed = False

    def _values(self) -> tuple[tuple[str, str | bool], ...]:
        fields: list[tuple[str, str | bool]] = [(w.id or "", w.value) for w in self.query(Input)]
        fields += [(w.id or "", w.value) for w in self.query(Checkbox)]
        return tuple(fields)

    @on(events.Mount)
    def _remember_as_opened(self) -> None:
        # After every mount handler (the edit form fills its fields in its own), unless
        # focus_first took it first.
        self.call_after_refresh(self._take_first_opened)

    def _take_first_opened(self) -> None:
        if self._as_opened is None:
            self._take_opened()

    def _take_opened(self) -> None:
        self._as_opened = self._values()

    def focus_first(self, field: Input) -> None:
        """Focus the first field once the form is filled in (the end of its mount): what
        it holds now is what esc may drop without asking, and the keys typed since the
        form was asked for go in after that. Taken later, text typed right after ``n``
        counted as the form's own, and one esc dropped it unasked (tester h61)."""
        self._take_opened()
        focus_first_field(self, field)

    @on(Input.Changed)
    @on(Checkbox.Changed)
    def _disarm_discard(self) -> None:
        # Typed on: the next esc asks again. Only for a change since the first esc: the
        # Changed of a key typed before it may come after it (under load), and the
        # second esc only asked again, the next keys landing in the old form (h103).
        if self._values() != self._armed_with:
            self._discard_armed = False
            self._quit_armed = False

    def may_discard(self) -> bool:
        """Whether esc may close the form now: nothing changed since it opened, or esc
        came twice in a row (the first says so)."""
        if self._discard_armed or self._as_opened is None or self._values() == self._as_opened:
            return True
        self._discard_armed = True
        self._quit_armed = False  # (in a row: an esc between two ctrl+c quit unasked, h124)
        self._armed_with = self._values()
        self._show_form_message(self.DISCARD_WORDS, busy=True)
        self._scroll_to_form_message()
        return False

    def may_quit(self) -> bool:
        """Whether ctrl+c may quit the app now: nothing typed since the form opened, or
        ctrl+c came twice in a row (the first says so)."""
        if self._quit_armed or self._as_opened is None or self._values() == self._as_opened:
            return True
        self._quit_armed = True
        self._discard_armed = False
        self._armed_with = self._values()
        self._show_form_message(self.QUIT_WORDS, busy=True)
        self._scroll_to_form_message()
        return False

    def _scroll_to_form_message(self) -> None:
        """Bring the form's message (at the top of its fields) into sight: said while a
        field further down had the focus, the question was scrolled away at 80x24, the
        screen looked unchanged, and the next esc threw the form away (tester h142)."""
        box = self.query_one("#form-error", Static)
        self.call_after_refresh(box.scroll_visible, animate=False, top=True)

    FORM_CHROME = 8
    """Rows of a form's dialog that are not its fields: border and padding (4), the
    buttons (3) and the row above them."""

    def on_resize(self, event: events.Resize) -> None:
        """Drop the hints on a narrow terminal (they wrapped into slivers); give the
        fields what the dialog (at most 90% of the screen) leaves beside its buttons."""
        self.set_class(event.size.width < self.NARROW, "-narrow")
        room = max(3, event.size.height * 9 // 10 - self.FORM_CHROME)
        for fields in self.query(".form-fields"):
            fields.styles.max_height = room

    def _value(self, field_id: str) -> str:
        return self.query_one(f"#{field_id}", Input).value.strip()

    def _show_problem(self, field_id: str, problem: str) -> None:
        if problem:
            release_keys(self)  # (typed after ctrl+s: for the form, still open)
        field = self.query_one(f"#{field_id}", Input)
        field.set_class(bool(problem), "-invalid")
        label = self.query_one(f"#{field_id}-error", Label)
        label.update(Content(problem))  # (it quotes what was typed: text, not markup)
        label.set_class(bool(problem), "-shown")

    def in_form_words(self, message: str, field: str | None, input_id: str | None) -> str:
        """The engine's ``message`` with its spec field's name (``depends_on: ...``) as
        this form labels that field (``After jobs: ...``: tester h83)."""
        if not field or input_id is None or not message.startswith(f"{field}:"):
            return message
        labels = self.query(f"#{input_id}-field .field-label").results(Label)
        label = next((str(found.content).strip() for found in labels), "")
        return f"{label}{message[len(field) :]}" if label else message

    def show_refusal(self, message: str, field: str | None, input_id: str | None) -> None:
        """The engine's refusal, at the form's top and under the field it names (focused,
        so in sight: at 80x24 the top was scrolled away, and ctrl+s seemed to do nothing:
        tester h130); one that names no field of the form is scrolled into sight."""
        # (a form of one field, the scale dialog's, said it twice, at its top and under
        # the field just below: tester h185)
        alone = input_id is not None and len(self.query(Input)) == 1
        self._show_form_message("" if alone else self.in_form_words(message, field, input_id))
        if input_id is None:
            box = self.query_one("#form-error", Static)
            self.call_after_refresh(box.scroll_visible, animate=False, top=True)
            return
        if field and message.startswith(f"{field}:"):
            message = message[len(field) + 1 :].strip()
        self._show_problem(input_id, message)
        self.query_one(f"#{input_id}", Input).focus()
        # (in sight with its message: focused already, it was not scrolled to, and the
        # message above it pushed it below the fold: tester h132)
        row = self.query_one(f"#{input_id}-field")
        self.call_after_refresh(row.scroll_visible, animate=False)

    def _show_form_message(self, message: str, *, busy: bool = False) -> None:
        if message and not busy:
            release_keys(self)  # (typed after ctrl+s: for the form, still open)
        box = self.query_one("#form-error", Static)
        box.update(Content(message))  # (the engine's words quote names: text, not markup)
        box.set_class(bool(message), "-shown")
        box.set_class(busy, "-busy")

    @property
    def form_message(self) -> str:
        """The message at the top of the form (the engine's, or a summary)."""
        box = self.query_one("#form-error", Static)
        return str(box.content) if box.has_class("-shown") else ""
