"""One engine per state dir: an ``fcntl.flock`` on ``engine.lock`` holding the owner's pid,
and an abstract Unix socket name of the state dir's own, which no file removal touches."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import struct
import time
from pathlib import Path

STOPPING_WAIT_S = 10.0
"""How long a new engine waits for one that is stopping to let go of the lock (it took
under a second when measured; refused at once, an engine started a second after SIGTERM
to the last one left none running: tester h90)."""


class EngineBusy(RuntimeError):
    """Another engine already serves this state dir."""

    def __init__(self, state_dir: Path, pid: int | None, waited: float | None = None) -> None:
        who = f" (pid {pid})" if pid else ""
        if waited is not None:  # (it said it was stopping)
            message = (
                f"the engine serving {state_dir}{who} is stopping, and still held it after "
                f"{waited:g} s; try again once it has stopped"
            )
        else:
            message = (
                f"an engine is already serving {state_dir}{who}; the TUI and the CLI attach "
                "to it (stop it first to start another)"
            )
        super().__init__(message)
        self.pid = pid


def _lock_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def lock_holder(path: Path) -> int | None:
    """The pid recorded in a lock file, if any."""
    words = _lock_words(path)
    first = words[0] if words else ""
    return int(first) if first.isascii() and first.isdigit() else None


def holder_is_stopping(path: Path) -> bool:
    """True if the engine holding the lock file said it is stopping."""
    return _lock_words(path)[1:2] == ["stopping"]


def _claim_name(state_dir: Path) -> bytes:
    """The abstract socket name an engine holds for ``state_dir`` (its device and inode:
    this folder, whatever path reaches it)."""
    st = os.stat(state_dir)
    return f"\0gpulayer-tui-engine:{st.st_dev}:{st.st_ino}".encode()


def _claim_holder(name: bytes) -> int | None:
    """The pid of the engine holding ``name`` (``SO_PEERCRED`` of a connect), if known."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(name)
            raw = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
        except OSError:
            return None
    return int(struct.unpack("iII", raw)[0]) or None


class EngineLock:
    """The lock. The kernel drops both parts when the process dies, so a crash never
    leaves it stale.

    ``engine.lock`` alone did not keep a second engine out once the file was removed under
    a running one (a tmp cleaner, someone tidying the folder): two engines served one
    database, fought over the launcher, and the one stopped last took the other's socket
    with it. The abstract name lives exactly as long as its engine.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._claim: socket.socket | None = None

    def acquire(self, stopping_wait: float = STOPPING_WAIT_S) -> None:
        """Take the lock or raise :class:`EngineBusy`; an engine that holds it and said it
        is stopping is waited for, up to ``stopping_wait`` seconds (blocking)."""
        # Never through a symlink (it would truncate the link's target), and only a file.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", str(self.path))
        deadline = time.monotonic() + stopping_wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                stopping = holder_is_stopping(self.path)
                if not stopping or time.monotonic() >= deadline:
                    os.close(fd)
                    pid = lock_holder(self.path)
                    waited = stopping_wait if stopping else None
                    raise EngineBusy(self.path.parent, pid, waited) from None
                time.sleep(0.05)
        name = _claim_name(self.path.parent)
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # (not inherited)
        try:
            claim.bind(name)
            claim.listen(8)  # (never accepted: a connect only asks who holds it)
        except OSError as err:
            claim.close()
            os.close(fd)
            if err.errno == errno.EADDRINUSE:  # (its lock file was removed under it)
                raise EngineBusy(self.path.parent, _claim_holder(name)) from None
            raise
        self._claim = claim
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def is_held_elsewhere(self) -> bool:
        """True if some other process holds the lock now (used by clients): its file, or
        the state dir's name where the file was removed."""
        return self.holder() is not None

    def holder(self) -> int | None:
        """The pid of the engine holding the lock now (0 if held by a pid unknown), else
        ``None`` (used by clients)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return lock_holder(self.path) or 0
            finally:
                os.close(fd)
        try:
            return _claim_holder(_claim_name(self.path.parent))
        except OSError:  # (no state dir)
            return None

    def mark_stopping(self) -> None:
        """Say in the lock file that this engine is stopping: an engine started meanwhile
        waits for the lock rather than being refused."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()} stopping\n".encode(), 0)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._claim is not None:
            self._claim.close()
            self._claim = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
