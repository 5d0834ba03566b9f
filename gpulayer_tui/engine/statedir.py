"""Is the state dir safe to use? Checked before the engine writes anything there.

The engine writes its lock, database, socket and every job's log into the state dir,
often as root on a shared box. If another user controls that directory, or any directory
above it, they can put symlinks where those files go and make the engine truncate,
overwrite or append to files they could not touch themselves (or swap the directory for
another between a check and a use). So, as OpenSSH's StrictModes does for ``~/.ssh``:

* the state dir and ``jobs/`` are real directories owned by the engine's user and
  writable by no one else;
* every directory above the state dir is owned by the engine's user or root, and
  writable by no one else unless it is sticky (like ``/tmp``, where only an entry's owner
  may rename or remove it).

Files inside are then as trusted as the directory; they are opened with ``O_NOFOLLOW``
anyway where the engine creates them (lock, logs, the launcher's files).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import StoreError


class UnsafeStateDir(StoreError):
    """The state dir, ``jobs/`` or a directory above them could be changed by another
    user; the engine refuses to start (exit code 2) and says which and why."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_state_dir(state_dir: Path, jobs_dir: Path) -> None:
    """Refuse a state dir another user could change (see the module's docstring).

    Raises:
        UnsafeStateDir: Naming the directory and what is wrong with it.
    """
    me = os.geteuid()
    for path in (state_dir, jobs_dir):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) and path == jobs_dir:
            raise UnsafeStateDir(
                f"{path} is a symlink; the engine keeps job logs only in a real directory"
            )
        info = os.stat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafeStateDir(f"{path} is not a directory")
        if info.st_uid != me:
            raise UnsafeStateDir(
                f"{path} belongs to {_owner(info.st_uid)}, not to {_owner(me)} who runs the "
                "engine: another user could put links there to files the engine would "
                "overwrite. Use a state dir of your own (GPULAYER_HOME) or chown it to "
                f"{_owner(me)}."
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeStateDir(
                f"{path} is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'}"
                f" (mode {stat.S_IMODE(info.st_mode):04o}); the engine needs it writable by "
                f"{_owner(me)} alone: chmod 700 {path}"
            )
    real = Path(os.path.realpath(state_dir))
    for parent in real.parents:
        info = os.stat(parent)
        if info.st_uid not in (0, me):
            raise UnsafeStateDir(
                f"{parent}, above the state dir {state_dir}, belongs to {_owner(info.st_uid)}: "
                "they could swap the state dir for another. Use a state dir under a "
                f"directory that {_owner(me)} or root owns."
            )
        sticky = bool(info.st_mode & stat.S_ISVTX)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
            raise UnsafeStateDir(
                f"{parent}, above the state dir {state_dir}, is writable by others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}, not sticky): they could swap the "
                "state dir for another."
            )
