"""One's own job output on a terminal (`logs`): colours and progress bars kept, what
would change the terminal's state dropped, across the chunks a stream comes in."""

from __future__ import annotations

import sys

import pytest

from gpulayer_tui.cli.terminal_output import PENDING_MAX, OwnOutput

from .conftest import REPO, Served
from .test_security import _on_a_terminal

# What tester h190 printed: a title, a colour, an OSC 52 clipboard write; the alternate
# screen, a hidden cursor, the line-drawing character set, mouse reporting.
HOSTILE = (
    b"\x1b]0;pwned\x07\x1b[31m red \x1b]52;c;cHduZWQ=\x07\n"
    b"\x1b[?1049h\x1b[?25l\x1b(0lqk\x1b[?1000h\n"
)
KEPT = b"\x1b[31m red \nlqk\n"


def _through(data: bytes, size: int) -> bytes:
    shown = OwnOutput()
    out = b"".join(shown.text(data[i : i + size]) for i in range(0, len(data), size))
    return out + shown.text(b"", final=True)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
def test_state_changing_sequences_are_dropped_however_the_stream_is_cut(size: int) -> None:
    assert _through(HOSTILE, size) == KEPT


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        # colours, bold, 256 and true colour, reset
        (b"\x1b[1;32mok\x1b[0m \x1b[38;5;208mx\x1b[38:2:1:2:3my\x1b[m", None),
        # a progress bar: carriage return, erase line, cursor up, backspace
        (b"10%\r\x1b[K20%\r\x1b[2K\x1b[1A\x1b[2Bbar\x08\n", None),
        # a hyperlink keeps its text, the link goes
        (b"\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\", b"link"),
        # a clear of the scrollback, a terminal reset, a query the terminal would answer
        (b"a\x1b[3Jb\x1bcc\x1b[6nd\x1b[cz", b"abcdz"),
        # SO/SI (the G1 character set), a bell, C1 CSI as UTF-8, a DCS query
        (b"a\x0eb\x0fc\x07d\xc2\x9b31me\x1bP+q544e\x1b\\f", b"abcd31mef"),
        # text after an escape that never ends is not swallowed
        (b"\x1b]0;" + b"t" * (PENDING_MAX + 10), b"0;" + b"t" * (PENDING_MAX + 10)),
        # a lone ESC at the end goes
        (b"end\x1b", b"end"),
        # UTF-8 (a character cut between chunks) and tabs pass
        ("héllo\t日本 ✓\n".encode(), None),
    ],
)
def test_what_is_kept_and_what_goes(given: bytes, shown: bytes | None) -> None:
    expected = given if shown is None else shown
    for size in (1, 5, len(given)):
        assert _through(given, size) == expected, size


def test_logs_on_a_terminal_keeps_colours_and_drops_the_rest(served: Served) -> None:
    """Through the CLI, on a pty, against a real engine (one's own job)."""
    served.start("--simulate", "1xA100-80GB")
    script = "printf '\\033]0;pwned\\007\\033[31m red \\033[?1049h\\033(0lqk\\033[?1000h\\n'"
    submitted = served.cli("submit", "--shell", "--", script)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[0]
    assert served.cli("wait", job).returncode == 0
    shown = _on_a_terminal([sys.executable, "-m", "gpulayer_tui", "logs", job], served.env, REPO)
    assert shown == b"\x1b[31m red lqk\r\n", shown
    raw = _on_a_terminal(
        [sys.executable, "-m", "gpulayer_tui", "logs", "--raw", job], served.env, REPO
    )
    assert b"\x1b]0;pwned\x07" in raw and b"\x1b[?1049h" in raw, raw
