"""One GPU domain: health, utilization, temperature, power, slots, VRAM split and history.

A panel has three densities, chosen by the dashboard from the terminal size:

``full``
    A bordered card: title ``gpu1 · NVIDIA A100-SXM4-80GB``, a stats line, the memory bar
    with its GiB figures, the jobs holding its slots, and utilization / memory history
    graphs ``graph_height`` lines tall each.
``compact``
    Four lines without a border: name and stats, the memory bar, its figures, its jobs.
``row``
    One line, like a row of nvitop's table (the jobs in a JOB column when there is room);
    :meth:`GpuPanel.row_header` gives the matching header line.

Job names are the users' words: shown as text, never read as markup.

Why this module is over ~400 lines: the three layouts render the same reading (and its
stale, lost and quarantined states) differently; one widget keeps them consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from ..cells import cell_width, cut_to_width, pad_to_width
from .memory_bar import BAR_CHAR, MemoryBar
from .usage_graphs import GraphLine, UsageGraphs

DENSITIES = ("full", "compact", "row")

NO_DOMAIN = "no_domain"
"""The state a panel shows for a GPU the config gives no domain."""


def no_domain_view(other: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU the config gives no domain (``gpus_without_domain`` of a ``/gpus`` view) as
    a panel shows it: ``gpu N``, its reading, no slots, its memory as its jobs' (those
    still running there since its domain went) and everyone else's."""
    gpu = other.get("gpu") or {}
    held = set(other.get("jobs") or ())
    owned = sum(
        p.get("used_bytes") or 0 for p in other.get("processes") or () if p.get("job_id") in held
    )
    total, used = gpu.get("memory_total"), gpu.get("memory_used")
    if total is not None and gpu.get("memory_reserved"):
        total -= gpu["memory_reserved"]  # (what jobs can have, as in a domain's account)
    vram = None
    if total is not None and used is not None:
        used = max(used, owned)
        vram = {"total": total, "used": used, "owned": owned, "others": used - owned}
        vram["free"] = max(0, total - used)
    return {
        # (Not a domain name: those have no spaces, so it never stands for one.)
        "name": f"gpu {other['gpu_index']}",
        "gpu_index": other["gpu_index"],
        "state": NO_DOMAIN,
        "slots": 0,
        "used_slots": 0,
        "gpu": other.get("gpu"),
        "vram": vram,
        "jobs": list(held),
        "processes": list(other.get("processes") or ()),
        "missing": bool(other.get("missing")),
        "was": other.get("name"),
        "gpu_uuid": other.get("gpu_uuid"),
    }


BLOCKS = " ▁▂▃▄▅▆▇█"

# (text, style) pieces, joined into one line of Content; styles are theme $variables.
Piece = tuple[str, str]


def short_model(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB`` -> ``A100-SXM4-80GB`` (the vendor is the same on every GPU;
    so is "Simulated ", which the header says: narrow rows showed "Simulat…" for every
    GPU, an H100 and an L4 alike)."""
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "Simulated "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def graph_lines(values: Iterable[float | None], width: int, height: int) -> list[str]:
    """A bar graph of ``values`` (fractions 0..1), newest at the right, top line first.

    One value per cell: with more values than ``width`` the oldest are dropped; with fewer
    the graph is right-aligned (blank on the left). ``None`` (unknown) is a blank column.
    """
    if width <= 0 or height <= 0:
        return [""] * max(height, 0)
    points = list(values)[-width:]
    columns: list[str] = []
    for value in points:
        if value is None:
            columns.append(" " * height)
            continue
        eighths = round(max(0.0, min(1.0, value)) * height * 8)
        column = "".join(BLOCKS[max(0, min(8, eighths - row * 8))] for row in range(height))
        columns.append(column)  # bottom row first
    pad = width - len(columns)
    lines = []
    for row in range(height - 1, -1, -1):
        lines.append(" " * pad + "".join(col[row] for col in columns))
    return lines


def _fit(text: str, width: int) -> str:
    """Pad or cut ``text`` to exactly ``width`` cells (with an ellipsis when cut), counted
    in terminal columns: a name of wide characters, cut by ``len``, pushed the row's
    POWER and SLOTS off the screen."""
    if width <= 0:
        return ""
    cut = cut_to_width(text, width)
    if cell_width(cut) > width:  # (one column: no room for a character and the "…")
        cut = "…"
    return pad_to_width(cut, width)


def _problem_then_holders(problem: str, holders: str, width: int) -> str:
    """``draining (Fan 2 be… · 13 gsvc``: why a GPU is out of service, cut so that the jobs
    still there (``holders``) fit beside it: its reason first, then its state's word
    (``drain… · 13 gsvc``); where even that leaves no room, the holders are cut after
    half of ``width``."""
    full = f"{problem} · {holders}"
    if cell_width(full) <= width:
        return full
    word = problem.split(" (", 1)[0]
    room = width - cell_width(holders) - 3
    if room >= cell_width(word) + 4:  # (the word and a little of its reason)
        return f"{cut_to_width(problem, room)} · {holders}"
    if room >= min(cell_width(word), 5):
        return f"{cut_to_width(word, room)} · {holders}"
    return f"{cut_to_width(word, max(1, width // 2))} · {holders}"


POWER_MIN_WIDTH = 72
"""Below this content width the rows leave out POWER: at 60 columns the bar had no room
for its USED/TOTAL figures, and the rows view (the one chosen there) showed no memory
figure at all (tester h54)."""


@dataclass(frozen=True)
class RowLayout:
    """Column widths of the one-line (``row``) density at a given content width."""

    name: int
    model: int
    bar: int
    power_limit: bool
    stats: int
    spark: int
    job: int = 0
    power: bool = True  # (left out below POWER_MIN_WIDTH: the memory figures come first)

    @classmethod
    def for_width(cls, width: int, name_width: int = 4) -> RowLayout:
        """The widths that fit ``width`` cells (the memory bar takes what is left)."""
        power_limit = width >= 100
        power = width >= POWER_MIN_WIDTH
        bar = 10 if width >= 120 else 5
        spark = min(40, width // 5) if width >= 110 else 0
        # "● " name " " model " " "100% " bar "  " "85°C" "  " power "  " slots " "
        fixed = 2 + name_width + 1 + 1 + 5 + bar + 2 + 4 + 2 + 5 + 1
        if power:
            fixed += (8 if power_limit else 5) + 2
        memory_min = 24
        room = width - fixed - memory_min - (spark + 1 if spark else 0)
        # The job holding the GPU gets a column once the model has 8 cells (" " + job).
        job = max(0, min(24, room - 8 - 1)) if room >= 8 + 1 + 6 else 0
        model = max(8, min(24 if width >= 100 else 14, room - (job + 1 if job else 0)))
        stats = fixed + model + (job + 1 if job else 0)
        return cls(name_width, model, bar, power_limit, stats, spark, job, power)


class GpuPanel(Vertical):
    """One GPU domain of the dashboard.

    Feed it with :meth:`update_domain` on every sample; it keeps the last domain and
    history and redraws on resize, density or graph-height changes.
    """

    class RowWidthChanged(Message):
        """In the ``row`` density, the panel's content width changed (redraw the header)."""

        def __init__(self, width: int, name_width: int) -> None:
            super().__init__()
            self.width = width
            """Content width of the panel, in cells."""
            self.name_width = name_width
            """Width of the domain-name column."""

    DEFAULT_CSS = """
    GpuPanel {
        height: auto;
        padding: 0 1;
        & > #stats { height: 1; }
        & > #jobs { height: 1; }
        & > #graphs { height: auto; }
        &.-full {
            border: round $primary 35%;
            border-title-color: $foreground;
            border-title-style: bold;
            &.-warn { border: round $warning 70%; }
            &.-problem { border: round $error; }
        }
        &.-compact {
            background: $surface;
            & > #graphs { display: none; }
        }
        &.-row {
            layout: horizontal;
            height: 1;
            & > #stats { width: auto; }
            & > #jobs { display: none; }
            & > MemoryBar { width: 1fr; }
            & > #graphs { width: auto; height: 1; padding-left: 1; }
            &.-no-spark > #graphs { display: none; }
            &:odd { background: $surface; }
        }
    }
    """

    density: reactive[str] = reactive("full")
    """``full``, ``compact`` or ``row``."""
    graph_height: reactive[int] = reactive(1)
    """Lines per history graph in the ``full`` density."""

    DEFAULT_CLASSES = "-full"

    # The colour of each service state (see :meth:`health` and :meth:`title`).
    _STATE_STYLE: ClassVar[dict[str, str]] = {
        "in_service": "$text-success",
        "draining": "$text-warning",
        "quarantined": "$text-error",
        NO_DOMAIN: "$text-muted",
    }

    def __init__(self, domain_name: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.domain_name = domain_name
        self.domain: dict[str, Any] = {}
        self.history: list[tuple[float, int | None, int | None]] = []
        self.holders: list[tuple[int, str]] = []
        self.name_width = 4
        self._row_width: tuple[int, int] | None = None
        self._drawn_shape: tuple[str, int, int, int] | None = None
        self._shown: dict[str, str] = {}  # widget id -> markup last shown

    def compose(self) -> ComposeResult:
        yield Static(id="stats")
        yield MemoryBar()
        yield Static(id="jobs")
        yield UsageGraphs(id="graphs")

    def on_mount(self) -> None:
        self._redraw()

    def on_resize(self) -> None:
        self._redraw()

    def watch_density(self, density: str) -> None:
        for item in DENSITIES:
            self.set_class(item == density, f"-{item}")
        self._redraw()

    def watch_graph_height(self) -> None:
        self._redraw()

    # -- data -----------------------------------------------------------------------------

    def update_domain(
        self,
        domain: Mapping[str, Any],
        history: Iterable[tuple[float, int | None, int | None]] = (),
        name_width: int = 4,
        holders: Iterable[tuple[int, str]] = (),
    ) -> None:
        """Show one domain of a ``/gpus`` view, its history points (at, util, mem) and the
        jobs holding its slots (id, name)."""
        self.domain = dict(domain)
        self.history = list(history)
        self.holders = list(holders)
        self.name_width = name_width
        self._redraw()

    @property
    def gpu(self) -> dict[str, Any]:
        """The domain's reading (empty when there is none)."""
        return self.domain.get("gpu") or {}

    @property
    def model(self) -> str:
        """The GPU's model name as NVML reports it; for one the driver no longer lists,
        the domain it was and its UUID (it said "unknown GPU")."""
        if self.domain.get("missing") and not self.gpu:
            was, uuid = self.domain.get("was"), self.domain.get("gpu_uuid")
            known = ", ".join(str(part) for part in (was, uuid) if part)
            return f"was {known}" if known else "no longer listed"
        return str(self.gpu.get("name") or "no reading yet")

    def health(self) -> tuple[str, str, str]:
        """``(mark, word, style)``: ``● ok``, ``◐ draining``, ``✖ LOST`` and so on."""
        gpu = self.domain.get("gpu")
        state = self.domain.get("state", "in_service")
        if self.domain.get("missing"):
            return "✖", "MISSING", "$text-error"
        if gpu is None:
            return "?", "no reading", "$text-warning"
        if gpu.get("lost"):
            return "✖", "LOST", "$text-error"
        if gpu.get("error"):
            return "✖", "error", "$text-error"
        if state == NO_DOMAIN:
            return "○", "no domain", "$text-muted"
        if state == "in_service" and self.domain.get("health") == "degraded":
            # (it said "● ok" while `domain list` said degraded: tester h124)
            return "◐", "degraded", "$text-warning"
        if state == "in_service":
            return "●", "ok", "$text-success"
        mark = "◐" if state == "draining" else "✖"
        return mark, state, self._STATE_STYLE.get(state, "$text-error")

    def title(self) -> Content:
        """``gpu1 · NVIDIA A100-SXM4-80GB`` plus the state and any error."""
        pieces: list[Piece] = [(f"{self.domain_name} · {self.model}", "")]
        state = self.domain.get("state", "in_service")
        if self.domain.get("missing"):
            jobs = ", ".join(map(str, self.domain.get("jobs") or ()))
            pieces.append(
                (f" · not found by the driver; still running there: job {jobs}", "$text-error")
            )
        elif state == NO_DOMAIN:
            pieces.append((" · no domain: not managed", "$text-muted"))
        elif state == "in_service" and self.domain.get("health") == "degraded":
            pieces.append((" · degraded", "$text-warning bold"))
            # (a domain event says its reason; a /gpus view its last error)
            why = self.domain.get("reason") or self.domain.get("last_error")
            if why:
                pieces.append((f" ({why})", "$text-muted"))
        elif state != "in_service":
            pieces.append((f" · {state}", f"{self._STATE_STYLE.get(state, '$text-error')} bold"))
            reason = self.domain.get("state_reason")
            if reason:
                pieces.append((f" ({reason})", "$text-muted"))
            drained = self.domain.get("drain_reason")
            if state == "quarantined" and drained is not None:
                pieces.append((f" · drained under it ({drained})", "$text-warning"))
        # (not again where the quarantine's reason said it: "quarantined (GPU is lost:
        # fell off the bus) · LOST · GPU is lost: fell off the bus")
        said = "".join(text for text, _style in pieces[1:]).lower()
        if self.gpu.get("lost") and "lost" not in said:
            pieces.append((" · LOST", "$text-error bold"))
        if self.gpu.get("error") and str(self.gpu["error"]).lower() not in said:
            pieces.append((f" · {self.gpu['error']}", "$text-error"))
        return Content.assemble(*pieces)

    # -- drawing --------------------------------------------------------------------------

    def _redraw(self) -> None:
        if not self.is_mounted or not self.domain:
            return
        width = self.content_size.width
        if width <= 0:
            return
        mark, _word, _style = self.health()
        self.set_class(mark == "✖", "-problem")
        self.set_class(mark in ("◐", "?"), "-warn")
        bar = self.query_one(MemoryBar)
        bar.legend = self.density != "row"
        bar.update_vram(self.domain.get("vram"), self.stale)
        stats = self.query_one("#stats", Static)
        jobs = self.query_one("#jobs", Static)
        graphs = self.query_one("#graphs", UsageGraphs)
        # A new sample changes text, not sizes: skip the (costly) screen re-layout unless
        # the panel's shape changed since the last draw.
        shape = (self.density, self.graph_height, width, self.name_width)
        relayout = shape != self._drawn_shape
        self._drawn_shape = shape
        if self.density == "row":
            if (width, self.name_width) != self._row_width:
                self._row_width = (width, self.name_width)
                self.post_message(self.RowWidthChanged(width, self.name_width))
            layout = RowLayout.for_width(width, self.name_width)
            stats.styles.width = layout.stats
            self._show(stats, self._row_stats(layout), layout=relayout)
            # (A class, not an inline ``display``: inline styles outlive the density.)
            self.set_class(not layout.spark, "-no-spark")
            if layout.spark:
                graphs.styles.width = layout.spark + 1
                graphs.show(self._graph("util", layout.spark, 1, label=False), layout=relayout)
            return
        if relayout:
            # Leaving the row density: its inline widths must not size the other layouts.
            stats.styles.width = None
            graphs.styles.width = None
            self.remove_class("-no-spark")
        if self.density == "full":
            title = self.title()
            if title.markup != self.border_title:
                self.border_title = title
            self._show(stats, self._full_stats(width), layout=relayout)
            self._show(jobs, self._jobs_line(width), layout=relayout)
            height = max(1, self.graph_height)
            graphs.show(
                self._graph("util", width, height) + self._graph("mem", width, height),
                layout=relayout,
            )
        else:
            if self.border_title:
                self.border_title = None
            self._show(stats, self._compact_stats(width), layout=relayout)
            self._show(jobs, self._jobs_line(width), layout=relayout)

    def _show(self, widget: Static, content: Content, layout: bool = True) -> None:
        """Update ``widget`` only if what it shows changed: an idle GPU's sample repeats
        the last one, and skipping those repaints is most of the dashboard's idle cost."""
        key = content.markup
        if not layout and self._shown.get(widget.id or "") == key:
            return
        self._shown[widget.id or ""] = key
        widget.update(content, layout=layout)

    def holder_text(self, width: int, word: str = "job ") -> str:
        """``job 10 train-a · job 12 eval`` cut to ``width`` cells; empty when none (in
        the rows' JOB column, without the word: ``10 train-a``)."""
        text = " · ".join(
            f"{word}{job_id} {_printable(name)}".rstrip() for job_id, name in self.holders
        )
        return _fit(text, width).rstrip() if text else ""

    def problem(self) -> str:
        """What the title says after the model (``quarantined (ECC errors)``); empty when
        all is well. The jobs line and the rows' JOB column say it where no title does."""
        head = f"{self.domain_name} · {self.model}"
        return self.title().plain[len(head) :].removeprefix(" · ")

    def _jobs_line(self, width: int) -> Content:
        # Compact has no title; a full panel's is cut at its width: the reason a GPU is
        # out of service was lost from both (only its mark was left: tester h124).
        problem = self.problem()
        if self.density == "full" and len(self.title().plain) <= width:
            problem = ""
        text = self.holder_text(width)
        if problem:
            _mark, _word, style = self.health()
            if not text:
                return Content.styled(problem, style).truncate(width, ellipsis=True)
            said = _problem_then_holders(problem, text, width)
            cut = said[: len(said) - len(text) - 3]  # (the reason, as cut to fit)
            line = Content.assemble((cut, style), " · ", (text, "$text-accent"))
            return line.truncate(width, ellipsis=True)
        if not text:
            return Content.styled("no job", "$text-muted")
        return Content.styled(text, "$text-accent")

    @property
    def stale(self) -> bool:
        """Its last reads failed: the figures are the last good read's, not the GPU's now
        (they read as live; the CLI marks them ``70%?``, and so does the panel)."""
        return bool(self.domain.get("failures")) and bool(self.domain.get("gpu"))

    def _util_pieces(self, bar_width: int) -> list[Piece]:
        util = self.gpu.get("utilization")
        if util is None:
            return [("  ? ", "$text-muted"), (" ", ""), (BAR_CHAR * bar_width, "$memory-free")]
        filled = round(util / 100 * bar_width)
        if util > 0:
            filled = max(1, filled)
        if self.stale:  # (as wide as a live figure: the bars of the panels stay aligned)
            shown = f"{util:>2}%?" if util < 100 else f"{util}?"
            return [
                (shown, "$text-muted"),
                (" ", ""),
                (BAR_CHAR * filled, "$text-muted"),
                (BAR_CHAR * (bar_width - filled), "$memory-free"),
            ]
        return [
            (f"{util:>3}%", "bold"),
            (" ", ""),
            (BAR_CHAR * filled, "$text-secondary"),
            (BAR_CHAR * (bar_width - filled), "$memory-free"),
        ]

    def _temp_piece(self) -> Piece:
        temp = self.gpu.get("temperature")
        if temp is None:
            return " ?°C", "$text-muted"
        if self.stale:
            return f"{temp:>2}C?", "$text-muted"
        style = "$text-error bold" if temp >= 85 else "$text-warning" if temp >= 75 else ""
        return f"{temp:>2}°C", style

    def _power_piece(self, with_limit: bool, unit_space: bool = False) -> Piece:
        """Power draw (and limit), right-aligned to the widest value the limit allows.

        The fixed width keeps the bars of neighbouring panels the same length.
        """
        watts = self.gpu.get("power_watts")
        limit = self.gpu.get("power_limit_watts")
        unit = " W" if unit_space else "W"
        if with_limit and limit:
            widest = len(f"{limit:.0f}/{limit:.0f}{unit}")
        else:
            widest = len(f"{limit or 999:.0f}{unit}")
        if watts is None:
            return "?".rjust(widest - len(unit)) + unit, "$text-muted"
        style = "$text-warning" if limit and watts >= 0.9 * limit else ""
        if self.stale:
            style = "$text-muted"
        if with_limit and limit:
            return f"{watts:.0f}/{limit:.0f}{unit}".rjust(widest), style
        return f"{watts:.0f}{unit}".rjust(widest), style

    def _slots_piece(self) -> Piece:
        if self.domain.get("state") == NO_DOMAIN:
            return "-", "$text-muted"  # (no slots: the engine starts nothing there)
        used, slots = self.domain.get("used_slots", 0), self.domain.get("slots", 0)
        return f"{used}/{slots}", "$text-warning bold" if slots and used >= slots else ""

    def _full_stats(self, width: int) -> Content:
        mark, word, health_style = self.health()
        health: list[Piece] = [(f"{mark} {word}", health_style)]
        temp, power, slots = self._temp_piece(), self._power_piece(True, True), self._slots_piece()
        wide: list[Piece] = [
            ("   temp ", "$text-muted"),
            temp,
            ("   power ", "$text-muted"),
            power,
            ("   slots ", "$text-muted"),
            slots,
        ]
        narrow: list[Piece] = [
            ("  ", ""),
            temp,
            ("  ", ""),
            self._power_piece(True),
            ("  slots ", "$text-muted"),
            slots,
        ]
        tiny: list[Piece] = [(" ", ""), temp, (" ", ""), self._power_piece(False), (" ", ""), slots]
        for lead, rest, bar_min in (("util ", wide, 10), ("", narrow, 6), ("", tiny, 3)):
            fixed = len(lead) + 5 + sum(len(t) for t, _ in rest) + 2 + len(mark) + 1 + len(word)
            bar_width = min(24, width - fixed)
            if bar_width >= bar_min:
                break
        bar_width = max(1, bar_width)
        pieces: list[Piece] = [(lead, "$text-muted"), *self._util_pieces(bar_width), *rest]
        used = sum(len(t) for t, _ in pieces)
        gap = width - used - len(mark) - 1 - len(word)
        if gap < 1:  # not even room for the health word: the mark alone
            health = [(mark, health_style)]
            gap = width - used - len(mark)
        return Content.assemble(*pieces, (" " * max(1, gap), ""), *health)

    def _compact_stats(self, width: int) -> Content:
        mark, _word, health_style = self.health()
        tail: list[Piece] = [
            ("  ", ""),
            self._temp_piece(),
            ("  ", ""),
            self._power_piece(width >= 70),
            ("  slots " if width >= 70 else "  ", "$text-muted"),
            self._slots_piece(),
        ]
        tail_len = sum(len(t) for t, _ in tail)
        bar_width = 10 if width >= 90 else 5
        name = f"{mark} {self.domain_name} "
        model_width = width - len(name) - (5 + bar_width) - tail_len - 1
        return Content.assemble(
            (mark, health_style),
            (f" {self.domain_name} ", "bold"),
            (_fit(short_model(self.model), model_width), ""),
            (" ", ""),
            *self._util_pieces(bar_width),
            *tail,
        )

    def _row_stats(self, layout: RowLayout) -> Content:
        mark, _word, health_style = self.health()
        return Content.assemble(
            (mark, health_style),
            (" ", ""),
            (self.domain_name.ljust(layout.name), "bold"),
            (" ", ""),
            *self._row_model_and_job(layout, health_style),
            (" ", ""),
            *self._util_pieces(layout.bar),
            ("  ", ""),
            self._temp_piece(),
            *(
                [
                    ("  ", ""),
                    _rjust(self._power_piece(layout.power_limit), 8 if layout.power_limit else 5),
                ]
                if layout.power
                else []
            ),
            ("  ", ""),
            _rjust(self._slots_piece(), 5),
            (" ", ""),
        )

    def _row_model_and_job(self, layout: RowLayout, health_style: str) -> list[Piece]:
        problem = self.problem()
        if not problem:
            return [(_fit(short_model(self.model), layout.model), ""), *self._row_job(layout)]
        # Why it is out of service, over the MODEL and JOB columns (the mark alone said
        # nothing: tester h124), then whose jobs are still there.
        width = layout.model + (layout.job + 1 if layout.job else 0)
        holders = self.holder_text(width, word="")
        if holders:
            # The reason cut first, so whose jobs are there stays in sight (a long drain
            # reason hid that job 13 still ran there: tester h142).
            said = _problem_then_holders(problem, holders, width)
            return [(_fit(said, width), health_style)]
        return [(_fit(problem, width), health_style)]

    def _row_job(self, layout: RowLayout) -> list[Piece]:
        if not layout.job:
            return []
        text = self.holder_text(layout.job, word="")
        if not text:
            return [(" ", ""), (_fit("-", layout.job), "$text-muted")]
        return [(" ", ""), (_fit(text, layout.job), "$text-accent")]

    @staticmethod
    def row_header(width: int, name_width: int = 4) -> Content:
        """The header line matching the ``row`` density's columns at ``width``."""
        layout = RowLayout.for_width(width, name_width)
        stats = (
            "  "
            + "GPU".ljust(layout.name)
            + " "
            + "MODEL".ljust(layout.model)
            + (" " + "JOB".ljust(layout.job) if layout.job else "")
            + " "
            + "UTIL".ljust(5 + layout.bar)
            + "  "
            + "TEMP"
            + ("  " + "POWER".rjust(8 if layout.power_limit else 5) if layout.power else "")
            + "  "
            + "SLOTS"
            + " "
        )
        memory_width = width - layout.stats - (layout.spark + 1 if layout.spark else 0)
        memory = "MEMORY own·unreg·unattr·free"
        if len(memory) + 11 > memory_width:
            memory = "MEMORY"
        if len(memory) + 11 <= memory_width:
            memory = memory.ljust(memory_width - 10) + "USED/TOTAL"
        memory = _fit(memory, memory_width)
        history = (" " + "UTIL HISTORY".ljust(layout.spark)) if layout.spark else ""
        return Content.styled(stats + memory + history, "$text-muted bold")

    def _graph(
        self, which: str, width: int, height: int, *, label: bool = True
    ) -> tuple[GraphLine, ...]:
        total = self.gpu.get("memory_total") or (self.domain.get("vram") or {}).get("total")
        if which == "util":
            values = [None if u is None else u / 100 for _at, u, _m in self.history]
        else:
            values = [None if m is None or not total else m / total for _at, _u, m in self.history]
        lead = 5 if label else 0
        lines = graph_lines(values, width - lead, height)
        # Two rows or more: the top row says what the graph's top is (100 %, or the GPU's
        # memory), the next what it is; a graph without a scale read as any figure.
        heads = ["util" if which == "util" else "mem"]
        if len(lines) >= 2:
            top = "100%" if which == "util" else (f"{total / 2**30:.0f}G" if total else "")
            heads.insert(0, top)
        out: list[GraphLine] = []
        for n, line in enumerate(lines):
            head = ""
            if label:
                head = (heads[n] if n < len(heads) else "").ljust(lead)[:lead]
            out.append(GraphLine(head, line, which))
        return tuple(out)


def _printable(text: str) -> str:
    """A name on one line: control characters (newlines, escapes) become spaces."""
    return "".join(c if c.isprintable() else " " for c in text)


def _rjust(piece: Piece, width: int) -> Piece:
    return piece[0].rjust(width), piece[1]
