"""Statuses, termination reasons, event kinds and the job record.

Everything that names a state is an enum defined here once, and the allowed status
transitions are a table that :func:`check_transition` enforces: an illegal move is a bug
and raises instead of silently corrupting history.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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
        return self in TERMINAL_STATUSES

    @property
    def is_active(self) -> bool:
        """True while the job may still run or is running."""
        return self not in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.ORPHANED}
)

# Allowed moves. `pending` is the instant between the insert and the first verdict; a job
# that fits at once goes straight to `running`.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset(
        {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}),
    # running -> queued is a service being placed again after it lost a domain (record 000);
    # batch and adopted jobs never take it.
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.QUEUED,
            JobStatus.COMPLETED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.ORPHANED,
        }
    ),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
    JobStatus.ORPHANED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """Raised when code tries a status change the transition table forbids."""


def check_transition(job_id: int, old: JobStatus, new: JobStatus) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in the table."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"job {job_id}: illegal transition {old} -> {new}")


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
    """Kinds of events the engine publishes (and, for transitions, stores)."""

    SUBMITTED = "job.submitted"
    TRANSITION = "job.transition"
    REASON = "job.reason"
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


_R = ReplicaState
REPLICA_TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    _R.PENDING: frozenset({_R.STARTING, _R.UP, _R.EXITED}),
    _R.STARTING: frozenset({_R.UP, _R.BACKOFF, _R.STOPPING, _R.EXITED}),
    _R.UP: frozenset({_R.BACKOFF, _R.STOPPING, _R.EXITED}),
    _R.BACKOFF: frozenset({_R.STARTING, _R.UP, _R.EXITED}),
    _R.STOPPING: frozenset({_R.EXITED}),
    # A service placed again after losing a domain starts its replicas afresh.
    _R.EXITED: frozenset({_R.PENDING}),
}


def check_replica_transition(job_id: int, index: int, old: ReplicaState, new: ReplicaState) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in the replica table."""
    if new not in REPLICA_TRANSITIONS[old]:
        raise IllegalTransition(f"job {job_id} replica {index}: illegal transition {old} -> {new}")


@dataclass(slots=True)
class Replica:
    """One copy of a service's command (stored as JSON in the job's row).

    Attributes:
        index: 0-based replica number (its ``$GPULAYER_REPLICA``).
        state: Current replica state.
        domains: Domains it runs on (one per GPU, or ``cpu``).
        gpus: GPU indices it sees.
        pid: Group-leader pid of its current process.
        start_ticks: /proc start time of ``pid``.
        port: The ``$PORT`` of its current process.
        endpoint: ``host:port`` once the port accepted a connection.
        restarts: How often it was restarted (never reset).
        backoff_step: Restarts in a row without a steady run (sets the next delay).
        next_restart_at: When a replica in back-off starts again (epoch seconds).
        started_at: When its current process started.
        last_exit_code: Exit status of its previous process.
        message: Human state (why it is starting, what it exited with).
    """

    index: int
    state: ReplicaState = ReplicaState.PENDING
    domains: list[str] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    pid: int | None = None
    start_ticks: int | None = None
    port: int | None = None
    endpoint: str | None = None
    restarts: int = 0
    backoff_step: int = 0
    next_restart_at: float | None = None
    started_at: float | None = None
    last_exit_code: int | None = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON shape (also what the database stores)."""
        return {
            "index": self.index,
            "state": self.state.value,
            "domains": list(self.domains),
            "gpus": list(self.gpus),
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "port": self.port,
            "endpoint": self.endpoint,
            "restarts": self.restarts,
            "backoff_step": self.backoff_step,
            "next_restart_at": self.next_restart_at,
            "started_at": self.started_at,
            "last_exit_code": self.last_exit_code,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Replica:
        """Inverse of :meth:`to_json`."""
        return cls(
            index=int(data["index"]),
            state=ReplicaState(data["state"]),
            domains=list(data.get("domains", [])),
            gpus=list(data.get("gpus", [])),
            pid=data.get("pid"),
            start_ticks=data.get("start_ticks"),
            port=data.get("port"),
            endpoint=data.get("endpoint"),
            restarts=int(data.get("restarts", 0)),
            backoff_step=int(data.get("backoff_step", 0)),
            next_restart_at=data.get("next_restart_at"),
            started_at=data.get("started_at"),
            last_exit_code=data.get("last_exit_code"),
            message=str(data.get("message", "")),
        )


@dataclass(slots=True)
class Job:
    """The engine's view of one job; mirrors a row of the ``jobs`` table.

    Attributes:
        id: Engine-assigned integer id, never reused within a state dir.
        name: Human label (defaults to the command's basename).
        kind: The workload kind.
        spec: The validated submission as a plain dict (JSON-safe).
        status: Current lifecycle status.
        message: Human reason: why it is queued, or how it ended.
        termination_reason: Machine reason once terminal.
        exit_code: Exit status of the command (128+N for signal N), when known.
        domains: Names of the domains whose slots the job holds (or last held).
        gpus: GPU indices assigned (what ``CUDA_VISIBLE_DEVICES`` got).
        priority: Higher starts first among jobs that fit.
        pid: PID of the job's process-group leader while running.
        start_ticks: /proc start time of ``pid``, to tell it from a recycled PID.
        created_at: Submission time (epoch seconds).
        started_at: When it started running.
        ended_at: When it reached a terminal status.
        owner_uid: Unix uid of the submitter.
        replicas: A service's replicas (empty for other kinds).
        attempt: How often a service was placed (1 on its first start).
    """

    id: int
    name: str
    kind: JobKind
    spec: dict[str, Any]
    status: JobStatus = JobStatus.PENDING
    message: str = ""
    termination_reason: TerminationReason | None = None
    exit_code: int | None = None
    domains: list[str] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    priority: int = 0
    pid: int | None = None
    start_ticks: int | None = None
    created_at: float = field(default_factory=time.time)
    queued_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    owner_uid: int | None = None
    replicas: list[Replica] = field(default_factory=list)
    attempt: int = 0
    kill_at: float | None = None  # while stopping: when SIGKILL follows (not stored)

    def to_json(self, slim: bool = False) -> dict[str, Any]:
        """The record's JSON shape, using the design records' field names.

        Args:
            slim: Leave the spec's ``env`` out (events carry jobs to every subscriber;
                the environment can be large and is only needed by the detail view).
        """
        spec = self.spec
        if slim and "env" in spec:
            spec = {k: v for k, v in spec.items() if k != "env"}
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "kind": self.kind.value,
            "status": self.status.value,
            "termination_reason": (
                self.termination_reason.value if self.termination_reason else None
            ),
            "exit_code": self.exit_code,
            "message": self.message,
            "domains": list(self.domains),
            "gpus": list(self.gpus),
            "priority": self.priority,
            "pid": self.pid,
            "created_at": self.created_at,
            "queued_at": self.queued_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "owner_uid": self.owner_uid,
            "kill_at": self.kill_at,
            "spec": spec,
        }
        if self.kind is JobKind.SERVICE:
            out["replicas"] = [r.to_json() for r in self.replicas]
            out["attempt"] = self.attempt
        return out


@dataclass(frozen=True, slots=True)
class Event:
    """One published engine event.

    Attributes:
        seq: Monotonic sequence number within one engine run.
        at: Epoch seconds.
        kind: What happened.
        job_id: The job concerned, if any.
        data: Kind-specific JSON-safe payload (stored with transitions).
        job: The job's slim JSON at that moment, for subscribers (never stored).
    """

    seq: int
    at: float
    kind: EventKind
    job_id: int | None
    data: dict[str, Any]
    job: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON shape used on the event stream."""
        out = {
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind.value,
            "job_id": self.job_id,
            "data": self.data,
        }
        if self.job is not None:
            out["job"] = self.job
        return out
