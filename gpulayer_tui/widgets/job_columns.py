"""What the jobs table shows: its columns, layouts, filters, sorts and cell texts.

Pure data and formatting (no widget), shared by the table and the job detail view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from ..formatting import (
    argv_text,
    domains_text,
    gpus_text,
    reason_words,
    run_started_at,
    user_text,
)
from ..wire import ACTIVE_STATUSES, ASCENDING_JOB_SORTS, JOB_SORTS, STATUS_RANK, JobRowJSON

__all__ = ["domains_text", "gpus_text", "user_text"]  # (shared with the CLI's jobs table)

STATUS_FILTERS: dict[str, frozenset[str] | None] = {
    "all": None,
    "active": ACTIVE_STATUSES,
    "queued": frozenset({"pending", "queued"}),
    "running": frozenset({"running"}),
    "failed": frozenset({"failed", "orphaned"}),
    "completed": frozenset({"completed"}),
    "cancelled": frozenset({"cancelled"}),
}
"""The status filter's choices, in the order ``f`` cycles through them."""

_SORT_LABELS: dict[str, str] = {
    "id": "newest",
    "status": "status",
    "priority": "priority",
    "name": "name",
    "started": "started",
    "runtime": "runtime",
    "vram": "VRAM",
    "user": "user",
    "kind": "kind",
    "exit": "exit",
}
SORTS: dict[str, tuple[str, bool]] = {
    key: (_SORT_LABELS[key], key not in ASCENDING_JOB_SORTS) for key in JOB_SORTS
}
"""Sort keys: column key -> (label, whether it starts descending), in cycling order. The
keys are the engine's (:data:`~gpulayer_tui.wire.JOB_SORTS`): a table sort is always one
the engine can page (a sort added there without a label here fails at import)."""


Justify = Literal["left", "right"]


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    key: str
    label: str
    width: int  # 0: the flexible message column
    justify: Justify = "left"


COLUMNS = (
    ColumnSpec("id", "ID", 5, "right"),
    ColumnSpec("name", "NAME", 16),
    ColumnSpec("user", "USER", 8),
    ColumnSpec("kind", "KIND", 7),
    ColumnSpec("status", "STATUS", 9),
    ColumnSpec("priority", "PRIO", 5, "right"),  # (empty at 0, as the CLI's; 5: "PRIO▼")
    ColumnSpec("message", "REASON / MESSAGE", 0),
    ColumnSpec("domains", "DOMAINS", 9),
    ColumnSpec("gpus", "GPUS", 5, "right"),
    ColumnSpec("vram", "VRAM", 5, "right"),
    ColumnSpec("peak", "PEAK", 5, "right"),
    ColumnSpec("util", "UTIL", 4, "right"),
    ColumnSpec("energy", "ENERGY", 7, "right"),
    ColumnSpec("started", "STARTED", 8),
    ColumnSpec("runtime", "RUNTIME", 8, "right"),  # (8: "RUNTIME▼", not "RUNT… ▼": h91)
    ColumnSpec("exit", "EXIT", 5, "right"),  # (5: "EXIT▼" when sorted by it)
)
BY_KEY = {c.key: c for c in COLUMNS}


@dataclass(frozen=True, slots=True)
class Layout:
    min_width: int
    hidden: frozenset[str]
    name_width: int


USAGE_COLUMNS = frozenset({"peak", "util", "energy"})
"""What GPU jobs used (a row's ``use``): only wide terminals show them."""

# Narrower terminals drop the columns that matter least (the detail view has them all)
# and keep the message column readable: it says why a job waits or how it ended.
LAYOUTS = (
    # (a name longer than 16 was cut at 200 columns too, beside a message with room to spare)
    Layout(200, frozenset(), 28),
    Layout(170, frozenset(), 16),
    Layout(130, USAGE_COLUMNS, 16),
    Layout(100, frozenset({"kind", "started", "user", "priority"}) | USAGE_COLUMNS, 14),
    Layout(
        70,
        frozenset({"kind", "user", "domains", "vram", "started", "exit", "priority"})
        | USAGE_COLUMNS,
        12,
    ),
    # (Under 70 the table outgrew the terminal: RUNTIME and its sort arrow fell off it.)
    Layout(
        0,
        frozenset({"kind", "user", "domains", "vram", "started", "exit", "gpus", "priority"})
        | USAGE_COLUMNS,
        10,
    ),
)
START_LAYOUT = LAYOUTS[2]
"""The layout a table starts in, before its width is known: the common terminal's. (A
switch of layout rebuilds the rows, and a rebuild that leaves the view near the end asks
for the next page of history, so a table should not switch on its first resize.)"""
MIN_MESSAGE_WIDTH = 16

Parts = tuple[tuple[str, str], ...]
"""A cell's text as (text, component class or "") pieces."""


def job_spec(job: JobRowJSON) -> dict[str, Any]:
    spec = job.get("spec")
    return spec if isinstance(spec, dict) else {}


def command_text(job: JobRowJSON, quoted: bool = True) -> str:
    """The job's command as one line: argv shell-quoted (``quoted=False``: joined with
    spaces, as the engine's text filter matches it), or the shell line."""
    spec = job_spec(job)
    command = spec.get("command")
    if isinstance(command, str):  # (an adopted process's command line, as /proc has it)
        return command
    if command:
        return argv_text(command) if quoted else " ".join(str(word) for word in command)
    return str(spec.get("shell") or "")


def filter_haystack(job: JobRowJSON) -> str:
    """What the jobs filter (``/``) looks in, its ASCII letters lower-cased (as SQLite's
    LIKE folds them: Python's lower() also turned the Kelvin sign into "k"), one field a
    line (a match never spans two): id, name, command, message, status, the termination
    reason (as stored, and as shown: ``engine lost``), project, the domain
    names (each domain it holds or held, each it is pinned to, ``@CLUSTER`` for a Slurm
    job), and its owner's user name.

    The engine's ``GET /v1/jobs?q=`` matches the same fields (``store._TEXT_MATCHES``), so
    a page fetched for a filter holds what the table shows for it.
    """
    spec = job_spec(job)
    pinned = spec.get("domain")
    cluster = spec.get("cluster")
    return "\n".join(
        (
            str(job["id"]),
            str(job.get("name", "")),
            command_text(job, quoted=False),
            str(job.get("message") or ""),
            str(job.get("status", "")),
            *(
                (str(reason), str(reason).replace("_", " "))
                if (reason := job.get("termination_reason"))
                else ()
            ),
            *((str(spec["project"]),) if spec.get("project") else ()),
            *(str(d) for d in job.get("domains") or ()),
            *((pinned,) if isinstance(pinned, str) else (str(d) for d in pinned or ())),
            *((f"@{cluster}",) if cluster else ()),
            user_text(job),
        )
    ).translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def filter_matches(text: str, haystack: str) -> bool:
    """Does the filter ``text`` match a :func:`filter_haystack`? As the engine matches
    (``store._TEXT_MATCHES``): an ASCII term in any case of its letters, a term with
    other letters through Unicode case folding (``éclair`` finds ``Éclair``)."""
    if text.isascii():
        return text.translate(_ASCII_LOWER) in haystack
    return text.casefold() in haystack.casefold()


def vram_text(job: JobRowJSON) -> str:
    """GiB per GPU from the spec (``20``, ``0.5``), or empty; one too long for the
    column's 5 cells with fewer decimals (``12.35``), in thousands from 100000 (``150k``),
    or, under a thousandth, in powers of ten. Cut, 100000 read ``1000…``, as if 1000
    (tester h46); in powers of ten, 12.345 read ``1e+01`` (tester h50)."""
    vram = job_spec(job).get("vram_gb")
    if vram is None:
        return ""
    text = f"{vram:g}"
    if len(text) <= 5 and "e" not in text:  # (:g writes 1000000 as 1e+06)
        return text
    if 0 < vram < 0.001:
        return f"{vram:.0e}"
    if vram < 100_000:
        for digits in (3, 2, 1, 0):
            text = f"{vram:.{digits}f}"
            text = text.rstrip("0").rstrip(".") if digits else text
            if len(text) <= 5:
                return text
    return f"{vram / 1000:.0f}k"


def priority_of(job: JobRowJSON) -> int:
    """The job's priority (0 when its spec has none)."""
    return int(job_spec(job).get("priority") or 0)


def priority_text(job: JobRowJSON) -> str:
    """``+5``, ``-2``, or empty at the default 0 (as the CLI's PRIO column)."""
    priority = priority_of(job)
    return f"{priority:+d}" if priority else ""


def use_texts(job: JobRowJSON) -> tuple[str, str, str]:
    """Peak VRAM (GiB per GPU), mean utilisation and energy from the row's ``use`` (GPU
    jobs seen running), else empty."""
    use = job.get("use")
    if not use or use.get("peak_vram") is None:  # (no sample read: nothing to show, not 0)
        return "", "", ""
    util = use.get("util_mean")
    energy = float(use.get("energy_wh") or 0.0)
    return (
        f"{(use['peak_vram'] or 0) / 1024**3:.1f}",
        "" if util is None else f"{util:.0f}%",
        f"{energy:.1f}Wh" if energy < 1000 else f"{energy / 1000:.1f}kWh",
    )


def runtime_seconds(job: JobRowJSON, now: float) -> float | None:
    """Seconds from start to end (or to ``now`` while it runs); None if it never started,
    or waits again (requeued, a service placed again: its last start is not a run now)."""
    started = run_started_at(job)
    if not started or job.get("status") in ("queued", "pending"):
        return None
    return max(0.0, float(job.get("ended_at") or now) - float(started))


def started_text(started: float | None, now: float) -> str:
    """Local ``HH:MM:SS`` if it started on ``now``'s day, else the date."""
    if not started:
        return ""
    when = time.localtime(started)
    today = time.localtime(now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M:%S", when)
    if when.tm_year == today.tm_year:
        return time.strftime("%b %d", when)
    return time.strftime("%y-%m-%d", when)


def kind_parts(job: JobRowJSON) -> Parts:
    """The kind column: a running service shows its replica health (``svc 2/2``)."""
    return health_parts(job) or ((str(job.get("kind", "")), "jobtable--muted"),)


def health_parts(job: JobRowJSON) -> Parts | None:
    """A running service's replica health (``svc 2/2``, fit for a 7-cell column), else
    ``None``."""
    replicas = job.get("replicas") or []
    if job.get("kind") != "service" or job.get("status") != "running" or not replicas:
        return None
    up = sum(1 for r in replicas if r.get("state") == "up")
    health = f"{up}/{len(replicas)}"
    text = f"svc {health}" if len(health) <= 3 else health  # fits the 7-cell column
    return ((text, "jobtable--replicas-up" if up == len(replicas) else "jobtable--replicas-down"),)


def reason_prefix(job: JobRowJSON) -> str:
    """The termination reason, when the message does not already say it."""
    return reason_words(job)


def sort_value(key: str, job: JobRowJSON, now: float) -> tuple[Any, ...]:
    """Where ``job`` sorts under the sort ``key`` (a key of :data:`SORTS`), ascending.

    Ties go by id: newest first under status and name, in the sort's direction for the
    rest. The engine's ``GET /v1/jobs?sort=`` orders the same way, so a page fetched from
    it is a true prefix of the table's order.
    """
    job_id = job["id"]
    if key == "status":
        return (STATUS_RANK.get(job.get("status", ""), 9), -job_id)
    if key == "name":
        return (str(job.get("name", "")).lower(), -job_id)
    if key == "started":
        return (job.get("started_at") or 0.0, job_id)
    if key == "runtime":
        # (Whole milliseconds, as the engine sorts: equal runtimes tie, then by id.)
        return (round((runtime_seconds(job, now) or 0.0) * 1000), job_id)
    if key == "vram":
        return (job_spec(job).get("vram_gb") or 0.0, job_id)
    if key == "priority":
        return (priority_of(job), job_id)
    if key == "user":
        return (user_text(job), -job_id)
    if key == "kind":
        return (str(job.get("kind", "")), -job_id)
    if key == "exit":  # (none yet: below every code)
        code = job.get("exit_code")
        return (-1 if code is None else int(code), job_id)
    return (job_id,)
