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


def check_state_dir(state_dir: Path, jobs_dir: Path | None) -> None:
    """Refuse a state dir another user could change (see the module's docstring);
    ``jobs_dir`` None: the state dir alone (before ``jobs/`` is made there).

    Raises:
        UnsafeStateDir: Naming the directory and what is wrong with it.
    """
    me = os.geteuid()
    _check_the_way(state_dir, me)
    for path in (state_dir,) if jobs_dir is None else (state_dir, jobs_dir):
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
    problem = _way_problem(
        state_dir,
        me,
        "the state dir",
        linked="they could point it at another directory at any time. Use a state dir whose "
        "path has no link of another user's in it.",
        swapped="they could swap the state dir for another",
        owned_hint=f" Use a state dir under a directory that {_owner(me)} or root owns.",
    )
    if problem is not None:
        raise UnsafeStateDir(problem)


def _way_problem(
    path: Path, me: int, noun: str, linked: str, swapped: str, owned_hint: str = ""
) -> str | None:
    """What another user controls on the way to ``path`` (the state dir, or the config
    file: ``noun``), or None: a symlink of theirs, a directory above it that is theirs
    or that others may write and is not sticky. ``path`` itself is its caller's to check.
    The path is walked as the kernel resolves it (see the module's docstring)."""
    try:
        way = walk(os.fspath(path))
    except OSError as err:
        # (a link loop was said "is a symlink; the engine never writes through one")
        return f"{noun} {path} cannot be followed: {err.strerror or err}"
    real = os.path.realpath(path)
    for where, info in way:
        owner = info.st_uid
        if stat.S_ISLNK(info.st_mode):
            if owner not in (0, me):
                return (
                    f"{where}, on the way to {noun} {path}, is a symlink that belongs to "
                    f"{_owner(owner)}: {linked}"
                )
            continue
        if where == real:
            continue  # (the path itself: its caller's)
        if owner not in (0, me):
            return (
                f"{where}, above {noun} {path}, belongs to {_owner(owner)}: {swapped}.{owned_hint}"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return (
                f"{where}, above {noun} {path}, is writable by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}, not sticky): {swapped}."
            )
    return None


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
        check_state_dir(state, None)
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


class UntrustedConfig(StoreError):
    """The config file is one another user could write or replace (see
    :func:`read_trusted_config`); the message says which and how to fix it."""


CONFIG_MAX_BYTES = 1 << 20  # (a config is kilobytes: more is a mistake, not read whole)


def read_trusted_config(path: Path) -> bytes | None:
    """The config file's bytes, or None where there is none.

    A config runs commands as the engine's user (``[notify] command``) and decides who may
    use the engine (``[security]``): one another user can write, or replace, is theirs to
    run code as this one (tester h155: a ``--config`` file in ``/tmp`` of another user's,
    reloaded live). So, as for the state dir: every directory on the way is this user's or
    root's and not writable by others unless sticky, and every symlink on the way is this
    user's or root's; the file itself is this user's or root's, writable by no one else,
    by its mode bits and by its ACL alike (an ACL entry let another user write: tester
    h161). The file is checked as opened, and read from that one descriptor: checked by
    name and then read by name, another user's file made at that name in a sticky folder
    in between was read (tester h161).

    Raises:
        UntrustedConfig: Naming what another user controls.
        OSError: It cannot be opened or read (not a regular file: ``EINVAL``).
    """
    me = os.geteuid()
    _config_way(path, me)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        problem = _config_file_itself(path, info, fd, me)
        if problem is not None:
            raise UntrustedConfig(problem)
        os.set_blocking(fd, True)
        chunks = []
        size = 0
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > CONFIG_MAX_BYTES:
                raise OSError(errno.EFBIG, f"larger than {CONFIG_MAX_BYTES} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def config_file_problem(path: Path) -> str | None:
    """Why the engine would refuse the config file at ``path`` (see
    :func:`read_trusted_config`), or None (a missing file too)."""
    try:
        read_trusted_config(path)
    except UntrustedConfig as err:
        return str(err)
    except OSError:
        return None  # (load_config says what is wrong with it)
    return None


def _config_way(path: Path, me: int) -> None:
    """Refuse a symlink or a directory on the way to the config that another user
    controls (the file itself is checked as opened)."""
    problem = _way_problem(
        path,
        me,
        "the config file",
        linked=f"they could point it at a config of theirs, which runs commands as "
        f"{_owner(me)} ([notify] command)",
        swapped="they could replace the file with one of theirs",
    )
    if problem is not None:
        raise UntrustedConfig(problem)


def _config_file_itself(path: Path, info: os.stat_result, fd: int, me: int) -> str | None:
    owner = info.st_uid
    if owner not in (0, me):
        return (
            f"the config file {path} belongs to {_owner(owner)}, not to {_owner(me)} who "
            f"runs the engine: a config runs commands as {_owner(me)} ([notify] command); "
            "the engine reads only one of its user's or root's (copy it to a file of your "
            "own, or chown it)"
        )
    # (an ACL's named writers show only as group-write in the mode, its mask: said by
    # name, tester h161)
    writers = _acl_writers(fd)
    if writers:
        return (
            f"the config file {path} is writable by {', '.join(writers)} through its ACL: a "
            f"config runs commands as {_owner(me)} ([notify] command): setfacl -b {path}"
        )
    # (its group too, whatever the group: the exception made for a user's own private
    # group let in another user whose primary group it was: tester h161)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if info.st_mode & stat.S_IWOTH else "its group"
        return (
            f"the config file {path} is writable by {who} (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): a config runs commands as {_owner(me)} "
            f"([notify] command): chmod go-w {path}"
        )
    return None


_ACL_USER, _ACL_GROUP, _ACL_MASK = 0x02, 0x08, 0x10
_ACL_WRITE = 0x02


def _acl_writers(fd: int) -> list[str]:
    """Who the file's access ACL lets write it besides its owner: its named users and
    groups with the write bit, where the mask keeps it; none without an ACL."""
    try:
        raw = os.getxattr(fd, "system.posix_acl_access")
    except OSError:
        return []  # (no ACL, or a filesystem without them)
    mask = _ACL_WRITE
    named = []
    for at in range(4, len(raw) - 7, 8):  # (a 4-byte header, then 8-byte entries)
        tag = int.from_bytes(raw[at : at + 2], "little")
        perm = int.from_bytes(raw[at + 2 : at + 4], "little")
        ident = int.from_bytes(raw[at + 4 : at + 8], "little")
        if tag == _ACL_MASK:
            mask = perm
        elif tag in (_ACL_USER, _ACL_GROUP) and perm & _ACL_WRITE:
            named.append((tag, ident))
    if not mask & _ACL_WRITE:
        return []
    said = []
    for tag, ident in named:
        if tag == _ACL_USER:
            said.append(_owner(ident))
            continue
        try:
            import grp

            said.append(f"group {grp.getgrgid(ident).gr_name}")
        except (KeyError, ImportError):
            said.append(f"gid {ident}")
    return said
