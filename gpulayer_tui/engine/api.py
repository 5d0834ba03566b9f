"""HTTP+JSON API on the engine's Unix socket (aiohttp), plus an NDJSON event stream.

Routes (all under ``/v1``):

=======  ==========================  =====================================================
GET      /health                     engine identity, backend, capacity
GET      /gpus                       domains, latest sample, VRAM accounting, history
GET      /jobs?status=a,b&limit=N    job rows, newest first, and whether there are ``more``:
                                     ``before=ID``/``after=ID`` page by id, ``q=TEXT`` filters,
                                     ``sort=KEY&order=asc`` (+ ``offset=N``) sorts
POST     /jobs                       submit one spec, or ``{"jobs": [spec, ...]}`` at once;
                                     an ``Idempotency-Key`` header makes a retry return the
                                     first attempt's jobs
GET      /jobs/ID                    one job and its event timeline
POST     /jobs/ID/cancel             cancel (SIGTERM, SIGKILL after the grace period)
POST     /jobs/cancel                cancel many: {"ids": [...]}, one answer per id
GET      /jobs/ID/wait?timeout=S     block until the job is terminal
GET      /jobs/ID/logs?offset=N      output from byte N; ``follow=1`` streams until it ends;
                                     ``tail=N`` from the start of the last N lines
POST     /adopt                      adopt a running process: {"pid", "start_ticks"?, "name"?,
                                     "vram_gb"?, "gpu"?, "domain"?}
GET      /ready                      200 when every domain is ready, else 503 naming them
GET      /domains                    every domain's state and health
POST     /domains/NAME/drain         stop new placements there ({"reason"?})
POST     /domains/NAME/release       back to service (a quarantined GPU must answer)
POST     /domains/NAME/forget        forget a GPU the driver no longer lists (removed for good)
POST     /config/reload              read the config file again (also done on every edit)
GET      /doctor                     the engine's checks (config, domains, queue, clock)
GET      /processes/PID              what the engine sees of a process (to adopt it)
POST     /clean                      remove old finished jobs ({"older_than_days"?, "keep"?,
                                     "dry_run"?: only say what would go})
GET      /metrics (also /metrics)    Prometheus text format
GET      /events                     every event as one JSON object per line
=======  ==========================  =====================================================

Errors are ``{"error": "...", "field"?: "..."}`` (``field`` names the input at fault) with
400 (bad input), 403 (this uid may not do that),
404 (unknown id), 409 (not applicable, e.g. cancelling a finished job), 429 (back-pressure:
too many submissions at once or too many active jobs; retry later) or 503 (the engine
refuses new work, e.g. its database cannot be written).

Access (:mod:`.access`): every request's peer credentials are read with ``SO_PEERCRED``.
The engine's own user and root may do everything; uids and groups listed in ``[security]``
may use the API but cancel only their own jobs, and may not drain, release or reload;
anyone else gets 403.

Why this module is longer than ~400 lines: one handler per route (each short), plus the
error mapping and the server's socket modes; the routes are read side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import __version__, wire
from ..fields import (
    DRAIN_REASON_MAX,
    FieldError,
    check_label,
    keys_once,
    no_presentation_selectors,
    parse_number,
    printable,
    shows_nothing,
    too_long,
    wanted_gpus,
)
from ..unixsock import SocketPath
from .access import (
    GROUPS_CACHE_S,
    Forbidden,
    access_refusal,
    is_admin,
    peer_creds,
    peer_uid,
    user_name,
)
from .api_connections import ConnectionCount, CountedSocketSite
from .config import Config
from .engine import EditRecord, Engine
from .errors import (
    DomainRefused,
    JobNotActive,
    KeyReused,
    KeySpent,
    Overloaded,
    SpecError,
    StoreError,
    UnknownDomain,
    UnknownJob,
    WriteDeferred,
)
from .events import Subscription
from .logread import LogRead, LogUnreadable, read_chunk, tail_span
from .models import Job, JobKind, JobQuery, JobStatus
from .procs import gone_words
from .tasks import cancel_and_wait

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger(__name__)

ENGINE_KEY: web.AppKey[Engine] = web.AppKey("engine", Engine)
MAX_BODY = 64 * 1024 * 1024
MAX_REQUEST_LINE = 65536
"""Bytes of a request line or header that reach the handlers (see ``ApiServer.start``)."""
MAX_INT = wire.MAX_INT  # SQLite's INTEGER; a larger id or offset names nothing
LISTEN_BACKLOG = 4096
"""Connections the kernel queues for the engine to accept (see ``ApiServer._listen``)."""
MAX_WAIT_S = wire.MAX_SECONDS


@dataclass(slots=True)
class _Gate:
    """Submit requests being handled now (bounded by ``[limits] submissions_in_flight``),
    in all and per uid: one uid may hold at most three quarters of the slots, so a client
    that stalls in its bodies cannot lock every other user out for ``[limits]
    idle_connection`` at a time (tester h100)."""

    busy: int = 0
    peak: int = 0
    refused: int = 0
    by_uid: dict[int | None, int] = field(default_factory=dict)

    @staticmethod
    def own_most(limit: int) -> int:
        """The slots one uid may hold: a quarter is kept for the others (none of 1-3)."""
        return limit - limit // 4


GATE_KEY: web.AppKey[_Gate] = web.AppKey("gate", _Gate)


class _Streams:
    """Open streams (events, followed logs) per uid, bounded by ``[limits]
    streams_per_user``; and, for each, whether its reader is still let in."""

    def __init__(self) -> None:
        self.open: dict[int | None, int] = {}
        # Event streams (TUIs, `events` readers), by the pid of the process reading them.
        self.followers: dict[int | None, int] = {}

    @contextlib.contextmanager
    def held(self, engine: Engine, uid: int | None) -> Iterator[None]:
        """One more stream of ``uid``, for as long as the block runs.

        Raises:
            Overloaded: ``uid`` holds as many as it may.
        """
        limit = engine.config.limits.streams_per_user
        count = self.open.get(uid, 0)
        if count >= limit:
            who = user_name(uid) if uid is not None else "this caller"
            raise Overloaded(
                f"{who} has {count} streams open (events, logs --follow), the most "
                f"[limits] streams_per_user = {limit} allows; close one"
            )
        self.open[uid] = count + 1
        try:
            yield
        finally:
            left = self.open[uid] - 1
            if left:
                self.open[uid] = left
            else:
                del self.open[uid]


STREAMS_KEY: web.AppKey[_Streams] = web.AppKey("streams", _Streams)


@contextlib.contextmanager
def _following(streams: _Streams, pid: int | None) -> Iterator[None]:
    """One more client following the events (see :meth:`ApiServer.followers`)."""
    streams.followers[pid] = streams.followers.get(pid, 0) + 1
    try:
        yield
    finally:
        streams.followers[pid] -= 1
        if not streams.followers[pid]:
            del streams.followers[pid]


GONE_CHECK_S = 1.0
"""How often a quiet stream checks that its reader is still connected (it held a slot of
``[limits] streams_per_user`` until it next wrote: a quiet job's ``logs -f`` until the
job ended, so Ctrl-C'd followers locked their user out of every stream)."""

STALLED_WRITE_S = 30.0
SOCKET_CHECK_S = 2.0
"""How often the engine looks whether its socket's path is still there (a tmp cleaner, or a
person tidying the state dir, may remove it; see ApiServer._keep_socket)."""
WRITE_PIECE = 64 * 1024  # a stream's bytes written at a time, each within STALLED_WRITE_S
"""How long a stream's write may wait for a reader that does not read before the
stream is cut (it held its slot, and megabytes of buffered events, for ever)."""


def _gone(request: web.Request) -> bool:
    """Whether the client of ``request`` has disconnected."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def _write(request: web.Request, response: web.StreamResponse, data: bytes) -> None:
    """Write to a stream; a reader that takes none of it for ``STALLED_WRITE_S`` is cut
    off (ConnectionError, as when it leaves).

    Written a piece at a time, each under the limit: a slow reader that keeps taking is
    not stalled (a burst that took it more than the limit to drain, at its pace, was
    taken for a stall, and it was cut off mid-stream, without the ``lagged`` line)."""
    view = memoryview(data)
    try:
        for start in range(0, max(len(view), 1), WRITE_PIECE):
            async with asyncio.timeout(STALLED_WRITE_S):
                await response.write(view[start : start + WRITE_PIECE])
    except TimeoutError:
        _cut_off(request)
        raise ConnectionResetError("the reader took nothing for a while") from None


def _cut_off(request: web.Request) -> None:
    """End a stream whose reader is no longer let in without a proper end of stream: a
    client then asks again, and is told why it may not (a clean end read as the job's).

    Aborted, not closed: a close waits until the buffered bytes are written, which a
    reader that takes nothing never lets happen; its descriptor and the kernel's buffer
    were held as long as it stayed connected, and it could open more streams meanwhile
    (the slot was given back: tester h128)."""
    if request.transport is not None:
        request.transport.abort()


class _StillAllowed:
    """Whether a stream's reader is still let in: the access rules read again whenever
    the configuration changed (a uid taken out of ``[security]``, or ``share_logs``
    turned off, kept reading what was already open), and, where groups let users in,
    every ``GROUPS_CACHE_S`` (a user taken out of an allowed group kept the streams it
    had open, new requests refused: tester h179)."""

    def __init__(
        self,
        request: web.Request,
        more: Callable[[Config], bool] | None = None,
    ) -> None:
        self._engine = request.app[ENGINE_KEY]
        self._creds = peer_creds(request)
        self._seen = self._engine.config
        self._more = more
        self._checked_at = time.monotonic()
        self.lost = False

    def __call__(self) -> bool:
        config = self._engine.config
        now = time.monotonic()
        regroup = bool(config.security.allowed_groups) and (
            now - self._checked_at >= GROUPS_CACHE_S
        )
        if (config is not self._seen or regroup) and not self.lost:
            self._seen = config
            self._checked_at = now
            if access_refusal(config.security, self._creds) is not None or (
                self._more is not None and not self._more(config)
            ):
                self.lost = True
        return not self.lost


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    return web.json_response(wire.error_body(message, field), status=status)


class BodyTooSlow(Exception):
    """The request's body did not arrive in time (408; the connection is closed)."""


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map engine exceptions to clear JSON errors."""
    try:
        return await handler(request)
    except KeyReused as err:
        return _error(422, str(err), err.field)
    except KeySpent as err:
        return _error(409, str(err), err.field)
    except UnknownDomain as err:
        return _error(404, str(err), err.field)
    except web.RequestPayloadError as err:
        # A body that is not what its Content-Encoding says: it was a 500, and two ERROR
        # tracebacks in the journal per request.
        encoding = request.headers.get("Content-Encoding", "")
        return _error(
            400,
            f"the request body could not be decoded as its Content-Encoding "
            f"({encoding[:40]!r}) says: {' '.join(str(err).split())[:200]}",
        )
    except SpecError as err:
        return _error(400, str(err), err.field)
    except wire.FieldError as err:
        return _error(400, str(err), err.field)
    except UnknownJob as err:
        return _error(404, str(err), "job")  # (as a malformed id's 400 names it: h64)
    except Forbidden as err:
        return _error(403, str(err))
    except (JobNotActive, DomainRefused) as err:
        return _error(409, str(err))
    except BodyTooSlow as err:
        response = _error(408, str(err))
        response.force_close()
        return response
    except Overloaded as err:
        response = _error(429, str(err))
        response.headers["Retry-After"] = "1"
        return response
    except WriteDeferred as err:
        # Decided, queued for the retry and acted on only once stored (a cancel signals
        # nothing before): say so, rather than leave it read as refused.
        return _error(
            503,
            f"not stored yet ({err}): it is kept and takes effect once the database takes "
            "writes again (lost if the engine stops first)",
        )
    except StoreError as err:
        return _error(503, str(err))
    except sqlite3.Error as err:
        return _error(503, f"the engine's database failed: {err}")
    except web.HTTPException as err:
        if err.status < 400:
            raise
        # Unknown route or method: answer in JSON like every other error (with its
        # headers: a 405 without Allow does not say which methods are).
        said = err.reason
        if err.status == 413:  # (which limit: it said only "Request Entity Too Large")
            said = f"the request body is over {MAX_BODY // 2**20} MiB"
        elif err.status == 404 and not request.path.startswith("/v1/") and request.path != "/v1":
            # (`/health` answered a bare 404 while `/metrics` answers at both: h182)
            said += "; the API's routes are under /v1 (GET /v1/health)"
        response = _error(err.status, f"{request.method} {request.path[:200]}: {said}")
        if err.status == 413:
            response.force_close()  # (the rest of the body is not read)
        if "Allow" in err.headers:
            response.headers["Allow"] = err.headers["Allow"]
        return response


# The query parameters each route reads; every other route reads none. One not read was
# ignored without a word: `jobs?stat=failed` listed every job, `logs?folow=1` a log that
# simply stopped.
_QUERY = {
    ("GET", "/v1/jobs"): (
        *("status", "q", "sort", "order", "before", "after", "offset", "limit", "since"),
    ),
    ("GET", "/v1/jobs/{job_id}/wait"): ("timeout",),
    ("GET", "/v1/jobs/{job_id}/logs"): ("follow", "offset", "replica", "tail"),
}


@web.middleware
async def _known_query(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a query parameter the route does not read, or one given twice (400)."""
    if request.query:
        resource = request.match_info.route.resource
        if resource is not None:  # (no route: its 404 says so)
            route = f"{request.method} {resource.canonical}"
            # (HEAD is GET without the body: it reads what GET reads; its own entry was
            # missing, and `HEAD /v1/jobs?limit=2` was refused: tester h149)
            method = "GET" if request.method == "HEAD" else request.method
            known = _QUERY.get((method, resource.canonical), ())
            for name in request.query:
                shown = printable(name)[:40]
                if name not in known:
                    takes = f"takes {', '.join(known)}" if known else "takes no parameters"
                    raise SpecError(f"unknown query parameter {shown!r} ({route} {takes})", name)
                if len(request.query.getall(name)) > 1:
                    raise SpecError(f"query parameter {shown!r} is given twice", name)
    return await handler(request)


@web.middleware
async def _access(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse every request from a uid the engine does not serve (403)."""
    engine = request.app[ENGINE_KEY]
    refusal = access_refusal(engine.config.security, peer_creds(request))
    if refusal is not None:
        return _error(403, refusal)
    return await handler(request)


def _require_admin(request: web.Request, what: str) -> None:
    uid = peer_uid(request)
    if not is_admin(uid):
        who = user_name(uid) if uid is not None else "an unidentified caller"
        raise Forbidden(
            f"{who} may not {what}: only {user_name(os.geteuid())} (the engine's user) and root may"
        )


def _job_id(request: web.Request) -> int:
    raw = request.match_info["job_id"]
    if not (raw.isascii() and raw.isdigit()) or not raw.strip("0"):
        raise SpecError(f"a job id is a positive integer, not {raw[:100]!r}", "job")
    # (a number past 4,300 digits made int() raise: a 500)
    shown = too_long(raw)
    if shown is not None or int(raw) > MAX_INT:
        raise SpecError(f"a job id is at most {MAX_INT}, not {shown or raw}", "job")
    return int(raw)


def _path_int(raw: str) -> object:
    """A number in a URL path for a field rule to judge (``raw`` itself if not digits; a
    number too long for ``int()`` as one past every limit)."""
    if raw[:1] == "-" and raw[1:].isascii() and raw[1:].isdigit():
        return -1  # (below every limit: "-1: must be a whole number" read wrong, h171)
    if not (raw.isascii() and raw.isdigit()):
        return raw
    return MAX_INT + 1 if too_long(raw) is not None else int(raw)


def _int_query(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        if not (raw.isascii() and raw.isdigit()):  # (int() took "+5", " 5" and "٣")
            raise ValueError(raw)
        if too_long(raw) is not None:
            raise SpecError(f"{name} must be at most {MAX_INT}", name)
        value = int(raw)
    except ValueError:
        if raw.startswith("-") and raw[1:].isascii() and raw[1:].isdigit():
            raise SpecError(f"{name} must not be negative", name) from None
        raise SpecError(f"{name} must be an integer, not {raw[:100]!r}", name) from None
    if value < 0:
        raise SpecError(f"{name} must not be negative", name)
    if value > MAX_INT:
        raise SpecError(f"{name} must be at most {MAX_INT}", name)
    return value


def _limit(request: web.Request) -> int:
    limit = _int_query(request, "limit", 500)
    if not limit:
        raise SpecError("limit must be 1 or more (rows per page)", "limit")
    if limit > wire.MAX_PAGE:
        # (it was cut to 10,000 without a word: a caller asking for all took a part)
        raise SpecError(
            f"limit must be at most {wire.MAX_PAGE} rows per page (page on with before=ID)",
            "limit",
        )
    return limit


def _bool_query(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "")
    if raw.lower() in ("", "0", "false", "no"):
        return False
    if raw.lower() in ("1", "true", "yes"):
        return True
    # (follow=abc read as no follow: a caller's typo gave a log that simply stopped)
    raise SpecError(f"{name} must be 1, true, yes, 0, false or no, not {raw[:100]!r}", name)


def _float_query(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if raw == "":  # (`wait?timeout=` read as no timeout: it waited for ever: tester h51)
        raise SpecError(f"{name} is empty: give a number of seconds, or leave it out", name)
    # A number as the CLI takes one: ASCII digits, a point, an exponent ("1e3" was refused
    # as not a number); float() alone took "+0.1", " 1", "0_1" and other scripts' digits.
    if raw[:1] in "+ " or raw != raw.strip():
        raise SpecError(f"{name} must be a number, not {raw[:100]!r}", name)
    try:
        value = parse_number(name, raw)
    except FieldError:
        raise SpecError(f"{name} must be a number, not {raw[:100]!r}", name) from None
    if not 0 <= value <= MAX_WAIT_S:  # (nan and inf too)
        raise SpecError(
            f"{name} must be a number of seconds from 0 to {MAX_WAIT_S:.0f}, not {raw[:100]}",
            name,
        )
    return value


def _epoch_query(request: web.Request, name: str) -> float | None:
    """A time as epoch seconds, a fraction too (every time the API answers has one:
    ``since=`` a row's ``created_at`` was refused, "must be an integer": tester h71)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if raw[:1] in "+ " or raw != raw.strip():
        raise SpecError(f"{name} must be a time in epoch seconds, not {raw[:100]!r}", name)
    try:
        value = parse_number(name, raw)
    except FieldError:
        raise SpecError(
            f"{name} must be a time in epoch seconds, not {raw[:100]!r}", name
        ) from None
    if value < 0:
        raise SpecError(f"{name} must not be negative", name)
    if not value < 1e11:  # (inf and nan too: no time a job has)
        raise SpecError(f"{name} must be a time in epoch seconds, not {raw[:100]}", name)
    return value


def _job(job: Job) -> wire.JobJSON:
    return job.to_json()


def _owner(owner_uid: int | None) -> int:
    # Jobs without a recorded submitter came from inside the engine (the embedded TUI).
    return owner_uid if owner_uid is not None else os.geteuid()


def _others(request: web.Request, owner_uid: int | None) -> bool:
    """True when the caller is neither the job's submitter nor the engine's user or root."""
    uid = peer_uid(request)
    return not is_admin(uid) and _owner(owner_uid) != uid


HIDDEN = "(hidden)"


def _shown(request: web.Request, job: wire.JobJSON) -> wire.JobJSON:
    """``job`` as the caller may see it: another user's environment values are hidden
    (names are kept). The CLI sends the submitter's whole environment: tokens and keys."""
    env = job["spec"].get("env")
    if not env or not _others(request, job.get("owner_uid")):
        return job
    spec = dict(job["spec"], env=dict.fromkeys(env, HIDDEN))
    return {**job, "spec": spec}


async def _read_json(request: web.Request) -> Any:
    """The request's JSON body, read within ``[limits] idle_connection``: a client that
    sends its headers and then stalls must not hold a submission slot for ever (64 of
    them refused every submission for as long as they stalled)."""
    deadline = request.app[ENGINE_KEY].config.limits.idle_connection
    size = request.content_length
    if size is not None and size > MAX_BODY:
        # Refused before a byte is read: it waited for a body it would refuse anyway, or
        # for the idle deadline when the client sent no more than its headers.
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=size)
    try:
        async with asyncio.timeout(deadline):
            return await request.json(loads=_loads_once)
    except TimeoutError:
        raise BodyTooSlow(
            f"the request body did not arrive within {deadline:g} s ([limits] "
            "idle_connection); nothing was stored"
        ) from None
    except (ValueError, UnicodeDecodeError) as err:
        if "integer string conversion" in str(err):  # (Python's words: not the user's)
            raise SpecError(
                "the request body has a number of over 4,300 digits (the largest any "
                f"field takes is {MAX_INT})"
            ) from None
        raise SpecError(f"the request body is not valid JSON: {err}") from None
    except RecursionError:
        raise SpecError("the request body is not valid JSON: nested too deeply") from None


async def _no_fields(request: web.Request, what: str, instead: str) -> None:
    """Refuse a body for an action that takes none (an empty one, or ``{}``, is fine): its
    fields were ignored without a word (a restart "with" other GPUs ran the old spec)."""
    if not request.can_read_body:
        return
    body = await _read_json(request)
    if body == {}:
        return  # (a JSON null is refused as 0 and [] are: tester h128)
    field = next(iter(body)) if isinstance(body, dict) else None
    shown = f"a field {printable(field)[:40]!r}" if field is not None else "a body"
    raise SpecError(f"{what} takes no fields, and was given {shown}; {instead}", field)


def _loads_once(text: str) -> Any:
    """JSON with each object's keys given once (with two, the last won, silently: a job
    ran `pwd` where `ls` came first)."""
    return json.loads(text, object_pairs_hook=keys_once)


async def health(request: web.Request) -> web.Response:
    """GET /v1/health."""
    return web.json_response(request.app[ENGINE_KEY].health())


async def gpus(request: web.Request) -> web.Response:
    """GET /v1/gpus."""
    return web.json_response(request.app[ENGINE_KEY].gpus())


def _job_query(request: web.Request) -> JobQuery:
    raw = request.query.get("status", "")
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise SpecError(f"order must be asc or desc, not {order[:100]!r}", "order")
    text = request.query.get("q", "")
    if "\0" in text:  # (SQLite's LIKE ends the pattern there: "a\0b" matched as "a")
        raise SpecError("q contains a NUL byte", "q")
    given = request.query.get("order")
    # (A contradicting order was obeyed half: before=10&order=asc gave 11, 12, 13.)
    if given == "asc" and request.query.get("before"):
        raise SpecError("order: before pages newest first; give order=desc or leave it", "order")
    if given == "desc" and request.query.get("after"):
        raise SpecError("order: after pages oldest first; give order=asc or leave it", "order")
    statuses = tuple(dict.fromkeys(s for s in raw.split(",") if s))
    if "status" in request.query and not statuses:
        # (taken as no filter: every job came back to a script that asked for none)
        raise SpecError(
            "status is empty: give one or more statuses (comma-separated), or leave it out",
            "status",
        )
    return JobQuery(
        statuses=statuses,
        text=text,
        sort=request.query.get("sort", "id"),
        descending=order == "desc",
        before=_int_query(request, "before", None),
        after=_int_query(request, "after", None),
        offset=_int_query(request, "offset", 0) or 0,
        limit=_limit(request),
        since=_epoch_query(request, "since"),
    )


async def list_jobs(request: web.Request) -> web.StreamResponse:
    """GET /v1/jobs: job rows, written as SQLite yields them (a chunk at a time, so a big
    page never sits in the engine's memory whole); ``more`` says another page follows."""
    query = _job_query(request)
    rows = request.app[ENGINE_KEY].job_rows(query)
    try:
        # The first chunk before the answer starts: a bad query is still a 400.
        chunk: list[wire.JobRowJSON] | None = await anext(rows, None)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"jobs":[')
        sent = 0
        more = False
        while chunk is not None:
            take = chunk[: query.limit - sent]
            more = len(take) < len(chunk)
            if take:
                text = json.dumps(take, separators=(",", ":"))[1:-1]
                await response.write((b"," if sent else b"") + text.encode())
                sent += len(take)
            if more:
                break
            chunk = await anext(rows, None)
        await response.write(b'],"more":' + (b"true" if more else b"false") + b"}")
        await response.write_eof()
    except ConnectionError:
        pass  # the client left (a TUI that moved on to another view): nothing to answer
    finally:
        await rows.aclose()
    return response


_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def _submit_key(request: web.Request) -> str | None:
    """The ``Idempotency-Key`` header: 1-128 letters, digits or ``._:-``."""
    keys = request.headers.getall("Idempotency-Key", [])
    if not keys:
        return None
    if len(keys) > 1:  # (the first one was used, silently: tester h140)
        raise SpecError("Idempotency-Key is given more than once", "Idempotency-Key")
    key = keys[0]
    if not 0 < len(key) <= 128 or not set(key) <= _KEY_CHARS:
        raise SpecError(
            "Idempotency-Key must be 1-128 letters, digits or ._:- (the CLI sends 32 hex digits)",
            "Idempotency-Key",
        )
    return key


async def _body_digest(request: web.Request, key: str | None) -> str | None:
    """A keyed submission's body, digested (a retry sends the same bytes); ``None``
    without a key."""
    if key is None:
        return None
    return "body:" + hashlib.sha256(await request.read()).hexdigest()[:32]


async def submit(request: web.Request) -> web.Response:
    """POST /v1/jobs: 201 with the job, or with a batch's rows (``{"jobs": [...]}``, an
    optional ``env`` under every job's own); 429 when too many submissions are in flight.

    The in-flight bound is checked before the body is read, so a flood of requests costs
    no memory beyond ``[limits] submissions_in_flight`` bodies.
    """
    engine = request.app[ENGINE_KEY]
    gate = request.app[GATE_KEY]
    limit = engine.config.limits.submissions_in_flight
    uid = peer_uid(request)
    mine = gate.by_uid.get(uid, 0)
    if gate.busy >= limit:
        gate.refused += 1
        raise Overloaded(
            f"too many submissions at once: {gate.busy} are being handled (limit {limit}, "
            "[limits] submissions_in_flight); nothing was stored, retry shortly"
        )
    if mine >= _Gate.own_most(limit):
        gate.refused += 1
        who = user_name(uid) if uid is not None else "this caller"
        raise Overloaded(
            f"too many submissions at once from {who}: {mine} of its submissions are being "
            f"handled, the most one user may have of [limits] submissions_in_flight = {limit} (a "
            "quarter is kept for other users); nothing was stored, retry shortly"
        )
    gate.busy += 1
    gate.by_uid[uid] = mine + 1
    gate.peak = max(gate.peak, gate.busy)
    try:
        key = _submit_key(request)
        body = await _read_json(request)
        if isinstance(body, dict) and "jobs" in body:  # (a spec has no field "jobs")
            extra = sorted(set(body) - {"jobs", "env"})
            if extra:
                raise SpecError(
                    'a batch is {"jobs": [...]} with an optional "env"; unknown key '
                    + ", ".join(repr(printable(key)[:40]) for key in extra[:5]),
                    extra[0],
                )
            items = body["jobs"]
            if not isinstance(items, list) or not items:
                raise SpecError("'jobs' must be a non-empty list of job specs", "jobs")
            if "env" in body:
                try:
                    items = wire.with_batch_env(items, body["env"])
                except wire.FieldError as err:
                    raise SpecError(str(err), err.field) from None
            jobs = await engine.submit_many(items, uid, key, await _body_digest(request, key))
            # Rows, as GET /v1/jobs lists them: a batch's answer does not echo every
            # job's environment back (GET /v1/jobs/ID has the whole job).
            answer: dict[str, Any] = {"jobs": [j.to_row() for j in jobs]}
        else:
            job = await engine.submit(body, uid, key, await _body_digest(request, key))
            jobs, answer = [job], {"job": _job(job)}
        # ("warnings": taken, but something the submitter should know; absent when none)
        unsent = engine.notifier.unsent_warning(jobs)
        warnings = [*([unsent] if unsent is not None else []), *engine.pinned_waits(jobs)]
        if warnings:
            answer["warnings"] = warnings
        return web.json_response(answer, status=201)
    finally:
        gate.busy -= 1
        left = gate.by_uid[uid] - 1
        if left:
            gate.by_uid[uid] = left
        else:
            del gate.by_uid[uid]


async def ready(request: web.Request) -> web.Response:
    """GET /v1/ready: 200 if every domain is ready, else 503 with the reason."""
    ok, reason = request.app[ENGINE_KEY].domain_ops.readiness()
    return web.json_response({"ready": ok, "reason": reason}, status=200 if ok else 503)


async def domains(request: web.Request) -> web.Response:
    """GET /v1/domains: the domains, and ``missing``: those the config names, or that had
    a GPU here before, whose GPU the driver does not list now (left out until it does, or
    forgotten), each with the reason in words."""
    scheduler = request.app[ENGINE_KEY].scheduler
    # (a GPU domain made automatically was left out of both: `domain list gpu2` said
    # "unknown domain" while drain, gpus and doctor said its GPU was missing: h148)
    names = set(scheduler.configured_missing) | {
        gpu.name for gpu in scheduler.missing_known.values()
    }
    missing: list[dict[str, Any]] = [
        {"name": name, "reason": scheduler.unknown_domain(name)}
        for name in sorted(names - scheduler.domains.keys())
    ]
    # A missing GPU whose domain's name another GPU has now (a new --simulate, GPUs
    # numbered anew): said too, by its UUID (it was left out: tester h164).
    for uuid, gpu in sorted(scheduler.missing_known.items(), key=lambda kv: kv[1].name):
        if gpu.name in scheduler.domains:
            missing.append(
                {
                    "name": gpu.name,
                    "gpu_uuid": uuid,
                    "reason": (
                        f"the GPU domain {gpu.name!r} had before ({uuid}) is not found by the "
                        f"driver now; {gpu.name} is another GPU's domain since "
                        f"(`gpulayer-tui domain forget {uuid}` if it was removed for good)"
                    ),
                }
            )
    domains = [d.to_json() for d in scheduler.domains.values()]
    return web.json_response({"domains": domains, "missing": missing})


async def drain(request: web.Request) -> web.Response:
    """POST /v1/domains/NAME/drain."""
    _require_admin(request, "drain a domain")
    body = await _read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise SpecError('a drain request is {"reason": "..."} or empty')
    extra = sorted(set(body) - {"reason"})
    if extra:
        shown = ", ".join(repr(printable(key)[:40]) for key in extra[:5])
        raise SpecError(
            f'a drain request is {{"reason": "..."}} or empty; unknown key {shown}', extra[0]
        )
    reason = body.get("reason")  # (None: keep it; "": the default)
    if reason is not None and not isinstance(reason, str):
        raise SpecError(f"reason must be text, not {type(reason).__name__}", "reason")
    if reason is not None and not reason.strip():
        reason = ""  # (the default: only spaces were stored, and said as no reason: h117)
    if reason:
        # (escapes went raw into the API's domains and every waiting job's reason: h114)
        try:
            check_label("reason", reason, DRAIN_REASON_MAX)
            no_presentation_selectors("reason", reason)
        except FieldError as err:
            raise SpecError(str(err), "reason") from None
        if shows_nothing(reason):
            # (combining marks or a joiner alone: shown as no reason at all: tester h166)
            raise SpecError(
                "reason: needs a visible character (it is only blank filler characters or "
                "combining marks); give none for the default",
                "reason",
            )
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {"domain": await engine.domain_ops.drain(request.match_info["name"], reason)}
    )


async def _no_body(request: web.Request, what: str) -> None:
    """Refuse any body but none or ``{}`` (release took any, even one that was no JSON:
    a malformed request acted)."""
    body = await _read_json(request) if request.can_read_body else {}
    if body != {}:
        key = next(iter(body)) if isinstance(body, dict) else None
        said = f"; unknown key {printable(str(key))[:40]!r}" if key is not None else ""
        raise SpecError(f"a {what} request is empty or {{}}{said}", key)


async def forget(request: web.Request) -> web.Response:
    """POST /v1/domains/NAME/forget: forget a missing GPU (NAME: its last domain or UUID)."""
    _require_admin(request, "forget a GPU")
    await _no_body(request, "forget")
    engine = request.app[ENGINE_KEY]
    forgotten = await engine.domain_ops.forget(request.match_info["name"])
    return web.json_response({"forgotten": forgotten})


async def release(request: web.Request) -> web.Response:
    """POST /v1/domains/NAME/release."""
    _require_admin(request, "release a domain")
    await _no_body(request, "release")
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {"domain": await engine.domain_ops.release(request.match_info["name"])}
    )


async def reload_config(request: web.Request) -> web.Response:
    """POST /v1/config/reload: 200 when applied, 400 with the error when rejected."""
    _require_admin(request, "reload the configuration")
    await _no_body(request, "reload")  # (it reloaded on any body, even no JSON: h51)
    result = await request.app[ENGINE_KEY].config_reload.reload()
    return web.json_response(result, status=200 if result["applied"] else 400)


async def clean(request: web.Request) -> web.Response:
    """POST /v1/clean: remove finished jobs older than ``older_than_days`` and/or all but the
    newest ``keep`` finished ones (rows, timelines, logs); with ``"dry_run": true`` only
    say what would go."""
    _require_admin(request, "clean the history")
    body = await _read_json(request) if request.can_read_body else {}
    dry_run = body.pop("dry_run", False) if isinstance(body, dict) else False
    if not isinstance(dry_run, bool):
        raise SpecError("dry_run must be true or false", "dry_run")
    shape = 'a clean request is {"older_than_days": D} and/or {"keep": N} (and "dry_run"?)'
    if isinstance(body, dict):
        for key in body:
            if key not in ("older_than_days", "keep"):
                # (the typo "older_than" was not named: tester h111)
                raise SpecError(f"{shape}: unknown key '{printable(key)[:40]}'", key[:40])
    if not isinstance(body, dict) or not body:
        raise SpecError(shape)
    days, keep = body.get("older_than_days"), body.get("keep")
    before = None
    if days is not None:
        if isinstance(days, bool) or not isinstance(days, int | float) or not 0 <= days <= 36500:
            raise SpecError(
                "older_than_days must be a number of days from 0 to 36500", "older_than_days"
            )
        before = time.time() - float(days) * 86400
    if keep is not None and (
        isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= MAX_INT
    ):
        raise SpecError(f"keep must be a whole number from 0 to {MAX_INT}", "keep")
    retention = request.app[ENGINE_KEY].retention
    if dry_run:
        return web.json_response(await retention.preview(before, keep))
    return web.json_response(await retention.clean(before, keep))


async def doctor(request: web.Request) -> web.Response:
    """GET /v1/doctor."""
    return web.json_response({"checks": await request.app[ENGINE_KEY].doctor_checks()})


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus exposition format."""
    from .metrics import CONTENT_TYPE, render

    body = await render(request.app[ENGINE_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def adopt(request: web.Request) -> web.Response:
    """POST /v1/adopt: 201 with the job (``running``, or ``failed`` with the refusal)."""
    adopt_request = wire.parse_adopt_request(await _read_json(request))
    creds = peer_creds(request)
    job = await request.app[ENGINE_KEY].adopt(
        adopt_request, peer_uid(request), requester_pid=creds[0] if creds else None
    )
    return web.json_response({"job": _job(job)}, status=201)


async def process(request: web.Request) -> web.Response:
    """GET /v1/processes/PID: what /proc says about a process (to confirm an adoption)."""
    raw = request.match_info["pid"]
    pid = wire.check_pid(_path_int(raw))
    creds = peer_creds(request)
    info = request.app[ENGINE_KEY].process_info(
        pid, peer_uid(request), requester_pid=creds[0] if creds else None
    )
    if info is None:  # (a zombie as one, as the adopt and signal routes say: h191)
        return _error(404, gone_words(pid), "pid")
    return web.json_response(info)


async def process_signal(request: web.Request) -> web.Response:
    """POST /v1/processes/PID/signal ``{"signal": "TERM", "start_ticks": N}``: signal a
    stray GPU process (the requester's own; root's: any)."""
    raw = request.match_info["pid"]
    pid = wire.check_pid(_path_int(raw))
    body = await _read_json(request)
    if not isinstance(body, dict):
        raise SpecError("expected a JSON object with 'signal'")
    ticks = body.get("start_ticks")
    if ticks is not None and (not isinstance(ticks, int) or isinstance(ticks, bool)):
        raise SpecError("start_ticks: a whole number", "start_ticks")
    done = request.app[ENGINE_KEY].signal_process(
        pid, str(body.get("signal", "TERM")), ticks, peer_uid(request)
    )
    return web.json_response({"done": done})


async def get_job(request: web.Request) -> web.Response:
    """GET /v1/jobs/ID."""
    job, events = await request.app[ENGINE_KEY].job_detail(_job_id(request))
    return web.json_response({"job": _shown(request, job), "events": events})


async def users(request: web.Request) -> web.Response:
    """GET /v1/users: fair-share order, running and waiting per user, limits."""
    return web.json_response({"users": request.app[ENGINE_KEY].queue.users_view()})


def _admin_only(request: web.Request, what: str) -> None:
    uid = peer_uid(request)
    if uid is not None and not is_admin(uid):
        raise Forbidden(f"only the engine's user and root may {what}; {user_name(uid)} may not")


async def queue_pause(request: web.Request) -> web.Response:
    """POST /v1/queue/pause: nothing new starts until resumed (the engine's user, root)."""
    _admin_only(request, "pause the queue")
    await _no_fields(request, "pausing the queue", "running jobs go on, nothing new starts")
    engine = request.app[ENGINE_KEY]
    was_paused = engine.paused_at is not None  # (said: a second pause read as a first, h147)
    paused_at = await engine.pause()
    return web.json_response({"paused_at": paused_at, "was_paused": was_paused})


async def queue_resume(request: web.Request) -> web.Response:
    """POST /v1/queue/resume."""
    _admin_only(request, "resume the queue")
    await _no_fields(request, "resuming the queue", "it starts what fits, as before the pause")
    was_paused = await request.app[ENGINE_KEY].resume()
    return web.json_response({"paused_at": None, "was_paused": was_paused})


async def job_restart(request: web.Request) -> web.Response:
    """POST /v1/jobs/ID/restart: the ended job's spec again, as a new job; a running
    service's replicas restarted one at a time (its owner, or the engine's user and
    root)."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    job = await engine.get(job_id)
    if _others(request, job.owner_uid):
        uid = peer_uid(request)
        who = user_name(uid) if uid is not None else "an unidentified caller"
        raise Forbidden(
            f"job {job_id} belongs to {user_name(_owner(job.owner_uid))}; {who} may restart "
            "only its own jobs"
        )
    await _no_fields(
        request,
        "a restart",
        "it runs the job's spec as it was; change the new job while it waits (PATCH "
        "/v1/jobs/ID), or submit a new spec",
    )
    left_out: list[int] = []
    warnings: list[str] = []
    if job.kind is JobKind.SERVICE and job.status is JobStatus.RUNNING:
        # A rolling restart, in place: the same job ("rolling": the replicas it restarts,
        # in order), 202: it goes on after the answer.
        rolling = await engine.roll(job_id, warnings)
        answer: dict[str, Any] = {"job": _job(await engine.get(job_id)), "rolling": rolling}
        answer["left_out"] = left_out
        if warnings:
            answer["warnings"] = warnings
        return web.json_response(answer, status=202)
    # (the job stays its owner's when an admin restarts it: it was root's, carrying the
    # owner's environment, and the owner could no longer see, cancel or read it: h65)
    new = await engine.restart(
        job_id,
        job.owner_uid if job.owner_uid is not None else peer_uid(request),
        left_out,
        warnings,
    )
    # ("left_out": dependencies cleaned from the history, which it no longer waits for;
    # "warnings", absent when none: the answer of a submission's kind)
    warnings += engine.pinned_waits([new])  # (as a submission says it: tester h197)
    answer = {"job": _job(new), "left_out": left_out}
    if warnings:
        answer["warnings"] = warnings
    return web.json_response(answer, status=201)


async def job_edit(request: web.Request) -> web.Response:
    """PATCH /v1/jobs/ID: change a waiting job (priority, gpus, vram_gb, timeout, name,
    project, depends_on; a waiting service: replicas; a running service: replicas alone,
    it is scaled); its owner, or the engine's user and root."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    job = await engine.get(job_id)
    if _others(request, job.owner_uid):
        uid = peer_uid(request)
        who = user_name(uid) if uid is not None else "an unidentified caller"
        raise Forbidden(
            f"job {job_id} belongs to {user_name(_owner(job.owner_uid))}; {who} may edit "
            "only its own jobs"
        )
    changes = await _read_json(request)
    if not isinstance(changes, dict):
        raise SpecError("expected a JSON object of the fields to change")
    if not changes and job.status in (JobStatus.PENDING, JobStatus.QUEUED):
        # (An ended one: what is wrong is that it ended; that is said first, by edit,
        # as for any fields: "no fields" first sent the caller to add some: tester h81)
        raise SpecError(
            "no fields given to change (one or more of: " + ", ".join(engine.EDITABLE) + ")"
        )
    record = EditRecord()
    edited = await engine.edit(job_id, changes, record)
    # ("changed": false for an edit that asks for what the job has: nothing was recorded;
    # "fields": each field changed, [before, after], one not asked for among them: a GPU
    # job made a CPU one loses its vram_gb, and the CLI said nothing of it: tester h86.
    # Both as this edit made them: read from the job after its commit, another request's
    # edit made meanwhile showed, and a scale that happened said "nothing to change": h108)
    before, after = record.before, record.after
    fields = {
        key: [before.get(key), after.get(key)]
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }
    if "name" in fields:  # (as shown: a default name is the program's, not null)
        fields["name"] = [record.name_before, record.name_after]
    gpus = [wanted_gpus(before), wanted_gpus(after)]
    if "gpus" not in fields and before and gpus[0] != gpus[1]:
        # (a VRAM figure given to a CPU job made it a GPU job, unsaid: tester h192)
        fields["gpus"] = gpus
    return web.json_response({"job": _job(edited), "changed": after != before, "fields": fields})


async def job_why(request: web.Request) -> web.Response:
    """GET /v1/jobs/ID/why: why a job waits (place, reservation, limits, fair share)."""
    return web.json_response(await request.app[ENGINE_KEY].why(_job_id(request)))


async def job_usage(request: web.Request) -> web.Response:
    """GET /v1/jobs/ID/usage: what the job used of its GPUs (summary and per-GPU series;
    live while it runs)."""
    usage = await request.app[ENGINE_KEY].usage_of(_job_id(request))
    return web.json_response(usage)


async def cancel(request: web.Request) -> web.Response:
    """POST /v1/jobs/ID/cancel: the engine's user and root cancel any job, others their own."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    uid = peer_uid(request)
    job = await engine.get(job_id)
    if _others(request, job.owner_uid):
        who = user_name(uid) if uid is not None else "an unidentified caller"
        raise Forbidden(
            f"job {job_id} belongs to {user_name(_owner(job.owner_uid))}; {who} may cancel "
            "only its own jobs"
        )
    await _no_fields(request, "a cancel", "it stops the job: SIGTERM, then SIGKILL")
    # (another's cancel is said as theirs: tester h75)
    by = user_name(uid) if uid is not None and uid != _owner(job.owner_uid) else None
    dependents = engine.queue.cancelled_with(job_id)  # (a queued job's go with it, at once)
    job = await engine.cancel(job_id, by)
    answer = _job(job)
    answer["cancels_dependents"] = dependents
    return web.json_response({"job": answer}, status=202)


MAX_CANCELS = 100_000
"""The most ids one ``POST /v1/jobs/cancel`` takes."""


async def cancel_many(request: web.Request) -> web.Response:
    """POST /v1/jobs/cancel ``{"ids": [...]}``: cancel many jobs in one request, each as
    ``POST /v1/jobs/ID/cancel`` would, in the order given, durable in one commit (one
    request per id took 19 s for 15,000, and an engine lost in the middle left the
    caller unable to tell which were done: tester h106). Answers ``jobs``, one entry per
    id: the job (with ``cancels_dependents``), or for one refused ``{"id", "error",
    "status"}`` (404, 403, 409; a 409's ``job`` as it is: cancelled already is the state
    asked for)."""
    engine = request.app[ENGINE_KEY]
    body = await _read_json(request)
    if isinstance(body, dict):
        for key in body:
            if key != "ids":  # (said as "ids" at fault: tester h111)
                said = f"unknown key '{printable(key)[:40]}'"
                raise SpecError(f'expected {{"ids": [job ids]}}: {said}', key[:40])
    if not isinstance(body, dict) or not isinstance(body.get("ids"), list):
        raise SpecError('expected {"ids": [job ids]}', "ids")
    ids: list[int] = []
    for value in body["ids"]:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_INT:
            shown = printable(json.dumps(value))[:40]
            raise SpecError(f"ids: a job id is a positive integer, not {shown}", "ids")
        ids.append(value)
    if not ids:
        raise SpecError("ids is empty: give the jobs to cancel", "ids")
    if len(ids) > MAX_CANCELS:
        raise SpecError(f"ids: at most {MAX_CANCELS:,} at once, not {len(ids):,}", "ids")
    uid = peer_uid(request)
    who = user_name(uid) if uid is not None else "an unidentified caller"
    done: list[tuple[int, Job | None, dict[str, Any] | None, list[int]]] = []
    unique = list(dict.fromkeys(ids))
    asked = set(unique)
    waits_on_it: dict[int, list[int]] = {}
    for count, job_id in enumerate(unique, 1):
        if count % 256 == 0:
            await asyncio.sleep(0)  # (the loop serves others between steps)
        waits_on_it[job_id] = engine.queue.cancelled_with(job_id)
    # A job asked for is cancelled before those it waits for: after them, it was found
    # cancelled already, by this very request's cascade, and said so with its cause
    # ("cancel A B C" of a chain; "C B A" said each cancelled: tester h113). Those lists
    # are transitive, so one that waits on another has fewer of the asked in its own.
    order = sorted(unique, key=lambda j: sum(d in asked for d in waits_on_it[j]))
    said_of: set[int] = set()  # the dependents said already, of a job asked for
    for count, job_id in enumerate(order, 1):
        if count % 256 == 0:
            await asyncio.sleep(0)
        try:
            job = await engine.get(job_id)
        except UnknownJob as err:
            done.append((job_id, None, {"error": str(err), "status": 404}, []))
            continue
        if _others(request, job.owner_uid):
            said = (
                f"job {job_id} belongs to {user_name(_owner(job.owner_uid))}; {who} may "
                "cancel only its own jobs"
            )
            done.append((job_id, None, {"error": said, "status": 403}, []))
            continue
        by = user_name(uid) if uid is not None and uid != _owner(job.owner_uid) else None
        # (Those asked for too are answered on their own: a chain cancelled by all its
        # ids named each up to three times, with two causes: tester h111.)
        # (and each said once, of the job asked for nearest to it, which comes first in
        # this order: "job 16 waited for job 14" and "... for job 15" of a chain 14 <- 15
        # <- 16 cancelled as 14 15; tester h197)
        dependents = [d for d in waits_on_it[job_id] if d not in asked and d not in said_of]
        said_of.update(dependents)
        try:
            job = await engine.cancel(job_id, by, flush=False)
        except JobNotActive as err:
            done.append((job_id, job, {"error": str(err), "status": 409}, []))
            continue
        done.append((job_id, job, None, dependents))
    await engine.store.flush()  # (durable, then answered: the signals follow this commit)
    out: list[dict[str, Any]] = []
    place = {job_id: at for at, job_id in enumerate(unique)}  # (answered in the order given)
    done.sort(key=lambda entry: place[entry[0]])
    for job_id, found, refused, dependents in done:
        if refused is not None:
            entry: dict[str, Any] = {"id": job_id, **refused}
            if found is not None:
                entry["job"] = _job(found)
            out.append(entry)
            continue
        assert found is not None
        answer: dict[str, Any] = dict(_job(found))
        answer["cancels_dependents"] = dependents
        out.append(answer)
    return web.json_response({"jobs": out})


async def wait(request: web.Request) -> web.Response:
    """GET /v1/jobs/ID/wait."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    timeout = _float_query(request, "timeout")
    try:
        job = await engine.wait(job_id, timeout)
    except TimeoutError:
        job = await engine.get(job_id)
        return web.json_response({"job": _shown(request, _job(job)), "timed_out": True})
    return web.json_response({"job": _shown(request, _job(job)), "timed_out": False})


async def logs(request: web.Request) -> web.StreamResponse:
    """GET /v1/jobs/ID/logs: output from ``offset``; ``follow=1`` streams; a service's
    ``replica=K`` (default 0)."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    asked_to_follow = _bool_query(request, "follow")
    job = await engine.get(job_id)
    if _others(request, job.owner_uid) and not engine.config.security.share_logs:
        uid = peer_uid(request)
        who = user_name(uid) if uid is not None else "an unidentified caller"
        raise Forbidden(
            f"job {job_id} belongs to {user_name(_owner(job.owner_uid))}; {who} may read only "
            "its own jobs' output ([security] share_logs = true shares every job's)"
        )
    offset = _int_query(request, "offset", 0) or 0
    tail = _int_query(request, "tail", None)
    if tail is not None and "offset" in request.query:
        raise SpecError("tail (the last lines) and offset (from a byte) do not go together", "tail")
    # An adopted process's output goes where it was started: nothing to follow here (a
    # follow waited, silent, for as long as the process ran).
    follow = asked_to_follow and job.kind is not JobKind.ADOPTED
    replica = engine.reads.check_replica(job, _int_query(request, "replica", None))
    path = engine.log_path(job_id, replica)
    others = _others(request, job.owner_uid)
    allowed = _StillAllowed(request, lambda config: not others or config.security.share_logs)
    streams = request.app[STREAMS_KEY]
    try:
        # (Before the answer starts: a log that cannot be read is said in a 409.)
        tail_end = None
        if tail is not None:
            offset, tail_end = await asyncio.to_thread(tail_span, path, tail)
        first = await asyncio.to_thread(read_chunk, path, offset)
    except LogUnreadable as err:
        raise JobNotActive(f"job {job_id}'s log {err}") from None
    launched = job.kind is JobKind.COMMAND and job.pid is not None and not job.cluster_job_id
    if launched and not await asyncio.to_thread(os.path.lexists, path):
        # (It read as empty: a job that ran and wrote nothing. Its launch made the file.)
        raise JobNotActive(f"job {job_id}'s log {path.name} is missing (removed from jobs/)")
    with streams.held(engine, peer_uid(request)) if follow else contextlib.nullcontext():
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.headers["X-Job-Status"] = job.status.value
        # Where in the job's output this answer starts (after X-Log-Note bytes of a cut
        # log's note): the offset to ask for next is that plus the rest of what came.
        response.headers["X-Log-Offset"] = str(first.start)
        response.headers["X-Log-Note"] = str(first.note)
        if first.size is not None:  # (how long the whole output was as this answer began)
            response.headers["X-Log-Size"] = str(first.size)
        await response.prepare(request)
        try:
            # Not following, the answer stops where the output ended when asked (the end of
            # the last lines asked for): read on to whatever end it had reached, a fast
            # writer's was never caught up with, and `logs -n 2` of `yes` printed 12
            # million lines (tester h186).
            stop_at = None if follow else (tail_end if tail_end is not None else first.size)
            await _send_log(
                request, engine, job_id, path, first, stop_at, follow, response, allowed, replica
            )
        except LogUnreadable as err:
            # No end of stream (it read as the job's end: `logs -f ID && next` went on):
            # the reader asks again and is told why.
            log.warning("job %s: stopped sending its log: %s", job_id, printable(str(err)))
            _cut_off(request)
        except ConnectionError:
            # The reader left (Ctrl-C on `logs -f`, a TUI that moved on): an ordinary end.
            log.debug("a log reader of job %s left", job_id)
        except (UnknownJob, JobNotActive) as err:
            # Cleaned from the history while read: the answer has begun, so no error
            # answer can follow (one written into the stream broke the reader's HTTP).
            # Cut off, the reader asks again and is told.
            log.info("job %s: stopped sending its log: %s", job_id, printable(str(err)))
            _cut_off(request)
        if allowed.lost:
            _cut_off(request)
    return response


async def _send_log(
    request: web.Request,
    engine: Engine,
    job_id: int,
    path: Path,
    first: LogRead,
    stop_at: int | None,
    follow: bool,
    response: web.StreamResponse,
    allowed: Callable[[], bool] = lambda: True,
    replica: int | None = None,
) -> None:
    bound = stop_at  # (see logs: where a read that does not follow stops)
    data = first.data
    if bound is not None and first.end > bound:
        data = data[: len(data) - (first.end - bound)]
    if data:
        await _write(request, response, data)
    offset = first.end
    last = False  # the job has ended: one more read for what it wrote just before
    while True:
        if bound is not None and offset >= bound:
            break
        if not allowed():
            return  # (no end of stream: the reader asks again, and is told why not)
        if _gone(request):
            return  # (it left while the job was quiet: its slot is free again)
        piece = await asyncio.to_thread(read_chunk, path, offset)
        if piece.start != offset or piece.note:
            # Cut back past what this reader had: what it asks for next no longer
            # follows from what it got. Ended without an end of stream, it asks again
            # (as of a lost engine) and is told where the output goes on.
            _cut_off(request)
            return
        if piece.data:
            data = piece.data
            if bound is not None and piece.end > bound:
                data = data[: len(data) - (piece.end - bound)]
            offset = piece.end
            await _write(request, response, data)
            continue
        if first.size is not None and not await asyncio.to_thread(os.path.lexists, path):
            # (removed under the reader, by `clean` or by hand: read as its end, `logs`
            # had part of it and exited 0, and `logs -f` stopped with no word)
            raise LogUnreadable(f"{path.name} is missing (removed from jobs/)")
        if last or not follow or _output_ended(await engine.get(job_id), replica):
            if last or not follow:
                break
            last = True  # (one last read: output written just before the exit)
            continue
        try:
            await engine.wait(job_id, timeout=0.25)
        except TimeoutError:
            pass
    await response.write_eof()


def _output_ended(job: Job, replica: int | None) -> bool:
    """Whether a followed log has no more to come: its job has ended, or the replica is
    one a scale-down removed and has ended (its follow waited, silent, for the whole
    service's end: tester h109)."""
    if not job.status.is_active:
        return True
    if replica is None:
        return False
    removed = replica >= int(job.spec.get("replicas", 1))
    return removed and all(r.index != replica for r in job.replicas)


class _QuietBadRequests(logging.Filter):
    """aiohttp logs a malformed request (a bad header, a line too long: a client's fault,
    answered 400) as an ERROR with a traceback; it becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        # (A body its Content-Encoding does not decode is answered 400 by the handler;
        # aiohttp then reads the rest of it, fails again, and logged that as an ERROR.)
        if isinstance(error, HttpProcessingError | ConnectionError | web.RequestPayloadError):
            log.info("a client's bad request was refused: %s", " ".join(str(error).split()))
            return False
        return True


logging.getLogger("aiohttp.server").addFilter(_QuietBadRequests())


async def events(request: web.Request) -> web.StreamResponse:
    """GET /v1/events: NDJSON, one event per line, until the client goes away."""
    engine = request.app[ENGINE_KEY]
    allowed = _StillAllowed(request)
    streams = request.app[STREAMS_KEY]
    creds = peer_creds(request)
    with streams.held(engine, peer_uid(request)), _following(streams, creds and creds[0]):
        subscription = engine.subscribe()
        # (Read with the subscription, before any await: the first event it gets is the
        # one after this; a reader had no way to tell one missed before its first.)
        # (and which engine: a reader that reconnects can tell a restarted one, whose
        # seq starts again, from the same one: tester h149)
        hello = (
            json.dumps(
                {
                    "kind": "hello",
                    "seq": engine.bus.last_seq,
                    "pid": os.getpid(),
                    "started_at": engine.started_at,
                    "version": __version__,
                }
            )
            + "\n"
        ).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(hello)
        try:
            while True:
                try:
                    async with asyncio.timeout(GONE_CHECK_S):
                        event = await subscription.queue.get()
                except TimeoutError:
                    if _gone(request):
                        break  # (it left: its slot is free again, not at the next event)
                    continue
                if event is None:
                    await _end_of_events(request, response, subscription)
                    break
                if not allowed():
                    _cut_off(request)  # (taken out of [security] since it subscribed)
                    break
                # What queued meanwhile goes in the same write: one per burst, not per event.
                more, ended = subscription.ready()
                await _write(request, response, b"".join(e.line() for e in (event, *more)))
                if ended:
                    await _end_of_events(request, response, subscription)
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            subscription.close()
    return response


async def _end_of_events(
    request: web.Request, response: web.StreamResponse, subscription: Subscription
) -> None:
    """A reader cut off for falling behind is told so in a last line (``{"kind":
    "lagged"}``: read the state again, then subscribe again); its stream read as the
    engine's end. One ended because the engine stops is told that (``{"kind":
    "stopping"}``): a stream that just ended read as a crash (tester h149)."""
    if subscription.overflowed:
        line = {
            "kind": "lagged",
            "data": {
                "message": "this reader fell behind by more events than are kept for it "
                "and was cut off: read the state again and subscribe again"
            },
        }
    else:
        line = {
            "kind": "stopping",
            "data": {"message": "the engine is stopping (its running jobs keep running)"},
        }
    with contextlib.suppress(ConnectionError):
        await _write(request, response, json.dumps(line).encode() + b"\n")


def make_app(engine: Engine) -> web.Application:
    """The aiohttp application serving ``engine``."""
    app = web.Application(middlewares=[_access, _errors, _known_query], client_max_size=MAX_BODY)
    app[ENGINE_KEY] = engine
    app[GATE_KEY] = _Gate()
    app[STREAMS_KEY] = _Streams()
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/gpus", gpus)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_get("/v1/jobs/{job_id}/usage", job_usage)
    app.router.add_get("/v1/jobs/{job_id}/why", job_why)
    app.router.add_get("/v1/users", users)
    app.router.add_post("/v1/queue/pause", queue_pause)
    app.router.add_post("/v1/queue/resume", queue_resume)
    app.router.add_post("/v1/jobs/{job_id}/restart", job_restart)
    app.router.add_patch("/v1/jobs/{job_id}", job_edit)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel)
    app.router.add_post("/v1/jobs/cancel", cancel_many)
    # The streams take no HEAD (405): an answer that is written as it goes has no headers
    # of its own to give, and `HEAD /v1/events` streamed its events, for ever (h149).
    app.router.add_get("/v1/jobs/{job_id}/wait", wait, allow_head=False)
    app.router.add_get("/v1/jobs/{job_id}/logs", logs, allow_head=False)
    app.router.add_post("/v1/adopt", adopt)
    app.router.add_get("/v1/processes/{pid}", process)
    app.router.add_post("/v1/processes/{pid}/signal", process_signal)
    app.router.add_get("/v1/ready", ready)
    app.router.add_get("/v1/doctor", doctor)
    app.router.add_post("/v1/clean", clean)
    app.router.add_post("/v1/config/reload", reload_config)
    app.router.add_get("/v1/metrics", metrics)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/domains", domains)
    app.router.add_post("/v1/domains/{name}/drain", drain)
    app.router.add_post("/v1/domains/{name}/release", release)
    app.router.add_post("/v1/domains/{name}/forget", forget)
    app.router.add_get("/v1/events", events, allow_head=False)
    return app


class ApiServer:
    """Serves an engine on its Unix socket (mode 0600, in the 0700 state dir).

    When ``[security]`` allows other users, they must be able to reach the socket: it is
    then mode 0666 in a state dir of mode 0711 (others may traverse it but not list it,
    and the database is made 0600, like the logs in the 0700 ``jobs/`` dir), and every
    request is checked against ``SO_PEERCRED`` instead. The mode is set when serving
    starts; who is allowed is read from the live config on every request.
    """

    def __init__(self, engine: Engine, path: Path) -> None:
        self.engine = engine
        self.path = path
        self._runner: web.AppRunner | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._folder: tuple[int, int] | None = None  # (device, inode) of the socket's folder
        self._bound: tuple[int, int] | None = None  # (device, inode) of the socket bound
        self.connections = ConnectionCount(lambda: engine.config.limits.connections_per_user)
        """Open connections per uid (see :mod:`.api_connections`)."""

    def followers(self) -> int:
        """Other processes following the engine's events now: TUIs attached from other
        windows (a TUI that embeds this engine, and follows it through this socket too,
        asks before it quits and stops it under them)."""
        if self._runner is None:
            return 0
        by_pid = self._runner.app[STREAMS_KEY].followers
        return sum(n for pid, n in by_pid.items() if pid != os.getpid())

    @property
    def submissions_refused(self) -> int:
        """Submissions answered 429 unread since the start: every ``[limits]
        submissions_in_flight`` slot was taken."""
        return 0 if self._runner is None else self._runner.app[GATE_KEY].refused

    async def start(self) -> None:
        """Bind the socket. A leftover socket file is removed: we hold the engine lock."""
        self.path.unlink(missing_ok=True)
        # A short shutdown grace: open streams (a TUI following /events, `logs -f`) are
        # ended by bus.close(); nothing else should keep a stopping engine waiting 60 s.
        # keepalive_timeout also bounds a new connection's wait for its first request
        # (aiohttp arms it at connection_made): a client that connects and sends nothing,
        # or half a header, is closed instead of holding a descriptor for ever. A request
        # being served (a stream) is never cut by it.
        self._runner = web.AppRunner(
            make_app(self.engine),
            handle_signals=False,
            access_log=None,
            shutdown_timeout=3.0,
            keepalive_timeout=self.engine.config.limits.idle_connection,
            # A request line past aiohttp's 8190 bytes was refused by aiohttp itself, in
            # text/plain ("Got more than 8190 bytes"), before any handler could say which
            # field is too long: a 9,000-character filter got a bare "HTTP 400". Every
            # field's own limit is well below this one.
            max_line_size=MAX_REQUEST_LINE,
            max_field_size=MAX_REQUEST_LINE,
        )
        await self._runner.setup()
        self.engine.on_reconfigure(self._reconfigured)
        await self._listen()
        st = os.stat(self.path.parent)
        self._folder = (st.st_dev, st.st_ino)
        self._keeper = asyncio.get_running_loop().create_task(
            self._keep_socket(), name="api-socket-keeper"
        )

    async def _listen(self) -> None:
        """Bind the socket's path and serve on it."""
        assert self._runner is not None
        old_umask = os.umask(0o177)
        try:
            # (bound through the directory when the path is longer than sun_path takes)
            with SocketPath(self.path) as where:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.bind(where.path)
                except OSError:
                    sock.close()
                    raise
            # (aiohttp's 128: while the loop ran one large request, 400 clients connecting
            # at once were refused by the kernel, curl's "Couldn't connect": tester h64;
            # the kernel caps it at net.core.somaxconn)
            site = CountedSocketSite(self._runner, sock, self.connections, LISTEN_BACKLOG)
            await site.start()
        finally:
            os.umask(old_umask)
        st = os.lstat(self.path)
        self._bound = (st.st_dev, st.st_ino)
        self._set_modes()

    async def _keep_socket(self) -> None:
        """Bind the socket's path again when it is removed while the engine runs (only in
        the folder it was started in). Removed, the engine served on, unreachable: the CLI
        said no engine ran, and starting one was refused, as this one held the lock
        (tester h60). The launcher does the same for its own socket."""
        said = ""
        while True:
            await asyncio.sleep(SOCKET_CHECK_S)
            try:
                lost = self._socket_lost()
                if lost is None:
                    continue
                await self._listen()
            except OSError as err:
                if str(err) != said:
                    log.error("cannot listen on %s again: %s", self.path, err)
                said = str(err)
                continue
            said = ""
            log.warning("%s was %s; listening on it again", self.path, lost)

    def _socket_lost(self) -> str | None:
        """How the socket's path stopped being this engine's socket in the folder it was
        bound in ("removed", or "replaced by ...", which is then removed), or None (a stat
        of a local folder: no thread for it). A path replaced by a file or a link was
        never bound again: the engine served on, unreachable, and the CLI said no engine
        ran (tester h149).

        Raises:
            OSError: The folder cannot be read, or what replaced the socket removed.
        """
        try:
            there = os.lstat(self.path)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == self._bound:
            return None
        st = os.stat(self.path.parent)
        if (st.st_dev, st.st_ino) != self._folder:
            return None  # (another folder there: not ours)
        if there is None:
            return "removed"
        from .logfiles import kind_of

        kind = kind_of(there.st_mode)
        os.unlink(self.path)  # (a link itself, never what it names; a folder: OSError)
        return f"replaced by {kind}"

    def _reconfigured(self, config: Config) -> None:
        """``[limits] idle_connection`` for the connections made from now on (it was
        read once, at start, while a reload said it applied)."""
        server = self._runner.server if self._runner is not None else None
        kwargs = getattr(server, "_kwargs", None)  # (aiohttp keeps each connection's here)
        if isinstance(kwargs, dict):
            kwargs["keepalive_timeout"] = config.limits.idle_connection

    def _set_modes(self) -> None:
        state = self.engine.paths.state_dir
        # The database holds every job's environment: 0600 whoever may use the socket (a
        # new one is made so by the store; one made 0644 by an older version is made
        # 0600 here; SQLite gives its -wal and -shm the database's mode).
        database = self.engine.paths.database
        for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
            if path.exists():
                os.chmod(path, 0o600)
        if not self.engine.config.security.opens_socket:
            os.chmod(self.path, 0o600)
            return
        os.chmod(self.path, 0o666)
        if self.path.parent == state:
            os.chmod(state, 0o711)

    async def stop(self) -> None:
        """Close the socket and every open connection (event streams included)."""
        if self._keeper is not None:
            await cancel_and_wait(self._keeper)
            self._keeper = None
        if self._runner is not None:
            self.engine.bus.close()
            await self._runner.cleanup()
            self._runner = None
        self.path.unlink(missing_ok=True)
