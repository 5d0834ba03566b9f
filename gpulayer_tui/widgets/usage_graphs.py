"""A GPU's utilisation and memory history as bar graphs, drawn straight into strips.

Every sample shifts every column of a busy GPU's graphs, so they are redrawn each second
for each GPU. As a ``Static`` holding ``Content`` that was the dashboard's largest cost
with every GPU busy (each line wrapped, divided and styled again); here a line is two
segments whose styles are resolved once per theme.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget


class GraphLine(NamedTuple):
    """One line of a graph: a label (may be empty) and the bars."""

    label: str
    bars: str
    kind: str
    """``util`` or ``mem``: the bars' colour."""


class UsageGraphs(Widget):
    """Lines of history graphs (utilisation in ``$text-secondary``, memory in ``$text-primary``,
    labels muted), as tall as its lines and, with ``width: auto``, as wide as the widest."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "usage-graphs--label",
        "usage-graphs--util",
        "usage-graphs--mem",
    }

    DEFAULT_CSS = """
    UsageGraphs {
        height: auto;
        & > .usage-graphs--label { color: $text-muted; }
        & > .usage-graphs--util { color: $text-secondary; }
        & > .usage-graphs--mem { color: $text-primary; }
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.lines: tuple[GraphLine, ...] = ()
        """What is shown, top line first."""
        self._styles: dict[str, Style] | None = None

    def show(self, lines: tuple[GraphLine, ...], layout: bool = False) -> None:
        """Show ``lines`` (nothing happens when they are what is shown); ``layout``: the
        size may have changed, so lay the screen out again."""
        if lines == self.lines and not layout:
            return
        resized = layout or len(lines) != len(self.lines)
        self.lines = lines
        self.refresh(layout=resized)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None  # a theme change: resolve the colours again

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((len(line.label) + len(line.bars) for line in self.lines), default=0)

    def _style(self, key: str) -> Style:
        if self._styles is None:
            base = self.rich_style
            # The full component style: alpha colours ($text-muted) are blended with the
            # background, as Content does.
            self._styles = {
                name: base + self.get_component_rich_style(f"usage-graphs--{name}")
                for name in ("label", "util", "mem")
            }
        return self._styles[key]

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if not 0 <= y < len(self.lines):
            return Strip.blank(width, self.rich_style)
        line = self.lines[y]
        segments = [Segment(line.label, self._style("label"))] if line.label else []
        segments.append(Segment(line.bars, self._style(line.kind)))
        return Strip(segments, len(line.label) + len(line.bars)).adjust_cell_length(
            width, self.rich_style
        )
