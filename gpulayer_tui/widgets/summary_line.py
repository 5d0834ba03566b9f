"""The dashboard's one-line summary: jobs, unregistered VRAM, GPUs (and the no-GPU notice)."""

from __future__ import annotations

from collections.abc import Mapping

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

from ..formatting import GIB
from ..wire import GpusJSON

Piece = tuple[str, str]


class SummaryLine(Vertical):
    """``3 running · 2 queued · 1 failed today · unregistered VRAM 18.0 GiB · 2 GPUs``
    (and ``· 1 idle`` after ``failed today`` while running jobs are warned idle).

    Under it, only when the engine has something to say about capacity (``/gpus``
    ``message``), a notice: with 0 GPUs a clear CPU-only notice with the reason (e.g. no
    NVIDIA driver) and that CPU jobs still work; with GPUs, the message as a warning.
    """

    DEFAULT_CSS = """
    SummaryLine {
        height: auto;
        & > #counts { height: 1; padding: 0 1; background: $surface; }
        & > #notice {
            display: none;
            height: auto;
            margin: 1 1 0 1;
            padding: 0 1;
            border: round $warning;
            border-title-color: $text-warning;
            border-title-style: bold;
        }
        &.-notice > #notice { display: block; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.summary: dict[str, int] = {}
        self.gpu_state: GpusJSON | None = None
        self._shown_counts: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(self.counts(), id="counts")
        yield Static(id="notice")

    def show(self, summary: Mapping[str, int], gpu_state: GpusJSON | None) -> None:
        """Redraw from a job summary (:meth:`JobStore.summary`) and a ``/gpus`` view."""
        self.summary = dict(summary)
        self.gpu_state = gpu_state
        counts = self.counts(self.size.width - 2 if self.size.width else None)
        if counts.markup != self._shown_counts:  # unchanged samples cost no repaint
            self._shown_counts = counts.markup
            self.query_one("#counts", Static).update(counts, layout=False)  # one line
        message = self.gpu_state["message"] if self.gpu_state else None
        notice = self.query_one("#notice", Static)
        self.set_class(bool(message), "-notice")
        if message:
            title = "CPU-only" if self.gpu_count == 0 else "capacity"
            if notice.border_title != title:
                notice.border_title = title
            notice.update(self.notice())

    @property
    def gpu_count(self) -> int:
        """GPU domains in the last ``/gpus`` view."""
        domains = self.gpu_state["domains"] if self.gpu_state else []
        return sum(1 for d in domains if d.get("gpu_index") is not None)

    def on_resize(self) -> None:
        if self.summary or self.gpu_state is not None:
            self.show(self.summary, self.gpu_state)

    def counts(self, width: int | None = None) -> Content:
        """The summary line itself; where it is wider than ``width`` cells, in short words
        (at 60 columns the line ended "· unregistered VRAM", its figure cut off)."""
        line = self._counts(short=False)
        for short, refused, no_unreg in (
            (True, True, False),
            (True, False, False),
            (True, False, True),
        ):
            if width is None or line.cell_length <= width:
                break
            line = self._counts(short, refused, no_unreg)
        if width is not None and line.cell_length > width:
            # (cut mid-phrase, "4 GPUs (2 draining, 1", it read as whole: tester h142)
            line = line.truncate(width, ellipsis=True)
        return line

    def _counts(self, short: bool, refused_said: bool = True, no_unreg: bool = False) -> Content:
        running = self.summary.get("running", 0)
        queued = self.summary.get("queued", 0)
        failed = self.summary.get("failed_today", 0)
        sep: Piece = (" · ", "$text-muted")
        pieces: list[Piece] = [
            (str(running), "$text-success bold" if running else "bold"),
            (" running", "$text-muted"),
            sep,
            (str(queued), "$text-warning bold" if queued else "bold"),
            (" queued", "$text-muted"),
            sep,
            (str(failed), "$text-error bold" if failed else "bold"),
            (" failed" if short else " failed today", "$text-muted"),
        ]
        refused = self.summary.get("refused_today", 0)
        if refused and refused_said:  # (failed too, never having run: over capacity...)
            pieces.append((f" (+{refused} refused)", "$text-muted"))
        idle = self.summary.get("idle", 0)
        if idle:  # (running jobs warned for holding their GPUs idle)
            pieces += [sep, (str(idle), "$text-warning bold"), (" idle", "$text-muted")]
        state = self.gpu_state
        if state is None:
            pieces += [sep, ("waiting for the first GPU sample…", "$text-muted")]
            return Content.assemble(*pieces)
        unregistered = int(state.get("unregistered_total") or 0)
        gpus = self.gpu_count
        if unregistered or not no_unreg:  # (none, and no room: it goes first)
            pieces += [
                sep,
                ("unreg " if short else "unregistered VRAM ", "$text-muted"),
                (f"{unregistered / GIB:.1f} GiB", "$text-error bold" if unregistered else "bold"),
            ]
        pieces += [sep, (f"{gpus} GPU{'' if gpus == 1 else 's'}", "bold")]
        # (a quarantined or draining GPU was said only in its panel's title, cut at 120
        # columns: "quarantined (GPU is lost) · L…", the line said "2 GPUs": tester h107)
        unwell: dict[str, int] = {}
        for domain in state.get("domains") or ():
            where = str(domain.get("state") or "")
            if domain.get("gpu_index") is not None and where and where != "in_service":
                unwell[where] = unwell.get(where, 0) + 1
        if unwell:
            said = ", ".join(f"{n} {where}" for where, n in sorted(unwell.items()))
            pieces.append((f" ({said})", "$text-warning"))
        # (less a missing GPU a job still runs on: listed there too, it was counted both
        # "without a domain" and "missing": tester h118)
        others = sum(1 for g in state.get("gpus_without_domain") or () if not g.get("missing"))
        if others:  # (left out by the config: shown, never scheduled on)
            said = f" (+{others})" if short else f" (+{others} without a domain)"
            pieces.append((said, "$text-muted"))
        here = {str(d.get("name")) for d in state.get("domains") or ()}
        missing = [
            # (its old name is another GPU's now: "2 missing: gpu0, gpu1" was said of two
            # GPUs at work; the driver numbers the GPUs it lists: tester h115)
            f"{name}'s old GPU {_short_uuid(str(g.get('gpu_uuid') or '?'))}"
            if name in here
            else name
            for g in state.get("missing_gpus") or ()
            for name in (str(g.get("name", "?")),)
        ]
        if missing:  # (had here, not listed by the driver now: jobs needing them wait)
            said, them = ", ".join(missing), "it" if len(missing) == 1 else "them"
            said = f" ({len(missing)} missing: {said}; jobs needing {them} wait)"
            pieces.append((said, "$text-warning"))
        return Content.assemble(*pieces)

    def notice(self) -> Content:
        """The capacity notice (empty when the engine has none)."""
        message = str(self.gpu_state["message"] or "") if self.gpu_state else ""
        if not message:
            return Content()
        if self.gpu_count == 0:
            return Content.assemble(
                (message, ""),
                ("\nJobs that need no GPU run in the CPU pool below; ", "$text-muted"),
                ("n", "$text-accent bold"),
                (" submits one.", "$text-muted"),
            )
        return Content.styled(message, "$text-warning")


def _short_uuid(uuid: str) -> str:
    """``GPU-5f3c09a1…``: a UUID cut to what tells GPUs apart on a line."""
    return uuid if len(uuid) <= 13 else f"{uuid[:12]}…"
