"""Show a file in the user's ``$PAGER`` (``less`` by default) while the app is suspended.

The pager runs as a child process the event loop waits for, so an embedded engine (it
lives in the TUI's loop) keeps scheduling and answering meanwhile; nothing is drawn until
the app resumes (a batch), and Ctrl+C / Ctrl+\\ typed in the pager reach the pager only
(the terminal sends them to the whole foreground group, and the TUI must not end).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shlex
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from textual.app import App

DEFAULT_PAGER = ("less", "-R", "+G")
"""Without ``$PAGER``: less, showing colours as colours, opened at the end (a log's news
is at its end)."""


def pager_command() -> list[str]:
    """The pager's argv (without the file): ``$PAGER`` split as a shell would, or less."""
    text = os.environ.get("PAGER", "").strip()
    try:
        words = shlex.split(text)
    except ValueError:
        words = []
    return words or list(DEFAULT_PAGER)


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """A caught (not ignored) signal: the pager, exec'd, gets the default action back."""


@contextmanager
def _interrupts_for_the_child() -> Iterator[None]:
    """Keep SIGINT / SIGQUIT from ending the TUI while a child owns the terminal."""
    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGQUIT):
            previous[signum] = signal.signal(signum, _ignore)
    except ValueError:  # (not the main thread: signals are not ours to change)
        pass
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


async def page_file(app: App[Any], path: Path) -> int:
    """Run the pager on ``path`` with the app suspended; return its exit status.

    Raises:
        SuspendNotSupported: The app cannot give the terminal away (in a browser).
        OSError: The pager cannot be started (not found, not executable).
    """
    argv = [*pager_command(), str(path)]
    # Found first, before the terminal is given away: a pager that could not start left
    # the app suspended (Textual's suspend() does not resume on an error), the screen
    # blank and the keyboard dead.
    program = shutil.which(argv[0])
    if program is None:
        raise FileNotFoundError(errno.ENOENT, f"{argv[0]} is not found or not executable")
    with _interrupts_for_the_child(), app.batch_update(), app.suspend():
        try:
            process = await asyncio.create_subprocess_exec(program, *argv[1:])
        except OSError as err:
            failed: OSError | None = err
        else:
            failed = None
            status = await process.wait()
    if failed is not None:
        raise failed
    return status
