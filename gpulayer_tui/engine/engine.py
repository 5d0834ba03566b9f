"""The engine facade: submit, cancel, list, wait, GPUs, events; and its lifecycle.

One :class:`Engine` serves one state dir. All state changes happen on the event loop, in
one place (:meth:`Engine._transition`), which checks the transition table, queues the row
and its event for the next group commit, and lets the store publish the event once it is
durable. The job lifecycle itself (scheduling passes, launch, exits, dependencies) lives in
:class:`~gpulayer_tui.engine.lifecycle.Lifecycle` and adoption in
:class:`~gpulayer_tui.engine.adoption.Adoption`, which this class extends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from .. import __version__
from .config import Config, ConfigError, Paths, load_config, plan_domains
from .domain import Domain
from .events import EventBus, Subscription
from .gpus import GpuProbe, ProbeStatus, make_probe
from .lifecycle import UnknownJob
from .lock import EngineLock
from .models import EventKind, Job, JobKind, JobStatus
from .reload import ConfigReload
from .sampler import Sample, Sampler
from .scheduler import Capacity, Scheduler
from .services import ServiceClock
from .spec import SpecError, parse_spec
from .store import Store, StoreError
from .supervisor import Supervisor, exit_path

log = logging.getLogger(__name__)

__all__ = ["ConfigError", "Engine", "JobNotActive", "Overloaded", "SpecError", "UnknownJob"]


class JobNotActive(RuntimeError):
    """The job already ended; the operation does not apply."""


class Overloaded(RuntimeError):
    """Back-pressure: the engine takes no more work now (retry later); nothing was stored."""


class Engine(ConfigReload):
    """A running engine over one state dir.

    Args:
        paths: State dir and config file.
        probe: GPU backend; built from ``simulate`` when omitted.
        simulate: Simulation spec (``2xA100-80GB``) when no probe is given.
        config: Parsed config; read from ``paths.config_file`` when omitted.
        cpu_count: Size of the default CPU pool (defaults to the core count).
        service_clock: Clock for service restart back-off (tests step it by hand).
    """

    def __init__(
        self,
        paths: Paths,
        probe: GpuProbe | None = None,
        simulate: str | None = None,
        config: Config | None = None,
        cpu_count: int | None = None,
        service_clock: ServiceClock | None = None,
    ) -> None:
        self.paths = paths
        self.config = config if config is not None else load_config(paths.config_file)
        self.probe = probe if probe is not None else make_probe(simulate, paths.state_dir)
        self.cpu_count = cpu_count or os.cpu_count() or 1
        self.bus = EventBus()
        self.store = Store(paths.database, self.bus.publish)
        self.supervisor = Supervisor(paths.jobs_dir, self._on_exit)
        self.scheduler = Scheduler({})
        settings = self.config.engine
        self.sampler = Sampler(
            self.probe,
            settings.sample_interval,
            settings.probe_timeout,
            settings.history,
            self._roots_snapshot,
            self._on_sample,
        )
        self._lock = EngineLock(paths.lock)
        self.started_at = 0.0
        self.no_gpu_notice: str | None = None
        super().__init__()
        if service_clock is not None:
            self.service_clock = service_clock

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the lock, open the database, read the GPUs, restore jobs and start sampling.

        Raises:
            EngineBusy: Another engine serves this state dir.
            ConfigError: The config does not match this machine.
            StoreError: The database cannot be used.
        """
        state = self.paths.state_dir
        try:
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(state, 0o700)
            self.paths.jobs_dir.mkdir(exist_ok=True, mode=0o700)
            self._lock.acquire()
        except OSError as err:
            raise StoreError(f"the state dir {state} cannot be written: {err.strerror}") from None
        try:
            await self.store.open(__version__, os.getpid())
            first = await self.sampler.sample_once()
            self._build_domains(first)
            await self._restore_domain_states()
            self._on_sample(first)
            self._next_id = await self.store.max_job_id()
            await self._restore(await self.store.active_jobs())
            self._schedule()
            await self.store.flush()
        except BaseException:
            await self.store.close()
            self._lock.release()
            raise
        self.started_at = time.time()
        self.sampler.start()
        self.start_config_watch()

    def _build_domains(self, sample: Sample) -> None:
        result = sample.result
        if result.status is ProbeStatus.ERROR:
            # Capacity unknown: keep configured GPU domains unverified rather than refusing
            # to run; over-capacity verdicts wait until the GPUs can be read.
            log.warning("GPUs could not be read at start: %s", result.message)
        if result.status is ProbeStatus.NO_DRIVER:
            # Said once, by whoever shows the engine (the --serve banner, the TUI header).
            self.no_gpu_notice = result.message
        plans = plan_domains(self.config, result.gpus, self.cpu_count, str(self.paths.config_file))
        domains = {p.name: Domain(p.name, p.gpu_index, p.gpu_uuid, p.slots) for p in plans}
        self.scheduler.domains = domains

    async def stop(self) -> None:
        """Stop sampling and serving. Running jobs keep running (they outlive the engine)."""
        await self.stop_config_watch()
        await self.sampler.stop()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for act in self._active.values():
            # Back-off timers and port probes are re-armed from the stored replica state by
            # the next engine; the processes themselves keep running.
            self._drop_service_runtime(act)
        if self._schedule_handle is not None:
            self._schedule_handle.cancel()
        self.supervisor.close()
        await self.store.close()
        self.bus.close()
        self._lock.release()

    # -- API ----------------------------------------------------------------------------------

    async def submit(self, data: Any, owner_uid: int | None = None) -> Job:
        """Validate and submit one job; return it after its first verdict is durable.

        The returned job is ``running``, ``queued`` (with the reason), or ``failed`` with
        ``over_capacity`` (the row stays in history).

        Raises:
            SpecError: Invalid spec, unknown domain or unknown dependency (nothing stored).
        """
        jobs = await self.submit_many([data], owner_uid)
        return jobs[0]

    async def submit_many(self, items: list[Any], owner_uid: int | None = None) -> list[Job]:
        """Submit several jobs at once: all are validated first, then stored in one commit.

        Raises:
            SpecError: Naming the first invalid item by index; nothing is stored.
            Overloaded: ``[limits] active_jobs`` would be exceeded; nothing is stored.
            StoreError: The database cannot be written: the engine refuses new work.
        """
        self._check_writable()
        self._check_room(len(items))
        prepared = []
        for index, data in enumerate(items):
            try:
                spec = parse_spec(data)
                request = self.scheduler.request_for(spec)
                self.refuse_quarantined_pins(spec.pinned_domains)
                deps = await self._resolve_dependencies(spec)
            except SpecError as err:
                prefix = f"job {index + 1} of {len(items)}: " if len(items) > 1 else ""
                raise SpecError(f"{prefix}{err}") from None
            prepared.append((spec, request, deps))
        # Again, with no await before the admission: other submissions ran meanwhile.
        self._check_writable()
        self._check_room(len(items))
        jobs = [self._admit(spec, req, deps, owner_uid) for spec, req, deps in prepared]
        self._schedule()
        try:
            await self.store.flush()
        except StoreError as err:
            # Refused means not run: jobs that could not be recorded are cancelled (their
            # rows are kept for the store's retry, so history shows them once it writes).
            for job in jobs:
                act = self._active.get(job.id)
                if act is not None:
                    self._cancel(act, f"not recorded: {err}")
            raise StoreError(f"the engine refuses new work: {err}") from None
        return jobs

    def _check_room(self, count: int) -> None:
        limit = self.config.limits.active_jobs
        if len(self._active) + count > limit:
            raise Overloaded(
                f"too many active jobs: {len(self._active)} pending, queued or running, "
                f"{count} more would pass the limit of {limit} ([limits] active_jobs); "
                "nothing was stored, retry when jobs have ended"
            )

    async def get(self, job_id: int) -> Job:
        """One job: the live record if active, else the stored one.

        Raises:
            UnknownJob: No such id.
        """
        active = self._live(job_id)
        if active is not None:
            return active.job
        job = await self.store.get_job(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job

    async def events_of(self, job_id: int) -> list[dict[str, Any]]:
        """The job's stored timeline (every transition with time, reason and message)."""
        await self.get(job_id)
        return await self.store.job_events(job_id)

    async def list_jobs(
        self, statuses: list[str] | None = None, limit: int = 1000, before_id: int | None = None
    ) -> list[Job]:
        """Jobs newest first; active rows reflect the live state.

        Raises:
            SpecError: For an unknown status name.
        """
        for status in statuses or []:
            if status not in JobStatus.__members__.values():
                known = ", ".join(s.value for s in JobStatus)
                raise SpecError(f"unknown status '{status}' (one of: {known})")
        jobs = await self.store.list_jobs(statuses or [], limit, before_id)
        live = (self._live(j.id) for j in jobs)
        return [act.job if act is not None else j for act, j in zip(live, jobs, strict=True)]

    async def cancel(self, job_id: int) -> Job:
        """Cancel a job: at once if it has not started, else SIGTERM then SIGKILL.

        Raises:
            UnknownJob: No such id.
            JobNotActive: It already ended (the message says how).
        """
        active = self._active.get(job_id)
        if active is None:
            job = await self.get(job_id)
            raise JobNotActive(f"job {job_id} already {job.status.value}")
        self._cancel(active, "cancelled by user")
        await self.store.flush()
        return active.job

    async def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Wait until the job is terminal (and durable); return it.

        Raises:
            UnknownJob: No such id.
            TimeoutError: ``timeout`` passed first.
        """
        active = self._live(job_id)
        if active is not None:
            async with asyncio.timeout(timeout):
                await asyncio.shield(active.finished)
        return await self.get(job_id)

    def log_path(self, job_id: int, replica: int | None = None) -> Path:
        """Where the job's output is (it may not exist yet).

        A service writes one log per replica; without ``replica`` its replica 0's log is
        meant. Use :meth:`check_replica` first to validate a user's replica number.
        """
        if replica is not None:
            return self.supervisor.log_path((job_id, replica))
        path = self.supervisor.log_path(job_id)
        if not path.exists():
            first = self.supervisor.log_path((job_id, 0))
            if first.exists():
                return first
        return path

    @staticmethod
    def check_replica(job: Job, replica: int | None) -> None:
        """Validate a replica number against a job.

        Raises:
            SpecError: The job is not a service, or has no such replica.
        """
        if replica is None:
            return
        if job.kind is not JobKind.SERVICE:
            raise SpecError(f"job {job.id} is not a service; it has no replicas")
        count = len(job.replicas) or int(job.spec.get("replicas", 1))
        if not 0 <= replica < count:
            raise SpecError(f"job {job.id} has replicas 0-{count - 1}, not {replica}")

    def subscribe(self) -> Subscription:
        """Receive every event published from now on."""
        return self.bus.subscribe()

    def gpus(self) -> dict[str, Any]:
        """Domains with their latest sample, VRAM accounting and history."""
        from .views import gpus_view

        return gpus_view(self)

    def health(self) -> dict[str, Any]:
        """Engine identity and overall state."""
        return {
            "engine": "gpulayer-tui",
            "version": __version__,
            "pid": os.getpid(),
            "state_dir": str(self.paths.state_dir),
            "config_file": str(self.paths.config_file),
            "backend": self.probe.backend,
            "capacity": self.scheduler.capacity.value,
            "capacity_message": self.scheduler.capacity_message,
            "no_gpu_notice": self.no_gpu_notice,
            "started_at": self.started_at,
            "uptime": time.time() - self.started_at if self.started_at else 0.0,
            "active_jobs": len(self._active),
            "store_failure": self.store.failure,
        }

    def active_services(self) -> list[Job]:
        """Services that are queued or running, in id order (live records)."""
        return [
            act.job for _, act in sorted(self._active.items()) if act.job.kind is JobKind.SERVICE
        ]

    def exit_path(self, job_id: int) -> Path:
        """Where the job's exit status is recorded once it ends."""
        return exit_path(self.paths.jobs_dir, job_id)

    # -- sampling -----------------------------------------------------------------------------

    def _on_sample(self, sample: Sample) -> None:
        result = sample.result
        before = (self.scheduler.capacity, self._capacity_signature())
        if result.status is ProbeStatus.OK:
            self.scheduler.capacity = Capacity.KNOWN if result.gpus else Capacity.NO_GPUS
            self.scheduler.capacity_message = (
                "" if result.gpus else "the GPU driver reports no devices"
            )
            by_index = {g.index: g for g in result.gpus}
            for dom in self.scheduler.gpu_domains:
                reading = by_index.get(dom.gpu_index or 0)
                if reading is not None:
                    dom.apply_sample(reading, sample.owners, sample.info)
            if self.scheduler.domains:
                self._observe_health(by_index)
        elif result.status is ProbeStatus.NO_DRIVER:
            self.scheduler.capacity = Capacity.NO_GPUS
            self.scheduler.capacity_message = result.message or "no NVIDIA driver"
        else:
            self.scheduler.capacity = Capacity.UNKNOWN
            self.scheduler.capacity_message = result.message or "GPU probe failed"
        if not self.scheduler.domains:
            return  # the first sample, before the domains exist
        if (self.scheduler.capacity, self._capacity_signature()) != before:
            self._recheck_capacity()
        self._schedule_soon()
        if self.bus.has_subscribers:
            from .views import sample_event_data

            self.bus.publish(self.bus.make(EventKind.GPU_SAMPLE, None, sample_event_data(self)))

    def _capacity_signature(self) -> tuple[tuple[str, int | None], ...]:
        return tuple((d.name, d.capacity_bytes) for d in self.scheduler.gpu_domains)
