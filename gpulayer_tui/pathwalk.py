"""The directories and symlinks a path goes through, as the kernel resolves it.

A path is only as trusted as every entry on the way to it: a symlink another user owns,
in a sticky directory such as ``/tmp``, is theirs to point elsewhere at any time (tester
h155: a state dir reached through one was accepted, and later swapped for a directory of
theirs: the next ``submit`` sent its whole environment to their engine). ``realpath``
hides such a link; this walk sees each one.

Stdlib only: the CLI's light client uses it on every call.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_LINKS = 40  # (as the kernel's limit on links followed in one lookup)


class UntrustedLink(Exception):
    """A symlink on the way to a path belongs to a user other than this one or root."""


def walk(path: str) -> list[tuple[str, os.stat_result]]:
    """Each directory (the last component's too) and symlink met resolving ``path``,
    in order, with its ``lstat``; a symlink's target is walked in its place.

    It stops at the first component that does not exist: what is there so far.

    Raises:
        OSError: ELOOP past :data:`MAX_LINKS` links; what ``lstat`` raises but ENOENT.
    """
    seen: list[tuple[str, os.stat_result]] = []
    current = "/"
    seen.append((current, os.lstat(current)))
    # (the working directory only for a relative path: it may have been removed)
    pending = _parts(path if path.startswith("/") else os.path.join(os.getcwd(), path))
    links = 0
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            return seen
        seen.append((candidate, info))
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending = _parts(target) + pending
            continue
        current = candidate
    return seen


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def untrusted_link(path: str, uid: int | None = None) -> str | None:
    """Why a client of ``uid`` (default: this process's) must not use the state dir at
    ``path``, or None: a symlink on the way to it that neither ``uid`` nor root owns; or,
    for a state dir of another user's (a shared engine's), a directory on the way that
    someone else than root or that user controls, or where anyone may make a folder (a
    sticky ``/tmp``: one named as a victim's state dir was gone after a reboot, made by
    another user, and got the victim's jobs and environment: tester h161)."""
    me = os.geteuid() if uid is None else uid
    try:
        way = walk(path)
    except OSError as err:
        # (a link loop ended doctor, web and the TUI in a traceback: tester h161)
        return f"{path} cannot be followed: {err.strerror or err}"
    for where, info in way:
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, me):
            return (
                f"{where}, on the way to {path}, is a symlink that belongs to "
                f"{owner_name(info.st_uid)}: they can point it at another directory at any "
                "time (at one of their own, where an engine of theirs would get your jobs "
                "and their environment). Use a path with no link of another user's in it."
            )
    folders = [(where, info) for where, info in way if stat.S_ISDIR(info.st_mode)]
    if not folders or folders[-1][0] != os.path.realpath(path):
        return None  # (it does not exist: no engine serves it)
    owner = folders[-1][1].st_uid
    if owner in (0, me):
        return None
    for where, info in folders[:-1]:
        anyone = info.st_mode & stat.S_IWOTH
        if info.st_uid not in (0, owner) or anyone:
            why = (
                "where any user may make a folder"
                if anyone
                else f"which {owner_name(info.st_uid)} controls"
            )
            return (
                f"the state dir {path} is {owner_name(owner)}'s, in {where}, {why}: an "
                "engine there may be anyone's, and would get your jobs and their "
                f"environment. A shared engine's state dir goes under directories only "
                f"root or {owner_name(owner)} control (e.g. /srv/gpulayer)."
            )
    return None


def owner_name(uid: int) -> str:
    """A user's name, or ``uid N`` where it has none."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"
