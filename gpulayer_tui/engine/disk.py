"""The state dir's free space: below a floor, new jobs wait instead of filling the disk.

Logs live in the state dir, beside the database; a full disk would stop both the jobs'
output and the engine's writes. So while the filesystem has less than ``[logs]
min_free_mb`` free, the queue starts nothing and says why; running jobs go on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FULL_MB = 64  # below this a failed job's end says the disk may be why (see full_note)...
FULL_SHARE = 0.05  # ... when that is also under this share of the filesystem
CHECK_S = 1.0  # statvfs at most this often (the queue asks on every pass)...
NEAR = 2  # ... unless the last reading was under NEAR times the floor: then every pass


class DiskSpace:
    """Answers "may jobs start?" for the state dir's filesystem.

    Args:
        path: The state dir.
        min_free_mb: The floor (0: no floor).
    """

    def __init__(self, path: Path, min_free_mb: int) -> None:
        self.path = path
        self.min_free_mb = min_free_mb
        self._checked = 0.0
        self._reason: str | None = None
        self._near = False

    def free_mb(self) -> float | None:
        """Free space for an unprivileged writer, in MiB (``None``: cannot tell)."""
        return self._mb("f_bavail")

    def size_mb(self) -> float | None:
        """The size of the state dir's filesystem, in MiB (``None``: cannot tell)."""
        return self._mb("f_blocks")

    def _mb(self, blocks: str) -> float | None:
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        return int(getattr(st, blocks)) * st.f_frsize / 1024**2

    def forget(self) -> None:
        """Read the free space again at the next ask (something just took a lot of it: a
        snapshot's copy; a job started right after it on a disk below the floor)."""
        self._checked = 0.0
        self._near = True

    def blocker(self) -> str | None:
        """Why new jobs must wait for disk space now, or ``None``."""
        if not self.min_free_mb:
            return None
        now = time.monotonic()
        if self._near or now - self._checked >= CHECK_S:
            self._checked = now
            free = self.free_mb()
            self._reason = None
            # Close to the floor a second is long: a job writing fast, or another
            # program, can take what is left between two looks.
            self._near = free is not None and free < NEAR * self.min_free_mb
            if free is not None and free < self.min_free_mb:
                self._reason = (
                    f"waiting for disk space: {free:.0f} MiB free where gpulayer-tui keeps "
                    f"its state and logs ({self.path}), below [logs] min_free_mb = "
                    f"{self.min_free_mb}"
                )
                size = self.size_mb()
                if size is not None and size < self.min_free_mb:
                    # (a small filesystem: freeing space there never helps, and nothing
                    # said so; tester h53)
                    self._reason += (
                        f", more than the whole filesystem ({size:.0f} MiB): no job "
                        "starts until it is lowered"
                    )
        return self._reason

    def full_note(self, failed: bool = True) -> str | None:
        """What to add to a failed job's end when its log's disk is (nearly) full, or
        ``None``; with ``failed`` false, to any other end's, only when the disk is full:
        its log may lack output (a program that ignores its write errors completed with
        a log cut short and no word of it: tester h186).

        A job that fails for a full disk often cannot say so: its own "No space left on
        device" is the write that fails. So the engine says it (read when the job ends).
        """
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize / 1024**2
        size = st.f_blocks * st.f_frsize / 1024**2
        # (19 MiB free of a 20 MiB disk is not full: every failing job there was told its
        # writes failed for want of space.)
        full = free < FULL_MB and free < FULL_SHARE * size
        if not full and (free >= self.min_free_mb or not failed):
            return None
        note = f"the disk of its log ({self.path}) had {free:.0f} MiB free as it ended"
        if full and not failed:
            return f"{note}: its log may lack output ('No space left on device')"
        if full:
            return f"{note}: a write there may have failed with 'No space left on device'"
        return f"{note}, below [logs] min_free_mb = {self.min_free_mb}"
