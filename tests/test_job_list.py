"""Job lists: slim rows, paging by key and by offset, filter and sort served by SQLite, and
the CLI's paging, against a real engine, its socket and its SQLite file."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpulayer_tui.client import ApiError, Client
from gpulayer_tui.engine.api import ApiServer
from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.models import JobQuery
from gpulayer_tui.engine.store import job_row_json
from gpulayer_tui.widgets.job_columns import SORTS, filter_haystack, filter_matches, sort_value
from gpulayer_tui.wire import ROW_SPEC_KEYS

from .conftest import EngineFactory, Served, eventually
from .raw_http import request

# Names, exits and VRAM chosen to tie: equal names, equal VRAM, equal status.
HISTORY: list[dict[str, Any]] = [
    {"name": "Beta", "command": ["true"], "vram_gb": 2},
    {"name": "alpha", "command": ["false"]},
    {"name": "beta", "shell": "echo 100%_done", "vram_gb": 2},
    {
        "name": "gamma",
        "command": ["python3", "-c", "pass"],
        "vram_gb": 1.5,
        "project": "p1",
        "priority": 5,
    },
    {"name": "alpha", "command": ["true"], "gpus": 2},
    {"name": "delta", "command": ["sh", "-c", "exit 3"], "priority": -2},
    {"name": "beta", "command": ["true"], "vram_gb": 2, "priority": 5},
]


@pytest.fixture
async def listed(make_engine: EngineFactory) -> AsyncIterator[tuple[Engine, Client]]:
    """An engine serving its socket, with HISTORY run to its end plus one job running and
    one queued behind it."""
    engine = await make_engine()
    server = ApiServer(engine, engine.paths.socket)
    await server.start()
    try:
        for spec in HISTORY:
            await engine.submit({**spec, "env": {"SECRET": "x" * 100}, "cwd": "/tmp"})
        ids = [j.id for j in await engine.list_jobs()]
        await eventually(lambda: all(engine.book.get(i) is None for i in ids), timeout=20)
        await engine.submit({"name": "runner", "command": ["sleep", "60"], "gpus": 2})
        await engine.submit({"name": "waiter", "command": ["true"], "gpus": 2})
        yield engine, Client(engine.paths)
    finally:
        await server.stop()


async def _all(engine: Engine, **query: Any) -> list[dict[str, Any]]:
    return [row async for chunk in engine.job_rows(JobQuery(**query)) for row in chunk]


async def test_rows_carry_what_a_table_shows_and_the_job_carries_its_whole_spec(
    listed: tuple[Engine, Client],
) -> None:
    engine, client = listed
    page = await asyncio.to_thread(client.jobs_page, limit=100)
    assert page["more"] is False and len(page["jobs"]) == len(HISTORY) + 2
    for row in page["jobs"]:
        assert set(row["spec"]) <= set(ROW_SPEC_KEYS), row["spec"]
        assert "env" not in row["spec"] and "cwd" not in row["spec"]
    shell_job = next(r for r in page["jobs"] if r["spec"].get("shell"))
    assert shell_job["spec"] == {"shell": "echo 100%_done", "vram_gb": 2, "priority": 0}
    # What scripts sort and group by comes too (jobs --json rows had no priority, project
    # or submission time).
    gamma = next(r for r in page["jobs"] if r["name"] == "gamma")
    assert gamma["spec"]["project"] == "p1" and gamma["created_at"] > 0
    detail = await asyncio.to_thread(client.job, shell_job["id"])
    assert detail["job"]["spec"]["env"]["SECRET"] == "x" * 100
    assert detail["job"]["spec"]["cwd"] == "/tmp"
    # A stored row read by SQLite is the same JSON as the job's own row; it is the whole
    # job less what a table does not show.
    for row in page["jobs"]:
        job = await engine.get(row["id"])
        # (plus, for a job seen holding a GPU, what it used: see tests/test_usage.py)
        assert {k: v for k, v in row.items() if k != "use"} == job.to_row()
        assert "use" not in row or job.gpus
        whole = job.to_json()
        assert set(whole) - set(row) - {"kill_at"} == {
            "priority",
            "queued_at",
            "stop_reason",
        }
        assert ("kill_at" in row) == (whole["kill_at"] is not None)
        for key, value in row.items():
            if key.endswith("_at") and value is not None:  # rows carry milliseconds
                assert abs(whole[key] - value) <= 0.0005, key  # type: ignore[literal-required]
            elif key not in ("spec", "use"):  # (use: the summary's figures, not the job's)
                assert whole[key] == value, key  # type: ignore[literal-required]


async def test_paging_by_key_visits_every_job_once_in_order(
    listed: tuple[Engine, Client],
) -> None:
    _, client = listed
    newest_first = [r["id"] for r in await asyncio.to_thread(client.jobs, None, 100)]
    assert newest_first == sorted(newest_first, reverse=True)
    walked = [
        r["id"]
        for page in await asyncio.to_thread(lambda: list(client.iter_jobs(100, page_size=3)))
        for r in page
    ]
    assert walked == newest_first
    forward = await asyncio.to_thread(
        lambda: [r["id"] for p in client.iter_jobs(100, page_size=2, after=0) for r in p]
    )
    assert forward == newest_first[::-1]
    page = await asyncio.to_thread(client.jobs_page, limit=3, before=newest_first[2])
    assert [r["id"] for r in page["jobs"]] == newest_first[3:6] and page["more"] is True
    last = await asyncio.to_thread(client.jobs_page, limit=3, before=newest_first[-3])
    assert [r["id"] for r in last["jobs"]] == newest_first[-2:] and last["more"] is False
    by_offset = await asyncio.to_thread(client.jobs_page, limit=4, offset=4)
    assert [r["id"] for r in by_offset["jobs"]] == newest_first[4:8]


async def test_status_and_text_filters_are_served_by_sqlite(
    listed: tuple[Engine, Client],
) -> None:
    engine, _ = listed
    failed = await _all(engine, statuses=("failed",))
    assert sorted(r["name"] for r in failed) == ["alpha", "delta"]
    # LIKE's wildcards are plain text; any case; the command as a shell shows it.
    assert [r["name"] for r in await _all(engine, text="100%_")] == ["beta"]
    assert await _all(engine, text="0%x") == []
    assert {r["name"] for r in await _all(engine, text="BETA")} == {"beta", "Beta"}
    assert [r["name"] for r in await _all(engine, text="python3 -c")] == ["gamma"]
    assert [r["name"] for r in await _all(engine, text="with CODE 3")] == ["delta"]
    # The termination reason, as stored and as shown ("failed (exit code)"): h174.
    ended = {r["name"] for r in await _all(engine) if r["termination_reason"] == "exit_code"}
    assert ended >= {"alpha", "delta"}
    assert {r["name"] for r in await _all(engine, text="exit code")} == ended
    assert {r["name"] for r in await _all(engine, text="EXIT_CODE")} == ended
    running = await _all(engine, statuses=("running",))
    assert [r["name"] for r in running] == ["runner"]
    queued = await _all(engine, statuses=("queued", "pending"), text="wait")
    assert [r["name"] for r in queued] == ["waiter"]


async def test_the_text_filter_matches_what_the_tuis_filter_matches(
    listed: tuple[Engine, Client],
) -> None:
    # Status and domain names too (issue 20), and the engine and the TUI agree on every
    # text: what the engine serves for a filter is what the table shows for it.
    engine, _ = listed
    # (it waits for gpu1, which the runner holds)
    await engine.submit({"name": "pinned", "command": ["true"], "gpus": 1, "domain": ["gpu1"]})
    # Letters past ASCII in any case (SQLite's LIKE folded ASCII only: "éclair" missed it).
    for name in ("Éclair", "Обучение", "Straße"):
        done = await engine.submit({"name": name, "command": ["true"], "gpus": 0})
        await engine.wait(done.id, timeout=20)  # (its status is matched too)
    # A command holding a byte that is not UTF-8 (stored as a "\udcff" escape): every
    # search past ASCII then failed, "the engine's database failed".
    for odd in ({"command": ["echo", "odd\udcff"]}, {"shell": "echo odd\udcff"}):
        done = await engine.submit({**odd, "name": "odd", "gpus": 0})
        await engine.wait(done.id, timeout=20)
    # Since a time: only the jobs submitted at or after it.
    newest = max(await _all(engine), key=lambda r: r["id"])
    # (a row's created_at is rounded to the millisecond: maybe past the stored time)
    since = [r["id"] for r in await _all(engine, since=newest["created_at"] - 0.001)]
    assert since == [newest["id"]]
    # A project is looked in (stored, and found nowhere: tester h69).
    swept = {"name": "lr-1", "project": "Sweep-7", "command": ["true"], "gpus": 0}
    done = await engine.submit(swept)
    await engine.wait(done.id, timeout=20)
    # So is the owner's user name (a shared box's users looked for their jobs by name:
    # tester h179); `daemon` (uid 1) owns one job here (waiting, as "pinned" does), the
    # engine's user the rest.
    theirs = {"name": "theirs", "command": ["true"], "gpus": 1, "domain": ["gpu1"]}
    await engine.submit(theirs, owner_uid=1)
    assert [r["name"] for r in await _all(engine, text="DAEMON")] == ["theirs"]
    every = await _all(engine)
    assert [r["name"] for r in await _all(engine, text="sweep-7")] == ["lr-1"]
    runner = next(r for r in every if r["name"] == "runner")
    assert sorted(runner["domains"]) == ["gpu0", "gpu1"]  # (in placement order: freest first)
    assert {r["name"] for r in await _all(engine, text="FAIL")} == {"alpha", "delta"}
    assert {r["name"] for r in await _all(engine, text="gpu0")} >= {"runner"}
    assert "pinned" in {r["name"] for r in await _all(engine, text="gpu1")}
    for text in (
        "fail",
        "complete",
        "queued",
        "run",
        "gpu",
        "gpu1",
        "cpu",
        '"',
        ",",
        "[",
        "@",
        "true",
        "python3 -c",
        "sh -c exit",
        "1",
        "%",
        "_",
        "éclair",
        "ÉCLAIR",
        "обучение",
        "STRASSE",
        "straße",
        "sweep",
        "exit code",  # (the termination reason as shown: "failed (exit code)"; h174)
        "exit_code",
        "daemon",
        "aemo",
        pwd.getpwuid(os.geteuid()).pw_name,
    ):
        served = {r["id"] for r in await _all(engine, text=text)}
        shown = {r["id"] for r in every if filter_matches(text, filter_haystack(r))}  # type: ignore[arg-type]
        assert served == shown, text
        if text in ("éclair", "ÉCLAIR", "обучение", "straße"):
            assert served, text
    assert len(await _all(engine, text="ODD")) == 2  # (ASCII: SQLite's own LIKE)
    # A filter that is not UTF-8 text is refused by name (it reached the database: 503,
    # "the database failed"); over HTTP a byte that is not UTF-8 reads as U+FFFD, which
    # is what such a byte in a job's text is matched as.
    with pytest.raises(ValueError, match="q: the text filter is not UTF-8 text"):
        JobQuery(text="ab\udcff").check()
    status, data = await asyncio.to_thread(request, engine.paths.socket, "GET", "/v1/jobs?q=%FF")
    assert status == 200 and {r["name"] for r in data["jobs"]} == {"odd"}, (status, data)


@pytest.mark.parametrize("sort", list(SORTS))
async def test_each_sort_orders_as_the_table_does(listed: tuple[Engine, Client], sort: str) -> None:
    engine, _ = listed
    # A running job's runtime grows between two reads (and between two pages): under the
    # runtime sort, the ended and waiting jobs are compared.
    held = ("completed", "failed", "queued") if sort == "runtime" else ()
    for descending in (True, False):
        now = time.time()
        rows = await _all(engine, sort=sort, descending=descending, statuses=held, limit=100)
        assert len(rows) == len(HISTORY) + (1 if held else 2)
        expected = sorted(rows, key=lambda j: sort_value(sort, j, now), reverse=descending)
        assert [r["id"] for r in rows] == [r["id"] for r in expected], (sort, descending)
        # Pages by offset of the same order join up to the whole order.
        paged: list[int] = []
        for offset in range(0, len(rows) + 3, 3):
            page = await _all(
                engine, sort=sort, descending=descending, statuses=held, offset=offset, limit=3
            )
            paged += [r["id"] for r in page[:3]]
        assert paged == [r["id"] for r in rows]


@pytest.mark.parametrize(
    ("query", "field", "says"),
    [
        ("sort=size", "sort", "unknown sort 'size'"),
        ("status=done", "status", "unknown status 'done'"),
        ("before=3&after=1", "after", "before or after, not both"),
        ("sort=name&before=3", "sort", "page other sorts with offset"),
        ("before=3&offset=2", "offset", "not both"),
        ("order=up", "order", "asc or desc"),
        ("limit=x", "limit", "integer"),
        ("before=-1", "before", "negative"),
        ("q=first%00nomatch", "q", "q contains a NUL byte"),  # (LIKE stopped at the NUL)
    ],
)
async def test_a_bad_list_query_is_refused_and_names_its_field(
    listed: tuple[Engine, Client], query: str, field: str, says: str
) -> None:
    _, client = listed
    with pytest.raises(ApiError) as refused:
        await asyncio.to_thread(client.request, "GET", "/jobs?" + query)
    assert refused.value.status == 400 and says in str(refused.value)
    status, body = await asyncio.to_thread(request, client.paths.socket, "GET", "/v1/jobs?" + query)
    assert status == 400 and body["field"] == field


async def test_a_page_is_capped_and_says_there_is_more(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    await engine.submit_many([{"command": ["true"]} for _ in range(30)])
    rows = await _all(engine, limit=20)
    assert len(rows) == 21  # the one past the limit is the caller's "more"
    with pytest.raises(ValueError, match="limit: must be 1-10000"):
        JobQuery(limit=10_001).check()


def test_job_row_json_reads_a_row_without_its_spec_fields() -> None:
    row = (7, "n", "command", "queued", None, None, "", "[]", "[]", None, None, None, None)
    row += (None, "[" + ",".join(["null"] * len(ROW_SPEC_KEYS)) + "]", None, 1000, 5.0)
    read = job_row_json(row)
    assert read["spec"] == {} and read["owner_uid"] == 1000 and read["created_at"] == 5.0
    assert job_row_json((*row[:-2], None, 5.0))["owner_uid"] == os.geteuid()  # (the engine's)


def test_the_cli_pages_filters_and_prints_json_rows(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served.start("--simulate", "1xA100-80GB")
    out = served.cli("submit", "--file", "-", input="".join(f"echo job {i}\n" for i in range(7)))
    assert out.returncode == 0, out.stderr
    for job_id in range(1, 8):
        assert served.cli("wait", str(job_id)).returncode == 0
    first = served.cli("jobs", "--limit", "3")
    assert [line.split()[0] for line in first.stdout.splitlines()[1:]] == ["7", "6", "5"]
    assert first.stderr.strip() == "older: --before 5"
    # The last full page says nothing of older ones when there are none (it told to look
    # at a page that answered "no jobs").
    last = served.cli("jobs", "--limit", "4", "--before", "5")
    assert [line.split()[0] for line in last.stdout.splitlines()[1:]] == ["4", "3", "2", "1"]
    assert last.stderr == ""
    second = served.cli("jobs", "--limit", "3", "--before", "5", "--json")
    rows = json.loads(second.stdout)
    assert [r["id"] for r in rows] == [4, 3, 2]
    assert len(second.stdout.splitlines()) == 5  # "[", a row per line, "]"
    # As the table does, on stderr: more follow (a script reading --json could not tell).
    assert second.stderr.strip() == "older: --before 2"
    by_name = served.cli("jobs", "--sort", "name", "--limit", "3", "--json")
    assert by_name.stderr.strip() == "more: --page 2"
    assert served.cli("jobs", "--sort", "name", "--page", "3", "--limit", "3").stderr == ""
    page3 = json.loads(served.cli("jobs", "--limit", "3", "--page", "3", "--json").stdout)
    assert [r["id"] for r in page3] == [1]
    # A page past the end says so ("no jobs" alone read as an empty list: tester h123).
    past = served.cli("jobs", "--limit", "3", "--page", "1000")
    assert (past.stdout, past.stderr) == ("", "page 1000 is past the end of the list\n")
    # An empty list is said on stderr: `jobs | wc -l` counted "no jobs" as a row (h178).
    none = served.cli("jobs", "--status", "failed")
    assert (none.returncode, none.stdout, none.stderr) == (0, "", "no jobs\n")
    # Each way of paging is told its own next step (--page 2 was told --before; --after
    # and --reverse nothing).
    page2 = served.cli("jobs", "--limit", "2", "--page", "2")
    assert page2.stderr.strip() == "more: --page 3"
    newer = served.cli("jobs", "--limit", "2", "--after", "3")
    assert [line.split()[0] for line in newer.stdout.splitlines()[1:]] == ["4", "5"]
    assert newer.stderr.strip() == "newer: --after 5"
    assert served.cli("jobs", "--reverse", "--limit", "2").stderr.strip() == "more: --page 2"
    forward = json.loads(served.cli("jobs", "--after", "5", "--json").stdout)
    assert [r["id"] for r in forward] == [6, 7]
    found = json.loads(served.cli("jobs", "--filter", "JOB 4", "--json").stdout)
    assert [r["id"] for r in found] == [5]
    assert json.loads(served.cli("jobs", "--filter", "nothing", "--json").stdout) == []
    # --since AGO: jobs submitted in the last AGO ("yesterday's failed run" had no way but
    # --json and epoch arithmetic: tester h69); the API's since is epoch seconds.
    recent = json.loads(served.cli("jobs", "--since", "1h", "--json", "--limit", "100").stdout)
    assert len(recent) == len(json.loads(served.cli("jobs", "--json", "--limit", "100").stdout))
    from gpulayer_tui.engine.paths import resolve_paths

    monkeypatch.setenv("GPULAYER_HOME", str(served.home))  # (the served engine's)
    client = Client(resolve_paths())
    assert client.jobs_page(since=int(time.time()) + 3600)["jobs"] == []
    with pytest.raises(ApiError, match="since must not be negative"):
        client.jobs_page(since=-1)
    # A time with a fraction, as every time the API answers has (tester h71: "must be an
    # integer"). (A row's created_at is rounded to the millisecond: one less is before it.)
    newest = recent[0]
    page = client.jobs_page(since=newest["created_at"] - 0.001)["jobs"]
    assert page[0]["id"] == newest["id"]
    with pytest.raises(ApiError, match="since must be a time in epoch seconds, not 'soon'"):
        client.jobs_page(since="soon")
    by_name = served.cli("jobs", "--sort", "id", "--reverse", "--limit", "2", "--json")
    assert [r["id"] for r in json.loads(by_name.stdout)] == [1, 2]
    mixed = served.cli("jobs", "--sort", "name", "--before", "3")
    assert mixed.returncode == 2 and "use --page with --sort" in mixed.stderr
    # The highest priority first, ties newest first (as the TUI's table starts it); the
    # PRIO column says it.
    for priority in ("3", "-1"):
        assert served.cli("submit", "--priority", priority, "--", "true").returncode == 0
    by_priority = served.cli("jobs", "--sort", "priority", "--limit", "3", "--json")
    assert [r["id"] for r in json.loads(by_priority.stdout)] == [8, 7, 6]
    lowest = served.cli("jobs", "--sort", "priority", "--reverse", "--limit", "2")
    assert [line.split()[0] for line in lowest.stdout.splitlines()] == ["ID", "9", "1"]
    assert lowest.stdout.splitlines()[1].split()[4] == "-1"  # (ID NAME USER STATUS PRIO)


async def test_a_row_carries_kill_at_only_while_a_stop_is_under_way(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine()
    stubborn = await engine.submit({"shell": "trap '' TERM; sleep 60"})
    await eventually(lambda: engine.book.get(stubborn.id).job.pid is not None)  # type: ignore[union-attr]
    before = await _all(engine)
    assert "kill_at" not in before[0]
    await engine.cancel(stubborn.id)
    during = (await _all(engine))[0]
    live = engine.book.get(stubborn.id)
    assert live is not None and live.job.kill_at is not None
    assert during["kill_at"] == round(live.job.kill_at, 3) and during["status"] == "running"


async def test_an_active_status_filter_reads_the_active_index_not_all_history(
    make_engine: EngineFactory,
) -> None:
    import sqlite3

    from gpulayer_tui.engine import store

    engine = await make_engine()
    await engine.stop()
    db = sqlite3.connect(engine.paths.database)
    (index_sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs_active'").fetchone()
    # The condition the query repeats is the index's own, character for character ...
    assert " ".join(index_sql.split()).endswith("WHERE " + store._ACTIVE_INDEX_WHERE)
    # ... so the planner searches the index (a scan would read every finished job).
    plan = db.execute(
        f"EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE {store._ACTIVE_INDEX_WHERE} "
        "AND status IN ('queued') ORDER BY id DESC LIMIT 501"
    ).fetchall()
    assert "USING COVERING INDEX jobs_active" in str(plan)
    db.close()


def test_the_client_lists_an_older_engines_jobs_which_have_no_more_flag(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine from before paged lists (still serving while a new CLI is installed)
    answers ``{"jobs": [...]}`` without ``more``: that is the whole list, no traceback."""
    import socketserver
    import threading
    from http.server import BaseHTTPRequestHandler

    from gpulayer_tui.engine.paths import resolve_paths

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path))
    paths = resolve_paths()
    old_rows = [{"id": 2, "name": "b"}, {"id": 1, "name": "a"}]

    class OldEngine(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = json.dumps({"jobs": old_rows}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self) -> Any:
            sock, _ = self.socket.accept()
            return sock, ("local", 0)

    with Server(str(paths.socket), OldEngine) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            pages = list(Client(paths, timeout=10).iter_jobs(limit=100))
        finally:
            server.shutdown()
    assert pages == [old_rows]


@pytest.mark.parametrize(
    ("spec", "gpus", "shown"),
    [
        ({"gpus": 2}, [], "\N{MULTIPLICATION SIGN}2"),
        ({"gpus": 1}, [0, 3], "#0,3"),
        ({}, [], ""),
        # As the engine resolves them: a GPU pin or a VRAM figure asks for one GPU (the
        # cell was empty), and a service's GPUs are its replicas' together (it said x1).
        ({"domain": "gpu1"}, [], "\N{MULTIPLICATION SIGN}1"),
        ({"domain": ["gpu1", "gpu2"]}, [], "\N{MULTIPLICATION SIGN}1"),
        ({"vram_gb": 20}, [], "\N{MULTIPLICATION SIGN}1"),
        ({"domain": "cpu"}, [], ""),
        ({"gpus": 1, "replicas": 2}, [], "\N{MULTIPLICATION SIGN}2"),
        ({"gpus": 0, "replicas": 4}, [], ""),
    ],
)
def test_the_gpus_cell_says_where_a_job_runs_or_what_it_asks_for(
    spec: dict[str, Any], gpus: list[int], shown: str
) -> None:
    from gpulayer_tui.formatting import gpus_text

    assert gpus_text({"spec": spec, "gpus": gpus}) == shown  # type: ignore[typeddict-item]


def test_the_cli_offers_every_sort_the_engine_takes() -> None:
    from gpulayer_tui.cli.grammar import build_parser
    from gpulayer_tui.wire import JOB_SORTS

    parser = build_parser(only="jobs")
    for sort in JOB_SORTS:
        assert parser.parse_args(["jobs", "--sort", sort]).sort == sort
