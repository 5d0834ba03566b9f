"""One's own job output on a terminal, with what would change the terminal's state taken
out: colours, cursor moves and line erases (progress bars) kept; titles, clipboard
writes, hyperlinks, the alternate screen, mouse reporting, hidden cursors, character
sets, terminal queries and resets dropped.

A job's output often carries text nobody checked (a dataset's lines, a web server's
request paths): one ``logs`` of it set the shell's title, left the terminal on the
alternate screen with its cursor hidden and mouse reporting on, and turned letters into
line-drawing characters (tester h190). The TUI's log view takes the same out; ``--raw``
and a pipe get the bytes as they are.
"""

from __future__ import annotations

import re

# A whole escape sequence: CSI (parameters, intermediates, final), a string sequence (OSC,
# DCS, SOS, PM, APC) up to its terminator, or another escape (ESC, intermediates, final).
_SEQUENCE = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]"
    rb"|\x1b[]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"
    rb"|\x1b[ -/]*[0-~]"
)
# What is taken out: every escape sequence and the C0 controls but tab, line feed,
# carriage return and backspace (SO and SI switch character sets; BEL rings), and the
# C1 controls as UTF-8 writes them (U+009B is CSI to some terminals).
_ACTIVE = re.compile(_SEQUENCE.pattern + rb"|[\x00-\x07\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")
# The escapes kept: SGR (colours, bold) and the cursor moves and line erases a progress
# bar draws with, their parameters plain numbers (no private modes: "?1049h").
_KEPT = re.compile(rb"\x1b\[[0-9;:]*[mABCDEFGK]")
# The start of a sequence that runs to the chunk's end, not ended yet.
_UNENDED = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*|[]PX^_][^\x07\x1b]*\x1b?|[ -/]*)\Z")
PENDING_MAX = 4096
"""An escape not ended within this many bytes is taken for text (its ESC dropped)."""


class OwnOutput:
    """Bytes written to a terminal with state-changing sequences dropped (see the module
    docstring), across chunks: a sequence cut between two is held until it is whole."""

    def __init__(self) -> None:
        self._held = b""

    def text(self, chunk: bytes, final: bool = False) -> bytes:
        """``chunk`` as it may reach the terminal (``final``: nothing follows it)."""
        data = self._held + chunk
        self._held = b""
        if not final:
            floor = max(0, len(data) - PENDING_MAX)
            start = data.rfind(b"\x1b", floor)
            if start > floor:
                # (a string sequence whose terminator, ESC \\, was cut after its ESC: held
                # from its own start)
                before = data.rfind(b"\x1b", floor, start)
                if before >= 0 and _UNENDED.match(data, before) is not None:
                    start = before
            if start >= 0 and _UNENDED.match(data, start) is not None:
                if len(data) - start < PENDING_MAX:
                    data, self._held = data[:start], data[start:]
            elif data.endswith(b"\xc2"):
                data, self._held = data[:-1], data[-1:]  # (a C1 control's first byte, maybe)
        return _ACTIVE.sub(_kept_or_nothing, data)


def _kept_or_nothing(match: re.Match[bytes]) -> bytes:
    found = match.group()
    return found if _KEPT.fullmatch(found) else b""
