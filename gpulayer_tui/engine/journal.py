"""The launcher's journal: what it started, as which process, and how each ended.

One append-only text file per state dir (``launcher.journal``), one line per event, each
written with a single ``write`` to a file opened ``O_APPEND | O_NOFOLLOW``: a line is
either all there or (after a crash in the middle of a write) missing its newline and
ignored. The page cache keeps what was written when a process dies, so the journal is
exact across crashes of the engine and of the launcher (not across a power loss: the same
promise as the database's ``synchronous=NORMAL``).

Lines (a key is a job id, ``7``, or a service replica, ``7.1``):

=============================  ====================================================
``S key ticks``                about to start ``key`` (boot-relative clock ticks)
``P key pid ticks [cap        ``key`` runs as ``pid``, started at ``ticks``, its log
[timeout_at grace]]``          cut back past ``cap`` bytes (``-`` or none: no cap);
                               stopped by the spawner at ``timeout_at`` (epoch s) with
                               SIGKILL ``grace`` s later if no engine is connected then
``F key``                      ``key`` could not be started (never ran)
``N key``                      ``key`` was found never to have started (see keeper)
``E key code at [dropped]``    ``key`` ended with ``code`` (``-``: nobody could see) at
                               ``at``; its log's cuts dropped ``dropped`` bytes in all
``K key deadline [T]``         SIGKILL ``key`` at ``deadline`` (epoch s) if still running
                               (``T``: the spawner stopped it for its timeout)
``L key cap``                  ``key``'s log cap is now ``cap`` bytes (a live change)
``A key``                      the engine recorded ``key``'s end; it may be forgotten
=============================  ====================================================

A serving spawner compacts it (rewrites it with only the live entries, then renames it
over the old) once it is big and mostly dead lines: about 80 bytes a job otherwise stay
for good.

The journal is the only thing written on the launch path; there is no file per job but
its log. Stdlib only: the launcher imports it, and must start fast.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time

NAME = "launcher.journal"

STARTING = "starting"
"""The folder (in the state dir) of start marks: the spawner has each job's process make
``KEY.TICKS`` (the ``S`` line's ticks) as it is made, before its program runs, and removes
it once the job has ended. A start whose ``P`` line never came (both launcher processes
killed between the two) and whose process is gone by the time a new keeper looks is told
by it: with the mark, its process was made and ran (it ended unseen: exit status unknown,
never run again); without, it never started. A job that ran and ended before the next
keeper came ran twice (tester h135)."""


def start_mark(state_dir: str, key: str, ticks: int) -> str:
    """The path of the start mark of ``key``'s start begun at ``ticks`` (see STARTING)."""
    return os.path.join(state_dir, STARTING, f"{key}.{ticks}")


COMPACT_BYTES = 1 << 20
"""A journal is compacted as it runs once it is this big (and 4x its live entries)."""

INTENT, RUNNING, EXITED = "intent", "running", "exited"


class Entry:
    """What the journal says about one key."""

    __slots__ = (
        "code",
        "ended_at",
        "intent_ticks",
        "kill_at",
        "log_dropped",
        "max_log",
        "pid",
        "state",
        "ticks",
        "timed_out",
        "timeout_at",
        "timeout_grace",
    )

    def __init__(self, state: str) -> None:
        self.state = state
        self.pid: int | None = None
        self.ticks: int | None = None
        self.code: int | None = None
        self.ended_at: float | None = None  # when the launcher saw it end (wall clock)
        self.kill_at: float | None = None
        self.intent_ticks = 0
        self.max_log = 0  # its log's cap in bytes (0: none)
        self.log_dropped = 0  # the output its log's cuts dropped, in all
        self.timeout_at: float | None = None  # its --timeout, kept while no engine runs
        self.timeout_grace = 0.0
        self.timed_out = False  # the spawner stopped it for its timeout

    def __repr__(self) -> str:
        return f"Entry({self.state}, pid={self.pid}, code={self.code})"


def boot_ticks() -> int:
    """Now, in the clock ticks /proc uses for start times (since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def replay(path: str) -> dict[str, Entry]:
    """The journal's last word on every key that the engine has not acknowledged."""
    entries: dict[str, Entry] = {}
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return entries
    for raw in data.split(b"\n")[:-1]:  # the last piece has no newline: ignore it
        fields = raw.decode("utf-8", "replace").split(" ")
        try:
            _apply(entries, fields)
        except (IndexError, ValueError):
            continue  # a damaged line says nothing
    return entries


def _apply(entries: dict[str, Entry], fields: list[str]) -> None:
    op, key = fields[0], fields[1]
    if op == "S":
        entry = entries[key] = Entry(INTENT)
        entry.intent_ticks = int(fields[2])
    elif op == "P":
        entry = entries.setdefault(key, Entry(RUNNING))
        entry.state, entry.pid, entry.ticks = RUNNING, int(fields[2]), int(fields[3])
        # (a line written before the cap was kept has no fifth field)
        entry.max_log = int(fields[4]) if len(fields) > 4 and fields[4] != "-" else 0
        if len(fields) > 6 and fields[5] != "-":
            entry.timeout_at, entry.timeout_grace = float(fields[5]), float(fields[6])
    elif op == "E":
        entry = entries.setdefault(key, Entry(EXITED))
        entry.state = EXITED
        entry.code = None if fields[2] == "-" else int(fields[2])
        # (a line written before the time was kept has no fourth field)
        entry.ended_at = float(fields[3]) if len(fields) > 3 and fields[3] != "-" else None
        entry.log_dropped = int(fields[4]) if len(fields) > 4 and fields[4] != "-" else 0
    elif op == "K":
        if key in entries:
            entries[key].kill_at = float(fields[2])
            if len(fields) > 3 and fields[3] == "T":
                entries[key].timed_out = True
    elif op == "L":
        if key in entries:
            entries[key].max_log = int(fields[2])
    elif op in ("F", "N", "A"):
        entries.pop(key, None)


def line(*fields: object) -> bytes:
    """One journal line (trailing fields that are ``None`` left off: optional ones)."""
    count = len(fields)
    while count > 2 and fields[count - 1] is None:
        count -= 1
    return (" ".join("-" if f is None else str(f) for f in fields[:count]) + "\n").encode()


def entry_lines(key: str, entry: Entry) -> bytes:
    """The lines that say ``entry`` again (for compaction)."""
    out = b""
    if entry.state == INTENT:
        return line("S", key, entry.intent_ticks)
    if entry.pid is not None:
        out += line(
            "P",
            key,
            entry.pid,
            entry.ticks or 0,
            entry.max_log or None,
            entry.timeout_at,
            None if entry.timeout_at is None else entry.timeout_grace,
        )
    if entry.kill_at is not None:
        out += line("K", key, entry.kill_at, "T" if entry.timed_out else None)
    if entry.state == EXITED:
        out += line("E", key, entry.code, entry.ended_at, entry.log_dropped or None)
    return out


class Journal:
    """The writer side (only the spawner writes; the keeper only reads).

    Args:
        path: The journal file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = self._open(path)
        self.compacted_size = os.fstat(self._fd).st_size
        """Its size right after the last compaction (what the live entries take)."""
        self.problem: str | None = None
        """Why the last write did not go through (``None`` once one has)."""
        # Lines not written yet (a full disk), in order: written before the next one.
        # (A line a killed writer left without its newline is not ended here: the
        # spawner compacts the journal as it starts, before writing anything.)
        self._pending = b""

    @staticmethod
    def _open(path: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(path, flags, 0o600)

    @property
    def pending(self) -> int:
        """Bytes kept in memory that the file has not taken yet."""
        return len(self._pending)

    def write(self, *fields: object, required: bool = False) -> bool:
        """Append one line (a single write: all of it, or nothing usable).

        Returns False when the file did not take it (a full disk): the line is kept, in
        order, and written before the next one or by :meth:`flush`. A ``required`` line
        (an intent, which must be in the file before what it announces is done) is not
        kept: nothing of it was written (or, cut short, its rest follows as above)."""
        if required and not self.flush():
            return False
        data = self._pending + line(*fields)
        self._pending = b""
        if self._put(data):
            return True
        if required and len(self._pending) == len(data):
            self._pending = b""
        return False

    def flush(self) -> bool:
        """Write what waits; True when nothing waits any more."""
        if not self._pending:
            return True
        data, self._pending = self._pending, b""
        return self._put(data)

    def _put(self, data: bytes) -> bool:
        try:
            done = os.write(self._fd, data)
        except OSError as err:
            self._pending, self.problem = data, err.strerror or str(err)
            return False
        if done < len(data):  # (the disk filled during the write: its rest waits)
            self._pending, self.problem = data[done:], "a write was cut short"
            return False
        self.problem = None
        return True

    def moved(self) -> bool:
        """Whether its path no longer names the file it writes (removed or replaced)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        own = os.fstat(self._fd)
        return (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino)

    def wants_compaction(self) -> bool:
        """Whether the file has grown well past what its live entries take.

        Every job adds about 80 bytes that only a compaction takes back; a spawner
        compacted only as it started, and one serving for months grew its journal
        without bound (4 MB at 50,000 jobs, tester h76), each replay reading all of it.
        """
        return not self._pending and self.size() >= max(COMPACT_BYTES, 4 * self.compacted_size)

    def size(self) -> int:
        """Bytes in the file now."""
        return os.fstat(self._fd).st_size

    def compact(self, entries: dict[str, Entry]) -> None:
        """Rewrite the journal with only ``entries``, atomically (the old file stays whole
        until the new one is, so a reader sees one or the other; a full disk raises
        ``OSError`` and changes nothing)."""
        tmp = f"{self.path}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        data = b"".join(entry_lines(k, e) for k, e in entries.items())
        fd = os.open(tmp, flags, 0o600)
        try:
            view = memoryview(data)
            while view:  # (a short write is a full disk: the rest would be lost)
                done = os.write(fd, view)
                if done == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
                view = view[done:]
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = self._open(self.path)
        self._pending = b""  # (what waited is in what was written: ``entries`` knows it)
        self.problem = None
        self.compacted_size = len(data)

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)
