"""Reading a job's log for the API: pieces at offsets in the job's whole output (true
across the launcher's cuts, see :mod:`.logfiles`), and where its last lines begin.

Every read opens the log without following links and without waiting, and counts only
if the log's note was the same before and after it (a cut moves the output under a
reader)."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .logfiles import head_of, read_note

LOG_CHUNK = 256 * 1024
"""The most bytes one read hands over."""

CUT_WAIT_S = 0.5
"""How long a log read waits for a cut under way to finish (see :func:`read_chunk`)."""

TAIL_BLOCK = 64 * 1024
"""Bytes read at a time, backwards, looking for the start of a log's last lines."""

_T = TypeVar("_T")


class LogUnreadable(Exception):
    """A job's log is not a file of ours to read (a symlink, a FIFO put in its place) or
    is gone though the job started (409)."""


@dataclass(frozen=True, slots=True)
class LogRead:
    """A piece of a job's log: ``data`` is ``note`` bytes of the cut note (when the
    output asked for was dropped), then the job's output from offset ``start``."""

    data: bytes
    start: int
    note: int = 0
    size: int | None = None  # the whole output's length when it was read (None: unknown)

    @property
    def end(self) -> int:
        """The output offset after this piece (where the next read starts)."""
        return self.start + len(self.data) - self.note


def read_chunk(path: Path, offset: int) -> LogRead:
    """Up to LOG_CHUNK bytes of the output from ``offset``: an offset in the job's whole
    output, as if its log were never cut (see :func:`.logfiles.read_note`). Output asked
    for that a cut dropped comes as the log's note, then what is kept. (Offsets into the
    file itself read as past its end after a cut, and the kept end was sent again and
    again: a TUI read it in a loop.) No log yet reads as empty.

    Raises:
        LogUnreadable: Its name is a symlink or something other than a file (opened
            without following links and without waiting: a FIFO there held a thread of
            the shared pool until someone wrote to it, and a few of them hung snapshots
            and other jobs' logs).
    """
    read = _while_uncut(path, lambda fd, head: _read_at(fd, offset, head))
    return LogRead(b"", offset) if read is None else read


def tail_start(path: Path, lines: int) -> int:
    """The output offset (as :func:`read_chunk` takes) where the log's last ``lines``
    lines begin: a last line without its newline counts as one, and ``0`` lines is the
    end. Lines reaching back past what a cut kept give 0 (the cut's note, then all that
    is kept). No log yet gives 0.

    Raises:
        LogUnreadable: As for :func:`read_chunk`.
    """
    return tail_span(path, lines)[0]


def tail_span(path: Path, lines: int) -> tuple[int, int]:
    """:func:`tail_start`, and the output offset of the log's end as those lines were
    found (where a read of just those lines stops: a fast writer's log grew past them
    before they were read, and `logs -n 2` printed thousands of lines: tester h186)."""
    span = _while_uncut(path, lambda fd, head: _tail_at(fd, lines, head))
    return (0, 0) if span is None else span


def _while_uncut(path: Path, read: Callable[[int, bytes], _T]) -> _T | None:
    """``read(fd, head)`` of the log at ``path`` while no cut is under way (None: no log)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LogUnreadable(f"{path.name} is a symbolic link; it is not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogUnreadable(f"{path.name} is not a regular file; it is not read")
        # A cut by the launcher moves the output under a reader: a read counts only if
        # the log's note was the same before and after it (logfiles.head_of). A cut is
        # microseconds; one that never finishes (its launcher died in it) is waited on
        # for CUT_WAIT_S, then the log is read as it is.
        deadline = time.monotonic() + CUT_WAIT_S
        while True:
            head = head_of(fd)
            if head is not None:
                result = read(fd, head)
                if head_of(fd) == head:
                    return result
            if time.monotonic() > deadline:
                return read(fd, b"")
            time.sleep(0.001)
    finally:
        os.close(fd)


def _read_at(fd: int, offset: int, head: bytes) -> LogRead:
    """:func:`read_chunk` of the log open on ``fd`` that starts with ``head`` (its note;
    empty if never cut)."""
    dropped, note = read_note(head)
    file_size = os.fstat(fd).st_size
    at = note + offset - dropped
    size = file_size - note + dropped
    if offset < dropped or at > file_size:
        # Dropped (or a file shorter than the offset: replaced): the note, then the
        # kept end. (Without a note: the file from its start.)
        return LogRead(os.pread(fd, LOG_CHUNK, 0), dropped, note, size)
    return LogRead(os.pread(fd, LOG_CHUNK, at), offset, 0, size)


def _tail_at(fd: int, lines: int, head: bytes) -> tuple[int, int]:
    """:func:`tail_span` of the log open on ``fd`` that starts with ``head``."""
    dropped, note = read_note(head)
    size = os.fstat(fd).st_size
    end_offset = max(size, note) - note + dropped
    if lines <= 0:
        return end_offset, end_offset
    found = 0
    end = size
    last_byte = True  # (a newline that ends the log ends its last line; it starts none)
    while end > note:
        at = max(note, end - TAIL_BLOCK)
        block = os.pread(fd, end - at, at)
        if not block:
            break  # (shorter than it said: cut back meanwhile; the reader asks again)
        search_to = len(block)
        if last_byte:
            last_byte = False
            if block.endswith(b"\n"):
                search_to -= 1
        while (newline := block.rfind(b"\n", 0, search_to)) >= 0:
            found += 1
            if found == lines:
                return at + newline + 1 - note + dropped, end_offset
            search_to = newline
        end = at
    return 0, end_offset
