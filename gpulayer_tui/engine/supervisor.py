"""Watching processes the engine did not start through its launcher: adopted processes, and
jobs an earlier version started under its per-job ``sh`` wrapper (so an upgrade does not
lose what is running).

A process is watched through a pidfd (``loop.add_reader``), which works for processes that
are not our children; after an engine restart the pidfd is opened *before* the /proc start
time is checked, so a passing check means the fd names that very process. An adopted
process is signalled alone (``pidfd_send_signal``), never its group; a wrapper-era job's
group is signalled while its leader is alive. A wrapper-era job's exit status is the one
its wrapper recorded in ``jobs/<id>.exit``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .executor import Exit, LaunchError, OnExit, TaskKey, task_name

__all__ = [
    "Exit",
    "LaunchError",
    "Supervisor",
    "TaskKey",
    "exit_path",
    "log_path",
    "open_pidfd",
    "read_exit_file",
]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5  # /proc polling for adopted processes where pidfds are unsupported


@dataclass(slots=True)
class _Watch:
    on_exit: OnExit
    pid: int
    pidfd: int | None  # None: no pidfd support, polled through /proc instead
    popen: subprocess.Popen[bytes] | None
    group: bool = True  # signal the whole process group (launched jobs) or the pid alone
    ticks: int | None = None
    poller: asyncio.Task[None] | None = None


def log_path(jobs_dir: Path, key: TaskKey) -> Path:
    """The job's (or replica's) combined stdout/stderr file."""
    return jobs_dir / f"{task_name(key)}.log"


def exit_path(jobs_dir: Path, key: TaskKey) -> Path:
    """Where the wrapper records the exit status (flat files: a directory per job would
    cost a mkdir per launch, which is slow on some filesystems)."""
    return jobs_dir / f"{task_name(key)}.exit"


def read_exit_file(path: Path) -> int | None:
    """The recorded exit status, or ``None`` if absent or incomplete."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if not text.endswith("\n"):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``; ``None`` if the process does not exist; -1 if pidfds are
    not supported here (old kernel), so callers fall back to polling /proc."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as err:
        if err.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
            return -1
        return None


class Supervisor:
    """Starts job processes and reports their exits (the local :class:`.Executor`).

    Args:
        jobs_dir: Where logs and exit files go.
    """

    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = jobs_dir
        self._watches: dict[TaskKey, _Watch] = {}
        self._kill_timers: dict[TaskKey, asyncio.TimerHandle] = {}
        # (argv0, PATH, cwd) -> (when found, path). A PATH search is ~10 stat calls per
        # job; a queue of 500 `python ...` jobs need not repeat it. Misses are not cached.
        self._programs: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._devnull_fd: int | None = None

    def log_path(self, key: TaskKey) -> Path:
        """The job's (or replica's) combined stdout/stderr file."""
        return log_path(self.jobs_dir, key)

    def recorded_exit(self, key: TaskKey) -> int | None:
        """The exit status the wrapper recorded for ``key``, if it did."""
        return read_exit_file(exit_path(self.jobs_dir, key))

    def recorded_end(self, key: TaskKey) -> Exit:
        """How ``key`` ended by its wrapper's exit file: the status, and when (the file's
        mtime: the wrapper wrote it as the command ended, maybe long before an engine
        looked), or an unobserved end."""
        path = exit_path(self.jobs_dir, key)
        code = read_exit_file(path)
        if code is None:
            return Exit(None, recorded=False)
        try:
            at: float | None = path.stat().st_mtime
        except OSError:
            at = None
        return Exit(code, recorded=True, at=at)

    def attach(
        self, key: TaskKey, pid: int, ticks: int | None, on_exit: OnExit, adopted: bool = False
    ) -> bool:
        """Watch a job process started by an earlier engine run (or adopted by one).

        The pidfd is opened *before* the start-time check, so if the check passes the fd
        is known to refer to that very process and not a later one with the same pid.

        Returns:
            False if the process is gone or the pid now belongs to another process.
        """
        pidfd = open_pidfd(pid)
        if pidfd is None or (pidfd < 0 and not adopted):
            return False
        if not procs.is_alive(pid, ticks):
            if pidfd >= 0:
                os.close(pidfd)
            return False
        if adopted:
            assert isinstance(key, int)
            self.watch_adopted(key, pid, pidfd if pidfd >= 0 else None, ticks or 0, on_exit)
        else:
            self._watch(key, on_exit, pid, pidfd, None)
        return True

    def watch_adopted(
        self, job_id: int, pid: int, pidfd: int | None, ticks: int, on_exit: OnExit
    ) -> None:
        """Watch a process this engine did not start (adoption).

        Args:
            job_id: The adopted job.
            pid: Its pid.
            pidfd: A pidfd opened *before* its start time was checked, or ``None`` where
                pidfds are unsupported: then /proc is polled, comparing the start time on
                every look, so a recycled pid reads as "exited".
            ticks: Its /proc start time.

        Signals go to that pid alone, never its process group: the process was started
        elsewhere, and its group may hold the user's shell or other work.
        """
        watch = _Watch(on_exit, pid, pidfd, None, group=False, ticks=ticks)
        self._watches[job_id] = watch
        if pidfd is not None:
            asyncio.get_running_loop().add_reader(pidfd, self._exited, job_id)
        else:
            watch.poller = asyncio.create_task(self._poll(job_id, watch))

    async def _poll(self, job_id: int, watch: _Watch) -> None:
        # Without a pidfd there is nothing to wait on for a process that is not our child:
        # polling /proc (start time included) is the only way.
        while procs.is_alive(watch.pid, watch.ticks):  # noqa: ASYNC110
            await asyncio.sleep(POLL_INTERVAL_S)
        self._exited(job_id)

    def _watch(
        self,
        key: TaskKey,
        on_exit: OnExit,
        pid: int,
        pidfd: int,
        popen: subprocess.Popen[bytes] | None,
    ) -> None:
        self._watches[key] = _Watch(on_exit, pid, pidfd, popen)
        asyncio.get_running_loop().add_reader(pidfd, self._exited, key)

    def _unwatch(self, watch: _Watch) -> None:
        if watch.pidfd is not None:
            asyncio.get_running_loop().remove_reader(watch.pidfd)
            os.close(watch.pidfd)
        if watch.poller is not None and watch.poller is not asyncio.current_task():
            watch.poller.cancel()

    def _drop_watch(self, key: TaskKey) -> _Watch | None:
        """Stop watching ``key``'s process and forget its pending SIGKILL."""
        watch = self._watches.pop(key, None)
        if watch is not None:
            self._unwatch(watch)
        timer = self._kill_timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        return watch

    def _exited(self, key: TaskKey) -> None:
        watch = self._drop_watch(key)
        if watch is None:
            return
        self._stop_leftovers(watch)
        code = read_exit_file(exit_path(self.jobs_dir, key))
        if code is not None:
            if watch.popen is not None:
                watch.popen.poll()
            watch.on_exit(Exit(code, recorded=True))
            return
        returncode: int | None = None
        if watch.popen is not None:
            returncode = watch.popen.poll()
        if returncode is not None and returncode < 0:
            returncode = 128 - returncode  # killed by signal N -> 128+N, as a shell says
        watch.on_exit(Exit(returncode, recorded=False))

    @staticmethod
    def _stop_leftovers(watch: _Watch) -> None:
        """SIGKILL what is left in an ended job's process group.

        The job is over once its wrapper ends; anything still in its group (the command
        itself when the wrapper was killed, or children left in the background) would run
        on untracked, holding GPU memory and ports the scheduler has already given away.
        This is done only for our own unreaped child: its pid, which is the group id,
        cannot be reused before we reap it, so the signal cannot reach a stranger. (A
        wrapper re-attached after an engine restart was reaped by init already.)
        """
        if not watch.group or watch.popen is None or watch.popen.returncode is not None:
            return
        try:
            os.killpg(watch.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def forget(self, key: TaskKey) -> None:
        """Stop watching a process without signalling it (an adoption that is undone)."""
        self._drop_watch(key)

    def pids(self) -> dict[TaskKey, int]:
        """``{key: leader pid}`` of every watched process."""
        return {key: w.pid for key, w in self._watches.items()}

    def terminate(self, key: TaskKey, grace: float) -> bool:
        """SIGTERM the process group, then SIGKILL it after ``grace`` seconds.

        Returns:
            False if the job (or replica) has no live process.
        """
        watch = self._watches.get(key)
        if watch is None:
            return False
        self._signal(watch, signal.SIGTERM)
        self._signal(watch, signal.SIGCONT)  # (a stopped process gets its SIGTERM: h171)
        if key not in self._kill_timers:
            loop = asyncio.get_running_loop()
            self._kill_timers[key] = loop.call_later(grace, self._kill, key)
        return True

    def _kill(self, key: TaskKey) -> None:
        self._kill_timers.pop(key, None)
        watch = self._watches.get(key)
        if watch is not None:
            self._signal(watch, signal.SIGKILL)

    @staticmethod
    def _signal(watch: _Watch, sig: signal.Signals) -> None:
        if not watch.group:
            try:
                if watch.pidfd is not None:
                    # The pidfd names that very process: a recycled pid cannot be hit.
                    signal.pidfd_send_signal(watch.pidfd, sig)
                elif procs.is_alive(watch.pid, watch.ticks):
                    os.kill(watch.pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError as err:
                log.warning("cannot signal pid %d: %s", watch.pid, err)
            return
        try:
            # The leader is unreaped (we are its parent) or held by our pidfd and checked
            # by start time, so its pid, which is the group id, still names our group.
            os.killpg(watch.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as err:
            log.warning("cannot signal process group %d: %s", watch.pid, err)

    def close(self) -> None:
        """Stop watching (the processes keep running: jobs outlive the engine)."""
        for watch in self._watches.values():
            self._unwatch(watch)
            if watch.popen is not None:
                # Let the Popen object forget the child without a ResourceWarning; the
                # orphan is reparented and its exit recorded by the wrapper.
                watch.popen.returncode = 0
        self._watches.clear()
        for timer in self._kill_timers.values():
            timer.cancel()
        self._kill_timers.clear()
