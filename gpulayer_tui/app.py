"""The Textual application: it wires screens, keys, themes and the engine's event stream.

Logic lives in the engine (scheduling, state) and in the widgets (presentation); the App
holds the shared view state (:class:`~gpulayer_tui.job_store.JobStore`, the latest GPU
sample and its history) and keeps it current from one long-lived events worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, cast

from textual import events, on, work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.command import Provider
from textual.markup import escape as markup_escape
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import ModalScreen, Screen
from textual.theme import Theme
from textual.widget import Widget
from textual.widgets import DataTable
from textual.worker import Worker, WorkerState

from . import keymap
from .backend import BackendError, EngineBackend
from .fields import printable
from .formatting import drain_said, still_on_domain
from .job_feed import PAGE, JobFeed, JobView
from .job_store import JobStore, start_of_today
from .key_hold import KeyHold, esc_then_key
from .palette import KeymapCommands, SafeCommandPalette
from .screens.dashboard import DashboardScreen
from .screens.dialogs import ConfirmScreen, QuitChoice, QuitScreen
from .screens.drain import DrainScreen
from .screens.help import HelpScreen
from .screens.job_detail import JobDetailScreen
from .screens.jobs import JobsScreen
from .screens.strays import StraysScreen
from .screens.submit import SubmitScreen
from .screens.users import UsersScreen
from .theme_files import themes, unknown_theme_words
from .view import HistoryPoint
from .wire import (
    ACTIVE_STATUSES,
    MAX_PAGE,
    TERMINAL_STATUSES,
    EventJSON,
    GpusJSON,
    HealthJSON,
    JobJSON,
    JobRowJSON,
)

HISTORY_POINTS = 120


FIRST_PICTURE_WAIT_S = 3.0
"""How long the first frame waits for the event stream's hello before loading anyway."""
USE_REFRESH_S = 10.0
"""How often the running GPU jobs' usage figures are read again (one page request)."""


class StartNotice(NamedTuple):
    """What the app says once it is up, about how it was started."""

    title: str
    text: str
    severity: SeverityLevel = "warning"


OWN_THEMES = frozenset(item.name for item in themes.THEMES)
"""Our themes, whose coloured text is chosen (see :meth:`GpulayerApp.get_theme`)."""

_READABLE_THEMES: dict[str, tuple[Theme, Theme]] = {}
"""Textual's themes as :func:`themes.readable` made them, by name, with the theme made
from (each made once per process)."""


class GpulayerApp(App[str]):
    """gpulayer-tui. Build it with :func:`build_app`.

    The exit result is ``"handover"`` when the user chose to keep an embedded engine's
    jobs running in a background engine, else ``""``.
    """

    CSS_PATH = str(themes.CSS_PATH)
    TITLE = "gpulayer-tui"
    MODES = {
        "dashboard": DashboardScreen,
        "jobs": JobsScreen,
        "strays": StraysScreen,
        "users": UsersScreen,
    }
    DEFAULT_MODE = "dashboard"
    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings(keymap.APP))
    COMMANDS: ClassVar[set[type[Provider] | Callable[[], type[Provider]]]] = {
        *App.COMMANDS,
        KeymapCommands,
    }

    # View state, watched by the widgets that show it; ``repaint=False`` because a
    # reactive of the App otherwise repaints the whole screen on every change (a full
    # frame per GPU sample and per health poll, half the idle TUI's CPU).
    gpu_state: reactive[GpusJSON | None] = reactive(None, always_update=True, repaint=False)
    """The latest ``/gpus`` view (domains, VRAM split, processes)."""
    jobs_version: reactive[int] = reactive(0, repaint=False)
    """Bumped (at most every ``refresh_interval``) when the job store changed."""
    job_pages: reactive[int] = reactive(0, repaint=False)
    """Bumped when a page of history arrived (the jobs bar says whether more remain)."""
    health: reactive[HealthJSON | None] = reactive(None, repaint=False)
    """The engine's ``/health``, refreshed every few seconds."""
    connection_problem: reactive[str] = reactive("", repaint=False)
    """Non-empty while the engine cannot be reached."""

    def __init__(
        self,
        backend: EngineBackend,
        *,
        clock: Callable[[], float] = time.time,
        theme: str | None = None,
        config_file: Path | None = None,
        refresh_interval: float = 0.25,
        health_interval: float = 2.0,
        cursor_blink: bool = True,
        notices: Iterable[StartNotice] = (),
    ) -> None:
        super().__init__()
        # Said once mounted: a config the engine rejected, flags the engine it attached
        # to does not take (what was printed before the app drew was hidden by it).
        self._notices = tuple(notices)
        self.cursor_blink = cursor_blink  # read by text inputs; snapshots turn it off
        self.log_wrap = False  # (w in a job's log: the next job's opens the same way)
        self.backend = backend
        self.clock = clock
        self.job_store = JobStore()
        self.active_partial = False  # (not every active job is loaded: see _load_state)
        self.job_feed = JobFeed()
        self._config_rejected = False  # (the last config event said a rejection)
        self._job_pages: Worker[None] | None = None
        self.gpu_history: dict[int, deque[HistoryPoint]] = {}
        self.config_file = config_file
        self.refresh_interval = refresh_interval
        self.health_interval = health_interval
        self._initial_theme = theme or themes.DEFAULT_THEME
        self._stopping = False
        self._quiet = asyncio.Event()  # set when no job is active (used when quitting)
        self._quitting = False  # "stop them and quit" chosen: under way
        self._quiet.set()
        self._first_picture = asyncio.Event()  # set once the first state is loaded
        for item in themes.THEMES:
            self.register_theme(item)
        self.key_hold = KeyHold(self, self.on_event)

    async def on_event(self, event: events.Event) -> None:
        """Keys typed right after one that opens a form wait for that form (see
        :mod:`~gpulayer_tui.key_hold`)."""
        if isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded:
            screen = self.key_hold.current_screen()
            if isinstance(event, events.Key) and screen is not None:
                keys = esc_then_key(event, screen)
                if keys is not None:
                    for key in keys:
                        await self.on_event(key)
                    return
            if self.key_hold.take(event):
                return
            await super().on_event(event)
            if isinstance(event, events.Key) and not event.is_forwarded:
                # (A priority binding ran it: it goes no further, to the widget and back.)
                self.key_hold.key_reached_app(event)
            return
        await super().on_event(event)

    def on_key(self, event: events.Key) -> None:
        """A key reached the app (its bindings run next, in App's own handler)."""
        screen = self.key_hold.current_screen()
        if screen is None:  # (the app is ending: its screens are gone)
            event.prevent_default()
            return
        if not screen.is_mounted:
            # It bubbled up from the screen before this one, which it opened (enter on a
            # row): the bindings now are those of a screen with no widgets yet.
            event.prevent_default()
            self.key_hold.hold_for_screen(event)
            return
        if self.key_hold.typed_on_another_screen(event):
            event.prevent_default()  # (it was for the screen it was typed on, now gone)
            return
        self.key_hold.key_reached_app(event)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every notification is plain text, whoever asks for markup: messages quote job
        names, commands, domain names and the engine's words, and a ``[/bold]`` in one
        must show as written, not end the app with a ``MarkupError``; and a terminal escape
        in one is written as an escape, not sent to the terminal."""
        message, title = printable(message, keep="\n"), printable(title)
        # One alike still shown goes, and this one comes in at the bottom: shown once (a
        # lost engine told at each view change stacked five alike), and the newest toast
        # is the latest word (t t t kept "theme: dark" below "theme: light", dropping the
        # third, which named the theme in use: tester h120).
        for shown in [n for n in self._notifications if n.message == message and n.title == title]:
            self._unnotify(shown, refresh=False)
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def get_theme(self, theme_name: str) -> Theme | None:
        """A theme by name; Textual's own with their coloured text made to read on their
        grounds (:func:`themes.readable`), worked out once, when first asked for (for
        every theme at start it took 50 ms)."""
        theme = super().get_theme(theme_name)
        if theme is None or theme_name in OWN_THEMES or theme_name.startswith("ansi"):
            return theme  # (ours choose their own; ANSI ones are the terminal's palette)
        made = _READABLE_THEMES.get(theme_name)
        if made is None or made[0] is not theme:
            made = _READABLE_THEMES[theme_name] = (theme, themes.readable(theme))
        return made[1]

    def get_theme_variable_defaults(self) -> dict[str, str]:
        """Our extra variables for every theme, Textual's built-in ones included."""
        defaults = super().get_theme_variable_defaults()
        defaults.update(themes.DARK.variables)
        return defaults

    # -- start-up ---------------------------------------------------------------------------

    async def on_mount(self) -> None:
        """Load the first picture, then follow the engine's events."""
        if self._initial_theme in self.available_themes:
            self.theme = self._initial_theme
        else:
            self.theme = themes.DEFAULT_THEME
            said = unknown_theme_words(self._initial_theme)
            self.notify(said, severity="warning", timeout=15)
        for notice in self._notices:
            self.notify(notice.text, title=notice.title, severity=notice.severity, timeout=30)
        # Subscribe first, then load: what changes between the two arrives as an event.
        # (Loading first lost a job submitted in between until the next reconnect.)
        self._follow_events()
        try:
            await asyncio.wait_for(self._first_picture.wait(), timeout=FIRST_PICTURE_WAIT_S)
        except TimeoutError:
            # The stream has not even said hello (an engine stalled): show what the API
            # gives rather than a blank screen; the hello, when it comes, loads again.
            await self._load_state()
        self.set_interval(self.refresh_interval, self._publish_job_changes)
        self.set_interval(self.health_interval, self._poll_health)
        self.set_interval(USE_REFRESH_S, self.refresh_running_use)

    async def _load_state(self) -> None:
        try:
            self.health = await self.backend.health()
            gpus = await self.backend.gpus()
            # The active jobs (the dashboard's, whatever the view) and the view's first page.
            active = await self.backend.jobs_page(
                status=",".join(sorted(ACTIVE_STATUSES)), limit=MAX_PAGE
            )
            # More than a page of them: the dashboard counts the engine's figures.
            self.active_partial = bool(active.get("more"))
            # The newest failed ones too: the dashboard's "failed today" counted only the
            # rows loaded, and with more than a page of jobs waiting none of those were.
            failed = await self._failed_today()
            self.job_feed.restart()
            generation = self.job_feed.generation
            page = await self.backend.jobs_page(**self.job_feed.next_query())
            self.job_store.load([*active["jobs"], *failed, *page["jobs"]])
            self.job_feed.took(generation, page["jobs"], bool(page.get("more")))
        except BackendError as err:
            self.connection_problem = str(err)
            self.notify(str(err), title="engine", severity="error")
            return
        self.connection_problem = ""
        self.gpu_history = {
            d["gpu_index"]: deque(map(_point, d.get("history", [])), maxlen=HISTORY_POINTS)
            for d in [*gpus["domains"], *gpus.get("gpus_without_domain", [])]
            if d["gpu_index"] is not None
        }
        self.gpu_state = gpus
        self.jobs_version = self.job_store.version

    async def _failed_today(self) -> list[JobRowJSON]:
        """The failed jobs newest first, page after page while they ended today (at most
        ``MAX_PAGE``): what the dashboard's "failed today" counts."""
        midnight = start_of_today(self.clock())
        rows: list[JobRowJSON] = []
        query: dict[str, Any] = {"status": "failed", "limit": PAGE}
        while len(rows) < MAX_PAGE:
            page = await self.backend.jobs_page(**query)
            rows.extend(page["jobs"])
            last = page["jobs"][-1] if page["jobs"] else None
            if last is None or not page.get("more") or (last.get("ended_at") or 0) < midnight:
                break
            query["before"] = last["id"]
        return rows

    @work(exclusive=True, group="engine-events", exit_on_error=False)
    async def _follow_events(self) -> None:
        """The one long-lived consumer of the engine's events."""
        while not self._stopping:
            refused: str | None = None
            try:
                async for event in self.backend.events():
                    if event.get("kind") == "hello":
                        # Subscribed: from here on nothing is missed, so this is the moment
                        # to load the picture the events then keep current.
                        await self._load_state()
                        self._first_picture.set()
                    else:
                        self._apply_event(event)
            except asyncio.CancelledError:
                raise
            except BackendError as err:
                refused = f"event stream refused: {err}; asking again"
            except Exception as err:
                # A cut stream (a killed engine), a torn line, an engine answering garbage:
                # the only way on is to reconnect and load everything again.
                self.log.warning(f"event stream failed: {err!r}")
            if not self._first_picture.is_set():
                # No stream at all (the engine is not there): show what can be had, and
                # say what is wrong, rather than keep the first frame waiting.
                try:
                    await self._load_state()
                finally:
                    self._first_picture.set()
            if self._stopping:
                return
            # The stream ended: the engine went away, or we fell behind and were cut off.
            # Asked at once how the engine is, so a header that says "no engine answers
            # ... start one" goes on saying it while none does (the line below replaced
            # it at each try, every second: tester h54).
            await self._poll_health()
            if refused is not None:
                self.connection_problem = refused
            elif not self.connection_problem:
                self.connection_problem = "event stream lost; reconnecting"
            await asyncio.sleep(1.0)

    def _apply_event(self, event: EventJSON) -> None:
        kind = event.get("kind")
        if kind == "gpu.sample":
            data = event["data"]
            for dom in [*data["domains"], *data.get("gpus_without_domain", [])]:
                gpu = dom.get("gpu")
                if dom["gpu_index"] is None or gpu is None:
                    continue
                points = self.gpu_history.setdefault(dom["gpu_index"], deque(maxlen=HISTORY_POINTS))
                if gpu.get("lost") or dom.get("failures"):  # (no-domain GPUs say it too)
                    # (a gap: the figures are the last good read's, and the graph went on
                    # plotting them as live)
                    points.append((event["at"], None, None))
                else:
                    points.append((event["at"], gpu.get("utilization"), gpu.get("memory_used")))
            self.gpu_state = cast(GpusJSON, data)
        elif kind == "domain.state":
            self._domain_notice(event["data"])
        elif kind == "engine.config":
            self._config_notice(event["data"])
        elif kind == "jobs.removed":
            self.job_store.remove([int(i) for i in event["data"].get("ids", ())])
        elif "job" in event:
            self.job_store.apply(event["job"])
            if kind == "job.transition":
                self._end_notice(event)
            if not self._quiet.is_set() and self.job_store.active_count(launched_only=True) == 0:
                self._quiet.set()

    def _end_notice(self, event: EventJSON) -> None:
        """A job submitted with ``notify`` ended: ring the terminal's bell and say how."""
        job, status = event["job"], event["data"].get("status")
        if status not in TERMINAL_STATUSES or not job["spec"].get("notify"):
            return
        code = job.get("exit_code")
        self.bell()
        self.notify(
            f"{job['name']}: {status}" + (f" (exit code {code})" if code is not None else ""),
            title=f"job {job['id']} ended",
            severity="information" if status == "completed" else "warning",
        )

    def _domain_notice(self, data: dict[str, Any]) -> None:
        change, name, reason = data.get("change"), data.get("domain"), data.get("reason") or ""
        self._domain_changed(data)
        if change == "quarantined":
            self.notify(
                f"{reason}\nNo new work goes there; release it (ctrl+p) once the GPU answers.",
                title=f"domain {name} quarantined",
                severity="error",
                timeout=15,
            )
        elif change == "degraded":
            self.notify(reason, title=f"domain {name} degraded", severity="warning")
        elif change in ("released", "draining", "healthy"):
            said = str(change)
            if change == "draining" and data.get("state") == "draining" and reason:
                said = f"draining (reason: {reason})"
            if change == "released" and data.get("state") == "draining":
                # (a drain made before the quarantine outlives it: "released" read as back
                # in service)
                # (whether the drain came before or after the quarantine: tester h169)
                said = "quarantine lifted; still draining, as it was drained under it"
                if data.get("drain_reason"):  # (said, as the CLI says it: tester h170)
                    said += f" (reason: {data['drain_reason']})"
            elif change == "draining" and data.get("state") == "quarantined":
                # (it said "draining" of a domain still quarantined: tester h124)
                said = "drained under its quarantine: it drains once the quarantine is lifted"
                if data.get("drain_reason"):
                    said += f" (reason: {data['drain_reason']})"
            elif change == "healthy" and data.get("state") == "quarantined":
                # (it said "healthy" alone of a GPU still quarantined: tester h142)
                said = (
                    "the GPU answers again; still quarantined, no new work goes there: "
                    "release it (ctrl+p) when you trust it"
                )
            elif change == "healthy" and data.get("state") == "draining":
                said = "the GPU answers again; still draining"
            # What still runs there, and when it leaves, as `domain drain` says it (the
            # toast said "draining" alone: tester h96).
            still = still_on_domain(self.job_store.jobs.values(), str(name))
            if change == "draining" and still:
                said += "\n" + "\n".join(still)
            self.notify(f"domain {name}: {said}", timeout=8 if still else 4)

    def _domain_changed(self, data: dict[str, Any]) -> None:
        """Take a domain's new state into the GPU view at once, in the stream's order.

        (A ``gpu.sample`` published before a release may arrive after the release's own
        answer; the change event that follows it sets the state right again.)
        """
        state = self.gpu_state
        if state is None or "state" not in data:
            return
        now = {"state": data["state"], "health": data.get("health")}
        now["state_reason"] = "" if data["state"] == "in_service" else data.get("reason") or ""
        if data.get("health") == "degraded" and data.get("reason"):
            now["last_error"] = data["reason"]  # (what its panel says it degraded of)
        domains = [
            {**d, **now} if d.get("name") == data.get("domain") else d for d in state["domains"]
        ]
        self.gpu_state = cast(GpusJSON, {**state, "domains": domains})

    def _config_notice(self, data: dict[str, Any]) -> None:
        if data.get("outcome") == "rejected":
            self._config_rejected = True
            self.notify(str(data.get("error")), title="config edit rejected", severity="error")
            return
        rejected, self._config_rejected = self._config_rejected, False
        if data.get("outcome") == "applied" and rejected and not data.get("changes"):
            # (a chmod that fixed what a rejection named changed nothing in force, and
            # the rejection was the last word on screen: tester h197)
            self.notify(
                "the config file is accepted again (what is in force is unchanged)", title="config"
            )
        if data.get("outcome") == "kept":  # (the file is gone: what runs stays)
            self.notify(str(data.get("message")), title="config file", severity="warning")
            return
        changes = [str(c) for c in data.get("changes") or []]
        if changes:
            # (a rejected edit was said, an applied one not at all: only a bar moved; h193)
            more = f"; and {len(changes) - 6} more" if len(changes) > 6 else ""
            self.notify("; ".join(changes[:6]) + more, title="config applied")
        # ("ui": [ui] said apart from the engine's changes; an older engine named it among
        # them: "ui.theme: 'a' -> 'b'")
        ui_changed = bool(data.get("ui")) or any(
            c == "ui" or str(c).startswith("ui.") for c in data.get("changes", [])
        )
        if ui_changed and self.config_file is not None:
            # The theme was edited in the config file: apply it live.
            from .engine.config import ConfigError, load_config

            try:
                theme = load_config(self.config_file).ui.theme
            except ConfigError:
                return
            if theme and theme in self.available_themes and theme != self.theme:
                self.theme = theme

    def show_jobs(self, view: JobView) -> None:
        """Make ``view`` the jobs table's view; load its first page if it is a new one."""
        if self.job_feed.show(view):
            if self._job_pages is not None:
                self._job_pages.cancel()  # its page is for the old view
                # (a cancelled worker is not finished at once: fetch_more_jobs took it for
                # a page on its way, and the new view's first page was never asked for;
                # after an engine restart the table kept the active jobs alone)
                self._job_pages = None
            self.fetch_more_jobs()

    def fetch_more_jobs(self) -> None:
        """Load the next page of the current view (the table nears its end); a page
        already on its way is not asked for twice."""
        if not self.job_feed.more:
            return
        if self._job_pages is not None and not self._job_pages.is_finished:
            return
        # (the function, not a coroutine made now: a worker cancelled before it starts
        # left that coroutine never awaited, a RuntimeWarning printed at exit)
        self._job_pages = self.run_worker(
            self._fetch_job_page, group="job-pages", exit_on_error=False
        )

    async def _fetch_job_page(self) -> None:
        feed = self.job_feed
        generation = feed.generation
        while True:
            try:
                page = await self.backend.jobs_page(**feed.next_query())
            except BackendError as err:
                if generation == feed.generation:
                    feed.unanswered = True
                    self.mutate_reactive(type(self).job_pages)  # (the count says it)
                self.notify(str(err), title="jobs", severity="error")
                return
            if not feed.took(generation, page["jobs"], bool(page.get("more"))):
                return
            fresh = self.job_store.extend(page["jobs"])
            self._publish_job_changes()
            self.job_pages += 1
            if fresh or not feed.more:
                return
            # Every row of it was shown already (the active jobs, loaded first, can fill
            # many pages): the next page now, or G never reached older finished jobs.

    def _publish_job_changes(self) -> None:
        if self.job_store.version != self.jobs_version:
            self.jobs_version = self.job_store.version

    async def refresh_running_use(self) -> None:
        """Bring the running GPU jobs' usage figures (the table's PEAK, UTIL and ENERGY)
        up to date: events carry them only at a change, so a running job's stayed as the
        first page brought them (or blank, for one started since)."""
        store = self.job_store
        if not any(j["status"] == "running" and j["gpus"] for j in store.jobs.values()):
            return
        try:
            page = await self.backend.jobs_page(status="running", limit=MAX_PAGE)
        except BackendError:
            return  # (the health poll says what is wrong)
        for row in page["jobs"]:
            old = store.jobs.get(row["id"])
            use = row.get("use")
            # (only the figures: the page may be older than an event taken meanwhile)
            if old is not None and use is not None and old.get("use") != use:
                store.apply({**old, "use": use})

    async def _poll_health(self) -> None:
        try:
            self.health = await self.backend.health()
            self.connection_problem = ""
        except BackendError as err:
            self.connection_problem = str(err)

    # -- actions ----------------------------------------------------------------------------

    def action_show_area(self, mode: str) -> None:
        """Show the dashboard, the jobs table, the strays or the users themselves, as the
        footer's "2 Jobs" promises: a job's detail left open in that area is closed (it came
        back on `2`, and a filter typed then searched the job's log: tester h67)."""
        if self.current_mode != mode:
            self.switch_mode(mode)
        while len(self.screen_stack) > 1 and not isinstance(self.screen, ModalScreen):
            self.pop_screen()

    def action_command_palette(self) -> None:
        """Open the command palette (ours: its page keys are safe at any size)."""
        if self.use_command_palette and not self.screen.has_class("--textual-command-palette"):
            self.push_screen(SafeCommandPalette(id="--command-palette"))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``n`` is not "new job" on a screen that keeps it while the user searches a log
        (its "next match", dimmed where there is none, let the key fall through to the
        new-job form, and what was typed next went into its command: tester h130)."""
        if action == "new_job" and getattr(self.screen, "keeps_n", False):
            return False
        return True

    def action_new_job(self) -> None:
        """Open the submit form."""
        self.key_hold.form_coming()  # (the keys typed after n are its command)
        self.push_screen(SubmitScreen())

    def action_help(self) -> None:
        """Show every key, the current screen's first."""
        screen = self.screen
        has_table = bool(screen.query(DataTable))
        self.push_screen(HelpScreen(getattr(screen, "KEYMAP_SCOPE", None), has_table))

    def action_next_theme(self) -> None:
        """Cycle through our themes and remember the choice in the config file."""
        names = [t.name for t in themes.THEMES]
        current = names.index(self.theme) if self.theme in names else -1
        # (t changed the colours and said nothing of which theme it was: tester h70; it
        # said it twice, set_theme's words and these: h83)
        self.set_theme(names[(current + 1) % len(names)], said="(t: the next; ctrl+p lists them)")

    def set_theme(self, name: str, said: str = "") -> None:
        """Apply a theme and save it as ``[ui] theme`` in the config file (one toast says
        which, ``said`` after it)."""
        self.theme = name
        if self.config_file is not None:
            from .ui_config import save_theme

            try:
                save_theme(self.config_file, name)
            except (OSError, ValueError) as err:
                self.notify(f"theme not saved: {err}", severity="warning")
        self.notify(f"theme: {name} {said}".rstrip(), timeout=3 if said else 2)

    def open_job(self, job_id: int) -> None:
        """Show one job's detail (from any area)."""
        self.push_screen(JobDetailScreen(job_id))

    async def action_quit(self) -> None:
        """Textual's own quit (ctrl+q, the command palette's "Quit"): asks as ``q`` does
        (it quit at once, and an embedded engine went with it, jobs queued and other
        windows attached)."""
        await self.action_quit_app()

    async def action_quit_app(self) -> None:
        """Quit; with an embedded engine that has work in flight, ask what to do first."""
        if self._quitting:
            # "Stop" was chosen: a second dialog answered "keep running" quit at once
            # and said the stopped jobs were handed over.
            self.notify("stopping the jobs; the app quits once they have ended", timeout=4)
            return
        if any(isinstance(screen, QuitScreen) for screen in self.screen_stack):
            return  # (ctrl+c is a priority key: inside the dialog it stacked another)
        may_quit = getattr(self.screen, "may_quit", None)
        if may_quit is not None and not may_quit():
            return  # (a form with something typed: the first ctrl+c says what a second does)
        active = self.job_store.active_count()
        # (TUIs in other windows attached to this one's engine lost it with no word)
        elsewhere = getattr(self.backend, "attached_elsewhere", lambda: 0)()
        if self.backend.mode != "embedded" or active == elsewhere == 0:
            self._stopping = True
            self.exit("")
            return
        launched = self.job_store.active_count(launched_only=True)
        quit_screen = QuitScreen(launched, elsewhere, adopted=active - launched)
        self.push_screen(quit_screen, self._on_quit_choice)

    async def _on_quit_choice(self, choice: QuitChoice | None) -> None:
        if choice is None or choice is QuitChoice.STAY:
            return
        if choice is QuitChoice.HANDOVER:
            self._stopping = True
            self.exit("handover")
            return
        self._quitting = True
        self._stop_all_and_quit()

    @work(exclusive=True, group="quit", exit_on_error=False)
    async def _stop_all_and_quit(self) -> None:
        # Adopted processes are left alone (record 004): they were started elsewhere, and
        # quitting the TUI is no reason to kill them. A later engine re-learns them.
        asked: set[int] = set()
        deadline = time.monotonic() + 60
        while True:
            # Again each second: a job submitted meanwhile (another shell, a script) was
            # neither stopped nor handed over, and ran on with no engine.
            active = [
                j["id"]
                for j in self.job_store.jobs.values()
                if j["status"] in ACTIVE_STATUSES
                and j.get("kind") != "adopted"
                and j["id"] not in asked
            ]
            if active:
                # (it said only "stopping 4 job(s)…" for the 10 s a job that ignores SIGTERM
                # takes, and read as stuck: tester h74)
                self.notify(
                    f"stopping {len(active)} job(s): SIGTERM now, SIGKILL after the grace "
                    "period ([engine] grace_period, 10 s) for any still running…",
                    timeout=10,
                )
            for job_id in active:
                asked.add(job_id)
                try:
                    await self.backend.cancel(job_id)
                except BackendError:
                    pass  # it ended meanwhile
            if not self.job_store.active_count(launched_only=True):
                break
            if time.monotonic() >= deadline:
                self.notify("some jobs did not stop in 60 s", severity="warning")
                break
            self._quiet.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet.wait(), timeout=1.0)
        self._stopping = True
        self.exit("")

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        # A worker that fails (a bug, or an answer nobody expected) is shown, never raised:
        # no user action may end the app (and, embedded, the engine with it).
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            self.notify(
                f"{type(error).__name__}: {error}", title="something went wrong", severity="error"
            )

    def job_submitted(self, job: JobJSON) -> None:
        """Take a job the engine accepted into the jobs table now, before the form goes
        and the keys typed after its ctrl+s are let go (``n cmd ctrl+s 2 g enter`` opened
        the job before it: the new one came with the next refresh, tester h139)."""
        # The event stream may already have brought a newer copy (the job may even have
        # finished): the submit answer only fills in a job we have not heard of yet.
        if job["id"] not in self.job_store.jobs:
            self.job_store.apply(job)
            self._publish_job_changes()

    # -- command palette --------------------------------------------------------------------

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Our themes (saved as ``t`` saves them), the domains' drain and release, and
        Textual's own commands but its theme picker (its themes would not be saved) and its
        quit (ours asks first). The keymap's actions come from
        :class:`~gpulayer_tui.palette.KeymapCommands`."""
        for item in themes.THEMES:
            yield SystemCommand(
                f"Theme: {item.name}", "Switch and remember the theme", self._theme_cmd(item.name)
            )
        paused_at = self.health.get("paused_at") if self.health is not None else None
        if paused_at:
            yield SystemCommand(
                "Resume the queue",
                "Let waiting jobs start again (paused since "
                f"{time.strftime('%H:%M', time.localtime(float(paused_at)))})",
                lambda: self.queue_action("resume"),
            )
        elif self.health is not None:
            yield SystemCommand(
                "Pause the queue",
                "Nothing new starts until resumed; running jobs go on (for every user)",
                self._ask_to_pause,
            )
        for dom in self.gpu_state["domains"] if self.gpu_state else []:
            name, state = dom["name"], dom.get("state")
            if state == "in_service":
                yield SystemCommand(
                    f"Drain {name}",
                    "Stop new placements there (maintenance)",
                    self._drain_cmd(name),
                )
            else:
                kept = dom.get("drain_reason")
                yield SystemCommand(
                    f"Release {name}",
                    # (the palette reads help as markup: a reason of "[/]" ended the app)
                    f"Lift the quarantine; it stays drained ({markup_escape(kept)})"
                    if state == "quarantined" and kept
                    else f"Return it to service (now {state})",
                    self._release_cmd(dict(dom)),
                )
                if state == "quarantined" and not kept:
                    yield SystemCommand(
                        f"Drain {name}",
                        "Keep it out of service once the quarantine is lifted (maintenance)",
                        self._drain_cmd(name),
                    )
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":
                # (Textual's saves to ~/Downloads, which a GPU server seldom has: it said
                # only "Failed to save screenshot")
                yield SystemCommand(
                    command.title,
                    f"Save an SVG of the screen (in {markup_escape(str(_screenshot_folder()))})",
                    lambda: self.set_timer(0.1, self._save_screenshot),
                )
            elif command.title == "Keys" and command.help.startswith("Show"):
                # (Textual's key panel docks beside the screen and no key closes it, esc
                # included: ours is the help screen ? opens, which esc closes)
                yield SystemCommand(
                    "Keys", "Every key of this screen, then the rest (esc closes)", self.action_help
                )
            elif command.title not in ("Theme", "Quit"):
                yield command

    def _save_screenshot(self) -> None:
        self.deliver_screenshot(path=str(_screenshot_folder()))

    @on(events.DeliveryComplete)
    def _screenshot_saved(self, event: events.DeliveryComplete) -> None:
        # (Textual's own toast is markup, "[$text-success]", shown as written here: every
        # notification is plain text; and its failure said no reason)
        if event.name == "screenshot":
            event.prevent_default()
            where = f" to {event.path}" if event.path is not None else ""
            self.notify(f"Saved screenshot{where}", title="Screenshot")

    @on(events.DeliveryFailed)
    def _screenshot_failed(self, event: events.DeliveryFailed) -> None:
        if event.name == "screenshot":
            event.prevent_default()
            said = f"Failed to save screenshot: {event.exception}"
            self.notify(said, title="Screenshot", severity="error")

    def _theme_cmd(self, name: str) -> Callable[[], None]:
        return lambda: self.set_theme(name)

    def _drain_cmd(self, name: str) -> Callable[[], None]:
        def run() -> None:
            def answered(reason: str | None) -> None:
                if reason is not None:
                    self.domain_action(name, "drain", reason)

            # (asked first, as cancel and restart are: on a shared box a drain holds back
            # everyone's new work there, and a palette entry is one Enter away; with the
            # reason the others will read)
            self.push_screen(DrainScreen(name), answered)

        return run

    def _release_cmd(self, dom: dict[str, Any]) -> Callable[[], None]:
        """Release a domain once asked: the question says why it is out of service, in
        full (rows and panels cut the reason, and a release was one Enter away: another
        operator's drain for an RMA went unread: tester h142)."""
        name, state = str(dom["name"]), dom.get("state")
        why = str(dom.get("state_reason") or "")
        kept = str(dom.get("drain_reason") or "")
        if state == "quarantined":
            question = f"{name} is quarantined: {why or 'no reason recorded'}."
            question += (
                f"\n\nIt is drained too: {kept}\nLifted, the quarantine leaves it drained "
                "(a second release ends the drain)."
                if kept
                else "\n\nLifted, it takes new work again (every user's)."
            )
        else:
            question = f"{name} is draining: {why or 'no reason recorded'}."
            question += "\n\nReleased, it takes new work again (every user's)."

        def answered(yes: bool | None) -> None:
            if yes:
                self.domain_action(name, "release")

        def run() -> None:
            self.push_screen(ConfirmScreen(f"Release {name}?", question, "Release"), answered)

        return run

    def _ask_to_pause(self) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.queue_action("pause")

        # (as a drain: on a shared box it holds back every user's new work)
        self.push_screen(
            ConfirmScreen(
                "Pause the queue?",
                'No waiting job starts until the queue is resumed ("Resume the queue" in '
                "the palette, or gpulayer-tui resume); running jobs go on. This holds for "
                "every user of the box.",
                "Pause",
            ),
            answered,
        )

    @work(group="queue", exclusive=True, exit_on_error=False)
    async def queue_action(self, action: str) -> None:
        """Pause or resume the queue; the engine's refusal is shown, never raised."""
        try:
            answer = await self.backend.queue_action(action)
        except BackendError as err:
            self.notify(str(err), title=f"{action} the queue", severity="error")
            return
        if action == "pause" and answer.get("was_paused"):
            # (a second client's pause said "queue paused" as if it were the first: h162)
            self.notify("the queue was paused already")
        elif action == "pause":
            self.notify("queue paused: nothing new starts until it is resumed")
        elif answer.get("was_paused") is False:
            self.notify("the queue was not paused")
        else:
            self.notify("queue resumed: waiting jobs start as they fit")
        await self._poll_health()

    @work(group="domains", exit_on_error=False)
    async def domain_action(self, name: str, action: str, reason: str | None = None) -> None:
        """Drain (with ``reason``) or release a domain; the engine's refusal is shown,
        never raised."""
        try:
            dom = await self.backend.domain_action(name, action, reason)
        except BackendError as err:
            self.notify(str(err), title=f"{action} {name}", severity="error")
            return
        # A drain or release is said by its event's toast (in every TUI), reason and what
        # still runs there included: said here too, it made two toasts (tester h169).
        # What only the answer knows is said here: the reason a drain replaced (another
        # client's went without a word: tester h162).
        if dom.get("previous_drain_reason") is not None:
            said = drain_said(dict(dom), action)
            self.notify(f"domain {dom['name']}: {dom['state']}{said}")
        self.gpu_state = await self.backend.gpus()


def _point(raw: list[float | int | None]) -> HistoryPoint:
    """A history point from ``GET /gpus``: ``[at, utilization, memory_used]``."""
    at, util, used = raw
    return (
        float(at or 0),
        None if util is None else int(util),
        None if used is None else int(used),
    )


def build_app(
    backend: EngineBackend,
    *,
    clock: Callable[[], float] = time.time,
    theme: str | None = None,
    config_file: Path | None = None,
    refresh_interval: float = 0.25,
    cursor_blink: bool = True,
    notices: Iterable[StartNotice] = (),
) -> GpulayerApp:
    """Build the app over ``backend`` (embedded, attached, or a test's fake); ``notices``
    are said once it is up."""
    return GpulayerApp(
        backend,
        clock=clock,
        theme=theme,
        config_file=config_file,
        refresh_interval=refresh_interval,
        cursor_blink=cursor_blink,
        notices=notices,
    )


class MessageApp(App[None]):
    """A page of text and nothing else (``q`` closes it): what a browser session shows when
    it cannot show the TUI (no engine serves; see :func:`gpulayer_tui.tui.run_tui`)."""

    TITLE = "gpulayer-tui"
    CSS = "#message { padding: 1 2; }"
    BINDINGS = [Binding("q", "quit", "Close")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text

    def compose(self) -> Iterable[Widget]:
        from textual.widgets import Static

        yield Static(self._text, markup=False, id="message")


def _screenshot_folder() -> Path:
    """Where a screenshot goes: ~/Downloads where it exists, else the folder the TUI was
    started in if it may write there, else home."""
    import os

    downloads = Path.home() / "Downloads"
    if downloads.is_dir():
        return downloads
    with contextlib.suppress(OSError):
        here = Path.cwd()
        if os.access(here, os.W_OK):
            return here
    return Path.home()
