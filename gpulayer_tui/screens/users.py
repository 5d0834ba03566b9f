"""Users: who uses the box, in fair-share order, with what each holds and may hold
(``GET /v1/users``, the TUI's ``gpulayer-tui users``)."""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Static

from .. import keymap
from ..backend import BackendError
from ..view import view_of
from ..widgets.engine_status import EngineStatus
from ..widgets.key_footer import KeyFooter
from ..widgets.user_table import UserTable
from ..wire import UserJSON
from .actions import my_uid
from .resume import KeepsStylesOnResume
from .stale import mark_while_no_engine

USERS_REFRESH_S = 5.0
"""How often the users are asked for again while the screen is shown (the GPU-hours of
running jobs grow between job events)."""

HINT = (
    "Who uses the box, in fair-share order: of jobs of equal priority, the first user's "
    "start first. GPU-H: GPU-hours used recently; SHARE: the user's weight; X/MAX: held or "
    "waiting now, and the limit ([users.NAME]; -: none)."
)
EMPTY = "No user has used the GPUs recently, and no job runs or waits."
ASKING = "Asking the engine who uses the box…"
NOT_ANSWERED = (
    f"The engine did not say who uses the box (see the notice); asked again every "
    f"{USERS_REFRESH_S:g} s."
)


class UsersScreen(KeepsStylesOnResume, Screen[None]):
    """Every user with recent GPU use, running or waiting jobs, as the engine orders them;
    asked for when shown, when a job starts, ends or is submitted, and every few seconds
    while shown (never while hidden)."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("users"))
    KEYMAP_SCOPE: ClassVar[str] = "users"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    DEFAULT_CSS = """
    UsersScreen #users-hint { height: auto; padding: 0 1; color: $text-muted; }
    UsersScreen #users-empty { padding: 1 2; color: $text-muted; }
    UsersScreen.-no-engine UserTable { text-opacity: 50%; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._timer: Timer | None = None
        self._fetching = False  # (a fetch is on its way)
        self._again = False  # (something changed meanwhile: ask again once it is back)
        self._problem: str | None = None  # (the engine's refusal last said, said once)
        self._loaded = False
        self._seen_version = 0
        self._statuses: dict[int, str] = {}  # job id -> status, as last seen

    def compose(self) -> ComposeResult:
        yield EngineStatus("users")
        yield Static(HINT, id="users-hint", markup=False)
        # (above the table: below it, the table's height put it on the last line before
        # the footer, far from anything: tester h167)
        yield Static(ASKING, id="users-empty", markup=False)
        yield UserTable(id="users")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.watch(self.app, "jobs_version", self._jobs_changed, init=False)
        mark_while_no_engine(self)
        self.query_one(UserTable).focus()

    def on_screen_resume(self) -> None:
        self._note_statuses()
        self.fetch_users()
        if self._timer is None:
            self._timer = self.set_interval(USERS_REFRESH_S, self.fetch_users)
        else:
            self._timer.resume()

    def on_screen_suspend(self) -> None:
        if self._timer is not None:
            self._timer.pause()  # (no polling while hidden)

    # -- what changes the figures ---------------------------------------------------------

    def _note_statuses(self) -> None:
        store = view_of(self).job_store
        self._statuses = {job_id: job["status"] for job_id, job in store.jobs.items()}
        self._seen_version = store.version

    def _jobs_changed(self, _version: int = 0) -> None:
        """A job started, ended, or was submitted (its status changed): what its user holds
        or has waiting changed. Other changes (a running job's usage figures) are left to
        the next periodic ask."""
        if not self.is_current:
            return  # (shown again, it asks at once)
        store = view_of(self).job_store
        moved = False
        for job_id in store.changed_since(self._seen_version):
            job = store.jobs.get(job_id)
            status = job["status"] if job is not None else None
            if self._statuses.get(job_id) != status:
                moved = True
                if status is None:
                    self._statuses.pop(job_id, None)
                else:
                    self._statuses[job_id] = status
        self._seen_version = store.version
        if moved:
            self.fetch_users()

    # -- asking ---------------------------------------------------------------------------

    def fetch_users(self) -> None:
        """Ask the engine for the users (a worker); one already on its way is followed by
        one more, not cancelled: a slow engine still gets each answer through."""
        if self._fetching:
            self._again = True
            return
        self._fetching = True
        self._fetch()

    @work(group="users", exit_on_error=False)
    async def _fetch(self) -> None:
        try:
            while True:
                self._again = False
                await self._ask()
                if not self._again or not self.is_current:
                    return
        finally:
            self._fetching = False

    async def _ask(self) -> None:
        try:
            answer = await view_of(self).backend.users()
        except BackendError as err:
            said = str(err)
            if said != self._problem:  # (not again every few seconds while it lasts)
                self._problem = said
                self.app.notify(said, title="users", severity="error")
            if not self._loaded:
                self.query_one("#users-empty", Static).update(NOT_ANSWERED)
            return
        self._problem = None
        self._loaded = True
        self._show(answer["users"])

    def _show(self, users: list[UserJSON]) -> None:
        self.query_one(UserTable).show(users, my_uid())
        empty = self.query_one("#users-empty", Static)
        empty.update(EMPTY)
        empty.display = not users
