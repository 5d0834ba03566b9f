"""A bracketed paste is text, whatever it holds (gpulayer_tui.paste_guard): Textual's
parser handed what followed an ESC inside a paste to the app as keys (tester h151)."""

from __future__ import annotations

import time

import pytest
from textual import constants, events
from textual._xterm_parser import XTermParser

from gpulayer_tui.paste_guard import PasteSafeParser, pasted_text

START, END = "\x1b[200~", "\x1b[201~"


def parsed(*chunks: str) -> list[tuple[str, str]]:
    """What the parser makes of ``chunks`` (each one read): ("key", name) / ("paste", text)."""
    parser = PasteSafeParser()
    out: list[tuple[str, str]] = []
    for chunk in chunks:
        for event in parser.feed(chunk):
            if isinstance(event, events.Key):
                out.append(("key", event.key))
            elif isinstance(event, events.Paste):
                out.append(("paste", event.text))
    return out


def test_textuals_own_parser_turns_a_pastes_escape_sequence_into_keys() -> None:
    # (why the guard exists: if Textual's parser stops doing this, the guard can go)
    read = XTermParser().feed(f"{START}hello \x1b[0mcy{END}")
    keys = [e for e in read if isinstance(e, events.Key)]
    assert keys, "Textual's parser no longer makes keys of a paste: paste_guard may go"


@pytest.mark.parametrize(
    "pasted",
    [
        *("A1 B2\x1b[31mC3 D4", "hello \x1b[0mcy", "N1\x1b[0m\tN2\rN3", "nm\x1b[0m\x13"),
        *("x\x1b", "\x1b[201"),  # (the start of the end marker)
    ],
)
def test_a_paste_is_one_paste_event_wherever_the_reads_cut_it(pasted: str) -> None:
    stream = f"a{START}{pasted}{END}b"
    want = [("key", "a"), ("paste", pasted), ("key", "b")]
    assert parsed(stream) == want
    for cut in range(1, len(stream)):  # (the terminal's bytes read in two pieces)
        assert parsed(stream[:cut], stream[cut:]) == want, f"cut at {cut}"


def test_keys_outside_pastes_are_parsed_as_before() -> None:
    assert parsed("ab\x1b[A\r") == [("key", "a"), ("key", "b"), ("key", "up"), ("key", "enter")]
    assert parsed(f"{START}one{END}{START}two{END}") == [("paste", "one"), ("paste", "two")]
    assert parsed(f"{START}x\x00y{END}") == [("paste", "xy")]  # (as Textual: no NULs)


def test_a_lone_escape_key_is_not_held_back() -> None:
    parser = PasteSafeParser()
    assert list(parser.feed("\x1b")) == []  # (Textual's own wait: a key or a sequence?)
    deadline = time.monotonic() + 5
    got: list[events.Message] = []
    while not got and time.monotonic() < deadline:
        time.sleep(constants.ESCAPE_DELAY)
        got = list(parser.tick())
    assert [e.key for e in got if isinstance(e, events.Key)] == ["escape"]


def test_a_field_takes_a_paste_without_escapes_or_control_characters() -> None:
    assert pasted_text("A1 B2\x1b[31mC3 D4\x1b[0m") == "A1 B2C3 D4"
    assert pasted_text("t\x1b]0;title\x07x\x07y\u202e") == "txy"
    assert pasted_text("one\r\ntwo\x1b[K") == "one\ntwo"
