"""Field rules: what a value of each spec field may be (ranges, characters), one function
per field, raising :class:`FieldError` (which names the field); and the status sets.

Part of the wire contract (:mod:`gpulayer_tui.wire` re-exports every name here): the
engine's spec model, argparse and the TUI's forms apply the same rules with the same
words. Kept apart from the contract's enums so that the CLI's quick path (see
``cli/quick.py``) can check a value without importing :mod:`enum` (~4 ms of a CLI call).
Stdlib only, no imports at all.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from typing import Any

# Plain strings, so a reader of JSON can test ``job["status"] in ACTIVE_STATUSES`` directly
# (a StrEnum member equals its value, so ``JobStatus.RUNNING in ACTIVE_STATUSES`` holds too).
ACTIVE_STATUSES: frozenset[str] = frozenset({"pending", "queued", "running"})
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "orphaned"})
NOT_COMPLETED_STATUSES: frozenset[str] = TERMINAL_STATUSES - {"completed"}

# Why an adopted job cannot run again (restart, submit --like): said alike everywhere.
ADOPTED_NOT_RUN = "is an adopted process: gpulayer-tui did not start it and never runs its command"

MAX_INT = 2**63 - 1  # SQLite's INTEGER: a larger id names nothing
CPU_POOL = "cpu"  # the one domain of CPU jobs (and CPU service replicas): its slots
PID_MAX = 4_194_304  # PID_MAX_LIMIT: no Linux pid is larger
MAX_SECONDS = 10 * 365 * 86400.0
NAME_MAX = 200


class FieldError(ValueError):
    """A value breaks a field's rule; ``field`` names the field, ``detail`` the problem."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_typed(value: object) -> str:
    """A value as JSON writes it (what was sent): ``true``, not Python's ``True``."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


def _whole(field: str, value: object, low: int, high: int, what: str = "") -> int:
    if not _is_int(value):
        raise FieldError(field, f"must be a whole number, not {_as_typed(value)}"[:200])
    assert isinstance(value, int)
    if not low <= value <= high:
        raise FieldError(field, what or f"must be from {low} to {high}, not {value}")
    return value


def _number(field: str, value: object, high: float, unit: str = "") -> float:
    if not _is_number(value):
        raise FieldError(field, f"must be a number, not {_as_typed(value)}"[:200])
    number = float(value)  # type: ignore[arg-type]
    if number != number or number in (float("inf"), float("-inf")):
        raise FieldError(field, f"must be a finite number, not {number}")
    if not 0 < number:
        raise FieldError(field, f"must be greater than 0, got {number:g}")
    if not number <= high:
        # (not :g: "at most 3.1536e+08 s, got 3.1536e+08" of 315360001; a whole number
        # of up to 15 digits is shown whole, a larger one as 1e+308, not 309 digits)
        shown = int(number) if number.is_integer() and number < 1e15 else repr(number)
        raise FieldError(field, f"must be at most {high:.0f}{unit}, got {shown}"[:200])
    return number


_JOINERS = "\u200c\u200d"  # format characters that emoji and some scripts need: kept


VARIATION_SELECTORS = "\ufe0e\ufe0f"
"""Text and emoji presentation selectors: refused in names (see
:func:`no_presentation_selectors`)."""
SKIN_TONES = "".join(chr(c) for c in range(0x1F3FB, 0x1F400))
"""Emoji skin-tone modifiers: tmux 3.3 draws 👍🏽 four columns wide where Rich counts two
(tester h197); refused in names too."""


def unsafe_characters(text: str) -> list[str]:
    """The characters of ``text`` a terminal could act on or that change how the rest
    reads: controls (C0, DEL, C1: escapes start there), format characters (bidi overrides
    and isolates, zero-width spaces, BOM; the two joiners apart), line and paragraph
    separators, lone surrogates, unassigned code points (noncharacters too: a terminal
    may give them a column the layout did not count). Empty for most text
    (``isprintable()`` answers first)."""
    if text.isprintable():
        return []
    import unicodedata  # (only for text that needs it: a CLI call never loads it)

    return [
        c
        for c in text
        if (category := unicodedata.category(c)) in ("Cc", "Zl", "Zp", "Cs", "Cn")
        or (category == "Cf" and c not in _JOINERS)
    ]


def program_name(program: str) -> str:
    """A program as named for a default job name or a narrow column: the last part of a
    path (``/opt/conda/bin/python3`` -> ``python3``), else the word whole. A process
    renamed with ``exec -a '[red]stray[/]'`` was named ``]``: only a word that is a path
    (from ``/``, ``./``, ``../`` or ``~/``) loses its directory (tester h54)."""
    if program.startswith(("/", "./", "../", "~/")):
        return program.rsplit("/", 1)[-1] or program
    return program


def default_job_name(program: str, fallback: str) -> str:
    """The name a job gets from its program (an adopted process's argv[0], whole: one
    under "/tmp/my proj/" was named "my"): :func:`program_name`, less the characters a
    name may not hold (an escape in a renamed process's argv0 was kept as the text
    "\\x1b", which then read like an escaped real one: tester h163), cut to
    :data:`NAME_MAX`; ``fallback`` when nothing of it is left to show."""
    name = program_name(program)
    if "\x1b" in name or "\x9b" in name or "\x9d" in name:
        import re  # (not on the CLI's path: only an escape in a program's name asks)

        # A terminal sequence goes whole: its ESC alone dropped left "]0;pwned[31mred"
        # of an argv0 that set a title and a colour (tester h166).
        name = re.sub(
            r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI ... final
            r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC ... BEL/ST
            r"|\x1b[ -/]*[0-~]?",  # other escapes
            "",
            name,
        )
    unsafe = set(unsafe_characters(name)).union(VARIATION_SELECTORS, SKIN_TONES)
    name = "".join(c for c in name if c not in unsafe).strip()[:NAME_MAX].strip()
    try:
        blank_label("name", name)
    except FieldError:
        return fallback
    return name


def duration_typed(seconds: float) -> str:
    """Seconds as a person types them, in the units the field takes (``600`` -> ``10m``,
    ``5400`` -> ``1h30m``; a fraction of a second as seconds): the form showed ``600``
    for the ``10m`` typed (tester h91)."""
    if seconds <= 0 or seconds != seconds or seconds == float("inf"):
        return f"{seconds:g}"
    rest, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    # (a fraction with the seconds: "5400.4" was said with no unit at all: tester h117)
    left = round(rest + (seconds - int(seconds)), 6)
    if left:
        parts.append(f"{left:g}s")
    return "".join(parts) or f"{seconds:g}"


EDIT_WORDS = {"depends_on": "after"}
"""A spec field as an edit line names it, where its key is not a person's word."""


def wanted_gpus(spec: dict[str, Any]) -> Any:
    """The GPUs a spec asks for (per replica), as the engine resolves a count left out: a
    GPU pin or a VRAM figure asks for one GPU (the cell was empty for such a job, though
    it waits for a GPU)."""
    wanted = spec.get("gpus")
    if wanted is None:
        pins = spec.get("domain")
        pins = [pins] if isinstance(pins, str) else list(pins or ())
        wanted = 1 if any(p != CPU_POOL for p in pins) or spec.get("vram_gb") is not None else 0
    return wanted


def edit_value(key: str, value: object, shown_name: str, spec: dict[str, Any] | None = None) -> str:
    """A field's value as a timeline's edit line says it: dependencies as ``3, 4 (any
    end)`` (Python's ``[{'job': 4, 'any_exit': True}]`` was shown), none as ``none``, a
    name left out as the name shown for it, ``shown_name`` (the program's: a
    default-named job's rename read "name none -> x"); a GPU count left out as the one
    ``spec`` (the stored spec with that value) asks for ("gpus 0 -> 2" of a job that asked
    for one by its VRAM: tester h103)."""
    if key == "name" and value is None:
        return shown_name
    if key == "gpus" and value is None and spec is not None:
        return str(wanted_gpus({**spec, "gpus": None}))
    if key == "depends_on" and isinstance(value, list):
        shown = [
            f"{d.get('job')}{' (any end)' if d.get('any_exit') else ''}"
            if isinstance(d, dict)
            else str(d)
            for d in value
        ]
        return ", ".join(shown) or "none"
    if value is None and key in ("gpus", "priority"):
        return "0"  # (what leaving it out means: "gpus none -> 1" read as unset)
    if value is None and key == "replicas":
        return "1"
    if key == "timeout" and isinstance(value, int | float):
        return duration_typed(value)  # (as typed: "none -> 5400" for 90m: tester h94)
    if isinstance(value, float):
        return f"{value:g}"  # (as given: "vram_gb none -> 10", not 10.0)
    return "none" if value is None else str(value)


def printable(text: str, keep: str = "") -> str:
    """``text`` with each of its :func:`unsafe_characters` but those in ``keep`` written as
    ``\\xNN``/``\\uNNNN``: safe to put on a terminal, and still says what was there."""
    unsafe = set(unsafe_characters(text)).difference(keep)
    if not unsafe:
        return text
    return "".join(c if c not in unsafe else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 256:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): that byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def cut_to_length(text: str, length: int) -> str:
    """``text`` cut to at most ``length`` characters, ending with "…" where it was cut
    (the engine's cut for its log and messages, which no table lines up)."""
    return text if len(text) <= length else text[: max(1, length - 1)] + "…"


BLANK_FILLERS = "\u115f\u1160\u3164\uffa0\u034f\u2800"
"""Characters that print as nothing though they are not spaces (the Hangul fillers, the
combining grapheme joiner, the blank Braille pattern): a name of only these looked empty."""


def _joining_marks(value: str) -> list[str]:
    """The characters of ``value`` that join the one before them: combining marks
    (spacing ones too), joiners and other format characters."""
    if value.isascii():
        return []
    import unicodedata  # (only for text that needs it)

    # "\u0301\u0301" and "\u200d" alone made names shown empty in every list (they join
    # the column's space: tester h163); a lone spacing mark (U+0903) was drawn one column
    # wider than counted (tester h166).
    joining = ("Mn", "Me", "Mc", "Cf")
    return [c for c in value if c in _JOINERS or unicodedata.category(c) in joining]


def shows_nothing(value: str, marks: list[str] | None = None) -> bool:
    """True for text of only spaces, :data:`BLANK_FILLERS` and marks that join what is
    before them: nothing of it is seen."""
    if marks is None:
        marks = _joining_marks(value)
    return all(c.isspace() or c in BLANK_FILLERS or c in marks for c in value)


def blank_label(field: str, value: str) -> None:
    """Refuse a name or project that shows nothing (only spaces and
    :data:`BLANK_FILLERS`) or starts or ends with a space (checked where a label is given,
    not in the spec's rule: jobs stored before load).

    Raises:
        FieldError: It shows nothing, or starts with a mark that joins what is before it.
    """
    marks = _joining_marks(value)
    if shows_nothing(value, marks):
        raise FieldError(
            field,
            "needs a visible character (it is only spaces, blank filler characters or "
            "combining marks)",
        )
    if marks and value[0] in marks:
        raise FieldError(
            field,
            f"starts with U+{ord(value[0]):04X}, a mark that joins the character before it "
            "(in a list, the column's space): start it with a visible character",
        )
    if value != value.strip():
        # ("e1 " and "e1" read alike in every list, and renaming one to the other was
        # said "name e1 -> e1": tester h117)
        raise FieldError(field, f"starts or ends with a space: {value!r}")
    no_presentation_selectors(field, value)


DRAIN_REASON_MAX = 500
"""The longest reason a drain is given (the API's, the CLI's and the TUI's)."""


def check_label(field: str, value: object, limit: int = NAME_MAX) -> str:
    """A name or project (or a short text, as a drain's reason): 1 to ``limit``
    characters, none of them unsafe on a terminal (see :func:`unsafe_characters`)."""
    if not isinstance(value, str) or not value:
        raise FieldError(field, f"must be text of 1 to {limit} characters")
    if len(value) > limit:
        raise FieldError(field, f"must be at most {limit} characters, not {len(value)}")
    unsafe = unsafe_characters(value)
    if unsafe:
        if any(c < " " or "\x7f" <= c <= "\x9f" for c in unsafe):
            raise FieldError(field, "control characters are not allowed")
        lone = [c for c in unsafe if "\ud800" <= c <= "\udfff"]
        if lone:  # (said to be "invisible formatting characters")
            raise FieldError(field, f"an unpaired surrogate is not text: U+{ord(lone[0]):04X}")
        shown = ", ".join(dict.fromkeys(f"U+{ord(c):04X}" for c in unsafe))
        import unicodedata

        if all(unicodedata.category(c) == "Cn" for c in unsafe):
            # (U+D7FF was said to be a formatting character: tester h92)
            raise FieldError(
                field, f"unassigned code points (no character yet) are not allowed: {shown}"
            )
        raise FieldError(
            field,
            "invisible formatting characters (bidi overrides, separators) or unassigned "
            f"code points are not allowed: {shown}",
        )
    return value


def no_presentation_selectors(field: str, value: str) -> None:
    """Refuse a label with a presentation selector (U+FE0E, U+FE0F) or a skin-tone
    modifier (U+1F3FB-U+1F3FF), where a label is given (jobs stored before load). A ❤️
    drawn one column wide by tmux 3.3 and two by other terminals and Rich moved the
    borders of every panel and table the name was in (tester h190).

    Raises:
        FieldError: Naming the selectors.
    """
    found = [c for c in value if c in VARIATION_SELECTORS or c in SKIN_TONES]
    if found:
        shown = ", ".join(dict.fromkeys(f"U+{ord(c):04X}" for c in found))
        kind = (
            "emoji presentation selectors"
            if all(c in VARIATION_SELECTORS for c in found)
            else "emoji skin-tone modifiers and presentation selectors"
            if any(c in VARIATION_SELECTORS for c in found)
            else "emoji skin-tone modifiers"
        )
        kept = "".join(c for c in value if c not in found)
        raise FieldError(
            field,
            f"{kind} are not allowed ({shown}): terminals draw the character before one at "
            "different widths (one, two or four columns), and the tables around it shift; "
            f"leave them out ({kept!r} shows as meant)",
        )


def check_command(value: object) -> list[str]:
    """An argv: 1 to 4,096 words, the first (the program) not empty, no NUL bytes."""
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise FieldError("command", "must be a list of words")
    if not value:
        raise FieldError("command", "a command is needed")
    if len(value) > 4096:
        raise FieldError("command", f"at most 4096 words, not {len(value)}")
    if not value[0].strip():  # ("   " passed, then failed at launch)
        raise FieldError("command", "the program name (first word) is empty")
    if any("\0" in word for word in value):
        raise FieldError("command", "contains a NUL byte")
    return value


def check_shell(value: object) -> str:
    """A shell line: 1 to 65,536 characters, no NUL bytes."""
    if not isinstance(value, str) or not value:
        raise FieldError("shell", "a command is needed")
    if not value.strip():  # (`sh -c '   '` runs nothing, and "completes")
        raise FieldError("shell", "a command is needed (the line is only blanks)")
    if all(not line.strip() or line.lstrip().startswith("#") for line in value.splitlines()):
        # (As the blank line: `sh -c '# x'` runs nothing, and "completes".)
        raise FieldError("shell", "a command is needed (the line is only a comment)")
    if len(value) > 65536:
        raise FieldError("shell", f"at most 65536 characters, not {len(value)}")
    if "\0" in value:
        raise FieldError("shell", "contains a NUL byte")
    if _unclosed_quote(value):
        # (`submit --file` took `echo "oops` and the job failed when it ran, exit 2)
        raise FieldError(
            "shell", "a quote is not closed: sh would refuse it (Unterminated quoted string)"
        )
    return value


def _unclosed_quote(line: str) -> bool:
    """Whether a quote in a shell line is never closed (as sh reads quotes). Lines with a
    here-document (its text is not shell words) or ``$'...'`` (bash's own quoting, where
    sh is bash) are not judged; a quote after ``#`` is a comment's."""
    if ("'" not in line and '"' not in line) or "<<" in line or "$'" in line:
        return False
    import shlex

    try:
        shlex.split(line, comments=True)
    except ValueError as err:
        return "closing quotation" in str(err)
    return False


def check_gpus(value: object) -> int:
    """GPUs a job needs, each on its own domain (0 = the CPU pool)."""
    return _whole("gpus", value, 0, 64)


VRAM_MIN_GB = 1 / 1024
"""The least VRAM a job may declare: 1 MiB (less rounds to nothing on any GPU)."""


def check_vram_gb(value: object, field: str = "vram_gb") -> float:
    """GiB needed on each GPU: at least 1 MiB, at most a million GiB."""
    number = _number(field, value, 1_000_000, " GiB")
    if number < VRAM_MIN_GB:
        raise FieldError(field, f"must be at least {VRAM_MIN_GB:g} GiB (1 MiB), got {number:g}")
    return number


def check_timeout(value: object) -> float:
    """Seconds of running before the job is stopped."""
    return _number("timeout", value, MAX_SECONDS, " s")


def check_priority(value: object) -> int:
    """Higher starts first; -1,000,000 to 1,000,000."""
    return _whole("priority", value, -1_000_000, 1_000_000)


def check_replicas(value: object) -> int:
    """Copies of a service: 1 to 64."""
    return _whole("replicas", value, 1, 64)


def check_max_restarts(value: object) -> int:
    """Restarts allowed per replica."""
    return _whole("max_restarts", value, 0, 1_000_000)


def check_max_attempts(value: object) -> int:
    """Placements of a service after losing a domain."""
    return _whole("max_attempts", value, 1, 1000)


def check_job_id(value: object, field: str = "job") -> int:
    """A job id: 1 up to SQLite's largest integer."""
    if _is_int(value) and value < 1:  # type: ignore[operator]
        raise FieldError(field, f"a job id is 1 or more, got {value}")
    return _whole(field, value, 1, MAX_INT, f"a job id is at most {MAX_INT}, got {value}")


def check_pid(value: object) -> int:
    """A Linux process id."""
    return _whole("pid", value, 1, PID_MAX, f"must be a process id from 1 to {PID_MAX}")


def check_start_ticks(value: object) -> int:
    """A /proc start time in clock ticks."""
    return _whole("start_ticks", value, 0, MAX_INT)


# Rules by field name, for code that checks a field it knows only by name (the TUI's form).
RULES: dict[str, Any] = {
    "command": check_command,
    "shell": check_shell,
    "name": lambda v: check_label("name", v),
    "project": lambda v: check_label("project", v),
    "gpus": check_gpus,
    "vram_gb": check_vram_gb,
    "timeout": check_timeout,
    "priority": check_priority,
    "replicas": check_replicas,
    "max_restarts": check_max_restarts,
    "max_attempts": check_max_attempts,
    "pid": check_pid,
    "start_ticks": check_start_ticks,
}


# -- text parsers (argparse types, form fields) --------------------------------------------


def too_long(digits: str) -> str | None:
    """For ASCII digits far past any limit here (over 40 significant digits: ``MAX_INT``
    has 19), how to show them (``int()`` refuses more than 4,300 digits with a Python
    traceback's words, and is slow well before); ``None`` for a number ``int()`` may read
    (the field's own rule then says what is wrong with it)."""
    if len(digits.lstrip("0")) <= 40:
        return None
    return f"{digits[:12]}... ({len(digits)} digits)"


def parse_whole(field: str, text: str) -> int:
    """A whole number typed by a person."""
    digits = text.strip()
    unsigned = digits[1:] if digits[:1] in ("-", "+") else digits
    if not (unsigned.isascii() and unsigned.isdigit()):  # (int() takes "1_0" and "٣")
        raise FieldError(field, f"expected a whole number, got {text!r}")
    shown = too_long(unsigned)
    if shown is not None:
        raise FieldError(field, f"{shown} is too large a number (at most {MAX_INT})")
    return int(digits)


def parse_number(field: str, text: str) -> float:
    """A number typed by a person: ASCII digits, a point, an exponent (``float`` also
    takes ``1_6``, a typo it read as 16, and digits of other scripts)."""
    typed = text.strip()
    try:
        if not typed.isascii() or "_" in typed:
            raise ValueError
        return float(typed)
    except ValueError:
        if field.endswith("_gb"):
            import re

            # ("10GB" beside --simulate 2xA100-80GB: a number of GiB, said so: h182; "10
            # GiB", "1e3g" were not caught, and "10b" was taken for GiB: h187)
            amount = r"\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*"
            gib = re.fullmatch(amount + r"(g|gb|gib)\s*", typed, re.IGNORECASE)
            if gib is not None:
                raise FieldError(
                    field,
                    f"expected a number of GiB without its unit ({gib.group(1)}), got {text!r}",
                ) from None
            if re.fullmatch(amount + r"([kmtp]i?b?|b)\s*", typed, re.IGNORECASE):
                raise FieldError(
                    field, f"expected a number of GiB, without a unit, got {text!r}"
                ) from None
        raise FieldError(field, f"expected a number, got {text!r}") from None


_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(field: str, text: str) -> float:
    """Seconds typed by a person: a number (``5400``), or amounts with units ``s``, ``m``,
    ``h``, ``d``, ``w`` (``90m``, ``1h30m``, ``1.5h``, ``2d``, ``2w``): ``--timeout 2h`` was
    refused, "expected a number" (tester h69)."""
    import re

    typed = text.strip().lower().replace(" ", "")
    wrong = FieldError(
        field, f"expected seconds or a duration such as 90m, 2h, 1h30m, 1d; got {text!r}"
    )
    if not typed or typed[-1] not in _UNIT_SECONDS:
        try:
            return parse_number(field, text)
        except FieldError:
            raise wrong from None
    # ([0-9], not \d: a full-width "3h" was taken here, refused elsewhere: tester h159)
    if re.fullmatch(r"(?:[0-9]+(?:\.[0-9]+)?[smhdw])+", typed) is None:
        raise wrong
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)([smhdw])", typed)
    units = [unit for _, unit in parts]
    if len(set(units)) != len(units) or units != sorted(units, key=_UNIT_SECONDS.__getitem__)[::-1]:
        # ("1d1d" was taken as 2 days, "30s1h" as 3630 s: a typo read as meant; h103)
        raise FieldError(field, f"each unit once, largest first (1d2h30m), got {text!r}")
    return sum(float(amount) * _UNIT_SECONDS[unit] for amount, unit in parts)


def _is_plain_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_field(field: str, text: str) -> Any:
    """Parse ``text`` for ``field`` and check it by the field's rule.

    Raises:
        FieldError: It does not parse or breaks the rule.
    """
    if field in ("vram_gb", "timeout"):
        number = parse_duration(field, text) if field == "timeout" else parse_number(field, text)
        if number in (float("inf"), float("-inf")) and any(c.isdigit() for c in text):
            # Too large for a float (1e400), not typed as "inf": it was refused as "must
            # be a finite number, not inf" (tester h61). Said as the rule says a large one.
            try:
                RULES[field](sys.float_info.max if number > 0 else -sys.float_info.max)
            except FieldError as err:
                said = err.detail.rsplit(", got ", 1)[0]
                raise FieldError(field, f"{said}, got {text.strip()[:40]}") from None
        try:
            return RULES[field](number)
        except FieldError as err:
            said, _, got = err.detail.rpartition(", got ")
            if field == "timeout" and said and not _is_plain_number(text):
                # What was typed, not its seconds: "--timeout 99999999d ... got
                # 8639999913600" (tester h86).
                raise FieldError(field, f"{said}, got {text.strip()[:40]} ({got} s)") from None
            if said and got != text.strip():
                # (as typed: "got 1e+20" of twenty digits typed: tester h151)
                raise FieldError(field, f"{said}, got {text.strip()[:40]}") from None
            raise
    if field in ("name", "project"):
        return RULES[field](text)
    if field == "job":
        return parse_job_id(text)
    return RULES[field](parse_whole(field, text))


def parse_job_id(text: str, field: str = "job") -> int:
    """A job id typed by a person."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):  # (int() takes "1_0" and "٣")
        raise FieldError(field, f"a job id is a number of 1 or more, got {text!r}")
    shown = too_long(digits)
    if shown is not None:
        raise FieldError(field, f"a job id is at most {MAX_INT}, got {shown}")
    return check_job_id(int(digits), field)


def parse_job_ids(text: str, field: str = "depends_on") -> list[int]:
    """Job ids separated by commas or spaces, each named once (``3,,4`` and ``3,3`` are
    typing slips: told, not read as ``3,4`` and ``3``)."""
    ids: list[int] = []
    for part in text.split(","):
        words = part.split()
        if not words and "," in text:
            raise FieldError(field, f"a job id is missing between the commas of {text!r}")
        for word in words:
            job = parse_job_id(word, field)
            if job in ids:
                raise FieldError(field, f"job {job} is named twice in {text!r}")
            ids.append(job)
    return ids


ANSWERED_BY = "is answered by"
"""How a starting replica's message says another program holds its port."""

LISTENED_ONLY_ON = "is listened on only at"
LISTENS_ELSEWHERE = "not answering; this replica listens on"
"""How a starting replica's message says it listens on another address than the one
checked (``::1``, where ``[services] host`` is 127.0.0.1)."""


def starting_why(port: int | None, message: str) -> str:
    """Why a starting replica is not up yet: its port does not answer, another program
    answers it, or it listens where the engine does not connect (its message says which;
    "not answering" contradicted it)."""
    if port is not None and message.startswith(
        (
            f"port {port} {ANSWERED_BY} ",
            f"port {port} {LISTENED_ONLY_ON} ",
            f"port {port} {LISTENS_ELSEWHERE} ",
        )
    ):
        return message
    return f"port {port} not answering yet"


def keys_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (``object_pairs_hook``): with a key
    given twice, the last one won silently (a spec ran `pwd` where `ls` came first).

    Raises:
        ValueError: Naming the key given twice.
    """
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key[:100]!r} is given twice in one object")
            seen.add(key)
    return out


def status_phrase(status: str) -> str:
    """``is running`` / ``has ended (failed)``: a job's status in a sentence ("job 5 is
    failed" read wrong)."""
    return f"has ended ({status})" if status in TERMINAL_STATUSES else f"is {status}"


def engine_sets_env(
    key: str,
    port_service: bool,
    no_port: str = "add --no-port",
    ask_gpus: str = "ask for GPUs with --gpus N (and --domain NAME for which ones)",
) -> str | None:
    """Why a job's environment may not name ``key`` where a user types it (``--env``, a
    spec file's ``env``, the TUI's form), or ``None``: the engine sets it for each job,
    over whatever the job's environment says (the value given was dropped without a
    word), or no shell could read it. ``port_service``: a service given a ``$PORT``;
    ``no_port``: how to turn that port off where the variable was typed; ``ask_gpus``:
    how to ask for GPUs there."""
    if any(c.isspace() or not c.isprintable() for c in key):
        # (`--env "LR =0.1"` set a variable "LR " that the job's $LR never read; refused
        # where the user typed it: an inherited environment may hold such a name)
        return "a variable's name has no spaces or control characters"
    if key == "CUDA_VISIBLE_DEVICES":
        return f"the engine sets it to the job's GPUs; {ask_gpus}"
    if key in ("CUDA_DEVICE_ORDER", "GPULAYER_JOB_ID", "GPULAYER_REPLICA", "GPULAYER_TASK"):
        return "the engine sets it for every job"
    if key == "PWD":
        return "the engine sets it to the folder the job runs in; give that with --cwd"
    if key == "PORT" and port_service:
        return (
            "each start of a replica gets a free port as $PORT from the engine; "
            f"{no_port} to give your own"
        )
    return None


def env_name_shown(key: str) -> str:
    """``key`` as typed, quoted (escapes and all) where it holds a space or a control."""
    return key if key.isprintable() and not any(c.isspace() for c in key) else repr(key)


def wait_words(seconds: float) -> str:
    """``3 s``, ``12 min``, ``2 h``, ``3 days``: a wait, as the engine's reasons and the
    clients both write it (``why`` showed "retry in 3 s" above "in 2s": tester h84)."""
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"{round(seconds / 3600)} h"
    return f"{round(seconds / 86400)} days"


def typed_folder(text: str, base: str | None = None) -> str:
    """A folder as typed, absolute: ``~`` and ``~user`` expanded, a relative one from
    ``base`` (the current folder by default).

    Raises:
        ValueError: ``~user`` names no user (it was taken as a folder named ``~user`` in
            the current one, and the job failed at its start: "no such folder").
        FileNotFoundError: It is relative and the current folder no longer exists.
    """
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = expanded[1:].split("/", 1)[0]
        raise ValueError(f"{text}: no user {user!r} (a folder named so: ./{text})")
    return os.path.normpath(os.path.join(base if base is not None else os.getcwd(), expanded))


def replicas_said(indexes: list[int]) -> str:
    """``replica 3``, ``replicas 2, 3``, ``replicas 1-63`` (runs of three or more as a
    range: a scale from 64 to 1 listed all 63: tester h168)."""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    said = ", ".join(
        f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)) for run in runs
    )
    return f"{'replica' if len(indexes) == 1 else 'replicas'} {said}"
