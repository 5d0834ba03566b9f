"""The app as a whole: areas, help, themes, quitting with work in flight, attaching."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from gpulayer_tui.app import build_app
from gpulayer_tui.backend import SocketBackend
from gpulayer_tui.engine.config import load_config
from gpulayer_tui.engine.paths import Paths
from gpulayer_tui.screens.dialogs import QuitScreen
from gpulayer_tui.screens.help import HelpScreen
from gpulayer_tui.tui import _connect, start_background_engine
from gpulayer_tui.ui_config import save_theme
from gpulayer_tui.widgets.engine_status import EngineStatus

from .conftest import Served, make_config, pid_gone, wait_for
from .ui_support import FIXED_NOW, StaticBackend, shown_text, until

AppFactory = Callable[..., Awaitable[Any]]


async def test_single_keys_switch_areas_and_help_lists_every_key(
    embedded_app: AppFactory,
) -> None:
    app = await embedded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.current_mode == "dashboard"
        await pilot.press("2")
        await until(pilot, lambda: app.current_mode == "jobs")
        await pilot.press("1")
        await until(pilot, lambda: app.current_mode == "dashboard")
        await pilot.press("question_mark")
        help_screen = await until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen)
        text = "\n".join(shown_text(w) for w in help_screen.query(Static))
        for binding in app.BINDINGS:
            if binding.show:
                assert binding.description in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_command_palette_offers_every_action(embedded_app: AppFactory) -> None:
    app = await embedded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        from gpulayer_tui.palette import KeymapCommands

        titles = {str(h.display) async for h in KeymapCommands(app.screen).discover()}
        assert {"Dashboard", "Jobs", "New job", "Help", "Quit"} <= titles
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {"Theme: gpulayer-dark", "Theme: gpulayer-light"} <= titles


async def test_the_palettes_keys_open_the_help_that_esc_closes(embedded_app: AppFactory) -> None:
    # Textual's "Keys" docked a key panel that no key closed, esc included (h124).
    app = await embedded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        (keys,) = [c for c in app.get_system_commands(app.screen) if c.title == "Keys"]
        keys.callback()
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))
        assert not app.screen.query("HelpPanel")


async def test_the_palettes_screenshot_is_saved_where_there_is_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Textual's saves to ~/Downloads: on a server without one it said only "Failed to
    # save screenshot". Without one, it goes to the folder the TUI was started in.
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        (command,) = [c for c in app.get_system_commands(app.screen) if c.title == "Screenshot"]
        assert str(here) in command.help
        command.callback()
        # (written whole: seen mid-write, under a loaded parallel suite, it read empty)
        saved = await until(
            pilot,
            lambda: [p for p in here.glob("*.svg") if p.read_text().startswith("<svg")],
            "the screenshot",
        )

        def said() -> list[str]:
            return [str(n.message) for n in app._notifications]

        told = f"Saved screenshot to {saved[0]}"
        await until(pilot, lambda: told in said(), "told where")
        assert not any("Failed" in m or "$text" in m for m in said()), said()
        (home / "Downloads").mkdir()  # (where there is one, it is used)
        (command,) = [c for c in app.get_system_commands(app.screen) if c.title == "Screenshot"]
        command.callback()
        downloads = home / "Downloads"
        second = await until(pilot, lambda: list(downloads.glob("*.svg")), "in Downloads")
        # (and told: the saving thread's last act; the app ended before it, the thread's
        # call_from_thread made a coroutine nothing awaited, an error in CI's teardown)
        await until(pilot, lambda: f"Saved screenshot to {second[0]}" in said(), "told again")


@pytest.mark.parametrize(
    ("size", "keys"),
    [
        ((12, 3), ["pagedown"]),
        ((12, 3), ["z", "z", "pagedown"]),
        ((12, 3), ["r", "up", "pageup"]),
        ((4, 3), ["a", "down", "pagedown"]),
        ((4, 40), ["r", "end", "home"]),
    ],
)
async def test_the_command_palette_is_safe_at_any_size(
    size: tuple[int, int], keys: list[str]
) -> None:
    # At 12x3 Textual's OptionList pages by line numbers it never computed (KeyError);
    # 4 columns wide it divides by its content width as it opens (ValueError).
    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: app.screen.id == "--command-palette")
        for key in keys:
            await pilot.press(key)
        await pilot.pause()
        assert app.is_running and app._exception is None
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id != "--command-palette")


async def test_two_enters_read_together_in_the_palette_run_its_command_once() -> None:
    # Typed ahead (or over a slow link) two Enters arrive in one read: the first picked
    # the command and closed the palette, the second closed it again: ScreenStackError,
    # and the app ended.
    from textual import events

    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: app.screen.id == "--command-palette")
        await pilot.press(*"theme: gpulayer-light")
        await pilot.pause()
        for _ in range(2):
            app.post_message(events.Key("enter", "\r"))
        await until(pilot, lambda: app.screen.id != "--command-palette")
        await pilot.pause()
        assert app.is_running and app._exception is None
        assert app.theme == "gpulayer-light"


async def test_keys_typed_in_one_burst_in_the_palette_apply_in_their_order() -> None:
    # ctrl+u then "pause" in one read: the letters were typed, then the ctrl+u (a binding,
    # run once the key had bubbled to the App) cleared them all (tester h198).
    from textual import events
    from textual.widgets import Input

    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: app.screen.id == "--command-palette")
        await pilot.press(*"drain")
        line = app.screen.query_one(Input)
        await until(pilot, lambda: line.value == "drain")
        for key, char in [("ctrl+u", None), *((c, c) for c in "pause")]:
            app.post_message(events.Key(key, char))
        await until(pilot, lambda: line.value == "pause", "the burst in its order")
        app.post_message(events.Key("backspace", None))
        app.post_message(events.Key("backspace", None))
        app.post_message(events.Key("x", "x"))
        await until(pilot, lambda: line.value == "paux", "backspaces in a burst")


async def test_a_screen_shown_again_after_a_theme_switch_has_the_new_theme() -> None:
    # Screens shown again keep their styles unless the app's look changed (KeepsStylesOnResume).
    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        jobs = await until(pilot, lambda: app.current_mode == "jobs" and app.screen)
        header = jobs.query_one(EngineStatus)
        dark = header.styles.background
        await pilot.press("1")
        await until(pilot, lambda: app.current_mode == "dashboard")
        await pilot.press("t")
        await until(pilot, lambda: app.theme == "gpulayer-light")
        light = app.screen.query_one(EngineStatus).styles.background
        assert light != dark
        await pilot.press("2")
        await until(pilot, lambda: app.current_mode == "jobs")
        await pilot.pause()
        assert header.styles.background == light
        await pilot.press("1", "2")  # (nothing changed: shown as it was)
        await until(pilot, lambda: app.current_mode == "jobs")
        await pilot.pause()
        assert header.styles.background == light


async def test_a_job_submitted_while_the_app_loads_its_first_picture_is_shown(
    ui_app: AppFactory,
) -> None:
    # The app subscribes to events before it loads: a job that arrives after the load read
    # its page comes as an event. (Loading first lost it until the stream reconnected.)
    app = await ui_app()
    engine = app.backend.engine
    read_page = app.backend.jobs_page
    submitted: list[int] = []

    async def jobs_page(**query: Any) -> Any:
        page = await read_page(**query)
        if not submitted and not query.get("status"):  # the newest page, after the active
            job = await engine.submit({"command": ["sleep", "600"], "name": "late"})
            submitted.append(job.id)
        return page

    app.backend.jobs_page = jobs_page
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: submitted, "the submission during the load")
        await until(
            pilot,
            lambda: submitted[0] in app.job_store.jobs,
            "the job submitted during the load, in the app's store",
        )


async def test_a_stream_that_never_says_hello_still_gets_a_first_picture() -> None:
    # An engine that accepts the event stream but stalls before its hello: the first
    # frame waits a moment for it, then loads the state anyway (not a blank screen).
    class Stalled(StaticBackend):
        async def events(self) -> Any:
            await asyncio.Event().wait()
            yield {}

    app = build_app(Stalled(n_gpus=2), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gpu_state is not None, "the first picture", timeout=15)
        assert len(app.job_store.jobs) > 0


async def test_theme_switch_is_saved_in_config(embedded_app: AppFactory, paths: Paths) -> None:
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text("# my settings\n[engine]\ngrace_period = 2.0\n")
    app = await embedded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.theme == "gpulayer-dark"
        await pilot.press("t")
        await until(pilot, lambda: app.theme == "gpulayer-light")
        # One toast says which (it was two at once: tester h83).
        await until(pilot, lambda: len(app._notifications) > 0, "the toast")
        await pilot.pause()
        said = [n.message for n in app._notifications]
        assert said == ["theme: gpulayer-light (t: the next; ctrl+p lists them)"], said
        # t t while the first is shown: the newest toast names the theme in use (the
        # third, alike to the first, was dropped, "dark" left below it: tester h120).
        await pilot.press("t")
        await until(pilot, lambda: app.theme == "gpulayer-dark")
        await pilot.press("t")
        await until(pilot, lambda: app.theme == "gpulayer-light")
        await pilot.pause()
        said = [n.message.split(" (")[0] for n in app._notifications]
        assert said == ["theme: gpulayer-dark", "theme: gpulayer-light"], said
    config = load_config(paths.config_file)
    assert config.ui.theme == "gpulayer-light"
    assert config.engine.grace_period == 2.0
    assert paths.config_file.read_text().startswith("# my settings\n")
    again = build_app(StaticBackend(), theme=config.ui.theme, clock=lambda: FIXED_NOW)
    async with again.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert again.theme == "gpulayer-light"
    # A theme no theme has says which there are (it said only "unknown theme": h131).
    unknown = build_app(StaticBackend(), theme="nope", clock=lambda: FIXED_NOW)
    async with unknown.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: unknown._notifications, "the toast")
        (said,) = [n.message for n in unknown._notifications]
        assert unknown.theme == "gpulayer-dark"
        assert said.startswith("[ui] theme 'nope' is no theme: the TUI uses gpulayer-dark")
        assert "ours: gpulayer-dark, gpulayer-light" in said


@pytest.mark.parametrize(
    "config",
    ['# mine\nui.theme = "gpulayer-dark"\n', 'ui = { theme = "gpulayer-dark" }\n', "[ui\n"],
    ids=["dotted-key", "inline-table", "not-toml"],
)
async def test_a_theme_that_cannot_be_saved_leaves_the_config_as_it_was(
    embedded_app: AppFactory, paths: Paths, config: str
) -> None:
    # `t` wrote a [ui] table after a dotted `ui.theme` key: "Cannot declare ('ui',)
    # twice", and neither the TUI nor an engine could start on the file again.
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(config)
    with pytest.raises(ValueError, match=r"left as it is|cannot edit alone"):
        save_theme(paths.config_file, "gpulayer-light")
    assert paths.config_file.read_text() == config
    if config.startswith("[ui"):
        return  # (no TUI starts on a config that is not TOML)
    app = await embedded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("t")
        await until(pilot, lambda: app.theme == "gpulayer-light")
        await until(
            pilot,
            lambda: any("theme not saved" in n.message for n in app._notifications),
            "the warning",
        )
    assert paths.config_file.read_text() == config
    # A [ui] table of its own, with a table after it, is edited in place.
    paths.config_file.write_text('[ui]\ntheme = "a" # x\n[engine]\ngrace_period = 2.0\n')
    save_theme(paths.config_file, "gpulayer-light")
    assert load_config(paths.config_file).ui.theme == "gpulayer-light"
    assert paths.config_file.read_text().endswith("[engine]\ngrace_period = 2.0\n")


def test_saving_the_theme_keeps_the_files_link_mode_endings_and_comments(tmp_path: Path) -> None:
    # Written through a temp file renamed over the path: a symlinked config became a plain
    # file, a 0600 one (it may hold a webhook URL) 0644, a read-only one was overwritten,
    # CRLF endings came back LF and the theme line's own comment went.
    real = tmp_path / "dotfiles" / "gpulayer.toml"
    real.parent.mkdir()
    real.write_bytes(b'# mine\r\n[ui]\r\ntheme = "gpulayer-dark"  # my pick\r\n')
    real.chmod(0o600)
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    save_theme(link, "gpulayer-light")
    assert link.is_symlink() and link.resolve() == real
    assert real.read_bytes() == b'# mine\r\n[ui]\r\ntheme = "gpulayer-light"  # my pick\r\n'
    assert real.stat().st_mode & 0o777 == 0o600
    real.chmod(0o444)
    with pytest.raises(ValueError, match="is read-only"):
        save_theme(link, "gpulayer-dark")
    assert b"gpulayer-light" in real.read_bytes()
    fresh = tmp_path / "new" / "config.toml"
    save_theme(fresh, "gpulayer-dark")
    assert fresh.stat().st_mode & 0o777 == 0o600


async def test_quit_without_work_exits_at_once(embedded_app: AppFactory) -> None:
    app = await embedded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running)
    assert app.return_value == ""


async def test_quit_asks_first_when_other_windows_follow_the_engine(
    embedded_app: AppFactory, paths: Paths
) -> None:
    # With no jobs it quit at once, and the TUIs attached from other windows lost their
    # engine with no word.
    app = await embedded_app()
    # (another process: the TUI's own engine follows itself through its socket too)
    follower = (
        "import asyncio, sys\n"
        "from gpulayer_tui.backend import SocketBackend\n"
        "from gpulayer_tui.engine.paths import resolve_paths\n"
        "async def main():\n"
        "    async for _ in SocketBackend(resolve_paths()).events():\n"
        "        pass\n"
        "asyncio.run(main())\n"
    )
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", follower, env={**os.environ, "GPULAYER_HOME": str(paths.state_dir)}
    )
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.backend.attached_elsewhere() == 1, "attached")
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, QuitScreen))
            said = " ".join(str(w.render()) for w in app.screen.query("#quit-dialog Static"))
            assert "1 other window is attached to it." in said
            assert "the other windows stay attached" in said
            assert "Stop: quit; the other windows lose their engine" in said
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, QuitScreen))
            other.kill()
            await other.wait()
            await until(pilot, lambda: app.backend.attached_elsewhere() == 0, "gone")
            await pilot.press("q")
            await until(pilot, lambda: not app.is_running)
        assert app.return_value == ""
    finally:
        with contextlib.suppress(ProcessLookupError):
            other.kill()
        await other.wait()


async def test_quit_with_running_job_can_stop_it(embedded_app: AppFactory, sleeper: int) -> None:
    app = await embedded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        job = await app.backend.submit({"command": ["sleep", "600"]})
        adopted = await app.backend.adopt({"pid": sleeper})
        await until(pilot, lambda: app.job_store.active_count() == 2)
        await pilot.press("ctrl+q")  # (Textual's own quit key went without asking)
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("ctrl+q")  # (and inside the dialog too)
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, QuitScreen)
        await pilot.press("escape")  # stay
        await until(pilot, lambda: not isinstance(app.screen, QuitScreen))
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("escape")  # stay
        await until(pilot, lambda: not isinstance(app.screen, QuitScreen))
        assert app.is_running
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("s")
        await until(pilot, lambda: not app.is_running)
    assert app.job_store.jobs[job["id"]]["status"] == "cancelled"
    assert pid_gone(job["pid"])
    # adopted processes are left alone when the TUI quits
    assert app.job_store.jobs[adopted["id"]]["status"] == "running"
    assert not pid_gone(sleeper)


async def test_the_quit_dialog_is_asked_once_and_a_choice_to_stop_stands(
    embedded_app: AppFactory,
) -> None:
    # ctrl+c (a priority key) inside the dialog stacked a second one; and q while the jobs
    # were stopping asked again, where "keep running" quit at once, saying the stopped
    # jobs were handed over.
    app = await embedded_app(config=make_config(engine={"grace_period": 60.0}))
    async with app.run_test(size=(100, 30)) as pilot:
        job = await app.backend.submit({"shell": "trap '' TERM; sleep 600"})
        await until(pilot, lambda: app.job_store.active_count() == 1)
        await pilot.press("ctrl+c", "ctrl+c")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        assert sum(isinstance(s, QuitScreen) for s in app.screen_stack) == 1
        await pilot.press("s")
        await until(pilot, lambda: not isinstance(app.screen, QuitScreen))
        await until(
            pilot,
            lambda: "stopping" in str(app.job_store.jobs[job["id"]].get("message")),
            "the job stopping (it outlives SIGTERM)",
        )
        await pilot.press("q")
        await pilot.pause()
        assert not any(isinstance(s, QuitScreen) for s in app.screen_stack)
        said = [n.message for n in app._notifications]
        assert "stopping the jobs; the app quits once they have ended" in said
        assert app.is_running
        # One submitted meanwhile (another shell) is stopped too: it ran on with no engine.
        late = await app.backend.submit({"command": ["sleep", "600"]})
        await until(
            pilot,
            lambda: app.job_store.jobs.get(late["id"], {}).get("status") == "cancelled",
            "the late job stopped",
        )
        os.killpg(job["pid"], signal.SIGKILL)
        await until(pilot, lambda: not app.is_running, "quit once the job ended", timeout=30)
    assert app.return_value == ""
    assert pid_gone(late["pid"])


async def test_quit_handover_keeps_jobs_running_in_a_background_engine(
    embedded_app: AppFactory, paths: Paths, served: Served
) -> None:
    app = await embedded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        job = await app.backend.submit({"command": ["sleep", "600"], "name": "long"})
        queued = await app.backend.submit(
            {"command": ["true"], "depends_on": [job["id"]], "name": "after"}
        )
        await until(pilot, lambda: app.job_store.active_count() == 2)
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("k")
        await until(pilot, lambda: not app.is_running)
    assert app.return_value == "handover"
    await app.backend.close()
    assert not pid_gone(job["pid"])  # the job outlived the TUI's engine

    served.proc = await asyncio.to_thread(start_background_engine, paths, "2xA100-80GB", None)
    status = json.loads(served.cli("status", str(job["id"]), "--json").stdout)["job"]
    assert status["status"] == "running" and status["pid"] == job["pid"]
    waiting = json.loads(served.cli("status", str(queued["id"]), "--json").stdout)["job"]
    assert waiting["status"] == "queued" and waiting["message"] == f"waiting for job {job['id']}"
    assert served.cli("cancel", str(job["id"])).returncode == 0
    assert served.cli("wait", str(queued["id"])).returncode == 1  # cascade-cancelled
    wait_for(lambda: pid_gone(job["pid"]))


async def test_attaches_to_a_running_serve_and_follows_it(served: Served, paths: Paths) -> None:
    served.start("--simulate", "2xA100-80GB")
    first = served.cli("submit", "--name", "from-cli", "--", "true").stdout.strip()
    assert served.cli("wait", first).returncode == 0
    backend = await _connect(paths, None, None)
    assert isinstance(backend, SocketBackend)
    app = build_app(backend, refresh_interval=0.05)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: int(first) in app.job_store.jobs)
            assert app.job_store.jobs[int(first)]["name"] == "from-cli"
            where = str(app.screen.query_one("#where").render())
            assert f"attached to {paths.socket}" in where
            # a job submitted elsewhere arrives through the event stream
            second = int(served.cli("submit", "--name", "later", "--", "true").stdout)
            await until(
                pilot,
                lambda: app.job_store.jobs.get(second, {}).get("status") == "completed",
            )
            # the engine goes away: the app says so and keeps running
            served.stop()
            await until(pilot, lambda: app.connection_problem != "", timeout=15)
            assert app.is_running
    finally:
        await backend.close()


def test_help_snapshot(snap_compare: Any) -> None:
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    assert snap_compare(app, press=["question_mark"], terminal_size=(100, 40))


def test_quit_dialog_snapshot(snap_compare: Any) -> None:
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    assert snap_compare(app, press=["q"], terminal_size=(100, 30))


async def test_a_question_too_tall_for_the_terminal_scrolls_to_its_buttons() -> None:
    # At 40x12 the quit dialog's buttons were cut off, out of the mouse's reach (h165).
    from textual.widgets import Button

    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(40, 12)) as pilot:
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        dialog = app.screen.query_one("#quit-dialog")
        button = app.screen.query_one("#handover", Button)
        seen = dialog.content_region

        def in_sight() -> bool:
            return seen.y <= button.region.y and button.region.bottom <= seen.bottom

        await until(pilot, lambda: dialog.max_scroll_y > 0 and in_sight(), "the buttons")
        assert app.screen.focused is button
        # Each button whole, one above the other: in a row the last was cut off (h170).
        assert app.screen.has_class("-narrow")
        for each in app.screen.query(Button):
            assert seen.x <= each.region.x and each.region.right <= seen.right, each
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, QuitScreen))
        # Opened wide, then made small: the focused button is brought into sight (it
        # stayed below the edge until Tab: tester h170).
        await pilot.resize_terminal(120, 40)
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.pause()
        assert not app.screen.has_class("-narrow")
        await pilot.resize_terminal(40, 12)
        dialog = app.screen.query_one("#quit-dialog")
        button = app.screen.query_one("#handover", Button)
        seen = dialog.content_region
        await until(pilot, lambda: in_sight() and app.screen.has_class("-narrow"), "in sight")


async def test_the_quit_question_says_one_job_in_the_singular() -> None:
    # "1 job is running or queued ... takes them over" (tester h170).
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        for active, takes in ((1, "takes it over"), (3, "takes them over")):
            app.push_screen(QuitScreen(active))

            def said() -> str:
                if not isinstance(app.screen, QuitScreen):
                    return ""
                return " ".join(str(w.render()) for w in app.screen.query("#quit-dialog Static"))

            await until(pilot, lambda takes=takes: takes in said(), takes)
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, QuitScreen))
        # Adopted processes are counted apart: "Stop" leaves them alone, and "3 jobs" of
        # one job and two adopted processes read as three to cancel (tester h182 #9).
        app.push_screen(QuitScreen(1, adopted=2))
        await until(pilot, lambda: "adopted" in said(), "adopted")
        assert (
            "1 job is running or queued in this window's engine. 2 adopted processes are "
            "watched by it."
        ) in said(), said()
        assert "Stop: cancel every job, then quit. Adopted processes are left alone" in said()
        await pilot.press("escape")
        app.push_screen(QuitScreen(0, adopted=1))
        await until(pilot, lambda: "Stop: quit. Adopted processes are left alone" in said())
