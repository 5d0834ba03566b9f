"""The strays screen and the adopt dialog, over a real engine and real processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from gpulayer_tui.app import build_app
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.screens.adopt import AdoptScreen
from gpulayer_tui.widgets.stray_table import StrayTable

from .ui_support import FIXED_NOW, StaticBackend, shown_text, until

AppFactory = Callable[..., Awaitable[Any]]
GIB = 1024**3


def _adopt_dialog(app: Any) -> AdoptScreen | None:
    """The adopt dialog once it is mounted (pushed, it has no widgets yet a moment)."""
    return app.screen if isinstance(app.screen, AdoptScreen) and app.screen.is_mounted else None


async def _open_strays(pilot: Any, app: Any) -> None:
    await pilot.press("3")
    await until(pilot, lambda: app.current_mode == "strays", "the strays screen")


async def _listed(pilot: Any, app: Any, pid: int) -> StrayTable:
    """The strays screen, once it lists ``pid``."""
    await _open_strays(pilot, app)
    table = app.screen.query_one(StrayTable)
    await until(pilot, lambda: pid in table.rows_by_pid)
    return table


async def test_a_selected_stray_the_engine_can_never_adopt_is_said_before_any_dialog(
    ui_app: AppFactory,
) -> None:
    # The dialog opened on init (or another user's process, or the engine), and its
    # refusal after ctrl+s left a failed job in the history (tester h171).
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(0, 1, 5.0)  # (pid 1: init)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        await _listed(pilot, app, 1)
        app.screen.query_one(StrayTable).move_cursor(row=0)
        await pilot.press("a")
        told = await until(
            pilot, lambda: next((n for n in app._notifications if n.title == "adopt"), None)
        )
        assert "pid 1" in told.message and told.severity == "error", told.message
        await pilot.pause()
        assert not isinstance(app.screen, AdoptScreen)
        assert not app.job_store.jobs  # (no failed job left behind)


async def test_adopt_a_stray_from_the_table(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(1, sleeper_proc.pid, 20.0)
    SimLedger(engine.paths.state_dir).hold(0, sleeper_proc.pid, 5.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _listed(pilot, app, sleeper_proc.pid)
        row = table.rows_by_pid[sleeper_proc.pid]
        assert sorted(row["gpus"]) == [0, 1] and row["used_bytes"] == 25 * GIB
        assert "sleep 600" in row["command"]
        assert app.gpu_state["unregistered_total"] == 25 * GIB
        await pilot.press("a")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        # Per GPU: the most it holds on one (the sum over its GPUs was offered)
        assert dialog.query_one("#adopt-vram", Input).value == "20.0"
        # (emptied, it said "e.g. 24", where empty is what it holds: tester h124)
        assert dialog.query_one("#adopt-vram", Input).placeholder == "20.0: what it holds"
        assert dialog.query_one("#adopt-name", Input).value == "sleep"
        name = dialog.query_one("#adopt-name", Input)
        name.value = "notebook"
        await pilot.press("ctrl+s")
        job = await until(
            pilot,
            lambda: next((j for j in app.job_store.jobs.values() if j["kind"] == "adopted"), None),
        )
        assert job["status"] == "running" and job["name"] == "notebook"
        assert job["domains"] == ["gpu0", "gpu1"] and job["spec"]["vram_gb"] == 20.0
        # on the next sample its memory is owned: the row leaves, unregistered shrinks
        await engine.sampler.sample_once()
        await until(pilot, lambda: sleeper_proc.pid not in table.rows_by_pid)
        assert app.gpu_state["unregistered_total"] == 0
        # Its detail says where its output is (the pane stayed blank, "following").
        app.open_job(job["id"])
        log = await until(pilot, lambda: app.screen.query("#log") and app.screen.query_one("#log"))
        await until(
            pilot,
            lambda: "an adopted process writes where it was started" in str(log.border_title),
            "the log pane's word",
        )
        # Nothing to search there: "/" is dimmed ("/x: no match" was said of no output: h99)
        assert app.screen.check_action("search_log", ()) is None
        await app.backend.cancel(job["id"])


@pytest.fixture
def spaced_stray() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose argv[0] is a path with a space and a terminal escape in it."""
    argv = [b"/opt/my tool/run\x1b]0;T\x07 thing", b"-c", b"import time; time.sleep(600)"]
    stray = subprocess.Popen(argv, executable=sys.executable, start_new_session=True)
    yield stray
    stray.kill()
    stray.wait()


async def test_the_adopt_dialog_offers_the_programs_name_whole_and_as_a_name_may_be(
    ui_app: AppFactory, spaced_stray: subprocess.Popen[bytes]
) -> None:
    # Made from the row's command text, a program under "/opt/my tool/" was offered "my",
    # and an escape in an argv0 was offered as the text "\\x1b" (tester h163).
    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(0, spaced_stray.pid, 5.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        await _listed(pilot, app, spaced_stray.pid)
        await pilot.press("a")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        name = dialog.query_one("#adopt-name", Input)
        await until(pilot, lambda: name.value == "run thing", f"the name ({name.value!r})")
        await pilot.press("escape")  # (untouched: closes without asking)
        await until(pilot, lambda: not isinstance(app.screen, AdoptScreen), "closed")


async def test_adopt_any_pid_by_typing_and_refusals_are_shown(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await _open_strays(pilot, app)
        # No stray listed: a and x are dimmed in the footer (a did nothing at all, with no
        # word; then they said "no process selected" from a footer that offered them:
        # tester h95); pressed anyway they say why, as the jobs table's dimmed keys do
        # (they did nothing at all: tester h120).
        from textual.widgets._footer import FooterKey

        def dimmed() -> set[str]:
            keys = app.screen.query(FooterKey)
            return {str(k.key) for k in keys if k.has_class("-disabled")}

        await until(pilot, lambda: {"a", "x"} <= dimmed(), "a and x dimmed")
        await pilot.press("a")
        await until(
            pilot,
            lambda: any(
                n.message == "no process selected (p adopts one by its pid)"
                for n in app._notifications
            ),
            "a's word",
        )
        assert not isinstance(app.screen, AdoptScreen)
        app.clear_notifications()
        await pilot.press("x")
        await until(
            pilot,
            lambda: any(n.message == "no process selected" for n in app._notifications),
            "x's word",
        )
        await pilot.press("p")
        await pilot.press("enter")  # (nothing typed)
        told = await until(
            pilot, lambda: next((n for n in app._notifications if n.title == "pid"), None)
        )
        assert told.message == "type a process id (digits 0-9), then enter"
        app.clear_notifications()
        await pilot.press("\u00b2", "enter")  # not an ASCII digit: said, kept to correct
        told = await until(
            pilot, lambda: next((n for n in app._notifications if n.title == "pid"), None)
        )
        assert told.message == "expected a whole number, got '\u00b2'"
        await pilot.press("backspace", *str(sleeper_proc.pid), "enter")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        assert dialog.query_one("#adopt-vram", Input).value == ""
        dialog.query_one("#adopt-vram", Input).value = "lots"
        # (asked from another field: the one it names is focused, as for the engine's
        # refusals; the next keys wrote over the field focused before: tester h144)
        dialog.query_one("#adopt-domain", Input).focus()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, AdoptScreen)  # invalid: stays open with the message
        said = str(dialog.query_one("#adopt-error").render())
        assert said == "declared VRAM: expected a number, got 'lots'"
        await until(pilot, lambda: dialog.query_one("#adopt-vram", Input).has_focus, "vram")
        dialog.query_one("#adopt-vram", Input).value = ""
        # A name the engine refuses is said here (its refusal closed the dialog, and what
        # was typed was lost).
        dialog.query_one("#adopt-name", Input).value = "a\x1b[31mb"
        dialog.query_one("#adopt-domain", Input).focus()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, AdoptScreen)
        said = str(dialog.query_one("#adopt-error").render())
        assert said.startswith("name: control characters are not allowed")
        await until(pilot, lambda: dialog.query_one("#adopt-name", Input).has_focus, "name")
        dialog.query_one("#adopt-name", Input).value = "sleeper"
        await pilot.press("ctrl+s")
        job = await until(
            pilot,
            lambda: next((j for j in app.job_store.jobs.values() if j["kind"] == "adopted"), None),
        )
        assert job["status"] == "running" and job["domains"] == ["cpu"]
        # A job's process, and a pid that no longer exists, are said, not offered: the
        # dialog said "no GPU memory seen" of them, and Adopt only added a failed job.
        for pid_is in ("a job's", "gone"):
            if pid_is == "gone":
                sleeper_proc.kill()
                sleeper_proc.wait()
                await until(pilot, lambda: app.job_store.jobs[job["id"]]["status"] == "orphaned")
            app._notifications.clear()
            await pilot.press("p")
            await pilot.press(*str(sleeper_proc.pid), "enter")
            told = await until(
                pilot, lambda: next((n for n in app._notifications if n.title == "adopt"), None)
            )
            assert not isinstance(app.screen, AdoptScreen)
            # The field stays open with the pid, to correct it (it closed, the pid lost).
            field = app.screen.query_one("#pid-input", Input)
            assert field.has_focus and field.value == str(sleeper_proc.pid)
            await pilot.press("escape")
            await until(pilot, lambda f=field: not f.has_focus and f.value == "")
            if pid_is == "gone":
                assert told.message == (
                    f"no process with pid {sleeper_proc.pid} (it exited, or never was)"
                )
            else:
                assert told.message.startswith(
                    f"pid {sleeper_proc.pid} belongs to job {job['id']} already"
                ), told.message
        assert [j["id"] for j in app.job_store.jobs.values()] == [job["id"]]  # (none added)


async def test_a_pid_typed_with_its_enter_in_one_burst_is_read_whole(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # Pasted (or sent by tmux) with its Enter in one write, the pid was "empty": enter, a
    # priority key, ran before the digits reached the field (tester h97).
    from textual import events

    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await _open_strays(pilot, app)
        await pilot.press("p")
        for char in str(sleeper_proc.pid):
            app.post_message(events.Key(char, char))
        app.post_message(events.Key("enter", "\r"))
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        assert dialog.process["pid"] == sleeper_proc.pid
        assert not any("type a process id" in n.message for n in app._notifications)


async def test_a_pid_with_a_space_in_it_is_refused_not_read_as_another(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # The integer field dropped the space: "12 34" was pid 1234, another process (h165).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await _open_strays(pilot, app)
        await pilot.press("p")
        digits = str(sleeper_proc.pid)
        await pilot.press(*digits[:1], "space", *digits[1:], "enter")
        told = await until(
            pilot, lambda: next((n for n in app._notifications if n.title == "pid"), None)
        )
        assert told.message == f"expected a whole number, got '{digits[:1]} {digits[1:]}'"
        assert not isinstance(app.screen, AdoptScreen)
        field = app.screen.query_one("#pid-input", Input)
        assert field.value == f"{digits[:1]} {digits[1:]}"  # (kept, to correct)


async def test_a_process_that_left_while_its_dialog_was_open_is_refused_once(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # Each Adopt after the refusal stored one more failed job ("adopt_pid_gone"), for a
    # process no field change could bring back (tester h97).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        await _open_strays(pilot, app)
        await pilot.press("p")
        await pilot.press(*str(sleeper_proc.pid), "enter")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        sleeper_proc.kill()
        sleeper_proc.wait()
        await pilot.press("ctrl+s")
        error = dialog.query_one("#adopt-error")
        await until(
            pilot, lambda: "adopt" in str(error.render()) and "failed" in str(error.render())
        )
        assert dialog.query_one("#adopt", Button).disabled
        stored = [j["id"] for j in app.job_store.jobs.values()]
        assert len(stored) == 1
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert [j["id"] for j in app.job_store.jobs.values()] == stored  # (none added)
        assert app.screen is dialog


async def test_the_adopt_dialog_takes_a_domain_and_stays_open_on_a_refusal(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # A process holding no GPU memory yet, declared with VRAM on a 2-GPU box: the engine
    # asks which GPU. The dialog had no domain field, closed on the refusal, and what was
    # typed was lost.
    app = await ui_app("2xA100-80GB")
    busy = await app.backend.submit(
        {"command": ["sleep", "60"], "gpus": 1, "domain": "gpu0", "vram_gb": 75}
    )
    async with app.run_test(size=(140, 40)) as pilot:
        await _open_strays(pilot, app)
        await until(
            pilot,
            lambda: any(d["used_slots"] for d in (app.gpu_state or {}).get("domains", [])),
            "gpu0 busy in the view",
        )
        await pilot.press("p")
        await pilot.press(*str(sleeper_proc.pid), "enter")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        domain = dialog.query_one("#adopt-domain", Input)
        assert "gpu0" in domain.placeholder  # (the names it takes)
        # A domain whose slots are all taken is said before it is taken once more (it
        # went to "slots 2/1" without a word: tester h70).
        note = dialog.query_one("#adopt-note")
        domain.value = "gpu0"
        await until(pilot, lambda: "every slot of gpu0 (1/1) is taken" in str(note.render()))
        domain.value = ""
        await until(pilot, lambda: str(note.render()).strip() == "", "no note for gpu1")
        # A draining domain is said too (adopted there without a word: tester h107).
        await app.backend.domain_action("gpu1", "drain")
        await until(
            pilot,
            lambda: any(d["state"] == "draining" for d in (app.gpu_state or {}).get("domains", [])),
            "gpu1 draining in the view",
        )
        domain.value = "gpu1"
        await until(pilot, lambda: "gpu1 is draining (" in str(note.render()), "the drain")
        assert "keeps running there and holds its slot" in str(note.render())
        await app.backend.domain_action("gpu1", "release")
        domain.value = ""
        await until(pilot, lambda: str(note.render()).strip() == "", "no note for gpu1")
        dialog.query_one("#adopt-name", Input).value = "warming-up"
        dialog.query_one("#adopt-vram", Input).value = "12"
        await pilot.press("ctrl+s")
        error = dialog.query_one("#adopt-error")
        await until(pilot, lambda: "name its GPU domain" in str(error.render()), "the refusal")
        assert app.screen is dialog and domain.has_focus
        assert dialog.query_one("#adopt-name", Input).value == "warming-up"  # (kept)
        # A domain the engine does not know is its refusal too, said in place.
        domain.value = "gpu9"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "unknown domain 'gpu9'" in str(error.render()), "unknown")
        assert app.screen is dialog
        # The engine's refusal of the VRAM is said in the form's words, as a typo is
        # ("vram_gb: ..." beside "declared VRAM: ...": tester h97).
        domain.value = "gpu1"
        dialog.query_one("#adopt-vram", Input).value = "900"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: str(error.render()).startswith("declared VRAM: "), "words")
        dialog.query_one("#adopt-vram", Input).value = "12"
        # Its full domain: taken (it runs there anyway), and the toast says what it
        # overbooks (it said only "adopted": tester h87).
        domain.value = "gpu0"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: not isinstance(app.screen, AdoptScreen), "the dialog closes")
        job = next(j for j in app.job_store.jobs.values() if j["kind"] == "adopted")
        assert job["status"] == "running" and job["name"] == "warming-up"
        assert job["domains"] == ["gpu0"] and job["spec"]["vram_gb"] == 12.0
        toast = await until(
            pilot,
            lambda: next((n for n in app._notifications if "adopted as job" in n.message), None),
            "the toast",
        )
        assert toast.message == (
            f"pid {sleeper_proc.pid} adopted as job {job['id']}; 12 GiB declared, but gpu0 "
            "had 5 GiB free for it: nothing else starts there until memory frees"
        )
        assert toast.severity == "warning"
        await app.backend.cancel(job["id"])
    await app.backend.cancel(busy["id"])


@pytest.fixture
def markup_stray() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose argv holds markup: an unmatched closing tag and a pair."""
    argv = ["python3", "-c", "import time; time.sleep(600)", "[/bold] [b]x[/b]"]
    proc = subprocess.Popen(argv)
    yield proc
    proc.kill()
    proc.wait()


async def test_the_adopt_dialog_shows_a_command_as_written_never_as_markup(
    ui_app: AppFactory, markup_stray: subprocess.Popen[bytes]
) -> None:
    # An argv with "[/bold]" ended the app (a closing tag with nothing open); "[b]" would
    # have been swallowed (issue 20).
    pid = markup_stray.pid
    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(0, pid, 2.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(120, 32)) as pilot:
        await pilot.press("3")
        table = app.screen.query_one(StrayTable)
        await until(pilot, lambda: pid in table.rows_by_pid, "the stray")
        await pilot.press("a")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        await pilot.pause()
        assert "[/bold] [b]x[/b]" in str(dialog.query_one("#adopt-what").render())
        dialog.query_one("#adopt-vram", Input).value = "[/bold]"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "got '[/bold]'" in str(dialog.query_one("#adopt-error").render())
        await pilot.press("escape")


def test_strays_snapshot(snap_compare: Any) -> None:
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    assert snap_compare(app, press=["3"], terminal_size=(120, 24))


def test_adopt_dialog_snapshot(snap_compare: Any) -> None:
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    assert snap_compare(app, press=["3", "a"], terminal_size=(120, 32))


async def test_keys_typed_in_one_burst_in_the_adopt_dialog_land_where_they_were_typed(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # ctrl+u, "ab", Tab, "dom" in one burst left the domain empty: Textual checks an
    # Input's ctrl+u once the key has bubbled back up, from the field focused by then, and
    # Tab had moved on: it cleared "dom" (tester h54). Sent as the driver sends a burst.
    from textual import events

    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(0, sleeper_proc.pid, 5.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        await _listed(pilot, app, sleeper_proc.pid)
        await pilot.press("a")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        vram = dialog.query_one("#adopt-vram", Input)
        vram.focus()
        await pilot.pause()
        burst = [("ctrl+u", "\x15"), ("2", "2"), ("4", "4"), ("tab", "\t")]
        burst += [("g", "g"), ("p", "p"), ("u", "u"), ("0", "0"), ("backspace", "\x7f"), ("1", "1")]
        for key, char in burst:
            app.post_message(events.Key(key, char))
        domain = dialog.query_one("#adopt-domain", Input)
        await until(pilot, lambda: domain.value == "gpu1", "the domain typed")
        assert vram.value == "24"


async def test_a_name_typed_right_after_a_goes_into_the_adopt_dialog(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # "a" then a name in one burst: each key reached the table before "a" had opened the
    # dialog, and was lost (see key_hold.py).
    from textual import events

    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(0, sleeper_proc.pid, 5.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        await _listed(pilot, app, sleeper_proc.pid)
        for key, char in [("a", "a"), ("ctrl+u", "\x15"), ("n", "n"), ("b", "b")]:
            app.post_message(events.Key(key, char))
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        name = dialog.query_one("#adopt-name", Input)
        await until(pilot, lambda: name.value == "nb", "the name typed")
        assert not app.key_hold.holding


async def test_enter_in_the_adopt_dialog_goes_field_by_field_and_esc_asks_first(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # Enter in its first field adopted at once (text meant for the pid line, typed with
    # its enter as the dialog opened, adopted a process), and one esc dropped what was
    # typed (tester h61): as in the job forms, enter goes to the next field, adopting
    # past the last, and the first esc after typing asks.
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(0, sleeper_proc.pid, 5.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        await _listed(pilot, app, sleeper_proc.pid)
        await pilot.press("a")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        await until(pilot, lambda: app.focused is dialog.query_one("#adopt-name", Input))
        await pilot.press("x", "enter")
        assert app.focused is dialog.query_one("#adopt-vram", Input)
        await pilot.press("enter")
        assert app.focused is dialog.query_one("#adopt-domain", Input)
        assert app.screen is dialog and not await engine.list_jobs()  # (nothing adopted)
        await pilot.press("escape")
        assert app.screen is dialog
        assert "esc again throws away what you typed" in str(
            dialog.query_one("#adopt-error").render()
        )
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is not dialog, "the dialog closed")
        assert not await engine.list_jobs()


async def test_an_empty_strays_screen_on_simulated_gpus_says_why(ui_app: Any) -> None:
    # A `sleep 600 &` never showed here, with no word why (tester h67).
    from textual.widgets import Static

    app = await ui_app("1xA100-80GB")
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("3")
        empty = await until(
            pilot,
            lambda: next(iter(app.screen.query("#strays-empty").results(Static)), None),
            "the strays screen",
        )
        await until(pilot, lambda: "simulated" in str(empty.render()), "the note")
        assert str(empty.render()).startswith("No unregistered GPU processes. The GPUs are")
        assert "p adopts any process by its pid" in str(empty.render())


async def test_the_pid_line_s_footer_says_enter_and_esc_and_no_table_keys(
    ui_app: Any, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # The footer named neither enter nor esc, and still offered a and x, which are text
    # in the line (tester h87).
    from textual.widgets._footer import FooterKey

    app = await ui_app("1xA100-80GB")

    def footer() -> dict[str, str]:
        return {key.action: key.description for key in app.screen.query(FooterKey)}

    async with app.run_test(size=(120, 30)) as pilot:
        await _open_strays(pilot, app)
        await until(pilot, lambda: "adopt_pid" in footer(), "the table's keys")
        assert not {"submit_pid", "close_pid"} & set(footer())
        await pilot.press("p")
        field = app.screen.query_one("#pid-input", Input)
        await until(pilot, lambda: app.screen.focused is field, "the pid line")
        await until(pilot, lambda: "close_pid" in footer(), "esc offered")
        assert footer()["submit_pid"] == "Adopt" and footer()["close_pid"] == "Close"
        assert not {"adopt_pid", "adopt_selected", "signal_process"} & set(footer())
        await pilot.press(*str(sleeper_proc.pid), "enter")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        assert dialog.query_one("#adopt-name", Input) is not None  # (enter adopted it)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, AdoptScreen), "the dialog left")
        await until(pilot, lambda: "adopt_pid" in footer(), "the table's keys again")
        assert not {"submit_pid", "close_pid"} & set(footer())


async def test_the_adopt_and_signal_dialogs_name_each_gpu_with_its_domain() -> None:
    # "user root · gpu1 · holds 8.0 GiB" over a Domain field offering "big, small":
    # gpu1 read as a domain's name, and typed, was "unknown domain" (tester h136).
    backend = StaticBackend()
    for domain in backend._gpus["domains"]:
        if domain.get("gpu_index") == 1:
            domain["name"] = "small"
    app = build_app(backend, clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(120, 32)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.screen.is_mounted and app.screen.query("#strays"))
        await pilot.press("a")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        text = " ".join(shown_text(s, 110) for s in dialog.query(Static))
        assert "GPU 1 (small)" in text and "gpu1" not in text, text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, AdoptScreen), "closed")
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ModalScreen), "the signal dialog")
        text = " ".join(shown_text(s, 110) for s in app.screen.query(Static))
        assert "GPU 1 (small)" in text, text


async def test_the_adopt_dialog_keeps_its_message_and_buttons_in_sight_at_80x24(
    ui_app: AppFactory, sleeper_proc: subprocess.Popen[bytes]
) -> None:
    # At 80x24 the dialog's bottom was cut: a refusal ("declared VRAM: expected a
    # number") and both buttons were below the screen's edge, ctrl+s seemed to do
    # nothing and Tab went to buttons out of sight (tester h142).
    app = await ui_app("4xA100-80GB")
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_strays(pilot, app)
        await pilot.press("p")
        await pilot.press(*str(sleeper_proc.pid), "enter")
        dialog = await until(pilot, lambda: _adopt_dialog(app))
        screen = dialog.region

        def in_sight(widget: Any) -> bool:
            region = widget.region
            return bool(region.height) and screen.contains_region(region)

        await pilot.press("tab", *"abc", "tab", *"nosuchdomain")
        await pilot.press("ctrl+s")
        error = dialog.query_one("#adopt-error", Static)
        await until(pilot, lambda: "declared VRAM: " in str(error.render()), "the refusal")
        await until(pilot, lambda: in_sight(error), "the refusal in sight")
        for button in dialog.query(Button):
            assert in_sight(button), button
        # The field the focus is on is scrolled to, and Tab reaches the buttons in sight.
        assert dialog.focused is not None and in_sight(dialog.focused)
        await pilot.press("tab", "tab")
        await until(pilot, lambda: isinstance(dialog.focused, Button), "a button")
        assert in_sight(dialog.focused)
        # esc asks first, in sight too.
        await pilot.press("escape")
        await until(pilot, lambda: "esc again throws away" in str(error.render()), "asked")
        assert in_sight(error)
        await pilot.press("escape")
        await until(pilot, lambda: _adopt_dialog(app) is None, "closed")


async def test_a_jobs_process_on_a_gpu_the_job_does_not_hold_is_listed_as_the_cli_lists_it(
    ui_app: AppFactory,
) -> None:
    # Its memory there counts as unregistered, and `gpus` lists it; the strays screen left
    # it out, so its rows added up to less than the unregistered figure (tester h184 #3).
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    job = await engine.submit({"command": ["sleep", "600"], "gpus": 0})
    assert job.pid is not None
    SimLedger(engine.paths.state_dir).hold(1, job.pid, 2.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _listed(pilot, app, job.pid)
        row = table.rows_by_pid[job.pid]
        assert row["command"] == f"job {job.id}'s, outside its GPUs: sleep 600", row
        assert row["gpus"] == [1] and row["used_bytes"] == 2 * GIB
        # The header above it says such rows are listed (it said "that no job owns": h187).
        hint = str(app.screen.query_one("#strays-hint", Static).render())
        assert "no job on their GPU owns" in hint, hint
        # Asked to adopt it, the engine's refusal is said before any dialog.
        table.move_cursor(row=list(table.rows_by_pid).index(job.pid))
        await pilot.press("a")
        told = await until(
            pilot, lambda: next((n for n in app._notifications if n.title == "adopt"), None)
        )
        assert f"job {job.id}" in told.message, told.message
        assert not isinstance(app.screen, AdoptScreen)
    await engine.cancel(job.id)
