"""HTTP+JSON API on the engine's Unix socket (aiohttp), plus an NDJSON event stream.

Routes (all under ``/v1``):

=======  ==========================  =====================================================
GET      /health                     engine identity, backend, capacity
GET      /gpus                       domains, latest sample, VRAM accounting, history
GET      /jobs?status=a,b&limit=N    jobs, newest first (``before=ID`` pages back)
POST     /jobs                       submit one spec, or ``{"jobs": [spec, ...]}`` at once
GET      /jobs/ID                    one job and its event timeline
POST     /jobs/ID/cancel             cancel (SIGTERM, SIGKILL after the grace period)
GET      /jobs/ID/wait?timeout=S     block until the job is terminal
GET      /jobs/ID/logs?offset=N      output from byte N; ``follow=1`` streams until it ends
POST     /adopt                      adopt a running process: {"pid", "start_ticks"?, "name"?,
                                     "vram_gb"?, "gpu"?, "domain"?}
GET      /ready                      200 when every domain is ready, else 503 naming them
GET      /domains                    every domain's state and health
POST     /domains/NAME/drain         stop new placements there ({"reason"?})
POST     /domains/NAME/release       back to service (a quarantined GPU must answer)
POST     /config/reload              read the config file again (also done on every edit)
GET      /doctor                     the engine's checks (domains, feasibility, clock)
GET      /metrics (also /metrics)    Prometheus text format
GET      /events                     every event as one JSON object per line
=======  ==========================  =====================================================

Errors are ``{"error": "..."}`` with 400 (bad input), 404 (unknown id), 409 (not
applicable, e.g. cancelling a finished job) or 503 (the engine refuses new work).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from .engine import Engine, JobNotActive
from .health import DomainRefused
from .lifecycle import UnknownJob
from .models import Job
from .spec import SpecError
from .store import StoreError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ENGINE_KEY: web.AppKey[Engine] = web.AppKey("engine", Engine)
MAX_BODY = 64 * 1024 * 1024
LOG_CHUNK = 256 * 1024


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map engine exceptions to clear JSON errors."""
    try:
        return await handler(request)
    except SpecError as err:
        return _error(400, str(err))
    except UnknownJob as err:
        return _error(404, str(err))
    except (JobNotActive, DomainRefused) as err:
        return _error(409, str(err))
    except StoreError as err:
        return _error(503, str(err))
    except web.HTTPException as err:
        if err.status < 400:
            raise
        # Unknown route or method: answer in JSON like every other error.
        return _error(err.status, f"{request.method} {request.path}: {err.reason}")


def peer_uid(request: web.Request) -> int | None:
    """The connecting process's uid, from ``SO_PEERCRED`` on the Unix socket."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _job_id(request: web.Request) -> int:
    raw = request.match_info["job_id"]
    if not raw.isdigit() or int(raw) < 1:
        raise SpecError(f"a job id is a positive integer, not {raw!r}")
    return int(raw)


def _int_query(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SpecError(f"{name} must be an integer, not {raw!r}") from None
    if value < 0:
        raise SpecError(f"{name} must not be negative")
    return value


def _float_query(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SpecError(f"{name} must be a number, not {raw!r}") from None
    if not value >= 0:
        raise SpecError(f"{name} must not be negative")
    return value


def _job(job: Job) -> dict[str, Any]:
    return job.to_json()


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as err:
        raise SpecError(f"the request body is not valid JSON: {err}") from None


async def health(request: web.Request) -> web.Response:
    """GET /v1/health."""
    return web.json_response(request.app[ENGINE_KEY].health())


async def gpus(request: web.Request) -> web.Response:
    """GET /v1/gpus."""
    return web.json_response(request.app[ENGINE_KEY].gpus())


async def list_jobs(request: web.Request) -> web.Response:
    """GET /v1/jobs."""
    engine = request.app[ENGINE_KEY]
    raw = request.query.get("status", "")
    statuses = [s for s in raw.split(",") if s]
    limit = _int_query(request, "limit", 1000) or 1000
    before = _int_query(request, "before", None)
    jobs = await engine.list_jobs(statuses, min(limit, 100_000), before)
    return web.json_response({"jobs": [_job(j) for j in jobs]})


async def submit(request: web.Request) -> web.Response:
    """POST /v1/jobs."""
    engine = request.app[ENGINE_KEY]
    body = await _read_json(request)
    uid = peer_uid(request)
    if isinstance(body, dict) and "jobs" in body and set(body) == {"jobs"}:
        items = body["jobs"]
        if not isinstance(items, list) or not items:
            raise SpecError("'jobs' must be a non-empty list of job specs")
        jobs = await engine.submit_many(items, uid)
        return web.json_response({"jobs": [_job(j) for j in jobs]}, status=201)
    job = await engine.submit(body, uid)
    return web.json_response({"job": _job(job)}, status=201)


async def ready(request: web.Request) -> web.Response:
    """GET /v1/ready: 200 if every domain is ready, else 503 with the reason."""
    ok, reason = request.app[ENGINE_KEY].readiness()
    return web.json_response({"ready": ok, "reason": reason}, status=200 if ok else 503)


async def domains(request: web.Request) -> web.Response:
    """GET /v1/domains."""
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {"domains": [engine.domain_json(d) for d in engine.scheduler.domains.values()]}
    )


async def drain(request: web.Request) -> web.Response:
    """POST /v1/domains/NAME/drain."""
    body = await _read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict) or set(body) - {"reason"}:
        raise SpecError('a drain request is {"reason": "..."} or empty')
    reason = body.get("reason") or ""
    if not isinstance(reason, str) or len(reason) > 500:
        raise SpecError("reason must be text of at most 500 characters")
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {"domain": await engine.drain_domain(request.match_info["name"], reason)}
    )


async def release(request: web.Request) -> web.Response:
    """POST /v1/domains/NAME/release."""
    engine = request.app[ENGINE_KEY]
    return web.json_response({"domain": await engine.release_domain(request.match_info["name"])})


async def reload_config(request: web.Request) -> web.Response:
    """POST /v1/config/reload: 200 when applied, 400 with the error when rejected."""
    result = await request.app[ENGINE_KEY].reload_config()
    return web.json_response(result, status=200 if result["applied"] else 400)


async def doctor(request: web.Request) -> web.Response:
    """GET /v1/doctor."""
    return web.json_response({"checks": await request.app[ENGINE_KEY].doctor_checks()})


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus exposition format."""
    from .metrics import CONTENT_TYPE, render

    body = await render(request.app[ENGINE_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


ADOPT_FIELDS = {"pid", "start_ticks", "name", "vram_gb", "gpu", "domain"}


async def adopt(request: web.Request) -> web.Response:
    """POST /v1/adopt: 201 with the job (``running``, or ``failed`` with the refusal)."""
    body = await _read_json(request)
    if not isinstance(body, dict):
        raise SpecError("an adopt request must be a JSON object")
    unknown = sorted(set(body) - ADOPT_FIELDS)
    if unknown:
        raise SpecError(f"unknown field '{unknown[0]}'")
    if "pid" not in body:
        raise SpecError("pid is required")
    start_ticks = body.get("start_ticks")
    if start_ticks is not None and (
        isinstance(start_ticks, bool) or not isinstance(start_ticks, int)
    ):
        raise SpecError("start_ticks must be an integer")
    gpu = body.get("gpu", False)
    if not isinstance(gpu, bool):
        raise SpecError("gpu must be true or false")
    job = await request.app[ENGINE_KEY].adopt(
        body["pid"],
        start_ticks=start_ticks,
        name=body.get("name"),
        vram_gb=body.get("vram_gb"),
        gpu=gpu,
        domain=body.get("domain"),
        requester_uid=peer_uid(request),
    )
    return web.json_response({"job": _job(job)}, status=201)


async def get_job(request: web.Request) -> web.Response:
    """GET /v1/jobs/ID."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    job = await engine.get(job_id)
    return web.json_response({"job": _job(job), "events": await engine.events_of(job_id)})


async def cancel(request: web.Request) -> web.Response:
    """POST /v1/jobs/ID/cancel."""
    job = await request.app[ENGINE_KEY].cancel(_job_id(request))
    return web.json_response({"job": _job(job)}, status=202)


async def wait(request: web.Request) -> web.Response:
    """GET /v1/jobs/ID/wait."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    timeout = _float_query(request, "timeout")
    try:
        job = await engine.wait(job_id, timeout)
    except TimeoutError:
        job = await engine.get(job_id)
        return web.json_response({"job": _job(job), "timed_out": True}, status=200)
    return web.json_response({"job": _job(job), "timed_out": False})


def _read_chunk(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(LOG_CHUNK)
    except FileNotFoundError:
        return b""


async def logs(request: web.Request) -> web.StreamResponse:
    """GET /v1/jobs/ID/logs: the job's output from ``offset``; ``follow=1`` streams."""
    engine = request.app[ENGINE_KEY]
    job_id = _job_id(request)
    job = await engine.get(job_id)
    offset = _int_query(request, "offset", 0) or 0
    follow = request.query.get("follow") in ("1", "true", "yes")
    path = engine.log_path(job_id)
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.headers["X-Job-Status"] = job.status.value
    await response.prepare(request)
    while True:
        chunk = await asyncio.to_thread(_read_chunk, path, offset)
        if chunk:
            offset += len(chunk)
            await response.write(chunk)
            continue
        if not follow or not (await engine.get(job_id)).status.is_active:
            # One last read: output written just before the exit.
            chunk = await asyncio.to_thread(_read_chunk, path, offset)
            if chunk:
                offset += len(chunk)
                await response.write(chunk)
                continue
            break
        try:
            await engine.wait(job_id, timeout=0.25)
        except TimeoutError:
            pass
    await response.write_eof()
    return response


async def events(request: web.Request) -> web.StreamResponse:
    """GET /v1/events: NDJSON, one event per line, until the client goes away."""
    engine = request.app[ENGINE_KEY]
    subscription = engine.subscribe()
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    await response.write(b'{"kind": "hello"}\n')
    try:
        async for event in subscription:
            await response.write(json.dumps(event.to_json()).encode() + b"\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        subscription.close()
    return response


def make_app(engine: Engine) -> web.Application:
    """The aiohttp application serving ``engine``."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY)
    app[ENGINE_KEY] = engine
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/gpus", gpus)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel)
    app.router.add_get("/v1/jobs/{job_id}/wait", wait)
    app.router.add_get("/v1/jobs/{job_id}/logs", logs)
    app.router.add_post("/v1/adopt", adopt)
    app.router.add_get("/v1/ready", ready)
    app.router.add_get("/v1/doctor", doctor)
    app.router.add_post("/v1/config/reload", reload_config)
    app.router.add_get("/v1/metrics", metrics)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/domains", domains)
    app.router.add_post("/v1/domains/{name}/drain", drain)
    app.router.add_post("/v1/domains/{name}/release", release)
    app.router.add_get("/v1/events", events)
    return app


class ApiServer:
    """Serves an engine on its Unix socket (mode 0600, in the 0700 state dir)."""

    def __init__(self, engine: Engine, path: Path) -> None:
        self.engine = engine
        self.path = path
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind the socket. A leftover socket file is removed: we hold the engine lock."""
        self.path.unlink(missing_ok=True)
        # A short shutdown grace: open streams (a TUI following /events, `logs -f`) are
        # ended by bus.close(); nothing else should keep a stopping engine waiting 60 s.
        self._runner = web.AppRunner(
            make_app(self.engine), handle_signals=False, access_log=None, shutdown_timeout=3.0
        )
        await self._runner.setup()
        old_umask = os.umask(0o177)
        try:
            site = web.UnixSite(self._runner, str(self.path))
            await site.start()
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        """Close the socket and every open connection (event streams included)."""
        if self._runner is not None:
            self.engine.bus.close()
            await self._runner.cleanup()
            self._runner = None
        self.path.unlink(missing_ok=True)
