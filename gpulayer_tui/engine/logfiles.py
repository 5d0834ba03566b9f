"""Job logs for the launcher: opened never through a symlink, and created ahead of need.

Creating a file costs the filesystem an inode. On this project's ext4 test machines that
took 5 to 290 us per file, changing from run to run (bench/before_after.md), on the path from a
job's start request to its process. Linking a file that already exists into the directory
takes 7-8 us, steadily. So the spawner keeps a few unnamed files (``O_TMPFILE``) in the
logs' directory, made while it has nothing else to do, and gives a first start one of
them under the log's name (``linkat``). An unnamed file that is never used vanishes with
its descriptor: nothing is left behind by a crash. Where the filesystem cannot make them
(``O_TMPFILE`` is not everywhere), logs are created as before.

Stdlib only: the launcher imports it and must start fast.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable

SPARE = 4  # unnamed files kept ready: a burst of starts in one request round uses several
RETRY_S = 60.0  # after the filesystem refused one, try again this much later
_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # read-write: a cut reads the end back


def open_log(path: str, fresh: bool, say: Callable[[str], None]) -> int:
    """The job's log, never through a symlink; a first start never appends to an old file
    (one that is there already is set aside, and ``say`` tells so).

    Raises:
        OSError: It cannot be created (the message names why: a directory, a symlink,
            a full disk, no permission).
    """
    flags = _FLAGS | os.O_CREAT | os.O_NOFOLLOW
    if not fresh:
        return os.open(path, flags, 0o600)
    try:
        return os.open(path, flags | os.O_EXCL, 0o600)
    except FileExistsError:
        _set_aside(path, say)
        return os.open(path, flags | os.O_EXCL, 0o600)


def _set_aside(path: str, say: Callable[[str], None]) -> None:
    """``path`` is there before a first start: keep a regular file aside (an id used before
    the journal existed) rather than mix two jobs' output; refuse anything else.

    Raises:
        OSError: A directory, a symlink or other non-regular file is at ``path``.
    """
    mode = os.lstat(path).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if not stat.S_ISREG(mode):
        raise OSError(errno.ELOOP, f"not a regular file ({kind_of(mode)})", path)
    os.replace(path, f"{path}.old-{int(time.time())}")
    say(f"{path} was there before its first start: kept aside as .old-*")


class LogFiles:
    """Opens job logs (:func:`open_log`), first starts' from a few files made ahead.

    Args:
        say: Where a note goes (the spawner's log), e.g. a log file set aside.
    """

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.directory: str | None = None  # where the spare files lie (the logs' directory)
        self.spare: list[int] = []
        self.refused_at = -RETRY_S  # (monotonic) when the filesystem last refused one
        self._proc_fd: int | None = None  # /proc/self/fd, to link a descriptor by name

    def open(self, path: str, fresh: bool) -> int:
        """Open ``path`` as :func:`open_log` does; a first start takes a spare file.

        Raises:
            OSError: As :func:`open_log`.
        """
        directory = os.path.dirname(path)
        if fresh and self.spare and directory == self.directory:
            fd = self.spare.pop()
            try:
                # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N names the unnamed file; like
                # O_EXCL it fails if anything, a symlink included, has the name already.
                os.link(str(fd), path, src_dir_fd=self._proc_fd, follow_symlinks=True)
            except OSError:
                self.spare.append(fd)  # still unnamed: kept for the next start
                return open_log(path, fresh, self.say)  # (it finds what is in the way)
            os.utime(fd)  # made ahead: its times are this start's
            return fd
        if fresh and directory != self.directory:
            self._drop()
            self.directory = directory  # made ahead from now on
        return open_log(path, fresh, self.say)

    def wanted(self) -> bool:
        """Should a spare file be made while the spawner has nothing else to do?"""
        return (
            self.directory is not None
            and len(self.spare) < SPARE
            and time.monotonic() - self.refused_at >= RETRY_S
        )

    def make_one(self) -> None:
        """Make one spare file (the spawner calls this when idle)."""
        assert self.directory is not None
        try:
            if self._proc_fd is None:
                self._proc_fd = os.open(
                    "/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                )
            self.spare.append(os.open(self.directory, _FLAGS | os.O_TMPFILE, 0o600))
        except OSError:
            # Not supported here (EOPNOTSUPP; EISDIR from old kernels), a full disk, the
            # directory gone: logs are created at each start, as without spare files.
            self.refused_at = time.monotonic()

    def close(self) -> None:
        """Close the spare files (they vanish: they have no name)."""
        self._drop()
        if self._proc_fd is not None:
            os.close(self._proc_fd)
            self._proc_fd = None

    def _drop(self) -> None:
        for fd in self.spare:
            os.close(fd)
        self.spare.clear()


NOTE_START = b"[gpulayer-tui: this log passed "
"""How the note a cut log starts with begins."""


def cut_note(max_log: int, dropped_output: int, kept: int) -> bytes:
    """The first line of a log cut back to its end. ``dropped_output``: the job's output
    bytes dropped by every cut so far, so a reader can tell where in the job's whole
    output the kept part starts (its offsets stay true across cuts)."""
    return (
        f"[gpulayer-tui: this log passed {max_log} bytes ([logs] max_bytes); its first "
        f"{dropped_output} bytes of output were dropped, {kept} kept at this cut]\n"
    ).encode()


CUT_MARK = "user.gpulayer-tui.cut"
"""An extended attribute set on a log the launcher has cut: only then is a note at its
start read as one (a job that printed another log, `cat jobs/45.log`, began with a note
of its own, and its offsets and counts were taken from it)."""


def mark_cut(fd: int) -> None:
    """Mark the log open on ``fd`` as cut (where the filesystem keeps user attributes)."""
    with contextlib.suppress(OSError):
        os.setxattr(fd, CUT_MARK, b"1")


def unmark_cut(fd: int) -> None:
    """Take back :func:`mark_cut` (a cut that did not happen)."""
    with contextlib.suppress(OSError):
        os.removexattr(fd, CUT_MARK)


def note_of(fd: int) -> tuple[int, int]:
    """:func:`read_note` of the log open on ``fd``, trusted only if the launcher marked
    it cut (or the filesystem keeps no such marks: then its text decides)."""
    head = head_of(fd)
    return read_note(head) if head else (0, 0)


def head_of(fd: int) -> bytes | None:
    """The note a log open on ``fd`` starts with (``b""``: never cut), or ``None`` while
    a cut is under way: the launcher marked it, and its first blocks are gone but the
    note is not written yet. A reader reads this before and after what it reads and
    goes on only if both are the same and not ``None``: a cut in between moved the
    output under it (each cut's note counts more bytes dropped, so no two are alike)."""
    try:
        os.getxattr(fd, CUT_MARK)
    except OSError as err:
        if err.errno == errno.ENODATA:
            return b""  # (never cut: whatever it starts with is the job's output)
        marked = False  # (no user attributes here: the text decides)
    else:
        marked = True
    head = os.pread(fd, NOTE_READ, 0)
    note = read_note(head)[1]
    if note:
        return head[:note]
    return None if marked and head else b""


NOTE_READ = 1024
"""Bytes to read from a log's start for :func:`read_note` (a note padded to the end of
the line it was written over is longer than its text)."""


def read_note(head: bytes) -> tuple[int, int]:
    """``(dropped_output, note_len)`` of a log starting with ``head`` (its first bytes);
    ``(0, 0)`` for a log never cut. A note written by an earlier version (its count
    took in the notes before it) is read the same way."""
    if not head.startswith(NOTE_START):
        return 0, 0
    end = head.find(b"\n")
    marker = head.find(b"; its first ", 0, end)
    if end < 0 or marker < 0:
        return 0, 0
    digits = head[marker + len(b"; its first ") :].split(b" ", 1)[0]
    if not digits.isdigit():
        return 0, 0
    return int(digits), end + 1


def highest_log_id(jobs_dir: os.PathLike[str] | str) -> int:
    """The largest job id with a log in ``jobs_dir`` (``7.log``, ``7.1.log``, set-aside
    ``7.log.old-*``); 0 if none, or if the folder cannot be read."""
    best = 0
    try:
        with os.scandir(jobs_dir) as entries:
            for entry in entries:
                head = entry.name.split(".", 1)[0]
                if head.isascii() and head.isdigit() and ".log" in entry.name:
                    best = max(best, int(head))
    except OSError:
        return 0
    return best


def kind_of(mode: int) -> str:
    """What kind of file ``mode`` (an ``lstat``'s) is, in words: "a symbolic link", "a
    regular file", "a folder", "a FIFO", "a socket" or "a device"."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"
