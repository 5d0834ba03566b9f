"""Terminal columns: how wide text is drawn, and text cut or padded to a width (the CLI's
tables and the TUI's panels line up by these).

Counted as the TUI's renderer (Rich) counts them, by grapheme. Rich is loaded only for
text that is not ASCII (the CLI's start stays cheap), and not by the wire contract
(:mod:`.fields`, :mod:`.wire`), which stays stdlib-only: the engine loads no UI library.
"""

from __future__ import annotations


def cell_width(text: str) -> int:
    """How many terminal columns ``text`` takes, counted as the TUI's renderer (Rich)
    counts them: by grapheme, so wide characters take two, combining marks and joiners
    none, and an emoji sequence (joined by U+200D, with a skin tone or U+FE0F) the two
    columns a terminal draws it in. (``len`` counted marks and wide characters as one;
    then a per-character count gave a family emoji six columns, and the CLI's tables
    came out of line where the TUI's did not: tester h190.)"""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)


def cut_to_width(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` columns, ending with "…" where it was cut (never
    inside a grapheme: an emoji sequence is kept whole or left out)."""
    if cell_width(text) <= width:
        return text
    room = max(1, width - 1)
    if text.isascii():
        return text[:room] + "…"
    from rich.cells import split_graphemes

    end = used = 0
    for _start, stop, columns in split_graphemes(text)[0]:
        if used + columns > room:
            break
        used, end = used + columns, stop
    return text[:end] + "…"


def pad_to_width(text: str, width: int) -> str:
    """``text`` followed by spaces up to ``width`` columns."""
    return text + " " * (width - cell_width(text))
