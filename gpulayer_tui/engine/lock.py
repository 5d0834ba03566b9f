"""One engine per state dir: an ``fcntl.flock`` on ``engine.lock`` holding the owner's pid,
and an abstract Unix socket name of the state dir's own, which no file removal touches."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import struct
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

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._claim is not None:
            self._claim.close()
            self._claim = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
