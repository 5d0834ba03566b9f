"""One interface to the engine for the TUI, whether it runs in-process or behind a socket.

The screens only ever see :class:`EngineBackend` and plain JSON-shaped dicts (the API's
shapes), so they cannot tell an embedded engine from an attached one.

* :class:`EmbeddedBackend` runs an :class:`~gpulayer_tui.engine.engine.Engine` in the
  TUI's own event loop and also serves its API socket, so the CLI can attach meanwhile.
* :class:`AttachedBackend` talks to a running ``--serve`` over its Unix socket (aiohttp).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import quote

from .engine.paths import Paths


class BackendError(RuntimeError):
    """The engine refused a request (bad input, unknown id, ...); the text is its message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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

    async def health(self) -> dict[str, Any]:
        """Engine identity and overall state."""
        ...

    async def gpus(self) -> dict[str, Any]:
        """Domains, samples, VRAM accounting and history."""
        ...

    async def jobs(
        self, statuses: list[str] | None = None, limit: int = 10_000
    ) -> list[dict[str, Any]]:
        """Jobs, newest first."""
        ...

    async def job(self, job_id: int) -> dict[str, Any]:
        """``{"job": ..., "events": [...]}`` for one job."""
        ...

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit a job spec; return the job (which may be ``failed``: over capacity)."""
        ...

    async def cancel(self, job_id: int) -> dict[str, Any]:
        """Cancel a job; return it (possibly still stopping)."""
        ...

    async def adopt(self, request: dict[str, Any]) -> dict[str, Any]:
        """Adopt a process (``{"pid", "start_ticks"?, "name"?, "vram_gb"?, ...}``); return
        the job (``running``, or ``failed`` with the refusal)."""
        ...

    async def read_log(
        self, job_id: int, offset: int, limit: int = 256 * 1024, replica: int | None = None
    ) -> bytes:
        """Up to ``limit`` bytes of the job's (or a service replica's) output from ``offset``."""
        ...

    async def domain_action(self, name: str, action: str) -> dict[str, Any]:
        """``drain`` or ``release`` a domain; return its new state."""
        ...

    def events(self) -> AsyncIterator[dict[str, Any]]:
        """Every engine event from now on, as JSON dicts; ends if the engine goes away."""
        ...


class EmbeddedBackend:
    """An engine living in this process (and serving its socket for the CLI)."""

    mode = "embedded"

    def __init__(self, engine: Any, serve_socket: bool = True) -> None:
        self.engine = engine
        self.location = str(engine.paths.state_dir)
        self._serve_socket = serve_socket
        self._server: Any = None

    async def start(self) -> None:
        """Start the engine and its API socket.

        Raises:
            EngineBusy, ConfigError, StoreError: From :meth:`Engine.start`.
        """
        from .engine.api import ApiServer

        await self.engine.start()
        if self._serve_socket:
            self._server = ApiServer(self.engine, self.engine.paths.socket)
            await self._server.start()

    async def close(self) -> None:
        """Stop serving and stop the engine; running jobs keep running."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self.engine.stop()

    async def _call(self, coro: Any) -> Any:
        from .engine.engine import JobNotActive, SpecError, UnknownJob
        from .engine.store import StoreError

        try:
            return await coro
        except SpecError as err:
            raise BackendError(str(err), 400) from None
        except UnknownJob as err:
            raise BackendError(str(err), 404) from None
        except JobNotActive as err:
            raise BackendError(str(err), 409) from None
        except StoreError as err:
            raise BackendError(str(err), 503) from None

    async def health(self) -> dict[str, Any]:
        """Engine identity and overall state."""
        return dict(self.engine.health())

    async def gpus(self) -> dict[str, Any]:
        """Domains, samples, VRAM accounting and history."""
        return dict(self.engine.gpus())

    async def jobs(
        self, statuses: list[str] | None = None, limit: int = 10_000
    ) -> list[dict[str, Any]]:
        """Jobs, newest first."""
        jobs = await self._call(self.engine.list_jobs(statuses or [], limit))
        return [j.to_json() for j in jobs]

    async def job(self, job_id: int) -> dict[str, Any]:
        """One job and its timeline."""
        job = await self._call(self.engine.get(job_id))
        events = await self._call(self.engine.events_of(job_id))
        return {"job": job.to_json(), "events": events}

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit one job."""
        job = await self._call(self.engine.submit(spec, None))
        return dict(job.to_json())

    async def cancel(self, job_id: int) -> dict[str, Any]:
        """Cancel one job."""
        job = await self._call(self.engine.cancel(job_id))
        return dict(job.to_json())

    async def adopt(self, request: dict[str, Any]) -> dict[str, Any]:
        """Adopt a process."""
        request = dict(request)
        pid = request.pop("pid", None)
        unknown = sorted(set(request) - {"start_ticks", "name", "vram_gb", "gpu", "domain"})
        if unknown:
            raise BackendError(f"unknown field '{unknown[0]}'", 400)
        job = await self._call(self.engine.adopt(pid, **request))
        return dict(job.to_json())

    async def domain_action(self, name: str, action: str) -> dict[str, Any]:
        """Drain or release a domain."""
        from .engine.health import DomainRefused

        try:
            if action == "drain":
                return dict(
                    await self._call(self.engine.drain_domain(name, "drained from the TUI"))
                )
            return dict(await self._call(self.engine.release_domain(name)))
        except DomainRefused as err:
            raise BackendError(str(err), 409) from None

    async def read_log(
        self, job_id: int, offset: int, limit: int = 256 * 1024, replica: int | None = None
    ) -> bytes:
        """A chunk of the job's (or a service replica's) output (read in a thread)."""
        job = await self._call(self.engine.get(job_id))
        try:
            self.engine.check_replica(job, replica)
        except ValueError as err:
            raise BackendError(str(err), 400) from None
        path = self.engine.log_path(job_id, replica)

        def read() -> bytes:
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    return fh.read(limit)
            except FileNotFoundError:
                return b""

        return await asyncio.to_thread(read)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Engine events as JSON dicts."""
        subscription = self.engine.subscribe()
        try:
            async for event in subscription:
                yield event.to_json()
        finally:
            subscription.close()


class AttachedBackend:
    """A ``--serve`` engine reached over its Unix socket."""

    mode = "attached"

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.location = str(paths.socket)
        self._session: Any = None

    def _client(self) -> Any:
        import aiohttp

        if self._session is None:
            connector = aiohttp.UnixConnector(path=str(self.paths.socket))
            self._session = aiohttp.ClientSession(connector=connector, base_url="http://engine")
        return self._session

    async def close(self) -> None:
        """Close the connection (the engine keeps running)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        import aiohttp

        try:
            async with self._client().request(method, "/v1" + path, **kwargs) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    try:
                        message = json.loads(data).get("error")
                    except (ValueError, AttributeError):
                        message = None
                    raise BackendError(message or f"HTTP {resp.status}", resp.status)
                return json.loads(data) if data else None
        except (aiohttp.ClientConnectionError, FileNotFoundError, ConnectionRefusedError):
            raise ConnectionLost(f"lost the connection to the engine at {self.location}") from None

    async def health(self) -> dict[str, Any]:
        """Engine identity and overall state."""
        return dict(await self._request("GET", "/health"))

    async def gpus(self) -> dict[str, Any]:
        """Domains, samples, VRAM accounting and history."""
        return dict(await self._request("GET", "/gpus"))

    async def jobs(
        self, statuses: list[str] | None = None, limit: int = 10_000
    ) -> list[dict[str, Any]]:
        """Jobs, newest first."""
        params = {"limit": str(limit)}
        if statuses:
            params["status"] = ",".join(statuses)
        return list((await self._request("GET", "/jobs", params=params))["jobs"])

    async def job(self, job_id: int) -> dict[str, Any]:
        """One job and its timeline."""
        return dict(await self._request("GET", f"/jobs/{int(job_id)}"))

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit one job."""
        return dict((await self._request("POST", "/jobs", json=spec))["job"])

    async def cancel(self, job_id: int) -> dict[str, Any]:
        """Cancel one job."""
        return dict((await self._request("POST", f"/jobs/{int(job_id)}/cancel"))["job"])

    async def adopt(self, request: dict[str, Any]) -> dict[str, Any]:
        """Adopt a process."""
        return dict((await self._request("POST", "/adopt", json=request))["job"])

    async def domain_action(self, name: str, action: str) -> dict[str, Any]:
        """Drain or release a domain."""
        body = {"reason": "drained from the TUI"} if action == "drain" else None
        path = f"/domains/{quote(name, safe='')}/{action}"
        return dict((await self._request("POST", path, json=body))["domain"])

    async def read_log(
        self, job_id: int, offset: int, limit: int = 256 * 1024, replica: int | None = None
    ) -> bytes:
        """A chunk of the job's (or a service replica's) output."""
        import aiohttp

        params = {"offset": str(offset)}
        if replica is not None:
            params["replica"] = str(replica)
        try:
            async with self._client().get(f"/v1/jobs/{int(job_id)}/logs", params=params) as resp:
                if resp.status >= 400:
                    raise BackendError(f"cannot read the log of job {job_id}", resp.status)
                return bytes(await resp.content.read(limit))
        except aiohttp.ClientConnectionError:
            raise ConnectionLost(f"lost the connection to the engine at {self.location}") from None

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Engine events from the NDJSON stream."""
        import aiohttp

        try:
            async with self._client().get("/v1/events", timeout=aiohttp.ClientTimeout()) as resp:
                async for line in resp.content:
                    if line.strip():
                        event = json.loads(line)
                        if event.get("kind") != "hello":
                            yield event
        except aiohttp.ClientConnectionError:
            return


async def engine_is_serving(paths: Paths) -> bool:
    """True if an engine answers on the state dir's socket."""
    if not paths.socket.exists():
        return False
    backend = AttachedBackend(paths)
    try:
        await backend.health()
        return True
    except BackendError:
        return False
    finally:
        await backend.close()
