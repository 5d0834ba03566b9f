"""Job detail: spec, timeline, GPU usage, live log tail, exit code and termination reason.

The log is searched (``/``, then ``n`` / ``N``), wrapped (``w``), moved in (``g`` / ``G``)
and opened in ``$PAGER`` (``P``); an ended job is restarted (``R``), a waiting one edited
(``e``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, cast

from textual import on, work
from textual.actions import SkipAction
from textual.app import ComposeResult, SuspendNotSupported
from textual.binding import BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Input, Label, Static

from .. import keymap
from ..backend import BackendError, ConnectionLost
from ..fields import printable, wanted_gpus
from ..formatting import (
    SHELL_LINE_MARK,
    dependencies_text,
    duration,
    live_message,
    placement_words,
    replica_health,
    replica_state,
    run_started_at,
    user_text,
)
from ..pager import page_file
from ..view import view_of
from ..widgets.engine_status import EngineStatus
from ..widgets.field_input import FieldInput, after_typed
from ..widgets.field_list import FieldList
from ..widgets.job_columns import command_text, runtime_seconds
from ..widgets.key_footer import KeyFooter
from ..widgets.log_tail import LogTail
from ..widgets.timeline import STATUS_STYLES, Timeline, clock_time
from ..widgets.usage_panel import UsagePanel
from ..widgets.why_panel import WhyPanel
from ..wire import ACTIVE_STATUSES, JobJSON, JobRowJSON, ReplicaJSON, ReplicaState
from .actions import (
    SaysWhyKeysAreDimmed,
    ask_to_cancel,
    ask_to_edit,
    ask_to_restart,
    can_edit,
    can_restart,
    not_yours,
)
from .resume import KeepsStylesOnResume
from .stale import mark_while_no_engine

WAITING_STATUSES = frozenset({"pending", "queued"})
WHY_REFRESH_S = 5.0
"""How often a waiting job's "why it waits" is asked again when nothing tells it to."""
PAGER_NOTICE_BYTES = 16 * 2**20  # a copy for $PAGER this large says it is under way
"""A job in these has a "why it waits" panel."""

LOG_POLL_INTERVAL = 0.5
"""Seconds between reads of a running job's output."""

LOG_TAIL_BYTES = 4 * 2**20
"""An output longer than this is read from this far before its end: the view keeps its
last 10,000 lines, and a 1 GiB log read whole to show them took three minutes of a core
(P pages all of it)."""

USAGE_POLL_INTERVAL = 2.0
"""Seconds between reads of a running GPU job's usage (the engine adds a point a tick)."""

EXPAND_USAGE_FROM = 36
"""Screens at least this tall show the usage panel expanded at first (else one line)."""


def uses_gpus(job: JobRowJSON) -> bool:
    """True for a job that asked for (or was given) GPUs: it has a usage panel."""
    spec = job.get("spec") or {}
    if job.get("gpus"):
        return True
    # A count left out is resolved as the engine does (a VRAM figure or a GPU pin asks
    # for one): a preempted job back in the queue, asked by its VRAM, said "uses no GPU"
    # (tester h124). An adopted process's spec says what it holds.
    if spec.get("kind") == "adopted":
        return bool(spec.get("gpus"))
    return bool(wanted_gpus(spec))


FIELDS = (
    ("name", "name"),
    ("status", "status"),
    ("exit", "exit code"),
    ("message", "message"),
    ("command", "command"),
    ("cwd", "cwd"),
    ("domains", "domains"),
    ("replicas", "replicas"),
    ("vram", "VRAM"),
    ("timeout", "timeout"),
    ("depends", "depends on"),
    ("restart", "restart of"),
    ("priority", "priority"),
    ("user", "user"),
    ("project", "project"),
    ("times", "times"),
    ("runtime", "runtime"),
    ("pid", "pid"),
)
"""The fields block: key (:meth:`FieldList.text` takes it) and label, in display order."""


def _cwd(spec: dict[str, Any]) -> Content:
    """The working directory and, for ``submit --snapshot``, the copy's commit (one line)."""
    cwd = printable(str(spec.get("cwd") or ""))
    snap = spec.get("snapshot")
    if not cwd or not isinstance(snap, dict):
        return _or_dash(cwd)
    commit = str(snap.get("commit") or "")
    said = f"commit {commit[:12]}" + (" dirty" if snap.get("dirty") else "") if commit else "copy"
    return Content.assemble(cwd, (f"  (snapshot: {said})", "$foreground-muted"))


def is_whole(job: JobJSON | JobRowJSON) -> bool:
    """True for a whole job (``GET /v1/jobs/ID``), false for a row (a list's, an event's:
    the detail opens on one): a row has no ``queued_at``, a whole job always has it."""
    return "queued_at" in job


def _or_dash(text: str) -> Content:
    return Content(text) if text else Content.styled("-", "$foreground-muted")


def _seconds(value: Any) -> str:
    return f"{value:g} s ({duration(float(value))})" if value else ""


def _placement(job: JobJSON, spec: dict[str, Any]) -> str:
    parts = []
    cluster = job.get("cluster") or spec.get("cluster")
    if cluster:  # (a Slurm cluster's job: issue 16)
        cluster_id = job.get("cluster_job_id")
        parts.append(f"cluster {cluster}" + (f", Slurm job {cluster_id}" if cluster_id else ""))
    if job.get("domains"):
        parts.append(", ".join(job["domains"]))
    if job.get("gpus"):
        parts.append(f"(GPU {', '.join(str(g) for g in job['gpus'])})")
    elif spec.get("gpus"):
        wants = f"wants {spec['gpus']} GPU{'s' if spec['gpus'] != 1 else ''}"
        replicas = spec.get("replicas") or 1
        if job.get("kind") == "service" and replicas > 1:
            # (a 2-replica service said "wants 1 GPU" beside "needs 2 GPUs": tester h151)
            wants += f" per replica, {replicas} replicas"
        parts.append(wants)
    pinned = spec.get("domain")
    if pinned:
        parts.append("pinned to " + (pinned if isinstance(pinned, str) else ", ".join(pinned)))
    return "  ".join(parts)


_REPLICA_STYLES = {
    "up": "$text-success",
    "starting": "$text-warning",
    "down": "bold $text-error",
    "backoff": "bold $text-warning",
    "stopping": "$foreground-muted",
    "exited": "$foreground-muted",
    "pending": "$foreground-muted",
}


def replica_lines(job: JobJSON, now: float) -> Content:
    """A service's replicas, one line each: state (with countdowns), endpoint, restarts."""
    replicas = job.get("replicas") or []
    if job.get("kind") != "service":
        return Content("")
    spec = job.get("spec") or {}
    limit = spec.get("max_restarts")
    # (never placed: "0/5 up", not "0 up", beside the 5 it asks for)
    health = replica_health(job) or f"0/{spec.get('replicas') or 1} up"
    if not is_whole(job):
        # (a row, until the whole job comes: it has neither the restart policy nor the
        # placement, which read "restart always · placement 0 of 10": tester h115)
        head = f"{health} · …"
    else:
        head = (
            f"{health} · restart {spec.get('restart', 'always')}"
            + ("" if limit is None else f", at most {limit}")
            + f" · {placement_words(job)}"
        )
    lines = [Content.styled(head, "$foreground-muted")]
    digits = len(str(len(replicas) - 1))  # (indexes right-aligned: 10 sat one column off)
    for replica in replicas:
        state = str(replica.get("state", ""))
        restarts = int(replica.get("restarts", 0))
        code = replica.get("last_exit_code")
        placing = job.get("status") in ("pending", "queued")
        lines.append(
            Content.assemble(
                (f"{replica.get('index', 0):>{digits}} ", "$foreground-muted"),
                (replica_state(replica, now, placing=placing), _REPLICA_STYLES.get(state, "")),
                # (its pid, as `status` shows it: the detail had none: tester h127)
                (f"  pid {replica['pid']}", "$foreground-muted") if _live_pid(replica) else "",
                f"  {replica.get('endpoint') or ''}".rstrip(),
                (f"  {','.join(replica.get('domains') or [])}", "$foreground-muted"),
                f"  restarts {restarts}" if restarts else "",
                (f"  last exit {code}", "$text-accent") if code is not None else "",
            )
        )
    return Content("\n").join(lines)


REASON_WORDS: dict[str, str] = {
    "over_capacity": "over capacity",
    "launch_failed": "it could not be started",
    "engine_lost": "its end was not seen (no engine or launcher watched it)",
    "domain_lost": "the GPU it ran on was lost",
    "adopted_exit_unobserved": "its exit was not seen",
    "adopt_pid_gone": "not adopted: the process was gone",
    "adopt_pid_mismatch": "not adopted: another process has that pid now",
    "adopt_uid_mismatch": "not adopted: the process is another user's",
    "adopt_refused": "not adopted: no one may adopt that process",
    "unkillable": "it outlived SIGKILL and was released",
}
"""How an ended job's status line says a reason whose message gives only the details (the
message field has them); the other reasons' messages say it in words (``exited with code
3``, ``killed by SIGKILL``, ``timed out after 5 s``, ``cancelled by user``)."""


def status_words(job: JobRowJSON) -> str:
    """The status in plain words: ``running``; for an ended job how it ended, never the
    reason's enum: ``failed: exited with code 3``, ``cancelled by user``, ``failed: over
    capacity``."""
    status = str(job.get("status", ""))
    if not status or status in ACTIVE_STATUSES:
        return status
    reason = str(job.get("termination_reason") or "")
    # (the engine's own words for the end: the message up to its first "; ")
    said = (
        REASON_WORDS.get(reason) or " ".join(str(job.get("message") or "").split()).split("; ")[0]
    )
    if not said and reason == "exit_code" and job.get("exit_code") is not None:
        said = f"exited with code {job['exit_code']}"
    if not said or said == status:
        return status
    return said if said.lower().startswith(status) else f"{status}: {said}"


def job_fields(job: JobJSON, now: float) -> dict[str, Content]:
    """The value of each field of :data:`FIELDS` for one job."""
    spec = job.get("spec") or {}
    status = str(job.get("status", ""))
    status_value = Content.styled(status_words(job), STATUS_STYLES.get(status, ""))
    exit_code = job.get("exit_code")
    vram = spec.get("vram_gb")
    runtime = runtime_seconds(job, now)
    # (An argv shell-quoted, as the CLI shows it: repr() doubled every backslash, so a
    # line holding the text \x1b read as one holding an escape character.)
    command_line = command_text(job)
    stamps = (
        ("created", job.get("created_at")),
        ("started", run_started_at(job)),
        ("ended", job.get("ended_at")),
    )
    times = [f"{label} {clock_time(at, now)}" for label, at in stamps if at]
    return {
        "name": Content.styled(str(job.get("name", "")), "bold"),
        "status": status_value,
        "exit": _or_dash("" if exit_code is None else str(exit_code)),
        # (a stop under way counts down to its SIGKILL, as the jobs table says it: the
        # stored "SIGKILL after 20 s" was said for the whole stop: tester h192)
        "message": _or_dash(" ".join(live_message(job, now).split())),
        "command": Content(printable(command_line))
        if spec.get("command")
        else Content.assemble(printable(command_line), (SHELL_LINE_MARK, "dim")),
        # (a row has none: "-" was said until the whole job came: tester h115)
        "cwd": _cwd(spec) if is_whole(job) else Content.styled("…", "$foreground-muted"),
        "domains": _or_dash(_placement(job, spec)),
        "replicas": replica_lines(job, now),
        "vram": _or_dash("" if vram is None else f"{vram:g} GiB per GPU"),
        "timeout": _or_dash(_seconds(spec.get("timeout"))),
        "depends": _or_dash(dependencies_text(spec)),
        "priority": Content(str(job.get("priority", spec.get("priority", 0)))),
        "user": _or_dash(user_text(job)),
        "times": _or_dash("  ·  ".join(times)),
        "runtime": _or_dash("" if runtime is None else duration(runtime)),
        "pid": _or_dash(_pids(job)),
        # (status shows both; the detail had neither: tester h74)
        "restart": _or_dash(f"job {spec['restart_of']}" if spec.get("restart_of") else ""),
        "project": _or_dash(printable(str(spec.get("project") or ""))),
    }


def _live_pid(replica: ReplicaJSON) -> int | None:
    """A replica's pid while a process of it may run (one in back-off keeps its last)."""
    pid = replica.get("pid")
    try:
        alive = ReplicaState(replica.get("state")).has_process
    except ValueError:
        alive = False
    return pid if pid and alive else None


def _pids(job: JobJSON) -> str:
    """The job's pid; a service's, its replicas' (it had none of its own: "pid -" was
    said of a running service: tester h127)."""
    if job.get("kind") == "service":
        return ", ".join(str(r["pid"]) for r in job.get("replicas") or () if _live_pid(r))
    return str(job["pid"]) if job.get("pid") else ""


SHORT_BELOW = 30
"""Lines below which the detail's top and usage parts get less of the height."""

NARROW_BELOW = 72
"""Columns below which the fields and the timeline are stacked, not side by side (side by
side at 60 columns, a field's value had 9 cells: "complete|d:", "longslee|p"; at 80 the
side by side layout stays, as stacked it took the log 5 of its 24 lines)."""


class JobDetailScreen(SaysWhyKeysAreDimmed, KeepsStylesOnResume, Screen[None]):
    """One job: its fields, its timeline and its output, kept current while it runs."""

    DEFAULT_CSS = """
    /* The screen never scrolls (its scrollbar took the footer's last column at 80x24):
       the parts share the height, and the log keeps at least 3 lines. */
    JobDetailScreen { overflow-y: hidden; }
    JobDetailScreen #detail-top {
        height: auto;
        max-height: 55%;
    }
    JobDetailScreen #log { min-height: 3; }
    JobDetailScreen.-no-engine #detail-top { text-opacity: 50%; }
    JobDetailScreen.-short #detail-top { max-height: 50%; }
    JobDetailScreen.-short #usage { max-height: 35%; }
    /* (a job that never ran has no output: its empty box took 9 of 24 rows, and "why it
       waits" was cut: tester h141) */
    JobDetailScreen.-not-started #detail-top { max-height: 100%; }
    JobDetailScreen #fields-box, JobDetailScreen #timeline-box {
        height: auto;
        max-height: 100%;
        border: round $panel-lighten-2;
        border-title-color: $foreground;
        background: $surface;
    }
    JobDetailScreen #fields-box { width: 3fr; padding: 0 1; }
    JobDetailScreen #timeline-box { width: 4fr; height: 100%; }
    JobDetailScreen.-narrow #detail-top { layout: vertical; }
    JobDetailScreen.-narrow #fields-box { width: 100%; max-height: 60%; }
    JobDetailScreen.-narrow #timeline-box { width: 100%; height: auto; max-height: 40%; }
    /* (anchored to its end, a timeline shorter than its box was drawn at the box's
       bottom: it fills the box, its lines at the top) */
    JobDetailScreen.-timeline-follows #timeline { min-height: 100%; }
    JobDetailScreen.-narrow #timeline { min-height: 0; }
    JobDetailScreen #fields { display: none; }
    JobDetailScreen #field-loading { color: $text-muted; }
    JobDetailScreen #field-loading.-error { color: $text-error; }
    JobDetailScreen #search-row { height: 1; display: none; background: $surface; }
    JobDetailScreen #search-row.-open { display: block; }
    JobDetailScreen #search-prompt {
        width: 3; padding: 0 1; color: $text-accent; text-style: bold;
    }
    JobDetailScreen #log-search { width: 1fr; background: $surface; }
    JobDetailScreen #log-search:focus { background: $boost; }
    """

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("detail"))
    HIDDEN_KEYS_SAY_WHY: ClassVar[dict[str, str]] = {
        "right_square_bracket": "next_replica",
        "left_square_bracket": "previous_replica",
        "u": "toggle_usage",
        "f": "toggle_follow",
    }
    KEYMAP_SCOPE: ClassVar[str] = "detail"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id
        self._job: JobJSON | None = None
        self._timeline_anchored = False  # (see _anchor_timeline)
        self._seen_version = 0
        self._seen_loads = 0
        self._log_done = False
        self._log_error = ""  # (why the output could not be read, once it could not)
        self._log_next = 0  # where its output goes on (see LogChunk.next)
        self._replica = 0  # whose output the log shows, for a service
        self._usage_chosen = False  # the user pressed u: the height no longer decides
        self._search_from = 0  # the line the search started from (it finds as you type)
        self._search_pending = False  # enter left the search line; its term not yet read
        self._why_asked = False  # a "why it waits" is being asked again

    def compose(self) -> ComposeResult:
        yield EngineStatus(f"job {self.job_id}")
        with Horizontal(id="detail-top"):
            with VerticalScroll(id="fields-box"):
                yield Static("loading…", id="field-loading")
                # (the name is whole in `status`, the CLI; here the rows after it stay in view)
                yield FieldList(FIELDS, max_lines={"name": 2}, id="fields")
            with VerticalScroll(id="timeline-box"):
                # (first in the wider column, beside a waiting job's short timeline: under
                # the fields it was below the fold at 120x40, its lines cut: tester h67)
                yield WhyPanel(id="why")
                yield Timeline(id="timeline")
        yield UsagePanel(id="usage")
        yield LogTail(id="log")
        with Horizontal(id="search-row"):
            yield Label("/", id="search-prompt")
            # Disabled while hidden, so it never takes the focus (and the keys) from the log.
            yield FieldInput(
                placeholder="search the log (enter: to the log, n / N: next / previous, esc: end)",
                compact=True,
                id="log-search",
                disabled=True,
            )
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        app = view_of(self)
        self.query_one("#fields-box").border_title = f"job {self.job_id}"
        self.query_one("#timeline-box").border_title = "timeline"
        mark_while_no_engine(self)
        self.query_one(LogTail).wrap = app.log_wrap
        self._update_log_title()
        known = app.job_store.jobs.get(self.job_id)
        if known is not None:
            # Only its row until the fetch brings the whole job (fields use .get for the
            # rest meanwhile).
            self._show_job(cast(JobJSON, known))
        self._seen_version = app.job_store.version
        self._seen_loads = app.job_store.loads
        self.watch(self.app, "jobs_version", self._jobs_changed, init=False)
        self.set_interval(1.0, self._tick)
        # Why a job waits changes with other jobs and the domains, not with its own row:
        # asked again while it waits (it said "ahead: none" with a job now ahead of it).
        self.set_interval(WHY_REFRESH_S, self._refresh_why)
        self.query_one(LogTail).focus()
        self.query_one("#log-search", Input).cursor_blink = app.cursor_blink
        usage = self.query_one(UsagePanel)
        usage.display = (
            known is not None
            and uses_gpus(known)
            and (known.get("status") not in WAITING_STATUSES or known.get("started_at") is not None)
        )
        usage.expanded = self.app.size.height >= EXPAND_USAGE_FROM
        self._fetch()
        self._follow_log()
        self._follow_usage()

    # -- the job ----------------------------------------------------------------------------

    @property
    def job(self) -> JobJSON | None:
        """The latest copy of the job (None until it is loaded)."""
        return self._job

    @property
    def finished(self) -> bool:
        """True once the job reached a terminal status."""
        return self._job is not None and self._job.get("status") not in ACTIVE_STATUSES

    def on_screen_resume(self) -> None:
        if self.job_id in view_of(self).job_store.removed:
            self._close_removed()

    def _close_removed(self) -> None:
        """The job was cleaned from the history (`clean`, ``[history]``): nothing here
        can be acted on any more ("no job N" answered every action). Closed once it is
        the screen shown (one under a dialog, or in another mode, waits until then)."""
        if self.app.screen is self:
            self.app.notify(f"job {self.job_id} was removed from the history", timeout=8)
            self.dismiss()

    def _jobs_changed(self, _version: int) -> None:
        app = view_of(self)
        store = app.job_store
        if self.job_id in store.removed:
            self._close_removed()
            return
        if store.loads != self._seen_loads:
            # Reloaded (a reconnect): a job cleaned meanwhile was said to no one, so ask
            # (one gone answers 404, and the detail closes as for a jobs.removed event).
            self._seen_loads = store.loads
            if self.job_id not in store.jobs:
                self._fetch()
        changed = store.changed_since(self._seen_version)
        if changed and self.job_id not in changed:
            self._refresh_why()  # (another job's change may be why this one waits)
        if self.job_id in changed:
            job = store.jobs.get(self.job_id)
            if job is not None:
                # The row is current but cut (its spec, and fields a table does not show):
                # over the whole job last fetched, until the fetch below brings a new one.
                last: dict[str, Any] = dict(self._job or {})
                merged = {**last, **job, "spec": last.get("spec", job["spec"])}
                self._show_job(cast(JobJSON, merged))
                if self.finished:
                    self._follow_usage()  # at once: its stored usage (the worker is exclusive)
            self._fetch()
        self._seen_version = store.version

    @work(exclusive=True, group="job-fetch", exit_on_error=False)
    async def _fetch(self) -> None:
        """Reload the job and its timeline from the engine."""
        app = view_of(self)
        try:
            data = await app.backend.job(self.job_id)
        except BackendError as err:
            if err.status == 404 and self._job is not None:
                # Gone since it was shown: cleaned while no event could say so (an engine
                # restart, [history] applied at its start): as a jobs.removed event does.
                app.job_store.remove([self.job_id])
                self._close_removed()
                return
            if self._job is None:
                loading = self.query_one("#field-loading", Static)
                loading.update(str(err))
                loading.add_class("-error")
            self.app.notify(str(err), title=f"job {self.job_id}", severity="error")
            return
        self._show_job(data["job"])
        self.query_one(Timeline).set_events(data.get("events") or [])
        why = None
        if data["job"].get("status") in WAITING_STATUSES:
            try:
                why = await app.backend.why(self.job_id)
            except BackendError:
                why = None  # (the fields say what is known; the engine's log says why)
        if not self._widgets_gone:
            self.query_one(WhyPanel).show_why(why)

    def _refresh_why(self) -> None:
        """Ask again why the job waits, while it does: once for a burst of changes (one
        ask at a time; those coming meanwhile are answered by it)."""
        if self._why_asked or self._job is None:
            return
        if self._job.get("status") in WAITING_STATUSES:
            self._why_asked = True
            self._ask_why()

    @work(group="job-why", exit_on_error=False)
    async def _ask_why(self) -> None:
        try:
            await asyncio.sleep(0.3)  # (the rest of the burst)
            why = await view_of(self).backend.why(self.job_id)
        except BackendError:
            return
        finally:
            self._why_asked = False
        waiting = self._job is not None and self._job.get("status") in WAITING_STATUSES
        if not self._widgets_gone and waiting:
            self.query_one(WhyPanel).show_why(why)

    def _show_job(self, job: JobJSON) -> None:
        app = view_of(self)
        self._job = job
        if self._widgets_gone:
            return
        # (Content: a name is the user's text, never markup)
        name = Content(f"job {self.job_id} · {job.get('name', '')}")
        self.query_one("#fields-box").border_title = name
        self.query_one("#field-loading").display = False
        fields = self.query_one("#fields", FieldList)
        spec = job.get("spec") or {}
        hidden = [] if self.is_service else ["replicas"]
        hidden += [key for key in ("restart_of", "project") if not spec.get(key)]
        fields.update(
            job_fields(job, app.clock()),
            hidden=[{"restart_of": "restart"}.get(key, key) for key in hidden],
        )
        fields.display = True
        usage = self.query_one(UsagePanel)
        # (a GPU job that has not run yet has no usage: "no GPU usage seen yet" took the
        # room its "why it waits" needed)
        # (nor has one that ended without running: over capacity, a dependency failed)
        usage.display = uses_gpus(job) and (
            job.get("started_at") is not None or job.get("status") == "running"
        )
        if "usage" in job or usage.summary is None:
            usage.show_summary(job.get("usage"), active=not self.finished)
        self.set_class(self._not_started, "-not-started")
        self._anchor_timeline(job.get("status") not in WAITING_STATUSES)
        self._update_log_title()
        self.refresh_bindings()

    def _anchor_timeline(self, anchored: bool) -> None:
        """Keep the timeline on its newest entries as they come (Textual's anchor: until
        the user scrolls up to older ones, and again once back at the end) for a job
        that runs or has ended; a service's scale from 64 to 1 went on below the first
        "replica N: up" lines, out of sight (tester h168). Not while it waits: "why it
        waits" heads the box. Set as that changes only, so a scroll up is kept."""
        if anchored is self._timeline_anchored:
            return
        self._timeline_anchored = anchored
        self.set_class(anchored, "-timeline-follows")
        box = self.query_one("#timeline-box", VerticalScroll)
        box.anchor(anchored)
        if not anchored:
            box.scroll_home(animate=False, immediate=True)

    @property
    def _adopted(self) -> bool:
        return self._job is not None and self._job.get("kind") == "adopted"

    @property
    def is_service(self) -> bool:
        """True when the job is a service (its log is per replica)."""
        return self._job is not None and self._job.get("kind") == "service"

    def _tick(self) -> None:
        """A running job's runtime grows; back-off countdowns run down."""
        if self._job is not None and self._job.get("status") == "running":
            app = view_of(self)
            values = job_fields(self._job, app.clock())
            self.query_one("#fields", FieldList).update(
                {key: values[key] for key in ("runtime", "replicas", "message")}
            )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``]`` (next replica) exists for services only, ``u`` for GPU jobs only, ``f``
        until an ended job's output is read to its end; ``c``
        (cancel) is for an active job, ``R`` (restart) for an ended one and ``e`` (edit)
        for a waiting one (dimmed otherwise, as in the jobs table); ``n`` / ``N`` are the
        log's only while it is searched (else ``n`` is the App's: new job); ``P`` needs a
        terminal (not a browser)."""
        if action == "search_log":  # (in the search line, "/" is text)
            if isinstance(self.focused, Input) and self.focused.id == "log-search":
                return False
            # (an adopted process's output is not here: "/x: no match" said of none; h99)
            return None if self._adopted else True
        if action in ("next_replica", "previous_replica"):
            # (dimmed for one replica: "]" re-read the same log without a word; h98, h99)
            count = self._replica_count
            shown_gone = self._replica >= count  # (removed by a scale-down)
            return (True if count > 1 or shown_gone else None) if self.is_service else False
        if action == "toggle_usage":
            # (a GPU job that has not run yet shows no usage: u did nothing to be seen)
            return self._job is not None and uses_gpus(self._job) and self._usage_shown

        if action in ("restart_job", "cancel_job", "edit_job") and isinstance(self.focused, Input):
            return False  # (in the search line letters are text: "R Restart" stayed: h83)
        if (
            action in ("restart_job", "cancel_job", "edit_job")
            and self._job is not None
            and not_yours(view_of(self).backend.location, self._job)
        ):
            return None  # (another user's: said why when pressed; h179)
        if action == "restart_job":
            return True if self._job is not None and can_restart(self._job) else None
        if action == "cancel_job":  # (still loading: on, to say so)
            return True if self._job is None or self._job["status"] in ACTIVE_STATUSES else None
        if action == "edit_job":
            return True if can_edit(self._job) else None
        if action in ("next_match", "previous_match"):
            if self._in_search_line:
                return False  # (there n and N are text: "N Prev" typed an N: tester h95)
            log = self.query_one(LogTail)
            searching = self._search_pending or bool(log.search_term)
            if searching and not self._search_pending and not log.matches:
                return None  # (dimmed: no match to go to, "/zzz: no match": tester h96)
            return not self._widgets_gone and searching
        if action == "end_search":
            return not self._widgets_gone and self._searching
        if action == "open_pager":
            return not self.app.is_web
        if action == "toggle_follow":
            # (an ended job's output, read to its end: nothing more comes to follow, and
            # the footer offered f, which then did nothing to be seen; nor has a job that
            # waits to start any output yet: tester h89)
            # An adopted process's output is not here: f flipped its label, nothing more
            # (tester h110).
            if self._adopted:
                return False
            return not (self.finished and self._log_done) and not self._not_started
        return True

    @property
    def _usage_shown(self) -> bool:
        return not self._widgets_gone and self.query_one(UsagePanel).display

    @property
    def _not_started(self) -> bool:
        """A job that waits and never ran (a requeued one has output)."""
        job = self._job
        return (
            job is not None
            and job.get("status") in WAITING_STATUSES
            and job.get("started_at") is None
        )

    def on_resize(self) -> None:
        # (A short terminal gives the log a few lines more; CSS has no height queries.)
        self.set_class(self.size.height < SHORT_BELOW, "-short")
        self.set_class(self.size.width < NARROW_BELOW, "-narrow")
        if not self._usage_chosen:
            self.query_one(UsagePanel).expanded = self.size.height >= EXPAND_USAGE_FROM

    # -- GPU usage --------------------------------------------------------------------------

    @work(exclusive=True, group="job-usage", exit_on_error=False)
    async def _follow_usage(self) -> None:
        """Read a GPU job's usage every few seconds while it runs, then once more (its
        stored usage) when it has ended; nothing for a job that uses no GPU."""
        app = view_of(self)
        lost = False
        stored_reads = 0
        while not self._widgets_gone:
            job = self._job
            if job is not None and not uses_gpus(job):
                return
            finished = self.finished  # (seen before the read: the read is then the last)
            try:
                usage = await app.backend.usage(self.job_id)
            except ConnectionLost:
                # Said on the panel, not in a toast: the header and footer say the engine
                # is lost; a toast of a background read's "nothing was sent" read as if
                # the user had asked something (tester h91). The reads go on.
                if not lost and not self._widgets_gone:
                    self.query_one(UsagePanel).show_lost()
                lost = True
                await asyncio.sleep(USAGE_POLL_INTERVAL)
                continue
            except BackendError as err:
                self.app.notify(str(err), title=f"usage of job {self.job_id}", severity="error")
                return
            lost = False
            if self._widgets_gone:
                return
            panel = self.query_one(UsagePanel)
            shown = panel.points
            if finished and shown and not usage.get("series") and stored_reads < 5:
                # Its stored usage is written a moment after its end: read a little later
                # (the plots it had went blank, the job's series lost to the view).
                stored_reads += 1
                await asyncio.sleep(0.4)
                continue
            panel.show(usage, active=not finished)
            if finished:
                return
            await asyncio.sleep(USAGE_POLL_INTERVAL)

    # -- the output -------------------------------------------------------------------------

    @work(exclusive=True, group="log-tail", exit_on_error=False)
    async def _follow_log(self) -> None:
        """Read the output until the job has ended and everything it wrote is shown."""
        app = view_of(self)
        log = self.query_one(LogTail)
        connection_said = False
        while True:
            if self._adopted:
                break  # (its output is where it was started: the pane stayed blank)
            # Decide "drained" from the status seen before the read: output written
            # just before the end is then read on this pass, not lost.
            finished = self.finished
            try:
                replica = self._replica if self.is_service else None
                chunk = await app.backend.read_log(self.job_id, self._log_next, replica=replica)
                if (
                    self._log_next == 0
                    and chunk.size is not None
                    and chunk.size - len(chunk.data) > LOG_TAIL_BYTES
                ):
                    self._log_next = chunk.size - LOG_TAIL_BYTES
                    log.skip_head()
                    self._update_log_title()
                    continue
                if (
                    log.follow
                    and chunk.size is not None
                    and chunk.size - self._log_next > LOG_TAIL_BYTES
                    and not log.search_term
                ):
                    # Followed, and a window's worth behind a fast writer: to its last part
                    # again, as on opening. It fell ever further behind, read every byte
                    # (most of a core), and said "reading" for minutes after the job
                    # ended (tester h104).
                    log.reset()
                    self._log_next = chunk.size - LOG_TAIL_BYTES
                    log.skip_head()
                    self._update_log_title()
                    continue
            except ConnectionLost as err:
                log.border_subtitle = Content(str(err))
                connection_said = True
                await asyncio.sleep(2.0)
                continue
            except BackendError as err:
                shown = self._replica < self._replica_count
                if self.is_service and err.field == "replica" and shown:
                    # The scale-down that removed it may not have reached this view yet (CI
                    # saw the toast below in that moment): the job as it is now decides.
                    try:
                        self._show_job((await view_of(self).backend.job(self.job_id))["job"])
                    except BackendError:
                        pass
                if not (self.is_service and self._replica >= self._replica_count):
                    # (a replica a scale-down removed before it ever ran has no output:
                    # its title says it was removed; the toast added "job 11 has one
                    # replica (0), not 1": tester h124)
                    self.app.notify(
                        str(err), title=f"output of job {self.job_id}", severity="error"
                    )
                self._log_error = str(err)
                break
            if connection_said:
                # Read again: the lost connection is no longer said (with no output to
                # replace it, it stayed under the log of a silent job: tester h176).
                connection_said = False
                log.border_subtitle = Content(log.partial_line)
            if chunk.data:
                kept, first = len(log.source_lines), not log.bytes_read
                log.feed(chunk.data)
                self._log_next = chunk.next
                if first or (
                    (log.lines_dropped or log.head_skipped) and len(log.source_lines) != kept
                ):
                    # (how many of its lines are kept, said; and its first output ends "no
                    # output yet", which stayed over the lines shown: testers h109, h110)
                    self._update_log_title()
                continue
            if finished:
                break
            await asyncio.sleep(LOG_POLL_INTERVAL)
        log.finish()
        self._log_done = True
        self._update_log_title()
        self.refresh_bindings()

    @property
    def _widgets_gone(self) -> bool:
        """True once the screen's widgets are going away (workers may still finish)."""
        if not self.is_attached:
            return True
        try:  # (a child: found by id without walking the screen, which footers ask often)
            self.get_child_by_id("log", LogTail)
        except NoMatches:
            return True
        return False

    def _update_log_title(self) -> None:
        if self._widgets_gone:
            return
        log = self.query_one(LogTail)
        self._show_follow_key("Unfollow" if log.follow else "Follow")
        state = "following" if log.follow else "paused (f or G follows)"
        if log.follow and not log.bytes_read:
            # (an empty box said "following" alone: was it broken? tester h107)
            state = "following · no output yet"
        job = self._job
        if job is not None and job.get("status") in WAITING_STATUSES and not log.bytes_read:
            # (an empty pane said "following" of a job that has not run: tester h83)
            state = "not started yet: its output shows here once it runs"
        if self.finished and not self._log_done:
            state = "reading"  # (an ended job's output: there is nothing to follow)
        if self._log_done:
            state = "no output" if log.bytes_read == 0 else "complete"
            if self._log_error:
                # (another user's unreadable log read "no output": tester h75)
                state = f"not readable: {self._log_error}"
        if self._adopted:
            state = "none here: an adopted process writes where it was started"
        which = ""
        if self.is_service:
            count = self._replica_count
            # (numbered as logs --replica N and status number them; "of 0-1" read oddly)
            which = f" · replica {self._replica}" + (
                f" (of {count}: [ ]: switch)" if count > 1 else ""
            )
            if self._replica >= count:
                # (a scale-down removed it: its log stayed, said "following", and "]" said
                # the one shown was the only one: tester h120)
                which = f" · replica {self._replica} (removed by a scale-down; ]: replica 0)"
                if not self._log_done and state == "following":
                    state = "its last output"
        extra = " · wrapped" if log.wrap else ""
        if log.lines_dropped or log.head_skipped:  # (g, a search and its count cover these)
            kept = len(log.source_lines)  # ("last 1 lines": tester h104)
            if kept:
                extra += f" · last {kept:,} line{'' if kept == 1 else 's'} (P: all)"
            else:  # ("last 0 lines" over a line longer than all that was read: h120)
                extra += " · its last line only, in part (P: all)"
        if log.search_term:
            # (lines, not matches: "match 1 of 1" of a line holding the term twice: h183)
            found = (
                f"line {(log.match_index or 0) + 1} of {len(log.matches)} with it"
                if log.matches
                else "no match"
            )
            extra += f" · /{log.search_term}: {found}"
        # (Content: the search term is the user's text, never markup)
        log.border_title = Content(f"output{which} · {state}{extra}")

    def palette_title(self, action: str) -> str | None:
        """The palette's title of ``action`` as it stands now (see :mod:`..palette`), or
        ``None`` for the keymap's."""
        if action == "toggle_follow" and self.query(LogTail) and self.query_one(LogTail).follow:
            return "Stop following output"
        return None

    def _show_follow_key(self, label: str) -> None:
        """The footer says what ``f`` does now: follow, or stop following (it said
        "Follow" while following: tester h83)."""
        bindings = self._bindings.key_to_bindings
        shown = [b for b in bindings.get("f", ()) if b.action == "toggle_follow"]
        if all(b.description == label for b in shown):
            return
        for key, found in bindings.items():
            bindings[key] = [
                replace(b, description=label) if b.action == "toggle_follow" else b for b in found
            ]
        self.refresh_bindings()

    # -- keys -------------------------------------------------------------------------------

    def action_toggle_follow(self) -> None:
        """Follow the output (scroll with it) or stop following."""
        # (hidden where there is nothing to follow, f did nothing and said nothing: h120)
        if self._job is None:
            self.app.notify("the job is still loading", severity="warning")
            return
        if self._adopted:
            self._say_not_here("is an adopted process: it writes where it was started")
            return
        if self._not_started:
            self._say_not_here("has not started yet: it has no output to follow")
            return
        if self.finished and self._log_done:
            self._say_not_here("has ended: its output is all shown, nothing more comes")
            return
        log = self.query_one(LogTail)
        log.follow = not log.follow
        self._update_log_title()

    def action_toggle_wrap(self) -> None:
        """Wrap long lines of the log, or show them as one row (scrolled sideways)."""
        log = self.query_one(LogTail)
        log.wrap = not log.wrap
        view_of(self).log_wrap = log.wrap  # (it was forgotten at the next job: tester h70)
        self._update_log_title()
        self.call_after_refresh(self._update_log_title)  # (the lines kept, once shown anew)

    def action_scroll_top(self) -> None:
        """The log's first line (following stops)."""
        self.query_one(LogTail).scroll_to_top()
        self._update_log_title()

    def action_scroll_bottom(self) -> None:
        """The log's last line."""
        self.query_one(LogTail).scroll_to_bottom()

    # -- search -----------------------------------------------------------------------------

    def action_search_log(self) -> None:
        """Type a term: the log goes to its matches as you type."""
        if self._adopted:
            self.app.notify("an adopted process writes where it was started: no output here")
            return
        log = self.query_one(LogTail)
        current = log.row_of_current_match()
        self._search_from = current[1] if current else log.top_line()
        field = self.query_one("#log-search", Input)
        field.disabled = False
        self.query_one("#search-row").add_class("-open")
        self.set_focus(field)  # (now: Widget.focus waits behind the keys on their way)

    @on(LogTail.FollowChanged)
    def _follow_changed(self) -> None:
        self._update_log_title()

    @on(Input.Changed, "#log-search")
    def _search_typed(self, event: Input.Changed) -> None:
        log = self.query_one(LogTail)
        if event.input.disabled or event.value == log.search_term:
            # (a Changed read late, after enter had searched its term and an "n" had gone
            # to the next match: searched again, it went back to the first; CI, h76's run)
            return
        log.search(event.value, from_line=self._search_from)
        self._update_log_title()
        self.refresh_bindings()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        self._close_search_field()
        if not event.value:
            self._end_search()

    def action_leave_search(self) -> None:
        """Enter in the search line: keep the term (an empty one ends the search), back
        to the log; a priority key, so that the focus moves before the next key is routed
        (see keymap)."""
        focused = self.focused
        if not isinstance(focused, Input) or focused.id != "log-search":
            raise SkipAction()
        self.set_focus(self.query_one(LogTail))
        # Until the term typed before enter is in (its keys may still wait in the field,
        # and its Changed messages behind them), n / N are the search's, not the App's:
        # under load "needle, enter, n" opened the new-job form (CI, coverage run).
        self._search_pending = True
        after_typed(self, self._search_entered)

    def _search_entered(self) -> None:
        field = self.query_one("#log-search", Input)
        self._search_pending = False
        log = self.query_one(LogTail)
        if field.value and log.search_term != field.value:
            log.search(field.value, from_line=self._search_from)  # (its Changed not read yet)
        self._close_search_field()
        if not field.value:
            self._end_search()

    def _close_search_field(self) -> None:
        field = self.query_one("#log-search", Input)
        self.query_one("#search-row").remove_class("-open")
        self.query_one(LogTail).focus()
        field.disabled = True

    def _end_search(self) -> None:
        field = self.query_one("#log-search", Input)
        with field.prevent(Input.Changed):
            field.value = ""
        self.query_one(LogTail).end_search()
        self._update_log_title()
        self.refresh_bindings()

    def action_next_match(self) -> None:
        """The next match of the search (from the last, the first)."""
        self._step_match(1)

    def action_previous_match(self) -> None:
        """The previous match of the search (from the first, the last)."""
        self._step_match(-1)

    def _step_match(self, step: int) -> None:
        if self._search_pending:
            after_typed(self, lambda: self._step_match(step))  # (behind the term's keys)
            return
        log = self.query_one(LogTail)
        if not log.search_term:
            if step == 1:  # (the term was empty: the search ended, and n is the App's again)
                self.app.call_later(self.app.run_action, "new_job")
            return
        if not log.next_match(step):
            self.app.notify(f"no match for {log.search_term!r}", severity="warning", timeout=2)
        self._update_log_title()

    # -- $PAGER -----------------------------------------------------------------------------

    def action_open_pager(self) -> None:
        """Read the whole output in $PAGER (less by default); the TUI comes back after."""
        if self._adopted:
            # (it opened an empty pager: there is no output of its here to read)
            self.app.notify(
                "an adopted process has no output here: it writes where it was started",
                title=f"output of job {self.job_id}",
                severity="warning",
            )
            return
        self._open_pager()

    @work(exclusive=True, group="pager", exit_on_error=False)
    async def _open_pager(self) -> None:
        app = view_of(self)
        replica = self._replica if self.is_service else None
        fd, name = tempfile.mkstemp(prefix=f"gpulayer-job{self.job_id}-", suffix=".log")
        path = Path(name)
        try:
            # A private copy of what the engine serves (the TUI may be attached as another
            # user, who may read the output but not the engine's files), up to the output's
            # length when P was pressed: a job that never stopped writing gave no empty
            # read, and the copy grew without end, the pager never shown.
            with os.fdopen(fd, "wb") as out:
                offset, until, told = 0, None, False
                while until is None or offset < until:
                    chunk = await app.backend.read_log(self.job_id, offset, replica=replica)
                    if not chunk.data:
                        break
                    if until is None:
                        # (an engine that does not say: what the view has read)
                        until = chunk.size if chunk.size is not None else self._log_next
                        if until > PAGER_NOTICE_BYTES and not told:
                            told = True
                            self.app.notify(
                                f"copying {until / 2**20:.0f} MB of output for the pager…",
                                title=f"output of job {self.job_id}",
                            )
                    await asyncio.to_thread(out.write, chunk.data)
                    offset = chunk.next
            if offset == 0:
                # (an ended job writes no more: "no output yet" was said of it: h118)
                said = (
                    "no output: it ended without writing any"
                    if self.finished
                    else ("no output yet")
                )
                self.app.notify(said, title=f"output of job {self.job_id}")
                return
            status = await page_file(self.app, path)
        except BackendError as err:
            self.app.notify(str(err), title=f"output of job {self.job_id}", severity="error")
            return
        except SuspendNotSupported:
            self.app.notify("a pager needs a terminal (not a browser)", severity="warning")
            return
        except OSError as err:
            self.app.notify(f"cannot run the pager: {err}", title="$PAGER", severity="error")
            return
        finally:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        if status != 0:
            self.app.notify(f"the pager exited with status {status}", severity="warning")

    def action_toggle_usage(self) -> None:
        """Show the GPU usage as one line, or with its lines and plots."""
        if self._job is not None and not uses_gpus(self._job):
            self._say_not_here("uses no GPU: there is no GPU usage to show")
            return
        if not self._usage_shown:
            # (a GPU job that has not run yet: u toggled a hidden panel: tester h120)
            ran = "never ran" if self.finished else "has not run yet"
            self._say_not_here(f"{ran}: it has no GPU usage to show")
            return
        panel = self.query_one(UsagePanel)
        panel.expanded = not panel.expanded
        self._usage_chosen = True

    @property
    def _replica_count(self) -> int:
        """Its replicas: those placed, else those it asks for (never placed, the detail
        said "replica 0 (of 1" of a 5-replica service: tester h93)."""
        if self._job is None:
            return 1
        placed = len(self._job.get("replicas") or [])
        return placed or int((self._job.get("spec") or {}).get("replicas") or 1)

    def action_next_replica(self) -> None:
        """Show the next replica's output (services write one log per replica)."""
        self._switch_replica(1)

    def action_previous_replica(self) -> None:
        """Show the previous replica's output."""
        self._switch_replica(-1)

    def _switch_replica(self, step: int) -> None:
        if not self.is_service:
            self._say_not_here("has no replicas: only a service has one log per replica")
            return
        count = self._replica_count
        if count == 1 and self._replica == 0:
            self.app.notify("this service has one replica: its output is the one shown")
            return
        self._replica = 0 if self._replica >= count else (self._replica + step) % count
        self.query_one(LogTail).reset()
        self._log_next = 0
        self._log_done = False
        self._log_error = ""
        self._update_log_title()
        self._follow_log()

    def _say_not_here(self, why: str) -> None:
        """A key that does not apply to this job (hidden from the footer) was pressed."""
        if self._job is None:
            self.app.notify("the job is still loading", severity="warning")
        else:
            self.app.notify(f"job {self.job_id} {why}", severity="warning")

    def action_cancel_job(self) -> None:
        """Cancel this job (after a confirmation)."""
        if self._job is None:
            self.app.notify("the job is still loading", severity="warning")
            return
        ask_to_cancel(self, self._job)

    def action_restart_job(self) -> None:
        """Run this ended job again as a new job (after a confirmation); the new job's
        detail replaces this one."""
        if self._job is None:
            self.app.notify("the job is still loading", severity="warning")
            return
        ask_to_restart(self, self._job, self._show_restarted)

    def _show_restarted(self, job: JobJSON) -> None:
        if self.is_current:
            from .jobs import JobsScreen

            # Back from the new job's detail, the table's cursor is on it, not on the job
            # this one showed (enter opened the old job again).
            stack = self.app.screen_stack
            if len(stack) > 1 and isinstance(stack[-2], JobsScreen):
                stack[-2].select_new(job)
            self.app.switch_screen(JobDetailScreen(job["id"]))

    def action_edit_job(self) -> None:
        """Edit this waiting job (priority, GPUs, VRAM, timeout), or scale this running service."""
        if self._job is None:
            self.app.notify("the job is still loading", severity="warning")
            return
        ask_to_edit(self, self._job)

    @property
    def _in_search_line(self) -> bool:
        focused = self.focused
        return isinstance(focused, Input) and focused.id == "log-search"

    @property
    def keeps_n(self) -> bool:
        """``n`` is the search's "next match" here now, even with no match to go to (see
        :meth:`~gpulayer_tui.app.GpulayerApp.check_action`)."""
        return self.is_mounted and not self._widgets_gone and self._searching

    @property
    def _searching(self) -> bool:
        """A search is open: its line, or a term kept for n / N."""
        return self.query_one("#search-row").has_class("-open") or bool(
            self.query_one(LogTail).search_term
        )

    def action_end_search(self) -> None:
        """End the search: its line closed, its term and highlights gone."""
        if self.query_one("#search-row").has_class("-open"):
            self._close_search_field()
        self._end_search()

    def action_back(self) -> None:
        """End the search (its field first), else back to where the job was opened from."""
        if self._searching:
            self.action_end_search()
        else:
            self.dismiss(None)
