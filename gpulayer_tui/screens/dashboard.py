"""Dashboard: one panel per domain, a summary line and the GPU process table.

The layout follows the terminal: panel columns from the width (1 under 100 cells, 2 under
160, up to 4 wider) and panel density from the height, so the process table always keeps
room. With many GPUs on a small terminal the panels become one line each, like nvitop's
rows; ``v`` overrides the automatic choice.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import ScrollableContainer
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static

from .. import keymap
from ..formatting import argv_text, user_text
from ..view import view_of
from ..widgets.cluster_panel import ClusterPanel
from ..widgets.engine_status import EngineStatus
from ..widgets.gpu_panel import GpuPanel, no_domain_view
from ..widgets.key_footer import KeyFooter
from ..widgets.memory_bar import BAR_CHAR
from ..widgets.process_row import ProcessRow
from ..widgets.process_table import ProcessTable, rows_from_state
from ..widgets.process_tree import JobLine
from ..widgets.summary_line import SummaryLine
from ..wire import DomainViewJSON, GpusJSON
from .actions import ask_to_signal
from .resume import KeepsStylesOnResume
from .stale import mark_while_no_engine

DENSITY_CYCLE: tuple[str | None, ...] = (None, "full", "compact", "row")
"""What ``v`` cycles through; ``None`` is automatic."""

TABLE_MIN_LINES = 8
"""Lines the process table keeps (title, header, six rows) when choosing the density."""


def grid_columns(width: int, panels: int) -> int:
    """Panel columns for a terminal ``width`` cells wide, balanced over the rows."""
    most = 1 if width < 100 else 2 if width < 160 else 4
    if panels <= 1:
        return 1
    rows = math.ceil(panels / most)
    return math.ceil(panels / rows)


def full_height(graph_height: int) -> int:
    """Lines of a ``full`` panel: border, stats, memory bar and figures, jobs, two graphs."""
    return 2 + 1 + 2 + 1 + 2 * graph_height


def choose_density(panels: int, columns: int, lines: int) -> tuple[str, int]:
    """``(density, graph_height)`` for ``panels`` GPUs in ``columns`` with ``lines`` to spare."""
    rows = math.ceil(panels / columns)
    for graph_height in (4, 3, 2, 1):
        if rows * full_height(graph_height) <= lines:
            return "full", graph_height
    if rows * 5 - 1 <= lines:  # (four lines and a gutter each)
        return "compact", 1
    return "row", 1


class DashboardScreen(KeepsStylesOnResume, Screen[None]):
    """The GPU dashboard: summary, per-GPU panels, the CPU pool and every GPU process."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings("dashboard"))
    KEYMAP_SCOPE: ClassVar[str] = "dashboard"
    """Its part of :data:`~gpulayer_tui.keymap.KEYMAP` (help and the palette show it)."""

    AUTO_FOCUS = "ProcessTable"

    DEFAULT_CSS = """
    DashboardScreen {
        & #gpu-grid {
            layout: grid;
            grid-size: 1;
            grid-gutter: 0 1;
            height: auto;
            overflow-y: auto;
            scrollbar-size-vertical: 1;
            &.-compact { grid-gutter: 1 1; }
            &.-empty { display: none; }
        }
        & #gpu-head { display: none; height: 1; padding: 0 1; }
        & #gpu-grid.-row #gpu-head { display: block; }
        & #cpu-pool { height: 1; padding: 0 1; }
        /* No engine answers: the last readings, dimmed (they read as live: tester h130). */
        &.-no-engine #gpu-grid, &.-no-engine #cpu-pool, &.-no-engine ProcessTable {
            text-opacity: 50%;
        }
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self._panels: dict[str, GpuPanel] = {}
        self._density_override: str | None = None
        self._stale = False
        self._cpu_shown: str | None = None
        self._row_head_width: tuple[int, int] | None = None

    def compose(self) -> ComposeResult:
        yield EngineStatus("dashboard")
        yield SummaryLine(id="summary")
        with ScrollableContainer(id="gpu-grid", classes="-empty"):
            yield Static(id="gpu-head")
        yield Static(id="cpu-pool")
        yield ClusterPanel(id="clusters")
        yield ProcessTable(id="processes")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        grid = self.query_one("#gpu-grid")
        self.watch(grid, "scroll_y", lambda _y: self._show_row_head(), init=False)
        self.watch(self.app, "gpu_state", self._on_gpu_state, init=True)
        mark_while_no_engine(self)
        self.watch(self.app, "jobs_version", self._on_jobs_version, init=True)

    def on_resize(self) -> None:
        self._relayout()

    def on_screen_resume(self) -> None:
        if self._stale:
            self._stale = False
            self._show_state()
            self._show_summary()

    # -- updates --------------------------------------------------------------------------

    def _on_gpu_state(self, _state: object = None) -> None:
        if not self.is_current and self.is_mounted:
            self._stale = True  # hidden: catch up when shown again
            return
        self._show_state()
        self._show_summary()

    def _on_jobs_version(self, _version: object = None) -> None:
        if not self.is_current and self.is_mounted:
            self._stale = True
            return
        self._show_summary()
        # A job's row (its name) may come after the sample that shows it on a GPU.
        for panel in self._panels.values():
            holders = self._holders(panel.domain.get("jobs", []))
            if holders != panel.holders:
                panel.update_domain(panel.domain, panel.history, panel.name_width, holders)

    def _holders(self, job_ids: list[int]) -> list[tuple[int, str]]:
        """(id, name) of the jobs holding a GPU's slots, names from the job store."""
        jobs = view_of(self).job_store.jobs
        named = []
        for job_id in job_ids:
            row = jobs.get(job_id)
            named.append((job_id, "" if row is None else str(row.get("name") or "")))
        return named

    def _show_summary(self) -> None:
        app = view_of(self)
        summary = self.query_one(SummaryLine)
        had_notice = summary.has_class("-notice")
        store = app.job_store
        counts = {**store.summary(app.clock()), "idle": store.idle_warned()}
        health = app.health
        if app.active_partial and health is not None and "waiting_jobs" in health:
            # (past a page of active jobs, the rows loaded undercounted: "10000 queued"
            # of 20,000; tester h104)
            counts["queued"] = health["waiting_jobs"]
            counts["running"] = health.get("running_jobs", counts["running"])
        summary.show(counts, app.gpu_state)
        if summary.has_class("-notice") != had_notice:
            # The notice takes lines from the panels: choose the density again.
            self.call_after_refresh(self._relayout)

    def _show_state(self) -> None:
        app = view_of(self)
        state = app.gpu_state
        if state is None:
            return
        domains: list[Mapping[str, Any]] = [
            d for d in state.get("domains", []) if d.get("gpu_index") is not None
        ]
        domains += [no_domain_view(g) for g in state.get("gpus_without_domain", [])]
        domains.sort(key=lambda d: d["gpu_index"])
        names = [d["name"] for d in domains]
        if names != list(self._panels):
            self._replace_panels(names)
        name_width = max((len(n) for n in names), default=4)
        for domain in domains:
            index = domain["gpu_index"]
            history = app.gpu_history.get(index, ()) if index is not None else ()
            self._panels[domain["name"]].update_domain(
                domain, history, name_width, self._holders(domain.get("jobs", []))
            )
        cpu = next((d for d in state.get("domains", []) if d.get("gpu_index") is None), None)
        self._show_cpu_pool(cpu)
        rows = self._with_job_commands(state)
        self.query_one(ProcessTable).update_processes(rows, self._job_lines(rows))

    def _job_lines(self, rows: list[ProcessRow]) -> dict[int, JobLine]:
        """What the tree view's line for each job owning a process says."""
        jobs = view_of(self).job_store.jobs
        lines = {}
        for job_id in {r.job_id for r in rows if r.job_id is not None}:
            job = jobs.get(job_id)
            if job is not None:
                lines[job_id] = JobLine(job.get("pid"), user_text(job), str(job.get("name") or ""))
        return lines

    def _with_job_commands(self, state: GpusJSON) -> list[ProcessRow]:
        """Process rows; a job's process without a command line shows the job's command."""
        app = view_of(self)
        rows = rows_from_state(state)
        for n, row in enumerate(rows):
            if row.job_id is None or row.command:
                continue
            job = app.job_store.jobs.get(row.job_id)
            if job is None:
                continue
            spec = job.get("spec") or {}
            command = argv_text(spec.get("command") or []) or spec.get("shell") or job.get("name")
            rows[n] = replace(row, command=str(command or ""))
        return rows

    def _replace_panels(self, names: list[str]) -> None:
        """The set of GPUs changed (first sample, a GPU appeared/vanished, a domain was
        renamed): a panel kept for each name kept, new ones mounted in GPU order.

        A kept name keeps its panel: a removal only takes effect later, and a new panel
        under the same id mounted meanwhile ended the app (``DuplicateIds``).
        """
        grid = self.query_one("#gpu-grid")
        old = self._panels
        for name, panel in old.items():
            if name not in names:
                panel.remove()
        kept = [name for name in names if name in old]
        for before, after in itertools.pairwise(kept):  # (GPU order, as names are)
            grid.move_child(old[after], after=old[before])
        self._panels = {
            # (A GPU without a domain, "gpu N", has a space: no id, which it could not be.)
            name: old.get(name) or GpuPanel(name, id=None if " " in name else f"panel-{name}")
            for name in names
        }
        grid.set_class(not names, "-empty")
        for at, name in enumerate(names):
            if name in old:
                continue
            anchor = next((old[n] for n in names[at + 1 :] if n in old), None)
            if anchor is None:
                grid.mount(self._panels[name])
            else:
                grid.mount(self._panels[name], before=anchor)
        self._relayout()

    def _show_cpu_pool(self, cpu: DomainViewJSON | None) -> None:
        line = self.query_one("#cpu-pool", Static)
        line.display = cpu is not None
        if cpu is None:
            return
        slots, used = int(cpu.get("slots") or 0), int(cpu.get("used_slots") or 0)
        width = max(4, min(16, slots))
        filled = 0 if not slots else round(used / slots * width)
        if used and not filled:
            filled = 1
        jobs = [str(j) for j in cpu.get("jobs", [])]
        job_text = ""
        if jobs:
            shown = ", ".join(jobs[:6]) + (f" +{len(jobs) - 6}" if len(jobs) > 6 else "")
            job_text = f"job{'s' if len(jobs) > 1 else ''} {shown}"
        state = cpu.get("state", "in_service")
        mark, style = ("●", "$text-success") if state == "in_service" else ("◐", "$text-warning")
        pieces: list[tuple[str, str]] = [
            (mark, style),
            (" cpu pool ", "bold"),
            (BAR_CHAR * filled, "$text-secondary"),
            (BAR_CHAR * (width - filled), "$memory-free"),
            (f" {used}/{slots}", "bold"),
            (" slots", "$text-muted"),
        ]
        if state != "in_service":
            # (with its reason, as a GPU's panel says it: "draining" alone, tester h162)
            reason = str(cpu.get("drain_reason") or cpu.get("state_reason") or "")
            said = f" · {state}" + (f" ({reason})" if reason else "")
            pieces.append((said, "$text-warning"))
        if job_text:
            pieces += [(" · ", "$text-muted"), (job_text, "")]
        content = Content.assemble(*pieces)
        if content.markup != self._cpu_shown:  # unchanged samples cost no repaint
            self._cpu_shown = content.markup
            line.update(content, layout=False)  # always one line

    # -- layout ---------------------------------------------------------------------------

    def _relayout(self) -> None:
        if not self.is_mounted:
            return
        panels = list(self._panels.values())
        grid = self.query_one("#gpu-grid")
        width, height = self.size
        if not panels or width <= 0:
            return
        summary_lines = max(1, self.query_one(SummaryLine).outer_size.height)
        spare = height - 1 - summary_lines - 1 - 1 - TABLE_MIN_LINES
        columns = grid_columns(width, len(panels))
        density, graph_height = choose_density(len(panels), columns, spare)
        if self._density_override is not None:
            # "full" asked for keeps the graphs automatic gave it where it fits (they
            # shrank from 4 lines to 2, smaller than "auto": tester h87); where it does
            # not fit, 2 lines, and the grid scrolls.
            fits = density == "full"
            density = self._density_override
            graph_height = (graph_height if fits else 2) if density == "full" else 1
        if density == "row":
            columns = 1
        grid.styles.grid_size_columns = columns
        # Row heights: one line per GPU in the row density; else each panel's own height.
        grid.styles.grid_rows = "1" if density == "row" else "auto"
        for item in ("full", "compact", "row"):
            grid.set_class(item == density, f"-{item}")
        head = self.query_one("#gpu-head", Static)
        head.styles.column_span = columns
        grid.styles.max_height = max(3, spare + (TABLE_MIN_LINES - 4))
        for panel in panels:
            panel.density = density
            panel.graph_height = graph_height
        if density == "row":  # (how many rows fit is known once laid out)
            self.call_after_refresh(self._show_row_head)

    @on(GpuPanel.RowWidthChanged)
    def _row_width_changed(self, message: GpuPanel.RowWidthChanged) -> None:
        # The header is as wide as every row (same column, same padding): draw it for the
        # width the rows were drawn for, so the columns line up exactly.
        self._row_head_width = (message.width, message.name_width)
        self._show_row_head()

    def _show_row_head(self) -> None:
        """The rows' header, ending in ``+5 more ↓`` while rows are scrolled out of sight
        below (only a one-cell scrollbar said so: tester h124, 8 GPUs at 40x12)."""
        if self._row_head_width is None:
            return
        width, name_width = self._row_head_width
        head = GpuPanel.row_header(width, name_width)
        grid = self.query_one("#gpu-grid")
        bottom = grid.scroll_y + grid.scrollable_content_region.height
        below = sum(
            1
            for panel in self._panels.values()
            if panel.density == "row" and panel.virtual_region.bottom > bottom
        )
        if below:
            hint = f" +{below} more ↓"
            head = Content.assemble(
                head.truncate(max(0, width - len(hint))), (hint, "$text-warning bold")
            )
        self.query_one("#gpu-head", Static).update(head)

    # -- actions --------------------------------------------------------------------------

    def action_sort(self, step: int) -> None:
        """Sort the process table by the next (or previous) column."""
        self.query_one(ProcessTable).cycle_sort(step)

    def action_reverse_sort(self) -> None:
        """Reverse the process table's order."""
        self.query_one(ProcessTable).reverse_sort()

    def action_toggle_tree(self) -> None:
        """Show each job's processes under a line for the job (and children under their
        parents), or the flat list again."""
        on = self.query_one(ProcessTable).toggle_tree()
        self.notify(f"process tree: {'on' if on else 'off'}", timeout=2)

    def action_cycle_density(self) -> None:
        """Cycle the panels through automatic, full, compact and one-line rows."""
        index = DENSITY_CYCLE.index(self._density_override)
        self._density_override = DENSITY_CYCLE[(index + 1) % len(DENSITY_CYCLE)]
        self._relayout()
        # (in the words help and the README use: "row" read as a mistake for "rows")
        shown = {None: "automatic", "row": "rows (one line each)"}
        said = shown.get(self._density_override, self._density_override)
        self.notify(f"panels: {said}", timeout=2)

    def action_open_job(self) -> None:
        """Open the job that owns the process under the table's cursor."""
        job_id = self.query_one(ProcessTable).chosen_job()
        if job_id is None:
            self.notify("this process is not a gpulayer job", timeout=2)
            return
        self._open_job(job_id)

    def action_signal_process(self) -> None:
        """Signal the unregistered process under the table's cursor (after a
        confirmation); a job's process is stopped by cancelling its job."""
        table = self.query_one(ProcessTable)
        row = table.cursor_process()
        if row is None:
            job_id = table.chosen_job()
            self.notify(
                "no process selected"
                if job_id is None
                else f"this is job {job_id}'s line: cancel the job (c, in its detail)",
                severity="warning",
            )
            return
        if row.job_id is not None:
            self.notify(
                f"pid {row.pid} is job {row.job_id}'s: cancel the job instead (c, in its detail)",
                severity="warning",
            )
            return
        gpus = sorted({r.gpu for r in self.query_one(ProcessTable).processes if r.pid == row.pid})
        held = [r.used_bytes for r in self.query_one(ProcessTable).processes if r.pid == row.pid]
        process = {
            "pid": row.pid,
            "user": row.user,
            "command": row.command,
            "start_ticks": row.start_ticks,
            "gpus": gpus,
            "used_bytes": sum(b for b in held if b is not None),
        }
        ask_to_signal(self, process)

    @on(ProcessTable.JobChosen)
    def _job_chosen(self, message: ProcessTable.JobChosen) -> None:
        self._open_job(message.job_id)

    def _open_job(self, job_id: int) -> None:
        app = view_of(self)
        app.open_job(job_id)
