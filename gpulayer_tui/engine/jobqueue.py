"""The queue: jobs waiting to run, why they wait, and the scheduling pass.

A waiting job is in exactly one of three places:

* waiting for dependencies (``waiting for job 12``): released or cancelled when they end;
* parked while GPU capacity cannot be read (``GPU capacity unknown: ...``): looked at
  again whenever capacity changes;
* in the run queue (:class:`~.runqueue.RunQueue`), ready to start when it fits.

A pass (:meth:`JobQueue.schedule`) starts what fits, best first, and gives everything else
its reason. Passes run on submit, job end and every GPU sample, coalesced with
``call_soon``. Over capacity (record 003) is decided at admission and again whenever the
machine's capacity changes: a job that can never run fails at once instead of waiting.

Everything here runs on the event loop between awaits, so a pass sees one consistent
picture and a multi-GPU job's holds are taken in one step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from .errors import SpecError
from .jobbook import ActiveJob, JobBook
from .models import Job, JobStatus, TerminationReason
from .runqueue import Key, RunQueue
from .scheduler import Request, Scheduler

if TYPE_CHECKING:
    from .domain import Domain
    from .spec import JobSpec

Reason = TerminationReason
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
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        lookup: LookupJob,
        start: StartJob,
        call_soon: CallSoon = _loop_call_soon,
        gate: Callable[[], str | None] = lambda: None,
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

    def __len__(self) -> int:
        """Jobs ready to run (not those waiting for dependencies or capacity)."""
        return len(self._ready)

    def ready_requests(self) -> list[tuple[int, Request]]:
        """``(job id, request)`` of every job ready to run (for ``doctor``)."""
        return [(key[1], request) for key, request in self._ready.items()]

    # -- admission ----------------------------------------------------------------------------

    async def resolve_dependencies(
        self, spec: JobSpec, *, restoring: bool = False
    ) -> list[ResolvedDep]:
        """``[(dep_id, any_exit, terminal status or None if still active)]``.

        Raises:
            SpecError: A dependency names no job (at submission; a restored job whose
                dependency row vanished treats it as failed: it can never complete).
        """
        resolved: list[ResolvedDep] = []
        for dep in spec.dependencies:
            if dep.job in self._book:
                resolved.append((dep.job, dep.any_exit, None))
                continue
            stored = await self._lookup(dep.job)
            if stored is None and not restoring:
                raise SpecError(f"depends_on: no job {dep.job}", "depends_on")
            resolved.append((dep.job, dep.any_exit, stored.status if stored else JobStatus.FAILED))
        return resolved

    def enqueue(self, act: ActiveJob, deps: list[ResolvedDep]) -> None:
        """Decide over capacity and dependencies, then make the job wait or ready."""
        assert act.request is not None
        verdict = self._scheduler.capacity_verdict(act.request)
        if verdict.possible is False:
            self._book.finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
            return
        job_id = act.job.id
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
        if waiting:
            self._waiting_on[job_id] = waiting
            self._set_dependency_reason(act)
        else:
            self.ready(act)

    def _set_dependency_reason(self, act: ActiveJob) -> None:
        ids = sorted(self._waiting_on.get(act.job.id, ()))
        noun = "job" if len(ids) == 1 else "jobs"
        self._book.set_reason(act, f"waiting for {noun} {', '.join(map(str, ids))}")

    def ready(self, act: ActiveJob) -> None:
        """Dependencies are met: queue the job, or park it while capacity is unknown."""
        assert act.request is not None
        block = self._capacity_block.get(act.job.id)
        if block is not None:
            self._capacity_wait[act.job.id] = act
            self._book.set_reason(act, block)
            return
        self._ready.push(act.key, act.request)
        self.schedule_soon()

    def recheck_capacity(self) -> None:
        """Capacity changed: re-decide over capacity for every job that is ready to run."""
        ready = [self._book.get(key[1]) for key, _ in self._ready.items()]
        ready += list(self._capacity_wait.values())
        for act in ready:
            if act is None or act.request is None or act.job.id not in self._book:
                continue  # (or it ended while this loop ran)
            verdict = self._scheduler.capacity_verdict(act.request)
            if verdict.possible is False:
                self._book.finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
                continue
            block = verdict.message if verdict.possible is None else None
            if block == self._capacity_block.get(act.job.id):
                continue
            self._ready.remove(act.key, act.request)
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
            try:
                request = request_for(act.spec)
            except SpecError as err:
                self._book.finish(
                    act,
                    JobStatus.FAILED,
                    Reason.OVER_CAPACITY,
                    f"can no longer run after a configuration change: {err}",
                )
                continue
            if request != act.request:
                in_queue = self._ready.remove(act.key, act.request)
                act.request = request
                if in_queue:
                    self._ready.push(act.key, request)

    # -- the pass -----------------------------------------------------------------------------

    def schedule_soon(self) -> None:
        """Run a pass on the next loop iteration (many calls, one pass)."""
        if self._handle is None:
            self._handle = self._call_soon(self.schedule)

    def schedule(self) -> None:
        """One pass: start what fits, best first; give everything else its reason.

        Only the head of each request shape is tried (see :mod:`.runqueue`). A shape
        found blocked stays blocked for the rest of the pass, since resources only shrink
        during a pass. Rows are rewritten only where a shape's reason changed, plus jobs
        that are new to the queue.
        """
        if self._handle is not None:
            self._handle.cancel()  # called directly: this pass covers it
            self._handle = None
        blocked: dict[Request, str] = {}
        closed = self._gate()
        if closed is not None:
            blocked = {request: closed for _, request in self._ready.heads()}
        progress = closed is None
        while progress:
            progress = False
            for key, request in self._ready.heads():
                if request in blocked:
                    continue
                placed = self._scheduler.place(request)
                if isinstance(placed, str):
                    blocked[request] = placed
                    continue
                self._ready.remove(key, request)
                act = self._book.get(key[1])
                if act is not None:
                    self._start(act, placed)
                progress = True
                break  # resources changed: look at the heads again, best first
        for request, reason in blocked.items():
            if self._ready.update_reason(request, reason):
                for key in self._ready.jobs_of(request):
                    self._reason(key, reason)
        for job_id in self._ready.take_fresh():
            act = self._book.get(job_id)
            if act is not None and act.request in blocked:
                self._book.set_reason(act, blocked[act.request])

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

    def _forget(self, act: ActiveJob) -> None:
        job_id = act.job.id
        self._ready.remove(act.key, act.request)
        self._capacity_wait.pop(job_id, None)
        self._capacity_block.pop(job_id, None)
        for dep_id in self._waiting_on.pop(job_id, {}):
            dependents = self._dependents.get(dep_id)
            if dependents is not None:
                dependents.discard(job_id)
                if not dependents:
                    del self._dependents[dep_id]

    def job_ended(self, act: ActiveJob) -> None:
        """End listener: take the job out of the queue and settle its dependents."""
        self._forget(act)
        job = act.job
        for dependent_id in sorted(self._dependents.pop(job.id, ())):
            dependent = self._book.get(dependent_id)
            waiting = self._waiting_on.get(dependent_id)
            if dependent is None or waiting is None or job.id not in waiting:
                continue
            any_exit = waiting.pop(job.id)
            if job.status is not JobStatus.COMPLETED and not any_exit:
                self._book.finish(
                    dependent,
                    JobStatus.CANCELLED,
                    Reason.DEPENDENCY_FAILED,
                    f"dependency job {job.id} {job.status.value}",
                )
            elif waiting:
                self._set_dependency_reason(dependent)
            else:
                del self._waiting_on[dependent_id]
                self.ready(dependent)
        if act.holds:
            self.schedule_soon()
