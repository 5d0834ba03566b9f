"""Stopping background tasks without swallowing the caller's own cancellation."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended.

    ``try: await task except CancelledError: pass`` would also swallow a cancellation of
    the *caller* that arrives while it waits (then ``asyncio.wait_for`` around a stop can
    neither time out nor cancel it). ``asyncio.wait`` never raises the task's outcome, so
    only the caller's own cancellation propagates; a task that failed is logged.
    """
    while not task.done():
        # Again if it swallowed the first cancellation (code that catches CancelledError
        # must not make a stop hang for ever).
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_name(), exc_info=task.exception())
