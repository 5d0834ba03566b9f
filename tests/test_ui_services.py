"""Services in the TUI: replica health in the jobs table, replicas and per-replica logs in
the detail view (a real engine under Pilot, then deterministic snapshots)."""

from __future__ import annotations

import copy
import os
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Checkbox, Input, Label

from gpulayer_tui.screens.dialogs import ConfirmScreen
from gpulayer_tui.screens.edit import EditScreen
from gpulayer_tui.screens.job_detail import JobDetailScreen
from gpulayer_tui.widgets.field_list import FieldList
from gpulayer_tui.widgets.log_tail import LogTail
from gpulayer_tui.widgets.timeline import Timeline

from .conftest import pid_gone
from .test_ui_jobs import cell, clear, field_error, fill, open_form, status_of, table_of
from .ui_support import FIXED_NOW, StaticBackend, jobs_fixture, until

SCRIPT = "echo hello from replica $GPULAYER_REPLICA; exec sleep 600"


async def test_a_service_never_placed_counts_the_replicas_it_asks_for(ui_app: Any) -> None:
    # Over capacity (5 CPU replicas, 4 slots), its detail said "replica 0 (of 1: ]:
    # next)" and "0 up", beside "replicas 5" from the CLI (tester h93).
    app = await ui_app("2xA100-80GB", cpu_count=4)
    async with app.run_test(size=(140, 40)) as pilot:
        job = await app.backend.submit(
            {"kind": "service", "shell": SCRIPT, "replicas": 5, "port": False, "cwd": os.getcwd()}
        )
        assert job["status"] == "failed"
        app.open_job(job["id"])
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        await until(pilot, lambda: bool(detail.query("#fields")), "the detail mounted")
        fields = detail.query_one("#fields", FieldList)
        await until(pilot, lambda: fields.text("replicas").startswith("0/5 up"), "0/5 up")
        log = detail.query_one(LogTail)
        await until(pilot, lambda: "(of 5: [ ]: switch)" in str(log.border_title), "of 5")
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: "replica 1 (of 5" in str(log.border_title), "replica 1")


async def test_the_next_replica_key_on_a_service_of_one_says_why_it_does_nothing(
    ui_app: Any,
) -> None:
    # Dimmed, "]" did nothing at all, where R and e say why (tester h110).
    app = await ui_app("2xA100-80GB", cpu_count=4)
    async with app.run_test(size=(140, 40)) as pilot:
        job = await app.backend.submit(
            {"kind": "service", "command": ["sleep", "600"], "port": False, "cwd": os.getcwd()}
        )
        app.open_job(job["id"])
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        await until(pilot, lambda: detail.job is not None, "the job loaded")
        assert detail.check_action("next_replica", ()) is None
        await pilot.press("right_square_bracket")
        said = "this service has one replica: its output is the one shown"
        await until(pilot, lambda: any(n.message == said for n in app._notifications), said)
        await app.backend.cancel(job["id"])


async def test_under_130_columns_a_services_status_says_its_replicas_health(
    ui_app: Any,
) -> None:
    # KIND (svc 2/3) is hidden under 130 columns, and STATUS said "running" alone: a
    # service with a replica down looked like any running job (tester h93).
    app = await ui_app("2xA100-80GB", cpu_count=4)
    async with app.run_test(size=(120, 40)) as pilot:
        job = await app.backend.submit(
            {"kind": "service", "shell": SCRIPT, "replicas": 2, "port": False, "cwd": os.getcwd()}
        )
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: status_of(table, job["id"]) == "svc 2/2", "svc 2/2")
        await pilot.resize_terminal(140, 40)
        await until(pilot, lambda: status_of(table, job["id"]) == "running", "KIND shown")
        await app.backend.cancel(job["id"])


async def test_a_one_replica_services_detail_offers_no_next_replica(ui_app: Any) -> None:
    # "replica 0 (of 1: ]: next)", "] Replica" lit, and "]" re-read the same log without a
    # word (testers h98, h99).
    app = await ui_app("2xA100-80GB", cpu_count=4)
    async with app.run_test(size=(140, 40)) as pilot:
        job = await app.backend.submit(
            {"kind": "service", "shell": SCRIPT, "port": False, "cwd": os.getcwd()}
        )
        app.open_job(job["id"])
        detail = await until(
            pilot,
            lambda: (
                isinstance(app.screen, JobDetailScreen) and app.screen.query(LogTail) and app.screen
            ),
            "detail",
        )
        log = detail.query_one(LogTail)
        await until(pilot, lambda: "hello from replica 0" in log.lines, "replica 0's output")
        assert "replica 0" in str(log.border_title) and "(of 1" not in str(log.border_title)
        assert detail.check_action("next_replica", ()) is None  # (dimmed)
        await app.backend.cancel(job["id"])


async def _two_replicas_detail(pilot: Pilot[Any], app: Any) -> tuple[Any, JobDetailScreen]:
    """A service of two replicas (no port), both up in the jobs table, its detail open."""
    job = await app.backend.submit(
        {"kind": "service", "shell": SCRIPT, "replicas": 2, "port": False, "cwd": os.getcwd()}
    )
    await pilot.press("2")
    table = table_of(app)
    await until(pilot, lambda: cell(table, job["id"], "kind") == "svc 2/2", "2/2 up")
    assert status_of(table, job["id"]) == "running"
    await pilot.press("g", "enter")
    detail = await until(
        pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
    )
    return job, detail


async def test_service_in_the_table_and_detail_with_replica_logs_then_cancel(
    ui_app: Any,
) -> None:
    app = await ui_app("2xA100-80GB", cpu_count=4)
    async with app.run_test(size=(140, 40)) as pilot:
        job, detail = await _two_replicas_detail(pilot, app)
        pids = [r["pid"] for r in app.job_store.jobs[job["id"]]["replicas"]]
        fields = detail.query_one("#fields", FieldList)
        await until(pilot, lambda: "2/2 up" in fields.text("replicas"), "the replicas field")
        assert fields.shown("replicas")
        log = detail.query_one(LogTail)
        await until(pilot, lambda: "hello from replica 0" in log.lines, "replica 0's output")
        assert "replica 0 (of 2: [ ]: switch)" in str(log.border_title)
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: "hello from replica 1" in log.lines, "replica 1's output")
        assert "hello from replica 0" not in log.lines
        assert "replica 1 (of 2: [ ]: switch)" in str(log.border_title)
        # "[" goes back, round the end too (only "]" went: 63 presses to 63 of 64; h168).
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: "replica 0 (of 2" in str(log.border_title), "back to 0")
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: "replica 1 (of 2" in str(log.border_title), "round to 1")
        timeline = detail.query_one(Timeline)
        await until(
            pilot,
            lambda: any(e["kind"] == "job.replica" for e in timeline.events),
            "replica events",
        )

        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "confirm")
        # It says its replicas stop (it said "It gets SIGTERM" of 64 of them: h168).
        asked = str(app.screen.query_one("#question").render())
        assert "All 2 of its replicas get SIGTERM" in asked, asked
        assert "the service ends and is not restarted" in asked
        await pilot.press("y")
        await until(
            pilot,
            lambda: (detail.job or {}).get("status") == "cancelled",
            "cancelled",
            timeout=20,
        )
        assert all(pid_gone(pid) for pid in pids)


async def test_a_replica_shown_then_removed_by_a_scale_down_says_so_and_next_goes_on(
    ui_app: Any,
) -> None:
    # The detail showed the removed replica's log as "following", and "]" said "this
    # service has one replica: its output is the one shown" over it (tester h120).
    app = await ui_app("2xA100-80GB", cpu_count=4)
    async with app.run_test(size=(140, 40)) as pilot:
        job, detail = await _two_replicas_detail(pilot, app)
        log = detail.query_one(LogTail)
        await until(pilot, lambda: "hello from replica 0" in log.lines, "replica 0's output")
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: "hello from replica 1" in log.lines, "replica 1's output")
        await app.backend.edit(job["id"], {"replicas": 1})
        await until(
            pilot,
            lambda: len((detail.job or {}).get("replicas") or []) == 1,
            "the scale-down",
            timeout=20,
        )
        title = str(log.border_title)
        assert "replica 1 (removed by a scale-down; ]: replica 0)" in title, title
        assert "following" not in title, title
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: "hello from replica 0" in log.lines, "replica 0's output")
        assert "hello from replica 1" not in log.lines
        assert "replica 0 ·" in str(log.border_title), log.border_title
        await app.backend.cancel(job["id"])


async def test_a_waiting_replica_removed_by_a_scale_down_is_no_error(ui_app: Any) -> None:
    # A queued service's replica 1, shown, then removed: its title said so, and an error
    # toast "job 11 has one replica (0), not 1" came too (tester h124).
    app = await ui_app("2xA100-80GB", cpu_count=4)
    async with app.run_test(size=(140, 40)) as pilot:
        await app.backend.queue_action("pause")
        job = await app.backend.submit(
            {"kind": "service", "shell": SCRIPT, "replicas": 2, "port": False, "cwd": os.getcwd()}
        )
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: status_of(table, job["id"]) == "queued", "queued")
        await pilot.press("g", "enter")
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        log = detail.query_one(LogTail)
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: "replica 1" in str(log.border_title), "replica 1 shown")
        await app.backend.edit(job["id"], {"replicas": 1})
        await until(
            pilot,
            lambda: "removed by a scale-down" in str(log.border_title),
            "said removed",
            timeout=20,
        )
        await pilot.pause(0.3)
        errors = [n for n in app._notifications if n.severity == "error"]
        assert not errors, [n.message for n in errors]
        await app.backend.cancel(job["id"])


async def test_next_replica_key_is_only_for_services(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 40)) as pilot:
        job = await app.backend.submit({"shell": "echo batch", "cwd": os.getcwd()})
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: status_of(table, job["id"]) == "completed", "completed")
        assert cell(table, job["id"], "kind") == "command"
        await pilot.press("g", "enter")
        detail = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "detail"
        )
        await until(pilot, lambda: detail.job is not None, "the job")
        assert detail.check_action("next_replica", ()) is False
        assert not detail.query_one("#fields", FieldList).shown("replicas")


async def test_submit_a_service_through_the_form(ui_app: Any) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("2")
        form = await open_form(pilot)
        await fill(pilot, form, "command", "exec python3 -m http.server --bind 127.0.0.1 $PORT")
        # Off until 'service' is ticked (its placeholder "1" invited a value the form then
        # refused for a batch job).
        replicas = form.query_one("#replicas", Input)
        assert replicas.disabled
        form.query_one("#service", Checkbox).value = True
        await until(pilot, lambda: not replicas.disabled, "replicas to open")
        await fill(pilot, form, "replicas", "2")
        form.query_one("#service", Checkbox).value = False  # (a value kept, ticked off)
        await until(pilot, lambda: replicas.disabled, "replicas to close")
        # Off, it is left out of the spec: no error on a field that cannot be edited.
        assert field_error(form, "replicas") == ""
        assert "replicas" not in form.build_spec() and "kind" not in form.build_spec()
        form.query_one("#service", Checkbox).value = True
        await until(pilot, lambda: form.build_spec().get("replicas") == 2, "replicas back")
        await fill(pilot, form, "gpus", "1")
        await clear(pilot, form, "replicas")
        await fill(pilot, form, "replicas", "3")
        await pilot.press("ctrl+s")
        await until(
            pilot,
            lambda: "requested 3 GPUs, but this machine has 2" in form.form_message,
            "the over-capacity refusal",
        )
        await clear(pilot, form, "replicas")
        await fill(pilot, form, "replicas", "2")
        await pilot.press("ctrl+s")
        # the refused submission stays in history as a failed row; this is the next one
        await until(pilot, lambda: len(app.job_store.jobs) == 2, "the new row")
        table = table_of(app)
        job_id = max(app.job_store.jobs)
        await until(pilot, lambda: cell(table, job_id, "kind") == "svc 2/2", "2/2 up")
        job = app.job_store.jobs[job_id]
        assert sorted(job["domains"]) == ["gpu0", "gpu1"] and job["spec"]["replicas"] == 2
        await app.backend.cancel(job_id)
        await until(pilot, lambda: status_of(table, job_id) == "cancelled", "cancelled")


# -- snapshots ------------------------------------------------------------------------------


def _service_job(
    job_id: int, name: str, replica_list: list[dict[str, Any]], **spec: Any
) -> dict[str, Any]:
    replicas = replica_list
    up = sum(r["state"] == "up" for r in replicas)
    message = f"{up}/{len(replicas)} up on {', '.join(d for r in replicas for d in r['domains'])}"
    endpoints = [r["endpoint"] for r in replicas if r["state"] == "up"]
    message += f" at {', '.join(endpoints)}" if endpoints else ""
    for r in replicas:
        if r["state"] == "backoff":
            message += f"; replica {r['index']} in back-off: {r['message']}"
    return {
        "id": job_id,
        "name": name,
        "kind": "service",
        "status": "running",
        "termination_reason": None,
        "exit_code": None,
        "message": message,
        "domains": [d for r in replicas for d in r["domains"]],
        "gpus": [g for r in replicas for g in r["gpus"]],
        "priority": 0,
        "pid": None,
        "created_at": FIXED_NOW - 900,
        "queued_at": None,
        "started_at": FIXED_NOW - 890,
        "ended_at": None,
        "owner_uid": 1000,
        "kill_at": None,
        "stop_reason": None,
        "attempt": 1,
        "replicas": replicas,
        "spec": {"kind": "service", "command": ["vllm", "serve", "model"], "gpus": 1, **spec},
    }


def _replica(index: int, state: str, gpu: int, **extra: Any) -> dict[str, Any]:
    base = {
        "index": index,
        "state": state,
        "domains": [f"gpu{gpu}"],
        "gpus": [gpu],
        "pid": 7000 + index,
        "start_ticks": 1,
        "port": 41000 + index,
        "endpoint": f"127.0.0.1:{41000 + index}" if state == "up" else None,
        "restarts": 0,
        "backoff_step": 0,
        "next_restart_at": None,
        "started_at": FIXED_NOW - 880,
        "last_exit_code": None,
        "message": "",
    }
    return base | extra


def service_jobs() -> list[dict[str, Any]]:
    """Two services (all up; one replica in back-off) beside the usual batch jobs."""
    healthy = _service_job(
        20,
        "llm-api",
        [_replica(0, "up", 0), _replica(1, "up", 1)],
        replicas=2,
    )
    flapping = _service_job(
        21,
        "embedder",
        [
            _replica(0, "up", 0, restarts=1, last_exit_code=1),
            _replica(
                1,
                "backoff",
                1,
                restarts=3,
                backoff_step=4,
                next_restart_at=FIXED_NOW + 7,
                last_exit_code=137,
                message="killed by SIGKILL (exit code 137); restart 4 in 8 s",
            ),
        ],
        replicas=2,
        restart="on_failure",
        max_restarts=5,
    )
    flapping["spec"]["command"] = ["python", "-m", "embedder"]
    return [*jobs_fixture(), healthy, flapping]


class ServiceBackend(StaticBackend):
    """Static jobs plus services whose timelines include replica events."""

    def __init__(self) -> None:
        super().__init__(
            jobs=service_jobs(),
            logs={
                (21, 0): b"serving embeddings on :41000\n",
                (21, 1): b"loading weights\nKilled\n",
            },
        )

    async def job(self, job_id: int) -> dict[str, Any]:
        data = await super().job(job_id)
        job = data["job"]
        if job["kind"] == "service":
            for r in job["replicas"]:
                data["events"].append(
                    {
                        "at": FIXED_NOW - 60 + r["index"],
                        "kind": "job.replica",
                        "status": None,
                        "reason": None,
                        "message": f"replica {r['index']}: "
                        + (r["message"] or f"up at {r['endpoint']}"),
                        "data": {"replica": r["index"], "state": r["state"]},
                    }
                )
        return copy.deepcopy(data)


def _service_app() -> Any:
    from gpulayer_tui.app import build_app

    return build_app(ServiceBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)


async def _show_jobs(pilot: Pilot[Any]) -> None:
    await pilot.press("2")
    await until(pilot, lambda: table_of(pilot.app).row_count == 12, "rows")


async def _open_flapping(pilot: Pilot[Any]) -> None:
    await _show_jobs(pilot)
    await pilot.press("g", "enter")  # newest first: the flapping service is on top
    screen = await until(
        pilot, lambda: isinstance(pilot.app.screen, JobDetailScreen) and pilot.app.screen, "detail"
    )
    await until(pilot, lambda: screen.job is not None, "the job")
    await until(pilot, lambda: screen.query_one(Timeline).events, "the timeline")
    await until(pilot, lambda: screen.query_one(LogTail).line_count == 1, "replica 0's log")


def test_snapshot_jobs_table_with_services(snap_compare: Any) -> None:
    assert snap_compare(_service_app(), terminal_size=(140, 30), run_before=_show_jobs)


def test_snapshot_service_detail_with_backoff(snap_compare: Any) -> None:
    assert snap_compare(_service_app(), terminal_size=(140, 40), run_before=_open_flapping)


def test_the_replicas_of_a_big_service_line_up_in_the_detail() -> None:
    from gpulayer_tui.screens.job_detail import replica_lines

    # Index 10 sat one column right of 0-9 (tester h77).
    replicas = [
        {"index": n, "state": "up", "endpoint": f"127.0.0.1:{9000 + n}", "domains": ["cpu"]}
        for n in range(11)
    ]
    job: Any = {"kind": "service", "status": "running", "replicas": replicas, "spec": {}}
    lines = replica_lines(job, FIXED_NOW).plain.splitlines()[1:]
    assert len(lines) == 11
    assert {line.index("up") for line in lines} == {3}
    assert lines[0].startswith(" 0 up") and lines[10].startswith("10 up")


def test_a_services_detail_shows_its_replicas_pids() -> None:
    from gpulayer_tui.screens.job_detail import job_fields, replica_lines

    # "pid -" of a running service, and no pid on its replicas' lines (tester h127).
    replicas = [
        {"index": 0, "state": "up", "pid": 4242, "endpoint": "127.0.0.1:9000", "domains": []},
        {"index": 1, "state": "backoff", "pid": None, "domains": []},
        {"index": 2, "state": "up", "pid": 4343, "domains": []},
    ]
    job: Any = {"kind": "service", "status": "running", "replicas": replicas, "spec": {}}
    lines = replica_lines(job, FIXED_NOW).plain.splitlines()[1:]
    assert lines[0].startswith("0 up  pid 4242  127.0.0.1:9000"), lines
    assert "pid" not in lines[1] and "pid 4343" in lines[2]
    assert job_fields(job, FIXED_NOW)["pid"].plain == "4242, 4343"


def test_a_detail_opened_on_a_row_says_nothing_of_what_a_row_lacks() -> None:
    from gpulayer_tui.screens.job_detail import job_fields, replica_lines

    # Opened from the table (a row), a service read "cwd -", "restart always" and
    # "placement 0 of 10" until the whole job came (tester h115).
    replicas = [{"index": 0, "state": "up", "endpoint": "127.0.0.1:9000", "domains": ["cpu"]}]
    row: Any = {"kind": "service", "status": "running", "replicas": replicas, "spec": {}}
    head = replica_lines(row, FIXED_NOW).plain.splitlines()[0]
    assert head == "1/1 up · …"
    assert job_fields(row, FIXED_NOW)["cwd"].plain == "…"
    whole: Any = {
        **row,
        "queued_at": FIXED_NOW,
        "attempt": 1,
        "spec": {"cwd": "/srv", "restart": "on_failure", "retry": {"max_attempts": 3}},
    }
    head = replica_lines(whole, FIXED_NOW).plain.splitlines()[0]
    assert head == "1/1 up · restart on_failure · placement 1 of 3"
    assert job_fields(whole, FIXED_NOW)["cwd"].plain == "/srv"
    # Refused over capacity (or cancelled while it waited): it was said "placement 0 of 10".
    refused: Any = {**whole, "status": "failed", "attempt": 0, "replicas": []}
    assert replica_lines(refused, FIXED_NOW).plain.splitlines()[0].endswith(" · never placed")


async def test_e_on_a_running_service_scales_it_from_a_form_of_its_replicas(
    ui_app: Any,
) -> None:
    # A running service could not be scaled from anywhere: cancel, submit again.
    app = await ui_app("2xA100-80GB", cpu_count=4)
    job = await app.backend.submit(
        {"kind": "service", "shell": SCRIPT, "port": False, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: status_of(table, job["id"]) == "running", "running")
        assert table.select_job(job["id"])
        await pilot.pause()
        await pilot.press("e")
        form = await until(pilot, lambda: isinstance(app.screen, EditScreen) and app.screen)
        assert [i.id for i in form.query(Input)] == ["replicas"]  # (its replicas alone)
        assert str(form.query_one(".dialog-title", Label).render()).startswith(
            f"Scale job {job['id']}"
        )
        assert app.focused is form.query_one("#replicas", Input)
        await pilot.press("backspace", "5", "ctrl+s")  # (5 on a 4-slot pool: never)
        problem = form.query_one("#replicas-error", Label)
        await until(pilot, lambda: "could never run" in str(problem.render()), "the refusal")
        # Said once, under its one field (it was said at the top too: tester h185 #7).
        assert form.form_message == ""
        await pilot.press("backspace", "3", "ctrl+s")
        await until(pilot, lambda: not isinstance(app.screen, EditScreen), "the form closed")
        assert any("scaled: replicas 1 -> 3" in n.message for n in app._notifications)
        await until(pilot, lambda: table.job(job["id"])["message"].startswith("3/3 up"), "3/3 up")
        await app.backend.cancel(job["id"])


def test_a_waiting_services_detail_says_its_gpus_per_replica() -> None:
    # "wants 1 GPU" of a 2-replica service, beside its reason "needs 2 GPUs" (h151).
    from gpulayer_tui.screens.job_detail import _placement

    service: Any = {"kind": "service", "domains": [], "gpus": []}
    assert _placement(service, {"gpus": 1, "replicas": 2}) == "wants 1 GPU per replica, 2 replicas"
    assert _placement(service, {"gpus": 2, "replicas": 1}) == "wants 2 GPUs"
    assert _placement({**service, "kind": "command"}, {"gpus": 1}) == "wants 1 GPU"


async def test_the_marked_cancel_question_says_the_services_replicas(ui_app: Any) -> None:
    # "The 4 running get SIGTERM": nothing of the services' replicas, which the question
    # of one service says (tester h170).
    from gpulayer_tui.screens.actions import ask_to_cancel_many

    app = await ui_app("1xA100-80GB", cpu_count=8)
    services = [
        await app.backend.submit(
            {"kind": "service", "port": False, "command": ["sleep", "600"], "replicas": n}
        )
        for n in (2, 3)
    ]
    async with app.run_test(size=(140, 40)) as pilot:
        await until(
            pilot,
            lambda: all(
                (app.job_store.jobs.get(s["id"]) or {}).get("status") == "running" for s in services
            ),
            "both running",
        )
        rows = [app.job_store.jobs[s["id"]] for s in services]

        def question() -> str:
            if not isinstance(app.screen, ConfirmScreen):
                return ""
            found = list(app.screen.query("#question"))
            return str(found[0].render()) if found else ""

        ask_to_cancel_many(app.screen, rows, lambda ids: None)
        said = "Of them, 2 services stop with their 5 replicas, not restarted."
        await until(pilot, lambda: said in question(), said)
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        ask_to_cancel_many(app.screen, rows[:1], lambda ids: None)
        said = f"Of them, service {services[0]['id']} stops with its 2 replicas, not restarted."
        await until(pilot, lambda: said in question(), said)
        await pilot.press("n")
        for service in services:
            await app.backend.cancel(service["id"])


async def test_r_on_a_running_service_restarts_its_replicas_one_at_a_time(ui_app: Any) -> None:
    # R was dimmed on a running service ("only an ended job restarts"): it could be
    # restarted only by a cancel and a new submission (tester h168 #4).
    app = await ui_app("2xA100-80GB", cpu_count=4)
    job = await app.backend.submit(
        {"kind": "service", "shell": SCRIPT, "port": False, "replicas": 2, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        table = table_of(app)
        await until(pilot, lambda: status_of(table, job["id"]) == "running", "running")
        assert table.select_job(job["id"])
        await pilot.pause()
        running = (await app.backend.job(job["id"]))["job"]["replicas"]
        pids = [r["pid"] for r in running]
        assert all(pids)
        assert app.screen.check_action("restart_job", ()) is True  # (not dimmed)
        await pilot.press("R")
        question = await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen)
        said = str(question.query_one("#question").render())
        assert f"Restart job {job['id']}'s 2 replicas?" in str(
            question.query_one(".dialog-title", Label).render()
        )
        assert "one at a time, each once the one before it is up again" in said
        await pilot.press("y")
        await until(
            pilot,
            lambda: any(
                f"job {job['id']} restarts replicas 0, 1 one at a time" in str(n.title)
                for n in app._notifications
            ),
            "the toast",
        )
        assert isinstance(app.screen, type(table.screen))  # (no new job: the table stays)
        assert table.cursor_job_id == job["id"]

        # The engine restarts the first replica (a new process), the second waits its turn.
        def replicas() -> list[Any]:
            return list(app.job_store.jobs[job["id"]].get("replicas") or ())

        await until(
            pilot,
            lambda: (
                replicas()[0].get("pid") not in (None, *pids) and replicas()[0]["state"] == "up"
            ),
            "replica 0 restarted",
        )
        assert replicas()[1]["pid"] == pids[1] and replicas()[1]["roll"] == "waits"
        # R again meanwhile says the roll under way at once, not after its question (h177).
        await pilot.press("R")
        await until(
            pilot,
            lambda: any(
                "is restarting its replicas one at a time already (replica " in str(n.message)
                for n in app._notifications
            ),
            "the roll said",
        )
        assert not isinstance(app.screen, ConfirmScreen)
        await app.backend.cancel(job["id"])


async def test_the_detail_timeline_of_a_running_service_keeps_its_newest_entries_in_sight(
    ui_app: Any,
) -> None:
    # After 64 replicas' "up" lines a service's scale went on below them, out of sight
    # (tester h168): kept at its newest entries as they come (the box anchored), unless
    # the user scrolled up to older ones; back at the end, it follows again.
    from textual.containers import VerticalScroll

    app = await ui_app("1xA100-80GB", cpu_count=8)
    job = await app.backend.submit(
        {"kind": "service", "command": ["sleep", "600"], "port": False, "cwd": os.getcwd()}
    )
    async with app.run_test(size=(100, 24)) as pilot:
        app.open_job(job["id"])
        detail = await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen)
        box = await until(pilot, lambda: next(iter(detail.query("#timeline-box")), None))
        assert isinstance(box, VerticalScroll)
        timeline = detail.query_one(Timeline)

        async def scaled_to(count: int) -> None:
            said = f"-> {count} ("
            before = sum(said in str(e.get("message")) for e in timeline.events)
            await app.backend.edit(job["id"], {"replicas": count})
            await until(
                pilot,
                lambda: sum(said in str(e.get("message")) for e in timeline.events) > before,
                f"scaled to {count}",
            )

            def settled() -> bool:  # (a scale-up waits for a scale-down's replicas to end)
                replicas = app.job_store.jobs[job["id"]].get("replicas") or ()
                return len(replicas) == count and all(r["state"] == "up" for r in replicas)

            await until(pilot, settled, f"{count} up", timeout=30)

        for count in (4, 1, 4, 1):
            await scaled_to(count)
        await until(pilot, lambda: box.max_scroll_y > 0, "more entries than the box holds")
        await until(pilot, lambda: box.scroll_y == box.max_scroll_y, "at the newest")
        box.scroll_home(animate=False)  # (as the user's keys or wheel do: it lets go)
        await until(pilot, lambda: box.scroll_y == 0, "scrolled up")
        await scaled_to(3)
        await pilot.pause()
        assert box.scroll_y == 0  # (the user's place among older entries is kept)
        box.scroll_end(animate=False)
        await until(pilot, lambda: box.scroll_y == box.max_scroll_y, "back at the end")
        await scaled_to(1)
        await until(pilot, lambda: box.scroll_y == box.max_scroll_y > 0, "following again")
        await app.backend.cancel(job["id"])
