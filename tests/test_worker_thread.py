"""The store's writer thread: calls run in order, answers and errors reach the caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpulayer_tui.engine.worker_thread import WorkerThread


async def test_calls_run_in_order_on_one_named_thread_and_errors_reach_the_caller() -> None:
    worker = WorkerThread("test-writer")
    seen: list[tuple[int, str]] = []

    def note(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        return n * 10

    try:
        answers = await asyncio.gather(*(worker.call(note, n) for n in range(50)))
        assert answers == [n * 10 for n in range(50)]
        assert seen == [(n, "test-writer") for n in range(50)]
        with pytest.raises(ZeroDivisionError):
            await worker.call(lambda: 1 / 0)
        # A call whose caller gave up still runs, and the thread goes on.
        gate = threading.Event()
        abandoned = worker.call(gate.wait, 5)
        abandoned.cancel()
        gate.set()
        assert await worker.call(note, 99) == 990
        assert seen[-1] == (99, "test-writer")
    finally:
        worker.stop()


async def test_stop_runs_what_is_queued_first() -> None:
    worker = WorkerThread("test-writer")
    done: list[int] = []
    for n in range(5):
        worker.call(done.append, n)
    worker.stop()
    assert done == [0, 1, 2, 3, 4]
