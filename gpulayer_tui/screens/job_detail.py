"""Job detail: spec, timeline, live log tail, exit code and termination reason."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Label, Static

from ..backend import BackendError, ConnectionLost
from ..formatting import duration
from ..widgets.engine_status import EngineStatus
from ..widgets.job_table import ACTIVE_STATUSES, command_text, reason_prefix, runtime_seconds
from ..widgets.log_tail import LogTail
from ..widgets.timeline import STATUS_STYLES, Timeline, clock_time
from .jobs import ask_to_cancel

LOG_POLL_INTERVAL = 0.5
"""Seconds between reads of a running job's output."""

FIELDS = (
    ("name", "name"),
    ("status", "status"),
    ("exit", "exit code"),
    ("message", "message"),
    ("command", "command"),
    ("cwd", "cwd"),
    ("domains", "domains"),
    ("vram", "VRAM"),
    ("timeout", "timeout"),
    ("depends", "depends on"),
    ("priority", "priority"),
    ("times", "times"),
    ("runtime", "runtime"),
    ("pid", "pid"),
)
"""The fields block: key (widget id ``field-<key>``) and label, in display order."""


def _or_dash(text: str) -> Content:
    return Content(text) if text else Content.styled("-", "$foreground-muted")


def _seconds(value: Any) -> str:
    return f"{value:g} s ({duration(float(value))})" if value else ""


def _dependencies(spec: dict[str, Any]) -> str:
    out = []
    for dep in spec.get("depends_on") or []:
        if isinstance(dep, dict):
            out.append(f"{dep.get('job')}" + (" (any outcome)" if dep.get("any_exit") else ""))
        else:
            out.append(str(dep))
    return ", ".join(out)


def _placement(job: dict[str, Any], spec: dict[str, Any]) -> str:
    parts = []
    if job.get("domains"):
        parts.append(", ".join(job["domains"]))
    if job.get("gpus"):
        parts.append(f"(GPU {', '.join(str(g) for g in job['gpus'])})")
    elif spec.get("gpus"):
        parts.append(f"wants {spec['gpus']} GPU{'s' if spec['gpus'] != 1 else ''}")
    pinned = spec.get("domain")
    if pinned:
        parts.append("pinned to " + (pinned if isinstance(pinned, str) else ", ".join(pinned)))
    return "  ".join(parts)


def job_fields(job: dict[str, Any], now: float) -> dict[str, Content]:
    """The value of each field of :data:`FIELDS` for one job."""
    spec = job.get("spec") or {}
    status = str(job.get("status", ""))
    reason = job.get("termination_reason")
    status_value = Content.assemble(
        (status, STATUS_STYLES.get(status, "")),
        (f"  ({reason})", "$accent" if reason_prefix(job) else "$foreground-muted")
        if reason
        else "",
    )
    exit_code = job.get("exit_code")
    vram = spec.get("vram_gb")
    runtime = runtime_seconds(job, now)
    command_line = command_text(job) if spec.get("command") else f"sh -c {spec.get('shell', '')!r}"
    times = [
        f"{label} {clock_time(job[key], now)}"
        for label, key in (
            ("created", "created_at"),
            ("started", "started_at"),
            ("ended", "ended_at"),
        )
        if job.get(key)
    ]
    return {
        "name": Content.styled(str(job.get("name", "")), "bold"),
        "status": status_value,
        "exit": _or_dash("" if exit_code is None else str(exit_code)),
        "message": _or_dash(" ".join(str(job.get("message") or "").split())),
        "command": Content(command_line),
        "cwd": _or_dash(str(spec.get("cwd") or "")),
        "domains": _or_dash(_placement(job, spec)),
        "vram": _or_dash("" if vram is None else f"{vram:g} GiB per GPU"),
        "timeout": _or_dash(_seconds(spec.get("timeout"))),
        "depends": _or_dash(_dependencies(spec)),
        "priority": Content(str(job.get("priority", spec.get("priority", 0)))),
        "times": _or_dash("  ·  ".join(times)),
        "runtime": _or_dash("" if runtime is None else duration(runtime)),
        "pid": _or_dash(str(job["pid"]) if job.get("pid") else ""),
    }


class JobDetailScreen(Screen[None]):
    """One job: its fields, its timeline and its output, kept current while it runs."""

    DEFAULT_CSS = """
    JobDetailScreen #detail-top {
        height: auto;
        max-height: 55%;
    }
    JobDetailScreen #fields-box, JobDetailScreen #timeline-box {
        height: auto;
        max-height: 100%;
        border: round $panel-lighten-2;
        border-title-color: $foreground;
        background: $surface;
    }
    JobDetailScreen #fields-box { width: 3fr; padding: 0 1; }
    JobDetailScreen #timeline-box { width: 4fr; height: 100%; }
    JobDetailScreen .field { height: auto; display: none; }
    JobDetailScreen #fields-box.-loaded .field { display: block; }
    JobDetailScreen .field-label { width: 11; color: $text-muted; }
    JobDetailScreen .field-value { width: 1fr; }
    JobDetailScreen #field-loading { color: $text-muted; }
    JobDetailScreen #field-loading.-error { color: $error; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "cancel_job", "Cancel job"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("escape,backspace", "back", "Back", key_display="esc"),
    ]

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id
        self._job: dict[str, Any] | None = None
        self._seen_version = 0
        self._log_done = False

    def compose(self) -> ComposeResult:
        yield EngineStatus(f"job {self.job_id}")
        with Horizontal(id="detail-top"):
            with VerticalScroll(id="fields-box"):
                yield Static("loading…", id="field-loading")
                for key, label in FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(label, classes="field-label")
                        yield Static("", id=f"field-{key}", classes="field-value")
            with VerticalScroll(id="timeline-box"):
                yield Timeline(id="timeline")
        yield LogTail(id="log")
        yield Footer()

    def on_mount(self) -> None:
        app: Any = self.app
        self.query_one("#fields-box").border_title = f"job {self.job_id}"
        self.query_one("#timeline-box").border_title = "timeline"
        self._update_log_title()
        known = app.job_store.jobs.get(self.job_id)
        if known is not None:
            self._show_job(known)
        self._seen_version = app.job_store.version
        self.watch(app, "jobs_version", self._jobs_changed, init=False)
        self.set_interval(1.0, self._tick)
        self.query_one(LogTail).focus()
        self._fetch()
        self._follow_log()

    # -- the job ----------------------------------------------------------------------------

    @property
    def job(self) -> dict[str, Any] | None:
        """The latest copy of the job (None until it is loaded)."""
        return self._job

    @property
    def finished(self) -> bool:
        """True once the job reached a terminal status."""
        return self._job is not None and self._job.get("status") not in ACTIVE_STATUSES

    def _jobs_changed(self, _version: int) -> None:
        app: Any = self.app
        store = app.job_store
        if self.job_id in store.changed_since(self._seen_version):
            job = store.jobs.get(self.job_id)
            if job is not None:
                self._show_job(job)
            self._fetch()
        self._seen_version = store.version

    @work(exclusive=True, group="job-fetch")
    async def _fetch(self) -> None:
        """Reload the job and its timeline from the engine."""
        app: Any = self.app
        try:
            data = await app.backend.job(self.job_id)
        except BackendError as err:
            if self._job is None:
                loading = self.query_one("#field-loading", Static)
                loading.update(str(err))
                loading.add_class("-error")
            app.notify(str(err), title=f"job {self.job_id}", severity="error")
            return
        self._show_job(data["job"])
        self.query_one(Timeline).set_events(data.get("events") or [])

    def _show_job(self, job: dict[str, Any]) -> None:
        app: Any = self.app
        self._job = job
        self.query_one("#fields-box").border_title = f"job {self.job_id} · {job.get('name', '')}"
        self.query_one("#field-loading").display = False
        self.query_one("#fields-box").add_class("-loaded")
        for key, value in job_fields(job, app.clock()).items():
            self.query_one(f"#field-{key}", Static).update(value)

    def _tick(self) -> None:
        """A running job's runtime grows."""
        if self._job is not None and self._job.get("status") == "running":
            app: Any = self.app
            runtime = job_fields(self._job, app.clock())["runtime"]
            self.query_one("#field-runtime", Static).update(runtime)

    # -- the output -------------------------------------------------------------------------

    @work(exclusive=True, group="log-tail")
    async def _follow_log(self) -> None:
        """Read the output until the job has ended and everything it wrote is shown."""
        app: Any = self.app
        log = self.query_one(LogTail)
        while True:
            # Decide "drained" from the status seen before the read: output written
            # just before the end is then read on this pass, not lost.
            finished = self.finished
            try:
                chunk = await app.backend.read_log(self.job_id, log.bytes_read)
            except ConnectionLost as err:
                log.border_subtitle = str(err)
                await asyncio.sleep(2.0)
                continue
            except BackendError as err:
                app.notify(str(err), title=f"output of job {self.job_id}", severity="error")
                break
            if chunk:
                log.feed(chunk)
                continue
            if finished:
                break
            await asyncio.sleep(LOG_POLL_INTERVAL)
        log.finish()
        self._log_done = True
        self._update_log_title()

    def _update_log_title(self) -> None:
        log = self.query_one(LogTail)
        state = "following" if log.follow else "paused (f follows)"
        if self._log_done:
            state = "no output" if log.bytes_read == 0 else "complete"
        log.border_title = f"output · {state}"

    # -- keys -------------------------------------------------------------------------------

    def action_toggle_follow(self) -> None:
        """Follow the output (scroll with it) or stop following."""
        log = self.query_one(LogTail)
        log.follow = not log.follow
        self._update_log_title()

    def action_cancel_job(self) -> None:
        """Cancel this job (after a confirmation)."""
        if self._job is None:
            self.app.notify("the job is still loading", severity="warning")
            return
        ask_to_cancel(self, self._job)

    def action_back(self) -> None:
        """Back to where the job was opened from."""
        self.dismiss(None)
