"""How the TUI reaches an engine: always through its socket API, embedded or attached.

There is one client (:class:`SocketBackend`, aiohttp over the Unix socket), so the TUI gets
the same answers, checks and errors whether the engine runs in another process
(``gpulayer-tui --serve``) or inside the TUI: an embedded engine (:class:`EmbeddedBackend`)
starts the engine and its API server in the TUI's event loop and then talks to it through
that same client. The screens only ever see :class:`EngineBackend` and the wire contract's
JSON shapes (:mod:`gpulayer_tui.wire`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast
from urllib.parse import quote

from .engine.paths import Paths
from .fields import printable
from .unixsock import SocketPath
from .wire import (
    DomainJSON,
    EventJSON,
    GpusJSON,
    HealthJSON,
    JobDetailJSON,
    JobJSON,
    JobPageJSON,
    JobRowJSON,
    ProcessInfoJSON,
    RestartedJSON,
    UsageJSON,
    UsersJSON,
)

if TYPE_CHECKING:
    from .engine.engine import Engine


HEALTH_S = 2.0
"""Seconds a health check waits for the engine before it counts as not answering."""

SUBMIT_BUSY_S = 30.0
"""How long a submission refused unread (the engine busy with others) is sent again."""


class LogChunk(NamedTuple):
    """A piece of a job's output and where its output goes on after it."""

    data: bytes
    """What to show (a cut log's note first when the output asked for was dropped)."""
    next: int
    """The offset to read from next: in the job's whole output, so it stays true when
    the log is cut back (the bytes read did not: the kept end came again, in a loop)."""
    size: int | None = None
    """The whole output's length when it was read (``None``: not said)."""


def _json_shown(data: bytes) -> Any:
    """``data`` decoded, through :func:`shown` unless its text cannot hold an unsafe
    character: JSON that is all ASCII with no escape at all needs no walk, and most
    answers are that (two scans at memory speed: ~7 us for a 500-row page, against
    ~1.3 ms for the walk)."""
    value = json.loads(data)
    if data.isascii() and b"\\" not in data:
        return value
    return shown(value)


def shown(value: Any) -> Any:
    """``value`` (decoded JSON) with every string made safe to draw: what a user or a
    process wrote (job names, commands, working directories, messages that quote them,
    other users' command lines) may hold terminal escapes, C1 controls or bidi overrides,
    and Rich passes those to the terminal as they are. Each such character is written as
    an escape (:func:`~gpulayer_tui.fields.printable`; line breaks and tabs are kept for
    the widgets to lay out). Changed in place; most strings pass one ``isprintable()``.

    The screens only show what they get and act by ids, so nothing they send back is
    changed by this.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str):
                if not item.isprintable():
                    value[key] = printable(item, keep="\n\t")
            elif isinstance(item, dict | list):
                shown(item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str):
                if not item.isprintable():
                    value[index] = printable(item, keep="\n\t")
            elif isinstance(item, dict | list):
                shown(item)
    elif isinstance(value, str) and not value.isprintable():
        return printable(value, keep="\n\t")
    return value


class BackendError(RuntimeError):
    """The engine refused a request; the text is its message.

    Attributes:
        status: The HTTP status (400 bad input, 404 unknown, 409 not applicable, 429
            back-pressure, 503 refusing work or unreachable).
        field: The input at fault, when the engine named one (a form marks that field).
    """

    def __init__(self, message: str, status: int = 400, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class ConnectionLost(BackendError):
    """The engine cannot be reached any more."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503)


class EngineBackend(Protocol):
    """What the TUI needs from an engine."""

    mode: str
    """``"embedded"`` or ``"attached"``."""
    location: str
    """The state dir (embedded) or socket path (attached)."""

    async def close(self) -> None:
        """Release the engine (embedded: stop it; jobs keep running)."""
        ...

    async def health(self) -> HealthJSON:
        """Engine identity and overall state."""
        ...

    async def gpus(self) -> GpusJSON:
        """Domains, samples, VRAM accounting and history."""
        ...

    async def jobs(
        self, statuses: list[str] | None = None, limit: int = 10_000
    ) -> list[JobRowJSON]:
        """Job rows, newest first (one page: at most 10,000)."""
        ...

    async def jobs_page(self, **query: Any) -> JobPageJSON:
        """One page of job rows and whether more follow (``GET /v1/jobs``'s parameters:
        ``status``, ``q``, ``sort``, ``order``, ``before``, ``after``, ``offset``, ``limit``)."""
        ...

    async def job(self, job_id: int) -> JobDetailJSON:
        """One job and its timeline."""
        ...

    async def usage(self, job_id: int) -> UsageJSON:
        """What a job used of its GPUs: its summary (``None`` for a job never seen holding
        a GPU) and per-GPU series, live while it runs."""
        ...

    async def submit(self, spec: dict[str, Any]) -> JobJSON:
        """Submit a job spec; return the job (which may be ``failed``: over capacity)."""
        ...

    async def cancel(self, job_id: int) -> JobJSON:
        """Cancel a job; return it (possibly still stopping)."""
        ...

    async def cancel_many(self, job_ids: list[int]) -> list[dict[str, Any]]:
        """Cancel several jobs in one request (``POST /v1/jobs/cancel``), durable together;
        one entry per id, in order: the job, or ``{"id", "error", "status"}`` for one
        refused (404, 403, 409)."""
        ...

    async def adopt(self, request: dict[str, Any]) -> JobJSON:
        """Adopt a process (``{"pid", "start_ticks"?, "name"?, "vram_gb"?, ...}``); return
        the job (``running``, or ``failed`` with the refusal)."""
        ...

    async def process(self, pid: int) -> ProcessInfoJSON:
        """What the engine sees of a process (its command, user and start time)."""
        ...

    async def restart(self, job_id: int) -> RestartedJSON:
        """Submit an ended job's spec again as a new job (``restart_of`` names the old one);
        return the new job (which may be ``failed``: over capacity), the dependencies it
        left out and any warnings. A running service restarts its replicas one at a time
        instead (``rolling``: which, in order; ``job``: the service)."""
        ...

    async def edit(self, job_id: int, changes: dict[str, Any]) -> JobJSON:
        """Change a waiting job (``priority``, ``gpus``, ``vram_gb``, ``timeout``, ...);
        return it as edited."""
        ...

    async def why(self, job_id: int) -> dict[str, Any]:
        """Why a job waits: its place, the reservation, its user's limits, the fair-share
        order (``gpulayer-tui why``)."""
        ...

    async def users(self) -> UsersJSON:
        """Every user with recent GPU use, running or waiting jobs, in fair-share order
        (``gpulayer-tui users``): GPU-hours, share, what runs and waits, the limits."""
        ...

    async def signal_process(self, pid: int, signal: str, start_ticks: int | None) -> str:
        """Send ``SIG<signal>`` to a stray GPU process (only while it is the process that
        started at ``start_ticks``); return what was done, in the engine's words."""
        ...

    async def read_log(
        self, job_id: int, offset: int, limit: int = 256 * 1024, replica: int | None = None
    ) -> LogChunk:
        """Up to ``limit`` bytes of the job's (or a service replica's) output from
        ``offset`` (an offset in its whole output: :attr:`LogChunk.next`)."""
        ...

    async def domain_action(self, name: str, action: str, reason: str | None = None) -> DomainJSON:
        """``drain`` (with ``reason``; none: "drained from the TUI") or ``release`` a
        domain; return its new state."""
        ...

    async def queue_action(self, action: str) -> dict[str, Any]:
        """``pause`` or ``resume`` the queue: ``{"paused_at": when, or None}``."""
        ...

    def events(self) -> AsyncIterator[EventJSON]:
        """Every engine event from now on; ends if the engine goes away.

        The first item is ``{"kind": "hello"}``, sent once the subscription is live:
        whatever changes after it arrives as an event, so a picture loaded after the
        hello misses nothing.
        """
        ...


class SocketBackend:
    """An engine reached over its Unix socket (the one client the TUI has)."""

    mode = "attached"

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.location = str(paths.socket)
        self._session: Any = None
        self._where: SocketPath | None = None

    def _client(self) -> Any:
        import aiohttp

        if self._session is None:
            # A long path is reached through its directory, held open while the session
            # may connect (see unixsock).
            self._where = SocketPath(self.paths.socket)
            connector = aiohttp.UnixConnector(path=self._where.path)
            self._session = aiohttp.ClientSession(connector=connector, base_url="http://engine")
        return self._session

    async def close(self) -> None:
        """Close the connection (the engine keeps running)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._where is not None:
            self._where.close()
            self._where = None

    def _lost(self) -> ConnectionLost:
        return ConnectionLost(f"lost the connection to the engine at {self.location}")

    async def _request(
        self, method: str, path: str, answer_within: float | None = None, **kwargs: Any
    ) -> Any:
        import aiohttp

        if answer_within is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=answer_within)
        try:
            async with self._client().request(method, "/v1" + path, **kwargs) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    raise _refusal(resp.status, data)
                return _json_shown(data) if data else None
        except TimeoutError:  # (aiohttp's timeouts are TimeoutErrors)
            raise ConnectionLost(
                f"the engine at {self.location} is not answering (no answer in "
                f"{answer_within or 300:g} s: stopped, or overloaded)" + _maybe_done(method)
            ) from None
        except (aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError):
            # (not even connected: nothing was sent; "lost the connection" said otherwise)
            raise ConnectionLost(
                f"no engine answers at {self.location}: nothing was sent (start one with "
                "`gpulayer-tui --serve`)"
            ) from None
        except aiohttp.ClientConnectionError:
            raise ConnectionLost(str(self._lost()) + _maybe_done(method)) from None

    async def health(self) -> HealthJSON:
        """Engine identity and overall state."""
        # A short deadline: the app polls this to say "not answering" within seconds.
        return cast(HealthJSON, await self._request("GET", "/health", answer_within=HEALTH_S))

    async def gpus(self) -> GpusJSON:
        """Domains, samples, VRAM accounting and history."""
        return cast(GpusJSON, await self._request("GET", "/gpus"))

    async def jobs(
        self, statuses: list[str] | None = None, limit: int = 10_000
    ) -> list[JobRowJSON]:
        """Job rows, newest first (one page: at most 10,000)."""
        return (await self.jobs_page(status=",".join(statuses or ()), limit=limit))["jobs"]

    async def jobs_page(self, **query: Any) -> JobPageJSON:
        """One page of job rows and whether more follow."""
        params = {k: str(v) for k, v in query.items() if v not in (None, "")}
        return cast(JobPageJSON, await self._request("GET", "/jobs", params=params))

    async def job(self, job_id: int) -> JobDetailJSON:
        """One job and its timeline."""
        return cast(JobDetailJSON, await self._request("GET", f"/jobs/{int(job_id)}"))

    async def usage(self, job_id: int) -> UsageJSON:
        """What a job used of its GPUs (summary and per-GPU series)."""
        return cast(UsageJSON, await self._request("GET", f"/jobs/{int(job_id)}/usage"))

    async def submit(self, spec: dict[str, Any]) -> JobJSON:
        """Submit one job."""
        import asyncio
        import time

        from .client import BUSY_REFUSAL

        # Refused unread while every [limits] submissions_in_flight slot is taken (nothing
        # stored): sent again each second, as the engine asks, for up to 30 s, as the CLI
        # does; the form said "too many submissions at once" at the first refusal.
        give_up = time.monotonic() + SUBMIT_BUSY_S
        while True:
            try:
                answer = await self._request("POST", "/jobs", json=spec)
            except BackendError as err:
                busy = err.status == 429 and str(err).startswith(BUSY_REFUSAL)
                if not busy or time.monotonic() + 1.0 > give_up:
                    raise
                await asyncio.sleep(1.0)
                continue
            return cast(JobJSON, answer["job"])

    async def cancel(self, job_id: int) -> JobJSON:
        """Cancel one job."""
        return cast(JobJSON, (await self._request("POST", f"/jobs/{int(job_id)}/cancel"))["job"])

    async def cancel_many(self, job_ids: list[int]) -> list[dict[str, Any]]:
        """Cancel several jobs in one request."""
        body = {"ids": [int(job_id) for job_id in job_ids]}
        return list((await self._request("POST", "/jobs/cancel", json=body))["jobs"])

    async def adopt(self, request: dict[str, Any]) -> JobJSON:
        """Adopt a process."""
        return cast(JobJSON, (await self._request("POST", "/adopt", json=request))["job"])

    async def process(self, pid: int) -> ProcessInfoJSON:
        """What the engine sees of a process."""
        return cast(ProcessInfoJSON, await self._request("GET", f"/processes/{int(pid)}"))

    async def restart(self, job_id: int) -> RestartedJSON:
        """Run an ended job again, as a new job (a running service: its replicas one at a
        time)."""
        answer = await self._request("POST", f"/jobs/{int(job_id)}/restart")
        answer.setdefault("left_out", [])  # (an older engine's answer)
        return cast(RestartedJSON, answer)

    async def edit(self, job_id: int, changes: dict[str, Any]) -> JobJSON:
        """Change a waiting job."""
        path = f"/jobs/{int(job_id)}"
        return cast(JobJSON, (await self._request("PATCH", path, json=changes))["job"])

    async def why(self, job_id: int) -> dict[str, Any]:
        """Why a job waits."""
        return dict(await self._request("GET", f"/jobs/{int(job_id)}/why"))

    async def users(self) -> UsersJSON:
        """Every user in fair-share order, with what runs and waits and the limits."""
        return cast(UsersJSON, await self._request("GET", "/users"))

    async def signal_process(self, pid: int, signal: str, start_ticks: int | None) -> str:
        """Signal a stray GPU process."""
        body: dict[str, Any] = {"signal": signal}
        if start_ticks is not None:
            body["start_ticks"] = start_ticks
        path = f"/processes/{int(pid)}/signal"
        return str((await self._request("POST", path, json=body))["done"])

    async def queue_action(self, action: str) -> dict[str, Any]:
        """Pause or resume the queue (``action``: ``"pause"`` or ``"resume"``)."""
        if action not in ("pause", "resume"):
            raise ValueError(f"no queue action {action!r}")
        return dict(await self._request("POST", f"/queue/{action}"))

    async def domain_action(self, name: str, action: str, reason: str | None = None) -> DomainJSON:
        """Drain (with ``reason``, else "drained from the TUI") or release a domain."""
        body = {"reason": reason or "drained from the TUI"} if action == "drain" else None
        path = f"/domains/{quote(name, safe='')}/{action}"
        return cast(DomainJSON, (await self._request("POST", path, json=body))["domain"])

    async def read_log(
        self, job_id: int, offset: int, limit: int = 256 * 1024, replica: int | None = None
    ) -> LogChunk:
        """A chunk of the job's (or a service replica's) output."""
        import aiohttp

        params = {"offset": str(offset)}
        if replica is not None:
            params["replica"] = str(replica)
        try:
            async with self._client().get(f"/v1/jobs/{int(job_id)}/logs", params=params) as resp:
                if resp.status >= 400:
                    raise _refusal(resp.status, await resp.read())
                data = bytes(await resp.content.read(limit))
                start = int(resp.headers.get("X-Log-Offset", offset))
                note = int(resp.headers.get("X-Log-Note", 0))
                size = resp.headers.get("X-Log-Size")
                return LogChunk(
                    data, start + max(0, len(data) - note), None if size is None else int(size)
                )
        except aiohttp.ClientConnectionError:
            raise self._lost() from None

    async def events(self) -> AsyncIterator[EventJSON]:
        """Engine events from the NDJSON stream; ends when the stream does."""
        import aiohttp

        try:
            async with self._client().get("/v1/events", timeout=aiohttp.ClientTimeout()) as resp:
                if resp.status >= 400:
                    # (refused, e.g. past [limits] streams_per_user: its words, not "event
                    # stream lost; reconnecting" for as long as it lasted: tester h156)
                    raise _refusal(resp.status, await resp.read())
                async for line in resp.content:
                    if line.strip():
                        yield _json_shown(line)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            return


def _maybe_done(method: str) -> str:
    """What a change asked for and never answered may have become."""
    if method == "GET":
        return ""
    return " before it answered: it may have been done (look before asking again)"


def _refusal(status: int, data: bytes) -> BackendError:
    """The engine's error answer as an exception (its message and field)."""
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return BackendError(f"HTTP {status}", status)
    field = body.get("field")
    return BackendError(
        shown(str(body.get("error") or f"HTTP {status}")),
        status,
        field if isinstance(field, str) else None,
    )


class EmbeddedBackend(SocketBackend):
    """An engine living in the TUI's process, reached through its own socket like any other.

    :meth:`start` starts the engine and its API server (so the CLI works meanwhile too);
    every request then goes through :class:`SocketBackend`.
    """

    mode = "embedded"

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine.paths)
        self.engine = engine
        self.location = str(engine.paths.state_dir)
        self._server: Any = None

    async def start(self) -> None:
        """Start the engine and its API socket.

        Raises:
            EngineBusy, ConfigError, StoreError: From :meth:`Engine.start`.
        """
        from .engine.api import ApiServer

        await self.engine.start()
        server = ApiServer(self.engine, self.engine.paths.socket)
        try:
            await server.start()
        except BaseException:
            await self.engine.stop()
            raise
        self._server = server

    def attached_elsewhere(self) -> int:
        """How many TUIs in other windows follow this engine through its socket."""
        return self._server.followers() if self._server is not None else 0

    async def close(self) -> None:
        """Stop serving and stop the engine; running jobs keep running."""
        await super().close()
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self.engine.running:
            await self.engine.stop()


async def engine_is_serving(paths: Paths) -> bool:
    """True if an engine answers on the state dir's socket.

    Raises:
        EngineRefused: One serves, and refuses this user (``[security]``): a TUI took
            that for no engine, and started one of its own on that state dir, which
            failed on its owner (tester h75). Or its socket cannot be reached (another
            user's private state dir), or is reached through a symlink another user
            owns (see :mod:`.pathwalk`).
    """
    from .pathwalk import untrusted_link

    why = untrusted_link(str(paths.state_dir))
    if why is not None:
        raise EngineRefused(f"not connecting to the engine: {why}")
    try:
        if not paths.socket.exists():
            return False
    except PermissionError:
        # (a traceback, from `web` and the TUI of a user another's engine does not serve:
        # tester h155)
        raise EngineRefused(
            f"cannot reach the engine's socket {paths.socket}: permission denied; an engine "
            "serves only its own user unless its config lists yours in [security]"
        ) from None
    backend = SocketBackend(paths)
    try:
        await backend.health()
        return True
    except BackendError as err:
        if err.status == 403:
            raise EngineRefused(str(err)) from None
        return False
    finally:
        await backend.close()


class EngineRefused(BackendError):
    """An engine serves the state dir and refuses this user (403)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 403)
