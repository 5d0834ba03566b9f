"""Process facts through psutil: command line, owner, start time, host CPU and memory.

All functions here block (they read /proc); the engine calls them from worker threads (the
sampler) or for single, cheap look-ups. A PID alone never identifies a process here:
``pid_max`` is small on many machines and PIDs recycle quickly, so identity is always
``(pid, start_ticks)``, ``start_ticks`` being field 22 of /proc/PID/stat.

psutil answers everything but that identity check, which stays a raw read of
/proc/PID/stat (:mod:`.procstat`, re-exported here): the launcher and its keeper import it
and stay stdlib-only (their start time matters), and the sampler runs it for every GPU
process on every tick. Measured by ``bench/bench_procstat.py`` (N=10,000, one run, 2-core
shared VM, psutil 7.2.2): ``read_stat`` 11.3 µs per call; ``psutil.Process(pid)`` (which
reads the same file for its create time) 11.9 µs, 1.1x (1.3-1.4x in two earlier runs); a
kept ``Process``'s ``ppid``, ``status`` and ``create_time`` under ``oneshot`` 32 µs, 2.8x.
So the raw read is not clearly cheaper than a fresh ``psutil.Process``; it stays because
psutil gives the start time only as epoch seconds (through the boot time), not the
kernel's ticks that identify a process here, the ancestor walk needs ppid and ticks
together, and the launcher needs it without psutil anyway. The host facts the sampler adds
(``host_use``: CPU % and RSS through a kept ``Process``) cost 27 µs per GPU process per
tick in the same run.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from functools import lru_cache

import psutil

from .procstat import PF_KTHREAD, ProcStat, is_alive, read_stat, start_ticks

__all__ = [
    "CLOCK_TICKS",
    "PF_KTHREAD",
    "HostUse",
    "ProcStat",
    "ProcessInfo",
    "boot_time",
    "describe",
    "describe_process",
    "find_owner",
    "host_use",
    "is_alive",
    "open_process",
    "read_cmdline",
    "read_cwd",
    "read_real_uid",
    "read_stat",
    "start_ticks",
    "started_at",
    "user_name",
]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def open_process(pid: int, ticks: int | None = None) -> psutil.Process | None:
    """psutil's handle on ``pid``, or ``None`` if it is gone (or, with ``ticks``, if the
    pid now names another process than the one that started at ``ticks``)."""
    try:
        process = psutil.Process(pid)
        if ticks is not None and _ticks_of(process) != ticks:
            return None
    except psutil.Error:
        return None
    return process


def _ticks_of(process: psutil.Process) -> int:
    # create_time is boot time + ticks / CLK_TCK (whole-second boot time): this is exact.
    return round((process.create_time() - psutil.boot_time()) * CLOCK_TICKS)


def _argv(process: psutil.Process) -> list[str]:
    """``process.cmdline()``, with its carriage returns: psutil reads the command line as
    text with universal newlines, so an argument's ``\r`` came back as ``\n`` (a process
    was said to hold a line feed it did not: tester h197). Read again as bytes, only when
    an argument holds a line break, the rare case where the two differ.

    Raises:
        psutil.Error: As ``cmdline()``.
    """
    args = process.cmdline()
    if any("\n" in arg for arg in args):
        try:
            with open(f"/proc/{process.pid}/cmdline", "rb") as fh:
                raw = fh.read()
        except OSError:
            return args
        words = raw.split(b"\0")
        if words and not words[-1]:
            words.pop()
        return [w.decode("utf-8", "surrogateescape") for w in words] or args
    return args


def _command(process: psutil.Process, limit: int) -> str:
    try:
        args = _argv(process)
        text = " ".join(args) if args else f"[{process.name()}]"  # kernel threads
    except psutil.Error:
        return ""
    if not text.isascii():
        # Bytes that are not UTF-8 came as lone surrogates, which strict JSON decoders
        # refuse in an answer: written as \xNN text instead.
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_program(pid: int) -> str:
    """``pid``'s argv[0] as it is (its name for a kernel thread, or one whose command
    line is empty); bytes that are not UTF-8 as U+FFFD; '' if gone."""
    process = open_process(pid)
    if process is None:
        return ""
    try:
        args = _argv(process)
        program = args[0] if args and args[0] else process.name()
    except psutil.Error:
        return ""
    return program.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def read_cmdline(pid: int, limit: int = 200) -> str:
    """The command line joined by spaces (kernel threads: ``[comm]``); '' if gone."""
    process = open_process(pid)
    return "" if process is None else _command(process, limit)


def _real_uid(process: psutil.Process) -> int | None:
    try:
        return int(process.uids().real)
    except psutil.Error:
        return None


def read_real_uid(pid: int) -> int | None:
    """The real uid of ``pid``, or ``None`` if it is gone."""
    process = open_process(pid)
    return None if process is None else _real_uid(process)


def read_cwd(pid: int) -> str:
    """The working directory of ``pid`` ('' if unreadable or gone)."""
    process = open_process(pid)
    try:
        return "" if process is None else process.cwd()
    except psutil.Error:
        return ""


def gone_words(pid: int) -> str:
    """Why ``pid`` is no process to act on: gone, or a zombie its parent has not reaped
    (``ps`` still lists one: "it exited, or never was" read as wrong beside it, h184)."""
    stat = read_stat(pid)
    if stat is not None and stat.state in ("Z", "X"):
        return f"pid {pid} has exited (a zombie its parent, pid {stat.ppid}, has not reaped yet)"
    return f"no process with pid {pid} (it exited, or never was)"


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
    ppid: int | None = None
    """Its parent's pid when it was first seen (the process table's tree view)."""


@dataclass(frozen=True, slots=True)
class HostUse:
    """What a process uses of the host, read on one tick.

    Attributes:
        cpu_percent: CPU time over the wall time since the previous read of the same
            process handle (100 = one core); ``None`` on the first read (no interval yet).
        rss: Resident memory, bytes.
    """

    cpu_percent: float | None
    rss: int | None


def host_use(process: psutil.Process, first: bool) -> HostUse:
    """CPU % since the previous call on ``process`` and its RSS (``first``: no CPU % yet)."""
    # (Not under oneshot(): the two read different files, and oneshot's set-up made the
    # pair 33 µs instead of 26.)
    try:
        percent = process.cpu_percent(None)
        rss = int(process.memory_info().rss)
    except psutil.Error:
        return HostUse(None, None)
    return HostUse(None if first else percent, rss)


@lru_cache(maxsize=1)
def boot_time() -> float:
    """When the machine booted (epoch seconds)."""
    return float(psutil.boot_time())


def started_at(ticks: int) -> float:
    """Epoch seconds of a /proc start time."""
    return boot_time() + ticks / CLOCK_TICKS


def describe_process(process: psutil.Process, ticks: int | None) -> ProcessInfo:
    """Owner (real uid), command line and start time of an open process."""
    uid = _real_uid(process)
    return ProcessInfo(
        pid=process.pid,
        user="" if uid is None else user_name(uid),
        command=_command(process, 200),
        start_ticks=ticks,
    )


def describe(pid: int) -> ProcessInfo:
    """Owner, command line and start time of ``pid`` (empty fields if it vanished)."""
    process = open_process(pid)
    try:
        ticks = None if process is None else _ticks_of(process)
    except psutil.Error:
        ticks = None
    if process is None or ticks is None:
        return ProcessInfo(pid=pid, user="", command="", start_ticks=None)
    return describe_process(process, ticks)


def find_owner(
    pid: int, roots: dict[int, tuple[int, int | None]], max_depth: int = 64
) -> int | None:
    """Return the job id whose root process is ``pid`` or one of its ancestors.

    Args:
        pid: A process seen on a GPU.
        roots: ``{root_pid: (job_id, root_start_ticks)}`` of the engine's running jobs.
        max_depth: Safety bound on the ancestor walk.

    A root matches only if its start time matches too, so a recycled PID that happens to
    equal an old job's pid is not attributed to that job. (The walk reads each ancestor's
    stat once, raw: it needs the start ticks, and psutil's ``parents()`` reads the same
    file without giving them.)
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


def listener_of(port: int) -> int | None:
    """The pid of a process listening on TCP ``port`` (any address), or ``None`` when none
    can be seen (none listens, or the kernel hides the owner from this user). Blocking: it
    reads every process's descriptors (run it in a thread)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid:
                return int(conn.pid)
    return None


def listened_ports(leader: int) -> list[int]:
    """The TCP ports the processes of ``leader``'s session listen on (any address), in
    order; empty when none does or the kernel hides the owners from this user. Blocking:
    it reads every process's descriptors (run it in a thread)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return []
    ports = {
        int(conn.laddr.port)
        for conn in connections
        if conn.status == psutil.CONN_LISTEN
        and conn.laddr
        and conn.pid
        and in_session(int(conn.pid), leader)
    }
    return sorted(ports)


def _listening(port: int) -> list[list[str]]:
    """The rows of ``/proc/net/tcp`` and ``tcp6`` for sockets listening on ``port`` (in
    this network namespace), each split into its fields: ``sl local_address rem_address
    st tx_queue:rx_queue ...``. A table that cannot be read is passed over."""
    rows: list[list[str]] = []
    wanted = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                next(fh, None)  # (the header)
                for line in fh:
                    fields = line.split()
                    # (state 0A: LISTEN)
                    if len(fields) > 4 and fields[3] == "0A" and fields[1].endswith(wanted):
                        rows.append(fields)
        except (OSError, ValueError):
            continue
    return rows


def accept_queue(port: int) -> int | None:
    """How many connections wait to be accepted on TCP ``port`` (the longest queue of its
    listening sockets, IPv4 or IPv6, in this network namespace), or ``None`` when nothing
    listens there or the kernel's tables cannot be read.

    The kernel completes a connect while the queue has room, whether or not the server
    ever accepts it: a connect cannot tell a hung server from a serving one, its queue
    can. (``/proc/net/tcp``: a listening socket's ``rx_queue`` is its accept queue;
    psutil does not give it.) Blocking: run it in a thread.
    """
    longest: int | None = None
    for fields in _listening(port):
        try:
            waiting = int(fields[4].partition(":")[2], 16)
        except ValueError:
            continue
        longest = waiting if longest is None else max(longest, waiting)
    return longest


def listen_addresses(port: int) -> list[str]:
    """The local addresses TCP ``port`` is listened on in this network namespace
    (``127.0.0.1``, ``::1``, ``0.0.0.0``, ``::``...), from ``/proc/net/tcp`` and ``tcp6``;
    empty when nothing listens there or the tables cannot be read. Blocking: run it in a
    thread."""
    import ipaddress

    found: list[str] = []
    for fields in _listening(port):
        try:
            raw = bytes.fromhex(fields[1].partition(":")[0])
            # (the kernel prints each 32-bit word of the address in host order:
            # little-endian here, so each word's bytes come reversed)
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            text = str(ipaddress.ip_address(packed))
        except ValueError:
            continue
        if text not in found:
            found.append(text)
    return found


def in_session(pid: int, leader: int) -> bool:
    """Whether ``pid`` is in the session ``leader`` leads (a job's processes: its leader
    starts one, and what it starts stays in it unless it makes a session of its own)."""
    try:
        return os.getsid(pid) == leader
    except OSError:
        return False
