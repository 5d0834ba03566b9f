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
files, downloads), rather than a reverse proxy in front of it. A request passes with
``?token=`` equal to the token (compared in constant time), or with the cookie a valid
``/?token=`` sets (HttpOnly, SameSite=Strict: the page's own websocket and static files
carry it; no other site's page does). The websocket also needs an ``Origin`` of this
host, as a second guard against other pages opening it. Everything else gets 403.

Imported only by the ``web`` subcommand (textual-serve, jinja2 and aiohttp stay out of
every other CLI call).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
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

FORBIDDEN_TEXT = (
    "403: gpulayer-tui web needs its token: open the URL `gpulayer-tui web` printed when "
    "it started (http://HOST:PORT/?token=...)\n"
)
SHUTDOWN_GRACE = 5.0
"""Seconds browser sessions get to quit on their own at shutdown before they are killed."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_LINK = re.compile(r"<link\b[^>]*\bhref=\"(?P<href>[^\"]*)\"[^>]*>\s*", re.IGNORECASE)
"""A ``<link>`` in textual-serve's page (those to another site are taken out)."""


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
        token: The secret in the URL.
        cookie: The cookie's name (per port: cookies do not tell ports apart, and two
            ``web`` servers on one host must not overwrite each other's).
    """

    def __init__(self, token: str, cookie: str) -> None:
        self._token = token.encode()
        self.cookie = cookie

    @property
    def token(self) -> str:
        """The token (for the URL printed at start)."""
        return self._token.decode()

    def _matches(self, value: str | None) -> bool:
        # Bytes, not str: compare_digest refuses a non-ASCII str (a TypeError, a 500).
        return value is not None and hmac.compare_digest(value.encode(), self._token)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        by_query = self._matches(request.query.get("token"))
        if not (by_query or self._matches(request.cookies.get(self.cookie))):
            raise web.HTTPForbidden(text=FORBIDDEN_TEXT)
        if request.path == "/ws" and not _same_origin(request):
            raise web.HTTPForbidden(text="403: a websocket from another origin\n")
        response = await handler(request)
        if not response.prepared:  # (not the websocket: its headers are sent)
            # The token is in this page's URL: no Referer carries it anywhere, no cache
            # keeps it.
            response.headers["Referrer-Policy"] = "no-referrer"
            response.headers["Cache-Control"] = "no-store"
            if by_query:
                response.set_cookie(
                    self.cookie,
                    self.token,
                    httponly=True,
                    samesite="Strict",
                    path="/",
                )
        return response


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (browsers always send Origin on a websocket)
    return urlsplit(origin).netloc == request.host


class WebServer(Server):
    """textual-serve's server with the token in front, relative-to-the-request URLs, our
    own start-up lines, and sessions that can be closed at shutdown."""

    def __init__(self, command: str, host: str, port: int, token: str) -> None:
        super().__init__(command, host=host, port=port, title="gpulayer-tui")
        self.gate = TokenGate(token, f"gpulayer_web_{port}")
        self.sessions: set[asyncio.Task[Any]] = set()

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.gate.middleware)
        return app

    async def on_startup(self, app: web.Application) -> None:
        """(textual-serve prints its logo and URL here; ``run_web`` prints ours.)"""

    async def handle_index(self, request: web.Request) -> Any:
        """The page, with the websocket and static URLs on the host the browser used.

        textual-serve writes absolute URLs from ``public_url`` (the bound host and port),
        which are wrong behind an SSH tunnel to another local port or when bound to
        0.0.0.0; the request's own ``Host`` is right. (No await between setting it and the
        template reading it, so concurrent requests cannot mix it up.)
        """
        self.public_url = f"{request.scheme}://{request.host}"
        response = await super().handle_index(request)
        if isinstance(response, web.Response) and response.text is not None:
            # textual-serve's page loads a font from Google: a request to a third party
            # each time the page opens, and on a box that reaches no internet a
            # stylesheet that holds the page's first paint until it times out. The
            # terminal falls back to the browser's monospace font.
            own = request.host
            response.text = _LINK.sub(
                lambda m: m[0] if urlsplit(m["href"]).netloc in ("", own) else "", response.text
            )
        return response

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """One browser session (textual-serve's), tracked so shutdown can close it."""
        if not web.WebSocketResponse().can_prepare(request).ok:
            # (a plain GET: textual-serve's handler raised, logged a traceback, and the
            # client got no answer at all)
            raise web.HTTPBadRequest(text="a websocket connection is expected here")
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

    app = await server._make_app()
    # No access log: the token is in the request line.
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        from .fields import printable

        print(
            f"gpulayer-tui web: cannot listen on {printable(f'{host}:{port}: {err}')}",
            file=sys.stderr,
        )
        return 2
    bound_port = _bound_port(runner, port)
    if bound_port != port:  # --port 0: a free port, now known; the cookie is named for it
        server.gate.cookie = f"gpulayer_web_{bound_port}"
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


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


def run_web(paths: Paths, host: str, port: int) -> int:
    """Serve the TUI to browsers until SIGINT or SIGTERM; return the exit code."""
    server = WebServer(session_command(paths), host, port, secrets.token_urlsafe(32))
    try:
        return asyncio.run(_serve(server, host, port, paths))
    except KeyboardInterrupt:  # (a second Ctrl+C during the shutdown)
        return 130
