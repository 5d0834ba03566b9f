"""``gpulayer-tui web``: the token, the binding warning, the session command, shutdown; and
a headless Chromium that drives the page (marked ``browser``; skipped without Chromium)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from gpulayer_tui.engine.paths import Paths, resolve_paths
from gpulayer_tui.web import (
    WebServer,
    browser_host,
    exposure_warning,
    is_loopback,
    session_command,
)

from .cdp import CAPTURE_TERMINAL, Chromium, chromium_path
from .conftest import REPO, Served, eventually, wait_for

TOKEN = "s3cret-token_value"
URL_LINE = re.compile(r"http://(\S+?):(\d+)/\?token=(\S+)")


# --- the gate, in process ---------------------------------------------------------------


class Gated:
    """WebServers with TOKEN on free ports of 127.0.0.1 (stopped at the end)."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.started: list[tuple[WebServer, Any]] = []

    async def start(self, host: str = "127.0.0.1", max_sessions: int = 8) -> str:
        """One more server (``host``: the address it believes it is bound to); its URL."""
        from aiohttp import web

        server = WebServer(session_command(self.paths), host, 0, TOKEN, max_sessions)
        runner = await server.runner()
        self.started.append((server, runner))
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        address, port = runner.addresses[0][:2]
        return f"http://{address}:{port}"


@pytest.fixture
async def servers(paths: Paths) -> AsyncIterator[Gated]:
    gated = Gated(paths)
    yield gated
    for server, runner in gated.started:
        await server.close_sessions(grace=10)
        await runner.cleanup()
    gc.collect()  # (the sessions' subprocess transports close on this loop)
    await asyncio.sleep(0)


@pytest.fixture
async def gated(servers: Gated) -> str:
    """A WebServer with TOKEN on a free port (no session is opened); its base URL."""
    return await servers.start()


async def test_the_page_needs_the_token_and_sets_no_cookie(gated: str) -> None:
    # (unsafe: aiohttp's client keeps no cookie of an IP address otherwise; browsers do)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        for query in ("", "?token=", "?token=wrong", "?token=%C3%A9t%C3%A9", f"?token={TOKEN}x"):
            async with session.get(f"{gated}/{query}") as response:
                assert response.status == 403, query
                assert "token" in await response.text()
        async with session.get(f"{gated}/?token={TOKEN}") as response:
            assert response.status == 200
            page = await response.text()
            assert response.headers["Referrer-Policy"] == "no-referrer"
            assert response.headers["Cache-Control"] == "no-store"
            # No cookie: a browser sends one of 127.0.0.1 to every port, another user's
            # server's too (h82 took the token so).
            assert "Set-Cookie" not in response.headers
        assert len(session.cookie_jar) == 0
        # The page's websocket and scripts point at the host the browser used, under the
        # token.
        host = gated.removeprefix("http://")
        assert f'"ws://{host}/{TOKEN}/ws"' in page
        assert f'"{gated}/{TOKEN}/static/js/textual.js"' in page
        # It asks nothing of another site (textual-serve's page loaded a Google font).
        assert "xterm.css" in page and "googleapis" not in page
        for url in re.findall(r"(?:href|src)=\"(https?://[^\"/]*)", page):
            assert url == gated, page
        async with session.get(f"{gated}/{TOKEN}/static/js/textual.js") as response:
            assert response.status == 200
        async with session.get(f"{gated}/{TOKEN}/static/css/xterm.css") as response:
            assert response.status == 200
        # Having loaded the page gives nothing to a request without the token.
        async with session.get(f"{gated}/static/js/textual.js") as response:
            assert response.status == 403


async def test_static_files_and_the_websocket_need_the_token_too(gated: str) -> None:
    async with aiohttp.ClientSession() as session:
        for path in (
            "/static/js/textual.js",
            "/ws",
            "/wrong/ws",
            f"/{TOKEN}x/ws",
            f"/{TOKEN}x/static/js/textual.js",
            f"/x{TOKEN}/static/js/textual.js",
            f"/{TOKEN}",
            "/download/",
        ):
            async with session.get(gated + path) as response:
                assert response.status == 403, path
        # A download's own key is its pass (random, one delivery): an unknown one is 404.
        async with session.get(f"{gated}/download/0123abcd") as response:
            assert response.status == 404
            # (a download's handler sends its own headers: they are added to every
            # response as it is prepared, not by the gate after the handler returned)
            assert response.headers["Cache-Control"] == "no-store"
            assert response.headers["Referrer-Policy"] == "no-referrer"
        # A page of another site cannot open the websocket, even knowing the token.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(
                f"{gated}/{TOKEN}/ws", headers={"Origin": "http://evil.example"}
            )
        assert refused.value.status == 403
        # Nor a page without an http(s) origin (a file, a sandboxed frame: "null").
        for origin in ("null", f"file://{gated.removeprefix('http://')}", "ftp://x"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(f"{gated}/{TOKEN}/ws", headers={"Origin": origin})
            assert refused.value.status == 403, origin


async def test_a_plain_get_of_the_websocket_with_the_token_is_a_clean_400(
    gated: str, caplog: pytest.LogCaptureFixture
) -> None:
    # It raised inside textual-serve: a logged traceback, and no answer at all.
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{gated}/{TOKEN}/ws") as response:
            assert response.status == 400
            assert "a websocket connection is expected here" in await response.text()
    assert "Traceback" not in caplog.text and "Unhandled exception" not in caplog.text


async def test_on_loopback_a_request_for_another_host_name_is_refused(servers: Gated) -> None:
    # DNS rebinding: a page of evil.example, its name re-pointed at 127.0.0.1, sends its
    # own name in Host.
    loopback = await servers.start()
    wildcard = await servers.start(host="0.0.0.0")
    async with aiohttp.ClientSession() as session:
        for host, status in (
            ("evil.example", 403),
            ("127.0.0.1.evil.example", 403),
            # (read as a URL, this one's host was "localhost"; a browser sends no such
            # Host, so it is refused rather than parsed: h85)
            ("evil.example\\@localhost", 403),
            ("evil.example@localhost", 403),
            ("localhost/evil", 403),
            ("localhost", 200),
            ("localhost:9999", 200),  # (an SSH tunnel's port)
            ("127.0.0.1:9999", 200),
            ("[::1]:9999", 200),
            ("app.localhost", 200),
        ):
            async with session.get(
                f"{loopback}/?token={TOKEN}", headers={"Host": host}
            ) as response:
                assert response.status == status, host
                if status == 403:
                    assert "Host header names no loopback address" in await response.text()
    # An absolute-form target took the place of the Host header in aiohttp's eyes: both
    # are checked (tester h88).
    address = urlsplit(loopback)
    for target, host in (
        (f"http://{address.netloc}/?token={TOKEN}", "evil.example"),
        (f"http://evil.example/?token={TOKEN}", address.netloc),
        (f"http://{address.netloc}/?token={TOKEN}", address.netloc),
    ):
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = (await asyncio.wait_for(reader.readline(), 10)).decode()
        writer.close()
        expected = "200" if "evil" not in target + host else "403"
        assert status_line.split()[1] == expected, (target, host, status_line)
    # No Host at all (HTTP/1.0): aiohttp took the socket's own address for it, and it
    # passed (tester h162).
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    writer.write(f"GET /?token={TOKEN} HTTP/1.0\r\n\r\n".encode())
    await writer.drain()
    status_line = (await asyncio.wait_for(reader.readline(), 10)).decode()
    await asyncio.wait_for(reader.read(), 10)  # (to its end: the server closes it)
    writer.close()
    await writer.wait_closed()
    assert status_line.split()[1] == "403", status_line
    async with aiohttp.ClientSession() as session:
        # Bound to every address, any name may be this machine's.
        async with session.get(
            f"{wildcard}/?token={TOKEN}", headers={"Host": "box.example:8765"}
        ) as response:
            assert response.status == 200


async def test_browser_sessions_are_capped(servers: Gated) -> None:
    base = await servers.start(max_sessions=1)
    server = servers.started[-1][0]
    async with aiohttp.ClientSession() as session:
        first = await session.ws_connect(f"{base}/{TOKEN}/ws?width=80&height=24")
        try:
            # The second gets a 503 that says why, at the page and at the websocket
            # (once it waited a moment for the slot: 0.2 s here).
            server.slot_wait = 0.2
            async with session.get(f"{base}/?token={TOKEN}") as response:
                assert response.status == 503
                assert "1 browser sessions are open" in await response.text()
                assert "--max-sessions" in await response.text()
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(f"{base}/{TOKEN}/ws?width=80&height=24")
            assert refused.value.status == 503
        finally:
            await first.close()
        # A reload at the cap: the new page asks while the old tab's TUI is still
        # quitting, and waits for its slot rather than a 503 (h85 got one on every other
        # reload).
        server.slot_wait = 30
        async with session.get(f"{base}/?token={TOKEN}") as response:
            assert response.status == 200
        second = await session.ws_connect(f"{base}/{TOKEN}/ws?width=80&height=24")
        await second.close()


def _session_processes() -> list[Any]:
    """This process's live browser-session TUIs (their shells left out).

    A TUI that has ended but is not reaped yet is a zombie, whose command line cannot be
    read (CI saw psutil raise for one): it no longer counts, and neither does one that
    vanished between the listing and the look.
    """
    import psutil

    def is_session_tui(child: psutil.Process) -> bool:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                return False
            return "gpulayer_tui.web_session" in " ".join(child.cmdline()) and (
                child.name() != "sh"
            )
        except psutil.Error:
            return False

    return [child for child in psutil.Process().children(recursive=True) if is_session_tui(child)]


async def test_a_browser_asks_for_any_size_and_bad_messages_and_gets_a_bounded_tui(
    servers: Gated, capfd: pytest.CaptureFixture[str]
) -> None:
    # A token holder asked for a 10**9-column terminal: the tab's TUI grew to 9.5 GB.
    # Sizes are clamped; messages that are not understood are ignored, said once.
    base = await servers.start()
    async with aiohttp.ClientSession() as session:
        socket_ = await session.ws_connect(f"{base}/{TOKEN}/ws?width=1000000000&height=-4")
        try:
            await eventually(lambda: bool(_session_processes()), timeout=30)
            (tui,) = _session_processes()
            environment = tui.environ()
            assert (environment["COLUMNS"], environment["ROWS"]) == ("1000", "24")
            for message in (
                "not json",
                "{}",
                "[]",
                '["resize", {"width": "wide", "height": 10}]',
                '["resize", {"width": true, "height": 10}]',
                '["resize", []]',
                '["stdin", 5]',
                '["stdin", "\\ud800"]',  # (a lone surrogate: no UTF-8 for it)
                '["resize", {"width": 99999999999, "height": 99999999999}]',
                '["nonsense"]',
                "[" * 1000,  # (json.loads: RecursionError, which ended the session: h88)
            ):
                await socket_.send_str(message)
            # The session still answers, and its TUI still runs.
            await socket_.send_str('["ping", "still-there"]')
            while True:
                answer = await asyncio.wait_for(socket_.receive(), 30)
                assert answer.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY)
                if answer.type == aiohttp.WSMsgType.TEXT and "still-there" in answer.data:
                    break
            assert tui.is_running()
        finally:
            await socket_.close()
    await eventually(lambda: not _session_processes(), timeout=30)
    err = capfd.readouterr().err
    assert err.count("a browser session sent a message that is not understood") == 1, err
    assert "Traceback" not in err


def test_terminal_sizes_a_browser_may_ask_for() -> None:
    from gpulayer_tui.web import MAX_COLUMNS, MAX_ROWS, terminal_size

    assert terminal_size("120", "40") == (120, 40)
    assert terminal_size(120, 40) == (120, 40)
    assert terminal_size(10**12, "99999") == (MAX_COLUMNS, MAX_ROWS)
    # (past Python's 4300-digit limit int() raised: a 500 at the websocket, h88)
    assert terminal_size("9" * 5000, "24") == (MAX_COLUMNS, 24)
    for width, height in (("0", "4"), (-1, 4), ("1e3", 4), (True, 4), (1.5, 4), (None, 4)):
        assert terminal_size(width, height) is None, width
    assert terminal_size("\uff18\uff10", "24") is None  # (fullwidth digits: isdigit, not ASCII)


async def test_a_tab_closed_while_its_tui_writes_much_ends_its_tui(servers: Gated) -> None:
    # A 1000x500 tab closed as its TUI redrew (a theme key): textual-serve's relay had
    # ended, nobody read the TUI's output, the TUI sat blocked in a write and never read
    # the quit; it lived on, no longer counted against the cap (tester h88).
    base = await servers.start(max_sessions=1)
    server = servers.started[-1][0]
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            tab = await session.ws_connect(f"{base}/{TOKEN}/ws?width=1000&height=500")
            await eventually(lambda: bool(_session_processes()), timeout=30)
            # (its first screen drawn: output flows)
            await asyncio.wait_for(tab.receive(), 30)
            for width in range(1000, 990, -1):  # (each a whole new screen to send)
                await tab.send_str('["stdin", "t"]')
                await tab.send_str(f'["resize", {{"width": {width}, "height": 500}}]')
            await asyncio.sleep(0.1)
            await tab.close()
            await eventually(lambda: not server.sessions, timeout=40)
            assert _session_processes() == [], "a TUI outlived its closed tab"


async def test_a_tui_that_does_not_quit_when_its_tab_closes_is_killed() -> None:
    # A session stopped counting against the cap while its TUI lived on (h85). Stopping
    # one waits for it, and kills what does not quit: here a program that ignores the
    # quit message textual-serve sends.
    import psutil
    from textual_serve.app_service import AppService
    from textual_serve.download_manager import DownloadManager

    from gpulayer_tui.web import _stop_app

    async def nothing(*_: Any) -> None:
        return None

    service = AppService(
        "exec sleep 600",
        write_bytes=nothing,
        write_str=nothing,
        close=nothing,
        download_manager=DownloadManager(),
    )
    await service.start(80, 24)
    process = service._process
    assert process is not None
    sleeper = psutil.Process(process.pid)
    await _stop_app(service, grace=0.5)
    assert not sleeper.is_running() or sleeper.status() == psutil.STATUS_ZOMBIE
    assert process.returncode is not None


async def test_connections_that_never_finish_a_request_give_way(
    servers: Gated, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Half-sent requests were held for an hour each: at the open-file limit the page was
    # unreachable and asyncio's accept errors flooded stderr (h85). Past the connection
    # cap, the oldest connection still waiting for its request is closed.
    monkeypatch.setattr("gpulayer_tui.web.MAX_CONNECTIONS", 4)
    base = await servers.start()
    host, port = base.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    stalled = []
    for _ in range(6):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /?token=" + TOKEN.encode() + b" HTTP/1.1\r\nHost: 127")
        await writer.drain()
        stalled.append((reader, writer))
    try:
        # The page still opens (in turn it pushes out another stalled connection).
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/?token={TOKEN}") as response:
                assert response.status == 200
        # The oldest stalled connections were closed by the server.
        for reader, _ in stalled[:2]:
            assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        for _, writer in stalled:
            writer.close()
    assert loop.time() > 0


async def test_connections_that_never_read_their_answers_give_way_too(
    servers: Gated, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # Pipelined requests whose answers were never read held their connections (a
    # handler stuck writing is not waiting for a request): past the cap the page was
    # refused (h88). And each connection the cap closed printed a traceback.
    monkeypatch.setattr("gpulayer_tui.web.MAX_CONNECTIONS", 4)
    base = await servers.start()
    host, port = base.removeprefix("http://").split(":")
    request = b"GET /download/" + b"A" * 7900 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    deaf = []
    for _ in range(6):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        with contextlib.suppress(BlockingIOError, ConnectionError):
            for _ in range(200):
                sock.send(request)
        deaf.append(sock)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/?token={TOKEN}") as response:
                assert response.status == 200
    finally:
        for sock in deaf:
            sock.close()
    gc.collect()
    await asyncio.sleep(0.2)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "never retrieved" not in err, err


def test_loopback_hosts_and_the_warning_for_others() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"):
        assert is_loopback(host) and exposure_warning(host, 8765) is None, host
    for host, where in (
        ("0.0.0.0", "every address of this machine (port 18641)"),
        ("::", "every address of this machine (port 18641)"),
        ("0", "every address of this machine (port 18641)"),
        ("192.168.1.5", "192.168.1.5:18641"),
        ("fe80::1", "[fe80::1]:18641"),  # (":::18641" was said of ::)
        ("box.example", "box.example:18641"),
    ):
        warning = exposure_warning(host, 18641)
        assert warning is not None and not is_loopback(host), host
        assert f"anyone who can reach {where} and has the token controls your jobs" in warning
        assert "(ssh -L 18641:127.0.0.1:18641 box)" in warning  # (the port given, not 8765)
    # The URL printed for a wildcard host is one a browser elsewhere can open.
    assert browser_host("0.0.0.0") == browser_host("::") == socket.gethostname()
    assert browser_host("::1") == "[::1]" and browser_host("10.0.0.2") == "10.0.0.2"
    # Judged by the addresses bound when given (h181): loopback ones, whatever the text.
    from gpulayer_tui.web import bound_loopback_only

    assert bound_loopback_only([("127.0.0.1", 1), ("::1", 1, 0, 0)])
    assert not bound_loopback_only([("0.0.0.0", 1)]) and not bound_loopback_only([])
    assert exposure_warning("127.1", 8765, loopback=True) is None
    assert exposure_warning("127.0.0.1", 8765, loopback=False) is not None


def test_the_session_command_textual_serve_runs(tmp_path: Path) -> None:
    # textual-serve runs it through a shell: a config path with spaces and quotes survives.
    paths = resolve_paths(tmp_path / "my conf's dir" / "config.toml")
    words = shlex.split(session_command(paths))
    assert words == [
        sys.executable,
        "-m",
        "gpulayer_tui.web_session",
        "--config",
        str(paths.config_file),
    ]


# --- the command, as a process ----------------------------------------------------------


class WebProcess:
    """``gpulayer-tui web ARGS`` running; its URL once printed."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpulayer_tui", "web", "--port", "0", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        match = wait_for(lambda: self.proc.poll() is not None or URL_LINE.search(self.output()))
        assert self.proc.poll() is None, self.output()
        assert isinstance(match, re.Match)
        self.url = match.group(0)
        self.base = self.url.split("/?", 1)[0]

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def web_process(home: Path, tmp_path: Path) -> Iterator[type[WebProcess]]:
    started: list[WebProcess] = []
    env = dict(os.environ, GPULAYER_HOME=str(home))

    def start(*args: str) -> WebProcess:
        proc = WebProcess(env, tmp_path / f"web{len(started)}.log", *args)
        started.append(proc)
        return proc

    yield start  # type: ignore[misc]
    for proc in started:
        proc.kill()


def test_web_warns_off_loopback_and_stops_on_sigint(web_process: type[WebProcess]) -> None:
    web = web_process("--host", "0.0.0.0")
    assert web.url.startswith(f"http://{socket.gethostname()}:")  # (not 0.0.0.0: h64)
    assert "WARNING: bound to 0.0.0.0" in web.output()
    assert "and has the token controls your jobs" in web.output()
    assert "no engine serves" in web.output()  # and it says what sessions will do
    assert web.stop(signal.SIGINT) == 0


def test_a_loopback_address_written_otherwise_is_loopback_with_its_host_check(
    web_process: type[WebProcess],
) -> None:
    # `--host 127.1` (or 0x7f000001, or a name /etc/hosts maps to 127.0.1.1) bound
    # 127.0.0.1 alone, yet was warned of as exposed and lost the Host check: a request
    # naming evil.example was served (tester h181). Judged by the addresses bound.
    import urllib.error
    import urllib.request

    web = web_process("--host", "127.1")
    assert "WARNING" not in web.output(), web.output()
    url = web.url
    assert url.startswith("http://127.1:") or url.startswith("http://127.0.0.1:"), url
    port = url.split(":")[2].split("/")[0]
    token = url.split("token=", 1)[1]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/?token={token}", headers={"Host": f"evil.example:{port}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    refused.value.close()
    assert refused.value.code == 403
    assert web.stop(signal.SIGTERM) == 0


def test_a_host_given_by_name_is_printed_as_the_address_bound(
    web_process: type[WebProcess],
) -> None:
    # `--host localhost` printed http://localhost:PORT/?token=...: a browser trying ::1
    # first met another user's listener there (bound only 127.0.0.1), token and all:
    # tester h155. The URL names the address bound.
    web = web_process("--host", "localhost")
    assert web.url.startswith(("http://127.0.0.1:", "http://[::1]:")), web.url
    assert web.stop(signal.SIGTERM) == 0


def test_the_url_names_one_bound_address_with_its_own_port() -> None:
    # With port 0 and a name bound at 127.0.0.1 and ::1, each got a port of its own, and
    # the URL paired the IPv4 address with the ::1 port: another user took that port on
    # 127.0.0.1 and got the token (tester h161).
    from types import SimpleNamespace

    from gpulayer_tui.web import _bound_address

    both = SimpleNamespace(addresses=[("::1", 45805, 0, 0), ("127.0.0.1", 32951)])
    assert _bound_address(both, "dual.example", 0) == ("127.0.0.1", 32951)  # type: ignore[arg-type]
    six = SimpleNamespace(addresses=[("::1", 45805, 0, 0)])
    assert _bound_address(six, "localhost", 0) == ("[::1]", 45805)  # type: ignore[arg-type]
    given = SimpleNamespace(addresses=[("127.0.0.1", 8765)])
    assert _bound_address(given, "127.0.0.1", 8765) == ("127.0.0.1", 8765)  # type: ignore[arg-type]


def test_web_on_loopback_does_not_warn_and_stops_on_sigterm(
    web_process: type[WebProcess],
) -> None:
    web = web_process()
    assert web.url.startswith("http://127.0.0.1:")
    assert "WARNING" not in web.output()
    assert web.stop(signal.SIGTERM) == 0
    assert "stopping (0 browser session(s))" in web.output()


def test_a_request_aiohttp_cannot_parse_is_logged_without_the_token(
    web_process: type[WebProcess],
) -> None:
    # aiohttp logged a traceback that quoted the over-long request line, token and all
    # (tester h82); the web's output may go to a journal others read.
    web = web_process()
    match = URL_LINE.search(web.url)
    assert match is not None
    host, port, token = match.groups()
    for request in (
        f"GET /?token={token}&{'a' * 9000} HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f"GET /?token={token} HTTP/1.1\r\nHost: {host}\r\nX-Long: {'b' * 9000}\r\n\r\n",
    ):
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(request.encode())
            assert conn.recv(100).startswith(b"HTTP/1.0 400")
    wait_for(lambda: web.output().count("LineTooLong") == 2)
    assert web.stop() == 0
    out = web.output()
    assert token not in out.replace(web.url, ""), out
    assert "Traceback" not in out
    assert "Error handling request from 127.0.0.1: LineTooLong (the request is not shown" in out


# --- a browser --------------------------------------------------------------------------

CHROMIUM = chromium_path()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Chromium]:
    assert CHROMIUM is not None
    chromium = Chromium(CHROMIUM, tmp_path / "profile")
    yield chromium
    await chromium.close()


def _screenshot_dir(tmp_path: Path) -> Path:
    # GPULAYER_SCREENSHOTS=DIR keeps them for a person to look at; else the test's tmp dir.
    path = Path(os.environ.get("GPULAYER_SCREENSHOTS") or tmp_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.browser
@needs_chromium
async def test_the_tui_in_a_browser_shows_the_dashboard_the_jobs_and_cancels_a_job(
    served: Served, web_process: type[WebProcess], browser: Chromium, tmp_path: Path
) -> None:
    shots = _screenshot_dir(tmp_path)
    await asyncio.to_thread(served.start, "--simulate", "1xA100-80GB")
    for name in ("train-a", "train-b"):
        result = await asyncio.to_thread(served.cli, "submit", "--name", name, "--", "sleep", "600")
        assert result.returncode == 0, result.stderr
    web = await asyncio.to_thread(web_process)

    page = await browser.page()
    await page.send("Page.enable")
    await page.send("Page.addScriptToEvaluateOnNewDocument", source=CAPTURE_TERMINAL)
    await page.send("Page.navigate", url=web.url)

    # The dashboard: the simulated GPU's panel, the two running jobs, attached.
    screen = await page.wait_for_text(
        lambda text: "gpu0 · Simulated A100" in text and "2 running" in text
    )
    assert f"attached to {served.home}/engine.sock" in screen
    await page.screenshot(shots / "web-1-dashboard.png")
    # Every column is in sight: no scrollbar over the last ones (h82: they were cut off).
    widths = await page.evaluate(
        "(() => { const t = document.querySelector('.xterm');"
        " return [t.querySelector('.xterm-screen').getBoundingClientRect().width,"
        " t.querySelector('.xterm-viewport').clientWidth]; })()"
    )
    assert widths[0] <= widths[1], widths

    await page.evaluate("window.__terminals.find((t) => t.buffer).focus()")
    await page.press("2")
    screen = await page.wait_for_text(lambda text: "train-a" in text and "train-b" in text)
    assert "Cancel" in screen and "Status" in screen  # the jobs screen's footer
    await page.screenshot(shots / "web-2-jobs.png")

    await page.press("c")
    screen = await page.wait_for_text(lambda text: re.search(r"Cancel job \d+\?", text) is not None)
    match = re.search(r"Cancel job (\d+)\?", screen)
    assert match is not None
    job_id = match.group(1)
    await page.screenshot(shots / "web-3-confirm.png")
    await page.press("y")

    def cancelled() -> bool:
        result = served.cli("status", job_id, "--json")
        return json.loads(result.stdout)["job"]["status"] == "cancelled"

    await asyncio.to_thread(wait_for, cancelled, 20, 0.1)
    await page.wait_for_text(lambda text: "cancelled" in text)
    await page.screenshot(shots / "web-4-cancelled.png")
    statuses = json.loads((await asyncio.to_thread(served.cli, "jobs", "--json")).stdout)
    assert sorted(row["status"] for row in statuses) == ["cancelled", "running"]

    # Stopping the server ends the session (its process too) and the page says so.
    assert await asyncio.to_thread(web.stop) == 0
    assert "stopping (1 browser session(s))" in web.output()
    await page.close()


@pytest.mark.browser
@needs_chromium
async def test_without_an_engine_the_page_says_how_to_start_one(
    home: Path, web_process: type[WebProcess], browser: Chromium, tmp_path: Path
) -> None:
    web = await asyncio.to_thread(web_process)
    page = await browser.page()
    await page.send("Page.enable")
    await page.send("Page.addScriptToEvaluateOnNewDocument", source=CAPTURE_TERMINAL)
    await page.send("Page.navigate", url=web.url)
    screen = await page.wait_for_text(lambda text: "--serve" in text)
    assert f"No gpulayer-tui engine serves {home}" in screen
    # (this state dir's, not the shell's own: tester h181)
    assert f"GPULAYER_HOME={home}" in screen.replace("\n", "")
    await page.screenshot(_screenshot_dir(tmp_path) / "web-5-no-engine.png")
    assert not (home / "engine.sock").exists()  # no engine was started for the tab
    # q closes the session: the page says so (textual-serve's "Session ended").
    await page.evaluate("window.__terminals.find((t) => t.buffer).focus()")
    await page.press("q")
    await page.wait_for(
        "document.body.classList.contains('-closed')", "the page never showed the session ended"
    )
    assert await asyncio.to_thread(web.stop) == 0
    await page.close()


@pytest.mark.browser
@needs_chromium
async def test_another_server_on_another_port_never_gets_the_token(
    home: Path, web_process: type[WebProcess], browser: Chromium
) -> None:
    # Tester h82: the token was in a cookie, and a browser sends a cookie of 127.0.0.1 to
    # every port: a link to another local user's server there handed it over.
    from aiohttp import web as aioweb

    seen: list[str] = []

    async def record(request: aioweb.Request) -> aioweb.Response:
        seen.append(f"{request.url}\n{dict(request.headers)}")
        return aioweb.Response(text="<p>another server</p>", content_type="text/html")

    other_app = aioweb.Application()
    other_app.router.add_get("/{tail:.*}", record)
    runner = aioweb.AppRunner(other_app)
    await runner.setup()
    await aioweb.TCPSite(runner, "127.0.0.1", 0).start()
    other = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        web = await asyncio.to_thread(web_process)
        match = URL_LINE.search(web.url)
        assert match is not None
        token = match.group(3)
        page = await browser.page()
        await page.send("Page.enable")
        await page.send("Page.addScriptToEvaluateOnNewDocument", source=CAPTURE_TERMINAL)
        await page.send("Page.navigate", url=web.url)
        # The page loaded and its session runs (no engine: it says how to start one).
        await page.wait_for_text(lambda text: "gpulayer-tui --serve" in text)
        await page.send("Page.navigate", url=f"{other}/follow-me")
        await page.wait_for(
            "document.body && document.body.innerText.includes('another server')",
            "the other server's page never opened",
        )
        assert seen
        assert not any(token in request for request in seen), seen
        await page.close()
        assert await asyncio.to_thread(web.stop) == 0
    finally:
        await runner.cleanup()


def test_a_browser_sessions_tui_ends_when_the_web_server_is_gone(served: Served) -> None:
    # `gpulayer-tui web` killed (SIGKILL, out of memory): each tab's TUI lived on, still
    # attached to the engine, its input a pipe nobody wrote to any more (tester h181).
    # The pipe's hang-up ends it. (Run here as textual-serve runs it: the web driver, its
    # input a pipe, its output read by nobody that matters.)
    served.start("--simulate", "1xA100-80GB")
    env = dict(
        served.env,
        TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver",
        TERM_PROGRAM="textual",
        COLUMNS="80",
        ROWS="24",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui.web_session"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        # Attached: its connections to the engine are open.
        import psutil

        def attached() -> bool:
            try:
                return bool(psutil.Process(proc.pid).net_connections("unix"))
            except psutil.Error:
                return False

        wait_for(attached, timeout=30)
        assert proc.stdin is not None
        proc.stdin.close()  # (the server gone: nobody writes its input any more)
        assert proc.wait(timeout=30) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
