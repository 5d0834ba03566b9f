"""The engine's end of the launcher socket (real sockets; the launcher's end is the test).

The launcher tests cover what goes over it; these cover how lines are cut out of what the
socket delivers (split across reads, several in one, a reaction that fails, a runaway
line), and how a start sent from the store's writer thread keeps the stream whole when the
socket is full or takes only part of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulayer_tui.engine import launch_client
from gpulayer_tui.engine.executor import Exit, Started
from gpulayer_tui.engine.launch_client import LauncherExecutor, _Connection
from gpulayer_tui.engine.launcher import SOCKET

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


class _Peer:
    """The launcher's end, played by the test: answers the table query, then reads only
    when told to."""

    def __init__(
        self,
        state_dir: Path,
        tasks: dict[str, object] | None = None,
        then: list[dict[str, object]] | None = None,
    ) -> None:
        self.tasks = tasks or {}  # the table it answers the first query with
        self.then = then or []  # events sent in the same write, right after the table
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(state_dir / SOCKET))
        self.listener.listen(1)
        self.listener.setblocking(False)  # (the loop's sock_accept waits for a client)
        self.conn: socket.socket | None = None
        self.received = b""

    async def accept_and_answer(self) -> None:
        loop = asyncio.get_running_loop()
        self.conn, _ = await loop.sock_accept(self.listener)
        while b"\n" not in self.received:
            self.received += await loop.sock_recv(self.conn, 65536)
        assert json.loads(self.received.split(b"\n")[0]) == {"op": "query"}
        self.received = self.received.split(b"\n", 1)[1]
        table = {"ev": "table", "tasks": self.tasks}
        said = b"".join(json.dumps(event).encode() + b"\n" for event in [table, *self.then])
        await loop.sock_sendall(self.conn, said)

    async def lines(self, count: int) -> list[dict[str, object]]:
        """Read until ``count`` whole lines have come; each must be JSON."""
        assert self.conn is not None
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(10):
            while self.received.count(b"\n") < count:
                self.received += await loop.sock_recv(self.conn, 1 << 20)
        return [json.loads(line) for line in self.received.split(b"\n")[:count]]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


async def _executor_with_peer(
    tmp_path: Path,
    tasks: dict[str, object] | None = None,
    then: list[dict[str, object]] | None = None,
) -> tuple[LauncherExecutor, _Peer]:
    peer = _Peer(tmp_path, tasks, then)
    executor = LauncherExecutor(tmp_path, tmp_path)
    answering = asyncio.create_task(peer.accept_and_answer())
    await executor.open()
    await answering
    return executor, peer


def _ignore(_what: Started | Exit) -> None:
    pass


async def test_a_start_the_socket_takes_only_in_part_is_finished_before_anything_else(
    tmp_path: Path,
) -> None:
    # A request larger than the socket's buffer, sent from another thread while the
    # launcher does not read: the socket takes part of it, the loop writes the rest, and
    # what is sent next comes after it, whole.
    executor, peer = await _executor_with_peer(tmp_path)
    try:
        big = "x" * (4 << 20)
        prepared = executor.prepare(
            7, ["true", big], str(tmp_path), {"A": "1"}, {}, _ignore, _ignore
        )
        (env,) = await peer.lines(1)  # the environment goes out at once (it starts nothing)
        assert env["op"] == "env"
        await asyncio.to_thread(prepared.send_now)
        assert prepared.sent
        executor.done(6)  # an ack: written by the loop, after the start's last byte
        lines = await peer.lines(3)
        assert [line.get("op") for line in lines] == ["env", "spawn", "ack"]
        assert lines[1]["argv"] == ["true", big] and lines[1]["key"] == "7"
        assert lines[2]["keys"] == ["6"]
    finally:
        await executor.close()
        peer.close()


async def test_a_start_the_full_socket_refuses_is_sent_by_the_loop_in_order(
    tmp_path: Path,
) -> None:
    executor, peer = await _executor_with_peer(tmp_path)
    env: dict[str, str] = {}
    try:
        first = executor.prepare(
            1, ["true", "y" * (4 << 20)], str(tmp_path), env, {}, _ignore, _ignore
        )
        second = executor.prepare(2, ["true"], str(tmp_path), env, {}, _ignore, _ignore)
        first.send()  # the loop's way: the transport keeps what the socket cannot take
        await eventually(lambda: first.sent and not executor._batch)
        await asyncio.to_thread(second.send_now)
        assert not second.sent  # it would have jumped the queue: the loop sends it
        second.send()
        assert second.sent
        lines = await peer.lines(3)
        assert [(line.get("op"), line.get("key")) for line in lines] == [
            ("env", None),
            ("spawn", "1"),
            ("spawn", "2"),
        ]
    finally:
        await executor.close()
        peer.close()


async def test_a_discarded_start_is_never_sent(tmp_path: Path) -> None:
    executor, peer = await _executor_with_peer(tmp_path)
    env: dict[str, str] = {}
    try:
        dropped = executor.prepare(1, ["true"], str(tmp_path), env, {}, _ignore, _ignore)
        dropped.discard()
        await peer.lines(1)  # (its environment went out: that starts nothing)
        await asyncio.to_thread(dropped.send_now)
        dropped.send()
        assert not dropped.sent and not executor.watching(1)
        kept = executor.prepare(2, ["true"], str(tmp_path), env, {}, _ignore, _ignore)
        await asyncio.to_thread(kept.send_now)
        assert kept.sent
        lines = await peer.lines(2)
        assert [(line.get("op"), line.get("key")) for line in lines] == [
            ("env", None),
            ("spawn", "2"),
        ]
    finally:
        await executor.close()
        peer.close()


async def test_an_ack_rides_with_the_next_start_or_goes_alone_soon_after(tmp_path: Path) -> None:
    executor, peer = await _executor_with_peer(tmp_path)
    env: dict[str, str] = {}
    try:
        prepared = executor.prepare(3, ["true"], str(tmp_path), env, {}, _ignore, _ignore)
        await peer.lines(1)  # its environment
        executor.done(1)
        prepared.send_now()  # (from this thread: the ack has had no time to go alone)
        assert peer.conn is not None
        peer.received += peer.conn.recv(1 << 20)  # what is in the socket now: one write
        assert b'"key":"3"' in peer.received and b'"keys": ["1"]' in peer.received
        executor.done(2)  # nothing follows: it goes alone, a moment later
        lines = await peer.lines(4)
        assert [(line.get("op"), line.get("key"), line.get("keys")) for line in lines] == [
            ("env", None, None),
            ("ack", None, ["1"]),
            ("spawn", "3", None),
            ("ack", None, ["2"]),
        ]
    finally:
        await executor.close()
        peer.close()


async def test_a_rerun_has_a_key_of_its_own_and_continues_the_log(tmp_path: Path) -> None:
    # A batch job requeued after preemption runs again: under a key of its own, so the
    # launcher can never answer it with the old run's end (an ack not read yet, one lost
    # with a dead spawner), and appending to the first run's log.
    executor, peer = await _executor_with_peer(tmp_path)
    env: dict[str, str] = {}
    ended: list[Exit] = []
    try:
        first = executor.prepare(5, ["true"], str(tmp_path), env, {}, _ignore, ended.append)
        await peer.lines(1)  # its environment
        first.send()
        await peer.lines(2)
        assert peer.conn is not None
        await asyncio.get_running_loop().sock_sendall(
            peer.conn,
            b'{"ev":"started","key":"5","pid":1,"ticks":1}\n{"ev":"exited","key":"5","code":143}\n',
        )
        await eventually(lambda: ended)
        rerun = executor.prepare(5, ["true"], str(tmp_path), env, {}, _ignore, _ignore, run=1)
        await asyncio.to_thread(rerun.send_now)  # the old run not even acked: no matter
        assert rerun.sent
        executor.done(5, 0)
        lines = await peer.lines(4)
        assert [(line.get("op"), line.get("key"), line.get("keys")) for line in lines] == [
            ("env", None, None),
            ("spawn", "5", None),
            ("spawn", "5~1", None),
            ("ack", None, ["5"]),
        ]
        assert lines[1]["fresh"] is True and lines[2]["fresh"] is False
        assert lines[1]["log"] == lines[2]["log"]
    finally:
        await executor.close()
        peer.close()


async def test_a_rerun_started_under_the_jobs_own_key_is_found_by_it(tmp_path: Path) -> None:
    # An engine from before per-run keys started a requeued job's second run as "5": the
    # engine after it finds that run, stops it and acks it under that key.
    running = {"state": "running", "pid": 4242, "ticks": 7, "code": None, "at": None}
    executor, peer = await _executor_with_peer(tmp_path, {"5": running})
    try:
        found = executor.find(5, _ignore, _ignore, run=1)
        assert found == Started(4242, 7)
        assert executor.watching(5, 1) and executor.pids() == {5: 4242}
        assert executor.find(6, _ignore, _ignore, run=1) is None
        assert executor.terminate(5, 2.0, 1)
        executor.done(5, 1)
        lines = await peer.lines(2)
        assert [(line.get("op"), line.get("key"), line.get("keys")) for line in lines] == [
            ("terminate", "5", None),  # (a stop is written at once)
            ("ack", None, ["5"]),
        ]
    finally:
        await executor.close()
        peer.close()


async def test_an_end_told_right_behind_the_table_is_not_lost(tmp_path: Path) -> None:
    # The job ended as a restarted engine connected: the table said "running" and the end
    # came in the same read. The end was dropped (the table was not taken in yet), and
    # the restore then found the job running and waited for ever (CI: a job whose spawner
    # was replaced, let go just before the next engine started).
    running = {"state": "running", "pid": 4242, "ticks": 7, "code": None, "at": None}
    ended = {"ev": "exited", "key": "5", "code": 0, "at": 1234.5}
    executor, peer = await _executor_with_peer(tmp_path, {"5": running}, then=[ended])
    try:
        found = executor.find(5, _ignore, _ignore)
        assert found == Exit(0, recorded=True, at=1234.5)
    finally:
        await executor.close()
        peer.close()


async def test_a_stop_that_died_with_the_connection_is_asked_again(tmp_path: Path) -> None:
    # The spawner died with a terminate unread: its successor took the job over, running,
    # and never heard of the stop (the job ran on, and was later released as unkillable
    # without ever being signalled). The engine asks the new spawner again, with what is
    # left of the grace period.
    executor, peer = await _executor_with_peer(tmp_path)
    env: dict[str, str] = {}
    try:
        started = executor.prepare(5, ["sleep", "60"], str(tmp_path), env, {}, _ignore, _ignore)
        started.send()
        await peer.lines(2)  # its environment and its start
        assert peer.conn is not None
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(peer.conn, b'{"ev":"started","key":"5","pid":1,"ticks":1}\n')
        await eventually(lambda: executor.pids() == {5: 1})
        assert executor.terminate(5, 30.0)
        (_, _, stop) = await peer.lines(3)  # written at once, and lost with this connection
        assert stop == {"op": "terminate", "key": "5", "grace": 30.0}
        peer.conn.close()
        peer.conn, peer.received = None, b""
        running = {"state": "running", "pid": 1, "ticks": 1, "code": None, "at": None}
        conn, _ = await loop.sock_accept(peer.listener)
        peer.conn = conn
        while b"\n" not in peer.received:
            peer.received += await loop.sock_recv(conn, 65536)
        peer.received = peer.received.split(b"\n", 1)[1]  # (the query)
        table = {"ev": "table", "tasks": {"5": running}}
        await loop.sock_sendall(conn, json.dumps(table).encode() + b"\n")
        lines = await peer.lines(3)
        assert lines[0]["op"] == "env"  # (a new spawner is told every environment again)
        assert lines[1]["op"] == "max_log"  # (and the cap, for the logs it took over)
        assert lines[2]["op"] == "terminate" and lines[2]["key"] == "5"
        assert 0 < float(lines[2]["grace"]) <= 30.0  # (what is left of it)
    finally:
        await executor.close()
        peer.close()


async def test_acks_that_died_with_the_connection_are_sent_again(tmp_path: Path) -> None:
    # The spawner died with an ack unread: its successor still keeps that end (its table
    # says "exited"), and would keep it for ever; the engine acks it again.
    executor, peer = await _executor_with_peer(tmp_path)
    env: dict[str, str] = {}
    ended: list[Exit] = []
    try:
        started = executor.prepare(5, ["true"], str(tmp_path), env, {}, _ignore, ended.append)
        started.send()
        await peer.lines(2)  # its environment and its start
        assert peer.conn is not None
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(
            peer.conn,
            b'{"ev":"started","key":"5","pid":1,"ticks":1}\n{"ev":"exited","key":"5","code":0}\n',
        )
        await eventually(lambda: ended)
        executor.done(5)
        await peer.lines(3)  # the ack came, and is lost with this connection
        peer.conn.close()
        peer.conn, peer.received = None, b""
        exited = {"state": "exited", "pid": 1, "ticks": 1, "code": 0, "at": 1.0}
        conn, _ = await loop.sock_accept(peer.listener)
        peer.conn = conn
        while b"\n" not in peer.received:
            peer.received += await loop.sock_recv(conn, 65536)
        peer.received = peer.received.split(b"\n", 1)[1]  # (the query)
        table = {"ev": "table", "tasks": {"5": exited}}
        await loop.sock_sendall(conn, json.dumps(table).encode() + b"\n")
        lines = await peer.lines(3)
        assert [(line.get("op"), line.get("keys")) for line in lines] == [
            ("env", None),  # (a new spawner is told every environment again)
            ("max_log", None),  # (and the cap, for the logs it took over)
            ("ack", ["5"]),
        ]
    finally:
        await executor.close()
        peer.close()


async def test_a_launcher_that_does_not_take_a_new_log_cap_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launcher started by an earlier version (it outlives upgrades) ignores max_log: a
    # lowered [logs] max_bytes then silently did nothing for the jobs running.
    monkeypatch.setattr(launch_client, "MAX_LOG_ANSWER_S", 0.2)
    caplog.set_level(logging.WARNING, "gpulayer_tui.engine.launch_client")
    executor, peer = await _executor_with_peer(tmp_path)
    try:
        executor.set_max_log(65536)
        assert (await peer.lines(1))[0] == {"op": "max_log", "bytes": 65536}
        await eventually(lambda: "does not apply the new [logs] max_bytes" in caplog.text)
        # One that answers is not warned about.
        caplog.clear()
        executor.set_max_log(131072)
        assert peer.conn is not None
        peer.conn.sendall(b'{"ev": "max_log", "bytes": 131072, "jobs": 0}\n')
        await eventually(lambda: executor._max_log_heard)
        executor._max_log_unheard(131072)  # (its deadline, come now: nothing is said)
        assert "does not apply" not in caplog.text
    finally:
        await executor.close()
        peer.close()
