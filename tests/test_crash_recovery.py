"""Nothing lost (issue 7): kill -9 the engine with work of every kind in flight, let some of
it finish while no engine runs, restart, and check every job's final status and exit code.
The same through the TUI's quit-and-hand-over path, and a kill during heavy writes.

Everything is real: a ``--serve`` process killed with SIGKILL, job processes, a service on
real ports, an adopted process started by the test, the SQLite file on disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer_tui.engine.paths import Paths
from gpulayer_tui.screens.dialogs import QuitScreen
from gpulayer_tui.tui import start_background_engine

from .conftest import Served, pid_gone, wait_for
from .ui_support import until

RUNNING = 10
QUEUED = 20


@pytest.fixture
def strays() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the test starts outside any engine; killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _job(served: Served, job_id: int) -> dict[str, Any]:
    out = served.cli("status", str(job_id), "--json")
    assert out.stdout, out.stderr
    return dict(json.loads(out.stdout)["job"])


def _jobs(served: Served) -> dict[int, dict[str, Any]]:
    out = served.cli("jobs", "--limit", "1000", "--json")
    return {j["id"]: j for j in json.loads(out.stdout)}


def _kill_engine(served: Served) -> None:
    assert served.proc is not None
    served.proc.send_signal(signal.SIGKILL)
    served.proc.wait(timeout=10)


def _integrity(paths: Paths) -> str:
    with sqlite3.connect(paths.database) as db:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])


def test_kill_9_with_running_queued_service_and_adopted_work(
    served: Served, paths: Paths, tmp_path: Path, strays: list[subprocess.Popen[bytes]]
) -> None:
    paths.config_file.parent.mkdir(parents=True, exist_ok=True)
    # 10 batch slots + 2 for the service's replicas; the 20 others queue behind them
    paths.config_file.write_text("[cpu]\nslots = 12\n[engine]\ngrace_period = 2.0\n")
    served.start("--simulate", "2xA100-80GB")
    gates = tmp_path / "gates"
    gates.mkdir()

    service = served.cli(
        "submit", "--service", "--replicas", "2", "--shell", "--",
        "exec python3 -m http.server --bind 127.0.0.1 $PORT",
    )  # fmt: skip
    assert service.returncode == 0, service.stderr
    service_id = int(service.stdout)
    lines = [
        f"while [ ! -e {gates}/{i} ]; do sleep 0.05; done; exit {i}" for i in range(RUNNING)
    ] + [f"exit {i % 4}" for i in range(QUEUED)]
    out = served.cli("submit", "--file", "-", input="\n".join(lines) + "\n")
    assert out.returncode == 0, out.stderr
    ids = [int(x) for x in out.stdout.split()]
    gated, queued = ids[:RUNNING], ids[RUNNING:]
    adopted_proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    strays.append(adopted_proc)
    adopted = served.cli("adopt", "--pid", str(adopted_proc.pid), "--name", "notebook")
    assert adopted.returncode == 0, adopted.stderr
    adopted_id = int(adopted.stdout)

    def settled() -> bool:
        jobs = _jobs(served)
        replicas = jobs[service_id].get("replicas", [])
        return (
            all(jobs[i]["status"] == "running" for i in gated)
            and all(jobs[i]["status"] == "queued" for i in queued)
            and len(replicas) == 2
            and all(r["state"] == "up" for r in replicas)
        )

    wait_for(settled, timeout=30)
    before = _jobs(served)
    gated_pids = {i: before[i]["pid"] for i in gated}
    replica_pids = [r["pid"] for r in before[service_id]["replicas"]]

    _kill_engine(served)
    # while no engine runs: half the running jobs end, one replica dies
    for n in range(5):
        (gates / str(n)).touch()
    psutil.Process(replica_pids[1]).kill()  # the replica's command itself (no wrapper)
    wait_for(lambda: all(pid_gone(gated_pids[gated[n]]) for n in range(5)))
    wait_for(lambda: pid_gone(replica_pids[1]))

    served.start("--simulate", "2xA100-80GB")
    after = _jobs(served)
    for n, job_id in enumerate(gated[:5]):  # ended while down: real exit codes
        job = after[job_id]
        assert job["exit_code"] == n, job
        assert job["status"] == ("completed" if n == 0 else "failed"), job
    for job_id in gated[5:]:  # still running: re-attached to the same process
        assert after[job_id]["status"] == "running" and after[job_id]["pid"] == gated_pids[job_id]
    assert after[adopted_id]["status"] == "running"
    assert after[adopted_id]["pid"] == adopted_proc.pid  # re-verified by pid + start time
    svc = after[service_id]
    assert svc["status"] == "running" and svc["replicas"][0]["pid"] == replica_pids[0]
    assert svc["replicas"][1]["last_exit_code"] == 137
    # the dead replica is restarted after its back-off, counted as restart 1
    wait_for(lambda: _job(served, service_id)["replicas"][1]["state"] == "up", timeout=20)
    assert _job(served, service_id)["replicas"][1]["restarts"] == 1

    for n in range(5, RUNNING):
        (gates / str(n)).touch()
    final = served.cli("wait", str(queued[-1]), "--timeout", "60")
    assert final.returncode in (0, 1), final.stderr
    wait_for(lambda: all(_jobs(served)[i]["status"] in ("completed", "failed") for i in ids))
    done = _jobs(served)
    for n, job_id in enumerate(gated):
        assert done[job_id]["exit_code"] == n
    for n, job_id in enumerate(queued):
        assert done[job_id]["exit_code"] == n % 4
        assert done[job_id]["status"] == ("completed" if n % 4 == 0 else "failed")

    adopted_proc.kill()
    adopted_proc.wait()
    wait_for(lambda: _job(served, adopted_id)["status"] == "orphaned")
    assert served.cli("cancel", str(service_id)).returncode == 0
    ended = _job(served, service_id)
    assert ended["status"] == "cancelled"
    assert all(pid_gone(r["pid"]) for r in ended["replicas"])
    served.stop()
    assert _integrity(paths) == "ok"
    # The queued jobs kept their order: they started in submission order (the order of
    # their stored transitions to running, not their clock times).
    assert _start_order(paths, queued) == queued


def _start_order(paths: Paths, job_ids: list[int]) -> list[int]:
    with sqlite3.connect(paths.database) as db:
        rows = db.execute(
            "SELECT job_id FROM events WHERE kind = 'job.transition' AND status = 'running' "
            "ORDER BY id"
        ).fetchall()
    wanted = set(job_ids)
    return [job_id for (job_id,) in rows if job_id in wanted]


def test_kill_9_during_heavy_writes_keeps_a_consistent_database(
    served: Served, paths: Paths
) -> None:
    paths.config_file.parent.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text("[cpu]\nslots = 2\n")
    served.start("--simulate", "2xA100-80GB")
    accepted: list[int] = []
    stop = threading.Event()

    def submit_in_a_loop() -> None:
        while not stop.is_set():
            out = served.cli("submit", "--file", "-", input="true\n" * 200)
            if out.returncode != 0:
                return  # the engine is gone
            accepted.extend(int(x) for x in out.stdout.split())

    writer = threading.Thread(target=submit_in_a_loop)
    writer.start()
    wait_for(lambda: len(accepted) >= 600, timeout=60)
    _kill_engine(served)  # mid-stream: submissions and job ends are being written
    stop.set()
    writer.join(timeout=60)
    assert _integrity(paths) == "ok"

    served.start("--simulate", "2xA100-80GB")
    with sqlite3.connect(paths.database) as db:
        stored = {r[0] for r in db.execute("SELECT id FROM jobs")}
    # every acknowledged submission survived the kill, and every job ends completed
    assert set(accepted) <= stored
    assert served.cli("wait", str(max(stored)), "--timeout", "60").returncode == 0

    def all_completed() -> bool:
        with sqlite3.connect(paths.database) as db:
            return not db.execute("SELECT 1 FROM jobs WHERE status != 'completed'").fetchone()

    wait_for(all_completed, timeout=60)
    with sqlite3.connect(paths.database) as db:
        rows = db.execute("SELECT COUNT(*), SUM(status = 'completed') FROM jobs").fetchone()
        assert rows[0] == rows[1] and rows[0] >= len(accepted)
        ids = [r[0] for r in db.execute("SELECT id FROM jobs ORDER BY id")]
    assert ids == list(range(1, len(ids) + 1))  # no gaps, no duplicates
    served.stop()


async def test_tui_quit_handover_keeps_service_queue_and_running_jobs(
    embedded_app: Any, paths: Paths, served: Served, tmp_path: Path
) -> None:
    app = await embedded_app("2xA100-80GB", cpu_count=2)
    gate = tmp_path / "gate"
    async with app.run_test(size=(100, 30)) as pilot:
        service = await app.backend.submit(
            {"kind": "service", "command": ["sleep", "600"], "port": False, "name": "svc"}
        )
        running = await app.backend.submit(
            {"shell": f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 7", "name": "gated"}
        )
        queued = [
            await app.backend.submit({"shell": f"exit {n}", "name": f"q{n}"}) for n in range(3)
        ]
        await until(
            pilot,
            lambda: all(
                app.job_store.jobs.get(q["id"], {}).get("status") == "queued" for q in queued
            ),
        )
        replica_pid = app.job_store.jobs[service["id"]]["replicas"][0]["pid"]
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("k")  # keep everything: hand over to a background engine
        await until(pilot, lambda: not app.is_running)
    assert app.return_value == "handover"
    await app.backend.close()
    gate.touch()  # the running job ends between the two engines
    wait_for(lambda: pid_gone(running["pid"]))

    served.proc = await asyncio.to_thread(start_background_engine, paths, "2xA100-80GB", None)
    svc = _job(served, service["id"])
    assert svc["status"] == "running" and svc["replicas"][0]["pid"] == replica_pid
    assert svc["replicas"][0]["state"] == "up" and svc["replicas"][0]["restarts"] == 0
    ended = _job(served, running["id"])
    assert ended["status"] == "failed" and ended["exit_code"] == 7
    for n, job in enumerate(queued):
        assert served.cli("wait", str(job["id"]), "--timeout", "30").returncode == (
            0 if n == 0 else 1
        )
        assert _job(served, job["id"])["exit_code"] == n
    assert served.cli("cancel", str(service["id"])).returncode == 0
    wait_for(lambda: pid_gone(replica_pid))


def test_a_job_that_ends_while_no_engine_runs_keeps_its_real_end_time(served: Served) -> None:
    # ended_at used to be when the next engine noticed the end (issue 14).
    served.start("--simulate", "1xA100-80GB")
    job_id = served.cli("submit", "--", "sleep", "1").stdout.strip()
    pid = wait_for(lambda: json.loads(served.cli("status", job_id, "--json").stdout)["job"]["pid"])
    assert served.proc is not None
    served.proc.kill()
    served.proc.wait()
    # It ended while no engine ran. Reaped, not only a zombie: the launcher stamps the end
    # when it sees it, just before it reaps (a zombie alone may not be seen yet).
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=10)
    seen_gone = time.time()
    served.start("--simulate", "1xA100-80GB")
    job = json.loads(served.cli("wait", job_id, "--json").stdout)["job"]
    assert job["status"] == "completed"
    assert job["ended_at"] <= seen_gone  # the launcher's time, not the new engine's
    assert 0.9 <= job["ended_at"] - job["started_at"] < 2.0


def test_a_young_jobs_gpu_time_before_a_kill_9_is_booked_unobserved(
    served: Served, paths: Paths
) -> None:
    # Killed before the job's first usage save (60 s), the engine lost what it had seen:
    # the next one counted the job's GPU time from its own start ("2 points over 4 s" of
    # a job 40 s old), the time before not even counted as unobserved.
    from gpulayer_tui.client import Client

    paths.config_file.parent.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text("[engine]\nsample_interval = 0.1\n")
    served.start("--simulate", "1xA100-80GB")
    job_id = int(served.cli("submit", "--gpus", "1", "--", "sleep", "120").stdout)
    client = Client(paths)
    started = _job(served, job_id)["started_at"]
    assert started is not None
    wait_for(lambda: (client.usage(job_id)["summary"] or {}).get("samples", 0) >= 3)
    wait_for(lambda: time.time() > started + 2.0, timeout=10)
    _kill_engine(served)
    served.start("--simulate", "1xA100-80GB")
    wait_for(lambda: (client.usage(job_id)["summary"] or {}).get("samples", 0) >= 2)
    usage = client.usage(job_id)
    seen_again = usage["series"][0]["t0"]
    totals = usage["totals"]
    assert totals["first_at"] == pytest.approx(started, abs=0.01)
    assert totals["unobserved_seconds"] == pytest.approx(seen_again - started, abs=0.3)
    summary = usage["summary"]
    assert summary is not None
    last = totals["last_at"]
    assert summary["gpu_hours"] * 3600 == pytest.approx(last - started, abs=0.5)
    # The plot says what it lacks (it covered the last seconds alone: tester h168).
    plot = served.cli("status", str(job_id), "--plot").stdout
    said = (
        r"GPU #0  \(\d+ points?( over \d+s)?; no readings kept for \ds \(no engine ran, or "
        r"one was killed before it saved them\)\)"
    )
    assert re.search(said, plot), plot
    assert served.cli("cancel", str(job_id)).returncode == 0


def test_a_database_copied_to_another_state_dir_leaves_the_others_jobs_alone(
    served: Served, tmp_path: Path
) -> None:
    # Restoring a backup (or copying the database to a new disk) started its running jobs
    # a second time, and took a running service's replica for its own: a cancel there
    # killed the original dir's process (tester h66).
    from .conftest import kill_jobs_of

    served.start("--simulate", "1xA100-80GB")
    running = json.loads(served.cli("submit", "--json", "--", "sleep", "600").stdout)
    service = json.loads(
        served.cli("submit", "--json", "--service", "--no-port", "--", "sleep", "600").stdout
    )
    blocker = json.loads(served.cli("submit", "--json", "--gpus", "1", "--", "sleep", "600").stdout)
    waiting = json.loads(served.cli("submit", "--json", "--gpus", "1", "--", "true").stdout)

    def replica_pid() -> Any:
        shown = json.loads(served.cli("status", str(service["id"]), "--json").stdout)["job"]
        return (shown.get("replicas") or [{}])[0].get("pid")

    wait_for(replica_pid)
    replica = replica_pid()
    copy = Served(tmp_path / "copy")
    copy.home.mkdir(mode=0o700)
    with (
        sqlite3.connect(served.home / "gpulayer.db") as source,
        sqlite3.connect(copy.home / "gpulayer.db") as target,
    ):
        source.backup(target)
    try:
        copy.start("--simulate", "1xA100-80GB")
        for job in (running, service, blocker):
            seen = json.loads(copy.cli("status", str(job["id"]), "--json").stdout)["job"]
            assert (seen["status"], seen["termination_reason"]) == ("failed", "engine_lost")
            assert seen["message"].startswith("this database was copied from another state dir")
        # The waiting job runs here (its GPU is free here: nothing runs on it).
        assert copy.cli("wait", str(waiting["id"])).returncode == 0
        # Nothing of the original's was started again or signalled.
        mine = [
            p.pid
            for p in psutil.process_iter()
            if p.pid != os.getpid()
            and _environ(p).get("GPULAYER_TASK", "").startswith(f"{copy.home}/")
        ]
        assert mine == []
        assert not pid_gone(running["pid"]) and not pid_gone(replica)
        assert (
            json.loads(served.cli("status", str(service["id"]), "--json").stdout)["job"]["status"]
            == "running"
        )
    finally:
        copy.stop()
        kill_jobs_of(copy.home)


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


def test_a_folder_moved_while_its_jobs_run_says_which_launcher_holds_it(
    served: Served, tmp_path: Path
) -> None:
    # The next engine said only "the launcher did not answer on .../launch.sock in 15 s"
    # (tester h66): the keeper holding the moved folder's lock serves its old path.
    from gpulayer_tui.engine.launch_client import launcher_elsewhere

    served.start("--simulate", "1xA100-80GB")
    job = json.loads(served.cli("submit", "--json", "--", "sleep", "600").stdout)
    assert job["pid"]
    served.stop()
    moved = tmp_path / "moved"
    os.rename(served.home, moved)
    try:
        said = launcher_elsewhere(moved)
        assert said.startswith(": the launcher holding this folder's jobs (keeper pid ")
        assert f"was started for {served.home}, the path this folder had before" in said
        assert launcher_elsewhere(tmp_path) == ""  # (no launcher there at all)
    finally:
        os.rename(moved, served.home)  # (the fixture's teardown ends what runs there)
