"""What screens and widgets may read from the app: its view state, typed.

Screens and widgets never import the App (it imports them); they reach its shared state
through :func:`view_of`, which names exactly what there is. The App's own methods
(``notify``, ``push_screen``) are reached through ``self.app`` as usual.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from .wire import GpusJSON, HealthJSON, JobJSON

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from .backend import EngineBackend
    from .job_feed import JobFeed, JobView
    from .job_store import JobStore
    from .key_hold import KeyHold

HistoryPoint = tuple[float, int | None, int | None]
"""One point of a GPU's history: time, utilisation %, memory used (bytes)."""


class AppView(Protocol):
    """The app's view state (see :class:`~gpulayer_tui.app.GpulayerApp`)."""

    backend: EngineBackend
    job_store: JobStore
    active_partial: bool
    """More active jobs than a page: not all are in ``job_store`` (count the engine's)."""
    job_feed: JobFeed
    gpu_state: GpusJSON | None
    gpu_history: dict[int, deque[HistoryPoint]]
    health: HealthJSON | None
    connection_problem: str
    jobs_version: int
    job_pages: int
    cursor_blink: bool
    log_wrap: bool
    """Whether a job's log wraps its long lines (``w``): kept for the next job opened."""
    key_hold: KeyHold
    clock: Callable[[], float]

    def open_job(self, job_id: int) -> None:
        """Show one job's detail."""
        ...

    def job_submitted(self, job: JobJSON) -> None:
        """Take a job the engine accepted into the jobs table now, before the form goes."""
        ...

    def show_jobs(self, view: JobView) -> None:
        """Make ``view`` the jobs table's view (its first page is fetched if new)."""
        ...

    def fetch_more_jobs(self) -> None:
        """Load the next page of the jobs table's view (a worker)."""
        ...


def view_of(node: MessagePump) -> AppView:
    """The view state of the app ``node`` runs in."""
    return cast(AppView, node.app)
