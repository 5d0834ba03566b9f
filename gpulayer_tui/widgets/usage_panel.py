"""What a GPU job used of its GPUs: the summary lines and, per GPU, VRAM and utilisation
sparklines over the job's life (issue 17).

Two densities: *collapsed*, one line without a border (peak VRAM, mean utilisation,
energy), for small terminals; *expanded*, a bordered box with :func:`usage_lines` (the
same lines the CLI's ``status`` prints) beside (or, when narrow, above) one pair of
sparklines per GPU. The screen chooses the density from its height and ``u`` toggles it.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.events import Resize
from textual.reactive import reactive
from textual.widgets import Label, Static

from ..formatting import duration, gib, plural, unobserved_note, usage_lines
from ..wire import UsageJSON, UsageSeriesJSON, UsageSummaryJSON
from .field_list import FieldList
from .level_line import LevelLine

STACK_BELOW = 150
"""Content widths under this put the plots under the text instead of beside it."""

_LINE_STYLES = {"warning": "$text-warning", "advice": "$text-accent"}


def collapsed_line(summary: UsageSummaryJSON | None, active: bool) -> Content:
    """The one-line form: ``GPU usage  peak 20.0 GiB · util 45% · 12.3 Wh``."""
    head = Content.styled("GPU usage  ", "bold")
    if summary is None:
        text = "none seen yet" if active else "none recorded"
        return Content.assemble(head, (text, "$text-muted"))
    if not summary.get("samples") or summary["energy_wh"] is None:
        # (it said "peak 0.0 GiB · 0.000 Wh" of a job whose GPUs were never read: h180)
        text = "no sample yet" if active else "not read: it ended before its GPUs were sampled"
        return Content.assemble(head, (text, "$text-muted"))
    util = summary.get("util_mean")
    sep = (" · ", "$text-muted")
    pieces: list[Content | tuple[str, str] | str] = [
        head,
        f"peak {gib(summary['peak_vram'])} GiB",
        sep,
        "util ?" if util is None else f"util {util:g}%",
        sep,
        f"{summary['energy_wh']:.3f} Wh",
    ]
    if summary.get("idle_warning"):
        pieces += [sep, ("idle warning", "$text-warning bold")]
    elif summary.get("advice"):
        pieces += [sep, ("advice", "$text-accent")]
    return Content.assemble(*pieces)


def summary_rows(
    summary: UsageSummaryJSON | None, active: bool = False
) -> list[tuple[str, Content]]:
    """The expanded text: one ``(label, text)`` row per :func:`usage_lines` entry (the
    engine's words, shown as text: never markup)."""
    if summary is None:
        return []
    return [
        (label, Content.styled(text, _LINE_STYLES.get(label, "")))
        for label, text in usage_lines(summary, active)
    ]


def summary_heading(summary: UsageSummaryJSON | None, active: bool) -> Content | None:
    """What the expanded text says when there is nothing to show yet."""
    if summary is not None:
        return None
    return Content.styled(
        "no GPU usage seen yet" if active else "no GPU usage recorded", "$text-muted"
    )


def _values(values: list[int | None] | list[int]) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)


def vram_figure(series: UsageSeriesJSON) -> str:
    """The text beside a GPU's VRAM sparkline: its peak."""
    peak = max(series["vram_mib"], default=0)
    return f"peak {peak / 1024:.1f} GiB"


def util_figure(series: UsageSeriesJSON) -> str:
    """The text beside a GPU's utilisation sparkline: mean and top."""
    known = [v for v in series["util"] if v is not None]
    if not known:
        return "util ?"
    return f"mean {sum(known) / len(known):.0f}% max {max(known)}%"


class UsagePanel(VerticalScroll, can_focus=False):
    """A GPU job's usage: feed it with :meth:`show` (the whole job's summary, then the
    ``/usage`` answer as it comes)."""

    DEFAULT_CSS = """
    UsagePanel {
        height: auto;
        max-height: 45%;
        padding: 0 1;
        background: $surface;
        & > #usage-line { height: 1; }
        & > #usage-body { height: auto; display: none; }
        &.-expanded {
            border: round $panel-lighten-2;
            border-title-color: $foreground;
            border-subtitle-color: $text-muted;
        }
        &.-expanded > #usage-line { display: none; }
        &.-expanded > #usage-body { display: block; }
        &.-stacked #usage-body { layout: vertical; }
        #usage-text { width: 1fr; height: auto; }
        #usage-plots { width: 1fr; height: auto; }
        &.-stacked #usage-plots { margin-top: 1; }
        .usage-plot { height: 1; }
        .usage-plot-label { width: 12; color: $text-muted; }
        .usage-plot-figure { width: 24; padding-left: 1; color: $text-muted; }
        LevelLine.-vram { color: $memory-owned; }
        LevelLine.-util { color: $text-success; }
    }
    """

    expanded: reactive[bool] = reactive(False)
    """Whether the summary lines and plots show (else one line)."""

    BORDER_TITLE: ClassVar[str] = "GPU usage"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.usage: UsageJSON | None = None
        self.summary: UsageSummaryJSON | None = None
        self.active = True
        # Each GPU's plots and figures, kept here rather than queried: a Horizontal mounts
        # its children a moment after it is mounted itself, and a read that came in between
        # found no plot to update (the reads then stopped).
        self._plots: dict[int, _GpuPlots] = {}

    def compose(self) -> ComposeResult:
        yield Static(collapsed_line(None, True), id="usage-line")
        with Horizontal(id="usage-body"):
            # (each line's text wrapped beside its label: a long advice went on under it,
            # at the panel's left edge)
            text = FieldList((), id="usage-text")
            text.set_rows((), heading=summary_heading(None, True))
            yield text
            yield Vertical(id="usage-plots")

    def watch_expanded(self, expanded: bool) -> None:
        self.set_class(expanded, "-expanded")

    def on_resize(self, event: Resize) -> None:
        self.set_class(event.size.width < STACK_BELOW, "-stacked")

    @property
    def points(self) -> int:
        """Points in the longest GPU series shown (0 before any)."""
        return max((len(s["t"]) for s in self.usage["series"]), default=0) if self.usage else 0

    def show_summary(self, summary: UsageSummaryJSON | None, active: bool) -> None:
        """Redraw the text from a summary (the whole job's ``usage``)."""
        self.summary = summary
        self.active = active
        self.query_one("#usage-line", Static).update(collapsed_line(summary, active))
        self.query_one("#usage-text", FieldList).set_rows(
            summary_rows(summary, active), heading=summary_heading(summary, active)
        )
        self._update_subtitle()

    def show(self, usage: UsageJSON, active: bool) -> None:
        """Redraw from a ``GET /v1/jobs/ID/usage`` answer (``active``: the job runs on)."""
        self.usage = usage
        self.show_summary(usage.get("summary"), active)
        series = usage.get("series") or []
        plots = self.query_one("#usage-plots", Vertical)
        gpus = [s["gpu"] for s in series]
        if gpus != list(self._plots):
            self._plots = {one["gpu"]: _GpuPlots(one) for one in series}
            plots.remove_children()
            plots.mount_all(row for pair in self._plots.values() for row in pair.rows())
            return
        for one in series:
            self._plots[one["gpu"]].update(one)

    def show_lost(self) -> None:
        """Say that the reads get no answer (the next answered read redraws)."""
        self.border_subtitle = f"{plural(self.points, 'point')} · no engine answers · u: fewer"

    def _update_subtitle(self) -> None:
        series = self.usage.get("series") if self.usage else None
        span = max((s["t"][-1] for s in series or [] if s["t"]), default=None)
        # (one point has no span: "1 points over 0s" was said: tester h131)
        over = "" if span is None or self.points < 2 else f" over {duration(span)}"
        state = "live" if self.active else "stored"
        gap = unobserved_note(self.usage) if self.usage else ""
        self.border_subtitle = f"{plural(self.points, 'point')}{over}{gap} · {state} · u: fewer"


class _GpuPlots:
    """One GPU's VRAM and utilisation plots, each with its figure."""

    def __init__(self, series: UsageSeriesJSON) -> None:
        gpu = series["gpu"]
        self.gpu = gpu
        self.vram = LevelLine(_values(series["vram_mib"]), id=f"usage-vram-{gpu}", classes="-vram")
        self.util = LevelLine(
            _values(series["util"]), top=100, id=f"usage-util-{gpu}", classes="-util"
        )
        self.vram_figure = Label(
            vram_figure(series), id=f"usage-vram-figure-{gpu}", classes="usage-plot-figure"
        )
        self.util_figure = Label(
            util_figure(series), id=f"usage-util-figure-{gpu}", classes="usage-plot-figure"
        )

    def rows(self) -> tuple[Horizontal, Horizontal]:
        """The two plot rows to mount (once)."""
        return (
            Horizontal(
                Label(f"GPU #{self.gpu} VRAM", classes="usage-plot-label"),
                self.vram,
                self.vram_figure,
                classes="usage-plot",
            ),
            Horizontal(
                Label("       util", classes="usage-plot-label"),
                self.util,
                self.util_figure,
                classes="usage-plot",
            ),
        )

    def update(self, series: UsageSeriesJSON) -> None:
        """Show a newer read of the same GPU (mounted yet or not)."""
        self.vram.data = _values(series["vram_mib"])
        self.util.data = _values(series["util"])
        self.vram_figure.update(vram_figure(series))
        self.util_figure.update(util_figure(series))
