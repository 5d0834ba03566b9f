"""A GPU's VRAM as one bar split by who holds it, with a line of GiB figures under it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, NamedTuple

from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..formatting import GIB

BAR_CHAR = "█"


class MemoryPart(NamedTuple):
    """One slice of the bar."""

    key: str
    """Component-class suffix (``owned``, ``reserved``, ...)."""
    label: str
    """Legend word."""
    short: str
    """Legend word when space is tight."""
    size: int
    """Bytes."""


COMPACT_FIGURE_MIN = 14
"""The narrowest bar that shows ``used/total`` (10 cells) beside 4 cells of bar."""


def split_cells(sizes: Sequence[float], width: int) -> list[int]:
    """Share ``width`` cells among ``sizes`` in proportion.

    The result always adds up to exactly ``width``; every non-zero size gets at least one
    cell (when ``width`` is smaller than the number of non-zero sizes, the largest ones
    win). When every size is zero, the last one takes the whole width.

    Args:
        sizes: Non-negative amounts, in bar order.
        width: Cells to share (negative counts as zero).

    Returns:
        Cells per size, in the same order.
    """
    width = max(0, width)
    count = len(sizes)
    if count == 0:
        return []
    clean = [max(0.0, float(s)) for s in sizes]
    total = sum(clean)
    if total <= 0:
        return [0] * (count - 1) + [width]
    nonzero = [i for i, s in enumerate(clean) if s > 0]
    if width < len(nonzero):
        cells = [0] * count
        for i in sorted(nonzero, key=lambda i: (-clean[i], i))[:width]:
            cells[i] = 1
        return cells
    ideal = [s / total * width for s in clean]
    cells = [max(1, int(x)) if clean[i] > 0 else 0 for i, x in enumerate(ideal)]
    # Hand out the cells still missing to the most under-served parts, and take back
    # any excess (from the 1-cell minimum) from the most over-served parts with room.
    while (missing := width - sum(cells)) != 0:
        if missing > 0:
            i = max(nonzero, key=lambda i: (ideal[i] - cells[i], -i))
            cells[i] += 1
        else:
            candidates = [i for i in nonzero if cells[i] > 1]
            i = min(candidates, key=lambda i: (ideal[i] - cells[i], i))
            cells[i] -= 1
    return cells


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


LETTERS = {
    "owned": "o",
    "reserved": "r",
    "unregistered": "u",
    "unattributed": "a",
    "others": "x",
    "free": "f",
}
"""Each part's letter in the narrowest legend that still names its parts."""


def _whole_gib(value: int) -> str:
    """GiB to the nearest whole one (a part under one but not none: ``<1``)."""
    gib = value / GIB
    return "<1" if 0 < gib < 0.5 else f"{gib:.0f}"


class MemoryBar(Widget):
    """VRAM split into owned by jobs / reserved / unregistered / unattributed / free.

    The first line is the bar (plus ``used/total`` when there is room); with ``legend``
    the second line gives each part in GiB, each word in its part's colour, e.g.
    ``owned 20.0 · unreg 18.0 · unattr 0.5 · free 41.5 GiB``. Colours come from the
    theme's ``$memory-*`` variables through the component classes below.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "memory-bar--owned",
        "memory-bar--reserved",
        "memory-bar--unregistered",
        "memory-bar--unattributed",
        "memory-bar--others",
        "memory-bar--free",
        "memory-bar--free-label",
        "memory-bar--figure",
        "memory-bar--muted",
    }

    DEFAULT_CSS = """
    MemoryBar {
        height: 2;
        &.-inline { height: 1; }
        & > .memory-bar--owned { color: $memory-owned; }
        & > .memory-bar--reserved { color: $memory-owned 45%; }
        & > .memory-bar--unregistered { color: $memory-unregistered; }
        & > .memory-bar--unattributed { color: $memory-unattributed; }
        & > .memory-bar--others { color: $text-muted; }
        & > .memory-bar--free { color: $memory-free; }
        & > .memory-bar--free-label { color: $text-muted; }
        & > .memory-bar--figure { color: $foreground; text-style: bold; }
        & > .memory-bar--muted { color: $text-muted; }
    }
    """

    legend: reactive[bool] = reactive(True)
    """Show the line of GiB figures under the bar (else a one-line bar)."""

    def __init__(
        self,
        *,
        legend: bool = True,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.set_reactive(MemoryBar.legend, legend)
        self.set_class(not legend, "-inline")
        self._vram: dict[str, int] | None = None
        self._stale = False

    def watch_legend(self, legend: bool) -> None:
        self.set_class(not legend, "-inline")
        self.refresh()

    def update_vram(self, vram: Mapping[str, int] | None, stale: bool = False) -> None:
        """Show a new VRAM account (the ``vram`` dict of a ``/gpus`` domain, or None);
        ``stale``: its GPU's last reads failed, the figures are the last good read's (its
        used and free figures are marked ``?``, as ``gpus`` marks them: they read as live
        on a lost GPU, tester h197)."""
        new = None if vram is None else dict(vram)
        if new != self._vram or stale != self._stale:
            self._vram, self._stale = new, stale
            self.refresh()

    @property
    def parts(self) -> list[MemoryPart]:
        """The slices in bar order (empty without a VRAM account)."""
        vram = self._vram
        if vram is None:
            return []
        if "others" in vram:
            # A GPU the engine does not manage: its jobs' memory (any still running
            # there), everyone else's, and what is free; nothing is anyone's to adopt.
            return [
                MemoryPart("owned", "owned", "own", vram.get("owned", 0)),
                MemoryPart("others", "others", "oth", vram["others"]),
                MemoryPart("free", "free", "free", vram.get("free", 0)),
            ]
        return [
            MemoryPart("owned", "owned", "own", vram.get("owned", 0)),
            MemoryPart("reserved", "reserved", "rsv", vram.get("reserved_extra", 0)),
            MemoryPart("unregistered", "unreg", "unreg", vram.get("unregistered", 0)),
            MemoryPart("unattributed", "unattr", "unatt", vram.get("unattributed", 0)),
            MemoryPart("free", "free", "free", vram.get("free", 0)),
        ]

    def legend_text(self, width: int | None = None) -> str:
        """The figures line as plain text (what the second line shows at ``width``)."""
        return self._legend(self.size.width if width is None else width).plain

    def _style(self, key: str) -> Style:
        # The full style: colours with alpha ($text-muted) need the background to blend with.
        return self.get_component_rich_style(f"memory-bar--{key}")

    def _figure(self, compact: bool) -> Text:
        vram = self._vram or {}
        used, total = vram.get("used", 0), vram.get("total", 0)
        text = Text(" ")
        text.append(_gib(used) + ("?" if self._stale else ""), self._style("figure"))
        text.append(f"/{_gib(total)}", self._style("muted"))
        if not compact:
            text.append(" GiB", self._style("muted"))
        return text

    def _bar(self, width: int) -> Text:
        parts = self.parts
        if not parts:
            return Text("no memory reading".ljust(width)[:width], self._style("muted"))
        figure = Text()
        if self.legend and width >= 34:
            figure = self._figure(compact=False)
        elif width >= COMPACT_FIGURE_MIN:
            figure = self._figure(compact=True)
        cells = split_cells([p.size for p in parts], width - figure.cell_len)
        text = Text()
        for part, count in zip(parts, cells, strict=True):
            if count:
                text.append(BAR_CHAR * count, self._style(part.key))
        text.append_text(figure)
        return text

    def _legend(self, width: int) -> Text:
        # Zero slices other than owned and free would only add noise; an unregistered
        # slice appearing (in its colour) is exactly what should catch the eye.
        parts = [p for p in self.parts if p.size > 0 or p.key in ("owned", "free")]
        if not parts:
            return Text()
        # Narrower, the figures go whole and the words to their first letter before they
        # go at all: bare numbers could not be told apart (four panels at 160 columns
        # read "21.0 50.0 5.0 4.0": tester h194).
        for variant in ("long", "medium", "short", "whole", "letters", "numbers"):
            text = Text()
            figure = _gib if variant in ("long", "medium", "short") else _whole_gib
            for n, part in enumerate(parts):
                colour = self._style("free-label" if part.key == "free" else part.key)
                if n:
                    text.append(" · " if variant == "long" else " ", self._style("muted"))
                mark = "?" if self._stale and part.key == "free" else ""
                if variant == "numbers":
                    text.append(figure(part.size) + mark, colour)
                    continue
                word = {"short": part.short, "whole": part.short, "letters": LETTERS[part.key]}
                text.append(word.get(variant, part.label), colour)
                if variant != "letters":
                    text.append(" ")
                text.append(figure(part.size) + mark, self._style("figure"))
            if variant == "long":
                text.append(" GiB", self._style("muted"))
            if text.cell_len <= width:
                return text
        text.truncate(width, overflow="ellipsis")
        return text

    def render(self) -> Text:
        width = self.size.width
        text = self._bar(width)
        if self.legend:
            text.append("\n")
            text.append_text(self._legend(width))
        text.no_wrap = True
        return text
