"""One engine per state dir: an ``fcntl.flock`` on ``engine.lock`` holding the owner's pid."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path


class EngineBusy(RuntimeError):
    """Another engine already serves this state dir."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        who = f" (pid {pid})" if pid else ""
        super().__init__(
            f"an engine is already serving {state_dir}{who}; the TUI and the CLI attach to it "
            "(stop it first to start another)"
        )
        self.pid = pid


def lock_holder(path: Path) -> int | None:
    """The pid recorded in a lock file, if any."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() else None


class EngineLock:
    """The lock. The kernel drops it when the process dies, so a crash never leaves it stale."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`EngineBusy`."""
        # Never through a symlink (it would truncate the link's target), and only a file.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", str(self.path))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EngineBusy(self.path.parent, lock_holder(self.path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def is_held_elsewhere(self) -> bool:
        """True if some other process holds the lock now (used by clients)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
