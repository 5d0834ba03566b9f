"""Unix socket paths of any length (stdlib only: the CLI, the engine and the launcher use it).

``sun_path`` holds 108 bytes, and a state dir can be deeper than that (a project's own
``GPULAYER_HOME``, a long home directory). A long path is reached through the directory,
held open, as ``/proc/self/fd/N/NAME``: the kernel resolves that to the same socket file,
so binding and connecting work whatever the directory's length.
"""

from __future__ import annotations

import os

SHORT_ENOUGH = 100  # bytes, under sun_path's 108 with room for the terminating NUL


class SocketPath:
    """A socket's address that fits ``sun_path``; use as a context manager around the
    ``bind`` or ``connect`` (or keep it while a connector may connect again).

    Raises:
        OSError: The directory of a long path cannot be opened (FileNotFoundError when
            it does not exist, as a connect would say).
    """

    def __init__(self, full: str | os.PathLike[str]) -> None:
        full = os.fspath(full)
        self.fd: int | None = None
        if len(os.fsencode(full)) < SHORT_ENOUGH:
            self.path = full
            return
        directory, name = os.path.split(full)
        self.fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.path = f"/proc/self/fd/{self.fd}/{name}"

    def close(self) -> None:
        """Let go of the directory (once bound or connected)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> SocketPath:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
