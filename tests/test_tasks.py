"""Stopping background tasks: the caller's own cancellation is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from gpulayer_tui.engine.tasks import cancel_and_wait


async def test_a_slow_task_to_stop_lets_a_deadline_around_the_stop_fire() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # cleanup that takes its time
            raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(cancel_and_wait(task), timeout=0.05)
    release.set()
    await asyncio.wait([task])
    assert task.cancelled()


async def test_a_task_that_failed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken(), name="broken-task")
    await asyncio.wait([task])
    await cancel_and_wait(task)
    assert "background task broken-task failed" in caplog.text


async def test_a_task_that_swallows_a_cancellation_is_cancelled_again() -> None:
    swallowed = asyncio.Event()

    async def swallows_once() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # as wait_for on 3.11 can, when its inner future just completed
        await asyncio.Event().wait()

    task = asyncio.create_task(swallows_once())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), timeout=10)
    assert swallowed.is_set() and task.cancelled()
