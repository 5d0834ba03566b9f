"""The job lifecycle: admission, scheduling passes, launch, exits, dependencies, cancel.

Everything here runs on the event loop, synchronously between awaits, so a scheduling
pass sees a consistent picture and a multi-GPU job's holds are taken in one step.

Only *active* jobs (pending, queued, running) live in memory; history is read from
SQLite on demand. So the cost of a scheduling decision depends on the queue, never on how
many jobs ever ran.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .domain import Domain
from .models import (
    Event,
    EventKind,
    Job,
    JobKind,
    JobStatus,
    TerminationReason,
    check_transition,
)
from .runqueue import RunQueue
from .scheduler import Request
from .spec import JobSpec, SpecError
from .store import StoreError
from .supervisor import Exit, LaunchError, TaskKey

if TYPE_CHECKING:
    from .config import Config, Paths
    from .events import EventBus
    from .scheduler import Scheduler
    from .services import Cancellable
    from .store import Store
    from .supervisor import Supervisor

log = logging.getLogger(__name__)

Reason = TerminationReason
# (dependency id, any_exit, its terminal status or None while it is still active)
ResolvedDep = tuple[int, bool, JobStatus | None]


class UnknownJob(LookupError):
    """No job has this id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


@dataclass(slots=True)
class _Active:
    """Runtime state of one active job (what the database row does not need)."""

    job: Job
    spec: JobSpec | None
    request: Request | None
    finished: asyncio.Future[None]
    waiting_on: dict[int, bool] = field(default_factory=dict)  # dep id -> any_exit
    capacity_block: str | None = None
    holds: list[Domain] = field(default_factory=list)
    stop_reason: TerminationReason | None = None
    stop_message: str = ""
    # Services only (engine/services.py): how it ends once its replicas are down, why it
    # is being placed again, pending restarts and port probes by replica index.
    end: tuple[JobStatus, TerminationReason, str, int | None] | None = None
    replacing: str | None = None
    restart_timers: dict[int, Cancellable] = field(default_factory=dict)
    probes: dict[int, asyncio.Task[None]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int]:
        """Queue order: higher priority first, then FIFO by id."""
        return (-self.job.priority, self.job.id)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_verdict(code: int | None) -> tuple[JobStatus, TerminationReason, str]:
    """How a process that ended with ``code`` (128+N: signal N) ends its job."""
    if code == 0:
        return JobStatus.COMPLETED, Reason.EXIT_CODE, "exited with code 0"
    if code is None:
        return (
            JobStatus.FAILED,
            Reason.ENGINE_LOST,
            "the process ended but its exit status was not recorded",
        )
    if 128 < code <= 128 + 64:
        name = _signal_name(code - 128)
        return JobStatus.FAILED, Reason.SIGNAL, f"killed by {name} (exit code {code})"
    return JobStatus.FAILED, Reason.EXIT_CODE, f"exited with code {code}"


class Lifecycle:
    """Job lifecycle mixin for :class:`~gpulayer_tui.engine.engine.Engine`."""

    paths: Paths
    config: Config
    bus: EventBus
    store: Store
    scheduler: Scheduler
    supervisor: Supervisor

    def __init__(self) -> None:
        self._active: dict[int, _Active] = {}
        # Jobs that ended in memory but whose terminal row is not committed yet: reads
        # must still see them, or a reader could find the stale "running" row in SQLite.
        self._settling: dict[int, _Active] = {}
        self._queue = RunQueue()
        self._capacity_wait: dict[int, _Active] = {}
        self._dependents: dict[int, set[int]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._roots: dict[int, tuple[int, int | None]] = {}
        self._next_id = 0
        # The engine's environment, copied once: jobs get it plus their spec's env.
        self._base_env = dict(os.environ)
        self._schedule_handle: asyncio.Handle | None = None

    # -- transitions --------------------------------------------------------------------------

    def _transition(
        self,
        act: _Active,
        new: JobStatus,
        *,
        reason: TerminationReason | None = None,
        message: str | None = None,
        exit_code: int | None = None,
    ) -> None:
        """The one place a status changes: check, stamp, queue for commit, then publish."""
        job = act.job
        check_transition(job.id, job.status, new)
        old = job.status
        job.status = new
        now = time.time()
        if message is not None:
            job.message = message
        if new is JobStatus.QUEUED:
            job.queued_at = now
        elif new is JobStatus.RUNNING:
            job.started_at = now
        elif new.is_terminal:
            job.ended_at = now
            job.termination_reason = reason
            job.exit_code = exit_code
        event = self._job_event(
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
        )
        if not new.is_terminal:
            self.store.save(job, [event])
            return
        done = self.store.save(job, [event], wait=True)
        assert done is not None

        def committed(fut: asyncio.Future[None]) -> None:
            if not fut.cancelled():
                fut.exception()  # a failed write is reported by the store; waiters go on
            self._settling.pop(job.id, None)
            if not act.finished.done():
                act.finished.set_result(None)

        self._settling[job.id] = act
        done.add_done_callback(committed)

    def _job_event(self, kind: EventKind, job: Job, data: dict[str, Any]) -> Event:
        """An event about ``job`` carrying its current (slim) JSON for subscribers."""
        snapshot = job.to_json(slim=True) if self.bus.has_subscribers else None
        return self.bus.make(kind, job.id, data, snapshot)

    def _set_reason(self, act: _Active, reason: str) -> None:
        """Put a waiting job in ``queued`` with ``reason``, or refresh the reason if changed."""
        job = act.job
        if job.status is JobStatus.PENDING:
            self._transition(act, JobStatus.QUEUED, message=reason)
        elif job.message != reason:
            job.message = reason
            event = self._job_event(EventKind.REASON, job, {"message": reason})
            self.store.save(job, [event])

    # -- admission ----------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.store.failure:
            raise StoreError(f"the engine refuses new work: {self.store.failure}")

    async def _resolve_dependencies(self, spec: JobSpec) -> list[ResolvedDep]:
        """``[(dep_id, any_exit, terminal status or None if still active)]``.

        Raises:
            SpecError: A dependency names no job.
        """
        resolved: list[ResolvedDep] = []
        for dep in spec.dependencies:
            if dep.job in self._active:
                resolved.append((dep.job, dep.any_exit, None))
                continue
            stored = await self.store.get_job(dep.job)
            if stored is None:
                raise SpecError(f"depends_on: no job {dep.job}")
            resolved.append((dep.job, dep.any_exit, stored.status))
        return resolved

    def _admit(
        self,
        spec: JobSpec,
        request: Request,
        deps: list[ResolvedDep],
        owner_uid: int | None,
    ) -> Job:
        self._next_id += 1
        job = Job(
            id=self._next_id,
            name=spec.default_name(),
            kind=JobKind.SERVICE if spec.is_service else JobKind.COMMAND,
            spec=spec.model_dump(mode="json", exclude_none=True),
            priority=spec.priority,
            owner_uid=owner_uid,
        )
        act = _Active(job, spec, request, asyncio.get_running_loop().create_future())
        self._active[job.id] = act
        submitted = self._job_event(
            EventKind.SUBMITTED, job, {"status": JobStatus.PENDING.value, "message": ""}
        )
        self.store.save(job, [submitted])
        self._enqueue(act, deps)
        return job

    def _enqueue(self, act: _Active, deps: list[ResolvedDep]) -> None:
        """Decide over capacity and dependencies, then make the job wait or ready."""
        assert act.request is not None
        verdict = self.scheduler.capacity_verdict(act.request)
        if verdict.possible is False:
            self._finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
            return
        act.capacity_block = verdict.message if verdict.possible is None else None
        for dep_id, any_exit, status in deps:
            if status is None:
                act.waiting_on[dep_id] = any_exit
                self._dependents.setdefault(dep_id, set()).add(act.job.id)
            elif status is not JobStatus.COMPLETED and not any_exit:
                self._finish(
                    act,
                    JobStatus.CANCELLED,
                    Reason.DEPENDENCY_FAILED,
                    f"dependency job {dep_id} {status.value}",
                )
                return
        if act.waiting_on:
            self._set_dependency_reason(act)
        else:
            self._ready(act)

    def _set_dependency_reason(self, act: _Active) -> None:
        ids = sorted(act.waiting_on)
        noun = "job" if len(ids) == 1 else "jobs"
        self._set_reason(act, f"waiting for {noun} {', '.join(map(str, ids))}")

    def _ready(self, act: _Active) -> None:
        """Dependencies are met: queue the job, or park it while capacity is unknown."""
        assert act.request is not None
        if act.capacity_block is not None:
            self._capacity_wait[act.job.id] = act
            self._set_reason(act, act.capacity_block)
            return
        self._queue.push(act.key, act.request)
        self._schedule_soon()

    def _recheck_capacity(self) -> None:
        """Capacity changed: re-decide over capacity for every job that is ready to run."""
        ready = [self._active[key[1]] for key, _ in self._queue.items()]
        ready += list(self._capacity_wait.values())
        for act in ready:
            assert act.request is not None
            verdict = self.scheduler.capacity_verdict(act.request)
            if verdict.possible is False:
                self._finish(act, JobStatus.FAILED, Reason.OVER_CAPACITY, verdict.message)
                continue
            block = verdict.message if verdict.possible is None else None
            if block == act.capacity_block:
                continue
            self._queue.remove(act.key, act.request)
            self._capacity_wait.pop(act.job.id, None)
            act.capacity_block = block
            self._ready(act)

    # -- scheduling ---------------------------------------------------------------------------

    def _schedule_soon(self) -> None:
        if self._schedule_handle is None:
            self._schedule_handle = asyncio.get_running_loop().call_soon(self._schedule)

    def _schedule(self) -> None:
        """One pass: start what fits, best first; give everything else its reason.

        Only the head of each request shape is tried (see :mod:`.runqueue`). A shape
        found blocked stays blocked for the rest of the pass, since resources only shrink
        during a pass. Rows are rewritten only where a shape's reason changed, plus jobs
        that are new to the queue.
        """
        if self._schedule_handle is not None:
            self._schedule_handle.cancel()  # called directly: this pass covers it
            self._schedule_handle = None
        blocked: dict[Request, str] = {}
        progress = True
        while progress:
            progress = False
            for key, request in self._queue.heads():
                if request in blocked:
                    continue
                placed = self.scheduler.place(request)
                if isinstance(placed, str):
                    blocked[request] = placed
                    continue
                self._queue.remove(key, request)
                self._start(self._active[key[1]], placed)
                progress = True
                break  # resources changed: look at the heads again, best first
        for request, reason in blocked.items():
            if self._queue.update_reason(request, reason):
                for key in self._queue.jobs_of(request):
                    self._set_reason(self._active[key[1]], reason)
        for job_id in self._queue.take_fresh():
            act = self._active.get(job_id)
            if act is not None and act.request in blocked:
                self._set_reason(act, blocked[act.request])

    def _job_env(self, act: _Active, gpus: list[int]) -> dict[str, str]:
        assert act.spec is not None
        env = dict(self._base_env)
        env.update(act.spec.env)
        env["GPULAYER_JOB_ID"] = str(act.job.id)
        # PCI bus order makes CUDA's numbering match NVML's (and ours). CPU jobs see no GPU,
        # so they cannot take GPU memory behind the scheduler's back.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        return env

    def _start(self, act: _Active, domains: list[Domain]) -> None:
        job, spec, request = act.job, act.spec, act.request
        assert spec is not None and request is not None
        self._hold(act, domains)
        job.domains = [d.name for d in domains]
        job.gpus = [d.gpu_index for d in domains if d.gpu_index is not None]
        if job.kind is JobKind.SERVICE:
            self._start_service(act)
            if spec.timeout is not None and act.end is None and job.id not in self._timers:
                self._arm_timeout(act, spec.timeout)
            return
        argv = spec.command if spec.command is not None else ["sh", "-c", spec.shell or ""]
        cwd = spec.cwd or os.path.expanduser("~")
        try:
            pid, ticks = self.supervisor.launch(job.id, argv, cwd, self._job_env(act, job.gpus))
        except LaunchError as err:
            self._finish(act, JobStatus.FAILED, Reason.LAUNCH_FAILED, str(err))
            return
        job.pid, job.start_ticks = pid, ticks
        self._roots[pid] = (job.id, ticks)
        where = ", ".join(job.domains)
        self._transition(act, JobStatus.RUNNING, message=f"running on {where}")
        if spec.timeout is not None:
            self._arm_timeout(act, spec.timeout)

    def _hold(self, act: _Active, domains: list[Domain]) -> None:
        """Take the job's slots (and declared memory) on ``domains``, in one step."""
        request = act.request
        for dom in domains:
            if request is None:  # a restored job whose spec can no longer be read
                dom.hold(act.job.id, None, False)
            else:
                dom.hold(act.job.id, request.vram_bytes, request.exclusive, request.slots_on(dom))
        act.holds = list(domains)

    def _arm_timeout(self, act: _Active, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._timers[act.job.id] = loop.call_later(max(0.0, delay), self._timed_out, act.job.id)

    def _timed_out(self, job_id: int) -> None:
        self._timers.pop(job_id, None)
        act = self._active.get(job_id)
        if act is None or act.job.status is not JobStatus.RUNNING or act.spec is None:
            return
        timeout = act.spec.timeout or 0
        self._stop_running(act, Reason.TIMEOUT, f"timed out after {timeout:g} s")

    # -- stopping and ending ------------------------------------------------------------------

    def _grace_period(self, act: _Active) -> float:
        if act.job.kind is JobKind.ADOPTED:
            return self.config.engine.adopt_grace_period
        return self.config.engine.grace_period

    def _cancel(self, act: _Active, message: str) -> None:
        if act.job.status in (JobStatus.PENDING, JobStatus.QUEUED):
            self._finish(act, JobStatus.CANCELLED, Reason.CANCELLED, message)
        elif act.job.status is JobStatus.RUNNING:
            self._stop_running(act, Reason.CANCELLED, message)

    def _stop_running(self, act: _Active, reason: TerminationReason, message: str) -> None:
        if act.job.kind is JobKind.SERVICE:
            self._stop_service(act, reason, message)
            return
        if act.stop_reason is not None:
            return  # already stopping; the first reason stands
        act.stop_reason, act.stop_message = reason, message
        grace = self._grace_period(act)
        if not self.supervisor.terminate(act.job.id, grace):
            return
        act.job.kill_at = time.time() + grace
        act.job.message = f"stopping ({message}): SIGTERM sent, SIGKILL after {grace:g} s"
        self.store.save(
            act.job, [self._job_event(EventKind.REASON, act.job, {"message": act.job.message})]
        )

    def _on_exit(self, key: TaskKey, exit: Exit) -> None:
        """The supervisor saw a job's (or a service replica's) process end."""
        if isinstance(key, tuple):
            self._on_replica_exit(key[0], key[1], exit)
            return
        job_id = key
        act = self._active.get(job_id)
        if act is None:
            return
        if act.job.pid is not None:
            self._roots.pop(act.job.pid, None)
        status, reason, message = self._exit_verdict(act, exit)
        holds = list(act.holds)
        self._finish(act, status, reason, message, exit.code)
        self._job_ended_on(holds, act.job)

    def _job_ended_on(self, domains: list[Domain], job: Job) -> None:
        """Hook: a launched or adopted job ended on ``domains`` (domain health uses it)."""

    def _exit_verdict(self, act: _Active, exit: Exit) -> tuple[JobStatus, TerminationReason, str]:
        code = exit.code
        act.job.kill_at = None
        if act.stop_reason is Reason.CANCELLED:
            return JobStatus.CANCELLED, Reason.CANCELLED, act.stop_message
        if act.job.kind is JobKind.ADOPTED:
            # Only a parent can wait() for a process: the exit status is unknowable, so
            # the job is never "completed" (record 004).
            return (
                JobStatus.ORPHANED,
                Reason.ADOPTED_EXIT_UNOBSERVED,
                f"pid {act.job.pid} exited; its exit status cannot be observed "
                "(it was not started by gpulayer-tui)",
            )
        if act.stop_reason is Reason.TIMEOUT:
            return JobStatus.FAILED, Reason.TIMEOUT, act.stop_message
        return exit_verdict(code)

    def _finish(
        self,
        act: _Active,
        status: JobStatus,
        reason: TerminationReason,
        message: str,
        exit_code: int | None = None,
    ) -> None:
        """Make a job terminal: free its holds, record it, then settle its dependents."""
        job = act.job
        for dom in act.holds:
            dom.release(job.id)
        if job.kind is JobKind.SERVICE:
            self._drop_service_runtime(act)
        timer = self._timers.pop(job.id, None)
        if timer is not None:
            timer.cancel()
        if job.status is not JobStatus.RUNNING:
            self._queue.remove(act.key, act.request)
            self._capacity_wait.pop(job.id, None)
        self._active.pop(job.id, None)
        self._transition(act, status, reason=reason, message=message, exit_code=exit_code)
        for dependent_id in sorted(self._dependents.pop(job.id, ())):
            dependent = self._active.get(dependent_id)
            if dependent is None or job.id not in dependent.waiting_on:
                continue
            any_exit = dependent.waiting_on.pop(job.id)
            if status is not JobStatus.COMPLETED and not any_exit:
                self._finish(
                    dependent,
                    JobStatus.CANCELLED,
                    Reason.DEPENDENCY_FAILED,
                    f"dependency job {job.id} {status.value}",
                )
            elif dependent.waiting_on:
                self._set_dependency_reason(dependent)
            else:
                self._ready(dependent)
        if act.holds:
            self._schedule_soon()

    # -- services (engine/services.py implements these) ---------------------------------------

    def _start_service(self, act: _Active) -> None:
        raise NotImplementedError

    def _stop_service(self, act: _Active, reason: TerminationReason, message: str) -> None:
        raise NotImplementedError

    def _on_replica_exit(self, job_id: int, index: int, exit: Exit) -> None:
        raise NotImplementedError

    def _drop_service_runtime(self, act: _Active) -> None:
        raise NotImplementedError

    def _live(self, job_id: int) -> _Active | None:
        """The in-memory record of an active or just-ended (not yet durable) job."""
        return self._active.get(job_id) or self._settling.get(job_id)

    def _roots_snapshot(self) -> dict[int, tuple[int, int | None]]:
        return dict(self._roots)
