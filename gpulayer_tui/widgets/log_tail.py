"""A job's output as it grows: raw bytes in, complete lines shown, progress bars kept tidy."""

from __future__ import annotations

import codecs
import re

from rich.cells import cell_len
from textual import work
from textual._context import NoActiveAppError
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Log

# CSI and OSC escape sequences (colours, cursor moves, titles) and the C0 controls other
# than tab; the log shows plain text.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_line(line: str) -> str:
    """What a terminal would end up showing for one line of output.

    A carriage return (progress bars) restarts the line, so only the text after the
    last one is kept; escape sequences and other control characters are dropped.
    """
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    return _CONTROLS.sub("", _ESCAPES.sub("", line))


class LogTail(Log):
    """The tail of a job's output, fed in raw chunks with :meth:`feed`.

    Complete lines go into the log. The unfinished last line (a progress bar redrawn with
    carriage returns, a prompt) is shown in the border subtitle until its newline arrives,
    or until :meth:`finish` says no more output will come.
    """

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
    """

    follow: reactive[bool] = reactive(True)
    """Scroll to the newest line as output arrives."""

    def __init__(
        self,
        *,
        max_lines: int | None = 10_000,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id, classes=classes)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self.bytes_read = 0
        """Bytes fed so far (the offset to read from next)."""

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
        return clean_line(self._partial)

    def feed(self, data: bytes) -> None:
        """Take the next chunk of raw output."""
        if not data:
            return
        self.bytes_read += len(data)
        text = self._partial + self._decoder.decode(data)
        *complete, self._partial = text.replace("\r\n", "\n").split("\n")
        if complete:
            self.write_lines([clean_line(line) for line in complete], scroll_end=self.follow)
            self._keep_end_in_view()
        self.border_subtitle = Content(self.partial_line)  # the job's output: text, not markup

    def reset(self) -> None:
        """Forget everything shown, to read another output from its start."""
        self.clear()
        self._decoder.reset()
        self._partial = ""
        self.bytes_read = 0
        self.border_subtitle = ""

    def finish(self) -> None:
        """No more output will come: show the unfinished last line, if any."""
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        if rest:
            self.write_line(clean_line(rest), scroll_end=self.follow)
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

    def on_resize(self) -> None:
        """A resize keeps a followed log at its end."""
        self._keep_end_in_view()

    def _update_maximum_width(self, updates: int, size: int) -> None:
        """Log's size thread reports back (the virtual size grows only now): scroll again."""
        super()._update_maximum_width(updates, size)
        self._keep_end_in_view()

    def watch_follow(self, follow: bool) -> None:
        self.auto_scroll = follow
        if follow:
            self.scroll_end(animate=False)
