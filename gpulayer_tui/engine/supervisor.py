"""The local executor: launching, watching and signalling job processes on this machine.

Launch path (designed so a restarted engine can re-attach and still learn exit codes):

* The job runs under a tiny ``sh`` wrapper, started in its own session, so the wrapper's
  pid is the process-group id. The wrapper runs the command in the *foreground* (so the
  command keeps default SIGINT/SIGQUIT handling and stdin), then writes ``$?`` to
  ``jobs/<id>.exit``. Its ``trap`` only sets a flag, so a SIGTERM sent to the whole group
  reaches the command while the wrapper survives to record 143.
* stdout and stderr go to ``jobs/<id>.log``, readable while the job runs.
* The engine watches the wrapper through a pidfd (``loop.add_reader``), which also works
  for a process it did not start: after an engine restart it re-opens a pidfd for the
  recorded pid, checks the /proc start time, and reads the exit file when it ends.

Signals go to the process group while the leader is alive and unreaped (its pid, hence the
group id, cannot be recycled until it is reaped), so they never land on a stranger.

Why this module is longer than ~400 lines: launching, watching (pidfd or /proc
polling), signalling and reaping one process are one job with one set of watches.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .executor import Exit, LaunchError, OnExit, Started, TaskKey, task_name

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

SH = shutil.which("sh") or "/bin/sh"

# $0 is the exit-status file. The wrapper's own stderr goes to /dev/null (fd 3 keeps the
# log for the command): dash reports "Terminated" for a foreground child killed by a signal
# on whatever its fd 2 is at that moment, and that is not the user's output. The command
# runs in a subshell that execs it, so the redirection happens in the child only (no extra
# process), and it runs in the foreground, so it keeps default SIGINT/SIGQUIT handling.
# "c" is set if TERM/INT arrives before the command starts, so a cancel that races the
# launch does not start the command at all.
WRAPPER = (
    "exec 3>&2 2>/dev/null; trap 'c=1' TERM INT; "
    'if [ -z "${c:-}" ]; then ( exec "$@" 2>&3 3>&- ); rc=$?; else rc=143; fi; '
    'printf \'%s\\n\' "$rc" > "$0"; exit "$rc"'
)

PROGRAM_CACHE_S = 5.0
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


def resolve_program(argv0: str, cwd: str, env: dict[str, str]) -> str | None:
    """Where ``argv0`` would be found, or ``None`` if it cannot be executed."""
    if "/" in argv0:
        path = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def why_not_runnable(argv0: str, cwd: str) -> str:
    """The reason ``argv0`` cannot be run (it was not found, or is not executable)."""
    if "/" not in argv0:
        return f"command not found: {argv0} (no such program in PATH)"
    path = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
    if not os.path.exists(path):
        return f"command not found: {argv0} (no such file)"
    if os.path.isdir(path):
        return f"cannot run {argv0}: it is a directory"
    return f"permission denied: {argv0} is not executable"


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

    def _devnull(self) -> int:
        # One /dev/null for every launch instead of an open per job.
        if self._devnull_fd is None:
            self._devnull_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        return self._devnull_fd

    def log_path(self, key: TaskKey) -> Path:
        """The job's (or replica's) combined stdout/stderr file."""
        return log_path(self.jobs_dir, key)

    def recorded_exit(self, key: TaskKey) -> int | None:
        """The exit status the wrapper recorded for ``key``, if it did."""
        return read_exit_file(exit_path(self.jobs_dir, key))

    def start(
        self, key: TaskKey, argv: list[str], cwd: str, env: dict[str, str], on_exit: OnExit
    ) -> Started:
        """Start ``argv`` for a job or replica; return its leader's pid and start time.

        Runs on the event loop on purpose: a fork/exec of ``sh`` costs about half a
        millisecond, less than a hop to a worker thread and back.

        Raises:
            LaunchError: Missing cwd, program not found or not executable, log not writable.
        """
        if not os.path.isdir(cwd):
            missing = "is not a directory" if os.path.exists(cwd) else "does not exist"
            raise LaunchError(f"working directory {missing}: {cwd}")
        if self._find_program(argv[0], cwd, env) is None:
            raise LaunchError(why_not_runnable(argv[0], cwd))
        log = log_path(self.jobs_dir, key)
        try:
            log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise LaunchError(f"cannot write the job's log {log}: {err.strerror}") from None
        try:
            popen = subprocess.Popen(
                [SH, "-c", WRAPPER, str(exit_path(self.jobs_dir, key)), *argv],
                cwd=cwd,
                env=env,
                stdin=self._devnull(),
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as err:
            where = f" ({err.filename})" if err.filename else ""
            raise LaunchError(f"cannot start {argv[0]}: {err.strerror}{where}") from None
        finally:
            os.close(log_fd)
        ticks = procs.start_ticks(popen.pid) or 0
        self._watch(key, on_exit, popen.pid, os.pidfd_open(popen.pid), popen)
        return Started(popen.pid, ticks)

    def _find_program(self, argv0: str, cwd: str, env: dict[str, str]) -> str | None:
        key = (argv0, env.get("PATH", ""), cwd if "/" in argv0 else "")
        now = time.monotonic()
        hit = self._programs.get(key)
        if hit is not None and now - hit[0] < PROGRAM_CACHE_S:
            return hit[1]
        found = resolve_program(argv0, cwd, env)
        if found is not None:
            if len(self._programs) > 1024:
                self._programs.clear()
            self._programs[key] = (now, found)
        return found

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
        if self._devnull_fd is not None:
            os.close(self._devnull_fd)
            self._devnull_fd = None
