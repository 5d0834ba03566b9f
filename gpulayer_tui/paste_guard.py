"""A bracketed paste is text, whatever it holds.

Textual's terminal parser (``textual._xterm_parser.XTermParser``, 8.2) reads a bracketed
paste one character at a time, and an ESC inside it starts an escape sequence that, not
being the paste's end, is handed to the app as *keys* before the paste itself: a copied
coloured log line (``A \\e[31mB``) pasted into the new-job form arrived as the keys
``^ [ 3 1 m B`` and then the paste ``A``; a paste ending in ``\\e[0mcy`` on the jobs
screen cancelled the job under the cursor, one with ``\\e[0m`` and ctrl+s submitted the
form, one with ``\\e[0mq`` asked to quit (tester h151; h142 saw the reordering).

:class:`PasteSafeParser` takes each paste out of the input before Textual's parser sees
it: everything between the terminal's paste start and end markers becomes one
:class:`~textual.events.Paste`, never keys; the rest is parsed as before. A field takes
such a text without its escape sequences and control characters
(:func:`pasted_text`). :func:`install` puts the parser in the drivers that read a
terminal (Linux, and the browser's through ``textual-serve``).

Input that is not UTF-8 is text too: the drivers decode what they read strictly, and one
byte that is not (a Latin-1 terminal's ``é``, a Meta key that sets the 8th bit, a pasted
binary) ended the TUI in a UnicodeDecodeError, and an embedded engine with it, exit 0
(tester h160). :func:`install` gives them a decoder that reads such a byte as U+FFFD.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Iterable

from textual import events
from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.constants import ESCAPE_DELAY
from textual.message import Message

from .terminal_escapes import CONTROLS, ESCAPES

PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"


def _cut_marker(data: str, marker: str) -> int:
    """How many characters at the end of ``data`` are the start of ``marker``."""
    for length in range(min(len(marker) - 1, len(data)), 0, -1):
        if data.endswith(marker[:length]):
            return length
    return 0


class PasteSafeParser(XTermParser):
    """Textual's terminal parser with bracketed pastes taken out whole (module doc)."""

    def __init__(self, debug: bool = False) -> None:
        super().__init__(debug)
        self._pasting = False
        self._pasted: list[str] = []
        self._held = ""  # (the start of a marker that the end of a read cut)
        self._held_at = 0.0

    def feed(self, data: str) -> Iterable[Message]:
        """Parse ``data``: a paste in it is one :class:`~textual.events.Paste`."""
        if not data:  # (the end of the input: Textual's parser ends)
            if self._held and not self._pasting:
                yield from super().feed(self._held)
            self._held = ""
            yield from super().feed(data)
            return
        data, self._held = self._held + data, ""
        while data:
            if self._pasting:
                end = data.find(PASTE_END)
                if end < 0:
                    cut = _cut_marker(data, PASTE_END)
                    self._pasted.append(data[: len(data) - cut])
                    self._held = data[len(data) - cut :]
                    return
                self._pasted.append(data[:end])
                data = data[end + len(PASTE_END) :]
                text = "".join(self._pasted).replace("\x00", "")
                self._pasted.clear()
                self._pasting = False
                yield events.Paste(text)
                continue
            start = data.find(PASTE_START)
            if start < 0:
                # A lone ESC may be the escape key, or a paste's start cut by the read:
                # held, it goes on to Textual's parser at the next read, or after the
                # same wait that parser gives a lone ESC (tick).
                cut = _cut_marker(data, PASTE_START)
                self._held = data[len(data) - cut :] if cut else ""
                self._held_at = get_time()
                data = data[: len(data) - cut]
                if data:
                    yield from super().feed(data)
                return
            if start:
                yield from super().feed(data[:start])
            self._pasting = True
            data = data[start + len(PASTE_START) :]

    def tick(self) -> Iterable[Message]:
        """Called as the driver waits for input: a held ESC waited long enough is a key."""
        if self._held and not self._pasting and get_time() - self._held_at >= ESCAPE_DELAY:
            held, self._held = self._held, ""
            yield from super().feed(held)
            # (its wait for the rest of a sequence was this one: over now)
            self._timeout_time = get_time()
        yield from super().tick()


def pasted_text(text: str) -> str:
    """``text`` as a field takes it from a paste: without escape sequences (a copied
    coloured line keeps its words, not its colour codes) or control characters; lines
    stay lines (a one-line field decides what to do with several)."""
    return "\n".join(CONTROLS.sub("", ESCAPES.sub("", line)) for line in text.splitlines())


def install() -> None:
    """Make the terminal drivers parse input with :class:`PasteSafeParser`.

    Textual's drivers build their parser by the module-level name ``XTermParser`` as they
    start reading; setting that name is the one place it can be changed without copying
    a driver's input loop.
    """
    from textual.drivers import linux_driver

    linux_driver.XTermParser = PasteSafeParser  # type: ignore[attr-defined]
    linux_driver.getincrementaldecoder = replacing_decoder  # type: ignore[attr-defined,assignment]
    try:
        from textual.drivers import web_driver
    except ImportError:  # pragma: no cover (part of textual; kept apart from the terminal)
        return
    web_driver.XTermParser = PasteSafeParser  # type: ignore[attr-defined]
    web_driver.getincrementaldecoder = replacing_decoder  # type: ignore[attr-defined,assignment]


def replacing_decoder(encoding: str) -> Callable[[], codecs.IncrementalDecoder]:
    """``codecs.getincrementaldecoder(encoding)`` whose decoders read a byte sequence
    that is not valid as U+FFFD, where the strict one raised (see the module)."""
    return functools.partial(codecs.getincrementaldecoder(encoding), errors="replace")
