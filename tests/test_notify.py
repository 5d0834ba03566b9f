"""Notifications ([notify], ``submit --notify``): a real engine, real processes, a real
command reading its stdin and a real HTTP server on 127.0.0.1; and the TUI's bell."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpulayer_tui.cli.commands import _spec_from_args
from gpulayer_tui.cli.grammar import build_parser
from gpulayer_tui.cli.quick import parse
from gpulayer_tui.engine.config import ConfigError, parse_config_text
from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.notify import Notifier
from gpulayer_tui.engine.spec import parse_spec

from .conftest import EngineFactory, Served, eventually, make_config, pid_gone, wait_for
from .test_services import ManualClock
from .ui_support import until

# Writes its stdin, with the variables the notifier sets, to a new file in DIR.
RECORD = (
    "import json, os, sys, tempfile\n"
    "body = json.load(sys.stdin)\n"
    "body['_env'] = {k: os.environ.get(k) for k in ('GPULAYER_JOB_ID', 'GPULAYER_NOTIFY_EVENT')}\n"
    "fd, path = tempfile.mkstemp(dir=sys.argv[1], suffix='.part')\n"
    "os.write(fd, json.dumps(body).encode()); os.close(fd)\n"
    "os.rename(path, path[:-5] + '.json')\n"
    "with open(os.path.join(sys.argv[1], 'arrivals'), 'a') as f: f.write(body['event'] + '\\n')\n"
)
LOGGER = "gpulayer_tui.engine.notify"


def _recorder(out: Path) -> list[str]:
    out.mkdir(exist_ok=True)
    return [sys.executable, "-c", RECORD, str(out)]


def _received(out: Path) -> list[dict[str, Any]]:
    """What the command received, in the order of the jobs and events (events of one
    instant, such as a replica giving up and so its job ending, in that order: up to
    WORKERS are delivered at once, so different jobs' arrive in any order)."""
    bodies = [json.loads(p.read_text()) for p in out.glob("*.json")]
    order = ["replica.down", "replica.restarted", "replica.gave_up", "job.ended"]
    return sorted(bodies, key=lambda b: (b["id"], b["event_at"], order.index(b["event"])))


async def _engine(make_engine: EngineFactory, **notify: Any) -> Engine:
    return await make_engine(simulate=None, config=make_config(notify=notify))


async def test_a_marked_job_that_ends_sends_its_json_to_the_command(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    out = tmp_path / "got"
    engine = await _engine(make_engine, command=_recorder(out))
    plain = await engine.submit({"command": ["true"]})
    await engine.wait(plain.id, timeout=20)
    marked = await engine.submit(
        {"command": ["sh", "-c", "exit 3"], "notify": True, "env": {"TOKEN": "s3cret"}}
    )
    assert marked.spec["notify"] is True and "notify" not in plain.spec
    await engine.wait(marked.id, timeout=20)
    await eventually(lambda: engine.notifier.sent == 1, timeout=20)
    await engine.stop()  # (waits for notifications under way: none may follow)
    [body] = _received(out)  # the unmarked job sent nothing
    assert body["event"] == "job.ended" and body["id"] == marked.id
    assert body["status"] == "failed" and body["exit_code"] == 3
    assert body["termination_reason"] == "exit_code" and body["ended_at"] is not None
    assert body["spec"]["env"] == {"TOKEN": "(hidden)"}  # names only, never values
    assert body["_env"] == {"GPULAYER_JOB_ID": str(marked.id), "GPULAYER_NOTIFY_EVENT": "job.ended"}
    assert engine.notifier.failed == 0 and engine.notifier.dropped == 0


async def test_all_jobs_notify_and_on_picks_the_statuses(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    out = tmp_path / "got"
    engine = await _engine(make_engine, command=_recorder(out), jobs="all", on=["failed"])
    ok = await engine.submit({"command": ["true"]})
    bad = await engine.submit({"command": ["false"]})
    for job in (ok, bad):
        await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.sent == 1, timeout=20)
    await engine.stop()
    assert [(b["id"], b["status"]) for b in _received(out)] == [(bad.id, "failed")]


async def test_no_notify_section_means_no_subscriber(make_engine: EngineFactory) -> None:
    engine = await make_engine(simulate=None)
    assert not engine.bus.has_subscribers  # publishers still skip building rows
    job = await engine.submit({"command": ["true"], "notify": True})
    assert (await engine.wait(job.id, timeout=20)).status is JobStatus.COMPLETED


class _Hook:
    """A webhook on 127.0.0.1 that answers ``status`` and keeps what it was sent."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers or {}
        self.got: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _post(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/json"
        self.got.append(await request.json())
        return web.Response(status=self.status, headers=self.headers)

    async def __aenter__(self) -> _Hook:
        app = web.Application()
        app.router.add_post("/hook", self._post)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def test_the_webhook_receives_the_json(make_engine: EngineFactory) -> None:
    async with _Hook() as hook:
        engine = await _engine(make_engine, url=hook.url)
        job = await engine.submit({"command": ["sh", "-c", "exit 0"], "notify": True})
        await engine.wait(job.id, timeout=20)
        await eventually(lambda: hook.got, timeout=20)
        [body] = hook.got
        assert (body["event"], body["id"], body["status"], body["exit_code"]) == (
            "job.ended",
            job.id,
            "completed",
            0,
        )
        await eventually(lambda: engine.notifier.sent == 1)


async def test_a_redirecting_webhook_is_a_failure_naming_where_to(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Followed, the POST arrived as a GET without its body, and counted as delivered:
    # every notification lost, nothing said (an http:// URL moved to https://).
    caplog.set_level(logging.WARNING, LOGGER)
    async with _Hook(status=302, headers={"Location": "https://example.org/hook?k=1"}) as hook:
        engine = await _engine(make_engine, url=hook.url)
        job = await engine.submit({"command": ["true"], "notify": True})
        await engine.wait(job.id, timeout=20)
        await eventually(lambda: engine.notifier.failed == 1, timeout=20)
        assert engine.notifier.sent == 0 and len(hook.got) == 1
        # (its path, to set the url to; the query, where tokens go, hidden: tester h49)
        assert "failed: HTTP 302, redirected to https://example.org/hook?...: set [notify] " in (
            caplog.text
        )
    # Relative, it is taken against the URL ("redirected to :///..." was said).
    async with _Hook(status=307, headers={"Location": "/elsewhere"}) as hook:
        engine.notifier.reconfigure(make_config(notify={"url": hook.url, "jobs": "all"}).notify)
        job = await engine.submit({"command": ["true"], "notify": True})
        await engine.wait(job.id, timeout=20)
        await eventually(lambda: engine.notifier.failed == 2, timeout=20)
        host = hook.url.split("/")[2]
        assert f"failed: HTTP 307, redirected to http://{host}/elsewhere: set" in caplog.text


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_failing_webhook_is_logged_and_changes_nothing(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    async with _Hook(status=500) as hook:
        engine = await _engine(make_engine, url=hook.url)
        first = await engine.submit({"command": ["true"], "notify": True})
        assert (await engine.wait(first.id, timeout=20)).status is JobStatus.COMPLETED
        await eventually(lambda: engine.notifier.failed == 1, timeout=20)
        assert len(hook.got) == 1
        # Said in /metrics too: failing deliveries showed only in the log (h153)
        from prometheus_client.parser import text_string_to_metric_families

        from gpulayer_tui.engine.metrics import render

        text = (await render(engine)).decode()
        (family,) = [
            f for f in text_string_to_metric_families(text) if f.name == "gpulayer_notifications"
        ]
        said = {s.labels["result"]: s.value for s in family.samples if s.name.endswith("_total")}
        assert said == {"sent": 0.0, "failed": 1.0, "dropped": 0.0}, said
        host = hook.url.split("/")[2]  # (its path is not logged: webhooks keep secrets there)
        assert f"job {first.id}: job.ended notification to http://{host}/... failed: HTTP 500" in (
            caplog.text
        )
        # Nobody listening: the connection is refused. The user info and the token in the
        # URL stay out of the log, which goes to the journal.
        port = _closed_port()
        refused = f"http://user:s3cret@127.0.0.1:{port}/hook?token=t0ken"
        engine.notifier.reconfigure(make_config(notify={"url": refused}).notify)
        second = await engine.submit({"command": ["true"], "notify": True})
        assert (await engine.wait(second.id, timeout=20)).status is JobStatus.COMPLETED
        await eventually(lambda: engine.notifier.failed == 2, timeout=20)
        said = f"job {second.id}: job.ended notification to http://127.0.0.1:{port}/... failed"
        assert said in caplog.text
        assert "s3cret" not in caplog.text and "t0ken" not in caplog.text
        # The engine goes on: jobs run, and a working hook is notified again.
        engine.notifier.reconfigure(make_config(notify={"url": hook.url}).notify)
        hook.status = 200
        third = await engine.submit({"command": ["true"], "notify": True})
        assert (await engine.wait(third.id, timeout=20)).status is JobStatus.COMPLETED
        await eventually(lambda: engine.notifier.sent == 1, timeout=20)
        assert [b["id"] for b in hook.got] == [first.id, third.id]
        for job in (first, second, third):
            assert (await engine.get(job.id)).status is JobStatus.COMPLETED


async def test_a_hanging_command_is_killed_at_the_timeout(
    make_engine: EngineFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    pids = tmp_path / "pids"
    hang = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{__import__(\"os\").getpid()}} {{child.pid}}')\n"
        "time.sleep(600)\n"
    )
    engine = await _engine(make_engine, command=[sys.executable, "-c", hang], timeout=1.0)
    job = await engine.submit({"command": ["true"], "notify": True})
    assert (await engine.wait(job.id, timeout=20)).status is JobStatus.COMPLETED
    await eventually(lambda: engine.notifier.failed == 1, timeout=20)
    # Killed with its process group: the command and what it started.
    for pid in map(int, pids.read_text().split()):
        await eventually(lambda pid=pid: pid_gone(pid))
    assert f"job {job.id}: job.ended notification: {sys.executable} killed after 1 s" in (
        caplog.text
    )
    assert (await engine.get(job.id)).status is JobStatus.COMPLETED


async def test_a_command_that_fails_or_cannot_run_is_logged(
    make_engine: EngineFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    fail = "import sys; sys.stdin.read(); print('no route to pager', file=sys.stderr); sys.exit(4)"
    engine = await _engine(make_engine, command=[sys.executable, "-c", fail])
    job = await engine.submit({"command": ["true"], "notify": True})
    await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.failed == 1, timeout=20)
    assert f"job {job.id}: job.ended notification: {sys.executable} exited 4: no route" in (
        caplog.text
    )
    missing = str(tmp_path / "no-such-program")
    engine.notifier.reconfigure(make_config(notify={"command": [missing]}).notify)
    job = await engine.submit({"command": ["true"], "notify": True})
    await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.failed == 2, timeout=20)
    assert f"job {job.id}: job.ended notification: cannot run {missing}" in caplog.text


async def test_a_command_that_exits_0_leaving_a_child_is_a_success(
    make_engine: EngineFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Done when it exits, though a child it left (in a session of its own) still holds
    its stderr."""
    caplog.set_level(logging.WARNING, LOGGER)
    pid_file = tmp_path / "child"
    hook = f"cat >/dev/null; setsid sh -c 'echo $$ > {pid_file}; exec sleep 600' & exit 0"
    engine = await _engine(make_engine, command=["sh", "-c", hook], timeout=2.0)
    job = await engine.submit({"command": ["true"], "notify": True})
    await engine.wait(job.id, timeout=20)
    try:
        await eventually(lambda: engine.notifier.sent == 1, timeout=20)
        assert engine.notifier.failed == 0 and "killed after" not in caplog.text
    finally:
        await eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        os.kill(int(pid_file.read_text()), 9)


async def test_a_commands_stderr_reaches_the_log_as_text(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    hook = "cat >/dev/null; printf '\\033[31mRED\\033]0;owned\\007\\nforged line\\n' >&2; exit 1"
    engine = await _engine(make_engine, command=["sh", "-c", hook])
    job = await engine.submit({"command": ["true"], "notify": True})
    await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.failed == 1, timeout=20)
    assert "exited 1: \\x1b[31mRED\\x1b]0;owned\\x07 | forged line" in caplog.text
    assert "\x1b" not in caplog.text and "\x07" not in caplog.text


async def test_a_replica_restart_and_give_up_notify(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    out = tmp_path / "got"
    clock = ManualClock()
    engine = await make_engine(
        simulate=None,
        config=make_config(notify={"command": _recorder(out)}),
        service_clock=clock,
    )
    spec = {"kind": "service", "command": ["sh", "-c", "exit 5"], "port": False}
    job = await engine.submit({**spec, "max_restarts": 1, "notify": True})
    await eventually(lambda: clock.pending(), timeout=20)  # in back-off
    await eventually(lambda: engine.notifier.sent == 1, timeout=20)
    clock.advance(clock.pending()[0])
    await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.sent == 3, timeout=20)
    await engine.stop()
    bodies = _received(out)
    assert [b["event"] for b in bodies] == ["replica.restarted", "replica.gave_up", "job.ended"]
    # Delivered in that order too: a job's notifications go one after another (the end
    # often reached the hook before the replica's giving up that caused it).
    arrived = (out / "arrivals").read_text().split()
    assert arrived == ["replica.restarted", "replica.gave_up", "job.ended"]
    restarted, gave_up, ended = bodies
    assert restarted["replica"]["replica"] == 0 and restarted["replica"]["exit_code"] == 5
    assert "restart #1 at " in restarted["replica"]["message"]
    assert "not restarted (max_restarts = 1 reached)" in gave_up["replica"]["message"]
    assert ended["status"] == "failed" and ended["exit_code"] == 5


async def test_a_replica_whose_port_stops_answering_notifies_once(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    from .test_services import GATED_SERVER

    out = tmp_path / "got"
    config = make_config(
        notify={"command": _recorder(out)},
        services={"check_interval": 0.05, "down_after": 2, "restart_down_after": 0},
    )
    engine = await make_engine(simulate=None, config=config)
    job = await engine.submit(
        {"kind": "service", "command": [*GATED_SERVER, str(tmp_path)], "notify": True}
    )
    replica = engine.book.get(job.id).job.replicas[0]  # type: ignore[union-attr]
    await eventually(lambda: replica.state.value == "up", timeout=20)
    (tmp_path / f"closed-{replica.port}").touch()
    await eventually(lambda: engine.notifier.sent == 1, timeout=20)
    (tmp_path / f"closed-{replica.port}").unlink()
    await eventually(lambda: replica.state.value == "up", timeout=20)
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.sent == 2, timeout=20)
    bodies = _received(out)
    assert [b["event"] for b in bodies] == ["replica.down", "job.ended"]
    assert (
        bodies[0]["replica"]["state"] == "down"
        and "stopped answering" in bodies[0]["replica"]["message"]
    )


async def test_replicas_false_notifies_only_the_end(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    out = tmp_path / "got"
    clock = ManualClock()
    config = make_config(notify={"command": _recorder(out), "replicas": False})
    engine = await make_engine(simulate=None, config=config, service_clock=clock)
    spec = {"kind": "service", "command": ["sh", "-c", "exit 5"], "port": False}
    job = await engine.submit({**spec, "max_restarts": 1, "notify": True})
    await eventually(lambda: clock.pending(), timeout=20)
    clock.advance(clock.pending()[0])
    await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.sent == 1, timeout=20)
    await engine.stop()
    assert [b["event"] for b in _received(out)] == ["job.ended"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # (the value is not quoted: a webhook's secret is in it, and every allowed user
        # reads config errors in events and doctor)
        ('url = "ftp://example.org/x"', "notify.url: not an http:// or https"),
        # (passed, then every delivery failed)
        ('url = "http://h:99999/"', "notify.url: its port is not 1-65535"),
        ('url = "http://h:abc/"', "notify.url: its port is not 1-65535"),
        ('url = "http://h:0/"', "notify.url: its port is not 1-65535"),
        ('url = "http://"', "notify.url"),
        # (said in Python's words: "Value error, Invalid IPv6 URL")
        ('url = "http://[x"', "notify.url: not an http:// or https:// URL with a host"),
        ('on = ["failed", "running"]', "notify.on: 'running' is not a terminal"),
        # (taken as "valid and applied": no job notified again, without a word: h63)
        ("on = []", "notify.on: lists no status, so nothing would ever notify"),
        ('jobs = "mine"', "notify.jobs"),
        ("command = []", "notify.command"),
        ('command = "notify-send"', "notify.command"),
        # (run from the engine's working directory: every delivery failed, tester h153)
        ('command = ["./notify.sh"]', "notify.command: './notify.sh' is a relative path"),
        ("timeout = 0", "notify.timeout"),
        ("when = 1", "unknown key 'notify.when'"),
    ],
)
def test_a_bad_notify_section_is_refused_naming_the_key(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config_text(f"[notify]\n{text}\n", "config.toml")
    assert words in str(err.value)


def test_notify_defaults() -> None:
    notify = parse_config_text('[notify]\nurl = "https://hooks.example.org/x"\n').notify
    assert notify.enabled and notify.jobs == "marked" and notify.replicas
    assert sorted(notify.on) == ["cancelled", "completed", "failed", "orphaned"]
    assert not parse_config_text("").notify.enabled


def test_submit_notify_sets_the_spec_field_on_both_paths() -> None:
    words = ["submit", "--notify", "--", "true"]
    quick = parse(words)
    parser = build_parser()
    full = parser.parse_args(words)
    assert quick is not None and vars(quick) == vars(full)
    assert _spec_from_args(quick, parser)["notify"] is True
    assert "notify" not in _spec_from_args(parser.parse_args(["submit", "true"]), parser)
    # A spec file says it as `notify = true`.
    assert parse_spec({"command": ["true"], "notify": True}).notify
    assert (
        not parse_spec({"command": ["true"], "notify": False})
        .model_dump(exclude_none=True)
        .get("notify")
    )


async def test_the_tui_rings_when_a_notify_job_ends(embedded_app: Any) -> None:
    app = await embedded_app(simulate="1xA100-80GB")
    rang: list[int] = []
    app.bell = lambda: rang.append(1)  # (the terminal's bell, observed)
    async with app.run_test(size=(120, 40)) as pilot:
        plain = await app.backend.submit({"command": ["true"]})
        await until(pilot, lambda: app.job_store.jobs.get(plain["id"], {}).get("ended_at"))
        assert rang == []
        job = await app.backend.submit({"command": ["sh", "-c", "exit 2"], "notify": True})
        await until(pilot, lambda: rang == [1])
        toast = next(n for n in app._notifications if n.title == f"job {job['id']} ended")
        assert toast.message == "sh: failed (exit code 2)" and toast.severity == "warning"
        assert not toast.markup


def test_notify_payload_keeps_env_names_only() -> None:
    from gpulayer_tui.engine.models import Job, JobKind
    from gpulayer_tui.engine.notify import payload

    job = Job(1, "n", JobKind.COMMAND, {"command": ["x"], "env": {"A": "1", "B": "2"}})
    body = payload("job.ended", 5.0, job, None)
    assert body["spec"]["env"] == {"A": "(hidden)", "B": "(hidden)"}
    assert job.spec["env"] == {"A": "1", "B": "2"}  # the job itself is untouched
    assert (body["event"], body["event_at"]) == ("job.ended", 5.0) and "replica" not in body
    assert os.environ.get("GPULAYER_NOTIFY_EVENT") is None
    # A command's bytes that are not UTF-8 (lone surrogates here) go as U+FFFD: strict
    # JSON parsers refused the \udcff escapes (tester h153).
    from gpulayer_tui.engine.notify import notification_body

    odd = Job(2, "a\udcffb", JobKind.COMMAND, {"command": ["printf", "a\udcffb"]})
    sent = notification_body(payload("job.ended", 5.0, odd, None))
    assert b"\\udc" not in sent
    parsed = json.loads(sent.decode("utf-8", "strict"))
    assert parsed["name"] == "a\ufffdb" and parsed["spec"]["command"] == ["printf", "a\ufffdb"]


# Records like RECORD, but first waits for a gate file (sys.argv[2]) to exist.
GATED = "import os, sys, time\nwhile not os.path.exists(sys.argv[2]): time.sleep(0.05)\n" + RECORD


async def test_notifications_an_engine_left_undelivered_are_sent_by_the_next(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A notification still waiting when the engine stopped (or was killed) was dropped
    # for good: the job's end was stored, its notification never sent.
    out, gate = tmp_path / "got", tmp_path / "gate"
    out.mkdir()
    command = [sys.executable, "-c", GATED, str(out), str(gate)]
    engine = await _engine(make_engine, command=command, jobs="all")
    first = await engine.submit({"command": ["true"]})
    await engine.wait(first.id, timeout=20)
    gate.touch()  # (the first goes through)
    await eventually(lambda: engine.notifier.sent == 1, timeout=20)
    gate.unlink()
    second = await engine.submit({"command": ["sh", "-c", "exit 4"]})
    await engine.wait(second.id, timeout=20)
    await eventually(lambda: engine.notifier._open_rows, timeout=20)  # (under way)
    await engine.stop()  # (2 s for it, then it is given up: owed)
    assert [b["id"] for b in _received(out)] == [first.id]
    gate.touch()
    again = await _engine(make_engine, command=command, jobs="all")
    await eventually(lambda: again.notifier.sent == 1, timeout=20)
    got = _received(out)
    assert [(b["id"], b["event"]) for b in got] == [
        (first.id, "job.ended"),
        (second.id, "job.ended"),
    ]
    assert got[1]["exit_code"] == 4
    await again.stop()
    # Nothing is owed now: a third engine sends nothing again.
    third = await _engine(make_engine, command=command, jobs="all")
    assert third.notifier.sent == 0 and not third.notifier._open_rows
    await third.stop()
    # Notifications off in a run: the next one owes nothing of it.
    off = await make_engine(simulate=None)
    done = await off.submit({"command": ["true"]})
    await off.wait(done.id, timeout=20)
    await off.stop()
    on = await _engine(make_engine, command=command, jobs="all")
    await on.store.flush()
    assert on.notifier.sent == 0 and not on.notifier._open_rows
    assert len(_received(out)) == 2


# Blocks until the gate exists only for a job named "stuck", then records as RECORD does.
GATED_BY_NAME = (
    "import json, os, sys, tempfile, time\n"
    "body = json.load(sys.stdin)\n"
    "while body['name'] == 'stuck' and not os.path.exists(sys.argv[2]): time.sleep(0.05)\n"
    "fd, path = tempfile.mkstemp(dir=sys.argv[1], suffix='.part')\n"
    "os.write(fd, json.dumps(body).encode()); os.close(fd)\n"
    "os.rename(path, path[:-5] + '.json')\n"
)


def _gated(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """Where GATED_BY_NAME records, its gate, and the command running it."""
    out, gate = tmp_path / "got", tmp_path / "gate"
    out.mkdir()
    return out, gate, [sys.executable, "-c", GATED_BY_NAME, str(out), str(gate)]


async def test_after_a_clean_stop_only_what_was_not_delivered_is_sent_again(
    make_engine: EngineFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The next engine sent everything after the first notification still owed: the ones
    # delivered after it came twice (and a command ran twice).
    out, gate, command = _gated(tmp_path)
    engine = await _engine(make_engine, command=command, jobs="all")
    stuck = await engine.submit({"command": ["true"], "name": "stuck"})
    await engine.wait(stuck.id, timeout=20)
    fast = [await engine.submit({"command": ["true"], "name": f"fast{i}"}) for i in range(3)]
    await eventually(lambda: engine.notifier.sent == 3, timeout=20)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    await engine.stop()
    assert "stopping with 1 not delivered" in caplog.text  # (it said 3: queued + 1)
    gate.touch()
    again = await _engine(make_engine, command=command, jobs="all")
    await eventually(lambda: again.notifier.sent == 1, timeout=20)
    await again.stop()
    ids = [b["id"] for b in _received(out)]
    assert sorted(ids) == sorted([stuck.id, *(job.id for job in fast)]), ids


async def test_every_notification_owed_is_sent_after_a_restart_up_to_the_cap(
    make_engine: EngineFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The catch-up took the newest 256 events of every transition (queued, running...):
    # about 128 ends came back, the older ones lost with no word.
    from gpulayer_tui.engine import notify

    out, gate, command = _gated(tmp_path)
    engine = await _engine(make_engine, command=command, jobs="all")
    jobs = await engine.submit_many([{"command": ["true"], "name": "stuck"}] * 40)
    for job in jobs:
        await engine.wait(job.id, timeout=20)
    await engine.stop()
    gate.touch()
    cap = 30  # (the cap, made small: 40 owed, each with 3 transitions stored)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    original = notify.QUEUE_MAX
    notify.QUEUE_MAX = cap
    try:
        again = await _engine(make_engine, command=command, jobs="all")
    finally:
        notify.QUEUE_MAX = original
    ended = {job.id: (await again.get(job.id)).ended_at or 0.0 for job in jobs}
    await eventually(lambda: again.notifier.sent == cap, timeout=60)
    await again.stop()
    ids = {b["id"] for b in _received(out)}
    assert len(ids) == cap and ids <= {job.id for job in jobs}
    # The newest: those that ended last (two slots: not quite in id order).
    by_end = [j.id for j in sorted(jobs, key=lambda j: ended[j.id])]
    assert not ids & set(by_end[:5]) and set(by_end[-5:]) <= ids
    assert "10 older ones left undelivered by the last engine are not sent" in caplog.text


async def test_notifications_dropped_in_a_burst_are_said_once_not_each(
    make_engine: EngineFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A 300-job batch with jobs = "all" and a hanging url wrote 40 warnings alike (h63).
    from gpulayer_tui.engine import notify

    _, gate, command = _gated(tmp_path)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    original = notify.QUEUE_MAX
    notify.QUEUE_MAX = 3  # (made small: the queue fills with a few jobs)
    try:
        engine = await _engine(make_engine, command=command, jobs="all")
    finally:
        notify.QUEUE_MAX = original
    jobs = await engine.submit_many([{"command": ["true"], "name": "stuck"}] * 20)
    for job in jobs:
        await engine.wait(job.id, timeout=20)
    await eventually(lambda: engine.notifier.dropped >= 10, timeout=20)
    said = [r.getMessage() for r in caplog.records if "notification dropped" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].endswith("(1 dropped since the engine started; said once per 100)")
    gate.touch()


class _SlowHook(_Hook):
    """A webhook that holds every answer until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def _post(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return await super()._post(request)


async def test_a_clean_stop_owes_only_the_channel_not_delivered(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # With a command and a URL, the command done and the POST under way at the stop: the
    # next engine ran the command again too.
    out = tmp_path / "got"
    async with _SlowHook() as hook:
        settings = {"command": _recorder(out), "url": hook.url, "jobs": "all"}
        engine = await _engine(make_engine, **settings)
        job = await engine.submit({"command": ["true"]})
        await engine.wait(job.id, timeout=20)
        await eventually(lambda: len(_received(out)) == 1, timeout=20)  # (the command)
        await engine.stop()  # (the POST still held: owed)
        hook.release.set()
        again = await _engine(make_engine, **settings)
        await eventually(lambda: len(hook.got) == 1, timeout=20)
        await eventually(lambda: again.notifier.sent == 1, timeout=20)
        await again.stop()
    assert [b["id"] for b in _received(out)] == [job.id]  # (the command ran once)
    assert [b["id"] for b in hook.got] == [job.id]


# Blocks on a job named "stuck" until the gate exists, then records as RECORD does; one
# whose engine died meanwhile (its parent changed) records nothing: that engine is gone.
GATED_WHILE_PARENT_LIVES = (
    "import json, os, sys, tempfile, time\n"
    "parent = os.getppid()\n"
    "body = json.load(sys.stdin)\n"
    "while body['name'] == 'stuck' and not os.path.exists(sys.argv[2]):\n"
    "    time.sleep(0.05)\n"
    "    if os.getppid() != parent: sys.exit(1)\n"
    "fd, path = tempfile.mkstemp(dir=sys.argv[1], suffix='.part')\n"
    "os.write(fd, json.dumps(body).encode()); os.close(fd)\n"
    "os.rename(path, path[:-5] + '.json')\n"
)


def test_a_kill_after_a_clean_stop_resends_nothing_delivered_before_it(
    served: Served, tmp_path: Path
) -> None:
    # The owed notification, older than the cursor, took the cursor back to it once the
    # next engine queued it: killed then, the engine after sent again everything
    # delivered since that row (and, with jobs = "marked", the catch-up counted unmarked
    # jobs and could crowd the marked ones out).
    import sqlite3

    out, gate = tmp_path / "got", tmp_path / "gate"
    out.mkdir()
    command = [sys.executable, "-c", GATED_WHILE_PARENT_LIVES, str(out), str(gate)]
    served.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (served.home / "config.toml").write_text(
        f'[notify]\ncommand = {json.dumps(command)}\njobs = "marked"\n'
    )
    served.start()
    stuck = served.cli("submit", "--notify", "--name", "stuck", "--", "true").stdout.strip()
    fast = [
        served.cli("submit", "--notify", "--name", f"fast{i}", "--", "true").stdout.strip()
        for i in range(3)
    ]
    for i in range(5):  # (unmarked: never notified)
        served.cli("submit", "--name", f"quiet{i}", "--", "true")
    wait_for(lambda: len(_received(out)) == 3, timeout=30)
    served.stop()  # (stuck owed)

    def run_id() -> int:
        with sqlite3.connect(served.home / "gpulayer.db") as db:
            row = db.execute("SELECT value FROM counters WHERE name = 'notify_run'").fetchone()
        return int(row[0]) if row else 0

    before = run_id()
    served.start()
    wait_for(lambda: run_id() != before, timeout=20)  # (its catch-up is stored)
    assert served.proc is not None
    served.proc.send_signal(signal.SIGKILL)
    served.proc.wait(timeout=20)
    gate.touch()
    served.start()
    # (60 s: CI's coverage pass, subprocesses measured too, once took longer than 30)
    wait_for(lambda: len(_received(out)) >= 4, timeout=60)
    said = served.stop()
    ids = sorted(str(b["id"]) for b in _received(out))
    assert ids == sorted([stuck, *fast]), ids  # (each once)
    assert said.count("1 left undelivered by the last engine are sent now") == 2, said


async def test_a_job_with_a_notification_still_to_go_is_kept_by_clean(
    make_engine: EngineFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Cleaned first, its notification failed with a traceback in the log and never went.
    out, gate, command = _gated(tmp_path)
    engine = await _engine(make_engine, command=command, jobs="all")
    job = await engine.submit({"command": ["true"], "name": "stuck"})
    await engine.wait(job.id, timeout=20)
    await eventually(lambda: job.id in engine.notifier.jobs_owed(), timeout=20)
    kept = await engine.retention.clean(None, keep=0)
    assert kept["jobs"] == 0 and kept["spared"] == [job.id]
    gate.touch()
    await eventually(lambda: engine.notifier.sent == 1, timeout=20)
    [body] = _received(out)
    assert body["id"] == job.id and body["status"] == "completed"
    assert (await engine.retention.clean(None, keep=0))["jobs"] == 1


def test_a_replica_waiting_on_in_back_off_is_no_restart_to_tell_of() -> None:
    # Kept off a GPU that is gone, it notified "replica.restarted" at every back-off step,
    # for ever; a replica that exited still does, once.
    from gpulayer_tui.engine.events import EventBus
    from gpulayer_tui.engine.models import Event, EventKind

    settings = parse_config_text('[notify]\ncommand = ["true"]\nreplicas = true\n', "c").notify

    async def read_job(job_id: int) -> Any:
        raise AssertionError("not delivered here")

    notifier = Notifier(EventBus(), settings, read_job)
    base = {"replica": 0, "state": "backoff", "restarts": 1, "exit_code": None}
    waiting = Event(1, 1.0, EventKind.REPLICA, 7, {**base, "not_started": True})
    exited = Event(2, 2.0, EventKind.REPLICA, 7, {**base, "exit_code": 137})
    assert notifier.consider(waiting) == 0
    assert notifier.consider(exited) == 1


async def test_turning_notify_off_drops_what_waits(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Removed from the config, [notify] went on sending what waited with its old settings
    # (a slow hook: half an hour), and `clean` kept those jobs all the while (tester h49).
    caplog.set_level(logging.WARNING, LOGGER)
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    engine = await _engine(make_engine, command=slow, timeout=60, jobs="all")
    jobs = [await engine.submit({"command": ["true"]}) for _ in range(12)]
    for job in jobs:
        await engine.wait(job.id, timeout=20)
    await eventually(lambda: len(engine.notifier.jobs_owed()) == len(jobs), timeout=20)
    engine.notifier.reconfigure(make_config().notify)  # (the section removed)
    under_way = engine.notifier.jobs_owed()
    assert len(under_way) < len(jobs)  # (only those a worker has taken are left)
    dropped = len(jobs) - len(under_way)
    assert f"[notify] turned off: {dropped} notifications waiting dropped" in caplog.text


def test_notify_with_nowhere_to_send_is_taken_with_a_warning(
    served: Served, tmp_path: Path
) -> None:
    # `submit --notify` on an engine whose config has no [notify] command or url was
    # taken without a word, and nothing was ever sent (tester h152).
    served.start("--simulate", "1xA100-80GB")
    one = served.cli("submit", "--notify", "--", "true")
    assert one.returncode == 0, one.stderr
    job = one.stdout.strip()
    assert one.stderr == (
        f"gpulayer-tui: warning: job {job} asks to be notified (notify), but [notify] in the "
        "engine's config has no command or url: nothing is sent unless one is set there (an "
        "edit applies at once) before the job ends\n"
    )
    lines = tmp_path / "lines.txt"
    lines.write_text("true\ntrue\n")
    batch = served.cli("submit", "--notify", "--file", str(lines))
    first, last = batch.stdout.split()
    assert batch.returncode == 0 and f"warning: jobs {first}-{last} ask to be" in batch.stderr
    quiet = served.cli("submit", "--", "true")  # (not asked: nothing said)
    assert quiet.returncode == 0 and quiet.stderr == ""
    # With somewhere to send, nothing is said either.
    served.stop()
    (served.home / "config.toml").write_text('[notify]\ncommand = ["true"]\n')
    served.start("--simulate", "1xA100-80GB")
    sent = served.cli("submit", "--notify", "--", "true")
    assert sent.returncode == 0 and sent.stderr == ""
