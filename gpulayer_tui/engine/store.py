"""SQLite state (WAL): the one source of truth, with versioned migrations.

Writes go through a group-commit writer: callers enqueue a job snapshot plus the events it
caused; one writer task commits everything queued so far in a single transaction and only
then publishes those events and runs the *after-commit* callbacks (a launch, a signal: the
decision is durable before it is acted on). So every transition is durable before anyone
sees it, and a burst of 500 transitions costs one commit instead of 500.

The writer's transaction runs as one call on its own thread with a plain ``sqlite3``
connection: one thread hop per commit (aiosqlite would hop once per statement). A job's
row is inserted once, with its spec; later snapshots update only the columns that change.
Its environment is stored once per distinct environment (``envs``), which the jobs of a
sweep, sent from one shell, share: it was most of each row, about 4 KB a job. Reads use
a second connection (aiosqlite), which in WAL mode sees only committed data.

Why this module is longer than ~400 lines: the schema, its migrations, the one writer
and the reads that must agree with it (a timeline merges what is committed with what is
queued) change together; most of the length is the schema and the column lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from .. import __version__
from ..formatting import user_name
from ..wire import (
    ACTIVE_STATUSES,
    ROW_SPEC_KEYS,
    STATUS_RANK,
    JobRowJSON,
    UsageJSON,
    UsageSummaryJSON,
)
from .errors import StoreError, WriteDeferred
from .models import (
    Event,
    EventKind,
    Job,
    JobKind,
    JobQuery,
    JobStatus,
    KnownGpu,
    TerminationReason,
)
from .worker_thread import WorkerThread

log = logging.getLogger(__name__)


def _free_space_note(path: Path) -> str:
    """What is free where the database lives, when little is: SQLite says "disk I/O
    error" for some writes a full disk refused (a migration's, with a few KiB left)."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= 64 * 1024 * 1024:
        return ""
    return f" ({free // 1024} KiB free on its disk: it is likely full)"


_DAMAGED_ADVICE = (
    "Move it aside to start with an empty history (jobs/ keeps the logs), or restore a "
    "copy; `sqlite3 FILE .recover` may save what is readable."
)

SCHEMA_VERSION = 14

ALIVE_NOTE_S = 30.0
"""How often an idle engine notes in the database that it is alive (whole seconds): what
a killed engine is known to have run until, within this."""
SEEN_RUN_SETTING = "alive.run"
SEEN_AT_SETTING = "alive.at"

# jobs_active's condition, exactly as created: a query that repeats it may use the index.
_ACTIVE_INDEX_WHERE = "status IN ('pending', 'queued', 'running')"

# Index i holds the statements that move the schema from version i to i + 1. Never edit a
# released step; append a new one.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            status TEXT NOT NULL,
            termination_reason TEXT,
            exit_code INTEGER,
            message TEXT NOT NULL DEFAULT '',
            domains TEXT NOT NULL DEFAULT '[]',
            gpus TEXT NOT NULL DEFAULT '[]',
            priority INTEGER NOT NULL DEFAULT 0,
            pid INTEGER,
            start_ticks INTEGER,
            created_at REAL NOT NULL,
            queued_at REAL,
            started_at REAL,
            ended_at REAL,
            owner_uid INTEGER,
            spec TEXT NOT NULL
        )""",
        # Partial index: restart and the scheduler only ever look for active rows, and
        # this keeps that lookup independent of how much history there is.
        """CREATE INDEX jobs_active ON jobs(status)
            WHERE status IN ('pending', 'queued', 'running')""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            job_id INTEGER,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            status TEXT,
            reason TEXT,
            message TEXT,
            data TEXT
        )""",
        "CREATE INDEX events_job ON events(job_id, id)",
        """CREATE TABLE engine_runs (
            id INTEGER PRIMARY KEY,
            pid INTEGER NOT NULL,
            version TEXT NOT NULL,
            started_at REAL NOT NULL,
            stopped_at REAL
        )""",
    ],
    # 1 -> 2: drained and quarantined domains survive an engine restart.
    [
        """CREATE TABLE domain_state (
            name TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            reason TEXT NOT NULL,
            at REAL NOT NULL
        )""",
    ],
    # 2 -> 3: services keep their replicas (state, pid, port, restarts) and placements.
    [
        "ALTER TABLE jobs ADD COLUMN replicas TEXT",
        "ALTER TABLE jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
    ],
    # 3 -> 4: a stop (cancel, timeout) and its SIGKILL deadline survive a restart; the
    # largest job id is kept apart from the rows, so cleaning history never reuses an id.
    [
        "ALTER TABLE jobs ADD COLUMN stop_reason TEXT",
        "ALTER TABLE jobs ADD COLUMN stop_message TEXT",
        "ALTER TABLE jobs ADD COLUMN kill_at REAL",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        "CREATE INDEX jobs_ended ON jobs(ended_at) WHERE ended_at IS NOT NULL",
    ],
    # 4 -> 5: a submission's idempotency key, so a retry after a lost answer (even across
    # an engine restart) returns the jobs the first attempt made.
    [
        "ALTER TABLE jobs ADD COLUMN submit_key TEXT",
        "CREATE INDEX jobs_submit_key ON jobs(submit_key) WHERE submit_key IS NOT NULL",
    ],
    # 5 -> 6: what each GPU job used (issue 17): its summary, apart for lists, and its
    # bounded per-GPU series.
    [
        """CREATE TABLE job_usage (
            job_id INTEGER PRIMARY KEY,
            summary TEXT NOT NULL,
            record TEXT NOT NULL
        )""",
    ],
    # 6 -> 7: a cluster job's id on its cluster (issue 16), so a restarted engine finds
    # every cluster job again.
    [
        "ALTER TABLE jobs ADD COLUMN cluster_job_id TEXT",
    ],
    # 7 -> 8: a drained or quarantined state follows its GPU (by UUID) when the config
    # renames its domain, live or while no engine ran (stored by name alone, a renamed
    # domain came back in service after a restart and the old name kept a stale state).
    [
        "ALTER TABLE domain_state ADD COLUMN gpu_uuid TEXT",
        # What a submission with an idempotency key asked for: the key reused for another
        # request is refused, not answered with the first one's jobs.
        "ALTER TABLE jobs ADD COLUMN submit_digest TEXT",
    ],
    # 8 -> 9: an operator's drain kept under a quarantine (the quarantine's release put
    # the domain back in service: the drain, and its reason, were lost).
    [
        "ALTER TABLE domain_state ADD COLUMN drain_reason TEXT",
    ],
    # 9 -> 10: each user's fair-share use, kept as it is booked (rebuilt from the job rows
    # alone, it lost what `clean` removed, and a preempted job's earlier runs).
    [
        """CREATE TABLE fair_usage (
            uid INTEGER PRIMARY KEY,
            gpu_seconds REAL NOT NULL,
            at REAL NOT NULL
        )""",
    ],
    # 10 -> 11: the idempotency keys of submissions whose jobs `clean` removed (a retry
    # got a 500, an empty answer, or, after a restart, a second run of the request).
    # owner_uid -1: an in-process submission (no peer).
    [
        """CREATE TABLE spent_keys (
            key TEXT NOT NULL,
            owner_uid INTEGER NOT NULL,
            digest TEXT,
            removed_at REAL NOT NULL,
            PRIMARY KEY (key, owner_uid)
        )""",
    ],
    # 11 -> 12: the jobs whose rows `clean` deleted and whose files are still to go (it
    # committed the rows first: killed before the unlinking, it left their files for ever).
    ["CREATE TABLE files_owed (job_id INTEGER PRIMARY KEY)"],
    # 12 -> 13: every GPU that had a domain here (by UUID, with its last domain's name):
    # one the driver no longer lists is capacity that may come back (a job needing it
    # waits instead of failing over capacity), until the operator forgets it. Seeded
    # from the domain states, which kept each GPU's UUID since 7 -> 8.
    [
        """CREATE TABLE known_gpus (
            gpu_uuid TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            gpu_index INTEGER,
            memory_bytes INTEGER,
            seen_at REAL NOT NULL
        )""",
        "INSERT INTO known_gpus (gpu_uuid, name, seen_at) "
        "SELECT gpu_uuid, name, at FROM domain_state WHERE gpu_uuid IS NOT NULL",
    ],
    # 13 -> 14: each distinct environment stored once (by the digest of its JSON), the
    # jobs naming it: the whole environment a CLI sends was most of every row. Rows
    # from before keep theirs in the spec.
    [
        """CREATE TABLE envs (
            id INTEGER PRIMARY KEY,
            digest TEXT NOT NULL UNIQUE,
            env TEXT NOT NULL
        )""",
        "ALTER TABLE jobs ADD COLUMN env_id INTEGER",
        "CREATE INDEX jobs_env ON jobs(env_id) WHERE env_id IS NOT NULL",
    ],
]

RECLAIM_PAGES = 512
"""Free pages a clean gives back per step on the writer (2 MiB of 4 KiB pages: 10-120 ms
here, idle to loaded, so commits wait no longer than that between steps; 300 MiB take
10-20 s in all, the clean's answer after them)."""

SPENT_KEY_DAYS = 7
"""How long the key of a submission whose jobs were cleaned is still refused (a retry
comes seconds after the lost answer, not weeks)."""

# The order `clean --keep N` and [history] keep_jobs count finished jobs in: by when they
# ended, not by id (a long run submitted early and ended last is the newest finished job;
# ranked by id it went first, its log an hour after it ended).
_ENDED_LAST_FIRST = "COALESCE(ended_at, created_at) DESC, id DESC"

_JOB_COLUMNS = (
    "id, name, kind, status, termination_reason, exit_code, message, domains, gpus, "
    "priority, pid, start_ticks, created_at, queued_at, started_at, ended_at, owner_uid, spec, "
    "replicas, attempt, stop_reason, stop_message, kill_at, cluster_job_id, "
    "(SELECT env FROM envs WHERE envs.id = jobs.env_id)"
)
# What changes after a job is created (the rest, its spec above all, is written once).
_DYNAMIC = (
    "status",
    "termination_reason",
    "exit_code",
    "message",
    "domains",
    "gpus",
    "pid",
    "start_ticks",
    "queued_at",
    "started_at",
    "ended_at",
    "replicas",
    "attempt",
    "stop_reason",
    "stop_message",
    "kill_at",
    "cluster_job_id",
)
_STATIC = (
    "id",
    "name",
    "kind",
    "priority",
    "created_at",
    "owner_uid",
    "spec",
    "env_id",  # (the row carries the environment's JSON: see Store._env_ids)
    "submit_key",
    "submit_digest",
)
_ENV_AT = _STATIC.index("env_id")
_INSERT = (
    f"INSERT INTO jobs ({', '.join(_STATIC + _DYNAMIC)}) "
    f"VALUES ({', '.join('?' * (len(_STATIC) + len(_DYNAMIC)))}) "
    f"ON CONFLICT(id) DO UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in _DYNAMIC)}"
)
_UPDATE = f"UPDATE jobs SET {', '.join(f'{c}=?' for c in _DYNAMIC)} WHERE id=?"
# An edit's statement (its environment's JSON is made an id on the writer: see _env_id).
_EDIT_SPEC = "UPDATE jobs SET spec=?, env_id=?, name=?, priority=?, replicas=? WHERE id=?"
_INSERT_EVENT = (
    "INSERT INTO events (id, job_id, at, kind, status, reason, message, data) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


# Events that are history (the timeline, domain and config changes); the rest (queued
# reason refreshes, GPU samples) are only published.
STORED_KINDS = frozenset(
    {
        EventKind.SUBMITTED,
        EventKind.TRANSITION,
        EventKind.REPLICA,
        EventKind.LOG,
        EventKind.IDLE,
        EventKind.EDITED,
        EventKind.PREEMPTION,
        EventKind.DOMAIN,
        EventKind.CONFIG,
    }
)


RETRY_FIRST_S = 0.25  # a failed commit is tried again after this, doubling up to:
RETRY_MAX_S = 5.0


def _escaped(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` with text that UTF-8 cannot encode written as ``\\udcff`` escapes."""
    return tuple(
        v.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(v, str) else v
        for v in values
    )


_last_env: list[Any] = [None, ""]  # the last environment encoded, and its JSON


def _spec_and_env(spec: dict[str, Any]) -> tuple[str, str | None]:
    """A spec's JSON without its environment, and the environment's JSON (``None``: none,
    or an empty one, kept in the spec)."""
    env = spec.get("env")
    if not env:
        return json.dumps(spec), None
    # (a batch's jobs share one environment dict, never changed in place: encoded once;
    # the reference kept here keeps its identity from being reused)
    if env is not _last_env[0]:
        _last_env[:] = [env, json.dumps(env, sort_keys=True)]
    return json.dumps({k: v for k, v in spec.items() if k != "env"}), str(_last_env[1])


def _static_row(job: Job) -> tuple[Any, ...]:
    spec, env = _spec_and_env(job.spec)
    return (
        job.id,
        job.name,
        job.kind.value,
        job.priority,
        job.created_at,
        job.owner_uid,
        spec,
        env,
        job.submit_key,
        job.submit_digest,
    )


def _json_list(values: list[Any]) -> str:
    # Most snapshots are of jobs not placed yet, or without GPUs: skip the encoder.
    return json.dumps(values) if values else "[]"


def _dynamic_row(job: Job) -> tuple[Any, ...]:
    return (
        job.status.value,
        job.termination_reason.value if job.termination_reason else None,
        job.exit_code,
        job.message,
        _json_list(job.domains),
        _json_list(job.gpus),
        job.pid,
        job.start_ticks,
        job.queued_at,
        job.started_at,
        job.ended_at,
        job.replicas_json(),
        job.attempt,
        job.stop_reason.value if job.stop_reason else None,
        job.stop_message,
        job.kill_at,
        job.cluster_job_id,
    )


# A job's row (lists and events: see ROW_SPEC_KEYS), read without parsing its whole spec:
# SQLite picks the row's spec fields out in one JSON array.
_ROW_SELECT = (
    "SELECT id, name, kind, status, termination_reason, exit_code, message, domains, gpus, "
    "pid, started_at, ended_at, kill_at, replicas, json_extract(spec, "
    + ", ".join(f"'$.{key}'" for key in ROW_SPEC_KEYS)
    + "), (SELECT json_array(json_extract(summary, '$.peak_vram'), "
    "json_extract(summary, '$.util_mean'), json_extract(summary, '$.energy_wh')) "
    "FROM job_usage WHERE job_usage.job_id = jobs.id), owner_uid, created_at FROM jobs"
)
_STATUS_RANK_SQL = (
    "CASE status "
    + " ".join(f"WHEN '{status}' THEN {rank}" for status, rank in STATUS_RANK.items())
    + " ELSE 9 END"
)
# Each sort's SQL value, and whether ties go newest first when the sort ascends (the TUI's
# table breaks ties the same way, so a page from here is a true prefix of its order).
_SORT_SQL: dict[str, tuple[str, bool]] = {
    "id": ("id", False),
    "status": (_STATUS_RANK_SQL, True),
    "name": ("lower(name)", True),
    # Times as rows carry them (milliseconds), so jobs within a millisecond tie here too.
    "started": ("COALESCE(round(started_at, 3), 0)", False),
    # Whole milliseconds: SQLite's round() and Python's may differ in the last bit, and
    # two runtimes equal to the millisecond must tie here as in the TUI (then by id).
    "runtime": (
        "CASE WHEN started_at IS NULL THEN 0 "
        "ELSE MAX(0, CAST(round((COALESCE(round(ended_at, 3), :now) - round(started_at, 3))"
        " * 1000) AS INTEGER)) END",
        False,
    ),
    "vram": ("COALESCE(json_extract(spec, '$.vram_gb'), 0)", False),
    "priority": ("COALESCE(json_extract(spec, '$.priority'), 0)", False),
    # The user's name, as rows show it (a uid's order is not its name's).
    "user": ("COALESCE(gpulayer_user(owner_uid), '')", True),
    "kind": ("kind", True),
    "exit": ("COALESCE(exit_code, -1)", False),
}


def job_row_json(row: Sequence[Any]) -> JobRowJSON:
    """A job's row from a row selected with ``_ROW_SELECT``: the same JSON as
    ``Job.to_row()``."""
    values = json.loads(row[14]) if row[14] else ()
    out: JobRowJSON = {
        "id": row[0],
        "name": row[1],
        "kind": row[2],
        "status": row[3],
        "termination_reason": row[4],
        "exit_code": row[5],
        "message": row[6],
        "domains": json.loads(row[7]),
        "gpus": json.loads(row[8]),
        "pid": row[9],
        "started_at": None if row[10] is None else round(row[10], 3),
        "ended_at": None if row[11] is None else round(row[11], 3),
        "spec": {k: v for k, v in zip(ROW_SPEC_KEYS, values, strict=True) if v is not None},
        "owner_uid": row[16] if row[16] is not None else os.geteuid(),
        "created_at": round(row[17], 3),
    }
    if row[12] is not None:
        out["kill_at"] = round(row[12], 3)
    if row[2] == JobKind.SERVICE:
        # (less the removed replicas' counts kept with them: see Job.replicas_json)
        out["replicas"] = (
            [r for r in json.loads(row[13]) if not r.get("removed")] if row[13] else []
        )
    if row[15] is not None:
        peak, util, energy = json.loads(row[15])
        out["use"] = {"peak_vram": peak, "util_mean": util, "energy_wh": energy}
    return out


# What the text filter looks in: id, name, command, message, status, the termination
# reason (as stored, and as shown: "engine lost"), project and domain names (each domain
# held, each pinned to, @CLUSTER), and the owner's user name. The TUI's filter matches the same
# (widgets/job_columns.filter_haystack); each is a predicate on :text (a LIKE pattern).
def _text_matches(fold: str) -> tuple[str, ...]:
    """The filter's predicates, each value passed through the SQL function ``fold``
    (empty: as it is)."""

    def folded(value: str) -> str:
        # (As bytes: a command holding a byte that is not UTF-8 is stored as a "\udcff"
        # escape, which SQLite's JSON functions give back as bytes Python cannot decode;
        # passed as text, the call failed and every non-ASCII search with it.)
        return f"{fold}(CAST({value} AS BLOB))" if fold else value

    return tuple(
        f"{folded(value)} LIKE :text ESCAPE '\\'"
        for value in (
            "CAST(id AS TEXT)",
            "name",
            "message",
            "json_extract(spec, '$.shell')",
            # The command's words joined by spaces, as a shell shows it (and the TUI).
            "(SELECT group_concat(value, ' ') FROM json_each(jobs.spec, '$.command'))",
            "status",
            # ("failed (engine lost)" was shown and "engine lost" found nothing: h174)
            "termination_reason",
            "replace(termination_reason, '_', ' ')",
            # (a sweep's --project was stored and found nowhere: tester h69)
            "json_extract(spec, '$.project')",
            "'@' || json_extract(spec, '$.cluster')",
        )
    ) + tuple(
        # Each name alone (not the JSON text: '"' or ',' must not match every job).
        f"EXISTS (SELECT 1 FROM json_each({source}) WHERE {folded('value')} LIKE :text ESCAPE '\\')"
        for source in ("jobs.domains", "jobs.spec, '$.domain'")
    )


_TEXT_MATCHES = _text_matches("")
# The owner, by the uids whose user names hold the text (see Store._owners_named); a row
# with no owner stored is the engine's user's (as job_row_json says).
_OWNER_MATCHES = "COALESCE(owner_uid, :euid) IN (SELECT value FROM json_each(:owners))"
# SQLite's LIKE folds the case of ASCII letters only: a term with other letters is matched
# through Python's casefold (Éclair, Обучение), as the TUI's own filter matches; an ASCII
# term keeps the plain LIKE (no Python call per row).
FOLD_FUNCTION = "gpulayer_fold"
_FOLDED_TEXT_MATCHES = _text_matches(FOLD_FUNCTION)


def _fold(value: object) -> object:
    """A column's text (given as bytes), case-folded; what is not UTF-8 in it as U+FFFD
    (the result goes back to SQLite, which takes only valid text)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").casefold()
    return value.casefold() if isinstance(value, str) else value


def _user_name(uid: object) -> str | None:
    """A uid's user name, as job rows show it (for ``sort=user``)."""
    return user_name(uid) if isinstance(uid, int) else None


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def job_from_row(row: Sequence[Any]) -> Job:
    """Build a :class:`Job` from a row selected with the full column list."""
    job = Job(
        id=row[0],
        name=row[1],
        kind=JobKind(row[2]),
        status=JobStatus(row[3]),
        termination_reason=TerminationReason(row[4]) if row[4] else None,
        exit_code=row[5],
        message=row[6],
        domains=json.loads(row[7]),
        gpus=json.loads(row[8]),
        priority=row[9],
        pid=row[10],
        start_ticks=row[11],
        created_at=row[12],
        queued_at=row[13],
        started_at=row[14],
        ended_at=row[15],
        owner_uid=row[16],
        spec=_with_env(json.loads(row[17]), row[24]),
        attempt=row[19] or 0,
        stop_reason=TerminationReason(row[20]) if row[20] else None,
        stop_message=row[21] or "",
        kill_at=row[22],
        cluster_job_id=row[23],
    )
    job.replicas_from_json(row[18])
    return job


def _with_env(spec: dict[str, Any], env: str | None) -> dict[str, Any]:
    if env is not None:
        spec["env"] = json.loads(env)
    return spec


@dataclass(slots=True)
class _Row:
    """A job's snapshot: what changes, and (the first time) what never does."""

    job_id: int
    dynamic: tuple[Any, ...]
    static: tuple[Any, ...] | None = None


@dataclass(slots=True)
class _Write:
    row: _Row | None
    events: list[Event]  # published after the commit
    done: asyncio.Future[None] | None
    statements: list[tuple[str, tuple[Any, ...]]] | None = None
    # The history events among ``events`` (stored), each with the row id it will get: ids
    # are given when queued, so a read can merge what is committed with what is not yet.
    history: list[tuple[int, Event]] | None = None
    # Run once what came before is durable (a launch, a signal: acted on only then).
    then: Callable[[], None] | None = None
    # Run on the writer's thread right after the COMMIT, before ``then`` (see after_commit).
    early: Callable[[], None] | None = None


def _timeline_entry(ev: Event) -> dict[str, Any]:
    return {
        "at": ev.at,
        "kind": ev.kind.value,
        "status": ev.data.get("status"),
        "reason": ev.data.get("reason"),
        "message": ev.data.get("message"),
        "data": ev.data,
    }


class PruneBlocked(Exception):
    """The disk is full: the jobs chosen for pruning could not be deleted (yet)."""

    def __init__(self, ids: list[int], why: str) -> None:
        super().__init__(why)
        self.ids = ids
        """The jobs that were to go (their files may go first, to make room)."""


class Store:
    """The engine's database.

    Args:
        path: SQLite file; created (with its schema) if missing.
        publish: Called with each committed event, in commit order.
    """

    def __init__(self, path: Path, publish: Callable[[Event], None]) -> None:
        self.path = path
        self._publish = publish
        self._thread: WorkerThread | None = None  # the writer's one thread
        self._db: sqlite3.Connection | None = None  # used on that thread only
        self._reader: aiosqlite.Connection | None = None
        self._queue: list[_Write] = []
        self._inflight: list[_Write] = []  # the batch being committed now
        self._next_event_id = 0
        self._wake = asyncio.Event()
        self._alive_due = 0.0  # (monotonic: when this run next notes that it is alive)
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()
        # Writes whose commit failed (disk full, read-only): kept and tried again.
        self._retry: list[_Write] = []
        self._retry_delay = RETRY_FIRST_S
        self.failure: str | None = None
        self.on_writable: Callable[[], None] | None = None
        # Told (the failure, in words) when writes start failing: what was decided in the
        # batch that failed is not durable, so not acted on, until a retry commits it.
        self.on_unwritable: Callable[[str], None] | None = None
        """Called (on the loop) when writes work again after a failure."""
        self.run_id = 0
        self.previous_run_id = 0  # (the engine run before this one: 0 for none)
        # When the engine before this one was last known to run, and whether it stopped
        # then (None: no run before, or no trace of it): see _last_seen_alive.
        self.previous_run_seen_until: tuple[float, bool] | None = None
        self.first_event_row = 0
        # Stored environments by their JSON's digest (the writer's thread alone uses it).
        self._env_ids: dict[str, int] = {}

    async def open(self, version: str, pid: int) -> None:
        """Open, migrate, record this engine run and start the writer.

        Raises:
            StoreError: If the file is from a newer schema or cannot be opened.
        """
        self._thread = WorkerThread("store-writer")
        try:
            await self._on_writer(self._open_writer, version, pid)
            self._reader = await aiosqlite.connect(self.path, isolation_level=None)
            await self._reader.execute("PRAGMA busy_timeout=5000")
            await self._reader.create_function(FOLD_FUNCTION, 1, _fold, deterministic=True)
            await self._reader.create_function("gpulayer_user", 1, _user_name)
        except sqlite3.Error as err:
            await self.close()
            advice = ""
            if isinstance(err, sqlite3.DatabaseError) and (
                "malformed" in str(err) or "not a database" in str(err)
            ):
                advice = f". Nothing was changed. {_DAMAGED_ADVICE}"
            elif "disk I/O error" in str(err) or "full" in str(err):
                advice = _free_space_note(self.path)
            raise StoreError(f"{self.path}: cannot open the database: {err}{advice}") from None
        except StoreError:
            await self.close()
            raise
        self._writer = asyncio.create_task(self._write_loop(), name="store-writer")

    async def _on_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the writer's thread (the one hop of a commit)."""
        assert self._thread is not None
        return await self._thread.call(fn, *args)

    async def run_on_writer(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(connection)`` on the writer's connection (for fault-injection tests
        and maintenance; the writer's own commits are never interleaved with it)."""
        return await self._on_writer(lambda: fn(self._connection()))

    def _connection(self) -> sqlite3.Connection:
        assert self._db is not None
        return self._db

    def _open_writer(self, version: str, pid: int) -> None:
        self._refuse_emptied()
        if not os.path.exists(self.path):
            # Every job's environment is in it: 0600 from its first byte (SQLite creates
            # it, and its -wal and -shm after it, with the umask's 0644; tester h105).
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        db = self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # A new file keeps a free-page map, so a clean can give its space back in steps
        # (see give_back_space); on a file that has tables already this is a no-op.
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable across application crashes in WAL mode (only a power loss can
        # drop the last commits), at a fraction of FULL's fsync cost.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=5000")
        self._check_integrity(db)
        self._migrate(db)
        cursor = db.execute(
            "INSERT INTO engine_runs (pid, version, started_at) VALUES (?, ?, ?)",
            (pid, version, time.time()),
        )
        self.run_id = cursor.lastrowid or 0
        row = db.execute(
            "SELECT COALESCE(MAX(id), 0) FROM engine_runs WHERE id < ?", (self.run_id,)
        ).fetchone()
        self.previous_run_id = int(row[0]) if row else 0
        row = db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()
        self._next_event_id = int(row[0]) if row else 0
        self.previous_run_seen_until = self._last_seen_alive(db)
        self.first_event_row = self._next_event_id  # (rows up to it: earlier runs')

    def _note_alive(self) -> None:
        """Note, while idle, that this run is alive: a killed engine's last sign of life
        was its last event, and an adopted process that ended while none ran was taken to
        have ended then, hours early for an engine long idle (tester h97)."""
        if self.run_id and not self._closing:
            self.save_setting(SEEN_RUN_SETTING, self.run_id)
            self.save_setting(SEEN_AT_SETTING, int(time.time()))

    def _last_seen_alive(self, db: sqlite3.Connection) -> tuple[float, bool] | None:
        """When the previous engine run was last known to be running, and whether it
        stopped then: its ``stopped_at`` when it stopped cleanly, else (killed) the time
        of the last event any run recorded or of its last note that it was alive
        (:data:`ALIVE_NOTE_S`), a lower bound. What an adopted process that
        vanished while no engine ran is known to have run until."""
        if not self.previous_run_id:
            return None
        row = db.execute(
            "SELECT stopped_at, started_at FROM engine_runs WHERE id = ?", (self.previous_run_id,)
        ).fetchone()
        if row is None:
            return None
        if row[0] is not None:
            return float(row[0]), True
        last = db.execute("SELECT MAX(at) FROM events").fetchone()
        seen = dict(
            db.execute(
                "SELECT name, value FROM counters WHERE name IN (?, ?)",
                (SEEN_RUN_SETTING, SEEN_AT_SETTING),
            ).fetchall()
        )
        noted = (
            seen.get(SEEN_AT_SETTING, 0)
            if seen.get(SEEN_RUN_SETTING) == self.previous_run_id
            else 0
        )
        return max(float(row[1]), float(last[0] or 0), float(noted)), False

    def _refuse_emptied(self) -> None:
        """An empty database file beside job logs was emptied (cut to nothing), not made
        new: SQLite would take it for a new database, and the history and the ids with
        it would start again from job 1.

        Raises:
            StoreError: Naming the file and what to do.
        """
        try:
            if os.path.getsize(self.path) != 0:
                return
            with os.scandir(self.path.parent / "jobs") as entries:
                logs = sum(1 for e in entries if e.name.endswith(".log"))
        except OSError:
            return  # (no file yet, or no jobs folder: a new state dir)
        if logs:
            raise StoreError(
                f"{self.path} is empty, but {self.path.parent / 'jobs'} holds {logs} job "
                "log(s): the database was emptied. Nothing was changed. " + _DAMAGED_ADVICE
            )

    def _check_integrity(self, db: sqlite3.Connection) -> None:
        """Refuse a damaged database before using it: a corrupt page could hide jobs (the
        engine would serve "no jobs" and give id 1 again). ``quick_check`` reads every
        page once (it skips the slower index-content checks of ``integrity_check``).

        Raises:
            StoreError: Naming the file, what SQLite found and what to do.
        """
        rows = [" ".join(str(r[0]).split()) for r in db.execute("PRAGMA quick_check(5)")]
        if rows != ["ok"]:
            raise StoreError(
                f"{self.path} is damaged ({'; '.join(rows)[:300]}). Nothing was changed. "
                + _DAMAGED_ADVICE
            )

    def _migrate(self, db: sqlite3.Connection) -> None:
        row = db.execute("PRAGMA user_version").fetchone()
        current = int(row[0]) if row else 0
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: database schema version {current} is newer than this "
                f"gpulayer-tui understands ({SCHEMA_VERSION}, gpulayer-tui {__version__}): "
                "it was written by a newer gpulayer-tui; upgrade gpulayer-tui"
            )
        for version in range(current, SCHEMA_VERSION):
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[version]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {version + 1}")
                db.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (a full disk does): a ROLLBACK of
                # no transaction would raise and hide the real reason.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            log.info("database migrated to schema version %d", version + 1)

    async def close(self) -> None:
        """Flush pending writes, mark the run stopped and close both connections."""
        self._closing = True
        self._closed.set()
        if self._writer is not None:
            self._wake.set()
            await self._writer
            self._writer = None
        if self._thread is not None:
            if self._db is not None:
                await self._on_writer(self._close_writer)
            self._thread.stop()
            self._thread = None
        if self._reader is not None:
            await self._reader.close()
            self._reader = None

    def _close_writer(self) -> None:
        db = self._connection()
        try:
            if self.run_id:
                db.execute(
                    "UPDATE engine_runs SET stopped_at=? WHERE id=?", (time.time(), self.run_id)
                )
        except sqlite3.Error:
            pass
        db.close()
        self._db = None

    # -- writes ---------------------------------------------------------------------------

    def save(
        self,
        job: Job | None,
        events: Iterable[Event] = (),
        wait: bool = False,
        new: bool = False,
    ) -> asyncio.Future[None] | None:
        """Queue a snapshot of ``job`` and its events for the next group commit.

        Args:
            job: The job to snapshot now (later mutations are not included).
            events: Published after the commit. Transition/submission events are also
                stored in the ``events`` table.
            wait: Return a future that resolves once committed (or fails with the error;
                at once while writes are failing, see :attr:`failure`).
            new: The job's first snapshot: its spec and the rest of what never changes are
                written with it (once).
        """
        done: asyncio.Future[None] | None = None
        if wait:
            done = asyncio.get_running_loop().create_future()
        published = list(events)
        history = None
        for ev in published:
            if ev.kind in STORED_KINDS:
                self._next_event_id += 1
                object.__setattr__(ev, "row", self._next_event_id)
                history = history or []
                history.append((self._next_event_id, ev))
        row = None
        if job is not None:
            row = _Row(job.id, _dynamic_row(job), _static_row(job) if new else None)
        write = _Write(row, published, done, None, history)
        if done is not None and self.failure is not None:
            # Writes are failing: say so now rather than at the next retry. The data stays
            # queued and is committed once the database takes writes again.
            done.set_exception(WriteDeferred(self.failure))
            write.done = None
        self._queue.append(write)
        self._wake.set()
        return done

    def after_commit(
        self, callback: Callable[[], None], early: Callable[[], None] | None = None
    ) -> None:
        """Run ``callback`` (on the loop) once everything queued so far is committed.

        While writes fail it waits for the retry that succeeds: what is decided is acted on
        only once it is durable (a job is started, signalled or answered only then).

        Args:
            callback: Runs on the loop after the commit.
            early: Runs on the writer's thread the moment the COMMIT returns, before the
                loop hears of it (a start request goes out without waiting for the loop:
                that hand-over is a tenth of a millisecond on an idle machine). Only after
                the first try: once a commit has failed, ``callback`` alone acts. It must
                be thread-safe and quick, and its errors are logged, never raised.
        """
        self._queue.append(_Write(None, [], None, then=callback, early=early))
        self._wake.set()

    async def _write_loop(self) -> None:
        while True:
            if self._retry and not self._closing:
                # The last commit failed: try again after a pause, or at once on close.
                try:
                    async with asyncio.timeout(self._retry_delay):
                        await self._closed.wait()
                except TimeoutError:
                    pass
                self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)
            else:
                # Due every ALIVE_NOTE_S, busy or idle: woken more often than that, a
                # busy engine never noted it (its writes were rows, not events), and an
                # adopted process that ended while none ran got 0 s of runtime (h112).
                now = time.monotonic()
                if not self._alive_due:
                    self._alive_due = now + ALIVE_NOTE_S
                try:
                    async with asyncio.timeout(max(0.0, self._alive_due - now)):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                if time.monotonic() >= self._alive_due:
                    self._alive_due = time.monotonic() + ALIVE_NOTE_S
                    self._note_alive()
                # Let what is already scheduled on the loop run first (the scheduling
                # pass after a job's end, say), so it joins this commit instead of
                # needing the next one: one commit per pass, not one per change.
                await asyncio.sleep(0)
            self._wake.clear()
            batch = self._retry + self._queue
            self._retry, self._queue = [], []
            if batch:
                self._inflight = batch
                try:
                    await self._commit(batch)
                finally:
                    self._inflight = []
                    batch = []  # (not kept alive while the writer waits for the next)
            if self._closing and not self._queue:
                if self._retry:
                    log.error(
                        "stopping with %d job rows not saved: %s",
                        sum(1 for w in self._retry if w.row is not None),
                        self.failure,
                    )
                return

    async def _commit(self, batch: list[_Write]) -> None:
        rows: dict[int, _Row] = {}
        events: list[Event] = []
        history: list[tuple[int, Event]] = []
        callbacks: list[Callable[[], None]] = []
        early: list[Callable[[], None]] = []
        for write in batch:
            if write.row is not None:
                latest = write.row
                earlier = rows.get(latest.job_id)
                if earlier is not None and earlier.static is not None and latest.static is None:
                    latest = _Row(latest.job_id, latest.dynamic, earlier.static)
                rows[latest.job_id] = latest  # the latest snapshot of a job wins
            events.extend(write.events)
            history.extend(write.history or ())
            if write.then is not None:
                callbacks.append(write.then)
            if write.early is not None:
                early.append(write.early)
        extra = [st for write in batch for st in (write.statements or ())]
        stored = [
            (
                row_id,
                ev.job_id,
                ev.at,
                ev.kind.value,
                ev.data.get("status"),
                ev.data.get("reason"),
                ev.data.get("message"),
                json.dumps(ev.data),
            )
            for row_id, ev in history
        ]
        inserts = [r.static + r.dynamic for r in rows.values() if r.static is not None]
        updates = [(*r.dynamic, r.job_id) for r in rows.values() if r.static is None]
        error: Exception | None = None
        began = False  # (a failure that begins with this batch)
        try:
            await self._on_writer(self._transaction, extra, inserts, updates, stored, early)
        except Exception as err:  # sqlite3.Error above all; the writer must never die
            error = err
        if error is None:
            if self.failure is not None:
                log.warning("database writes work again; the engine takes new work")
                self.failure = None
                if self.on_writable is not None:  # (what waited for it may start now)
                    self.on_writable()
            self._retry_delay = RETRY_FIRST_S
        elif not isinstance(error, sqlite3.Error):
            # A value SQLite cannot take (a bug, not the disk): retrying cannot help, and
            # keeping it would block every later write. Report it to the waiters and go on.
            log.error("database write failed; this batch is dropped", exc_info=error)
        else:
            began = self.failure is None
            if began:
                log.error("database write failed, refusing new work until it succeeds: %s", error)
            self.failure = f"database write failed: {error}"
            # Keep what must not be lost for the retry: each job's latest row, the history
            # events, statements and after-commit callbacks. Reason refreshes (not
            # history) are dropped, as the rows carry the latest message: an outage costs
            # memory per job touched, not per event.
            self._retry = [_Write(row, [], None) for row in rows.values()]
            kept = [ev for _, ev in history]
            self._retry.append(_Write(None, kept, None, extra, history))
            self._retry += [_Write(None, [], None, then=cb) for cb in callbacks]
        retried = isinstance(error, sqlite3.Error)  # (kept for the retry: see above)
        if retried and began and self.on_unwritable is not None:
            try:
                self.on_unwritable(self.failure or "")
            except Exception:
                log.exception("a reaction to the database write failure failed")
        for write in batch:
            if write.done is not None and not write.done.done():
                if error is None:
                    write.done.set_result(None)
                else:
                    failed = WriteDeferred if retried else StoreError
                    write.done.set_exception(failed(f"database write failed: {error}"))
        if error is None:
            for ev in events:
                self._publish(ev)
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # one failing reaction must not stop the others
                    log.exception("an after-commit reaction failed")

    def _transaction(
        self,
        extra: list[tuple[str, tuple[Any, ...]]],
        inserts: list[tuple[Any, ...]],
        updates: list[tuple[Any, ...]],
        stored: list[tuple[Any, ...]],
        early: list[Callable[[], None]] = [],  # noqa: B006 (never mutated)
    ) -> None:
        """One commit, on the writer's thread; then its ``early`` reactions."""
        try:
            self._statements(extra, inserts, updates, stored)
        except UnicodeEncodeError:
            # Text that is not valid Unicode (lone surrogates: a JSON "\udcff" escape, or a
            # non-UTF-8 environment read with surrogateescape) cannot be bound as TEXT.
            # Store it escaped rather than lose the batch.
            self._statements(
                [(sql, _escaped(args)) for sql, args in extra],
                [_escaped(r) for r in inserts],
                [_escaped(r) for r in updates],
                [_escaped(r) for r in stored],
            )
        for reaction in early:
            try:
                reaction()
            except Exception:  # committed all the same: never reported as a failed write
                log.exception("an early after-commit reaction failed")

    def _statements(
        self,
        extra: list[tuple[str, tuple[Any, ...]]],
        inserts: list[tuple[Any, ...]],
        updates: list[tuple[Any, ...]],
        stored: list[tuple[Any, ...]],
    ) -> None:
        db = self._connection()
        if db.in_transaction:
            db.execute("ROLLBACK")  # left open by an earlier failure
        db.execute("BEGIN")
        made: dict[str, int] = {}  # environments this transaction stores
        try:
            for sql, args in extra:
                if sql == _EDIT_SPEC:
                    args = (args[0], self._env_id(db, args[1], made), *args[2:])
                db.execute(sql, args)
            if inserts:
                db.executemany(_INSERT, [self._env_named(db, row, made) for row in inserts])
            if updates:
                db.executemany(_UPDATE, updates)
            if stored:
                db.executemany(_INSERT_EVENT, stored)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        # (only once committed: an id from a rolled-back insert names nothing)
        self._env_ids.update(made)

    def _env_named(
        self, db: sqlite3.Connection, row: tuple[Any, ...], made: dict[str, int]
    ) -> tuple[Any, ...]:
        """An insert's row with its environment's JSON replaced by the id it is stored as."""
        if row[_ENV_AT] is None:
            return row
        env_id = self._env_id(db, row[_ENV_AT], made)
        return (*row[:_ENV_AT], env_id, *row[_ENV_AT + 1 :])

    def _env_id(self, db: sqlite3.Connection, env: str | None, made: dict[str, int]) -> int | None:
        """The id ``env`` (an environment's JSON) is stored as, storing it if new."""
        if env is None:
            return None
        digest = hashlib.sha256(env.encode("utf-8", "surrogatepass")).hexdigest()
        known = self._env_ids.get(digest) or made.get(digest)
        if known is not None:
            return known
        db.execute(
            "INSERT INTO envs (digest, env) VALUES (?, ?) ON CONFLICT DO NOTHING", (digest, env)
        )
        env_id = int(db.execute("SELECT id FROM envs WHERE digest = ?", (digest,)).fetchone()[0])
        made[digest] = env_id
        return env_id

    def save_domain_state(
        self,
        name: str,
        state: str,
        reason: str,
        gpu_uuid: str | None = None,
        drain_reason: str | None = None,
    ) -> None:
        """Queue a domain's service state for the next commit (a GPU's state is kept
        once: a row of its UUID under another name is dropped); ``drain_reason``: the
        operator's drain kept under a quarantine."""
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if gpu_uuid is not None:
            statements.append(
                ("DELETE FROM domain_state WHERE gpu_uuid = ? AND name != ?", (gpu_uuid, name))
            )
        statements.append(
            (
                "INSERT INTO domain_state (name, state, reason, at, gpu_uuid, drain_reason) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET state=excluded.state, "
                "reason=excluded.reason, at=excluded.at, gpu_uuid=excluded.gpu_uuid, "
                "drain_reason=excluded.drain_reason",
                (name, state, reason, time.time(), gpu_uuid, drain_reason),
            )
        )
        self._queue.append(_Write(None, [], None, statements))
        self._wake.set()

    def save_fair_usage(self, uid: int, gpu_seconds: float, at: float) -> None:
        """Queue a user's fair-share use (GPU-seconds as of ``at``) for the next commit."""
        self._queue.append(
            _Write(
                None,
                [],
                None,
                [
                    (
                        "INSERT INTO fair_usage (uid, gpu_seconds, at) VALUES (?, ?, ?) "
                        "ON CONFLICT(uid) DO UPDATE SET gpu_seconds=excluded.gpu_seconds, "
                        "at=excluded.at",
                        (uid, gpu_seconds, at),
                    )
                ],
            )
        )
        self._wake.set()

    async def fair_usages(self) -> list[tuple[int, float, float]]:
        """Every user's stored fair-share use: ``(uid, gpu_seconds, at)``."""
        rows = await self._fetchall("SELECT uid, gpu_seconds, at FROM fair_usage")
        return [(int(r[0]), float(r[1]), float(r[2])) for r in rows]

    def save_usage(self, job_id: int, record: UsageJSON) -> None:
        """Queue what a job used (its summary and series) for the next commit."""
        self._queue.append(
            _Write(
                None,
                [],
                None,
                [
                    (
                        "INSERT INTO job_usage (job_id, summary, record) VALUES (?, ?, ?) "
                        "ON CONFLICT(job_id) DO UPDATE SET summary=excluded.summary, "
                        "record=excluded.record",
                        (
                            job_id,
                            json.dumps(record["summary"], separators=(",", ":")),
                            json.dumps(record, separators=(",", ":")),
                        ),
                    )
                ],
            )
        )
        self._wake.set()

    async def usage(self, job_ids: Sequence[int]) -> list[UsageJSON]:
        """The stored usage records of ``job_ids`` (those that have one)."""
        records: list[UsageJSON] = []
        for start in range(0, len(job_ids), 500):
            chunk = list(job_ids[start : start + 500])
            rows = await self._fetchall(
                f"SELECT record FROM job_usage WHERE job_id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            records.extend(json.loads(r[0]) for r in rows)
        return records

    async def usage_summary(self, job_id: int) -> UsageSummaryJSON | None:
        """A job's stored usage summary, or ``None``."""
        rows = await self._fetchall("SELECT summary FROM job_usage WHERE job_id=?", (job_id,))
        return json.loads(rows[0][0]) if rows else None

    async def gpu_history(self, since: float) -> list[tuple[int, int, float, float]]:
        """``(uid, GPUs, started_at, ended_at)`` of GPU jobs that ended after ``since``,
        oldest end first (the engine's own jobs as its uid)."""
        rows = await self._fetchall(
            "SELECT owner_uid, json_array_length(gpus), started_at, ended_at FROM jobs "
            "WHERE ended_at > ? AND started_at IS NOT NULL AND gpus != '[]' "
            "ORDER BY ended_at",
            (since,),
        )
        me = os.geteuid()
        return [(me if r[0] is None else r[0], r[1], r[2], r[3]) for r in rows]

    async def newest_job_time(self) -> float | None:
        """The latest submission time in the database (to spot a clock gone backwards)."""
        rows = await self._fetchall("SELECT MAX(created_at) FROM jobs")
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    async def domain_states(self) -> list[tuple[str, str, str, str | None, str | None]]:
        """Stored ``(name, state, reason, gpu_uuid, drain_reason)`` of every domain ever
        changed (the UUID is ``None`` for the cpu pool, and for rows from before it was
        kept; ``drain_reason`` is a drain kept under a quarantine)."""
        rows = await self._fetchall(
            "SELECT name, state, reason, gpu_uuid, drain_reason FROM domain_state ORDER BY at"
        )
        return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        done = self.save(None, (), wait=True)
        assert done is not None
        await done

    # -- reads (committed data only) --------------------------------------------------------

    async def _fetchall(
        self, sql: str, args: Sequence[Any] | dict[str, Any] = ()
    ) -> list[sqlite3.Row]:
        assert self._reader is not None
        # Execute and fetch in one hop to the connection's thread. With a separate
        # execute and fetch, overlapping reads leave a cursor open, and its read
        # transaction pins an old WAL snapshot: a later read could miss a commit.
        return list(await self._reader.execute_fetchall(sql, args))

    async def existing(self, ids: set[int]) -> set[int]:
        """Which of ``ids`` have a row."""
        if not ids:
            return set()
        marks = ", ".join(str(int(i)) for i in sorted(ids))
        rows = await self._fetchall(f"SELECT id FROM jobs WHERE id IN ({marks})")
        return {int(r[0]) for r in rows}

    async def newest_restart(self, job_id: int) -> int | None:
        """The newest job that restarted ``job_id`` (``restart`` of it), if any."""
        # (a scan of the specs: only a user's `restart` of a chain asks, rarely)
        rows = await self._fetchall(
            "SELECT MAX(id) FROM jobs WHERE json_extract(spec, '$.restart_of') = ?", (job_id,)
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    async def finished_past(
        self, ids: frozenset[int], ended_before: float | None, keep: int | None
    ) -> list[int]:
        """Which of ``ids`` are finished jobs that ended before ``ended_before`` or are not
        among the ``keep`` finished ones that ended last: what :meth:`prune` would take if they were
        not spared."""
        if not ids:
            return []
        marks = ", ".join(str(int(i)) for i in sorted(ids))
        finished = "status IN ('completed', 'failed', 'cancelled', 'orphaned')"
        rows = await self._fetchall(
            f"SELECT id, ended_at FROM jobs WHERE id IN ({marks}) AND {finished} ORDER BY id"
        )
        if not rows:
            return []
        newest: set[int] = set()
        if keep is not None:
            kept = await self._fetchall(
                f"SELECT id FROM jobs WHERE {finished} ORDER BY {_ENDED_LAST_FIRST} LIMIT ?",
                (keep,),
            )
            newest = {int(r[0]) for r in kept}
        return [
            int(job_id)
            for job_id, ended_at in rows
            if (ended_before is not None and ended_at is not None and ended_at < ended_before)
            or (keep is not None and int(job_id) not in newest)
        ]

    async def prunable(
        self, ended_before: float | None, keep: int | None, spared: frozenset[int]
    ) -> list[int]:
        """The ids :meth:`prune` would delete now, all of them, oldest first (``clean
        --dry-run``); nothing is changed."""
        finished = "status IN ('completed', 'failed', 'cancelled', 'orphaned')"
        if spared:
            finished += f" AND id NOT IN ({', '.join(str(int(i)) for i in sorted(spared))})"
        ids: set[int] = set()
        if ended_before is not None:
            rows = await self._fetchall(
                f"SELECT id FROM jobs WHERE ended_at < ? AND {finished}", (ended_before,)
            )
            ids.update(int(r[0]) for r in rows)
        if keep is not None:
            rows = await self._fetchall(
                f"SELECT id FROM jobs WHERE {finished} ORDER BY {_ENDED_LAST_FIRST} "
                "LIMIT -1 OFFSET ?",
                (keep,),
            )
            ids.update(int(r[0]) for r in rows)
        return sorted(ids)

    async def jobs_with_key(self, key: str, owner_uid: int | None) -> tuple[list[Job], str | None]:
        """The jobs a submission with idempotency ``key`` by ``owner_uid`` made (committed
        ones; oldest first), and the digest of what it asked for (``None`` for jobs from
        before digests were kept)."""
        rows = await self._fetchall(
            f"SELECT {_JOB_COLUMNS}, submit_digest FROM jobs WHERE submit_key = ? "
            "AND owner_uid IS ? ORDER BY id",
            (key, owner_uid),
        )
        return [job_from_row(r[:-1]) for r in rows], (rows[0][-1] if rows else None)

    async def spent_key(self, key: str, owner_uid: int | None) -> tuple[bool, str | None]:
        """Whether ``key``'s jobs were all removed from the history (in the last
        :data:`SPENT_KEY_DAYS` days), and the digest of what its submission asked for."""
        rows = await self._fetchall(
            "SELECT digest FROM spent_keys WHERE key = ? AND owner_uid = ?",
            (key, -1 if owner_uid is None else owner_uid),
        )
        return (True, rows[0][0]) if rows else (False, None)

    def save_edit(self, job: Job) -> None:
        """Queue what an edit changes of a waiting job that is otherwise written once: its
        spec, name and priority (and a service's replicas: their number may change)."""
        self._queue.append(
            _Write(
                None,
                [],
                None,
                [
                    (
                        _EDIT_SPEC,
                        (
                            *_spec_and_env(job.spec),
                            job.name,
                            job.priority,
                            job.replicas_json(),
                            job.id,
                        ),
                    )
                ],
            )
        )
        self._wake.set()

    def save_setting(self, name: str, value: int) -> None:
        """Queue an engine setting (an integer in ``counters``) for the next commit."""
        self._queue.append(
            _Write(
                None,
                [],
                None,
                [
                    (
                        "INSERT INTO counters (name, value) VALUES (?, ?) "
                        "ON CONFLICT(name) DO UPDATE SET value=excluded.value",
                        (name, value),
                    )
                ],
            )
        )
        self._wake.set()

    @property
    def last_event_row(self) -> int:
        """The row the last stored event queued so far got (0: none ever)."""
        return self._next_event_id

    async def stored_events(
        self,
        after_row: int,
        up_to_row: int,
        since: float,
        statuses: Sequence[str],
        also: Sequence[int] = (),
    ) -> list[Event]:
        """Stored events that may call for a notification, oldest first: replica events,
        and transitions to one of ``statuses``, with rows in (``after_row``,
        ``up_to_row``] or in ``also``, that happened after ``since``."""
        status_marks = ", ".join("?" * len(statuses)) or "NULL"
        where = "(id > ? AND id <= ?)"
        if also:
            where = f"({where} OR id IN ({', '.join(str(int(r)) for r in sorted(also))}))"
        rows = await self._fetchall(
            f"SELECT id, job_id, at, kind, data FROM events WHERE {where} AND at >= ? AND "
            f"(kind = '{EventKind.REPLICA.value}' OR (kind = '{EventKind.TRANSITION.value}' "
            f"AND json_extract(data, '$.status') IN ({status_marks}))) ORDER BY id",
            (after_row, up_to_row, since, *statuses),
        )
        events = []
        for row_id, job_id, at, kind, data in rows:
            try:
                event = Event(0, at, EventKind(kind), job_id, json.loads(data or "{}"))
            except ValueError:
                continue  # (a kind or a payload this version cannot read)
            object.__setattr__(event, "row", row_id)
            events.append(event)
        return events

    async def setting(self, name: str) -> int | None:
        """A stored engine setting, or ``None``."""
        rows = await self._fetchall("SELECT value FROM counters WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else None

    async def settings_named(self, prefix: str) -> dict[str, int]:
        """The stored engine settings whose names start with ``prefix``."""
        rows = await self._fetchall(
            "SELECT name, value FROM counters WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
        )
        return {str(name): int(value) for name, value in rows}

    async def known_gpus(self) -> dict[str, KnownGpu]:
        """Every GPU that had a domain here, by UUID, the earliest seen first."""
        rows = await self._fetchall(
            "SELECT gpu_uuid, name, gpu_index, memory_bytes FROM known_gpus ORDER BY seen_at"
        )
        return {
            str(uuid): KnownGpu(
                str(name),
                None if index is None else int(index),
                None if memory is None else int(memory),
            )
            for uuid, name, index, memory in rows
        }

    def save_known_gpus(self, gpus: dict[str, KnownGpu]) -> None:
        """Queue ``gpus`` (by UUID), seen now, for the next commit."""
        now = time.time()
        self._queue.append(
            _Write(
                None,
                [],
                None,
                [
                    (
                        "INSERT INTO known_gpus (gpu_uuid, name, gpu_index, memory_bytes, "
                        "seen_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT(gpu_uuid) DO UPDATE SET "
                        "name=excluded.name, gpu_index=excluded.gpu_index, "
                        "memory_bytes=excluded.memory_bytes, seen_at=excluded.seen_at",
                        (uuid, gpu.name, gpu.index, gpu.memory, now),
                    )
                    for uuid, gpu in gpus.items()
                ],
            )
        )

    def forget_gpu(self, gpu_uuid: str) -> None:
        """Queue the removal of a known GPU (and its domain state) for the next commit."""
        self._queue.append(
            _Write(
                None,
                [],
                None,
                [
                    ("DELETE FROM known_gpus WHERE gpu_uuid = ?", (gpu_uuid,)),
                    ("DELETE FROM domain_state WHERE gpu_uuid = ?", (gpu_uuid,)),
                ],
            )
        )

    def drop_setting(self, name: str) -> None:
        """Queue the removal of the engine setting ``name`` for the next commit."""
        self._queue.append(
            _Write(None, [], None, [("DELETE FROM counters WHERE name = ?", (name,))])
        )

    async def marked_for_notify(self, ids: set[int]) -> set[int]:
        """Which of ``ids`` are jobs submitted with ``notify``."""
        if not ids:
            return set()
        marks = ", ".join(str(int(i)) for i in sorted(ids))
        rows = await self._fetchall(
            f"SELECT id FROM jobs WHERE id IN ({marks}) AND json_extract(spec, '$.notify')"
        )
        return {int(r[0]) for r in rows}

    def drop_settings(self, prefix: str) -> None:
        """Queue the removal of every engine setting named ``prefix``... for the next
        commit."""
        self._queue.append(
            _Write(
                None,
                [],
                None,
                [("DELETE FROM counters WHERE substr(name, 1, ?) = ?", (len(prefix), prefix))],
            )
        )

    async def max_job_id(self) -> int:
        """The largest job id ever used (0 for a new database), cleaned history included."""
        rows = await self._fetchall(
            "SELECT MAX(COALESCE((SELECT MAX(id) FROM jobs), 0), "
            "COALESCE((SELECT value FROM counters WHERE name = 'job_id'), 0))"
        )
        return int(rows[0][0])

    async def prune(
        self,
        ended_before: float | None,
        keep: int | None,
        limit: int,
        spared: frozenset[int] = frozenset(),
    ) -> list[int]:
        """Delete up to ``limit`` finished jobs (rows and timelines): those that ended
        before ``ended_before``, and/or all but the ``keep`` finished ones that ended last; never
        those in ``spared``.

        Returns:
            The ids deleted (their files are the caller's to remove).
        """
        return list(await self._on_writer(self._prune, ended_before, keep, limit, spared))

    def _prune(
        self,
        ended_before: float | None,
        keep: int | None,
        limit: int,
        spared: frozenset[int] = frozenset(),
    ) -> list[int]:
        db = self._connection()
        finished = "status IN ('completed', 'failed', 'cancelled', 'orphaned')"
        if spared:
            finished += f" AND id NOT IN ({', '.join(str(int(i)) for i in sorted(spared))})"
        ids: set[int] = set()
        if ended_before is not None:
            rows = db.execute(
                f"SELECT id FROM jobs WHERE ended_at < ? AND {finished} ORDER BY id LIMIT ?",
                (ended_before, limit),
            ).fetchall()
            ids.update(r[0] for r in rows)
        if keep is not None and len(ids) < limit:
            rows = db.execute(
                f"SELECT id FROM jobs WHERE {finished} "
                f"ORDER BY {_ENDED_LAST_FIRST} LIMIT ? OFFSET ?",
                (limit - len(ids), keep),
            ).fetchall()
            ids.update(r[0] for r in rows)
        if not ids:
            return []
        chosen = sorted(ids)
        marks = ", ".join("?" * len(chosen))
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.execute("BEGIN")
        try:
            db.execute(
                "INSERT INTO counters (name, value) VALUES ('job_id', "
                "(SELECT COALESCE(MAX(id), 0) FROM jobs)) ON CONFLICT(name) DO UPDATE SET "
                "value = MAX(value, excluded.value)"
            )
            db.execute(f"DELETE FROM events WHERE job_id IN ({marks})", chosen)
            db.execute(f"DELETE FROM job_usage WHERE job_id IN ({marks})", chosen)
            # (a key whose jobs are all gone stays refused for a while: see spent_key)
            db.execute(
                "INSERT OR REPLACE INTO spent_keys (key, owner_uid, digest, removed_at) "
                "SELECT submit_key, COALESCE(owner_uid, -1), submit_digest, ? FROM jobs "
                f"WHERE id IN ({marks}) AND submit_key IS NOT NULL GROUP BY submit_key, "
                "owner_uid",
                [time.time(), *chosen],
            )
            db.execute(
                "DELETE FROM spent_keys WHERE removed_at < ?",
                (time.time() - SPENT_KEY_DAYS * 86400,),
            )
            db.execute(
                "INSERT OR IGNORE INTO files_owed (job_id) "
                f"SELECT id FROM jobs WHERE id IN ({marks})",
                chosen,
            )
            db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", chosen)
            db.execute(
                "DELETE FROM envs WHERE id NOT IN "
                "(SELECT env_id FROM jobs WHERE env_id IS NOT NULL)"
            )
            db.execute("COMMIT")
            self._env_ids.clear()  # (some it named are gone; the rest are found again)
        except sqlite3.OperationalError as err:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if err.sqlite_errorcode == sqlite3.SQLITE_FULL:
                raise PruneBlocked(chosen, str(err)) from None
            raise
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return chosen

    async def give_back_space(self) -> int:
        """Return the pages deleted rows left free to the filesystem; the bytes the
        database shrank by.

        Deleted rows only leave free pages inside the file: after a clean of 20,000 jobs
        the file kept its size for good (tester h76). A file made with a free-page map
        (``auto_vacuum=INCREMENTAL``, every file made since) gives them back in steps of
        :data:`RECLAIM_PAGES`, each its own call on the writer, so commits go on between
        them. An older file is rewritten once (``VACUUM``, which also gives it the map),
        only when at least a quarter of it is free: that holds the writer for as long as
        it takes (about a second per 100 MB here). A full disk (the rewrite needs room
        for a copy) leaves the file as it was.
        """
        before: int = await self._on_writer(self._file_bytes)
        after = before
        try:
            while await self._on_writer(self._reclaim_step):
                pass
            await self._on_writer(self._checkpoint_truncate)
        except sqlite3.Error as err:
            log.warning("giving the database's free space back stopped: %s", err)
        with contextlib.suppress(sqlite3.Error):
            after = await self._on_writer(self._file_bytes)
        return max(0, before - after)

    def _file_bytes(self) -> int:
        """What the database's pages take (its file, once checkpointed)."""
        db = self._connection()
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])
        return pages * int(db.execute("PRAGMA page_size").fetchone()[0])

    def _reclaim_step(self) -> bool:
        """One step of :meth:`give_back_space`; whether free pages are left to give."""
        db = self._connection()
        if db.in_transaction:
            db.execute("ROLLBACK")
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])
        free = int(db.execute("PRAGMA freelist_count").fetchone()[0])
        mode = int(db.execute("PRAGMA auto_vacuum").fetchone()[0])
        if not free:
            return False
        if mode == 2:  # incremental (each step of the cursor frees one page: read it all)
            db.execute(f"PRAGMA incremental_vacuum({RECLAIM_PAGES})").fetchall()
            return bool(int(db.execute("PRAGMA freelist_count").fetchone()[0]))
        if mode == 0 and free >= RECLAIM_PAGES // 4 and free * 4 >= pages:
            log.info("rewriting the database once to give back %d free pages", free)
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            db.execute("VACUUM")
        return False

    def _checkpoint_truncate(self) -> None:
        """Copy the write-ahead log into the file and empty it (the file's end is cut
        there, and a rewrite's copy in the log is let go); best effort: a reader in the
        middle of a read leaves it for the next checkpoint."""
        self._connection().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    async def files_owed(self) -> list[int]:
        """The jobs whose rows were cleaned and whose files are still to be removed."""
        rows = await self._fetchall("SELECT job_id FROM files_owed ORDER BY job_id")
        return [int(r[0]) for r in rows]

    async def files_removed(self, ids: list[int]) -> None:
        """The files of the cleaned jobs ``ids`` are gone: nothing is owed for them."""
        if ids:
            marks = ", ".join(str(int(i)) for i in ids)
            sql = f"DELETE FROM files_owed WHERE job_id IN ({marks})"
            self._queue.append(_Write(None, [], None, [(sql, ())]))
            await self.flush()

    async def active_jobs(self) -> list[Job]:
        """Every job that is pending, queued or running, oldest first."""
        rows = await self._fetchall(
            f"SELECT {_JOB_COLUMNS} FROM jobs "
            "WHERE status IN ('pending', 'queued', 'running') ORDER BY id"
        )
        return [job_from_row(r) for r in rows]

    async def get_job(self, job_id: int) -> Job | None:
        """One job by id, or ``None``."""
        rows = await self._fetchall(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,))
        return job_from_row(rows[0]) if rows else None

    async def list_jobs(
        self, statuses: Sequence[str] = (), limit: int = 1000, before_id: int | None = None
    ) -> list[Job]:
        """Jobs, newest first, optionally filtered by status; paged by ``before_id``."""
        where: list[str] = []
        args: list[Any] = []
        if statuses:
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            args.extend(statuses)
        if before_id is not None:
            where.append("id < ?")
            args.append(before_id)
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        return [job_from_row(r) for r in await self._fetchall(sql, args)]

    async def _owners_named(self, text: str) -> list[int]:
        """The uids owning jobs here whose user name (as rows show it) contains ``text``,
        any case; a job with no owner stored is the engine's user's."""
        wanted = text.casefold()
        uids = {
            os.geteuid() if uid is None else int(uid)
            for (uid,) in await self._fetchall("SELECT DISTINCT owner_uid FROM jobs", ())
        }
        return sorted(uid for uid in uids if wanted in user_name(uid).casefold())

    async def job_rows(
        self, query: JobQuery, now: float, chunk: int = 1000
    ) -> AsyncGenerator[list[JobRowJSON], None]:
        """The rows ``query`` asks for (see :class:`JobQuery`), in chunks of ``chunk``, so
        a page of 10,000 never lives in memory at once; plus, past ``query.limit``, one
        more row when there is one (the caller's "more" flag). ``now`` ends the runtime
        of running jobs for ``sort="runtime"``.

        Each chunk is its own query (no cursor stays open across awaits): chunks of the
        id order continue by key, other orders by offset.
        """
        where: list[str] = []
        params: dict[str, Any] = {"now": now}
        if query.statuses:
            # As literals (checked against JobStatus first), and for active statuses with
            # the partial index's own condition beside them: SQLite uses jobs_active only
            # for a query that repeats its WHERE, and then reads the few active rows
            # instead of scanning all history for them.
            known = {status.value for status in JobStatus}
            if not set(query.statuses) <= known:
                raise ValueError(f"unknown status in {query.statuses!r}")
            if set(query.statuses) <= ACTIVE_STATUSES:
                where.append(_ACTIVE_INDEX_WHERE)
            where.append(f"status IN ({', '.join(repr(s) for s in query.statuses)})")
        if query.since is not None:
            where.append("created_at >= :since")
            params["since"] = query.since
        if query.text:
            # The owner's name too (a shared box's users looked for their own jobs by name
            # and found none: tester h179): the uids of jobs here whose names hold the text,
            # found in Python (a name lookup per row in SQL made the filter 5x slower).
            params["owners"] = json.dumps(await self._owners_named(query.text))
            params["euid"] = os.geteuid()
            if query.text.isascii():
                params["text"] = _like(query.text)
                where.append("(" + " OR ".join((*_TEXT_MATCHES, _OWNER_MATCHES)) + ")")
            else:
                params["text"] = _like(query.text.casefold())
                where.append("(" + " OR ".join((*_FOLDED_TEXT_MATCHES, _OWNER_MATCHES)) + ")")
        value, ties_newest_first = _SORT_SQL[query.sort]
        ascending = query.after is not None or not query.descending
        direction = "ASC" if ascending else "DESC"
        order = f" ORDER BY {value} {direction}"
        if query.sort != "id":
            order += f", id {('DESC' if ascending else 'ASC') if ties_newest_first else direction}"
        keyed = query.sort == "id"
        cursor = query.after if query.after is not None else query.before
        offset = query.offset
        wanted = query.limit + 1
        while wanted > 0:
            clauses = list(where)
            if keyed and cursor is not None:
                params["cursor"] = cursor
                clauses.append("id > :cursor" if ascending else "id < :cursor")
            size = min(chunk, wanted)
            sql = _ROW_SELECT
            if clauses:
                sql += " WHERE " + " AND ".join(clauses)
            sql += f"{order} LIMIT {size}" + (f" OFFSET {offset}" if offset else "")
            rows = await self._fetchall(sql, params)
            if not rows:
                return
            wanted -= len(rows)
            if keyed:
                cursor, offset = rows[-1][0], 0
            else:
                offset += len(rows)
            yield [job_row_json(r) for r in rows]
            if len(rows) < size:
                return

    def job_events(self, job_id: int) -> Coroutine[Any, Any, list[dict[str, Any]]]:
        """The timeline of one job, oldest first (by time, then as stored): what is
        committed plus what is queued.

        What is queued is taken when this is *called* (before any await), so a caller that
        snapshots the job in the same step gets a timeline that includes every transition
        the job shows, even while the commit is still on its way (or failing).
        """
        pending = [
            (row_id, ev)
            for write in (*self._retry, *self._inflight, *self._queue)
            for row_id, ev in write.history or ()
            if ev.job_id == job_id
        ]
        return self._job_events(job_id, pending)

    async def _job_events(
        self, job_id: int, pending: list[tuple[int, Event]]
    ) -> list[dict[str, Any]]:
        rows = await self._fetchall(
            "SELECT id, at, kind, status, reason, message, data FROM events "
            "WHERE job_id=? ORDER BY id",
            (job_id,),
        )
        timeline = {
            r[0]: {
                "at": r[1],
                "kind": r[2],
                "status": r[3],
                "reason": r[4],
                "message": r[5],
                "data": json.loads(r[6]) if r[6] else {},
            }
            for r in rows
        }
        for row_id, ev in pending:
            timeline.setdefault(row_id, _timeline_entry(ev))
        # By time, then as stored: an entry learnt late (a replica's end while no engine
        # ran) is stamped when it happened, and came after later ones (tester h121).
        return sorted((timeline[k] for k in sorted(timeline)), key=lambda e: e["at"] or 0.0)

    async def count_by_status(self, since: float | None = None) -> dict[str, int]:
        """Number of jobs per status (optionally only those created since ``since``)."""
        sql = "SELECT status, COUNT(*) FROM jobs"
        args: list[Any] = []
        if since is not None:
            sql += " WHERE created_at >= ?"
            args.append(since)
        sql += " GROUP BY status"
        return {r[0]: int(r[1]) for r in await self._fetchall(sql, args)}
