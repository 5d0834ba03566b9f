"""The CLI's quick path: the common forms of ``submit``, ``status`` and ``jobs`` without
argparse.

argparse imports :mod:`re`, :mod:`gettext` and :mod:`locale` (~7 ms of a call that should
cost little more than starting Python). These three subcommands are the ones scripts call
in loops, so their common forms are read here into the same namespace argparse would
build (a test checks this on many command lines). Anything else (``--help``, an
abbreviated or unknown option, ``--opt=`` forms of list options, a value argparse would
refuse or read differently, a spec file to submit) returns ``None``, and argparse parses the
whole command line as before, with its messages and its exit code 2. (``submit --file
FILE`` is read here: a batch of commands, the launch benchmarks' and scripts' way to queue
many, lost 24 ms to building every subcommand's parser.)

Values go through the same field rules (:mod:`gpulayer_tui.fields`) as argparse's types;
one that breaks its rule also returns ``None``, so the refusal comes from argparse.
"""

from __future__ import annotations

from .. import fields

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any


class Args:
    """The parsed command line (argparse's ``Namespace``, without argparse)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


# What argparse puts in the namespace for the global options when none is given.
_GLOBAL_DEFAULTS: dict[str, Any] = {
    "serve": False,
    "simulate": None,
    "simulate_if_no_gpu": None,
    "config": None,
    "verbose": False,
}


def _job_id(text: str) -> int:
    return fields.parse_job_id(text)


def _job_ids(text: str) -> list[int]:
    ids = fields.parse_job_ids(text, "job")
    if not ids:
        raise fields.FieldError("job", f"a job id is a number of 1 or more, got {text!r}")
    return ids


def _typed(name: str) -> Callable[[str], Any]:
    return lambda text: fields.parse_field(name, text)


def _count(text: str) -> int:
    value = fields.parse_whole("value", text)
    if value < 1:
        raise fields.FieldError("value", f"must not be less than 1, got {value}")
    if value > fields.MAX_INT:
        raise fields.FieldError("value", f"must be at most {fields.MAX_INT}, got {value}")
    return value


# option -> (namespace key, kind, parse): kind is "value", "append" or "flag".
_Option = tuple[str, str, "Callable[[str], Any] | None"]
_SUBMIT: dict[str, _Option] = {
    "--name": ("name", "value", str),
    "--project": ("project", "value", str),
    "--gpus": ("gpus", "value", _typed("gpus")),
    "--vram-gb": ("vram_gb", "value", _typed("vram_gb")),
    "--domain": ("domain", "append", str),
    "--exclusive": ("exclusive", "flag", None),
    "--notify": ("notify", "flag", None),
    "--preemptible": ("preemptible", "flag", None),
    "--cluster": ("cluster", "value", str),
    "--no-requeue": ("no_requeue", "flag", None),
    "--snapshot": ("snapshot", "flag", None),
    "--no-snapshot": ("no_snapshot", "flag", None),
    "--after": ("after", "extend", _job_ids),
    "--after-any": ("after_any", "extend", _job_ids),
    "--timeout": ("timeout", "value", _typed("timeout")),
    "--priority": ("priority", "value", _typed("priority")),
    "--cwd": ("cwd", "value", str),
    "--env": ("env", "append", str),
    "--no-inherit-env": ("no_inherit_env", "flag", None),
    "--shell": ("shell", "flag", None),
    "--json": ("json", "flag", None),
    "--file": ("file", "value", str),
}
_SUBMIT_DEFAULTS: dict[str, Any] = {
    "name": None,
    "like": None,
    "project": None,
    "gpus": None,
    "vram_gb": None,
    "domain": None,
    "exclusive": False,
    "notify": False,
    "preemptible": False,
    "cluster": None,
    "cpus": None,
    "mem_gb": None,
    "no_requeue": False,
    "snapshot": False,
    "no_snapshot": False,
    "after": [],
    "after_any": [],
    "timeout": None,
    "priority": None,
    "cwd": None,
    "env": [],
    "no_inherit_env": False,
    "shell": False,
    "file": None,
    "spec": None,
    "service": False,
    "replicas": None,
    "restart": None,
    "max_restarts": None,
    "no_port": False,
    "max_attempts": None,
    "json": False,
}
_STATUS: dict[str, _Option] = {"--json": ("json", "flag", None), "--plot": ("plot", "flag", None)}
_JOBS: dict[str, _Option] = {
    "--status": ("status", "append", str),
    "--limit": ("limit", "value", _count),
    "--json": ("json", "flag", None),
}
_JOBS_DEFAULTS: dict[str, Any] = {
    "status": [],
    "filter": "",
    "limit": 50,
    "before": None,
    "after": None,
    "page": None,
    "sort": "id",
    "reverse": False,
    "json": False,
    "since": None,
}


def parse(words: Sequence[str]) -> Args | None:
    """The namespace argparse would build for ``words``, or ``None`` to let it parse."""
    if not words:
        return None
    try:
        if words[0] == "submit":
            return _submit(words[1:])
        if words[0] == "status":
            return _status(words[1:])
        if words[0] == "jobs":
            return _options(words[1:], "jobs", _JOBS, _JOBS_DEFAULTS, positional=False)
    except fields.FieldError:
        return None
    return None


def _submit(words: Sequence[str]) -> Args | None:
    at = 0
    values = dict(_SUBMIT_DEFAULTS)
    while at < len(words):
        word = words[at]
        if not word.startswith("-") or word == "--":
            break  # the command starts (argparse.REMAINDER keeps a leading "--")
        taken = _take(words, at, _SUBMIT, values)
        if taken is None:
            return None
        at = taken
    command = list(words[at:])
    if values["file"] is not None:
        if command:
            return None  # (a file and a command: argparse and the handler refuse it)
    elif not command or command == ["--"]:
        return None  # argparse and the handler say what is missing
    return Args(**_GLOBAL_DEFAULTS, command="submit", **values, cmd=command)


def _status(words: Sequence[str]) -> Args | None:
    job: int | None = None
    values: dict[str, Any] = {"json": False, "plot": False, "last": 40}
    at = 0
    while at < len(words):
        word = words[at]
        if word.startswith("-"):
            taken = _take(words, at, _STATUS, values)
            if taken is None:
                return None
            at = taken
        elif job is None:
            job = _job_id(word)
            at += 1
        else:
            return None
    if job is None:
        return None
    return Args(**_GLOBAL_DEFAULTS, command="status", job=job, **values)


def _options(
    words: Sequence[str],
    command: str,
    table: dict[str, _Option],
    defaults: dict[str, Any],
    positional: bool,
) -> Args | None:
    values = dict(defaults)
    at = 0
    while at < len(words):
        if not words[at].startswith("-") and not positional:
            return None
        taken = _take(words, at, table, values)
        if taken is None:
            return None
        at = taken
    return Args(**_GLOBAL_DEFAULTS, command=command, **values)


def _take(
    words: Sequence[str], at: int, table: dict[str, _Option], values: dict[str, Any]
) -> int | None:
    """Read the option at ``words[at]`` into ``values``; the index after it, or ``None``
    when argparse should read this command line."""
    word = words[at]
    option, sep, inline = word.partition("=")
    known = table.get(option)
    if known is None:
        return None
    key, kind, parse_value = known
    if kind == "flag":
        if sep:
            return None
        values[key] = True
        return at + 1
    if sep:
        text, after = inline, at + 1
    elif at + 1 < len(words):
        text, after = words[at + 1], at + 2
    else:
        return None
    if text.startswith("-") or (not sep and not text):
        return None  # argparse decides what a dash (or an empty value) means here
    assert parse_value is not None
    value = parse_value(text)
    if kind == "append":
        values[key] = [*(values[key] or []), value]
    elif kind == "extend":
        if any(job in (values[key] or []) for job in value):
            return None  # (a repeated id: argparse's JobIdsAction tells it)
        values[key] = [*(values[key] or []), *value]
    else:
        values[key] = value
    return after
