"""Batch jobs: launch a placed command, stop it, time it out, and end it when it exits.

The runner never decides *whether* a job runs (the queue does) nor *how* a process is
started (the executor does): it turns a placement into a launch with the job's
environment, and an exit into the job's end (``exit_verdict``). A job that ends while its
process is watched is also announced to the *process-end listeners* (domain health reads
its log for device errors).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .commandline import SHELL_BUILTIN_PROGRAMS, literal_program, plain_argv, shell_argv
from .executor import Executor, Exit, LaunchError, PreparedStart, Started, TaskKey
from .jobbook import ActiveJob, JobBook, release_holds, retake_holds, take_holds
from .launcher import why_not_runnable
from .models import DomainState, EventKind, Job, JobKind, JobStatus, TerminationReason
from .unkillable import StuckReleaser

if TYPE_CHECKING:
    from .config import EngineSettings
    from .disk import DiskSpace
    from .domain import Domain
    from .scheduler import Scheduler
    from .spec import JobSpec
    from .supervisor import Supervisor

Reason = TerminationReason
ProcessEndListener = Callable[[Job, list["Domain"]], None]


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for numbers that name none."""
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
            # (Its launcher's keeper, its parent, was gone: both launcher processes killed.
            # It said only "not recorded", leaving the user to guess why.)
            # (and a job that ended while none ran was dated when the next found it gone,
            # its runtime seconds too long, without a word: tester h101)
            "the process ended with no launcher process left to see its exit (init reaped "
            "it): exit status unknown, and its end is when a launcher saw it gone (it may "
            "have ended before); see launcher.log",
        )
    if 128 < code <= 128 + 64:
        name = signal_name(code - 128)
        return JobStatus.FAILED, Reason.SIGNAL, f"killed by {name} (exit code {code})"
    return JobStatus.FAILED, Reason.EXIT_CODE, f"exited with code {code}"


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def login_basics(uid: int | None = None) -> dict[str, str]:
    """What a login of ``uid`` (default: this process's user, whom jobs run as) starts
    with, as cron and systemd give: ``PATH``, and ``HOME``, ``USER``, ``LOGNAME``,
    ``SHELL`` where the user is known (blocking: the user database)."""
    import pwd

    basics = {"PATH": DEFAULT_PATH}
    try:
        user = pwd.getpwuid(os.geteuid() if uid is None else uid)
    except KeyError:
        return basics
    basics.update(
        HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name, SHELL=user.pw_shell or "/bin/sh"
    )
    return basics


OUTPUT_DEFAULTS = {"PYTHONUNBUFFERED": "1"}
"""Set in every job unless its spec sets it: a job's output is a file, so Python buffered
its prints in 8 KiB blocks: ``logs -f`` showed nothing for minutes, and a cancel or a
timeout (SIGTERM ends Python without flushing) lost the last block of output (tester h69).
``PYTHONUNBUFFERED=`` (empty) in the spec's environment buffers again."""

IDENTITY = ("HOME", "USER", "LOGNAME")
"""Who a job runs as: another user's job gets the account's own (see JobEnv.shared)."""
PER_LOGIN = ("XDG_RUNTIME_DIR", "MAIL")
"""A submitter's per-login places, left out of a job that runs as another account."""


class JobEnv:
    """Job environments: a login's basics (:func:`login_basics`), the spec's environment
    on top (the CLI and the TUI send the submitting shell's whole environment), then what
    gpulayer-tui sets. Never the engine's own environment: its ``PYTHONPATH``, its
    virtualenv and whatever its service unit set reached every job, even one submitted
    with ``--no-inherit-env``.

    The first two are shared by every job whose spec sets the same variables (one dict,
    kept here), so the executor can send each such environment once; only the per-job
    part changes from job to job.

    Args:
        base: What every job starts from (:func:`login_basics`).
    """

    def __init__(self, base: dict[str, str]) -> None:
        self._base = base
        self._shared: dict[tuple[bool, tuple[tuple[str, str], ...]], dict[str, str]] = {}

    def shared(self, spec: JobSpec, owner_uid: int | None = None) -> dict[str, str]:
        """The basics with the spec's environment on top (the same dict for equal specs;
        never to be changed). For a job of another user than the one jobs run as (a
        shared engine), who it runs as is the basics' (``HOME``, ``USER``, ``LOGNAME``)
        whatever the submitter's shell said, and the submitter's per-login folders
        (``XDG_RUNTIME_DIR``, ``MAIL``) are left out: root's job took the submitter's
        home for its own, and wrote its caches there as root (tester h65)."""
        other = owner_uid is not None and owner_uid != os.geteuid()
        key = (other, tuple(sorted(spec.env.items())))
        env = self._shared.get(key)
        if env is None:
            if len(self._shared) >= 256:
                self._shared.pop(next(iter(self._shared)))
            env = {**self._base, **OUTPUT_DEFAULTS, **spec.env}
            if other:
                for name in IDENTITY:
                    if name in self._base:
                        env[name] = self._base[name]
                    else:
                        env.pop(name, None)
                for name in PER_LOGIN:
                    env.pop(name, None)
            self._shared[key] = env
        return env

    @staticmethod
    def own(job_id: int, gpus: list[int], cwd: str | None = None) -> dict[str, str]:
        """What gpulayer-tui sets for one job (``cwd``: where it runs, as ``PWD``)."""
        own = {
            "GPULAYER_JOB_ID": str(job_id),
            # PCI bus order makes CUDA's numbering match NVML's (and ours). CPU jobs see no
            # GPU, so they cannot take GPU memory behind the scheduler's back.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
        }
        if cwd is not None:
            # The folder it runs in: the submitting shell's PWD came with its environment,
            # and a program that reads $PWD found that, not its --cwd (a shell line's `sh`
            # set it right: tester h126).
            own["PWD"] = cwd
        return own


def argv_of(spec: JobSpec) -> tuple[list[str], str]:
    """The argv and working directory. A ``shell`` spec runs as ``sh -c LINE``, or as its
    words when the line is a plain command (see :mod:`.commandline`)."""
    if spec.command is not None:
        argv = spec.command
    else:
        line = spec.shell or ""
        argv = plain_argv(line) or shell_argv(line)
    return argv, spec.run_dir


LATE_START_S = 1.0
"""A start heard this long after its decision moves the job's ``started_at`` to it (a
launcher that could not start jobs meanwhile); a usual start is milliseconds, and keeps
the decision's time (no second write per job)."""


def prepare_task(
    executor: Executor,
    key: TaskKey,
    spec: JobSpec,
    env: dict[str, str],
    own_env: dict[str, str],
    on_start: Callable[[Started], None],
    on_exit: Callable[[Exit], None],
    run: int = 0,
    timeout: tuple[float, float] | None = None,
) -> PreparedStart:
    """Have ``executor`` prepare ``spec``'s command as ``key`` (sent once durable);
    ``timeout`` (seconds, grace) is kept by the executor while no engine runs.

    A plain shell line whose program cannot be run fails as an argv command does
    (``launch_failed``, "command not found: ..."): it went through ``sh -c`` and failed
    with exit 127, its reason in its log alone (tester h147). One that names a builtin of
    the shell (``kill``, ``echo``) with no program of that name here still runs, through
    the shell.

    Raises:
        LaunchError: The command cannot be started (its cwd, its program).
    """
    argv, cwd = argv_of(spec)
    program = literal_program(spec.shell) if spec.shell is not None else None
    if program is not None and argv[:2] == ["sh", "-c"]:
        # (a line the shell must expand, naming its program as written: a missing one
        # exited 127, and a service restarted it for ever: tester h152's vllm example)
        found, why = why_not_runnable(program, cwd, {**env, **own_env})
        if found is None:
            raise LaunchError(why)
    try:
        return executor.prepare(
            key, argv, cwd, env, own_env, on_start, on_exit, run, timeout=timeout
        )
    except LaunchError:
        if spec.shell is None or argv[:2] == ["sh", "-c"] or argv[0] not in SHELL_BUILTIN_PROGRAMS:
            raise
        # (as written, no `exec` before it: `exec echo` looks for a program, and there is
        # none; the builtin runs in the shell)
        return executor.prepare(
            key,
            ["sh", "-c", spec.shell],
            cwd,
            env,
            own_env,
            on_start,
            on_exit,
            run,
            timeout=timeout,
        )


def timeout_message(job: Job, timeout: float) -> str:
    """Why a job is stopped for its timeout; how long it really ran when its time ran out
    while no engine ran (the next one stops it late: "after 5 s" hid a 14 s run)."""
    message = f"timed out after {timeout:g} s"
    ran = time.time() - (job.started_at or time.time())
    if ran > timeout + 2:
        # (whole seconds down, as the jobs table's RUNTIME counts them)
        message += f" (stopped at {int(ran)} s: no engine ran to stop it sooner)"
    return message


LAUNCHER_STOPPED = "its launcher stopped it: no engine was running"


def late_timeout_message(
    job: Job,
    timeout: float,
    ended_at: float | None,
    grace: float,
    code: int | None = None,
    term_at: float | None = None,
) -> str:
    """A timeout its launcher enforced: on time (SIGTERM at the timeout, SIGKILL ``grace``
    seconds later, which ``code`` says), or (a launcher that came up late, after a double
    fault) how long it really ran. ``term_at``: when its launcher sent the SIGTERM, where
    known: a program that shut down in its grace period ended well past its timeout, and
    was said stopped late (tester h188 #4)."""
    started = job.started_at or time.time()
    ran = (ended_at or time.time()) - started
    killed = code == 128 + signal.SIGKILL
    if term_at is not None and job.started_at is not None:
        stopped_at = term_at - started  # (what it ran after it was its own shutdown)
    else:
        # (not known: a SIGKILL within the grace period after its timeout was on time)
        killed = killed and ran <= timeout + grace + 2
        stopped_at = timeout if killed else ran
    if stopped_at > timeout + 2:
        return (
            f"timed out after {timeout:g} s (stopped at {int(stopped_at)} s: no engine or "
            "launcher ran to stop it sooner)"
        )
    if killed and ran > timeout + 2:  # (it outlived its SIGTERM: not a late stop)
        return (
            f"timed out after {timeout:g} s ({LAUNCHER_STOPPED}; it outlived SIGTERM and "
            f"was killed {grace:g} s later)"
        )
    return f"timed out after {timeout:g} s ({LAUNCHER_STOPPED})"


"""Said of a timeout the launcher enforced itself (see :meth:`.Executor.prepare`)."""


def assign(act: ActiveJob, domains: list[Domain]) -> None:
    """Hold ``domains`` for ``act`` and record them on the job (names and GPU indices)."""
    take_holds(act, domains)
    act.job.domains = [d.name for d in domains]
    act.job.gpus = [d.gpu_index for d in domains if d.gpu_index is not None]


def decide_stop(
    book: JobBook, act: ActiveJob, reason: TerminationReason, message: str, grace: float
) -> bool:
    """Record the decision to stop a running job: why, and when SIGKILL follows.

    It is stored with the job (so a restarted engine still kills on time and still ends the
    job ``cancelled``, whatever its exit code); the caller signals only once it is durable.
    The first reason stands (a cancel during a timeout's grace changes nothing), but a
    cancel or a timeout during a preemption's stop wins: the job ends, it is not requeued
    (the cancel was lost: the job went back to the queue and ran again).

    Returns:
        False if the job was already being stopped (for a reason that stands).
    """
    job = act.job
    if job.stop_reason is not None:
        if job.stop_reason is not Reason.PREEMPTED or reason not in (
            Reason.CANCELLED,
            Reason.TIMEOUT,
        ):
            return False
    job.stop_reason, job.stop_message = reason, message
    job.kill_at = time.time() + grace
    sent = f"stopping ({message}): SIGTERM sent, SIGKILL after {grace:g} s"
    if book.write_failure is None:
        book.note(act, sent)
        return True
    # Signalled only once the decision is stored: "SIGTERM sent, SIGKILL due" was said
    # for as long as the disk was full, of a job no signal had reached (tester h187).
    book.note(
        act,
        f"stopping ({message}): SIGTERM once this is stored (the database cannot be "
        f"written now), SIGKILL {grace:g} s later",
    )

    def stored() -> None:
        if book.get(job.id) is act and job.stop_reason is reason:
            job.kill_at = time.time() + grace  # (counted from the SIGTERM, as it is sent)
            book.note(act, sent)

    book.after_commit(stored)
    return True


def stop_verdict(job: Job, exit: Exit) -> tuple[JobStatus, TerminationReason, str]:
    """How a job whose process ended ends: a decided stop wins over the exit code."""
    if job.stop_reason is Reason.CANCELLED:
        message = job.stop_message
        if exit.code == 128 + signal.SIGKILL:
            # (it said only "cancelled by user" of a job that held on through its grace)
            message += "; SIGTERM did not end it: SIGKILL did, after the grace period"
        elif exit.code is None and exit.error is None:
            # (its keeper and spawner both killed: said as for a job that was not
            # cancelled, not as a plain cancel that was seen to end; tester h53)
            message += "; how it ended was not seen: no launcher process was left to see it"
        return JobStatus.CANCELLED, Reason.CANCELLED, message
    if job.stop_reason is Reason.PREEMPTED and exit.error is None:
        return JobStatus.FAILED, Reason.PREEMPTED, f"{job.stop_message} (not requeued)"
    if job.stop_reason is Reason.TIMEOUT:
        # (a timeout shorter than the start itself ends it before it runs: still a timeout)
        said = job.stop_message + (f" ({exit.error})" if exit.error is not None else "")
        if exit.code == 128 + signal.SIGKILL and "outlived SIGTERM" not in said:
            # (as a cancel says it: "timed out after 2 s" alone, exit 137: tester h126)
            said += "; SIGTERM did not end it: SIGKILL did, after the grace period"
        return JobStatus.FAILED, Reason.TIMEOUT, said
    if exit.error is not None:
        return JobStatus.FAILED, Reason.LAUNCH_FAILED, exit.error
    return exit_verdict(exit.code)


class BatchRunner:
    """Runs ``command`` jobs.

    Every step is decided, committed, then done: a placed job is marked ``running`` and
    started once that is durable; a stop is recorded, then signalled. After a restart each
    running job is found again through the executor (or, for a job started by an older
    version's shell wrapper, through ``legacy``).

    Args:
        book: The active jobs.
        scheduler: The domains (a found-again job takes its holds back).
        executor: Starts and watches the processes (the launcher).
        legacy: Watches processes started by an earlier version's per-job wrapper.
        settings: ``[engine]`` (grace period).
        env: Builds each job's environment.
        disk: The state dir's free space (a failed job's end names a full disk).
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        executor: Executor,
        legacy: Supervisor,
        settings: EngineSettings,
        env: JobEnv,
        disk: DiskSpace | None = None,
    ) -> None:
        self._book = book
        self._disk = disk
        self._scheduler = scheduler
        self._executor = executor
        self._legacy = legacy
        self._settings = settings
        self._env = env
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._checkpoints: dict[int, asyncio.TimerHandle] = {}
        # job -> when the checkpoint lead of its called-off preemption was to end: a new
        # preemption before then sends no second checkpoint signal (the job may still be
        # saving) and keeps that SIGTERM time (a fresh lead each call-off put it off)
        self._lead_due: dict[int, float] = {}
        self._process_end: list[ProcessEndListener] = []
        self._requeued: list[Callable[[ActiveJob], None]] = []
        self._run_ended: list[Callable[[ActiveJob], None]] = []
        self._stuck = StuckReleaser(book, lambda: self._settings.release_after, self._let_go)
        self._since = time.time()  # (an end before this was learnt after a restart)
        self.log_total: Callable[[ActiveJob, int], None] | None = None
        """Told what all cuts of a job's log dropped, as its launcher saw it end (the
        engine's own count misses the cuts made while none ran)."""

    def reconfigure(self, settings: EngineSettings) -> None:
        """Use new ``[engine]`` settings from now on."""
        self._settings = settings

    def on_process_end(self, listener: ProcessEndListener) -> None:
        """Call ``listener(job, domains)`` when a watched job's process ended it."""
        self._process_end.append(listener)

    def on_run_end(self, listener: Callable[[ActiveJob], None]) -> None:
        """Call ``listener(act)`` when a preempted job's run ended and it goes back to the
        queue, before the run is reset (its holds and ``started_at`` still its)."""
        self._run_ended.append(listener)

    def on_requeue(self, listener: Callable[[ActiveJob], None]) -> None:
        """Call ``listener(act)`` when a preempted job is back in ``queued``."""
        self._requeued.append(listener)

    # -- start --------------------------------------------------------------------------------

    def start(self, act: ActiveJob, domains: list[Domain]) -> None:
        """The job was placed on ``domains``: hold them, mark it running, start it once that
        is durable (one commit covers every start of a scheduling pass).

        The start request is made now, while the decision commits, and sent by the store's
        writer thread as the commit returns (the loop sends it if that could not).
        """
        job, spec = act.job, act.spec
        assert spec is not None
        assign(act, domains)
        message = f"running on {', '.join(job.domains)}"
        act.held_back = bool(self._executor.problem)
        if act.held_back:
            # (decided now, started once a launcher can: it said "running" with no process)
            message = (
                f"placed on {', '.join(job.domains)}; starts once the launcher can start "
                f"jobs ({self._executor.problem})"
            )
        # (Its timeout is armed as it starts: armed here, a decision whose commit waited
        # on a locked database timed the job out before it ever ran: tester h119.)
        self._book.transition(act, JobStatus.RUNNING, message=message)
        if act.held_back:
            job.started_at = None  # (no runtime counting until it starts: _started_late)
        try:
            prepared: PreparedStart | None = self._prepare(act)
        except LaunchError:
            prepared = None  # (_launch tries again once durable, and fails the job then)
        early = None if prepared is None else functools.partial(self._send_early, job, prepared)
        self._book.after_commit(functools.partial(self._launch, job.id, prepared), early)

    def starts_not_stored(self, failure: str) -> None:
        """Database writes began to fail (``failure``): a start decided in the batch that
        failed is not durable, so it is not made until a retry commits it. The job says
        so, not "running" (it read running, its runtime counting, with no process; its
        runtime then counts from its real start: tester h174)."""
        for act in list(self._book):
            job = act.job
            if (
                job.status is not JobStatus.RUNNING
                or job.kind is not JobKind.COMMAND
                or act.launched
                or act.held_back
                or job.pid is not None
                or job.stop_reason is not None
            ):
                continue
            act.held_back = True
            # (its runtime counted from the decision, with no process: tester h180)
            job.started_at = None
            self._book.note(
                act,
                f"placed on {', '.join(job.domains)}; starts once its start is stored ({failure})",
            )

    def _prepare(self, act: ActiveJob) -> PreparedStart:
        """The job's start request.

        Raises:
            LaunchError: It cannot start (its cwd, its program).
        """
        job = act.job
        spec = act.spec
        assert spec is not None
        return prepare_task(
            self._executor,
            job.id,
            spec,
            self._env.shared(spec, job.owner_uid),
            self._env.own(job.id, job.gpus, spec.run_dir),
            functools.partial(self._started, job.id),
            functools.partial(self._exited, job.id),
            run=job.attempt,
            # (kept by the launcher too: a stopped engine no longer lets it run on)
            timeout=(None if spec.timeout is None else (spec.timeout, self._settings.grace_period)),
        )

    @staticmethod
    def _send_early(job: Job, prepared: PreparedStart) -> None:
        # On the store's writer thread. A stop decided meanwhile (its reason is set on the
        # loop) keeps it unsent: _launch then ends the job without a process. A stop decided
        # just after this check finds it started, and signals it once that stop is durable.
        if job.stop_reason is None:
            prepared.send_now()

    def _launch(self, job_id: int, prepared: PreparedStart | None) -> None:
        if prepared is not None and prepared.sent:
            # Sent as the commit returned: this hands on what the launcher said of it since.
            prepared.send()
            return
        act = self._book.get(job_id)
        if act is None or act.job.status is not JobStatus.RUNNING or act.spec is None:
            if prepared is not None:
                prepared.discard()
            return  # it ended before its start was durable (a refused submission)
        job = act.job
        if job.stop_reason is not None:
            # Stopped before it started: it never runs.
            if prepared is not None:
                prepared.discard()
            if job.stop_reason is Reason.PREEMPTED:
                # (preempted in the pass that placed it: back to the queue as any
                # preempted run, not failed as a launch that failed)
                self._end(act, Exit(None, recorded=False))
                return
            # (no start time: a refused submission's row said "started 00:43:31, runtime
            # 0s" of a job that never ran: tester h78)
            job.started_at = None
            self._end(act, Exit(None, recorded=False, error="stopped before it started"))
            return
        if prepared is not None:
            prepared.send()
            return
        try:
            # (It could not be prepared: this says why, or it can start now after all.)
            self._prepare(act).send()
        except LaunchError as err:
            self._book.finish(act, JobStatus.FAILED, Reason.LAUNCH_FAILED, str(err))

    def _started(self, job_id: int, started: Started) -> None:
        act = self._book.get(job_id)
        if act is None:
            return
        job = act.job
        job.pid, job.start_ticks = started.pid, started.start_ticks
        self._book.roots.add(started.pid, job_id, started.start_ticks)
        act.launched = True
        late = (
            started.at is not None
            and job.started_at is not None
            and started.at - job.started_at > LATE_START_S
        )
        if (late or act.held_back) and job.status is JobStatus.RUNNING:
            self._started_late(act, started.at or time.time())
        elif (
            act.spec is not None
            and act.spec.timeout is not None
            and job.status is JobStatus.RUNNING
            and job.stop_reason is None
            and job.id not in self._timers
        ):
            since = job.started_at if job.started_at is not None else time.time()
            self._arm_timeout(act, act.spec.timeout - (time.time() - since))
        act.held_back = False
        self._book.started(job_id, started.at)

    def _started_late(self, act: ActiveJob, at: float) -> None:
        """A job decided while no launcher could start it started at ``at``: its runtime
        and its timeout count from then (they counted from the decision, and a job held
        back a minute lost a minute of its time limit), and its message says it runs."""
        job = act.job
        job.started_at = at
        timer = self._timers.pop(job.id, None)
        if timer is not None:
            timer.cancel()
        if act.spec is not None and act.spec.timeout is not None and job.stop_reason is None:
            self._arm_timeout(act, act.spec.timeout - (time.time() - at))
        if job.message.startswith("placed on "):
            self._book.note(act, f"running on {', '.join(job.domains)}")
        else:
            self._book.save(act)

    def _arm_timeout(self, act: ActiveJob, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._timers[act.job.id] = loop.call_later(max(0.0, delay), self._timed_out, act.job.id)

    def _timed_out(self, job_id: int) -> None:
        self._timers.pop(job_id, None)
        act = self._book.get(job_id)
        if act is None or act.job.status is not JobStatus.RUNNING or act.spec is None:
            return
        self.stop(act, Reason.TIMEOUT, timeout_message(act.job, act.spec.timeout or 0))

    # -- stop and end -------------------------------------------------------------------------

    def stop(self, act: ActiveJob, reason: TerminationReason, message: str) -> None:
        """Record the stop, then (once durable) SIGTERM the job's process group; SIGKILL
        follows after the grace period (the launcher keeps that deadline)."""
        grace = self._settings.grace_period
        if decide_stop(self._book, act, reason, message, grace):
            # (a preemption's SIGTERM still to come is this stop's now)
            timer = self._checkpoints.pop(act.job.id, None)
            if timer is not None:
                timer.cancel()
            self._book.after_commit(functools.partial(self._signal_stop, act.job.id, grace))

    def call_off_preemption(self, act: ActiveJob, why: str) -> None:
        """The job it was being stopped for no longer needs it (it ended, or started
        elsewhere): a preemption still in its checkpoint lead (its SIGTERM not sent) is
        called off, stored, and the job runs on (it was stopped, and its work lost, for a
        job that had been cancelled)."""
        job = act.job
        timer = self._checkpoints.get(job.id)
        if job.stop_reason is not Reason.PREEMPTED or timer is None:
            return  # (SIGTERM sent already: it goes back to the queue as decided)
        timer.cancel()
        del self._checkpoints[job.id]
        if job.kill_at is not None:
            self._lead_due[job.id] = job.kill_at - self._settings.grace_period
        job.stop_reason, job.stop_message, job.kill_at = None, "", None
        # Its running message again, with a quarantine's warning (a call-off's note took
        # the place of "warning: domain gpu1 quarantined" for good).
        running = f"running on {', '.join(job.domains)}"
        for dom in act.holds:
            if dom.state is DomainState.QUARANTINED:
                running += f"; warning: domain {dom.name} quarantined: {dom.state_reason}"
                break
        self._book.note(act, f"{running} (preemption called off: {why})")
        self._book.record(act, EventKind.PREEMPTION, {"message": f"called off: {why}"})

    def _signal_stop(self, job_id: int, grace: float) -> None:
        act = self._book.get(job_id)
        if act is None:
            return
        if job_id in self._legacy.pids():
            self._legacy.terminate(job_id, grace)
        else:
            # Not started yet: _launch sees the stop and ends it without a process.
            self._executor.terminate(job_id, grace, act.job.attempt)
        self._stuck.arm(act)

    def _let_go(self, act: ActiveJob) -> None:
        """Stop watching a process that outlived SIGKILL (its job ends ``unkillable``)."""
        job = act.job
        if job.id in self._legacy.pids():
            self._legacy.forget(job.id)
        else:
            self._executor.release(job.id, job.attempt)
        self._book.roots.drop(job.pid)

    def preempt(
        self, act: ActiveJob, message: str, checkpoint_signal: str | None, checkpoint: float
    ) -> None:
        """Stop a preemptible job for a better one: ``checkpoint_signal`` first, SIGTERM
        ``checkpoint`` s later, SIGKILL after the grace period. It goes back to the queue
        when it exits (or fails, if it asked not to be requeued). Decided and stored
        first; signalled once durable."""
        job = act.job
        if job.stop_reason is not None or job.status is not JobStatus.RUNNING:
            return
        grace = self._settings.grace_period
        lead = checkpoint if checkpoint_signal else 0.0
        now = time.time()
        due = self._lead_due.pop(job.id, None)
        send = checkpoint_signal
        if lead and due is not None and due > now:
            lead, send = due - now, None  # (its last stop's checkpoint lead still runs)
            said = f"{checkpoint_signal} sent already, SIGTERM in {lead:.0f} s, "
        elif lead:
            said = f"{checkpoint_signal} sent, SIGTERM in {lead:g} s, "
        else:
            said = "SIGTERM sent, "
        job.stop_reason, job.stop_message = Reason.PREEMPTED, message
        job.kill_at = now + lead + grace
        self._book.note(act, f"stopping ({message}): {said}SIGKILL {grace:g} s after that")
        # (in its timeline: a stop called off left no trace once its message was gone)
        self._book.record(act, EventKind.PREEMPTION, {"message": f"stopping: {message}"})
        self._book.after_commit(functools.partial(self._signal_preempt, job.id, send, lead, grace))

    def _signal_preempt(self, job_id: int, sent: str | None, lead: float, grace: float) -> None:
        act = self._book.get(job_id)
        if act is None:
            return
        pid = act.job.pid
        if lead and pid:
            if sent:  # (None: sent for a stop called off, whose lead this one finishes)
                try:
                    os.killpg(pid, getattr(signal, sent))
                except (ProcessLookupError, PermissionError):
                    pass  # (it is gone: its exit follows)
            loop = asyncio.get_running_loop()
            self._checkpoints[job_id] = loop.call_later(
                lead, functools.partial(self._checkpoint_lead_over, job_id, grace)
            )
            return
        self._signal_stop(job_id, grace)

    def _checkpoint_lead_over(self, job_id: int, grace: float) -> None:
        # (out of _checkpoints first: a call-off after the SIGTERM said "it goes on
        # running", and the launcher's SIGKILL then ended it failed)
        self._checkpoints.pop(job_id, None)
        self._signal_stop(job_id, grace)

    def _exited(self, job_id: int, exit: Exit) -> None:
        act = self._book.get(job_id)
        if act is None:
            return
        run = act.job.attempt
        self._end(act, exit)
        self._book.after_commit(functools.partial(self._executor.done, job_id, run))

    def _requeue(self, act: ActiveJob) -> None:
        """A preempted job exited: back to ``queued`` (its next start is a new run)."""
        job = act.job
        self._lead_due.pop(job.id, None)
        for timers in (self._timers, self._checkpoints):
            timer = timers.pop(job.id, None)
            if timer is not None:
                timer.cancel()
        self._stuck.job_ended(act)  # (its stop is over: the next run is not released for it)
        for listener in self._run_ended:  # (its GPU use, booked before the run is reset)
            listener(act)
        release_holds(act)
        by = job.stop_message
        job.attempt += 1
        job.pid = job.start_ticks = job.kill_at = job.started_at = None
        job.stop_reason, job.stop_message = None, ""
        job.domains, job.gpus = [], []
        act.launched = False
        times = "once" if job.attempt == 1 else f"{job.attempt} times"
        self._book.transition(
            act, JobStatus.QUEUED, message=f"{by}; back in the queue (requeued {times})"
        )
        for listener in self._requeued:
            listener(act)

    def _end(self, act: ActiveJob, exit: Exit) -> None:
        self._book.roots.drop(act.job.pid)
        job = act.job
        spec = act.spec
        if job.stop_reason is Reason.PREEMPTED and exit.error is None and spec and spec.requeue:
            self._requeue(act)
            return
        act.job.kill_at = None
        if job.pid is None and exit.pid is not None:
            job.pid = exit.pid  # (it ended while no engine ran: its pid stays in history)
        if exit.log_dropped and self.log_total is not None:
            self.log_total(act, exit.log_dropped)
        if exit.timed_out and job.stop_reason is None and spec is not None and spec.timeout:
            # Its launcher stopped it at its timeout while no engine ran; or late, a new
            # launcher after both launcher processes died (it said "on time" of a 26 s run).
            job.stop_reason = Reason.TIMEOUT
            job.stop_message = late_timeout_message(
                job, spec.timeout, exit.at, self._settings.grace_period, exit.code, exit.term_at
            )
        status, reason, message = stop_verdict(act.job, exit)
        # (Read now: of an end before this engine started, today's disk says nothing.)
        learnt_now = exit.at is None or exit.at >= self._since
        failed = reason in (Reason.EXIT_CODE, Reason.SIGNAL) and status is JobStatus.FAILED
        timeout = spec.timeout if spec is not None else None
        if (
            not learnt_now
            and timeout
            and exit.at is not None
            and job.started_at is not None
            and job.stop_reason is None
            and exit.at - job.started_at > timeout + 2
        ):
            # Its time ran out while no engine ran to stop it: it ended on its own later
            # ("completed", nothing said of the timeout it was submitted with).
            ran = exit.at - job.started_at
            message += (
                f" (after {ran:.0f} s, past its {timeout:g} s timeout: no engine ran to stop it)"
            )
        if learnt_now and reason is not Reason.LAUNCH_FAILED:
            note = self._disk.full_note(failed) if self._disk is not None else None
            if note:
                message = f"{message}; {note}"
        holds = list(act.holds)
        self._book.finish(act, status, reason, message, exit.code, ended_at=exit.at)
        if exit.error is None:
            for listener in self._process_end:
                listener(act.job, holds)

    def job_ended(self, act: ActiveJob) -> None:
        """End listener: drop the job's timeout (and a preemption's pending SIGTERM)."""
        self._lead_due.pop(act.job.id, None)
        for timers in (self._timers, self._checkpoints):
            timer = timers.pop(act.job.id, None)
            if timer is not None:
                timer.cancel()
        self._stuck.job_ended(act)

    # -- restart ------------------------------------------------------------------------------

    def reattach(self, act: ActiveJob) -> None:
        """Take back a job that was running when an earlier engine stopped: watch it again,
        end it from what its launcher recorded, or start it if it never started."""
        job = act.job
        run = job.attempt
        found = self._executor.find(
            job.id,
            functools.partial(self._started, job.id),
            functools.partial(self._exited, job.id),
            run,
        )
        if isinstance(found, Exit):
            self._end(act, found)
            self._book.after_commit(functools.partial(self._executor.done, job.id, run))
            return
        domains = self._scheduler.domains
        if found is None and job.pid is not None:
            self._reattach_legacy(act)
            return
        if retake_holds(act, domains, self._scheduler.retired):
            self._book.save(act)  # (its domains' new names)
        if isinstance(found, Started):
            self._started(job.id, found)
            if found.timed_out and act.spec is not None and act.spec.timeout:
                # Its launcher is stopping it for its timeout (no engine ran when its time
                # ran out): recorded as such, and signalled again below (the launcher's
                # SIGKILL deadline stands).
                message = late_timeout_message(
                    job, act.spec.timeout, None, self._settings.grace_period, None, found.term_at
                )
                decide_stop(self._book, act, Reason.TIMEOUT, message, self._settings.grace_period)
        if (
            act.spec is not None
            and act.spec.timeout is not None
            and job.started_at
            and job.stop_reason is None
        ):
            self._arm_timeout(act, act.spec.timeout - (time.time() - job.started_at))
        lead_left = 0.0
        if job.stop_reason is Reason.PREEMPTED and job.kill_at is not None:
            lead_left = job.kill_at - self._settings.grace_period - time.time()
        if found is None:
            self._launch(job.id, None)  # decided (and durable) but never started: start it once
        elif lead_left > 0:
            # Being preempted, in its checkpoint lead: its SIGTERM comes when the lead ends
            # (sent at once, it cut the job's checkpoint short).
            self._checkpoints[job.id] = asyncio.get_running_loop().call_later(
                lead_left,
                functools.partial(self._signal_stop, job.id, self._settings.grace_period),
            )
        elif job.stop_reason is not None:
            # Stopping when the engine stopped: signal again, keeping the stored deadline.
            grace = max(0.0, (job.kill_at or time.time()) - time.time())
            if job.stop_reason is Reason.PREEMPTED:
                # Its SIGTERM, at the end of the checkpoint lead, is this engine's own
                # timer: the last one may have stopped before sending it. A job that
                # saves on SIGTERM gets its whole grace (killed at once, it lost its save).
                grace = max(grace, self._settings.grace_period)
            self._executor.terminate(job.id, grace, run)
            self._stuck.arm(act)

    def _reattach_legacy(self, act: ActiveJob) -> None:
        """A job an older version started under its per-job ``sh`` wrapper."""
        job = act.job
        assert job.pid is not None
        on_exit = functools.partial(self._exited_legacy, job.id)
        if not self._legacy.attach(job.id, job.pid, job.start_ticks, on_exit):
            ended = self._legacy.recorded_end(job.id)
            if ended.code is None:
                self._book.finish(
                    act,
                    JobStatus.FAILED,
                    Reason.ENGINE_LOST,
                    "the process ended while no engine was watching; exit status unknown",
                )
            else:
                self._end(act, ended)  # (ended when its exit file says, not now)
            return
        self._book.roots.add(job.pid, job.id, job.start_ticks)
        domains = self._scheduler.domains
        if retake_holds(act, domains, self._scheduler.retired):
            self._book.save(act)  # (its domains' new names)
        if act.spec is not None and act.spec.timeout is not None and job.started_at:
            self._arm_timeout(act, act.spec.timeout - (time.time() - job.started_at))

    def _exited_legacy(self, job_id: int, exit: Exit) -> None:
        act = self._book.get(job_id)
        if act is not None:
            self._end(act, exit)

    def close(self) -> None:
        """Engine stop: drop the timers (a restarted engine re-arms them)."""
        for timers in (self._timers, self._checkpoints):
            for timer in timers.values():
                timer.cancel()
            timers.clear()
        self._stuck.close()
