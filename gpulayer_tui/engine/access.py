"""Who may use the engine: peer credentials of socket callers and the ``[security]`` rules.

Every request's peer is read with ``SO_PEERCRED`` on the Unix socket. The engine's own user
and root may do everything; uids and groups listed in ``[security]`` may use the API but
cancel only their own jobs, and may not drain, release or reload; anyone else is refused.
"""

from __future__ import annotations

import os
import pwd
import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

    from ..wire import JobJSON
    from .config import SecuritySettings


class Forbidden(RuntimeError):
    """This caller may not do this (403); the message names the uid and the rule."""


_PEERCRED = "iII"  # struct ucred: pid_t pid; uid_t uid; gid_t gid


def peer_creds(request: web.Request) -> tuple[int, int, int] | None:
    """``(pid, uid, gid)`` of the connecting process, from ``SO_PEERCRED``."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(_PEERCRED))
    pid, uid, gid = struct.unpack(_PEERCRED, raw)
    return int(pid), int(uid), int(gid)


def peer_uid(request: web.Request) -> int | None:
    """The connecting process's uid, from ``SO_PEERCRED`` on the Unix socket."""
    creds = peer_creds(request)
    return creds[1] if creds is not None else None


def user_name(uid: int) -> str:
    """``uid 1000 (ana)``, or ``uid 1000`` where the user database has no name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


GROUPS_CACHE_S = 10.0
"""How long a user's groups, as the user database has them, are taken as read (the
database may be a network service; an edit to it applies within this)."""

_groups_read: dict[int, tuple[float, frozenset[int]]] = {}


def user_groups(uid: int) -> frozenset[int]:
    """``uid``'s groups as the user database has them (its primary group and those that
    list it); none for a uid it does not know.

    Not the connecting process's own groups, read from ``/proc/PID/status`` as this did:
    that pid, recorded at connect time, may be another process's by the time a request
    is read (a connection handed to a child, its parent gone and the pid reused by a
    member of an allowed group let an unlisted user in: tester h155). And the same rule
    as for a waiting job's owner (:class:`OwnerAccess`), which has no process to ask.
    """
    import time

    now = time.monotonic()
    cached = _groups_read.get(uid)
    if cached is not None and now - cached[0] < GROUPS_CACHE_S:
        return cached[1]
    try:
        user = pwd.getpwuid(uid)
        groups = frozenset(os.getgrouplist(user.pw_name, user.pw_gid))
    except (KeyError, OSError):
        groups = frozenset()
    if len(_groups_read) > 1024:
        _groups_read.clear()
    _groups_read[uid] = (now, groups)
    return groups


def is_admin(uid: int | None) -> bool:
    """The engine's own user and root may do everything (jobs run as the engine's user)."""
    return uid is not None and uid in (0, os.geteuid())


def access_refusal(security: SecuritySettings, creds: tuple[int, int, int] | None) -> str | None:
    """Why this peer may not use the engine at all, or ``None`` if it may."""
    if creds is None:
        return "the caller cannot be identified (SO_PEERCRED works on the Unix socket only)"
    _pid, uid, _gid = creds
    if is_admin(uid) or uid in security.allowed_uids:
        return None
    if security.allowed_groups and user_groups(uid) & security.group_ids():
        return None
    return (
        f"{user_name(uid)} may not use this engine: it serves {user_name(os.geteuid())}; "
        "list the uid in [security] allowed_uids, or one of its groups in allowed_groups, "
        "of the engine's config.toml"
    )


class OwnerAccess:
    """Whether the owner of a waiting job may still use the engine, by ``[security]`` as
    it is now (answers cached per uid for this config; the user and group databases are
    read once each). A job of a user taken out of ``allowed_uids`` / ``allowed_groups``
    is held, not started: it ran later as the engine's user, without a word (tester h65).

    Args:
        security: The ``[security]`` settings in force.
    """

    def __init__(self, security: SecuritySettings) -> None:
        self._security = security
        self._gids = security.group_ids() if security.allowed_groups else frozenset()
        # uid -> (when answered, the answer): kept for GROUPS_CACHE_S, as the groups it
        # read are (kept for the config's life, a user taken out of an allowed group had
        # its waiting job started 30 s later: tester h161)
        self._said: dict[int, tuple[float, str | None]] = {}

    def refusal(self, uid: int) -> str | None:
        """Why ``uid``'s waiting jobs are held (it is no longer let in), or ``None``."""
        import time

        now = time.monotonic()
        said = self._said.get(uid)
        if said is None or (self._gids and now - said[0] >= GROUPS_CACHE_S):
            said = self._said[uid] = (now, self._refusal(uid))
        return said[1]

    def _refusal(self, uid: int) -> str | None:
        if is_admin(uid) or uid in self._security.allowed_uids:
            return None
        if self._gids and user_groups(uid) & self._gids:
            return None
        return (
            f"held: its owner, {user_name(uid)}, may no longer use this engine ([security]); "
            "it starts once they are let in again (cancel it otherwise)"
        )


HIDDEN = "(hidden)"  # what an environment value reads as where it is not shown


def env_values_hidden(job: JobJSON) -> JobJSON:
    """``job`` with every environment value replaced by :data:`HIDDEN` (names kept): what
    leaves the machine's users, such as a notification, never carries tokens or keys."""
    env = job["spec"].get("env")
    if not env:
        return job
    return {**job, "spec": dict(job["spec"], env=dict.fromkeys(env, HIDDEN))}
