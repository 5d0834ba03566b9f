"""A plain HTTP/1.1 connection over the engine's Unix socket, for tests that send raw or
many requests (keep-alive, invalid bodies) without the CLI's client; and :func:`send_raw`
for bytes no HTTP library would send (malformed request lines and headers)."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket; reused for many requests (keep-alive)."""

    def __init__(self, path: Path, timeout: float | None = 60) -> None:
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

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any, bytes]:
        """Send one request; return ``(status, decoded JSON or None, raw body)``."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.request(method, path, body, headers)
        response = self.getresponse()
        raw = response.read()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        return response.status, data, raw


def request(socket_path: Path, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One JSON request on a fresh connection (closed after): ``(status, decoded body)``."""
    conn = UnixHTTPConnection(socket_path)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        status, data, _raw = conn.call(method, path, payload)
        return status, data
    finally:
        conn.close()


def send_raw(path: str | Path, request: bytes) -> bytes:
    """Send ``request`` as it is on a new connection; everything the engine answers until
    it closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)
