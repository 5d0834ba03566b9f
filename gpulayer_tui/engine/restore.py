"""Taking back the active jobs of an earlier engine run (restart, crash, handover).

Waiting jobs are queued again. Running jobs are re-attached by pid + /proc start time
(pidfd opened first); if their process ended meanwhile, the exit status their wrapper
recorded is used, and a job is never left ``running`` without a live process. Adopted jobs
are re-verified the same way, never requeued, and end ``orphaned`` if they vanished.
"""

from __future__ import annotations

import asyncio
import time

from .lifecycle import Reason, ResolvedDep, _Active
from .models import Job, JobKind, JobStatus
from .scheduler import Request
from .services import Services
from .spec import JobSpec, SpecError, parse_spec
from .supervisor import Exit, exit_path, read_exit_file


class Restore(Services):
    """Restart recovery, mixed into the engine."""

    async def _restore(self, jobs: list[Job]) -> None:
        """Take back the active jobs of an earlier engine run.

        Waiting jobs are queued again. Running jobs are re-attached by pid + start time; if
        their process ended meanwhile, the exit status the wrapper recorded is used, and a
        job is never left ``running`` without a live process.
        """
        loop = asyncio.get_running_loop()
        acts: list[_Active] = []
        for job in jobs:
            spec: JobSpec | None = None
            request: Request | None = None
            problem = ""
            if job.kind is JobKind.ADOPTED:
                # Never parsed as a runnable spec: an adopted job's command is a label.
                request = self._adopted_request(job)
            else:
                try:
                    spec = parse_spec(job.spec)
                    request = self.scheduler.request_for(spec)
                except SpecError as err:
                    problem = str(err)
            act = _Active(job, spec, request, loop.create_future())
            self._active[job.id] = act
            acts.append(act)
            if problem and job.status is not JobStatus.RUNNING:
                self._finish(
                    act,
                    JobStatus.FAILED,
                    Reason.OVER_CAPACITY,
                    f"can no longer run on this machine: {problem}",
                )
        for act in acts:
            if act.job.kind is JobKind.ADOPTED and act.job.status is not JobStatus.RUNNING:
                # Interrupted between insert and verdict: never run or requeue it.
                self._finish(
                    act,
                    JobStatus.FAILED,
                    Reason.ADOPT_PID_GONE,
                    "adoption was interrupted by an engine restart; adopt the pid again",
                )
            elif act.job.status in (JobStatus.PENDING, JobStatus.QUEUED) and act.spec:
                deps = await self._resolve_stored_dependencies(act.spec)
                self._enqueue(act, deps)
        for act in acts:
            if act.job.status is JobStatus.RUNNING:
                self._reattach(act)

    async def _resolve_stored_dependencies(self, spec: JobSpec) -> list[ResolvedDep]:
        resolved: list[ResolvedDep] = []
        for dep in spec.dependencies:
            if dep.job in self._active:
                resolved.append((dep.job, dep.any_exit, None))
                continue
            stored = await self.store.get_job(dep.job)
            # A dependency row that vanished can never complete: treat it as failed.
            resolved.append((dep.job, dep.any_exit, stored.status if stored else JobStatus.FAILED))
        return resolved

    def _adopted_request(self, job: Job) -> Request:
        vram = job.spec.get("vram_gb")
        return Request(
            gpus=len([d for d in job.domains if d != "cpu"]),
            vram_bytes=None if vram is None else int(float(vram) * 1024**3),
            pins=tuple(job.domains),
            exclusive=False,
        )

    def _reattach(self, act: _Active) -> None:
        job = act.job
        if job.kind is JobKind.SERVICE:
            self._reattach_service(act)
            return
        if job.kind is JobKind.ADOPTED:
            alive = job.pid is not None and self.supervisor.attach(
                job.id, job.pid, job.start_ticks, adopted=True
            )
            if not alive:
                self._finish(
                    act,
                    JobStatus.ORPHANED,
                    Reason.ADOPTED_EXIT_UNOBSERVED,
                    f"pid {job.pid} exited while no engine was watching; exit status unknown",
                )
                return
        else:
            alive = job.pid is not None and self.supervisor.attach(job.id, job.pid, job.start_ticks)
        if not alive:
            code = read_exit_file(exit_path(self.paths.jobs_dir, job.id))
            if code is None:
                self._finish(
                    act,
                    JobStatus.FAILED,
                    Reason.ENGINE_LOST,
                    "the process ended while no engine was watching; exit status unknown",
                )
            else:
                self._on_exit(job.id, Exit(code, recorded=True))
            return
        assert job.pid is not None
        self._roots[job.pid] = (job.id, job.start_ticks)
        domains = self.scheduler.domains
        self._hold(act, [domains[name] for name in job.domains if name in domains])
        if act.spec is not None and act.spec.timeout is not None and job.started_at:
            self._arm_timeout(act, act.spec.timeout - (time.time() - job.started_at))
