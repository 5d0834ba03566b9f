"""Label / value rows drawn by one widget: the job detail's fields block."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

from textual.content import Content
from textual.geometry import Size
from textual.style import Style as VisualStyle
from textual.widget import Widget


class FieldList(Widget):
    """Rows of ``label  value``: each label in a muted column, each value wrapped at the
    width beside it (its later lines under its first). One widget for every row (not a
    label and a value widget per row), so a screen with many fields opens quickly.

    Values are :class:`~textual.content.Content` (a job's text is never markup). A row is
    hidden with :meth:`hide`; :meth:`text` and :meth:`shown` answer what a row says.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"field-list--label"}
    DEFAULT_CSS = """
    FieldList { height: auto; }
    FieldList > .field-list--label { color: $text-muted; }
    """

    def __init__(
        self,
        fields: Iterable[tuple[str, str]],
        *,
        label_width: int = 11,
        max_lines: Mapping[str, int] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """``fields``: (key, label) in display order; ``label_width``: the label column;
        ``max_lines``: rows wrapped to at most that many lines, the last ending in "…"
        where cut (a long name pushed every row after it below a small terminal's fold)."""
        super().__init__(id=id, classes=classes)
        self._max_lines = dict(max_lines or {})
        self._labels = dict(fields)
        self._values: dict[str, Content] = dict.fromkeys(self._labels, Content(""))
        self._hidden: set[str] = set()
        self._label_width = label_width
        self._lines_cache: tuple[tuple[int, VisualStyle], list[Content]] | None = None
        self._heading: Content | None = None

    def set_rows(self, rows: Iterable[tuple[str, Content]], heading: Content | None = None) -> None:
        """Show exactly these ``(label, value)`` rows, in order, under ``heading`` (a line
        of its own, wrapped at the whole width): for blocks whose labels change (a job's
        usage lines, why it waits)."""
        rows = list(rows)
        labels = {str(n): label for n, (label, _value) in enumerate(rows)}
        values = {str(n): value for n, (_label, value) in enumerate(rows)}
        same = (
            labels == self._labels
            and not self._hidden
            and all(values[k].is_same(self._values[k]) for k in values)
            and (heading is None) == (self._heading is None)
            and (heading is None or self._heading is None or heading.is_same(self._heading))
        )
        if same:
            return
        self._labels, self._values, self._hidden, self._heading = labels, values, set(), heading
        self._lines_cache = None
        self.refresh(layout=True)

    # -- what it shows ----------------------------------------------------------------------

    def update(self, values: Mapping[str, Content], hidden: Iterable[str] | None = None) -> None:
        """Set these rows' values (others keep theirs); with ``hidden``, hide exactly those
        rows (without, the hidden rows stay hidden)."""
        changed = False
        for key, value in values.items():
            if key not in self._labels:
                raise KeyError(key)
            if not value.is_same(self._values[key]):
                self._values[key] = value
                changed = True
        hide = self._hidden if hidden is None else set(hidden)
        if hide != self._hidden:
            self._hidden = hide
            changed = True
        if changed:
            self._lines_cache = None
            self.refresh(layout=True)

    def set(self, key: str, value: Content) -> None:
        """Set one row's value."""
        self.update({key: value})

    def hide(self, keys: Iterable[str]) -> None:
        """Hide exactly these rows (the others are shown)."""
        self.update({}, keys)

    def value(self, key: str) -> Content:
        """A row's value."""
        return self._values[key]

    def text(self, key: str) -> str:
        """A row's value as plain text."""
        return self._values[key].plain

    @property
    def plain(self) -> str:
        """Every line as plain text, as drawn at the current width (tests, copying)."""
        return "\n".join(line.plain for line in self._lines(self.size.width or 80))

    def shown(self, key: str) -> bool:
        """True when the row is shown."""
        return key in self._labels and key not in self._hidden

    # -- drawing ----------------------------------------------------------------------------

    def _lines(self, width: int) -> list[Content]:
        """The rows at ``width`` cells, one Content per screen line."""
        label_style = self.get_visual_style("field-list--label")
        cache_key = (width, label_style)
        if self._lines_cache is not None and self._lines_cache[0] == cache_key:
            return self._lines_cache[1]
        column = self._label_width
        room = max(1, width - column)
        indent = Content(" " * column)
        lines: list[Content] = []
        if self._heading is not None:
            lines.extend(self._heading.wrap(max(1, width)) or [Content("")])
        for key, label in self._labels.items():
            if key in self._hidden:
                continue
            label = label[: column - 1]
            head = Content.assemble((label, label_style), " " * (column - len(label)))
            parts = self._values[key].wrap(room) or [Content("")]
            most = self._max_lines.get(key)
            if most is not None and len(parts) > most:
                last = parts[most - 1]
                parts = [*parts[: most - 1], last.truncate(max(0, room - 1)) + Content("…")]
            for n, part in enumerate(parts):
                lines.append((head if n == 0 else indent) + part)
        self._lines_cache = (cache_key, lines)
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width)) if width else 0

    def render(self) -> Content:
        return Content("\n").join(self._lines(self.size.width))
