"""Events: durable before visible, in order, over the real socket; the transition table."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import time

import aiohttp
import pytest

from gpulayer_tui.engine.api import ApiServer
from gpulayer_tui.engine.events import EventBus
from gpulayer_tui.engine.models import (
    TRANSITIONS,
    EventKind,
    IllegalTransition,
    JobStatus,
    TerminationReason,
    check_transition,
)

from .conftest import EngineFactory, eventually, make_config


def test_transition_table_forbids_leaving_terminal_states() -> None:
    for status in JobStatus:
        if status.is_terminal:
            assert TRANSITIONS[status] == frozenset()
            with pytest.raises(IllegalTransition, match=f"job 7: illegal transition {status}"):
                check_transition(7, status, JobStatus.RUNNING)
    check_transition(1, JobStatus.PENDING, JobStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(1, JobStatus.QUEUED, JobStatus.COMPLETED)


async def test_events_are_published_only_after_commit(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    sub = engine.subscribe()
    job = await engine.submit({"command": ["true"]})
    seen = []
    async for event in sub:
        if event.job_id != job.id or event.kind not in (EventKind.SUBMITTED, EventKind.TRANSITION):
            continue
        # at publish time the row is already committed: a fresh read shows this state
        stored = await engine.store.get_job(job.id)
        assert stored is not None
        seen.append((event.data["status"], stored.status.value))
        if event.data["status"] == "completed":
            break
    sub.close()
    for published, stored_status in seen:
        order = ["pending", "running", "completed"]
        assert order.index(stored_status) >= order.index(published)
    assert [p for p, _ in seen] == ["pending", "running", "completed"]


async def test_slow_subscriber_is_cut_off_not_unbounded() -> None:
    bus = EventBus()
    slow = bus.subscribe(maxsize=3)
    fast = bus.subscribe(maxsize=100)
    for i in range(10):
        bus.publish(bus.make(EventKind.ENGINE, None, {"i": i}))
    assert slow.overflowed and not fast.overflowed
    received = [e.data["i"] async for e in slow]
    # It gets what fit less the oldest (room for the end marker), then learns it was cut
    # off (iteration ends) ...
    assert received == [1, 2]
    assert fast.queue.qsize() == 10  # ... while others get everything
    assert bus.has_subscribers  # the fast one is still subscribed
    bus.publish(bus.make(EventKind.ENGINE, None, {"i": 10}))
    assert fast.queue.qsize() == 11


async def test_a_reader_gets_every_event_numbered_in_order_without_gaps(
    make_engine: EngineFactory,
) -> None:
    # Numbered when made, events reached readers out of order (one made earlier was
    # committed later) and with gaps (some made were never published).
    engine = await make_engine(cpu_count=2)
    sub = engine.subscribe()
    jobs = []
    for _ in range(3):
        jobs += await engine.submit_many([{"command": ["true"]}] * 150)
    for job in jobs:
        await engine.wait(job.id, timeout=30)
    seqs = [event.seq for event in sub.ready()[0]]
    sub.close()
    assert len(seqs) > 900
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


async def test_a_reader_cut_off_for_falling_behind_is_told_so_in_a_last_line(
    make_engine: EngineFactory,
) -> None:
    # Its stream ended as the engine's end does: a client could not tell "read the state
    # again" from a shutdown.
    engine = await make_engine()
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    try:
        connector = aiohttp.UnixConnector(path=str(engine.paths.socket))
        before = set(engine.bus._subscribers)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get("http://engine/v1/events") as stream:
                hello = json.loads(await stream.content.readline())
                # (which engine it is too: a reader that reconnects can tell a restarted
                # one, whose seq starts again: tester h149)
                from gpulayer_tui import __version__

                assert hello == {
                    "kind": "hello",
                    "seq": engine.bus.last_seq,
                    "pid": os.getpid(),
                    "started_at": engine.started_at,
                    "version": __version__,
                }
                (sub,) = engine.bus._subscribers - before
                for i in range(sub.queue.maxsize + 1):  # (more than it keeps, at once)
                    engine.bus.publish(engine.bus.make(EventKind.ENGINE, None, {"i": i}))
                lines = (await asyncio.wait_for(stream.content.read(), 30)).splitlines()
        last = json.loads(lines[-1])
        assert last["kind"] == "lagged" and "read the state again" in last["data"]["message"]
    finally:
        await server.stop()


async def test_a_reader_that_reads_nothing_is_cut_off_and_frees_its_slot(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its write waited for ever: the stream held its slot and megabytes of events.
    from gpulayer_tui.engine import api

    monkeypatch.setattr(api, "STALLED_WRITE_S", 0.5)
    engine = await make_engine(config=make_config(limits={"streams_per_user": 1}))
    server = ApiServer(engine, engine.paths.socket)
    await server.start()

    reader = socket.socket(socket.AF_UNIX)
    try:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(str(engine.paths.socket))
        reader.sendall(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: engine.bus.has_subscribers)
        connector = aiohttp.UnixConnector(path=str(engine.paths.socket))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get("http://engine/v1/events") as refused:
                assert refused.status == 429  # (its one stream is the reader's)
            big = {"pad": "x" * 60_000}
            for _ in range(200):  # (far more than the socket takes: the write waits)
                engine.bus.publish(engine.bus.make(EventKind.ENGINE, None, big))
                await asyncio.sleep(0)
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                async with session.get("http://engine/v1/events") as again:
                    if again.status == 200:
                        break
                assert asyncio.get_running_loop().time() < deadline, "still held"
                await asyncio.sleep(0.1)
        # Its connection is gone too, though it still reads nothing: a close waited for
        # the buffered bytes to be taken, and held the descriptor (tester h128).
        await eventually(lambda: not server.connections.open, timeout=10)
    finally:
        reader.close()
        await server.stop()


async def test_connections_past_the_per_user_limit_are_told_why_and_closed(
    make_engine: EngineFactory,
) -> None:
    # A user's thousand connections, each a `wait` or an answer it did not read, used up
    # the engine's descriptors: nobody else got an answer (tester h128).
    engine = await make_engine(config=make_config(limits={"connections_per_user": 3}))
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    held: list[socket.socket] = []

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(str(engine.paths.socket))
        return sock

    def answer(sock: socket.socket) -> bytes:
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got

    try:
        for _ in range(3):
            held.append(connect())
        await eventually(lambda: sum(server.connections.open.values()) == 3)
        extra = connect()
        refused = await asyncio.to_thread(answer, extra)  # (answered before it asks)
        extra.close()
        head, _, body = refused.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429 ")
        said = json.loads(body)["error"]
        assert "connections open to the engine, the most [limits] connections_per_user = 3" in (
            said
        )
        assert server.connections.refused == 1
        held.pop().close()
        await eventually(lambda: sum(server.connections.open.values()) == 2)
        sock = connect()  # (a place again)
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.to_thread(answer, sock)).startswith(b"HTTP/1.1 200 ")
        sock.close()
    finally:
        for sock in held:
            sock.close()
        await server.stop()


async def test_a_slow_reader_that_keeps_reading_is_not_cut_off(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst that took it longer than the stall limit to drain, at its pace, was taken
    # for a stall: it was cut off mid-stream, with no "lagged" line, far from 10,000 behind.
    from gpulayer_tui.engine import api

    # (a limit a loaded machine's reader thread keeps within, piece by piece; the burst
    # takes it some 3 s at its pace)
    monkeypatch.setattr(api, "STALLED_WRITE_S", 2.0)
    monkeypatch.setattr(api, "WRITE_PIECE", 4096)
    engine = await make_engine()
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    reader = socket.socket(socket.AF_UNIX)
    try:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(str(engine.paths.socket))
        reader.sendall(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: engine.bus.has_subscribers)
        big = {"pad": "x" * 2000}
        for i in range(600):  # (~1.2 MB at once: some 3 s at its pace)
            engine.bus.publish(engine.bus.make(EventKind.ENGINE, None, {**big, "i": i}))

        def read_steadily() -> bytes:
            got = b""
            reader.settimeout(10)
            while b'"i": 599' not in got:
                chunk = reader.recv(4096)
                if not chunk:
                    break  # (cut off)
                got += chunk
                time.sleep(0.01)
            return got

        got = await asyncio.to_thread(read_steadily)
        assert b'"i": 599' in got and b'"lagged"' not in got
    finally:
        reader.close()
        await server.stop()


async def test_event_stream_over_the_socket(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    try:
        connector = aiohttp.UnixConnector(path=str(engine.paths.socket))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get("http://engine/v1/events") as stream:
                hello = json.loads(await stream.content.readline())
                assert hello["kind"] == "hello" and hello["seq"] == engine.bus.last_seq
                async with session.post(
                    "http://engine/v1/jobs",
                    json={"command": ["true"], "name": "evt", "env": {"SECRET": "x"}},
                ) as resp:
                    assert resp.status == 201
                    job_id = (await resp.json())["job"]["id"]
                statuses = []
                seq = hello["seq"]
                while "completed" not in statuses:
                    line = await asyncio.wait_for(stream.content.readline(), 10)
                    event = json.loads(line)
                    # The first event is the one after hello's seq: a gap anywhere, the
                    # first included, means one was missed (tester h71).
                    assert event["seq"] == seq + 1, (seq, event)
                    seq = event["seq"]
                    if event["job_id"] == job_id and event["kind"] in (
                        "job.submitted",
                        "job.transition",
                    ):
                        statuses.append(event["data"]["status"])
                        # events carry the job's current row, without its environment
                        assert event["job"]["status"] == event["data"]["status"]
                        assert event["job"]["name"] == "evt"
                        assert "env" not in event["job"]["spec"]
                assert statuses == ["pending", "running", "completed"]
            async with session.get(f"http://engine/v1/jobs/{job_id}") as resp:
                body = await resp.json()
                assert body["job"]["name"] == "evt"
                assert body["job"]["owner_uid"] is not None
    finally:
        await server.stop()


async def test_a_job_and_its_timeline_are_read_together(make_engine: EngineFactory) -> None:
    # The timeline must include every transition the job shows, also in the instant before
    # the group commit writes it (reading committed rows only made a service test flaky
    # under load, and let GET /v1/jobs/ID show a status whose transition was missing).
    engine = await make_engine()
    first = await engine.submit({"command": ["sleep", "600"], "gpus": 0})
    waiting = await engine.submit({"command": ["true"], "gpus": 0, "depends_on": [first.id]})
    assert waiting.status is JobStatus.QUEUED
    act = engine.book.get(waiting.id)
    assert act is not None
    engine.book.finish(act, JobStatus.CANCELLED, TerminationReason.CANCELLED, "by this test")
    # Nothing has awaited since: the cancellation is not committed yet...
    with sqlite3.connect(engine.paths.database) as db:
        row = db.execute("SELECT status FROM jobs WHERE id=?", (waiting.id,)).fetchone()
    assert row == ("queued",)
    # ...and the job, read with its timeline, shows it in both.
    job, events = await engine.job_detail(waiting.id)
    assert job["status"] == "cancelled"
    assert [e["status"] for e in events if e["kind"] == "job.transition"] == [
        "queued",
        "cancelled",
    ]
    assert events[-1]["message"] == "by this test"
    # Once committed, the same read gives the same answer (no event twice).
    await engine.store.flush()
    assert (await engine.job_detail(waiting.id))[1] == events


async def test_a_stream_ended_by_the_engines_stop_says_so(make_engine: EngineFactory) -> None:
    # The stream just ended: a reader could not tell a stop from a crash (tester h149).
    engine = await make_engine()
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    stopped = False
    try:
        connector = aiohttp.UnixConnector(path=str(engine.paths.socket))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get("http://engine/v1/events") as stream:
                hello = json.loads(await stream.content.readline())
                assert hello["kind"] == "hello"
                await server.stop()
                stopped = True
                lines = [json.loads(line) async for line in stream.content if line.strip()]
        assert lines[-1] == {
            "kind": "stopping",
            "data": {"message": "the engine is stopping (its running jobs keep running)"},
        }
    finally:
        if not stopped:
            await server.stop()
