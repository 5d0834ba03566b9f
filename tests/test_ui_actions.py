"""Acting from the TUI (issue 20): restart an ended job, edit a waiting one, signal a stray
GPU process; over a real engine (both ways of reaching it) and real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Footer, Input, Static
from textual.widgets._footer import FooterKey

from gpulayer_tui.app import build_app
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.screens.dialogs import ConfirmScreen, SignalScreen
from gpulayer_tui.screens.edit import EditScreen
from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.screens.jobs import JobsScreen
from gpulayer_tui.widgets.job_table import JobTable
from gpulayer_tui.widgets.log_tail import LogTail
from gpulayer_tui.widgets.process_table import ProcessTable
from gpulayer_tui.widgets.stray_table import StrayTable

from .conftest import make_config
from .ui_support import FIXED_NOW, StaticBackend, until

MARKUP_NAME = "[b]oops[/i] [link=x]"
"""A job name that is invalid Rich markup: shown as written, or the app would crash."""


def _spec(shell: str, **extra: Any) -> dict[str, Any]:
    return {"shell": shell, "cwd": os.getcwd(), **extra}


def _notes(app: Any) -> list[str]:
    return [f"{n.title}: {n.message}" for n in app._notifications]


async def _jobs_table(pilot: Any, app: Any, job_id: int) -> JobTable:
    await pilot.press("2")
    await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the jobs screen")
    table = app.screen.query_one(JobTable)
    await until(pilot, lambda: table.select_job(job_id), f"job {job_id} in the table")
    await pilot.pause()
    return table


# -- cancel ----------------------------------------------------------------------------------


async def test_cancel_of_another_users_job_is_refused_before_it_is_asked(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It asked "Cancel job 37?", and after yes the engine refused in a toast (tester h75).
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(_spec("sleep 60", gpus=0))
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, job["id"])
        await until(pilot, lambda: table.job(job["id"])["status"] == "running", "running")
        monkeypatch.setattr("gpulayer_tui.screens.actions.my_uid", lambda: 4321)
        # Dimmed, as on a job it does not apply to (offered, then refused: tester h179).
        assert app.screen.check_action("cancel_job", ()) is None
        await pilot.press("c")
        await until(
            pilot,
            lambda: any("you may cancel only your own jobs" in n for n in _notes(app)),
            "the refusal, said at once",
        )
        assert not isinstance(app.screen, ConfirmScreen)
        assert table.job(job["id"])["status"] == "running"
        # So in its detail: c, R and e are dimmed there too.
        app.open_job(job["id"])
        detail = await until(
            pilot,
            lambda: isinstance(app.screen, JobDetailScreen) and app.screen.job and app.screen,
        )
        assert detail.check_action("cancel_job", ()) is None
        app.clear_notifications()
        await pilot.press("c")
        await until(
            pilot,
            lambda: any("you may cancel only your own jobs" in n for n in _notes(app)),
            "the refusal in the detail",
        )
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the table")
        monkeypatch.undo()  # (the engine's user: asked, as ever)
        assert app.screen.check_action("cancel_job", ()) is True
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: table.job(job["id"])["status"] == "cancelled", "cancelled")


async def test_cancel_of_a_job_being_cancelled_says_its_stop_rather_than_asking_again(
    ui_app: Any, tmp_path: Path
) -> None:
    # It asked "It gets SIGTERM, and SIGKILL if it still runs after the grace period." of
    # a job whose SIGTERM was sent and whose SIGKILL was set (tester h192 #4); its detail
    # said "SIGKILL after 10 s" for the whole stop.
    ready = tmp_path / "trap-set"
    app = await ui_app("1xA100-80GB", config=make_config(engine={"grace_period": 30.0}))
    job = await app.backend.submit(
        _spec(f"trap '' TERM; touch {ready}; sleep 600 & wait; wait", gpus=0)
    )
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, job["id"])
        await until(pilot, ready.exists, "its trap set")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: table.job(job["id"]).get("kill_at"), "stopping")
        app.clear_notifications()
        await pilot.press("c")
        said = await until(
            pilot,
            lambda: next((n for n in _notes(app) if "being stopped already" in n), None),
            "its stop, said",
        )
        assert f"job {job['id']} is being stopped already: stopping (cancelled" in said, said
        assert "SIGTERM sent, SIGKILL in " in said, said
        assert not isinstance(app.screen, ConfirmScreen)
        app.open_job(job["id"])
        detail = await until(
            pilot,
            lambda: isinstance(app.screen, JobDetailScreen) and app.screen.job and app.screen,
        )
        await until(
            pilot,
            lambda: "SIGKILL in " in str(detail.query_one("#fields").render()),  # type: ignore[attr-defined]
            "the countdown in its detail",
        )
        os.killpg(int(table.job(job["id"])["pid"]), 9)
        await until(pilot, lambda: table.job(job["id"])["status"] == "cancelled", "its end")


async def test_restart_and_edit_of_another_users_job_are_refused_before_they_are_asked(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # R asked "Restart job N?" and e opened the form; the engine refused the answer (h75).
    app = await ui_app("1xA100-80GB")
    ended = await app.backend.submit(_spec("exit 3", gpus=0))
    blocker = await app.backend.submit(_spec("sleep 60", gpus=0))
    waiting = await app.backend.submit(_spec("true", gpus=0, depends_on=[blocker["id"]]))
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, ended["id"])
        await until(pilot, lambda: table.job(ended["id"])["status"] == "failed", "the failure")
        monkeypatch.setattr("gpulayer_tui.screens.actions.my_uid", lambda: 4321)
        await pilot.press("R")
        await until(
            pilot,
            lambda: any("you may restart only your own jobs" in n for n in _notes(app)),
            "the restart's refusal, said at once",
        )
        assert not isinstance(app.screen, ConfirmScreen)
        await until(pilot, lambda: table.select_job(waiting["id"]), "the waiting job")
        await until(pilot, lambda: table.job(waiting["id"])["status"] == "queued", "waiting")
        await pilot.press("e")
        await until(
            pilot,
            lambda: any("you may edit only your own jobs" in n for n in _notes(app)),
            "the edit's refusal, said at once",
        )
        assert not isinstance(app.screen, EditScreen)
        monkeypatch.undo()  # (the engine's user: the form opens, as ever)
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        # (its fields mounted before the test ends: quitting under its mount failed once)
        await until(
            pilot,
            lambda: any(app.focused is f for f in form.query("#priority")),
            "its focus",
        )


async def test_the_cancel_question_names_the_waiting_jobs_that_go_with_it(ui_app: Any) -> None:
    # "parent is running. It gets SIGTERM" and nothing of job 12 waiting for it (h83).
    app = await ui_app("1xA100-80GB")
    parent = await app.backend.submit(_spec("sleep 60", gpus=0, name="parent"))
    child = await app.backend.submit(_spec("true", gpus=0, name="child", depends_on=[parent["id"]]))
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, parent["id"])
        await until(pilot, lambda: table.job(parent["id"])["status"] == "running", "running")
        await pilot.press("c")
        dialog = await until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, "the question"
        )
        question = dialog.query_one("#question", Static)
        await until(
            pilot,
            lambda: (
                f"Job {child['id']} (child) waits for it to complete: it is cancelled too."
                in str(question.render())
            ),
            "the dependent named",
        )
        await pilot.press("y")
        await until(pilot, lambda: table.job(child["id"])["status"] == "cancelled", "with it")


async def test_while_typing_a_filter_or_search_the_footer_offers_no_job_keys(
    ui_app: Any,
) -> None:
    # "R Restart" stayed in the footer while R typed an R in the line (tester h83).
    app = await ui_app("1xA100-80GB")
    job = await app.backend.submit(_spec("exit 3", gpus=0))

    def footer_actions() -> set[str]:
        return {key.action for key in app.screen.query(FooterKey)}

    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, job["id"])
        await until(pilot, lambda: table.job(job["id"])["status"] == "failed", "the failure")
        await until(pilot, lambda: "restart_job" in footer_actions(), "R offered on the table")
        await pilot.press("slash")
        field = app.screen.query_one("#filter", Input)
        await until(pilot, lambda: app.screen.focused is field, "the filter line")
        await until(pilot, lambda: "restart_job" not in footer_actions(), "R withdrawn")
        assert not {"cancel_job", "edit_job"} & footer_actions()
        await pilot.press("R")
        await until(pilot, lambda: field.value == "R", "R typed")
        await pilot.press("escape", "escape")
        await until(pilot, lambda: app.screen.focused is table, "back on the table")
        await until(pilot, lambda: table.select_job(job["id"]), "the job again")
        await pilot.press("enter")
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "the detail"
        )
        await until(pilot, lambda: "restart_job" in footer_actions(), "R offered in the detail")
        await pilot.press("slash")
        search = detail.query_one("#log-search", Input)
        await until(pilot, lambda: detail.focused is search, "the search line")
        await until(pilot, lambda: "restart_job" not in footer_actions(), "R withdrawn there")


async def test_a_waiting_jobs_detail_offers_no_output_keys_until_it_runs(ui_app: Any) -> None:
    # A queued GPU job's footer offered f and u, which did nothing to be seen (no output,
    # no usage panel yet); a search offered n but not N (tester h89).
    app = await ui_app("1xA100-80GB")
    blocker = await app.backend.submit(_spec("sleep 60", gpus=1))
    waiter = await app.backend.submit(_spec("echo one; echo two; sleep 60", gpus=1))

    def footer_actions() -> set[str]:
        return {key.action for key in app.screen.query(FooterKey)}

    async with app.run_test(size=(140, 40)) as pilot:
        app.open_job(waiter["id"])
        detail = await until(
            pilot,
            lambda: isinstance(app.screen, JobDetailScreen) and app.screen.job and app.screen,
            "the waiting job's detail",
        )
        await until(pilot, lambda: "back" in footer_actions(), "the footer")
        assert detail.job["status"] == "queued"
        assert not {"toggle_follow", "toggle_usage"} & footer_actions()
        await app.backend.cancel(blocker["id"])
        await until(
            pilot,
            lambda: {"toggle_follow", "toggle_usage"} <= footer_actions(),
            "f and u once it runs",
        )
        await until(pilot, lambda: detail.query_one(LogTail).line_count >= 2, "its output")
        await pilot.press("slash", *"two", "enter")
        await until(
            pilot,
            lambda: {"next_match", "previous_match"} <= footer_actions(),
            "n and N while searching",
        )


# -- restart ---------------------------------------------------------------------------------


async def test_a_restart_the_view_hides_says_what_hides_it(ui_app: Any, tmp_path: Path) -> None:
    # Under "failed" the new job (running) is not shown: the cursor stayed on the old one
    # and nothing said why, though the README says it moves to the new job (tester h89).
    app = await ui_app("1xA100-80GB")
    ran = tmp_path / "ran"  # (the first run fails at once, the restart runs on)
    old = await app.backend.submit(_spec(f"[ -e {ran} ] && sleep 60; touch {ran}; exit 3", gpus=0))
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, old["id"])
        await until(pilot, lambda: table.job(old["id"])["status"] == "failed", "the failure")
        app.screen.query_one(JobTable).set_filters(status="failed")
        await until(pilot, lambda: table.select_job(old["id"]), "the failed job, filtered")
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        said = await until(
            pilot,
            lambda: next((n for n in _notes(app) if "is not in this view" in n), None),
            "what hides the new job",
        )
        assert "the status filter 'failed' hides it (esc shows all)" in said, said
        await pilot.press("escape")  # (all jobs: the cursor goes to the new one)
        await until(
            pilot,
            lambda: table.cursor_job_id is not None and table.cursor_job_id > old["id"],
            "the cursor on the new job",
        )


async def test_the_restart_toast_says_a_second_run_and_a_dependency_left_out(
    ui_app: Any,
) -> None:
    # The CLI said both on stderr; the toast said only the new id (a left-out dependency:
    # found last round; a second run made from two clients: tester h162).
    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    first = await app.backend.submit(_spec("true", gpus=0))
    await engine.wait(first["id"], timeout=30)
    old = await app.backend.submit(_spec("sleep 600", gpus=0, depends_on=[first["id"]]))
    await engine.cancel(old["id"])
    await engine.wait(old["id"], timeout=30)
    await engine.retention.clean(None, 1)  # (first goes; old, ended last, stays)
    elsewhere = (await app.backend.restart(old["id"]))["job"]  # (another client's restart)
    async with app.run_test(size=(140, 40)) as pilot:
        await _jobs_table(pilot, app, old["id"])
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        said = await until(
            pilot,
            lambda: next((n for n in _notes(app) if f"job {old['id']} restarted as" in n), None),
            "the toast",
        )
        new_id = max(app.job_store.jobs)
        assert said.startswith(f"job {old['id']} restarted as job {new_id} ("), said
        assert (
            f"job {old['id']} was restarted already: job {elsewhere['id']} (running) has not "
            f"ended; job {new_id} runs it again" in said
        ), said
        assert f"it does not wait for job {first['id']}, cleaned from the history" in said, said
        for job_id in (elsewhere["id"], new_id):
            await engine.cancel(job_id)


async def test_restart_from_the_table_and_from_the_detail(ui_app: Any) -> None:
    app = await ui_app("1xA100-80GB")
    old = await app.backend.submit(_spec("exit 3", gpus=0, name=MARKUP_NAME))
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, old["id"])
        await until(pilot, lambda: table.job(old["id"])["status"] == "failed", "the failure")
        await pilot.pause()
        assert app.screen.check_action("restart_job", ()) is True
        assert app.screen.check_action("edit_job", ()) is None
        await pilot.press("e")  # dimmed on an ended job: says why, opens nothing
        await until(
            pilot,
            lambda: any(
                "has ended (failed): only a waiting job is edited" in n for n in _notes(app)
            ),
            "the dimmed edit key's refusal in the table",
        )
        assert isinstance(app.screen, JobsScreen)
        await pilot.press("c")  # (dimmed too: it said nothing)
        await until(
            pilot,
            lambda: any(f"job {old['id']} already failed" in n for n in _notes(app)),
            "the dimmed cancel key's refusal in the table",
        )
        await pilot.press("R")
        dialog = await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen)
        question = str(dialog.query_one("#question", Static).render())
        assert f"Restart job {old['id']}?" in str(dialog.query_one(".dialog-title").render())
        assert MARKUP_NAME in question  # the name as written, not read as markup
        await pilot.press("y")
        # A new job, linked to the old one; the cursor goes to it.
        new_id = await until(
            pilot,
            lambda: next(
                (
                    j["id"]
                    for j in app.job_store.jobs.values()
                    if j["id"] > old["id"] and j["name"] == MARKUP_NAME
                ),
                None,
            ),
            "the restarted job",
        )
        await until(pilot, lambda: table.cursor_job_id == new_id, "the cursor on the new job")
        assert any(f"restarted as job {new_id}" in n for n in _notes(app))
        assert (await app.backend.job(new_id))["job"]["spec"]["restart_of"] == old["id"]
        # From the detail: the new job's detail replaces the old one's.
        await until(pilot, lambda: table.job(new_id)["status"] == "failed", "its failure")
        await pilot.press("enter")
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        await until(pilot, lambda: detail.finished, "the detail's job")
        # Its output read to the end, f (follow) is not offered: it did nothing to be seen.
        await until(pilot, lambda: detail.check_action("toggle_follow", ()) is False, "no f")
        await pilot.press("f")  # (out of the footer: pressed, it did nothing at all; h120)
        await until(
            pilot,
            lambda: any("has ended: its output is all shown" in n for n in _notes(app)),
            "the hidden follow key's word",
        )
        # Cancel is dimmed on the ended job's detail as in the table, and says why.
        assert detail.check_action("cancel_job", ()) is None
        await pilot.press("c")
        await until(
            pilot,
            lambda: any(f"job {new_id} already failed" in n for n in _notes(app)),
            "the dimmed cancel key's refusal in the detail",
        )
        await pilot.press("R", "y")
        newest = await until(
            pilot,
            lambda: (
                isinstance(app.screen, JobDetailScreen)
                and app.screen.job_id > new_id
                and app.screen
            ),
            "the newest job's detail",
        )
        # Back in the table, the cursor is on that newest job (it stayed on the one whose
        # detail was open: enter opened it again).
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the table")
        await until(pilot, lambda: table.cursor_job_id == newest.job_id, "the cursor on it")
        # A running job is not restarted: the key is dimmed, and says why when pressed.
        running = await app.backend.submit(_spec("sleep 60", gpus=0))
        app.open_job(running["id"])
        detail = await until(
            pilot,
            lambda: (
                isinstance(app.screen, JobDetailScreen)
                and app.screen.job_id == running["id"]
                and app.screen.job is not None
                and app.screen
            ),
        )
        assert detail.check_action("restart_job", ()) is None
        assert detail.check_action("cancel_job", ()) is True
        await pilot.press("R")
        await until(
            pilot,
            lambda: any("is running: only an ended job restarts" in n for n in _notes(app)),
            "the dimmed key's refusal",
        )
        await pilot.press("e")  # (edit is dimmed too on a running job)
        await until(
            pilot,
            lambda: any("is running: only a waiting job is edited" in n for n in _notes(app)),
            "the dimmed edit key's refusal",
        )
        # A plain CPU job has no replicas and no GPU usage: those keys are out of the
        # footer, and say so when pressed anyway.
        assert detail.check_action("next_replica", ()) is False
        assert detail.check_action("toggle_usage", ()) is False
        await pilot.press("right_square_bracket")
        await until(
            pilot,
            lambda: any("has no replicas: only a service" in n for n in _notes(app)),
            "the hidden replica key's word",
        )
        await pilot.press("u")
        await until(
            pilot,
            lambda: any("uses no GPU: there is no GPU usage" in n for n in _notes(app)),
            "the hidden usage key's word",
        )
        await pilot.press("slash", "u", "right_square_bracket", "f")  # (in a search: text)
        search = detail.query_one("#log-search", Input)
        await until(pilot, lambda: search.value == "u]f", "the search field's text")
        await pilot.press("escape")
        assert isinstance(app.screen, JobDetailScreen)
        assert app.is_running
        await app.backend.cancel(running["id"])


# -- edit ------------------------------------------------------------------------------------


async def test_the_edit_forms_hints_are_shown_whole_on_a_120_column_terminal(
    ui_app: Any,
) -> None:
    app = await ui_app("1xA100-80GB")
    blocker = await app.backend.submit(_spec("sleep 60", gpus=1))
    waiting = await app.backend.submit(_spec("true", gpus=1, vram_gb=10))
    async with app.run_test(size=(120, 40)) as pilot:
        table = await _jobs_table(pilot, app, waiting["id"])
        await until(pilot, lambda: table.job(waiting["id"])["status"] == "queued", "queued")
        await pilot.pause()
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        await pilot.pause()
        hints = list(form.query(".field-hint"))
        assert any(hint.region.height > 1 for hint in hints)  # (so this test can fail)
        for hint in hints:  # a row of one line cut a wrapped hint to its first line
            assert hint.parent is not None
            assert hint.parent.region.contains_region(hint.region), hint.render()
        # At 40 columns a hint was wrapped into a sliver two characters wide: they go.
        await pilot.resize_terminal(40, 15)
        await until(pilot, lambda: not any(h.display for h in form.query(".field-hint")))
        await pilot.resize_terminal(120, 40)
        await until(pilot, lambda: all(h.display for h in form.query(".field-hint")))
    await app.backend.cancel(waiting["id"])
    await app.backend.cancel(blocker["id"])


async def test_edit_a_queued_job_in_its_form_and_the_engines_refusal_stays_in_it(
    ui_app: Any,
) -> None:
    app = await ui_app("1xA100-80GB")
    blocker = await app.backend.submit(_spec("sleep 60", gpus=1))
    waiting = await app.backend.submit(_spec("true", gpus=1, vram_gb=10))
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, waiting["id"])
        await until(pilot, lambda: table.job(waiting["id"])["status"] == "queued", "queued")
        await pilot.pause()
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        values = {i: form.query_one(f"#{i}", Input).value for i in ("priority", "gpus", "vram")}
        assert values == {"priority": "0", "gpus": "1", "vram": "10"}
        # The form says its keys in its footer.
        keys = {k.action for k in form.query_one(Footer).query(FooterKey)}
        assert {"save", "cancel"} <= keys
        # Checked as typed, by the wire contract's rules.
        form.query_one("#vram", Input).value = "lots"
        await pilot.pause()
        assert "lots" in str(form.query_one("#vram-error").render())
        await pilot.press("ctrl+s")
        assert form.form_message == "fix the fields marked in red"
        # What only the engine judges comes back into the form, which stays open.
        form.query_one("#vram", Input).value = "10"
        form.query_one("#gpus", Input).value = "4"
        await pilot.press("ctrl+s")
        await until(
            pilot, lambda: "unable to ever run" in form.form_message, "the engine's refusal"
        )
        assert app.screen is form and app.is_running
        # A good edit is stored: the job's priority and VRAM change.
        form.query_one("#gpus", Input).value = "1"
        form.query_one("#vram", Input).value = "20"
        form.query_one("#priority", Input).value = "5"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        job = (await app.backend.job(waiting["id"]))["job"]
        assert job["priority"] == 5 and job["spec"]["vram_gb"] == 20
        await until(pilot, lambda: table.job(waiting["id"])["spec"]["vram_gb"] == 20, "the row")
        # The toast says what changed, as the CLI and the timeline do (it said only where
        # the job stood: tester h93).
        said = f"job {waiting['id']} edited: priority 0 -> 5, vram_gb 10 -> 20; queued: "
        await until(pilot, lambda: any(said in n for n in _notes(app)), said)
        # The jobs it waits for: checked as typed, judged by the engine, replaced.
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        after = form.query_one("#after", Input)
        assert after.value == ""
        after.value = "12 maybe"
        await pilot.pause()
        assert "'12 maybe' is not a job id" in str(form.query_one("#after-error").render())
        after.value = str(waiting["id"])
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "cannot wait for itself" in form.form_message, "the refusal")
        assert after.has_class("-invalid")
        # In the form's words: its label, not the spec's field name (tester h83).
        label = str(form.query_one("#after-field .field-label").render()).strip()
        assert form.form_message.startswith(f"{label}: job {waiting['id']} cannot"), label
        assert "depends_on" not in form.form_message
        after.value = f"{blocker['id']} (any outcome)"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        job = (await app.backend.job(waiting["id"]))["job"]
        assert job["spec"]["depends_on"] == [{"job": blocker["id"], "any_exit": True}]
        assert job["message"] == f"waiting for job {blocker['id']}"
        # The same job twice is no change (the toast said "edited", the engine recorded none).
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        form.query_one(
            "#after", Input
        ).value = f"{blocker['id']} (any outcome), {blocker['id']} (any outcome)"
        await pilot.pause()  # (its Changed clears the form's message)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: form.form_message == "nothing changed", "nothing to save")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        # A running job is not edited.
        assert table.select_job(blocker["id"])
        await pilot.pause()
        assert app.screen.check_action("edit_job", ()) is None
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, JobsScreen)
        # A GPU count left out shows the count it asks for (by its VRAM: 1), not "none"
        # beside the table's x1 (tester h103).
        by_vram = await app.backend.submit(_spec("true", vram_gb=10))
        await until(pilot, lambda: table.select_job(by_vram["id"]), "its row")
        await pilot.pause()
        await pilot.press("e")
        form = await until(
            pilot,
            lambda: isinstance(app.screen, EditScreen) and app.screen.query("#gpus") and app.screen,
        )
        gpus = form.query_one("#gpus", Input)
        assert (gpus.value, gpus.placeholder) == ("", "1")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        await app.backend.cancel(blocker["id"])


async def test_the_edit_form_renames_a_job_and_scales_a_waiting_service(ui_app: Any) -> None:
    # The CLI's edit had --name, --project and --replicas; the form had none (tester h70).
    app = await ui_app("2xA100-80GB")
    blocker = await app.backend.submit(_spec("sleep 60", gpus=2))
    service = await app.backend.submit(
        _spec("sleep 60", kind="service", gpus=1, replicas=2, port=False)
    )
    batch = await app.backend.submit(_spec("true", gpus=1))
    async with app.run_test(size=(140, 50)) as pilot:
        table = await _jobs_table(pilot, app, batch["id"])
        await until(pilot, lambda: table.job(batch["id"])["status"] == "queued", "queued")
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        assert not form.query("#replicas")  # (a batch job has none)
        assert form.query_one("#name", Input).placeholder == "true"
        form.query_one("#name", Input).value = "[b]renamed[/b]"
        form.query_one("#project", Input).value = "sweep-b"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        job = (await app.backend.job(batch["id"]))["job"]
        assert (job["name"], job["spec"]["project"]) == ("[b]renamed[/b]", "sweep-b")
        # A waiting service's replicas.
        assert table.select_job(service["id"])
        await pilot.pause()
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        replicas = form.query_one("#replicas", Input)
        assert replicas.value == "2"
        replicas.value = ""
        await pilot.pause()
        assert "1 replica or more" in str(form.query_one("#replicas-error").render())
        replicas.value = "3"
        await pilot.press("ctrl+s")
        await until(
            pilot, lambda: "unable to ever run" in form.form_message, "the engine's refusal"
        )
        replicas.value = "1"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), "the form closed")
        job = (await app.backend.job(service["id"]))["job"]
        assert job["spec"]["replicas"] == 1
    for done in (batch, service, blocker):
        await app.backend.cancel(done["id"])


# -- signal ----------------------------------------------------------------------------------


@pytest.fixture
def foreign() -> Iterator[subprocess.Popen[bytes]]:
    # A command line that is invalid markup: the table and the dialog show it as written.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "[/nope]", "[b]"]
    )
    yield proc
    proc.kill()
    proc.wait()


async def test_signal_a_stray_from_the_strays_screen(
    ui_app: Any, foreign: subprocess.Popen[bytes]
) -> None:
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    SimLedger(engine.paths.state_dir).hold(1, foreign.pid, 4.0)
    await engine.sampler.sample_once()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("3")
        table = await until(
            pilot, lambda: app.current_mode == "strays" and app.screen.query_one(StrayTable)
        )
        await until(pilot, lambda: foreign.pid in table.rows_by_pid, "the stray")
        assert "[/nope] [b]" in str(table.get_cell(str(foreign.pid), "command"))
        await pilot.press("x")
        dialog = await until(pilot, lambda: isinstance(app.screen, SignalScreen) and app.screen)
        said = str(dialog.query_one("#signal-what").render())
        assert "[/nope] [b]" in said
        assert dialog.signal_name == "TERM"
        assert not dialog.query("#signal-owner")  # our own process: no warning
        await pilot.press("n")  # changed our mind: nothing is sent
        await until(pilot, lambda: not isinstance(app.screen, SignalScreen))
        assert foreign.poll() is None
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, SignalScreen))
        await pilot.press("y")
        await until(pilot, lambda: foreign.poll() is not None, "the process ended")
        assert foreign.returncode == -15
        await until(pilot, lambda: any("SIGTERM sent" in n for n in _notes(app)), "said")


async def test_sigkill_from_the_process_table_and_refusals_are_said(
    ui_app: Any, foreign: subprocess.Popen[bytes]
) -> None:
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # noqa: ASYNC220
    try:
        ledger = SimLedger(engine.paths.state_dir)
        ledger.hold(0, foreign.pid, 4.0)
        ledger.hold(1, other.pid, 8.0)  # (the table puts the most VRAM first)
        await engine.sampler.sample_once()
        async with app.run_test(size=(140, 40)) as pilot:
            table = app.screen.query_one(ProcessTable)

            def under_cursor() -> int | None:
                row = table.cursor_process()
                return None if row is None else row.pid

            await until(pilot, lambda: under_cursor() == other.pid, "the biggest process")
            await pilot.press("x")
            dialog = await until(pilot, lambda: isinstance(app.screen, SignalScreen) and app.screen)
            await pilot.press("k")
            assert dialog.signal_name == "KILL"
            assert "SIGKILL" in str(dialog.query_one("#send").render())
            await pilot.press("y")
            await until(pilot, lambda: other.poll() is not None, "the process killed")
            assert other.returncode == -9
            # Refused, and said: this process is gone by the time the engine is asked.
            await engine.sampler.sample_once()
            await until(pilot, lambda: under_cursor() == foreign.pid, "the other process")
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, SignalScreen))
            foreign.kill()
            foreign.wait()
            await pilot.press("y")
            await until(pilot, lambda: any("no process with pid" in n for n in _notes(app)))
            assert app.is_running
    finally:
        other.kill()
        other.wait()


async def test_another_users_process_is_refused_with_the_engines_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fixed data's stray (pid 4242) is ben's: the dialog warns a user who is not root,
    # and the engine's refusal is said.
    monkeypatch.setattr(os, "getuid", lambda: 4321)
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("3")
        table = await until(
            pilot, lambda: app.current_mode == "strays" and app.screen.query_one(StrayTable)
        )
        await until(pilot, lambda: table.cursor_pid == 4242, "the stray")
        await pilot.press("x")
        dialog = await until(pilot, lambda: isinstance(app.screen, SignalScreen) and app.screen)
        assert "ben's process" in str(dialog.query_one("#signal-owner").render())
        await pilot.press("y")
        await until(pilot, lambda: any("belongs to ben" in n for n in _notes(app)), "refused")
        assert app.is_running


async def test_the_edit_form_stays_while_the_engine_has_its_edit(
    ui_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Esc twice while "saving…" closed it saying "esc again throws away your changes" of
    # an edit the engine then applied, and no toast came (tester h50).
    import asyncio

    app = await ui_app("1xA100-80GB")
    blocker = await app.backend.submit(_spec("sleep 60", gpus=1))
    waiting = await app.backend.submit(_spec("true", gpus=1))
    answer = asyncio.Event()
    real_edit = app.backend.edit

    async def slow_edit(job_id: int, changes: dict[str, Any]) -> Any:
        await answer.wait()
        return await real_edit(job_id, changes)

    monkeypatch.setattr(app.backend, "edit", slow_edit)
    async with app.run_test(size=(140, 40)) as pilot:
        table = await _jobs_table(pilot, app, waiting["id"])
        await until(pilot, lambda: table.job(waiting["id"])["status"] == "queued", "queued")
        await pilot.pause()
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        form.query_one("#priority", Input).value = "-1"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: form._busy, "saving")
        await pilot.press("escape", "escape")
        # (the keys after ctrl+s wait a moment for the form to close: then go to it)
        await until(pilot, lambda: "wait for its answer" in form.form_message)
        assert app.screen is form
        answer.set()
        await until(pilot, lambda: app.screen is not form, "closed once answered")
        assert (await app.backend.job(waiting["id"]))["job"]["priority"] == -1
    await app.backend.cancel(blocker["id"])


@pytest.mark.parametrize(
    ("seconds", "typed"),
    [
        (600, "10m"),
        (5400, "1h30m"),
        (86400, "1d"),
        (90061, "1d1h1m1s"),
        (2.5, "2.5s"),
        (45, "45s"),
        # (a fraction with its unit: "5400.4" was said bare: tester h117)
        (5400.4, "1h30m0.4s"),
        (0.0005, "0.0005s"),
    ],
)
def test_the_edit_form_shows_a_timeout_as_it_is_typed(seconds: float, typed: str) -> None:
    # (it showed 600 for the 10m typed in the new-job form: tester h91)
    from gpulayer_tui.fields import duration_typed, parse_duration

    assert duration_typed(seconds) == typed
    assert parse_duration("timeout", typed) == seconds


@pytest.mark.parametrize("typed", ["1d1d", "30s1h", "1m1m30s"])
def test_a_duration_takes_each_unit_once_largest_first(typed: str) -> None:
    # "1d1d" was taken as 2 days, a typo read as meant (tester h103).
    from gpulayer_tui.fields import FieldError, parse_duration

    with pytest.raises(FieldError, match=r"each unit once, largest first \(1d2h30m\)"):
        parse_duration("timeout", typed)
    assert parse_duration("timeout", "1m 30s") == 90  # (spaced, in order: fine)
    assert parse_duration("timeout", "2w1d") == 15 * 86400  # (weeks: history is kept in them)


def test_the_dependents_note_of_several_marked_jobs_says_one_of_them() -> None:
    # "Job 507 waits for it to complete" with two marked: "it" was neither (tester h112).
    from gpulayer_tui.screens.actions import dependents_note

    rows: dict[int, Any] = {7: {"name": "chainC"}}
    assert dependents_note([7], rows) == (
        "Job 7 (chainC) waits for it to complete: it is cancelled too."
    )
    assert dependents_note([7], rows, cancelled=2) == (
        "Job 7 (chainC) waits for one of them to complete: it is cancelled too."
    )


async def test_u_on_a_gpu_job_that_has_not_run_yet_says_why(ui_app: Any) -> None:
    # It toggled a hidden panel: nothing to be seen, nothing said (tester h120).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        first = await app.backend.submit(_spec("sleep 60", gpus=0))
        waiting = await app.backend.submit({**_spec("true", gpus=1), "depends_on": [first["id"]]})
        app.open_job(waiting["id"])
        detail = await until(
            pilot,
            lambda: (
                isinstance(app.screen, JobDetailScreen)
                and app.screen.job is not None
                and app.screen
            ),
            "the waiting job's detail",
        )
        assert detail.check_action("toggle_usage", ()) is False
        await pilot.press("u")
        await until(
            pilot,
            lambda: any("has not run yet: it has no GPU usage to show" in n for n in _notes(app)),
            "u's word",
        )
        await pilot.press("f")
        await until(
            pilot,
            lambda: any(
                "has not started yet: it has no output to follow" in n for n in _notes(app)
            ),
            "f's word",
        )
        await app.backend.cancel(first["id"])


@pytest.mark.parametrize(
    ("row", "uses"),
    [
        # (preempted back to the queue, asked by its VRAM: "uses no GPU", tester h124)
        ({"gpus": [], "spec": {"vram_gb": 60}}, True),
        ({"gpus": [], "spec": {"domain": "gpu1"}}, True),
        ({"gpus": [], "spec": {"gpus": 2}}, True),
        ({"gpus": [2], "spec": {}}, True),
        ({"gpus": [], "spec": {}}, False),
        ({"gpus": [], "spec": {"domain": "cpu"}}, False),
        ({"gpus": [], "spec": {"kind": "adopted", "vram_gb": 3}}, False),
    ],
)
def test_a_job_uses_gpus_as_the_engine_resolves_its_count(row: dict[str, Any], uses: bool) -> None:
    from gpulayer_tui.screens.job_detail import uses_gpus

    assert uses_gpus(row) is uses  # type: ignore[arg-type]


@pytest.mark.parametrize("typed", ["\uff13h", "1h\uff130m", "\u0663d"])
def test_a_duration_takes_ascii_digits_only(typed: str) -> None:
    # A full-width "3h" was taken where a full-width 3 alone was refused (tester h159):
    # digits of other scripts are refused alike.
    from gpulayer_tui.fields import FieldError, parse_duration

    with pytest.raises(FieldError, match="expected seconds or a duration"):
        parse_duration("timeout", typed)
