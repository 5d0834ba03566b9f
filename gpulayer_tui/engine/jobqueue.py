"""The queue: jobs waiting to run, why they wait, and the scheduling pass.

A waiting job is in exactly one of three places:

* waiting for dependencies (``waiting for job 12``): released or cancelled when they end;
* parked while GPU capacity cannot be read (``GPU capacity unknown: ...``): looked at
  again whenever capacity changes;
* in the run queue (:class:`~.runqueue.RunQueue`), ready to start when it fits.

A pass (:meth:`JobQueue.schedule`) starts what fits, best first, and gives everything else
its reason. Best first means: higher priority, then (issue 18) the user with the least
recent GPU use (fair share), then FIFO. A user past a ``[users.*]`` limit waits with the
limit as its reason. The best job that cannot start keeps (reserves) the domains it will
get first; other jobs use them only if their timeout ends before it can start (backfill),
so a 2-GPU job is not starved by a stream of 1-GPU jobs. Passes run on submit, job end
and every GPU sample, coalesced with ``call_soon``. Over capacity (record 003) is decided
at admission and again whenever the machine's capacity changes: a job that can never run
fails at once instead of waiting.

Everything here runs on the event loop between awaits, so a pass sees one consistent
picture and a multi-GPU job's holds are taken in one step.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from .config import CPU_DOMAIN, SchedulingSettings
from .domain import DomainState
from .errors import SpecError
from .fairness import (
    FairShare,
    Limits,
    Reservation,
    Running,
    frees_for,
    gpu_seconds,
    limit_blocker,
    never_within_limits,
    owner_of,
    pool_reservation,
    reservation,
    user_label,
)
from .gpus import GIB
from .jobbook import ActiveJob, JobBook
from .models import Job, JobKind, JobStatus, TerminationReason
from .runqueue import Group, Key, RunQueue
from .scheduler import Request, Scheduler, Verdict

if TYPE_CHECKING:
    from .domain import Domain
    from .spec import JobSpec

Reason = TerminationReason
_EXIT_UNKNOWN = {
    Reason.ENGINE_LOST: "engine lost: its exit status was not seen",
    Reason.ADOPTED_EXIT_UNOBSERVED: "adopted: its exit status could not be seen",
}
"""Ends that say nothing of how a job exited, as a dependent's message says them."""
RESERVED_MARK = "waiting: "  # how a reason kept off a reservation begins
PREEMPT_HOLD_S = 60.0  # how long jobs stopped for a job wait for it to start first
CLOSED_SPANS_KEPT = 64  # closed spans of the queue remembered for preempt_after
# (dependency id, any_exit, its terminal status or None while it is still active)
ResolvedDep = tuple[int, bool, JobStatus | None]
StartJob = Callable[[ActiveJob, list["Domain"]], None]
LookupJob = Callable[[int], Awaitable[Job | None]]


class Handle(Protocol):
    """A scheduled call that can be called off (``asyncio.Handle``)."""

    def cancel(self) -> None:
        """Do not run it."""


CallSoon = Callable[[Callable[[], None]], Handle]


def _loop_call_soon(callback: Callable[[], None]) -> Handle:
    return asyncio.get_running_loop().call_soon(callback)


class JobQueue:
    """Waiting jobs and the scheduling pass.

    Args:
        book: The active jobs (reasons and ends go through it).
        scheduler: Capacity verdicts and placement.
        lookup: Reads a stored job by id (dependencies on jobs that already ended).
        start: Called with a job and the domains placed for it; it must take the holds
            in the same step (see :func:`~.jobbook.take_holds`).
        call_soon: Schedules the next pass (the event loop's ``call_soon``; tests that
            run without a loop pass their own).
        gate: Why nothing may start now (e.g. the disk is nearly full), or ``None``.
        settings: ``[scheduling]`` (fair share, reservations).
        limits: ``[users.*]`` resolved per uid.
        clock: Wall-clock time (tests pass their own).
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        lookup: LookupJob,
        start: StartJob,
        call_soon: CallSoon = _loop_call_soon,
        gate: Callable[[], str | None] = lambda: None,
        settings: SchedulingSettings | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._book = book
        self._scheduler = scheduler
        self._lookup = lookup
        self._start = start
        self._ready = RunQueue()
        self._capacity_wait: dict[int, ActiveJob] = {}
        self._capacity_block: dict[int, str] = {}
        self._waiting_on: dict[int, dict[int, bool]] = {}  # job -> {dependency: any_exit}
        self._dependents: dict[int, set[int]] = {}
        self._call_soon = call_soon
        self._gate = gate
        self._handle: Handle | None = None
        self.settings = settings or SchedulingSettings()
        self.limits = limits or Limits({})
        self.fair = FairShare(self.settings.fairshare_half_life)
        self._clock = clock
        self._waiting_of: dict[int, int] = {}  # waiting job -> its user
        self._waiting_count: dict[int, int] = {}  # user -> waiting jobs
        self.reservation: Reservation | None = None  # (the last pass's first)
        self.reservations: list[Reservation] = []  # (the last pass's: GPUs, the cpu pool)
        # By user, the best job of theirs a limit held back in the last open pass: which
        # limits, the job, why (a scale-up of that user's service leaves it that room).
        self.held_by_limit: dict[int, tuple[frozenset[str], int, str]] = {}
        # Stops a preemptible job for a better one (wired by the engine to its runner).
        self.preempt: Callable[[ActiveJob, ActiveJob], None] | None = None
        # (a victim, why): the job it was stopped for no longer needs it
        self.call_off: Callable[[ActiveJob, str], None] | None = None
        # Cluster jobs (issue 16): their verdict and their start are the cluster's.
        self.cluster_verdict: Callable[[ActiveJob], Verdict] | None = None
        self.cluster_start: Callable[[ActiveJob], None] | None = None
        # (job, {dependency: any_exit}) -> True if Slurm takes the dependencies over.
        self.cluster_deps: Callable[[ActiveJob, dict[int, bool]], bool] | None = None
        self._preempting: dict[int, set[int]] = {}  # waiting job -> jobs stopped for it
        self._preempted_at: dict[int, float] = {}  # waiting job -> when it stopped them
        # job -> when its last dependency ended: preempt_after counts from there (a job
        # that had waited an hour on its dependencies stopped others the instant it could
        # run, its wait for them taken as a wait for room)
        self._deps_met_at: dict[int, float] = {}
        # When the queue was closed (paused, or the disk below its floor): no wait for
        # room, so preempt_after does not count it (jobs paused for an hour stopped others
        # the instant the queue was resumed). (start, end); the last one open while closed.
        self._closed_spans: list[list[float]] = []
        self._said_stopping: set[int] = set()  # jobs whose reason says whom they stop
        self._cluster_held: dict[int, ActiveJob] = {}  # cluster jobs the gate holds back

    owner_refusal: Callable[[int], str | None] = staticmethod(lambda _uid: None)
    """Why a user's waiting jobs are held because the user may no longer use the engine
    (:class:`.access.OwnerAccess`), or ``None``; the engine sets it with each config."""

    def reconfigure(self, settings: SchedulingSettings, limits: Limits) -> None:
        """A reloaded ``[scheduling]`` / ``[users.*]``. Preemption turned off calls off
        the stops still in their checkpoint lead (they went on, while the job they were
        for no longer said it preempted them, and `why` still did: tester h154)."""
        if settings.preempt_after is None and self.settings.preempt_after is not None:
            for urgent in list(self._preempting):
                self._call_off(urgent, "[scheduling] preempt_after was unset by a reload")
        self.settings, self.limits = settings, limits
        self.fair.half_life = settings.fairshare_half_life
        self.schedule_soon()

    # -- users ----------------------------------------------------------------------------------

    def waiting_of(self, uid: int) -> int:
        """Jobs of ``uid`` waiting to run (dependencies, capacity or the run queue)."""
        return self._waiting_count.get(uid, 0)

    def _wait(self, act: ActiveJob) -> None:
        if act.job.id not in self._waiting_of:
            uid = owner_of(act.job.owner_uid)
            self._waiting_of[act.job.id] = uid
            self._waiting_count[uid] = self._waiting_count.get(uid, 0) + 1

    def _unwait(self, job_id: int) -> None:
        uid = self._waiting_of.pop(job_id, None)
        if uid is not None:
            left = self._waiting_count[uid] - 1
            if left:
                self._waiting_count[uid] = left
            else:
                del self._waiting_count[uid]

    def _group(self, act: ActiveJob) -> Group | None:
        if act.request is None:
            return None
        timeout = act.spec.timeout if act.spec is not None else None
        return (act.request, owner_of(act.job.owner_uid), timeout)

    def running_by_user(self, now: float) -> dict[int, Running]:
        """What each user's running jobs hold now: GPUs, declared VRAM, GPU-seconds."""
        out: dict[int, Running] = {}
        # The retired domains too: a GPU whose domain a reload removed (or the driver no
        # longer lists) still runs the job, and counted nothing: max_gpus was passed, and
        # fair share went down while the jobs ran (tester h59). By the domains' holdings,
        # not by walking every active job: with 1,000 queued that walk (sorted, since the
        # book iterates in id order) was a third of a scheduling pass's CPU.
        seen: set[int] = set()
        for dom in (*self._scheduler.domains.values(), *self._scheduler.retired.values()):
            if not dom.is_gpu or id(dom) in seen:
                continue
            seen.add(id(dom))
            for job_id, holding in dom.holdings.items():
                act = self._book.get(job_id)
                if act is None:
                    continue
                held = out.setdefault(owner_of(act.job.owner_uid), Running())
                held.gpus += 1
                held.vram_bytes += holding.declared_bytes or 0
                started = act.job.started_at
                if started and act.charged_until is not None:
                    started = max(started, act.charged_until)  # (booked up to there)
                held.gpu_seconds += max(0.0, now - started) if started else 0.0
        return out

    def fair_usage(self, uid: int, running: dict[int, Running], now: float) -> float:
        """The user's fair-share usage: recent GPU-seconds (decayed) plus its running
        jobs' so far, divided by its share."""
        return self.recent_use(uid, running, now) / self.limits.share(uid)

    def recent_use(self, uid: int, running: dict[int, Running], now: float) -> float:
        """The user's recent GPU-seconds (decayed) plus its running jobs' so far."""
        held = running.get(uid)
        return self.fair.usage(uid, now) + (held.gpu_seconds if held else 0.0)

    def _fair_row(self, uid: int, running: dict[int, Running], now: float) -> dict[str, object]:
        """A user's fair-share figures: recent GPU-hours as used, its share, and what
        orders users (those hours divided by the share; "GPU-H" showed that quotient)."""
        used = self.recent_use(uid, running, now)
        share = self.limits.share(uid)
        return {
            "user": user_label(uid),
            "gpu_hours": round(used / 3600, 4),  # (2 places said 0 for 9 GPU-seconds)
            "share": share,
            "fair_usage": used / 3600 / share,
        }

    def __len__(self) -> int:
        """Jobs ready to run (not those waiting for dependencies or capacity)."""
        return len(self._ready)

    def capacity_blocked(self) -> dict[int, str]:
        """Queued jobs held for capacity that is not there now (GPUs unreadable, a GPU the
        driver no longer lists), each with why (for ``doctor``)."""
        return dict(self._capacity_block)

    def ready_requests(self) -> list[tuple[int, Request]]:
        """``(job id, request)`` of every job ready to run (for ``doctor``)."""
        return [(key[1], group[0]) for key, group in self._ready.items()]

    # -- admission ----------------------------------------------------------------------------

    async def resolve_dependencies(
        self, spec: JobSpec, *, restoring: bool = False
    ) -> list[ResolvedDep]:
        """``[(dep_id, any_exit, terminal status or None if still active)]``.

        Raises:
            SpecError: A dependency names no job (at submission; a restored job whose
                dependency row vanished treats it as failed: it can never complete).
        """
        return (await self.resolve_all([spec], restoring=restoring))[0]

    async def resolve_all(
        self, specs: list[JobSpec], *, restoring: bool = False
    ) -> list[list[ResolvedDep]]:
        """:meth:`resolve_dependencies` of each of ``specs`` (one submission's), all read
        after the last await, so every answer holds until the caller's next await.

        Raises:
            SpecError: A dependency names no job (``job N of M:`` says whose).
        """
        # Every await first: a dependency seen running may end (and its end be committed,
        # leaving memory) during the lookup of another; the answers are then read in one
        # pass with no await.
        stored: dict[int, Job | None] = {}
        while unknown := {
            dep.job
            for spec in specs
            for dep in spec.dependencies
            if dep.job not in self._book
            and self._book.live(dep.job) is None
            and dep.job not in stored
        }:
            for job_id in sorted(unknown):
                stored[job_id] = await self._lookup(job_id)
        out: list[list[ResolvedDep]] = []
        for index, spec in enumerate(specs):
            resolved: list[ResolvedDep] = []
            for dep in spec.dependencies:
                if dep.job in self._book:
                    waited = self._book.get(dep.job)
                    if (
                        not restoring
                        and not dep.any_exit
                        and waited is not None
                        and waited.spec is not None
                        and waited.spec.is_service
                        and waited.spec.restart_policy == "always"
                        and waited.spec.max_restarts is None  # (else it may end, and 0)
                    ):
                        # (It never completes: the job waited until the service was
                        # stopped, then was cancelled: tester h47.)
                        prefix = f"job {index + 1} of {len(specs)}: " if len(specs) > 1 else ""
                        raise SpecError(
                            f"{prefix}depends_on: job {dep.job} is a service that restarts "
                            "always: it never completes, so this job could only be cancelled "
                            f"(--after-any {dep.job} runs it once the service ends)",
                            "depends_on",
                        )
                    resolved.append((dep.job, dep.any_exit, None))
                    continue
                ending = self._book.live(dep.job)
                if ending is not None:
                    # Ended, the end not committed yet: the database would still say
                    # running (read as "it failed": a dependent cancelled for a parent
                    # that completed).
                    resolved.append((dep.job, dep.any_exit, ending.job.status))
                    continue
                found = stored[dep.job]
                if found is None and not restoring:
                    prefix = f"job {index + 1} of {len(specs)}: " if len(specs) > 1 else ""
                    # (an id below the newest was given once: its row was cleaned away)
                    gone = (
                        " (no longer in the history: cleaned)"
                        if dep.job < self._book.next_id
                        else ""
                    )
                    raise SpecError(f"{prefix}depends_on: no job {dep.job}{gone}", "depends_on")
                status = found.status if found else JobStatus.FAILED
                resolved.append((dep.job, dep.any_exit, status))
            out.append(resolved)
        return out

    def enqueue(self, act: ActiveJob, deps: list[ResolvedDep]) -> None:
        """Decide over capacity and dependencies, then make the job wait or ready."""
        assert act.request is not None
        verdict = self.verdict(act)
        if verdict.possible is False:
            self._book.finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
            return
        job_id = act.job.id
        self._wait(act)
        if verdict.possible is None:
            self._capacity_block[job_id] = verdict.message
        waiting: dict[int, bool] = {}
        for dep_id, any_exit, status in deps:
            if status is None:
                waiting[dep_id] = any_exit
                self._dependents.setdefault(dep_id, set()).add(job_id)
            elif status is not JobStatus.COMPLETED and not any_exit:
                for other in waiting:
                    self._dependents.get(other, set()).discard(job_id)
                self._book.finish(
                    act,
                    JobStatus.CANCELLED,
                    Reason.DEPENDENCY_FAILED,
                    f"dependency job {dep_id} {status.value}",
                )
                return
        if waiting and self._on_cluster(act) and self.cluster_deps is not None:
            # Every job it waits for runs on its cluster, submitted: Slurm's own
            # dependencies hold it there (it is submitted now and starts at once after).
            if self.cluster_deps(act, waiting):
                for dep_id in waiting:
                    self._dependents.get(dep_id, set()).discard(job_id)
                waiting = {}
        if waiting:
            self._waiting_on[job_id] = waiting
            self._set_dependency_reason(act)
        else:
            self.ready(act)

    def _dependency_state(self, job_id: int) -> dict[str, object]:
        """``{"job", "status", "message"}`` of a job another waits for (``None`` status:
        not active here any more, its end on its way)."""
        dep = self._book.get(job_id)
        if dep is None:
            return {"job": job_id, "status": None, "message": ""}
        return {"job": job_id, "status": dep.job.status.value, "message": dep.job.message}

    def _set_dependency_reason(self, act: ActiveJob) -> None:
        ids = sorted(self._waiting_on.get(act.job.id, ()))
        noun = "job" if len(ids) == 1 else "jobs"
        self._book.set_reason(act, f"waiting for {noun} {', '.join(map(str, ids))}")

    def ready(self, act: ActiveJob) -> None:
        """Dependencies are met: queue the job, or park it while capacity is unknown."""
        assert act.request is not None
        self._wait(act)
        block = self._capacity_block.get(act.job.id)
        if block is not None:
            self._capacity_wait[act.job.id] = act
            self._book.set_reason(act, block)
            return
        if self._on_cluster(act):
            assert self.cluster_start is not None
            closed = self._gate()
            if closed is not None:  # (paused, or the disk: it goes once that passes)
                self._cluster_held[act.job.id] = act
                self._book.set_reason(act, closed)
                self.schedule_soon()
                return
            self._unwait(act.job.id)
            self.cluster_start(act)
            return
        group = self._group(act)
        assert group is not None
        self._ready.push(act.key, group)
        self.schedule_soon()

    def _on_cluster(self, act: ActiveJob) -> bool:
        return (
            act.spec is not None
            and act.spec.cluster is not None
            and (self.cluster_start is not None)
        )

    def verdict(self, act: ActiveJob) -> Verdict:
        """Could it ever run: on this machine, or on its cluster's partition."""
        if self._on_cluster(act) and self.cluster_verdict is not None:
            return self.cluster_verdict(act)
        assert act.request is not None
        verdict = self._scheduler.capacity_verdict(act.request)
        if verdict.possible is False:
            return verdict
        past = never_within_limits(
            self.limits, owner_of(act.job.owner_uid), act.request.gpus, act.request.vram_bytes
        )
        return verdict if past is None else Verdict(False, past)

    def room_to_grow(self, act: ActiveJob, request: Request, added: int) -> list[Domain] | str:
        """Where ``added`` more replicas of the running service ``act`` go now (``request``:
        the service's, with them), or why not. Only on what is free now, within its user's
        limits, and not on domains reserved for a job that waits: a scale-up does not jump
        the queue (it would take the GPUs the job at its head waits for)."""
        closed = self.closed()
        if closed is not None:
            return closed
        uid = owner_of(act.job.owner_uid)
        refused = self.owner_refusal(uid)
        if refused is not None:
            return refused
        per_replica = request.gpus // request.replicas
        more = Request(
            per_replica * added, request.vram_bytes, request.pins, request.exclusive, added
        )
        running = self.running_by_user(self._clock())
        why = limit_blocker(
            self.limits, uid, running.get(uid, Running()), more.gpus, more.vram_bytes
        )
        if why is not None:
            return why
        held = self.held_by_limit.get(uid)
        if held is not None and held[0] & _limits_taken(more) and held[1] in self._book:
            # (the room under the limit that job waits for: taken by a scale-up, it waited
            # on, again and again; tester h177)
            return f"job {held[1]} waits for that room under the same limit ({held[2]})"
        # (a GPU replica goes on a domain of its own; CPU replicas take more of the pool)
        own = frozenset(d.name for d in act.holds) if more.gpus else frozenset()
        others = [r for r in self.reservations if r.job_id != act.job.id]
        reserved = frozenset().union(*(r.domains for r in others))
        placed = self._scheduler.place(more, avoid=own | reserved)
        if not isinstance(placed, str) or not reserved:
            return placed
        anywhere = self._scheduler.place(more, avoid=own)
        if isinstance(anywhere, str):
            return anywhere  # (it would not fit even without the reservations)
        taken = {d.name for d in anywhere}
        keeping = next((r for r in others if r.domains & taken), None)
        if keeping is None:
            return placed
        return (
            f"{', '.join(sorted(keeping.domains & taken))} reserved for job {keeping.job_id}, "
            f"which waits for {'it' if len(keeping.domains & taken) == 1 else 'them'}"
        )

    def waits_for(self, job_id: int, deps: list[int]) -> int | None:
        """The first of ``deps`` that waits for ``job_id``, directly or through other
        jobs' dependencies (``job_id`` waiting for it would close a circle), or ``None``."""
        seen: set[int] = set()
        for first in deps:
            todo = [first]
            while todo:
                current = todo.pop()
                if current == job_id:
                    return first
                if current in seen:
                    continue
                seen.add(current)
                todo.extend(self._waiting_on.get(current, ()))
        return None

    def edit(
        self,
        act: ActiveJob,
        spec: JobSpec,
        request: Request,
        deps: list[ResolvedDep] | None = None,
    ) -> None:
        """Give a waiting job a new spec and request (``gpulayer-tui edit``): out of the
        queue under its old shape and priority, back in under the new ones. ``deps`` (when
        its dependencies were edited: checked by the engine, none failed) replace what it
        waits for; otherwise a job still waiting for its dependencies stays waiting."""
        job_id = act.job.id
        self._edited_while_preempting(act, spec, deps)
        in_queue = self._ready.remove(act.key, self._group(act))
        parked = self._capacity_wait.pop(job_id, None) is not None
        held = self._cluster_held.pop(job_id, None) is not None
        self._capacity_block.pop(job_id, None)
        act.spec, act.request = spec, request
        act.job.priority = spec.priority
        if deps is not None:
            was_waiting = self._waiting_on.pop(job_id, None)
            for dep_id in was_waiting or ():
                dependents = self._dependents.get(dep_id)
                if dependents is not None:
                    dependents.discard(job_id)
                    if not dependents:
                        del self._dependents[dep_id]
            waiting = {dep_id: any_exit for dep_id, any_exit, status in deps if status is None}
            if waiting:
                for dep_id in waiting:
                    self._dependents.setdefault(dep_id, set()).add(job_id)
                self._waiting_on[job_id] = waiting
                self._set_dependency_reason(act)
                return
            if was_waiting is not None:
                in_queue = True  # its dependencies are met now: it is ready
        if job_id in self._waiting_on:
            return
        if in_queue or parked or held:
            verdict = self.verdict(act)
            if verdict.possible is None:
                self._capacity_block[job_id] = verdict.message
            self.ready(act)

    def _edited_while_preempting(
        self, act: ActiveJob, spec: JobSpec, deps: list[ResolvedDep] | None
    ) -> None:
        """Jobs being stopped for ``act``, which an edit makes wait for a job or rank no
        higher than them: not needed by it any more. (The edited job was shown waiting
        for itself, "preempted for job N", and the GPUs stayed idle for the hold's
        minute: a victim ahead of it in their group blocked the group.)"""
        victims = self._preempting.get(act.job.id)
        if not victims:
            return
        waits = any(status is None for _dep, _any, status in deps or ())
        below = any(
            (victim := self._book.get(v)) is not None and victim.job.priority >= spec.priority
            for v in victims
        )
        if waits or below:
            why = "waits for another job now" if waits else "no longer outranks it"
            self._call_off(act.job.id, f"the job it was for, job {act.job.id}, {why} (edited)")

    def requeued(self, act: ActiveJob) -> None:
        """A job that ran is back in ``queued`` (preempted, or a service placed again): it
        waits again (its dependencies were met long ago).

        Its request is resolved again first: a live reload may have renamed or removed a
        domain it is pinned to, or shrunk what the machine has, since it started (running
        jobs are never touched by a reload). One that can no longer run fails
        ``over_capacity`` now, as a waiting job does at the reload itself.
        """
        if act.spec is not None:
            request = self._resolve_again(act, self._scheduler.request_for)
            if request is None:
                return
            act.request = request
        verdict = self.verdict(act)
        if verdict.possible is False:
            self._book.finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
            return
        if verdict.possible is None:
            self._capacity_block[act.job.id] = verdict.message
        else:
            self._capacity_block.pop(act.job.id, None)
        self.ready(act)

    def recheck_capacity(self) -> None:
        """Capacity changed: re-decide over capacity for every waiting job."""
        for job_id in list(self._waiting_on):
            # Still waiting for its dependencies: one that can never run fails now too (it
            # was left to wait for ever once they were met), and one whose capacity is
            # unknown now is parked when they are.
            act = self._book.get(job_id)
            if act is None or act.request is None or job_id not in self._waiting_on:
                continue  # (or it ended while this loop ran)
            verdict = self.verdict(act)
            if verdict.possible is False:
                self._book.finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
            elif verdict.possible is None:
                self._capacity_block[job_id] = verdict.message
            else:
                self._capacity_block.pop(job_id, None)
        ready = [self._book.get(key[1]) for key, _ in self._ready.items()]
        ready += list(self._capacity_wait.values())
        for act in ready:
            if act is None or act.request is None or act.job.id not in self._book:
                continue  # (or it ended while this loop ran)
            verdict = self.verdict(act)
            if verdict.possible is False:
                self._book.finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
                continue
            block = verdict.message if verdict.possible is None else None
            if block == self._capacity_block.get(act.job.id):
                continue
            self._ready.remove(act.key, self._group(act))
            self._capacity_wait.pop(act.job.id, None)
            if block is None:
                self._capacity_block.pop(act.job.id, None)
            else:
                self._capacity_block[act.job.id] = block
            self.ready(act)

    def reresolve(self, request_for: Callable[[JobSpec], Request]) -> None:
        """The domains changed (config reload): resolve every waiting job's request again.

        A job whose pins no longer exist fails ``over_capacity`` (record 003: capacity
        changed); running jobs are never touched.
        """
        waiting = [self._book.get(key[1]) for key, _ in self._ready.items()]
        waiting += list(self._capacity_wait.values())
        waiting += [self._book.get(job_id) for job_id in self._waiting_on]
        for act in waiting:
            if act is None or act.spec is None or act.job.id not in self._book:
                continue  # (or it ended while this loop ran: a dependency failed)
            if act.job.status is JobStatus.RUNNING:
                continue
            request = self._resolve_again(act, request_for)
            if request is None:
                continue
            if request != act.request:
                in_queue = self._ready.remove(act.key, self._group(act))
                act.request = request
                group = self._group(act)
                if in_queue and group is not None:
                    self._ready.push(act.key, group)

    def _resolve_again(
        self, act: ActiveJob, request_for: Callable[[JobSpec], Request]
    ) -> Request | None:
        """``act``'s request against today's domains; ``None`` once it failed because it
        can no longer run (a domain it is pinned to was renamed or removed)."""
        assert act.spec is not None
        try:
            return request_for(act.spec)
        except SpecError as err:
            if self._scheduler.may_keep_gone_pins(act.spec):  # (a choice still open)
                return self._scheduler.request_for(act.spec, keep_gone=True)
            scheduler = self._scheduler
            removed = [
                pin
                for pin in act.spec.pinned_domains
                if pin not in scheduler.domains and pin not in scheduler.configured_missing
            ]
            said = str(err)
            if removed and scheduler.missing_named(removed[0]):
                # (a missing GPU's table removed: "jobs queued for it before wait for it",
                # said of jobs failed by that very edit; tester h102)
                said = (
                    f"domain: domain {removed[0]!r} was removed from the configuration (its "
                    "GPU is not found by the driver now)"
                )
            self._book.finish(
                act,
                JobStatus.FAILED,
                Reason.OVER_CAPACITY,
                f"can no longer run after a configuration change: {said}",
            )
            return None

    # -- explaining ---------------------------------------------------------------------------

    def explain(self, job_id: int) -> dict[str, object]:
        """Why a waiting job waits: where it stands, what it waits for, the reservation,
        its user's limits and the fair-share order (``gpulayer-tui why``)."""
        act = self._book.get(job_id)
        if act is None:
            return {"job": job_id, "waiting": False}
        now = self._clock()
        running = self.running_by_user(now)
        uid = owner_of(act.job.owner_uid)
        order = sorted(
            self._ready.items(),
            key=lambda item: (item[0][0], self.fair_usage(item[1][1], running, now), item[0][1]),
        )
        # Its place among the jobs that want what it wants (GPUs, or the cpu pool): a GPU
        # job was told of 90 CPU jobs "ahead" of it, none of them in its way.
        wants_gpus = act.request is not None and act.request.gpus > 0
        ids = [
            key[1]
            for key, group in order
            if act.request is None or (group[0].gpus > 0) == wants_gpus
        ]
        users = {group[1] for _, group in order} | {uid} | set(running)
        own = self.limits.of(uid)
        held = running.get(uid, Running())
        out: dict[str, object] = {
            "job": job_id,
            "status": act.job.status.value,
            "waiting": act.job.status is not JobStatus.RUNNING,
            "reason": act.job.message,
            # (while it stops: when SIGKILL follows, so a reader counts the message's
            # "SIGTERM in 8 s" down as `jobs` does; `why` said 8 s for as long: h154)
            "kill_at": act.job.kill_at,
            "priority": act.job.priority,
            "user": user_label(uid),
            "place": ids.index(job_id) + 1 if job_id in ids else None,
            "ready": len(ids),
            "ahead": ids[: ids.index(job_id)][:10] if job_id in ids else [],
            "waiting_for_jobs": sorted(self._waiting_on.get(job_id, ())),
            # (each with how it is doing: "waits for job 2681" alone took a `status` per
            # link to explain a chain: tester h147)
            "waiting_for": [
                self._dependency_state(dep) for dep in sorted(self._waiting_on.get(job_id, ()))
            ],
            "capacity": self._capacity_block.get(job_id),
            "limits": {
                "max_gpus": own.max_gpus,
                "max_vram_gb": own.max_vram_gb,
                "max_queued": own.max_queued,
                "max_priority": own.max_priority,
                "running_gpus": held.gpus,
                "running_vram_gb": round(held.vram_bytes / GIB, 1),
                "waiting": self.waiting_of(uid),
                "from": self.limits.where(uid),
                # (each limit's own table: one the user's table leaves unset is the
                # default's, and was credited to the user's)
                "tables": {
                    key: self.limits.where(uid, key)
                    for key in ("max_gpus", "max_vram_gb", "max_queued", "max_priority")
                    if getattr(own, key) is not None
                },
            },
            "fair_share": sorted(
                (self._fair_row(u, running, now) for u in users),
                # (The exact usage, not the rounded hours: users that read alike were
                # listed by name while the scheduler took them in their true order.)
                key=lambda row: (row["fair_usage"], row["user"]),
            ),
            "reservation": None,
            "preempting": sorted(self._preempting.get(job_id, ())),
            "held_by": self._holders_in_the_way(act),
            "out_of_service": self._out_of_service(act),
        }
        out["may_preempt"] = self._coming_preemption(act, out["place"], now)
        reserved = self._reservation_of(act)
        if reserved is not None:
            out["reservation"] = {
                "job": reserved.job_id,
                "domains": sorted(reserved.domains),
                "start": reserved.start,
                "when": reserved.when(now),
            }
        if act.spec is not None and act.spec.cluster is not None:
            # Slurm places it: this box's limits, fair share, line and domains are none
            # of its business (its detail said "limits none; running jobs hold 0 GPU
            # slots" and the fair-share order: tester h195).
            out.update(
                cluster=act.spec.cluster,
                limits=None,
                fair_share=[],
                place=None,
                ahead=[],
                held_by=[],
                out_of_service=[],
                may_preempt=None,
            )
        return out

    def _out_of_service(self, act: ActiveJob) -> list[str]:
        """The domains out of service (quarantined, draining) without which ``act`` cannot
        start, each as its blocker says it; none while enough in service could hold it.

        The reason names only the first blocker: a user's limit hid the quarantined GPU
        a pinned job waited for, and raising the limit would not have started it, while
        ``doctor`` named it (tester h148).
        """
        request = act.request
        if request is None:
            return []
        domains = self._scheduler.domains
        if request.pins:
            candidates = [domains[p] for p in request.pins if p in domains]
        elif request.gpus:
            candidates = self._scheduler.gpu_domains
        else:
            candidates = [domains[CPU_DOMAIN]] if CPU_DOMAIN in domains else []
        fit = [d for d in candidates if self._scheduler.could_hold(d, request)]
        usable = [d for d in fit if d.state is DomainState.IN_SERVICE]
        if len(usable) >= max(1, request.gpus):
            return []
        return [
            said
            for d in fit
            if d.state is not DomainState.IN_SERVICE
            and (said := d.blocker(None, exclusive=False)) is not None
        ]

    def _coming_preemption(
        self, act: ActiveJob, place: object, now: float
    ) -> dict[str, object] | None:
        """Whom the first job in line would stop once it has waited ``preempt_after``,
        and in how long (``why`` said "reserved gpu1 for this job until it frees up" of a
        job that would stop the one there in 60 s: tester h47); ``None`` when it would
        stop no one, or stops some already."""
        after, request = self.settings.preempt_after, act.request
        if (
            after is None
            or self.preempt is None
            or request is None
            or request.replicas > 1
            or place != 1
            or act.job.status is not JobStatus.QUEUED
            or act.job.id in self._preempting
            or act.job.id in self._waiting_on
            or self._gate() is not None  # (closed: the wait does not count meanwhile)
            or self.owner_refusal(owner_of(act.job.owner_uid)) is not None  # (held)
        ):
            return None
        plan = self._preemption_plan(act, request, now)
        if not plan:
            return None
        left = max(0.0, after - self._waited_for_room(act, now))
        return {"jobs": sorted(v.job.id for v in plan), "in_s": round(left, 1)}

    def _holders_in_the_way(self, act: ActiveJob) -> list[dict[str, object]]:
        """The jobs holding every slot of the domains a waiting job could use: the row
        says only "all 6 GPU slots busy" (naming jobs there rewrote every waiting row at
        each job end), so `why` names them."""
        if act.request is None or act.job.status is not JobStatus.QUEUED:
            return []
        domains = (
            self._scheduler.candidates(act.request)
            if act.request.gpus > 0
            else [d for d in self._scheduler.domains.values() if not d.is_gpu]
        )
        asked = act.request.vram_bytes
        if asked:
            # (not the GPUs too small for it: "held by g2: job 10" named a 24 GiB card a
            # 30 GiB job can never use: tester h129)
            domains = [d for d in domains if d.capacity_bytes is None or d.capacity_bytes >= asked]
        if act.request.gpus > 0:
            roomy = sum(1 for d in domains if d.free_slots >= act.request.slots_on(d))
            if roomy >= act.request.gpus:
                # Room enough: it waits for something else (a paused queue, a job), and
                # "held by gpu3: job 57" named a job it need not wait for (tester h86).
                return []
        out: list[dict[str, object]] = []
        for dom in domains[:16]:
            # (a 2-replica CPU service waits for 2 slots with 1 free: its holders were left
            # unnamed, as the pool was not full; tester h58)
            if dom.free_slots >= act.request.slots_on(dom) or not dom.holdings:
                continue
            jobs = sorted(dom.holdings)[:20]
            # (a service holds its GPU until stopped: "held by gpu0: job 50" told nothing
            # of a wait with no end: tester h47)
            # (one with a timeout ends by then: "runs until stopped" was said of it: h158)
            services = [
                j
                for j in jobs
                if (held := self._book.get(j)) is not None
                and held.job.kind is JobKind.SERVICE
                and (held.spec is None or held.spec.timeout is None)
            ]
            out.append({"domain": dom.name, "jobs": jobs, "services": services})
        return out

    def _reservation_of(self, act: ActiveJob) -> Reservation | None:
        """The reservation that concerns ``act``: its own, else one over domains it could
        run on (the pass's first was shown for every job, a cpu job told of GPUs kept for
        another, and its own reason contradicted)."""
        for made in self.reservations:
            if made.job_id == act.job.id:
                return made
        request = act.request
        if request is None:
            return None
        if request.gpus:
            could = {d.name for d in self._scheduler.candidates(request)}
        else:
            could = {CPU_DOMAIN}
        return next((r for r in self.reservations if r.domains & could), None)

    def users_view(self) -> list[dict[str, object]]:
        """Every user with recent use, running or waiting jobs: fair-share usage (the
        order within a priority, least first), what runs, what waits, the limits."""
        now = self._clock()
        running = self.running_by_user(now)
        # (jobs of any kind: a user whose running jobs were all CPU jobs was left out)
        jobs_running: dict[int, int] = {}
        for act in self._book:
            if act.job.status is JobStatus.RUNNING:
                owner = owner_of(act.job.owner_uid)
                jobs_running[owner] = jobs_running.get(owner, 0) + 1
        uids = set(running) | set(jobs_running) | set(self._waiting_count) | set(self.fair.users())
        rows: list[dict[str, object]] = []
        for uid in uids:
            held = running.get(uid, Running())
            own = self.limits.of(uid)
            rows.append(
                {
                    **self._fair_row(uid, running, now),
                    "uid": uid,
                    "running_jobs": jobs_running.get(uid, 0),
                    "running_gpus": held.gpus,
                    "running_vram_gb": round(held.vram_bytes / GIB, 1),
                    "waiting": self.waiting_of(uid),
                    "max_gpus": own.max_gpus,
                    "max_vram_gb": own.max_vram_gb,
                    "max_queued": own.max_queued,
                    "max_priority": own.max_priority,
                }
            )
        rows.sort(key=lambda row: (float(row["fair_usage"]), str(row["user"])))  # type: ignore[arg-type]
        return rows

    # -- the pass -----------------------------------------------------------------------------

    def schedule_soon(self) -> None:
        """Run a pass on the next loop iteration (many calls, one pass)."""
        if self._handle is None:
            self._handle = self._call_soon(self.schedule)

    def schedule(self) -> None:
        """One pass: start what fits, best first; give everything else its reason.

        Only the head of each (shape, user, timeout) group is tried (see :mod:`.runqueue`). A group
        found blocked stays blocked for the rest of the pass, since resources only shrink
        during a pass. The best head that cannot start reserves the domains it will get
        first (:func:`.fairness.reservation`); later heads avoid them unless they are sure
        to end before it can start. Rows are rewritten only where a group's reason
        changed, plus jobs that are new to the queue.
        """
        if self._handle is not None:
            self._handle.cancel()  # called directly: this pass covers it
            self._handle = None
        blocked: dict[Group, str] = {}
        closed = self._gate()
        now = self._clock()
        self._note_closed(closed is not None, now)
        if closed is not None:
            blocked = {group: closed for _, group in self._ready.heads()}
        elif self._cluster_held:
            released, self._cluster_held = self._cluster_held, {}
            for waiting in released.values():
                if waiting.job.id in self._book:
                    self.ready(waiting)
        running = self.running_by_user(now) if len(self._ready) else {}
        # At most one reservation of GPUs and one of the cpu pool (each kept for the best
        # job of its kind that cannot start), with the group each is for.
        reserved: list[Reservation] = []
        reserved_groups: dict[int, Group] = {}
        kept_off: set[int] = set()  # reservations (by job) that kept someone off
        tried: set[str] = set()  # kinds ("gpu", "cpu") whose best blocked job was seen
        first_blocked: tuple[int, Group] | None = None  # the best job that cannot start
        first_blocked_cpu: tuple[int, Group] | None = None  # ... of the cpu pool
        first_limited: tuple[int, Group] | None = None  # ... held back by its user's limit
        # Per user, the best job of theirs a limit holds back: which limits (of "gpus",
        # "vram"), the job, the reason. Their later jobs that count against one of those
        # limits wait behind it (they took the room it waited for, again and again).
        limited: dict[int, tuple[frozenset[str], int, str]] = {}
        shapes: dict[Request, str] = {}  # request shapes that fit nowhere now
        progress = closed is None
        while progress:
            progress = False
            for key, group in self._ordered_heads(running, now):
                if group in blocked:
                    continue
                request, uid, _ = group
                refused = self.owner_refusal(uid)
                if refused is not None:
                    blocked[group] = refused  # (held, whatever is free: nothing reserved)
                    continue
                ahead = limited.get(uid)
                if ahead is not None and ahead[0] & _limits_taken(request):
                    _, ahead_id, ahead_why = ahead
                    blocked[group] = (
                        f"waits behind job {ahead_id}, which the same limit holds back "
                        f"({ahead_why})"
                    )
                    continue
                held = running.get(uid, Running())
                why = limit_blocker(self.limits, uid, held, request.gpus, request.vram_bytes)
                if why is not None:
                    blocked[group] = why
                    limited[uid] = (self._limits_past(uid, held, request), key[1], why)
                    if first_limited is None and first_blocked is None and request.gpus:
                        # (its own user's preemptible jobs may make room under the limit)
                        first_limited = (key[1], group)
                    continue
                shape_reason = shapes.get(request)
                if shape_reason is not None:
                    blocked[group] = shape_reason  # (the same shape, another user)
                    continue
                urgent = self._preempted_for(key[1])
                if urgent is not None:
                    # Stopped for a job that has not started yet: it goes first. (Requeued,
                    # the victims took the freed slots back while the GPU still showed
                    # their memory, and the urgent job waited for ever, or stopped them
                    # again and again.)
                    blocked[group] = f"preempted for job {urgent}, which starts first"
                    continue
                placed = self._place(key[1], request, reserved, now, kept_off)
                if isinstance(placed, str) and not placed.startswith(RESERVED_MARK):
                    # Blocked wherever it goes: so is every job of this shape, whoever's
                    # it is, for the rest of the pass (resources only shrink in a pass).
                    shapes[request] = placed
                if isinstance(placed, str):
                    if first_blocked is None and request.gpus:
                        first_blocked = (key[1], group)
                    elif first_blocked_cpu is None and not request.gpus:
                        first_blocked_cpu = (key[1], group)
                    kind = "gpu" if request.gpus else "cpu"
                    if not placed.startswith(RESERVED_MARK) and kind not in tried:
                        tried.add(kind)  # (only the best blocked job of each kind reserves)
                        made = self._reserve(key[1], request, now)
                        if made is not None:
                            reserved.append(made)
                            reserved_groups[made.job_id] = group
                    blocked[group] = placed
                    continue
                self._ready.remove(key, group)
                act = self._book.get(key[1])
                if act is not None:
                    self._unwait(act.job.id)
                    self._call_off(act.job.id, f"the job it was for, job {act.job.id}, has started")
                    self._preempted_at.pop(act.job.id, None)
                    self._start(act, placed)
                    held = running.setdefault(uid, Running())
                    held.gpus += sum(1 for d in placed if d.is_gpu)
                    held.vram_bytes += (request.vram_bytes or 0) * request.gpus
                progress = True
                break  # resources changed: look at the heads again, best first
        self.reservation = reserved[0] if reserved else None
        self.reservations = reserved
        if closed is None:
            self.held_by_limit = limited
        self._recheck_preemptions(closed)
        stopping_for: dict[int, str] = {}  # the job a preemption is for -> its reason's end
        if self.settings.preempt_after is not None:
            # The best job that cannot start; one before it held back by its own user's
            # limit first (it waited for ever while that user's sweeps ran).
            # (The cpu pool's best on its own: its jobs free no GPU, and a GPU job's stop
            # frees no cpu slot. CPU jobs submitted preemptible were never stopped.)
            for candidates in ((first_limited, first_blocked), (first_blocked_cpu,)):
                for best in candidates:
                    if best is None:
                        continue
                    job_id, group = best
                    stopping = self._maybe_preempt(job_id, group[0], now)
                    if stopping:
                        # (said of that job alone: its group's other jobs, of the same
                        # shape, were said to be stopping it too)
                        ids = ", ".join(map(str, sorted(stopping)))
                        noun = "job" if len(stopping) == 1 else "jobs"  # (h154)
                        stopping_for[job_id] = f"; stopping preemptible {noun} {ids} for it"
                        break
        for made in reserved:
            group = reserved_groups[made.job_id]
            if made.job_id in kept_off and group in blocked:
                # Said on the reserved job only when it kept someone off its domains, and
                # on that job alone: on its group's reason, every job of its shape said
                # "reserved for it" beside `why`'s "reserved for job 13" (tester h189).
                stopping_for[made.job_id] = (
                    f"; {', '.join(sorted(made.domains))} reserved for it {made.when(now)}"
                    + stopping_for.get(made.job_id, "")
                )
        for group, reason in blocked.items():
            if self._ready.update_reason(group, reason):
                for key in self._ready.jobs_of(group):
                    if key[1] not in stopping_for:
                        self._reason(key, reason)
        for job_id in self._ready.take_fresh():
            act = self._book.get(job_id)
            fresh = self._group(act) if act is not None else None
            if act is not None and fresh is not None and fresh in blocked:
                self._book.set_reason(act, blocked[fresh] + stopping_for.get(job_id, ""))
        # A job a preemption is for says so; one that no longer is, says its group's reason.
        for job_id in self._said_stopping | stopping_for.keys():
            act = self._book.get(job_id)
            if act is None or act.job.status not in (JobStatus.PENDING, JobStatus.QUEUED):
                continue  # (started this pass: its group's reason is not its own now)
            said = self._group(act)
            if said is not None and said in blocked:
                self._book.set_reason(act, blocked[said] + stopping_for.get(job_id, ""))
        self._said_stopping = set(stopping_for)

    def _ordered_heads(self, running: dict[int, Running], now: float) -> list[tuple[Key, Group]]:
        """Each group's first job: higher priority, then less recent use, then older."""
        heads = self._ready.heads()
        users = {group[1] for _, group in heads}
        if len(users) < 2:
            return heads
        usage = {uid: self.fair_usage(uid, running, now) for uid in users}
        return sorted(heads, key=lambda head: (head[0][0], usage[head[1][1]], head[0][1]))

    def _place(
        self,
        job_id: int,
        request: Request,
        reserved: list[Reservation],
        now: float,
        kept_off: set[int],
    ) -> list[Domain] | str:
        """Where the job goes now, or why not: around the reservations, unless it ends
        before they start (backfill). A reservation that keeps it off adds its job to
        ``kept_off``."""
        others = [r for r in reserved if r.job_id != job_id]
        if not others:
            return self._scheduler.place(request)
        avoid = frozenset().union(*(r.domains for r in others))
        placed = self._scheduler.place(request, avoid=avoid)
        if not isinstance(placed, str):
            return placed
        anywhere = self._scheduler.place(request)
        if isinstance(anywhere, str):
            return anywhere  # it would not fit even without the reservations
        act = self._book.get(job_id)
        timeout = act.spec.timeout if act is not None and act.spec is not None else None
        taken = {d.name for d in anywhere}
        keeping = [r for r in others if r.domains & taken and not r.allows(now, timeout)]
        if not keeping:
            return anywhere
        reserving = keeping[0]
        kept_off.add(reserving.job_id)
        backfill = (
            "a job with a timeout that ends before may use them"
            if reserving.start is not None
            else "it is not known when: the jobs it waits for have no timeout"
        )
        if reserving.back:  # (a service placed again after a loss keeps where it ran)
            backfill = f"it ran there before {', '.join(sorted(reserving.back))} was lost"
        return (
            f"{RESERVED_MARK}{', '.join(sorted(reserving.domains))} reserved for job "
            f"{reserving.job_id} {reserving.when(now)} ({backfill})"
        )

    def _preempted_for(self, job_id: int) -> int | None:
        """The waiting job ``job_id`` was stopped for, if that one has not started yet."""
        if not self._preempting:
            return None
        now = self._clock()
        for urgent, victims in self._preempting.items():
            if job_id in victims and now - self._preempted_at.get(urgent, now) < PREEMPT_HOLD_S:
                act = self._book.get(urgent)
                if act is not None and act.job.status in (JobStatus.PENDING, JobStatus.QUEUED):
                    return urgent
        return None

    def closed(self) -> str | None:
        """Why nothing may start now (paused, the disk below its floor), or ``None``."""
        return self._gate()

    def _limits_past(self, uid: int, held: Running, request: Request) -> frozenset[str]:
        """Which of ``uid``'s limits ``request`` would pass now ("gpus", "vram")."""
        own = self.limits.of(uid)
        past = set()
        if own.max_gpus is not None and held.gpus + request.gpus > own.max_gpus:
            past.add("gpus")
        if (
            own.max_vram_gb is not None
            and request.vram_bytes
            and held.vram_bytes + request.vram_bytes * request.gpus > own.max_vram_gb * GIB
        ):
            past.add("vram")
        return frozenset(past)

    def limit_blocks_again(self, act: ActiveJob) -> str | None:
        """Why its user's limits would hold back ``act``, a running job placed again
        now, or ``None``: what it holds itself is given back as it stops, so it counts
        only against the user's other running work.

        A service moved off a drained domain went down to wait there, every replica
        stopped, when its user was past a limit a reload had lowered (tester h125).
        """
        request = act.request
        if request is None or not request.gpus:
            return None
        uid = owner_of(act.job.owner_uid)
        held = self.running_by_user(time.time()).get(uid, Running())
        own = [d for d in act.holds if d.is_gpu]
        others = Running(
            gpus=max(0, held.gpus - len(own)),
            vram_bytes=max(
                0,
                held.vram_bytes
                - sum(
                    (d.holdings[act.job.id].declared_bytes or 0)
                    for d in own
                    if act.job.id in d.holdings
                ),
            ),
        )
        return limit_blocker(self.limits, uid, others, request.gpus, request.vram_bytes)

    def closed_since(self, at: float) -> None:
        """The queue has been closed since ``at`` (a pause stored by an earlier engine):
        that time is no wait for room either."""
        if not self._closed_spans:
            self._closed_spans.append([at, float("inf")])

    def _note_closed(self, closed: bool, now: float) -> None:
        """Keep the spans in which the queue was closed (see ``_closed_spans``)."""
        spans = self._closed_spans
        open_span = bool(spans) and spans[-1][1] == float("inf")
        if closed and not open_span:
            spans.append([now, float("inf")])
            del spans[:-CLOSED_SPANS_KEPT]
        elif not closed and open_span:
            spans[-1][1] = now

    def _waited_for_room(self, act: ActiveJob, now: float) -> float:
        """How long ``act`` has waited for room: since it was queued or its dependencies
        were met, less the time the queue was closed meanwhile."""
        since = max(act.job.queued_at or now, self._deps_met_at.get(act.job.id, 0.0))
        spans = self._closed_spans
        closed = sum(max(0.0, min(end, now) - max(start, since)) for start, end in spans)
        return now - since - closed

    def _maybe_preempt(self, job_id: int, request: Request, now: float) -> set[int]:
        """Stop lower-priority preemptible jobs for the best waiting job once it has waited
        ``[scheduling] preempt_after``, if stopping them lets it start: lowest priority
        first (a higher one is never stopped while lower ones would make room, even
        several of them), newest first within a priority, and none that a later one made
        unneeded. Returns the jobs being stopped for it."""
        already = self._preempting.get(job_id)
        if already:
            # Still being stopped (running with its stop decided); requeued, it waits for
            # this job (see _preempted_for) and is kept in the set for that.
            still = {
                j
                for j in already
                if (victim := self._book.get(j)) is not None
                and victim.job.status is JobStatus.RUNNING
                and victim.job.stop_reason is not None
            }
            if still:
                return still
            self._preempting[job_id] = {j for j in already if j in self._book}
            back = any(
                (victim := self._book.get(j)) is not None and victim.job.status is JobStatus.RUNNING
                for j in self._preempting[job_id]
            )  # (running again: started ahead of it, its stop done; it may be asked again)
            if not back and now - self._preempted_at.get(job_id, now) < PREEMPT_HOLD_S:
                # Its victims are gone, and held for it while the GPU's reading still shows
                # their memory: no one more is stopped for it meanwhile (the other job of a
                # shared GPU was, the moment the first had exited).
                return set()
        act = self._book.get(job_id)
        after = self.settings.preempt_after
        if act is None or after is None or self.preempt is None or request.replicas > 1:
            return set()
        if self._waited_for_room(act, now) < after:
            return set()
        chosen = self._preemption_plan(act, request, now)
        if not chosen:
            return set()
        for stopped in chosen:
            self.preempt(stopped, act)
        self._preempting[job_id] = {v.job.id for v in chosen}
        self._preempted_at[job_id] = now
        return self._preempting[job_id]

    def _preemption_plan(self, act: ActiveJob, request: Request, now: float) -> list[ActiveJob]:
        """The jobs whose stop would let ``act`` start (see :meth:`_maybe_preempt`), none
        when no such set exists; decides nothing (``why`` asks it too)."""
        scheduler = self._scheduler
        candidates = self._preemption_domains(request)
        uid = owner_of(act.job.owner_uid)
        held = self.running_by_user(now).get(uid, Running())
        # Held back by its own user's limit: only that user's jobs, wherever they run,
        # make room under it (stopping them also frees their GPUs).
        own_limit = (
            limit_blocker(self.limits, uid, held, request.gpus, request.vram_bytes) is not None
        )
        where = scheduler.gpu_domains if own_limit else candidates
        victims: dict[int, ActiveJob] = {}
        for dom in where:
            for holder in dom.holdings:
                other = self._book.get(holder)
                if (
                    other is not None
                    and other.spec is not None
                    and other.spec.preemptible
                    and other.job.priority < act.job.priority
                    and other.job.stop_reason is None
                    and (not own_limit or owner_of(other.job.owner_uid) == uid)
                ):
                    victims[holder] = other
        order = sorted(
            victims.values(), key=lambda v: (v.job.priority, -(v.job.started_at or 0), -v.job.id)
        )

        def enough(gone: list[ActiveJob]) -> bool:
            ids = {v.job.id for v in gone}
            if not self._fits_without(request, candidates, ids):
                return False
            if not own_limit:
                return True
            left = Running(
                gpus=held.gpus - sum(1 for v in gone for d in v.holds if d.is_gpu),
                vram_bytes=held.vram_bytes
                - sum(
                    (v.request.vram_bytes or 0) * sum(1 for d in v.holds if d.is_gpu)
                    for v in gone
                    if v.request is not None
                ),
            )
            return limit_blocker(self.limits, uid, left, request.gpus, request.vram_bytes) is None

        chosen: list[ActiveJob] = []
        for victim in order:
            chosen.append(victim)
            if enough(chosen):
                # The fewest: one taken on the way may not be needed once a later one is
                # (a 10 GiB job stopped beside the 60 GiB one that alone made room).
                for extra in list(chosen[:-1]):
                    if enough([v for v in chosen if v is not extra]):
                        chosen.remove(extra)
                return chosen
        return []

    def _recheck_preemptions(self, closed: str | None) -> None:
        """Call off the stops whose job could not start once they are done: the queue
        closed (paused), a domain it needs drained or quarantined, or the GPUs it was to
        have taken by another job meanwhile. (They went ahead, the victims' work lost, for
        a job that then waited on.) Checked while a victim still runs: once they have all
        ended, the GPUs' readings may still show their memory for a moment."""
        for urgent, victims in list(self._preempting.items()):
            act = self._book.get(urgent)
            if act is None or act.request is None:
                continue
            if not any(
                (victim := self._book.get(j)) is not None and victim.job.status is JobStatus.RUNNING
                for j in victims
            ):
                continue
            if closed is not None:
                why = f"the queue is closed: {closed}"
            elif not self._fits_without(
                act.request, self._preemption_domains(act.request), victims
            ):
                why = f"the job it was for, job {urgent}, could not start once it stopped"
            else:
                continue
            self._call_off(urgent, why)
            self._preempted_at.pop(urgent, None)

    def _preemption_domains(self, request: Request) -> list[Domain]:
        """Where stopping jobs may let ``request`` start: its GPU domains, or (a cpu
        job) the cpu pool."""
        if request.gpus:
            return self._scheduler.candidates(request)
        pool = self._scheduler.domains.get(CPU_DOMAIN)
        return [] if pool is None else [pool]

    @staticmethod
    def _fits_without(request: Request, candidates: list[Domain], gone: set[int]) -> bool:
        """Whether ``request`` would fit once the jobs ``gone`` left their domains."""
        usable = 0
        for dom in candidates:
            if dom.state is not DomainState.IN_SERVICE:
                continue
            slots = request.slots_on(dom)
            if dom.blocker(request.vram_bytes, request.exclusive, slots) is None:
                usable += 1
            elif frees_for(dom, request.vram_bytes, request.exclusive, gone, slots):
                usable += 1  # (one job of a 2-slot domain stopped may be enough)
        return usable >= max(1, request.gpus)

    def _reserve(self, job_id: int, request: Request, now: float) -> Reservation | None:
        if not self.settings.reserve:
            return None
        scheduler = self._scheduler
        if request.gpus == 0:
            slots = request.cpu_slots
            pool = scheduler.domains.get(CPU_DOMAIN)
            if pool is None or (slots <= 1 and not request.exclusive):
                return None  # (one slot: the next one that frees is its anyway)
            return pool_reservation(job_id, pool, slots, request.exclusive, self._ends_at, now)
        candidates = scheduler.candidates(request)
        act = self._book.get(job_id)
        ends_at: Callable[[int], float | None] = self._ends_at
        stopped = self._stopped_for(act, request, now)
        if stopped is not None:
            # The GPUs of the jobs stopped (or to be stopped) for it are the ones it gets:
            # `why` said "reserved gpu0, gpu1, gpu2" beside "preempts jobs 51, 52, 53",
            # which ran on gpu1-3 (tester h55), and gpu0 was kept from others for nothing.
            going, at = stopped
            ends_at = functools.partial(_ending, going, at, self._ends_at)

        # A service's GPU replicas each take their own domains, so it needs
        # ``request.gpus`` distinct domains in all, like one job of that many GPUs.
        return reservation(
            job_id,
            request.gpus,
            request.vram_bytes,
            request.exclusive,
            candidates,
            ends_at,
            now,
            comeback=act.ran_on if act is not None else frozenset(),
        )

    def _stopped_for(
        self, act: ActiveJob | None, request: Request, now: float
    ) -> tuple[set[int], float] | None:
        """The jobs being stopped for ``act``, or that would be once it has waited
        ``preempt_after``, and by when they are gone (as far as is known); ``None``: no
        one is."""
        after = self.settings.preempt_after
        if act is None or after is None or self.preempt is None or request.replicas > 1:
            return None
        going = {
            j
            for j in self._preempting.get(act.job.id, ())
            if (victim := self._book.get(j)) is not None and victim.job.status is JobStatus.RUNNING
        }
        if going:
            kills = [v.job.kill_at for j in going if (v := self._book.get(j)) is not None]
            return going, max((k for k in kills if k is not None), default=now)
        if act.job.id in self._waiting_on or self._gate() is not None:
            return None
        plan = self._preemption_plan(act, request, now)
        if not plan:
            return None
        return {v.job.id for v in plan}, now + max(0.0, after - self._waited_for_room(act, now))

    def _ends_at(self, job_id: int) -> float | None:
        """When a running job will have ended at the latest (its timeout), if known;
        ``math.inf`` for a service with no timeout (it runs until stopped)."""
        act = self._book.get(job_id)
        if act is None or act.spec is None:
            return None
        if act.job.kill_at is not None:
            # Being stopped: gone by its SIGKILL at the latest (past its timeout, it was
            # taken for ended: "reserved gpu0, gpu1 for this job now" was said of GPUs
            # whose jobs had 7 s left before their SIGKILL: tester h129).
            return act.job.kill_at
        if act.spec.timeout is None:
            return math.inf if act.spec.is_service else None
        started = act.job.started_at
        return None if started is None else started + act.spec.timeout

    def _reason(self, key: Key, reason: str) -> None:
        act = self._book.get(key[1])
        if act is not None:
            self._book.set_reason(act, reason)

    def close(self) -> None:
        """Stop: no pass runs any more."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    # -- ends ---------------------------------------------------------------------------------

    def preempting_again(self, urgent: int, victim: int) -> None:
        """After a restart: ``victim`` is being stopped for ``urgent`` (stored with its
        stop), so no other job is stopped for it (one was, its work lost, while the first
        was still in its checkpoint lead), and the stop is called off if ``urgent`` ends."""
        self._preempting.setdefault(urgent, set()).add(victim)
        self._preempted_at.setdefault(urgent, self._clock())

    def _call_off(self, urgent: int, why: str) -> None:
        """The jobs being stopped for ``urgent`` are not needed by it any more."""
        for victim_id in self._preempting.pop(urgent, ()):
            victim = self._book.get(victim_id)
            if victim is not None and self.call_off is not None:
                self.call_off(victim, why)

    def _forget(self, act: ActiveJob) -> None:
        job_id = act.job.id
        self._ready.remove(act.key, self._group(act))
        self._unwait(job_id)
        self._call_off(job_id, f"the job it was for, job {job_id}, is {act.job.status.value}")
        self._cluster_held.pop(job_id, None)
        self._capacity_wait.pop(job_id, None)
        self._capacity_block.pop(job_id, None)
        self._deps_met_at.pop(job_id, None)
        for dep_id in self._waiting_on.pop(job_id, {}):
            dependents = self._dependents.get(dep_id)
            if dependents is not None:
                dependents.discard(job_id)
                if not dependents:
                    del self._dependents[dep_id]

    def charge_run(self, act: ActiveJob) -> None:
        """Book a run's GPU use to its user's fair share: at the job's end, and at a
        preempted job's requeue (its earlier runs were not booked: each start resets
        ``started_at``)."""
        job = act.job
        # (Its GPUs as recorded: a job whose end a restarted engine learns took back no
        # holds, and its run was never booked.)
        gpus = len(job.gpus) or sum(1 for dom in act.holds if dom.is_gpu)
        if gpus and job.started_at is not None:
            ended = job.ended_at or self._clock()
            since = max(job.started_at, act.charged_until or 0.0)
            self.fair.charge(owner_of(job.owner_uid), gpu_seconds(gpus, since, ended), ended)

    def charge_so_far(self, act: ActiveJob) -> None:
        """Book a running job's GPU use up to now, with the GPUs it holds now (a service
        about to be scaled: its run before and after are booked each with its own count;
        booked whole at its end, a scale-down just before made a day on 8 GPUs one on 1)."""
        job = act.job
        gpus = len(job.gpus)
        now = self._clock()
        if gpus and job.started_at is not None:
            since = max(job.started_at, act.charged_until or 0.0)
            self.fair.charge(owner_of(job.owner_uid), gpu_seconds(gpus, since, now), now)
        act.charged_until = now

    def cancelled_with(self, job_id: int) -> list[int]:
        """The waiting jobs cancelled if ``job_id`` ends other than completed: those that
        wait for it to complete (not ``--after-any``), and theirs, on down; sorted ids."""
        found: set[int] = set()
        todo = [job_id]
        while todo:
            current = todo.pop()
            for dependent_id in self._dependents.get(current, ()):
                waiting = self._waiting_on.get(dependent_id)
                if dependent_id in found or waiting is None or waiting.get(current) is not False:
                    continue  # (any_exit: it runs whatever this one's end)
                found.add(dependent_id)
                todo.append(dependent_id)
        return sorted(found)

    def cancel_dependents(self, job_id: int) -> None:
        """Cancel now the waiting jobs that wait for ``job_id`` to complete (not
        ``--after-any``): it is being cancelled, and ends cancelled whatever its exit.
        Theirs follow as each ends (see :meth:`job_ended`)."""
        for dependent_id in sorted(self._dependents.get(job_id, ())):
            dependent = self._book.get(dependent_id)
            waiting = self._waiting_on.get(dependent_id)
            if dependent is None or waiting is None or waiting.get(job_id) is not False:
                continue
            said = f"dependency job {job_id} cancelled"
            self._book.finish(dependent, JobStatus.CANCELLED, Reason.DEPENDENCY_FAILED, said)

    def job_ended(self, act: ActiveJob) -> None:
        """End listener: take the job out of the queue, book its GPU use to its user's
        fair share, and settle its dependents."""
        self._forget(act)
        job = act.job
        self.charge_run(act)
        for dependent_id in sorted(self._dependents.pop(job.id, ())):
            dependent = self._book.get(dependent_id)
            waiting = self._waiting_on.get(dependent_id)
            if dependent is None or waiting is None or job.id not in waiting:
                continue
            any_exit = waiting.pop(job.id)
            if job.status is not JobStatus.COMPLETED and not any_exit:
                said = f"dependency job {job.id} {job.status.value}"
                reason = job.termination_reason
                unknown = _EXIT_UNKNOWN.get(reason) if reason is not None else None
                if unknown is not None:
                    # (read alone, "failed" of a job that exited 0 told the user it had
                    # failed: tester h106)
                    said += f" ({unknown}, so whether it completed is unknown)"
                self._book.finish(dependent, JobStatus.CANCELLED, Reason.DEPENDENCY_FAILED, said)
            elif waiting:
                self._set_dependency_reason(dependent)
            else:
                del self._waiting_on[dependent_id]
                self._deps_met_at[dependent_id] = self._clock()
                self.ready(dependent)
        if act.holds:
            self.schedule_soon()


def _ending(
    going: set[int], at: float, ends_at: Callable[[int], float | None], holder: int
) -> float | None:
    """When ``holder`` ends: at ``at`` if it is being stopped, else as ``ends_at`` says."""
    return at if holder in going else ends_at(holder)


def _limits_taken(request: Request) -> frozenset[str]:
    """Which of its user's limits a job of ``request`` counts against ("gpus": any GPU
    job; "vram": a GPU job that declares its VRAM)."""
    taken = set()
    if request.gpus:
        taken.add("gpus")
        if request.vram_bytes:
            taken.add("vram")
    return frozenset(taken)
