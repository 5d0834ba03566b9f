"""A small Chrome DevTools Protocol driver for headless Chromium (tests only).

Chromium is started with ``--remote-debugging-port=0``; it writes the port it chose to
``DevToolsActivePort`` in its profile dir, and the page's websocket comes from
``/json/list``. Commands go over that websocket (aiohttp's client) as JSON with ids; the
answers are matched by id. No Node, no browser-automation package.

The page's terminal is xterm.js drawing on a canvas (WebGL), so its text is not in the
DOM. A script that runs before the page's own (``Page.addScriptToEvaluateOnNewDocument``)
catches the ``Terminal`` object when textual-serve's client stores it (``this.terminal =
new Terminal(...)``: a setter on ``Object.prototype`` sees the assignment), and
:meth:`Page.screen_text` reads its buffer: the characters the terminal shows.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

CAPTURE_TERMINAL = """
window.__terminals = [];
Object.defineProperty(Object.prototype, "terminal", {
  configurable: true,
  set(value) {
    Object.defineProperty(this, "terminal", {
      value, writable: true, configurable: true, enumerable: true,
    });
    window.__terminals.push(value);
  },
});
"""

SCREEN_TEXT = """
(() => {
  const t = (window.__terminals || []).find((x) => x && x.buffer && x.buffer.active);
  if (!t) return null;
  const buffer = t.buffer.active;
  const lines = [];
  for (let i = 0; i < t.rows; i++) {
    const line = buffer.getLine(buffer.viewportY + i);
    lines.push(line ? line.translateToString(true) : "");
  }
  return lines.join("\\n");
})()
"""

# key -> (code, windowsVirtualKeyCode, text) for Input.dispatchKeyEvent
_KEYS = {"Enter": ("Enter", 13, "\r"), "Escape": ("Escape", 27, "")}


def chromium_path() -> str | None:
    """The Chromium binary, if one is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CdpError(RuntimeError):
    """A DevTools command answered with an error."""


class Page:
    """One page target, driven over its DevTools websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            future = self._waiting.pop(data.get("id", -1), None)
            if future is None or future.done():
                continue  # an event: not used
            if "error" in data:
                future.set_exception(CdpError(str(data["error"])))
            else:
                future.set_result(data.get("result", {}))
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(CdpError("the DevTools connection closed"))

    async def send(self, method: str, timeout: float = 10.0, **params: Any) -> Any:
        """Run a DevTools command; return its result."""
        self._next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[self._next_id] = future
        await self._ws.send_str(
            json.dumps({"id": self._next_id, "method": method, "params": params})
        )
        return await asyncio.wait_for(future, timeout)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise CdpError(str(result["exceptionDetails"]))
        return result["result"].get("value")

    async def screen_text(self) -> str:
        """What the page's terminal shows, one line per row ("" before it exists)."""
        return await self.evaluate(SCREEN_TEXT) or ""

    async def wait_for_text(self, predicate: Callable[[str], bool], timeout: float = 20.0) -> str:
        """Poll the terminal's text until ``predicate`` holds; fail with the screen at the
        deadline."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = await self.screen_text()
            if predicate(text):
                return text
            await asyncio.sleep(0.1)
        raise AssertionError(f"the page's terminal never matched in {timeout} s; it shows:\n{text}")

    async def wait_for(self, expression: str, message: str, timeout: float = 20.0) -> Any:
        """Poll a JavaScript expression until it is truthy; fail with ``message``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        raise AssertionError(f"{message} (in {timeout} s)")

    async def press(self, key: str) -> None:
        """Type one key (a character, ``Enter`` or ``Escape``) as a keyboard would."""
        if key in _KEYS:
            code, vk, text = _KEYS[key]
        else:
            # (the default was built before the lookup: ord("ENTER") raised for Enter)
            physical = f"Digit{key}" if key.isdigit() else f"Key{key.upper()}"
            code, vk, text = physical, ord(key.upper()), key
        common = {"key": key, "code": code, "windowsVirtualKeyCode": vk}
        await self.send("Input.dispatchKeyEvent", type="keyDown", text=text, **common)
        await self.send("Input.dispatchKeyEvent", type="keyUp", **common)

    async def screenshot(self, path: Path) -> Path:
        """Save a PNG of the page."""
        result = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(result["data"]))
        return path

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()


class Chromium:
    """A headless Chromium with its own throw-away profile."""

    def __init__(self, binary: str, profile: Path, width: int = 1400, height: int = 900) -> None:
        self.profile = profile
        self.log = profile.parent / "chromium.log"
        args = [
            binary,
            "--headless=new",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            "--no-sandbox",  # (as root in CI, Chromium's sandbox refuses to start)
            "about:blank",
        ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self.session: aiohttp.ClientSession | None = None

    async def _port(self, timeout: float) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited: {self.log.read_text()[-2000:]}")
            try:
                first = marker.read_text().splitlines()[0]
                return int(first)
            except (OSError, IndexError, ValueError):
                await asyncio.sleep(0.05)
        raise RuntimeError(f"chromium gave no DevTools port in {timeout} s")

    async def page(self, timeout: float = 20.0) -> Page:
        """The first page (about:blank), driven over DevTools."""
        port = await self._port(timeout)
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        ws = await self.session.ws_connect(url, max_msg_size=0)
        return Page(ws)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.proc.kill()
        self.proc.wait(timeout=10)
