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
import hmac
import ipaddress
import logging
import re
import secrets
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
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
"""Seconds browser sessions get to quit on their own at shutdown before they are killed."""

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


def exposure_warning(host: str, port: int) -> str | None:
    """The warning printed when ``host`` is not a loopback address, else ``None``."""
    if is_loopback(host):
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
        response = await handler(request)
        if not response.prepared:  # (not the websocket: its headers are sent)
            # The token is in this page's URL: no Referer carries it anywhere, no cache
            # keeps it.
            response.headers["Referrer-Policy"] = "no-referrer"
            response.headers["Cache-Control"] = "no-store"
        return response


HOST_REFUSED = (
    "a request for another host name (the Host header names no loopback address); open "
    "the URL `gpulayer-tui web` printed"
)


def _host_is_loopback(request: web.Request) -> bool:
    # A page of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends
    # its own name; a tunnel's and the printed URL's are loopback ones.
    host = urlsplit(f"//{request.host}").hostname or ""
    return host == "localhost" or host.endswith(".localhost") or is_loopback(host)


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (browsers always send Origin on a websocket)
    return urlsplit(origin).netloc == request.host


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

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        # The page's own routes, under the token (textual-serve's /ws and /static stay,
        # refused without it).
        app.router.add_get(f"{self.gate.prefix}/ws", self.handle_websocket)
        app.router.add_static(f"{self.gate.prefix}/static", self.statics_path)
        app.middlewares.append(self.gate.middleware)
        return app

    def _full(self) -> web.HTTPServiceUnavailable | None:
        if len(self.sessions) < self.max_sessions:
            return None
        return web.HTTPServiceUnavailable(
            text=f"503: {self.max_sessions} browser sessions are open, the most "
            "`gpulayer-tui web --max-sessions` allows here (each runs a TUI of its own); "
            "close a tab and reload\n"
        )

    async def on_startup(self, app: web.Application) -> None:
        """(textual-serve prints its logo and URL here; ``run_web`` prints ours.)"""

    async def handle_index(self, request: web.Request) -> Any:
        """The page, with the websocket and static URLs on the host the browser used.

        textual-serve writes absolute URLs from ``public_url`` (the bound host and port),
        which are wrong behind an SSH tunnel to another local port or when bound to
        0.0.0.0; the request's own ``Host`` is right. (No await between setting it and the
        template reading it, so concurrent requests cannot mix it up.)
        """
        if full := self._full():
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
        """One browser session (textual-serve's), tracked so shutdown can close it."""
        if not web.WebSocketResponse().can_prepare(request).ok:
            # (a plain GET: textual-serve's handler raised, logged a traceback, and the
            # client got no answer at all)
            raise web.HTTPBadRequest(text="a websocket connection is expected here")
        if full := self._full():
            raise full
        task = asyncio.current_task()
        assert task is not None
        self.sessions.add(task)
        try:
            return await super().handle_websocket(request)
        finally:
            self.sessions.discard(task)

    async def close_sessions(self, grace: float = SHUTDOWN_GRACE) -> None:
        """End every browser session: each is cancelled, which makes textual-serve tell its
        app to quit and wait for it; apps still running after ``grace`` are killed."""
        tasks = list(self.sessions)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        _kill_children()


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
    app = await server._make_app()
    # No access log: the token is in the request line.
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
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
    bound_port = _bound_port(runner, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    warning = exposure_warning(host, bound_port)
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
    print(f"    http://{browser_host(host)}:{bound_port}/?token={server.gate.token}", flush=True)
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


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


def run_web(paths: Paths, host: str, port: int, max_sessions: int = MAX_SESSIONS) -> int:
    """Serve the TUI to browsers until SIGINT or SIGTERM; return the exit code."""
    server = WebServer(session_command(paths), host, port, secrets.token_urlsafe(32), max_sessions)
    try:
        return asyncio.run(_serve(server, host, port, paths))
    except KeyboardInterrupt:  # (a second Ctrl+C during the shutdown)
        return 130
