"""Batch jobs: launch a placed command, stop it, time it out, and end it when it exits.

The runner never decides *whether* a job runs (the queue does) nor *how* a process is
started (the executor does): it turns a placement into a launch with the job's
environment, and an exit into the job's end (``exit_verdict``). A job that ends while its
process is watched is also announced to the *process-end listeners* (domain health reads
its log for device errors).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .executor import Executor, Exit, LaunchError
from .jobbook import ActiveJob, JobBook, take_holds
from .models import Job, JobStatus, TerminationReason

if TYPE_CHECKING:
    from .config import EngineSettings
    from .domain import Domain
    from .scheduler import Scheduler
    from .spec import JobSpec

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
            "the process ended but its exit status was not recorded",
        )
    if 128 < code <= 128 + 64:
        name = signal_name(code - 128)
        return JobStatus.FAILED, Reason.SIGNAL, f"killed by {name} (exit code {code})"
    return JobStatus.FAILED, Reason.EXIT_CODE, f"exited with code {code}"


def job_env(base: dict[str, str], spec: JobSpec, job_id: int, gpus: list[int]) -> dict[str, str]:
    """A job's environment: the engine's, the spec's, and what gpulayer-tui sets."""
    env = dict(base)
    env.update(spec.env)
    env["GPULAYER_JOB_ID"] = str(job_id)
    # PCI bus order makes CUDA's numbering match NVML's (and ours). CPU jobs see no GPU, so
    # they cannot take GPU memory behind the scheduler's back.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return env


def argv_of(spec: JobSpec) -> tuple[list[str], str]:
    """The argv (a ``shell`` spec runs as ``sh -c LINE``) and working directory."""
    argv = spec.command if spec.command is not None else ["sh", "-c", spec.shell or ""]
    return argv, spec.cwd or os.path.expanduser("~")


def terminate(
    book: JobBook,
    executor: Executor,
    act: ActiveJob,
    reason: TerminationReason,
    message: str,
    grace: float,
) -> None:
    """Ask a running job's process to stop: SIGTERM now, SIGKILL after ``grace`` seconds.

    The first reason stands (a cancel during a timeout's grace changes nothing); the job's
    message counts down to the SIGKILL. The job ends when the process does.
    """
    if act.stop_reason is not None:
        return
    act.stop_reason, act.stop_message = reason, message
    if not executor.terminate(act.job.id, grace):
        return
    act.job.kill_at = time.time() + grace
    book.note(act, f"stopping ({message}): SIGTERM sent, SIGKILL after {grace:g} s")


def assign(act: ActiveJob, domains: list[Domain]) -> None:
    """Hold ``domains`` for ``act`` and record them on the job (names and GPU indices)."""
    take_holds(act, domains)
    act.job.domains = [d.name for d in domains]
    act.job.gpus = [d.gpu_index for d in domains if d.gpu_index is not None]


class BatchRunner:
    """Runs ``command`` jobs.

    Args:
        book: The active jobs.
        scheduler: The domains (a re-attached job takes its holds back).
        executor: Starts and watches the processes.
        settings: ``[engine]`` (grace period).
        base_env: The environment every job starts from.
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        executor: Executor,
        settings: EngineSettings,
        base_env: dict[str, str],
    ) -> None:
        self._book = book
        self._scheduler = scheduler
        self._executor = executor
        self._settings = settings
        self._base_env = base_env
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._process_end: list[ProcessEndListener] = []

    def reconfigure(self, settings: EngineSettings) -> None:
        """Use new ``[engine]`` settings from now on."""
        self._settings = settings

    def on_process_end(self, listener: ProcessEndListener) -> None:
        """Call ``listener(job, domains)`` when a watched job's process ended it."""
        self._process_end.append(listener)

    # -- start --------------------------------------------------------------------------------

    def start(self, act: ActiveJob, domains: list[Domain]) -> None:
        """The job was placed on ``domains``: hold them and launch it."""
        job, spec = act.job, act.spec
        assert spec is not None
        assign(act, domains)
        argv, cwd = argv_of(spec)
        env = job_env(self._base_env, spec, job.id, job.gpus)
        try:
            started = self._executor.start(job.id, argv, cwd, env, self._exit_handler(job.id))
        except LaunchError as err:
            self._book.finish(act, JobStatus.FAILED, Reason.LAUNCH_FAILED, str(err))
            return
        job.pid, job.start_ticks = started.pid, started.start_ticks
        self._book.roots.add(started.pid, job.id, started.start_ticks)
        where = ", ".join(job.domains)
        self._book.transition(act, JobStatus.RUNNING, message=f"running on {where}")
        if spec.timeout is not None:
            self._arm_timeout(act, spec.timeout)

    def _exit_handler(self, job_id: int) -> Callable[[Exit], None]:
        return lambda exit: self._exited(job_id, exit)

    def _arm_timeout(self, act: ActiveJob, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._timers[act.job.id] = loop.call_later(max(0.0, delay), self._timed_out, act.job.id)

    def _timed_out(self, job_id: int) -> None:
        self._timers.pop(job_id, None)
        act = self._book.get(job_id)
        if act is None or act.job.status is not JobStatus.RUNNING or act.spec is None:
            return
        timeout = act.spec.timeout or 0
        self.stop(act, Reason.TIMEOUT, f"timed out after {timeout:g} s")

    # -- stop and end -------------------------------------------------------------------------

    def stop(self, act: ActiveJob, reason: TerminationReason, message: str) -> None:
        """SIGTERM the job's process group, SIGKILL after the grace period."""
        terminate(self._book, self._executor, act, reason, message, self._settings.grace_period)

    def _exited(self, job_id: int, exit: Exit) -> None:
        act = self._book.get(job_id)
        if act is None:
            return
        self._book.roots.drop(act.job.pid)
        act.job.kill_at = None
        if act.stop_reason is Reason.CANCELLED:
            status, reason, message = JobStatus.CANCELLED, Reason.CANCELLED, act.stop_message
        elif act.stop_reason is Reason.TIMEOUT:
            status, reason, message = JobStatus.FAILED, Reason.TIMEOUT, act.stop_message
        else:
            status, reason, message = exit_verdict(exit.code)
        holds = list(act.holds)
        self._book.finish(act, status, reason, message, exit.code)
        for listener in self._process_end:
            listener(act.job, holds)

    def job_ended(self, act: ActiveJob) -> None:
        """End listener: drop the job's timeout."""
        timer = self._timers.pop(act.job.id, None)
        if timer is not None:
            timer.cancel()

    # -- restart ------------------------------------------------------------------------------

    def reattach(self, act: ActiveJob) -> None:
        """Watch a job an earlier engine started; end it from its exit record if it is gone."""
        job = act.job
        alive = job.pid is not None and self._executor.attach(
            job.id, job.pid, job.start_ticks, self._exit_handler(job.id)
        )
        if not alive:
            code = self._executor.recorded_exit(job.id)
            if code is None:
                self._book.finish(
                    act,
                    JobStatus.FAILED,
                    Reason.ENGINE_LOST,
                    "the process ended while no engine was watching; exit status unknown",
                )
            else:
                self._exited(job.id, Exit(code, recorded=True))
            return
        assert job.pid is not None
        self._book.roots.add(job.pid, job.id, job.start_ticks)
        domains = self._scheduler.domains
        take_holds(act, [domains[name] for name in job.domains if name in domains])
        if act.spec is not None and act.spec.timeout is not None and job.started_at:
            self._arm_timeout(act, act.spec.timeout - (time.time() - job.started_at))

    def close(self) -> None:
        """Engine stop: drop the timers (a restarted engine re-arms them)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
