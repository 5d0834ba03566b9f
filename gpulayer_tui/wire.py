"""The wire contract: every name and shape the engine, the API, the CLI and the TUI share.

Stdlib only, and cheap to import (the CLI loads it on every call). It holds:

* the enums that name states (job status, termination reason, kind, event kind, replica
  and domain states) and the active/terminal status sets, defined once here;
* the JSON shapes of jobs, domains, VRAM, GPU views, events and errors (``TypedDict``), so
  readers are type-checked against what the engine writes;
* the field rules (ranges, characters) used by the engine's spec model, argparse and the
  TUI's forms alike, raising :class:`FieldError`, which names its field; errors travel as
  ``{"error": message, "field": name}``;
* the adopt request, parsed once for the API, the CLI and the adopt dialog.

The engine's behaviour around these names (the transition tables, the records) lives in
``engine/models.py``; this module only says what the names are.

Why this module is longer than ~400 lines: it is a contract, mostly declarations (enums,
JSON shapes, one rule per field); splitting it would make every reader import several
modules to learn one vocabulary, and the CLI pay for each import.
"""

from __future__ import annotations

from enum import StrEnum

TYPE_CHECKING = False  # (not typing's: the CLI loads this module; typing costs ~2 ms)
if TYPE_CHECKING:
    from typing import Any

    # Re-exported: the shapes are part of this contract (see SHAPES below).
    from .shapes import AdoptRequest as AdoptRequest
    from .shapes import DomainJSON as DomainJSON
    from .shapes import DomainViewJSON as DomainViewJSON
    from .shapes import ErrorJSON as ErrorJSON
    from .shapes import EventJSON as EventJSON
    from .shapes import GpuJSON as GpuJSON
    from .shapes import GpusJSON as GpusJSON
    from .shapes import HealthJSON as HealthJSON
    from .shapes import JobDetailJSON as JobDetailJSON
    from .shapes import JobJSON as JobJSON
    from .shapes import JobPageJSON as JobPageJSON
    from .shapes import JobRowJSON as JobRowJSON
    from .shapes import ProcessInfoJSON as ProcessInfoJSON
    from .shapes import ProcessJSON as ProcessJSON
    from .shapes import ReplicaJSON as ReplicaJSON
    from .shapes import TimelineEntryJSON as TimelineEntryJSON
    from .shapes import VramJSON as VramJSON

# -- names -------------------------------------------------------------------------------


class JobStatus(StrEnum):
    """Lifecycle status of a job (record 003)."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ORPHANED = "orphaned"

    @property
    def is_terminal(self) -> bool:
        """True for statuses a job never leaves."""
        return self.value in TERMINAL_STATUSES

    @property
    def is_active(self) -> bool:
        """True while the job may still run or is running."""
        return self.value in ACTIVE_STATUSES


# Plain strings, so a reader of JSON can test ``job["status"] in ACTIVE_STATUSES`` directly
# (a StrEnum member equals its value, so ``JobStatus.RUNNING in ACTIVE_STATUSES`` holds too).
ACTIVE_STATUSES: frozenset[str] = frozenset({"pending", "queued", "running"})
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "orphaned"})
NOT_COMPLETED_STATUSES: frozenset[str] = TERMINAL_STATUSES - {"completed"}

STATUS_RANK: dict[str, int] = {
    "running": 0,
    "queued": 1,
    "pending": 2,
    "failed": 3,
    "orphaned": 4,
    "cancelled": 5,
    "completed": 6,
}
"""Where each status sorts when jobs are sorted by status: what needs attention first."""

JOB_SORTS: tuple[str, ...] = ("id", "status", "name", "started", "runtime", "vram")
"""What ``GET /v1/jobs?sort=`` takes. Ties are broken by id: newest first under ``status``
and ``name`` ascending, in the sort's direction for the rest (as the TUI's table does)."""

ROW_SPEC_KEYS: tuple[str, ...] = ("command", "shell", "gpus", "vram_gb", "replicas", "domain")
"""The spec fields a job's *row* (``JobRowJSON``: lists, events) carries: what a table
shows. The whole spec (environment, working directory, dependencies, policies) comes only
with the job itself (``GET /v1/jobs/ID``, ``status``)."""

MAX_PAGE = 10_000
"""The most jobs one ``GET /v1/jobs`` answers; more are read page by page."""


class TerminationReason(StrEnum):
    """Why a job reached its terminal status."""

    EXIT_CODE = "exit_code"
    SIGNAL = "signal"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    OVER_CAPACITY = "over_capacity"
    DEPENDENCY_FAILED = "dependency_failed"
    LAUNCH_FAILED = "launch_failed"
    ENGINE_LOST = "engine_lost"
    DOMAIN_LOST = "domain_lost"
    ADOPTED_EXIT_UNOBSERVED = "adopted_exit_unobserved"
    ADOPT_PID_GONE = "adopt_pid_gone"
    ADOPT_PID_MISMATCH = "adopt_pid_mismatch"
    ADOPT_UID_MISMATCH = "adopt_uid_mismatch"


class JobKind(StrEnum):
    """What sort of workload a job is."""

    COMMAND = "command"
    SERVICE = "service"
    ADOPTED = "adopted"


class EventKind(StrEnum):
    """Kinds of events the engine publishes (and, for history, stores)."""

    SUBMITTED = "job.submitted"
    TRANSITION = "job.transition"
    STARTED = "job.started"  # its process runs now (pid); the launcher journaled it
    REASON = "job.reason"
    LOG = "job.log"  # its log was cut back (it passed [logs] max_bytes)
    REPLICA = "job.replica"
    GPU_SAMPLE = "gpu.sample"
    DOMAIN = "domain.state"
    CONFIG = "engine.config"
    ENGINE = "engine"


class ReplicaState(StrEnum):
    """Lifecycle state of one replica of a service (record 000)."""

    PENDING = "pending"  # not launched yet (the service is being placed)
    STARTING = "starting"  # its process runs; its $PORT does not accept connections yet
    UP = "up"  # running (and its endpoint answers, when it has a port)
    BACKOFF = "backoff"  # exited; restarts at ``next_restart_at``
    STOPPING = "stopping"  # SIGTERM sent, SIGKILL follows after the grace period
    EXITED = "exited"  # ended for good (or stopped with its service)

    @property
    def has_process(self) -> bool:
        """True while a process of this replica may be alive."""
        return self in (ReplicaState.STARTING, ReplicaState.UP, ReplicaState.STOPPING)


class DomainState(StrEnum):
    """Whether a domain takes new work (record 002)."""

    IN_SERVICE = "in_service"
    DRAINING = "draining"
    QUARANTINED = "quarantined"


class DomainHealth(StrEnum):
    """How its GPU answers: repeated failed reads degrade, then quarantine it."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"


class Capacity(StrEnum):
    """Whether the machine's GPU capacity is known."""

    KNOWN = "known"
    NO_GPUS = "no_gpus"
    UNKNOWN = "unknown"


# -- JSON shapes -------------------------------------------------------------------------


# (defined in :mod:`.shapes`; see there why)

SHAPES = frozenset(
    (
        "ReplicaJSON",
        "JobJSON",
        "TimelineEntryJSON",
        "JobDetailJSON",
        "JobPageJSON",
        "JobRowJSON",
        "DomainJSON",
        "GpuJSON",
        "VramJSON",
        "ProcessJSON",
        "DomainViewJSON",
        "GpusJSON",
        "HealthJSON",
        "EventJSON",
        "ProcessInfoJSON",
        "ErrorJSON",
        "AdoptRequest",
    )
)


def __getattr__(name: str) -> Any:
    if name in SHAPES:
        from . import shapes

        return getattr(shapes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- field rules -------------------------------------------------------------------------

MAX_INT = 2**63 - 1  # SQLite's INTEGER: a larger id names nothing
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


def _whole(field: str, value: object, low: int, high: int, what: str = "") -> int:
    if not _is_int(value):
        raise FieldError(field, f"must be a whole number, not {value!r}"[:200])
    assert isinstance(value, int)
    if not low <= value <= high:
        raise FieldError(field, what or f"must be from {low} to {high}, not {value}")
    return value


def _number(field: str, value: object, high: float, unit: str = "") -> float:
    if not _is_number(value):
        raise FieldError(field, f"must be a number, not {value!r}"[:200])
    number = float(value)  # type: ignore[arg-type]
    if number != number or number in (float("inf"), float("-inf")):
        raise FieldError(field, f"must be a finite number, not {number}")
    if not 0 < number:
        raise FieldError(field, f"must be greater than 0, got {number:g}")
    if not number <= high:
        raise FieldError(field, f"must be at most {high:g}{unit}, got {number:g}")
    return number


def check_label(field: str, value: object) -> str:
    """A name or project: 1-200 characters, no control characters (they would reach
    terminals)."""
    if not isinstance(value, str) or not value:
        raise FieldError(field, f"must be text of 1 to {NAME_MAX} characters")
    if len(value) > NAME_MAX:
        raise FieldError(field, f"must be at most {NAME_MAX} characters, not {len(value)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise FieldError(field, "control characters are not allowed")
    return value


def check_command(value: object) -> list[str]:
    """An argv: 1 to 4,096 words, the first (the program) not empty, no NUL bytes."""
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise FieldError("command", "must be a list of words")
    if not value:
        raise FieldError("command", "a command is needed")
    if len(value) > 4096:
        raise FieldError("command", f"at most 4096 words, not {len(value)}")
    if not value[0]:
        raise FieldError("command", "the program name (first word) is empty")
    if any("\0" in word for word in value):
        raise FieldError("command", "contains a NUL byte")
    return value


def check_shell(value: object) -> str:
    """A shell line: 1 to 65,536 characters, no NUL bytes."""
    if not isinstance(value, str) or not value:
        raise FieldError("shell", "a command is needed")
    if len(value) > 65536:
        raise FieldError("shell", f"at most 65536 characters, not {len(value)}")
    if "\0" in value:
        raise FieldError("shell", "contains a NUL byte")
    return value


def check_gpus(value: object) -> int:
    """GPUs a job needs, each on its own domain (0 = the CPU pool)."""
    return _whole("gpus", value, 0, 64)


def check_vram_gb(value: object, field: str = "vram_gb") -> float:
    """GiB needed on each GPU: more than 0, at most a million."""
    return _number(field, value, 1_000_000, " GiB")


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


def parse_whole(field: str, text: str) -> int:
    """A whole number typed by a person."""
    try:
        return int(text.strip())
    except ValueError:
        raise FieldError(field, f"expected a whole number, got {text!r}") from None


def parse_number(field: str, text: str) -> float:
    """A number typed by a person."""
    try:
        return float(text.strip())
    except ValueError:
        raise FieldError(field, f"expected a number, got {text!r}") from None


def parse_field(field: str, text: str) -> Any:
    """Parse ``text`` for ``field`` and check it by the field's rule.

    Raises:
        FieldError: It does not parse or breaks the rule.
    """
    if field in ("vram_gb", "timeout"):
        return RULES[field](parse_number(field, text))
    if field in ("name", "project"):
        return RULES[field](text)
    if field == "job":
        return parse_job_id(text)
    return RULES[field](parse_whole(field, text))


def parse_job_id(text: str, field: str = "job") -> int:
    """A job id typed by a person."""
    try:
        value = int(text.strip())
    except ValueError:
        raise FieldError(field, f"a job id is a number, got {text!r}") from None
    return check_job_id(value, field)


def parse_job_ids(text: str, field: str = "depends_on") -> list[int]:
    """Job ids separated by commas or spaces."""
    return [parse_job_id(item, field) for item in text.replace(",", " ").split()]


# -- requests --------------------------------------------------------------------------------

ADOPT_FIELDS = frozenset({"pid", "start_ticks", "name", "vram_gb", "gpu", "domain"})


def parse_adopt_request(body: object) -> AdoptRequest:
    """Validate an adopt request (the API's body, the CLI's and the dialog's input).

    Raises:
        FieldError: Naming the field at fault (``request`` for the shape itself).
    """
    if not isinstance(body, dict):
        raise FieldError("request", "an adopt request must be a JSON object")
    unknown = sorted(str(k) for k in set(body) - ADOPT_FIELDS)
    if unknown:
        raise FieldError(unknown[0], "unknown field")
    if "pid" not in body:
        raise FieldError("pid", "is required")
    pid = check_pid(body["pid"])
    ticks = body.get("start_ticks")
    name = body.get("name")
    vram = body.get("vram_gb")
    domain = body.get("domain")
    if domain is None:
        domains: list[str] = []
    elif isinstance(domain, str):
        domains = [domain]
    elif isinstance(domain, list) and all(isinstance(d, str) for d in domain):
        domains = list(domain)
    else:
        raise FieldError("domain", "must be a domain name or a list of domain names")
    if any(not d for d in domains):
        raise FieldError("domain", "a domain name is empty")
    gpu = body.get("gpu", False)
    if not isinstance(gpu, bool):
        raise FieldError("gpu", "must be true or false")
    return {
        "pid": pid,
        "start_ticks": None if ticks is None else check_start_ticks(ticks),
        "name": None if name is None else check_label("name", name),
        "vram_gb": None if vram is None else check_vram_gb(vram),
        "gpu": gpu,
        "domain": domains,
    }


def error_body(message: str, field: str | None = None) -> ErrorJSON:
    """The JSON of an error answer."""
    body: ErrorJSON = {"error": message}
    if field:
        body["field"] = field
    return body
