"""Keys typed right after one that opens a form or a field go into it (gpulayer_tui/key_hold.py).

A terminal delivers a fast typist's keys, or a paste, in one burst: the app has them all
before the first one's binding ran. Here the burst is posted the same way, every key at
once, with no pause between them (``pilot.press`` waits after each key, and never saw it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from textual import events
from textual.screen import ModalScreen
from textual.widgets import Input

from gpulayer_tui.app import build_app
from gpulayer_tui.screens.adopt import AdoptScreen
from gpulayer_tui.screens.edit import EditScreen
from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.screens.jobs import JobsScreen
from gpulayer_tui.screens.submit import SubmitScreen
from gpulayer_tui.widgets.job_table import JobTable
from tests.ui_support import FIXED_NOW, StaticBackend, until

NAMED = {" ": "space", "/": "slash", ".": "full_stop", "-": "minus", ":": "colon"}


def _static_app(backend: StaticBackend | None = None) -> Any:
    app = build_app(backend or StaticBackend(), clock=lambda: FIXED_NOW)
    app.cursor_blink = False
    return app


def _burst(app: Any, *keys: str) -> None:
    """Post ``keys`` as one read from the terminal: all queued before the first is handled.
    A key of one character is typed text; a longer one is a key's name."""
    for key in keys:
        if len(key) == 1:
            app.post_message(events.Key(NAMED.get(key, key), key))
        else:
            app.post_message(events.Key(key, None))


def _field(app: Any, screen: type, selector: str) -> Input | None:
    """The field of the form now up, once it is composed (pushed, it has no children yet)."""
    if not isinstance(app.screen, screen):
        return None
    found = app.screen.query(selector)
    return found.first(Input) if found else None


async def _jobs_screen(pilot: Any, job_id: int) -> JobTable:
    await pilot.press("2")
    screen = await until(pilot, lambda: isinstance(pilot.app.screen, JobsScreen), "jobs")
    assert screen
    table = pilot.app.screen.query_one(JobTable)
    await until(pilot, lambda: table.select_job(job_id), f"job {job_id} in the table")
    return table


async def test_a_command_typed_right_after_n_goes_into_the_new_job_form() -> None:
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gpu_state is not None, "the first picture")
        _burst(app, "n", *"python train.py --lr 3")
        command = await until(pilot, lambda: _field(app, SubmitScreen, "#command"), "the form")
        await until(pilot, lambda: command.value == "python train.py --lr 3", "the command")
        assert app.focused is command
        assert not app.key_hold.holding


async def test_keys_typed_after_e_go_into_the_edit_form_not_to_the_table_under_it() -> None:
    backend = StaticBackend()
    app = _static_app(backend)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 11)  # (queued: it may be edited)
        # "c" on the table is cancel: typed in the burst, it must reach the form instead.
        _burst(app, "e", "backspace", "c", "7")
        priority = await until(pilot, lambda: _field(app, EditScreen, "#priority"), "the form")
        await until(pilot, lambda: priority.value.endswith("7"), "the priority typed")
        assert backend.cancelled == []
        assert table.cursor_job_id == 11


async def test_keys_after_one_that_opens_no_form_still_arrive_in_order() -> None:
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _jobs_screen(pilot, 10)  # (running: not edited, a warning says why)
        _burst(app, "e", "1")
        await until(pilot, lambda: app.current_mode == "dashboard", "1: back to the dashboard")
        await until(pilot, lambda: not app.key_hold.holding, "let go once it is shown")
        assert not isinstance(app.screen, EditScreen)


async def test_a_filter_typed_right_after_slash_goes_into_the_filter_line() -> None:
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 10)
        # ("q" on the table quits: typed after "/" it is text in the filter line)
        _burst(app, "/", *"eq")
        field = app.screen.query_one("#filter", Input)
        await until(pilot, lambda: field.value == "eq", "the filter typed")
        assert app.is_running
        await until(pilot, lambda: table.filter_text == "eq", "the filter applied")


@pytest.mark.parametrize("leave", ["enter", "down"])
async def test_keys_after_leaving_the_filter_act_on_the_filtered_rows(leave: str) -> None:
    # "/ sleep enter c y" in one burst cancelled a job the filter hid: the keys after enter
    # ran on the table before the filter applied (tester h139).
    backend = StaticBackend()
    app = _static_app(backend)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 12)  # (eval: the filter "train" hides it)
        _burst(app, "/", *"train", leave, "j", "c")
        await until(pilot, lambda: isinstance(app.screen, ModalScreen), "the cancel dialog")
        _burst(app, "y")
        await until(pilot, lambda: backend.cancelled, "cancelled")
        rows = [int(row.key.value) for row in table.ordered_rows]
        assert rows == [11, 10, 2]
        assert backend.cancelled == [10]  # (j: from the first row shown to the second)


@pytest.mark.parametrize("keys", [("escape", "j", "enter"), ("escape", "enter")])
async def test_a_key_declined_on_the_table_does_not_run_on_the_detail_opened_after_it(
    keys: tuple[str, ...],
) -> None:
    # "esc j enter" on the jobs table (nothing to clear) opened the row and closed it at
    # once: enter, a priority key, opened it before the esc had come back up to the app,
    # whose bindings were the detail's by then (tester h139).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 12)
        rows = [int(row.key.value) for row in table.ordered_rows]
        _burst(app, *keys)
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        await until(pilot, lambda: detail.is_mounted and not app.key_hold.holding, "let go")
        await pilot.pause(0.2)  # (an esc that would close it has come by now)
        assert app.screen is detail
        assert detail.job_id == rows[rows.index(12) + len(keys) - 2]


async def test_a_paste_of_many_lines_into_the_filter_is_refused_saying_so() -> None:
    # It kept the first line, silently; the command field refused it, saying why (h139).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 10)
        _burst(app, "/", *"tr")
        field = app.screen.query_one("#filter", Input)
        await until(pilot, lambda: field.value == "tr", "typed")
        app.post_message(events.Paste("gamma\ndelta"))
        await until(pilot, lambda: app._notifications, "said")
        note = next(iter(app._notifications)).message
        assert note == "pasted 2 lines: the filter is one line; nothing was pasted"
        assert field.value == "tr"
        await until(pilot, lambda: table.filter_text == "tr", "the filter applied")


async def test_keys_after_ctrl_s_find_the_new_job_in_the_table() -> None:
    # "n 'sleep 41' ctrl+s 2 g enter" opened the job before it: the new one came into
    # the table with the next refresh, after the keys (tester h139).
    backend = StaticBackend()
    app = _static_app(backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gpu_state is not None, "the first picture")
        _burst(app, "n", *"sleep 41", "ctrl+s", "2", "g", "enter")
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        assert len(backend.submitted) == 1
        assert detail.job_id == max(backend._jobs)  # (the job just made)


async def test_n_typed_in_a_text_field_is_text_and_holds_nothing() -> None:
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _jobs_screen(pilot, 10)
        await pilot.press("slash")
        _burst(app, *"nn")
        field = app.screen.query_one("#filter", Input)
        await until(pilot, lambda: field.value == "nn", "n typed as text")
        assert not app.key_hold.holding
        assert not isinstance(app.screen, SubmitScreen)


async def test_enter_right_after_moves_opens_the_row_the_cursor_moved_to() -> None:
    # "j j j enter" opened the row the cursor had left: enter (a priority key) ran before
    # the table had its j's (tester h61).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 14)
        rows = [int(row.key.value) for row in table.ordered_rows]
        start = rows.index(14)
        _burst(app, "j", "j", "j", "enter")
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        assert detail.job_id == rows[start + 3]


async def test_a_key_acting_on_the_row_right_after_a_move_acts_on_the_new_row() -> None:
    # "j e" from a cancelled job onto a waiting one said "only a waiting job is edited"
    # of the row left (tester h61).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 13)
        rows = [int(row.key.value) for row in table.ordered_rows]
        assert rows[rows.index(13) + 1] == 12  # (queued: edited)
        _burst(app, "j", "e")
        form = await until(pilot, lambda: _field(app, EditScreen, "#priority") and app.screen)
        assert int(form.job["id"]) == 12


async def test_enter_right_after_a_filter_opens_a_job_the_filter_shows() -> None:
    # "/ word enter enter" opened the job under the old cursor, which the filter hid.
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _jobs_screen(pilot, 14)
        _burst(app, "/", *"train-b", "enter", "enter")
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        assert detail.job_id == 11


async def test_esc_after_text_typed_right_after_n_asks_before_it_drops_it() -> None:
    # The form took what it held "as opened" after the typed-ahead text had landed: one
    # esc dropped it unasked (tester h61).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gpu_state is not None, "the first picture")
        _burst(app, "n", *"echo hi", "escape")
        command = await until(pilot, lambda: _field(app, SubmitScreen, "#command"), "the form")
        form = app.screen
        await until(pilot, lambda: form.form_message == form.DISCARD_WORDS, "the question")
        assert command.value == "echo hi" and app.screen is form


async def test_keys_typed_after_an_area_key_are_for_that_area() -> None:
    # "1 g" moved the cursor of the jobs table being left, "2 G" the dashboard's
    # processes (tester h132).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 10)
        await pilot.press("1")
        await until(pilot, lambda: app.current_mode == "dashboard", "the dashboard")
        _burst(app, "2", "G")
        await until(pilot, lambda: app.current_mode == "jobs", "the jobs")
        await until(pilot, lambda: table.cursor_row == table.row_count - 1, "G: the last row")
        _burst(app, "g", "1", "G")
        await until(pilot, lambda: app.current_mode == "dashboard", "the dashboard again")
        await until(pilot, lambda: not app.key_hold.holding, "let go")
        assert table.cursor_row == 0  # (the G after 1 was the dashboard's)


async def test_a_burst_through_every_area_ends_where_its_last_key_says() -> None:
    # Each area key holds the keys after it until its area is up. A check left from the
    # hold before let go of the hold a replayed `3` had just started, before the strays
    # came: under load the `2 enter` after it went to the area being left, and the detail
    # opened there was closed again while it was being built (NoMatches, the app ended).
    app = _static_app()
    async with app.run_test(size=(80, 24)) as pilot:
        _burst(app, "1", "2", "3", "2", "enter")
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail")
        await until(pilot, lambda: app.screen.is_mounted and not app.key_hold.holding, "let go")
        assert app.current_mode == "jobs" and isinstance(app.screen, JobDetailScreen)
        assert [type(screen) for screen in app.screen_stack] == [JobsScreen, JobDetailScreen]


async def test_keys_held_when_the_app_ends_go_nowhere_and_end_nothing() -> None:
    # `q` then keys: the held ones were let go while the app closed its screens
    # (ScreenStackError; a held `3` opened a new area as the app closed them).
    app = _static_app()
    async with app.run_test(size=(80, 24)) as pilot:
        _burst(app, "1", "j", "2")  # (held: `1` waits a moment for an area that is up)
        await until(pilot, lambda: app.key_hold.holding, "held")
    assert app.return_code in (None, 0)
    assert app.key_hold.current_screen() is None
    assert app.key_hold.take(events.Key("j", "j"))  # (kept from a screen that is gone)


async def test_keys_typed_after_a_palette_command_go_where_the_command_leads() -> None:
    # Enter on a palette's command held nothing: ": new job <enter> sleep 7" gave the form
    # "eep 7", ": cancel <enter> n" left the cancel dialog open (tester h133).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gpu_state is not None, "the first picture")
        _burst(app, ":", *"new job", "enter", *"sleep 7")
        command = await until(pilot, lambda: _field(app, SubmitScreen, "#command"), "the form")
        await until(pilot, lambda: command.value == "sleep 7", "the command")
        assert not app.key_hold.holding


@pytest.mark.parametrize("late", ["before its release", "after its release was asked"])
async def test_a_form_that_came_keeps_its_keys_when_the_hold_limit_is_handled_late(
    late: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under CI's coverage load the limit's timer fired on time but was handled after the
    # form had mounted (its release queued behind it): the keys were dropped, the form
    # stayed empty. Here the late timer is handled at those two moments.
    app = _static_app()
    opened = SubmitScreen.on_mount

    def on_mount(screen: SubmitScreen) -> None:
        hold = app.key_hold
        if late == "before its release":
            hold._limit_reached(hold._held)
        opened(screen)
        if late == "after its release was asked":
            hold._limit_reached(hold._held)

    monkeypatch.setattr(SubmitScreen, "on_mount", on_mount)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gpu_state is not None, "the first picture")
        _burst(app, "n", *"sleep 7")
        command = await until(pilot, lambda: _field(app, SubmitScreen, "#command"), "the form")
        await until(pilot, lambda: command.value == "sleep 7", "the command")
        await until(pilot, lambda: not app.key_hold.holding, "let go")
        assert not app._notifications  # (no "went nowhere")


async def test_a_paste_right_after_n_goes_into_the_form_in_its_place() -> None:
    # A paste that came with the `n` was dropped whole; "n a b <paste> c d" gave "abcd".
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gpu_state is not None, "the first picture")
        _burst(app, "n", "a", "b")
        app.post_message(events.Paste("XY"))
        _burst(app, "c", "d")
        command = await until(pilot, lambda: _field(app, SubmitScreen, "#command"), "the form")
        await until(pilot, lambda: command.value == "abXYcd", "the command")
        await until(pilot, lambda: not app.key_hold.holding, "let go")
        assert command.value == "abXYcd"


async def test_keys_typed_after_a_pid_and_enter_go_into_the_adopt_dialog() -> None:
    # "p 4242 enter zz": the dialog opened with its name untouched, the zz lost (h133).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.screen.is_mounted and app.screen.query("#strays"))
        _burst(app, "p", *"4242", "enter", "z", "z")
        name = await until(pilot, lambda: _field(app, AdoptScreen, "#adopt-name"), "the dialog")
        await until(pilot, lambda: name.value == "zz", "typed over the name offered")
        assert app.focused is name


async def test_esc_and_a_key_read_as_one_alt_key_are_the_two_keys() -> None:
    # The terminal's parser makes "esc j" typed within 0.1 s one `alt+j`, which nothing
    # binds: "esc j enter" in a detail stayed there (tester h133).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 10)
        first = table.cursor_job_id
        await pilot.press("j")
        second = table.cursor_job_id
        await pilot.press("k")
        await until(pilot, lambda: table.cursor_job_id == first)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail")
        await until(pilot, lambda: app.screen.is_mounted, "mounted")
        assert app.screen.job_id == first != second
        app.post_message(events.Key("alt+j", "j"))
        _burst(app, "enter")
        await until(
            pilot,
            lambda: isinstance(app.screen, JobDetailScreen) and app.screen.job_id == second,
            "the next row's detail",
        )
        # (where an alt+ key is bound, as the fields' alt+backspace, it stays one key)
        _burst(app, "n", *"ab cd")
        command = await until(pilot, lambda: _field(app, SubmitScreen, "#command"), "the form")
        await until(pilot, lambda: command.value == "ab cd", "typed")
        await pilot.press("home")
        app.post_message(events.Key("alt+backspace", "\x7f"))  # (a word to the right)
        await until(pilot, lambda: "ab" not in command.value, "a word deleted")
        assert command.value.endswith("cd")
        assert isinstance(app.screen, SubmitScreen)


class _SlowJobBackend(StaticBackend):
    """A job's detail comes only once ``gate`` is set (an engine slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def job(self, job_id: int) -> dict[str, Any]:
        await self.gate.wait()
        return await super().job(job_id)


async def test_keys_held_for_a_form_that_comes_too_late_are_dropped_saying_so() -> None:
    # "e 3 Tab ..." while the engine was slow: the keys went to the table under the form
    # (there "c" is cancel, "R" restart), silently (tester h133).
    backend = _SlowJobBackend()
    app = _static_app(backend)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 11)
        _burst(app, "e", "c", "j")
        await until(pilot, lambda: app.key_hold.holding, "held")
        await until(pilot, lambda: not app.key_hold.holding, "the hold's limit", timeout=5)
        notes = [n.message for n in app._notifications]
        assert any("2 keys typed meanwhile went nowhere" in m for m in notes), notes
        assert table.cursor_job_id == 11 and backend.cancelled == []
        assert not isinstance(app.screen, ModalScreen)  # (no cancel dialog either)
        backend.gate.set()
        await until(pilot, lambda: isinstance(app.screen, EditScreen), "the form, late")


async def test_keys_typed_after_ctrl_s_are_for_the_screen_the_form_leaves() -> None:
    # "n 'sleep 81' ctrl+s j" submitted "sleep 81j"; two forms in one burst made one job
    # (tester h137).
    backend = StaticBackend()
    app = _static_app(backend)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 11)
        await pilot.press("j")
        below = table.cursor_job_id
        await pilot.press("k")
        await until(pilot, lambda: table.cursor_job_id == 11)
        _burst(app, "n", *"sleep 81", "ctrl+s", "j")
        await until(pilot, lambda: table.cursor_job_id == below, "j: the row below")
        _burst(app, "n", *"sleep 82", "ctrl+s", "k")
        await until(pilot, lambda: len(backend.submitted) == 2, "both sent")
        await until(pilot, lambda: not app.key_hold.holding, "let go")
        said = [str(spec) for spec in backend.submitted]
        assert "sleep 81" in said[0] and "81j" not in said[0], said
        assert "sleep 82" in said[1] and "82k" not in said[1], said
        await until(pilot, lambda: table.cursor_job_id == 11, "k: back up")
        _burst(app, "n", *"sleep 83", "ctrl+s", "n", *"sleep 84", "ctrl+s")
        await until(pilot, lambda: len(backend.submitted) == 4, "both of one burst sent")
        said = [str(spec) for spec in backend.submitted[2:]]
        assert "sleep 83" in said[0] and "sleep 84" in said[1], said


async def test_keys_typed_after_esc_in_the_palette_are_for_the_screen_under_it() -> None:
    # ": esc j j" left the cursor where it was (tester h137).
    app = _static_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_screen(pilot, 11)
        await pilot.press("g")
        await until(pilot, lambda: table.cursor_row == 0, "the first row")
        _burst(app, ":", "escape", "j", "j")
        await until(pilot, lambda: table.cursor_row == 2, "two rows down")
        assert not app.key_hold.holding
