"""Live configuration: valid edits apply (and are recorded), invalid ones are rejected."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.cli.format import format_gpus
from gpulayer_tui.engine.config import load_config
from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.errors import DomainRefused, SpecError
from gpulayer_tui.engine.models import DomainState, JobStatus, ReplicaState, TerminationReason
from gpulayer_tui.engine.paths import Paths
from gpulayer_tui.engine.simulate import SimLedger

from .conftest import EngineFactory, Served, eventually, make_config, wait_for

BASE = "[engine]\nsample_interval = 0.2\ngrace_period = 2.0\n"


UNMANAGED = BASE + "auto_domains = false\n"
"""A config that names its domains (none made for GPUs it leaves out)."""


async def _unmanaged(
    make_engine: EngineFactory,
    paths: Paths,
    domains: str = "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n",
) -> Engine:
    """An engine on two simulated GPUs whose config names their domains (a and b)."""
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(UNMANAGED + domains)
    return await make_engine("2xA100-80GB", config=load_config(paths.config_file))


def _config_events(paths: Paths) -> list[dict[str, object]]:
    with sqlite3.connect(paths.database) as db:
        rows = db.execute("SELECT data FROM events WHERE kind = 'engine.config' ORDER BY id")
        return [json.loads(r[0]) for r in rows]


def _kill(pid: int | None) -> None:
    """SIGKILL a replica's process (``os.kill(0)`` would kill the tests' own group)."""
    assert pid, "the replica has no process to kill"
    os.kill(pid, signal.SIGKILL)


async def test_slot_change_applies_live_and_bad_edit_keeps_the_old_config(
    make_engine: EngineFactory, paths: Paths, caplog: pytest.LogCaptureFixture
) -> None:
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE + "[cpu]\nslots = 1\n")
    engine = await make_engine(config=load_config(paths.config_file))
    first = await engine.submit({"command": ["sleep", "600"]})
    second = await engine.submit({"command": ["sleep", "600"]})
    assert second.status is JobStatus.QUEUED and second.message == "the only cpu slot is busy"

    # the watcher picks the edit up by itself
    paths.config_file.write_text(BASE + "[cpu]\nslots = 2\n")
    await eventually(lambda: engine.scheduler.domains["cpu"].slots == 2, timeout=10)
    await eventually(lambda: engine.book.get(second.id).job.status is JobStatus.RUNNING)
    assert (await engine.get(first.id)).status is JobStatus.RUNNING  # undisturbed

    # a double-owned GPU is rejected, naming the domains; the running config stays
    paths.config_file.write_text(
        BASE + "[cpu]\nslots = 3\n[domains.a]\ngpu = 0\n[domains.b]\ngpu = 0\n"
    )
    await eventually(lambda: any(e["outcome"] == "rejected" for e in _config_events(paths)))
    assert engine.scheduler.domains["cpu"].slots == 2
    rejected = next(e for e in _config_events(paths) if e["outcome"] == "rejected")
    assert "domains.a and domains.b both claim GPU 0" in str(rejected["error"])
    applied = next(e for e in _config_events(paths) if e["outcome"] == "applied")
    assert applied["changes"] == ["cpu: slots 1 -> 2"]
    # A rejection's event names the field at fault, as the reload API's answer does (h193).
    paths.config_file.write_text(BASE + "[cpu]\nslotz = 3\n")
    answer = await engine.config_reload.reload()
    assert answer["field"] == "cpu.slotz", answer
    assert _config_events(paths)[-1]["field"] == "cpu.slotz"
    # Every section that changed is said (the event said [] for [logs] and the like).
    paths.config_file.write_text(BASE + "[cpu]\nslots = 2\n[logs]\nmax_bytes = 65536\n")
    assert (await engine.config_reload.reload())["changes"] == [
        "logs.max_bytes: 1073741824 -> 65536"
    ]
    # The next launcher started gets a new launcher_idle ("applied", and it still got the
    # old --idle: tester h135).
    paths.config_file.write_text(
        BASE + "launcher_idle = 4.0\n[cpu]\nslots = 2\n[logs]\nmax_bytes = 65536\n"
    )
    assert (await engine.config_reload.reload())["changes"] == ["engine.launcher_idle: 60.0 -> 4.0"]
    assert engine.executor.idle_timeout == 4.0
    # [ui] is the TUI's: not the engine's change (a theme switched with `t` was: h164).
    paths.config_file.write_text(
        BASE + "launcher_idle = 4.0\n[cpu]\nslots = 2\n[logs]\nmax_bytes = 65536\n"
        '[ui]\ntheme = "gpulayer-light"\n'
    )
    assert (await engine.config_reload.reload())["changes"] == []
    # (said to the TUIs apart, which apply a theme live)
    told = [e for e in _config_events(paths) if e["outcome"] == "applied"][-1]
    assert told["changes"] == [] and told["ui"] == ["ui.theme: unset -> 'gpulayer-light'"]
    # Each setting with its values (the log said only "history": tester h81), but not a
    # notification's: a webhook URL may hold a secret.
    paths.config_file.write_text(
        BASE + "[cpu]\nslots = 2\n[logs]\nmax_bytes = 65536\n[history]\nkeep_jobs = 50\n"
        '[notify]\nurl = "https://hooks.example/T0/secret"\n'
    )
    changes = (await engine.config_reload.reload())["changes"]
    assert "history.keep_jobs: unset -> 50" in changes and "notify.url" in changes, changes
    assert not [c for c in changes if "secret" in c], changes
    # A table of named tables, table by table ("users" alone: tester h111).
    kept = BASE + "[cpu]\nslots = 2\n[logs]\nmax_bytes = 65536\n[history]\nkeep_jobs = 50\n"
    kept += '[notify]\nurl = "https://hooks.example/T0/secret"\n'
    paths.config_file.write_text(kept + "[users.root]\nmax_gpus = 1\n")
    assert (await engine.config_reload.reload())["changes"] == ["users.root added"]
    paths.config_file.write_text(
        kept + "[users.root]\nmax_gpus = 2\n[users.nobody]\nmax_gpus = 1\n"
    )
    assert (await engine.config_reload.reload())["changes"] == [
        "users.nobody added",
        "users.root.max_gpus: 1 -> 2",
    ]
    paths.config_file.write_text(kept + "[users.nobody]\nmax_gpus = 1\n")
    assert (await engine.config_reload.reload())["changes"] == ["users.root removed"]
    # Two errors: one log record, one line, that says a restart would refuse the file
    # (the second error went to the log bare: tester h90).
    caplog.set_level(logging.WARNING, "gpulayer_tui.engine.reload")
    caplog.clear()
    paths.config_file.write_text(BASE + '[cpu]\nslots = "four"\n[bogus]\nx = 1\n')
    assert (await engine.config_reload.reload())["applied"] is False
    records = [r.getMessage() for r in caplog.records if "config rejected" in r.getMessage()]
    assert records  # (the watcher may have read the edit too: each one line)
    for said in records:
        assert "\n" not in said and "bogus" in said and "slots" in said, said
        assert "an engine started now would refuse this file" in said
    await engine.cancel(first.id)
    await engine.cancel(second.id)


async def test_a_rename_says_the_slots_that_change_with_it(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # "GPU 1: domain dev -> gpu1" alone, while its slots went 2 -> 1 (tester h125).
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(UNMANAGED + "[domains.dev]\ngpu = 1\nslots = 2\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    paths.config_file.write_text(BASE)
    changes = (await engine.config_reload.reload())["changes"]
    assert "GPU 1: domain dev -> gpu1, slots 2 -> 1" in changes, changes
    assert engine.scheduler.domains["gpu1"].slots == 1


async def test_the_watcher_applies_nothing_for_a_file_already_read(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # An edit then `POST /config/reload`: applied, then again by the watcher, "nothing
    # changed", a second event and log line; a save of the same bytes did the same.
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE + "[cpu]\nslots = 1\n")
    engine = await make_engine(config=load_config(paths.config_file))
    reloader = engine.config_reload
    # Written until the watcher applies it (it watches a moment after the engine starts).
    deadline, tries = time.monotonic() + 20, 0
    while engine.scheduler.domains["cpu"].slots != 2:
        assert time.monotonic() < deadline, "the watcher never applied an edit"
        tries += 1
        paths.config_file.write_text(BASE + f"[cpu]\nslots = 2\n# {tries}\n")
        with contextlib.suppress(AssertionError):
            await eventually(lambda: engine.scheduler.domains["cpu"].slots == 2, timeout=1)
    handled = reloader.changes_handled
    edited = BASE + "[cpu]\nslots = 3\n"
    paths.config_file.write_text(edited)
    await engine.config_reload.reload()
    await eventually(lambda: reloader.changes_handled > handled, timeout=10)
    assert engine.scheduler.domains["cpu"].slots == 3
    seen, handled = len(_config_events(paths)), reloader.changes_handled
    paths.config_file.write_text(edited)  # (saved again, unchanged)
    await eventually(lambda: reloader.changes_handled > handled, timeout=10)
    assert len(_config_events(paths)) == seen, _config_events(paths)[seen:]
    assert [e["changes"] for e in _config_events(paths)].count([]) <= 1


async def test_lowering_max_priority_brings_waiting_jobs_down_to_it(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # A waiting job kept the priority its user may no longer have, its rank with it, and
    # preempted others by it (tester h47); lowered max_gpus or max_vram_gb were applied.
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE + "[users.default]\nmax_priority = 50\n")
    engine = await make_engine("1xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()  # (applied by hand below, not by the watcher)
    blocker = await engine.submit({"command": ["sleep", "60"], "gpus": 1})
    high = await engine.submit({"command": ["true"], "gpus": 1, "priority": 50})
    low = await engine.submit({"command": ["true"], "gpus": 1, "priority": -2})
    paths.config_file.write_text(BASE + "[users.default]\nmax_priority = 0\n")
    done = await engine.config_reload.reload()
    assert done["applied"] is True
    # (the reply names the jobs it edited: it said only "max_priority: 50 -> 0", h125)
    said_now = f"job {high.id} edited: priority lowered to max_priority"
    assert done["changes"][-1] == said_now, done
    capped = await engine.get(high.id)
    assert capped.priority == 0 and capped.spec["priority"] == 0
    said = [e["message"] for e in await engine.events_of(high.id) if e["kind"] == "job.edited"]
    assert said == ["edited: priority 50 -> 0 ([users.default] max_priority lowered)"], said
    assert (await engine.get(low.id)).priority == -2  # (below it already: untouched)
    assert engine.queue.explain(high.id)["priority"] == 0
    await engine.cancel(blocker.id)
    assert (await engine.wait(high.id, timeout=20)).status is JobStatus.COMPLETED


async def test_a_services_host_nothing_can_listen_on_is_refused(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Taken, every service failed at its next replica start ("cannot pick a port"), and
    # doctor said the config was valid and applied.
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine(config=load_config(paths.config_file))
    for host, why in (("192.0.2.1", "cannot pick a port on 192.0.2.1"), ("nohost.invalid", "")):
        paths.config_file.write_text(BASE + f'[services]\nhost = "{host}"\n')
        result = await engine.config_reload.reload()
        assert result["applied"] is False
        assert f"services.host: cannot pick a port on {host}" in result["error"], result
        assert result["field"] == "services.host"  # (errors name their input: tester h71)
        assert why in result["error"]
        assert engine.config.services.host == "127.0.0.1"
        check = await engine.config_reload.check_file()
        assert check["status"] == "fail" and "services.host" in check["detail"]
    paths.config_file.write_text(BASE + '[services]\nhost = "224.0.0.1"\n')
    refused = await engine.config_reload.reload()  # (it binds; no client ever reaches it)
    assert "224.0.0.1 is a multicast or broadcast address" in refused["error"]
    paths.config_file.write_text(BASE + "[services\n")
    refused = await engine.config_reload.reload()
    assert "not valid TOML" in refused["error"] and "field" not in refused
    paths.config_file.write_text(BASE + "bogus = 1\n")
    refused = await engine.config_reload.reload()  # (it had no field: tester h105)
    assert "unknown key 'engine.bogus'" in refused["error"]
    assert refused["field"] == "engine.bogus"
    # Those that name a domain name it as their field, as TOML writes it (no field, and
    # `domains.a b` unquoted: tester h145).
    for table, field in (
        ('[domains."a b"]\ngpu = 0\n', 'domains."a b"'),
        ("[domains.gpu1]\ngpu = 0\n", "domains.gpu1"),
        ("[domains.x]\ngpu = 0\n[domains.y]\ngpu = 0\n", "domains.y"),
    ):
        paths.config_file.write_text(BASE + table)
        refused = await engine.config_reload.reload()
        assert refused["applied"] is False and refused.get("field") == field, refused
        assert refused["error"].startswith(f"{paths.config_file}: {field}: "), refused
    paths.config_file.write_text(BASE + '[services]\nhost = "localhost"\n')
    assert (await engine.config_reload.reload())["applied"] is True


async def test_renaming_a_gpu_domain_keeps_running_jobs_and_moves_waiting_pins_with_it(
    make_engine: EngineFactory, paths: Paths
) -> None:
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    running = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    pinned = await engine.submit({"command": ["true"], "domain": "gpu1"})
    assert pinned.status is JobStatus.QUEUED
    paths.config_file.write_text(BASE + "[domains.train]\ngpu = 1\nslots = 1\n")
    result = await engine.config_reload.reload()
    assert result["applied"] is True
    assert "GPU 1: domain gpu1 -> train" in result["changes"]
    assert list(engine.scheduler.domains) == ["gpu0", "train", "cpu"]
    train = engine.scheduler.domains["train"]
    assert set(train.holdings) == {running.id}  # carried over, still accounted for
    live = await engine.get(running.id)
    assert live.status is JobStatus.RUNNING and live.domains == ["train"]
    assert live.message == "running on train"  # (it said "running on gpu1" ever after)
    # The job waiting for gpu1 waits for the same GPU under its new name (it failed "can
    # no longer run": a rename lost every job queued for the GPU); stored as an edit.
    waiting = await engine.get(pinned.id)
    assert waiting.status is JobStatus.QUEUED and waiting.spec["domain"] == "train"
    edits = [e for e in await engine.events_of(pinned.id) if e["kind"] == "job.edited"]
    assert edits[-1]["message"] == "edited: pinned domain renamed with its GPU (gpu1 -> train)"
    with sqlite3.connect(paths.database) as db:
        stored = db.execute("SELECT spec FROM jobs WHERE id = ?", (pinned.id,)).fetchone()[0]
    assert json.loads(stored)["domain"] == "train"
    # A pin to a domain removed with its GPU still fails, with the reason.
    gone = await engine.submit({"command": ["true"], "domain": ["gpu0", "train"], "gpus": 2})
    assert gone.status is JobStatus.QUEUED
    paths.config_file.write_text(
        BASE + "auto_domains = false\n[domains.train]\ngpu = 1\nslots = 1\n"
    )
    done = await engine.config_reload.reload()
    assert done["applied"] is True
    failed = await engine.wait(gone.id, timeout=10)
    assert failed.termination_reason is TerminationReason.OVER_CAPACITY
    # (named in the reply and the log: queued work lost to a one-line setting, h125)
    assert done["changes"][-1] == (
        f"job {gone.id} failed: it can no longer run (see the job's message)"
    ), done
    assert "can no longer run after a configuration change" in failed.message
    await engine.cancel(running.id)
    await engine.wait(running.id, timeout=10)
    assert (await engine.wait(pinned.id, timeout=10)).status is JobStatus.COMPLETED
    assert not set(train.holdings)  # released from the domain it now belongs to


def test_served_engine_follows_config_edits(served: Served) -> None:
    served.home.mkdir(parents=True)
    config = served.home / "config.toml"
    config.write_text("[cpu]\nslots = 1\n")
    served.start("--simulate", "2xA100-80GB")

    def cpu_slots() -> int:
        domains = json.loads(served.cli("domain", "list", "--json").stdout)
        return int({d["name"]: d["slots"] for d in domains}["cpu"])

    assert cpu_slots() == 1
    config.write_text("[cpu]\nslots = 4\n")
    wait_for(lambda: cpu_slots() == 4, timeout=15, interval=0.1)
    # Its log says when a new configuration took effect, without -v (tester h79).
    wait_for(lambda: "configuration applied: cpu: slots 1 -> 4" in served.log.read_text())
    config.write_text("[cpu]\nslots = 0\n")  # invalid: stays at 4
    wait_for(lambda: "cpu.slots" in served.log.read_text(), timeout=15, interval=0.1)
    assert cpu_slots() == 4


async def test_slots_lowered_below_use_stop_nothing_and_hold_new_work_until_below(
    make_engine: EngineFactory, paths: Paths
) -> None:
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE + "[cpu]\nslots = 2\n")
    engine = await make_engine(config=load_config(paths.config_file))
    first = await engine.submit({"command": ["sleep", "600"]})
    second = await engine.submit({"command": ["sleep", "600"]})
    paths.config_file.write_text(BASE + "[cpu]\nslots = 1\n")
    result = await engine.config_reload.reload()
    assert result["changes"] == ["cpu: slots 2 -> 1"]
    # Both keep running: a lower limit stops nothing; new work waits for room under it.
    assert [(await engine.get(j.id)).status for j in (first, second)] == [JobStatus.RUNNING] * 2
    third = await engine.submit({"command": ["true"]})
    # ("the only cpu slot is busy" of a pool cut to 1 under 3 jobs: tester h136)
    assert third.status is JobStatus.QUEUED
    assert third.message == "cpu: 2 slots in use, more than its 1 slot (lowered while jobs ran)"
    # doctor said "2/1 slots used" and "ok".
    checks = {c["check"]: c for c in await engine.doctor_checks()}
    assert checks["domain cpu"]["status"] == "warn"
    assert checks["domain cpu"]["detail"] == (
        "cpu pool, 2/1 slots used: more than its slots; no new work until below"
    )
    await engine.cancel(first.id)
    await engine.wait(first.id, timeout=10)
    waiting = await engine.get(third.id)  # 1 running: still full
    assert waiting.status is JobStatus.QUEUED and waiting.message == "the only cpu slot is busy"
    await engine.cancel(second.id)
    assert (await engine.wait(third.id, timeout=10)).status is JobStatus.COMPLETED


async def test_a_domain_removed_while_it_holds_a_job_lets_the_job_finish(
    make_engine: EngineFactory, paths: Paths
) -> None:
    paths.state_dir.mkdir(parents=True)
    unmanaged = BASE + "auto_domains = false\n"
    paths.config_file.write_text(unmanaged + "[domains.train]\ngpu = 1\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    running = await engine.submit({"command": ["sleep", "600"], "domain": "train"})
    waiting = await engine.submit({"command": ["true"], "domain": "train"})
    assert waiting.status is JobStatus.QUEUED
    paths.config_file.write_text(unmanaged)
    result = await engine.config_reload.reload()
    assert result["applied"] is True and "domain train removed" in result["changes"]
    assert "train" not in engine.scheduler.domains
    # The running job is not stopped: it ends as it would have.
    assert (await engine.get(running.id)).status is JobStatus.RUNNING
    # Both GPUs are still shown (`gpus`), with the job that still runs on its old one.
    view = engine.gpus()
    assert [d["name"] for d in view["domains"]] == ["cpu"]
    others = view.get("gpus_without_domain", [])
    assert [(g["gpu_index"], g["jobs"]) for g in others] == [(0, []), (1, [running.id])]
    assert all(g["gpu"] and g["gpu"]["name"] for g in others)
    shown = format_gpus(dict(view)).splitlines()
    assert shown[1].startswith("-") and shown[1].split()[1] == "0"
    assert shown[2].endswith(f"no domain (still running: job {running.id})")
    assert shown[3].startswith("cpu")
    # Its row says so too ("running on train" alone, with no domain train listed: h125).
    await engine.sampler.sample_once()
    assert (await engine.get(running.id)).message == (
        "running on train; warning: domain train is no longer in the configuration (it is "
        "let run to its end)"
    )
    failed = await engine.wait(waiting.id, timeout=10)
    assert failed.termination_reason is TerminationReason.OVER_CAPACITY
    assert "domain: unknown domain 'train'" in failed.message
    await engine.cancel(running.id)
    ended = await engine.wait(running.id, timeout=10)
    assert ended.status is JobStatus.CANCELLED
    assert [g["jobs"] for g in engine.gpus().get("gpus_without_domain", [])] == [[], []]
    after = await engine.submit({"command": ["true"]})  # and the engine carries on
    assert (await engine.wait(after.id, timeout=10)).status is JobStatus.COMPLETED
    # No GPU domain left: a GPU job is told the config's share, not "this machine has 0".
    two = await engine.submit({"command": ["true"], "gpus": 2})
    assert (
        two.message
        == "requested 2 GPUs, but 0 of this machine's 2 GPUs have a domain in the config"
    )
    # More than the machine has: no config could help, so none is suggested.
    three = await engine.submit({"command": ["true"], "gpus": 3})
    assert three.message == "requested 3 GPUs, but this machine has 2"


async def test_a_gpu_given_a_domain_again_keeps_the_job_still_running_there(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Two edits: the GPU's domain removed while a job ran on it, then a new domain for
    # that GPU. The new domain started empty, and a second job was placed on the GPU
    # the first still used (one slot, two jobs).
    paths.state_dir.mkdir(parents=True)
    unmanaged = BASE + "auto_domains = false\n"
    paths.config_file.write_text(unmanaged + "[domains.train]\ngpu = 1\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    running = await engine.submit({"command": ["sleep", "600"], "gpus": 1, "domain": "train"})
    assert running.status is JobStatus.RUNNING
    paths.config_file.write_text(unmanaged)
    assert (await engine.config_reload.reload())["applied"] is True
    paths.config_file.write_text(unmanaged + "[domains.again]\ngpu = 1\nslots = 1\n")
    result = await engine.config_reload.reload()
    assert result["applied"] is True and "GPU 1: domain train -> again" in result["changes"]
    again = engine.scheduler.domains["again"]
    assert list(again.holdings) == [running.id]
    second = await engine.submit({"command": ["true"], "gpus": 1, "domain": "again"})
    assert second.status is JobStatus.QUEUED  # the slot is the running job's
    assert (await engine.get(running.id)).domains == ["again"]
    await engine.cancel(running.id)
    assert (await engine.wait(second.id, timeout=10)).status is JobStatus.COMPLETED


async def test_renaming_a_gpu_domain_renames_it_in_an_adopted_jobs_reason_and_pins(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Batch jobs and services followed a rename; an adopted one said "adopted pid N on
    # gpu1" and "on gpu1" in its status ever after (tester h102).
    from .conftest import adopt

    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    stray = await asyncio.create_subprocess_exec("sleep", "600", start_new_session=True)
    try:
        job = await adopt(engine, stray.pid, domain="gpu1")
        assert job.message == f"adopted pid {stray.pid} on gpu1", job.message
        paths.config_file.write_text(BASE + "[domains.train]\ngpu = 1\nslots = 1\n")
        assert (await engine.config_reload.reload())["applied"] is True
        live = await engine.get(job.id)
        assert live.domains == ["train"]
        assert live.message == f"adopted pid {stray.pid} on train", live.message
        assert live.spec["domain"] == ["train"]
        with sqlite3.connect(paths.database) as db:
            stored = db.execute("SELECT spec FROM jobs WHERE id = ?", (job.id,)).fetchone()[0]
        assert json.loads(stored)["domain"] == ["train"]
    finally:
        stray.kill()
        await stray.wait()


async def test_renaming_a_gpu_domain_moves_a_running_services_replicas_too(
    make_engine: EngineFactory, paths: Paths
) -> None:
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()  # only the reload below: none later by the watcher
    service = await engine.submit(
        {"kind": "service", "command": ["sleep", "600"], "gpus": 1, "domain": "gpu1"}
    )
    await eventually(lambda: engine.book.get(service.id).job.replicas[0].pid)
    paths.config_file.write_text(BASE + "[domains.train]\ngpu = 1\n")
    assert (await engine.config_reload.reload())["applied"] is True
    live = await engine.get(service.id)
    assert live.domains == ["train"]
    assert [r.domains for r in live.replicas] == [["train"]]
    await engine.cancel(service.id)
    await engine.wait(service.id, timeout=10)
    assert not engine.scheduler.domains["train"].holdings


async def test_a_pinned_service_placed_again_after_its_domain_was_renamed_waits_for_it(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The service started pinned to gpu0; a reload renamed gpu0 to "train"; then its GPU
    # was lost and the service went back to the queue. Its old request made every
    # scheduling pass raise KeyError (HTTP 500, nothing started again); then it failed
    # "unknown domain 'gpu0'". Its pin follows the GPU now: it waits for "train".
    from gpulayer_tui.engine.simulate import SimLedger

    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()  # only the reload below: none later by the watcher
    service = await engine.submit(
        {"kind": "service", "command": ["sleep", "600"], "domain": "gpu0", "port": False}
    )
    await eventually(lambda: engine.book.get(service.id).job.status is JobStatus.RUNNING)
    paths.config_file.write_text(BASE + "[domains.train]\ngpu = 0\n")
    result = await engine.config_reload.reload()
    assert "GPU 0: domain gpu0 -> train" in result["changes"]
    SimLedger(paths.state_dir).set_gpu(0, lost=True, error="GPU is lost: fell off the bus")
    await engine.sampler.sample_once()
    await eventually(
        lambda: engine.book.get(service.id).job.message.startswith(
            "waiting for domain train quarantined"
        ),
        timeout=20,
    )
    assert (await engine.get(service.id)).spec["domain"] == "train"
    # Scheduling goes on: a new job starts on the GPU that is left, and sampling runs.
    other = await engine.submit({"command": ["sleep", "600"], "gpus": 1})
    assert other.status is JobStatus.RUNNING and other.domains == ["gpu1"]
    await engine.sampler.sample_once()
    assert engine.sampler.stalled() is None
    await engine.cancel(other.id)


async def test_a_quarantined_domain_removed_and_brought_back_warns_its_job_again(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Back under its quarantine, its running job said "running on gpu1" alone: the
    # quarantine's warning went with the "no longer in the configuration" one (h148).
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine(config=load_config(paths.config_file))
    await engine.config_reload.stop()  # (only the reloads below)
    job = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    SimLedger(paths.state_dir).set_gpu(1, lost=True, error="GPU is lost: fell off the bus")
    warned = "running on gpu1; warning: domain gpu1 quarantined: GPU is lost: fell off the bus"

    async def said() -> str:
        await engine.sampler.sample_once()
        return (await engine.get(job.id)).message

    assert await said() == warned
    paths.config_file.write_text(BASE + "auto_domains = false\n")
    assert (await engine.config_reload.reload())["applied"]
    assert "is no longer in the configuration" in await said()
    paths.config_file.write_text(BASE)
    assert (await engine.config_reload.reload())["applied"]
    assert engine.scheduler.domains["gpu1"].state is DomainState.QUARANTINED
    assert await said() == warned
    # Renamed, its message names the new name, in its warning too (h148)
    paths.config_file.write_text(BASE + "[domains.renamed]\ngpu = 1\n")
    assert (await engine.config_reload.reload())["applied"]
    assert (await engine.get(job.id)).message == warned.replace("gpu1", "renamed")
    await engine.cancel(job.id)


async def test_a_preempted_job_pinned_to_a_renamed_domain_waits_for_it_when_requeued(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The same hole for batch jobs: a preemptible job pinned to a domain a reload renamed
    # is requeued by preemption (it failed "can no longer run"); its pin followed the GPU.
    paths.state_dir.mkdir(parents=True)
    unmanaged = BASE + "auto_domains = false\n[scheduling]\npreempt_after = 0\n"
    paths.config_file.write_text(unmanaged + "[domains.train]\ngpu = 1\n[domains.other]\ngpu = 0\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()  # only the reload below: none later by the watcher
    victim = await engine.submit(
        {"command": ["sleep", "600"], "domain": "train", "preemptible": True}
    )
    assert victim.status is JobStatus.RUNNING
    renamed = "[domains.other]\ngpu = 0\n[domains.train2]\ngpu = 1\n"
    paths.config_file.write_text(unmanaged + renamed)
    assert (await engine.config_reload.reload())["applied"] is True
    urgent = await engine.submit({"command": ["sleep", "600"], "domain": "train2", "priority": 10})
    await eventually(lambda: engine.book.get(urgent.id).job.status is JobStatus.RUNNING, timeout=20)
    requeued = await engine.get(victim.id)
    assert requeued.status is JobStatus.QUEUED and requeued.spec["domain"] == "train2"
    await engine.cancel(urgent.id)
    await eventually(lambda: engine.book.get(victim.id).job.status is JobStatus.RUNNING, timeout=20)
    await engine.cancel(victim.id)


async def test_a_renamed_domain_is_stored_with_its_running_jobs_and_said_by_services(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The rename moved running jobs to the new name in memory only: an engine restarted
    # before their next change read the old name, found no such domain, and started a
    # second job on the GPU. A service's message still said "1/1 up on gpu1".
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()  # only the reload below: none later by the watcher
    running = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    service = await engine.submit(
        {"kind": "service", "command": ["sleep", "600"], "domain": "gpu0", "port": False}
    )
    await eventually(lambda: engine.book.get(service.id).job.message == "1/1 up on gpu0")
    paths.config_file.write_text(
        BASE + "[domains.train]\ngpu = 1\nslots = 1\n[domains.serve]\ngpu = 0\n"
    )
    assert (await engine.config_reload.reload())["applied"] is True
    assert (await engine.get(service.id)).message == "1/1 up on serve"
    await engine.stop()
    second = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    assert (await second.get(running.id)).domains == ["train"]
    assert set(second.scheduler.domains["train"].holdings) == {running.id}
    assert set(second.scheduler.domains["serve"].holdings) == {service.id}
    waiting = await second.submit({"command": ["true"], "domain": "train"})
    assert waiting.status is JobStatus.QUEUED  # its one slot is the running job's
    for job in (waiting, running, service):  # (the waiting one first: it would start)
        await second.cancel(job.id)


async def test_a_domain_renamed_while_no_engine_ran_keeps_its_running_jobs_held(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Renamed in the file while the engine was down: the restored jobs matched holds by
    # name only, held nothing, and a second job was started on the 1-slot GPU; a service
    # there stayed "up" on a lost GPU, never placed again.
    from gpulayer_tui.engine.simulate import SimLedger

    unmanaged = BASE + "auto_domains = false\n"
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(unmanaged + "[domains.train]\ngpu = 1\n[domains.serve]\ngpu = 0\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()
    running = await engine.submit({"command": ["sleep", "600"], "domain": "train"})
    service = await engine.submit(
        {"kind": "service", "command": ["sleep", "600"], "domain": "serve", "port": False}
    )
    await eventually(lambda: engine.book.get(service.id).job.message == "1/1 up on serve")
    await engine.stop()
    paths.config_file.write_text(
        unmanaged + "[domains.train2]\ngpu = 1\n[domains.serve2]\ngpu = 0\n"
    )
    second = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await second.config_reload.stop()
    restored = await second.get(running.id)
    assert restored.domains == ["train2"] and restored.message == "running on train2"
    assert (await second.get(service.id)).message == "1/1 up on serve2"  # (not on "serve")
    assert set(second.scheduler.domains["train2"].holdings) == {running.id}
    waiting = await second.submit({"command": ["true"], "domain": "train2"})
    assert waiting.status is JobStatus.QUEUED  # its one slot is the running job's
    assert set(second.scheduler.domains["serve2"].holdings) == {service.id}
    assert (await second.get(service.id)).spec["domain"] == "serve2"  # (its pin followed)
    SimLedger(paths.state_dir).set_gpu(0, lost=True, error="GPU is lost: fell off the bus")
    await second.sampler.sample_once()
    await eventually(  # (placed again: it waits for its GPU, pinned there under its name)
        lambda: second.book.get(service.id).job.message.startswith(
            "waiting for domain serve2 quarantined"
        ),
        timeout=20,
    )
    await second.cancel(service.id)
    await second.cancel(waiting.id)  # (first: it would start once the slot is free)
    await second.cancel(running.id)


async def test_a_gpu_left_without_a_domain_across_a_restart_keeps_its_running_job_held(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The GPU's domain removed while no engine ran: the restored job held nothing, so when
    # an edit gave the GPU a domain again it came back empty and a second job started on
    # the 1-slot GPU (and the first's memory read as unregistered).
    unmanaged = BASE + "auto_domains = false\n"
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()
    running = await engine.submit({"command": ["sleep", "600"], "domain": "b", "vram_gb": 20})
    assert running.status is JobStatus.RUNNING
    await engine.stop()
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n")
    second = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await second.config_reload.stop()
    assert (await second.get(running.id)).status is JobStatus.RUNNING
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.c]\ngpu = 1\n")
    result = await second.config_reload.reload()
    assert result["applied"] is True and "GPU 1: domain b -> c" in result["changes"]
    assert set(second.scheduler.domains["c"].holdings) == {running.id}
    waiting = await second.submit({"command": ["true"], "domain": "c"})
    assert waiting.status is JobStatus.QUEUED  # its one slot is the running job's
    assert (await second.get(running.id)).domains == ["c"]
    await second.cancel(running.id)
    assert (await second.wait(waiting.id, timeout=20)).status is JobStatus.COMPLETED
    assert not second.scheduler.retired  # (nothing runs there any more)


async def test_gpus_shows_memory_declared_beyond_use_so_the_parts_add_up(
    make_engine: EngineFactory, sleepers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    # A job using 10 of the 50 GiB it declared: USED/TOTAL 30.0/80.0, JOBS 10.0 and FREE
    # 10.0; 40 GiB showed nowhere but in --json (tester h45).
    engine = await make_engine("1xA100-80GB")
    job = await engine.submit({"command": ["sleep", "60"], "vram_gb": 50})
    await eventually(lambda: engine.book.get(job.id).job.pid is not None)  # type: ignore[union-attr]
    pid = engine.book.get(job.id).job.pid  # type: ignore[union-attr]
    SimLedger(engine.paths.state_dir).hold(0, pid, 10.0)
    await engine.sampler.sample_once()
    shown = format_gpus(dict(engine.gpus())).splitlines()
    line = next(line for line in shown if line.startswith("gpu0"))

    def column(name: str) -> str:  # (right-aligned figures end where their heading does)
        end = shown[0].index(name) + len(name)
        return line[:end].split()[-1]

    assert (column("JOBS"), column("RESERVED"), column("FREE")) == ("10.0", "40.0", "30.0"), shown
    await engine.cancel(job.id)


async def test_memory_on_a_gpu_without_a_domain_is_listed_with_its_processes(
    make_engine: EngineFactory, sleepers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    # `gpus` showed such a GPU's used memory but no process, and empty JOBS and UNREG
    # columns: 20 GiB held by someone, and nobody named.
    config = make_config(engine={"auto_domains": False}, domains={"train": {"gpu": 0}})
    engine = await make_engine("2xA100-80GB", config=config)
    stray = sleepers()
    SimLedger(engine.paths.state_dir).hold(1, stray.pid, 20.0)
    await engine.sampler.sample_once()
    shown = format_gpus(dict(engine.gpus())).splitlines()
    row = next(line.split() for line in shown if line.startswith("-"))
    # USED/TOTAL, JOBS (none of its jobs), UNREG (the stray's), FREE, STATE
    assert row[1] == "1" and row[-6:] == ["20.0/80.0", "0.0", "20.0", "60.0", "no", "domain"]
    assert "unregistered VRAM: 0.0 GiB (and 20.0 GiB held by processes of no job on GPUs " in (
        "\n".join(shown)
    )
    listed = next(line for line in shown if line.startswith(str(stray.pid)))
    assert "gpu 1 (no domain)" in listed and "20.0" in listed


async def test_doctor_names_a_job_waiting_for_a_gpu_the_driver_no_longer_lists(
    make_engine: EngineFactory,
) -> None:
    # It said "queued jobs ok: 0 ready to run, all placeable" (tester h44).
    first = await make_engine("2xA100-80GB")
    await first.pause()  # (kept across the restart: resumed once gpu1 is gone)
    pinned = await first.submit({"command": ["true"], "domain": "gpu1"})
    await first.stop()
    second = await make_engine("1xA100-80GB")
    await second.resume()
    waiting = await second.get(pinned.id)
    assert waiting.status is JobStatus.QUEUED
    assert waiting.message == "waiting for GPU 1 (gpu1): not found by the driver"
    checks = {c["check"]: c for c in await second.doctor_checks()}
    assert checks["queued jobs"] == {
        "check": "queued jobs",
        "status": "warn",
        # (not "0 wait for a free place (nothing else); 1 wait for ...": tester h169)
        "detail": "1 waits for capacity that is not "
        "there now: job "
        f"{pinned.id} (waiting for GPU 1 (gpu1): not found by the driver)",
    }
    await second.cancel(pinned.id)


async def test_a_gpu_missing_after_a_restart_is_waited_for_until_it_is_forgotten(
    make_engine: EngineFactory,
) -> None:
    # Queued for 2 GPUs, restarted on 1: the job failed over_capacity at start, though the
    # GPU may come back (one that did not come up after a reboot) (tester h44).
    first = await make_engine("2xA100-80GB")
    await first.pause()  # (kept across the restarts)
    both = await first.submit({"command": ["true"], "gpus": 2})
    await first.stop()
    second = await make_engine("1xA100-80GB")
    waiting = await second.get(both.id)
    assert waiting.status is JobStatus.QUEUED
    assert waiting.message == (
        "waiting for the GPU of gpu1: not found by the driver (1 here, 1 missing; "
        "`gpulayer-tui domain forget gpu1` if removed for good)"
    ), waiting.message
    later = await second.submit({"command": ["true"], "gpus": 2})
    assert later.status is JobStatus.QUEUED  # (a new one too: it may come back)
    three = await second.submit({"command": ["true"], "gpus": 3})
    assert three.status is JobStatus.FAILED and three.message == (
        "requested 3 GPUs, but this machine has 1"
    )
    missing = second.gpus()["missing_gpus"]
    assert [m["name"] for m in missing] == ["gpu1"] and missing[0]["gpu_uuid"].startswith("GPU-")
    shown = format_gpus(dict(second.gpus()))
    assert "not found by the driver: the GPU of gpu1 (GPU-" in shown, shown
    checks = {c["check"]: c for c in await second.doctor_checks()}
    assert checks["GPU of gpu1"]["status"] == "warn"
    waits = checks["queued jobs"]["detail"]  # (paused: it said "none waits": tester h47)
    assert waits.startswith("2 wait: the queue has been paused"), waits
    assert f"; 2 of them wait for capacity that is not there now: job {both.id} (" in waits
    await second.stop()

    back = await make_engine("2xA100-80GB")  # it came back: the job runs
    await back.resume()
    done = await back.wait(both.id, timeout=30)
    assert done.status is JobStatus.COMPLETED, done.message
    assert (await back.wait(later.id, timeout=30)).status is JobStatus.COMPLETED
    await back.pause()
    pinned = await back.submit({"command": ["true"], "domain": "gpu1"})
    await back.stop()

    again = await make_engine("1xA100-80GB")  # gone again, for good this time
    queued = await again.submit({"command": ["true"], "gpus": 2})
    assert queued.status is JobStatus.QUEUED
    assert (await again.get(pinned.id)).status is JobStatus.QUEUED  # (waits for the GPU)
    with pytest.raises(SpecError, match=r"domain 'gpu1': its GPU \(GPU-.*\) is not found"):
        await again.submit({"command": ["true"], "domain": "gpu1"})
    with pytest.raises(DomainRefused, match="domain cpu is the CPU pool"):
        await again.domain_ops.forget("cpu")
    with pytest.raises(SpecError, match=r"no missing GPU goes by 'x\\x1b\[31m' \("):
        await again.domain_ops.forget("x\x1b[31m")  # (escaped once: it was twice)
    with pytest.raises(DomainRefused, match="gpu0's GPU is listed by the driver"):
        await again.domain_ops.forget("gpu0")
    with pytest.raises(SpecError, match=r"no missing GPU goes by 'gpu7' \(missing now: gpu1\)"):
        await again.domain_ops.forget("gpu7")
    forgotten = await again.domain_ops.forget("gpu1")
    assert forgotten["name"] == "gpu1"
    failed = await again.get(queued.id)
    assert failed.status is JobStatus.FAILED
    assert failed.termination_reason is TerminationReason.OVER_CAPACITY
    assert failed.message == "requested 2 GPUs, but this machine has 1", failed.message
    # A job pinned to it is decided again too: it waited for good (tester h48).
    gone = await again.get(pinned.id)
    assert gone.status is JobStatus.FAILED, gone.message
    # (saying what happened: "unknown domain 'gpu1'" said nothing of it: tester h148)
    assert "domain 'gpu1': its GPU (GPU-" in gone.message, gone.message
    assert "was forgotten (`gpulayer-tui domain forget`)" in gone.message, gone.message
    assert again.gpus()["missing_gpus"] == []
    await again.stop()
    last = await make_engine("1xA100-80GB")  # (forgotten for good: not waited for again)
    refused = await last.submit({"command": ["true"], "gpus": 2})
    assert refused.status is JobStatus.FAILED and last.gpus()["missing_gpus"] == []


async def test_a_job_only_a_missing_larger_gpu_could_hold_waits_for_it(
    make_engine: EngineFactory,
) -> None:
    # 60 GiB queued on an L4 + A100 machine restarted without the A100: it failed against
    # the L4 left (tester h48); the A100's size is remembered with it.
    first = await make_engine("1xL4-24GB,1xA100-80GB")
    await first.pause()
    big = await first.submit({"command": ["true"], "vram_gb": 60})
    await first.stop()
    second = await make_engine("1xL4-24GB")
    waiting = await second.get(big.id)
    assert waiting.status is JobStatus.QUEUED
    assert waiting.message.startswith("waiting for the GPU of gpu1: not found by the driver")
    again = await second.submit({"command": ["true"], "vram_gb": 60})
    assert again.status is JobStatus.QUEUED
    huge = await second.submit({"command": ["true"], "vram_gb": 100})  # (no GPU ever had it)
    assert huge.status is JobStatus.FAILED
    assert huge.message == "requested 100 GiB per GPU, but gpu0 (Simulated L4) has 24 GiB"
    await second.domain_ops.forget("gpu1")
    assert (await second.get(big.id)).status is JobStatus.FAILED


async def test_a_gpu_the_config_names_is_not_forgotten_and_an_edit_may_name_it(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Forgotten while [domains.train] named it, the next engine took the domain for a
    # typo and did not start; and an edit naming a GPU this machine had was refused while
    # the same file was taken at the next start (tester h48).
    paths.state_dir.mkdir(parents=True)
    named = BASE + "[domains.dev]\ngpu = 0\n[domains.train]\ngpu = 1\n"
    paths.config_file.write_text(named)
    first = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await first.stop()
    second = await make_engine("1xA100-80GB", config=load_config(paths.config_file))
    await second.config_reload.stop()  # (applied by hand below, not by the watcher)
    with pytest.raises(DomainRefused, match=r"\[domains.train\] in config.toml\): take that"):
        await second.domain_ops.forget("train")
    paths.config_file.write_text(BASE + "[domains.dev]\ngpu = 0\n[domains.big]\ngpu = 1\n")
    result = await second.config_reload.reload()
    assert result["applied"] is True, result
    paths.config_file.write_text(BASE + "[domains.dev]\ngpu = 0\n[domains.big]\ngpu = 7\n")
    typo = await second.config_reload.reload()  # (a GPU never seen here: a typo)
    assert typo["applied"] is False and "gpu 7 does not exist" in str(typo), typo


def test_domain_forget_from_the_command_line(served: Served) -> None:
    served.start("--simulate", "2xA100-80GB")
    # (a job still running on the GPU forgotten is said: forgotten, the GPU went on
    # showing in `gpus` with the job, and nothing said why: tester h148)
    running = served.cli("submit", "--domain", "gpu1", "--", "sleep", "600").stdout.strip()
    wait_for(lambda: "running" in served.cli("status", running).stdout)
    served.stop()
    served.start("--simulate", "1xA100-80GB")
    shown = served.cli("gpus")
    assert "not found by the driver: the GPU of gpu1" in shown.stdout, shown.stdout
    # (listed as missing, as gpus, drain and doctor say it: "unknown domain" was said of
    # a domain made automatically: tester h148)
    one = served.cli("domain", "list", "gpu1")
    assert one.returncode == 1 and "domain 'gpu1': its GPU (GPU-" in one.stderr, one.stderr
    assert "domain forget gpu1" in served.cli("domain", "list").stderr
    refused = served.cli("domain", "forget", "gpu0")
    assert refused.returncode == 1 and "gpu0's GPU is listed by the driver" in refused.stderr
    unknown = served.cli("domain", "forget", "gpu5")
    assert unknown.returncode == 2 and "no missing GPU goes by 'gpu5'" in unknown.stderr
    forgot = served.cli("domain", "forget", "gpu1")
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.startswith("forgot the GPU of gpu1 (GPU-"), forgot.stdout
    assert forgot.stdout.endswith(
        f"were decided again\n  job {running} was running on it and still runs: left to end "
        "by itself (cancel stops it now); `gpus` lists the GPU until it ends\n"
    ), forgot.stdout
    assert "not found by the driver" in served.cli("gpus").stdout
    assert served.cli("cancel", running).returncode == 0
    wait_for(lambda: "not found by the driver" not in served.cli("gpus").stdout)
    gone = served.cli("domain", "list", "gpu1")
    assert gone.returncode == 2 and "unknown domain 'gpu1'" in gone.stderr


def test_a_configured_domain_whose_gpu_is_missing_is_listed_as_missing(served: Served) -> None:
    # `domain list big` called it "unknown domain", exit 2, while drain and doctor said
    # its GPU was not found (tester h102).
    served.home.mkdir(parents=True, exist_ok=True)
    (served.home / "config.toml").write_text("[domains.big]\ngpu = 1\n")
    served.start("--simulate", "2xA100-80GB")
    served.stop()
    served.start("--simulate", "1xA100-80GB")
    said = "domain 'big': its GPU 1 is not found by the driver (the domain is left out until it is)"
    one = served.cli("domain", "list", "big")
    assert one.returncode == 1 and one.stderr == f"gpulayer-tui: {said}\n", one.stderr
    every = served.cli("domain", "list")
    assert every.returncode == 0 and "gpu0" in every.stdout
    assert every.stderr == f"gpulayer-tui: {said}\n", every.stderr
    typo = served.cli("domain", "list", "bigg")
    assert typo.returncode == 2 and "unknown domain 'bigg'" in typo.stderr


async def test_a_gpu_gone_across_a_restart_with_a_job_still_there_is_said_everywhere(
    make_engine: EngineFactory,
) -> None:
    # The job ran on "gpu1" of a machine that now showed none: `gpus` left it out, doctor
    # passed and the engine said it was ready.
    first = await make_engine("2xA100-80GB")
    running = await first.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    assert running.status is JobStatus.RUNNING
    await first.stop()
    second = await make_engine("1xA100-80GB")
    assert (await second.get(running.id)).status is JobStatus.RUNNING
    view = second.gpus()
    gone = [g for g in view.get("gpus_without_domain", []) if g.get("missing")]
    assert [(g["gpu_index"], g["jobs"]) for g in gone] == [(1, [running.id])]
    # Its row names the domain it was and its UUID (it said "-" and "?")
    row = next(line for line in format_gpus(dict(view)).splitlines() if "missing" in line)
    assert row.startswith("(gpu1) ") and (gone[0]["gpu_uuid"] or "?") in row, row
    assert f"missing: not found by the driver (still running: job {running.id})" in row
    # The job says so too (it said "running on gpu1", as if all were well).
    await second.sampler.sample_once()
    warned = (await second.get(running.id)).message
    assert warned == "running on gpu1; warning: GPU 1 is not found by the driver", warned
    said = f"not found by the driver; job {running.id} still runs there"
    ready, why = second.domain_ops.readiness()
    assert not ready and f"GPU 1 {said}" in why
    checks = {c["check"]: c for c in await second.doctor_checks()}
    assert checks["GPU 1"] == {"check": "GPU 1", "status": "fail", "detail": said}
    # Once it ends, no job is there; the GPU is still missing (it may come back) until it
    # is forgotten.
    await second.cancel(running.id)
    await second.wait(running.id, timeout=20)
    assert not second.gpus().get("gpus_without_domain")
    ready, why = second.domain_ops.readiness()
    assert not ready and why == "GPU of gpu1 is not found by the driver", why
    await second.domain_ops.forget("gpu1")
    assert second.domain_ops.readiness() == (True, "every domain is ready")


async def test_a_job_s_warning_that_its_gpu_is_missing_goes_when_the_gpu_is_back(
    make_engine: EngineFactory,
) -> None:
    first = await make_engine("2xA100-80GB")
    running = await first.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    await first.stop()
    second = await make_engine("1xA100-80GB")
    await second.sampler.sample_once()
    assert "warning: GPU 1 is not found" in (await second.get(running.id)).message
    await second.stop()
    back = await make_engine("2xA100-80GB")
    await back.sampler.sample_once()
    assert (await back.get(running.id)).message == "running on gpu1"
    await back.cancel(running.id)


async def test_a_service_on_a_gpu_gone_across_a_restart_says_so_until_it_is_back(
    make_engine: EngineFactory,
) -> None:
    # Batch jobs there said "warning: GPU 1 is not found by the driver"; a service said
    # "1/1 up on gpu1", all well (tester h58), through every replica change.
    first = await make_engine("2xA100-80GB")
    svc = await first.submit(
        {"kind": "service", "command": ["sleep", "600"], "port": False, "domain": "gpu1"}
    )
    await eventually(lambda: first.book.get(svc.id).job.message == "1/1 up on gpu1")
    await first.stop()
    second = await make_engine("1xA100-80GB")
    await second.sampler.sample_once()
    warned = (await second.get(svc.id)).message
    assert warned == "1/1 up on gpu1; warning: GPU 1 is not found by the driver", warned
    await second.sampler.sample_once()  # (said once: the same words are not set again)
    said = [e for e in await second.events_of(svc.id) if "warning: GPU 1" in e["message"]]
    assert len(said) <= 1, said
    await second.stop()
    back = await make_engine("2xA100-80GB")
    await back.sampler.sample_once()
    assert (await back.get(svc.id)).message == "1/1 up on gpu1"
    await back.cancel(svc.id)
    await back.wait(svc.id, timeout=20)


async def test_a_domain_renamed_while_no_engine_ran_takes_its_waiting_jobs_along(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Running jobs followed their GPU; the ones waiting for it failed "unknown domain"
    # (only a drained or quarantined GPU's name was stored with it).
    unmanaged = BASE + "auto_domains = false\n"
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()
    running = await engine.submit({"command": ["sleep", "600"], "domain": "a"})
    one = await engine.submit({"command": ["true"], "domain": "a"})
    both = await engine.submit({"command": ["true"], "gpus": 2, "domain": ["a", "b"]})
    assert one.status is both.status is JobStatus.QUEUED
    await engine.stop()
    paths.config_file.write_text(unmanaged + "[domains.a2]\ngpu = 0\n[domains.b]\ngpu = 1\n")
    second = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await second.config_reload.stop()
    assert (await second.get(running.id)).domains == ["a2"]
    assert (await second.get(one.id)).spec["domain"] == "a2"
    assert (await second.get(both.id)).spec["domain"] == ["a2", "b"]
    edits = [e for e in await second.events_of(one.id) if e["kind"] == "job.edited"]
    assert edits[-1]["message"] == "edited: pinned domain renamed with its GPU (a -> a2)"
    await second.cancel(running.id)
    for job in (one, both):
        assert (await second.wait(job.id, timeout=20)).status is JobStatus.COMPLETED
    # Stored: a third engine reads the edited spec, nothing to follow any more.
    with sqlite3.connect(paths.database) as db:
        stored = db.execute("SELECT spec FROM jobs WHERE id = ?", (both.id,)).fetchone()[0]
    assert json.loads(stored)["domain"] == ["a2", "b"]


@pytest.mark.parametrize("when", ["live", "while stopped"])
async def test_names_shifted_between_gpus_keep_each_waiting_job_on_its_gpu(
    make_engine: EngineFactory, paths: Paths, when: str
) -> None:
    # a -> b, b -> c: the job waiting for GPU 1 (pinned "b") stayed "b", now GPU 0's name,
    # while the job running on GPU 1 moved to "c".
    unmanaged = BASE + "auto_domains = false\n"
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()
    running = [await engine.submit({"command": ["sleep", "600"], "domain": d}) for d in "ab"]
    waiting = [await engine.submit({"command": ["true"], "domain": d}) for d in "ab"]
    shifted = unmanaged + "[domains.b]\ngpu = 0\n[domains.c]\ngpu = 1\n"
    paths.config_file.write_text(shifted)
    if when == "live":
        assert (await engine.config_reload.reload())["applied"]
    else:
        await engine.stop()
        engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
        await engine.config_reload.stop()
    assert [(await engine.get(j.id)).domains for j in running] == [["b"], ["c"]]
    assert [(await engine.get(j.id)).spec["domain"] for j in waiting] == ["b", "c"]
    await engine.cancel(running[1].id)  # (GPU 1 frees: its waiting job starts there)
    done = await engine.wait(waiting[1].id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.gpus == [1]
    await engine.cancel(running[0].id)


async def test_a_drained_gpu_stays_drained_under_its_new_name_across_restarts(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The state was stored by name: a domain renamed live came back in service after a
    # restart, and the old names kept their states (revived once a domain took the name).
    unmanaged = BASE.replace("[engine]\n", "[engine]\nauto_domains = false\n")

    def states(engine: object) -> dict[str, tuple[str, str]]:
        doms = engine.scheduler.domains  # type: ignore[attr-defined]
        return {n: (d.state.value, d.state_reason) for n, d in doms.items() if d.is_gpu}

    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(unmanaged + "[domains.alpha]\ngpu = 0\n[domains.beta]\ngpu = 1\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()
    await engine.domain_ops.drain("beta", "bad fan")
    paths.config_file.write_text(unmanaged + "[domains.alpha]\ngpu = 0\n[domains.gamma]\ngpu = 1\n")
    assert (await engine.config_reload.reload())["applied"]
    assert states(engine)["gamma"] == ("draining", "bad fan")
    await engine.stop()
    second = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await second.config_reload.stop()
    assert states(second) == {"alpha": ("in_service", ""), "gamma": ("draining", "bad fan")}
    # The names swapped live: each GPU keeps its own state, and so after a restart.
    paths.config_file.write_text(unmanaged + "[domains.gamma]\ngpu = 0\n[domains.alpha]\ngpu = 1\n")
    assert (await second.config_reload.reload())["applied"]
    assert states(second) == {"gamma": ("in_service", ""), "alpha": ("draining", "bad fan")}
    await second.stop()
    # Renamed while no engine ran: found by its GPU, not by a name another GPU now has.
    paths.config_file.write_text(unmanaged + "[domains.alpha]\ngpu = 0\n[domains.delta]\ngpu = 1\n")
    third = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await third.config_reload.stop()
    assert states(third) == {"alpha": ("in_service", ""), "delta": ("draining", "bad fan")}
    await third.stop()
    with sqlite3.connect(paths.database) as db:
        rows = db.execute("SELECT name, state FROM domain_state ORDER BY name").fetchall()
    assert [r for r in rows if r[1] != "in_service"] == [("delta", "draining")]


async def test_a_shorter_sample_interval_takes_effect_at_once(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The sampler slept out the old interval first: lowered from 120 s, the engine went
    # unsampled (and answered "not ready") for up to two minutes.
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text("[engine]\nsample_interval = 120\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()
    first = engine.sampler.latest
    assert first is not None
    paths.config_file.write_text("[engine]\nsample_interval = 0.2\n")
    assert (await engine.config_reload.reload())["applied"]
    # Two new samples: the one the change asked for, and one on the new interval.
    seen: set[float] = set()

    def sampled_twice() -> bool:
        latest = engine.sampler.latest
        if latest is not None and latest.taken_at > first.taken_at:
            seen.add(latest.taken_at)
        return len(seen) >= 2

    await eventually(sampled_twice, timeout=10)


WORK = BASE + "[domains.work]\ngpu = 0\nslots = 1\n"


async def _watched_work_domain(make_engine: EngineFactory, paths: Paths) -> tuple[Any, Any, Any]:
    """An engine whose config file gives GPU 0 the 1-slot domain ``work``, a job running
    there and one waiting for it; returned once its watcher has applied an edit."""
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(WORK)
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    running = await engine.submit({"command": ["sleep", "600"], "domain": "work"})
    waiting = await engine.submit({"command": ["true"], "domain": "work"})
    assert waiting.status is JobStatus.QUEUED

    def watched() -> bool:  # (an edit seen: the watcher, started after the engine, runs)
        if engine.scheduler.domains["cpu"].slots == 3:
            return True
        paths.config_file.write_text(WORK + "[cpu]\nslots = 3\n")
        return False

    await eventually(watched, timeout=15, interval=1.0)  # (> reload.SETTLE_S: each write settles)
    return engine, running, waiting


async def test_a_job_on_a_gpu_whose_domain_was_removed_still_counts_against_limits(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Its GPUs counted nothing once their domains were gone: max_gpus was passed, and
    # the user's fair-share hours went down while the job ran (tester h59).
    paths.state_dir.mkdir(parents=True)
    limited = BASE + "auto_domains = false\n[users.default]\nmax_gpus = 3\n"
    both = "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n[domains.c]\ngpu = 2\n"
    paths.config_file.write_text(limited + both)
    engine = await make_engine("3xA100-80GB", config=load_config(paths.config_file))
    running = await engine.submit({"command": ["sleep", "600"], "gpus": 2, "domain": ["a", "b"]})
    assert running.status is JobStatus.RUNNING
    before = engine.queue.running_by_user(time.time())
    paths.config_file.write_text(limited + "[domains.c]\ngpu = 2\n")  # (a and b removed)
    assert (await engine.config_reload.reload())["applied"] is True
    after = engine.queue.running_by_user(time.time())
    assert [h.gpus for h in after.values()] == [h.gpus for h in before.values()] == [2]
    paths.config_file.write_text(limited.replace("3", "2") + "[domains.c]\ngpu = 2\n")
    assert (await engine.config_reload.reload())["applied"] is True
    more = await engine.submit({"command": ["true"], "gpus": 1})
    assert more.status is JobStatus.QUEUED, more.message  # (2 held, at most 2)
    assert "limit: 2 GPUs running at once" in more.message, more.message
    await engine.cancel(running.id)
    assert (await engine.wait(more.id, timeout=20)).status is JobStatus.COMPLETED


async def test_a_removed_config_file_keeps_the_running_configuration(
    make_engine: EngineFactory, paths: Paths, caplog: pytest.LogCaptureFixture
) -> None:
    # Moved away and back (a save), or removed a moment: the defaults were applied, the
    # configured domain vanished and a waiting job pinned to it failed for good.
    caplog.set_level(logging.WARNING, "gpulayer_tui.engine.reload")
    engine, running, waiting = await _watched_work_domain(make_engine, paths)
    aside = paths.config_file.with_name("config.toml~")
    paths.config_file.rename(aside)
    await eventually(lambda: "was removed: the running configuration stays" in caplog.text)
    assert "work" in engine.scheduler.domains
    assert engine.book.get(waiting.id).job.status is JobStatus.QUEUED
    aside.rename(paths.config_file)
    # A link to itself in its place is said as one (it read "was removed", and doctor
    # "absent"; tester h59).
    paths.config_file.rename(aside)
    paths.config_file.symlink_to(paths.config_file.name)
    said = "is a symbolic link that loops (no file at its end): the running configuration"
    await eventually(lambda: said in caplog.text)
    checks = {c["check"]: c for c in await engine.doctor_checks()}
    assert checks["config"]["status"] == "warn"
    assert "is a symbolic link that loops" in checks["config"]["detail"]
    paths.config_file.unlink()
    paths.config_file.symlink_to("nowhere.toml")
    await eventually(
        lambda: "is a symbolic link to nowhere.toml, which does not exist" in caplog.text
    )
    paths.config_file.unlink()
    aside.rename(paths.config_file)
    # Asked on purpose (SIGHUP, POST /v1/config/reload), its absence is applied.
    paths.config_file.unlink()
    await eventually(lambda: caplog.text.count("was removed") >= 2)
    assert (await engine.config_reload.reload())["applied"]
    assert "work" not in engine.scheduler.domains
    # (GPU 0's domain is "gpu0" by default: the jobs there and waiting for it follow)
    assert (await engine.get(running.id)).domains == ["gpu0"]
    assert (await engine.get(waiting.id)).spec["domain"] == "gpu0"
    await engine.cancel(running.id)
    assert (await engine.wait(waiting.id, timeout=10)).status is JobStatus.COMPLETED


async def test_a_save_held_up_between_truncating_and_writing_is_read_once_written(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The watcher read such a save in between and applied its empty file: the defaults,
    # for a moment (a waiting job pinned to a configured domain failed, and a user let in
    # by [security] had their open streams cut off).
    engine, running, waiting = await _watched_work_domain(make_engine, paths)
    with paths.config_file.open("w") as save:  # (truncated: empty for half a second)
        await asyncio.sleep(0.5)
        save.write(WORK + "[cpu]\nslots = 5\n")
    await eventually(lambda: engine.scheduler.domains["cpu"].slots == 5)
    changes = [c for e in _config_events(paths) for c in e.get("changes", [])]
    assert not [c for c in changes if "work" in str(c)], changes
    assert engine.book.get(waiting.id).job.status is JobStatus.QUEUED
    # Left empty, it is applied (the defaults), once it has stayed so a while.
    paths.config_file.write_text("")
    await eventually(lambda: "work" not in engine.scheduler.domains, timeout=10)
    await engine.cancel(running.id)


async def test_a_symlinked_config_is_followed_into_its_files_folder(
    make_engine: EngineFactory, paths: Paths, tmp_path: Path
) -> None:
    # (a dotfile manager's link: edits to the file it names were not seen, only SIGHUP)
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "gpulayer.toml"
    real.write_text(BASE + "[cpu]\nslots = 1\n")
    paths.state_dir.mkdir(parents=True)
    paths.config_file.symlink_to(real)
    engine = await make_engine(config=load_config(paths.config_file))

    def edited(file: Path, slots: int) -> bool:
        # Written until seen: the watcher starts (and starts again in a new folder) a
        # moment after the engine, and an edit before that is not an edit it sees.
        if engine.scheduler.domains["cpu"].slots == slots:
            return True
        file.write_text(BASE + f"[cpu]\nslots = {slots}\n")
        return False

    await eventually(
        lambda: edited(real, 3), timeout=15, interval=1.0
    )  # (> reload.SETTLE_S: each write settles)
    # Pointed at another file: that file's edits are followed from then on.
    other = tmp_path / "elsewhere" / "other.toml"
    other.parent.mkdir()
    other.write_text(BASE + "[cpu]\nslots = 4\n")
    paths.config_file.unlink()
    paths.config_file.symlink_to(other)
    await eventually(lambda: engine.scheduler.domains["cpu"].slots == 4, timeout=10)
    await eventually(
        lambda: edited(other, 5), timeout=15, interval=1.0
    )  # (> reload.SETTLE_S: each write settles)
    assert real.read_text().endswith("slots = 3\n")  # (the old file is not read again)


async def test_a_chain_of_symlinks_to_the_config_is_followed(
    make_engine: EngineFactory, paths: Paths, tmp_path: Path
) -> None:
    # config.toml -> links/current -> files/one.toml: re-pointing the middle link was not
    # seen, nor were edits to the file it named then.
    (tmp_path / "links").mkdir()
    (tmp_path / "files").mkdir()
    one, two = tmp_path / "files" / "one.toml", tmp_path / "files" / "two.toml"
    one.write_text(BASE + "[cpu]\nslots = 1\n")
    middle = tmp_path / "links" / "current"
    middle.symlink_to(one)
    paths.state_dir.mkdir(parents=True)
    paths.config_file.symlink_to(middle)
    engine = await make_engine(config=load_config(paths.config_file))

    def applied(slots: int, file: Path | None = None) -> bool:
        if engine.scheduler.domains["cpu"].slots == slots:
            return True
        if file is not None:  # (written until seen: the watcher starts after the engine)
            file.write_text(BASE + f"[cpu]\nslots = {slots}\n")
        return False

    await eventually(
        lambda: applied(2, one), timeout=15, interval=1.0
    )  # (> reload.SETTLE_S: each write settles)
    two.write_text(BASE + "[cpu]\nslots = 3\n")
    middle.unlink()
    middle.symlink_to(two)
    await eventually(lambda: applied(3), timeout=10)
    await eventually(
        lambda: applied(4, two), timeout=15, interval=1.0
    )  # (> reload.SETTLE_S: each write settles)


async def test_names_swapped_while_no_engine_ran_leave_running_jobs_on_their_gpus(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Both names still existed, so the restored job took the one it had: the other GPU.
    # Its own GPU looked free, and a second job was started on the 1-slot GPU.
    unmanaged = BASE + "auto_domains = false\n"
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n")
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await engine.config_reload.stop()
    running = await engine.submit({"command": ["sleep", "600"], "domain": "a"})
    assert running.gpus == [0]
    await engine.stop()
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 1\n[domains.b]\ngpu = 0\n")
    second = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    await second.config_reload.stop()
    restored = await second.get(running.id)
    assert (restored.domains, restored.gpus) == (["b"], [0])
    assert set(second.scheduler.domains["b"].holdings) == {running.id}
    assert not second.scheduler.domains["a"].holdings
    waiting = await second.submit({"command": ["true"], "domain": "b"})
    assert waiting.status is JobStatus.QUEUED  # (GPU 0's one slot is the running job's)
    await second.cancel(waiting.id)
    await second.cancel(running.id)


async def test_a_symlinked_folder_on_the_way_to_the_config_is_followed(
    make_engine: EngineFactory, paths: Paths, tmp_path: Path
) -> None:
    # config.toml -> conf/current/F.toml, conf/current -> rel1 (a release layout):
    # pointing "current" at rel2 was never seen.
    conf = tmp_path / "conf"
    for release, slots in (("rel1", 3), ("rel2", 7)):
        (conf / release).mkdir(parents=True)
        (conf / release / "F.toml").write_text(BASE + f"[cpu]\nslots = {slots}\n")
    (conf / "current").symlink_to("rel1")
    paths.state_dir.mkdir(parents=True)
    paths.config_file.symlink_to(conf / "current" / "F.toml")
    engine = await make_engine(config=load_config(paths.config_file))
    assert engine.scheduler.domains["cpu"].slots == 3

    def repointed() -> bool:  # (again until seen: the watcher starts after the engine)
        if engine.scheduler.domains["cpu"].slots == 7:
            return True
        fresh = conf / "current.new"
        fresh.unlink(missing_ok=True)
        fresh.symlink_to("rel2")
        fresh.rename(conf / "current")  # (as `ln -sfn` / `mv -T` do it)
        return False

    await eventually(repointed, timeout=15, interval=1.0)  # (> reload.SETTLE_S: each write settles)


async def test_a_folder_link_to_a_folder_link_on_the_way_is_followed(
    make_engine: EngineFactory, paths: Paths, tmp_path: Path
) -> None:
    # conf/current -> deep/cur -> v1: re-pointing deep/cur was never seen.
    deep = tmp_path / "conf" / "deep"
    for release, slots in (("v1", 3), ("v2", 5)):
        (deep / release).mkdir(parents=True)
        (deep / release / "F.toml").write_text(BASE + f"[cpu]\nslots = {slots}\n")
    (deep / "cur").symlink_to("v1")
    (tmp_path / "conf" / "current").symlink_to("deep/cur")
    paths.state_dir.mkdir(parents=True)
    paths.config_file.symlink_to(tmp_path / "conf" / "current" / "F.toml")
    engine = await make_engine(config=load_config(paths.config_file))
    assert engine.scheduler.domains["cpu"].slots == 3

    def repointed() -> bool:  # (again until seen: the watcher starts after the engine)
        if engine.scheduler.domains["cpu"].slots == 5:
            return True
        fresh = deep / "cur.new"
        fresh.unlink(missing_ok=True)
        fresh.symlink_to("v2")
        fresh.rename(deep / "cur")
        return False

    await eventually(repointed, timeout=15, interval=1.0)  # (> reload.SETTLE_S: each write settles)


async def _replica_pid(engine: Any, job_id: int) -> int:
    """Its replica's pid, once known (a --no-port replica is "up" as it is asked for)."""
    pid = await eventually(lambda: engine.book.get(job_id).job.replicas[0].pid, timeout=20)
    return int(pid)


@pytest.mark.parametrize("how", ["domain removed live", "GPU missing at restart"])
async def test_a_service_replica_is_never_restarted_where_nothing_is_scheduled(
    make_engine: EngineFactory, paths: Paths, how: str
) -> None:
    # Its replica was restarted in place: on a GPU the driver no longer lists, or one
    # whose domain the config had just removed (a batch job was refused there meanwhile).
    if how == "domain removed live":
        paths.state_dir.mkdir(parents=True)
        unmanaged = BASE + "auto_domains = false\n"
        paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n")
        engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
        service = await engine.submit(
            {"kind": "service", "command": ["sleep", "600"], "domain": ["a", "b"],
             "port": False, "gpus": 1}
        )  # fmt: skip
        await eventually(lambda: engine.book.get(service.id).job.message == "1/1 up on a")
        paths.config_file.write_text(unmanaged + "[domains.b]\ngpu = 1\n")
        result = await engine.config_reload.reload()
        assert result["applied"] is True and "domain a removed" in result["changes"]
        gone, moved_to = "domain a is no longer in the configuration", "b"
    else:
        first = await make_engine("2xA100-80GB")
        blocker = await first.submit({"command": ["sleep", "600"], "domain": "gpu0"})
        service = await first.submit(
            {"kind": "service", "command": ["sleep", "600"], "gpus": 1, "port": False}
        )
        await eventually(lambda: first.book.get(service.id).job.message == "1/1 up on gpu1")
        await first.stop()
        engine = await make_engine("1xA100-80GB")
        await engine.cancel(blocker.id)
        await engine.wait(blocker.id, timeout=20)
        gone, moved_to = "GPU 1 (gpu1) is not found by the driver", "gpu0"
    old = await _replica_pid(engine, service.id)
    os.kill(old, signal.SIGKILL)
    await eventually(
        lambda: engine.book.get(service.id).job.message == f"1/1 up on {moved_to}", timeout=20
    )
    timeline = " ".join(e.get("message", "") for e in await engine.store.job_events(service.id))
    assert f"placing again after {gone}" in timeline, timeline
    new = await _replica_pid(engine, service.id)
    environ = (await asyncio.to_thread(Path(f"/proc/{new}/environ").read_bytes)).split(b"\0")
    index = engine.scheduler.domains[moved_to].gpu_index
    assert f"CUDA_VISIBLE_DEVICES={index}".encode() in environ
    await engine.cancel(service.id)


async def test_waiting_jobs_pinned_to_a_gpu_gone_across_a_restart_wait_for_it(
    make_engine: EngineFactory,
) -> None:
    # They failed for good, "can no longer run on this machine: unknown domain 'gpu1'",
    # a job with a choice of gpu0 or gpu1 among them, while job 1 still ran on GPU 1.
    first = await make_engine("2xA100-80GB")
    running = await first.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    blocker = await first.submit({"command": ["sleep", "600"], "domain": "gpu0"})
    pinned = await first.submit({"command": ["true"], "domain": "gpu1"})
    choice = await first.submit({"command": ["true"], "domain": ["gpu0", "gpu1"], "gpus": 1})
    assert choice.status is JobStatus.QUEUED and pinned.status is JobStatus.QUEUED
    await first.stop()
    second = await make_engine("1xA100-80GB")
    waiting = await second.get(pinned.id)
    assert waiting.status is JobStatus.QUEUED, waiting.message
    assert waiting.message == "waiting for GPU 1 (gpu1): not found by the driver"
    # Its pins as they were, it can be edited: every edit was refused "not found by the
    # driver", even of its priority (tester h118); a bad value is told as itself.
    edited = await second.edit(pinned.id, {"priority": 3, "name": "renamed"})
    assert (edited.priority, edited.name, edited.status) == (3, "renamed", JobStatus.QUEUED)
    with pytest.raises(
        SpecError,
        match=r"unable to ever run: requested 500 GiB per GPU, but the GPU of gpu1 \(not found "
        r"by the driver now\) has 80 GiB",
    ):
        await second.edit(pinned.id, {"vram_gb": 500})
    assert (await second.get(choice.id)).status is JobStatus.QUEUED
    await second.cancel(blocker.id)
    done = await second.wait(choice.id, timeout=20)  # (on gpu0, the one left)
    assert done.status is JobStatus.COMPLETED and done.domains == ["gpu0"]
    await second.cancel(running.id)
    await second.wait(running.id, timeout=20)
    await second.stop()
    third = await make_engine("2xA100-80GB")  # the GPU is back
    assert (await third.wait(pinned.id, timeout=20)).status is JobStatus.COMPLETED


async def test_a_two_replica_service_keeps_running_when_a_domain_of_it_is_removed(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Any replica's exit after one of its domains was removed placed the whole service
    # again, which no longer fit: it failed over capacity, its healthy replica stopped.
    unmanaged = UNMANAGED
    engine = await _unmanaged(make_engine, paths)
    service = await engine.submit(
        {"kind": "service", "command": ["sleep", "600"], "gpus": 1, "replicas": 2,
         "port": False}
    )  # fmt: skip
    job = engine.book.get(service.id).job
    await eventually(lambda: all(r.pid for r in job.replicas), timeout=20)
    on = {r.domains[0]: r for r in job.replicas}
    paths.config_file.write_text(unmanaged + "[domains.b]\ngpu = 1\n")
    assert (await engine.config_reload.reload())["applied"] is True
    healthy_pid = on["b"].pid
    _kill(healthy_pid)  # (on b: it starts again where it ran)
    await eventually(lambda: on["b"].pid not in (None, healthy_pid), timeout=20)
    assert job.status is JobStatus.RUNNING
    _kill(on["a"].pid)  # (on a, removed: it waits, b runs on)
    await eventually(
        lambda: "not started again: domain a is no longer in the configuration" in on["a"].message,
        timeout=20,
    )
    assert on["a"].state is ReplicaState.BACKOFF
    assert job.status is JobStatus.RUNNING and on["b"].state is ReplicaState.UP
    # It waits on, each wait longer (2 s, then 4 s) ...
    await eventually(lambda: "(4 s back-off)" in on["a"].message, timeout=20)
    assert "restart #1 " in on["a"].message
    # Domain a is back: the replica starts there at once, not at its next back-off step.
    due = on["a"].next_restart_at or 0.0
    assert due > time.time() + 0.5, "its back-off runs out too soon for this test"
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n")
    assert (await engine.config_reload.reload())["applied"] is True
    await eventually(lambda: on["a"].state is ReplicaState.UP, timeout=20)
    assert (on["a"].started_at or 0) < due and on["a"].domains == ["a"]
    assert job.status is JobStatus.RUNNING and on["b"].state is ReplicaState.UP
    # ... but waiting out the removed domain was no crash: its next one backs off 2 s, the
    # step after its one crash (the waits had taken it to 8 s).
    await eventually(lambda: on["a"].pid is not None, timeout=20)
    _kill(on["a"].pid)
    await eventually(lambda: "restart #2 " in on["a"].message, timeout=20)
    assert "(2 s back-off)" in on["a"].message, on["a"].message
    await engine.cancel(service.id)


async def test_a_name_given_to_another_gpu_leaves_the_old_gpus_jobs_counted_there(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # a (GPU 0, job 1 running) renamed onto GPU 1 in one edit: GPU 0's job was counted
    # nowhere, and a domain for GPU 0 in the next edit started a job on top of it.
    unmanaged = UNMANAGED
    engine = await _unmanaged(make_engine, paths)
    first = await engine.submit({"command": ["sleep", "600"], "domain": "a"})
    assert first.gpus == [0]
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 1\n")
    said = await engine.config_reload.reload()
    assert said["applied"] is True
    assert "GPU 0: no domain now (a is another GPU's)" in said["changes"], said
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 1\n[domains.c]\ngpu = 0\n")
    assert (await engine.config_reload.reload())["applied"] is True
    c = engine.scheduler.domains["c"]
    assert set(c.holdings) == {first.id}
    second = await engine.submit({"command": ["sleep", "600"], "domain": "c"})
    assert second.status is JobStatus.QUEUED, second.message  # (GPU 0 is job 1's)
    assert (await engine.get(first.id)).domains == ["c"]
    await engine.cancel(second.id)
    await engine.cancel(first.id)


async def test_a_waiting_jobs_pin_keeps_its_gpu_when_a_removed_domains_name_is_reused(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # b (GPU 1, job 1 running) removed; a (GPU 0) renamed b; then c for GPU 1: the new b's
    # waiting job was moved to c, GPU 1, as the old b's running one was.
    unmanaged = UNMANAGED
    engine = await _unmanaged(make_engine, paths)
    on_b = await engine.submit({"command": ["sleep", "600"], "domain": "b"})
    on_a = await engine.submit({"command": ["sleep", "600"], "domain": "a"})
    waiting = await engine.submit({"command": ["sleep", "600"], "domain": "a"})
    assert waiting.status is JobStatus.QUEUED
    for text in (
        "[domains.a]\ngpu = 0\n",
        "[domains.b]\ngpu = 0\n",
        "[domains.b]\ngpu = 0\n[domains.c]\ngpu = 1\n",
    ):
        paths.config_file.write_text(unmanaged + text)
        assert (await engine.config_reload.reload())["applied"] is True
    assert (await engine.get(waiting.id)).spec["domain"] == "b"
    assert (await engine.get(on_a.id)).spec["domain"] == "b"
    assert (await engine.get(on_b.id)).spec["domain"] == "c"  # (it runs on GPU 1)
    await engine.cancel(on_a.id)
    await eventually(
        lambda: engine.book.get(waiting.id).job.status is JobStatus.RUNNING,  # type: ignore[union-attr]
        timeout=20,
    )
    assert engine.book.get(waiting.id).job.gpus == [0]  # type: ignore[union-attr]
    await engine.cancel(waiting.id)
    await engine.cancel(on_b.id)


async def test_a_domain_put_back_under_its_own_name_is_no_rename(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # "GPU 1: domain b -> b", and every job pinned to b got an edit "renamed (b -> b)".
    paths.state_dir.mkdir(parents=True)
    unmanaged = BASE + "auto_domains = false\n"
    both = unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n"
    paths.config_file.write_text(both)
    engine = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    job = await engine.submit({"command": ["sleep", "600"], "domain": "b"})
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n")
    assert (await engine.config_reload.reload())["applied"] is True
    paths.config_file.write_text(both)
    said = await engine.config_reload.reload()
    assert said["changes"] == ["domain b back (GPU 1)"], said
    assert not [e for e in await engine.events_of(job.id) if e["kind"] == "job.edited"]
    assert set(engine.scheduler.domains["b"].holdings) == {job.id}
    await engine.cancel(job.id)


async def test_a_drain_and_a_failure_count_follow_the_gpu_out_of_the_config_and_back(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Taken out of the config with nothing running and put back (under any name), a drained
    # or quarantined GPU was in service again, and a rename reset its count of jobs that
    # failed with a device error.
    unmanaged = UNMANAGED
    engine = await _unmanaged(make_engine, paths)
    await engine.domain_ops.drain("a", "fan")
    engine.scheduler.domains["b"].launch_failures = 2
    paths.config_file.write_text(unmanaged)
    assert (await engine.config_reload.reload())["applied"] is True
    paths.config_file.write_text(unmanaged + "[domains.c]\ngpu = 0\n[domains.d]\ngpu = 1\n")
    assert (await engine.config_reload.reload())["applied"] is True
    c, d = engine.scheduler.domains["c"], engine.scheduler.domains["d"]
    assert c.state is DomainState.DRAINING and "fan" in c.state_reason
    assert d.launch_failures == 2
    job = await engine.submit({"command": ["true"], "domain": "c"})
    assert job.status is JobStatus.QUEUED and "draining" in job.message
    await engine.domain_ops.release("c")
    assert (await engine.wait(job.id, timeout=20)).status is JobStatus.COMPLETED


async def test_a_named_domain_whose_gpu_did_not_come_up_is_left_out_not_refused(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The engine refused to start at all ("domains.big: gpu 1 does not exist"): the jobs
    # running there, their timeouts and dependents went unmanaged. (A GPU never seen
    # here is still a typo, refused: test_serve_cli.)
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE + "[domains.big]\ngpu = 1\n")
    first = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    running = await first.submit({"command": ["sleep", "600"], "domain": "big"})
    waiting = await first.submit({"command": ["true"], "domain": "big"})
    assert waiting.status is JobStatus.QUEUED
    await first.stop()
    second = await make_engine("1xA100-80GB", config=load_config(paths.config_file))
    assert "big" not in second.scheduler.domains
    assert (await second.get(running.id)).status is JobStatus.RUNNING
    said = (await second.get(waiting.id)).message
    assert said == "waiting for GPU 1 (big): not found by the driver", said
    ready, why = second.domain_ops.readiness()
    assert not ready and "domain big: GPU 1 is not found by the driver" in why
    checks = {c["check"]: c for c in await second.domain_ops.doctor_checks()}
    assert checks["domain big"]["status"] == "fail"
    # A new job pinned to it waits too (it was refused: "unknown domain 'big'"); a drain
    # or an adoption there is told why it cannot be done now.
    later = await second.submit({"command": ["true"], "domain": "big"})
    assert later.status is JobStatus.QUEUED
    assert later.message == "waiting for GPU 1 (big): not found by the driver", later.message
    gone = "domain 'big': its GPU 1 is not found by the driver (the domain is left out"
    with pytest.raises(SpecError, match=re.escape(gone)):
        await second.domain_ops.drain("big", "")
    with pytest.raises(SpecError, match=re.escape(gone)):
        await second.adopt({"pid": os.getpid(), "domain": ["big"]})  # type: ignore[typeddict-item]
    with pytest.raises(SpecError, match="unknown domain 'bigg'"):
        await second.submit({"command": ["true"], "domain": "bigg"})  # (a typo stays one)
    await second.cancel(later.id)
    # An edit while it is still gone is not refused for it.
    paths.config_file.write_text(BASE + "[domains.big]\ngpu = 1\n[cpu]\nslots = 3\n")
    assert (await second.config_reload.reload())["applied"] is True
    # ... but a GPU named anew that is not there is.
    paths.config_file.write_text(BASE + "[domains.big]\ngpu = 1\n[domains.x]\ngpu = 7\n")
    refused = await second.config_reload.reload()
    assert refused["applied"] is False and "domains.x: gpu 7 does not exist" in refused["error"]
    # Its table taken out (the first step before `domain forget`): the job waiting for it
    # fails, saying so, and so does the change ("nothing changed", and the job was told
    # "jobs queued for it before wait for it": tester h102).
    paths.config_file.write_text(BASE)
    applied = await second.config_reload.reload()
    assert applied["applied"] is True
    assert "domain big removed (its GPU was not found)" in applied["changes"], applied
    failed = await second.get(waiting.id)
    assert failed.status is JobStatus.FAILED
    assert failed.message == (
        "can no longer run after a configuration change: domain: domain 'big' was removed "
        "from the configuration (its GPU is not found by the driver now)"
    ), failed.message
    # A new one pinned to it is refused, without "jobs queued for it before wait for it"
    # of the jobs that edit has just failed (tester h136).
    with pytest.raises(SpecError) as refused:
        await second.submit({"command": ["true"], "domain": "big"})
    assert "is not found by the driver now" in str(refused.value)
    assert "queued for it before" not in str(refused.value)
    await second.cancel(running.id)


async def test_a_service_pinned_to_a_removed_domain_waits_after_an_engine_restart_too(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # A live engine kept its exited replica waiting; a restarted one could not resolve
    # its pin, took that as "fits elsewhere", placed it again and failed it for good
    # ("can no longer run after a configuration change").
    unmanaged = UNMANAGED
    first = await _unmanaged(make_engine, paths)
    service = await first.submit(
        {"kind": "service", "command": ["sleep", "600"], "gpus": 1, "domain": "b",
         "port": False}
    )  # fmt: skip
    replica = first.book.get(service.id).job.replicas[0]
    await eventually(lambda: replica.pid is not None, timeout=20)
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n")
    assert (await first.config_reload.reload())["applied"] is True
    await first.stop()
    second = await make_engine("2xA100-80GB", config=load_config(paths.config_file))
    job = second.book.get(service.id).job
    again = job.replicas[0]
    assert job.status is JobStatus.RUNNING and again.pid == replica.pid
    _kill(again.pid)
    await eventually(
        lambda: "not started again: domain b is no longer in the configuration" in again.message,
        timeout=20,
    )
    assert job.status is JobStatus.RUNNING and again.state is ReplicaState.BACKOFF
    paths.config_file.write_text(unmanaged + "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n")
    assert (await second.config_reload.reload())["applied"] is True
    await eventually(lambda: again.state is ReplicaState.UP, timeout=20)
    assert again.domains == ["b"] and job.status is JobStatus.RUNNING
    await second.cancel(service.id)


async def test_a_service_stays_up_when_its_other_gpu_is_busy_and_one_of_its_own_removed(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The check was of capacity only: it passed while the other GPU was busy, the healthy
    # replica was stopped and the service waited down behind an unrelated job.
    paths.state_dir.mkdir(parents=True)
    unmanaged = BASE + "auto_domains = false\n"
    three = "[domains.a]\ngpu = 0\n[domains.b]\ngpu = 1\n[domains.c]\ngpu = 2\n"
    paths.config_file.write_text(unmanaged + three)
    engine = await make_engine("3xA100-80GB", config=load_config(paths.config_file))
    service = await engine.submit(
        {"kind": "service", "command": ["sleep", "600"], "gpus": 1, "replicas": 2,
         "port": False, "domain": ["a", "b", "c"]}
    )  # fmt: skip
    job = engine.book.get(service.id).job
    await eventually(lambda: all(r.pid for r in job.replicas), timeout=20)
    on = {r.domains[0]: r for r in job.replicas}
    free = ({"a", "b", "c"} - set(on)).pop()
    blocker = await engine.submit({"command": ["sleep", "600"], "domain": free})
    assert blocker.status is JobStatus.RUNNING
    gone = sorted(on)[0]
    kept = "".join(f"[domains.{n}]\ngpu = {i}\n" for i, n in enumerate("abc") if n != gone)
    paths.config_file.write_text(unmanaged + kept)
    assert (await engine.config_reload.reload())["applied"] is True
    _kill(on[gone].pid)
    await eventually(lambda: "not started again" in on[gone].message, timeout=20)
    healthy = ({"a", "b", "c"} - {gone, free}).pop()
    assert job.status is JobStatus.RUNNING and on[healthy].state is ReplicaState.UP
    await engine.cancel(service.id)
    await engine.cancel(blocker.id)


async def test_a_domain_removed_leaves_a_choice_and_its_name_given_later_is_not_in_it(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # A choice kept a removed domain's name; a later edit gave that name to a domain on
    # another GPU, and the job ran there: on a GPU it never named (tester h55).
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine("4xA100-80GB", config=load_config(paths.config_file))
    busy = await engine.submit({"command": ["sleep", "600"], "domain": "gpu1"})
    await engine.pause()
    choice = await engine.submit({"command": ["true"], "domain": ["gpu1", "gpu0"]})
    paths.config_file.write_text(UNMANAGED + "[domains.g1]\ngpu = 1\n")
    assert (await engine.config_reload.reload())["applied"] is True
    edited = await engine.get(choice.id)
    assert edited.status is JobStatus.QUEUED and edited.spec["domain"] == "g1"
    edits = [e["message"] for e in await engine.events_of(choice.id) if e["kind"] == "job.edited"]
    assert edits[-1] == (
        "edited: domain gpu0 removed from the configuration, left out of its choice (now g1)"
    ), edits
    paths.config_file.write_text(UNMANAGED + "[domains.g1]\ngpu = 1\n[domains.gpu0]\ngpu = 3\n")
    assert (await engine.config_reload.reload())["applied"] is True
    await engine.resume()
    await engine.store.flush()
    waiting = await engine.get(choice.id)
    assert waiting.status is JobStatus.QUEUED, waiting.domains
    assert "g1" in waiting.message and "job " + str(busy.id) in waiting.message, waiting.message
    await engine.cancel(busy.id)
    done = await engine.wait(choice.id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.domains == ["g1"]


def _cluster_toml(says: str) -> str:
    """A cluster whose every command fails as Slurm's do, saying ``says`` (no Slurm here:
    the prefix stands in for its commands)."""
    fail = f"echo {json.dumps(says)} >&2; exit 1"
    return (
        '[clusters.lab]\npartition = "gpu"\npoll_interval = 0.2\n'
        f'command_prefix = ["sh", "-c", {json.dumps(fail)}, "x"]\n'
    )


async def test_a_cluster_added_by_a_reload_is_followed_and_its_jobs_told_why_they_wait(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # Added to an engine that had none, it was never read: its jobs said "not read yet"
    # for ever, and `gpus` showed it answering (tester h122).
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE)
    engine = await make_engine(config=load_config(paths.config_file))
    paths.config_file.write_text(BASE + _cluster_toml("fatal: no such controller"))
    assert (await engine.config_reload.reload())["changes"] == ["clusters.lab added"]
    job = await engine.submit({"command": ["true"], "cluster": "lab"})

    def told() -> str:
        act = engine.book.get(job.id)
        assert act is not None
        return act.job.message

    await eventually(lambda: "no such controller" in told(), timeout=10)
    assert told() == "cluster lab refused: sinfo: fatal: no such controller", told()
    # Changed, it is read again (what was read of it before says nothing of it now); out
    # of reach, its jobs say since when, once.
    paths.config_file.write_text(BASE + _cluster_toml("Unable to contact slurm controller"))
    await engine.config_reload.reload()
    await eventually(lambda: "not answering since" in told(), timeout=10)
    assert told().endswith(": sinfo: Unable to contact slurm controller"), told()
    said = len(await engine.events_of(job.id))
    polls = engine.clusters._polls
    await eventually(lambda: engine.clusters._polls >= polls + 3, timeout=10)
    assert len(await engine.events_of(job.id)) == said and "not answering since" in told()
    await engine.cancel(job.id)


async def test_a_file_gone_by_the_watchers_read_leaves_the_running_configuration(
    make_engine: EngineFactory, paths: Paths
) -> None:
    # The watcher saw a file, gone again by its read: the defaults were applied, dropping
    # [security] and the domains (tester h161's race); an explicit reload still applies
    # a file's absence on purpose.
    paths.state_dir.mkdir(parents=True)
    paths.config_file.write_text(BASE + "[cpu]\nslots = 3\n")
    engine = await make_engine(config=load_config(paths.config_file))
    await engine.config_reload.stop()  # (applied by hand below, not by the watcher)
    paths.config_file.unlink()
    kept = await engine.config_reload.reload(absent_keeps=True)
    assert kept == {"applied": False, "error": f"{paths.config_file} was removed"}
    assert engine.scheduler.domains["cpu"].slots == 3
    asked = await engine.config_reload.reload()
    assert asked["applied"] is True and engine.scheduler.domains["cpu"].slots != 3


def test_a_checkpoint_signal_turned_off_is_said_as_none_sent() -> None:
    # "checkpoint_signal: 'SIGUSR1' -> unset" read as back to the default, SIGUSR1; it
    # means no signal is sent (tester h154).
    from gpulayer_tui.engine.config import parse_config_text
    from gpulayer_tui.engine.reload import _section_changes

    on = parse_config_text("[scheduling]\npreempt_after = 60\n").scheduling
    off = parse_config_text('[scheduling]\npreempt_after = 60\ncheckpoint_signal = ""\n')
    assert _section_changes("scheduling", on, off.scheduling) == [
        "scheduling.checkpoint_signal: 'SIGUSR1' -> \"\" (none sent)"
    ]


async def test_a_service_down_on_a_gpu_the_driver_lost_is_placed_again_to_wait(
    make_engine: EngineFactory,
) -> None:
    # Its one replica exited on a GPU the driver no longer lists: it backed off in place,
    # "running 0/1 up", holding that GPU, each wait longer, until another job's end let
    # it move (tester h194 #1). Down anyway, it is placed again: queued, waiting for a GPU.
    first = await make_engine("2xA100-80GB")
    blocker = await first.submit({"command": ["sleep", "600"], "gpus": 1})
    assert blocker.domains == ["gpu0"]
    service = await first.submit(
        {"kind": "service", "command": ["sleep", "600"], "gpus": 1, "port": False}
    )
    replica = first.book.get(service.id).job.replicas[0]
    await eventually(lambda: replica.pid is not None, timeout=20)
    assert replica.domains == ["gpu1"]
    await first.stop()
    second = await make_engine("1xA100-80GB")  # (gpu1 did not come up)
    job = second.book.get(service.id).job
    assert job.status is JobStatus.RUNNING and job.replicas[0].pid == replica.pid
    _kill(job.replicas[0].pid)
    await eventually(lambda: job.status is JobStatus.QUEUED, timeout=20)
    waiting = await second.get(service.id)
    assert "gpu0" in waiting.message and f"job {blocker.id}" in waiting.message, waiting.message
    await second.cancel(blocker.id)
    await eventually(lambda: job.status is JobStatus.RUNNING and job.replicas[0].pid, timeout=20)
    assert job.replicas[0].domains == ["gpu0"]
    await second.cancel(service.id)
