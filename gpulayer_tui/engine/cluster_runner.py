"""Cluster jobs: the same jobs, run by a Slurm cluster instead of this machine (issue 16).

A job with ``cluster = "NAME"`` never enters the local run queue: once its dependencies
are met the queue hands it here. Record 003 carries over:

* **Over capacity** is decided from the partition (largest node's GPUs, memory, CPUs;
  the partition's time limit) when the job is submitted; a request no node can ever
  satisfy fails at once, naming the partition and the largest node.
* **Queued with a reason**: a pending job shows Slurm's reason in plain words.
* **Cannot tell**: while the cluster does not answer, jobs keep their state and say
  since when it has not answered; nothing is failed on a guess.

Durable before acted on: the decision to submit is committed (the job says "submitting
to cluster NAME") before ``sbatch`` runs, and the cluster's job id is stored with the job
at once; a restarted engine looks a job without an id up by its Slurm name before
submitting it, so a job is never submitted twice. A cancel is stored, then ``scancel``
is sent. One ``squeue`` per cluster per tick follows every job, however many there are.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .batch import JobEnv, argv_of
from .config import ClusterSettings
from .jobbook import ActiveJob, JobBook
from .models import Job, JobStatus, TerminationReason
from .scheduler import Verdict
from .slurm import (
    PENDING_STATES,
    RUNNING_STATES,
    ClusterError,
    Partition,
    SlurmCluster,
    SlurmJob,
    end_of,
    ended,
    minutes,
    pending_words,
)
from .tasks import cancel_and_wait

Reason = TerminationReason
log = logging.getLogger(__name__)

SBATCH_AHEAD = 8
"""sbatch processes started ahead of their turn per cluster (waiting for their script)."""


class Turns:
    """Tickets served in the order they were taken: the sbatch calls of one cluster go to
    its controller one at a time, in the order the jobs were decided (eight at once
    reached it in any order, and a ``submit --file``'s later lines got the lower ids and
    ran first on a first-in-first-out partition: tester h150). A ticket whose holder
    gives up before its turn is passed over."""

    def __init__(self) -> None:
        self._taken = 0
        self._current = 0
        self._finished: set[int] = set()
        self._moved = asyncio.Event()

    def take(self) -> int:
        """The next ticket (taken in the order the submissions were decided)."""
        self._taken += 1
        return self._taken - 1

    async def wait(self, ticket: int, ahead: int = 0) -> None:
        """Return once ``ticket`` is served, or is at most ``ahead`` behind the one that is."""
        while ticket > self._current + ahead:
            moved = self._moved
            await moved.wait()

    def done(self, ticket: int) -> None:
        """``ticket``'s turn is over (or given up): the next ones move up."""
        self._finished.add(ticket)
        while self._current in self._finished:
            self._finished.discard(self._current)
            self._current += 1
        self._moved.set()
        self._moved = asyncio.Event()


SUBMITTING = "submitting to cluster "  # how the decision to submit reads (and is found)
PROBE_EVERY = 6  # partitions are read again every this many polls
# Seconds an sbatch that went unanswered, and the cluster answering again, must be past
# before a job it may have submitted is taken as never submitted (see ClusterRunner._unsure).
UNSURE_WAIT_S = 15.0
# Seconds a job may be missing from both squeue and accounting before it is given up on
# (slurmdbd may store an end a moment after the controller forgot the job).
FORGOTTEN_AFTER_S = 30.0


def _stop_said(act: ActiveJob) -> str:
    """A stop decided for a job still being submitted, as its message ends with it."""
    job = act.job
    if job.stop_reason is None:
        return ""
    return f": stopping ({job.stop_message}) once it answers"


def _began(job: Job, found: SlurmJob) -> float | None:
    """When a cluster job's run began: Slurm's start time, but not before it was queued
    here (Slurm's times are whole seconds, and its clock may run behind ours: a job that
    ran within its first second ended, in the timeline, before it was submitted)."""
    if not found.start_time:
        return None
    # (nor after now: a clock ahead of ours put its start in the future)
    return min(time.time(), max(found.start_time, job.queued_at or job.created_at or 0.0))


def _ended(job: Job, found: SlurmJob) -> float | None:
    """When a cluster job's run ended: Slurm's end time, moved as far as its start was
    (:func:`_began` puts a start within the second it was queued at the queueing, and a
    3 s job ran "2 s": Slurm's whole-second end less our fractional start; tester h195),
    so its runtime is Slurm's."""
    end, start = found.end_time, found.start_time
    if end is None or not start or job.started_at is None:
        return end
    shift = job.started_at - start
    if not 0 < shift < 1.0:
        return end
    return max(end, min(end + shift, time.time()))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


class ClusterRunner:
    """Runs cluster jobs through their Slurm cluster (see the module docstring).

    Args:
        book: The active jobs.
        settings: ``[clusters.*]``.
        log_path: Where a job's output goes (the cluster writes it; a shared filesystem).
        tag: Names this engine's jobs on a cluster (``gpulayer-TAG-ID``).
        recheck: Asks the queue to decide again for jobs whose verdict waited on a
            cluster that had not answered.
    """

    def __init__(
        self,
        book: JobBook,
        settings: dict[str, ClusterSettings],
        log_path: Callable[[int], Path],
        tag: str,
        recheck: Callable[[], None] = lambda: None,
    ) -> None:
        self._book = book
        self._log_path = log_path
        self.tag = tag
        self._recheck = recheck
        self._clusters: dict[str, SlurmCluster] = {}
        self._retiring: set[str] = set()  # removed from the config, its jobs still followed
        self._partitions: dict[str, Partition] = {}
        self._errors: dict[str, str] = {}
        self._down_since: dict[str, float] = {}
        self._silent_why: dict[str, str] = {}  # the last unanswered call's error, while down
        self._tracked: dict[int, str] = {}  # job id -> its cluster
        self._submitting: set[int] = set()
        # job -> when an sbatch for it went unanswered: the controller may hold it and
        # take it later (a stopped controller keeps what it received), so the job is
        # looked up by name, and submitted again only once the cluster has answered for
        # UNSURE_WAIT_S without knowing it.
        self._unsure: dict[int, float] = {}
        self._up_since: dict[str, float] = {}  # cluster -> since when it answers again
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._polling = False  # (started: a cluster added later is followed too)
        self._polls = 0
        # One sbatch at a time per cluster, in the order the jobs were decided (Turns);
        # the next few started ahead, each given its script at its turn.
        self._sbatch_turns: dict[str, Turns] = {}
        # job -> [(dependency job, its cluster id, any exit)] that Slurm holds it for
        self._deps: dict[int, list[tuple[int, str, bool]]] = {}
        self._missing: dict[int, float] = {}  # job -> since when neither squeue nor sacct has it
        # job -> (cluster, its cluster id): a stop decided (and stored) whose scancel the
        # cluster has not taken yet; sent again at each poll until it has.
        self._cancels: dict[int, tuple[str, str]] = {}
        self._cancelling: set[int] = set()
        self._refused: set[str] = set()  # clusters whose last partition read was refused
        self.reconfigure(settings)

    def reconfigure(self, settings: dict[str, ClusterSettings]) -> None:
        """A reloaded ``[clusters.*]``: a cluster added is followed from now on (one added
        to an engine that had none was never read, and its jobs waited for ever: tester
        h122); one changed is read again."""
        old = self._clusters
        self._clusters = {
            name: old[name] if name in old and old[name].settings == s else SlurmCluster(name, s)
            for name, s in settings.items()
        }
        self._retiring.intersection_update(old.keys() - settings.keys())
        for name in old.keys() - settings.keys():
            # Removed with jobs on it: they are followed, and their cancels sent, until they
            # end, with its last settings; nothing new goes to it. Its jobs were frozen at
            # their last state for ever, and a cancel said "sent" was never sent (h150).
            if self._has_jobs_on(name):
                self._clusters[name] = old[name]
                if name not in self._retiring:
                    self._retiring.add(name)
                    log.warning(
                        "cluster %s was removed from the configuration: its jobs there are "
                        "followed until they end, and no new job goes to it",
                        name,
                    )
        for name in old:
            if self._clusters.get(name) is not old[name]:
                # (what was read of it before says nothing of it now)
                self._partitions.pop(name, None)
                self._errors.pop(name, None)
                self._down_since.pop(name, None)
                self._silent_why.pop(name, None)
                self._up_since.pop(name, None)
                self._refused.discard(name)
        if self._polling:
            self.start_polling()

    @property
    def names(self) -> list[str]:
        """The configured clusters (not one removed whose jobs are still followed)."""
        return [name for name in self._clusters if name not in self._retiring]

    def _has_jobs_on(self, name: str) -> bool:
        """Whether a job submitted to cluster ``name`` (or its cancel) is still followed."""
        return (
            name in self._tracked.values()
            or any(cname == name for cname, _ in self._cancels.values())
            or any(
                act.spec is not None
                and act.spec.cluster == name
                and act.job.cluster_job_id is not None
                for act in self._book
            )
        )

    def _retire_done(self) -> None:
        """Stop following a removed cluster once none of its jobs is left."""
        for name in [n for n in self._retiring if not self._has_jobs_on(n)]:
            self._retiring.discard(name)
            self._clusters.pop(name, None)
            self._partitions.pop(name, None)
            self._errors.pop(name, None)
            self._down_since.pop(name, None)
            log.warning("cluster %s: its last job here ended; it is no longer followed", name)

    # -- verdicts -------------------------------------------------------------------------------

    def verdict(self, act: ActiveJob) -> Verdict:
        """Could this job ever run on its cluster's partition? (record 003)"""
        spec = act.spec
        assert spec is not None and spec.cluster is not None
        name = spec.cluster
        if name not in self._clusters or (
            name in self._retiring and act.job.cluster_job_id is None
        ):
            return Verdict(False, f"cluster {name} is no longer configured")
        part = self._partitions.get(name)
        if part is None:
            why = self._errors.get(name, "not read yet")
            if name in self._refused:
                if "not found" in why:  # (a partition that does not exist: a config error)
                    return Verdict(False, f"cluster {name}: {why} (see [clusters.{name}])")
                return Verdict(None, f"cluster {name} refused: {why}")
            return Verdict(None, f"cluster {name} not answering: {why}")
        where = f"partition {part.name}"
        gpus = spec.gpus or 0
        if part.nodes == 0:
            return Verdict(False, f"{where} on cluster {name} has no nodes")
        if gpus > part.max_gpus:
            return Verdict(
                False,
                f"requested {_plural(gpus, 'GPU')} on one node, but the largest node in "
                f"{where} has {part.max_gpus}",
            )
        if spec.mem_gb is not None and spec.mem_gb * 1024 > part.max_mem_mb:
            return Verdict(
                False,
                f"requested {spec.mem_gb:g} GB of memory on one node, but the largest node "
                f"in {where} has {part.max_mem_mb / 1024:.1f} GB",
            )
        if spec.cpus is not None and spec.cpus > part.max_cpus:
            return Verdict(
                False,
                f"requested {_plural(spec.cpus, 'CPU')} on one node, but the largest node "
                f"in {where} has {part.max_cpus}",
            )
        limit = spec.timeout or self._clusters[name].settings.time_limit
        if limit is not None and part.max_time_s is not None and limit > part.max_time_s:
            return Verdict(
                False,
                f"asks for {minutes(limit)} min of run time, but {where} allows at most "
                f"{minutes(part.max_time_s)} min",
            )
        return Verdict(True)

    # -- dependencies -----------------------------------------------------------------------------

    def take_dependencies(self, act: ActiveJob, waiting: dict[int, bool]) -> bool:
        """If every job ``act`` waits for is a submitted job of the same cluster, Slurm's
        ``--dependency`` holds it (``afterok``, or ``afterany`` for any exit) and it is
        submitted at once; True then. Otherwise the engine holds it (False)."""
        spec = act.spec
        if spec is None or spec.cluster is None:
            return False
        native: list[tuple[int, str, bool]] = []
        for dep_id, any_exit in waiting.items():
            dep = self._book.get(dep_id)
            if (
                dep is None
                or dep.spec is None
                or dep.spec.cluster != spec.cluster
                or dep.job.cluster_job_id is None
            ):
                return False
            native.append((dep_id, dep.job.cluster_job_id, any_exit))
        self._deps[act.job.id] = native
        return True

    # -- submitting -----------------------------------------------------------------------------

    def start(self, act: ActiveJob) -> None:
        """The job may go to its cluster: say so (durably), then submit it."""
        job, spec = act.job, act.spec
        assert spec is not None and spec.cluster is not None
        if job.cluster_job_id is not None:  # (found again after a restart)
            self._tracked[job.id] = spec.cluster
            self._cancel_again(act)
            return
        # A job restored with the decision already stored may have reached the cluster
        # before the engine stopped: it is looked up by name before it is submitted.
        restored = job.message.startswith(SUBMITTING)
        if restored:
            # Its sbatch may still be on its way (it outlives a killed engine): it is not
            # taken as never submitted before the cluster has answered a while without it.
            self._unsure.setdefault(job.id, time.monotonic())
        self._book.set_reason(act, f"{SUBMITTING}{spec.cluster}")
        self._book.after_commit(
            functools.partial(self._spawn, self._submit(job.id, restored=restored))
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, job_id: int, restored: bool = False) -> None:
        act = self._book.get(job_id)
        if act is None or act.spec is None or act.job.cluster_job_id is not None:
            return
        if job_id in self._submitting:
            return
        job, spec = act.job, act.spec
        name = spec.cluster
        assert name is not None
        cluster = self._clusters.get(name)
        if cluster is None or name in self._retiring:
            self._book.finish(
                act, JobStatus.FAILED, Reason.LAUNCH_FAILED, f"cluster {name} not configured"
            )
            return
        self._submitting.add(job_id)
        sent = False
        turns = self._sbatch_turns.setdefault(name, Turns())
        ticket = turns.take()  # (before any await: in the order the submissions were decided)
        try:
            slurm_name = self.slurm_name(job_id)
            await turns.wait(ticket, ahead=SBATCH_AHEAD)
            # A submission decided before a crash, or one whose sbatch went unanswered, may
            # have reached the cluster: looked up by name first, in its turn.
            found = []
            if restored:
                await turns.wait(ticket)
                found = await cluster.find(slurm_name, job.created_at)
            if found:
                cluster_id = found[0].job_id
            elif not self._surely_absent(job_id, name):
                return  # (looked up again at the next poll)
            elif job.stop_reason is not None:
                # Cancelled, and it never reached the cluster: it ends here.
                self._unsure.pop(job_id, None)
                self._book.finish(act, JobStatus.CANCELLED, Reason.CANCELLED, job.stop_message)
                return
            else:
                options = self._sbatch(job_id, spec, cluster, slurm_name)
                sent = True
                # (started now, given its script in its turn: a cancel meanwhile is sent
                # once it has its id, as for one cancelled while its sbatch ran)
                cluster_id = await cluster.submit(
                    *options, cwd=argv_of(spec)[1], gate=functools.partial(turns.wait, ticket)
                )
        except ClusterError as err:
            if err.unreachable:
                if sent:
                    self._unsure.setdefault(job_id, time.monotonic())
                self._unanswered(name, str(err))  # the next poll tries again
            elif job_id in self._book:
                self._book.finish(
                    act, JobStatus.FAILED, Reason.LAUNCH_FAILED, f"cluster {name} refused it: {err}"
                )
            return
        finally:
            turns.done(ticket)
            self._submitting.discard(job_id)
        self._unsure.pop(job_id, None)
        if job_id not in self._book:
            return
        job.cluster_job_id = cluster_id
        self._tracked[job_id] = name
        if job.stop_reason is not None:  # cancelled while it was being submitted
            # (said: "submitted" alone read as if the cancel was lost: tester h195)
            self._book.note(
                act,
                f"cluster {name} job {cluster_id}: submitted; stopping ({job.stop_message}): "
                "scancel sent",
            )
            self._cancel_later(job_id, name, cluster_id)
        else:
            self._book.note(act, f"cluster {name} job {cluster_id}: submitted")

    def _surely_absent(self, job_id: int, name: str) -> bool:
        """Whether a job the cluster does not list was surely never submitted: no sbatch
        for it went unanswered, or the cluster has answered for UNSURE_WAIT_S since
        (and since that sbatch) without taking it."""
        since = self._unsure.get(job_id)
        if since is None:
            return True
        if name in self._down_since:
            return False
        now = time.monotonic()
        up = self._up_since.get(name, since)
        return now - since >= UNSURE_WAIT_S and now - up >= UNSURE_WAIT_S

    def _sbatch(
        self, job_id: int, spec: Any, cluster: SlurmCluster, slurm_name: str
    ) -> tuple[list[str], list[str], dict[str, str]]:
        settings = cluster.settings
        argv, cwd = argv_of(spec)
        log = str(self._log_path(job_id))
        if "\\" not in log:  # (a backslash already turns Slurm's patterns off)
            # Slurm expands %j, %u ... in -o: a state dir named "h%j" sent the log to
            # "h428", and the job died "killed by signal 53". %% is a literal %.
            log = log.replace("%", "%%")
        options = [
            "-p",
            settings.partition,
            "-J",
            slurm_name,
            "-o",
            log,
            "-D",
            cwd,
        ]
        if spec.gpus:
            options.append(f"--gres=gpu:{spec.gpus}")
        if spec.cpus:
            options.append(f"--cpus-per-task={spec.cpus}")
        if spec.mem_gb:
            # Whole MiB, rounded up: --mem=0 asks Slurm for all of the node's memory.
            options.append(f"--mem={max(1, math.ceil(spec.mem_gb * 1024))}M")
        limit = spec.timeout or settings.time_limit
        if limit:
            options.append(f"--time={minutes(limit)}")
        deps = self._deps.get(job_id)
        if deps:
            parts = [f"{'afterany' if any_exit else 'afterok'}:{cid}" for _, cid, any_exit in deps]
            options += [f"--dependency={','.join(parts)}", "--kill-on-invalid-dep=yes"]
        if settings.account:
            options += ["-A", settings.account]
        if settings.qos:
            options += ["--qos", settings.qos]
        env = {**spec.env, **JobEnv.own(job_id, [])}
        env.pop("CUDA_VISIBLE_DEVICES", None)  # (Slurm sets it from the job's GPUs)
        env.pop("CUDA_DEVICE_ORDER", None)
        return argv, options, env

    # -- following ------------------------------------------------------------------------------

    def start_polling(self) -> None:
        """Follow every cluster job from now on (one squeue per cluster per tick)."""
        self._polling = True
        if self._loop is None and self._clusters:
            self._loop = asyncio.get_running_loop().create_task(self._poll_forever())

    async def close(self) -> None:
        """Stop following (cluster jobs run on; a restarted engine finds them again)."""
        self._polling = False
        if self._loop is not None:
            await cancel_and_wait(self._loop)
            self._loop = None
        for task in list(self._tasks):
            await cancel_and_wait(task)

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # one bad answer must not stop following the others
                log.exception("following cluster jobs failed")
            interval = min((c.settings.poll_interval for c in self._clusters.values()), default=5)
            await asyncio.sleep(interval)

    async def poll_once(self) -> None:
        """One round: each cluster's partition now and then, and its jobs."""
        self._polls += 1
        for name, cluster in list(self._clusters.items()):
            if name not in self._partitions or self._polls % PROBE_EVERY == 1:
                await self._probe(name, cluster)
            for job_id in [j for j, c in self._tracked.items() if c == name]:
                act = self._book.get(job_id)
                if act is None:
                    self._tracked.pop(job_id, None)
            waiting = [
                act.job.id
                for act in self._book
                if act.spec is not None
                and act.spec.cluster == name
                and act.job.cluster_job_id is None
                and act.job.message.startswith(SUBMITTING)
                and act.job.id not in self._submitting
            ]
            for job_id in waiting:  # (the cluster did not answer when they were decided)
                self._spawn(self._submit(job_id, restored=True))
            await self._follow(name, cluster)
            for job_id, (cname, cluster_id) in list(self._cancels.items()):
                if cname == name and job_id not in self._cancelling:
                    self._spawn(self._scancel(job_id, name, cluster_id))
        self._retire_done()

    async def _probe(self, name: str, cluster: SlurmCluster) -> None:
        try:
            part = await cluster.partition()
        except ClusterError as err:
            before = (self._errors.get(name), name in self._refused)
            self._errors[name] = str(err)
            if err.unreachable:
                self._refused.discard(name)
            else:
                self._refused.add(name)  # (it answered: "not answering" was untrue)
            if (str(err), not err.unreachable) != before:
                # Jobs judged before its first read kept "not read yet" for ever (h122).
                self._recheck()
            if err.unreachable:
                self._unanswered(name, str(err))
            return
        self._refused.discard(name)
        had = name in self._partitions
        self._partitions[name] = part
        self._errors.pop(name, None)
        if self._down_since.pop(name, None) is not None:
            self._answers_again(name)
        if not had:
            self._recheck()  # jobs waiting for a verdict on this cluster get one

    async def _follow(self, name: str, cluster: SlurmCluster) -> None:
        ids = {
            act.job.cluster_job_id: act
            for job_id, cname in self._tracked.items()
            if cname == name
            and (act := self._book.get(job_id)) is not None
            and act.job.cluster_job_id is not None
        }
        if not ids:
            return
        try:
            jobs = await cluster.jobs([i for i in ids if i is not None])
        except ClusterError as err:
            self._unanswered(name, str(err))
            return
        if name in self._down_since:
            del self._down_since[name]
            self._answers_again(name)
        seen = {j.job_id: j for j in jobs}
        # Those that left the queue (ended, or forgotten by the controller): their ends
        # from accounting, one sacct call for all of them.
        left = [cid for cid in ids if (j := seen.get(cid)) is None or ended(j.state)]
        accounted: dict[str, SlurmJob] | None = {}
        unsure = False  # (accounting failed this time: nothing is decided on its silence)
        if left:
            try:
                accounted = await cluster.ends(left)
            except ClusterError as err:
                log.warning("sacct on cluster %s failed: %s", name, err)
                unsure = True
        for cluster_id, act in ids.items():
            job_id = act.job.id
            if job_id not in self._book:
                continue
            found = seen.get(cluster_id)
            if found is not None and not ended(found.state):
                self._missing.pop(job_id, None)
                self._apply(name, act, found)
                continue
            record = (accounted or {}).get(cluster_id)
            if record is not None and record.name not in ("", self.slurm_name(job_id)):
                record = None  # (an id the cluster gave again, to another job)
            if record is not None:
                if found is not None:  # (squeue's reason: why Slurm cancelled it)
                    record = replace(record, reason=found.reason)
                self._apply(name, act, record)
            elif found is not None:
                # Ended, and accounting has no record (none kept, or not written yet):
                # the controller's, while it remembers the job (MinJobAge).
                try:
                    code, sig = await cluster.exit_of(found.job_id)
                except ClusterError:
                    continue  # (read again at the next poll)
                self._apply(name, act, replace(found, exit_code=code, signal=sig))
            elif not unsure:
                since = self._missing.setdefault(job_id, time.monotonic())
                if accounted is not None and time.monotonic() - since < FORGOTTEN_AFTER_S:
                    continue  # (accounting may not have it yet)
                if accounted is None:
                    why = f"cluster {name} no longer knows job {cluster_id} and keeps no accounting"
                else:
                    why = f"neither cluster {name} nor its accounting knows job {cluster_id}"
                self._book.finish(
                    act, JobStatus.FAILED, Reason.ENGINE_LOST, f"{why}: its exit status is unknown"
                )
                self._missing.pop(job_id, None)
                self._tracked.pop(job_id, None)

    def slurm_name(self, job_id: int) -> str:
        """A job's name on its cluster (how a restarted engine finds it again)."""
        return f"gpulayer-{self.tag}-{job_id}"

    def _apply(self, name: str, act: ActiveJob, found: SlurmJob) -> None:
        job = act.job
        label = f"cluster {name} job {found.job_id}"
        if found.state in PENDING_STATES:
            partition = self._clusters[name].settings.partition
            words = pending_words(found.reason, partition)
            if job.status is JobStatus.RUNNING:  # Slurm requeued it
                self._book.transition(act, JobStatus.QUEUED, message=f"{label}: {words}")
            else:
                self._book.set_reason(act, f"{label}: {words}")
        elif found.state in RUNNING_STATES:
            if job.status is not JobStatus.RUNNING:
                self._book.transition(
                    act, JobStatus.RUNNING, message=f"running on {label}", at=_began(job, found)
                )
                if found.start_time:
                    job.started_at = _began(job, found)
            elif job.message.startswith(f"cluster {name} not answering"):
                self._book.note(act, f"running on {label}")  # (it answers again)
        else:
            spec = act.spec
            limit = (spec.timeout if spec is not None else None) or (
                self._clusters[name].settings.time_limit if name in self._clusters else None
            )
            status, reason, message = end_of(found, job.stop_message, limit)
            # Slurm cancels a job whose dependency failed (--kill-on-invalid-dep); squeue
            # says so while it remembers the job, accounting does not: a cancel nobody
            # here asked for, of a job Slurm held for its dependencies, is that.
            if found.state == "CANCELLED" and (
                found.reason == "DependencyNeverSatisfied"
                or (job.stop_reason is None and self._deps.get(job.id))
            ):
                ids = ", ".join(str(d[0]) for d in self._deps.get(job.id, [])) or "?"
                status, reason = JobStatus.CANCELLED, Reason.DEPENDENCY_FAILED
                message = f"dependency job {ids} did not complete (Slurm cancelled it)"
            ran = status is JobStatus.COMPLETED or (
                found.start_time is not None and status is not JobStatus.CANCELLED
            )
            if job.status is not JobStatus.RUNNING and ran:
                # It ran (and ended) between two looks: its run is in the timeline too,
                # when it began (stamped at the look, it came after its end).
                self._book.transition(
                    act, JobStatus.RUNNING, message=f"running on {label}", at=_began(job, found)
                )
                if found.start_time:
                    job.started_at = _began(job, found)
            # As a local job's: 128+N for signal N. Slurm records 0:0 for a cancelled job
            # (pending, held for its dependencies, or running): no exit status, not 0.
            code = found.exit_code if found.signal is None else 128 + found.signal
            stopped = status is JobStatus.CANCELLED or reason is Reason.TIMEOUT
            if stopped and found.signal is None:  # (a timeout's 0:0 read "exit code 0")
                code = None
            self._book.finish(act, status, reason, message, code, ended_at=_ended(job, found))
            self._tracked.pop(job.id, None)
            self._deps.pop(job.id, None)
            self._missing.pop(job.id, None)
            self._cancels.pop(job.id, None)

    def _unanswered(self, name: str, why: str) -> None:
        """The cluster did not answer: its jobs keep their state and say since when."""
        since = self._down_since.setdefault(name, time.time())
        self._silent_why[name] = why
        silent = f"not answering since {time.strftime('%H:%M:%S', time.localtime(since))}: {why}"
        text = f"cluster {name} {silent}"

        for act in list(self._book):
            if act.spec is None or act.spec.cluster != name or act.job.status.is_terminal:
                continue
            if act.job.cluster_job_id is None and act.job.message.startswith(SUBMITTING):
                # Still "submitting": how the next poll (and a restarted engine, which
                # looks the job up on the cluster first) knows the decision was taken.
                if "not answering since" not in act.job.message:
                    self._book.set_reason(act, f"{SUBMITTING}{name}, {silent}{_stop_said(act)}")
                continue
            said = text
            if act.job.stop_reason is not None:
                # (its stop went unsaid: "queued: cluster lab not answering" of a job
                # cancelled, which read as if the cancel was lost: tester h150)
                said = (
                    f"stopping ({act.job.stop_message}): {text}; scancel sent again at the "
                    "next poll"
                )
            if f"cluster {name} not answering since" not in act.job.message:
                if act.job.status is JobStatus.RUNNING:
                    self._book.note(act, said)
                else:
                    self._book.set_reason(act, said)

    def _answers_again(self, name: str) -> None:
        """The cluster answers again: its jobs still being submitted say what happens
        now. They said "not answering since ..." for the UNSURE_WAIT_S that a job whose
        sbatch went unanswered is looked for before it is sent again, and a cancel given
        meanwhile went unsaid (tester h195)."""
        self._silent_why.pop(name, None)
        self._up_since[name] = time.monotonic()
        log.warning("cluster %s answers again", name)
        for act in list(self._book):
            job = act.job
            if act.spec is None or act.spec.cluster != name or job.status.is_terminal:
                continue
            if job.cluster_job_id is not None or not job.message.startswith(SUBMITTING):
                continue
            if "not answering since" not in job.message:
                continue
            stopping = job.stop_reason is not None
            if job.id in self._unsure:
                then = (
                    f"scancel'd if found, else it ends here ({job.stop_message})"
                    if stopping
                    else "sent again if not found"
                )
                said = (
                    f"{SUBMITTING}{name}: it answers again; looked for there (its sbatch went "
                    f"unanswered) for up to {UNSURE_WAIT_S:g} s: {then}"
                )
            else:
                said = f"{SUBMITTING}{name}: it answers again" + (
                    f": stopping ({job.stop_message})" if stopping else ""
                )
            self._book.set_reason(act, said)

    # -- stopping and restarting ----------------------------------------------------------------

    def stop(self, act: ActiveJob, reason: TerminationReason, message: str) -> None:
        """Cancel: stored first, then ``scancel``; it ends when the cluster says it has."""
        job, spec = act.job, act.spec
        # Decided for the cluster, and its sbatch under way, unanswered, or sent before a
        # restart: the cluster may have it.
        maybe_sent = (
            job.id in self._submitting
            or job.id in self._unsure
            or job.message.startswith(SUBMITTING)
        )
        if job.cluster_job_id is None and not maybe_sent:
            # Never reached the cluster: it ends here and now.
            self._book.finish(act, JobStatus.CANCELLED, Reason.CANCELLED, message)
            return
        if job.stop_reason is not None:
            return
        job.stop_reason, job.stop_message = reason, message
        name = spec.cluster if spec is not None else None
        if job.cluster_job_id is None:
            # Cancelled once the cluster says whether it has it (looked up by name at the
            # next poll: scancel'd if found, ended here if surely never submitted). The
            # message keeps its prefix: it is how the poll knows to look.
            self._book.note(act, f"{SUBMITTING}{name}: stopping ({message}) once it answers")
            return
        if name in self._down_since:
            # (said "scancel sent" while the cluster did not answer: it is sent at the
            # polls until it is taken; tester h195)
            since = time.strftime("%H:%M:%S", time.localtime(self._down_since[name]))
            self._book.note(
                act,
                f"stopping ({message}): scancel goes to cluster {name} once it answers (not "
                f"answering since {since})",
            )
        else:
            self._book.note(act, f"stopping ({message}): scancel sent to cluster {name}")
        if job.cluster_job_id is not None and name is not None:
            self._book.after_commit(
                functools.partial(self._cancel_later, job.id, name, job.cluster_job_id)
            )

    def _cancel_later(self, job_id: int, name: str, cluster_id: str) -> None:
        """Send ``scancel`` now, and at every poll until the cluster has taken it."""
        self._cancels[job_id] = (name, cluster_id)
        if job_id not in self._cancelling:
            self._spawn(self._scancel(job_id, name, cluster_id))

    def _cancel_again(self, act: ActiveJob) -> None:
        """A job found again after a restart whose stop was stored: its scancel may
        never have reached the cluster."""
        job, spec = act.job, act.spec
        if job.stop_reason is not None and job.cluster_job_id is not None and spec is not None:
            assert spec.cluster is not None
            self._cancel_later(job.id, spec.cluster, job.cluster_job_id)

    async def _scancel(self, job_id: int, name: str, cluster_id: str) -> None:
        cluster = self._clusters.get(name)
        if cluster is None:
            return
        self._cancelling.add(job_id)
        try:
            await cluster.cancel(cluster_id)
        except ClusterError as err:
            log.warning("scancel %s on cluster %s failed: %s", cluster_id, name, err)
            act = self._book.get(job_id)
            if act is not None and job_id in self._cancels:
                self._book.note(
                    act,
                    f"stopping ({act.job.stop_message}): scancel to cluster {name} failed "
                    f"({err}); sent again at the next poll",
                )
            return
        finally:
            self._cancelling.discard(job_id)
        self._cancels.pop(job_id, None)

    def reattach(self, act: ActiveJob) -> None:
        """A cluster job that was running when the engine stopped: follow it again."""
        spec = act.spec
        if spec is not None and spec.cluster is not None:
            self._tracked[act.job.id] = spec.cluster
            self._cancel_again(act)

    # -- the view -----------------------------------------------------------------------------

    def views(self) -> list[dict[str, Any]]:
        """Each cluster: its partition's nodes and GPUs, and whether it answers."""
        out = []
        for name, cluster in self._clusters.items():
            if name in self._retiring:
                continue  # (not configured: its jobs say where they are)
            part = self._partitions.get(name)
            row: dict[str, Any] = {
                "name": name,
                "kind": "slurm",
                "partition": cluster.settings.partition,
                "answering": name not in self._down_since and name not in self._errors,
                "error": self._errors.get(name) or self._silent_why.get(name),
                # since when it has not answered (epoch seconds), or None
                "down_since": self._down_since.get(name),
                "jobs": sum(1 for c in self._tracked.values() if c == name),
            }
            if part is not None:
                row.update(
                    state=part.state,
                    nodes=part.nodes,
                    node_states=part.node_states,
                    gpus_total=part.gpus_total,
                    gpus_allocated=part.gpus_used,
                    gpus_idle=max(0, part.gpus_total - part.gpus_used),
                    max_time_s=part.max_time_s,
                )
            out.append(row)
        return out
