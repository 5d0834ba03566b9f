"""Reading /proc: process identity (pid + start time), ancestry, owner and command line.

All functions here are blocking file reads; the engine calls them from worker threads
(the sampler) or for single, cheap look-ups. A PID alone never identifies a process here:
``pid_max`` is small on many machines and PIDs recycle quickly, so identity is always
``(pid, start_ticks)`` where ``start_ticks`` is field 22 of /proc/PID/stat.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/PID/stat that the engine uses."""

    pid: int
    state: str
    ppid: int
    start_ticks: int
    session: int = 0
    flags: int = 0  # field 9: PF_* (PF_KTHREAD marks a kernel thread)


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/PID/stat, or ``None`` if the process does not exist.

    The command name (field 2) may contain spaces and parentheses, so the line is split
    after the *last* ``)``; start time is field 22 counted from the line's start.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    end = data.rfind(b")")
    if end < 0:
        return None
    rest = data[end + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    try:
        return ProcStat(
            pid=pid,
            state=rest[0].decode(),
            ppid=int(rest[1]),
            start_ticks=int(rest[19]),
            session=int(rest[3]),
            flags=int(rest[6]),
        )
    except (IndexError, ValueError):
        return None


PF_KTHREAD = 0x00200000


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` if it is gone."""
    stat = read_stat(pid)
    return None if stat is None else stat.start_ticks


def is_alive(pid: int, expected_ticks: int | None = None) -> bool:
    """True if ``pid`` exists, is not a zombie, and (if given) started at ``expected_ticks``."""
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    return expected_ticks is None or stat.start_ticks == expected_ticks


def read_cmdline(pid: int, limit: int = 200) -> str:
    """The command line joined by spaces (kernel threads: ``[comm]``); '' if gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return ""
    if not raw:
        try:
            with open(f"/proc/{pid}/comm", "rb") as fh:
                return "[" + fh.read().decode(errors="replace").strip() + "]"
        except OSError:
            return ""
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_uid(pid: int) -> int | None:
    """Real uid owning ``pid``, or ``None`` if it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def read_real_uid(pid: int) -> int | None:
    """The real uid of ``pid`` (from /proc/PID/status), or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_cwd(pid: int) -> str:
    """The working directory of ``pid`` ('' if unreadable or gone)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


@lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """Login name for ``uid`` (the number as text when unknown)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """What the UI and queued reasons say about a process."""

    pid: int
    user: str
    command: str
    start_ticks: int | None


@lru_cache(maxsize=1)
def boot_time() -> float:
    """When the machine booted (epoch seconds, ``btime`` in /proc/stat)."""
    try:
        with open("/proc/stat", "rb") as fh:
            for line in fh:
                if line.startswith(b"btime"):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def started_at(ticks: int) -> float:
    """Epoch seconds of a /proc start time."""
    return boot_time() + ticks / CLOCK_TICKS


def describe(pid: int) -> ProcessInfo:
    """Owner, command line and start time of ``pid`` (empty fields if it vanished)."""
    uid = read_uid(pid)
    return ProcessInfo(
        pid=pid,
        user="" if uid is None else user_name(uid),
        command=read_cmdline(pid),
        start_ticks=start_ticks(pid),
    )


def find_owner(
    pid: int, roots: dict[int, tuple[int, int | None]], max_depth: int = 64
) -> int | None:
    """Return the job id whose root process is ``pid`` or one of its ancestors.

    Args:
        pid: A process seen on a GPU.
        roots: ``{root_pid: (job_id, root_start_ticks)}`` of the engine's running jobs.
        max_depth: Safety bound on the ancestor walk.

    A root matches only if its start time matches too, so a recycled PID that happens to
    equal an old job's pid is not attributed to that job.
    """
    current = pid
    for _ in range(max_depth):
        hit = roots.get(current)
        if hit is not None:
            job_id, ticks = hit
            if ticks is None or start_ticks(current) == ticks:
                return job_id
        stat = read_stat(current)
        if stat is None or stat.ppid <= 1:
            return None
        current = stat.ppid
    return None
