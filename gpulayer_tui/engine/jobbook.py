"""The job book: every active job, the ids, and the one place a job's status changes.

Only *active* jobs (pending, queued, running) live here; history is read from SQLite on
demand, so nothing here grows with how many jobs ever ran. The book is the only writer of a
job's status: :meth:`JobBook.transition` checks the transition table, stamps the times,
and queues the row and its event for the next group commit; the store publishes the event
once it is durable. A job that becomes terminal is announced to the *end listeners* (the
queue settles its dependents, the scheduler takes back its holds, runners drop their
timers), in the order they were registered.

Parts never keep their own copy of a job's status: they read it here.

Why this module is a little over ~400 lines: ids, membership, transitions, waiters and end
listeners all guard one invariant (a job's status changes only through :meth:`JobBook._change`,
and whoever waits on it is told after the commit); split, each half would reach into the other.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .domain import Domain
from .errors import WriteDeferred
from .models import Event, EventKind, Job, JobKind, JobStatus, TerminationReason, check_transition

log = logging.getLogger(__name__)

LOG_CUT = "log cut: "  # how a job's message starts while it says its log was cut

if TYPE_CHECKING:
    from .events import EventBus
    from .scheduler import Request
    from .spec import JobSpec


class Journal(Protocol):
    """Where job rows and events go (the store's group-commit writer)."""

    failure: str | None
    """Why the last commit failed, while writes fail (``None`` while they work)."""

    def save(
        self,
        job: Job | None,
        events: Iterable[Event] = (),
        wait: bool = False,
        new: bool = False,
    ) -> asyncio.Future[None] | None:
        """Queue ``job``'s row (``new``: its first) and ``events``; with ``wait``, a future
        for the commit."""
        ...

    def after_commit(
        self, callback: Callable[[], None], early: Callable[[], None] | None = None
    ) -> None:
        """Run ``callback`` once everything queued so far is durable (``early``: on the
        writer's thread as the commit returns; see :meth:`.Store.after_commit`)."""
        ...


@dataclass(slots=True, eq=False)
class ActiveJob:
    """The runtime record of one active job (what its database row does not need).

    Attributes:
        job: The job record itself (its status changes only through the book).
        spec: The parsed spec; ``None`` for adopted jobs and rows this version cannot parse.
        request: What it needs, resolved against the domains (``None``: unknown).
        holds: The domains whose slots it holds (set by :func:`take_holds`).
    """

    job: Job
    spec: JobSpec | None
    request: Request | None
    holds: list[Domain] = field(default_factory=list)
    launched: bool = False  # its processes run (set by its runner)
    # Decided while the executor could not start tasks: a submission does not wait for
    # its start (it waited its whole LAUNCH_WAIT_S, then answered anyway).
    held_back: bool = False
    log_note: str = ""  # its log was cut: said again in its final message
    # A service placed again after a domain loss: the GPU domains it ran on. Its
    # reservation counts a quarantined one of them as coming back (its healthy ones went
    # to the next job, and it waited for ever behind that one's service).
    ran_on: frozenset[str] = frozenset()
    # Its run is booked to fair share up to here (a scaled service: see charge_so_far).
    charged_until: float | None = None

    @property
    def key(self) -> tuple[int, int]:
        """Queue order: higher priority first, then FIFO by id."""
        return (-self.job.priority, self.job.id)


class Runner(Protocol):
    """A part that runs one kind of job (batch commands, services, adopted processes)."""

    def stop(self, act: ActiveJob, reason: TerminationReason, message: str) -> None:
        """Stop a running job (cancel or timeout); it ends once its process does."""
        ...

    def reattach(self, act: ActiveJob) -> None:
        """Take back a job that was running when an earlier engine stopped."""
        ...


class ProcessRoots:
    """The process-group leader (or adopted pid) of every running job, with its start time.

    The sampler attributes GPU processes to jobs by walking up to one of these, so the VRAM
    a job's processes hold counts as owned (and a recycled pid is not taken for a job's).
    """

    def __init__(self) -> None:
        self._roots: dict[int, tuple[int, int | None]] = {}

    def add(self, pid: int, job_id: int, ticks: int | None) -> None:
        """``pid`` (started at ``ticks``) is job ``job_id``'s process."""
        self._roots[pid] = (job_id, ticks)

    def drop(self, pid: int | None) -> None:
        """``pid`` no longer runs for a job."""
        if pid is not None:
            self._roots.pop(pid, None)

    def snapshot(self) -> dict[int, tuple[int, int | None]]:
        """A copy for another thread (the sampler reads it off the loop)."""
        return dict(self._roots)


EndListener = Callable[[ActiveJob], None]


def take_holds(act: ActiveJob, domains: list[Domain]) -> None:
    """Give ``act`` the slots (and declared memory) of ``domains``, all in one step."""
    adopted = act.job.kind is JobKind.ADOPTED
    for dom in domains:
        if act.request is None:  # a restored job whose spec can no longer be read
            dom.hold(act.job.id, None, False, adopted=adopted)
        else:
            request = act.request
            slots = request.slots_on(dom)
            dom.hold(act.job.id, request.vram_bytes, request.exclusive, slots, adopted)
    act.holds = list(domains)


def retake_holds(
    act: ActiveJob, domains: Mapping[str, Domain], retired: dict[int, Domain] | None = None
) -> bool:
    """A restored running job takes back the slots of the domains it runs on.

    By name, or by its GPU where the config renamed that GPU's domain while no engine
    ran: matched by name alone, it held nothing, and a second job was started on its
    GPU. A GPU job's names and GPU indices are recorded side by side (``assign``). On a
    GPU the config gives no domain now, it holds its old domain, kept in ``retired`` (by
    GPU index): a later edit that gives the GPU a domain hands that one the holdings
    (without, the GPU came back empty and a second job started on top).

    Returns:
        Whether its domains were renamed (its row is to be saved).
    """
    job = act.job
    renamed: dict[str, str] = {}
    if job.gpus and len(job.gpus) == len(job.domains):
        # The GPU decides, not the name: names swapped between two GPUs while no engine
        # ran booked the job on the other GPU (and a second job onto its own).
        by_gpu = {d.gpu_index: d.name for d in domains.values() if d.gpu_index is not None}
        for name, index in zip(job.domains, job.gpus, strict=True):
            now = domains.get(name)
            if (now is None or now.gpu_index != index) and index in by_gpu:
                renamed[name] = by_gpu[index]
    if renamed:
        said = job.message == f"running on {', '.join(job.domains)}"
        job.domains = [renamed.get(n, n) for n in job.domains]
        if said:  # (it named the old domain ever after)
            job.message = f"running on {', '.join(job.domains)}"
        for replica in job.replicas:
            replica.domains = [renamed.get(n, n) for n in replica.domains]
    holds = [domains[name] for name in job.domains if name in domains]
    if retired is not None and job.gpus and len(job.gpus) == len(job.domains):
        named = {d.gpu_index for d in domains.values()}
        for name, index in zip(job.domains, job.gpus, strict=True):
            if index not in named and name not in domains:
                if index not in retired:
                    retired[index] = Domain(name, index, None, 1)
                holds.append(retired[index])
    take_holds(act, holds)
    return bool(renamed)


def adopted_on(job: Job) -> str:
    """An adopted job's reason while it runs: ``adopted pid 4242 on gpu0, gpu1``."""
    return f"adopted pid {job.pid} on {', '.join(job.domains)}"


def release_holds(act: ActiveJob) -> None:
    """Give back every slot ``act`` holds (``act.holds`` keeps naming the domains)."""
    for dom in act.holds:
        dom.unhold(act.job.id)


class JobBook:
    """Active jobs by id, the id counter, transitions and end listeners.

    Args:
        journal: Where rows and events are queued for commit.
        bus: Makes events (sequence numbers) and tells whether anyone listens.
    """

    def __init__(self, journal: Journal, bus: EventBus) -> None:
        self._journal = journal
        self._bus = bus
        self._active: dict[int, ActiveJob] = {}
        # Jobs that ended in memory but whose terminal row is not committed yet: reads must
        # still see them, or a reader could find the stale "running" row in SQLite.
        self._settling: dict[int, ActiveJob] = {}
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._start_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._last_id = 0
        self._end_listeners: list[EndListener] = []
        self.roots = ProcessRoots()
        self.usage_of: Callable[[int], Mapping[str, Any] | None] = lambda _job_id: None
        """A job's usage figures as a row shows them (``use``), while they are observed:
        events carry them, so a table's columns are true at each change, its end above
        all (they were a page's, loaded once)."""

    # -- ids and membership -------------------------------------------------------------------

    def resume_ids(self, last_id: int) -> None:
        """Continue numbering after ``last_id`` (the largest id ever stored)."""
        self._last_id = max(self._last_id, last_id)

    @property
    def next_id(self) -> int:
        """The id :meth:`create` gives next (the ones after it follow in order)."""
        return self._last_id + 1

    def create(
        self,
        *,
        name: str,
        kind: JobKind,
        spec_json: dict[str, Any],
        spec: JobSpec | None,
        request: Request | None,
        priority: int = 0,
        owner_uid: int | None = None,
        submit_key: str | None = None,
        submit_digest: str | None = None,
        note: str = "",
    ) -> ActiveJob:
        """A new job with the next id, ``pending``, queued for commit with its submission
        (``note``: said in that timeline entry)."""
        self._last_id += 1
        job = Job(
            id=self._last_id,
            name=name,
            kind=kind,
            spec=spec_json,
            priority=priority,
            owner_uid=owner_uid,
            submit_key=submit_key,
            submit_digest=submit_digest,
        )
        act = ActiveJob(job, spec, request)
        self._active[job.id] = act
        submitted = self.event(
            EventKind.SUBMITTED, job, {"status": JobStatus.PENDING.value, "message": note}
        )
        self._journal.save(job, [submitted], new=True)
        return act

    def restore(self, job: Job, spec: JobSpec | None, request: Request | None) -> ActiveJob:
        """Take back an active job stored by an earlier engine run (nothing is written)."""
        act = ActiveJob(job, spec, request)
        if job.message.startswith(LOG_CUT):
            act.log_note = job.message
        self._active[job.id] = act
        self._last_id = max(self._last_id, job.id)
        return act

    def get(self, job_id: int) -> ActiveJob | None:
        """The active job ``job_id``, or ``None``."""
        return self._active.get(job_id)

    def live(self, job_id: int) -> ActiveJob | None:
        """The in-memory record of an active or just-ended (not yet durable) job."""
        return self._active.get(job_id) or self._settling.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._active

    def __len__(self) -> int:
        return len(self._active)

    def __iter__(self) -> Iterator[ActiveJob]:
        """Active jobs in id order (a copy: callers may end jobs while iterating)."""
        return iter([self._active[k] for k in sorted(self._active)])

    # -- changes ------------------------------------------------------------------------------

    def on_end(self, listener: EndListener) -> None:
        """Call ``listener(act)`` whenever a job becomes terminal (after its transition)."""
        self._end_listeners.append(listener)

    def event(
        self, kind: EventKind, job: Job, data: dict[str, Any], at: float | None = None
    ) -> Event:
        """An event about ``job`` carrying its current row for subscribers, stamped
        ``at`` (when it happened, if that was before now) or now."""
        row: dict[str, Any] | None = None
        if self._bus.has_subscribers:
            row = dict(job.to_row())
            use = self.usage_of(job.id)
            if use is not None:
                row["use"] = use
        return self._bus.make(kind, job.id, data, row, at)

    def transition(
        self,
        act: ActiveJob,
        new: JobStatus,
        *,
        reason: TerminationReason | None = None,
        message: str | None = None,
        exit_code: int | None = None,
        started_at: float | None = None,
        at: float | None = None,
    ) -> None:
        """Move a job to a non-terminal status (:meth:`finish` ends jobs).

        Check, stamp, queue for commit; the store publishes the event once it is durable.
        ``started_at``: when a job that runs again first started (a service placed again
        keeps it: its time limit and runtime count from there), else it starts now.
        ``at``: when the change happened, if learnt later (a cluster job seen running at
        a poll); its event is stamped so (timelines are in time order), never later than
        now.

        Raises:
            IllegalTransition: The table does not allow the move (a bug).
        """
        if new.is_terminal:
            raise ValueError(f"job {act.job.id}: use finish() to end a job")
        self._change(
            act,
            new,
            reason=reason,
            message=message,
            exit_code=exit_code,
            started_at=started_at,
            at=at,
        )

    def _change(
        self,
        act: ActiveJob,
        new: JobStatus,
        *,
        reason: TerminationReason | None,
        message: str | None,
        exit_code: int | None,
        ended_at: float | None = None,
        started_at: float | None = None,
        at: float | None = None,
    ) -> None:
        """The one place a status changes."""
        job = act.job
        check_transition(job.id, job.status, new)
        old = job.status
        job.status = new
        now = time.time()
        stamp = now if at is None else min(now, at)
        if message is not None:
            job.message = message
        if new is JobStatus.QUEUED:
            job.queued_at = now
        elif new is JobStatus.RUNNING:
            job.started_at = now if started_at is None else started_at
        elif new.is_terminal:
            # Never before it started, never in the future.
            job.ended_at = now if ended_at is None else min(now, max(ended_at, job.started_at or 0))
            job.termination_reason = reason
            job.exit_code = exit_code
        event = self.event(
            EventKind.TRANSITION,
            job,
            {
                "from": old.value,
                "status": new.value,
                "reason": reason.value if reason else None,
                "message": job.message,
                "exit_code": exit_code,
                "domains": list(job.domains),
            },
            # An end the launcher saw while no engine ran goes in the timeline when it
            # happened (it was stamped with the restart that learnt of it).
            at=job.ended_at if new.is_terminal else stamp,
        )
        if log.isEnabledFor(logging.INFO):  # (`--serve -v` said nothing of jobs: h140)
            log.info(
                "job %d %r: %s -> %s%s%s",
                job.id,
                job.name,
                old.value,
                new.value,
                f" ({reason.value})" if reason else "",
                f": {job.message}" if job.message else "",
            )
        if not new.is_terminal:
            self._journal.save(job, [event])
            return
        self._active.pop(job.id, None)
        self._settling[job.id] = act
        done = self._journal.save(job, [event], wait=True)
        if done is None:
            self._settled(job.id)
            return

        def committed(fut: asyncio.Future[None]) -> None:
            error = None if fut.cancelled() else fut.exception()
            if isinstance(error, WriteDeferred):
                # Writes fail now; the row is kept and retried. Until it is durable the job
                # stays live (reads show its end) and `wait` goes on waiting: a waiter is
                # never told "ended" while the database still says "running".
                self._journal.after_commit(functools.partial(self._settled, job.id))
                return
            self._settled(job.id)  # (committed; or dropped by the store, which says so)

        done.add_done_callback(committed)

    def _settled(self, job_id: int) -> None:
        self._settling.pop(job_id, None)
        for waiters in (self._waiters, self._start_waiters):
            for waiter in waiters.pop(job_id, ()):
                if not waiter.done():
                    waiter.set_result(None)

    def started(self, job_id: int, at: float | None = None) -> None:
        """A running job's processes run now (its runner says so): tell subscribers (its
        pid is durable in the launcher's journal, not a row of ours) and wake waiters.

        Args:
            job_id: The job.
            at: When its runner started it, if known: the event carries that time, since
                the runner's word can arrive after the job has already ended.
        """
        act = self._active.get(job_id)
        if act is not None and self._bus.has_subscribers:
            pid = act.job.pid
            data = {"status": act.job.status.value, "pid": pid}
            self._bus.publish(self.event(EventKind.STARTED, act.job, data, at))
        for waiter in self._start_waiters.pop(job_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def wait_started(self, job_ids: list[int], timeout: float) -> None:
        """Return once each of ``job_ids`` that is running has its processes started (or
        it ended), or after ``timeout``: a submission answers with the real pid."""
        loop = asyncio.get_running_loop()
        waiters = []
        for job_id in job_ids:
            act = self._active.get(job_id)
            if act is None or act.job.status is not JobStatus.RUNNING or act.launched:
                continue
            if act.held_back:
                continue
            waiter = loop.create_future()
            self._start_waiters.setdefault(job_id, []).append(waiter)
            waiters.append(waiter)
        if waiters:
            await asyncio.wait(waiters, timeout=timeout)

    def finish(
        self,
        act: ActiveJob,
        status: JobStatus,
        reason: TerminationReason,
        message: str,
        exit_code: int | None = None,
        ended_at: float | None = None,
    ) -> None:
        """Make a job terminal (checked like every move), then tell every end listener.

        ``ended_at``: when it really ended, if known (a launcher saw the exit while no
        engine ran); otherwise now.
        """
        if not status.is_terminal:
            raise ValueError(f"job {act.job.id}: {status} is not an end")
        if act.log_note:
            message = f"{message}; {act.log_note}" if message else act.log_note
        self._change(
            act, status, reason=reason, message=message, exit_code=exit_code, ended_at=ended_at
        )
        for listener in self._end_listeners:
            listener(act)

    def set_reason(self, act: ActiveJob, reason: str) -> None:
        """Put a waiting job in ``queued`` with ``reason``, or refresh the reason if changed.

        A refresh updates the row's message and publishes a ``job.reason`` event; it is not
        part of the stored timeline.
        """
        job = act.job
        if job.status is JobStatus.PENDING:
            self.transition(act, JobStatus.QUEUED, message=reason)
        elif job.message != reason:
            self.note(act, reason)

    def log_cut(self, act: ActiveJob, message: str) -> None:
        """The job's log was cut to its limit: a stored ``job.log`` event, and the job's
        message until it ends (its final message repeats it)."""
        act.log_note = f"{LOG_CUT}{message}"
        self.record(act, EventKind.LOG, {"message": message})
        if act.job.kind is JobKind.COMMAND:  # a service's message is its replicas' summary
            self.note(act, act.log_note)

    def note(self, act: ActiveJob, message: str) -> None:
        """Change a job's message (e.g. "stopping: SIGTERM sent") and publish it."""
        act.job.message = message
        self._journal.save(act.job, [self.event(EventKind.REASON, act.job, {"message": message})])

    @property
    def write_failure(self) -> str | None:
        """Why the database cannot be written now (``None`` while it can)."""
        return self._journal.failure

    def after_commit(
        self, callback: Callable[[], None], early: Callable[[], None] | None = None
    ) -> None:
        """Run ``callback`` once every change queued so far is durable: a decision (to
        start, signal, stop) is acted on only then. ``early`` runs on the store's writer
        thread the moment the commit returns (see :meth:`.Store.after_commit`)."""
        self._journal.after_commit(callback, early)

    def save(self, act: ActiveJob) -> None:
        """Queue the job's row (a change that is not an event: its pid, its stop)."""
        self._journal.save(act.job)

    def record(
        self, act: ActiveJob, kind: EventKind, data: dict[str, Any], at: float | None = None
    ) -> None:
        """Queue the job's row with an event of ``kind`` (e.g. a replica's change),
        stamped ``at`` (when it happened, if learnt late) or now."""
        self._journal.save(act.job, [self.event(kind, act.job, data, at)])

    async def wait(self, job_id: int, timeout: float | None = None) -> None:
        """Return once ``job_id`` is terminal and durable (at once if it is not live).

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        if self.live(job_id) is None:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, []).append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[job_id]
