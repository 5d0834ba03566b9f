"""Domain health in the TUI: notifications, the release command, stopping countdowns."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.screens.dialogs import ConfirmScreen
from gpulayer_tui.screens.drain import DrainScreen
from gpulayer_tui.widgets.job_table import JobTable
from gpulayer_tui.widgets.summary_line import SummaryLine

from .ui_support import until

AppFactory = Callable[..., Awaitable[Any]]


def _notes(app: Any) -> list[str]:
    return [f"{n.title}: {n.message}" for n in app._notifications]


async def _answers(pilot: Any, engine: Any, name: str) -> None:
    """Take a sample, and wait until the engine has read the domain's GPU answering."""
    await engine.sampler.sample_once()
    await until(pilot, lambda: engine.scheduler.domains[name].answers, f"{name} answers")


def _state(app: Any, name: str) -> str:
    return next(d["state"] for d in app.gpu_state["domains"] if d["name"] == name)


async def _lose_gpu1(pilot: Any, app: Any) -> SimLedger:
    """Lose the simulated gpu1 (quarantined at the next sample); its ledger."""
    await pilot.pause()
    ledger = SimLedger(app.backend.engine.paths.state_dir)
    ledger.set_gpu(1, lost=True, error="GPU is lost: fell off the bus")
    await app.backend.engine.sampler.sample_once()
    await until(pilot, lambda: _state(app, "gpu1") == "quarantined")
    return ledger


async def test_quarantine_is_notified_and_release_is_offered(ui_app: AppFactory) -> None:
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    async with app.run_test(size=(120, 40)) as pilot:
        ledger = await _lose_gpu1(pilot, app)
        await until(pilot, lambda: any("domain gpu1 quarantined" in n for n in _notes(app)))
        # The summary line counts it (its panel's title alone said so, cut at 120: h107).
        line = app.screen.query_one(SummaryLine)
        await until(pilot, lambda: line.counts().plain.endswith("2 GPUs (1 quarantined)"))
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert "Release gpu1" in titles and "Drain gpu0" in titles
        # still lost: the engine refuses, and the app says why
        await app.domain_action("gpu1", "release").wait()
        assert any("its GPU still fails" in n for n in _notes(app))
        ledger.set_gpu(1, lost=False, error=None)
        await _answers(pilot, engine, "gpu1")
        await app.domain_action("gpu1", "release").wait()
        await until(pilot, lambda: _state(app, "gpu1") == "in_service")
        # Drain from the palette asks first (it holds back every user's new work there),
        # with the reason every user will read (it stored "drained from the TUI" alone:
        # tester h141).
        drain = next(c for c in app.get_system_commands(app.screen) if c.title == "Drain gpu0")
        drain.callback()
        question = await until(
            pilot,
            lambda: isinstance(app.screen, DrainScreen) and app.screen.query("#question"),
        )
        assert "This holds for every user of the box" in str(question.first().render())
        await pilot.press(*"no")  # (typed into the reason: no answer)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DrainScreen))
        await pilot.pause()
        assert _state(app, "gpu0") == "in_service"
        drain.callback()
        found = await until(
            pilot, lambda: isinstance(app.screen, DrainScreen) and app.screen.query("#drain-reason")
        )
        dialog, reason = app.screen, found.first()
        reason.value = "x" * 501
        await pilot.press("ctrl+s")
        error = dialog.query_one("#drain-error")
        await until(pilot, lambda: "at most 500 characters" in str(error.render()), "refused")
        assert app.screen is dialog and _state(app, "gpu0") == "in_service"
        reason.value = ""
        await pilot.press(*"fan swap [b]x[/b], back by 14:00", "enter")
        await until(pilot, lambda: _state(app, "gpu0") == "draining")
        dom = engine.scheduler.domains["gpu0"]
        assert dom.drain_reason == "fan swap [b]x[/b], back by 14:00"
        await until(pilot, lambda: line.counts().plain.endswith("2 GPUs (1 draining)"))


async def test_a_drain_toast_says_what_still_runs_there(ui_app: AppFactory) -> None:
    # It said "domain gpu0: draining" alone; `domain drain` says what stays and when it
    # leaves (tester h96), a pinned service too (it does not move: it starts in place).
    app = await ui_app("2xA100-80GB")
    batch = await app.backend.submit({"command": ["sleep", "600"], "gpus": 1, "domain": "gpu0"})
    pinned = await app.backend.submit(
        {"kind": "service", "port": False, "command": ["sleep", "600"], "gpus": 1, "domain": "gpu1"}
    )
    async with app.run_test(size=(140, 40)) as pilot:
        await until(
            pilot,
            lambda: all(
                (app.job_store.jobs.get(j["id"]) or {}).get("status") == "running"
                for j in (batch, pinned)
            ),
            "both running",
        )
        await app.domain_action("gpu0", "drain").wait()
        said = (
            "domain gpu0: draining (reason: drained from the TUI)\n"
            f"job {batch['id']} runs there until it ends"
        )
        await until(pilot, lambda: any(said in n for n in _notes(app)), said)
        # One toast for one drain: its answer said it again, without what runs (h169).
        assert sum("domain gpu0: draining" in n for n in _notes(app)) == 1, _notes(app)
        await app.domain_action("gpu1", "drain").wait()
        said = f"service {pinned['id']} is pinned to the domains it holds: a replica that exits"
        await until(pilot, lambda: any(said in n for n in _notes(app)), said)
        for job in (batch, pinned):
            await app.backend.cancel(job["id"])


async def test_a_degraded_gpu_is_said_on_its_panel(ui_app: AppFactory) -> None:
    # Its panel said "● ok" while `domain list` said degraded (tester h124).
    from gpulayer_tui.widgets.gpu_panel import GpuPanel

    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    crash = "echo 'RuntimeError: no CUDA-capable device is detected'; exit 1"
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        for _ in range(2):  # ([health] degrade_after: jobs' device errors count too)
            job = await app.backend.submit({"shell": crash, "gpus": 1, "domain": "gpu1"})
            await engine.wait(job["id"], timeout=10)
        await until(pilot, lambda: engine.scheduler.domains["gpu1"].health.value == "degraded")
        panel = next(p for p in app.screen.query(GpuPanel) if p.domain_name == "gpu1")
        await until(pilot, lambda: panel.health()[1] == "degraded", "said degraded")
        assert panel.health() == ("◐", "degraded", "$text-warning")
        assert " · degraded (no CUDA-capable device" in panel.title().plain, panel.title().plain


async def test_a_quarantine_reason_is_said_in_every_panel_view(ui_app: AppFactory) -> None:
    # Cut from a narrow panel's title, and with no title in the compact and rows views:
    # only the mark was left (tester h124).
    from textual.widgets import Static

    from gpulayer_tui.widgets.gpu_panel import GpuPanel

    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(60, 40)) as pilot:
        await _lose_gpu1(pilot, app)
        panel = next(p for p in app.screen.query(GpuPanel) if p.domain_name == "gpu1")
        reason = "quarantined (GPU is lost: fell off the bus)"
        assert reason in panel.problem(), panel.problem()
        for density, width, said in (
            ("full", 60, reason),
            ("compact", 60, reason),
            ("row", 80, "quarantined ("),  # (over the model and job columns: cut at 80)
            ("row", 160, reason),
        ):
            await pilot.resize_terminal(width, 40)
            while app.screen._density_override != density:
                await pilot.press("v")  # (the view key: auto, full, compact, rows)
            shown = panel.query_one("#stats" if density == "row" else "#jobs", Static)
            await until(pilot, lambda s=shown, t=said: t in str(s.content), f"{density} at {width}")
            if density == "full":
                assert len(panel.title().plain) > panel.content_size.width  # (cut there)
        # A panel wide enough for its title does not say it twice.
        await pilot.resize_terminal(200, 40)
        while app.screen._density_override != "full":
            await pilot.press("v")
        await until(pilot, lambda: "no job" in str(panel.query_one("#jobs", Static).content))


async def test_draining_a_quarantined_domain_says_it_drains_under_it(ui_app: AppFactory) -> None:
    # The toast said "domain gpu1: draining" of a domain still quarantined (tester h124).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(120, 40)) as pilot:
        await _lose_gpu1(pilot, app)
        await app.domain_action("gpu1", "drain").wait()
        said = (
            "domain gpu1: drained under its quarantine: it drains once the quarantine is "
            "lifted (reason: drained from the TUI)"  # (the reason too: tester h170)
        )
        await until(pilot, lambda: any(said in n for n in _notes(app)), said)
        assert not any(n.endswith("domain gpu1: draining") for n in _notes(app))


async def test_releasing_a_drained_then_quarantined_domain_says_it_drains_again(
    ui_app: AppFactory,
) -> None:
    # The palette said "Return it to service" and the toast "released", while the domain
    # went back to draining (as the CLI said).
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    ledger = SimLedger(engine.paths.state_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await app.domain_action("gpu1", "drain").wait()
        ledger.set_gpu(1, lost=True, error="GPU is lost: fell off the bus")
        await engine.sampler.sample_once()
        await until(pilot, lambda: _state(app, "gpu1") == "quarantined")
        app.gpu_state = await app.backend.gpus()
        commands = {c.title: c.help for c in app.get_system_commands(app.screen)}
        assert commands["Release gpu1"].startswith("Lift the quarantine; it stays drained")
        assert "Drain gpu1" not in commands  # (drained already)
        ledger.set_gpu(1, lost=False, error=None)
        await _answers(pilot, engine, "gpu1")
        await app.domain_action("gpu1", "release").wait()
        await until(pilot, lambda: _state(app, "gpu1") == "draining")
        await until(
            pilot,
            lambda: any("quarantine lifted; still draining" in n for n in _notes(app)),
            "the toast",
        )
        assert not any(n.endswith("domain gpu1: released") for n in _notes(app))


async def test_a_drain_reason_in_the_palette_is_text_not_markup(ui_app: AppFactory) -> None:
    # The palette reads a command's help as markup: a quarantined domain drained "[/]"
    # ended the app as the palette opened (MarkupError).
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    await engine.domain_ops.drain("gpu1", "[/] [b]x[@click=app.quit]y")
    SimLedger(engine.paths.state_dir).set_gpu(1, lost=True, error="GPU is lost")
    await engine.sampler.sample_once()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: _state(app, "gpu1") == "quarantined")
        await pilot.press("ctrl+p")
        await pilot.press(*"release")
        await until(pilot, lambda: "[/] [b]x[@click=app.quit]y" in _palette_text(app))
        assert app.is_running


def _palette_text(app: Any) -> str:
    from textual.widgets import OptionList

    return "\n".join(
        str(option.prompt) for lst in app.screen.query(OptionList) for option in lst.options
    )


async def test_a_sample_older_than_a_release_does_not_undo_it(ui_app: AppFactory) -> None:
    # A gpu.sample published before a release can reach the app after the release's own
    # answer; the domain's change event, next in the stream, sets the state right again.
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    ledger = SimLedger(engine.paths.state_dir)
    gate = asyncio.Event()
    gate.set()
    stream = app.backend.events

    async def held_events() -> Any:
        async for event in stream():
            await gate.wait()  # held: what follows waits, in order, in the stream
            yield event

    app.backend.events = held_events
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        ledger.set_gpu(1, lost=True, error="GPU is lost: fell off the bus")
        await engine.sampler.sample_once()
        await until(pilot, lambda: _state(app, "gpu1") == "quarantined")
        gate.clear()
        ledger.set_gpu(1, lost=False, error=None)
        await _answers(pilot, engine, "gpu1")  # samples of the still quarantined domain
        await app.domain_action("gpu1", "release").wait()
        assert _state(app, "gpu1") == "in_service"  # the release's answer
        gate.set()  # now the older sample arrives, then the release's event
        await until(pilot, lambda: any("domain gpu1: released" in n for n in _notes(app)))
        assert _state(app, "gpu1") == "in_service"


@pytest.fixture
def stubborn(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A foreign process that ignores SIGTERM, and the file it touches once it does."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)",
        ]
    )
    yield proc, ready
    proc.kill()
    proc.wait()


async def test_cancelling_an_adopted_job_counts_down_to_sigkill(
    ui_app: AppFactory, stubborn: tuple[subprocess.Popen[bytes], Path]
) -> None:
    proc, ready = stubborn
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 30)) as pilot:
        await until(pilot, ready.exists)
        job = await app.backend.adopt({"pid": proc.pid, "name": "stubborn"})
        await pilot.press("2")
        table = await until(
            pilot, lambda: app.screen.query(JobTable) and app.screen.query_one(JobTable)
        )
        await until(pilot, lambda: table.row_count == 1)
        await pilot.press("c")
        await pilot.pause()
        await pilot.press("y")

        def message() -> str:
            return str(table.get_cell(str(job["id"]), "message"))

        await until(pilot, lambda: "SIGKILL in" in message())
        first = message()
        await until(pilot, lambda: message() != first, timeout=5)  # it counts down
        assert "SIGTERM sent" in message()


async def test_config_edits_reach_the_tui(ui_app: AppFactory) -> None:
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    config = engine.paths.config_file
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.theme == "gpulayer-dark"
        config.write_text('[ui]\ntheme = "gpulayer-light"\n')
        await engine.config_reload.reload()
        await until(pilot, lambda: app.theme == "gpulayer-light")
        config.write_text("[cpu]\nslots = 0\n")
        await engine.config_reload.reload()
        await until(pilot, lambda: any("config edit rejected" in n for n in _notes(app)))
        # Put back as it was: accepted again, said (the rejection was the last word on
        # screen: tester h197).
        config.write_text('[ui]\ntheme = "gpulayer-light"\n')
        await engine.config_reload.reload()
        await until(pilot, lambda: any("accepted again" in n for n in _notes(app)))
        # An applied edit is said too, and a file the watcher finds removed (both went
        # unsaid: only a bar moved, or the engine's log had it; tester h193).
        config.write_text("[cpu]\nslots = 3\n")
        await engine.config_reload.reload()
        await until(
            pilot, lambda: any("config applied: cpu: slots 2 -> 3" in n for n in _notes(app))
        )
        config.unlink()
        await until(
            pilot,
            lambda: any(
                f"config file: {config} was removed: the running" in n for n in _notes(app)
            ),
            "the removal, said",
            timeout=15,
        )


async def test_a_paused_queue_is_said_in_the_header(ui_app: AppFactory) -> None:
    from textual.widgets import Label

    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    async with app.run_test(size=(120, 40)) as pilot:

        def health_text() -> str:
            return str(app.screen.query_one("#health", Label).render())

        await until(pilot, lambda: "engine ok" in health_text(), "engine ok")
        await engine.pause()
        await until(pilot, lambda: "queue paused" in health_text(), "paused in the header")
        await engine.resume()
        await until(pilot, lambda: "engine ok" in health_text(), "ok again")


async def test_the_queue_is_paused_and_resumed_from_the_palette(ui_app: AppFactory) -> None:
    # Only the CLI could pause the queue: the TUI said "queue paused (gpulayer-tui
    # resume)" and offered no way to do either.
    from textual.widgets import Label

    app = await ui_app("1xA100-80GB")
    engine = app.backend.engine
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.health is not None, "health read")

        def command(title: str) -> Any:
            return next((c for c in app.get_system_commands(app.screen) if c.title == title), None)

        assert command("Resume the queue") is None
        pause = command("Pause the queue")
        pause.callback()
        question = await until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.query("#question")
        )
        assert "every user of the box" in str(question.first().render())
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await pilot.pause()
        assert engine.paused_at is None  # (no: nothing paused)
        pause.callback()
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: engine.paused_at is not None, "paused")
        await until(pilot, lambda: any("queue paused" in n for n in _notes(app)))
        header = app.screen.query_one("#health", Label)
        await until(pilot, lambda: "queue paused (ctrl+p: resume)" in str(header.render()))
        waiting = await engine.submit({"command": ["true"], "gpus": 0})
        assert waiting.status.value == "queued"
        assert command("Pause the queue") is None
        command("Resume the queue").callback()
        await until(pilot, lambda: engine.paused_at is None, "resumed")
        await until(pilot, lambda: any("queue resumed" in n for n in _notes(app)))
        await engine.wait(waiting.id, timeout=20)
        await until(pilot, lambda: "engine ok" in str(header.render()), "ok again")


async def test_releasing_from_the_palette_asks_and_shows_the_whole_reason(
    ui_app: AppFactory,
) -> None:
    # The reason was cut everywhere at 80x24 ("draining (Fan …"), and a release was one
    # Enter away: another operator's drain for an RMA went unread (tester h142).
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    reason = "Fan 2 bearing failing; vendor RMA ticket #88231 [b]open[/b], " + "x" * 120 + " END"
    await engine.domain_ops.drain("gpu1", reason)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: _state(app, "gpu1") == "draining")

        def release() -> None:
            command = next(
                c for c in app.get_system_commands(app.screen) if c.title == "Release gpu1"
            )
            command.callback()

        release()
        question = await until(
            pilot,
            lambda: isinstance(app.screen, ConfirmScreen) and app.screen.query("#question"),
        )
        shown = str(question.first().render())
        assert f"gpu1 is draining: {reason}." in " ".join(shown.split("\n")) or reason in shown
        said = question.first()
        assert said.region.bottom <= app.screen.size.height  # (whole, on the screen)
        assert app.screen.query_one("#yes").region.bottom <= 24
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await pilot.pause()
        assert engine.scheduler.domains["gpu1"].state.value == "draining"
        release()
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: _state(app, "gpu1") == "in_service")


async def test_a_quarantined_gpu_that_answers_again_is_not_said_healthy_alone(
    ui_app: AppFactory,
) -> None:
    # The toast said "domain gpu1: healthy" while it stayed quarantined (tester h142).
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(120, 40)) as pilot:
        ledger = await _lose_gpu1(pilot, app)
        ledger.set_gpu(1, lost=False, error=None)
        await _answers(pilot, app.backend.engine, "gpu1")
        said = "domain gpu1: the GPU answers again; still quarantined, no new work goes there"
        await until(pilot, lambda: any(said in n for n in _notes(app)), said)
        assert not any(n.endswith("domain gpu1: healthy") for n in _notes(app))
        assert _state(app, "gpu1") == "quarantined"


async def test_a_long_drain_reason_leaves_the_job_still_there_in_sight(
    ui_app: AppFactory,
) -> None:
    # A long reason over the MODEL and JOB columns hid that job 13 still ran on the
    # drained GPU, in the rows and in a full panel; and the 80-column summary ended
    # "4 GPUs (2 draining, 1" with no mark that it was cut (tester h142).
    from textual.widgets import Static

    from gpulayer_tui.widgets.gpu_panel import GpuPanel

    app = await ui_app("4xA100-80GB")
    engine = app.backend.engine
    job = await app.backend.submit({"command": ["sleep", "600"], "gpus": 1, "domain": "gpu0"})
    reason = "Fan 2 bearing failing; vendor RMA ticket #88231 " + "x" * 100
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot, lambda: (app.job_store.jobs.get(job["id"]) or {}).get("status") == "running"
        )
        await engine.domain_ops.drain("gpu0", reason)
        await engine.domain_ops.drain("gpu1", reason)
        ledger = SimLedger(engine.paths.state_dir)
        ledger.set_gpu(2, lost=True, error="GPU is lost: fell off the bus")
        await engine.sampler.sample_once()
        await until(pilot, lambda: _state(app, "gpu2") == "quarantined")
        app.gpu_state = await app.backend.gpus()
        panel = next(p for p in app.screen.query(GpuPanel) if p.domain_name == "gpu0")
        for density, said in (("row", "drai"), ("full", "draining (Fan 2")):
            while app.screen._density_override != density:
                await pilot.press("v")
            shown = panel.query_one("#stats" if density == "row" else "#jobs", Static)
            await until(
                pilot,
                lambda s=shown, w=said: (
                    w in str(s.content) and f"{job['id']} sleep" in str(s.content)
                ),
                f"the state and the job, {density}",
            )
        line = app.screen.query_one(SummaryLine)
        counts = str(app.screen.query_one(SummaryLine).query_one("#counts", Static).content)
        assert counts.endswith("4 GPUs (2 draining, 1 quarantined)") or counts.endswith("…")
        assert line.counts(40).plain.endswith("…")
        await app.backend.cancel(job["id"])


def test_snapshot_the_drain_dialog_at_80x24(snap_compare: Any) -> None:
    # Asked from the palette, with the reason every user will read (tester h141).
    from gpulayer_tui.app import build_app

    from .test_ui_dashboard import settled
    from .ui_support import FIXED_NOW, StaticBackend

    app = build_app(StaticBackend(n_gpus=2), clock=lambda: FIXED_NOW, cursor_blink=False)

    async def ask(pilot: Any) -> None:
        # (the panels behind it drawn first: under CI's coverage pass they were still
        # empty when the dialog was taken)
        await settled(2)(pilot)
        drain = next(c for c in app.get_system_commands(app.screen) if c.title == "Drain gpu0")
        drain.callback()
        await until(
            pilot, lambda: isinstance(app.screen, DrainScreen) and app.screen.query("#drain-reason")
        )
        await pilot.press(*"fan swap, back by 14:00")
        field = app.screen.query_one("#drain-reason")
        await until(pilot, lambda: field.value == "fan swap, back by 14:00", "typed")
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=ask)


async def test_a_drain_that_replaces_another_reason_and_a_second_pause_say_so(
    ui_app: AppFactory,
) -> None:
    # Another client's drain reason was replaced without a word, and a pause of a queue
    # paused already said "queue paused" as if it were the first (tester h162).
    app = await ui_app("2xA100-80GB")
    engine = app.backend.engine
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await engine.domain_ops.drain("gpu1", "cli reason")  # (another client's)
        await app.domain_action("gpu1", "drain", "PSU check").wait()
        said = "domain gpu1: draining (reason changed: cli reason -> PSU check)"
        await until(pilot, lambda: any(said in n for n in _notes(app)), said)
        await engine.pause()  # (another client's)
        await app.queue_action("pause").wait()
        assert any(n.endswith("the queue was paused already") for n in _notes(app))
        await engine.resume()
