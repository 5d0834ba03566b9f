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

# The field rules are defined in .fields (no enum there, for the CLI's quick path) and
# are part of this contract.
from .fields import ACTIVE_STATUSES as ACTIVE_STATUSES
from .fields import ADOPTED_NOT_RUN as ADOPTED_NOT_RUN
from .fields import MAX_INT as MAX_INT
from .fields import MAX_SECONDS as MAX_SECONDS
from .fields import NAME_MAX as NAME_MAX
from .fields import NOT_COMPLETED_STATUSES as NOT_COMPLETED_STATUSES
from .fields import PID_MAX as PID_MAX
from .fields import RULES as RULES
from .fields import TERMINAL_STATUSES as TERMINAL_STATUSES
from .fields import FieldError as FieldError
from .fields import blank_label as blank_label
from .fields import check_command as check_command
from .fields import check_gpus as check_gpus
from .fields import check_job_id as check_job_id
from .fields import check_label as check_label
from .fields import check_max_attempts as check_max_attempts
from .fields import check_max_restarts as check_max_restarts
from .fields import check_pid as check_pid
from .fields import check_priority as check_priority
from .fields import check_replicas as check_replicas
from .fields import check_shell as check_shell
from .fields import check_start_ticks as check_start_ticks
from .fields import check_timeout as check_timeout
from .fields import check_vram_gb as check_vram_gb
from .fields import parse_field as parse_field
from .fields import parse_job_id as parse_job_id
from .fields import parse_job_ids as parse_job_ids
from .fields import parse_number as parse_number
from .fields import parse_whole as parse_whole
from .fields import printable as printable

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
    from .shapes import OtherGpuJSON as OtherGpuJSON
    from .shapes import ProcessInfoJSON as ProcessInfoJSON
    from .shapes import ProcessJSON as ProcessJSON
    from .shapes import ReplicaJSON as ReplicaJSON
    from .shapes import RestartedJSON as RestartedJSON
    from .shapes import RowUsageJSON as RowUsageJSON
    from .shapes import TimelineEntryJSON as TimelineEntryJSON
    from .shapes import UsageJSON as UsageJSON
    from .shapes import UsageSeriesJSON as UsageSeriesJSON
    from .shapes import UsageSummaryJSON as UsageSummaryJSON
    from .shapes import UserJSON as UserJSON
    from .shapes import UsersJSON as UsersJSON
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


# ACTIVE_STATUSES, TERMINAL_STATUSES and NOT_COMPLETED_STATUSES: see .fields (imported
# above): plain strings, so a reader of JSON can test ``job["status"] in ACTIVE_STATUSES``.

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

JOB_SORTS: tuple[str, ...] = (
    "id",
    "status",
    "priority",
    "name",
    "started",
    "runtime",
    "vram",
    "user",
    "kind",
    "exit",
)
"""What ``GET /v1/jobs?sort=`` takes (``priority``: the spec's, 0 when it has none). Ties
are broken by id: newest first under ``status``, ``name``, ``user`` and ``kind``
ascending, in the sort's direction for the rest (as the TUI's table does)."""

ASCENDING_JOB_SORTS = frozenset({"status", "name", "user", "kind"})
"""The sorts a list starts ascending (A to Z, the status order); the others start with the
biggest (newest, longest, highest priority). The CLI's ``jobs --sort`` and the TUI's table
start each sort the same way."""

ROW_SPEC_KEYS: tuple[str, ...] = (
    "command",
    "shell",
    "gpus",
    "vram_gb",
    "replicas",
    "domain",
    "notify",
    "cluster",
    "priority",
    "project",
)
"""The spec fields a job's *row* (``JobRowJSON``: lists, events) carries: what a table
shows (``cluster``: the Slurm cluster a job runs on), what scripts sort and group by
(``priority``, ``project``: ``jobs --json`` rows had neither), and ``notify`` (stored only when
true: the TUI rings when such a job ends). The whole spec (environment, working
directory, dependencies, policies) comes only with the job itself (``GET /v1/jobs/ID``,
``status``)."""

MAX_PAGE = 10_000
"""The most jobs one ``GET /v1/jobs`` answers; more are read page by page."""

RESTARTING_DOWN = "SIGTERM sent to restart it"
"""A down replica's ``message`` says it once the engine stops it to restart it (down too
long): tables say it is stopping to restart, not only how long it has been down."""

ENDING_DOWN = "SIGTERM sent to end it"
"""... or this, where its policy allows no more restarts (it said "to restart it", and
the next line "not restarted": tester h121)."""

NOT_ACCEPTING = "stopped accepting connections"
"""A down replica's ``message`` says it when its port answered but its server took none of
the connections waiting (a hung server): tables say so too, not "not answering"."""


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
    ADOPT_REFUSED = "adopt_refused"  # a process no one may adopt (init, a kernel thread, ...)
    PREEMPTED = "preempted"  # stopped for a higher-priority job, and not to be requeued
    UNKILLABLE = "unkillable"  # outlived SIGKILL past [engine] release_after: released


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
    IDLE = "job.idle"  # it held its GPUs idle past [policy] idle_after
    EDITED = "job.edited"  # a waiting job's spec was changed (gpulayer-tui edit)
    PREEMPTION = "job.preemption"  # its stop for another job was decided, or called off
    REMOVED = "jobs.removed"  # finished jobs cleaned from the history: data {"ids": [...]}
    REPLICA = "job.replica"
    GPU_SAMPLE = "gpu.sample"
    DOMAIN = "domain.state"
    CONFIG = "engine.config"
    ENGINE = "engine"
    """Reserved: no part of this version publishes it (the event stream's tests use it as
    a kind no client acts on)."""


class ReplicaState(StrEnum):
    """Lifecycle state of one replica of a service (record 000)."""

    PENDING = "pending"  # not launched yet (the service is being placed)
    STARTING = "starting"  # its process runs; its $PORT does not accept connections yet
    UP = "up"  # running (and its endpoint answers, when it has a port)
    DOWN = "down"  # its process runs; its port stopped answering after it was up
    BACKOFF = "backoff"  # exited; restarts at ``next_restart_at``
    STOPPING = "stopping"  # SIGTERM sent, SIGKILL follows after the grace period
    EXITED = "exited"  # ended for good (or stopped with its service)

    @property
    def has_process(self) -> bool:
        """True while a process of this replica may be alive."""
        return self in (
            ReplicaState.STARTING,
            ReplicaState.UP,
            ReplicaState.DOWN,
            ReplicaState.STOPPING,
        )


class Roll(StrEnum):
    """Where a replica is in a rolling restart of its running service (``restart`` of a
    running service: its replicas restarted one at a time, each once the one before it
    is up again). Stored with the replica, so a restarted engine goes on with it."""

    NONE = ""  # not part of a rolling restart (or done with it)
    WAITS = "waits"  # to be restarted when its turn comes
    STOPPING = "stopping"  # the roll stopped it: SIGTERM sent, its start follows its exit
    RESTARTING = "restarting"  # stopped by the roll: its start is due at once
    STARTED = "started"  # started again: the roll goes on once it is up


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
        "RestartedJSON",
        "JobPageJSON",
        "JobRowJSON",
        "DomainJSON",
        "GpuJSON",
        "VramJSON",
        "ProcessJSON",
        "DomainViewJSON",
        "OtherGpuJSON",
        "GpusJSON",
        "HealthJSON",
        "EventJSON",
        "ProcessInfoJSON",
        "ErrorJSON",
        "AdoptRequest",
        "UsageSummaryJSON",
        "UsageSeriesJSON",
        "UsageJSON",
        "RowUsageJSON",
        "UserJSON",
        "UsersJSON",
    )
)


def __getattr__(name: str) -> Any:
    if name in SHAPES:
        from . import shapes

        return getattr(shapes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        if not domains:  # (taken as "find them": a process holding none became a cpu job)
            raise FieldError("domain", "an empty list names no domain; leave it out to find them")
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
        "name": None if name is None else _adopted_name(name),
        "vram_gb": None if vram is None else check_vram_gb(vram),
        "gpu": gpu,
        "domain": domains,
    }


def _adopted_name(name: object) -> str:
    """An adoption's name, held to a submitted job's rule (it skipped the one against
    names that show nothing: tester h166)."""
    label = check_label("name", name)
    blank_label("name", label)
    return label


def with_batch_env(items: list[Any], env: object) -> list[Any]:
    """A batch's specs with its shared ``env`` under each one's own (``POST /v1/jobs``
    with ``{"jobs": [...], "env": {...}}``): a job's own entries win. Sent once instead of
    with each of N jobs, a shell's environment (kilobytes) no longer makes a big batch
    megabytes. Items that are not specs, or whose own ``env`` is not an object, are left
    as they are: the spec's own check names what is wrong with them.

    Raises:
        FieldError: ``env`` is not an object of text values.
    """
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise FieldError("env", "the batch's environment must be an object of NAME: text")
    merged: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            own = item.get("env")
            if own is None:
                item = {**item, "env": env}
            elif isinstance(own, dict):
                item = {**item, "env": {**env, **own}}
        merged.append(item)
    return merged


def error_body(message: str, field: str | None = None) -> ErrorJSON:
    """The JSON of an error answer."""
    body: ErrorJSON = {"error": message}
    if field:
        body["field"] = field
    return body
