"""A small synchronous client for the engine's Unix-socket API (stdlib only).

The CLI uses it, so it must stay cheap to import: no aiohttp, no pydantic, no engine, and
not even ``http.client``, which pulls in ``email`` and ``ssl`` (about 16 ms of a ~40 ms
``gpulayer-tui submit``). The engine speaks plain HTTP/1.1 on a local socket, so the few
lines below (one request per connection; a body by length, chunked or until close) are all
the protocol needed.
"""

from __future__ import annotations

import _socket  # not socket.py: it imports selectors and builds enums (~3 ms of a CLI call)
import errno
import time

from . import jsonlite

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:  # (annotations only: typing and the wire module cost a CLI call ~5 ms)
    from collections.abc import Callable, Iterator
    from typing import Any

    from .engine.paths import Paths
    from .wire import JobDetailJSON, JobRowJSON, UsageJSON


class StreamIdle(Exception):
    """A stream sent nothing for its idle time (see :meth:`Client.stream`)."""


class EngineNotRunning(RuntimeError):
    """Nothing is serving the state dir."""

    def __init__(self, paths: Paths) -> None:
        import os

        # (simulated GPUs were offered on a box with a driver too: what is there decides)
        if os.path.exists("/proc/driver/nvidia/version"):
            how = "  start one with:  gpulayer-tui --serve"
        else:
            how = (
                "  start one with:  gpulayer-tui --serve\n"
                "  (no NVIDIA driver here: --simulate 2xA100-80GB runs it on simulated GPUs)"
            )
        super().__init__(f"no engine is serving {paths.state_text}\n{how}")


class EngineStarting(EngineNotRunning):
    """An engine holds the state dir's lock but its socket did not answer in time: it is
    still starting (taking back its jobs), or its socket was removed."""

    def __init__(self, paths: Paths, pid: int, waited: float) -> None:
        who = f" (pid {pid})" if pid else ""
        RuntimeError.__init__(
            self,
            f"the engine{who} serving {paths.state_text} is not answering on its socket "
            f"after {waited:g} s: still starting (taking back its jobs), or its socket "
            "was removed; try again shortly, or see its log",
        )


STARTING_WAIT_S = 30.0
"""How long a request waits for an engine that holds the lock but does not listen yet
(when the client itself waits forever)."""


def starting_engine(paths: Paths) -> int | None:
    """The pid of an engine that holds the state dir's lock, else None; a connect that
    found no socket or no listener means it is starting. One that said it is stopping
    counts as none.

    Read, never locked: the lock file names the engine that took it, and that process is
    alive and a gpulayer-tui one (a killed engine's pid stays in the file). A shared
    ``flock`` to ask, held for an instant every 50 ms while waiting, would make an
    engine taking the lock in that instant refuse to start ("already serving").
    """
    words = _lock_file_words(paths)
    if not words or not words[0].isdigit() or words[1:2] == [b"stopping"]:
        return None
    pid = int(words[0])
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as proc:
            command = proc.read()
    except OSError:
        return None  # (gone: the file names a killed engine)
    return pid if b"gpulayer" in command else None


def engine_was_stopped(paths: Paths) -> bool:
    """True if the last engine of the state dir said it was stopping (``PID stopping`` in
    the lock file, left there once it ended) and none has taken the lock since: stopped on
    purpose, not lost."""
    return _lock_file_words(paths)[1:2] == [b"stopping"]


def _lock_file_words(paths: Paths) -> list[bytes]:
    """The words of the state dir's lock file (``PID`` or ``PID stopping``), read without
    locking it; none if it cannot be read."""
    import os

    try:
        fd = os.open(paths.lock_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        return os.pread(fd, 64, 0).split()
    except OSError:
        return []
    finally:
        os.close(fd)


class EngineLost(OSError):
    """The engine took the request but stopped answering (it was stopped, killed or is
    overloaded): whether it acted on the request is unknown."""

    def __str__(self) -> str:
        # The sentence alone: OSError would print "[Errno 110] ..." before it.
        return str(self.strerror) if self.strerror else super().__str__()


class ApiError(RuntimeError):
    """The engine answered with an error; ``status`` is the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        retry_after: float | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        """The engine's ``Retry-After`` (seconds), if it gave one."""
        self.field = field
        """The input at fault, as the engine names it (a spec field), if it named one."""


SNAPSHOT_WAIT_S = 180.0
"""How long a submission that asks for snapshots is waited for (see
:meth:`Client._submit_timeout`)."""

BUSY_REFUSAL = "too many submissions at once"
"""How the engine's refusal of a submission it did not read begins (429: its
``[limits] submissions_in_flight`` are all taken): nothing was stored, so it is sent again."""


def _retry_after(headers: dict[str, str]) -> float | None:
    try:
        return max(0.0, min(float(headers["retry-after"]), 5.0))
    except (KeyError, ValueError):
        return None


def _plain_error(status: int, data: bytes) -> str:
    """An error answer that is not the engine's JSON (the HTTP server's own, for a
    request it could not read): its first line, so that more than "HTTP 400" is said."""
    line = data.decode("utf-8", "replace").strip().split("\n", 1)[0]
    # (aiohttp's own words end in a repr of what it read: "... when reading: bytearray(b'")
    line = line.split(": bytearray(", 1)[0]
    text = "".join(c if c.isprintable() else "?" for c in line)[:200]
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


class NotText(ValueError):
    """A value for a URL holds bytes that are not UTF-8 (an argument with such a byte,
    as the shell passes it: Python holds it as a lone surrogate)."""


def quote(value: object) -> str:
    """``value`` as one percent-encoded URL path segment or query value (RFC 3986: all but
    the unreserved characters). Not urllib's: importing it costs a CLI call ~3 ms.

    Raises:
        NotText: ``value`` holds a byte that is not UTF-8 (it ended the CLI in a
            traceback), naming it.
    """
    text = str(value)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        bad = next(c for c in text if "\ud800" <= c <= "\udfff")
        if "\udc80" <= bad <= "\udcff":
            what = f"the byte 0x{ord(bad) - 0xDC00:02X}"
        else:
            what = f"the unpaired surrogate U+{ord(bad):04X}"
        shown = text.encode("utf-8", "backslashreplace").decode()[:200]
        # (quoted by hand: repr() doubled the backslash of its own "\xff")
        raise NotText(f"'{shown}' is not UTF-8 text (it holds {what})") from None
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in data)


def _urlencode(query: dict[str, Any]) -> str:
    return "&".join(f"{quote(key)}={quote(value)}" for key, value in query.items())


class _Buffered:
    """Reads a socket through a buffer (what ``socket.makefile("rb")`` would give)."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def _fill(self) -> bool:
        data = self._sock.recv(65536)
        self._buf += data
        return bool(data)

    def _take(self, count: int) -> bytes:
        out = bytes(self._buf[:count])
        del self._buf[:count]
        return out

    def readline(self, limit: int) -> bytes:
        """Up to and including the next newline (at most ``limit`` bytes)."""
        while b"\n" not in self._buf and len(self._buf) < limit and self._fill():
            pass
        end = self._buf.find(b"\n")
        return self._take(min(limit, end + 1 if end >= 0 else len(self._buf)))

    def read(self, count: int) -> bytes:
        """``count`` bytes, or fewer if the connection ends first."""
        while len(self._buf) < count and self._fill():
            pass
        return self._take(count)

    def read1(self, count: int) -> bytes:
        """What is there (waiting for some if nothing is), at most ``count`` bytes."""
        if not self._buf:
            self._fill()
        return self._take(count)

    def close(self) -> None:
        self._buf.clear()


class _Response:
    """One HTTP response read from a socket that the server closes after it."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._file = _Buffered(sock)
        status_line = self._file.readline(65537)
        parts = status_line.split(None, 2)
        if not status_line:
            # (said in words: "not an HTTP response: b''" reached users, tester h147)
            self.close()
            raise OSError(errno.ECONNRESET, "it closed the connection without an answer")
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            self.close()
            raise OSError(errno.EPROTO, f"not an HTTP response: {status_line[:80]!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        while True:
            line = self._file.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (for streams: logs, events), then close."""
        try:
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                yield from self._chunked()
            elif "content-length" in self.headers:
                length = int(self.headers["content-length"])
                data = self._file.read(length)
                if len(data) < length:
                    raise EngineLost(errno.ECONNRESET, "the engine closed the answer mid-way")
                if data:
                    yield data
            else:
                while chunk := self._file.read1(65536):
                    yield chunk
        finally:
            self.close()

    def _chunked(self) -> Iterator[bytes]:
        while True:
            size_line = self._file.readline(65537)
            if not size_line:
                # A stream ends with an empty chunk; a cut one means the engine went away.
                raise EngineLost(errno.ECONNRESET, "the engine closed the stream mid-way")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                return  # trailers, if any, are not needed
            data = self._file.read(size)
            self._file.readline(65537)  # the CRLF after the chunk
            if data:
                yield data

    def read(self) -> bytes:
        """The whole body."""
        return b"".join(self.chunks())

    def close(self) -> None:
        """Release the socket."""
        self._file.close()
        self._sock.close()


class Client:
    """Talks to the engine serving ``paths``.

    Args:
        paths: The state dir whose socket to use.
        timeout: Socket timeout in seconds (``None`` waits forever, for ``wait``/``-f``).
    """

    def __init__(self, paths: Paths, timeout: float | None = 30.0) -> None:
        self.paths = paths
        self.timeout = timeout
        self.more_jobs = False  # (whether the engine had more rows past the last listed)
        # Told once when a submission waits for the engine to take it (the CLI prints it:
        # it said nothing for as long as 30 s while held back)
        self.on_busy: Callable[[str], None] | None = None
        # Told each warning a submission's answer carries (taken, but with something the
        # submitter should know: a --notify with nowhere to send)
        self.on_warning: Callable[[str], None] | None = None
        self._way_checked = False  # (the way to the socket: see _connect)

    def _open(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = -1.0,
        headers: dict[str, str] | None = None,
    ) -> _Response:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        wait = self.timeout if timeout == -1.0 else timeout
        sock.settimeout(wait)
        head = f"{method} /v1{path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        for name, value in (headers or {}).items():
            head += f"{name}: {value}\r\n"
        payload = b""
        if body is not None:
            payload = jsonlite.dumps(body).encode()
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        elif method != "GET":
            head += "Content-Length: 0\r\n"
        try:
            sock = self._connect(sock, wait)
        except OSError as err:
            sock.close()
            if isinstance(err, (FileNotFoundError, ConnectionRefusedError)) or err.errno in (
                errno.ENOENT,
                errno.ECONNREFUSED,
            ):
                raise EngineNotRunning(self.paths) from None
            if isinstance(err, TimeoutError):
                raise self._lost(wait, None, method) from None
            raise
        try:
            sock.sendall(head.encode("latin-1") + b"\r\n" + payload)
            return _Response(sock)
        except (BrokenPipeError, ConnectionResetError) as err:
            # The engine may answer before it reads the request (a connection past
            # [limits] connections_per_user is told so and closed): that answer, not
            # "the engine closed the connection".
            try:
                return _Response(sock)
            except OSError:
                sock.close()
                raise self._lost(wait, err, method) from None
        except OSError as err:
            sock.close()
            if isinstance(err, EngineLost):
                raise
            raise self._lost(wait, err, method) from None

    def _connect(self, sock: _socket.socket, wait: float | None) -> _socket.socket:
        """``sock`` connected to the engine's socket. An engine whose queue of connections
        to accept is full (busy with a large request while many clients connect) makes a
        connect with a timeout fail at once with EAGAIN: asked again, with a short pause,
        for as long as the client waits for an answer (it said "Resource temporarily
        unavailable", exit 2, as of bad input: tester h64).

        Raises:
            EngineLost: It took no connection for that long.
            OSError: As ``connect`` (no socket, nobody listening).
        """
        from .unixsock import SocketPath

        if not self._way_checked:
            # (nothing is sent through a link another user can point at an engine of
            # theirs: a submission's whole environment went to one: tester h155)
            import os

            from .pathwalk import UntrustedLink, untrusted_link

            why = untrusted_link(os.path.dirname(self.paths.socket_file))
            if why is not None:
                sock.close()
                raise UntrustedLink(why)
            self._way_checked = True
        deadline = None if wait is None else time.monotonic() + wait
        pause = 0.005
        starting_since: float | None = None
        while True:
            try:
                with SocketPath(self.paths.socket_file) as where:
                    sock.connect(where.path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                # No socket, or no one listening: "no engine is serving", and its advice
                # to start one, were said while an engine was taking back its jobs, and
                # starting one then was refused "already serving" (tester h111).
                pid = starting_engine(self.paths)
                if pid is None:
                    raise
                now = time.monotonic()
                if starting_since is None:
                    starting_since = now
                    if self.on_busy is not None:
                        who = f" (pid {pid})" if pid else ""
                        self.on_busy(
                            f"the engine{who} is starting (taking back its jobs): waiting "
                            "for it to answer"
                        )
                limit = wait if wait is not None else STARTING_WAIT_S
                if now - starting_since >= limit:
                    sock.close()
                    raise EngineStarting(self.paths, pid, limit) from None
                sock.close()
                time.sleep(0.05)
                sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                sock.settimeout(wait)
            except BlockingIOError:
                if deadline is not None and time.monotonic() + pause > deadline:
                    sock.close()
                    raise EngineLost(
                        errno.ETIMEDOUT,
                        f"the engine at {self.paths.socket_file} took no connection for "
                        f"{wait:g} s (too busy); nothing was sent",
                    ) from None
                sock.close()
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
                sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                sock.settimeout(wait)

    def _lost(
        self, wait: float | None, err: OSError | None = None, method: str = "POST"
    ) -> EngineLost:
        if err is None or isinstance(err, TimeoutError):
            why = f"did not answer in {wait:g} s (stopped, or overloaded)"
        else:
            why = f"went away mid-request ({err.strerror or err})"
        if method == "GET":  # (a read acts on nothing: "whether it acted" misled: h51)
            return EngineLost(errno.ETIMEDOUT, f"the engine at {self.paths.socket_file} {why}")
        return EngineLost(
            errno.ETIMEDOUT,
            f"the engine at {self.paths.socket_file} {why}: whether it acted on the request "
            "is unknown (`gpulayer-tui jobs` shows what it did)",
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = -1.0,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Send a request and return the decoded JSON.

        Raises:
            EngineNotRunning: No engine listens on the socket.
            EngineLost: It took the request but did not answer (in ``timeout``).
            ApiError: The engine answered 4xx/5xx (the message is the engine's).
        """
        response = self._open(method, path, body, timeout, headers)
        try:
            data = response.read()
        except EngineLost:
            raise
        except OSError as err:
            raise self._lost(self.timeout if timeout == -1.0 else timeout, err, method) from None
        try:
            decoded = jsonlite.loads(data.decode()) if data else None
        except ValueError:
            decoded = None
        if response.status >= 400:
            message = decoded.get("error") if isinstance(decoded, dict) else None
            if (
                response.status == 404
                and isinstance(message, str)
                and message.startswith(f"{method} /v1/")
                and message.endswith(": Not Found")
            ):
                # The route, not a job or a domain, is unknown: an engine older than this
                # client ("POST /v1/domains/gpu1/forget: Not Found" read as an unknown
                # domain: tester h48).
                message += (
                    ": this engine does not take that request (one older than this "
                    "gpulayer-tui? `gpulayer-tui stop`, then start it again)"
                )
            field = decoded.get("field") if isinstance(decoded, dict) else None
            raise ApiError(
                response.status,
                message or _plain_error(response.status, data),
                _retry_after(response.headers),
                field if isinstance(field, str) else None,
            )
        if self.on_warning is not None and isinstance(decoded, dict):
            # (any answer's: a submission's and a restart's carry them)
            for warning in decoded.get("warnings") or ():
                self.on_warning(str(warning))
        return decoded

    def _submit_timeout(self, body: Any) -> float | None:
        """How long a submission may take to be answered: the client's timeout, or, for
        one that asks for snapshots, long enough for the engine's ``[snapshot] timeout``
        (120 s by default) and a commit: at 30 s the CLI gave up on a submission the
        engine made a minute later ("whether it acted is unknown", exit 4: tester h49)."""
        specs = body.get("jobs") if isinstance(body, dict) and "jobs" in body else [body]
        snapshots = any(isinstance(s, dict) and s.get("snapshot") for s in specs or ())
        if self.timeout is None or not snapshots:
            return self.timeout
        return max(self.timeout, SNAPSHOT_WAIT_S)

    def _submitting(self, body: Any, headers: dict[str, str] | None) -> Any:
        """``POST /jobs``, sent again while the engine answers that it is handling too
        many submissions at once (it read nothing of them, so nothing was stored: a
        client holding connections open made every `submit` fail at once), as it asks
        (``Retry-After``), for up to the client's timeout."""
        import time

        patience = self.timeout or 30.0
        give_up = time.monotonic() + patience
        told = False
        while True:
            try:
                answer = self.request(
                    "POST", "/jobs", body, timeout=self._submit_timeout(body), headers=headers
                )
            except ApiError as err:
                wait = err.retry_after if err.retry_after is not None else 1.0
                busy = err.status == 429 and str(err).startswith(BUSY_REFUSAL)
                if not busy or time.monotonic() + wait > give_up:
                    raise
                if not told and self.on_busy is not None:
                    told = True
                    self.on_busy(
                        f"the engine is handling {BUSY_REFUSAL} (nothing of this one stored "
                        f"yet): trying again for up to {patience:g} s (GPULAYER_TIMEOUT)"
                    )
                time.sleep(wait)
                continue
            return answer

    def stream(
        self, path: str, idle: float | None = None, headers: dict[str, str] | None = None
    ) -> Iterator[bytes]:
        """Yield raw chunks of a streaming response (logs, events); ``headers`` (when
        given) gets the response's headers, names in lower case, before the first chunk.

        Raises:
            StreamIdle: Nothing came for ``idle`` seconds (a quiet stream, or a frozen
                engine: the caller asks the engine which).
        """
        response = self._open("GET", path, timeout=idle)
        if response.status >= 400:
            data = response.read()
            try:
                message = jsonlite.loads(data.decode()).get("error")
            except (ValueError, AttributeError):
                message = None
            raise ApiError(response.status, message or _plain_error(response.status, data))
        if headers is not None:
            headers.update(response.headers)
        try:
            yield from response.chunks()
        except EngineLost:
            raise
        except TimeoutError:
            raise StreamIdle(idle) from None
        except OSError as err:
            raise self._lost(None, err, "GET") from None

    # Convenience wrappers ------------------------------------------------------------------

    def submit(self, spec: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """Submit one job; returns its JSON. With ``key`` (an idempotency key), sending the
        same submission again returns the job the first one made instead of a second."""
        headers = {"Idempotency-Key": key} if key else None
        return dict(self._submitting(spec, headers)["job"])

    def submit_many(
        self,
        specs: list[dict[str, Any]],
        key: str | None = None,
        env: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Submit several jobs in one request (one commit on the engine side); ``key`` as
        for :meth:`submit`. ``env`` is sent once and goes under each spec's own ``env``.

        Returns:
            The jobs' rows (as :meth:`jobs` lists them), in the order of ``specs``.
        """
        headers = {"Idempotency-Key": key} if key else None
        body: dict[str, Any] = {"jobs": specs}
        if env:
            body["env"] = env
        try:
            return list(self._submitting(body, headers)["jobs"])
        except ApiError as err:
            # An engine from before batch environments (still serving across an upgrade)
            # took the body for one spec and stored nothing: send each job its own.
            if not env or err.status != 400 or str(err) != "unknown field 'jobs'":
                raise
        inlined = [
            dict(spec, env={**env, **spec["env"]}) if isinstance(spec.get("env"), dict)
            else dict(spec, env=spec.get("env") or env)
            for spec in specs
        ]  # fmt: skip
        return list(self._submitting({"jobs": inlined}, headers)["jobs"])

    def job(self, job_id: int | str) -> JobDetailJSON:
        """One job with its ``events``."""
        detail: JobDetailJSON = self.request("GET", f"/jobs/{quote(job_id)}")
        return detail

    def usage(self, job_id: int | str) -> UsageJSON:
        """What a job used of its GPUs: summary and per-GPU series (``summary`` is
        ``None`` for a job never seen holding a GPU)."""
        usage: UsageJSON = self.request("GET", f"/jobs/{quote(job_id)}/usage")
        return usage

    def jobs_page(self, **query: Any) -> dict[str, Any]:
        """One page of job rows: ``{"jobs": [...], "more": bool}``.

        Args:
            **query: ``GET /v1/jobs``'s parameters: ``status`` (a list), ``limit`` (at most
                10,000), ``before``/``after`` (ids), ``q``, ``sort``, ``order``, ``offset``.
        """
        if isinstance(query.get("status"), list):
            query["status"] = ",".join(query["status"])
        params = {k: v for k, v in query.items() if v not in (None, "", [])}
        return dict(self.request("GET", "/jobs?" + _urlencode(params)))

    def iter_jobs(
        self, limit: int, page_size: int = 10_000, **query: Any
    ) -> Iterator[list[JobRowJSON]]:
        """Pages of job rows until ``limit`` rows or the end: a page is at most
        ``page_size`` (the engine answers at most 10,000), and the next continues by key
        (id order, from ``before``/``after``) or by offset (other sorts)."""
        offset = int(query.pop("offset", 0) or 0)
        self.more_jobs = False
        while limit > 0:
            page = self.jobs_page(limit=min(limit, page_size), offset=offset, **query)
            rows: list[JobRowJSON] = page["jobs"]
            self.more_jobs = bool(page.get("more"))  # (rows past the last page read)
            if rows:
                yield rows
            limit -= len(rows)
            if not page.get("more") or not rows:  # (an engine before paging: all of them)
                return
            if query.get("sort", "id") == "id":
                key = "after" if query.get("after") is not None else "before"
                query[key] = rows[-1]["id"]
                offset = 0
            else:
                offset += len(rows)

    def jobs(
        self, statuses: list[str] | None = None, limit: int = 1000, **query: Any
    ) -> list[JobRowJSON]:
        """Job rows, newest first (paging through the engine's pages up to ``limit``)."""
        return [row for page in self.iter_jobs(limit, status=statuses, **query) for row in page]

    def cancel(self, job_id: int | str) -> dict[str, Any]:
        """Cancel a job; returns it (possibly still stopping)."""
        return dict(self.request("POST", f"/jobs/{quote(job_id)}/cancel")["job"])

    def wait(self, job_id: int | str, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends (or ``timeout``); returns ``{"job", "timed_out"}``."""
        # (as fixed-point seconds: a few microseconds left went out as "8.78e-05", which
        # the engine refuses as no number, and `cancel` of a job it had cancelled exited 2)
        query = "" if timeout is None else "?" + _urlencode({"timeout": f"{max(0.0, timeout):.3f}"})
        sock_timeout = None if timeout is None else timeout + (self.timeout or 30.0)
        return dict(self.request("GET", f"/jobs/{quote(job_id)}/wait{query}", timeout=sock_timeout))

    def gpus(self) -> dict[str, Any]:
        """Domains, samples and VRAM accounting."""
        return dict(self.request("GET", "/gpus"))

    def health(self) -> dict[str, Any]:
        """Engine identity and state."""
        return dict(self.request("GET", "/health"))
