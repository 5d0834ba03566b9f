"""Faults: a database that cannot be written, launch failures, a flood of submissions.

Real engines, real SQLite files, real processes. The write failures are made at the write
boundary (SQLite's own "database or disk is full" and "readonly database" errors on the
engine's writer connection) everywhere, and with a real full or read-only filesystem (a
tiny tmpfs) where the tests run as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer_tui.backend import SocketBackend
from gpulayer_tui.client import ApiError, Client
from gpulayer_tui.engine.api import ApiServer
from gpulayer_tui.engine.engine import Engine, Overloaded
from gpulayer_tui.engine.errors import StoreError
from gpulayer_tui.engine.models import JobStatus, TerminationReason
from gpulayer_tui.engine.paths import Paths, resolve_paths

from .conftest import (
    REPO,
    EngineFactory,
    Served,
    adopt,
    eventually,
    launcher_gone,
    make_config,
    wait_for,
)
from .raw_http import UnixHTTPConnection, request


def _db_rows(paths: Paths, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the engine's database from a separate connection (what a restart would see)."""
    with sqlite3.connect(paths.database) as db:
        return list(db.execute(sql, args))


async def _cli(paths: Paths, *args: str) -> tuple[int, str, str]:
    """Run the real CLI against an in-process engine (without blocking its loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpulayer_tui",
        *args,
        env=dict(os.environ, GPULAYER_HOME=str(paths.state_dir)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# -- the database cannot be written -----------------------------------------------------------


async def _break_writes(engine: Engine, how: str) -> None:
    def apply(db: sqlite3.Connection) -> None:
        if how == "full":
            # SQLite's SQLITE_FULL, exactly what ENOSPC gives: no page may be added.
            pages = int(db.execute("PRAGMA page_count").fetchone()[0])
            db.execute(f"PRAGMA max_page_count = {pages}")
        else:
            db.execute("PRAGMA query_only = 1")

    await engine.store.run_on_writer(apply)


async def _mend_writes(engine: Engine, how: str) -> None:
    def apply(db: sqlite3.Connection) -> None:
        if how == "full":
            db.execute("PRAGMA max_page_count = 1073741823")
        else:
            db.execute("PRAGMA query_only = 0")

    await engine.store.run_on_writer(apply)


@pytest.mark.parametrize(
    ("how", "error"),
    [("full", "database or disk is full"), ("read-only", "attempt to write a readonly database")],
)
async def test_unwritable_database_refuses_new_work_and_loses_nothing(
    make_engine: EngineFactory, tmp_path: Path, how: str, error: str
) -> None:
    engine = await make_engine()
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    try:
        go = tmp_path / "go"
        running = await engine.submit({"shell": f"while [ ! -e {go} ]; do sleep 0.02; done"})
        assert running.status is JobStatus.RUNNING
        await _break_writes(engine, how)
        # The first write that fails: a submission that needs new pages. It is refused
        # (503 over the API), and its job is cancelled, not left to run unrecorded.
        big = {f"BIG{i}": "x" * 50_000 for i in range(4)}
        with pytest.raises(StoreError, match=f"refuses new work: database write failed: {error}"):
            # (placed at once: a start decided, never acted on, as the commit failed)
            await engine.submit({"command": ["true"], "env": big})
        assert engine.health()["store_failure"] == f"database write failed: {error}"
        ready, why = engine.domain_ops.readiness()
        assert not ready and f"not accepting work: database write failed: {error}" in why
        checks = {c["check"]: c for c in await engine.domain_ops.doctor_checks()}
        assert checks["database writes"]["status"] == "fail"
        assert checks["database writes"]["detail"] == f"database write failed: {error}"
        # Now every new submission is refused at once, with the reason; the CLI says so.
        with pytest.raises(StoreError, match=error):
            await engine.submit({"command": ["true"]})
        rc, out, err = await _cli(engine.paths, "submit", "--", "true")
        assert rc == 1 and out == ""
        assert f"gpulayer-tui: the engine refuses new work: database write failed: {error}" in err
        # Meanwhile the running job ends; its end cannot be written yet.
        go.touch()
        await eventually(lambda: running.id not in engine.book)
        # clean cannot see that end either: it says why it removed nothing (it reported
        # 0 removed while a job's log filled the disk), and where the space went.
        said = f"nothing was cleaned: database write failed: {error}"
        with pytest.raises(StoreError, match=said):
            await engine.retention.clean(None, keep=0)
        # Reads still work and the engine carries on.
        rc, out, _ = await _cli(engine.paths, "jobs", "--json")
        assert rc == 0 and json.loads(out)
        # Writes work again: everything held back is committed, nothing was lost.
        await _mend_writes(engine, how)
        await eventually(lambda: engine.store.failure is None)
        assert engine.domain_ops.readiness()[0]
        # (the refused job's end is the commit after the one that first works again)
        await eventually(
            lambda: (
                _db_rows(engine.paths, "SELECT status FROM jobs ORDER BY id DESC LIMIT 1")
                == [("cancelled",)]
            )
        )
        rows = dict(
            (r[0], r[1:]) for r in _db_rows(engine.paths, "SELECT id, status, message FROM jobs")
        )
        assert rows[running.id][0] == "completed"
        refused = max(rows)
        assert rows[refused][0] == "cancelled"
        assert rows[refused][1] == f"not recorded: database write failed: {error}"
        # It never ran, and its row says no start (it said "started", "runtime 0s").
        assert _db_rows(engine.paths, f"SELECT started_at, pid FROM jobs WHERE id={refused}") == [
            (None, None)
        ]
        timeline = [e["status"] for e in await engine.events_of(running.id)]
        assert timeline == ["pending", "running", "completed"]
        later = await engine.submit({"command": ["true"]})
        assert (await engine.wait(later.id, timeout=10)).status is JobStatus.COMPLETED
    finally:
        await server.stop()


async def test_a_job_that_ends_during_a_write_outage_reads_ended_and_is_waited_for_until_durable(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    go = tmp_path / "go"
    job = await engine.submit({"shell": f"while [ ! -e {go} ]; do sleep 0.02; done"})
    await _break_writes(engine, "read-only")
    with pytest.raises(StoreError):
        await engine.submit({"command": ["true"]})  # (the outage is noticed)
    waiting = asyncio.create_task(engine.wait(job.id))
    go.touch()
    await eventually(lambda: job.id not in engine.book)
    # Its end cannot be written: reads show what happened, never the stale "running",
    # and a waiter is not told "ended" while the database still says "running".
    assert (await engine.get(job.id)).status is JobStatus.COMPLETED
    assert _db_rows(engine.paths, "SELECT status FROM jobs WHERE id = ?", (job.id,)) == [
        ("running",)
    ]
    with pytest.raises(TimeoutError):
        await engine.wait(job.id, timeout=0.3)
    assert not waiting.done()
    await _mend_writes(engine, "read-only")
    done = await asyncio.wait_for(waiting, timeout=20)
    assert done.status is JobStatus.COMPLETED
    # It returned once the end was durable.
    assert _db_rows(engine.paths, "SELECT status FROM jobs WHERE id = ?", (job.id,)) == [
        ("completed",)
    ]


async def test_a_cancel_during_a_write_outage_says_it_is_kept_and_signals_only_once_stored(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(config=make_config(engine={"grace_period": 2}))
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    try:
        ready = tmp_path / "ready"
        ignores = (
            "import pathlib, signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "time.sleep(600)"
        )
        job = await engine.submit({"command": [sys.executable, "-c", ignores]})
        assert job.pid is not None
        await eventually(ready.exists)
        await _break_writes(engine, "read-only")
        with pytest.raises(StoreError):
            await engine.submit({"command": ["true"]})  # (the outage is noticed)
        # Answered 503 as if refused, yet kept and acted on later: the answer says which.
        rc, _, err = await _cli(engine.paths, "cancel", str(job.id))
        assert rc == 1
        assert "not stored yet (database write failed: attempt to write a readonly" in err
        assert "it is kept and takes effect once the database takes writes again" in err
        os.kill(job.pid, 0)  # (not signalled: the stop is not durable)
        # ... and its message says so ("SIGTERM sent, SIGKILL due" was said of a job no
        # signal had reached, for as long as the disk was full: tester h187 #1).
        waiting = (await engine.get(job.id)).message
        assert waiting.startswith(
            "stopping (cancelled by user): SIGTERM once this is stored (the database cannot "
            "be written now), SIGKILL "
        ), waiting
        await _mend_writes(engine, "read-only")
        # Stored, it is sent, and said sent (the job ignores it: SIGKILL 2 s later).
        await eventually(lambda: "SIGTERM sent" in engine.book.get(job.id).job.message)  # type: ignore[union-attr]
        done = await engine.wait(job.id, timeout=20)
        assert done.status is JobStatus.CANCELLED
        assert done.message.endswith("SIGKILL did, after the grace period"), done.message
    finally:
        await server.stop()


# -- a real full or read-only filesystem (root: a tiny tmpfs) ----------------------------------


@pytest.fixture
def tiny_fs(home: Path) -> Iterator[Path]:
    """Mount a 3 MiB tmpfs as the test's GPULAYER_HOME (root only; skipped otherwise)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs for a real full/read-only disk")
    home.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(home)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    # No free-space floor: these tests are about the disk filling up under the engine.
    (home / "config.toml").write_text("[logs]\nmin_free_mb = 0\n")
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


def _fill(path: Path) -> None:
    """Write ``path`` until the filesystem has no space left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    block = b"\0" * 4096
    try:
        while True:
            os.write(fd, block)  # unbuffered: nothing is left to fail at close
    except OSError as err:
        assert err.errno == 28, err  # ENOSPC
    finally:
        os.close(fd)


def test_full_disk_refuses_work_with_the_reason_then_recovers(
    served: Served, tiny_fs: Path
) -> None:
    served.start("--simulate", "1xA100-80GB")
    done = served.cli("submit", "--", "true").stdout.strip()
    assert served.cli("wait", done).returncode == 0
    go = served.home.parent / "go"  # (outside the full disk)
    ending = served.cli("submit", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done")
    ending_id = ending.stdout.strip()
    filler = tiny_fs / "filler"
    _fill(filler)
    sock = tiny_fs / "engine.sock"
    # A submission whose rows need new space fails to commit: refused, 503, with the reason.
    big = {f"BIG{i}": "x" * 100_000 for i in range(5)}
    status, data = request(sock, "POST", "/v1/jobs", {"command": ["true"], "env": big})
    assert status == 503
    assert data["error"].startswith("the engine refuses new work: database write failed")
    assert "full" in data["error"]
    cli = served.cli("submit", "--", "true")
    assert cli.returncode == 1 and "refuses new work" in cli.stderr and "full" in cli.stderr
    assert served.cli("status", done).returncode == 0  # reads keep working
    # A job that ends meanwhile reads ended; `wait` answers once its end is stored, and
    # says so (it sat silent, and `--timeout` said "job 26 still failed": tester h186).
    go.touch()
    wait_for(lambda: '"completed"' in served.cli("status", ending_id, "--json").stdout)
    timed = served.cli("wait", ending_id, "--timeout", "0.5")
    assert timed.returncode == 5, timed
    assert timed.stderr == (
        f"gpulayer-tui: job {ending_id} has ended (completed), but its end is still not stored "
        "after 0.5 s\n"
    )
    # `stop` now would lose that end: refused, unless forced (it stopped, and a cancel the
    # engine had said it kept was lost: tester h186 #3).
    refused = served.cli("stop")
    assert refused.returncode == 1, refused
    assert "cannot write its database (" in refused.stderr and "--force" in refused.stderr
    assert served.proc is not None and served.proc.poll() is None
    waiter = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "wait", ending_id],
        env=served.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    filler.unlink()
    wait_for(lambda: request(sock, "GET", "/v1/health")[1]["store_failure"] is None, timeout=20)
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, (out, err)
    assert out.startswith(f"job {ending_id} completed"), out
    # It ended while the disk was full: its log may lack what it wrote then, and its end
    # says so (a program that ignores its write errors completed unsaid: tester h186 #7).
    ended = json.loads(served.cli("status", ending_id, "--json").stdout)["job"]
    assert "its log may lack output ('No space left on device')" in ended["message"], ended
    again = served.cli("submit", "--", "true")
    assert again.returncode == 0, again.stderr
    assert served.cli("wait", again.stdout.strip()).returncode == 0
    assert served.proc is not None and served.proc.poll() is None
    assert "Traceback" not in served.stop()


def test_read_only_state_dir_refuses_to_start_with_the_reason(
    served: Served, tiny_fs: Path
) -> None:
    served.start("--simulate", "1xA100-80GB")
    job = served.cli("submit", "--", "true").stdout.strip()
    assert served.cli("wait", job).returncode == 0
    served.stop()
    # Its launcher exits once idle, and holds the journal open for writing until then
    # (a remount while it is still going is refused: "mount point is busy").
    wait_for(lambda: launcher_gone(served.home))
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    proc = served.start("--simulate", "1xA100-80GB", wait=False)
    assert proc.wait(timeout=30) == 2
    log = served.log.read_text()
    assert f"the state dir {tiny_fs} cannot be written: Read-only file system" in log
    assert "Traceback" not in log
    subprocess.run(["mount", "-o", "remount,rw", str(tiny_fs)], check=True)
    served.start("--simulate", "1xA100-80GB")
    assert served.cli("status", job).returncode == 0  # history intact


@pytest.mark.parametrize("free_kib", [20, 100])
def test_a_migration_on_a_full_disk_says_the_disk_is_full_and_keeps_the_database(
    served: Served, tiny_fs: Path, free_kib: int
) -> None:
    # SQLite rolls a transaction back itself when the disk fills; our own ROLLBACK then
    # raised "cannot rollback - no transaction is active", which hid the reason.
    from gpulayer_tui.engine.store import MIGRATIONS

    database = tiny_fs / "gpulayer.db"
    with sqlite3.connect(database) as db:
        for statement in MIGRATIONS[0]:
            db.execute(statement)
        db.executemany(
            "INSERT INTO jobs (id, name, kind, status, message, created_at, ended_at, spec) "
            "VALUES (?, 'true', 'command', 'completed', ?, 1.0, ?, '{}')",
            [(i, "x" * 40, float(i)) for i in range(1, 8001)],
        )
        db.execute("PRAGMA user_version = 1")
    db.close()
    filler = tiny_fs / "filler"
    _fill(filler)
    # Room for the engine's start-up files, not for the migration's new index pages.
    # (with a few KiB SQLite says "disk I/O error", not "full": the free space is named)
    os.truncate(filler, filler.stat().st_size - free_kib * 1024)
    from gpulayer_tui.engine.store import _free_space_note

    assert f"{free_kib} KiB free on its disk: it is likely full" in _free_space_note(database)
    proc = served.start("--simulate", "1xA100-80GB", wait=False)
    assert proc.wait(timeout=30) == 2
    log = served.log.read_text()
    assert "full" in log and "no transaction is active" not in log, log[-2000:]
    assert "Traceback" not in log
    filler.unlink()  # (reading it in WAL mode needs room for its -shm file)
    with sqlite3.connect(database) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] >= 1
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 8000
    served.start("--simulate", "1xA100-80GB")  # with room again, it migrates and serves
    assert served.cli("status", "8000").returncode == 0


def test_database_from_a_newer_schema_stops_serve_with_the_reason(served: Served) -> None:
    served.home.mkdir(parents=True)
    with sqlite3.connect(served.home / "gpulayer.db") as db:
        db.execute("PRAGMA user_version = 999")
    proc = served.start("--simulate", "1xA100-80GB", wait=False)
    assert proc.wait(timeout=30) == 2
    log = served.log.read_text()
    assert "database schema version 999 is newer than this gpulayer-tui understands" in log
    assert "upgrade gpulayer-tui" in log and "Traceback" not in log


# -- launch failures ----------------------------------------------------------------------------


async def test_launch_failures_name_the_reason_and_the_engine_carries_on(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o644)  # not executable
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        ({"command": [str(script)]}, f"permission denied: {script} is not executable"),
        ({"command": ["./script.sh"], "cwd": str(tmp_path)}, "./script.sh is not executable"),
        ({"command": [str(tmp_path)]}, f"cannot run {tmp_path}: it is a directory"),
        ({"command": ["no-such-program-xyz"]}, "command not found: no-such-program-xyz"),
        # What a user wrote is quoted as text: no line break or escape in the message.
        ({"command": ["prog\nX\x1b[2J"]}, "command not found: prog\\x0aX\\x1b[2J (no such"),
        ({"command": [str(tmp_path / "nope")]}, "(no such file)"),
        (
            {"command": ["true"], "cwd": str(tmp_path / "gone")},
            f"working directory does not exist: {tmp_path / 'gone'}",
        ),
        (
            {"command": ["true"], "cwd": str(a_file)},
            f"working directory is not a directory: {a_file}",
        ),
    ]
    for spec, message in cases:
        job = await engine.submit(spec)
        assert job.status is JobStatus.FAILED, spec
        assert job.termination_reason is TerminationReason.LAUNCH_FAILED
        assert message in job.message, (spec, job.message)
    # A log that cannot be written: the next job's log path is taken by a directory.
    first = await engine.submit({"command": ["true"]})
    await engine.wait(first.id, timeout=10)
    blocked = engine.log_path(first.id + 1)
    blocked.mkdir()
    submitted = await engine.submit({"command": ["true"]})
    assert submitted.id == first.id + 1
    # (The spawner finds the log's path taken: its answer may come after the submit's.)
    nolog = await engine.wait(submitted.id, timeout=10)
    assert nolog.termination_reason is TerminationReason.LAUNCH_FAILED
    assert nolog.message == f"cannot write the job's log {blocked}: Is a directory"
    # The reasons are stored, and the engine carries on.
    stored = {j.id: j for j in await engine.list_jobs()}
    assert stored[nolog.id].message == nolog.message
    ok = await engine.submit({"command": ["sh", "-c", "echo fine"]})
    assert (await engine.wait(ok.id, timeout=10)).status is JobStatus.COMPLETED
    assert engine.log_path(ok.id).read_text() == "fine\n"


# -- back-pressure ------------------------------------------------------------------------------


async def test_active_job_limit_refuses_with_the_reason_and_stores_nothing(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(config=make_config(limits={"active_jobs": 3}))
    first = [await engine.submit({"command": ["sleep", "60"]}) for _ in range(2)]
    before = await engine.list_jobs()
    with pytest.raises(Overloaded, match=r"too many active jobs: 2 .* limit of 3 "):
        await engine.submit_many([{"command": ["true"]}] * 2)
    assert await engine.list_jobs() == before
    third = await engine.submit({"command": ["sleep", "60"]})
    with pytest.raises(Overloaded, match=r"\[limits\] active_jobs.*retry when jobs have ended"):
        await engine.submit({"command": ["true"]})
    # Paused, the waiting jobs neither start nor end: said (only "retry when jobs have
    # ended" was: tester h156).
    await engine.pause()
    with pytest.raises(Overloaded, match=r"nothing starts now \(the queue has been paused"):
        await engine.submit({"command": ["true"]})
    await engine.resume()
    for job in [*first, third]:
        await engine.cancel(job.id)
    for job in [*first, third]:
        assert (await engine.wait(job.id, timeout=10)).status is JobStatus.CANCELLED
    again = await engine.submit({"command": ["true"]})  # room again: accepted, and it runs
    assert (await engine.wait(again.id, timeout=10)).status is JobStatus.COMPLETED


def _flood(
    socket_path: Path, total: int, connections: int
) -> tuple[list[int], list[tuple[int, str]]]:
    """POST ``total`` submissions over ``connections`` keep-alive connections at once."""
    accepted: list[int] = []
    refused: list[tuple[int, str]] = []
    lock = threading.Lock()
    body = json.dumps({"command": ["true"], "depends_on": [1]}).encode()

    def worker(count: int) -> None:
        conn = UnixHTTPConnection(socket_path, timeout=120)
        try:
            for _ in range(count):
                status, data, raw = conn.call("POST", "/v1/jobs", body)
                with lock:
                    if status == 201:
                        accepted.append(int(data["job"]["id"]))
                    else:
                        error = data.get("error", "") if isinstance(data, dict) else raw
                        refused.append((status, str(error)))
        finally:
            conn.close()

    per = [total // connections + (i < total % connections) for i in range(connections)]
    threads = [threading.Thread(target=worker, args=(n,)) for n in per]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return accepted, refused


@pytest.mark.parametrize(
    ("limits", "refusals"),
    [
        ({}, False),
        ({"active_jobs": 1500, "submissions_in_flight": 3}, True),
    ],
    ids=["default-limits", "tight-limits"],
)
def test_a_flood_of_submissions_is_accepted_or_refused_never_dropped(
    served: Served, limits: dict[str, int], refusals: bool
) -> None:
    served.home.mkdir(parents=True)
    lines = [f"{key} = {value}" for key, value in limits.items()]
    (served.home / "config.toml").write_text("[limits]\n" + "\n".join(lines) + "\n")
    served.start("--simulate", "1xA100-80GB")
    paths = Paths(served.home, served.home / "config.toml")
    # Job 1 never runs (its only domain is drained), so the flood queues behind it.
    assert served.cli("domain", "drain", "gpu0").returncode == 0
    status, data = request(paths.socket, "POST", "/v1/jobs", {"command": ["true"], "gpus": 1})
    assert status == 201 and data["job"]["id"] == 1 and data["job"]["status"] == "queued"
    accepted, refused = _flood(paths.socket, 5000, connections=12)
    assert len(accepted) + len(refused) == 5000
    assert len(set(accepted)) == len(accepted)
    for status, message in refused:
        assert status == 429, (status, message)
        assert message.startswith("too many ") and "nothing was stored" in message
    if refusals:
        assert refused and len(accepted) <= 1500 - 1
    else:
        assert not refused
    # Every accepted submission is in the database, and nothing else is.
    counted = _db_rows(paths, "SELECT COUNT(*) FROM jobs WHERE id > 1")[0][0]
    assert counted == len(accepted)
    assert served.proc is not None and served.proc.poll() is None
    rss = psutil.Process(served.proc.pid).memory_info().rss
    assert rss < 400 * 2**20, f"engine RSS {rss / 2**20:.0f} MiB after the flood"
    assert served.cli("cancel", "1").returncode == 0  # the flood ends as dependency_failed
    queued = "/v1/jobs?status=queued,pending&limit=10"
    wait_for(lambda: not request(paths.socket, "GET", queued)[1]["jobs"], timeout=60)
    assert "Traceback" not in served.stop()


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """True once the engine closes ``sock`` (reads end), False if it is open at ``within``."""
    sock.settimeout(within)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False


def test_half_open_connections_are_closed_and_streams_are_not(served: Served) -> None:
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text("[limits]\nidle_connection = 0.5\n")
    served.start("--simulate", "1xA100-80GB")
    path = str(resolve_paths().socket)
    silent, half, stream = (socket.socket(socket.AF_UNIX) for _ in range(3))
    for sock in (silent, half, stream):
        sock.connect(path)
    half.sendall(b"GET /v1/health HTTP/1.1\r\nHost: engine\r\n")  # never finished
    stream.sendall(b"GET /v1/events HTTP/1.1\r\nHost: engine\r\n\r\n")
    assert _closed_by_server(silent, within=10)
    assert _closed_by_server(half, within=10)
    # A request being served (a stream) is not idle: it stays open past the limit and
    # still carries what happens.
    assert not _closed_by_server(stream, within=1.5), "the stream was cut"
    submitted = served.cli("submit", "--name", "after-the-limit", "--", "true")
    assert submitted.returncode == 0, submitted.stderr
    stream.settimeout(10)
    seen = b""
    while b"after-the-limit" not in seen:
        chunk = stream.recv(65536)
        assert chunk, "the stream ended"
        seen += chunk
    for sock in (silent, half, stream):
        sock.close()
    # A submission whose body stalls gets 408 and its slot back within the same limit.
    stalled = socket.socket(socket.AF_UNIX)
    stalled.connect(path)
    stalled.sendall(
        b"POST /v1/jobs HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    stalled.settimeout(10)
    answer = stalled.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"did not arrive within 0.5 s ([limits] idle_connection)" in answer
    stalled.close()


async def test_adoption_that_cannot_be_recorded_is_undone_and_the_pid_left_alone(
    make_engine: EngineFactory, sleeper: int
) -> None:
    engine = await make_engine()
    await _break_writes(engine, "read-only")
    with pytest.raises(StoreError, match="attempt to write a readonly database"):
        await adopt(engine, sleeper)
    assert psutil.pid_exists(sleeper)  # never signalled
    assert engine.executor.pids() == {}  # no longer watched
    assert not any(a.job.kind.value == "adopted" for a in engine.book)
    await _mend_writes(engine, "read-only")
    await eventually(lambda: engine.store.failure is None)
    (row,) = _db_rows(engine.paths, "SELECT kind, status, message FROM jobs")
    assert row[0] == "adopted" and row[1] == "cancelled"
    assert row[2].startswith("not recorded: database write failed: attempt to write")
    assert row[2].endswith("; pid left alone")
    # it can be adopted again once writes work
    again = await adopt(engine, sleeper)
    assert again.status is JobStatus.RUNNING


async def test_a_damaged_database_is_refused_at_start_and_left_as_it_was(
    make_engine: EngineFactory, paths: Paths
) -> None:
    engine = await make_engine()
    await engine.submit_many([{"command": ["true"], "name": "x" * 150} for _ in range(200)])
    await engine.stop()
    db = paths.state_dir / "gpulayer.db"
    with sqlite3.connect(db) as conn:  # (fold the WAL in, so the damage is in the file)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    _tear(db, page * 3, page)  # a page of the jobs table's tree
    damaged = db.read_bytes()
    with pytest.raises(StoreError, match=f"{db} is damaged .*Move it aside"):
        await make_engine()
    assert db.read_bytes() == damaged  # nothing was written, no id was given again


async def test_a_truncated_database_is_refused_with_the_same_advice(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Cut short (a copy interrupted, a full disk at a checkpoint), SQLite cannot even open
    # it: "database disk image is malformed", with no word on what to do.
    engine = await make_engine()
    await engine.submit_many([{"command": ["true"], "name": "x" * 150} for _ in range(200)])
    await engine.stop()
    db = paths.state_dir / "gpulayer.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.truncate(db, db.stat().st_size // 2)
    cut = db.read_bytes()
    with pytest.raises(StoreError, match=r"malformed\. Nothing was changed\. Move it aside"):
        await make_engine()
    assert db.read_bytes() == cut


async def test_an_emptied_database_beside_job_logs_is_refused(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Cut to nothing, SQLite took it for a new database: history gone, ids from 1 again.
    engine = await make_engine()
    job = await engine.submit({"command": ["true"]})
    await engine.wait(job.id, timeout=10)
    await engine.stop()
    db = paths.state_dir / "gpulayer.db"
    db.write_bytes(b"")
    for extra in ("-wal", "-shm"):
        db.with_name(db.name + extra).unlink(missing_ok=True)
    with pytest.raises(StoreError, match=r"is empty, but .* holds 1 job log\(s\)"):
        await make_engine()
    assert db.read_bytes() == b""


def _tear(path: Path, offset: int, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xa5" * size)


def test_idle_connection_reloaded_applies_to_new_connections(served: Served) -> None:
    # A reload said "applied", and half-open connections were closed after the start's
    # 30 s all the same.
    served.start("--simulate", "1xA100-80GB")
    from .raw_http import request

    (served.home / "config.toml").write_text("[limits]\nidle_connection = 0.5\n")
    status, answer = request(resolve_paths().socket, "POST", "/v1/config/reload")
    assert status == 200 and answer["applied"] is True, answer
    half = socket.socket(socket.AF_UNIX)
    half.connect(str(resolve_paths().socket))
    half.sendall(b"GET /v1/health HTTP/1.1\r\nHost: engine\r\n")  # never finished
    try:
        assert _closed_by_server(half, within=10)
    finally:
        half.close()


async def test_a_submission_refused_unread_is_sent_again_until_a_slot_frees(
    make_engine: EngineFactory,
) -> None:
    # Every [limits] submissions_in_flight slot held by a client that stalls in its body:
    # `submit` failed at once ("too many submissions at once ... retry shortly"), though
    # the engine read nothing of it and said when to try again (Retry-After).
    engine = await make_engine(config=make_config(limits={"submissions_in_flight": 1}))
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    stalled = socket.socket(socket.AF_UNIX)
    try:
        stalled.connect(str(engine.paths.socket))
        stalled.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        client = Client(engine.paths, timeout=20)
        told: list[str] = []
        client.on_busy = told.append  # (the CLI prints it: it said nothing for 30 s, h45)
        submitting = asyncio.create_task(asyncio.to_thread(client.submit, {"command": ["true"]}))
        tui = SocketBackend(engine.paths)  # (the TUI's submit, attached: the same)
        from_tui = asyncio.create_task(tui.submit({"command": ["true"]}))
        await eventually(lambda: server.submissions_refused >= 2, timeout=10)
        stalled.close()  # (its slot comes back)
        for job in (await asyncio.wait_for(submitting, 15), await asyncio.wait_for(from_tui, 15)):
            assert (await engine.wait(job["id"], timeout=10)).status is JobStatus.COMPLETED
        assert told == [
            "the engine is handling too many submissions at once (nothing of this one stored "
            "yet): trying again for up to 20 s (GPULAYER_TIMEOUT)"
        ]
        await tui.close()
        # Any other refusal is said at once, as before (here: no such job to wait on).
        with pytest.raises(ApiError) as refused:
            spec = {"command": ["true"], "depends_on": [999]}
            await asyncio.to_thread(Client(engine.paths).submit, spec)
        assert refused.value.status == 400
    finally:
        stalled.close()
        await server.stop()


async def test_a_start_whose_commit_waits_on_a_locked_database_gets_its_whole_timeout(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Someone's `sqlite3` session held the write lock as a slot freed: the next job was
    # decided (its start waiting for the commit), its timeout ran from the decision, and
    # it failed "timed out ... (stopped before it started)" without ever running (h119).
    engine = await make_engine(cpu_count=1)
    ran, gate = tmp_path / "ran", tmp_path / "gate"
    await engine.submit({"shell": f"while [ ! -e {gate} ]; do sleep 0.02; done"})
    later = await engine.submit({"shell": f"echo ran >> {ran}", "timeout": 1.0})
    assert later.status is JobStatus.QUEUED
    db = sqlite3.connect(engine.paths.database, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")  # (the write lock, as an open session holds it)
        gate.touch()  # (the first job ends: the next is decided, its commit waits)
        act = engine.book.get(later.id)
        assert act is not None
        await eventually(lambda: act.job.status is JobStatus.RUNNING, timeout=20)
        # The scenario's input, not a wait for a condition: the lock outlives the timeout.
        await asyncio.sleep(1.5)
        assert act.job.stop_reason is None and not ran.exists()
    finally:
        db.execute("ROLLBACK")
        db.close()
    done = await engine.wait(later.id, timeout=30)
    assert done.status is JobStatus.COMPLETED, done.message
    assert ran.read_text() == "ran\n"


async def test_nothing_is_started_while_the_database_cannot_be_written(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A queued job whose slot freed during the outage was decided then: it read
    # "running" with no process for as long, and its timeline said it started then, the
    # start being the commit that came once the disk had room (tester h158). It waits
    # now, saying why, and starts once writes work again.
    engine = await make_engine(cpu_count=1)
    go = tmp_path / "go"
    holder = await engine.submit({"shell": f"while [ ! -e {go} ]; do sleep 0.02; done"})
    waiter = await engine.submit({"command": ["true"]})
    assert holder.status is JobStatus.RUNNING and waiter.status is JobStatus.QUEUED
    await _break_writes(engine, "full")
    with pytest.raises(StoreError):  # (the first write that fails)
        await engine.submit(
            {"command": ["true"], "env": {f"BIG{i}": "x" * 50_000 for i in range(4)}}
        )
    assert engine.store.failure is not None
    go.touch()
    await eventually(lambda: holder.id not in engine.book)
    said = "nothing starts while the database cannot be written (database write failed: "
    live = await eventually(
        lambda: (act := engine.book.get(waiter.id)) and said in act.job.message and act
    )
    assert live.job.status is JobStatus.QUEUED and live.job.pid is None
    await _mend_writes(engine, "full")
    done = await engine.wait(waiter.id, timeout=20)
    assert done.status is JobStatus.COMPLETED, done.message


async def test_a_start_decided_in_the_batch_whose_write_fails_says_it_waits_to_be_stored(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Decided as the job before it ended, in the commit that failed (a full disk), it read
    # "running", its runtime counting, with no process; its timeline kept the decision
    # as its start (tester h174 #2).
    engine = await make_engine(cpu_count=1)
    go = tmp_path / "go"
    await engine.submit({"shell": f"while [ ! -e {go} ]; do sleep 0.02; done", "gpus": 0})
    second = await engine.submit({"command": ["sleep", "0.2"], "gpus": 0})
    assert second.status is JobStatus.QUEUED
    await _break_writes(engine, "read-only")
    go.touch()  # (its end and the next job's start: one commit, which fails)
    await eventually(lambda: engine.store.failure is not None)
    waiting = await engine.get(second.id)
    assert waiting.status is JobStatus.RUNNING and waiting.pid is None
    assert waiting.started_at is None  # (no runtime counting with no process: h180)
    assert waiting.message == (
        "placed on cpu; starts once its start is stored (database write failed: attempt to "
        "write a readonly database)"
    )
    await _mend_writes(engine, "read-only")
    done = await engine.wait(second.id, timeout=20)
    assert done.status is JobStatus.COMPLETED
    assert done.started_at is not None and done.pid is not None
    messages = [e["message"] for e in await engine.events_of(second.id)]
    assert "running on cpu" in messages


async def test_a_service_stopped_during_a_write_outage_says_its_sigterm_waits_to_be_stored(
    make_engine: EngineFactory,
) -> None:
    # Its replicas said "SIGTERM sent" while no signal had gone (tester h187, as a job's).
    from .test_services import _service

    engine = await make_engine(simulate=None, cpu_count=2)
    svc = await engine.submit(_service(["sleep", "600"], port=False))
    await eventually(lambda: all(r.pid for r in engine.book.get(svc.id).job.replicas))  # type: ignore[union-attr]
    (replica,) = engine.book.get(svc.id).job.replicas  # type: ignore[union-attr]
    pid = replica.pid
    assert pid is not None
    await _break_writes(engine, "read-only")
    with pytest.raises(StoreError):
        await engine.submit({"command": ["true"]})  # (the outage is noticed)
    with contextlib.suppress(StoreError):
        await engine.cancel(svc.id)
    act = engine.book.get(svc.id)
    assert act is not None and "SIGTERM once this is stored" in act.job.message, act.job.message
    assert replica.message == "SIGTERM once this is stored"
    os.kill(pid, 0)  # (not signalled yet)
    await _mend_writes(engine, "read-only")
    done = await engine.wait(svc.id, timeout=30)
    assert done.status is JobStatus.CANCELLED
