"""The engine: a thin facade that builds the parts, wires them and answers callers.

It keeps no state of its own. Each part owns its state and is reached through small
methods (see docs/architecture.md for who calls whom):

* :class:`~.jobbook.JobBook` (``book``): active jobs, ids, the one transition point;
* :class:`~.jobqueue.JobQueue` (``queue``): waiting jobs, their reasons, the pass;
* :class:`~.scheduler.Scheduler` (``scheduler``): domains, capacity, placement;
* runners, one per kind: :class:`~.batch.BatchRunner`, :class:`~.services.ServiceRunner`,
  :class:`~.adoption.Adopter`, over one :class:`~.executor.Executor` (``executor``);
* :class:`~.health.DomainOps` (``domain_ops``): health, drain, release, doctor;
* :class:`~.admission.Admission` (``admission``) and :class:`~.reads.JobReader` (``reads``):
  taking submissions, answering reads;
* :class:`~.recovery.Recovery`, :class:`~.reload.ConfigReloader` (``config_reload``);
* the store, the event bus and the GPU sampler.

Reactions that cross parts are listeners wired in :meth:`Engine._wire`, in one place.

Why this module is over ~400 lines (the aim was ~250): it is the public API of the engine
library, and each public method carries its Google-style docstring (what it raises
included); the bodies are one-line delegations to the parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

from .. import __version__
from ..fields import (
    EDIT_WORDS,
    FieldError,
    blank_label,
    cut_to_length,
    edit_value,
    printable,
    status_phrase,
    wanted_gpus,
)
from ..wire import (
    ADOPTED_NOT_RUN,
    AdoptRequest,
    GpusJSON,
    HealthJSON,
    JobJSON,
    JobRowJSON,
    ProcessInfoJSON,
    RowUsageJSON,
    UsageJSON,
)
from . import procs
from .access import Forbidden, OwnerAccess
from .admission import Admission
from .adoption import Adopter, default_name, read_process, runs_the_asker, thread_group_of
from .batch import BatchRunner, JobEnv, login_basics
from .cluster_runner import ClusterRunner
from .config import Config, ConfigError, Paths, load_engine_config, plan_domains
from .disk import DiskSpace
from .domain import Domain, DomainState
from .errors import JobNotActive, Overloaded, SpecError, StoreError, UnknownJob
from .events import EventBus, Subscription
from .executor import TaskKey
from .fairness import Limits, owner_of
from .gpus import GIB, GpuProbe, ProbeStatus
from .health import DomainOps
from .jobbook import LOG_CUT, ActiveJob, JobBook, Runner, release_holds
from .jobqueue import JobQueue, ResolvedDep
from .launch_client import LauncherExecutor
from .lock import EngineLock
from .logfiles import highest_log_id
from .models import EventKind, Job, JobKind, JobQuery, JobStatus, TerminationReason
from .notify import Notifier
from .probes import make_probe
from .procstat import is_alive
from .reads import JobReader
from .recovery import Recovery
from .reload import ConfigReloader
from .retention import Retention
from .sampler import Sample, Sampler
from .scheduler import Request, Scheduler
from .service_runtime import ServiceClock
from .services import ServiceRunner
from .simulate import SimulatedProbe, placed_processes
from .snapshot import SnapshotStore, writes_read_only_files
from .spec import JobSpec, parse_spec
from .statedir import claim_state_dir, unwritable_state_dir
from .store import Store
from .supervisor import Supervisor
from .usage import UsageRecorder
from .views import gpus_view

log = logging.getLogger(__name__)

LOG_NOTE_EVERY_S = 60.0
STATE_ID_SETTING = "state_id"
"""The id of the state dir the database was last used in (see Engine._database_moved)."""
"""A log cut back again and again is said in its job's timeline at most this often."""

__all__ = ["ConfigError", "Engine", "JobNotActive", "Overloaded", "SpecError", "UnknownJob"]


@dataclasses.dataclass
class EditRecord:
    """What one edit changed, taken as it was made (see :meth:`Engine.edit`)."""

    before: dict[str, Any] = dataclasses.field(default_factory=dict)
    after: dict[str, Any] = dataclasses.field(default_factory=dict)
    name_before: str = ""
    name_after: str = ""

    def took(self, job: Job) -> None:
        """The job as the edit found it (and as it stays, if nothing changes)."""
        self.before = self.after = job.spec
        self.name_before = self.name_after = job.name

    def made(self, job: Job) -> None:
        """The job as the edit left it (its spec is a new dict: the one before stays)."""
        self.after, self.name_after = job.spec, job.name


def _removed_replica_run(job: Job, key: str) -> bool:
    """Whether ``key`` (``J.K.R``) is a run of a replica a scale-down removed from the
    running service ``job``: its end was recorded as it was dropped. Forgotten, a replica
    added back later under that index, going on from a run this engine does not know, can
    never be answered with that old run's end."""
    parts = key.split(".")
    if job.kind is not JobKind.SERVICE or job.status.is_terminal or len(parts) != 3:
        return False
    if not parts[1].isdigit():
        return False
    count = job.spec.get("replicas") or 1
    return isinstance(count, int) and int(parts[1]) >= count and int(parts[1]) >= len(job.replicas)


def _unwatched_text(runs: list[tuple[str, int]]) -> str:
    """What doctor and the log say of processes the launcher runs for no job watched."""
    shown = ", ".join(f"pid {pid} (launcher key {key})" for key, pid in runs[:10])
    more = f" and {len(runs) - 10} more" if len(runs) > 10 else ""
    return (
        f"the launcher runs {len(runs)} process{'es' if len(runs) > 1 else ''} that no job "
        f"of this database watches: {shown}{more} (started from a database moved aside, or "
        "released as unkillable); they hold what they use, unseen by the scheduler: stop "
        "them (kill PID) or put that database back"
    )


def _dependency_id(dep: object) -> int | None:
    """The job a stored ``depends_on`` item names (an id, or ``{"job": ID, ...}``)."""
    if isinstance(dep, dict):
        dep = dep.get("job")
    return dep if isinstance(dep, int) else None


def _holders_said(domains: list[Domain], act: ActiveJob, request: Request) -> str:
    """`` (gpu0: job 24)`` of the full GPU domains a scale-up could have used:
    "gpu0 busy" left the user to find what held it (tester h185; `why` names them)."""
    if request.gpus <= 0:
        return ""
    said = []
    for dom in domains:
        if dom.free_slots >= request.slots_on(dom) or act.job.id in dom.holdings:
            continue
        others = sorted(dom.holdings)
        if others:
            more = f" and {len(others) - 3} more" if len(others) > 3 else ""
            jobs = ", ".join(str(j) for j in others[:3]) + more
            said.append(f"{dom.name}: job{'s' if len(others) > 1 else ''} {jobs}")
    return f" ({'; '.join(said[:4])})" if said else ""


class Engine:
    """A running engine over one state dir.

    Args:
        paths: State dir and config file.
        probe: GPU backend; built from ``simulate`` when omitted.
        simulate: Simulation spec (``2xA100-80GB``) when no probe is given.
        config: Parsed config; read from ``paths.config_file`` when omitted.
        cpu_count: Size of the default CPU pool (defaults to the core count).
        service_clock: Clock for service restart back-off (tests step it by hand).
        lock: The state dir's lock, already taken (:func:`.statedir.claim_state_dir`);
            :meth:`start` takes it when omitted.
    """

    def __init__(
        self,
        paths: Paths,
        probe: GpuProbe | None = None,
        simulate: str | None = None,
        config: Config | None = None,
        cpu_count: int | None = None,
        service_clock: ServiceClock | None = None,
        lock: EngineLock | None = None,
    ) -> None:
        self._config_listeners: list[Callable[[Config], None]] = []
        self.paths = paths
        if config is None:
            config = load_engine_config(paths.config_file) or Config()
        self.config = config
        self.probe = probe if probe is not None else make_probe(simulate, paths.state_dir)
        self.cpu_count = cpu_count or os.cpu_count() or 1
        settings = self.config.engine
        env = JobEnv(login_basics())  # a login's basics plus their spec's (not the engine's)
        self.bus = EventBus()
        self.store = Store(paths.database, self.bus.publish)
        # Jobs start through the state dir's launcher; adopted processes (and jobs an older
        # version started under its per-job wrapper) are watched directly.
        self.executor = LauncherExecutor(
            paths.state_dir, paths.jobs_dir, settings.launcher_idle, self.config.logs.max_bytes
        )
        self.watcher = Supervisor(paths.jobs_dir)
        self.scheduler = Scheduler()
        self.book = JobBook(self.store, self.bus)
        self.disk = DiskSpace(paths.state_dir, self.config.logs.min_free_mb)
        self.queue = JobQueue(
            self.book,
            self.scheduler,
            self.store.get_job,
            self._start_job,
            gate=self._gate,
            settings=self.config.scheduling,
            limits=Limits(self.config.users),
        )
        self.queue.owner_refusal = OwnerAccess(self.config.security).refusal
        self.store.on_writable = self.queue.schedule_soon  # (see _gate)
        self.batch = BatchRunner(
            self.book, self.scheduler, self.executor, self.watcher, settings, env, self.disk
        )
        self.store.on_unwritable = self.batch.starts_not_stored
        self.services = ServiceRunner(
            self.book,
            self.scheduler,
            self.queue,
            self.executor,
            self.watcher,
            self.config,
            env,
            service_clock,
        )
        self.sampler = Sampler(
            self.probe,
            settings.sample_interval,
            settings.probe_timeout,
            settings.history,
            self.book.roots.snapshot,
            self._on_sample,
            self._place_simulated if isinstance(self.probe, SimulatedProbe) else None,
        )
        if isinstance(self.probe, SimulatedProbe):
            self.probe.settings = self.config.simulate
        self.adopter = Adopter(
            self.book,
            self.scheduler,
            self.watcher,
            self.store,
            self._latest_sample,
            settings,
            state_dir=str(paths.state_dir),
            sample_now=self._sample_now,
        )
        self.domain_ops = DomainOps(
            self.scheduler,
            self.book,
            self.queue,
            self.store,
            self.bus,
            self.config.health,
            self.executor.log_path,
            lambda: self.sampler.stalled(),
            self._gate,
            self.disk.blocker,
            lambda: self.executor.problem,
        )
        # Cluster jobs (issue 16): batch jobs that Slurm runs; the queue hands them over.
        # (Named on the cluster by this state dir's id, read at start.)
        tag = hashlib.sha256(str(paths.state_dir).encode()).hexdigest()[:8]
        self.clusters = ClusterRunner(
            self.book,
            self.config.clusters,
            self.executor.log_path,
            tag,
            recheck=self.queue.recheck_capacity,
        )
        self.queue.cluster_verdict = self.clusters.verdict
        self.queue.cluster_start = self.clusters.start
        self.queue.cluster_deps = self.clusters.take_dependencies
        self._runners: dict[JobKind, Runner] = {
            JobKind.COMMAND: _ByPlace(self.batch, self.clusters),
            JobKind.SERVICE: self.services,
            JobKind.ADOPTED: self.adopter,
        }
        self.recovery = Recovery(
            self.book,
            self.scheduler,
            self.queue,
            self._runners,
            self.store.save_edit,
            self.services.restored_waiting,
        )
        self.snapshots = SnapshotStore(paths.state_dir)
        self.admission = Admission(
            self.book,
            self.scheduler,
            self.queue,
            self.domain_ops,
            self.store,
            self.config.limits,
            self._cancel,
            self.snapshots,
            self.config.snapshot,
            self.disk,
        )
        self.admission.clusters = self.clusters.names
        self.usage = UsageRecorder(
            self.config.usage,
            self.config.policy,
            self._usage_facts,
            self.store.save_usage,
            self._idle_warning,
            self.store.after_commit,
        )
        self.reads = JobReader(self.book, self.store, self.executor, self.usage)
        self.notifier = Notifier(self.bus, self.config.notify, self.reads.get, self.store)
        self.retention = Retention(
            self.store,
            paths.jobs_dir,
            self.config.history,
            self.snapshots,
            self._kept_because,
            lambda job_id: self.book.live(job_id) is not None,
            self.bus,
        )
        self.config_reload = ConfigReloader(
            paths,
            self.cpu_count,
            self.sampler,
            self.scheduler,
            self.book,
            self.queue,
            self.store,
            self.bus,
            lambda: self.config,
            self._reconfigure,
            self.services.domains_changed,
        )
        self._lock = lock if lock is not None else EngineLock(paths.lock)
        self.started_at = 0.0
        self.paused_at: float | None = None  # the queue's pause (gpulayer-tui pause)
        self.no_gpu_notice: str | None = None
        self.unwatched_runs: list[tuple[str, int, int]] = []  # (see _say_unwatched_runs)
        self._wire()

    def _wire(self) -> None:
        """Every reaction that crosses parts, in the order it runs."""
        self.book.usage_of = self._usage_row
        # A job that ends: what it used is written, its holds go back, then its runner
        # forgets its timers, then the queue settles its dependents and runs a pass.
        self.book.on_end(
            lambda act: self.usage.job_ended(
                act.job.id,
                act.job.ended_at,
                len(act.job.gpus),
                # (a batch job's one run held its GPUs from its start to its end; one that
                # never started, its launch failed, held none: tester h180)
                act.job.started_at
                if act.job.kind is JobKind.COMMAND
                and not act.job.attempt
                and (act.launched or act.job.pid is not None)
                else None,
                act.job.gpus,
            )
        )
        self.book.on_end(release_holds)
        self.book.on_end(self.batch.job_ended)
        self.book.on_end(self.adopter.job_ended)
        self.book.on_end(self.services.job_ended)
        self.book.on_end(self.queue.job_ended)
        # A GPU job that died of a device error counts against its GPUs' health.
        self.batch.on_process_end(self.domain_ops.job_ended_on)
        self.services.on_replica_end = self.domain_ops.replica_ended_on
        # Preemption (issue 18): the queue picks whom to stop, the batch runner stops it
        # and hands it back to the queue when it has exited.
        self.queue.preempt = self._preempt
        self.queue.call_off = self.batch.call_off_preemption
        self.batch.on_requeue(self.queue.requeued)
        self.batch.on_run_end(self.queue.charge_run)
        # A quarantined domain's services are placed again elsewhere (record 000).
        self.domain_ops.on_quarantine(self.services.domain_quarantined)
        # A log cut back to its limit is said in the job's timeline (at most once a
        # minute per log: how often, how much in all, by job id, cuts, bytes, when said).
        self._log_cuts: dict[TaskKey, tuple[int, int, int, float]] = {}
        # Restarts being made, by the job they restart: a second one at the same moment
        # (two clients) is told it makes a second run.
        self._restarting: dict[int, int] = {}
        self.executor.log_cut.append(self._log_cut)
        self.batch.log_total = self._log_total
        self.book.on_end(self._forget_log_cuts)

    def _usage_row(self, job_id: int) -> RowUsageJSON | None:
        usage = self.usage.live(job_id)
        return None if usage is None else usage.row()

    def _reconfigure(self, config: Config) -> None:
        """A reloaded configuration: each part takes its section."""
        self.config = config
        engine = config.engine
        self.sampler.reconfigure(engine.sample_interval, engine.probe_timeout, engine.history)
        if isinstance(self.probe, SimulatedProbe):
            self.probe.settings = config.simulate
        self.batch.reconfigure(engine)
        self.adopter.reconfigure(engine)
        self.services.reconfigure(config)
        self.domain_ops.reconfigure(config.health)
        self.executor.set_max_log(config.logs.max_bytes)
        # (the next launcher this engine starts gets it: "applied", and the next one still
        # got the old --idle; tester h135)
        self.executor.idle_timeout = engine.launcher_idle
        self.retention.reconfigure(config.history)
        self.disk.min_free_mb = config.logs.min_free_mb
        self.admission.reconfigure(config.limits, config.snapshot)
        self.usage.reconfigure(config.usage, config.policy)
        self.clusters.reconfigure(config.clusters)
        self.admission.clusters = self.clusters.names
        self.queue.owner_refusal = OwnerAccess(config.security).refusal
        self.queue.reconfigure(config.scheduling, Limits(config.users))
        self.notifier.reconfigure(config.notify)
        for listener in self._config_listeners:
            listener(config)

    def on_reconfigure(self, listener: Callable[[Config], None]) -> None:
        """Call ``listener(config)`` after each reloaded configuration is taken in (what
        wraps the engine, as its API server, takes its part too)."""
        self._config_listeners.append(listener)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the lock, open the database, read the GPUs, restore jobs and start sampling.

        Raises:
            EngineBusy: Another engine serves this state dir.
            ConfigError: The config does not match this machine.
            StoreError: The database cannot be used.
        """
        if not self._lock.held:  # (--serve took it before it built the engine)
            claim_state_dir(self.paths, self._lock)
        # (After the lock: a second engine refused here emptied the serving one's tmp/,
        # the snapshots it was building, and collected their objects.)
        try:
            self.snapshots.prepare()  # (snapshots/, 0700; what a crash left in tmp/ goes)
        except BaseException as err:
            self._lock.release()
            if isinstance(err, OSError):
                raise unwritable_state_dir(self.paths.state_dir, err) from None
            raise
        try:
            self.notifier.start()  # (before recovery: a job that ended meanwhile notifies)
            await self.store.open(__version__, os.getpid())
            await self.notifier.catch_up()  # (what the last engine left undelivered)
            state_id = self._state_id()
            self.clusters.tag = state_id
            moved_from = await self._database_moved(state_id)
            await self.executor.open()
            # The cap in force for the jobs running now too ([logs] max_bytes may have
            # been lowered while no engine ran: the launcher still had the old one).
            self.executor.send_max_log()
            first = await self.sampler.sample_once()
            # (the GPU domains the last engine had: one named there whose GPU is gone now
            # is a GPU that did not come up, not a typo)
            named_before = {row[0] for row in await self.store.domain_states()}
            self._build_domains(first, named_before)
            renamed = await self.domain_ops.restore_states()
            had = await self.store.known_gpus()
            self._on_sample(first)
            # (GPUs the engines before had: one the driver does not list now may come back;
            # after the first sample, which tells each domain's size)
            result = first.result
            # (no driver: it lists none, and the GPUs before are missing, not unknown)
            listed = (
                [g.uuid for g in result.gpus]
                if result.status in (ProbeStatus.OK, ProbeStatus.NO_DRIVER)
                else None
            )
            self.store.save_known_gpus(self.scheduler.know_gpus(had, listed))
            stored = await self.store.max_job_id()
            # (The launcher's runs, and the logs in jobs/: a run it had forgotten, its end
            # recorded, left its log; its id was given again after a database reset.)
            known = max(
                self.executor.highest_job_id(),
                await asyncio.to_thread(highest_log_id, self.paths.jobs_dir),
            )
            if known > stored:
                log.warning(
                    "job %d ran here, which this database does not know (a database moved "
                    "aside?): new job ids go on after it",
                    known,
                )
            self.book.resume_ids(max(stored, known))
            await self._restore_fair_share()
            paused = await self.store.setting("queue_paused_at")
            self.paused_at = float(paused) if paused else None
            if self.paused_at is not None:
                self.queue.closed_since(self.paused_at)
            active = await self.store.active_jobs()
            if moved_from is not None:
                active = self._lost_with_their_state_dir(active, moved_from)
            # Running jobs' usage goes on from what was written before the restart (taken
            # back first: a job that ended meanwhile, ended by the restore, has its time
            # since then booked up to its end).
            # (a waiting one's too: a service being placed again, or a requeued job, lost
            # all it had used before the restart)
            self.usage.restore(
                await self.store.usage([j.id for j in active]),
                [j.id for j in active if j.status is JobStatus.RUNNING],
            )
            await self.recovery.restore(active, renamed)
            # (those still running: their time since their record, booked now)
            running = [a.job.id for a in self.book if a.job.status is JobStatus.RUNNING]
            if running:
                # The first sample was read before the jobs were taken back: their
                # processes (an adopted one's children too) were no job's, and the first
                # answers said their memory unregistered, `why` named them as strays in
                # the way (tester h200). Read again, now that the jobs are known: the VRAM
                # account follows it (their usage records see them there, from now).
                again = await self.sampler.sample_once()
                self.scheduler.observe(again.result, again.owners, again.info)
            self.usage.book_gaps(running, time.time())
            for dom in self.scheduler.gpu_domains:
                if dom.state is DomainState.QUARANTINED and dom.holdings:
                    self.domain_ops.quarantined(dom)  # (see DomainOps.quarantined)
            self._resume_preemptions()
            await self._say_unwatched_runs()
            self.queue.schedule()
            await self.store.flush()
        except BaseException:
            await self.notifier.stop()
            await self.executor.close()
            await self.store.close()
            self._lock.release()
            raise
        self.started_at = time.time()
        self.clusters.start_polling()
        self.sampler.start()
        self.config_reload.start()
        self.retention.start()

    def _place_simulated(self) -> None:
        """Simulated GPUs (before each tick): every running job's processes, where they
        run, so the GPUs show them as a driver would (``[simulate]``)."""
        assert isinstance(self.probe, SimulatedProbe)
        self.probe.place(placed_processes(self.book.roots.snapshot(), self.book.get))

    def _gate(self) -> str | None:
        """Why nothing may start now: the queue is paused, the disk is nearly full, or the
        database cannot be written (a start is decided durably first: decided meanwhile,
        a job read "running" for as long, with no process: tester h158)."""
        if self.paused_at is not None:
            since = time.strftime("%H:%M:%S", time.localtime(self.paused_at))
            return f"the queue has been paused since {since} (gpulayer-tui resume)"
        if self.store.failure is not None:
            return f"nothing starts while the database cannot be written ({self.store.failure})"
        return self.disk.blocker()

    def _kept_because(self) -> dict[int, str]:
        """The finished jobs history cleaning keeps, each with why: one a waiting job
        depends on (named: a kept job said only "a job not ended yet depends on it, or
        its notification is not sent yet", tester h123), and one whose notification has
        yet to go (it reads the job as it goes)."""
        why: dict[int, str] = {}
        for act in self.book:
            if act.spec is not None and act.job.status.is_active:
                for dep in act.spec.dependencies:
                    why.setdefault(dep.job, f"job {act.job.id} depends on it")
        for job_id in self.notifier.jobs_owed():
            why.setdefault(job_id, "its notification is not sent yet")
        return why

    async def doctor_checks(self) -> list[dict[str, str]]:
        """``GET /v1/doctor``: the config file as a reload would find it, then the domains,
        the queue, sampling, writes and the clock (:meth:`.DomainOps.doctor_checks`), and
        processes of the launcher that no job watches."""
        checks = [await self.config_reload.check_file(), *await self.domain_ops.doctor_checks()]
        if self.executor.keeper_lost():
            running = len(self.executor.pids())
            checks.append(
                {
                    "check": "launcher",
                    "status": "warn",
                    "detail": f"its keeper process is gone: the {running} job(s) it runs go on, "
                    "but if the launcher dies too their exit statuses are lost; a new launcher "
                    "starts once they have ended",
                }
            )
        command = self.config.notify.command
        if command and shutil.which(command[0]) is None:
            # (taken as valid, and every notification failed at its job's end: h193)
            checks.append(
                {
                    "check": "notify",
                    "status": "warn",
                    "detail": f"[notify] command: {printable(command[0])} is not a program "
                    "this engine can run (no such file, or not executable, or not in its "
                    "PATH): every notification will fail",
                }
            )
        security = self.config.security
        if os.geteuid() == 0 and (security.allowed_uids or security.allowed_groups):
            # (said in the README, and found only by a job that ran `id`: tester h75)
            checks.append(
                {
                    "check": "security",
                    "status": "warn",
                    "detail": "this engine runs as root and [security] lets other users in: "
                    "every job runs as root, so each allowed user can do anything root "
                    "can; run the engine as a service account of its own",
                }
            )
        if self.config.snapshot.files == "linked" and writes_read_only_files():
            # (set by hand where auto would not: one job's write changed what another
            # sharing its files ran, and nothing said so: tester h156)
            checks.append(
                {
                    "check": "snapshot",
                    "status": "warn",
                    "detail": '[snapshot] files = "linked" while the engine ignores read-only '
                    "modes (root, or CAP_DAC_OVERRIDE): a job that writes a file of its copy "
                    'changes it for every job sharing it; "auto" makes them private here',
                }
            )
        alive = [(k, pid) for k, pid, ticks in self.unwatched_runs if is_alive(pid, ticks)]
        if alive:
            checks.append(
                {
                    "check": "launcher",
                    "status": "warn",
                    "detail": _unwatched_text(alive),
                }
            )
        return checks

    def _resume_preemptions(self) -> None:
        """Running jobs being preempted when the last engine stopped: the job each is
        stopped for (its stop's message names it, as :meth:`_preempt` wrote it)."""
        for act in self.book:
            job = act.job
            if job.stop_reason is TerminationReason.PREEMPTED and job.status is JobStatus.RUNNING:
                words = job.stop_message.split()
                if words[:3] == ["preempted", "by", "job"] and len(words) > 3:
                    urgent = words[3]
                    if urgent.isdigit():
                        self.queue.preempting_again(int(urgent), job.id)

    async def _say_unwatched_runs(self) -> None:
        """Runs of the launcher no job of this database watches (started from a database
        moved aside, or by an engine that released them as unkillable): said at start and
        by doctor, where they were invisible while holding their GPUs."""
        self.unwatched_runs = self.executor.unwatched()
        for key in self.executor.ended_unclaimed():
            # (an end this database has recorded already: its engine was killed before it
            # told the launcher; one of a job it does not know is kept, as a run is)
            head = key.split(".", 1)[0].split("~", 1)[0]
            if not (head.isascii() and head.isdigit()):
                continue
            job = await self.store.get_job(int(head))
            if job is not None and (job.status.is_terminal or _removed_replica_run(job, key)):
                self.executor.forget(key)
        if self.unwatched_runs:
            pairs = [(key, pid) for key, pid, _ in self.unwatched_runs]
            log.warning("%s", _unwatched_text(pairs))

    async def pause(self) -> float:
        """Pause the queue: nothing new starts (running jobs go on) until :meth:`resume`.
        Stored first, so a restarted engine stays paused. Returns when it was paused."""
        if self.paused_at is None:
            self.paused_at = time.time()
            self.store.save_setting("queue_paused_at", int(self.paused_at))
            await self.store.flush()
            self.queue.schedule()  # (waiting jobs say why)
            await self.store.flush()
        return self.paused_at

    async def resume(self) -> bool:
        """Let the queue start jobs again; False if it was not paused."""
        if self.paused_at is None:
            return False
        self.paused_at = None
        self.store.save_setting("queue_paused_at", 0)
        await self.store.flush()
        self.queue.schedule()
        await self.store.flush()
        return True

    EDITABLE = (
        "priority",
        "gpus",
        "vram_gb",
        "timeout",
        "name",
        "project",
        "depends_on",
        "replicas",
    )

    async def edit(
        self, job_id: int, changes: dict[str, Any], record: EditRecord | None = None
    ) -> Job:
        """Change a waiting job: its priority, GPUs, VRAM, timeout, name, project or
        dependencies (``depends_on``, replaced as a whole). Checked like a submission
        (and for over capacity: an edit that would make it unable to ever run is refused,
        the job unchanged; so is a dependency on itself, on a job that waits for it, or on
        one that already failed); stored, with a ``job.edited`` timeline entry, before the
        queue acts on it.

        Raises:
            UnknownJob: No such id.
            JobNotActive: It runs or ended (only a waiting job is edited).
            SpecError: A field that cannot be edited, or an invalid value.

        A running service's ``replicas`` is changed too (:meth:`scale`). ``record``, if
        given, gets the spec and name before and after, taken as the edit is made (read
        from the job after the commit, they showed another request's edit made meanwhile).
        """
        record = record if record is not None else EditRecord()
        running = self.book.get(job_id)
        if (
            running is not None
            and "replicas" in changes
            and running.job.kind is not JobKind.SERVICE
        ):
            # (said of any batch job, whatever its state: a running one was told "only a
            # waiting job is edited", as if it could be once queued: tester h117)
            raise SpecError(f"replicas: job {job_id} is not a service", "replicas")
        if (
            running is not None
            and running.job.kind is JobKind.SERVICE
            and running.job.status is JobStatus.RUNNING
            and "replicas" in changes
        ):
            return await self.scale(job_id, changes, record)
        act = await self._editable(job_id, changes)
        assert act.spec is not None
        if "replicas" in changes and act.job.kind is not JobKind.SERVICE:
            # (A waiting service's copies: it was cancel and submit again, a new id.)
            raise SpecError(f"replicas: job {job_id} is not a service", "replicas")
        if "gpus" in changes:
            changes = self._implied_gpus_left_out(act.job.spec, changes)
        if changes.get("gpus") == 0 and "vram_gb" not in changes and act.spec.vram_gb:
            # (a GPU job made a CPU one: its VRAM per GPU no longer applies; refused, it
            # could not be undone, as vram_gb 0 is no value)
            changes = {**changes, "vram_gb": None}
        spec = parse_spec({**act.job.spec, **changes})
        if "depends_on" in changes and act.spec.dependencies != spec.dependencies:
            before = sorted((d.job, d.any_exit) for d in act.spec.dependencies)
            if before == sorted((d.job, d.any_exit) for d in spec.dependencies):
                # The same jobs in another order: nothing to change (no timeline entry).
                changes = {**changes, "depends_on": act.job.spec.get("depends_on", [])}
                spec = parse_spec({**act.job.spec, **changes})
        for field in ("name", "project"):
            if isinstance(changes.get(field), str):
                try:
                    blank_label(field, changes[field])
                except FieldError as err:
                    raise SpecError(str(err), field) from None
        if "priority" in changes and spec.priority != act.spec.priority:
            self.queue.limits.check_priority(owner_of(act.job.owner_uid), spec.priority)
        deps = None
        if "depends_on" in changes:
            if spec.cluster is not None:
                raise SpecError(
                    "depends_on: a cluster job's dependencies cannot be edited "
                    "(cancel it and submit it again)",
                    "depends_on",
                )
            deps = await self._edited_dependencies(job_id, spec)
            # (The look-ups awaited: it may have started or ended meanwhile.)
            act = await self._editable(job_id, changes)
        # Pins kept as they were may name a GPU that is missing now: the job waits for it,
        # as it did (every edit was refused, "not found by the driver", even of its
        # priority, and named --domain, never given: tester h118).
        kept_pins = act.spec is not None and spec.pinned_domains == act.spec.pinned_domains
        request = self.scheduler.request_for(spec, keep_gone=kept_pins)
        old = act.job.spec
        trial = ActiveJob(act.job, spec, request)
        verdict = self.queue.verdict(trial)
        if verdict.possible is False:
            raise SpecError(f"the edit would make it unable to ever run: {verdict.message}")
        new = spec.stored()  # (as kept: "--after 10 --after 10" is one dependency on 10)
        said = ", ".join(
            f"{EDIT_WORDS.get(key, key)} {edit_value(key, old.get(key), act.job.name, old)} -> "
            f"{edit_value(key, new.get(key), spec.default_name(), new)}"
            for key in changes
            if old.get(key) != new.get(key)
        )
        gpus_before, gpus_after = wanted_gpus(old), wanted_gpus(new)
        if gpus_before != gpus_after and old.get("gpus") == new.get("gpus"):
            # A VRAM figure (or a GPU pin) given or taken away makes a CPU job a GPU job
            # or back: said, it went unsaid ("vram_gb none -> 20" of a job that moved
            # from the cpu pool to a GPU: tester h192).
            why = (
                "implied: VRAM or a GPU domain asks for a GPU"
                if gpus_after
                else "implied: with no VRAM or GPU domain it runs in the cpu pool"
            )
            said = f"{said}, gpus {gpus_before} -> {gpus_after} ({why})".lstrip(", ")
        record.took(act.job)
        if new == old:
            return act.job  # (asked for what it has: no "edited: nothing changed" entry)
        said = said or "nothing changed"
        # (All before the next await: the queue's next pass, which may start it, is
        # committed after the edit.)
        self.queue.edit(act, spec, request, deps)  # (out under the old key, in under the new)
        act.job.spec = spec.stored()
        act.job.name = spec.default_name()
        if act.job.replicas and len(act.job.replicas) != spec.replica_count:
            # A service that ran and waits to be placed again: it comes back with as many
            # (those kept keep their restart counts; a GPU "kept" for one dropped is not).
            self.services.replicas_edited(act, spec.replica_count)
        record.made(act.job)
        self.store.save_edit(act.job)
        self.book.record(act, EventKind.EDITED, {"message": f"edited: {said}"})
        if "timeout" in changes and act.job.kind is JobKind.SERVICE:
            self.services.timeout_edited(act)  # (one being placed again: it counts already)
        await self.store.flush()
        return act.job

    async def scale(
        self, job_id: int, changes: dict[str, Any], record: EditRecord | None = None
    ) -> Job:
        """Change a running service's number of replicas (``{"replicas": N}``) while it
        runs: more start at once on what is free now, fewer are stopped (the highest
        indexes). Stored, with a ``job.edited`` timeline entry, before any replica is
        started or signalled (see :meth:`.ServiceRunner.scale`). A service that waits is
        edited as any waiting job (:meth:`edit`).

        Raises:
            UnknownJob: No such id.
            JobNotActive: It is not a running service; it is stopping or being placed
                again; a scale-down's replicas are still stopping; or there is no room
                now for the replicas added (the message says why: busy, reserved for a
                waiting job, a user limit, the queue paused). Nothing changed.
            SpecError: Another field than ``replicas``, an invalid count, or a count it
                could never run with (over capacity).
        """
        record = record if record is not None else EditRecord()
        act = self.book.get(job_id)
        if act is None or act.job.kind is not JobKind.SERVICE:
            return await self.edit(job_id, changes, record)
        if act.job.status is not JobStatus.RUNNING:
            return await self.edit(job_id, changes, record)
        others = sorted(set(changes) - {"replicas"})
        if others:
            raise JobNotActive(
                f"job {job_id} runs: only its replicas change while it runs "
                f"({EDIT_WORDS.get(others[0], others[0])} only while it waits)"
            )
        if act.spec is None:
            raise JobNotActive(f"job {job_id} has no spec this version can edit")
        if changes["replicas"] is None:
            # (null, "leave it out", fell back to 1: one stray null in a client's JSON
            # scaled a service down to one replica: tester h108)
            raise SpecError(
                "replicas: a running service is scaled to a number of replicas (1-64), not null",
                "replicas",
            )
        spec = parse_spec({**act.job.spec, "replicas": changes["replicas"]})
        count, now = spec.replica_count, len(act.job.replicas)
        record.took(act.job)
        stopping = self.services.stopping(act)
        if stopping is not None:
            # (before "nothing to change": its count asked again was "nothing to change",
            # exit 0, and any other count "is stopping", exit 1: tester h144)
            raise JobNotActive(f"job {job_id} {stopping}")
        if count == act.spec.replica_count:
            return act.job  # (asked for what it has, or is going to: no timeline entry)
        refused = self.services.scale_refusal(act, count)
        if refused is not None:
            raise JobNotActive(f"job {job_id} {refused}")
        request = self.scheduler.request_for(spec, keep_gone=True)  # (pins as they were)
        verdict = self.queue.verdict(ActiveJob(act.job, spec, request))
        if verdict.possible is False:
            raise SpecError(
                f"replicas: {count} replicas could never run: {verdict.message}", "replicas"
            )
        domains: list[Domain] = []
        if count > now:
            room = self.queue.room_to_grow(act, request, count - now)
            if isinstance(room, str):
                # (a refusal: "waiting for gpu3: ..." read as if something were queued,
                # and "all 3 GPU slots busy" of a 4-GPU box left out its own: h108)
                room = room.removeprefix("waiting for a GPU: ").removeprefix("waiting for ")
                if act.job.gpus:
                    room = room.replace(" GPU slots busy", " other GPU slots busy")
                if "held by job" not in room:  # (named already: "slot held by job 18")
                    room += _holders_said(self.scheduler.candidates(request), act, request)
                raise JobNotActive(
                    f"job {job_id} cannot grow to {count} replicas now: {room} (nothing "
                    "changed; a scale-up takes only what is free)"
                )
            domains = room
        # (All before the next await: nothing else acts on the service in between.)
        self.queue.charge_so_far(act)
        self.services.scale(
            act,
            spec,
            request,
            domains,
            lambda said: self.book.record(act, EventKind.EDITED, {"message": f"scaled: {said}"}),
        )
        record.made(act.job)
        self.store.save_edit(act.job)
        self.services.scaled(act)
        await self.store.flush()
        return act.job

    async def _editable(self, job_id: int, changes: dict[str, Any]) -> ActiveJob:
        """The waiting job ``changes`` may be applied to.

        Raises:
            UnknownJob, JobNotActive, SpecError: As :meth:`edit` says.
        """
        act = self.book.get(job_id)
        if act is None or act.job.status not in (JobStatus.PENDING, JobStatus.QUEUED):
            job = await self.get(job_id)
            state = status_phrase(job.status.value)
            how = ""
            if "replicas" in changes and job.kind is JobKind.SERVICE:
                # (the README's way was not in the message: tester h98)
                # (a running one is scaled: see scale; an ended one runs again)
                how = (
                    f" (to run it again with another count of replicas: "
                    f"`submit --like {job_id} --replicas N`)"
                    if job.status.is_terminal
                    else ""
                )
            elif job.kind is JobKind.SERVICE and job.status is JobStatus.RUNNING:
                # (its one change while it runs went unsaid: tester h108)
                how = " (and a running service scaled: replicas alone)"
            raise JobNotActive(f"job {job_id} {state}: only a waiting job is edited{how}")
        unknown = sorted(set(changes) - set(self.EDITABLE))
        if unknown:
            raise SpecError(
                f"{unknown[0]}: cannot be edited (one of: {', '.join(self.EDITABLE)})", unknown[0]
            )
        if act.job.cluster_job_id is not None:
            raise JobNotActive(f"job {job_id} was submitted to its cluster already")
        if act.spec is None:
            raise JobNotActive(f"job {job_id} has no spec this version can edit")
        return act

    def _implied_gpus_left_out(
        self, old: dict[str, Any], changes: dict[str, Any]
    ) -> dict[str, Any]:
        """``changes`` less a GPU count that the job has already: none set is 0 GPUs, or
        1 with a GPU domain pinned or a VRAM amount ("gpus 0 -> 0" and "gpus 1 -> 1" were
        said, and a timeline entry written: testers h110, h115); and so a ``null`` count
        (back to that default) where the job's count is the default's (``gpus: null`` of
        a 1-GPU job with a VRAM amount answered "changed" and wrote "gpus 1 -> 1": h143)."""
        rest = {key: value for key, value in changes.items() if key != "gpus"}
        try:
            asked = self.scheduler.request_for(parse_spec({**old, **changes}))
            implied = self.scheduler.request_for(parse_spec({**old, **rest}))
        except (SpecError, ValueError):
            return changes  # (refused below, in the edit's own words)
        return rest if asked == implied else changes

    async def _edited_dependencies(self, job_id: int, spec: JobSpec) -> list[ResolvedDep]:
        """``spec``'s dependencies, resolved, for an edit of ``job_id``.

        Raises:
            SpecError: One names no job, the job itself, a job that waits for it (they
                would wait for each other for ever), or a job that ended without
                completing (it would be cancelled at once) unless ``any_exit``.
        """
        for dep in spec.dependencies:
            if dep.job == job_id:
                raise SpecError(f"depends_on: job {job_id} cannot wait for itself", "depends_on")
        deps = await self.queue.resolve_dependencies(spec)
        waits_for_us = self.queue.waits_for(job_id, [dep_id for dep_id, _, _ in deps])
        if waits_for_us is not None:
            raise SpecError(
                f"depends_on: job {waits_for_us} waits for job {job_id} (directly or through "
                "others): they would wait for each other for ever",
                "depends_on",
            )
        for dep_id, any_exit, status in deps:
            if status is not None and status is not JobStatus.COMPLETED and not any_exit:
                raise SpecError(
                    f"depends_on: job {dep_id} ended {status.value}: job {job_id} would be "
                    "cancelled at once (wait for any end: --after-any, any_exit in a spec; "
                    "or leave it out)",
                    "depends_on",
                )
        return deps

    async def restart(
        self,
        job_id: int,
        owner_uid: int | None = None,
        left_out: list[int] | None = None,
        warnings: list[str] | None = None,
    ) -> Job:
        """Submit a finished job again: its spec, a new id, ``restart_of`` naming the old
        one (a snapshot is made afresh from where the old one was taken). Dependencies
        cleaned from the history since are left out (they had ended before the job ran),
        said in its submission's timeline entry and added to ``left_out``. A job restarted
        already by a job that has not ended (or by a restart being made at this moment:
        two clients) is restarted again, and ``warnings`` says it runs a second time.

        Raises:
            UnknownJob: No such id.
            JobNotActive: (inverted) It has not ended yet: there is nothing to restart.
            SpecError: It is an adopted process (nobody has its command to run), or it
                waited for a job that ended without completing and that was not restarted
                since (or whose restart also failed): it would be cancelled at once.
        """
        job = await self.get(job_id)
        if not job.status.is_terminal:
            state = status_phrase(job.status.value)
            raise JobNotActive(f"job {job_id} {state}: only an ended job restarts")
        if job.kind is JobKind.ADOPTED:
            raise SpecError(f"job {job_id} {ADOPTED_NOT_RUN}", "job")
        self._restarting[job_id] = self._restarting.get(job_id, 0) + 1
        try:
            twice = await self._restarted_already(job_id)
            new = await self._restart(job, owner_uid, left_out)
        finally:
            if self._restarting[job_id] <= 1:
                del self._restarting[job_id]
            else:
                self._restarting[job_id] -= 1
        if twice and warnings is not None:
            # (two clients restarted one failed job and made two runs of it, with no word
            # to either: tester h162)
            warnings.append(f"job {job_id} {twice}; job {new.id} runs it again")
        return new

    async def roll(self, job_id: int, warnings: list[str] | None = None) -> list[int]:
        """Restart a running service's replicas one at a time, each once the one before
        it is up again (see :meth:`.ServiceRunner.roll`); decided and stored, with a
        ``job.edited`` timeline entry, before the first replica is signalled.

        Args:
            job_id: The running service.
            warnings: Given what the caller should know: a service of one replica does
                not serve while it restarts.

        Returns:
            The indexes of the replicas restarted, in order.

        Raises:
            UnknownJob: No such id.
            JobNotActive: It is not a running service, it is stopping or being placed
                again, or a rolling restart of it is under way. Nothing changed.
        """
        act = self.book.get(job_id)
        if (
            act is None
            or act.job.kind is not JobKind.SERVICE
            or act.job.status is not (JobStatus.RUNNING)
        ):
            job = await self.get(job_id)
            state = status_phrase(job.status.value)
            what = "a running service" if job.kind is JobKind.SERVICE else "a service"
            raise JobNotActive(
                f"job {job_id} {state}: only {what} restarts its replicas one at a time "
                "(an ended job restarts as a new job)"
            )
        refused = self.services.roll_refusal(act)
        if refused is not None:
            raise JobNotActive(f"job {job_id} {refused}")
        # (All before the next await: nothing else acts on the service in between.)
        indexes = self.services.roll(
            act, lambda said: self.book.record(act, EventKind.EDITED, {"message": said})
        )
        if len(indexes) == 1 and warnings is not None:
            warnings.append(
                f"job {job_id} has one replica: it serves nothing until that one is up again"
            )
        await self.store.flush()
        return indexes

    async def _restarted_already(self, job_id: int) -> str:
        """How ``job_id``'s spec is being run again already ("" when it is not): by a
        restart of it, or of a job of its line (a restart of its restart, of the job it
        restarted, ...), that has not ended; or by a restart of it being made at this
        moment. (Only its newest restart was looked at: a restart of a restart, and an
        older restart still running, went unsaid: tester h166.)"""
        if self._restarting.get(job_id, 0) > 1:
            return "is being restarted by another request at this moment"
        roots: dict[int, int] = {}
        line = await self._first_of_line(job_id, roots)
        others = []
        for act in list(self.book):
            job = act.job
            of = job.spec.get("restart_of")
            if not isinstance(of, int) or job.status.is_terminal:
                continue
            if await self._first_of_line(job.id, roots) == line:
                how = "" if of == job_id else f", a restart of job {of}"
                others.append((job.id, f"{job.id} ({job.status.value}{how})"))
        if not others:
            return ""  # (running it again after its restarts ended: the usual retry)
        said = [words for _, words in sorted(others)]
        jobs = f"job {said[0]} has" if len(said) == 1 else f"jobs {', '.join(said)} have"
        return f"was restarted already: {jobs} not ended"

    async def _first_of_line(self, job_id: int, seen: dict[int, int]) -> int:
        """The job ``job_id`` restarts, and the one that restarts, ... up to the first
        (``seen``: the answers found so far, kept by the caller)."""
        walked = []
        current = job_id
        for _ in range(1000):  # (a line is as long as its restarts: never a circle)
            if current in seen:
                current = seen[current]
                break
            walked.append(current)
            try:
                of = (await self.get(current)).spec.get("restart_of")
            except UnknownJob:
                break  # (cleaned from the history: the line is known from here)
            if not isinstance(of, int):
                break
            current = of
        for job in walked:
            seen[job] = current
        return current

    async def _restart(self, job: Job, owner_uid: int | None, left_out: list[int] | None) -> Job:
        job_id = job.id
        spec = {k: v for k, v in job.spec.items() if k not in ("restart_of",)}
        deps = spec.get("depends_on") or []
        note = ""
        if deps:
            # A dependency cleaned from the history since had ended before this job ran
            # (met, or it would not have run): left out, or the restart was refused for
            # ever ("depends_on: no job 1", a field the user never typed).
            ids = {_dependency_id(d) for d in deps}
            kept = await self.store.existing({i for i in ids if i is not None})
            spec["depends_on"] = [
                await self._restarted_dependency(job_id, d)
                for d in deps
                if _dependency_id(d) in kept
            ]
            gone = sorted({i for i in ids if i is not None and i not in kept})
            if gone:
                # (said: the new job's spec just had fewer, and nothing told why: h145)
                words = ", ".join(map(str, gone))
                note = (
                    f"restart of job {job_id}: its dependency on job{'s' if len(gone) > 1 else ''}"
                    f" {words} left out (cleaned from the history; ended before job {job_id} ran)"
                )
                if left_out is not None:
                    left_out.extend(gone)
        snapshot = spec.get("snapshot")
        if isinstance(snapshot, dict):
            # A new copy of the folder it was submitted from, run at the same place in it
            # (its cwd, which the record leaves as given: the copy's source is the repo's
            # top, and a job submitted from repo/sub ran again in repo: tester h156).
            spec["snapshot"] = True
            spec["cwd"] = spec.get("cwd") or snapshot.get("source")
        return await self.admission.resubmit(spec, owner_uid, restart_of=job_id, note=note)

    async def _restarted_dependency(self, job_id: int, dep: Any) -> Any:
        """A dependency of ``job_id`` as its restart should wait for it.

        A dependency that ended without completing (which cancelled ``job_id``) is
        replaced by its newest restart, followed down its line (restart A, then B: B's
        restart waits for A's). Without one the restart would be cancelled at once, a new
        id spent on a job that never runs: it is refused, saying what to do.

        Raises:
            SpecError: The dependency failed and has no restart, or its restart ended
                without completing too.
        """
        dep_id = _dependency_id(dep)
        if dep_id is None or (isinstance(dep, dict) and dep.get("any_exit")):
            return dep
        dependency = await self.get(dep_id)
        status = dependency.status
        current = dep_id
        while status.is_terminal and status is not JobStatus.COMPLETED:
            newer = await self.store.newest_restart(current)
            if newer is None:
                break
            current = newer
            status = (await self.get(current)).status
        if status.is_terminal and status is not JobStatus.COMPLETED:
            which = "which" if current == dep_id else f"whose newest restart, job {current},"
            # (An adopted process is never run again: "restart job 10 first" was refused
            # in turn: tester h51.)
            first = (
                ""
                if dependency.kind is JobKind.ADOPTED
                else f"restart job {current} first, and this job's restart waits for that one; or "
            )
            raise SpecError(
                f"depends_on: job {job_id} waited for job {dep_id}, {which} ended "
                f"{status.value}: its restart would be cancelled at once ({first}submit "
                f"--like {job_id} with other --after)",
                "depends_on",
            )
        if current == dep_id:
            return dep
        return {**dep, "job": current} if isinstance(dep, dict) else current

    async def _database_moved(self, state_id: str) -> str | None:
        """The id of the state dir this database was last used in, if not this one's
        (``None`` too for a database from before ids were kept in it). Noted as this
        one's from now on."""
        mine = int(state_id, 16)
        stored = await self.store.setting(STATE_ID_SETTING)
        if stored != mine:
            self.store.save_setting(STATE_ID_SETTING, mine)
        if stored is None or stored == mine:
            return None
        return f"{stored:x}"

    def _lost_with_their_state_dir(self, active: list[Job], other: str) -> list[Job]:
        """A database copied from another state dir (a backup restored, a copy to a new
        disk): its running jobs are that dir's launcher's, not this one's. They are ended
        here as lost, their processes never touched; the waiting ones stay (they run
        here). A copy's engine started them a second time, and took a running service's
        replica for its own, its cancel killing the other dir's process (tester h66)."""
        left = []
        for job in active:
            if job.status is not JobStatus.RUNNING:
                left.append(job)
                continue
            act = self.book.restore(job, None, None)
            self.book.finish(
                act,
                JobStatus.FAILED,
                TerminationReason.ENGINE_LOST,
                f"this database was copied from another state dir (state id {other}; this "
                f"one's is {self.clusters.tag}): the job ran there, under that dir's "
                "launcher, which this engine does not reach; not touched here, and not "
                "run again (gpulayer-tui restart runs it anew)",
            )
            log.warning(
                "job %d was running in the state dir this database was copied from: ended "
                "here as lost, its processes left alone",
                job.id,
            )
        return left

    def _state_id(self) -> str:
        """This state dir's random id (made once): names its jobs on a shared cluster, so
        another state dir's job of the same number is never taken for one of ours."""
        path = self.paths.state_dir / "state-id"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as existing:
                text = existing.read().strip()
            if text.isalnum() and 8 <= len(text) <= 32:
                return text
            raise StoreError(f"{path} holds no valid state id; remove it") from None
        made = os.urandom(6).hex()
        with os.fdopen(fd, "w") as new:
            new.write(made + "\n")
        return made

    def _build_domains(self, sample: Sample, known: set[str] | None = None) -> None:
        result = sample.result
        if result.status is ProbeStatus.ERROR:
            log.warning("GPUs could not be read at start: %s", result.message)
        if result.status is ProbeStatus.NO_DRIVER:
            # Said once, by whoever shows the engine (the --serve banner, the TUI header).
            self.no_gpu_notice = result.message
        # With capacity unknown (ERROR) the configured domains stay unverified rather than
        # refusing to run; over-capacity verdicts wait until the GPUs can be read.
        missing: dict[str, int | str] = {}
        plans = plan_domains(
            self.config, result.gpus, self.cpu_count, str(self.paths.config_file), missing
        )
        typos = [n for n in missing if n not in (known or set())]
        if typos:  # (never seen here: refused, naming it, as before)
            only = {n: d for n, d in self.config.domains.items() if n in typos}
            plan_domains(
                self.config.model_copy(update={"domains": only}),
                result.gpus,
                self.cpu_count,
                str(self.paths.config_file),
            )
        for name, gpu in missing.items():
            log.warning(
                "domains.%s: GPU %s is not found by the driver: the domain is left out until "
                "it is (jobs pinned to it wait)",
                name,
                gpu,
            )
        self.scheduler.configured_missing = missing
        self.scheduler.replace_domains(
            Domain(p.name, p.gpu_index, p.gpu_uuid, p.slots) for p in plans
        )

    async def stop(self) -> None:
        """Stop sampling and serving. Running jobs keep running (they outlive the engine)."""
        self.mark_stopping()
        await self.notifier.stop()
        await self.retention.stop()
        await self.config_reload.stop()
        await self.sampler.stop()
        await self.clusters.close()
        self.usage.save_all()  # (running jobs' series go on after the next start)
        self.batch.close()
        self.adopter.close()
        self.services.close()
        self.queue.close()
        await self.store.close()  # (commits what is queued; after-commit acks go out)
        await self.executor.close()
        self.watcher.close()
        self.bus.close()
        self._lock.release()

    def mark_stopping(self) -> None:
        """Say this engine is stopping: an engine started meanwhile for the same state dir
        waits for it to let go (:data:`~.lock.STOPPING_WAIT_S`) instead of being refused."""
        self._lock.mark_stopping()

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._lock.held

    # -- jobs ---------------------------------------------------------------------------------

    async def submit(
        self,
        data: Any,
        owner_uid: int | None = None,
        key: str | None = None,
        digest: str | None = None,
    ) -> Job:
        """Validate and submit one job (see :meth:`submit_many`)."""
        return (await self.admission.submit_many([data], owner_uid, key, digest))[0]

    async def submit_many(
        self,
        items: list[Any],
        owner_uid: int | None = None,
        key: str | None = None,
        digest: str | None = None,
    ) -> list[Job]:
        """Submit several jobs in one commit; ``key`` makes a retry return the first
        attempt's jobs (see :meth:`.Admission.submit_many`; ``digest``: what the request
        asked for, when the caller has it cheaper than the items' JSON)."""
        return await self.admission.submit_many(items, owner_uid, key, digest)

    def _start_job(self, act: ActiveJob, domains: list[Domain]) -> None:
        """The queue placed a job: its runner holds the domains and launches it."""
        if act.job.kind is JobKind.SERVICE:
            self.services.start(act, domains)
        else:
            self.batch.start(act, domains)

    async def get(self, job_id: int) -> Job:
        """One job (see :meth:`.JobReader.get`)."""
        return await self.reads.get(job_id)

    async def job_detail(self, job_id: int) -> tuple[JobJSON, list[dict[str, Any]]]:
        """One job and its timeline, read together (see :meth:`.JobReader.detail`); an
        active job's says which waiting jobs its end other than completed would cancel
        (``cancels_dependents``, ``[]`` when none; an ended job's has no such field)."""
        job, events = await self.reads.detail(job_id)
        if self.book.get(job_id) is not None:
            # (always there while it applies: a script read a missing field as "none"
            # and could not tell it from an ended job's: tester h178)
            job["cancels_dependents"] = self.queue.cancelled_with(job_id)
        return job, events

    async def events_of(self, job_id: int) -> list[dict[str, Any]]:
        """The job's timeline (every transition with time, reason and message)."""
        return (await self.reads.detail(job_id))[1]

    async def list_jobs(
        self, statuses: list[str] | None = None, limit: int = 1000, before_id: int | None = None
    ) -> list[Job]:
        """Jobs newest first (see :meth:`.JobReader.list`)."""
        return await self.reads.list(statuses, limit, before_id)

    def job_rows(self, query: JobQuery) -> AsyncGenerator[list[JobRowJSON], None]:
        """Job rows (the spec cut to what a table shows), in chunks, with paging, filter
        and sort served by SQLite (see :meth:`.JobReader.rows`)."""
        return self.reads.rows(query)

    async def why(self, job_id: int) -> dict[str, Any]:
        """Why a job waits (see :meth:`.JobQueue.explain`); a job that is not active says
        how it ended.

        Raises:
            UnknownJob: No such id.
        """
        job = await self.get(job_id)
        if job.id not in self.book:
            return {
                "job": job_id,
                "status": job.status.value,
                "waiting": False,
                "reason": job.message,
            }
        return self.queue.explain(job_id)

    async def usage_of(self, job_id: int) -> UsageJSON:
        """What a job used of its GPUs (see :meth:`.JobReader.usage`)."""
        return await self.reads.usage(job_id)

    def _usage_facts(self, job_id: int) -> tuple[float | None, int | None] | None:
        """When a running job started and the VRAM it declared per GPU (bytes)."""
        act = self.book.live(job_id)
        if act is None or act.job.status is not JobStatus.RUNNING:
            return None
        vram_gb = act.spec.vram_gb if act.spec is not None else None
        return act.job.started_at, None if vram_gb is None else int(vram_gb * GIB)

    def _preempt(self, victim: ActiveJob, by: ActiveJob) -> None:
        """Stop ``victim`` (preemptible, lower priority) so that ``by`` can start."""
        settings = self.config.scheduling
        self.batch.preempt(
            victim,
            f"preempted by job {by.job.id} (priority {by.job.priority})",
            settings.checkpoint_signal,
            settings.checkpoint_grace,
        )

    def _idle_warning(self, job_id: int, message: str, stop: bool) -> None:
        """[policy] idle_after passed: say so in the job's timeline and message; with
        ``idle_action = "stop"``, cancel it with that reason."""
        act = self.book.live(job_id)
        if act is None or act.job.status is not JobStatus.RUNNING:
            return
        self.book.record(act, EventKind.IDLE, {"message": message})
        if stop:
            self._cancel(act, f"stopped by [policy]: {message}")
        elif act.job.kind is JobKind.COMMAND:
            self.book.note(act, message)

    async def cancel(self, job_id: int, by: str | None = None, *, flush: bool = True) -> Job:
        """Cancel a job: at once if it has not started, else SIGTERM then SIGKILL.

        Args:
            job_id: The job.
            by: Who cancels it, where not its owner (``uid 0 (root)``): said in its
                message, "cancelled by user" read as its owner's doing on a shared box.
            flush: Return once the cancel is durable; ``False`` for one of many, whose
                caller flushes once after the last (its signals wait for that commit).

        Raises:
            UnknownJob: No such id.
            JobNotActive: It already ended (the message says how).
        """
        act = self.book.get(job_id)
        if act is None:
            job = await self.get(job_id)
            raise JobNotActive(f"job {job_id} already {job.status.value}")
        self._cancel(act, f"cancelled by {by}" if by else "cancelled by user")
        if flush:
            await self.store.flush()
        return act.job

    def pinned_waits(self, jobs: list[Job]) -> list[str]:
        """What a submitter is told of those of ``jobs`` that wait for a domain they are
        pinned to to be back in service (:meth:`.DomainOps.pins_out_of_service`)."""
        waiting = []
        for job in jobs:
            act = self.book.get(job.id)
            if act is None or act.spec is None or act.job.status is not JobStatus.QUEUED:
                continue
            pins = act.spec.pinned_domains
            if pins and act.request is not None and act.spec.cluster is None:
                waiting.append((job.id, pins, act.request.gpus))
        return self.domain_ops.pins_out_of_service(waiting) if waiting else []

    def _cancel(self, act: ActiveJob, message: str) -> None:
        if act.spec is not None and act.spec.cluster is not None:
            self.clusters.stop(act, TerminationReason.CANCELLED, message)
            return
        if act.job.status in (JobStatus.PENDING, JobStatus.QUEUED):
            self.book.finish(act, JobStatus.CANCELLED, TerminationReason.CANCELLED, message)
        elif act.job.status is JobStatus.RUNNING:
            self._runners[act.job.kind].stop(act, TerminationReason.CANCELLED, message)
            if act.job.stop_reason is TerminationReason.CANCELLED:
                # It ends cancelled whatever its exit: the jobs waiting for it to complete
                # are cancelled now, in the same commit, as the answer says ("cancelled
                # too"). They read "waiting for job 79" for its whole grace period (h192).
                self.queue.cancel_dependents(act.job.id)

    async def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Wait until the job is terminal (and durable); return it.

        Raises:
            UnknownJob: No such id.
            TimeoutError: ``timeout`` passed first.
        """
        await self.book.wait(job_id, timeout)
        return await self.get(job_id)

    async def adopt(
        self,
        request: AdoptRequest,
        requester_uid: int | None = None,
        requester_pid: int | None = None,
    ) -> Job:
        """Adopt a running process as a job (see :meth:`.Adopter.adopt`)."""
        job = await self.adopter.adopt(request, requester_uid, requester_pid)
        self.queue.schedule_soon()  # its holds change what can start
        if job.status is JobStatus.RUNNING and self.running:
            # A sample now, so its memory is counted as the job's when the answer comes
            # (`adopt` then `gpus` showed it owned and unregistered at once, till the next
            # tick); a hung read does not hold the answer past a moment.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.sampler.sample_once()), 2.0)
        return job

    def log_path(self, job_id: int, replica: int | None = None) -> Path:
        """Where the job's output is (see :meth:`.JobReader.log_path`)."""
        return self.reads.log_path(job_id, replica)

    # -- machine ------------------------------------------------------------------------------

    def subscribe(self) -> Subscription:
        """Receive every event published from now on."""
        return self.bus.subscribe()

    def gpus(self) -> GpusJSON:
        """Domains with their latest sample, VRAM accounting and history."""
        view = gpus_view(self.scheduler, self.sampler, self.probe.backend, self.no_gpu_notice)
        if self.clusters.names:
            view["clusters"] = self.clusters.views()
        return view

    def health(self) -> HealthJSON:
        """Engine identity and overall state."""
        running = sum(1 for act in self.book if act.job.status is JobStatus.RUNNING)
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
            "active_jobs": len(self.book),
            "running_jobs": running,
            "waiting_jobs": len(self.book) - running,
            "store_failure": self.store.failure,
            "launcher_problem": self.executor.problem,
            "paused_at": self.paused_at,
        }

    SIGNALS = ("TERM", "INT", "HUP", "KILL", "USR1", "USR2", "STOP", "CONT")

    def signal_process(
        self, pid: int, name: str, start_ticks: int | None, requester_uid: int | None
    ) -> str:
        """Send ``SIG<name>`` to a stray GPU process (one the latest sample shows on a GPU,
        owned by no job): the same process only (pid + start time, through a pidfd), the
        requester's own (or anyone's for root), never init, this engine, gpulayer-tui's own
        processes or a kernel thread (a job's processes: cancel the job). Returns what was
        done, in words.

        Raises:
            SpecError: The signal or the process is refused (the message says which and
                why).
            Forbidden: The process is another user's.
        """
        if name.upper().removeprefix("SIG") not in self.SIGNALS:
            raise SpecError(f"signal: one of {', '.join(self.SIGNALS)}, not {name!r}", "signal")
        signum = getattr(signal, "SIG" + name.upper().removeprefix("SIG"))
        leader = thread_group_of(pid)
        if leader is not None:  # (a signal to a thread's id goes to its whole process)
            raise SpecError(f"pid {pid} is a thread of process {leader}, not a process", "pid")
        snapshot = read_process(pid)
        if snapshot is None:
            raise SpecError(procs.gone_words(pid), "pid")
        never = self.adopter.never_touched(pid, snapshot)
        if never is not None:
            raise SpecError(never, "pid")
        if start_ticks is not None and start_ticks != snapshot.start_ticks:
            raise SpecError(f"pid {pid} is a different process now: the pid was reused", "pid")
        sample = self.sampler.latest
        on_gpu = sample is not None and pid in sample.owners and sample.owners[pid] is None
        if not on_gpu:
            raise SpecError(f"pid {pid} is not a stray GPU process (none is seen on a GPU)", "pid")
        if requester_uid not in (None, 0) and requester_uid != snapshot.uid:
            raise Forbidden(
                f"pid {pid} belongs to {procs.user_name(snapshot.uid)}; "
                f"{procs.user_name(requester_uid)} may signal only its own processes"
            )
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise SpecError(f"no process with pid {pid} (it exited)", "pid") from None
        try:
            again = read_process(pid)
            if again is None or again.start_ticks != snapshot.start_ticks:
                raise SpecError(f"pid {pid} exited or was reused while asked", "pid")
            signal.pidfd_send_signal(fd, signum)
            if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                # (a stopped process takes it only once continued: "SIGTERM sent" and
                # nothing happened to a stray stopped with ctrl+z; tester h171)
                with contextlib.suppress(ProcessLookupError):
                    # (ended by the signal and reaped already: it was sent, and a 500
                    # said it failed; tester h179)
                    signal.pidfd_send_signal(fd, signal.SIGCONT)
        except PermissionError:
            raise SpecError(
                f"pid {pid} belongs to {procs.user_name(snapshot.uid)}: this engine may not "
                "signal it",
                "pid",
            ) from None
        finally:
            os.close(fd)
        # (cut with a mark: "...signal.signal(signal.SIGTERM,)" read as the command: h97)
        command = cut_to_length(snapshot.command, 80)
        what = f"SIG{name.upper().removeprefix('SIG')} sent to pid {pid} ({command})"
        log.warning("%s, asked by uid %s", what, requester_uid)
        return what

    def process_info(
        self, pid: int, requester_uid: int | None = None, requester_pid: int | None = None
    ) -> ProcessInfoJSON | None:
        """What /proc says about ``pid`` (to confirm an adoption), the GPU memory the
        latest sample saw it hold, and why it can never be adopted (a job's already, this
        engine..., or, by ``requester_uid``, another user's; or by ``requester_pid``, a
        process it runs below: the shell the TUI runs in); ``None`` if gone."""
        snapshot = read_process(pid)
        if snapshot is None:
            return None
        leader = thread_group_of(pid)
        info: ProcessInfoJSON = {
            "pid": pid,
            "start_ticks": snapshot.start_ticks,
            "uid": snapshot.uid,
            "user": procs.user_name(snapshot.uid),
            "command": snapshot.command,
            "started_at": procs.started_at(snapshot.start_ticks),
            # (the name an adoption with none gives it: the TUI's dialog offers it; made
            # there from the command's escaped text, it split at a space in a path: h163)
            "name": default_name(pid, snapshot),
        }
        sample = self.sampler.latest
        held = {
            gpu.index: proc.used_bytes or 0
            for gpu in (sample.result.gpus if sample is not None else ())
            for proc in gpu.processes
            if proc.pid == pid
        }
        if held:
            info["gpus"] = sorted(held)
            info["used_bytes"] = sum(held.values())
            info["most_on_a_gpu"] = max(held.values())
        # (another user's too: the TUI's dialog offered its adoption, each try a failed job)
        refused = self.adopter.never_adopted(pid, snapshot) or self.adopter.not_theirs(
            pid, snapshot, requester_uid
        )
        if leader is not None:
            # (a thread's id: its process's command line was shown as its own, and the
            # adoption then refused it; tester h197)
            refused = f"pid {pid} is a thread of process {leader}: adopt {leader} instead"
        if refused is None and requester_pid is not None:
            # (the TUI's dialog opened for the shell it runs in, each try a failed job: h99)
            asker = runs_the_asker(pid, snapshot, requester_pid, typed=False)
            refused = asker[1] if asker is not None else None
        if refused is not None:
            info["refused"] = refused
        return info

    def _forget_log_cuts(self, act: ActiveJob) -> None:
        if self._log_cuts:
            for key in [k for k, tally in self._log_cuts.items() if tally[0] == act.job.id]:
                del self._log_cuts[key]

    async def _restore_fair_share(self) -> None:
        """Each user's fair-share use as stored when it was booked; from a database that
        kept none yet (older), rebuilt once from the GPU jobs that ended lately. Stored
        from then on as it is booked (rebuilt from job rows at every start, it lost what
        `clean` removed, and a preempted job's earlier runs)."""
        fair = self.queue.fair
        if await self.store.setting("fair_usage_kept"):
            for uid, used, at in await self.store.fair_usages():
                fair.restore(uid, used, at)
        else:
            half_life = self.config.scheduling.fairshare_half_life
            for uid, gpus, started, ended in await self.store.gpu_history(
                time.time() - 10 * half_life
            ):
                fair.charge(uid, gpus * max(0.0, ended - started), ended)
            now = time.time()
            for uid in fair.users():
                self.store.save_fair_usage(uid, fair.usage(uid, now), now)
            self.store.save_setting("fair_usage_kept", 1)
        fair.on_change = self.store.save_fair_usage

    def _log_total(self, act: ActiveJob, total: int) -> None:
        """A job ended with ``total`` bytes of output dropped by its log's cuts, as its
        launcher counted them: said in its end where this engine saw fewer (cuts made
        while no engine ran; ended so, its message kept the last total one had seen)."""
        tally = self._log_cuts.get(act.job.id)
        if tally is not None and tally[0] == act.job.id and tally[2] == total:
            return
        if act.log_note and f" {total} bytes" in act.log_note:
            return
        limit = self.config.logs.max_bytes
        act.log_note = (
            f"{LOG_CUT}its log passed [logs] max_bytes ({limit} bytes): "
            f"cut back, {total} bytes dropped in all"
        )

    def _log_cut(
        self, key: TaskKey, dropped: int, kept: int, limit: int | None, total_dropped: int | None
    ) -> None:
        act = self.book.get(key[0] if isinstance(key, tuple) else key)
        tally = self._log_cuts.pop(key, None)
        if act is None:
            return
        if tally is None or tally[0] != act.job.id:
            tally = (act.job.id, 0, 0, 0.0)
        _, cuts, seen, noted_at = tally
        cuts, seen = cuts + 1, seen + dropped
        # (The spawner's count, as its note says, is of every cut: this engine's own sum
        # started from 0 after a restart, and disagreed with the note.)
        total = total_dropped if total_dropped is not None else seen
        which = f"replica {key[1]}'s log" if isinstance(key, tuple) else "its log"
        # (The limit the job was started with: a reload since changes the next jobs'.)
        limit = self.config.logs.max_bytes if limit is None else limit
        message = f"{which} passed [logs] max_bytes ({limit} bytes): "
        # ("the last N kept" read as what the log holds: it grows after a cut)
        at_cut = f"{kept} kept at the last cut"
        if kept > limit:
            # (a writer as fast as `yes` adds megabytes while a cut is made: "2508306 kept"
            # of a 1 MiB cap read as a cap not kept: tester h63)
            at_cut += ", with what it wrote during that cut (cut back again next)"
        if total <= dropped:
            message += f"the first {dropped} bytes were dropped, {at_cut}"
        elif total == seen:  # (every cut seen here: their count is known)
            message += f"cut back {cuts} times, {total} bytes dropped in all, {at_cut}"
        else:
            message += f"cut back again, {total} bytes dropped in all, {at_cut}"
        now = time.monotonic()
        if cuts == 1 or now - noted_at >= LOG_NOTE_EVERY_S:
            # Recorded at most once a minute: a runaway writer is cut back many times a
            # second, and each cut was a timeline entry and a row write (90 a second).
            self.book.log_cut(act, message)
            noted_at = now
        else:
            act.log_note = f"{LOG_CUT}{message}"  # (its final message says the total)
        self._log_cuts[key] = (act.job.id, cuts, seen, noted_at)

    def _latest_sample(self) -> Sample | None:
        return self.sampler.latest

    async def _sample_now(self) -> Sample:
        return await self.sampler.sample_once()

    def _on_sample(self, sample: Sample) -> None:
        before = self.scheduler.capacity_signature()
        readings = self.scheduler.observe(sample.result, sample.owners, sample.info)
        if not self.scheduler.domains:
            return  # the first sample, before the domains exist
        self.usage.observe(sample.taken_at, self.scheduler.domains.values())
        if sample.result.status is ProbeStatus.OK:
            self.domain_ops.observe(readings, sample.taken_at)
        if self.scheduler.capacity_signature() != before:
            self.queue.recheck_capacity()
        self.queue.schedule_soon()
        if self.bus.has_subscribers:
            view = gpus_view(
                self.scheduler, self.sampler, self.probe.backend, self.no_gpu_notice, False
            )
            if self.clusters.names:  # (the dashboard's cluster panel follows these)
                view["clusters"] = self.clusters.views()
            self.bus.publish(self.bus.make(EventKind.GPU_SAMPLE, None, dict(view)))


class _ByPlace:
    """The runner of ``command`` jobs: this machine's, or its cluster's (issue 16)."""

    def __init__(self, local: BatchRunner, clusters: ClusterRunner) -> None:
        self._local = local
        self._clusters = clusters

    def _of(self, act: ActiveJob) -> Runner:
        on_cluster = act.spec is not None and act.spec.cluster is not None
        return self._clusters if on_cluster else self._local

    def stop(self, act: ActiveJob, reason: TerminationReason, message: str) -> None:
        """Stop it where it runs."""
        self._of(act).stop(act, reason, message)

    def reattach(self, act: ActiveJob) -> None:
        """Take it back where it runs."""
        self._of(act).reattach(act)
