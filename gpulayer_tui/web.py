"""``gpulayer-tui web``: the TUI in a browser, through textual-serve, behind a token.

textual-serve runs one process per browser tab (its ``command``, through a shell) and
relays its terminal over a websocket to xterm.js. Here that process is
``python -m gpulayer_tui.web_session``: the TUI attached to the engine already serving
the state dir. It never starts an engine: a browser tab must not own GPUs or jobs (a
closed tab or a stopped ``web`` would take them with it), so without an engine the page
says how to start one.

The token: textual-serve has no authentication, and its :class:`~textual_serve.server.
Server` builds its aiohttp application in one method (``_make_app``), so a subclass adds
one middleware to it before it starts, in front of every route (page, websocket, static
files, downloads), rather than a reverse proxy in front of it. The page is
``/?token=TOKEN``; what the page loads lives under ``/TOKEN/`` (its websocket,
``/TOKEN/ws``, and its scripts and styles, ``/TOKEN/static/``), so every request carries
the token itself, compared in constant time. There is no cookie: a browser sends a
cookie of 127.0.0.1 to every port of it, and so to another local user's server on
another port (tester h82 took the token that way and ran jobs as the web user). A
download (``/download/KEY``: a screenshot the TUI delivers) needs no token: its key is
random, made for that one delivery, and gone once fetched. The websocket also needs an
``Origin`` of this host, and on a loopback address every request a ``Host`` of this
machine (a DNS-rebinding guard). Everything else gets 403.

Browser sessions are capped (``--max-sessions``): each runs a TUI process of its own.

Imported only by the ``web`` subcommand (textual-serve, jinja2 and aiohttp stay out of
every other CLI call).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Collection
from typing import Any
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.server import Server

from .engine.paths import Paths
from .fields import printable

FORBIDDEN_TEXT = (
    "403: gpulayer-tui web needs its token: open the URL `gpulayer-tui web` printed when "
    "it started (http://HOST:PORT/?token=...)\n"
)
MAX_SESSIONS = 8
"""Browser sessions served at once by default (each a TUI process, ~70 MiB)."""
SHUTDOWN_GRACE = 5.0
"""Seconds a browser session's TUI gets to quit on its own (at shutdown, or once its tab
closed) before it is killed."""
SLOT_WAIT = 3.0
"""Seconds a page or websocket waits for a session slot when all are taken: a reloaded
tab's old session is still quitting when the new page asks (tester h85 got a 503 on every
other reload at the cap)."""
REQUEST_TIMEOUT = 20.0
"""Seconds a connection may take to send a whole request (and may stay idle between
requests): aiohttp's own default for a runner is an hour, so connections that never
finish a request held file descriptors until the server ran out of them (tester h85)."""
MAX_CONNECTIONS = 256
"""Connections served at once (beyond it, new ones are closed at once); lowered to half
the open-file limit where that is lower."""
MAX_COLUMNS = 1000
MAX_ROWS = 500
"""The largest terminal a browser session may ask for: a size is the TUI's own screen
buffer, and a width of 10**9 made one grow to 9.5 GB (tester h85)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_LINK = re.compile(r"<link\b[^>]*\bhref=\"(?P<href>[^\"]*)\"[^>]*>\s*", re.IGNORECASE)
"""A ``<link>`` in textual-serve's page (those to another site are taken out)."""


_NO_SCROLLBAR = "<style>.xterm .xterm-viewport { overflow-y: hidden !important; }</style>\n"
"""The page's terminal has no scrollback, yet xterm.js's viewport kept a scrollbar's width
over its last columns, which the terminal's size did not leave out: the TUI's rightmost
column was cut off (tester h82)."""


def is_loopback(host: str) -> bool:
    """True if ``host`` binds to this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def bound_loopback_only(addresses: list[Any]) -> bool:
    """Whether every address the server listens on is a loopback one (``--host 127.1``,
    ``0x7f000001`` or a name ``/etc/hosts`` maps to 127.0.1.1 bind there too: judged by
    its text alone, each was warned of as exposed, and lost the Host check: h181)."""
    bound = [a for a in addresses if isinstance(a, tuple) and len(a) >= 2]
    return bool(bound) and all(is_loopback(str(a[0])) for a in bound)


def exposure_warning(host: str, port: int, loopback: bool | None = None) -> str | None:
    """The warning printed when the server is not bound to loopback addresses only (as
    ``loopback`` says, from the addresses bound; else as ``host`` reads), else ``None``."""
    if is_loopback(host) if loopback is None else loopback:
        return None
    where = (
        f"every address of this machine (port {port})"
        if is_wildcard(host)
        else (f"{url_host(host)}:{port}")
    )
    return (
        f"gpulayer-tui web: WARNING: bound to {host}, not to 127.0.0.1: anyone who can reach "
        f"{where} and has the token controls your jobs. Prefer the default host and an "
        f"SSH tunnel (ssh -L {port}:127.0.0.1:{port} box)."
    )


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means every address (``0.0.0.0``, ``::``, ``0``): no browser
    opens a URL of it."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host == "0"


def browser_host(host: str) -> str:
    """The host for the URL printed at start: a wildcard one is this machine's name (a
    URL of ``0.0.0.0`` opens nothing elsewhere: tester h64)."""
    if is_wildcard(host):
        import socket

        return socket.gethostname() or "localhost"
    return url_host(host)


def session_command(paths: Paths) -> str:
    """The shell line textual-serve runs for each browser session (it runs it with
    ``create_subprocess_shell``, so every word is quoted)."""
    return shlex.join(
        [sys.executable, "-m", "gpulayer_tui.web_session", "--config", str(paths.config_file)]
    )


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class TokenGate:
    """The aiohttp middleware that lets only holders of ``token`` through (see the module).

    Args:
        token: The secret in the URL (``secrets.token_urlsafe``: URL-safe as it is).
        loopback_only: Whether the server listens on a loopback address only (then a
            request naming another host in ``Host`` is refused).
    """

    def __init__(self, token: str, loopback_only: bool = True) -> None:
        self._token = token.encode()
        self.loopback_only = loopback_only

    @property
    def token(self) -> str:
        """The token (for the URL printed at start)."""
        return self._token.decode()

    @property
    def prefix(self) -> str:
        """The path under which the page's websocket and static files live."""
        return f"/{self.token}"

    def _matches(self, value: str | None) -> bool:
        # Bytes, not str: compare_digest refuses a non-ASCII str (a TypeError, a 500).
        return value is not None and hmac.compare_digest(value.encode(), self._token)

    def admits(self, request: web.Request) -> bool:
        """Whether ``request`` holds the token: in its query, or as its path's first
        segment; or it fetches a download (see the module)."""
        if self._matches(request.query.get("token")):
            return True
        first, _, rest = request.path.removeprefix("/").partition("/")
        if first == "download" and rest:
            return True
        return bool(rest) and self._matches(first)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.loopback_only and not _host_is_loopback(request):
            raise web.HTTPForbidden(text=f"403: {HOST_REFUSED}\n")
        if not self.admits(request):
            raise web.HTTPForbidden(text=FORBIDDEN_TEXT)
        if request.path.endswith("/ws") and not _same_origin(request):
            raise web.HTTPForbidden(text="403: a websocket from another origin\n")
        return await handler(request)

    @staticmethod
    async def private_headers(request: web.Request, response: web.StreamResponse) -> None:
        """(``on_response_prepare``: every response, a download's too, whose handler sends
        its headers itself.) The token is in the page's URL: no Referer carries it
        anywhere, no cache keeps a page or a download."""
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"


HOST_REFUSED = (
    "a request for another host name (the Host header names no loopback address); open "
    "the URL `gpulayer-tui web` printed"
)


_HOST_HEADER = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?")
"""A ``Host`` header as a browser sends it: a name or an address, and a port. (Read by
``urlsplit``, ``evil.com\\@localhost`` was host ``localhost``: tester h85.)"""


def _hosts(request: web.Request) -> set[str]:
    """The names a request is for: its ``Host`` header, and aiohttp's ``request.host``,
    which an absolute-form target (``GET http://127.0.0.1/ HTTP/1.1``) puts in place of
    the header (tester h88). Both are checked, so neither hides the other."""
    header = request.headers.get("Host")
    return {request.host} if header is None else {request.host, header}


def _host_is_loopback(request: web.Request) -> bool:
    # A page of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends
    # its own name; a tunnel's and the printed URL's are loopback ones.
    if "Host" not in request.headers:
        # (no name at all: aiohttp's request.host is then the socket's own address, which
        # passed; every browser sends one, and HTTP/1.1 asks for one: tester h162)
        return False
    for name in _hosts(request):
        found = _HOST_HEADER.fullmatch(name)
        if found is None:
            return False
        host = found["name"].lower()
        if not (host == "localhost" or host.endswith(".localhost") or is_loopback(host)):
            return False
    return True


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (browsers always send Origin on a websocket)
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and _hosts(request) == {parts.netloc}


def terminal_size(width: object, height: object) -> tuple[int, int] | None:
    """The size a browser asked for, within :data:`MAX_COLUMNS` x :data:`MAX_ROWS`, or
    ``None`` where it is not two positive whole numbers (a bad one crashed the tab's TUI:
    tester h85)."""
    columns, rows = dimension(width, MAX_COLUMNS), dimension(height, MAX_ROWS)
    return None if columns is None or rows is None else (columns, rows)


def dimension(value: object, most: int) -> int | None:
    """``value`` as a count of cells up to ``most``; ``None`` if it is none."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        # (past Python's 4300 digits int() raised: a 500, tester h88)
        value = int(value) if len(value) <= 9 else most
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return min(value, most)


class WebServer(Server):
    """textual-serve's server with the token in front, relative-to-the-request URLs, our
    own start-up lines, and sessions that can be closed at shutdown."""

    def __init__(
        self,
        command: str,
        host: str,
        port: int,
        token: str,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        super().__init__(command, host=host, port=port, title="gpulayer-tui")
        self.gate = TokenGate(token, loopback_only=is_loopback(host))
        self.max_sessions = max_sessions
        self.sessions: set[asyncio.Task[Any]] = set()
        self.slot_wait = SLOT_WAIT
        self.session_transports: set[object] = set()
        """The sessions' websocket connections (the connection cap never closes them)."""
        self._sessions_changed = asyncio.Condition()

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        # The page's own routes, under the token (textual-serve's /ws and /static stay,
        # refused without it).
        app.router.add_get(f"{self.gate.prefix}/ws", self.handle_websocket)
        app.router.add_static(f"{self.gate.prefix}/static", self.statics_path)
        app.middlewares.append(self.gate.middleware)
        app.on_response_prepare.append(self.gate.private_headers)
        return app

    async def _full(self) -> web.HTTPServiceUnavailable | None:
        """``None`` once a session slot is free (waiting up to ``slot_wait``), else the 503."""
        try:
            async with asyncio.timeout(self.slot_wait), self._sessions_changed:
                await self._sessions_changed.wait_for(
                    lambda: len(self.sessions) < self.max_sessions
                )
            return None
        except TimeoutError:
            pass
        return web.HTTPServiceUnavailable(
            text=f"503: {self.max_sessions} browser sessions are open, the most "
            "`gpulayer-tui web --max-sessions` allows here (each runs a TUI of its own); "
            "close a tab and reload\n"
        )

    async def runner(self) -> web.AppRunner:
        """The app, set up to be served: no access log (the token is in the request
        line), :data:`REQUEST_TIMEOUT` for a request, and at most
        :func:`connection_limit` connections at once."""
        runner = web.AppRunner(
            await self._make_app(),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=REQUEST_TIMEOUT,
        )
        await runner.setup()
        assert runner.server is not None
        ConnectionCap(runner.server, connection_limit(), lambda: self.session_transports)
        return runner

    async def on_startup(self, app: web.Application) -> None:
        """(textual-serve prints its logo and URL here; ``run_web`` prints ours.)"""

    async def handle_index(self, request: web.Request) -> Any:
        """The page, with the websocket and static URLs on the host the browser used.

        textual-serve writes absolute URLs from ``public_url`` (the bound host and port),
        which are wrong behind an SSH tunnel to another local port or when bound to
        0.0.0.0; the request's own ``Host`` is right. (No await between setting it and the
        template reading it, so concurrent requests cannot mix it up.)
        """
        if full := await self._full():
            raise full
        # (the token prefix: the page's websocket and static URLs carry it, see the module)
        self.public_url = f"{request.scheme}://{request.host}{self.gate.prefix}"
        response = await super().handle_index(request)
        if isinstance(response, web.Response) and response.text is not None:
            # textual-serve's page loads a font from Google: a request to a third party
            # each time the page opens, and on a box that reaches no internet a
            # stylesheet that holds the page's first paint until it times out. The
            # terminal falls back to the browser's monospace font.
            own = request.host
            page = _LINK.sub(
                lambda m: m[0] if urlsplit(m["href"]).netloc in ("", own) else "", response.text
            )
            response.text = page.replace("</head>", f"{_NO_SCROLLBAR}</head>", 1)
        return response

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """One browser session: its TUI process, and the websocket between them.

        textual-serve's own handler, with what a browser sends checked: the size within
        :data:`MAX_COLUMNS` x :data:`MAX_ROWS`, messages it cannot read ignored rather
        than a traceback, and a TUI that does not quit once its tab closed killed. The
        session counts against ``--max-sessions`` until its process is gone.
        """
        if not web.WebSocketResponse().can_prepare(request).ok:
            # (a plain GET: textual-serve's handler raised, logged a traceback, and the
            # client got no answer at all)
            raise web.HTTPBadRequest(text="a websocket connection is expected here")
        if full := await self._full():
            raise full
        task = asyncio.current_task()
        assert task is not None
        width = dimension(request.query.get("width"), MAX_COLUMNS) or 80
        height = dimension(request.query.get("height"), MAX_ROWS) or 24
        websocket = web.WebSocketResponse(heartbeat=15)
        self.sessions.add(task)
        connection = request.transport
        if connection is not None:
            self.session_transports.add(connection)
        app_service: AppService | None = None
        try:
            await websocket.prepare(request)

            async def close() -> None:
                await websocket.close()

            app_service = AppService(
                self.command,
                write_bytes=websocket.send_bytes,
                write_str=websocket.send_str,
                close=close,
                download_manager=self.download_manager,
                debug=self.debug,
            )
            await app_service.start(width, height)
            await self._process_messages(websocket, app_service)
        except asyncio.CancelledError:  # (shutdown: close_sessions)
            await websocket.close()
        except (ConnectionError, RuntimeError) as error:  # (the tab went mid-write)
            _say(f"a browser session ended: {type(error).__name__}")
        finally:
            try:
                if app_service is not None:
                    await _stop_app(app_service)
            finally:
                self.session_transports.discard(connection)
                async with self._sessions_changed:
                    self.sessions.discard(task)
                    self._sessions_changed.notify_all()
        return websocket

    async def _process_messages(
        self, websocket: web.WebSocketResponse, app_service: AppService
    ) -> None:
        """Relay the browser's messages to its TUI: keys, sizes, focus, pings. What is
        not one of them is ignored (said once per session)."""
        said = False
        async for message in websocket:
            if message.type != WSMsgType.TEXT:
                continue
            try:
                envelope = json.loads(message.data)
            except (ValueError, RecursionError):  # ("[" * 1000 ended the session: h88)
                envelope = None
            kind = envelope[0] if isinstance(envelope, list) and envelope else None
            data = envelope[1] if isinstance(envelope, list) and len(envelope) > 1 else None
            if kind == "stdin" and isinstance(data, str):
                await app_service.send_bytes(data.encode("utf-8", "replace"))
            elif (
                kind == "resize"
                and isinstance(data, dict)
                and (size := terminal_size(data.get("width"), data.get("height")))
            ):
                await app_service.set_terminal_size(*size)
            elif kind == "ping":
                await websocket.send_json(["pong", data])
            elif kind == "blur":
                await app_service.blur()
            elif kind == "focus":
                await app_service.focus()
            elif not said:
                said = True
                _say("a browser session sent a message that is not understood (ignored)")

    async def close_sessions(self, grace: float = SHUTDOWN_GRACE) -> None:
        """End every browser session: each is cancelled, which makes textual-serve tell its
        app to quit and wait for it; apps still running after ``grace`` are killed."""
        tasks = list(self.sessions)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        _kill_children()


async def _stop_app(app_service: AppService, grace: float = SHUTDOWN_GRACE) -> None:
    """Ask a session's TUI to quit; kill it (and what it started) if it is still there
    after ``grace``. Returns once the process is gone: the session counts until then.

    The process is what is waited for, not textual-serve's ``stop()``: that returns at
    once when its relay already ended (it failed to write to the closed tab), while the
    TUI, its output no longer read, sat blocked in a write and never read the quit
    (tester h88: such TUIs lived on, uncounted, at 285 MiB and growing).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    # (textual-serve keeps its process private: a shell, the TUI below it)
    process = getattr(app_service, "_process", None)
    stopping = asyncio.ensure_future(app_service.stop())
    await asyncio.wait({stopping}, timeout=grace)
    if process is not None and process.returncode is None:
        if not await _exited(process, max(0.1, deadline - loop.time())):
            _kill_tree(process.pid)
            if not await _exited(process, grace):
                _say("a browser session's TUI did not end when killed")
    if not stopping.done():
        # (the relay, stuck writing to a tab that no longer reads; its TUI is gone)
        await asyncio.wait({stopping}, timeout=grace)
        stopping.cancel()
    elif not stopping.cancelled() and (error := stopping.exception()) is not None:
        _say(f"a browser session ended: {type(error).__name__}")
    # Its pipes: once the relay ended, nothing read the TUI's output to its end, and the
    # pipe stayed open in this server, a descriptor per such tab (h88's case again).
    transport = getattr(process, "_transport", None)
    if transport is not None and process is not None and process.returncode is not None:
        transport.close()


async def _exited(process: asyncio.subprocess.Process, within: float) -> bool:
    """Whether ``process`` ended within ``within`` seconds."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), within)
    return process.returncode is not None


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        parent = psutil.Process(pid)
        family = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for process in family:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue


def _say(line: str) -> None:
    try:
        sys.stderr.write(f"gpulayer-tui web: {line}\n")
    except (OSError, ValueError):  # (stderr closed)
        pass


def _kill_children() -> None:
    """Kill what is left of the session processes (the shells and the apps under them)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue


async def _serve(server: WebServer, host: str, port: int, paths: Paths) -> int:
    from .backend import EngineRefused, engine_is_serving

    quiet_request_errors()
    runner = await server.runner()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        print(
            f"gpulayer-tui web: cannot listen on {printable(f'{host}:{port}: {err}')}",
            file=sys.stderr,
        )
        return 2
    shown, bound_port = _bound_address(runner, host, port)
    loopback = bound_loopback_only(list(runner.addresses))
    server.gate.loopback_only = loopback  # (the Host check, where only loopback listens)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    warning = exposure_warning(host, bound_port, loopback)
    if warning:
        print(warning, file=sys.stderr)
    try:
        serving = await engine_is_serving(paths)
    except EngineRefused as err:
        print(f"gpulayer-tui web: {err}", file=sys.stderr)
        serving = True  # (it serves; each tab's TUI says the same refusal)
    if not serving:
        print(
            f"gpulayer-tui web: no engine serves {paths.state_text} yet; browser sessions "
            "attach to a running engine and never start one: start `gpulayer-tui --serve` "
            "(or the unit from `gpulayer-tui install-service`)",
            file=sys.stderr,
        )
    print("gpulayer-tui web: serving the TUI to browsers (Ctrl+C stops); open", flush=True)
    print(f"    http://{shown}:{bound_port}/?token={server.gate.token}", flush=True)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        print(
            f"gpulayer-tui web: stopping ({len(server.sessions)} browser session(s))",
            file=sys.stderr,
            flush=True,
        )
        await server.close_sessions()
        await runner.cleanup()
        # The sessions' subprocess transports, collected after the loop closed, printed
        # "Exception ignored ... Event loop is closed" at a stop soon after a tab left:
        # collected here, they close on the running loop.
        import gc

        gc.collect()
        await asyncio.sleep(0)
    return 0


class RequestErrorLines(logging.Handler):
    """aiohttp's logging of a request it could not handle, as one line without the
    request: aiohttp prints a traceback whose message quotes the request line (an
    over-long one: tester h82), and the request line holds the token."""

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        what = f": {type(error).__name__}" if error is not None else ""
        try:
            sys.stderr.write(
                f"gpulayer-tui web: {printable(record.getMessage())}{what} (the request "
                "is not shown: it may hold the token)\n"
            )
        except (OSError, ValueError):  # (stderr closed)
            pass


def quiet_request_errors() -> None:
    """Route aiohttp's server log through :class:`RequestErrorLines` (only there)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(h, RequestErrorLines) for h in logger.handlers):
        logger.addHandler(RequestErrorLines(logging.WARNING))
    logger.propagate = False


class ConnectionCap:
    """At most ``limit`` connections on aiohttp's ``server``: past it, a new connection
    takes the place of the oldest one that is waiting for a request (idle, or still
    sending one), else of the oldest that is not a browser session (an answer its client
    does not read), and is closed itself where none is. Connections that never finished
    a request held the server's file descriptors until it could accept nothing, its own
    page included (tester h85); so did ones that never read their answers (h88). Now
    they are what gives way; the sessions' websockets never do.

    aiohttp tells its server of each connection made and lost; the cap wraps those two.

    Args:
        server: aiohttp's low-level server.
        limit: The most connections at once.
        sessions: The transports of the browser sessions' websockets, now.
    """

    def __init__(
        self,
        server: web.Server,
        limit: int,
        sessions: Callable[[], Collection[object]] = frozenset,
    ) -> None:
        self.limit = limit
        self.open: dict[Any, asyncio.Transport] = {}  # (oldest first)
        self._sessions = sessions
        self._made = server.connection_made
        self._lost = server.connection_lost
        server.connection_made = self.connection_made  # type: ignore[method-assign]
        server.connection_lost = self.connection_lost  # type: ignore[method-assign]

    def connection_made(self, handler: Any, transport: asyncio.Transport) -> None:
        self.open[handler] = transport
        self._made(handler, transport)
        live = [known for known, its in self.open.items() if not its.is_closing()]
        if len(live) <= self.limit:
            return
        sessions = self._sessions()
        older = [known for known in live[:-1] if self.open[known] not in sessions]
        giving_way = next((known for known in older if _waits_for_a_request(known)), None)
        if giving_way is None:
            giving_way = older[0] if older else handler
        # (closed once aiohttp has started its handler: closed before, the handler's
        # start raised "assert manager is not None", a traceback per refusal: h88)
        asyncio.get_running_loop().call_soon(giving_way.force_close)

    def connection_lost(self, handler: Any, exc: BaseException | None = None) -> None:
        self.open.pop(handler, None)
        self._lost(handler, exc)


def _waits_for_a_request(handler: Any) -> bool:
    # (aiohttp's own test for an idle connection, in its keep-alive timer: a request
    # handler waiting on its next message)
    waiter = getattr(handler, "_waiter", None)
    return waiter is not None and not waiter.done()


def connection_limit() -> int:
    """:data:`MAX_CONNECTIONS`, or half the open-file limit where that is lower (the rest
    is for the sessions' pipes, the engine's socket and the files served)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return min(MAX_CONNECTIONS, max(8, soft // 2))


def _bound_address(runner: web.AppRunner, host: str, asked: int) -> tuple[str, int]:
    """The host and port the URL printed names: one address bound, and its own port.

    A host given by name (``localhost``) is printed as the address it was bound at: a
    browser resolving the name may try an address not bound here (``::1``), where another
    user's listener got the token (tester h155). With port 0 each address gets a port of
    its own, so the port is that address's (the IPv4 address was printed with the ::1
    port, which another user then took on 127.0.0.1: tester h161).
    """
    bound = [a for a in runner.addresses if isinstance(a, tuple) and len(a) >= 2]
    if not bound:
        return browser_host(host), asked
    # (IPv4 first: what "localhost" meant before ::1 existed)
    first = sorted(bound, key=lambda a: ":" in str(a[0]))[0]
    try:
        ipaddress.ip_address(host.strip("[]"))
        literal = True
    except ValueError:
        literal = is_wildcard(host)
    if literal:
        return browser_host(host), int(first[1])
    return url_host(str(first[0])), int(first[1])


def run_web(paths: Paths, host: str, port: int, max_sessions: int = MAX_SESSIONS) -> int:
    """Serve the TUI to browsers until SIGINT or SIGTERM; return the exit code."""
    server = WebServer(session_command(paths), host, port, secrets.token_urlsafe(32), max_sessions)
    try:
        return asyncio.run(_serve(server, host, port, paths))
    except KeyboardInterrupt:  # (a second Ctrl+C during the shutdown)
        return 130
