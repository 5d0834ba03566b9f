"""The engine's end of the launcher socket reads lines as they arrive (a real socket pair).

The launcher tests cover what goes over it; these cover how lines are cut out of what the
socket delivers: split across reads, several in one, a reaction that fails, a runaway line.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import pytest

from gpulayer_tui.engine import launch_client
from gpulayer_tui.engine.launch_client import _Connection

from .conftest import eventually


async def _connected(
    on_line: Callable[[bytes], None],
) -> tuple[socket.socket, _Connection, asyncio.Event]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    lost = asyncio.Event()
    _, conn = await asyncio.get_running_loop().connect_accepted_socket(
        lambda: _Connection(on_line, lambda _conn: lost.set()), ours
    )
    return theirs, conn, lost


async def test_lines_split_across_reads_and_sent_together_arrive_whole() -> None:
    lines: list[bytes] = []
    theirs, conn, lost = await _connected(lines.append)
    try:
        theirs.sendall(b'{"ev":"sta')
        theirs.sendall(b'rted","key":"1"}\n{"ev":"exited","key":"1"}\n\n{"ev":"st')
        await eventually(lambda: len(lines) == 2)
        theirs.sendall(b'arted","key":"2"}\n')
        await eventually(lambda: len(lines) == 3)
        assert lines == [
            b'{"ev":"started","key":"1"}',
            b'{"ev":"exited","key":"1"}',
            b'{"ev":"started","key":"2"}',
        ]
        theirs.close()
        await asyncio.wait_for(lost.wait(), 5)
    finally:
        theirs.close()
        assert conn.transport is not None
        conn.transport.close()


async def test_a_reaction_that_fails_does_not_stop_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[bytes] = []

    def react(line: bytes) -> None:
        seen.append(line)
        if line == b"bad":
            raise ValueError("a bug in one reaction")

    theirs, conn, lost = await _connected(react)
    try:
        with caplog.at_level(logging.ERROR, logger=launch_client.__name__):
            theirs.sendall(b"bad\ngood\n")
            await eventually(lambda: seen == [b"bad", b"good"])
        assert "handling the launcher's b'bad' failed" in caplog.text
        assert not lost.is_set()  # the connection stays up
    finally:
        theirs.close()
        assert conn.transport is not None
        conn.transport.close()


async def test_a_line_without_end_past_the_limit_drops_the_connection(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(launch_client, "LINE_LIMIT", 1000)
    lines: list[bytes] = []
    theirs, _conn, lost = await _connected(lines.append)
    try:
        with caplog.at_level(logging.ERROR, logger=launch_client.__name__):
            theirs.sendall(b"short\n" + b"x" * 1500)
            await asyncio.wait_for(lost.wait(), 5)
        assert lines == [b"short"]
        assert "over 1000 bytes" in caplog.text
    finally:
        theirs.close()
