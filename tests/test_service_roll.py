"""A rolling restart of a running service (``restart ID`` while it runs), with real
processes, real ports and real SQLite: its replicas are restarted one at a time, the next
only once the one before it is up again, so the others serve meanwhile.
"""

from __future__ import annotations

import json
from typing import Any

import psutil
import pytest

from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.errors import JobNotActive
from gpulayer_tui.engine.models import JobStatus, ReplicaState, Roll

from .conftest import EngineFactory, Served, eventually, pid_gone, wait_for
from .test_service_scale import _edited, _live
from .test_services import HTTP_SERVER, ManualClock, _http_get, _http_service, _service

R = ReplicaState


def _stepped(clock: ManualClock, seconds: float = 5.0) -> bool:
    """Step the service clock (by default 5 s: a portless replica's settling) for a
    condition that waits on it."""
    clock.advance(seconds)
    return True


async def _rolling_portless(
    make_engine: EngineFactory, replicas: int
) -> tuple[Engine, ManualClock, Any]:
    """An engine on a stepped clock, a portless service of ``replicas`` all started, and
    its rolling restart begun."""
    clock = ManualClock()
    engine = await make_engine(simulate=None, cpu_count=4, service_clock=clock)
    svc = await engine.submit(_service(["sleep", "600"], replicas=replicas, port=False))
    await eventually(lambda: all(r.pid for r in _live(engine, svc.id).replicas))
    await engine.roll(svc.id)
    return engine, clock, svc


async def _replica_events(engine: Engine, job_id: int) -> list[tuple[int, str, str]]:
    return [
        (e["data"]["replica"], e["data"]["state"], e["data"]["message"])
        for e in await engine.events_of(job_id)
        if e["kind"] == "job.replica"
    ]


async def test_a_rolling_restart_restarts_one_replica_at_a_time_and_serves_throughout(
    make_engine: EngineFactory,
) -> None:
    # A running service could be restarted only by a cancel and a new submission: every
    # replica down at once (tester h168 #4).
    engine = await make_engine(simulate=None, cpu_count=4)
    svc = await engine.submit(_http_service(replicas=3, max_restarts=0))
    await eventually(lambda: all(r.endpoint for r in _live(engine, svc.id).replicas), timeout=30)
    before = [(r.pid, r.endpoint) for r in _live(engine, svc.id).replicas]

    warnings: list[str] = []
    assert await engine.roll(svc.id, warnings) == [0, 1, 2]
    assert warnings == []
    # Decided and stored before any replica was signalled: the first one stops, the
    # others wait their turn.
    replicas = _live(engine, svc.id).replicas
    assert [r.roll for r in replicas] == [Roll.STOPPING, Roll.WAITS, Roll.WAITS]
    assert replicas[0].state is R.STOPPING
    assert (await _edited(engine, svc.id))[0] == (
        "rolling restart of replicas 0-2: one at a time, each once the one before it is up "
        "again (SIGTERM, SIGKILL after 2 s)"
    )
    with pytest.raises(JobNotActive, match="restarting its replicas one at a time already"):
        await engine.roll(svc.id)

    await eventually(
        lambda: (
            any("rolling restart done" in m for m in _live(engine, svc.id).message.split("\n"))
            or all(r.roll is Roll.NONE for r in _live(engine, svc.id).replicas)
        ),
        timeout=60,
    )
    await eventually(lambda: all(r.endpoint for r in _live(engine, svc.id).replicas), timeout=30)
    after = _live(engine, svc.id)
    assert after.status is JobStatus.RUNNING
    for (old_pid, _), replica in zip(before, after.replicas, strict=True):
        assert replica.pid != old_pid and pid_gone(old_pid)
        assert replica.restarts == 0  # (not the policy's: max_restarts = 0 is no bar)
        assert _http_get(replica.endpoint) == 200
    assert (await _edited(engine, svc.id))[-1] == "rolling restart done: replica 2, the last, is up"

    # One at a time: each replica is stopped only once the one before it is up again.
    events = await _replica_events(engine, svc.id)
    stops = [i for i, (_, state, _) in enumerate(events) if state == "stopping"]
    assert [events[i][0] for i in stops] == [0, 1, 2]
    for index, at in zip((0, 1), stops[1:], strict=True):
        ups = [i for i, (r, state, _) in enumerate(events) if r == index and state == "up"]
        assert any(stops[index] < up < at for up in ups), events
    down_at_once = 0
    serving = {0, 1, 2}
    for replica, state, _ in events[stops[0] :]:
        if state == "up":
            serving.add(replica)
        elif state == "stopping":
            serving.discard(replica)
        down_at_once = max(down_at_once, 3 - len(serving))
    assert down_at_once == 1
    assert next(m for r, s, m in events if r == 0 and s == "backoff") == (
        "replica 0: rolling restart: killed by SIGTERM (exit code 143); starting again"
    )
    # No "replica.restarted" notification for the roll's own steps (notify skips a
    # replica event "not_started"): a roll of 5 sent 5 that read as crashes (h177 #4).
    steps = [
        e
        for e in await engine.events_of(svc.id)
        if e["kind"] == "job.replica" and e["data"]["state"] == "backoff"
    ]
    assert len(steps) == 3 and all(e["data"].get("not_started") for e in steps)
    await engine.cancel(svc.id)
    await engine.wait(svc.id, timeout=30)


async def test_a_restarted_replica_that_exits_stops_the_roll_and_leaves_the_rest(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    clock = ManualClock()
    engine = await make_engine(simulate=None, cpu_count=4, service_clock=clock)
    broken = tmp_path / "broken"
    command = ["sh", "-c", f'[ -e "{broken}" ] && exit 3; exec sleep 600']
    svc = await engine.submit(_service(command, replicas=3, port=False))
    await eventually(lambda: all(r.pid for r in _live(engine, svc.id).replicas))
    pids = [r.pid for r in _live(engine, svc.id).replicas]
    # (each past its check: a replica still in its shell would read the file below)
    await eventually(lambda: all(psutil.Process(pid).name() == "sleep" for pid in pids))
    broken.write_text("")  # (what the restart picks up is broken)

    await engine.roll(svc.id)
    first = _live(engine, svc.id).replicas[0]
    await eventually(lambda: first.state is R.BACKOFF and first.roll is Roll.RESTARTING)
    assert clock.pending() == [0.0]  # (started again at once, not after a back-off)
    clock.advance(0.0)
    await eventually(lambda: first.state is R.BACKOFF and first.last_exit_code == 3)

    replicas = _live(engine, svc.id).replicas
    assert [r.roll for r in replicas] == [Roll.NONE] * 3
    assert [r.pid for r in replicas[1:]] == pids[1:]  # (untouched, serving on)
    assert all(r.state is R.UP for r in replicas[1:])
    assert (await _edited(engine, svc.id))[-1] == (
        "rolling restart stopped: replica 0 exited with code 3 after its restart; "
        "replicas 1, 2 not restarted"
    )
    # Its crash is the policy's: it restarts after its back-off, as any crash does.
    assert clock.pending() == [1.0]
    await engine.cancel(svc.id)
    await engine.wait(svc.id, timeout=30)


async def test_a_rolling_restart_goes_on_after_an_engine_restart(
    make_engine: EngineFactory,
) -> None:
    clock = ManualClock()
    engine = await make_engine(simulate=None, cpu_count=4, service_clock=clock)
    svc = await engine.submit(_service(["sleep", "600"], replicas=2, port=False))
    await eventually(lambda: all(r.pid for r in _live(engine, svc.id).replicas))
    pids = [r.pid for r in _live(engine, svc.id).replicas]
    await engine.roll(svc.id)
    first = _live(engine, svc.id).replicas[0]
    # Stopped by the roll, its start due: the engine stops before it is made.
    await eventually(lambda: first.roll is Roll.RESTARTING and pid_gone(pids[0]))
    await engine.stop()

    clock2 = ManualClock()
    again = await make_engine(simulate=None, cpu_count=4, service_clock=clock2)
    replicas = _live(again, svc.id).replicas
    assert replicas[0].state is R.BACKOFF and replicas[1].pid == pids[1]
    assert [r.roll for r in replicas] == [Roll.RESTARTING, Roll.WAITS]
    # (a replica with no port counts as up once it has run 5 s: the clock is stepped)
    await eventually(
        lambda: (
            _stepped(clock2)
            and all(r.roll is Roll.NONE and r.pid for r in _live(again, svc.id).replicas)
        )
    )
    replicas = _live(again, svc.id).replicas
    assert all(r.pid not in pids and r.state is R.UP for r in replicas)
    assert [r.restarts for r in replicas] == [0, 0]
    assert (await _edited(again, svc.id))[-1] == "rolling restart done: replica 1, the last, is up"
    await again.cancel(svc.id)
    await again.wait(svc.id, timeout=30)


async def test_a_scale_down_during_a_roll_leaves_out_the_replicas_it_removes(
    make_engine: EngineFactory,
) -> None:
    engine, clock, svc = await _rolling_portless(make_engine, 3)
    first = _live(engine, svc.id).replicas[0]
    await eventually(lambda: first.roll is Roll.RESTARTING)
    await engine.edit(svc.id, {"replicas": 2})
    await eventually(lambda: len(_live(engine, svc.id).replicas) == 2)
    await eventually(
        lambda: _stepped(clock) and all(r.roll is Roll.NONE for r in _live(engine, svc.id).replicas)
    )
    assert [e for e in await _edited(engine, svc.id) if "rolling" in e][1:] == [
        "rolling restart done: replica 1, the last, is up"
    ]
    await engine.cancel(svc.id)
    await engine.wait(svc.id, timeout=30)


async def test_a_scale_down_removing_every_replica_left_to_restart_ends_the_roll_said(
    make_engine: EngineFactory,
) -> None:
    # Its timeline said it started, then nothing: every replica it had left went with the
    # scale-down (tester h177 #3).
    engine, clock, svc = await _rolling_portless(make_engine, 3)
    first, second, _ = _live(engine, svc.id).replicas
    # Replica 0 restarted and up; replica 1 stopped by the roll (the clock is stepped
    # only until then), then started, not up yet (5 s to settle: the clock stands).
    await eventually(lambda: second.roll is Roll.RESTARTING or (_stepped(clock, 1.0) and False))
    clock.advance(0.0)
    await eventually(lambda: second.roll is Roll.STARTED and second.pid is not None)
    assert first.roll is Roll.NONE
    await engine.edit(svc.id, {"replicas": 1})
    await eventually(lambda: len(_live(engine, svc.id).replicas) == 1)
    said = [e for e in await _edited(engine, svc.id) if e.startswith("rolling restart")]
    assert said[1:] == ["rolling restart stopped: replicas 1, 2 left removed by a scale-down"]
    await engine.cancel(svc.id)
    await engine.wait(svc.id, timeout=30)


async def test_a_roll_is_refused_where_it_does_not_apply_and_warned_of_one_replica(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(simulate=None, cpu_count=1)
    batch = await engine.submit({"command": ["sleep", "600"]})
    with pytest.raises(JobNotActive, match=r"job \d+ is running: only a service restarts"):
        await engine.roll(batch.id)
    waiting = await engine.submit(_service(["sleep", "600"], port=False))
    with pytest.raises(JobNotActive, match=r"is queued: only a running service restarts"):
        await engine.roll(waiting.id)
    await engine.cancel(batch.id)
    await eventually(
        lambda: (
            bool(_live(engine, waiting.id).replicas)
            and _live(engine, waiting.id).replicas[0].pid is not None
        )
    )
    warnings: list[str] = []
    assert await engine.roll(waiting.id, warnings) == [0]
    assert warnings == [
        f"job {waiting.id} has one replica: it serves nothing until that one is up again"
    ]
    await engine.cancel(waiting.id)
    ended = await engine.wait(waiting.id, timeout=30)
    assert ended.status is JobStatus.CANCELLED
    assert [r.roll for r in ended.replicas] == [Roll.NONE]  # (a cancel ends the roll)


def test_cli_restart_of_a_running_service_rolls_it_in_place(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    server = "exec " + " ".join(HTTP_SERVER) + " $PORT"  # (up as its port answers)
    out = served.cli("submit", "--service", "--replicas", "2", "--shell", "--", server)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()

    def replicas() -> list[dict[str, Any]]:
        shown = served.cli("status", job_id, "--json")
        return list(json.loads(shown.stdout)["job"]["replicas"])

    wait_for(lambda: all(r["pid"] and r["state"] == "up" for r in replicas()), timeout=30)
    pids = [r["pid"] for r in replicas()]

    rolled = served.cli("restart", job_id)
    assert rolled.returncode == 0, rolled.stderr
    assert rolled.stdout.strip() == job_id  # (the same job: restarted in place)
    assert rolled.stderr.strip() == (
        f"gpulayer-tui: job {job_id} restarts replicas 0, 1 one at a time, each once the one "
        f"before it is up again (`gpulayer-tui status {job_id}` shows where it is)"
    )
    wait_for(
        lambda: all(r["pid"] and r["pid"] not in pids and r["state"] == "up" for r in replicas()),
        timeout=60,
    )
    wait_for(lambda: "rolling restart done" in served.cli("status", job_id).stdout, timeout=30)
    served.cli("cancel", job_id)
    assert all(pid_gone(pid) for pid in pids)


async def test_a_restarted_replica_not_up_in_time_stops_the_roll(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    clock = ManualClock()
    engine = await make_engine(simulate=None, cpu_count=4, service_clock=clock)
    mute = tmp_path / "mute"  # (once there, a start opens no port)
    server = " ".join(HTTP_SERVER)
    svc = await engine.submit(
        _service(
            ["sh", "-c", f'[ -e "{mute}" ] && exec sleep 600; exec {server} "$PORT"'],
            replicas=2,
        )
    )
    await eventually(lambda: all(r.endpoint for r in _live(engine, svc.id).replicas), timeout=30)
    second_pid = _live(engine, svc.id).replicas[1].pid
    mute.write_text("")
    await engine.roll(svc.id)
    first = _live(engine, svc.id).replicas[0]
    await eventually(lambda: first.roll is Roll.RESTARTING)
    clock.advance(0.0)
    await eventually(lambda: first.roll is Roll.STARTED and first.pid is not None)
    assert first.state is R.STARTING
    clock.advance(60.0)  # ([services] restart_down_after)
    await eventually(lambda: first.roll is Roll.NONE)
    edited = (await _edited(engine, svc.id))[-1]
    assert edited.startswith(
        "rolling restart stopped: replica 0 was not up 60 s ([services] restart_down_after) "
        "(starting: "
    ), edited
    assert edited.endswith("after its restart; replica 1 not restarted")
    second = _live(engine, svc.id).replicas[1]
    assert second.pid == second_pid and second.state is R.UP and second.roll is Roll.NONE
    await engine.cancel(svc.id)
    await engine.wait(svc.id, timeout=30)


async def test_a_cancel_in_the_middle_of_a_roll_says_the_roll_stopped(
    make_engine: EngineFactory,
) -> None:
    # Its timeline said the roll began, then only the stops and "cancelled": the roll's
    # end went unsaid (so did a re-placement's) (tester h185 #3).
    engine, _clock, svc = await _rolling_portless(make_engine, 3)
    first = _live(engine, svc.id).replicas[0]
    await eventually(lambda: first.roll is Roll.RESTARTING)
    await engine.cancel(svc.id)
    await engine.wait(svc.id, timeout=30)
    said = [e for e in await _edited(engine, svc.id) if e.startswith("rolling restart")]
    assert len(said) == 2 and said[1].startswith("rolling restart stopped: stopping ("), said
    assert said[1].endswith("; replicas 1, 2 not restarted"), said
