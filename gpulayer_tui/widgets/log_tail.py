"""A job's output as it grows: raw bytes in, complete lines shown, progress bars kept tidy;
searched (matches highlighted, next / previous), wrapped or not."""

from __future__ import annotations

import codecs
import re
from bisect import bisect_left, bisect_right
from typing import ClassVar

from rich.cells import cell_len, chop_cells
from rich.highlighter import Highlighter
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events, work
from textual._context import NoActiveAppError
from textual.binding import BindingType
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widgets import Log

from .. import keymap
from ..terminal_escapes import CONTROLS as _CONTROLS
from ..terminal_escapes import ESCAPES as _ESCAPES
from ..terminal_escapes import SEQUENCE as _SEQUENCE


def _visible(line: str) -> str:
    """``line`` without the characters that draw nothing here but may take a column in a
    terminal, or none where the layout counted one: format characters (zero-width space,
    soft hyphen, BOM, word joiner, tags; the two joiners apart) and unassigned code points
    (noncharacters too). Binary output is full of them, and each moved the borders of
    the log's panel and the ones beside it."""
    if line.isprintable():
        return line
    import unicodedata

    return "".join(
        c for c in line if unicodedata.category(c) not in ("Cf", "Cn") or c in "\u200c\u200d"
    )


def clean_line(line: str) -> str:
    """What a terminal would end up showing for one line of output.

    A carriage return (progress bars) goes back to the line's start, and what follows
    writes over what was there: a shorter rewrite leaves the end of a longer one showing
    ("tab\there\rCR-over" shows "CR-over here"; only "CR-over" was kept). Escape
    sequences and other control characters are dropped.
    """
    line = line.rstrip("\r")
    if "\r" not in line and ("\x1b[" not in line or not _ERASE.search(line)):
        return _visible(_CONTROLS.sub("", _ESCAPES.sub("", line)))
    return _as_terminal(line)


_ERASE = re.compile(r"\x1b\[[0-2]?K")
_LINE_OR_REWRITE = re.compile(rb"\n|\r(?!\n)")
_TOKENS = re.compile(f"({_SEQUENCE}|\r|\t)")


def _as_terminal(line: str) -> str:
    """``line`` written to a terminal row: a carriage return goes back to its start and
    what follows writes over it, erase-line (``ESC [ K``, ``1K``, ``2K``) clears, a tab
    moves to the next stop of 8, wide characters take two columns. (Taking only what
    followed the last ``\r`` lost the end of a longer line; writing over it by characters
    left "Downloading 100%" under a "\r ESC[K done".)"""
    cells: list[str] = []  # one per column; "" is the right half of a wide character
    col = 0
    for token in _TOKENS.split(line):
        if not token:
            continue
        if token == "\r":
            col = 0
        elif token == "\t":
            col = (col // 8 + 1) * 8
        elif token[0] in "\x1b\x90\x98\x9b\x9d\x9e\x9f":
            if token[-1] == "K" and token.startswith(("\x1b[", "\x9b")):
                how = token[1 + token.startswith("\x1b") : -1]
                if how in ("", "0"):
                    del cells[col:]
                elif how == "1":
                    cells[: col + 1] = [" "] * min(col + 1, len(cells))
                elif how == "2":
                    cells.clear()
        else:
            for char in _visible(_CONTROLS.sub("", token)):
                width = cell_len(char)
                if width == 0:  # (a combining mark: on the character before it)
                    if col and col <= len(cells):
                        cells[col - 1] += char
                    continue
                if len(cells) < col:
                    cells.extend(" " * (col - len(cells)))
                end = col + width
                if col < len(cells) and cells[col] == "" and col:
                    cells[col - 1] = " "  # (half of a wide character written over)
                if end < len(cells) and cells[end] == "":
                    cells[end] = " "
                cells[col:end] = [char] + [""] * (width - 1)
                col = end
    return "".join(cells)


MORE_MARK = "\u203a"  # (a single right-pointing angle quotation mark)
"""The last cell of a row whose line goes on past the view's right edge."""

LINE_PAST_READ = (
    "(… its last line starts before the last {read:,} bytes, all that was read: "
    "P pages the whole output)"
)
"""Shown for an output whose end, as read, holds no line's start."""

LINE_SHOWN_MAX = 65_536
"""Characters of one line of output the log keeps; the rest is counted (a 30 MB line,
shown whole, took the UI half a minute to read and stalled it at every chunk)."""


REWRITE_READ = 8192
"""Characters of a long chunk of ``\r``-updates read to show its newest state (a
terminal's row is written char by char here: reading all of an 11 MB run took 1.6 s)."""


def _cut(line: str, more: int = 0) -> str:
    """``line`` (already :func:`clean_line`'d) cut at :data:`LINE_SHOWN_MAX`, saying how
    much was left out (``more``: characters dropped before it reached here)."""
    more += max(0, len(line) - LINE_SHOWN_MAX)
    if not more:
        return line
    return f"{line[:LINE_SHOWN_MAX]} … ({more:,} more characters of this line not shown)"


def _finder(term: str) -> re.Pattern[str]:
    """The search's pattern: the term as typed (no regex), case-insensitive unless it has
    a capital letter (smart case, as in vim and ``less -i``)."""
    return re.compile(re.escape(term), 0 if term != term.lower() else re.IGNORECASE)


class _MatchHighlighter(Highlighter):
    """Marks the search's matches in the line being drawn (the current one apart)."""

    def __init__(self, log: LogTail) -> None:
        self.log = log

    def highlight(self, text: Text) -> None:
        log = self.log
        if log.search_pattern is None:
            return
        current = log.row_of_current_match()
        on_current = current is not None and log._line_at_row(log._drawing) == current[1]
        style = log.match_style(on_current)
        for found in log.search_pattern.finditer(text.plain):
            text.stylize(style, found.start(), found.end())


class LogTail(Log):
    """The tail of a job's output, fed in raw chunks with :meth:`feed`.

    Complete lines go into the log. The unfinished last line (a progress bar redrawn with
    carriage returns, a prompt) is shown in the border subtitle until its newline arrives,
    or until :meth:`finish` says no more output will come.

    The log keeps its lines (``source_lines``) apart from the rows it shows: with
    :attr:`wrap` a line longer than the width is shown as several rows. :meth:`search`
    finds a term in the lines; its matches are highlighted, and :meth:`next_match` moves
    to the next (or previous) one.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"log-tail--match", "log-tail--current-match"}

    # j and k, as in tables (they did nothing here, where g and G moved the log: h146)
    BINDINGS: ClassVar[list[BindingType]] = [
        b for b in keymap.bindings(keymap.TABLE) if b.action in ("cursor_down", "cursor_up")
    ]

    DEFAULT_CSS = """
    LogTail {
        height: 1fr;
        border: round $panel-lighten-2;
        border-title-color: $foreground;
        border-subtitle-color: $text-muted;
        background: $surface;
        padding: 0 1;
        overflow: auto auto;
    }
    LogTail:focus {
        border: round $primary;
    }
    /* Wrapped, no row is wider than the view: a horizontal scrollbar took a row of the
       few at 80x24, coming and going with the lines' lengths (tester h95). */
    LogTail.-wrapped { overflow-x: hidden; }
    LogTail > .log-tail--match { background: $warning 35%; }
    LogTail > .log-tail--current-match { background: $accent; color: $text; text-style: bold; }
    """

    follow: reactive[bool] = reactive(True)
    """Scroll to the newest line as output arrives."""
    wrap: reactive[bool] = reactive(False)
    """Show a long line as several rows (else it is one row, scrolled sideways)."""

    def __init__(
        self,
        *,
        max_lines: int | None = 10_000,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id, classes=classes)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # The unfinished last line: its first LINE_SHOWN_MAX characters in pieces (joined
        # once the line ends: never the whole line again at every chunk), and how many
        # more there were.
        self._partial: list[str] = []
        self._partial_len = 0
        self._partial_more = 0
        self.bytes_read = 0
        """Bytes fed so far (the offset to read from next)."""
        self._limit = max_lines
        self.head_skipped = False
        """The output's start was not read (see :meth:`skip_head`)."""
        self._to_line_start = False  # skipping the rest of a line read from its middle
        self.lines_dropped = 0
        """Complete lines dropped from the top to keep the newest ``max_lines`` (since
        :meth:`reset`): the first line kept is not the output's first."""
        self._source: list[str] = []
        self._starts: list[int] = []  # wrapped: the first row of each line
        self._wrap_width = 0  # wrapped: the width the rows were cut for
        self._term = ""
        self.search_pattern: re.Pattern[str] | None = None
        """What the search looks for (None: no search)."""
        self.matches: list[int] = []
        """The lines (indices into ``source_lines``) where the search term is."""
        self.match_index: int | None = None
        """Which of :attr:`matches` is the current one."""
        self._drawing = -1  # the row being drawn (for the highlighter)
        self.highlighter = _MatchHighlighter(self)

    @work(thread=True, exit_on_error=False)
    def _update_size(self, updates: int, lines: list[str]) -> None:
        """Textual's own size thread, made safe to outlive the widget.

        Log measures new lines in a thread worker that then asks ``self.app`` to apply the
        width. When the screen was left meanwhile (escape while output pours in), the
        widget has no app any more: Textual's version raised ``NoActiveAppError``, and a
        failed worker ends the app. Measuring a log no one shows is pointless: stop.
        """
        if not lines:
            return
        try:
            app = self.app
        except NoActiveAppError:
            return
        width = max(cell_len(self._process_line(line)) for line in lines)
        try:
            app.call_from_thread(self._update_maximum_width, updates, width)
        except RuntimeError:  # the app is stopping, or the widget left it meanwhile
            return

    @property
    def partial_line(self) -> str:
        """The unfinished last line, as shown."""
        return clean_line("".join(self._partial))

    def skip_head(self) -> None:
        """The output will be fed from somewhere in its middle, not its start: what comes
        before the first line break is the end of a line, dropped."""
        self.head_skipped = True
        self._to_line_start = True

    def feed(self, data: bytes) -> None:
        """Take the next chunk of raw output (in time linear in its size, however long
        its lines are)."""
        if not data:
            return
        self.bytes_read += len(data)
        if self._to_line_start:
            # A line's start; or a carriage return's: what follows it writes the row
            # anew, so a progress line read from its middle shows its newest state (it
            # was "its last line starts before ..." for a long run of "\r"-updates).
            start = _LINE_OR_REWRITE.search(data)
            if start is None:
                # (said as it runs too: the pane stayed blank under "last 0 lines" until
                # the job ended, a 5 MB line still being written: tester h120)
                self.border_subtitle = Content(LINE_PAST_READ.format(read=self.bytes_read))
                return
            self._to_line_start = False
            data = data[start.end() if start[0] == b"\n" else start.start() :]
        # (a CRLF cut in two by the chunks leaves "\r" at a line's end: clean_line drops it)
        pieces = self._decoder.decode(data).replace("\r\n", "\n").split("\n")
        self._add_partial(pieces[0])
        if len(pieces) > 1:
            complete = [self._take_partial()]
            complete += [_cut(clean_line(line)) for line in pieces[1:-1]]
            self._add_partial(pieces[-1])
            self._add_lines(complete)
            self._keep_end_in_view()
        self.border_subtitle = Content(self.partial_line)  # the job's output: text, not markup

    def _add_partial(self, text: str) -> None:
        """More of the unfinished line (only its first LINE_SHOWN_MAX characters kept;
        for a line that carriage returns write over, what a terminal shows now)."""
        if "\r" in text and self._partial_len + len(text) > LINE_SHOWN_MAX:
            text = self._rewritten(text)
        room = LINE_SHOWN_MAX - self._partial_len
        if room > 0 and text:
            kept = text[:room]
            self._partial.append(kept)
            self._partial_len += len(kept)
            text = text[room:]
        self._partial_more += len(text)

    def _rewritten(self, text: str) -> str:
        """A progress line (``\r``-updates) past LINE_SHOWN_MAX: the unfinished line so
        far and ``text`` up to its last ``\r`` become the row a terminal shows now, and
        what follows that ``\r`` is returned to be added to it. (Its first 64 K
        characters were kept: the view showed the progress of long ago, tester h78.)

        Of ``text`` before its last ``\r``, only its last REWRITE_READ characters are
        read (from a ``\r`` among them, if any): what came before them is written over,
        as far as a progress bar's rewrites of one width go."""
        head, _, last = text.rpartition("\r")
        window = max(0, len(head) - REWRITE_READ)
        start = head.find("\r", window) if window else 0
        shown = _as_terminal("".join(self._partial) + head[max(start, window) :])
        # (the row is cleaned text: read again, it shows the same)
        shown = shown[:LINE_SHOWN_MAX]
        self._partial, self._partial_len, self._partial_more = [shown], len(shown), 0
        return "\r" + last

    def _take_partial(self) -> str:
        """The unfinished line has ended: it, as shown (cut if long, the cut said)."""
        line = _cut(clean_line("".join(self._partial)), self._partial_more)
        self._partial, self._partial_len, self._partial_more = [], 0, 0
        return line

    def reset(self) -> None:
        """Forget everything shown, to read another output from its start."""
        self.clear()
        self._source.clear()
        self._starts.clear()
        self.matches = []
        self.match_index = None
        self._decoder.reset()
        self._partial, self._partial_len, self._partial_more = [], 0, 0
        self.bytes_read = 0
        self.lines_dropped = 0
        self.head_skipped = self._to_line_start = False
        self.border_subtitle = ""

    def finish(self) -> None:
        """No more output will come: show the unfinished last line, if any; and, where
        the end read held no line's start (one line longer than all that was read), say
        so: the pane stayed blank, "complete", of a 30 MB line (tester h76)."""
        self._add_partial(self._decoder.decode(b"", final=True))
        if self._partial_len or self._partial_more:
            self._add_lines([self._take_partial()])
        elif self.head_skipped and not self._source and self.bytes_read:
            self._add_lines([LINE_PAST_READ.format(read=self.bytes_read)])
        self.border_subtitle = ""
        self._keep_end_in_view()

    def _keep_end_in_view(self) -> None:
        """Following means the last line is visible, and stays so.

        Log scrolls to its end as it writes, but only while it is at the end already and
        while it may scroll: output that arrives before the first layout (a new screen)
        finds no scrollbar yet, ``scroll_end`` does nothing, and the view stayed at the
        top while the title said "following". So the position is set once the new lines
        are laid out, whether the scrollbar exists yet or not.
        """
        if self.follow:
            self.call_after_refresh(self._to_end)

    def _to_end(self) -> None:
        if self.follow and self.scroll_y < self.max_scroll_y:
            self.set_scroll(None, self.max_scroll_y)
            # Painted anew in full: scrolled as the horizontal scrollbar came (a long
            # line's width measured late), the rows kept their old paint, one line up,
            # the last line hidden while the title said "following".
            self.refresh()

    def on_resize(self) -> None:
        """A resize keeps a followed log at its end (and cuts wrapped rows anew)."""
        if self.wrap and self._wrap_room() != self._wrap_width:
            self._show_all()
        self._keep_end_in_view()

    def watch_show_horizontal_scrollbar(self, _shown: bool) -> None:
        """A long line's width came back (Log measures it in a thread, after the scroll
        to the end): the scrollbar it brings takes the last row, so the end moves."""
        self._keep_end_in_view()

    def _update_maximum_width(self, updates: int, size: int) -> None:
        """Log's size thread reports back (the virtual size grows only now): scroll again."""
        super()._update_maximum_width(updates, size)
        self._keep_end_in_view()

    class FollowChanged(Message):
        """Following started or stopped (a key, or the reader scrolling back)."""

        def __init__(self, log: LogTail, follow: bool) -> None:
            super().__init__()
            self.log = log
            self.follow = follow

        @property
        def control(self) -> LogTail:
            """The log (for ``@on`` selectors)."""
            return self.log

    def watch_follow(self, follow: bool) -> None:
        self.auto_scroll = follow
        if follow:
            self.scroll_end(animate=False)
        self.post_message(self.FollowChanged(self, follow))

    def _reading_back(self) -> None:
        """The reader scrolls up: following stops (the next line of output brought the
        view back to the end while the title said "following")."""
        if self.follow and self.max_scroll_y > 0:
            self.follow = False

    def action_scroll_up(self) -> None:
        self._reading_back()
        super().action_scroll_up()

    def action_cursor_up(self) -> None:
        """k: a line up, as up."""
        self.action_scroll_up()

    def action_cursor_down(self) -> None:
        """j: a line down, as down."""
        self.action_scroll_down()

    def action_page_up(self) -> None:
        self._reading_back()
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self._reading_back()
        super().action_scroll_home()

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        if not (event.ctrl or event.shift):  # (those scroll sideways)
            self._reading_back()
        super()._on_mouse_scroll_up(event)

    # -- lines and rows ---------------------------------------------------------------------

    @property
    def source_lines(self) -> list[str]:
        """The complete lines of output kept (the newest ``max_lines``), as shown."""
        return self._source

    def _content_width(self) -> int:
        return self.scrollable_content_region.width

    def _wrap_room(self) -> int:
        """The cells a wrapped row may take: the content's width, less the vertical
        scrollbar's even before it shows (rows cut to the whole width became wider than
        the view once the rows they made brought the scrollbar)."""
        width = self._content_width()
        if not self.show_vertical_scrollbar:
            width -= self.styles.scrollbar_size_vertical
        return max(1, width)

    def _rows(self, line: str) -> list[str]:
        """The rows one line is shown as (never none: an empty line is a blank row)."""
        if not self.wrap or self._wrap_width <= 0:
            return [line or " "]
        return chop_cells(self._process_line(line), self._wrap_width) or [" "]

    def _add_lines(self, lines: list[str]) -> None:
        """New complete lines: kept, shown, searched."""
        first = len(self._source)
        self._source.extend(lines)
        if self.search_pattern is not None:
            find = self.search_pattern.search
            self.matches.extend(first + i for i, line in enumerate(lines) if find(line))
        if not self.wrap:
            # (one row per line: Log drops the oldest rows past max_lines as lines are)
            before = len(self.lines)
            self.write_lines([line or " " for line in lines], scroll_end=self.follow)
            dropped = before + len(lines) - len(self.lines)
            self._drop_oldest(len(self._source) - (self._limit or len(self._source)))
            if dropped and not self.follow:
                # Paused, the view stays on what it showed: rows dropped above it moved
                # it on by as many lines (a busy job's output scrolled by as if followed).
                # (the target too: up and PageUp go from it, and jumped on by what was
                # dropped since: tester h146)
                kept = max(0.0, self.scroll_y - dropped)
                self.set_scroll(None, kept)
                self.scroll_target_y = kept
            return
        rows: list[str] = []
        start = len(self.lines)
        for line in lines:
            self._starts.append(start + len(rows))
            rows.extend(self._rows(line))
        self.write_lines(rows, scroll_end=self.follow)
        if self._limit is not None and len(self._source) > self._limit:
            # Wrapped rows are not one per line: drop a tenth at once, then show anew.
            count = len(self._source) - self._limit * 9 // 10
            top = self.top_line() - count  # (in the lines kept: the same line stays on top)
            self._drop_oldest(count)
            self._show_all(max(0, top))

    def _drop_oldest(self, count: int) -> None:
        if count <= 0:
            return
        del self._source[:count]
        self.lines_dropped += count
        gone = bisect_left(self.matches, count)  # (matches are in line order)
        self.matches = [m - count for m in self.matches[gone:]]
        if self.match_index is not None:
            # The same match stays current (the count said 9987 of the next, 6,000 lines
            # on); one dropped itself gives way to the oldest kept.
            self.match_index = max(0, self.match_index - gone) if self.matches else None

    def _show_all(self, top: int | None = None) -> None:
        """Show every kept line again (wrap switched, or the width changed), keeping the
        top line (``top``, else the one in view now) in view, or the end when following."""
        if top is None:
            top = self.top_line()
        self.clear()
        self._starts.clear()
        self.set_class(self.wrap, "-wrapped")
        self._wrap_width = self._wrap_room() if self.wrap else 0
        self.max_lines = None if self.wrap else self._limit
        rows: list[str] = []
        for line in self._source:
            self._starts.append(len(rows))
            rows.extend(self._rows(line))
        if not self.wrap:
            self._starts.clear()
        self.write_lines(rows, scroll_end=False)
        if self.follow:
            self._keep_end_in_view()
        else:
            self.call_after_refresh(self.scroll_to, None, self.row_of_line(top), animate=False)

    def row_of_line(self, index: int) -> int:
        """The first row that shows line ``index`` of :attr:`source_lines`."""
        if not self._starts:
            return index
        return self._starts[max(0, min(index, len(self._starts) - 1))]

    def _line_at_row(self, row: int) -> int:
        if not self._starts:
            return row
        return max(0, bisect_right(self._starts, row) - 1)

    def top_line(self) -> int:
        """The line (of :attr:`source_lines`) at the top of the view."""
        return self._line_at_row(round(self.scroll_y))

    def watch_wrap(self, _wrap: bool) -> None:
        self._show_all()

    # -- search -----------------------------------------------------------------------------

    @property
    def search_term(self) -> str:
        """The term searched for, as typed (``""``: no search)."""
        return self._term

    def search(self, term: str, *, from_line: int | None = None) -> bool:
        """Find ``term`` in every line kept and go to the first match at or after
        ``from_line`` (default: the top line in view), wrapping around to the first.
        An empty term ends the search. Returns whether there is a match."""
        if not term:
            self.end_search()
            return False
        self._term = term
        self.search_pattern = _finder(term)
        find = self.search_pattern.search
        self.matches = [i for i, line in enumerate(self._source) if find(line)]
        self.match_index = None
        if self.matches:
            start = self.top_line() if from_line is None else from_line
            at = next((n for n, line in enumerate(self.matches) if line >= start), 0)
            self._go_to_match(at)
        self._redraw()
        return bool(self.matches)

    def end_search(self) -> None:
        """No search: no highlights, and ``n`` is the App's again."""
        self._term = ""
        self.search_pattern = None
        self.matches = []
        self.match_index = None
        self._redraw()

    def next_match(self, step: int = 1) -> bool:
        """Go to the next (``step`` 1) or previous (-1) match, wrapping around: from the
        current match while it is in view, else from the view, as ``less`` does (after
        ``G``, ``n`` went back up to the match after the last one seen: tester h160)."""
        if not self.matches:
            return False
        here = -1 if self.match_index is None and step > 0 else (self.match_index or 0)
        if self.match_index is not None and not self._current_match_in_view():
            top = self.top_line()
            if step > 0:
                here = bisect_right(self.matches, top) - 1
            else:
                here = bisect_left(self.matches, top)
        self._go_to_match((here + step) % len(self.matches))
        self._redraw()
        return True

    def _current_match_in_view(self) -> bool:
        if self.match_index is None or not self.matches:
            return False
        row = self.row_of_line(self.matches[self.match_index])
        top = round(self.scroll_y)
        return top <= row < top + self.scrollable_content_region.height

    def row_of_current_match(self) -> tuple[int, int] | None:
        """(row, line) of the current match, if any."""
        if self.match_index is None or not self.matches:
            return None
        line = self.matches[self.match_index]
        return self.row_of_line(line), line

    def _go_to_match(self, index: int) -> None:
        """Scroll so the match is in view (a third down), and stop following."""
        self.match_index = index
        line = self.matches[index]
        self.follow = False
        row = self.row_of_line(line)
        x = None
        pattern = self.search_pattern
        if not self.wrap and pattern is not None:
            text = self._process_line(self._source[line])
            found = pattern.search(text)
            column = cell_len(text[: found.start()]) if found else 0
            width = self._content_width()
            if not self.scroll_x <= column < self.scroll_x + width - 1:
                x = max(0, column - width // 2)
        self.scroll_to(x, max(0, row - self.scrollable_content_region.height // 3), animate=False)

    def match_style(self, current: bool) -> Style:
        """The style of a match (the current one's apart)."""
        name = "log-tail--current-match" if current else "log-tail--match"
        full = self.get_component_rich_style(name)
        return Style(color=full.color, bgcolor=full.bgcolor, bold=full.bold)

    def _redraw(self) -> None:
        self.highlight = self.search_pattern is not None
        self._render_line_cache.clear()
        self.refresh()

    def _render_line(self, y: int, scroll_x: int, width: int) -> Strip:
        """A row cut to the view, its last cell a dim :data:`MORE_MARK` where the line goes on past
        the right edge: a long line was cut there without a mark (``w`` wraps it)."""
        row = super()._render_line(y, scroll_x, width)
        # (The view's own width: the row runs under a vertical scrollbar, which hid the
        # mark in every log longer than the view: tester h73.)
        shown = min(width, self.scrollable_content_region.width)
        if self.wrap or y >= len(self._lines) or shown < 2:
            return row
        if cell_len(self._process_line(self._lines[y])) <= scroll_x + shown:
            return row
        mark = Strip([Segment(MORE_MARK, self.rich_style + Style(dim=True))], 1)
        parts = [row.crop(0, shown - 1), mark, row.crop(shown, width)]
        return Strip.join(parts).apply_offsets(scroll_x, y)

    def _render_line_strip(self, y: int, rich_style: Style) -> Strip:
        # (the highlighter is told which row it draws: the current match stands out)
        self._drawing = y
        return super()._render_line_strip(y, rich_style)

    # -- moving -----------------------------------------------------------------------------

    def scroll_to_top(self) -> None:
        """The first line kept (following stops)."""
        self.follow = False
        self.scroll_home(animate=False)

    def scroll_to_bottom(self) -> None:
        """The last line, and following again."""
        self.follow = True
        self.scroll_end(animate=False)
