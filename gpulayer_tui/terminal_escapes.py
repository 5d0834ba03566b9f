"""Terminal escape sequences and control characters, as patterns: what a job's output
(the log view) and a paste into a field (:mod:`~gpulayer_tui.paste_guard`) are shown or
taken without."""

from __future__ import annotations

import re

# Escape sequences, whole: CSI (colours, cursor moves; U+009B is its one-character form),
# the string sequences OSC (titles, hyperlinks), DCS (terminal queries, sixel images), SOS,
# PM and APC up to their terminator (a terminal swallows what follows up to it: the line's
# end where none comes), and the other escapes: ESC, intermediates, a final ("ESC ( B"
# picks a character set), or ESC and whatever one character follows it. Only the
# introducer was dropped for DCS, and its payload ("+q544e") showed as output.
SEQUENCE = (
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c|$)"
    r"|\x1b[ -/]*[0-~]|\x1b."
)
ESCAPES = re.compile(SEQUENCE)
"""Every escape sequence, whole (with the C0 controls but tab below, plain text is left)."""

# (also DEL and the C1 controls, U+009B being a one-character CSI; the bidi embeddings,
# overrides, isolates and marks, which reorder what follows them; and the line separators
# str.splitlines() would split a line at: one line of output is one line of the log)
CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ufe00-\ufe0f]"
)
"""The characters that draw nothing but act on a terminal (tab and newline apart)."""
# (and the variation selectors: an emoji's U+FE0F made a terminal draw it two columns
# wide where the layout counted one, and the panel's right border moved)
