"""The job detail's log (issue 20): search with ``/`` and ``n`` / ``N``, top and end, wrap,
``$PAGER``; the widget alone, then the real app over a real engine."""

from __future__ import annotations

import html
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.app import App, ComposeResult
from textual.drivers.headless_driver import HeadlessDriver
from textual.widgets import Input

from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.screens.submit import SubmitScreen
from gpulayer_tui.widgets.log_tail import LogTail

from .conftest import eventually
from .ui_support import until


class _LogApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LogTail(max_lines=50)


def _output(count: int) -> bytes:
    lines = [f"step {i}" + (" NEEDLE" if i % 10 == 3 else "") for i in range(count)]
    lines[5] = ""  # a blank line is a line too
    lines[7] = "x" * 150 + " needle at the far end"
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1bP+q544e\x1b\\b", "ab"),  # DCS (a terminal query): its payload is not output
        ("a\x1bPq#0;2;0;0;0#0~~@@vv\x07b", "ab"),  # (sixel, ended by BEL)
        ("a\x1b_Gf=100;AAAA\x1b\\b", "ab"),  # APC (kitty graphics)
        ("a\x1b^private\x1b\\b", "ab"),  # PM
        ("a\x1bXstring\x1b\\b", "ab"),  # SOS
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC 8 hyperlink
        ("a\x90+q\x9cb\x9b1mc", "abc"),  # the one-character C1 forms
        ("shown\x1bPnever ended", "shown"),  # a terminal swallows it to the end
        ("a\x1b(Bb\x1b#8c\x1b7d", "abcd"),  # character set, alignment, cursor save
        ("long line\r\x9bKdone", "done"),  # erase-line in its C1 form
        # Characters that draw nothing, or that a terminal widens: each moved the panel's
        # borders (zero-width space, soft hyphen, BOM, word joiner, a tag, unassigned,
        # a noncharacter, an emoji's variation selector); the joiners emoji need stay.
        ("a\u200bb\u00adc\ufeffd\u2060e", "abcde"),
        ("a\U000e0041b\u0378c\ufffed", "abcd"),
        ("\u2764\ufe0f ok", "\u2764 ok"),
        ("\U0001f469\u200d\U0001f52c", "\U0001f469\u200d\U0001f52c"),
    ],
)
def test_escape_sequences_are_dropped_whole(raw: str, shown: str) -> None:
    from gpulayer_tui.widgets.log_tail import clean_line

    assert clean_line(raw) == shown
    assert clean_line("\r" + raw) == shown  # (the terminal's path, by tokens)


async def test_a_very_long_line_is_read_in_linear_time_and_cut_where_shown() -> None:
    # 8 MiB on one line, in the 256 KiB chunks the detail reads: the unfinished line is
    # never held (or cleaned, or joined) past what is shown, so each chunk costs its own
    # size; before, each chunk re-joined and re-cleaned the whole line so far.
    from gpulayer_tui.widgets.log_tail import LINE_SHOWN_MAX

    app = _LogApp()
    async with app.run_test(size=(60, 20)) as pilot:
        log = app.query_one(LogTail)
        chunk = b"a" * (256 * 1024)
        for _ in range(32):
            log.feed(chunk)
            assert log._partial_len <= LINE_SHOWN_MAX  # (the rest only counted)
        assert len(log.partial_line) == LINE_SHOWN_MAX
        log.feed(b"\x1b[31mtail\r\nnext line\nlast, unfinished")
        await pilot.pause()
        long_line, short = log.source_lines
        more = 32 * 256 * 1024 + len("\x1b[31mtail") - LINE_SHOWN_MAX  # (counted raw)
        assert (
            long_line
            == "a" * LINE_SHOWN_MAX + f" … ({more:,} more characters of this line not shown)"
        )
        assert short == "next line" and log.partial_line == "last, unfinished"
        log.finish()
        assert log.source_lines[-1] == "last, unfinished"


async def test_a_progress_line_longer_than_what_is_kept_shows_its_newest_state() -> None:
    # tqdm-style: one line that carriage returns write over, 600 K characters of it; the
    # view kept its first 64 K, a progress of long ago (tester h78).
    from gpulayer_tui.widgets.log_tail import LINE_SHOWN_MAX, clean_line

    app = _LogApp()
    async with app.run_test(size=(60, 20)) as pilot:
        log = app.query_one(LogTail)
        whole = "loading the model, a line longer than the bar" + "".join(
            f"\r{i:>7}/30000 it, {i % 97:>2} it/s" for i in range(30_000)
        )
        data = whole.encode()
        assert len(data) > 8 * LINE_SHOWN_MAX
        for at in range(0, len(data), 4096):
            log.feed(data[at : at + 4096])
            assert log._partial_len <= LINE_SHOWN_MAX
        newest = clean_line(whole)
        assert newest.startswith("  29999/30000 it,") and newest.endswith("bar")
        assert log.partial_line == newest
        log.feed(b"\ndone\n")
        await pilot.pause()
        assert log.source_lines == [newest, "done"]


async def test_a_progress_line_read_from_its_middle_shows_its_newest_state() -> None:
    # The view reads a long output's end only: a progress line that started before it
    # was "its last line starts before ..." (tester h78).
    app = _LogApp()
    async with app.run_test(size=(60, 20)) as pilot:
        log = app.query_one(LogTail)
        log.skip_head()
        log.feed(b"5/9 it\r  6/9 it\r  7/9 it\r  8/9 it\r")
        log.feed(b"  9/9 it")
        log.finish()
        await pilot.pause()
        assert log.source_lines == ["  9/9 it"]
        # (a line's end and CRLF still start a line as before)
        log.reset()
        log.skip_head()
        log.feed(b"tail of a line\r\nnext\n")
        log.finish()
        await pilot.pause()
        assert log.source_lines == ["next"]


async def test_a_wrapped_log_has_no_horizontal_scrollbar() -> None:
    # Rows cut to the view's width before the vertical scrollbar came were wider than the
    # view once it did: a horizontal scrollbar took a row of the few at 80x24 (tester h95).
    app = _LogApp()
    async with app.run_test(size=(80, 24)) as pilot:
        log = app.query_one(LogTail)
        log.feed(b"".join(b"%03d " % n + b"x" * 150 + b"\n" for n in range(6)))
        await pilot.pause()
        assert log.show_horizontal_scrollbar  # (not wrapped: scrolled sideways)
        log.wrap = True
        for n in range(6, 60):  # (more rows than the view: the vertical scrollbar comes)
            log.feed(b"%03d " % n + b"x" * (60 + 5 * n) + b"\n")
            await pilot.pause()
        await until(pilot, lambda: log.show_vertical_scrollbar, "the vertical scrollbar")
        assert not log.show_horizontal_scrollbar and log.max_scroll_x == 0
        log.wrap = False
        await until(pilot, lambda: log.show_horizontal_scrollbar, "sideways again, unwrapped")


async def test_the_log_searches_wraps_and_keeps_its_lines() -> None:
    app = _LogApp()
    async with app.run_test(size=(60, 20)) as pilot:
        log = app.query_one(LogTail)
        log.feed(_output(40))
        await pilot.pause()
        assert len(log.source_lines) == 40 and log.line_count == 40  # one row per line
        assert log.source_lines[5] == ""
        # Smart case: lower case finds either case; a capital letter only that case.
        assert log.search("needle", from_line=0)
        assert log.matches == [3, 7, 13, 23, 33]
        assert log.match_index == 0 and not log.follow  # going to a match stops following
        assert log.search("NEEDLE", from_line=10)
        assert log.matches == [3, 13, 23, 33] and log.match_index == 1  # from line 10 on
        assert log.next_match() and log.match_index == 2
        assert log.next_match(-1) and log.next_match(-1) and log.match_index == 0
        assert log.next_match(-1) and log.match_index == 3  # wraps around
        # Moved away from the current match, `n` goes on from the view, as in `less`:
        # after G it went back up to the match after the last one seen (tester h160).
        assert log.search("needle", from_line=0) and log.match_index == 0
        await pilot.pause()
        log.scroll_to(y=20, animate=False)  # (lines 20-37 in view; the match at 3 is not)
        await pilot.pause()
        assert log.next_match() and log.matches[log.match_index or 0] == 23
        await pilot.pause()
        log.scroll_to(y=20, animate=False)
        await pilot.pause()
        assert log.next_match(-1) and log.matches[log.match_index or 0] == 13
        # The far-away match scrolls the view sideways to it.
        log.search("far end", from_line=0)
        await pilot.pause()
        assert log.matches == [7] and log.scroll_x > 0
        # Wrapped: a long line is several rows; the lines and the matches stay as they were.
        log.wrap = True
        await pilot.pause()
        assert len(log.source_lines) == 40 and log.line_count > 40
        assert log.max_scroll_x == 0
        row, line = log.row_of_current_match() or (0, 0)
        assert line == 7 and row == 7
        log.search("needle", from_line=10)
        assert log.row_of_current_match() == (log.row_of_line(13), 13)
        assert log.row_of_line(13) > 13  # (line 7 took more than one row)
        # Past max_lines the oldest lines go, and the matches follow them.
        log.feed(_output(40))
        await pilot.pause()
        assert len(log.source_lines) <= 50
        assert all(log.search_pattern.search(log.source_lines[m]) for m in log.matches)  # type: ignore[union-attr]
        log.wrap = False
        await pilot.pause()
        assert log.line_count == len(log.source_lines)
        log.end_search()
        assert log.matches == [] and log.search_term == ""


@pytest.mark.parametrize("wrap", [False, True])
async def test_a_paused_view_stays_on_its_lines_while_old_ones_are_dropped(wrap: bool) -> None:
    # Past max_lines the oldest lines go; a paused view kept its row number, so a busy
    # job's output scrolled by under "paused", and the current match jumped with it.
    app = _LogApp()
    async with app.run_test(size=(60, 20)) as pilot:
        log = app.query_one(LogTail)
        log.wrap = wrap
        log.feed("".join(f"L{i}\n" for i in range(50)).encode())
        await pilot.pause()
        assert log.search("L20", from_line=0) and not log.follow
        await pilot.pause()
        top = log.source_lines[log.top_line()]
        for more in (50, 54):  # (two chunks, dropping the oldest lines but not the view's)
            log.feed("".join(f"L{i}\n" for i in range(more, more + 4)).encode())
            await pilot.pause()
            assert log.source_lines[log.top_line()] == top
            assert log.source_lines[log.matches[log.match_index or 0]] == "L20"
        assert log.lines_dropped > 0 and log.source_lines[0] != "L0"
        # Up then shows the line before (it jumped on by as many lines as were dropped
        # since the last key: tester h146), and so does PageUp, by a page.


async def test_up_in_a_paused_view_shows_the_line_before_while_old_ones_are_dropped() -> None:
    # Each up (and PageUp) jumped on by as many lines as were dropped since the last key:
    # the keys moved from where the view was before the drops (tester h146).
    app = _LogApp()
    async with app.run_test(size=(60, 20)) as pilot:
        log = app.query_one(LogTail)
        log.feed("".join(f"L{i}\n" for i in range(50)).encode())
        await pilot.pause()
        assert log.search("L40", from_line=0) and not log.follow
        await pilot.pause()
        log.focus()
        top = int(log.source_lines[log.top_line()][1:])
        fed = 50
        for step in (1, 2, 3):
            log.feed("".join(f"L{i}\n" for i in range(fed, fed + 3)).encode())
            fed += 3
            await pilot.pause()
            await pilot.press("up")
            want = f"L{top - step}"
            await until(pilot, lambda w=want: log.source_lines[log.top_line()] == w, want)
        assert log.lines_dropped == fed - 50


@pytest.mark.parametrize("how", ["up", "pageup", "home", "wheel"])
async def test_scrolling_back_stops_following_and_g_follows_again(how: str) -> None:
    # Up while following was undone by the next line of output: the view went back to the
    # end, and the title said "following" all along.
    app = _LogApp()
    said: list[LogTail.FollowChanged] = []

    def hook(message: object) -> None:
        # (each message once: the hook sees it at every node it bubbles through)
        if isinstance(message, LogTail.FollowChanged) and all(m is not message for m in said):
            said.append(message)

    async with app.run_test(size=(60, 20), message_hook=hook) as pilot:
        log = app.query_one(LogTail)
        log.focus()
        log.feed("".join(f"L{i}\n" for i in range(40)).encode())
        await until(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)
        said.clear()
        if how == "wheel":
            await pilot.hover(LogTail)
            await pilot._post_mouse_events([events.MouseScrollUp], LogTail)
        else:
            await pilot.press(how)
        await pilot.pause()
        assert not log.follow and [m.follow for m in said] == [False]
        where = log.scroll_y
        assert where < log.max_scroll_y
        log.feed("".join(f"M{i}\n" for i in range(10)).encode())
        await pilot.pause()
        assert log.scroll_y == where and not log.follow
        log.scroll_to_bottom()
        await pilot.pause()
        assert log.follow and [m.follow for m in said] == [False, True]
        log.feed(b"last\n")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y)


def _detail(app: Any) -> JobDetailScreen | None:
    screen = app.screen
    return screen if isinstance(screen, JobDetailScreen) else None


async def _ended_log(ui_app: Any, script: str) -> Any:
    """An app, and the ended job that ran the Python ``script``."""
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(
        {"command": [sys.executable, "-c", script], "gpus": 0, "cwd": os.getcwd()}
    )
    assert (await app.backend.engine.wait(job["id"], timeout=30)).status.value == "completed"
    return app, job


async def test_a_long_output_is_read_from_near_its_end_whole_lines_only(ui_app: Any) -> None:
    # A 1 GiB log was read whole, 256 KiB a request, to keep its last 10,000 lines: three
    # minutes of a core before the view said "complete", again at each opening.
    from gpulayer_tui.screens.job_detail import LOG_TAIL_BYTES

    count = LOG_TAIL_BYTES // 13 + 40_000  # ("line NNNNNNN\n": 13 bytes)
    script = f"import sys\nsys.stdout.write(''.join('line %07d\\n' % i for i in range({count})))"
    app, job = await _ended_log(ui_app, script)
    async with app.run_test(size=(120, 40)) as pilot:
        detail, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: detail._log_done, "all the output", timeout=30)
        assert log.bytes_read == LOG_TAIL_BYTES  # (its last 4 MiB, not all of it)
        lines = log.source_lines
        # Whole lines, in order, to the last: the one read from its middle is dropped.
        assert lines[-1] == f"line {count - 1:07d}" and len(lines) <= 10_000
        first = int(lines[0].removeprefix("line "))
        assert lines == [f"line {i:07d}" for i in range(first, count)]
        assert f"complete · last {len(lines):,} lines (P: all)" in str(log.border_title)


async def test_a_followed_output_far_behind_a_fast_writer_goes_to_its_end_again(
    ui_app: Any, tmp_path: Path
) -> None:
    # Followed, the pane read every byte of a job writing 4 MB/s: ever further behind,
    # most of a core, "reading" for minutes after the job ended (tester h104).
    from gpulayer_tui.screens.job_detail import LOG_TAIL_BYTES

    gate = tmp_path / "gate"
    count = LOG_TAIL_BYTES // 13 + 200_000  # ("line NNNNNNN\n": 13 bytes)
    script = (
        "import os, sys, time\n"
        "print('started', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
        f"sys.stdout.write(''.join('line %07d\\n' % i for i in range({count})))\n"
    )
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(
        {"command": [sys.executable, "-c", script], "gpus": 0, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(120, 40)) as pilot:
        detail, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: "started" in log.source_lines, "its first line, followed")
        assert log.follow
        gate.touch()
        await until(pilot, lambda: detail._log_done, "all the output", timeout=60)
        assert log.head_skipped and log.bytes_read <= LOG_TAIL_BYTES
        lines = log.source_lines
        assert lines[-1] == f"line {count - 1:07d}"
        first = int(lines[0].removeprefix("line "))
        assert lines == [f"line {i:07d}" for i in range(first, count)]


async def test_an_output_whose_last_line_is_longer_than_its_read_end_says_so(
    ui_app: Any,
) -> None:
    # One 5 MiB line: the end read (4 MiB) held no line's start, and the pane stayed
    # blank, "complete · last 0 lines" (tester h76).
    from gpulayer_tui.screens.job_detail import LOG_TAIL_BYTES
    from gpulayer_tui.widgets.log_tail import LINE_PAST_READ

    script = f"import sys\nsys.stdout.write('x' * {LOG_TAIL_BYTES + 1_000_000} + '\\n')"
    app, job = await _ended_log(ui_app, script)
    async with app.run_test(size=(120, 40)) as pilot:
        detail, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: detail._log_done, "all the output", timeout=30)
        assert log.source_lines == [LINE_PAST_READ.format(read=LOG_TAIL_BYTES)]


async def test_a_running_jobs_unfinished_line_longer_than_its_read_end_says_so(
    ui_app: Any, tmp_path: Path
) -> None:
    # A 5 MB line still being written: the pane stayed blank under "last 0 lines" until
    # the job ended (tester h120).
    from gpulayer_tui.screens.job_detail import LOG_TAIL_BYTES
    from gpulayer_tui.widgets.log_tail import LINE_PAST_READ

    gate = tmp_path / "gate"
    script = (
        f"import os, sys, time\nsys.stdout.write('x' * {LOG_TAIL_BYTES + 1_000_000})\n"
        f"sys.stdout.flush()\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
    )
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(
        {"command": [sys.executable, "-c", script], "gpus": 0, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(120, 40)) as pilot:
        _detail, log = await _open_log(pilot, app, job["id"])
        said = LINE_PAST_READ.format(read=LOG_TAIL_BYTES)
        await until(pilot, lambda: str(log.border_subtitle) == said, "the note", timeout=30)
        title = str(log.border_title)
        assert "last 0 lines" not in title and "its last line only, in part" in title, title
        gate.touch()
        await until(
            pilot,
            lambda: app.job_store.jobs.get(job["id"], {}).get("status") == "completed",
            "its end",
            timeout=30,
        )


async def test_search_keys_in_the_detail_and_n_is_new_job_again_after(ui_app: Any) -> None:
    app = await ui_app("1xA100-80GB")
    script = "for i in $(seq 0 199); do echo line $i; [ $((i % 50)) = 7 ] && echo needle $i; done"
    job = await app.backend.submit({"shell": script, "gpus": 0, "cwd": os.getcwd()})
    async with app.run_test(size=(120, 40)) as pilot:
        detail, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: detail._log_done and log.line_count == 204, "all the output")
        # A finished job's log opens at its end.
        await until(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)
        assert detail.check_action("next_match", ()) is False  # n: the App's new job
        await pilot.press("g")  # top
        assert log.scroll_y == 0 and not log.follow
        # j and k move it a line, as down and up do (they did nothing: tester h146).
        await pilot.press("j", "j")
        await until(pilot, lambda: log.scroll_y == 2, "j j")
        await pilot.press("k")
        await until(pilot, lambda: log.scroll_y == 1, "k")
        await pilot.press("g")
        await until(pilot, lambda: log.scroll_y == 0, "g again")
        from textual.widgets._footer import FooterKey

        def footer() -> dict[str, str]:
            return {str(k.key_display): str(k.description) for k in app.screen.query(FooterKey)}

        await pilot.press("slash")
        assert app.focused is detail.query_one("#log-search", Input)
        # In the search line n and N are text, and esc ends the search ("N Prev" typed an
        # N; "esc Back" ended the search and stayed: tester h95).
        await until(pilot, lambda: footer().get("esc") == "End search", "esc: end search")
        assert "N" not in footer() and "n" not in footer(), footer()
        # In one burst, as a terminal sends a fast typist's keys: the "n" right after
        # enter is the next match (it was typed into the term: "needlen", tester h56).
        from textual import events

        for key, char in [*((c, c) for c in "needle"), ("enter", "\r"), ("n", "n")]:
            app.post_message(events.Key(key, char))
        await until(pilot, lambda: log.match_index == 1, "the next match, typed after enter")
        assert app.focused is log
        assert log.search_term == "needle" and len(log.matches) == 4
        assert "/needle: line 2 of 4 with it" in str(log.border_title)
        await until(pilot, lambda: footer().get("N") == "Prev", "N: the previous match")
        assert footer().get("esc") == "End search"
        await pilot.press("n")
        assert log.match_index == 2 and "line 3 of 4 with it" in str(log.border_title)
        # The term's Changed, read late (under load: after enter searched it and "n" went
        # on), searched again and went back to the first match (CI, once).
        field = detail.query_one("#log-search", Input)
        field.post_message(Input.Changed(field, "needle"))
        await pilot.pause()
        await pilot.pause()
        assert log.match_index == 2
        await pilot.press("N")
        assert log.match_index == 1
        assert isinstance(app.screen, JobDetailScreen)  # n searched, it opened no form
        await pilot.press("w")
        assert log.wrap and "wrapped" in str(log.border_title)
        await pilot.press("G")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y, "the end")
        # esc ends the search (and stays); then n is the new-job key again; esc goes back.
        await pilot.press("escape")
        assert log.search_term == "" and isinstance(app.screen, JobDetailScreen)
        await until(pilot, lambda: footer().get("esc") == "Back", "esc: back again")
        # A term with no match: n and N dimmed, nothing to go to (tester h96).
        await pilot.press("slash", *"zzz", "enter")
        await until(pilot, lambda: "no match" in str(log.border_title), "no match")
        await until(pilot, lambda: detail.check_action("next_match", ()) is None, "n dimmed")
        assert detail.check_action("previous_match", ()) is None
        # ... and n is still the search's: it fell through to the new-job form (h130).
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, JobDetailScreen) and "no match" in str(log.border_title)
        await pilot.press("escape")
        await until(pilot, lambda: footer().get("esc") == "Back", "the search ended")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, SubmitScreen), "the new-job form")
        await pilot.press("escape", "escape")
        await until(pilot, lambda: _detail(app) is None, "back")


FAST_WRITER = """\
import sys, time
block = ("x" * 1023 + "\\n") * 64
while True:
    sys.stdout.write(block)
    sys.stdout.flush()
    time.sleep(0.02)  # (3 MB/s: at 30 MB/s, on CI's loaded machine, the copy of what it
    # had written by P, far past what the view had read, took over 30 s)
"""

QUIET_PAGER = """\
import os, shutil, sys
# (copied, then renamed: a test that saw the marker at once read it empty)
shutil.copyfile(sys.argv[-1], os.environ["MARKER"] + ".part")
os.rename(os.environ["MARKER"] + ".part", os.environ["MARKER"])
"""

PAGER_SCRIPT = """\
import os, shutil, signal, sys
# (copied, then renamed: a test that saw the marker at once read it empty)
shutil.copyfile(sys.argv[-1], os.environ["MARKER"] + ".part")
os.rename(os.environ["MARKER"] + ".part", os.environ["MARKER"])
# Ctrl+C typed in a pager reaches the whole foreground group: the TUI must live on.
os.kill(os.getppid(), signal.SIGINT)
"""


def _pager(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script_text: str) -> Path:
    """$PAGER set to ``script_text`` (it copies what it is given to the file returned)."""
    # (the headless driver cannot give a terminal away; the real one can)
    monkeypatch.setattr(HeadlessDriver, "can_suspend", property(lambda self: True), raising=False)
    script = tmp_path / "pager.py"
    script.write_text(script_text)
    marker = tmp_path / "paged.log"
    monkeypatch.setenv("PAGER", f"{sys.executable} {script}")
    monkeypatch.setenv("MARKER", str(marker))
    return marker


async def test_the_log_opens_in_the_pager_with_the_app_suspended(
    ui_app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _pager(monkeypatch, tmp_path, PAGER_SCRIPT)
    # The pager's copy goes to this test's own temp dir: in the shared one, another test's
    # job of the same id would look like a copy left behind.
    copies = tmp_path / "copies"
    copies.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(copies))
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(
        {"shell": "echo first; echo '[b]second[/i]'", "gpus": 0, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_job(job["id"])
        detail = await until(pilot, lambda: _detail(app), "the detail")
        await until(pilot, lambda: detail.query(LogTail) and detail._log_done, "the output")
        await pilot.press("P")
        await until(pilot, marker.exists, "the pager ran")
        assert marker.read_text() == "first\n[b]second[/i]\n"
        await until(
            pilot, lambda: not [w for w in detail.workers if w.group == "pager"], "the pager done"
        )
        assert app.is_running and _detail(app) is detail
        assert list(copies.iterdir()) == []  # the copy it read is gone
        # A job that never stops writing: the copy stops at the output's length when P was
        # pressed (it read on for ever, the pager never shown, the copy past the log's cap).
        # (This pager only copies: the interrupt above is tested once.)
        quiet = tmp_path / "quiet-pager.py"
        quiet.write_text(QUIET_PAGER)
        monkeypatch.setenv("PAGER", f"{sys.executable} {quiet}")
        writer = await app.backend.submit(
            {
                "command": [sys.executable, "-c", FAST_WRITER],
                "gpus": 0,
                "cwd": os.getcwd(),
            }
        )
        marker.unlink()
        app.open_job(writer["id"])
        fast = await until(
            pilot, lambda: (d := _detail(app)) is not None and d.job_id == writer["id"] and d
        )
        await until(pilot, lambda: fast._log_next > 1_000_000, "a megabyte of its output read")
        await pilot.press("P")
        await until(pilot, marker.exists, "the pager ran", timeout=30)
        await app.backend.cancel(writer["id"])
        await pilot.press("escape")
        # A pager that cannot start is said, not raised.
        monkeypatch.setenv("PAGER", str(tmp_path / "no-such-pager"))
        await pilot.press("P")
        await until(
            pilot, lambda: any("cannot run the pager" in n.message for n in app._notifications)
        )
        assert app.is_running


async def test_p_says_there_is_nothing_to_page_instead_of_an_empty_pager(
    ui_app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: int
) -> None:
    # An adopted process (it writes where it was started) and a job with no output yet
    # opened an empty pager.
    marker = _pager(monkeypatch, tmp_path, QUIET_PAGER)
    app = await ui_app("1xA100-80GB")
    ended = await app.backend.submit({"command": ["true"], "gpus": 0})  # (first: a slot)
    silent = await app.backend.submit({"command": ["sleep", "600"], "gpus": 0})
    adopted = await app.backend.adopt({"pid": sleeper})
    async with app.run_test(size=(120, 40)) as pilot:
        for job, said in [
            (silent, "no output yet"),
            (adopted, "an adopted process has no"),
            # (an ended job writes no more: "no output yet" was said of it: tester h118)
            (ended, "no output: it ended without writing any"),
        ]:
            app.open_job(job["id"])
            await until(
                pilot, lambda j=job: (d := _detail(app)) is not None and d.job_id == j["id"]
            )
            if job is ended:
                await until(pilot, lambda: _detail(app).finished, "it ended", timeout=30)
            await pilot.press("P")
            await until(pilot, lambda s=said: any(s in n.message for n in app._notifications))
            if job is adopted:  # (f flipped its label, nothing more: tester h110)
                assert _detail(app).check_action("toggle_follow", ()) is False
            await until(pilot, lambda: not [w for w in app.screen.workers if w.group == "pager"])
            assert not marker.exists()
            await pilot.press("escape")
            await until(pilot, lambda: _detail(app) is None)


async def _open_log(pilot: Any, app: Any, job_id: int) -> tuple[JobDetailScreen, LogTail]:
    """Open a job's detail; it and its log once they are there."""
    app.open_job(job_id)
    detail = await until(pilot, lambda: _detail(app), "the detail")
    log = await until(pilot, lambda: next(iter(detail.query(LogTail)), None), "the log")
    return detail, log


def _screen_text(app: Any) -> str:
    """What the terminal shows (the screenshot's text: rows as painted, not the state)."""
    shot = re.sub("<[^>]+>", "", app.export_screenshot())
    return html.unescape(shot).replace("\xa0", " ")


async def test_wrap_on_then_off_shows_the_last_line_of_a_finished_log(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `w` twice on an ended job's log: the last line was hidden above the horizontal
    # scrollbar, the title saying "following" (the rows kept their paint from before the
    # long lines' width came back). Textual measures that width in a thread; here it comes
    # back late, as on a loaded machine, so the race is always lost.
    measured = LogTail._update_maximum_width

    def late(log: LogTail, updates: int, size: int) -> None:
        log.set_timer(0.2, lambda: measured(log, updates, size))

    monkeypatch.setattr(LogTail, "_update_maximum_width", late)
    script = "for i in range(112):\n    print(f'line {i} ' + ('y' * 150 if i % 5 == 0 else 'end'))"
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(
        {"command": [sys.executable, "-c", script], "gpus": 0, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(100, 30)) as pilot:
        detail, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: detail._log_done and len(log.source_lines) == 112, "all")
        await until(pilot, lambda: "line 111 end" in _screen_text(app), "the end shown")
        for _ in range(2):
            await pilot.press("w")
            await until(pilot, lambda: log.wrap == (log.line_count > 112), "rows redone")
            await until(
                pilot,
                lambda: log.scroll_y == log.max_scroll_y > 0 and log.follow,
                "at the end",
            )
            await until(  # (the long lines' width comes back from a thread)
                pilot, lambda: log.wrap or log.virtual_size.width > log.size.width, "width"
            )
            await until(pilot, lambda: "line 111 end" in _screen_text(app), "the last line")
        assert not log.wrap and log.show_horizontal_scrollbar


async def test_wrap_is_kept_for_the_next_job_opened(ui_app: Any) -> None:
    # `w` was forgotten as soon as the detail closed: every job's log opened unwrapped
    # again (tester h70).
    app = await ui_app("1xA100-80GB")
    first = await app.backend.submit({"command": ["true"], "gpus": 0, "cwd": os.getcwd()})
    second = await app.backend.submit({"command": ["true"], "gpus": 0, "cwd": os.getcwd()})
    async with app.run_test(size=(100, 30)) as pilot:
        _, log = await _open_log(pilot, app, first["id"])
        assert not log.wrap
        await pilot.press("w")
        await until(pilot, lambda: log.wrap, "wrapped")
        await pilot.press("escape")
        await until(pilot, lambda: _detail(app) is None, "closed")
        again, log = await _open_log(pilot, app, second["id"])
        assert again.job_id == second["id"] and log.wrap
        await until(pilot, lambda: "wrapped" in str(log.border_title), "the title says so")


async def test_a_long_line_is_marked_in_a_log_taller_than_its_view(ui_app: Any) -> None:
    # The mark was drawn under the vertical scrollbar: in any log longer than its view,
    # no cut line showed it (tester h73).
    from gpulayer_tui.widgets.log_tail import MORE_MARK

    script = "for i in range(400):\n    print(f'{i:03d} ' + 'x' * (200 + i))"
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(
        {"command": [sys.executable, "-c", script], "gpus": 0, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(130, 40)) as pilot:
        detail, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: detail._log_done and len(log.source_lines) == 400, "all")
        await until(pilot, lambda: log.max_scroll_y > 0, "a log taller than its view")
        rows = [r for r in _screen_text(app).splitlines() if "xxxxxxxx" in r]
        assert rows and all(MORE_MARK in row for row in rows), rows[-3:]


async def test_the_footer_says_what_f_does_and_a_waiting_job_says_it_has_not_run(
    ui_app: Any,
) -> None:
    # "f Follow" while following; an empty pane "output · following" of a job that had
    # not started (tester h83).
    from textual.widgets._footer import FooterKey

    app = await ui_app("1xA100-80GB")
    blocker = await app.backend.submit({"command": ["sleep", "60"], "gpus": 0, "cwd": "/"})
    waiting = await app.backend.submit(
        {"command": ["true"], "gpus": 0, "cwd": "/", "depends_on": [blocker["id"]]}
    )

    def f_says() -> str | None:
        keys = [k for k in app.screen.query(FooterKey) if k.action == "toggle_follow"]
        return keys[0].description if keys else None

    async with app.run_test(size=(140, 40)) as pilot:
        _, log = await _open_log(pilot, app, blocker["id"])
        await until(pilot, lambda: f_says() == "Unfollow", "f: unfollow, while following")
        # (a quiet job's empty box said "following" alone: tester h107)
        assert "following · no output yet" in str(log.border_title)
        await pilot.press("f")
        await until(pilot, lambda: not log.follow and f_says() == "Follow", "f: follow")
        assert "paused (f or G follows)" in str(log.border_title)
        await pilot.press("escape")
        _, log = await _open_log(pilot, app, waiting["id"])
        await until(
            pilot,
            lambda: "not started yet: its output shows here once it runs" in str(log.border_title),
            "the waiting job's pane",
        )
        await app.backend.cancel(blocker["id"])


async def test_a_jobs_first_output_ends_no_output_yet_in_the_title(
    ui_app: Any, tmp_path: Path
) -> None:
    # Its first lines showed under "following · no output yet" for as long as it was
    # quiet after them (testers h109, h110).
    app = await ui_app("1xA100-80GB")
    gate = tmp_path / "speak"
    job = await app.backend.submit(
        {
            "shell": f"while [ ! -e {gate} ]; do sleep 0.02; done; echo hello-late; sleep 60",
            "gpus": 0,
            "cwd": "/",
        }
    )
    async with app.run_test(size=(140, 40)) as pilot:
        _, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: "no output yet" in str(log.border_title), "no output yet")
        gate.touch()
        await until(pilot, lambda: log.bytes_read > 0, "the output shown")
        await until(
            pilot, lambda: "no output yet" not in str(log.border_title), "the title said anew"
        )
        assert "output · following" in str(log.border_title)
        await app.backend.cancel(job["id"])


async def test_an_output_that_cannot_be_read_says_so_in_its_title(embedded_app: Any) -> None:
    # Another user's log that could not be read was titled "no output" (tester h75);
    # here a directory stands where the log was (root reads every file).
    app = await embedded_app("1xA100-80GB")
    job = await app.backend.submit({"command": ["echo", "hello"], "gpus": 0})

    async def ended() -> bool:
        return (await app.backend.job(job["id"]))["job"]["status"] == "completed"

    await eventually(ended)
    path = app.backend.engine.log_path(job["id"])
    path.unlink()
    path.mkdir()
    async with app.run_test(size=(100, 30)) as pilot:
        detail, log = await _open_log(pilot, app, job["id"])
        await until(pilot, lambda: detail._log_done, "the read given up")
        title = str(log.border_title)
        assert title.startswith("output · not readable: "), title
        assert "no output" not in title
