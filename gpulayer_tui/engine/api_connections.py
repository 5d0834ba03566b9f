"""Connections to the engine's socket, counted per uid as they are accepted.

Each connection holds one of the engine's file descriptors. The per-uid limits on requests
(``[limits] submissions_in_flight``, ``streams_per_user``) bound what a user's connections
*do*, not how many it holds: a user listed in ``[security]`` that opened a thousand
connections, each with a ``wait`` on a running job or a log answer it never read, used up
the engine's descriptors and every other user, the engine's own included, got no answer
(tester h128). So each uid may hold at most ``[limits] connections_per_user`` at once; a
connection past that is answered 429 at once, naming the limit, and closed, before any of
its request is read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from .access import user_name

log = logging.getLogger(__name__)

_PEERCRED = "iII"  # struct ucred: pid_t pid; uid_t uid; gid_t gid

REFUSED_LOG_EVERY_S = 60.0
"""A uid's refused connections are logged at most once in this many seconds (with how
many there were since)."""


def socket_uid(transport: asyncio.BaseTransport) -> int | None:
    """The uid of the process at the other end of a Unix socket's ``transport``."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(_PEERCRED))
    except OSError:
        return None
    return int(struct.unpack(_PEERCRED, raw)[1])


class ConnectionCount:
    """Open connections per uid, and the refusals of those past the limit.

    Args:
        limit: Reads ``[limits] connections_per_user`` from the live configuration.
    """

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self.open: dict[int | None, int] = {}
        self.refused = 0
        self._said: dict[int | None, tuple[float, int]] = {}  # uid -> (logged at, since)

    def admit(self, uid: int | None) -> str | None:
        """Count a new connection of ``uid``; ``None``, or why it is refused (not
        counted)."""
        count, limit = self.open.get(uid, 0), self._limit()
        if count < limit:
            self.open[uid] = count + 1
            return None
        self.refused += 1
        who = user_name(uid) if uid is not None else "this caller"
        why = (
            f"{who} has {count} connections open to the engine, the most [limits] "
            f"connections_per_user = {limit} allows; close some (each waiting `wait`, "
            "followed log and unread answer holds one)"
        )
        now = time.monotonic()
        at, since = self._said.get(uid, (-REFUSED_LOG_EVERY_S, 0))
        if now - at >= REFUSED_LOG_EVERY_S:
            more = f" ({since} more refused since the last note)" if since else ""
            log.warning("connection refused: %s%s", why, more)
            self._said[uid] = (now, 0)
        else:
            self._said[uid] = (at, since + 1)
        return why

    def release(self, uid: int | None) -> None:
        """A counted connection of ``uid`` closed."""
        left = self.open.get(uid, 0) - 1
        if left > 0:
            self.open[uid] = left
        else:
            self.open.pop(uid, None)


def _refusal(why: str) -> bytes:
    body = json.dumps({"error": why}).encode()
    head = (
        "HTTP/1.1 429 Too Many Requests\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        "Retry-After: 5\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _CountedHandler(RequestHandler):
    """aiohttp's protocol for one connection, counted against its uid."""

    __slots__ = ("_count", "_counted", "_uid")

    def __init__(self, count: ConnectionCount, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._count = count
        self._counted = False
        self._uid: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._uid = socket_uid(transport)
        why = self._count.admit(self._uid)
        if why is None:
            self._counted = True
            return
        # (Before a byte of the request is read: a small answer the socket's buffer
        # takes at once, so the close that follows does not wait on the client.)
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_refusal(why))
        transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._count.release(self._uid)
        super().connection_lost(exc)


class CountedSocketSite(web.SockSite):
    """A :class:`aiohttp.web.SockSite` whose connections are counted per uid."""

    __slots__ = ("_count",)

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, count: ConnectionCount, backlog: int
    ) -> None:
        super().__init__(runner, sock, backlog=backlog)
        self._count = count

    async def start(self) -> None:
        """Serve on the socket (as :meth:`aiohttp.web.SockSite.start`, each connection's
        protocol counted)."""
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        count = self._count

        def protocol() -> RequestHandler:
            # (aiohttp's Server() does the same with the runner's settings, which it
            # keeps in _kwargs: the keep-alive and header limits apply as they did)
            return _CountedHandler(count, server, loop=server._loop, **server._kwargs)

        self._server = await asyncio.get_running_loop().create_unix_server(
            protocol, sock=self._sock, backlog=self._backlog
        )
