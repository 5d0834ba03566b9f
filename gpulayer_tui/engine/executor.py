"""The executor interface: how the engine starts, signals, watches and re-attaches work.

The runners (batch jobs, service replicas) decide *what* runs and *when*; an executor
carries it out and reports each exit through the callback given with the work. Today's
implementation is the local one (:class:`~gpulayer_tui.engine.supervisor.Supervisor`:
processes on this machine); a long-lived launcher and a Slurm cluster plug in behind the
same methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# What a watched process belongs to: a job id, or (job id, replica index) for a service.
TaskKey = int | tuple[int, int]


def task_name(key: TaskKey) -> str:
    """``7`` for job 7, ``7.1`` for replica 1 of service 7 (file names, log lines)."""
    return f"{key[0]}.{key[1]}" if isinstance(key, tuple) else str(key)


class LaunchError(RuntimeError):
    """The command could not be started; the message says why (for the job's record)."""


@dataclass(frozen=True, slots=True)
class Exit:
    """How a watched process ended.

    Attributes:
        code: The command's exit status (128+N when killed by signal N); ``None`` when
            nobody could observe it (the wrapper was killed and nothing was recorded).
        recorded: True when the executor's exit record supplied ``code``.
    """

    code: int | None
    recorded: bool


@dataclass(frozen=True, slots=True)
class Started:
    """Identity of a started (or re-attached) task's process: pid plus its start time, so a
    recycled pid is never taken for it."""

    pid: int
    start_ticks: int


OnExit = Callable[[Exit], None]
"""Called on the event loop, once, when the task's process has ended."""


class Executor(Protocol):
    """Runs tasks for the engine's runners."""

    def start(
        self, key: TaskKey, argv: list[str], cwd: str, env: dict[str, str], on_exit: OnExit
    ) -> Started:
        """Start ``argv`` as task ``key``; ``on_exit`` hears of its end.

        Raises:
            LaunchError: It cannot start (the message is the job's reason).
        """
        ...

    def attach(self, key: TaskKey, pid: int, ticks: int | None, on_exit: OnExit) -> bool:
        """Watch a task started by an earlier engine run; False if it is gone."""
        ...

    def terminate(self, key: TaskKey, grace: float) -> bool:
        """SIGTERM the task now and SIGKILL it after ``grace`` s; False if nothing runs."""
        ...

    def forget(self, key: TaskKey) -> None:
        """Stop watching without signalling (the work is left alone)."""
        ...

    def recorded_exit(self, key: TaskKey) -> int | None:
        """The exit status recorded for a task that ended unwatched (``None``: unknown)."""
        ...

    def log_path(self, key: TaskKey) -> Path:
        """Where the task's output goes."""
        ...

    def pids(self) -> dict[TaskKey, int]:
        """The process of every task being watched."""
        ...

    def close(self) -> None:
        """Stop watching everything; the processes keep running."""
        ...
