"""A small synchronous client for the engine's Unix-socket API (stdlib only).

The CLI uses it, so it must stay cheap to import: no aiohttp, no pydantic, no engine.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from .engine.paths import Paths


class EngineNotRunning(RuntimeError):
    """Nothing is serving the state dir."""

    def __init__(self, paths: Paths) -> None:
        super().__init__(
            f"no engine is serving {paths.state_dir}\n"
            "  start one with:  gpulayer-tui --serve            (real GPUs)\n"
            "              or:  gpulayer-tui --serve --simulate 2xA100-80GB"
        )


class ApiError(RuntimeError):
    """The engine answered with an error; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    """Talks to the engine serving ``paths``.

    Args:
        paths: The state dir whose socket to use.
        timeout: Socket timeout in seconds (``None`` waits forever, for ``wait``/``-f``).
    """

    def __init__(self, paths: Paths, timeout: float | None = 30.0) -> None:
        self.paths = paths
        self.timeout = timeout

    def _open(
        self, method: str, path: str, body: Any = None, timeout: float | None = -1.0
    ) -> http.client.HTTPResponse:
        conn = _UnixConnection(self.paths.socket, self.timeout if timeout == -1.0 else timeout)
        headers = {}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, "/v1" + path, body=payload, headers=headers)
            return conn.getresponse()
        except OSError as err:
            conn.close()
            if isinstance(err, (FileNotFoundError, ConnectionRefusedError)) or err.errno in (
                errno.ENOENT,
                errno.ECONNREFUSED,
            ):
                raise EngineNotRunning(self.paths) from None
            raise

    def request(
        self, method: str, path: str, body: Any = None, timeout: float | None = -1.0
    ) -> Any:
        """Send a request and return the decoded JSON.

        Raises:
            EngineNotRunning: No engine listens on the socket.
            ApiError: The engine answered 4xx/5xx (the message is the engine's).
        """
        response = self._open(method, path, body, timeout)
        data = response.read()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = None
        if response.status >= 400:
            message = decoded.get("error") if isinstance(decoded, dict) else None
            raise ApiError(response.status, message or f"HTTP {response.status}")
        return decoded

    def stream(self, path: str) -> Iterator[bytes]:
        """Yield raw chunks of a streaming response (logs, events)."""
        response = self._open("GET", path, timeout=None)
        if response.status >= 400:
            data = response.read()
            try:
                message = json.loads(data).get("error")
            except (ValueError, AttributeError):
                message = None
            raise ApiError(response.status, message or f"HTTP {response.status}")
        while True:
            chunk = response.read1(65536)
            if not chunk:
                return
            yield chunk

    # Convenience wrappers ------------------------------------------------------------------

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit one job; returns its JSON."""
        return dict(self.request("POST", "/jobs", spec)["job"])

    def submit_many(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Submit several jobs in one request (one commit on the engine side)."""
        return list(self.request("POST", "/jobs", {"jobs": specs})["jobs"])

    def job(self, job_id: int | str) -> dict[str, Any]:
        """One job with its ``events``."""
        return dict(self.request("GET", f"/jobs/{quote(str(job_id), safe='')}"))

    def jobs(self, statuses: list[str] | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """Jobs, newest first."""
        query: dict[str, Any] = {"limit": limit}
        if statuses:
            query["status"] = ",".join(statuses)
        return list(self.request("GET", "/jobs?" + urlencode(query))["jobs"])

    def cancel(self, job_id: int | str) -> dict[str, Any]:
        """Cancel a job; returns it (possibly still stopping)."""
        return dict(self.request("POST", f"/jobs/{quote(str(job_id), safe='')}/cancel")["job"])

    def wait(self, job_id: int | str, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends (or ``timeout``); returns ``{"job", "timed_out"}``."""
        query = "" if timeout is None else "?" + urlencode({"timeout": timeout})
        sock_timeout = None if timeout is None else timeout + 30
        return dict(
            self.request(
                "GET", f"/jobs/{quote(str(job_id), safe='')}/wait{query}", timeout=sock_timeout
            )
        )

    def gpus(self) -> dict[str, Any]:
        """Domains, samples and VRAM accounting."""
        return dict(self.request("GET", "/gpus"))

    def health(self) -> dict[str, Any]:
        """Engine identity and state."""
        return dict(self.request("GET", "/health"))
