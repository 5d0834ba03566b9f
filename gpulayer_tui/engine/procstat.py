"""The raw /proc/PID/stat read: process identity (pid + start ticks), parent, state.

Stdlib only, and kept apart from :mod:`.procs` (which uses psutil) because the launcher
and its keeper import it: their start time matters and they load no third-party module.
The sampler also calls :func:`read_stat` for every GPU process on every tick, where the raw
read is the cheaper one (figures in :mod:`.procs`). A PID alone never identifies a process
here: identity is always ``(pid, start_ticks)``, ``start_ticks`` being field 22 of
/proc/PID/stat.
"""

from __future__ import annotations

from dataclasses import dataclass

PF_KTHREAD = 0x00200000


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/PID/stat that the engine uses."""

    pid: int
    state: str
    ppid: int
    start_ticks: int
    session: int = 0
    pgrp: int = 0  # field 5: its process group
    flags: int = 0  # field 9: PF_* (PF_KTHREAD marks a kernel thread)
    comm: bytes = b""  # field 2, the command name: exec (and PR_SET_NAME) change it


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
    begin, end = data.find(b"("), data.rfind(b")")
    if begin < 0 or end < begin:
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
            pgrp=int(rest[2]),
            flags=int(rest[6]),
            comm=data[begin + 1 : end],
        )
    except (IndexError, ValueError):
        return None


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
