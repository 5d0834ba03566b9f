"""State across engine restarts: history, re-attached jobs, exit codes, schema versions."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from gpulayer_tui.engine.errors import StoreError
from gpulayer_tui.engine.lock import EngineBusy, EngineLock
from gpulayer_tui.engine.models import JobStatus, TerminationReason
from gpulayer_tui.engine.paths import Paths

from .conftest import EngineFactory, eventually, make_config, pid_gone, pid_reaped


def gated(tmp_path: Path, code: int) -> dict[str, object]:
    """A job that runs until the file ``go`` appears, then exits ``code``."""
    return {
        "shell": f"while [ ! -e go ]; do sleep 0.02; done; exit {code}",
        "cwd": str(tmp_path),
    }


async def test_restart_keeps_history_and_ids(make_engine: EngineFactory) -> None:
    first = await make_engine()
    done = await first.submit({"command": ["true"], "name": "one"})
    await first.wait(done.id, timeout=10)
    over = await first.submit({"command": ["true"], "gpus": 9})
    before = [j.to_json() for j in await first.list_jobs()]
    events_before = await first.events_of(done.id)
    await first.stop()

    second = await make_engine()
    assert [j.to_json() for j in await second.list_jobs()] == before
    assert await second.events_of(done.id) == events_before
    assert (await second.get(over.id)).termination_reason is TerminationReason.OVER_CAPACITY
    new = await second.submit({"command": ["true"]})
    assert new.id == over.id + 1


async def test_a_database_moved_aside_never_reuses_an_id_the_launcher_knows(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # As a damaged database's message advises: moved aside, the next engine numbered from
    # 1 again, and a new job whose key the launcher knew was answered with the old run's
    # process (or its end): its own command never ran.
    first = await make_engine()
    old = await first.submit(gated(tmp_path, 42))
    assert old.status is JobStatus.RUNNING
    await first.stop()
    database = first.paths.database
    for path in database.parent.glob(database.name + "*"):
        path.rename(tmp_path / path.name)
    second = await make_engine()
    # The old run goes on, unwatched: said at start and by doctor (it was invisible while
    # it held what it used).
    assert [(key, pid) for key, pid, _ in second.unwatched_runs] == [(str(old.id), old.pid)]
    checks = {c["check"]: c for c in await second.doctor_checks()}
    assert checks["launcher"]["status"] == "warn"
    assert f"pid {old.pid} (launcher key {old.id})" in checks["launcher"]["detail"]
    assert "started from a database moved aside" in checks["launcher"]["detail"]
    new = await second.submit({"shell": "echo ran > new; exit 3", "cwd": str(tmp_path)})
    assert new.id > old.id and new.pid != old.pid
    done = await second.wait(new.id, timeout=10)
    assert (done.status, done.exit_code) == (JobStatus.FAILED, 3)
    assert (tmp_path / "new").read_text() == "ran\n"
    (tmp_path / "go").touch()  # (the old run ends; nobody here asks for it)
    await eventually(lambda: pid_reaped(old.pid or 0))
    assert "launcher" not in {c["check"] for c in await second.doctor_checks()}


async def test_a_database_moved_aside_never_reuses_an_id_with_a_log(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A run the launcher had forgotten (its end recorded) left only its log: after a
    # database reset its id was given again (the old log set aside as .old-*).
    first = await make_engine()
    done = await first.wait((await first.submit({"command": ["true"]})).id, timeout=10)
    await first.stop()
    database = first.paths.database
    for path in database.parent.glob(database.name + "*"):
        path.rename(tmp_path / path.name)
    second = await make_engine()
    assert second.executor.highest_job_id() < done.id  # (forgotten there)
    new = await second.submit({"command": ["true"]})
    assert new.id > done.id


async def test_an_engine_refused_for_its_snapshot_store_leaves_the_lock_free(
    make_engine: EngineFactory, paths: Paths
) -> None:
    from gpulayer_tui.engine.statedir import UnsafeStateDir

    paths.state_dir.mkdir(parents=True)
    (paths.state_dir / "snapshots").write_text("not a directory")
    with pytest.raises(UnsafeStateDir, match="is not a directory of the engine's own"):
        await make_engine()
    assert EngineLock(paths.lock).holder() is None
    (paths.state_dir / "snapshots").unlink()
    assert (await (await make_engine()).submit({"command": ["true"]})).id == 1


async def test_a_tui_that_loses_the_race_for_the_state_dir_attaches_to_the_winner(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two TUIs opened at once on a state dir with no engine: the second found no socket,
    # lost the lock to the first, and exited 2 saying "the TUI and the CLI attach to it".
    from gpulayer_tui import tui
    from gpulayer_tui.backend import SocketBackend
    from gpulayer_tui.engine.api import ApiServer

    winner = await make_engine()  # (the lock taken; its socket not served yet)
    looks: list[bool] = []
    looked = tui.engine_is_serving

    async def counted(paths: Paths) -> bool:
        looks.append(await looked(paths))
        return looks[-1]

    monkeypatch.setattr(tui, "engine_is_serving", counted)
    connecting = asyncio.create_task(tui._connect(winner.paths, "1xA100-80GB", None))
    await eventually(lambda: len(looks) >= 2 or connecting.done())  # (refused, it waits)
    assert not connecting.done() and looks == [False, False]
    server = ApiServer(winner, winner.paths.socket)
    await server.start()
    try:
        backend = await asyncio.wait_for(connecting, 30)
        assert isinstance(backend, SocketBackend)
        assert (await backend.submit({"command": ["true"], "gpus": 0}))["id"] == 1
        await backend.close()
    finally:
        await server.stop()


async def test_second_engine_on_the_same_dir_is_refused(make_engine: EngineFactory) -> None:
    first = await make_engine()
    # A snapshot the first one is building, and an object it wrote for it: the refused
    # one emptied the first's tmp/ and collected its objects before it took the lock.
    building = first.snapshots.tmp / "job-9"
    building.mkdir()
    (building / "train.py").write_text("in flight")
    (first.snapshots.objects / "0123abcd").write_text("linked into job-9 next")
    with pytest.raises(EngineBusy, match=f"already serving .*\\(pid {os.getpid()}\\)"):
        await make_engine()
    assert (building / "train.py").read_text() == "in flight"
    assert (first.snapshots.objects / "0123abcd").exists()
    # Its lock file removed under it (a tmp cleaner): a second engine started and served
    # the same database beside it.
    first.paths.lock.unlink()
    with pytest.raises(EngineBusy, match=f"already serving .*\\(pid {os.getpid()}\\)"):
        await make_engine()
    assert EngineLock(first.paths.lock).holder() == os.getpid()
    assert (await first.submit({"command": ["true"]})).id == 1


def test_an_engine_started_while_the_last_one_stops_waits_for_its_lock(tmp_path: Path) -> None:
    # Started a second after SIGTERM to the last one, an engine was refused ("already
    # serving") by the one on its way out, and none ran (tester h90).
    import threading

    path = tmp_path / "engine.lock"
    first = EngineLock(path)
    first.acquire()
    with pytest.raises(EngineBusy, match="already serving"):
        EngineLock(path).acquire()  # (serving: refused at once)
    first.mark_stopping()
    with pytest.raises(EngineBusy, match=r"is stopping, and still held it after 0.2 s"):
        EngineLock(path).acquire(stopping_wait=0.2)
    threading.Timer(0.3, first.release).start()
    second = EngineLock(path)
    second.acquire(stopping_wait=30)
    assert second.held and EngineLock(path).holder() == os.getpid()
    assert path.read_text() == f"{os.getpid()}\n"
    second.release()


async def test_running_job_is_reattached_and_its_exit_code_learned(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    first = await make_engine()
    job = await first.submit(gated(tmp_path, 7))
    assert job.status is JobStatus.RUNNING
    await first.stop()
    assert not pid_gone(job.pid or 0)  # the job outlived its engine

    second = await make_engine()
    live = await second.get(job.id)
    assert live.status is JobStatus.RUNNING and live.pid == job.pid
    assert second.unwatched_runs == []  # (watched again: nothing to say)
    (tmp_path / "go").touch()
    done = await second.wait(job.id, timeout=10)
    assert done.status is JobStatus.FAILED
    assert done.exit_code == 7 and done.termination_reason is TerminationReason.EXIT_CODE


async def test_job_that_ended_while_engine_was_down(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    first = await make_engine()
    ok = await first.submit(gated(tmp_path, 0))
    await first.stop()
    (tmp_path / "go").touch()
    await eventually(lambda: pid_reaped(ok.pid or 0))  # its launcher records 0, then reaps

    restarted_at = time.time()
    second = await make_engine()
    done = await second.wait(ok.id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.exit_code == 0
    # Its pid stays in its history (it was written nowhere of ours: null ever after).
    await second.store.flush()
    stored = await second.store.get_job(ok.id)
    assert done.pid == ok.pid and stored is not None and stored.pid == ok.pid
    # Its timeline has the end when it was, not when the next engine learnt of it.
    end = (await second.events_of(ok.id))[-1]
    assert end["status"] == "completed"
    assert done.ended_at is not None and end["at"] == pytest.approx(done.ended_at, abs=1e-6)
    assert end["at"] < restarted_at


async def test_job_killed_while_engine_was_down_is_never_shown_running(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    first = await make_engine()
    job = await first.submit(gated(tmp_path, 0))
    queued_dep = await first.submit({"command": ["true"], "depends_on": [job.id]})
    assert queued_dep.status is JobStatus.QUEUED
    await first.stop()
    assert job.pid, job  # (killpg(0) would kill the tests' own group)
    os.killpg(job.pid, signal.SIGKILL)
    await eventually(lambda: pid_gone(job.pid or 0))

    second = await make_engine()
    killed = await second.get(job.id)
    # Its launcher, its parent, saw how it ended while no engine ran.
    assert killed.status is JobStatus.FAILED and killed.exit_code == 137
    assert killed.termination_reason is TerminationReason.SIGNAL
    dep = await second.wait(queued_dep.id, timeout=10)
    assert dep.termination_reason is TerminationReason.DEPENDENCY_FAILED


async def test_queued_job_survives_restart(make_engine: EngineFactory, tmp_path: Path) -> None:
    first = await make_engine("1xA100-80GB")
    blocker = await first.submit({**gated(tmp_path, 0), "gpus": 1})
    waiting = await first.submit({"command": ["true"], "gpus": 1})
    assert waiting.status is JobStatus.QUEUED
    await first.stop()

    second = await make_engine("1xA100-80GB")
    assert (await second.get(waiting.id)).status is JobStatus.QUEUED
    (tmp_path / "go").touch()
    assert (await second.wait(blocker.id, timeout=10)).status is JobStatus.COMPLETED
    assert (await second.wait(waiting.id, timeout=10)).status is JobStatus.COMPLETED


async def test_after_a_restart_running_jobs_keep_their_slots_before_anything_starts(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A waiting job whose dependency has ended is looked up in the database while the
    # engine restores; a scheduling pass then ran before the running jobs had taken their
    # GPUs back, and started the job queued for both GPUs on top of them.
    first = await make_engine("2xA100-80GB")
    ended = await first.submit({"command": ["true"]})
    await first.wait(ended.id, timeout=10)
    holders = [await first.submit({**gated(tmp_path, 0), "gpus": 1}) for _ in range(2)]
    both = await first.submit({"command": ["true"], "gpus": 2})
    after = await first.submit(
        {"command": ["true"], "gpus": 1, "depends_on": [{"job": ended.id, "any_exit": True}]}
    )
    assert both.status is JobStatus.QUEUED and after.status is JobStatus.QUEUED
    await first.stop()

    second = await make_engine("2xA100-80GB")
    second.queue.schedule()  # (a pass now must not start them either)
    await second.store.flush()
    assert (await second.get(both.id)).status is JobStatus.QUEUED
    assert (await second.get(after.id)).status is JobStatus.QUEUED
    assert [(await second.get(h.id)).status for h in holders] == [JobStatus.RUNNING] * 2
    (tmp_path / "go").touch()
    for job in (*holders, both, after):
        assert (await second.wait(job.id, timeout=10)).status is JobStatus.COMPLETED


async def test_database_from_a_newer_schema_is_refused(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine()
    await engine.stop()
    with sqlite3.connect(engine.paths.database) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99 is newer"):
        await make_engine()


async def test_new_database_is_migrated_to_current_schema(make_engine: EngineFactory) -> None:
    from gpulayer_tui.engine.store import SCHEMA_VERSION

    engine = await make_engine()
    await engine.stop()
    with sqlite3.connect(engine.paths.database) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"jobs", "events", "engine_runs"} <= tables
    assert oct(engine.paths.state_dir.stat().st_mode & 0o777) == "0o700"


async def test_a_services_timeout_counts_from_the_first_start_across_a_restart(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(simulate=None)
    spec: dict[str, object] = {"command": ["sleep", "600"], "timeout": 3}
    spec |= {"kind": "service", "port": False}
    job = await engine.submit(spec)
    started = (await engine.get(job.id)).started_at
    assert job.status is JobStatus.RUNNING and started is not None
    await engine.stop()  # its timer goes with this engine
    # Its limit passes while no engine runs: the next one stops it at once, rather than
    # giving it the whole limit again from its own start, and says how long it ran.
    await eventually(lambda: time.time() > started + 5.5, timeout=10)
    restarted_at = time.time()
    again = await make_engine(simulate=None)
    done = await again.wait(job.id, timeout=20)
    assert (done.status, done.termination_reason) == (JobStatus.FAILED, TerminationReason.TIMEOUT)
    assert done.message.startswith("timed out after 3 s (stopped at ")
    assert done.message.endswith(" s: no engine ran to stop it sooner)")
    assert done.ended_at is not None and done.ended_at < restarted_at + 3


async def test_the_launcher_keeps_a_jobs_timeout_while_no_engine_runs(
    make_engine: EngineFactory,
) -> None:
    # A stopped engine (an upgrade, a crash) no longer lets a job run past its limit: its
    # launcher stops it on time, and the next engine ends it "timeout", not "killed".
    engine = await make_engine()
    job = await engine.submit({"command": ["sleep", "600"], "timeout": 1})
    assert job.pid is not None and job.started_at is not None
    await engine.stop()
    await eventually(lambda: pid_reaped(job.pid or 0), timeout=10)
    again = await make_engine()
    done = await again.wait(job.id, timeout=10)
    assert (done.status, done.termination_reason) == (JobStatus.FAILED, TerminationReason.TIMEOUT)
    assert done.message == ("timed out after 1 s (its launcher stopped it: no engine was running)")
    assert done.exit_code == 128 + signal.SIGTERM
    assert done.ended_at is not None and done.ended_at - job.started_at < 3


async def test_an_engine_that_finds_the_launcher_stopping_a_job_for_its_timeout(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # It ignores SIGTERM: when the next engine starts it is still in its grace period.
    # That engine records the timeout at once (a cancel now changes nothing), and the
    # launcher's SIGKILL ends it at the deadline it set.
    ready = tmp_path / "trap-set"
    engine = await make_engine(config=make_config(engine={"grace_period": 4.0}))
    job = await engine.submit(
        {"shell": f"trap '' TERM; touch {ready}; sleep 600 & wait; wait", "timeout": 1}
    )
    await eventually(ready.exists, timeout=10)
    await engine.stop()
    journal_path = engine.paths.state_dir / "launcher.journal"
    await eventually(lambda: f"K {job.id} " in journal_path.read_text(), timeout=10)
    again = await make_engine(config=make_config(engine={"grace_period": 4.0}))
    stopping = await again.get(job.id)
    assert stopping.status is JobStatus.RUNNING
    assert stopping.stop_reason is TerminationReason.TIMEOUT
    await again.cancel(job.id)
    done = await again.wait(job.id, timeout=15)
    assert (done.status, done.termination_reason) == (JobStatus.FAILED, TerminationReason.TIMEOUT)
    assert done.message == (
        "timed out after 1 s (its launcher stopped it: no engine was running); SIGTERM did "
        "not end it: SIGKILL did, after the grace period"
    )
    assert done.exit_code == 128 + signal.SIGKILL


async def test_a_stop_under_way_across_a_restart_sends_no_second_sigterm(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # The next engine signalled it again: to many servers and trainers a second SIGTERM
    # is "quit now", cutting short the shutdown the grace period is for.
    terms, ready = tmp_path / "terms", tmp_path / "ready"
    script = f"trap 'echo term >> {terms}' TERM; touch {ready}; while :; do sleep 0.05; done"
    config = make_config(engine={"grace_period": 3.0})
    engine = await make_engine(config=config)
    job = await engine.submit({"shell": script})
    await eventually(ready.exists, timeout=10)
    await engine.cancel(job.id)
    await eventually(lambda: terms.exists() and terms.read_text() == "term\n", timeout=10)
    await engine.stop()
    again = await make_engine(config=config)
    done = await again.wait(job.id, timeout=15)  # (its SIGKILL, at the deadline that stands)
    assert done.status is JobStatus.CANCELLED
    assert terms.read_text() == "term\n"


async def test_a_timeout_whose_sigkill_the_launcher_sent_is_not_said_late(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # It outlived its SIGTERM, and the launcher killed it after the grace period, on time:
    # its end said "no engine or launcher ran to stop it sooner".
    ready = tmp_path / "trap-set"
    config = make_config(engine={"grace_period": 3.0})
    engine = await make_engine(config=config)
    job = await engine.submit(
        {"shell": f"trap '' TERM; touch {ready}; sleep 600 & wait; wait", "timeout": 1}
    )
    await eventually(ready.exists, timeout=10)
    await engine.stop()
    journal_path = engine.paths.state_dir / "launcher.journal"
    await eventually(lambda: f"E {job.id} " in journal_path.read_text(), timeout=15)
    again = await make_engine(config=config)
    done = await again.wait(job.id, timeout=15)
    assert done.termination_reason is TerminationReason.TIMEOUT
    assert done.message == (
        "timed out after 1 s (its launcher stopped it: no engine was running; it outlived "
        "SIGTERM and was killed 3 s later)"
    ), done.message


async def test_a_timeout_whose_program_shut_down_in_its_grace_period_is_not_said_late(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Its launcher sent SIGTERM on time, and the program took 3 s to shut down (a server
    # draining, a trainer saving): its end, 4 s after its start, was said "stopped at 4 s:
    # no engine or launcher ran to stop it sooner" (tester h188 #4). Likewise a job the
    # next engine finds still shutting down.
    config = make_config(engine={"grace_period": 20.0})
    engine = await make_engine(config=config)
    shutdown = "trap 'sleep 3; exit 0' TERM; touch {ready}; sleep 600 & wait"
    ends, drains = tmp_path / "ends", tmp_path / "drains"
    job = await engine.submit({"shell": shutdown.format(ready=ends), "timeout": 1})
    slow = await engine.submit(
        {"shell": f"trap 'sleep 600' TERM; touch {drains}; sleep 600 & wait",
         "timeout": 1}
    )  # fmt: skip
    await eventually(lambda: ends.exists() and drains.exists(), timeout=10)
    await engine.stop()
    journal_path = engine.paths.state_dir / "launcher.journal"
    await eventually(lambda: f"E {job.id} " in journal_path.read_text(), timeout=15)
    again = await make_engine(config=config)
    done = await again.wait(job.id, timeout=15)
    assert done.termination_reason is TerminationReason.TIMEOUT
    assert done.message == "timed out after 1 s (its launcher stopped it: no engine was running)"
    assert done.ended_at is not None and done.started_at is not None
    assert done.ended_at - done.started_at >= 3.5  # (its shutdown, 3 s after the SIGTERM)
    stopping = await again.get(slow.id)
    assert stopping.status is JobStatus.RUNNING
    assert stopping.started_at is not None and time.time() - stopping.started_at > 4
    said = "(timed out after 1 s (its launcher stopped it: no engine was running))"
    assert stopping.message is not None and said in stopping.message, stopping.message
    assert stopping.pid is not None
    os.killpg(stopping.pid, signal.SIGKILL)
    await again.wait(slow.id, timeout=10)


async def test_an_old_wrappers_job_that_ended_while_no_engine_ran_ends_when_its_file_says(
    make_engine: EngineFactory,
) -> None:
    """A job an older version ran under its per-job ``sh`` wrapper, which wrote its exit
    file 100 s before this engine started: it ended then, not when the engine looked."""
    from gpulayer_tui import __version__
    from gpulayer_tui.engine.models import Job, JobKind
    from gpulayer_tui.engine.store import Store

    engine = await make_engine()
    paths = engine.paths
    await engine.stop()
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    now = time.time()
    store = Store(paths.database, lambda _event: None)
    await store.open(__version__, os.getpid())
    job = Job(id=1, name="old", kind=JobKind.COMMAND, spec={"command": ["true"], "cwd": "/tmp"},
              priority=0)  # fmt: skip
    job.created_at = job.queued_at = now - 300
    job.started_at = now - 200
    job.status, job.pid, job.domains = JobStatus.RUNNING, gone.pid, ["cpu"]
    store.save(job, [], new=True)
    await store.flush()
    await store.close()
    exit_file = paths.state_dir / "jobs" / "1.exit"
    exit_file.parent.mkdir(exist_ok=True)
    exit_file.write_text("3\n")
    os.utime(exit_file, (now - 100, now - 100))
    again = await make_engine()
    ended = await again.wait(1, timeout=10)
    assert ended.status is JobStatus.FAILED and ended.exit_code == 3
    assert ended.ended_at is not None and abs(ended.ended_at - (now - 100)) < 1


async def test_an_environment_is_stored_once_and_each_job_gets_its_own_back(
    make_engine: EngineFactory, paths: Paths, tmp_path: Path
) -> None:
    # The CLI sends the shell's whole environment with every job: stored with each row it
    # was most of the database (about 4 KB a job, tester h76). A sweep's jobs share one.
    engine = await make_engine()
    shared = {"PAD": "x" * 20000, "WHO": "sweep"}
    gate = await engine.submit({**gated(tmp_path, 0), "gpus": 0})
    script = 'echo "$WHO ${#PAD}"'
    sweep = [
        await engine.submit({"shell": script, "gpus": 0, "env": shared, "depends_on": [gate.id]})
        for _ in range(30)
    ]
    other = await engine.submit(
        {"shell": script, "gpus": 0, "env": {"WHO": "other", "PAD": "y"}, "depends_on": [gate.id]}
    )
    plain = await engine.submit({"command": ["true"], "gpus": 0, "depends_on": [gate.id]})
    await engine.edit(sweep[0].id, {"name": "renamed"})  # (an edit keeps it)
    await engine.store.flush()

    def count(sql: str) -> int:
        with sqlite3.connect(paths.database) as db:
            return int(db.execute(sql).fetchone()[0])

    assert count("SELECT COUNT(*) FROM envs") == 2
    assert count("SELECT MAX(length(spec)) FROM jobs") < 1000  # (not in the rows)
    # Across a restart, each waiting job is read back with its own environment.
    await engine.stop()
    again = await make_engine()
    assert (await again.get(sweep[0].id)).spec["env"] == shared
    assert (await again.get(sweep[0].id)).name == "renamed"
    assert (await again.get(other.id)).spec["env"] == {"WHO": "other", "PAD": "y"}
    assert (await again.get(plain.id)).spec["env"] == {}
    (tmp_path / "go").touch()
    for job in [*sweep, other]:
        assert (await again.wait(job.id, timeout=30)).status is JobStatus.COMPLETED
    assert again.log_path(sweep[-1].id).read_text().endswith("sweep 20000\n")
    assert again.log_path(other.id).read_text().endswith("other 1\n")
    # A clean takes an environment with the last job that named it.
    await again.wait(plain.id, timeout=10)
    await again.retention.clean(None, keep=0)
    assert count("SELECT COUNT(*) FROM envs") == 0
    fresh = await again.submit({"shell": script, "gpus": 0, "env": shared})
    assert (await again.wait(fresh.id, timeout=10)).status is JobStatus.COMPLETED
    assert again.log_path(fresh.id).read_text().endswith("sweep 20000\n")
    assert count("SELECT COUNT(*) FROM envs") == 1


async def test_rows_from_before_environments_were_shared_keep_theirs(
    make_engine: EngineFactory, paths: Paths
) -> None:
    from gpulayer_tui.engine.store import MIGRATIONS

    # A version-13 database, its waiting job's environment in its spec.
    paths.state_dir.mkdir(parents=True, mode=0o700)
    with sqlite3.connect(paths.database) as db:
        for step in MIGRATIONS[:13]:
            for statement in step:
                db.execute(statement)
        db.execute(
            "INSERT INTO jobs (id, name, kind, status, created_at, queued_at, spec) VALUES "
            "(1, 'sh', 'command', 'queued', 1.0, 1.0, ?)",
            ('{"shell": "echo $OLD", "gpus": 0, "env": {"OLD": "kept"}}',),
        )
        db.execute("PRAGMA user_version = 13")
    engine = await make_engine()
    await engine.resume()
    assert (await engine.wait(1, timeout=10)).status is JobStatus.COMPLETED
    assert engine.log_path(1).read_text().endswith("kept\n")
