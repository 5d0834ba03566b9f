"""Long-running services (record 000): replicas, ``$PORT``, endpoints, restarts, re-placement.

A service is one job of kind ``service``. Its status is ``running`` from placement until it
ends; underneath, each replica has its own state (:class:`~.models.ReplicaState`, with its
own transition table), stored with the job's row and published as ``job.replica`` events.

* Placement: all replicas at once, like a multi-GPU job (GPU replicas on distinct domains,
  CPU replicas one cpu slot each). The service holds its domains for as long as it runs,
  restarts and back-off included, so a restart never waits behind the queue.
* Ports: with ``port`` (the default) each start of a replica gets a free TCP port as
  ``$PORT``; the replica is ``starting`` until the port accepts a TCP connection on the
  configured host, then ``up`` with its endpoint ``host:port``.
* Restarts: ``always``, or ``on_failure`` (non-zero exit). Back-off 1 s doubling to 30 s;
  a run of ``[services] steady_after`` seconds (60 by default) resets it. ``max_restarts``
  per replica (unlimited by default). A replica that ends for good ends the service:
  ``completed`` if it exited 0, else ``failed``; the other replicas are stopped.
* Loss: a domain that is lost or quarantined stops the whole service and places it again
  (``running -> queued``), up to ``retry.max_attempts`` placements (10 by default).

Back-off timers use :class:`ServiceClock`, so tests can step time instead of sleeping.

Why this module is longer than ~400 lines: it is one state machine (the replicas of
a service, their restarts and the service's own end) whose halves (start, exit, stop,
re-attach) all read and write the same runtime; split, each half would reach into the
other's state. The parts that stand alone (clock, back-off, ports, the runtime record)
are in :mod:`.service_runtime`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..fields import (
    ANSWERED_BY,
    LISTENED_ONLY_ON,
    LISTENS_ELSEWHERE,
    replicas_said,
    starting_why,
)
from . import procs
from .batch import JobEnv, assign, exit_verdict, prepare_task, timeout_message
from .domain import DomainState, missing_warning, plural
from .executor import Executor, Exit, LaunchError, Started, TaskKey
from .jobbook import ActiveJob, JobBook, release_holds, retake_holds
from .models import (
    EventKind,
    Job,
    JobKind,
    JobStatus,
    Replica,
    ReplicaState,
    Roll,
    TerminationReason,
    check_replica_transition,
)
from .service_runtime import (
    ENDING_DOWN,
    NOT_ACCEPTING,
    PROBE_INTERVAL_MAX_S,
    PROBE_TIMEOUT_S,
    RESTARTING_DOWN,
    WILDCARD_HOSTS,
    LoopClock,
    ServiceClock,
    ServiceRuntime,
    backoff_delay,
    describe_exit,
    endpoint_of,
    free_port,
)

if TYPE_CHECKING:
    from .config import Config
    from .domain import Domain
    from .jobqueue import JobQueue
    from .scheduler import Request, Scheduler
    from .spec import JobSpec
    from .supervisor import Supervisor

R = ReplicaState
Reason = TerminationReason
# Replica states whose port is watched (a restarted engine watches them again).
_WATCHED = (R.STARTING, R.UP, R.DOWN)
REPLICAS_SAID = 3
"""A service's message names this many endpoints, and replicas not up; then counts."""
MOVING_OFF = "moving off "
"""How a move's stored stop message begins (off a drained domain: no lost placement)."""


class ServiceRunner:
    """Runs ``service`` jobs: their replicas, ports, restarts and re-placements.

    Args:
        book: The active jobs.
        scheduler: The domains (holds on start, restart recovery and re-placement).
        queue: Where a service placed again waits.
        executor: Starts and watches the replicas' processes (the launcher).
        legacy: Watches replicas started by an earlier version's per-job wrapper.
        config: The engine's configuration (``[engine]`` grace, ``[services]``).
        env: Builds each replica's environment.
        clock: Time for back-off (tests step a manual clock).
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        queue: JobQueue,
        executor: Executor,
        legacy: Supervisor,
        config: Config,
        env: JobEnv,
        clock: ServiceClock | None = None,
    ) -> None:
        self._book = book
        self._scheduler = scheduler
        self._queue = queue
        self._executor = executor
        self._legacy = legacy
        self._config = config
        self._env = env
        self.clock: ServiceClock = clock or LoopClock()
        self._runtimes: dict[int, ServiceRuntime] = {}
        self._timeouts: dict[int, asyncio.TimerHandle] = {}
        # Set (and replaced) by each new configuration: an up replica's port check waits
        # on it, so a new check_interval applies at once (one of 0 was never looked at
        # again, and one of 30 s made to 2 waited out its 30 s).
        self._reconfigured = asyncio.Event()
        # Told of each replica process that ended by itself on GPUs (its task, its exit
        # code, those GPUs' domains): domain health counts device errors as for a job.
        self.on_replica_end: Callable[[TaskKey, int | None, list[Domain]], None] | None = None

    def reconfigure(self, config: Config) -> None:
        """Use a new configuration from now on (grace period, host, steady time, the
        port checks' interval: waiting checks start over with it)."""
        self._config = config
        changed, self._reconfigured = self._reconfigured, asyncio.Event()
        changed.set()

    async def _sleep_unless_reconfigured(self, seconds: float | None) -> bool:
        """Sleep ``seconds`` (``None``: as long as it takes), ended early by a new
        configuration; whether one came."""
        changed = self._reconfigured
        try:
            async with asyncio.timeout(seconds):
                await changed.wait()
        except TimeoutError:
            return False
        return True

    def runtime(self, job_id: int) -> ServiceRuntime | None:
        """The runtime of a running service (its pending restarts and port probes)."""
        return self._runtimes.get(job_id)

    def active(self) -> list[Job]:
        """Services that are queued or running, in id order (live records)."""
        return [act.job for act in self._book if act.job.kind is JobKind.SERVICE]

    # -- placement and launch -----------------------------------------------------------------

    def start(self, act: ActiveJob, domains: list[Domain]) -> None:
        """The service was placed on ``domains``: hold them, mark it running, start replicas."""
        job, spec, request = act.job, act.spec, act.request
        assert spec is not None and request is not None
        act.ran_on = frozenset()  # (placed: nothing is kept for it any more)
        assign(act, domains)
        runtime = self._runtimes.setdefault(job.id, ServiceRuntime())
        job.attempt += 1
        act.launched = False
        per_replica = request.gpus // request.replicas
        runtime.moving = False
        old = {r.index: r for r in job.replicas}
        job.replicas = []
        for index in range(request.replicas):
            replica = old.get(index) or Replica(index)
            if replica.state is R.EXITED:
                replica.state = R.PENDING  # placed again: restart counts are kept
            replica.pid = replica.start_ticks = replica.port = None
            replica.endpoint = replica.next_restart_at = None
            if per_replica:
                mine = act.holds[index * per_replica : (index + 1) * per_replica]
            else:
                mine = act.holds
            replica.domains = [d.name for d in mine]
            replica.gpus = [d.gpu_index for d in mine if d.gpu_index is not None]
            job.replicas.append(replica)
        runtime.end = runtime.ended_at = None  # (a placement before this one ended nothing)
        job.stop_reason, job.stop_message, job.kill_at = None, "", None
        # (``attempt`` counts placements against retry.max_attempts: a move off a drained
        # domain, no loss, gave its placement back in _requeue)
        counted = job.attempt
        attempt = f" (placement {counted} of {spec.max_attempts})" if counted > 1 else ""
        where = ", ".join(job.domains)
        # Placed again, it is the same service: its start, and so its time limit and its
        # runtime, stay its first (the limit was re-armed whole by a placement that came
        # after it ran out, or by an engine restart after a placement).
        first = job.started_at if job.attempt > 1 or runtime.moves else None
        self._book.transition(
            act, JobStatus.RUNNING, message=f"starting on {where}{attempt}", started_at=first
        )
        if spec.timeout is not None and job.id not in self._timeouts:
            left = spec.timeout - (time.time() - first) if first is not None else spec.timeout
            self._arm_timeout(job.id, left)
        for replica in job.replicas:
            if not self._decide_launch(act, replica, "start"):
                return

    def restored_waiting(self, act: ActiveJob) -> None:
        """A waiting job taken back after a restart: a service that ran and waits to be
        placed again keeps its time limit from its first start (it waited, untimed, for
        a placement that then got it killed at once: "no engine ran to stop it sooner").
        """
        spec, job = act.spec, act.job
        if job.kind is JobKind.SERVICE and job.started_at is not None:
            # Where it ran (its replicas say): kept for it, as before the restart (without,
            # a job submitted after the restart took its healthy GPU; see jobbook.ran_on).
            domains = self._scheduler.domains
            act.ran_on = frozenset(
                name
                for replica in job.replicas
                for name in replica.domains
                if name in domains and domains[name].is_gpu
            )
        if job.kind is not JobKind.SERVICE or spec is None or spec.timeout is None:
            return
        if job.started_at is not None and job.id not in self._timeouts:
            self._arm_timeout(job.id, spec.timeout - (time.time() - job.started_at))

    def replicas_edited(self, act: ActiveJob, count: int) -> None:
        """A service waiting to be placed again was edited to ``count`` replicas: those
        past it are dropped (with the GPUs kept for them), new ones wait to be placed."""
        job = act.job
        kept = [r for r in job.replicas if r.index < count]
        _remember_removed(job, job.replicas[count:])
        added = [self._added_replica(job, index) for index in range(len(kept), count)]
        job.replicas = kept + added
        act.ran_on = frozenset(name for r in kept for name in r.domains if name in act.ran_on)

    # -- scaling a running service --------------------------------------------------------------

    def stopping(self, act: ActiveJob) -> str | None:
        """``is stopping (why)`` while the running service is being stopped, else ``None``."""
        runtime = self._runtimes.get(act.job.id)
        if runtime is not None and runtime.end is not None:
            return f"is stopping ({act.job.stop_message})"
        return None

    def scale_refusal(self, act: ActiveJob, count: int) -> str | None:
        """Why the running service cannot change its number of replicas to ``count`` now,
        or ``None``. Down again while a scale-down's replicas stop is fine (it needs
        nothing: refused, a user could not stop two in a row within the grace: h108)."""
        job, spec = act.job, act.spec
        runtime = self._runtimes.get(job.id)
        if spec is None or runtime is None:
            return "has no spec this version can scale"
        stopping = self.stopping(act)
        if stopping is not None:
            return stopping
        if runtime.replacing is not None:
            # (once it waits to be placed again, an edit of its replicas applies)
            return f"is being placed again ({runtime.replacing}): try again in a moment"
        leaving = [r.index for r in job.replicas if r.index >= spec.replica_count]
        if leaving and count > spec.replica_count:
            by = ""
            if job.kill_at is not None:  # (when to try again, at the latest: tester h109)
                by = f" (SIGKILL at {time.strftime('%H:%M:%S', time.localtime(job.kill_at))})"
            return (
                f"is still stopping {replicas_said(leaving)} of its last scale-down: "
                f"try again once {'it has' if len(leaving) == 1 else 'they have'} ended{by}"
            )
        return None

    def scale(
        self,
        act: ActiveJob,
        spec: JobSpec,
        request: Request,
        domains: list[Domain],
        announce: Callable[[str], None],
    ) -> None:
        """Change a running service's number of replicas to ``spec``'s (checked by the
        caller: :meth:`scale_refusal`, over capacity, room now).

        Up: the new replicas take ``domains`` (free GPU domains, one set per replica; for
        CPU replicas, more slots of the pool it holds) and start once this is durable,
        each with its own ``$PORT``. Down: the replicas past the new count (the highest
        indexes: ``GPULAYER_REPLICA`` stays 0..N-1) are stopped, SIGTERM then SIGKILL
        after the grace period; their domains are given back once their processes are
        gone (a GPU is not handed on while a stopping replica still holds its memory).

        ``announce`` is given what changes, in words (the timeline's ``job.edited``
        entry), before any replica's own entry: the cause before its effects (the replicas'
        "starting" came before the "scaled" that started them: testers h134, h140).
        """
        job = act.job
        runtime = self._runtimes[job.id]
        had = act.spec.replica_count if act.spec is not None else len(job.replicas)
        count = spec.replica_count
        act.spec, act.request = spec, request
        job.spec = spec.stored()
        if count > had:
            self._grow(act, domains, had, count, announce)
        else:
            self._shrink(act, runtime, count, had, announce)
        if job.status is JobStatus.RUNNING:
            # (its row and subscribers get the new summary: the entries above carried the
            # one from before the scale)
            self._book.note(act, self._summary(job))

    def _grow(
        self,
        act: ActiveJob,
        domains: list[Domain],
        had: int,
        count: int,
        announce: Callable[[str], None],
    ) -> None:
        before = len(act.job.replicas)
        job, request = act.job, act.request
        assert request is not None
        per_replica = request.gpus // request.replicas
        if per_replica:
            for dom in domains:
                dom.hold(job.id, request.vram_bytes, request.exclusive, request.slots_on(dom))
            act.holds = [*act.holds, *domains]
        else:
            for dom in act.holds:  # (the cpu pool: one slot more for each new replica)
                dom.hold(job.id, None, request.exclusive, request.slots_on(dom))
        job.domains = [d.name for d in act.holds]
        job.gpus = [d.gpu_index for d in act.holds if d.gpu_index is not None]
        added: list[Replica] = []
        for index in range(before, count):
            replica = self._added_replica(job, index)
            if per_replica:
                at = (index - before) * per_replica
                mine = domains[at : at + per_replica]
            else:
                mine = list(act.holds)
            replica.domains = [d.name for d in mine]
            replica.gpus = [d.gpu_index for d in mine if d.gpu_index is not None]
            job.replicas.append(replica)
            added.append(replica)
        # Grouped by where they run ("replicas 2 on cpu, 3 on cpu starting" read as the
        # count of replicas on cpu: tester h127): "replicas 2, 3 starting on cpu".
        places: dict[str, list[int]] = {}
        for replica in added:
            places.setdefault("+".join(replica.domains), []).append(replica.index)
        said = "; ".join(
            f"{'replica' if len(ids) == 1 else 'replicas'} {', '.join(map(str, ids))} "
            f"starting on {place}"
            for place, ids in places.items()
        )
        announce(f"replicas {had} -> {count} ({said})")
        for replica in added:
            if not self._decide_launch(act, replica, "start"):
                break

    def _added_replica(self, job: Job, index: int) -> Replica:
        """A replica a scale-up adds (or an edit of a waiting service): one this index had
        before goes on from its runs, so its log continues (a first start set the old log
        aside as if another job's: tester h108) and each run keeps a launcher key of its
        own (see :func:`.launch_client.launcher_key`). Where this engine does not know them
        (removed before a restart) but the log is there, it goes on as a later run."""
        replica = Replica(index)
        runs, replica.restarts, replica.backoff_step = job.removed_replicas.pop(index, (0, 0, 0))
        if not runs and self._executor.log_path((job.id, index)).exists():
            runs = 1  # (their keys were forgotten at the start: see Engine)
        replica.launches = runs
        return replica

    def _shrink(
        self,
        act: ActiveJob,
        runtime: ServiceRuntime,
        count: int,
        had: int,
        announce: Callable[[str], None],
    ) -> None:
        job = act.job
        grace = self._config.engine.grace_period
        # (those past ``had`` are stopping already, from a scale-down before)
        leaving = [r for r in job.replicas if count <= r.index < had]
        said = f"{replicas_said([r.index for r in leaving])} removed"
        if any(r.state.has_process and r.state is not R.STOPPING for r in leaving):
            said += f": SIGTERM sent, SIGKILL after {grace:g} s"
        announce(f"replicas {had} -> {count} ({said})")
        stopping: list[tuple[int, int]] = []
        for replica in leaving:
            timer = runtime.restart_timers.pop(replica.index, None)
            if timer is not None:
                timer.cancel()
            runtime.off_domain.pop(replica.index, None)
            if replica.state.has_process and replica.state is not R.STOPPING:
                self._set_replica(act, replica, R.STOPPING, f"SIGTERM sent (scaled to {count})")
                stopping.append((replica.index, replica.launches))
            elif not replica.state.has_process and replica.state is not R.EXITED:
                replica.next_restart_at = None
                self._set_replica(act, replica, R.EXITED, f"removed (scaled to {count})")
        if stopping:
            # (stored: a restarted engine still kills them on time; never sooner than an
            # earlier scale-down's stop, still under way, was told)
            job.kill_at = max(job.kill_at or 0.0, time.time() + grace)
            self._book.after_commit(
                functools.partial(self._signal_replicas, job.id, stopping, grace)
            )
        # (those with no process leave in :meth:`scaled`, after the entry)

    def scaled(self, act: ActiveJob) -> None:
        """After a scale's own timeline entry: replicas it removed that had no process
        (waiting in back-off) leave now. Dropped during the scale, their "scaled down
        to 1: replica 1 ended" came before the "scaled: replicas 2 -> 1" that caused it
        (tester h109)."""
        if act.job.id in self._runtimes:
            self._settle(act)

    def _drop_removed(self, act: ActiveJob) -> None:
        """The replicas a scale-down removed leave the service's record as their
        processes end, from the highest down (``job.replicas`` stays indexed by replica),
        and the domains only they held are given back then: a GPU freed by one that
        ended waited for the slowest of the others (tester h109). The pool's slots are
        given back once all have ended."""
        job, spec = act.job, act.spec
        if spec is None:
            return
        count = spec.replica_count
        leaving: list[Replica] = []
        while (
            job.replicas
            and job.replicas[-1].index >= count
            and not job.replicas[-1].state.has_process
        ):
            leaving.append(job.replicas.pop())
        if not leaving:
            return
        leaving.reverse()
        _remember_removed(job, leaving)
        kept = {name for r in job.replicas for name in r.domains}
        freed = [d for d in act.holds if d.name not in kept]
        for dom in freed:
            dom.unhold(job.id)
        act.holds = [d for d in act.holds if d.name in kept]
        done = not any(r.index >= count for r in job.replicas)
        for dom in act.holds:
            if done and not dom.is_gpu and act.request is not None:  # (the pool: fewer slots)
                dom.hold(job.id, None, act.request.exclusive, act.request.slots_on(dom))
        job.domains = [d.name for d in act.holds]
        job.gpus = [d.gpu_index for d in act.holds if d.gpu_index is not None]
        if done:
            job.kill_at = None
        gone = replicas_said([r.index for r in leaving])
        given = f"; {', '.join(d.name for d in freed)} given back" if freed else ""
        job.message = self._summary(job)
        self._book.record(
            act, EventKind.EDITED, {"message": f"scaled down to {count}: {gone} ended{given}"}
        )
        self._queue.schedule_soon()  # (what waited for those GPUs may start)

    # -- rolling restart ------------------------------------------------------------------------

    def roll_refusal(self, act: ActiveJob) -> str | None:
        """Why the running service cannot restart its replicas one at a time now, or
        ``None``."""
        job = act.job
        runtime = self._runtimes.get(job.id)
        if act.spec is None or runtime is None:
            return "has no spec this version can restart"
        stopping = self.stopping(act)
        if stopping is not None:
            return stopping
        if runtime.replacing is not None:
            return f"is being placed again ({runtime.replacing}): its replicas start afresh"
        current = next((r for r in job.replicas if r.roll not in (Roll.NONE, Roll.WAITS)), None)
        if current is not None:
            left = [r.index for r in job.replicas if r.roll is Roll.WAITS]
            then = f"; then {replicas_said(left)}" if left else ""
            return (
                f"is restarting its replicas one at a time already (replica "
                f"{current.index} now: {current.state.value}{then}): wait for it to end"
            )
        return None

    def roll(self, act: ActiveJob, announce: Callable[[str], None]) -> list[int]:
        """Restart the running service's replicas one at a time (checked by the caller:
        :meth:`roll_refusal`): each is stopped (SIGTERM, SIGKILL after the grace period)
        and started again at once, and the next one only once it is up again (its port
        answers; with no port, its process runs), so the others serve meanwhile. Replicas
        a scale-down is removing are left to stop. A restarted replica that exits, or is
        not up within ``[services] restart_down_after`` s, stops the roll: the replicas
        not restarted yet run on untouched.

        The plan is stored with the replicas (``Replica.roll``) with the ``announce``d
        entry, before the first replica is signalled, and a restarted engine goes on
        with it. A roll's stop and start are not restarts of the policy's: they do not
        count toward ``max_restarts``.

        Returns:
            The indexes of the replicas it restarts, in order.
        """
        job = act.job
        count = act.spec.replica_count if act.spec is not None else len(job.replicas)
        rolled = [r for r in job.replicas if r.index < count]
        for replica in rolled:
            replica.roll = Roll.WAITS
        indexes = [r.index for r in rolled]
        grace = self._config.engine.grace_period
        announce(
            f"rolling restart of {replicas_said(indexes)}: one at a time, each once the one "
            f"before it is up again (SIGTERM, SIGKILL after {grace:g} s)"
        )
        self._roll_on(act)
        return indexes

    def _roll_on(self, act: ActiveJob) -> None:
        """The roll's next step: the replica restarted is up again, so the next one is
        stopped (or, waiting in back-off, started at once); the last up ends it."""
        job = act.job
        runtime = self._runtimes.get(job.id)
        if runtime is None or runtime.end is not None or runtime.replacing is not None:
            return
        if not any(r.roll is not Roll.NONE for r in job.replicas):
            return
        finished: list[int] = []
        removed: list[int] = []
        for replica in job.replicas:
            if replica.roll is Roll.NONE:
                continue
            if _removed(act, replica):
                replica.roll = Roll.NONE  # (a scale-down removed it: it stops for good)
                removed.append(replica.index)
            elif replica.roll is Roll.STARTED and _serves(replica):
                settled = self._settles_in(replica)
                if settled > 0:
                    self._arm_roll_check(runtime, act.job.id, settled)
                    continue
                replica.roll = Roll.NONE
                finished.append(replica.index)
        current = next((r for r in job.replicas if r.roll not in (Roll.NONE, Roll.WAITS)), None)
        if current is not None:
            if current.roll is Roll.STARTED:
                self._arm_roll_limit(act, runtime, current)
            return
        self._cancel_roll_limit(runtime)
        following = next((r for r in job.replicas if r.roll is Roll.WAITS), None)
        if following is None:
            if finished:
                said = f"rolling restart done: replica {finished[-1]}, the last, is up"
            elif removed:
                # (the replicas it had left went with a scale-down: it ended unsaid, h177)
                left = replicas_said(removed)
                # ("done" of a roll cut short read as finished: tester h201)
                said = f"rolling restart stopped: {left} left removed by a scale-down"
            else:
                return
            self._book.record(act, EventKind.EDITED, {"message": said})
            return
        if following.state in (R.STARTING, R.UP) and following.pid is None:
            # Its start is decided and under way: it starts as things are now already.
            following.roll = Roll.STARTED
            self._roll_on(act)
        elif following.state.has_process and following.state is not R.STOPPING:
            grace = self._config.engine.grace_period
            following.roll = Roll.STOPPING
            # (stored: a restarted engine still kills it on time)
            job.kill_at = max(job.kill_at or 0.0, time.time() + grace)
            self._set_replica(
                act,
                following,
                R.STOPPING,
                f"rolling restart: SIGTERM sent, SIGKILL after {grace:g} s",
            )
            self._book.after_commit(
                functools.partial(
                    self._signal_replicas, job.id, [(following.index, following.launches)], grace
                )
            )
        elif following.state is R.BACKOFF:
            # It waits out a crash's back-off: its restart (the policy's, counted) is
            # brought forward, and the roll goes on once it is up.
            timer = runtime.restart_timers.pop(following.index, None)
            if timer is not None:
                timer.cancel()
            following.roll = Roll.STARTED
            self._restart_replica(job.id, following.index)
        else:
            following.roll = Roll.NONE  # (nothing of it runs to restart)
            self._roll_on(act)

    def _roll_stopped(self, act: ActiveJob, replica: Replica, what: str) -> None:
        """The replica the roll restarted did not come up (``what`` happened instead): the
        roll ends here, and the replicas not restarted yet run on untouched."""
        runtime = self._runtimes.get(act.job.id)
        if runtime is not None:
            self._cancel_roll_limit(runtime)
        left = [r.index for r in act.job.replicas if r.roll is Roll.WAITS]
        for other in act.job.replicas:
            other.roll = Roll.NONE
        untouched = f"; {replicas_said(left)} not restarted" if left else ""
        self._book.record(
            act,
            EventKind.EDITED,
            {
                "message": f"rolling restart stopped: replica {replica.index} {what} after "
                f"its restart{untouched}"
            },
        )

    def _arm_roll_limit(self, act: ActiveJob, runtime: ServiceRuntime, replica: Replica) -> None:
        """Give the replica the roll restarted ``restart_down_after`` s to be up again
        (counted from its start: a restarted engine arms what is left of it)."""
        limit = self._config.services.restart_down_after
        if limit <= 0 or runtime.roll_limit is not None:
            return
        started = replica.started_at if replica.started_at is not None else self.clock.now()
        delay = max(0.0, started + limit - self.clock.now())
        runtime.roll_limit = self.clock.call_later(
            delay, functools.partial(self._roll_limit_passed, act.job.id, replica.index)
        )

    def _settles_in(self, replica: Replica) -> float:
        """Seconds before a replica with no port counts as up for the roll: its process
        has run :data:`ROLL_SETTLE_S` (one that crashes at its start took every replica
        down, one after the other, as each "came up" the moment it started)."""
        if replica.port is not None or replica.started_at is None:
            return 0.0
        return max(0.0, replica.started_at + ROLL_SETTLE_S - self.clock.now())

    def _arm_roll_check(self, runtime: ServiceRuntime, job_id: int, delay: float) -> None:
        if runtime.roll_check is not None:
            runtime.roll_check.cancel()
        runtime.roll_check = self.clock.call_later(
            delay, functools.partial(self._roll_on_by_id, job_id)
        )

    @staticmethod
    def _cancel_roll_limit(runtime: ServiceRuntime) -> None:
        for timer in (runtime.roll_limit, runtime.roll_check):
            if timer is not None:
                timer.cancel()
        runtime.roll_limit = runtime.roll_check = None

    def _roll_limit_passed(self, job_id: int, index: int) -> None:
        act = self._book.get(job_id)
        runtime = self._runtimes.get(job_id)
        if act is None or runtime is None or index >= len(act.job.replicas):
            return
        runtime.roll_limit = None
        replica = act.job.replicas[index]
        if replica.roll is not Roll.STARTED or _serves(replica):
            return
        limit = self._config.services.restart_down_after
        self._roll_stopped(
            act,
            replica,
            f"was not up {limit:g} s ([services] restart_down_after) "
            f"({replica.state.value}: {replica.message})",
        )

    def timeout_edited(self, act: ActiveJob) -> None:
        """A waiting service's ``timeout`` was edited: its limit is armed again. One being
        placed again counts it from its first start; edited below what it had run, it
        ended only once placed (started, then stopped "before it started"), said as "no
        engine ran to stop it sooner" while one ran throughout (tester h52). It ends
        now, saying so."""
        timer = self._timeouts.pop(act.job.id, None)
        if timer is not None:
            timer.cancel()
        spec, job = act.spec, act.job
        if job.kind is not JobKind.SERVICE or spec is None or spec.timeout is None:
            return
        if job.started_at is None:
            return  # (armed as it starts)
        ran = time.time() - job.started_at
        if ran < spec.timeout:
            self._arm_timeout(job.id, spec.timeout - ran)
            return
        self._book.finish(
            act,
            JobStatus.FAILED,
            Reason.TIMEOUT,
            f"timed out after {spec.timeout:g} s (an edit set that limit when it had run "
            f"{int(ran)} s, waiting to be placed again)",
        )

    def _arm_timeout(self, job_id: int, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._timeouts[job_id] = loop.call_later(max(0.0, delay), self._timed_out, job_id)

    def _timed_out(self, job_id: int) -> None:
        self._timeouts.pop(job_id, None)
        act = self._book.get(job_id)
        if act is None or act.spec is None:
            return
        message = timeout_message(act.job, act.spec.timeout or 0)
        if act.job.status is JobStatus.QUEUED and act.job.started_at is not None:
            # Its limit ran out while it waited to be placed again: it ends now (nothing
            # runs), not with a whole new limit once placed.
            self._book.finish(act, JobStatus.FAILED, Reason.TIMEOUT, message)
            return
        if act.job.status is JobStatus.RUNNING:
            self.stop(act, Reason.TIMEOUT, message)

    def _ports_in_use(self) -> set[int]:
        return {
            r.port
            for job in self.active()
            for r in job.replicas
            if r.port is not None and r.state.has_process
        }

    def _decide_launch(self, act: ActiveJob, replica: Replica, verb: str, note: str = "") -> bool:
        """Decide the replica's next start (its port, its run number) and record it; the
        process is started once that is durable (:meth:`_spawn`). ``note`` goes after
        its message (why it starts where it does).

        Returns:
            False if it cannot start (then the service is failing, with the reason).
        """
        job, spec = act.job, act.spec
        port: int | None = None
        try:
            if spec is None:  # restored from a row this version cannot parse
                raise LaunchError("its stored spec can no longer be read")
            if spec.wants_port:
                port = free_port(self._config.services.host, self._ports_in_use())
        except LaunchError as err:
            self._launch_failed(act, replica, verb, str(err))
            return False
        replica.launches += 1
        replica.pid = replica.start_ticks = None
        replica.port, replica.endpoint, replica.next_restart_at = port, None, None
        replica.down_since = None
        replica.started_at = self.clock.now()
        if port is None:
            # (up from its start: no port to wait for; "starting" beside state up read wrong)
            said = "up (no port to wait for); its process starting"
            self._set_replica(act, replica, R.UP, said + note)
        else:
            self._set_replica(act, replica, R.STARTING, f"starting with $PORT {port}{note}")
        self._book.after_commit(
            functools.partial(self._spawn, job.id, replica.index, replica.launches, verb)
        )
        return True

    def _spawn(self, job_id: int, index: int, run: int, verb: str) -> None:
        """The decision to start is durable: start the replica's process."""
        act = self._book.get(job_id)
        runtime = self._runtimes.get(job_id)
        if act is None or runtime is None or index >= len(act.job.replicas):
            return
        replica = act.job.replicas[index]
        if replica.launches != run or replica.pid is not None:
            return  # superseded, or already running
        if replica.state is R.STOPPING:
            # Stopped before it started: it never runs.
            self._set_replica(act, replica, R.EXITED, "stopped before it started")
            self._settle(act)
            return
        if replica.state not in (R.STARTING, R.UP):
            return
        spec = act.spec
        assert spec is not None
        own = self._env.own(job_id, replica.gpus, spec.run_dir)
        own["GPULAYER_REPLICA"] = str(index)
        if replica.port is not None:
            own["PORT"] = str(replica.port)
        try:
            prepare_task(
                self._executor,
                (job_id, index),
                spec,
                self._env.shared(spec, act.job.owner_uid),
                own,
                functools.partial(self._replica_started, job_id, index, run),
                functools.partial(self._replica_exited, job_id, index, run),
                run,
            ).send()  # (decided and durable: this runs after its commit)
        except LaunchError as err:
            self._launch_failed(act, replica, verb, str(err))

    def _replica_started(self, job_id: int, index: int, run: int, started: Started) -> None:
        act = self._book.get(job_id)
        if act is None or index >= len(act.job.replicas):
            return
        replica = act.job.replicas[index]
        if replica.launches != run:
            return
        pid = started.pid
        replica.pid, replica.start_ticks = pid, started.start_ticks
        self._book.roots.add(pid, job_id, started.start_ticks)
        if not act.launched and all(
            r.pid is not None or not r.state.has_process for r in act.job.replicas
        ):
            # (once per placement: a replica a scale-up added is no start of the service)
            act.launched = True
            self._book.started(job_id, started.at)
        if replica.state is R.STARTING:
            assert replica.port is not None
            # (dated when the launcher made it: one that exited at once was learnt of
            # after its exit, and its timeline said it ended before it started: h134)
            self._set_replica(
                act,
                replica,
                R.STARTING,
                f"pid {pid} started; waiting for port {replica.port} to accept",
                at=started.at,
            )
            self._watch_port(act, replica)
        elif replica.state is R.UP:
            self._set_replica(act, replica, R.UP, f"running (pid {pid})", at=started.at)

    def _launch_failed(self, act: ActiveJob, replica: Replica, verb: str, error: str) -> None:
        """A replica cannot start: the service fails with the reason; a restart that
        cannot start (its working directory gone a moment, no port free) is a failed run
        of the replica, retried after a back-off as its policy allows (it ended the
        service for good, restart = always or not); so is the first start of a replica
        a scale-up added."""
        runtime = self._runtimes.get(act.job.id)
        if (
            # (a restart, or a replica a scale-up added to a service that runs: the others
            # started, so the spec can; it ended the service, every replica with it)
            (replica.restarts > 0 or act.launched)
            and runtime is not None
            and runtime.end is None
            and runtime.replacing is None
            and replica.state is not R.STOPPING
        ):
            why = self._no_restart_because(act, replica, None)
            if why is None:
                replica.pid = replica.start_ticks = None
                self._back_off(act, runtime, replica, f"could not {verb}: {error}", None)
                return
        if replica.state is not R.EXITED:
            self._set_replica(act, replica, R.EXITED, f"could not {verb}: {error}", gave_up=True)
        self._end(
            act,
            JobStatus.FAILED,
            Reason.LAUNCH_FAILED,
            f"replica {replica.index} could not {verb}: {error}",
        )

    def _watch_port(self, act: ActiveJob, replica: Replica) -> None:
        assert replica.pid is not None and replica.port is not None
        task = asyncio.get_running_loop().create_task(
            self._probe_port(act, replica, replica.pid, replica.port)
        )
        self._runtimes[act.job.id].probes[replica.index] = task

    async def _probe_port(self, act: ActiveJob, replica: Replica, pid: int, port: int) -> None:
        """Watch the replica's port for as long as this process of it runs.

        Starting (or down), ``host:port`` is polled until it accepts a connection, then the
        replica is up. Up, the port is checked every ``[services] check_interval``; after
        ``down_after`` failed checks in a row the replica is down (its endpoint withdrawn:
        it was shown "up" for as long as it ran, serving or not) until it answers again,
        and once down for ``restart_down_after`` seconds it is stopped and restarted.
        """
        delay = 0.02
        failed = 0
        first_failed = 0.0
        unaccepted = 0  # its accept queue at the last check (see procs.accept_queue)
        piled = 0  # checks in a row that found that queue longer than the one before
        stuck_at: int | None = None  # down for not accepting: the queue it was found with
        while replica.pid == pid:
            settings = self._config.services
            # (read each time: a [services] host set right, as a replica's message
            # advises, never reached the replicas starting already: tester h170)
            host = settings.host
            if replica.state is R.UP:
                # (0: not checked, until a new configuration says otherwise)
                interval = settings.check_interval if settings.check_interval > 0 else None
                if await self._sleep_unless_reconfigured(interval):
                    continue  # (its new interval, counted from now)
                if replica.pid != pid or replica.state is not R.UP:
                    continue
                # A hung server's port still "answers": the kernel completes each connect
                # while its accept queue has room (128 checks, 20 minutes at 10 s). Its
                # queue tells: each check's connection waits there, unaccepted. Longer
                # than at the check before is a failed check (a busy server's queue
                # comes and goes; only one that grows check after check fails them all).
                waiting = await asyncio.to_thread(procs.accept_queue, port)
                if replica.pid != pid or replica.state is not R.UP:
                    continue
                growing = waiting is not None and waiting > unaccepted
                unaccepted = waiting or 0
                piled = piled + 1 if growing else 0
                # (connected every time: a hung server's queue grows by ours)
                if await _answers(host, port) and not growing:
                    failed = 0
                    continue
                if replica.pid != pid or replica.state is not R.UP:
                    continue
                failed += 1
                if failed == 1:
                    first_failed = time.time()
                if failed < settings.down_after:
                    continue
                replica.down_since = first_failed
                at = time.strftime("%H:%M:%S", time.localtime(first_failed))
                if piled >= failed:
                    stuck_at = unaccepted
                    said = (
                        f"port {port} {NOT_ACCEPTING} at {at} ({plural(unaccepted, 'connection')} "
                        f"wait, more at each of {plural(failed, 'check')} in a row); "
                        "endpoint withdrawn"
                    )
                else:
                    said = (
                        f"port {port} stopped answering at {at} "
                        f"({plural(failed, 'check')} in a row failed); endpoint withdrawn"
                    )
                self._set_replica(act, replica, R.DOWN, said)
                delay = 0.02
                continue
            if replica.state not in (R.STARTING, R.DOWN):
                return
            answered: bool
            if replica.state is R.DOWN and NOT_ACCEPTING in replica.message:
                # Down for not accepting: its port answers all along. Serving again is its
                # queue shorter than it was found with (it accepted), or empty; no connect
                # of ours meanwhile (each would wait in that queue too).
                waiting = await asyncio.to_thread(procs.accept_queue, port)
                if stuck_at is None:  # (a restarted engine: the queue as found now)
                    stuck_at = waiting or 0
                shorter = waiting is not None and (waiting == 0 or waiting < stuck_at)
                answered = shorter and await _answers(host, port)
            else:
                answered = await _answers(host, port)
            if not answered:
                if replica.pid != pid:
                    continue
                if replica.state is R.DOWN and self._overdue(replica, time.time()):
                    # (asked first: a restarted engine found one that had come back while
                    # none ran, and stopped it on its stored down_since)
                    self._restart_down(act, replica)
                    return
                if (
                    replica.pid == pid
                    and replica.state is R.STARTING
                    and replica.message.startswith(f"port {port} {ANSWERED_BY} ")
                ):
                    # (the other program is gone: it went on being named; and "pid N started"
                    # read as a new start, of a replica started minutes before: h116)
                    self._set_replica(
                        act,
                        replica,
                        R.STARTING,
                        f"port {port} is free again; still waiting for pid {pid} to accept on it",
                    )
                elif replica.state is R.STARTING and delay >= PROBE_INTERVAL_MAX_S:
                    await self._say_where_it_listens(act, replica, pid, port, host)
                await asyncio.sleep(delay)
                delay = min(PROBE_INTERVAL_MAX_S, delay * 1.5)
                continue
            # Whose port answered? Another program on it was taken for the replica ("up"
            # on an endpoint the replica never served).
            owner = await asyncio.to_thread(_foreign_listener, port, pid, replica.start_ticks)
            if replica.pid != pid or replica.state not in (R.STARTING, R.DOWN):
                continue
            if owner is not None:
                said = f"port {port} {ANSWERED_BY} pid {owner}, not by this replica"
                if replica.state is R.STARTING and replica.message != said:
                    self._set_replica(act, replica, R.STARTING, said)
                await asyncio.sleep(delay)
                delay = min(PROBE_INTERVAL_MAX_S, delay * 1.5)
                continue
            again = replica.state is R.DOWN
            endpoint, only_here = await self._reachable_at(host, port)
            if replica.pid != pid or replica.state not in (R.STARTING, R.DOWN):
                continue
            replica.endpoint = endpoint
            replica.down_since = None
            failed = piled = unaccepted = 0
            stuck_at = None
            said = "answering again" if again else "up"
            self._set_replica(
                act, replica, R.UP, f"{said} at {replica.endpoint} (pid {pid}){only_here}"
            )

    async def _reachable_at(self, host: str, port: int) -> tuple[str, str]:
        """Where a replica answering at ``host:port`` can be reached, and a note when that
        is not where ``[services] host`` says: with a wildcard host the endpoint names this
        machine's host name, but a server bound to loopback alone answers the engine's own
        check (a connect to 0.0.0.0 reaches 127.0.0.1) and no other machine. It was said
        "up at vm:34653", an endpoint nobody else could use (tester h168)."""
        if host not in WILDCARD_HOSTS:
            return endpoint_of(host, port), ""
        where = await asyncio.to_thread(procs.listen_addresses, port)
        if not where or not all(ipaddress.ip_address(a).is_loopback for a in where):
            return endpoint_of(host, port), ""
        return endpoint_of(where[0], port), (
            f"; listened on only at {', '.join(where)}: not reachable from other machines "
            f"(bind {host} to be, as [services] host asks)"
        )

    async def _say_where_it_listens(
        self, act: ActiveJob, replica: Replica, pid: int, port: int, host: str
    ) -> None:
        """A starting replica whose port does not answer at ``host`` but is listened on
        at another address (a server bound to ``::1``, where ``host`` is 127.0.0.1): say
        so. It said "port N not answering yet" for ever, and the user looked for a bug in
        the server (tester h144)."""
        where = await asyncio.to_thread(procs.listen_addresses, port)
        if replica.pid != pid or replica.state is not R.STARTING:
            return
        if not where:
            # Nothing listens on its port: its server may listen on another one (it
            # ignores $PORT: "port N not answering yet" for ever; tester h168).
            others = await asyncio.to_thread(procs.listened_ports, pid)
            if port in others:
                # (bound between the two reads: it was said to listen on "52113 instead"
                # of 52113, its own port: tester h185)
                return
            if others and replica.pid == pid and replica.state is R.STARTING:
                ports = ", ".join(map(str, others))
                said = f"port {port} {LISTENS_ELSEWHERE} {ports} instead: serve on $PORT ({port})"
                if replica.message != said:
                    self._set_replica(act, replica, R.STARTING, said)
            return
        if host in where or "0.0.0.0" in where or "::" in where:
            return  # (it listens where it is checked: it does not accept yet)
        if await asyncio.to_thread(_foreign_listener, port, pid, replica.start_ticks):
            return  # (another program's: said once it answers, as ever)
        said = (
            f"port {port} {LISTENED_ONLY_ON} {', '.join(where)}, not at {host} where the "
            f"engine checks it ([services] host): bind {host} (or all addresses), or set "
            "[services] host"
        )
        if replica.pid == pid and replica.state is R.STARTING and replica.message != said:
            self._set_replica(act, replica, R.STARTING, said)

    def _overdue(self, replica: Replica, at: float) -> bool:
        """Whether a down replica has been down long enough at ``at`` to be restarted
        (worked out from what is stored, so a restarted engine decides alike)."""
        limit = self._config.services.restart_down_after
        since = replica.down_since
        return replica.state is R.DOWN and limit > 0 and since is not None and at - since >= limit

    def _restart_down(self, act: ActiveJob, replica: Replica) -> None:
        """Stop a replica that stayed down too long; its exit restarts it (recorded first,
        signalled once that is durable)."""
        runtime = self._runtimes.get(act.job.id)
        if runtime is None or runtime.end is not None or runtime.replacing is not None:
            return
        grace = self._config.engine.grace_period
        down = time.time() - (replica.down_since or time.time())
        # (the same words as its down message: a hung server's port answers)
        how = NOT_ACCEPTING if NOT_ACCEPTING in replica.message else "not answering"
        # (Its exit is judged as not answering: only the policy's count can end it.)
        final = self._no_restart_because(act, replica, None)
        self._set_replica(
            act,
            replica,
            R.DOWN,
            f"port {replica.port} {how} for {down:.{1 if down < 10 else 0}f} s: "
            f"{RESTARTING_DOWN if final is None else ENDING_DOWN}"
            f" (SIGKILL after {grace:g} s)" + ("" if final is None else f"; {final}"),
        )
        self._book.after_commit(
            functools.partial(
                self._signal_replicas, act.job.id, [(replica.index, replica.launches)], grace
            )
        )

    # -- state --------------------------------------------------------------------------------

    def _set_replica(
        self,
        act: ActiveJob,
        replica: Replica,
        state: ReplicaState,
        message: str,
        exit_code: int | None = None,
        gave_up: bool = False,
        at: float | None = None,
        not_started: bool = False,
    ) -> None:
        """The one place a replica's state changes (or its message, in the same state):
        check, update the summary, record. ``gave_up``: it exited for good on its own (no
        restart left, or it could not start); the event says so (notifications use it).
        ``at``: when it happened, if that was learnt late (an exit while no engine ran)."""
        job = act.job
        went_down = state is R.DOWN and replica.state is not R.DOWN
        if state is not replica.state:
            check_replica_transition(job.id, replica.index, replica.state, state)
        replica.state = state
        replica.message = message
        if not state.has_process:
            # (A dead process's pid and port, shown in back-off or after the end, told a
            # script to signal a pid the system may have given to another: tester h77.)
            replica.pid = replica.start_ticks = replica.port = None
        if state is not R.UP:
            # (Shown in backoff or after it ended, an endpoint sent clients to a dead port;
            # while stopping, to one told to go: tester h140.)
            replica.endpoint = None
        runtime = self._runtimes.get(job.id)
        steady = runtime is None or (runtime.end is None and runtime.replacing is None)
        if job.status is JobStatus.RUNNING and steady:
            job.message = self._summary(job)
        data = {
            "replica": replica.index,
            "state": state.value,
            "message": f"replica {replica.index}: {message}",
            "exit_code": exit_code,
            "restarts": replica.restarts,
            "endpoint": replica.endpoint,
            "next_restart_at": replica.next_restart_at,
        }
        if gave_up:
            data["gave_up"] = True
        if went_down:
            data["went_down"] = True  # (notify: its port stopped answering)
        if not_started:
            data["not_started"] = True  # (see notify: not a restart to tell of)
        self._book.record(act, EventKind.REPLICA, data, at)
        if replica.roll is Roll.STARTED and _serves(replica):
            # (the roll's next stop is decided once this "up" is durable)
            self._book.after_commit(functools.partial(self._roll_on_by_id, job.id))

    def _roll_on_by_id(self, job_id: int) -> None:
        act = self._book.get(job_id)
        if act is not None and job_id in self._runtimes:
            self._roll_on(act)

    def _summary(self, job: Job) -> str:
        """Its message: :func:`service_summary`, and a warning while a GPU it runs on is
        not found by the driver (see ``DomainOps._warn_missing``)."""
        for index, jobs in self._scheduler.missing_gpus().items():
            if job.id in jobs:
                return service_summary(job) + missing_warning(index)
        return service_summary(job)

    # -- exits and restarts -------------------------------------------------------------------

    def _replica_exited(self, job_id: int, index: int, run: int, exit: Exit) -> None:
        """A replica's process ended: restart it, end the service, or finish stopping."""
        self._book.after_commit(functools.partial(self._executor.done, (job_id, index), run))
        act = self._book.get(job_id)
        runtime = self._runtimes.get(job_id)
        if act is None or runtime is None or index >= len(act.job.replicas):
            return
        replica = act.job.replicas[index]
        if replica.launches != run:
            return  # an older start of this replica (its end was already handled)
        # Told after its end is decided (a quarantine it brings about places the service
        # again): a replica that ended by itself, not stopped by the engine.
        by_itself = exit.error is None and not (
            replica.state is R.STOPPING
            or runtime.end is not None
            or runtime.replacing is not None
            or self._overdue(replica, exit.at or time.time())
        )
        gpus = [d for d in act.holds if d.is_gpu and d.name in replica.domains]
        self._replica_ended(act, runtime, replica, exit)
        if by_itself and gpus and self.on_replica_end is not None:
            self.on_replica_end((job_id, index), exit.code, gpus)

    def _replica_ended(
        self, act: ActiveJob, runtime: ServiceRuntime, replica: Replica, exit: Exit
    ) -> None:
        index = replica.index
        self._book.roots.drop(replica.pid)
        probe = runtime.probes.pop(index, None)
        if probe is not None:
            probe.cancel()
        if exit.error is not None and replica.state is not R.STOPPING:
            self._launch_failed(act, replica, "start", exit.error)
            return
        code = exit.code
        replica.last_exit_code = code
        what = describe_exit(code) if exit.error is None else "not started"
        # The timeline has the exit when the launcher saw it (one learnt late, while no
        # engine ran, was stamped with the restart that learnt of it).
        late = None if exit.at is None else min(exit.at, time.time())
        if (
            replica.roll is Roll.STOPPING
            and replica.state is R.STOPPING
            and runtime.end is None
            and runtime.replacing is None
            and not _removed(act, replica)
        ):
            # Stopped by a rolling restart: it starts again at once (the roll's own
            # restart, not the policy's: its back-off starts afresh, and no count).
            replica.roll = Roll.RESTARTING
            replica.backoff_step = 0
            replica.next_restart_at = self.clock.now()
            if not any(r.state is R.STOPPING for r in act.job.replicas if r is not replica):
                act.job.kill_at = None
            # (not_started: no "replica.restarted" notification; a roll of 5 sent 5 alerts
            # that read as crashes: tester h177)
            self._set_replica(
                act,
                replica,
                R.BACKOFF,
                f"rolling restart: {what}; starting again",
                code,
                at=late,
                not_started=True,
            )
            runtime.restart_timers[index] = self.clock.call_later(
                0.0, functools.partial(self._restart_replica, act.job.id, index)
            )
            return
        if replica.state is R.STOPPING or runtime.end is not None or runtime.replacing is not None:
            if replica.state.has_process:
                # (one that ended by itself as the service's end was decided: its exit,
                # not a stop)
                said = (
                    f"stopped: {what}" if replica.state is R.STOPPING else what
                )  # (no (..(..)): h170)
                self._set_replica(act, replica, R.EXITED, said, code, at=late)
            if exit.at is not None and (runtime.end is not None or act.job.stop_reason):
                # (the service ends when its last replica did, as the launcher recorded
                # it: not at the next engine's start; a replica a scale-down stopped ends
                # no service: a cancel later, with none running, ended it back then)
                runtime.ended_at = max(runtime.ended_at or 0.0, exit.at)
            self._settle(act)
            return
        # When it ended: the launcher's record (it may have ended while no engine ran, and
        # the next engine's start is not its end: a crash loop then read as steady).
        now = self.clock.now()
        ago = max(0.0, time.time() - exit.at) if exit.at is not None else 0.0
        if ago < 1.0:
            ago = 0.0  # (told as it happened: only an end learnt late moves it back)
        ended = now - ago  # (on the restart clock's own time line)
        if replica.started_at is not None and ended - replica.started_at >= (
            self._config.services.steady_after
        ):
            replica.backoff_step = 0  # it ran steadily: a fresh crash starts at 1 s again
        # Stopped by the engine for not answering: restarted, whatever it exited with (a
        # server that exits 0 on SIGTERM ended an `on_failure` service "completed").
        forced = self._overdue(replica, exit.at or time.time())
        if forced:
            # (its down message's words: "stopped answering" was said of a hung server,
            # whose port answered but took no connection: tester h127)
            how = NOT_ACCEPTING if NOT_ACCEPTING in replica.message else "stopped answering"
            what = f"stopped after its port {replica.port} {how}: {what}"
        elif code == 0 and replica.state is R.STARTING and replica.port is not None:
            # A clean exit before its port ever answered: a command that started its
            # server in the background (`server & echo started`) and ended, again and
            # again, with no word of why (tester h168).
            what = f"{what} before its port answered: {FOREGROUND}"
        why = self._no_restart_because(act, replica, None if forced else code)
        if why is None:
            self._back_off(act, runtime, replica, what, code, late)
            return
        self._set_replica(
            act, replica, R.EXITED, f"{what}; not restarted ({why})", code, gave_up=True, at=late
        )
        status, reason, _ = exit_verdict(code)
        if forced:
            # (stopped for not answering: a failure, whatever it exited with; a server
            # that exits 0 on SIGTERM ended the service "completed", its dependents run)
            status = JobStatus.FAILED
            reason = Reason.SIGNAL if code is not None and code > 128 else Reason.EXIT_CODE
        running = [
            r
            for r in act.job.replicas
            if r is not replica and r.state.has_process and r.index not in runtime.ended_unseen
        ]
        others = " (the other replicas were stopped)" if running else ""
        message = f"replica {index} {what}; not restarted ({why}){others}"
        self._end(act, status, reason, message, code, exit.at)

    def _back_off(
        self,
        act: ActiveJob,
        runtime: ServiceRuntime,
        replica: Replica,
        what: str,
        code: int | None,
        late: float | None = None,
        not_started: bool = False,
        wait_step: int | None = None,
    ) -> None:
        """The replica restarts after its next back-off delay (``not_started``: it did not
        exit, it waits on: no "restarted" notification is due; ``wait_step``: the step of
        such a wait, kept apart from the replica's crash back-off, which it leaves as it is).
        """
        if wait_step is None:
            delay = backoff_delay(replica.backoff_step)
            replica.backoff_step += 1
        else:
            delay = backoff_delay(wait_step)
        replica.next_restart_at = self.clock.now() + delay
        self._set_replica(
            act,
            replica,
            R.BACKOFF,
            # (the clock time, not "in 16 s": the job's message stays while the delay runs
            # down, and read a quarter of a minute later that told 16 s more; the delay
            # said as the back-off it is, except for an exit learnt late, stamped when it
            # was: "1 s" beside an exit 6 s before it read wrong; said instead why its
            # restart came so long after it: a minute's gap read as unexplained, h106)
            f"{what}; restart #{replica.restarts + 1} at "
            + time.strftime("%H:%M:%S", time.localtime(time.time() + delay))
            + (
                " (it ended while no engine ran: restarted once one did)"
                if late is not None and late < time.time() - 1
                else f" ({delay:g} s back-off)"
            ),
            code,
            at=late,
            not_started=not_started,
        )
        runtime.restart_timers[replica.index] = self.clock.call_later(
            delay, functools.partial(self._restart_replica, act.job.id, replica.index)
        )
        if replica.roll in (Roll.RESTARTING, Roll.STARTED):
            self._roll_stopped(act, replica, what)

    @staticmethod
    def _no_restart_because(act: ActiveJob, replica: Replica, code: int | None) -> str | None:
        """Why the policy says this exit is final, or ``None`` to restart the replica."""
        spec = act.spec
        if spec is None:
            # Restored from a row this version cannot parse: no policy to apply.
            return "its stored spec can no longer be read"
        if spec.restart_policy != "always" and code == 0:
            return f"restart = {spec.restart_policy}"
        if spec.max_restarts is not None and replica.restarts >= spec.max_restarts:
            return f"max_restarts = {spec.max_restarts} reached"
        return None

    def _restart_replica(self, job_id: int, index: int) -> None:
        act = self._book.get(job_id)
        runtime = self._runtimes.get(job_id)
        if act is None or runtime is None or runtime.end is not None:
            return
        if runtime.replacing is not None:
            return
        runtime.restart_timers.pop(index, None)
        replica = act.job.replicas[index]
        if replica.state is not R.BACKOFF:
            return
        draining = self._domain_draining(act, replica)
        if draining is not None and self._fits_now_elsewhere(act):
            # Its domain is drained (no new work there): it moves where it fits now, as
            # the whole service; else it starts again in place (a drain lets running work
            # go on). It restarted there for good, and a drain never emptied a GPU that
            # ran a service (tester h52). The move is no loss: it does not count against
            # retry.max_attempts (with 1, a drain failed the service; tester h58).
            self.replace(act, draining, move=True)
            return
        gone = self._domain_gone(act, replica)
        if gone is not None:
            # Restarted in place, it ran on a GPU the driver no longer lists, or one the
            # config no longer schedules on (the running processes are left alone; a new
            # one is not started there): placed again, as for a lost domain, if the whole
            # service fits elsewhere; else this replica waits, the others running on (it
            # was placed again and failed over capacity, its healthy replicas stopped).
            if self._fits_now_elsewhere(act) or self._down_and_placeable(act, index):
                self.replace(act, gone)
                return
            step = runtime.off_domain.get(index, replica.backoff_step)
            runtime.off_domain[index] = step + 1
            self._back_off(
                act,
                runtime,
                replica,
                f"not started again: {gone}",
                None,
                not_started=True,
                wait_step=step,
            )
            return
        runtime.off_domain.pop(index, None)
        if replica.roll is Roll.RESTARTING:
            replica.roll = Roll.STARTED  # (a rolling restart's: not the policy's to count)
        else:
            replica.restarts += 1
        # (it restarted on a drained domain with no word of it: only `domain drain`
        # said it might; tester h121)
        drained = self._drained_domain(replica)
        note = ""
        if drained is not None:
            why = f" ({drained.state_reason})" if drained.state_reason else ""
            held_back = self._queue.limit_blocks_again(act)
            note = f"; restarted in place on {drained.name}, draining{why}, as the service " + (
                f"placed again would wait ({held_back})"
                if held_back is not None
                else "fits nowhere else now"
            )
        if self._decide_launch(act, replica, "restart", note) and replica.roll is Roll.STARTED:
            self._arm_roll_limit(act, runtime, replica)  # (it has so long to be up)

    def domains_changed(self) -> None:
        """A reload changed the domains: a replica that waited in back-off off a domain
        the config had removed starts at once where its domain is back (it waited for
        its next back-off step, up to minutes)."""
        for job_id, runtime in list(self._runtimes.items()):
            act = self._book.get(job_id)
            if act is None or runtime.end is not None or runtime.replacing is not None:
                continue
            for index in sorted(runtime.off_domain):
                replica = act.job.replicas[index]
                if replica.state is not R.BACKOFF or self._domain_gone(act, replica):
                    continue
                timer = runtime.restart_timers.pop(index, None)
                if timer is not None:
                    timer.cancel()
                runtime.restart_timers[index] = self.clock.call_later(
                    0, functools.partial(self._restart_replica, job_id, index)
                )

    def _down_and_placeable(self, act: ActiveJob, index: int) -> bool:
        """Whether no replica but ``index`` (off its domain) has a process, and the
        service's spec still resolves: placed again, it stops nothing that serves. Left
        waiting in place instead, a service on a GPU the driver no longer lists read
        "running 0/1 up", holding that GPU, and backed off ever longer until another
        job's end let it move (tester h194); placed again, it is queued ("waiting for a
        GPU") and starts where one frees."""
        if act.request is None:
            return False  # (pinned to a domain the config removed: it waits for it)
        return not any(r.state.has_process for r in act.job.replicas if r.index != index)

    def _fits_now_elsewhere(self, act: ActiveJob) -> bool:
        """Whether the whole service would be placed again now: on the healthy domains it
        holds and the free ones (a capacity check passed while the other GPU was busy or
        quarantined: its healthy replicas were stopped, and it waited down)."""
        request = act.request
        if request is None:
            # (its spec no longer resolves: pinned to a domain the config removed, as a
            # restarted engine finds it; placed again, it failed for good)
            return False
        if self._queue.closed() is not None:
            # Paused (or the disk full): placed again, it would wait there, every replica
            # down, until the queue opens (pause, drain, one exit: an outage; tester h58).
            return False
        if not request.gpus:
            # CPU replicas share the one cpu pool: there is no elsewhere. (True moved a
            # service off a drained pool to wait there, every replica down, until the
            # drain was released; tester h98.)
            return False
        if self._queue.limit_blocks_again(act) is not None:
            # Its user is past a limit (lowered by a reload while it ran): placed again,
            # it would wait there, every replica down (tester h125).
            return False
        domains = self._scheduler.domains
        own = {
            d.name
            for d in act.holds
            if domains.get(d.name) is d and d.state is DomainState.IN_SERVICE
        }
        free = {
            d.name
            for d in self._scheduler.candidates(request)
            if d.is_gpu
            and d.name not in own
            and d.state is DomainState.IN_SERVICE
            and d.blocker(request.vram_bytes, request.exclusive) is None
        }
        return len(own) + len(free) >= request.gpus

    def _domain_draining(self, act: ActiveJob, replica: Replica) -> str | None:
        """Why the replica should rather not start again where it ran (a domain of it is
        drained), or ``None``."""
        dom = self._drained_domain(replica)
        if dom is None:
            return None
        reason = f": {dom.state_reason}" if dom.state_reason else ""
        return f"domain {dom.name} draining{reason}"

    def _drained_domain(self, replica: Replica) -> Domain | None:
        """The first domain the replica ran on that is draining, or ``None``."""
        for name in replica.domains:
            dom = self._scheduler.domains.get(name)
            if dom is not None and dom.state is DomainState.DRAINING:
                return dom
        return None

    def _domain_gone(self, act: ActiveJob, replica: Replica) -> str | None:
        """Why the replica may not start again where it ran (a domain of it is no longer
        scheduled on), or ``None``."""
        domains = self._scheduler.domains
        missing = self._scheduler.missing_gpus()
        held = {d.name: d for d in act.holds}
        for name in replica.domains:
            now = domains.get(name)
            dom = held.get(name)
            if now is not None and (dom is None or now.gpu_index == dom.gpu_index):
                continue
            index = dom.gpu_index if dom is not None else None
            if index is not None and index in missing:
                return f"GPU {index} ({name}) is not found by the driver"
            return f"domain {name} is no longer in the configuration"
        return None

    # -- stopping -----------------------------------------------------------------------------

    def stop(self, act: ActiveJob, reason: TerminationReason, message: str) -> None:
        """Cancel or time out a running service: stop every replica, then end it."""
        status = JobStatus.CANCELLED if reason is Reason.CANCELLED else JobStatus.FAILED
        self._end(act, status, reason, message)

    def _end(
        self,
        act: ActiveJob,
        status: JobStatus,
        reason: TerminationReason,
        message: str,
        exit_code: int | None = None,
        ended_at: float | None = None,
    ) -> None:
        """Decide how the service ends; it does once no replica process is left. The
        verdict is stored with the stop (its reason, message and exit code), so an engine
        restarted while the other replicas stop ends it the same way."""
        runtime = self._runtimes.setdefault(act.job.id, ServiceRuntime())
        if runtime.end is not None:
            return  # already ending; the first verdict stands
        runtime.end = (status, reason, message, exit_code)
        if ended_at is not None:  # (the latest of its replicas' recorded ends)
            runtime.ended_at = max(runtime.ended_at or 0.0, ended_at)
        act.job.stop_reason, act.job.stop_message = reason, message
        act.job.exit_code = exit_code
        self._stop_replicas(act, runtime, f"stopping ({message})")
        self._settle(act)

    def domain_quarantined(self, dom: Domain) -> None:
        """A domain was quarantined: every service on it is placed again (record 000)."""
        for job_id in sorted(dom.holdings):
            act = self._book.get(job_id)
            if act is not None and act.job.kind is JobKind.SERVICE:
                self.replace(act, f"domain {dom.name} quarantined: {dom.state_reason}")

    def replace(self, act: ActiveJob, why: str, *, move: bool = False) -> None:
        """A domain of the service was lost: stop it and place it again (record 000).

        Args:
            act: The running service.
            why: What happened, in words.
            move: Only to move it off a drained domain: not counted as a placement
                against ``retry.max_attempts``.
        """
        runtime = self._runtimes.get(act.job.id)
        if runtime is None or runtime.end is not None or runtime.replacing is not None:
            return
        if act.job.status is not JobStatus.RUNNING:
            return
        runtime.replacing, runtime.moving = why, move
        # Stored with the stop: an engine restarted before the replicas are gone goes on
        # placing it again (it ended it "cancelled", which no one had asked for), and a
        # move stays a move (its words say so, as a preemption's name the job it is for):
        # read back as a loss, it spent a placement, and with retry.max_attempts = 1 the
        # service failed "domain lost" (tester h109).
        act.job.stop_reason = Reason.DOMAIN_LOST
        act.job.stop_message = f"{MOVING_OFF}{why}" if move else why
        self._stop_replicas(act, runtime, f"placing again: {why}")
        self._settle(act)

    def _stop_replicas(self, act: ActiveJob, runtime: ServiceRuntime, summary: str) -> None:
        """Record that every replica stops; signal them once that is durable."""
        job = act.job
        runtime.cancel_restarts()
        grace = self._config.engine.grace_period
        # Signalled once stored: while the database cannot be written, "SIGTERM sent" was
        # said of replicas no signal had reached (as of a batch job: tester h187).
        unstored = self._book.write_failure is not None
        sent = "SIGTERM once this is stored" if unstored else "SIGTERM sent"
        if any(r.roll is not Roll.NONE for r in job.replicas):
            # A rolling restart ends with the service's run, and says so: a cancel or a
            # re-placement in the middle of one left its start the last word of it
            # (tester h185).
            self._cancel_roll_limit(runtime)
            left = [r.index for r in job.replicas if r.roll is Roll.WAITS]
            untouched = f"; {replicas_said(left)} not restarted" if left else ""
            self._book.record(
                act, EventKind.EDITED, {"message": f"rolling restart stopped: {summary}{untouched}"}
            )
        stopping = []
        for replica in job.replicas:
            replica.roll = Roll.NONE
            if replica.index in runtime.ended_unseen:
                continue  # (it ended while no engine ran: its exit is told next)
            if replica.state.has_process and replica.state is not R.STOPPING:
                self._set_replica(act, replica, R.STOPPING, sent)
                stopping.append((replica.index, replica.launches))
            elif replica.state in (R.PENDING, R.BACKOFF):
                replica.next_restart_at = None
                words = "not started again"
                if runtime.replacing is not None and runtime.end is None:
                    # Placed again, it starts with the others: its restart (announced
                    # "restart #N at ...") is that one, and counted. "not started again"
                    # read as given up, and the restart went uncounted (tester h98).
                    words = "starts again with the service's next placement"
                    if replica.state is R.BACKOFF:
                        replica.restarts += 1
                self._set_replica(act, replica, R.EXITED, words)
        if stopping:
            job.kill_at = time.time() + grace
            said = f"{summary}: SIGTERM sent, SIGKILL after {grace:g} s"
            if unstored:
                summary += (
                    ": SIGTERM once this is stored (the database cannot be written now), "
                    f"SIGKILL {grace:g} s later"
                )
            else:
                summary = said
        self._book.note(act, summary)
        if stopping:
            if unstored:
                self._book.after_commit(functools.partial(self._said_sent, job.id, said, grace))
            self._book.after_commit(
                functools.partial(self._signal_replicas, job.id, stopping, grace)
            )

    def _said_sent(self, job_id: int, said: str, grace: float) -> None:
        """A stop decided while the database could not be written is stored: its SIGTERM
        goes now, and the service and its stopping replicas say so."""
        act = self._book.get(job_id)
        if act is None:
            return
        act.job.kill_at = time.time() + grace
        for replica in act.job.replicas:
            if replica.state is R.STOPPING and replica.message == "SIGTERM once this is stored":
                self._set_replica(act, replica, R.STOPPING, "SIGTERM sent")
        self._book.note(act, said)

    def _signal_replicas(self, job_id: int, replicas: list[tuple[int, int]], grace: float) -> None:
        for index, run in replicas:
            key = (job_id, index)
            if key in self._legacy.pids():
                self._legacy.terminate(key, grace)
            else:
                # Not started yet: _spawn sees the stop and never starts it.
                self._executor.terminate(key, grace, run)

    def _settle(self, act: ActiveJob) -> None:
        """Once no replica process is left, end the service or queue it again (and once
        the replicas a scale-down removed are gone, drop them)."""
        runtime = self._runtimes[act.job.id]
        if runtime.end is None and runtime.replacing is None:
            self._drop_removed(act)
            self._roll_on(act)  # (a replica it restarted or awaited may have gone with them)
        if any(r.state.has_process for r in act.job.replicas):
            return
        act.job.kill_at = None
        if runtime.end is not None:  # (a cancel while it was being placed again wins)
            status, reason, message, code = runtime.end
            self._book.finish(act, status, reason, message, code, ended_at=runtime.ended_at)
        elif runtime.replacing is not None:
            self._requeue(act, runtime)

    def _requeue(self, act: ActiveJob, runtime: ServiceRuntime) -> None:
        job, spec = act.job, act.spec
        assert spec is not None and runtime.replacing is not None
        why, runtime.replacing = runtime.replacing, None
        job.stop_reason, job.stop_message = None, ""
        act.ran_on = frozenset(d.name for d in act.holds if d.is_gpu)
        release_holds(act)
        act.holds = []
        if runtime.moving:
            # No loss: the placement it had is given back (the header said "placement 3
            # of 2" after a drain move, and the API's attempt counted moves: tester h68).
            runtime.moves += 1
            job.attempt -= 1
        counted = job.attempt
        if not runtime.moving and counted >= spec.max_attempts:
            self._book.finish(
                act,
                JobStatus.FAILED,
                Reason.DOMAIN_LOST,
                f"{why}; gave up after {plural(counted, 'placement')} "
                f"(retry.max_attempts = {spec.max_attempts})",
            )
            return
        job.domains, job.gpus = [], []
        if runtime.moving:
            message = f"{MOVING_OFF}{why}"
        else:
            message = f"placing again after {why} (placement {counted + 1} of {spec.max_attempts})"
        self._book.transition(act, JobStatus.QUEUED, message=message)
        self._queue.requeued(act)

    def job_ended(self, act: ActiveJob) -> None:
        """End listener: cancel the service's timers and port probes."""
        runtime = self._runtimes.pop(act.job.id, None)
        if runtime is not None:
            runtime.close()
        timer = self._timeouts.pop(act.job.id, None)
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        """Engine stop: back-off timers and port probes are re-armed by the next engine from
        the stored replica states; the processes themselves keep running."""
        for runtime in self._runtimes.values():
            runtime.close()
        for timer in self._timeouts.values():
            timer.cancel()
        self._timeouts.clear()

    # -- restart recovery ---------------------------------------------------------------------

    def reattach(self, act: ActiveJob) -> None:
        """Take back a running service after an engine restart.

        Live replicas are watched again (pid + start time); replicas that ended while no
        engine ran go through the restart policy with the exit status their wrapper
        recorded; back-off timers are armed for what is left of their delay.
        """
        job = act.job
        domains = self._scheduler.domains
        summary = job.message == service_summary(job)
        if retake_holds(act, domains, self._scheduler.retired):
            if summary:  # ("1/1 up on OLD" ever after)
                job.message = service_summary(job)
            self._book.save(act)  # (its domains' new names)
        runtime = self._runtimes.setdefault(job.id, ServiceRuntime())
        if not job.replicas:
            # A row from before replicas were recorded: place the service afresh.
            release_holds(act)
            act.holds = []
            job.domains, job.gpus = [], []
            self._book.transition(
                act, JobStatus.QUEUED, message="placing again: its replicas were not recorded"
            )
            self._queue.requeued(act)
            return
        now = self.clock.now()
        interrupted_stop = False
        ended: list[tuple[float, int, Replica, Exit, Callable[[], None] | None]] = []
        for replica in job.replicas:
            if replica.state.has_process:
                # (one a scale-down removed stops on alone: no stop of the service)
                # (nor one a rolling restart stopped: it starts again)
                interrupted_stop |= (
                    replica.state is R.STOPPING
                    and not _removed(act, replica)
                    and replica.roll is not Roll.STOPPING
                )
                found = self._find_replica(act, runtime, replica)
                if job.id not in self._book:
                    return
                if found is not None:
                    exit, forget = found
                    ended.append((exit.at or now, replica.index, replica, exit, forget))
        # Replicas that ended while no engine ran, in the order they ended: the first to
        # decide the service's end decides it (taken by index, a replica's exit 0 after
        # another's failure ended it `completed`, the failure said "stopped").
        runtime.ended_unseen = {e[1] for e in ended}
        for _, index, replica, exit, forget in sorted(ended, key=lambda e: (e[0], e[1])):
            runtime.ended_unseen.discard(index)
            if forget is not None:
                self._book.after_commit(forget)
            if replica.state.has_process:
                self._replica_ended(act, runtime, replica, exit)
            if job.id not in self._book:
                return
        if runtime.end is not None or runtime.replacing is not None:
            return  # (a replica's exit ended it, or moves it: the others are being stopped)
        for replica in job.replicas:
            if replica.state is R.BACKOFF and replica.index not in runtime.restart_timers:
                delay = max(0.0, (replica.next_restart_at or now) - now)
                runtime.restart_timers[replica.index] = self.clock.call_later(
                    delay, functools.partial(self._restart_replica, job.id, replica.index)
                )
            elif replica.state is R.PENDING and not self._decide_launch(act, replica, "start"):
                return
        if not interrupted_stop:
            self._roll_on(act)  # (a rolling restart goes on where it was)
        spec = act.spec
        if spec and spec.timeout is not None and job.started_at and job.id in self._book:
            # Its limit counts from its first start, across engine restarts (what is left
            # of it; at once if it passed while no engine ran).
            self._arm_timeout(job.id, spec.timeout - (time.time() - job.started_at))
        if interrupted_stop and runtime.end is None and act.job.id in self._book:
            # The engine stopped while the service was stopping: finish what was decided.
            if job.stop_reason is Reason.DOMAIN_LOST and runtime.replacing is None:
                why = job.stop_message or "a domain of it was lost"
                runtime.moving = why.startswith(MOVING_OFF)
                runtime.replacing = why.removeprefix(MOVING_OFF)
                self._settle(act)
                return
            reason = job.stop_reason or Reason.CANCELLED
            code = job.exit_code
            if reason is Reason.CANCELLED:
                status = JobStatus.CANCELLED
            elif reason is Reason.EXIT_CODE and code == 0:
                status = JobStatus.COMPLETED  # (a replica's exit 0 ended it, as decided)
            else:
                status = JobStatus.FAILED
            message = job.stop_message or "stopped: the engine restarted while it was stopping"
            job.stop_reason = None  # (_end decides it again)
            self._end(act, status, reason, message, code)

    def _find_replica(
        self, act: ActiveJob, runtime: ServiceRuntime, replica: Replica
    ) -> tuple[Exit, Callable[[], None] | None] | None:
        """Watch a replica again, or start it if its start was decided but never happened.
        One that ended while no engine ran: its recorded exit, and what tells the
        executor to forget it once its end is committed (the caller ends the replicas in
        the order they ended)."""
        job_id, index, run = act.job.id, replica.index, replica.launches
        key = (job_id, index)
        found = self._executor.find(
            key,
            functools.partial(self._replica_started, job_id, index, run),
            functools.partial(self._replica_exited, job_id, index, run),
            run,
        )
        if isinstance(found, Started):
            replica.pid, replica.start_ticks = found.pid, found.start_ticks
            self._book.roots.add(found.pid, job_id, found.start_ticks)
            if replica.state in _WATCHED and replica.port is not None:
                self._watch_port(act, replica)
            elif replica.state is R.STOPPING:
                grace = max(0.0, (act.job.kill_at or time.time()) - time.time())
                self._executor.terminate(key, grace, run)
        elif isinstance(found, Exit):
            return found, functools.partial(self._executor.done, key, run)
        elif replica.pid is not None:
            legacy = self._find_legacy(act, runtime, replica)
            return None if legacy is None else (legacy, None)
        else:
            self._spawn(job_id, index, run, "start")  # decided, durable, never started
        return None

    def _find_legacy(
        self, act: ActiveJob, runtime: ServiceRuntime, replica: Replica
    ) -> Exit | None:
        """A replica an older version started under its per-job ``sh`` wrapper."""
        key = (act.job.id, replica.index)
        assert replica.pid is not None

        def exited(exit: Exit) -> None:
            if act.job.id in self._book:
                self._replica_ended(act, runtime, replica, exit)

        if self._legacy.attach(key, replica.pid, replica.start_ticks, exited):
            self._book.roots.add(replica.pid, act.job.id, replica.start_ticks)
            if replica.state in _WATCHED and replica.port is not None:
                self._watch_port(act, replica)
            return None
        return self._legacy.recorded_end(key)


def service_summary(job: Job) -> str:
    """A running service's message: how many replicas are up, where, their endpoints,
    and what the others are doing."""
    target = _target_count(job)
    leaving = [r.index for r in job.replicas if r.index >= target]
    replicas = [r for r in job.replicas if r.index < target]
    up = sum(r.state is R.UP for r in replicas)
    # Where the kept replicas are: a scale-down's leaving replica was said among them,
    # "1/1 up on gpu0, gpu1" (tester h172); its own domains are said with it below.
    where = list(dict.fromkeys(d for r in replicas for d in r.domains)) or job.domains
    text = f"{up}/{len(replicas)} up on {', '.join(where)}"
    endpoints = [r.endpoint for r in replicas if r.state is R.UP and r.endpoint]
    if endpoints:
        # (a few, then a count: a 25-replica service's line ran to 1.5 KB; every
        # replica's state and endpoint is in its ``replicas``)
        text += f" at {', '.join(endpoints[:REPLICAS_SAID])}"
        if len(endpoints) > REPLICAS_SAID:
            text += f" and {len(endpoints) - REPLICAS_SAID} more"
    said = 0
    unsaid: dict[str, int] = {}
    for r in replicas:
        if r.state not in (R.STARTING, R.DOWN, R.BACKOFF):
            continue
        if said == REPLICAS_SAID:
            what = "in back-off" if r.state is R.BACKOFF else r.state.value
            unsaid[what] = unsaid.get(what, 0) + 1
            continue
        said += 1
        if r.state is R.STARTING:
            text += f"; replica {r.index} starting ({starting_why(r.port, r.message)})"
        elif r.state is R.DOWN:
            text += f"; replica {r.index} down ({r.message})"
        else:
            text += f"; replica {r.index} in back-off: {r.message}"
    if unsaid:
        counts = ", ".join(f"{n} {what}" for what, n in unsaid.items())
        text += f"; {sum(unsaid.values())} more not up ({counts})"
    if leaving:
        away = [
            d
            for d in dict.fromkeys(d for r in job.replicas if r.index >= target for d in r.domains)
            if d not in where
        ]
        on = f" on {', '.join(away)}" if away else ""
        text += f"; {replicas_said(leaving)} stopping{on} (scaled to {target})"
    return text


def _target_count(job: Job) -> int:
    """The replicas the service has (its spec's count; past it, ones a scale-down is
    removing), or all it records where the stored spec does not say."""
    count = job.spec.get("replicas") if isinstance(job.spec, dict) else None
    if count is None and isinstance(job.spec, dict) and job.spec:
        count = 1
    return count if isinstance(count, int) and count >= 1 else len(job.replicas)


def _serves(replica: Replica) -> bool:
    """Whether the replica is up with its process running (and its port answering)."""
    return (
        replica.state is R.UP
        and replica.pid is not None
        and (replica.port is None or replica.endpoint is not None)
    )


def _removed(act: ActiveJob, replica: Replica) -> bool:
    """Whether a scale-down removed ``replica`` (its index is past the service's count)."""
    return act.spec is not None and replica.index >= act.spec.replica_count


ROLL_SETTLE_S = 5.0
"""How long a restarted replica with no port runs before a rolling restart goes on."""

FOREGROUND = "a service's command must keep running (in the foreground, not with &)"
"""Said of a replica that exited cleanly before its port answered."""


async def _answers(host: str, port: int) -> bool:
    """Whether ``host:port`` accepts a TCP connection within the probe timeout. A wildcard
    host (every address) is tried at the loopback address of each family: a connect to
    ``::`` reaches ``::1`` alone, and a server on ``0.0.0.0`` under ``host = "::"`` never
    came up (nor one on ``::1`` under ``0.0.0.0``: tester h170)."""
    targets = ("127.0.0.1", "::1") if host in WILDCARD_HOSTS else (host,)
    for target in targets:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                _, writer = await asyncio.open_connection(target, port)
        except (OSError, TimeoutError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


def _foreign_listener(port: int, pid: int, ticks: int | None) -> int | None:
    """The pid listening on ``port`` if it is not the replica ``pid``'s (in its session,
    or below it: a server it started in a session of its own, as ``setsid`` or a
    container runtime does, was taken for another program's, and the replica never
    came up); ``None`` when it is the replica's or nobody listens (blocking: /proc)."""
    owner = procs.listener_of(port)
    if owner is None or procs.in_session(owner, pid):
        return None
    return None if procs.find_owner(owner, {pid: (0, ticks)}) == 0 else owner


def _remember_removed(job: Job, replicas: Iterable[Replica]) -> None:
    """Keep what replicas leaving by a scale-down had, with the job (stored with its
    replicas): their runs, restarts and back-off step (see ``Job.removed_replicas``)."""
    for replica in replicas:
        job.removed_replicas[replica.index] = (
            replica.launches,
            replica.restarts,
            replica.backoff_step,
        )
