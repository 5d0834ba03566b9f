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
  may rename or remove it);
* every symlink on the way to it is the engine's user's or root's: one of another user's
  in ``/tmp`` is theirs to point elsewhere at any time (tester h155). The path is walked
  as the kernel resolves it (:mod:`gpulayer_tui.pathwalk`), each directory met checked as above, not
  only those above its ``realpath``, which hides the links.

Files inside are then as trusted as the directory; they are opened with ``O_NOFOLLOW``
anyway where the engine creates them (lock, logs, the launcher's files).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from ..pathwalk import owner_name as _owner
from ..pathwalk import walk
from .errors import StoreError

if TYPE_CHECKING:
    from .lock import EngineLock
    from .paths import Paths


class UnsafeStateDir(StoreError):
    """The state dir, ``jobs/`` or a directory above them could be changed by another
    user; the engine refuses to start (exit code 2) and says which and why."""


def check_state_dir(state_dir: Path, jobs_dir: Path) -> None:
    """Refuse a state dir another user could change (see the module's docstring).

    Raises:
        UnsafeStateDir: Naming the directory and what is wrong with it.
    """
    me = os.geteuid()
    _check_the_way(state_dir, me)
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


def _check_the_way(state_dir: Path, me: int) -> None:
    """Refuse a symlink or a directory on the way to ``state_dir`` another user controls."""
    real = os.path.realpath(state_dir)
    for where, info in walk(os.fspath(state_dir)):
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (0, me):
                raise UnsafeStateDir(
                    f"{where}, on the way to the state dir {state_dir}, is a symlink that "
                    f"belongs to {_owner(info.st_uid)}: they could point it at another "
                    "directory at any time. Use a state dir whose path has no link of "
                    "another user's in it."
                )
            continue
        if where == real:
            continue  # (the state dir itself: see check_state_dir)
        parent = Path(where)
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


def claim_state_dir(paths: Paths, lock: EngineLock) -> None:
    """Make the state dir and ``jobs/`` if need be, check them, then take the engine's lock.

    ``--serve`` calls it before it imports the rest of the engine (0.7-1.5 s on a loaded
    2-core box), so that from its first instant a CLI call finds the lock held and waits
    for the engine instead of saying none is serving (tester h113).

    Raises:
        EngineBusy: Another engine serves this state dir.
        StoreError: The state dir cannot be written, or is unsafe (:class:`UnsafeStateDir`).
    """
    state = paths.state_dir
    try:
        # (first: a link of another user's where the state dir goes was said "cannot be
        # written: File exists" when it pointed nowhere, and taken when it did: h155)
        _check_the_way(state, os.geteuid())
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        # (the state dir itself before jobs/ is made there: one refused for its mode was
        # left with a jobs/ folder in it: tester h158)
        check_state_dir(state, state)
        paths.jobs_dir.mkdir(exist_ok=True, mode=0o700)
        # Before anything is written there: no other user may control these dirs.
        check_state_dir(state, paths.jobs_dir)
        os.chmod(state, 0o700)  # (the API opens it to 0711 if [security] lets others in)
        lock.acquire()
    except OSError as err:
        raise unwritable_state_dir(state, err) from None


def unwritable_state_dir(state: Path, err: OSError) -> StoreError:
    """The error for a state dir the engine could not write, naming the file and why."""
    if err.errno == errno.ELOOP:  # O_NOFOLLOW met a link
        why = f"{err.filename} is a symlink; the engine never writes through one"
    else:
        why = f"{err.strerror}" + (f" ({err.filename})" if err.filename else "")
        if err.errno in (errno.EACCES, errno.EPERM):
            why += _whose(state)
    return StoreError(f"the state dir {state} cannot be written: {why}")


def _whose(state: Path) -> str:
    """Whose the nearest existing directory of ``state`` (or above it) is, where it is
    another user's: "Permission denied (.../jobs)" named neither (tester h155)."""
    me = os.geteuid()
    for path in (state, *state.parents):
        try:
            owner = os.lstat(path).st_uid
        except OSError:
            continue
        if owner in (me, 0) and path != state:
            return ""
        if owner != me:
            return (
                f"; {path} belongs to {_owner(owner)}, not to {_owner(me)}: an engine serves "
                "the state dir of the user it runs as (set GPULAYER_HOME to one of yours, or "
                f"use {_owner(owner)}'s engine if its config lets you in)"
            )
        return ""
    return ""


def config_file_problem(path: Path) -> str | None:
    """Why the engine must not read the config file at ``path``, or None.

    A config runs commands as the engine's user (``[notify] command``) and decides who may
    use the engine (``[security]``): one another user can write, or replace, is theirs to
    run code as this one (tester h155: a ``--config`` file in ``/tmp`` of another user's,
    reloaded live). So, as for the state dir: the file is this user's or root's and
    writable by no one else (its group only where that group is this user's own private
    one), every directory on the way is this user's or root's and not writable by others
    unless sticky, and every symlink on the way is this user's or root's. A missing or
    unreadable file is for :func:`~.config.load_config` to say.
    """
    me = os.geteuid()
    try:
        way = walk(os.fspath(path))
        real = os.path.realpath(path)
    except OSError:
        return None
    for where, info in way:
        owner = info.st_uid
        if stat.S_ISLNK(info.st_mode):
            if owner not in (0, me):
                return (
                    f"{where}, on the way to the config file {path}, is a symlink that "
                    f"belongs to {_owner(owner)}: they could point it at a config of theirs, "
                    f"which runs commands as {_owner(me)} ([notify] command)"
                )
            continue
        if where == real:
            if not stat.S_ISREG(info.st_mode):
                return None  # (load_config says what it is)
            if owner not in (0, me):
                return (
                    f"the config file {path} belongs to {_owner(owner)}, not to {_owner(me)} "
                    f"who runs the engine: a config runs commands as {_owner(me)} ([notify] "
                    "command); the engine reads only one of its user's or root's (copy it to "
                    "a file of your own, or chown it)"
                )
            if info.st_mode & stat.S_IWOTH or (
                info.st_mode & stat.S_IWGRP and not _own_private_group(info.st_gid, me)
            ):
                who = "others" if info.st_mode & stat.S_IWOTH else "its group"
                return (
                    f"the config file {path} is writable by {who} (mode "
                    f"{stat.S_IMODE(info.st_mode):04o}): a config runs commands as "
                    f"{_owner(me)} ([notify] command): chmod go-w {path}"
                )
            continue
        if owner not in (0, me):
            return (
                f"{where}, above the config file {path}, belongs to {_owner(owner)}: they "
                "could replace the file with one of theirs"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return (
                f"{where}, above the config file {path}, is writable by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}, not sticky): they could replace the file "
                "with one of theirs"
            )
    return None


def _own_private_group(gid: int, uid: int) -> bool:
    """Whether ``gid`` is ``uid``'s own group alone (a user private group, as Debian makes
    for each user: its files are group-writable under umask 002, and safe)."""
    try:
        import grp
        import pwd

        user = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
    except (KeyError, ImportError):
        return False
    return (
        user.pw_gid == gid
        and group.gr_name == user.pw_name
        and not set(group.gr_mem) - {user.pw_name}
    )
