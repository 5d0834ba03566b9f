"""The key map (gpulayer_tui/keymap.py): one key, one meaning per screen; vim movement;
number keys switch screens; help and the palette are generated from it; modal forms say
their own keys."""

from __future__ import annotations

from typing import Any

from textual.widgets import Footer, Input, Static
from textual.widgets._footer import FooterKey

from gpulayer_tui import keymap
from gpulayer_tui.app import build_app
from gpulayer_tui.palette import KeymapCommands
from gpulayer_tui.screens.help import HelpScreen
from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.screens.jobs import JobsScreen
from gpulayer_tui.screens.submit import SubmitScreen
from gpulayer_tui.widgets.job_table import JobTable
from gpulayer_tui.widgets.log_tail import LogTail
from tests.ui_support import FIXED_NOW, StaticBackend, shown_text, until

SCREENS = ("dashboard", "jobs", "detail", "strays", "users")
"""Non-modal screens: the App's keys and the tables' keys work there too."""
MODALS = ("submit", "edit", "adopt", "signal", "confirm", "quit", "help")


def _static_app() -> Any:
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW)
    app.cursor_blink = False
    return app


def test_no_key_means_two_things_on_one_screen_and_every_key_says_what_it_does() -> None:
    for screen in (*SCREENS, *MODALS):
        scopes = (screen, keymap.APP, keymap.TABLE) if screen in SCREENS else (screen,)
        seen: dict[str, str] = {}
        for key in (k for scope in scopes for k in keymap.keys_of(scope)):
            assert key.description.strip(), key
            for name in keymap.key_names(key):
                if key.when and screen in SCREENS:
                    # A key with a `when` may shadow an App key, or one of its screen's
                    # listed after it (the detail's esc: "End search" while searching, else
                    # "Back"): the screen declines it outside that state, so the other acts.
                    others = [k for k in keymap.keys_of(screen) if name in keymap.key_names(k)]
                    assert others[0] == key, (screen, name)
                    assert all(not k.when for k in others[1:]), (screen, name)
                    continue
                assert seen.setdefault(name, key.action) == key.action, (screen, name)
    for key in keymap.KEYMAP:
        assert set(key.scopes) <= set(keymap.SCREEN_TITLES), key


def test_one_idea_one_key_across_screens() -> None:
    # A key used on several screens does one thing (sort, reverse, cancel...) wherever it is.
    by_key: dict[str, set[str]] = {}
    for key in keymap.KEYMAP:
        if key.when:
            continue  # (n / N: the log's matches while searching; else n is the App's)
        if any(s in SCREENS or s in (keymap.APP, keymap.TABLE) for s in key.scopes):
            for name in keymap.key_names(key):
                by_key.setdefault(name, set()).add(key.action)
    clashes = {k: a for k, a in by_key.items() if len(a) > 1}
    # escape is "back out" everywhere: leave the detail, clear the filter, close the pid field.
    # / finds: it filters the jobs table and searches the detail's log.
    assert set(clashes) <= {"escape", "slash"}, clashes


async def test_number_keys_switch_screens_and_vim_keys_move() -> None:
    app = _static_app()
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: app.current_mode == "jobs")
        table = app.screen.query_one(JobTable)
        await until(pilot, lambda: table.row_count == 10, "rows")
        assert table.cursor_row == 0
        await pilot.press("j", "j")
        assert table.cursor_row == 2
        await pilot.press("k")
        assert table.cursor_row == 1
        await pilot.press("G")
        assert table.cursor_row == 9
        await pilot.press("g")
        assert table.cursor_row == 0
        assert app.current_mode == "jobs"  # j/k/g moved, they did not switch screens
        await pilot.press("slash")
        assert app.focused is app.screen.query_one("#filter", Input)
        assert app.screen.query_one("#filter-row").has_class("-open")
        await pilot.press("escape", "1")
        await until(pilot, lambda: app.current_mode == "dashboard")
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "strays")
        await pilot.press("4")
        await until(pilot, lambda: app.current_mode == "users")


async def _palette_titles(screen: Any) -> set[str]:
    provider = KeymapCommands(screen)
    return {str(hit.display) async for hit in provider.discover()}


async def test_palette_offers_each_screens_actions() -> None:
    app = _static_app()
    async with app.run_test(size=(140, 30)) as pilot:
        everywhere = {"Dashboard", "Jobs", "Strays", "Users", "New job", "Help", "Quit"}
        dashboard = await _palette_titles(app.screen)
        assert everywhere | {"Sort", "Reverse sort"} <= dashboard
        assert "Cancel job" not in dashboard
        await pilot.press("2")
        await until(pilot, lambda: app.current_mode == "jobs")
        await until(pilot, lambda: app.screen.query_one(JobTable).row_count == 10, "rows")
        jobs = await _palette_titles(app.screen)
        assert (
            everywhere | {"Cancel job", "Filter", "Sort", "Reverse sort", "Status filter"} <= jobs
        )
        await pilot.press("enter")
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        await until(
            pilot, lambda: detail._job is not None and (detail._log_done or not detail.finished)
        )
        offered = await _palette_titles(detail)
        assert {"Cancel job", "GPU usage", "Back"} <= offered
        # (f: while output may still come, not for an ended job's output read to its end)
        follow = {"Follow output", "Stop following output"} & offered
        assert bool(follow) is not detail.finished
        assert "Next replica" not in offered  # a batch job has no replicas (services do)
        await pilot.press("escape", "3")
        await until(pilot, lambda: app.current_mode == "strays")
        assert {"Adopt", "Adopt a pid"} <= await _palette_titles(app.screen)
        # Our themes only (saved as t saves them), not Textual's unsaved theme picker.
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {"Theme: gpulayer-dark", "Theme: gpulayer-light"} <= titles
        assert "Theme" not in titles


async def test_help_lists_every_key_of_the_current_screen() -> None:
    app = _static_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen))
        await pilot.press("question_mark")
        help_screen = await until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen)
        for scope in ("jobs", keymap.TABLE, keymap.APP):
            text = shown_text(help_screen.query_one(f".help-{scope}", Static))
            for key in keymap.keys_of(scope):
                assert key.description in text and key.shown_keys in text, key
        first = help_screen.query(".help-section").first()
        assert "Jobs" in str(first.render())  # this screen's keys come first
        # Every key of a binding is named where the footer has room for one: backspace
        # (back, in the detail; the README names it) was said nowhere (tester h183 #3).
        detail = shown_text(help_screen.query_one(".help-detail", Static))
        assert "esc, backspace" in detail and "Back" in detail, detail
        # j/k scroll it, as they move in every table (only down and pgdn did: tester h70)
        await pilot.resize_terminal(80, 24)
        dialog = help_screen.query_one("#help-dialog")
        await until(pilot, lambda: dialog.max_scroll_y > 2, "more keys than fit")
        await pilot.press("j", "j")
        await until(pilot, lambda: dialog.scroll_y == 2, "two rows down")
        await pilot.press("k")
        await until(pilot, lambda: dialog.scroll_y == 1, "one up")
        await pilot.press("G")
        await until(pilot, lambda: dialog.scroll_y == dialog.max_scroll_y, "the end")
        await pilot.press("g")
        await until(pilot, lambda: dialog.scroll_y == 0, "the top")
        # A description too long for the dialog wraps under itself, not under the keys (h124).
        keys = help_screen.query_one(".help-jobs", Static)
        await until(pilot, lambda: keys.content_region.width < 70, "the dialog narrowed")
        lines = shown_text(keys, keys.content_region.width).splitlines()
        at = next(i for i, line in enumerate(lines) if "Mark every waiting" in line)
        column = lines[at].index("Mark every waiting")
        assert column > 4 and lines[at + 1][:column].strip() == "", lines[at : at + 2]
        assert lines[at + 1][column:].strip(), "the rest of the description"


async def test_new_job_form_shows_its_submit_key_at_80x24() -> None:
    app = _static_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("n")
        form = await until(pilot, lambda: isinstance(app.screen, SubmitScreen) and app.screen)
        footer = form.query_one(Footer)

        def submit_key() -> FooterKey | None:
            # (A key can be in the footer a moment before it is laid out: region 0x0.)
            key = next((k for k in footer.query(FooterKey) if k.action == "submit"), None)
            return key if key is not None and key.region.height == 1 else None

        submit = await until(pilot, submit_key, "the submit key laid out")
        assert "cancel" in {k.action for k in footer.query(FooterKey)}
        assert 0 <= submit.region.y < 24 and submit.region.right <= 80


async def test_at_80_columns_every_footer_shows_whole_keys_its_own_first() -> None:
    app = _static_app()
    async with app.run_test(size=(80, 24)) as pilot:
        for screen_key, name in (
            ("1", "dashboard"),
            ("2", "jobs"),
            ("3", "strays"),
            ("", "detail"),
        ):
            if screen_key:
                await pilot.press(screen_key)
            else:
                await pilot.press("2", "enter")
                await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "detail")
            # (the area's screen, mounted: under load it is still being built a moment)
            await until(
                pilot,
                lambda name=name: (
                    name in type(app.screen).__name__.lower()
                    and app.screen.is_mounted
                    and not app.key_hold.holding
                ),
                name,
            )
            footer = app.screen.query_one(Footer)

            def palette_key(footer: Footer = footer) -> FooterKey | None:
                # (in the footer a moment before it is laid out: region 0x0)
                key = next(
                    (k for k in footer.query(FooterKey) if k.has_class("-command-palette")), None
                )
                return key if key is not None and key.region.width else None

            palette = await until(pilot, palette_key, "the palette's key laid out")
            keys = [k for k in footer.query(FooterKey) if not k.has_class("-command-palette")]
            edge = palette.region.x
            # The palette's key takes the last column (nothing shows through beside it),
            # and no key runs under it: each is shown whole before it, or not at all.
            assert palette.region.right == 80, (name, palette.region)
            under = [k.description for k in keys if k.display and k.region.right > edge]
            assert under == [], (name, under)
            shown = [k.action for k in keys if k.region.right <= edge]
            # The screen's own keys (before the App's) all fit.
            app_actions = {key.action for key in keymap.KEYMAP if keymap.APP in key.scopes}
            own = [k.action for k in keys if k.action not in app_actions]
            assert own and set(own) <= set(shown), (name, shown, own)
            # And help, which lists the rest, in place of the last App key that fit (it
            # fell off the end: tester h70).
            assert any(k.key == "question_mark" and k.display for k in keys), (name, shown)
        if isinstance(app.screen, JobDetailScreen):
            await pilot.press("escape")


async def test_at_80_columns_the_way_out_of_a_search_or_filter_stays_in_the_footer() -> None:
    # With a filter set or a log searched the footer grew, and "esc Clear" / "esc Back"
    # fell off the end first: the way out was the key not shown (tester h95). Dimmed keys
    # give way before it.
    app = _static_app()

    def esc_says() -> str | None:
        footer = app.screen.query_one(Footer)
        keys = [k for k in footer.query(FooterKey) if k.key == "escape" and k.display]
        edge = next(k for k in footer.query(FooterKey) if k.has_class("-command-palette"))
        assert all(k.region.right <= edge.region.x for k in keys)
        return str(keys[0].description) if keys else None

    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2", "slash", "a", "enter")
        await until(pilot, lambda: esc_says() == "Clear", "esc: clear the filter")
        await pilot.press("escape", "enter")
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "detail")
        await pilot.press("slash", "a", "enter")
        await until(pilot, lambda: esc_says() == "End search", "esc: end the search")
        keys = {str(k.description) for k in app.screen.query(FooterKey) if k.display}
        # (n and N are dimmed here, this job's log having no match: they give way)
        assert "Help" in keys and not {"Next", "Prev"} & keys, keys


async def test_the_palette_titles_follow_as_it_stands(ui_app: Any) -> None:
    # "Follow output" was offered while the log was followed, and picked it stopped it
    # (tester h173).
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit({"shell": "while :; do echo x; sleep 0.2; done", "gpus": 0})
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_job(job["id"])
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        log = await until(pilot, lambda: next(iter(detail.query(LogTail)), None))
        await until(pilot, lambda: log.follow, "following")
        offered = await _palette_titles(detail)
        assert "Stop following output" in offered and "Follow output" not in offered
        await pilot.press("f")
        await until(pilot, lambda: not log.follow, "paused")
        offered = await _palette_titles(detail)
        assert "Follow output" in offered and "Stop following output" not in offered
        await app.backend.cancel(job["id"])
