"""The executor interface: how the engine starts, signals, watches and finds again its work.

The runners (batch jobs, service replicas) decide *what* runs and *when*, and commit that
decision first; an executor carries it out and reports each start and end through the
callbacks given with the work. The implementation for this machine is the launcher
(:class:`~gpulayer_tui.engine.launch_client.LauncherExecutor`: one long-lived parent of
every job); a Slurm cluster plugs in behind the same methods. Adopted processes, which
nobody starts, are watched by :class:`~gpulayer_tui.engine.supervisor.Supervisor`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# What a task belongs to: a job id, or (job id, replica index) for a service.
TaskKey = int | tuple[int, int]


def task_name(key: TaskKey) -> str:
    """``7`` for job 7, ``7.1`` for replica 1 of service 7 (file names, log lines)."""
    return f"{key[0]}.{key[1]}" if isinstance(key, tuple) else str(key)


class LaunchError(RuntimeError):
    """The command could not be started; the message says why (for the job's record)."""


@dataclass(frozen=True, slots=True)
class Exit:
    """How a task ended.

    Attributes:
        code: The command's exit status (128+N when killed by signal N); ``None`` when
            nobody could observe it.
        recorded: True when the executor observed ``code`` itself.
        error: Set when the task never ran (it could not be started): the reason.
        at: When it ended, as the executor saw it (``None``: when the engine learns it).
        log_dropped: The output its log's cuts dropped in all (``None``: none, or unknown).
        timed_out: The executor stopped it itself for its timeout (no engine was
            connected to do so).
        term_at: Then, when it sent the SIGTERM (``None``: not known).
    """

    code: int | None
    recorded: bool
    error: str | None = None
    at: float | None = None
    log_dropped: int | None = None
    timed_out: bool = False
    term_at: float | None = None
    pid: int | None = None
    """Its process, when the executor knew it and the runner may not have (it ended while
    no engine ran: the pid is kept in the job's history)."""


@dataclass(frozen=True, slots=True)
class Started:
    """Identity of a started (or found again) task's process: pid plus its start time, so a
    recycled pid is never taken for it."""

    pid: int
    start_ticks: int
    timed_out: bool = False
    """Found again being stopped by the executor for its timeout (no engine was
    connected when its time ran out)."""
    term_at: float | None = None
    """Then, when the executor sent it SIGTERM (``None``: not known)."""
    at: float | None = None
    """When the executor spawned it (``None``: not known, e.g. a start found again). The
    engine may hear of a start after the task ended; its event carries this time."""


OnStart = Callable[[Started], None]
"""Called on the event loop once the task's process runs."""
OnExit = Callable[[Exit], None]
"""Called on the event loop, once, when the task has ended (or could not start)."""


class PreparedStart(Protocol):
    """A start made ready before its decision is durable, sent only after (see
    :meth:`Executor.prepare`)."""

    @property
    def sent(self) -> bool:
        """True once it went out (it runs, or its failure is reported)."""
        ...

    def send_now(self) -> None:
        """From any thread, the moment the decision is committed: send it unless something
        sent earlier must go first (then :meth:`send` sends it). Never raises."""
        ...

    def send(self) -> None:
        """On the loop, once the decision is durable: send it unless it went already.
        Until this is called, what becomes of it (started, exited) is held back, so the
        runner takes in its own decision's commit first."""
        ...

    def discard(self) -> None:
        """On the loop: it will never be sent (its job ended or was stopped first)."""
        ...


class Executor(Protocol):
    """Runs tasks for the engine's runners."""

    @property
    def problem(self) -> str | None:
        """Why it cannot start tasks now (they start once it can), or ``None``."""

    def prepare(
        self,
        key: TaskKey,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        extra_env: dict[str, str],
        on_start: OnStart,
        on_exit: OnExit,
        run: int = 0,
        timeout: tuple[float, float] | None = None,
    ) -> PreparedStart:
        """Make ready the ``run``-th start of task ``key`` (a replica restarts under the
        same key): ``argv`` with ``env`` (shared by many tasks: never changed) and
        ``extra_env`` on top, checked, its request made and its callbacks in place, while
        the decision to start it is being committed. Nothing starts until it is sent, and
        it may be sent only once the decision is durable. ``timeout`` (seconds after the
        start, grace period): the executor stops the task itself when its time runs out
        while no engine is connected (an engine stops it itself, on its own clock).

        Raises:
            LaunchError: It cannot start (checked before anything is started).
        """
        ...

    def find(self, key: TaskKey, on_start: OnStart, on_exit: OnExit, run: int = 0) -> object:
        """After a restart: what became of a task. :class:`Started` (it runs and is watched
        again: ``on_exit`` follows), :class:`Exit` (it ended meanwhile), or ``None`` (it
        never started: starting it now runs it once)."""
        ...

    def terminate(self, key: TaskKey, grace: float, run: int = 0) -> bool:
        """SIGTERM the task now and SIGKILL it after ``grace`` s; False if nothing runs."""
        ...

    def done(self, key: TaskKey, run: int = 0) -> None:
        """The engine recorded the task's end: the executor may forget it."""
        ...

    def release(self, key: TaskKey, run: int = 0) -> None:
        """Stop watching a task that outlived SIGKILL (see :mod:`.unkillable`); it is not
        signalled again, and its end, if it comes, reports to no one."""
        ...

    def log_path(self, key: TaskKey) -> Path:
        """Where the task's output goes."""
        ...

    def pids(self) -> dict[TaskKey, int]:
        """The process of every task running now."""
        ...
