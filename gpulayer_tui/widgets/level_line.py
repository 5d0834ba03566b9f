"""A series as one line of block characters on a fixed scale.

Textual's ``Sparkline`` draws each series from its own lowest value to its highest: a
GPU busy at a steady 70 % drew as flat, empty bars, the same as an idle one, and 38-40 %
as a climb from nothing to full. Here the bars run from 0 to ``top`` (100 % for
utilisation) or to the series' own peak (memory, whose peak is written beside it), and
an unknown reading is a gap, not a 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import RenderResult
from textual.reactive import reactive
from textual.widget import Widget

from ..formatting import sparkline


class LevelLine(Widget):
    """One line of bars for ``data``, across the widget's width: neighbours merged by
    their peak when there are more points than cells, each point drawn wider when there
    are fewer (the line spans the job's life either way)."""

    DEFAULT_CSS = """
    LevelLine { height: 1; width: 1fr; }
    """

    data: reactive[tuple[float | None, ...]] = reactive(tuple)
    """The series, oldest first (``None``: no reading then)."""

    def __init__(
        self,
        data: Sequence[float | None] = (),
        *,
        top: float | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.top = top
        self.set_reactive(LevelLine.data, tuple(data))

    def render(self) -> RenderResult:
        width, values = self.size.width, self.data
        if 0 < len(values) < width:
            values = tuple(values[col * len(values) // width] for col in range(width))
        return sparkline(list(values), width, self.top)
