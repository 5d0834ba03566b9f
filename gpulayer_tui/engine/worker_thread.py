"""One thread that runs blocking calls for the event loop, one at a time, in order.

The store's writer uses it for every SQLite commit. ``loop.run_in_executor`` with a
one-thread ``ThreadPoolExecutor`` does the same with more machinery on the loop's side
(a work item, a lock, an idle-thread check, a second future chained to the first): a
profile of a 2,000-job drain put ~40 us of the loop's time on each ``submit``, about a
tenth of the engine's CPU per job. Here a call is one queue ``put``, and its answer one
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class WorkerThread:
    """Runs ``fn(*args)`` calls on one named thread, in the order they were made.

    Args:
        name: The thread's name (shown by py-spy and in thread dumps).
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue ``fn(*args)``; the future (of the running loop) gets its result or error.

        A call whose future is cancelled still runs (as with an executor's running work):
        callers that need it undone must not cancel.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((fn, args, future, loop))
        return future

    def stop(self) -> None:
        """Run what is queued, then end the thread (waits for it)."""
        self._calls.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            fn, args, future, loop = item
            try:
                result = fn(*args)
            except BaseException as err:  # handed to the caller, whatever it is
                _answer(loop, future, None, err)
            else:
                _answer(loop, future, result, None)
            # (held until the next call came, a commit's rows stayed alive after it: a
            # flood's last batch of 20,000 rows for as long as the engine then idled)
            del item, fn, args, future, loop
            result = None


def _answer(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:
        pass  # the loop is closed: nobody waits any more


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return  # cancelled meanwhile
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
