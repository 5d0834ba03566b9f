"""Domain health and isolation (record 002): quarantine, drain, release, readiness."""

from __future__ import annotations

import json
import logging
import os
import pwd
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from gpulayer_tui.cli.format import format_gpus
from gpulayer_tui.engine import launcher
from gpulayer_tui.engine.errors import DomainRefused
from gpulayer_tui.engine.gpus import GIB
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.nvml import NvmlProbe
from gpulayer_tui.engine.spec import SpecError
from gpulayer_tui.engine.store import MIGRATIONS, SCHEMA_VERSION
from gpulayer_tui.formatting import event_label, event_words

from .conftest import EngineFactory, Served, eventually, make_config, pid_gone, wait_for

if TYPE_CHECKING:
    from .fake_nvml import FakeNvml


async def _status(engine: object, job_id: int) -> JobStatus:
    return (await engine.get(job_id)).status  # type: ignore[attr-defined]


async def test_a_jobs_quarantine_warning_goes_when_its_drain_comes_back(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Drained, then quarantined, then released back to its drain: the warning stayed
    # (only a release to service cleared it).
    engine = await make_engine(probe=NvmlProbe())
    job = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    await engine.domain_ops.drain("gpu1", "fan")
    fake_nvml.devices[1].lost = True
    await engine.sampler.sample_once()
    assert "warning: domain gpu1 quarantined" in (await engine.get(job.id)).message
    fake_nvml.devices[1].lost = False
    await engine.sampler.sample_once()
    released = await engine.domain_ops.release("gpu1")
    assert released["state"] == "draining"
    assert (await engine.get(job.id)).message == "running on gpu1"
    await engine.cancel(job.id)


async def test_lost_gpu_quarantines_only_its_domain(
    make_engine: EngineFactory, fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await make_engine(probe=NvmlProbe())
    on_gpu0 = await engine.submit({"command": ["sleep", "600"], "domain": "gpu0"})
    on_gpu1 = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    waiting = await engine.submit({"command": ["true"], "domain": "gpu1"})
    assert waiting.status is JobStatus.QUEUED
    gpu0 = engine.scheduler.domains["gpu0"]
    before = (gpu0.slots, dict(gpu0.holdings), gpu0.account, gpu0.state)

    fake_nvml.devices[1].lost = True
    await engine.sampler.sample_once()
    gpu1 = engine.scheduler.domains["gpu1"]
    assert gpu1.state.value == "quarantined" and "GPU is lost" in gpu1.state_reason
    # the other domain is untouched: slots, holdings, accounting, state
    assert (gpu0.slots, dict(gpu0.holdings), gpu0.account, gpu0.state) == before
    # running work on the lost GPU is left alone, with a warning
    live = await engine.get(on_gpu1.id)
    assert live.status is JobStatus.RUNNING
    assert "warning: domain gpu1 quarantined: GPU is lost" in live.message
    # a queued job that can only run there says why
    await eventually(
        lambda: engine.book.get(waiting.id).job.message.startswith(
            "waiting for domain gpu1 quarantined"
        )
    )
    # pinned submissions are refused at once, unpinned work goes elsewhere
    with pytest.raises(SpecError, match="domain gpu1 is quarantined: GPU is lost"):
        await engine.submit({"command": ["true"], "domain": "gpu1"})
    await engine.cancel(on_gpu0.id)
    elsewhere = await engine.submit({"command": ["true"], "gpus": 1})
    done = await engine.wait(elsewhere.id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.domains == ["gpu0"]
    ready, reason = engine.domain_ops.readiness()
    assert not ready and reason.startswith("domain gpu1 quarantined: GPU is lost")
    # release is refused while the GPU still fails ...
    with pytest.raises(DomainRefused, match="its GPU still fails"):
        await engine.domain_ops.release("gpu1")
    # ... and works once it answers again; the event is recorded
    fake_nvml.devices[1].lost = False
    with caplog.at_level(logging.INFO, logger="gpulayer_tui.engine.health"):
        await engine.sampler.sample_once()
    assert gpu1.state.value == "quarantined"  # never lifted automatically
    # (logged "health healthy (GPU is lost)": the cause is the quarantine's: h185 #6)
    healthy = [m for m in caplog.messages if m.startswith("domain gpu1, healthy:")]
    assert len(healthy) == 1, caplog.messages
    assert healthy[0].startswith(
        "domain gpu1, healthy: state quarantined, health healthy (quarantined for: GPU is lost"
    ) and healthy[0].endswith("; `domain release` lifts it)"), healthy
    released = await engine.domain_ops.release("gpu1")
    assert released["state"] == "in_service"
    assert engine.domain_ops.readiness() == (True, "every domain is ready")
    # the running job's warning is past (it stayed for good)
    assert (await engine.get(on_gpu1.id)).message == "running on gpu1"
    await engine.cancel(on_gpu1.id)
    assert (await engine.wait(waiting.id, timeout=10)).status is JobStatus.COMPLETED
    events = [
        json.loads(r[0])
        for r in sqlite3.connect(engine.paths.database).execute(
            "SELECT data FROM events WHERE kind = 'domain.state' ORDER BY id"
        )
    ]
    # the GPU answering again is recorded too (health), but only the release lifts it
    assert [e["change"] for e in events] == ["quarantined", "healthy", "released"]
    # and a healthy, released GPU is not explained by its old error any more
    assert events[-1]["reason"] == "" and gpu1.reason == ""


async def test_repeated_failed_reads_degrade_then_quarantine(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Only the ticks below: the background sampler waits an hour (its own ticks between
    # them would make the exact failure counts race).
    config = make_config(
        health={"degrade_after": 2, "quarantine_after": 4}, engine={"sample_interval": 3600}
    )
    engine = await make_engine(probe=NvmlProbe(), config=config)
    gpu0, gpu1 = engine.scheduler.domains["gpu0"], engine.scheduler.domains["gpu1"]
    fake_nvml.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, index=1)
    await engine.sampler.sample_once()
    assert gpu1.health.value == "healthy" and gpu1.failures == 1
    await engine.sampler.sample_once()
    assert gpu1.health.value == "degraded" and gpu1.state.value == "in_service"
    await engine.sampler.sample_once()
    await engine.sampler.sample_once()
    assert gpu1.state.value == "quarantined"
    assert gpu1.state_reason.startswith("4 failed reads in a row: cannot read memory")
    assert gpu0.health.value == "healthy" and gpu0.failures == 0
    view = {d["name"]: d for d in engine.gpus()["domains"]}
    assert view["gpu1"]["state"] == "quarantined" and view["gpu1"]["health"] == "degraded"
    assert view["gpu0"]["state"] == "in_service"
    # `gpus` says it in one pair of brackets ("(NVML_ERROR_UNKNOWN) (last 4 reads
    # failed)" read as two notes: tester h102).
    shown = format_gpus(dict(engine.gpus()))
    row = next(line for line in shown.splitlines() if line.startswith("gpu1"))
    said = "quarantined (cannot read memory (Unknown Error); last 4 reads failed)"
    assert row.rstrip().endswith(said), row


async def test_drain_and_release(make_engine: EngineFactory) -> None:
    engine = await make_engine("2xA100-80GB")
    running = await engine.submit({"command": ["sleep", "600"], "domain": "gpu0"})
    drained = await engine.domain_ops.drain("gpu0", "driver update at noon")
    assert drained["state"] == "draining"
    assert (await engine.get(running.id)).status is JobStatus.RUNNING  # left alone
    pinned = await engine.submit({"command": ["true"], "domain": "gpu0"})
    assert pinned.status is JobStatus.QUEUED
    assert pinned.message == "waiting for domain gpu0 draining: driver update at noon"
    free = await engine.submit({"command": ["true"], "gpus": 1})
    assert (await engine.wait(free.id, timeout=10)).domains == ["gpu1"]
    assert engine.domain_ops.readiness()[0] is False
    with pytest.raises(DomainRefused, match="already draining"):
        await engine.domain_ops.drain("gpu0")
    with pytest.raises(DomainRefused, match="already draining"):
        await engine.domain_ops.drain("gpu0", "driver update at noon")  # (the same)
    # A new reason is taken in place (a release between let queued work start there).
    said = await engine.domain_ops.drain("gpu0", "driver update at two")
    assert said["state"] == "draining" and said["state_reason"] == "driver update at two"
    await eventually(
        lambda: (
            engine.book.get(pinned.id).job.message  # type: ignore[union-attr]
            == "waiting for domain gpu0 draining: driver update at two"
        )
    )
    assert engine.book.get(pinned.id).job.status is JobStatus.QUEUED  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="unknown domain 'gpu7'"):
        await engine.domain_ops.drain("gpu7")
    await engine.cancel(running.id)
    await engine.domain_ops.release("gpu0")
    assert (await engine.wait(pinned.id, timeout=10)).status is JobStatus.COMPLETED
    with pytest.raises(DomainRefused, match="in service already"):
        await engine.domain_ops.release("gpu0")


async def test_an_operators_drain_outlives_a_quarantine_on_top_of_it_and_a_restart(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # The quarantine's release put the domain back in service: the drain (an RMA, say)
    # and its reason were lost, and new work went to the GPU.
    engine = await make_engine(probe=NvmlProbe())
    await engine.domain_ops.drain("gpu0", "RMA scheduled")
    fake_nvml.devices[0].lost = True
    await engine.sampler.sample_once()
    gpu0 = engine.scheduler.domains["gpu0"]
    assert gpu0.state.value == "quarantined"
    shown = gpu0.to_json()
    assert shown["drain_reason"] == "RMA scheduled"
    with pytest.raises(DomainRefused, match="already draining under its quarantine \\(reason"):
        await engine.domain_ops.drain("gpu0")
    await engine.stop()

    again = await make_engine(probe=NvmlProbe())
    gpu0 = again.scheduler.domains["gpu0"]
    assert (gpu0.state.value, gpu0.drain_reason) == ("quarantined", "RMA scheduled")
    fake_nvml.devices[0].lost = False
    await again.sampler.sample_once()
    released = await again.domain_ops.release("gpu0")  # lifts the quarantine only
    assert (released["state"], released["state_reason"]) == ("draining", "RMA scheduled")
    pinned = await again.submit({"command": ["true"], "domain": "gpu0"})
    assert pinned.message == "waiting for domain gpu0 draining: RMA scheduled"
    assert (await again.domain_ops.release("gpu0"))["state"] == "in_service"
    assert (await again.wait(pinned.id, timeout=10)).status is JobStatus.COMPLETED
    # A quarantine with no drain under it is released straight to service.
    fake_nvml.devices[1].lost = True
    await again.sampler.sample_once()
    fake_nvml.devices[1].lost = False
    await again.sampler.sample_once()
    assert (await again.domain_ops.release("gpu1"))["state"] == "in_service"


async def test_domain_state_survives_restart_and_v1_database_is_migrated(
    make_engine: EngineFactory, paths: Any
) -> None:
    # a version-1 database, as the first release wrote it, with one finished job in it
    paths.state_dir.mkdir(parents=True, mode=0o700)
    with sqlite3.connect(paths.database) as db:
        for statement in MIGRATIONS[0]:
            db.execute(statement)
        db.execute(
            "INSERT INTO jobs (id, name, kind, status, termination_reason, exit_code, message, "
            "created_at, started_at, ended_at, spec) VALUES (1, 'true', 'command', "
            "'completed', 'exit_code', 0, 'exited with code 0', 1.0, 2.0, 3.0, "
            '\'{"command": ["true"]}\')'
        )
        db.execute("PRAGMA user_version = 1")
    second = await make_engine("2xA100-80GB")
    old = await second.get(1)
    assert old.status is JobStatus.COMPLETED and old.exit_code == 0  # history kept
    assert old.replicas == [] and old.attempt == 0
    await second.domain_ops.drain("gpu1", "maintenance")
    await second.stop()
    with sqlite3.connect(paths.database) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    third = await make_engine("2xA100-80GB")
    gpu1 = third.scheduler.domains["gpu1"]
    assert gpu1.state.value == "draining" and gpu1.state_reason == "maintenance"
    assert (await third.submit({"command": ["true"]})).id == 2  # ids go on after history


def test_cli_domain_commands_and_ready(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    listed = served.cli("domain", "list")
    assert listed.returncode == 0 and "gpu1" in listed.stdout and "in_service" in listed.stdout
    drained = served.cli("domain", "drain", "gpu1", "--reason", "swap fan")
    assert drained.stdout.strip() == "domain gpu1: draining (reason: swap fan)", drained
    # (in the engine's log without -v: a headless engine's journal had none: h125)
    said = "domain gpu1, draining: state draining, health healthy (swap fan)"
    wait_for(lambda: said in served.log.read_text(), timeout=10)
    domains = json.loads(served.cli("domain", "list", "--json").stdout)
    assert {d["name"]: d["state"] for d in domains}["gpu1"] == "draining"
    again = served.cli("domain", "drain", "gpu1")
    assert again.returncode == 1
    assert (
        "gpu1 is already draining (reason: swap fan); give another reason to change it, or "
        "an empty one for the default" in again.stderr
    )  # (it said how to do neither: h45)
    # A new reason is said with the one it replaced: it said "domain gpu1: draining",
    # the same words as a first drain.
    changed = served.cli("domain", "drain", "gpu1", "--reason", "RMA")
    assert changed.stdout.strip() == "domain gpu1: draining (reason changed: swap fan -> RMA)"
    # A reason that shows nothing is refused, as such a name is (taken, it was shown as
    # no reason at all: tester h166); the drain stays as it was.
    for blank in ("\u0301\u0301", "\u200d", "\u3164"):
        refused = served.cli("domain", "drain", "gpu1", "--reason", blank)
        assert refused.returncode == 2, refused
        assert "reason: needs a visible character" in refused.stderr, refused.stderr
    kept = json.loads(served.cli("domain", "list", "--json").stdout)
    assert {d["name"]: d["drain_reason"] for d in kept}["gpu1"] == "RMA"
    cleared = json.loads(served.cli("domain", "drain", "gpu1", "--reason", "", "--json").stdout)
    assert cleared["drain_reason"] == "drained by the operator"
    assert cleared["previous_drain_reason"] == "RMA"
    unknown = served.cli("domain", "release", "gpu9")
    assert unknown.returncode == 2 and "unknown domain 'gpu9'" in unknown.stderr
    missing = served.cli("domain", "drain")
    assert missing.returncode == 2 and "needs the domain's name" in missing.stderr
    assert served.cli("domain", "release", "gpu1").returncode == 0
    # What still runs there is said, and when it leaves: a service kept a drained GPU
    # while none of its replicas exited, and nothing said so (tester h93).
    batch = served.cli("submit", "--gpus", "1", "--", "sleep", "600").stdout.strip()
    service = served.cli(
        "submit", "--service", "--no-port", "--gpus", "1", "--", "sleep", "600"
    ).stdout.strip()
    wait_for(lambda: all(_status(served, j) == "running" for j in (batch, service)))
    on = {
        j: json.loads(served.cli("status", j, "--json").stdout)["job"]["domains"][0]
        for j in (batch, service)
    }
    out = served.cli("domain", "drain", on[batch]).stdout.splitlines()
    assert out == [
        f"domain {on[batch]}: draining (reason: drained by the operator)",
        f"  job {batch} runs there until it ends",
    ]
    out = served.cli("domain", "drain", on[service]).stdout.splitlines()
    assert out[1].startswith(f"  service {service} moves off it when a replica there exits"), out
    served.cli("cancel", batch, service)


def test_what_a_drain_says_of_services_is_what_they_will_do() -> None:
    # "moves off it ... to where it fits" was said of a service no free GPU could take
    # (it never left) and of a CPU service, which has no elsewhere (tester h98).
    from gpulayer_tui.formatting import placement_words, still_on_domain

    gpu = {"id": 7, "kind": "service", "status": "running", "domains": ["gpu0", "gpu1"]}
    cpu = {"id": 8, "kind": "service", "status": "running", "domains": ["cpu"], "spec": {}}
    batch = {"id": 9, "kind": "command", "status": "running", "domains": ["cpu"]}
    assert still_on_domain([gpu], "gpu0") == [
        "service 7 moves off it when a replica there exits, with the whole service, if it "
        "fits elsewhere then; else that replica starts again in place (cancel to stop now)"
    ]
    assert still_on_domain([cpu, batch], "cpu") == [
        "job 9 runs there until it ends",
        "service 8 is pinned to the cpu pool, the only one: a replica that exits starts "
        "again in place (cancel to stop it)",
    ]
    # A service's placements: a waiting one names the one it waits for, as its timeline
    # ("placing again ... (placement 2 of 10)") under a header that said "1 of 10".
    placed = {"status": "running", "attempt": 1, "spec": {"retry": {"max_attempts": 3}}}
    assert placement_words(placed) == "placement 1 of 3"
    assert placement_words({**placed, "status": "queued"}) == "waits for placement 2 of 3"
    assert placement_words({"status": "pending", "spec": {}}) == "waits for placement 1 of 10"


def _status(served: Served, job: str) -> str:
    return str(json.loads(served.cli("status", job, "--json").stdout)["job"]["status"])


def _scrape(served: Served, path: str = "/metrics") -> tuple[int, str]:
    import socket as socketlib

    with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as sock:
        sock.connect(str(served.home / "engine.sock"))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def test_metrics_ready_and_doctor_follow_each_step(served: Served) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    served.start("--simulate", "2xA100-80GB")
    submitted = served.cli("submit", "--", "true")
    assert submitted.returncode == 0, submitted.stderr
    assert served.cli("wait", submitted.stdout.strip()).returncode == 0

    def families() -> dict[str, list[tuple[dict[str, str], float]]]:
        status, text = _scrape(served)
        assert status == 200
        return {
            f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)
        }

    metrics = families()
    jobs = {labels["status"]: value for labels, value in metrics["gpulayer_jobs"]}
    assert jobs["completed"] == 1.0 and jobs.get("running", 0.0) == 0.0, jobs
    assert ({"domain": "gpu1", "kind": "total"}, 1.0) in metrics["gpulayer_domain_slots"]
    assert ({"domain": "gpu0", "kind": "total"}, float(80 * 1024**3)) in metrics[
        "gpulayer_domain_vram_bytes"
    ]
    # The parts add up to the total (memory declared beyond use had no kind: tester h45).
    gpu0 = {
        labels["kind"]: value
        for labels, value in metrics["gpulayer_domain_vram_bytes"]
        if labels["domain"] == "gpu0"
    }
    parts = ("owned", "reserved", "unregistered", "unattributed", "free")
    assert sum(gpu0[k] for k in parts) == gpu0["total"], gpu0
    assert metrics["gpulayer_ready"] == [({}, 1.0)]
    assert ({"domain": "gpu1", "state": "in_service"}, 1.0) in metrics["gpulayer_domain_state"]
    assert metrics["gpulayer_probe_reads"][0][1] >= 1
    assert _scrape(served, "/v1/ready")[0] == 200

    doctor = served.cli("doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout
    assert {c["check"] for c in json.loads(doctor.stdout)} >= {
        "config",
        "state dir",
        "disk space",
        "engine",
        "driver",
        "domain gpu0",
        "queued jobs",
        "clock",
    }

    served.cli("domain", "drain", "gpu1", "--reason", "maintenance")
    status, body = _scrape(served, "/v1/ready")
    assert status == 503 and "domain gpu1 draining: maintenance" in body
    metrics = families()
    assert metrics["gpulayer_ready"] == [({}, 0.0)]
    assert ({"domain": "gpu1", "state": "draining"}, 1.0) in metrics["gpulayer_domain_state"]
    # a queued job that only the drained domain could take: doctor says so
    served.cli("submit", "--domain", "gpu1", "--", "true")
    doctor = served.cli("doctor")
    assert doctor.returncode == 1
    assert "can only run on domains out of service" in doctor.stdout
    assert "draining: maintenance" in doctor.stdout


async def test_a_disk_below_the_floor_is_not_ready_and_is_in_the_metrics(
    make_engine: EngineFactory,
) -> None:
    # No job could start, and /ready said ready; /metrics had no disk series (h63).
    from prometheus_client.parser import text_string_to_metric_families

    from gpulayer_tui.engine.metrics import render

    engine = await make_engine(config=make_config(logs={"min_free_mb": 999_999_999}))
    held = await engine.submit({"command": ["true"], "gpus": 0})
    assert held.message.startswith("waiting for disk space: ")
    ready, reason = engine.domain_ops.readiness()
    assert not ready and reason.startswith("new jobs are held: waiting for disk space: ")
    samples = {
        f.name: f.samples[0].value
        for f in text_string_to_metric_families((await render(engine)).decode())
        if f.name.startswith(("gpulayer_state_dir", "gpulayer_ready"))
    }
    assert samples["gpulayer_ready"] == 0.0
    assert 0 < samples["gpulayer_state_dir_free_bytes"] < samples["gpulayer_state_dir_floor_bytes"]
    await engine.cancel(held.id)


async def test_a_paused_queue_is_in_the_metrics(make_engine: EngineFactory) -> None:
    # A paused queue showed nowhere a monitor looks (tester h153).
    from prometheus_client.parser import text_string_to_metric_families

    from gpulayer_tui.engine.metrics import render

    engine = await make_engine()

    async def paused() -> dict[str, float]:
        return {
            f.name: f.samples[0].value
            for f in text_string_to_metric_families((await render(engine)).decode())
            if f.name.startswith("gpulayer_queue_paused")
        }

    assert await paused() == {"gpulayer_queue_paused": 0.0}
    await engine.pause()
    assert engine.paused_at is not None
    assert await paused() == {
        "gpulayer_queue_paused": 1.0,
        "gpulayer_queue_paused_since_seconds": engine.paused_at,
    }
    await engine.resume()
    assert await paused() == {"gpulayer_queue_paused": 0.0}


def test_doctor_checks_the_config_file_it_is_given_not_only_the_engines(
    served: Served,
) -> None:
    # `--config other.toml doctor` said "config ok <the engine's file> is valid and
    # applied": someone checking a new file before installing it got a false OK (h145).
    served.start("--simulate", "1xA100-80GB")
    other = served.home.parent / "other.toml"
    other.write_text("[history]\nkeep_jobs = -1\n")
    out = served.cli("--config", str(other), "doctor", "--json")
    assert out.returncode == 1, out
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert checks["config"]["status"] == "fail"
    assert "history.keep_jobs" in checks["config"]["detail"], checks["config"]
    engine = checks["engine config"]
    assert engine["status"] == "ok" and str(served.home / "config.toml") in engine["detail"]
    other.write_text("[history]\nkeep_jobs = 5\n")
    out = served.cli("--config", str(other), "doctor")
    assert out.returncode == 0, out
    line = next(x for x in out.stdout.splitlines() if x.startswith("config "))
    assert f"{other} is valid (not the engine's config: it reads " in line
    # Its domains are bound to the GPUs the engine sees (no driver here: it was called
    # valid, "checked when the engine starts", and the engine then rejected it: h164).
    other.write_text("[domains.train]\ngpu = 5\n")
    out = served.cli("--config", str(other), "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert out.returncode == 1 and checks["config"]["status"] == "fail", out
    assert "domains.train: gpu 5 does not exist" in checks["config"]["detail"], checks
    other.write_text("[domains.train]\ngpu = 0\n")
    out = served.cli("--config", str(other), "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert checks["config"]["status"] == "ok", checks
    assert checks["config"]["detail"].startswith(
        f"{other} is valid (for the GPUs the engine sees) (not the engine's config"
    )
    # The engine's own file named: one check, the engine's, as without --config.
    (served.home / "config.toml").write_text("")
    out = served.cli("--config", str(served.home / "config.toml"), "doctor", "--json")
    names = [c["check"] for c in json.loads(out.stdout)]
    assert names.count("config") == 1 and "engine config" not in names


def test_doctor_without_an_engine(served: Served) -> None:
    served.home.mkdir(parents=True)
    (served.home / "config.toml").write_text("[domains.a]\ngpu = 0\nslots = 0\n")
    out = served.cli("doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert out.returncode == 1
    assert checks["config"]["status"] == "fail" and "domains.a.slots" in checks["config"]["detail"]
    assert checks["engine"]["status"] == "warn"
    assert checks["driver"]["status"] == "warn" and "No NVIDIA driver" in checks["driver"]["detail"]
    # (no engine runs: it said "running with 0 GPUs")
    assert "an engine started here runs with 0 GPUs" in checks["driver"]["detail"]
    assert "or on simulated ones with --simulate" in checks["driver"]["detail"]
    assert "running with" not in checks["driver"]["detail"]
    assert "ui" not in checks
    # A theme the TUI does not know is a warning (the config was "valid": tester h131).
    (served.home / "config.toml").write_text('[ui]\ntheme = "nope"\n')
    checks = {c["check"]: c for c in json.loads(served.cli("doctor", "--json").stdout)}
    assert checks["ui"]["status"] == "warn" and "theme 'nope' is no theme" in checks["ui"]["detail"]
    (served.home / "config.toml").write_text('[ui]\ntheme = "nord"\n')  # (Textual's own)
    assert "ui" not in {c["check"] for c in json.loads(served.cli("doctor", "--json").stdout)}
    # A state dir the engine refuses fails as the engine says it (a warning, exit 0: h153)
    served.home.chmod(0o777)
    out = served.cli("doctor", "--json")
    state = {c["check"]: c for c in json.loads(out.stdout)}["state dir"]
    assert out.returncode == 1 and state["status"] == "fail", state
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert state["detail"] == (
        f"{served.home} is writable by others (mode 0777); the engine needs it writable by "
        f"{me} alone: chmod 700 {served.home} (an engine refuses to start on it)"
    )
    served.home.chmod(0o755)  # (an engine starts on it: a warning)
    state = {c["check"]: c for c in json.loads(served.cli("doctor", "--json").stdout)}["state dir"]
    assert state["status"] == "warn", state


def test_doctor_without_an_engine_opens_the_database_and_reads_a_failed_launcher(
    served: Served,
) -> None:
    # A damaged database stopped the next engine at start, and doctor said all was well.
    served.start("--simulate", "1xA100-80GB")
    served.cli("submit", "--", "true")
    served.stop()
    out = served.cli("doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert checks["database"]["status"] == "ok", checks["database"]
    assert "reads whole (schema" in checks["database"]["detail"]
    assert "launcher" not in checks
    db = served.home / "gpulayer.db"
    with open(db, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\xff" * 8192)  # (past the header: pages of the tables)
    (served.home / launcher.FAILED_NOTE).write_text(
        "the launcher cannot start: [Errno 13] Permission denied: 'launcher.journal'\n"
    )
    out = served.cli("doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert out.returncode == 1
    assert checks["database"]["status"] == "fail", checks["database"]
    assert "Move it aside" in checks["database"]["detail"]
    # (SQLite's report has lines of its own: said on one, not as "\x0a": tester h174)
    assert "(*** in database main *** " in checks["database"]["detail"]
    assert "\n" not in checks["database"]["detail"]
    assert "\\x0a" not in served.cli("doctor").stdout
    assert checks["launcher"]["status"] == "fail"
    assert checks["launcher"]["detail"].startswith("the launcher cannot start: [Errno 13]")
    serve = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "--serve", "--simulate", "1xA100-80GB"],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 2 and "Move it aside" in serve.stderr  # (as doctor said)


def test_a_removed_socket_is_bound_again(served: Served) -> None:
    # Removed (a tmp cleaner), the engine served on unreachable: the CLI said to start
    # one, and starting one was refused, as this one held the lock (tester h60).
    served.start("--simulate", "1xA100-80GB")
    sock = served.home / "engine.sock"
    sock.unlink()
    wait_for(lambda: served.cli("jobs").returncode == 0, timeout=20, interval=0.2)
    # Replaced by a file or a link, it was never bound again (tester h149).
    elsewhere = served.home.parent / "elsewhere"
    elsewhere.write_text("kept")
    for replace in (lambda: sock.write_text(""), lambda: sock.symlink_to(elsewhere)):
        sock.unlink()
        replace()
        wait_for(
            lambda: sock.is_socket() and served.cli("jobs").returncode == 0,
            timeout=20,
            interval=0.2,
        )
    assert elsewhere.read_text() == "kept"  # (the link went, not what it named)
    log = served.stop()
    assert "engine.sock was removed; listening on it again" in log
    assert "engine.sock was replaced by a regular file; listening on it again" in log
    assert "engine.sock was replaced by a symbolic link; listening on it again" in log


def test_a_run_is_said_in_words() -> None:
    from gpulayer_tui.cli.doctor import _run_words

    assert [_run_words(k) for k in ("7", "7~1", "10.0.1", "10.2.13")] == [
        "job 7", "job 7", "job 10 replica 0", "job 10 replica 2"
    ]  # fmt: skip


def test_doctor_without_an_engine_says_what_its_launcher_still_runs(
    served: Served, tmp_path: Path
) -> None:
    # Jobs running on with no engine were not mentioned.
    served.start("--simulate", "1xA100-80GB")
    long = served.cli("submit", "--", "sleep", "600").stdout.strip()
    gated = f"until [ -e {tmp_path}/go ]; do sleep 0.05; done"
    short = served.cli("submit", "--", "sh", "-c", gated)
    pid = int(json.loads(served.cli("status", long, "--json").stdout)["job"]["pid"])
    served.stop()
    (tmp_path / "go").touch()
    journal = served.home / "launcher.journal"
    wait_for(lambda: f"E {short.stdout.strip()} " in journal.read_text())
    out = served.cli("doctor", "--json")
    jobs = [c for c in json.loads(out.stdout) if c["check"] == "jobs"]
    assert [c["status"] for c in jobs] == ["warn", "warn"], jobs
    assert jobs[0]["detail"].startswith(
        f"1 still running with no engine to follow them: job {long} (pid {pid});"
    )
    assert jobs[1]["detail"].startswith("1 ended with no engine running")
    assert "the next engine learns them" in jobs[0]["detail"]
    # Its keeper killed: the ends are kept only while the spawner lives (it was not said).
    keeper = int((served.home / "launcher.lock").read_text())
    os.kill(keeper, signal.SIGKILL)
    wait_for(lambda: pid_gone(keeper))
    out = served.cli("doctor", "--json")
    jobs = [c for c in json.loads(out.stdout) if c["check"] == "jobs"]
    assert "keeper process is gone: their ends are recorded only while" in jobs[0]["detail"]
    os.killpg(pid, signal.SIGKILL)


async def test_a_hanging_gpu_degrades_then_quarantines_only_its_domain(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    config = make_config(
        engine={"probe_timeout": 0.2, "sample_interval": 60},
        health={"degrade_after": 2, "quarantine_after": 3},
    )
    engine = await make_engine(probe=NvmlProbe(), config=config)
    gpu0, gpu1 = engine.scheduler.domains["gpu0"], engine.scheduler.domains["gpu1"]
    hang = fake_nvml.hang("nvmlDeviceGetMemoryInfo", index=1)
    first = await engine.sampler.sample_once()
    reading = next(g for g in first.result.gpus if g.index == 1)
    assert reading.failed and reading.error == "GPU 1 did not answer within 0.2 s"
    assert reading.name == "NVIDIA H100 80GB HBM3"  # identity kept from the last good read
    # the other GPU's reading arrived as usual, in the same tick
    assert next(g for g in first.result.gpus if g.index == 0).memory_total == 80 * 1024**3
    await engine.sampler.sample_once()
    assert gpu1.health.value == "degraded" and gpu1.state.value == "in_service"
    third = await engine.sampler.sample_once()
    assert "still busy" in (next(g for g in third.result.gpus if g.index == 1).error or "")
    assert gpu1.state.value == "quarantined"
    assert gpu0.state.value == "in_service" and gpu0.failures == 0
    # the engine kept answering meanwhile
    job = await engine.submit({"command": ["true"], "gpus": 1})
    done = await engine.wait(job.id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.domains == ["gpu0"]
    hang.release()

    async def answers() -> bool:
        await engine.sampler.sample_once()
        return gpu1.answers

    await eventually(answers, timeout=10, interval=0.05)
    assert (await engine.domain_ops.release("gpu1"))["state"] == "in_service"


async def test_doctor_checks_name_quarantine_and_a_clock_gone_backwards(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    engine = await make_engine(probe=NvmlProbe())
    job = await engine.submit({"command": ["true"]})
    await engine.wait(job.id, timeout=10)
    fake_nvml.devices[1].lost = True
    await engine.sampler.sample_once()
    with sqlite3.connect(engine.paths.database) as db:
        db.execute("UPDATE jobs SET created_at = created_at + 3600 WHERE id = ?", (job.id,))
    checks = {c["check"]: c for c in await engine.domain_ops.doctor_checks()}
    assert checks["domain gpu1"]["status"] == "fail"
    assert checks["domain gpu1"]["detail"].startswith("quarantined: GPU is lost")
    assert "answers again" not in checks["domain gpu1"]["detail"]
    assert checks["domain gpu0"]["status"] == "ok"
    assert checks["GPU sampling"] == {
        "check": "GPU sampling",
        "status": "ok",
        "detail": "samples are taken and handled",
    }
    assert (
        checks["clock"]["status"] == "fail" and "behind the newest job" in checks["clock"]["detail"]
    )
    # The GPU back, and drained under its quarantine: said, as `domain list` says it
    # ("quarantined: GPU is lost" alone: tester h170).
    fake_nvml.devices[1].lost = False
    await engine.sampler.sample_once()
    await engine.domain_ops.drain("gpu1", "rma")
    checks = {c["check"]: c for c in await engine.domain_ops.doctor_checks()}
    assert checks["domain gpu1"]["detail"].endswith(
        "; the GPU answers again: release it when you trust it; drained under it (rma): a "
        "release drains it"
    ), checks["domain gpu1"]


async def test_a_job_only_one_gpu_can_hold_waits_for_that_gpu_and_doctor_says_so(
    make_engine: EngineFactory,
) -> None:
    # A 100 GiB job beside an H200 and an L4: its reason blamed "all 2 GPU slots busy"
    # (the L4 never could take it); with the H200 lost it said "GPU capacity unknown",
    # and doctor called every queued job placeable.
    from gpulayer_tui.engine.simulate import SimLedger

    engine = await make_engine("1xH200-141GB,1xL4-24GB")
    on_h200 = await engine.submit({"command": ["sleep", "600"], "domain": "gpu0"})
    on_l4 = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    big = await engine.submit({"command": ["sleep", "600"], "gpus": 1, "vram_gb": 100})
    assert big.status is JobStatus.QUEUED
    assert big.message == f"waiting for gpu0: slot held by job {on_h200.id}"
    SimLedger(engine.paths.state_dir).set_gpu(0, lost=True, error="GPU is lost: off the bus")
    await engine.sampler.sample_once()
    await eventually(
        lambda: (
            engine.book.get(big.id).job.message
            == "waiting for domain gpu0 quarantined: GPU is lost: off the bus"
        )
    )
    checks = {c["check"]: c for c in await engine.domain_ops.doctor_checks()}
    assert checks["queued jobs"] == {
        "check": "queued jobs",
        "status": "fail",
        "detail": f"1 queued job can only run on domains out of service: {big.id}",
    }
    # The same after a restart, the GPU lost before the new engine ever read it well.
    await engine.stop()
    again = await make_engine("1xH200-141GB,1xL4-24GB")
    await eventually(
        lambda: (
            again.book.get(big.id).job.message
            == "waiting for domain gpu0 quarantined: GPU is lost: off the bus"
        )
    )
    checks = {c["check"]: c for c in await again.domain_ops.doctor_checks()}
    assert checks["queued jobs"]["detail"].endswith(f"out of service: {big.id}")
    for job in (big, on_h200, on_l4):
        await again.cancel(job.id)


async def test_a_gpu_reported_lost_without_words_is_called_lost(
    make_engine: EngineFactory,
) -> None:
    from gpulayer_tui.engine.simulate import SimLedger

    engine = await make_engine("2xA100-80GB")
    SimLedger(engine.paths.state_dir).set_gpu(1, lost=True)
    await engine.sampler.sample_once()
    gpu1 = engine.scheduler.domains["gpu1"]
    assert gpu1.state.value == "quarantined"
    assert gpu1.state_reason == "GPU is lost"  # (it said "read failed")


def test_doctor_sees_a_lock_without_a_socket_and_low_disk(
    served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import sys

    from gpulayer_tui.cli import doctor
    from gpulayer_tui.engine.paths import resolve_paths

    served.home.mkdir(parents=True, mode=0o700)
    lock = served.home / "engine.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); "
            "print('locked', flush=True); time.sleep(600)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"

        class Usage:
            free, total = 50 * 1024**2, 100 * 1024**3

        monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: Usage())
        monkeypatch.setenv("GPULAYER_HOME", str(served.home))
        assert doctor.run_doctor(resolve_paths(), as_json=True) == 1
        checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
        assert checks["engine"]["status"] == "fail"
        assert f"pid {holder.pid} holds" in checks["engine"]["detail"]
        assert checks["disk space"]["status"] == "fail"
        assert checks["disk space"]["detail"].startswith("50 MiB free in ")
        # A small disk with room is as the engine judges it: not full ("0.0 GiB" failed).
        Usage.free, Usage.total = 39 * 1024**2, 40 * 1024**2
        (served.home / "config.toml").write_text("[logs]\nmin_free_mb = 0\n")
        doctor.run_doctor(resolve_paths(), as_json=True)
        checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
        assert checks["disk space"]["status"] == "ok", checks["disk space"]
    finally:
        holder.kill()
        holder.communicate()


async def test_jobs_dying_of_device_errors_count_against_their_gpu(
    make_engine: EngineFactory,
) -> None:
    config = make_config(health={"degrade_after": 2, "quarantine_after": 3})
    engine = await make_engine("2xA100-80GB", config=config)
    gpu0, gpu1 = engine.scheduler.domains["gpu0"], engine.scheduler.domains["gpu1"]
    cuda_dead = {
        "shell": "echo 'RuntimeError: CUDA error: no CUDA-capable device is detected' >&2; exit 1",
        "domain": "gpu1",
    }
    program_bug = {"shell": "echo 'AssertionError: shapes differ' >&2; exit 1", "domain": "gpu0"}
    for _ in range(2):
        await engine.wait((await engine.submit(program_bug)).id, timeout=10)
    assert gpu0.launch_failures == 0 and gpu0.health.value == "healthy"  # not the GPU's fault
    await engine.wait((await engine.submit(cuda_dead)).id, timeout=10)
    second = await engine.submit(cuda_dead)
    await engine.wait(second.id, timeout=10)
    assert gpu1.health.value == "degraded" and gpu1.state.value == "in_service"
    ok = await engine.submit({"command": ["true"], "domain": "gpu1"})
    await engine.wait(ok.id, timeout=10)
    assert gpu1.launch_failures == 0  # a clean run resets the count
    for _ in range(3):
        last = await engine.submit(cuda_dead)
        await engine.wait(last.id, timeout=10)
    assert gpu1.state.value == "quarantined"
    assert gpu1.state_reason == "3 jobs in a row failed with: no CUDA-capable device"
    # The job whose run tipped it over is told, in its timeline (tester h148: it said only
    # that it failed); the clean run that made the GPU healthy again is not the job's news.
    # (the reason is said once: it was said again before the message: tester h169)
    said = [
        (e["kind"], event_label(e), *event_words(e))
        for job in (second, ok, last)
        for e in (await engine.job_detail(job.id))[1]
        if e["kind"] == "domain.state"
    ]
    assert said == [
        (
            "domain.state",
            "GPU",
            "",
            "domain gpu1 degraded after this run's device error: no CUDA-capable device",
        ),
        (
            "domain.state",
            "GPU",
            "",
            "domain gpu1 quarantined after this run's device error: 3 jobs in a row failed "
            "with: no CUDA-capable device",
        ),
    ]
    assert gpu0.state.value == "in_service"
    # The operator's release starts the count again: one more such job quarantined it at
    # once ("4 jobs in a row") while it showed healthy (tester h72).
    await engine.domain_ops.release("gpu1")
    assert gpu1.launch_failures == 0 and gpu1.health.value == "healthy"
    await engine.wait((await engine.submit(cuda_dead)).id, timeout=10)
    assert gpu1.state.value == "in_service" and gpu1.launch_failures == 1


async def test_a_service_replica_dying_of_device_errors_counts_against_its_gpu(
    make_engine: EngineFactory,
) -> None:
    # A replica crash-looping on a broken GPU was restarted for ever, the GPU "healthy":
    # only batch jobs counted. Quarantined, the GPU sends the service elsewhere.
    from .test_services import ManualClock

    clock = ManualClock()
    config = make_config(health={"degrade_after": 2, "quarantine_after": 3})
    engine = await make_engine("2xA100-80GB", config=config, service_clock=clock)
    gpu1 = engine.scheduler.domains["gpu1"]
    holder = await engine.submit({"command": ["sleep", "600"], "gpus": 1, "domain": "gpu0"})
    job = await engine.submit(
        {
            "kind": "service",
            "port": False,
            "gpus": 1,
            "shell": 'if [ "$CUDA_VISIBLE_DEVICES" = 1 ]; then echo "RuntimeError: CUDA error: '
            'no CUDA-capable device is detected" >&2; exit 1; fi; exec sleep 600',
        }
    )
    assert job.domains == ["gpu1"]  # (gpu0 is busy)
    for crashes in (1, 2, 3):
        await eventually(
            lambda: gpu1.launch_failures == crashes or gpu1.state.value == "quarantined"  # noqa: B023
        )
        if crashes < 3:
            await eventually(lambda: bool(clock.pending()))
            clock.advance(60)
    assert gpu1.state.value == "quarantined"
    assert gpu1.state_reason.endswith("failed with: no CUDA-capable device")
    await engine.cancel(holder.id)
    live = engine.book.get(job.id)
    await eventually(lambda: live.job.domains == ["gpu0"] and live.job.replicas[0].pid)
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=20)


async def test_a_service_whose_device_errors_follow_it_quarantines_one_gpu_not_each(
    make_engine: EngineFactory,
) -> None:
    # One crash-looping service quarantined gpu1, was placed on gpu0 and quarantined it,
    # then gpu2: every GPU of the box, for one job's fault ("5 jobs in a row failed" said
    # of one service's exits): tester h93.
    from .test_services import ManualClock

    clock = ManualClock()
    config = make_config(health={"degrade_after": 2, "quarantine_after": 3})
    engine = await make_engine("3xA100-80GB", config=config, service_clock=clock)
    job = await engine.submit(
        {
            "kind": "service",
            "port": False,
            "gpus": 1,
            "shell": "echo 'RuntimeError: CUDA error: no CUDA-capable device is detected' >&2; "
            "exit 1",
        }
    )
    live = engine.book.get(job.id)
    first = engine.scheduler.domains[job.domains[0]]
    while first.state.value != "quarantined":
        await eventually(lambda: bool(clock.pending()) or first.state.value == "quarantined")
        clock.advance(60)
    assert first.state_reason == (
        f"3 runs of job {job.id} in a row failed with: no CUDA-capable device"
    )
    await eventually(lambda: live.job.domains and live.job.domains != [first.name])
    second = engine.scheduler.domains[live.job.domains[0]]
    restarts = live.job.replicas[0].restarts
    for _ in range(6):  # (twice what quarantines a GPU)
        await eventually(lambda: bool(clock.pending()))
        clock.advance(60)
    await eventually(lambda: live.job.replicas[0].restarts >= restarts + 6)
    assert second.state.value == "in_service" and second.launch_failures == 0
    assert [d.state.value for d in engine.scheduler.gpu_domains].count("quarantined") == 1
    # Another job's device errors still count against the GPU it ran on.
    other = await engine.submit(
        {"shell": "echo 'CUDA error: no CUDA-capable device is detected' >&2; exit 1", "gpus": 1}
    )
    ended = await engine.wait(other.id, timeout=10)
    assert [engine.scheduler.domains[d].launch_failures for d in ended.domains] == [1]
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=20)


async def test_doctor_checks_the_config_file_as_the_engine_would_and_a_closed_queue(
    make_engine: EngineFactory, paths: Any
) -> None:
    # doctor said "config ok, is valid" for a file the engine refused (a GPU that does not
    # exist), and "queued jobs ok" while every new job waited for disk space.
    from gpulayer_tui.engine.config import load_config

    paths.state_dir.mkdir(parents=True, mode=0o700)
    paths.config_file.write_text("[cpu]\nslots = 2\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()  # (the reloads below only)

    async def check(name: str) -> dict[str, str]:
        return next(c for c in await engine.doctor_checks() if c["check"] == name)

    assert (await check("config"))["status"] == "ok"
    assert (await check("config"))["detail"].endswith("is valid and applied")
    paths.config_file.write_text("[cpu]\nslots = 2\n[domains.other]\ngpu = 7\n")
    assert not (await engine.config_reload.reload())["applied"]
    said = await check("config")
    assert said["status"] == "fail" and "gpu 7 does not exist" in said["detail"]
    assert said["detail"].endswith("(the engine runs on the last valid configuration)")
    paths.config_file.write_text("[cpu]\nslots = 3\n")
    assert (await check("config"))["status"] == "warn"  # valid, not applied yet
    paths.config_file.unlink()
    said = await check("config")
    assert said["status"] == "warn" and "runs on the configuration it last read" in said["detail"]
    # A queue that starts nothing says why: paused (a choice), or the disk (a fault).
    await engine.pause()
    said = await check("queued jobs")  # (nothing waits yet: the pause is said all the same)
    assert said["status"] == "warn"
    assert said["detail"].startswith("none waits; the queue has been paused")
    waiting = await engine.submit({"command": ["true"]})
    said = await check("queued jobs")
    assert said["status"] == "warn"
    assert said["detail"].startswith("1 waits: the queue has been paused")
    await engine.resume()
    await engine.wait(waiting.id, timeout=10)


def test_doctor_without_an_engine_binds_the_config_to_the_gpus_and_knows_the_floor(
    served: Served,
    fake_nvml: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpulayer_tui.cli import doctor
    from gpulayer_tui.engine.paths import resolve_paths

    served.home.mkdir(parents=True, mode=0o700)
    config = served.home / "config.toml"
    config.write_text("[logs]\nmin_free_mb = 1073741824\n[domains.other]\ngpu = 7\n")
    monkeypatch.setenv("GPULAYER_HOME", str(served.home))
    assert doctor.run_doctor(resolve_paths(), as_json=True) == 1
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["config"]["status"] == "fail"
    assert "gpu 7 does not exist (the GPUs seen: GPU 0, GPU 1)" in checks["config"]["detail"]
    # The floor is read even from a file whose domains are wrong.
    assert checks["disk space"]["status"] == "fail"
    assert "below [logs] min_free_mb = 1073741824, new jobs wait" in checks["disk space"]["detail"]
    # (1 PiB: more than this filesystem; freeing space never helps: tester h53)
    assert "(more than the whole filesystem, " in checks["disk space"]["detail"]
    config.write_text("[domains.other]\ngpu = 1\n")
    doctor.run_doctor(resolve_paths(), as_json=True)
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["config"] == {
        "check": "config",
        "status": "ok",
        "detail": f"{config} is valid",
    }


async def test_the_drivers_own_reserve_is_not_unattributed_nor_capacity(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # On a real H200 every idle GPU showed 0.6 GiB "UNATTR": the driver's own reserve
    # (NVML's v2 memory info says it apart). No job can have it, so it is not capacity
    # either: a job asking for the whole GPU can never run there.
    reserve = 615 * 1024**2
    for device in fake_nvml.devices:
        device.compute = []
        device.memory_reserved = device.memory_used = reserve
    engine = await make_engine(probe=NvmlProbe())
    await engine.sampler.sample_once()

    view = next(d for d in engine.gpus()["domains"] if d["name"] == "gpu0")
    vram = view["vram"]
    assert vram["unattributed"] == 0 and vram["used"] == 0
    assert vram["driver_reserved"] == reserve and vram["total"] == 80 * GIB - reserve
    assert vram["free"] == 80 * GIB - reserve
    assert view["gpu"]["memory_reserved"] == reserve
    shown = format_gpus(dict(engine.gpus()))
    assert "the driver keeps 0.6 GiB of each GPU (not in TOTAL)" in shown, shown
    row = next(line.split() for line in shown.splitlines() if line.startswith("gpu0"))
    assert "0.0/79.4" in row, row

    whole = await engine.submit({"command": ["true"], "domain": "gpu0", "vram_gb": 80})
    assert whole.status is JobStatus.FAILED
    assert "requested 80 GiB per GPU, but gpu0" in whole.message
    assert "has 79.4 GiB" in whole.message, whole.message


async def test_a_missing_gpu_whose_name_another_gpu_took_is_named_by_its_uuid(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # The driver numbers the GPUs it lists: with GPU 0 gone, GPU 1 is "gpu0" now, and
    # "waiting for the GPU of gpu0" named a GPU that is here.
    first = await make_engine(probe=NvmlProbe())
    await first.pause()
    both = await first.submit({"command": ["true"], "gpus": 2})
    await first.stop()
    gone = fake_nvml.devices.pop(0)
    second = await make_engine(probe=NvmlProbe())
    waiting = await second.get(both.id)
    assert waiting.status is JobStatus.QUEUED
    assert waiting.message.startswith(
        f"waiting for the GPU of gpu0 ({gone.uuid}): not found by the driver (1 here, 1 missing;"
    ), waiting.message
    assert second.scheduler.domains["gpu0"].gpu_uuid == fake_nvml.devices[0].uuid
    forgotten = await second.domain_ops.forget(gone.uuid)  # (by UUID too)
    assert forgotten == {"name": "gpu0", "gpu_uuid": gone.uuid, "still_running": []}
    assert (await second.get(both.id)).status is JobStatus.FAILED


def test_a_one_slot_domain_held_by_two_jobs_names_them_as_jobs() -> None:
    # An adoption past its slots (or a slot count lowered by a reload) puts two there:
    # "slot held by job 9, 13" (tester h102).
    from gpulayer_tui.engine.domain import Domain

    dom = Domain("gpu0", 0, None, 1)
    dom.hold(9, None, False)
    assert dom.blocker(None, False) == "gpu0: slot held by job 9"
    dom.hold(13, None, False)
    # ("slot held by jobs 9, 13" read as one slot shared by two: tester h129)
    assert dom.blocker(None, False) == (
        "gpu0: jobs 9, 13 running, more than its 1 slot (lowered while jobs ran)"
    )
    three = Domain("gpu1", 1, None, 2)
    for job in (49, 50):
        three.hold(job, None, False)
    three.hold(51, None, False, adopted=True)
    # Which: "lowered" was said of a pool adoptions over-filled (tester h163).
    assert three.blocker(None, False) == (
        "gpu1: jobs 49, 50, 51 running, more than its 2 slots (adopted processes take slots, "
        "free or not)"
    )
    cpu = Domain("cpu", None, None, 2)
    for job in (1, 2, 3):
        cpu.hold(job, None, False, adopted=job == 3)
    assert cpu.blocker(None, False) == (
        "cpu: 3 slots in use, more than its 2 slots (adopted processes take slots, free or not)"
    )


def test_doctor_names_the_engines_version_and_warns_of_another(
    served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An engine keeps its code until restarted: a newer CLI against it was never told
    # (tester h149). A simulated driver is said as such ("readable through simulated").
    import gpulayer_tui
    from gpulayer_tui.cli import doctor
    from gpulayer_tui.engine.paths import resolve_paths

    served.start("--simulate", "1xA100-80GB")
    monkeypatch.setenv("GPULAYER_HOME", str(served.home))
    doctor.run_doctor(resolve_paths(), as_json=True)
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
    version = gpulayer_tui.__version__
    assert checks["engine"]["detail"].endswith(f", gpulayer-tui {version}")
    assert "engine version" not in checks
    assert (
        checks["driver"]["detail"]
        == "simulated GPUs (--simulate, or --simulate-if-no-gpu): no driver is read"
    )
    monkeypatch.setattr(gpulayer_tui, "__version__", "9.9.9")
    doctor.run_doctor(resolve_paths(), as_json=True)
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["engine version"]["status"] == "warn"
    assert checks["engine version"]["detail"] == (
        f"the engine runs gpulayer-tui {version}, this command is 9.9.9: stop the engine and "
        "start it again to run this version"
    )


async def test_a_gpu_with_no_domain_whose_reads_fail_is_shown_as_such(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Its figures were the last good read's, shown as live (and plotted on): tester h148.
    from gpulayer_tui.widgets.gpu_panel import GpuPanel

    config = make_config(engine={"sample_interval": 3600, "auto_domains": False})
    engine = await make_engine(probe=NvmlProbe(), config=config)
    await engine.sampler.sample_once()
    (fresh,) = [g for g in engine.gpus()["gpus_without_domain"] if g["gpu_index"] == 1]
    assert fresh["failures"] == 0
    fake_nvml.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, index=1)
    await engine.sampler.sample_once()
    (failing,) = [g for g in engine.gpus()["gpus_without_domain"] if g["gpu_index"] == 1]
    assert failing["failures"] == 1 and failing["gpu"]["error"]
    panel = GpuPanel("gpu 1")  # (the dashboard's panel of a GPU with no domain)
    panel.domain = dict(failing)
    assert panel.stale


def test_a_release_that_leaves_a_drain_says_so() -> None:
    # The first release of a quarantined, drained domain said "domain train: draining"
    # alone: not that the quarantine went, nor that a second release ends the drain (h169).
    from gpulayer_tui.formatting import drain_said

    dom = {"name": "train", "state": "draining", "drain_reason": "rma", "state_reason": "rma"}
    assert drain_said(dom, "release") == (
        " (quarantine lifted; still drained: rma; release again to end the drain)"
    )
    assert drain_said({**dom, "state": "in_service", "drain_reason": None}, "release") == ""
    # A new reason for a drain under a quarantine says the one it replaced (h170).
    under = {"name": "gpu0", "state": "quarantined", "drain_reason": "x2"}
    assert drain_said({**under, "previous_drain_reason": "x1"}, "drain") == (
        " (drained under it; reason changed: x1 -> x2; a release drains it again)"
    )


def test_a_submission_pinned_to_a_draining_domain_is_taken_with_a_warning(
    served: Served,
) -> None:
    # Taken without a word, it waited as long as the maintenance (tester h194 #6); one
    # pinned to a quarantined domain is refused instead.
    served.start("--simulate", "2xA100-80GB")
    assert served.cli("domain", "drain", "gpu1", "--reason", "fan noisy").returncode == 0
    pinned = served.cli("submit", "--domain", "gpu1", "--", "true")
    assert pinned.returncode == 0, pinned.stderr
    job = pinned.stdout.strip()
    assert pinned.stderr == (
        f"gpulayer-tui: warning: job {job} waits for the domains it is pinned to: gpu1 is "
        "draining (fan noisy): it starts once it is back in service (`gpulayer-tui domain "
        "release gpu1`)\n"
    )
    either = served.cli("submit", "--domain", "gpu0,gpu1", "--", "true")  # (gpu0 takes it)
    assert either.returncode == 0 and either.stderr == "", either.stderr
    # Two GPUs on gpu0 and the draining gpu1: it waits for gpu1 too (unsaid: h197), and
    # its restart says so as its submission does.
    both = served.cli("submit", "--gpus", "2", "--domain", "gpu0,gpu1", "--", "true")
    assert both.returncode == 0 and "warning: job " in both.stderr, both.stderr
    assert "gpu1 is draining (fan noisy): it starts once it is back in service" in both.stderr
    assert served.cli("cancel", both.stdout.strip()).returncode == 0
    again = served.cli("restart", both.stdout.strip())
    assert again.returncode == 0 and "gpu1 is draining (fan noisy)" in again.stderr, again
    assert served.cli("cancel", again.stdout.strip()).returncode == 0
    assert served.cli("domain", "release", "gpu1").returncode == 0
    assert served.cli("wait", job, "--timeout", "30").returncode == 0


async def test_doctor_warns_of_a_notify_command_it_cannot_run(make_engine: EngineFactory) -> None:
    # Taken as valid, every notification then failed at its job's end (tester h193).
    engine = await make_engine(config=make_config(notify={"command": ["/nonexistent/cmd"]}))
    checks = {c["check"]: c for c in await engine.doctor_checks()}
    assert checks["notify"]["status"] == "warn"
    assert checks["notify"]["detail"].startswith(
        "[notify] command: /nonexistent/cmd is not a program this engine can run"
    )
    await engine.stop()
    fine = await make_engine(config=make_config(notify={"command": ["true"]}))
    assert "notify" not in {c["check"] for c in await fine.doctor_checks()}
