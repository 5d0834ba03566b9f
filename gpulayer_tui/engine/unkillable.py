"""Processes that outlive SIGKILL: released with a recorded reason, never held for ever.

A process in uninterruptible sleep (state ``D``: stuck in a GPU driver or on a hung
filesystem, or frozen by a cgroup freezer) does not die of SIGKILL until the kernel lets
it go, which may be never. Without a bound its job would stay ``running`` and hold its
slots and VRAM for good, and ``cancel`` would wait for ever.

So once a stop has reached its SIGKILL deadline (``job.kill_at``, stored with the job),
the job gets ``[engine] release_after`` more seconds. A process still alive then is
*released*: the job ends ``orphaned`` with reason ``unkillable`` and a message naming the
pid and its kernel state; the engine stops watching it and gives its slots back. Its GPU
memory, if it holds any, is then counted as unregistered VRAM until it really ends, so
admission still sees it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import procs
from .models import JobStatus, TerminationReason

if TYPE_CHECKING:
    from .jobbook import ActiveJob, JobBook

STATES = {
    "D": "uninterruptible sleep",
    "T": "stopped",
    "t": "stopped by a tracer",
    "R": "running",
    "S": "sleeping",
    "Z": "a zombie",
}
EXIT_LATE_S = 5.0
"""A process found gone at the deadline whose exit was not reported yet gets this long."""


def stuck_message(pid: int, outlived: float, why: str) -> str:
    """What a released job's message says: the pid, its kernel state and what it waits in."""
    stat = procs.read_stat(pid)
    state = "" if stat is None else stat.state
    described = STATES.get(state, f"state {state}" if state else "state unknown")
    wchan = _wchan(pid)
    where = f", waiting in {wchan}" if wchan else ""
    return (
        f"pid {pid} outlived SIGKILL by {outlived:g} s ({described}{where}): released after "
        f"{why}; gpulayer-tui no longer watches it or holds its slots, and GPU memory it "
        "still holds counts as unregistered VRAM until it ends"
    )


def _wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii", errors="replace") as fh:
            name = fh.read(64).strip()
    except OSError:
        return ""
    return "" if name in ("", "0") else name


class StuckReleaser:
    """Arms, per stopping job, the deadline after which a surviving process is released.

    Args:
        book: The active jobs.
        release_after: Seconds after the SIGKILL deadline (``[engine] release_after``).
        let_go: Stops watching the job's process (called just before the job ends).
    """

    def __init__(
        self,
        book: JobBook,
        release_after: Callable[[], float],
        let_go: Callable[[ActiveJob], None],
    ) -> None:
        self._book = book
        self._release_after = release_after
        self._let_go = let_go
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def arm(self, act: ActiveJob) -> None:
        """Watch ``act``'s stop: call once it is signalled (and again after a restart)."""
        kill_at = act.job.kill_at
        if kill_at is None:
            return
        delay = kill_at + self._release_after() - time.time()
        self._arm(act.job.id, kill_at, delay, late=False)

    def _arm(self, job_id: int, kill_at: float, delay: float, late: bool) -> None:
        old = self._timers.pop(job_id, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[job_id] = loop.call_later(max(0.0, delay), self._due, job_id, kill_at, late)

    def job_ended(self, act: ActiveJob) -> None:
        """End listener: its process ended (or it was released): nothing left to watch."""
        timer = self._timers.pop(act.job.id, None)
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        """Engine stop: drop the timers (a restarted engine re-arms them)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _due(self, job_id: int, kill_at: float, late: bool) -> None:
        self._timers.pop(job_id, None)
        act = self._book.get(job_id)
        if act is None or act.job.status is not JobStatus.RUNNING:
            return
        job = act.job
        if job.kill_at != kill_at:
            return  # not the stop this was armed for (a requeued job's next run, say)
        pid = job.pid
        if pid is not None and not procs.is_alive(pid, job.start_ticks) and not late:
            # Gone, and its exit is on its way (the launcher reaps, then tells): let the
            # normal end win, with its real exit code.
            self._arm(job_id, kill_at, EXIT_LATE_S, late=True)
            return
        outlived = time.time() - (job.kill_at or time.time())
        why = job.stop_message or "a stop"
        if pid is None:
            message = f"no process to watch {outlived:.0f} s after SIGKILL ({why}): released"
        elif not procs.is_alive(pid, job.start_ticks):
            message = f"pid {pid} ended after {why} but its exit was never reported: released"
        else:
            message = stuck_message(pid, round(outlived, 1), why)
        self._let_go(act)
        self._book.finish(act, JobStatus.ORPHANED, TerminationReason.UNKILLABLE, message)
