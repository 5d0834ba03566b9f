"""The engine's records and the transition tables of its state machines.

The names themselves (statuses, reasons, kinds, event kinds, replica and domain states)
are the wire contract's (:mod:`gpulayer_tui.wire`) and re-exported here. This module says
how they may change: each state machine is a table that a ``check_*`` function enforces,
so an illegal move is a bug that raises instead of silently corrupting history.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, cast

from ..wire import (
    ACTIVE_STATUSES,
    JOB_SORTS,
    MAX_PAGE,
    ROW_SPEC_KEYS,
    TERMINAL_STATUSES,
    DomainHealth,
    DomainState,
    EventKind,
    JobJSON,
    JobKind,
    JobRowJSON,
    JobStatus,
    ReplicaJSON,
    ReplicaState,
    Roll,
    TerminationReason,
)

__all__ = [
    "ACTIVE_STATUSES",
    "DOMAIN_TRANSITIONS",
    "REPLICA_TRANSITIONS",
    "ROW_SPEC_KEYS",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "DomainHealth",
    "DomainState",
    "Event",
    "EventKind",
    "IllegalTransition",
    "Job",
    "JobKind",
    "JobQuery",
    "JobStatus",
    "Replica",
    "ReplicaState",
    "Roll",
    "TerminationReason",
    "check_domain_transition",
    "check_replica_transition",
    "check_transition",
]

# Allowed moves. `pending` is the instant between the insert and the first verdict; a job
# that fits at once goes straight to `running`.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset(
        {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}),
    # running -> queued is a service being placed again after it lost a domain (record 000),
    # or a preemptible batch job preempted and requeued (`requeue`); adopted jobs never
    # take it.
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


_R = ReplicaState
REPLICA_TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    _R.PENDING: frozenset({_R.STARTING, _R.UP, _R.EXITED}),
    _R.STARTING: frozenset({_R.UP, _R.BACKOFF, _R.STOPPING, _R.EXITED}),
    _R.UP: frozenset({_R.DOWN, _R.BACKOFF, _R.STOPPING, _R.EXITED}),
    # Up, then its port stopped answering: up again when it answers, restarted (through
    # back-off) when it stays down too long.
    _R.DOWN: frozenset({_R.UP, _R.BACKOFF, _R.STOPPING, _R.EXITED}),
    _R.BACKOFF: frozenset({_R.STARTING, _R.UP, _R.EXITED}),
    # Stopped by a rolling restart, it starts again at once (through a back-off of none).
    _R.STOPPING: frozenset({_R.EXITED, _R.BACKOFF}),
    # A service placed again after losing a domain starts its replicas afresh.
    _R.EXITED: frozenset({_R.PENDING}),
}


def check_replica_transition(job_id: int, index: int, old: ReplicaState, new: ReplicaState) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in the replica table."""
    if new not in REPLICA_TRANSITIONS[old]:
        raise IllegalTransition(f"job {job_id} replica {index}: illegal transition {old} -> {new}")


_D = DomainState
# A domain's service state (record 002). Drain is the operator's switch for a healthy domain;
# quarantine comes from its health (or a lost GPU) and only an explicit release lifts it.
DOMAIN_TRANSITIONS: dict[DomainState, frozenset[DomainState]] = {
    _D.IN_SERVICE: frozenset({_D.DRAINING, _D.QUARANTINED}),
    _D.DRAINING: frozenset({_D.IN_SERVICE, _D.QUARANTINED}),
    # (back to draining: a release lifts the quarantine, not an operator's drain under it)
    _D.QUARANTINED: frozenset({_D.IN_SERVICE, _D.DRAINING}),
}


def check_domain_transition(name: str, old: DomainState, new: DomainState) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in the domain table."""
    if new not in DOMAIN_TRANSITIONS[old]:
        raise IllegalTransition(f"domain {name}: illegal transition {old} -> {new}")


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
        down_since: When its port stopped answering (the first failed check), while down.
        last_exit_code: Exit status of its previous process.
        message: Human state (why it is starting, what it exited with).
        launches: How often a start was decided (numbers each start for the executor, so a
            start decided before a crash is carried out once, never twice).
        roll: Its place in a rolling restart of the service (:class:`Roll`).
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
    launches: int = 0
    down_since: float | None = None
    roll: Roll = Roll.NONE

    def to_json(self) -> ReplicaJSON:
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
            "launches": self.launches,
            "down_since": self.down_since,
            "roll": self.roll.value,
        }

    @classmethod
    def from_json(cls, data: ReplicaJSON | dict[str, Any]) -> Replica:
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
            launches=int(data.get("launches", 0)),
            down_since=data.get("down_since"),
            # (a place this version does not know, from a newer one: no roll)
            roll=next((r for r in Roll if r.value == data.get("roll")), Roll.NONE),
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
        stop_reason: Why it is being stopped (cancel, timeout), once that is decided: it
            decides the job's end whatever the exit code, also after a restart.
        stop_message: The words of that stop.
        kill_at: While stopping: when SIGKILL follows (epoch seconds).
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
    stop_reason: TerminationReason | None = None
    stop_message: str = ""
    kill_at: float | None = None
    submit_key: str | None = None  # the submission's idempotency key (never shown)
    submit_digest: str | None = None  # what that submission asked for (a key reused for
    # another request is refused: see Admission.submit_many)
    cluster_job_id: str | None = None  # its id on its Slurm cluster (issue 16)
    # A service's replicas a scale-down removed, by index: (runs, restarts, back-off step).
    # One added back goes on from there: its log continues, each run keeps a launcher key
    # of its own, and it goes on counting toward max_restarts (a crash-looping replica
    # scaled away and back started over: h109; and again after an engine restart: h116).
    removed_replicas: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def replicas_json(self) -> str | None:
        """The ``replicas`` column: each replica, then each removed one's counts (marked
        ``"removed"``; :meth:`replicas_from_json` splits them again)."""
        if not self.replicas and not self.removed_replicas:
            return None
        kept: list[Any] = [r.to_json() for r in self.replicas]
        for index, (runs, restarts, step) in sorted(self.removed_replicas.items()):
            kept.append(
                {
                    "index": index,
                    "removed": True,
                    "launches": runs,
                    "restarts": restarts,
                    "backoff_step": step,
                }
            )
        return json.dumps(kept)

    def replicas_from_json(self, text: str | None) -> None:
        """Take the ``replicas`` column back (see :meth:`replicas_json`)."""
        self.replicas, self.removed_replicas = [], {}
        for item in json.loads(text) if text else ():
            if item.get("removed"):
                self.removed_replicas[int(item["index"])] = (
                    int(item.get("launches", 0)),
                    int(item.get("restarts", 0)),
                    int(item.get("backoff_step", 0)),
                )
            else:
                self.replicas.append(Replica.from_json(item))

    def to_row(self) -> JobRowJSON:
        """The job's *row* (lists, events): what a table shows, the spec cut to
        :data:`ROW_SPEC_KEYS`, times to the millisecond, ``kill_at`` only while set. The
        environment alone can be kilobytes, and only the job's own view needs the whole
        spec; a listed row is ~300 bytes."""
        spec = self.spec
        out = self._json_base(
            {k: spec[k] for k in ROW_SPEC_KEYS if spec.get(k) is not None},
            _ms(self.started_at),
            _ms(self.ended_at),
            round(self.created_at, 3),
        )
        if self.kill_at is not None:
            out["kill_at"] = _ms(self.kill_at)
        return out

    def to_json(self) -> JobJSON:
        """The whole record's JSON shape, using the design records' field names."""
        out = cast(
            JobJSON, self._json_base(self.spec, self.started_at, self.ended_at, self.created_at)
        )
        out["priority"] = self.priority
        out["queued_at"] = self.queued_at
        out["kill_at"] = self.kill_at
        out["stop_reason"] = self.stop_reason.value if self.stop_reason else None
        if self.kind is JobKind.SERVICE or self.attempt:
            out["attempt"] = self.attempt
        cluster = self.spec.get("cluster")
        if cluster is not None:
            out["cluster"] = cluster
            out["cluster_job_id"] = self.cluster_job_id
        return out

    def _json_base(
        self,
        spec: dict[str, Any],
        started_at: float | None,
        ended_at: float | None,
        created_at: float,
    ) -> JobRowJSON:
        """What a row and the whole job share."""
        out: JobRowJSON = {
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
            "pid": self.pid,
            "started_at": started_at,
            "ended_at": ended_at,
            "spec": spec,
            # (kept as None for the engine's own user; said as that uid on the wire)
            "owner_uid": self.owner_uid if self.owner_uid is not None else os.geteuid(),
            "created_at": created_at,
        }
        if self.kind is JobKind.SERVICE:
            out["replicas"] = [r.to_json() for r in self.replicas]
        return out


def _ms(at: float | None) -> float | None:
    """A time to the millisecond (a row's times: a table shows seconds, and full
    precision would make every listed row ~8 bytes longer)."""
    return None if at is None else round(at, 3)


@dataclass(frozen=True, slots=True)
class Event:
    """One published engine event.

    Attributes:
        seq: Sequence number within one engine run, given when published: readers get
            1, 2, 3, ... in order, with no gaps (a gap means events were missed).
        at: Epoch seconds.
        kind: What happened.
        job_id: The job concerned, if any.
        data: Kind-specific JSON-safe payload (stored with transitions).
        job: The job's row at that moment, for subscribers (never stored).
    """

    seq: int
    at: float
    kind: EventKind
    job_id: int | None
    data: dict[str, Any]
    job: dict[str, Any] | None = None
    _line: bytes | None = field(default=None, compare=False, repr=False)
    row: int | None = field(default=None, compare=False, repr=False)
    """Its row in the ``events`` table, for a stored one (given when it is queued)."""

    def line(self) -> bytes:
        """The event as one NDJSON line, encoded once however many subscribers write it
        (each encoded it again: with many streams, a burst cost its events times them)."""
        if self._line is None:
            object.__setattr__(self, "_line", json.dumps(self.to_json()).encode() + b"\n")
        assert self._line is not None
        return self._line

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


@dataclass(frozen=True, slots=True)
class JobQuery:
    """Which jobs a list asks for, in what order, and which page.

    Paging by id is by key (``before``/``after``: stable while jobs are added); pages of
    another order are by ``offset``.

    Attributes:
        statuses: Only these statuses (empty: all).
        text: Only jobs whose id, name, command, message, status or a domain name
            contains this (any case).
        sort: One of :data:`JOB_SORTS`.
        descending: The sort's direction.
        before: Only ids below this (newest first); ``sort="id"`` only.
        after: Only ids above this, oldest first whatever ``descending`` says (to walk
            forward from a known job); ``sort="id"`` only.
        offset: Skip this many (other sorts).
        limit: At most this many (at most :data:`MAX_PAGE`).
        since: Only jobs submitted at or after this time (epoch seconds).
    """

    statuses: tuple[str, ...] = ()
    text: str = ""
    sort: str = "id"
    descending: bool = True
    before: int | None = None
    after: int | None = None
    offset: int = 0
    limit: int = 500
    since: float | None = None

    def check(self) -> None:
        """Refuse a query that names something unknown or mixes ways of paging.

        Raises:
            ValueError: With a message naming the field at fault first (``status: ...``).
        """
        known = ", ".join(s.value for s in JobStatus)
        for status in self.statuses:
            if status not in JobStatus.__members__.values():
                raise ValueError(f"status: unknown status '{status}' (one of: {known})")
        if self.sort not in JOB_SORTS:
            raise ValueError(f"sort: unknown sort '{self.sort}' (one of: {', '.join(JOB_SORTS)})")
        if self.before is not None and self.after is not None:
            raise ValueError("after: give before or after, not both")
        if (self.before is not None or self.after is not None) and self.sort != "id":
            raise ValueError("sort: before/after page by id; page other sorts with offset")
        if (self.before is not None or self.after is not None) and self.offset:
            raise ValueError("offset: page by before/after or by offset, not both")
        if not 1 <= self.limit <= MAX_PAGE:
            raise ValueError(f"limit: must be 1-{MAX_PAGE} (read more page by page)")
        if len(self.text) > 1000:
            raise ValueError("q: the text filter is over 1000 characters")
        try:
            self.text.encode()
        except UnicodeEncodeError:
            # (it reached the database, which answered 503 "the database failed")
            raise ValueError("q: the text filter is not UTF-8 text") from None


@dataclass(frozen=True, slots=True)
class KnownGpu:
    """A GPU that had a domain here (the ``known_gpus`` table), as last seen.

    Attributes:
        name: Its last domain's name.
        index: Its last index (the driver's numbering then), if known.
        memory: What jobs could have of its memory, if known.
    """

    name: str
    index: int | None = None
    memory: int | None = None
