"""The engine's side of the launcher: an :class:`~.executor.Executor` over its socket.

The engine starts the launcher (``python -m gpulayer_tui.engine.keeper``, in its own
session) if none serves the state dir, and talks to it in JSON lines (see
:mod:`.launcher`). Requests are never awaited: a start's answer comes back as an event and
goes to the callbacks given with it. If the connection breaks (the spawner died: its
keeper starts another at once), requests wait in an outbox; after reconnecting, the engine
asks for the launcher's table and reconciles: tasks that ended meanwhile are reported,
starts the dead spawner never received are sent again (the launcher never starts a key
twice, so sending again is safe), and only then does the outbox go out.

The socket is read by a protocol (:class:`_Connection`) that hands each line to the
executor as it arrives: no reader task woken per line (a profile of a drain put a loop
iteration and a future on every ``readline``).

A start is prepared while its decision commits (:meth:`LauncherExecutor.prepare`) and sent
from the store's writer thread the moment the ``COMMIT`` returns (:meth:`_Prepared.send_now`),
through a second descriptor of the same socket, under the lock every write takes: the loop's
hand-over (a thread wake-up, then the after-commit reactions) is off a start's path. It goes
that way only when nothing sent earlier still waits (the batch, the outbox, a reconnect, the
transport's buffer), so the launcher reads requests in the order they were made; otherwise
the loop sends it after the commit, as every other request.

Why this module is over ~400 lines: connecting (and starting a launcher), the executor
interface and the reconnect/reconcile path share the watches, the pending starts and the
outbox; they are read together when reasoning about exactly-once.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import functools
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..fields import printable
from ..unixsock import SocketPath
from .executor import Exit, LaunchError, OnExit, OnStart, Started, TaskKey, task_name
from .launcher import (
    ENV_CACHE,
    FAILED_NOTE,
    LOCK,
    LOG,
    SOCKET,
    claimed,
    start_failure,
    why_not_runnable,
)
from .tasks import cancel_and_wait

log = logging.getLogger(__name__)
MAX_LOG_ANSWER_S = 5.0  # a launcher that took a new max_log answers within this

CONNECT_TIMEOUT_S = 15.0
ACK_DELAY_S = 0.05  # an ack waits this long for a request to ride with (at most)
RECENT_ACKS = 4096  # acks remembered, to send again if a connection dies with them
LINE_LIMIT = 64 * 1024 * 1024  # (the table of a launcher with many tasks is one line)
PROGRAM_CACHE_S = 5.0
# A start the connected launcher has not answered in this long means it cannot start jobs
# now (stopped, hung, starved): said as the executor's problem. (A spawn takes
# milliseconds; a submission waits as long for its job's start: admission.LAUNCH_WAIT_S.)
STALL_S = 5.0


_LEADING_ID = re.compile(r"[0-9]+")
"""A launcher key's job id (``7``, ``7~1``, ``7.1.3``)."""


def launcher_key(key: TaskKey, run: int = 0) -> str:
    """The launcher's name for the ``run``-th start of a task: ``7`` for job 7's first
    run, ``7~1`` for its run after one requeue, ``7.1.3`` for replica 1's third start.

    Every run has a key of its own, so the launcher never holds an old run's end under a
    key the engine asks it to start again (it would answer with that end).
    """
    if isinstance(key, tuple):
        return f"{key[0]}.{key[1]}.{run}"
    return f"{key}~{run}" if run else str(key)


def keeper_alive(state_dir: Path) -> bool:
    """True if a keeper holds ``state_dir``'s launcher lock, or its abstract name (which
    outlives a removed lock file: see :func:`.launcher.claim_name`)."""
    try:
        fd = os.open(state_dir / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return claimed(str(state_dir))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return claimed(str(state_dir))


def launcher_elsewhere(state_dir: Path) -> str:
    """Why the keeper that holds ``state_dir``'s launcher lock does not answer there, when
    it was started for another path (the folder was moved while its jobs ran: it serves
    the old path only, and retires once they have ended); ``""`` otherwise. The engine
    said only "did not answer in 15 s" (tester h66)."""
    try:
        with open(state_dir / LOCK, "rb") as fh:
            pid = int(fh.read().split()[0])
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = [w.decode(errors="replace") for w in fh.read().split(b"\0") if w]
    except (OSError, ValueError, IndexError):
        return ""
    if "gpulayer_tui.engine.keeper" not in words:
        return ""
    at = words.index("gpulayer_tui.engine.keeper") + 1
    started_for = words[at] if at < len(words) else ""
    if not started_for or os.path.realpath(started_for) == os.path.realpath(state_dir):
        return f": its keeper (pid {pid}) holds the lock but does not answer (see launcher.log)"
    return (
        f": the launcher holding this folder's jobs (keeper pid {pid}) was started for "
        f"{started_for}, the path this folder had before it was moved; it answers there "
        "only, and retires once those jobs have ended. Move the folder back until then, or "
        "end those jobs"
    )


def _job_of(key: TaskKey) -> int:
    return key[0] if isinstance(key, tuple) else key


def _seconds(value: object) -> float | None:
    """A time the launcher sent (``None`` when absent or not a number)."""
    return float(value) if isinstance(value, (int, float)) else None


def _ack_line(keys: list[str]) -> bytes:
    """The request that lets the launcher forget ``keys`` (nothing for none)."""
    return json.dumps({"op": "ack", "keys": keys}).encode() + b"\n" if keys else b""


JOBS_OPEN_FILES: int | None = None
"""The open-files soft limit the launcher (and so every job) gets, when the engine raised
its own (``serve.raise_open_files_limit``): jobs keep the limit they would have had."""


class _Watch:
    __slots__ = ("held", "key", "on_exit", "on_start", "pid")

    def __init__(self, key: TaskKey, on_start: OnStart, on_exit: OnExit) -> None:
        self.key = key
        self.on_start = on_start
        self.on_exit = on_exit
        self.pid: int | None = None
        # A prepared start's news (started, exited) waits here until the loop has taken
        # in the commit that decided it (_Prepared.send): its runner sees its own decision
        # first, and subscribers get "running" before "started".
        self.held: list[Callable[[], None]] | None = None

    def hold(self, news: Callable[[], None]) -> bool:
        """Keep ``news`` for later if the task's start is not taken in yet."""
        if self.held is None:
            return False
        self.held.append(news)
        return True


class _Connection(asyncio.Protocol):
    """The launcher's socket: each complete line goes to ``on_line`` as it arrives."""

    def __init__(self, on_line: Callable[[bytes], None], on_lost: Callable[[Any], None]) -> None:
        self._on_line = on_line
        self._on_lost = on_lost
        self._buffer = b""
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
        *lines, self._buffer = data.split(b"\n")
        for line in lines:
            if not line:
                continue
            try:
                self._on_line(line)
            except Exception:  # one failing reaction must not stop the others
                log.exception("handling the launcher's %r failed", line[:80])
        if len(self._buffer) > LINE_LIMIT:
            log.error("the launcher sent a line over %d bytes; reconnecting", LINE_LIMIT)
            self._buffer = b""
            assert self.transport is not None
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_lost(self)


class _Prepared:
    """A spawn request made while its decision commits (see :class:`.PreparedStart`)."""

    __slots__ = ("_executor", "data", "discarded", "lkey", "request", "sent", "sent_at")

    def __init__(self, executor: LauncherExecutor, lkey: str, request: dict[str, Any]) -> None:
        self._executor = executor
        self.lkey = lkey
        self.request = request
        self.data = json.dumps(request, separators=(",", ":")).encode() + b"\n"
        self.sent = False  # (set under the executor's lock)
        self.sent_at: float | None = None  # (monotonic) written to a connected launcher
        self.discarded = False

    def send_now(self) -> None:
        """From the writer thread as the commit returns (see :meth:`.PreparedStart.send_now`)."""
        self._executor._send_direct(self)

    def send(self) -> None:
        """On the loop, once durable: send it unless it went already; from now on what
        the launcher says of it reaches its callbacks (held until then)."""
        self._executor._send_prepared(self)

    def discard(self) -> None:
        """On the loop: it will never be sent; its callbacks are forgotten."""
        self._executor._discard(self)


class LauncherExecutor:
    """Starts and watches jobs through the state dir's launcher.

    Args:
        state_dir: The engine's state dir.
        jobs_dir: Where job logs go.
        idle_timeout: How long an idle launcher with no engine waits before it exits.
    """

    def __init__(
        self,
        state_dir: Path,
        jobs_dir: Path,
        idle_timeout: float = 60.0,
        max_log: int = 1024**3,
    ) -> None:
        self.state_dir = state_dir
        self.jobs_dir = jobs_dir
        self.idle_timeout = idle_timeout
        self.max_log = max_log  # a job's log is cut back past this ([logs] max_bytes)
        self._max_log_heard = True  # the launcher answered the last new max_log
        # (key, dropped, kept, the limit it passed: None from a launcher before it said)
        self.log_cut: list[Callable[[TaskKey, int, int, int | None, int | None], None]] = []
        self._conn: _Connection | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._serving = False  # open() is done: a lost connection is reconnected
        self._reconnecting: asyncio.Task[None] | None = None
        self._connect_problem: str | None = None  # why no launcher can be reached now
        self._watches: dict[str, _Watch] = {}
        self._pending: dict[str, _Prepared] = {}  # starts not answered yet
        self._outbox: list[bytes] = []  # held while no launcher is connected
        self._batch: list[bytes] = []  # this loop iteration's requests, sent as one write
        self._flush_handle: asyncio.Handle | None = None
        self._acks: list[str] = []  # (under the lock: the writer thread takes them too)
        # A requeued job's run that an engine from before per-run keys started (its key
        # is the job's own): its key here -> the key the launcher knows it by.
        self._aliases: dict[str, str] = {}
        self._found: set[str] = set()  # launcher keys a restore asked for (find)
        # Acks written lately: one still in the socket (or the transport) when the
        # spawner died is lost, and the launcher would keep that end for ever.
        self._recent_acks: collections.deque[str] = collections.deque(maxlen=RECENT_ACKS)
        self._ack_timer: asyncio.TimerHandle | None = None
        self._released: set[str] = set()  # tasks let go of as unkillable (still running)
        # Stops asked of the launcher, by key: their SIGKILL deadline (wall clock). A stop
        # written to a spawner that died before it read it is lost with it: after the
        # reconnect it is asked again of the new spawner, for what it still runs.
        # (deadline, the connection it was written to; None: it waits in the outbox)
        self._stops: dict[str, tuple[float, _Connection | None]] = {}
        self._table: dict[str, Any] = {}
        self._table_ready: asyncio.Future[dict[str, Any]] | None = None
        self._started_at: float | None = None
        self._programs: dict[tuple[str, str, str], tuple[float, str]] = {}
        # Environments sent to the launcher: id(env) -> (its id there, the env kept alive).
        self._envs: dict[int, tuple[int, dict[str, str]]] = {}
        self._next_env_id = 0
        self._closing = False
        self._syncing = False  # reconnected, not yet told the launcher what it must know
        # Every write to the socket holds this lock: the store's writer thread sends a
        # committed start itself (_send_direct), through its own descriptor of the socket
        # (one that only we close, under this lock: the transport's may be closed and its
        # number reused before we hear of it).
        self._lock = threading.Lock()
        self._direct_fd = -1
        self._tail = b""  # what a partial direct write left, sent before anything else
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def problem(self) -> str | None:
        """Why no job starts now, while that lasts: no launcher can be reached (its
        spawner cannot start, say), or the one connected has answered none of the starts
        sent to it for :data:`STALL_S` (stopped, hung, or starved of CPU). Jobs decided
        meanwhile wait for it, and the engine's health, ``/ready`` and ``doctor`` say it.
        (A stopped spawner went unsaid: jobs showed running with no process, /ready
        answered 200 and doctor said all was well: tester h143.)"""
        if self._connect_problem is not None:
            return self._connect_problem
        sent = [p.sent_at for p in self._pending.values() if p.sent_at is not None]
        if not sent:
            return None
        waited = time.monotonic() - min(sent)
        if waited < STALL_S:
            return None
        return (
            f"the launcher has not answered a start sent {waited:.0f} s ago ({len(sent)} "
            "waiting; is its spawner stopped or starved of CPU?)"
        )

    # -- connection ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (starting a launcher if none serves the state dir) and learn its table.

        Raises:
            OSError: No launcher could be reached or started.
        """
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            await self._connect()
            try:
                self._table = await self._query()
                break
            except OSError:
                # A launcher that was retiring (idle, its engine gone) closed on us: the
                # next one answers.
                self._drop_connection()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        self._serving = True

    async def _connect(self) -> None:
        """Connect to the launcher, starting one if none runs.

        Raises:
            OSError: None answered in CONNECT_TIMEOUT_S, or its spawner could not start
                since this call began (said at once, in the spawner's words).
        """
        sock = str(self.state_dir / SOCKET)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        began = time.time() - 1.0  # (a note's mtime has a coarse clock on some filesystems)
        delay = 0.005
        while True:
            where = SocketPath(self.state_dir / SOCKET)
            try:
                _, conn = await asyncio.get_running_loop().create_unix_connection(
                    functools.partial(_Connection, self._dispatch, self._lost), where.path
                )
                assert conn.transport is not None
                sock = conn.transport.get_extra_info("socket")
                with self._lock:
                    self._conn, self._transport = conn, conn.transport
                    self._direct_fd = os.dup(sock.fileno())
                    self._tail = b""
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if not self._launcher_alive():
                    self._start_launcher()
            finally:
                where.close()
            failure = self._start_failure(since=began)
            if failure is not None:
                raise OSError(failure)
            if time.monotonic() > deadline:
                raise OSError(
                    f"the launcher did not answer on {sock} in {CONNECT_TIMEOUT_S} s"
                    + launcher_elsewhere(self.state_dir)
                )
            await asyncio.sleep(delay)
            delay = min(0.1, delay * 2)

    def _launcher_alive(self) -> bool:
        return keeper_alive(self.state_dir)

    def _start_failure(self, since: float) -> str | None:
        """Why a spawner could not start, if one could not after ``since`` (wall clock)."""
        try:
            if os.stat(self.state_dir / FAILED_NOTE).st_mtime < since:
                return None
        except OSError:
            return None
        return start_failure(self.state_dir)

    def _start_launcher(self) -> None:
        if self._started_at is not None and time.monotonic() - self._started_at < 0.5:
            return  # ours is still starting
        self._started_at = time.monotonic()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        log_fd = os.open(self.state_dir / LOG, flags, 0o600)
        try:
            # Started in the background by a shell that exits at once: the launcher is then
            # nobody's child here (it outlives this engine, and is never our zombie).
            env = None
            if JOBS_OPEN_FILES is not None:  # (the engine raised its own: not the jobs')
                env = dict(os.environ, GPULAYER_OPEN_FILES=str(JOBS_OPEN_FILES))
            starter = subprocess.Popen(
                [
                    "/bin/sh",
                    "-c",
                    '[ -z "$GPULAYER_OPEN_FILES" ] || ulimit -S -n "$GPULAYER_OPEN_FILES"; '
                    'unset GPULAYER_OPEN_FILES; exec "$@" &',
                    "sh",
                    sys.executable,
                    "-m",
                    "gpulayer_tui.engine.keeper",
                    str(self.state_dir),
                    "--idle",
                    str(self.idle_timeout),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                cwd="/",
                start_new_session=True,
                close_fds=True,
                env=env,
            )
        finally:
            os.close(log_fd)
        starter.wait()

    async def _query(self) -> dict[str, Any]:
        """Ask for the launcher's table (sent at once, ahead of any outbox).

        Raises:
            OSError: The connection closed before the answer.
        """
        self._table_ready = asyncio.get_running_loop().create_future()
        self._write_now({"op": "query"})
        return await self._table_ready

    def _forget_connection(self) -> None:
        """(With the lock held.) No connection: nothing more is written to this one."""
        self._conn = self._transport = None
        if self._direct_fd >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1
        self._tail = b""  # (a part of a line: the next connection must not begin with it)

    def _drop_connection(self) -> None:
        with self._lock:
            if self._transport is not None:
                self._transport.close()
            self._forget_connection()

    def _lost(self, conn: _Connection) -> None:
        """``conn`` closed (the spawner died, or we closed it)."""
        with self._lock:
            if conn is not self._conn:
                return  # an older one
            self._forget_connection()
        if self._table_ready is not None and not self._table_ready.done():
            self._table_ready.set_exception(OSError("the launcher closed the connection"))
        if self._closing or not self._serving or self._reconnecting is not None:
            return  # (open() and a running reconnect handle it themselves)
        log.warning("lost the launcher; reconnecting")
        self._reconnecting = asyncio.get_running_loop().create_task(
            self._reconnect(), name="launcher-reconnect"
        )

    async def _reconnect(self) -> None:
        # Until the new launcher has its environments and the starts it missed, every
        # request waits in the outbox (a spawn naming an environment it does not know yet
        # would fail).
        self._syncing = True
        try:
            while not self._closing:
                try:
                    await self._connect()
                except OSError as err:
                    # (the last spawner's own words, while none has started since)
                    problem = start_failure(self.state_dir) or str(err)
                    if self._connect_problem != problem:
                        log.error("cannot reach the launcher (%s); trying again", problem)
                    self._connect_problem = problem
                    await asyncio.sleep(1.0)
                    continue
                self._connect_problem = None
                if self._closing:
                    return
                try:
                    table = await self._query()
                except OSError:
                    continue  # that one went away too: the next
                self._reconcile(table)
                return
        finally:
            self._reconnecting = None

    def _reconcile(self, table: dict[str, Any]) -> None:
        """After a reconnect: report what ended, send again what never arrived."""
        resend = []
        for lkey, watch in list(self._watches.items()):
            info = table.get(lkey)
            if info is None:
                prepared = self._pending.get(lkey)
                if prepared is None:
                    self._exited(lkey, None)  # lost with both launcher processes
                elif prepared.sent:
                    resend.append(prepared)
                # (else its decision is still being committed: it is sent after that)
            elif info["state"] == "running" and watch.pid is None:
                self._started(lkey, info["pid"], info["ticks"])
            elif info["state"] == "exited":
                if watch.pid is None and info.get("pid"):
                    # (none: its start was interrupted, and a keeper found it had run and
                    # ended, its pid unknown; see journal.STARTING)
                    self._started(lkey, info["pid"], info["ticks"])
                self._exited(lkey, info["code"], info.get("at"))
        # A new spawner knows no environment: send every one again, before anything else;
        # nor the logs' cap, for the jobs it took over (their logs grew past it for good).
        for env_id, env in self._envs.values():
            self._write_now({"op": "env", "id": env_id, "env": env})
        self._max_log_heard = False
        self._write_now({"op": "max_log", "bytes": self.max_log})
        with self._lock:
            # Ends this engine acked (so recorded) that the launcher still keeps: those acks
            # died with the connection.
            lost = {
                key
                for key in self._recent_acks
                if key not in self._watches and table.get(key, {}).get("state") == "exited"
            }
            self._acks[:0] = sorted(lost)
            acks = self._take_acks()
            if acks:
                self._transport_write(acks)
            now = time.time()
            for lkey, (kill_at, sent_on) in list(self._stops.items()):
                # (one still in the outbox goes with it, below)
                running = table.get(lkey, {}).get("state") == "running"
                if sent_on is not None and lkey in self._watches and running:
                    grace = max(0.0, kill_at - now)
                    line = {"op": "terminate", "key": lkey, "grace": grace}
                    self._transport_write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
                self._stops[lkey] = (kill_at, self._conn)
            outbox, self._outbox = self._outbox, []
            for prepared in resend:
                self._transport_write(prepared.data)
                prepared.sent_at = time.monotonic()
            for data in outbox:
                self._transport_write(data)
            self._syncing = False

    def _write(self, request: dict[str, Any]) -> None:
        """Send ``request`` at the end of this loop iteration, with the others made in it
        (the starts of one scheduling pass, the acks of the ends it saw): one system call
        and one wake-up of the launcher for all of them."""
        data = json.dumps(request, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self._batch.append(data)
        self._flush_soon()

    def _flush_soon(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush_batch)

    def _flush_batch(self) -> None:
        self._flush_handle = None
        with self._lock:
            # (Acks first: the launcher forgets an end before it reads what comes next.)
            data, self._batch = self._take_acks() + b"".join(self._batch), []
            if not data:
                return
            if self._transport is None or self._outbox or self._syncing:
                self._outbox.append(data)  # (sent after the reconnect, in order)
            else:
                self._transport_write(data)

    def _take_acks(self) -> bytes:
        """(With the lock held.) The ack line for the ends recorded so far, if any."""
        keys, self._acks = self._acks, []
        self._recent_acks.extend(keys)
        return _ack_line(keys)

    def _ack_soon(self) -> None:
        # An ack is not urgent (it lets the launcher forget an end the engine recorded): it
        # rides with the next request, a start sent as its commit returns above all (one
        # write, one wake-up of the launcher), or goes alone after ACK_DELAY_S.
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY_S, self._acks_due)

    def _acks_due(self) -> None:
        self._ack_timer = None
        with self._lock:
            pending = bool(self._acks)
        if pending:
            self._flush_soon()

    def _write_now(self, request: dict[str, Any]) -> None:
        with self._lock:
            self._transport_write(json.dumps(request, separators=(",", ":")).encode() + b"\n")

    def _transport_write(self, data: bytes) -> None:
        """(With the lock held.) Write ``data`` after what a partial direct write left."""
        assert self._transport is not None
        if self._tail:
            data, self._tail = self._tail + data, b""
        self._transport.write(data)

    def _flush_tail(self) -> None:
        with self._lock:
            if self._tail and self._transport is not None:
                self._transport_write(b"")

    # -- prepared starts ------------------------------------------------------------------------

    def _send_direct(self, prepared: _Prepared) -> None:
        """Send a committed start from the calling thread (the store's writer), unless
        something sent before it still waits; then the loop sends it (:meth:`_send_prepared`)."""
        try:
            with self._lock:
                if prepared.sent or prepared.discarded or self._direct_fd < 0:
                    return
                if self._batch or self._outbox or self._syncing or self._tail:
                    return  # (an earlier request, its environment perhaps, goes first)
                transport = self._transport
                if transport is None or transport.get_write_buffer_size():
                    return
                acks, self._acks = self._acks, []
                data = _ack_line(acks) + prepared.data
                try:
                    written = os.write(self._direct_fd, data)
                except OSError:
                    self._acks[:0] = acks  # (they go with the loop's next write)
                    raise
                self._recent_acks.extend(acks)
                prepared.sent, prepared.sent_at = True, time.monotonic()
                if written < len(data):
                    # The socket took part of it: the rest goes first from the loop.
                    self._tail = data[written:]
                    assert self._loop is not None
                    self._loop.call_soon_threadsafe(self._flush_tail)
        except OSError:
            return  # full, or the launcher went away: the loop sends it (or resends it)

    def _send_prepared(self, prepared: _Prepared) -> None:
        with self._lock:
            if prepared.discarded:
                return
            sent_early, prepared.sent = prepared.sent, True
            if not sent_early:
                self._batch.append(prepared.data)
                prepared.sent_at = time.monotonic()  # (with this iteration's write)
        if not sent_early:
            self._flush_soon()
        watch = self._watches.get(prepared.lkey)
        if watch is not None and watch.held is not None:
            held, watch.held = watch.held, None
            for news in held:  # (what the launcher said while the commit was on its way)
                news()

    def _discard(self, prepared: _Prepared) -> None:
        with self._lock:
            if prepared.sent:
                return
            prepared.discarded = True
        self._pending.pop(prepared.lkey, None)
        self._watches.pop(prepared.lkey, None)

    def _dispatch(self, line: bytes) -> None:
        try:
            event = json.loads(line)
            kind = event["ev"]
        except (ValueError, KeyError, TypeError):
            return
        if kind == "started":
            at = event.get("at")
            self._started(
                str(event["key"]),
                int(event["pid"]),
                int(event["ticks"]),
                float(at) if isinstance(at, (int, float)) else None,
            )
        elif kind == "exited":
            dropped = event.get("dropped")
            self._exited(
                str(event["key"]),
                event.get("code"),
                event.get("at"),
                None if dropped is None else int(dropped),
                bool(event.get("timed_out")),
                _seconds(event.get("term_at")),
            )
        elif kind == "failed":
            self._failed(str(event["key"]), str(event["error"]))
        elif kind == "log_cut":
            watch = self._watches.get(str(event["key"]))
            if watch is not None:
                for listener in self.log_cut:
                    limit, total = event.get("limit"), event.get("total")
                    listener(
                        watch.key,
                        int(event["dropped"]),
                        int(event["kept"]),
                        None if limit is None else int(limit),
                        None if total is None else int(total),
                    )
        elif kind == "max_log":
            self._max_log_heard = True
        elif kind == "table" and self._table_ready is not None:
            if not self._table_ready.done():
                if not self._serving:
                    # Taken in now, not when open() resumes: an end told in the same read
                    # (the job ended as this engine connected) updates it in _exited. It
                    # was dropped, and the restore found the job running for ever.
                    self._table = event["tasks"]
                self._table_ready.set_result(event["tasks"])

    def _started(self, lkey: str, pid: int, ticks: int, at: float | None = None) -> None:
        self._pending.pop(lkey, None)
        watch = self._watches.get(lkey)
        if watch is None or watch.pid is not None:
            return
        if watch.hold(functools.partial(self._started, lkey, pid, ticks, at)):
            return
        watch.pid = pid
        watch.on_start(Started(pid, ticks, at=at))

    def _exited(
        self,
        lkey: str,
        code: int | None,
        at: float | None = None,
        dropped: int | None = None,
        timed_out: bool = False,
        term_at: float | None = None,
    ) -> None:
        self._pending.pop(lkey, None)
        held = self._watches.get(lkey)
        if held is not None and held.hold(
            functools.partial(self._exited, lkey, code, at, dropped, timed_out, term_at)
        ):
            return
        self._stops.pop(lkey, None)
        watch = self._watches.pop(lkey, None)
        if watch is not None:
            watch.on_exit(
                Exit(
                    code,
                    recorded=code is not None,
                    at=at,
                    log_dropped=dropped,
                    timed_out=timed_out,
                    term_at=term_at,
                )
            )
        elif lkey in self._released:
            # Released as unkillable, it ended after all: its job is over already.
            self._released.discard(lkey)
            with self._lock:
                self._acks.append(lkey)
            self._flush_soon()
        elif lkey in self._table:
            # Not watched yet: it ended between the table's answer and the restore's
            # find(), which would have found it running and waited for ever for an end
            # already told (a restarted engine's job stayed "running", its end journaled).
            self._table[lkey] = {
                "state": "exited",
                "code": code,
                "at": at,
                "dropped": dropped,
                "timed_out": timed_out or None,
                "term_at": term_at,
            }

    def _failed(self, lkey: str, error: str) -> None:
        self._pending.pop(lkey, None)
        held = self._watches.get(lkey)
        if held is not None and held.hold(functools.partial(self._failed, lkey, error)):
            return
        self._stops.pop(lkey, None)
        watch = self._watches.pop(lkey, None)
        if watch is not None:
            watch.on_exit(Exit(None, recorded=False, error=error))

    async def close(self) -> None:
        """Stop listening; the launcher keeps running what runs (it exits once idle)."""
        self._closing = True
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        if self._reconnecting is not None:
            await cancel_and_wait(self._reconnecting)
        transport = self._transport
        if transport is not None:
            self._flush_batch()
            self._write_now({"op": "quit_if_idle"})
            # What is still buffered (the socket was full) goes out before the close.
            deadline = time.monotonic() + 5.0
            while transport.get_write_buffer_size() and not transport.is_closing():
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            self._drop_connection()

    # -- the executor interface -----------------------------------------------------------------

    def log_path(self, key: TaskKey) -> Path:
        """The task's combined stdout/stderr file."""
        return self.jobs_dir / f"{task_name(key)}.log"

    def prepare(
        self,
        key: TaskKey,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        extra_env: dict[str, str],
        on_start: OnStart,
        on_exit: OnExit,
        run: int = 0,
        timeout: tuple[float, float] | None = None,
    ) -> _Prepared:
        """A start request, ready to send once its decision is durable (see
        :meth:`.Executor.prepare`); its environment goes to the launcher now.

        Raises:
            LaunchError: Missing cwd, or a program that is not there or not executable.
        """
        if not os.path.isdir(cwd):
            missing = "is not a directory" if os.path.exists(cwd) else "does not exist"
            raise LaunchError(f"working directory {missing}: {printable(cwd)}")
        self._check_program(argv[0], cwd, {**env, **extra_env} if "PATH" in extra_env else env)
        lkey = launcher_key(key, run)
        request = {
            "op": "spawn",
            "key": lkey,
            "argv": argv,
            "cwd": cwd,
            "env_id": self._env_id(env),
            "extra": extra_env,
            "log": str(self.log_path(key)),
            # A first start never appends to an older file; a later run continues its log.
            "fresh": run <= 1 if isinstance(key, tuple) else run == 0,
            "max_log": self.max_log,
        }
        if not request["fresh"]:
            # A later run's output continues its log: a line in between says where it
            # begins (runs ran together, and a restart's first lines read as the last
            # run's).
            what = f"replica {key[1]}, run {run}" if isinstance(key, tuple) else f"run {run + 1}"
            request["banner"] = f"--- gpulayer-tui: {what} of job {_job_of(key)}, started at "
        if timeout is not None:
            request["timeout"] = [timeout[0], timeout[1]]
        watch = self._watches[lkey] = _Watch(key, on_start, on_exit)
        watch.held = []
        prepared = self._pending[lkey] = _Prepared(self, lkey, request)
        return prepared

    def _env_id(self, env: dict[str, str]) -> int:
        """The launcher's id for ``env``, sending it first if it has not seen it.

        Many jobs share one environment object (the engine's, plus their spec's): sending
        it once instead of with every start saves a few kilobytes of JSON per job.
        """
        known = self._envs.get(id(env))
        if known is not None and known[1] is env:
            return known[0]
        if len(self._envs) >= ENV_CACHE:
            self._envs.pop(next(iter(self._envs)))
        self._next_env_id += 1
        env_id = self._next_env_id
        self._envs[id(env)] = (env_id, env)
        self._write({"op": "env", "id": env_id, "env": env})
        return env_id

    def _check_program(self, argv0: str, cwd: str, env: dict[str, str]) -> None:
        cache_key = (argv0, env.get("PATH", ""), cwd if "/" in argv0 else "")
        now = time.monotonic()
        hit = self._programs.get(cache_key)
        if hit is not None and now - hit[0] < PROGRAM_CACHE_S:
            return
        path, why = why_not_runnable(argv0, cwd, env)
        if path is None:
            raise LaunchError(why)
        if len(self._programs) > 1024:
            self._programs.clear()
        self._programs[cache_key] = (now, path)

    def highest_job_id(self) -> int:
        """The largest job id among the runs the launcher knows (0 if none): a database
        moved aside (as a damaged one's message advises) numbered from 1 again, and a new
        job whose key the launcher knew was answered with the old run's process or end."""
        ids = [int(m.group()) for key in self._table if (m := _LEADING_ID.match(key))]
        return max(ids, default=0)

    def unwatched(self) -> list[tuple[str, int, int]]:
        """Runs the launcher says are running that no job of this engine watches (after
        the restore): ``(key, pid, start ticks)``. Started from a database moved aside (as
        a damaged one's message advises), they run on, invisible, their GPUs taken for
        free (issue: a job placed on top of one on a real GPU runs out of memory)."""
        watched = set(self._watches) | self._released | set(self._aliases.values())
        return [
            (key, int(info["pid"]), int(info["ticks"] or 0))
            for key, info in self._table.items()
            if info.get("state") == "running" and key not in watched and info.get("pid")
        ]

    def ended_unclaimed(self) -> list[str]:
        """Ends the launcher journaled that no job taken back asked for (after the
        restore): launcher keys. One of a job already ended in the database had its end
        recorded by an engine killed before it told the launcher so: kept for good, it
        was counted as an end no engine had recorded."""
        return [
            key
            for key, info in self._table.items()
            if info.get("state") == "exited" and key not in self._found
        ]

    def forget(self, lkey: str) -> None:
        """Tell the launcher it may forget ``lkey``'s end (see :meth:`ended_unclaimed`)."""
        with self._lock:
            self._acks.append(lkey)
        self._ack_soon()

    def find(self, key: TaskKey, on_start: OnStart, on_exit: OnExit, run: int = 0) -> object:
        """What the launcher knows of a task after a restart (see :meth:`.Executor.find`)."""
        lkey = launcher_key(key, run)
        self._found.add(lkey)
        info = self._table.get(lkey)
        if info is None and run and isinstance(key, int):
            # A requeued job's run started before every run had a key of its own: the
            # launcher knows it by the job's key (its earlier run's end was acked first).
            info = self._table.get(str(key))
            if info is not None:
                self._aliases[lkey] = lkey = str(key)
                self._found.add(lkey)
        if info is None:
            return None
        if info["state"] == "exited":
            dropped = info.get("dropped")
            return Exit(
                info["code"],
                recorded=info["code"] is not None,
                at=info.get("at"),
                log_dropped=None if dropped is None else int(dropped),
                timed_out=bool(info.get("timed_out")),
                term_at=_seconds(info.get("term_at")),
                pid=int(info["pid"]) if info.get("pid") else None,
            )
        watch = _Watch(key, on_start, on_exit)
        watch.pid = int(info["pid"])
        self._watches[lkey] = watch
        return Started(
            int(info["pid"]),
            int(info["ticks"] or 0),
            timed_out=bool(info.get("timed_out")),
            term_at=_seconds(info.get("term_at")),
        )

    def set_max_log(self, limit: int) -> None:
        """A new ``[logs] max_bytes``: for the starts from now on, and for the logs of the
        jobs running now (a lower cap is what one sets to stop a runaway log)."""
        if limit == self.max_log:
            return
        self.max_log = limit
        if self._serving:
            self.send_max_log()
            assert self._loop is not None
            self._loop.call_later(MAX_LOG_ANSWER_S, self._max_log_unheard, limit)

    def send_max_log(self) -> None:
        """Tell the launcher the cap in force, for the jobs running now too (at start: it
        may have been changed while no engine ran)."""
        self._max_log_heard = False
        self._write({"op": "max_log", "bytes": self.max_log})
        self._flush_batch()

    def _max_log_unheard(self, limit: int) -> None:
        # A launcher started by an earlier version (it outlives upgrades) ignores the
        # request: said, rather than a lower cap that silently did nothing.
        if not self._max_log_heard and limit == self.max_log and self._serving:
            log.warning(
                "the launcher (started by an earlier gpulayer-tui) does not apply the new "
                "[logs] max_bytes = %d to the jobs running now: it applies to jobs started "
                "from now on, and to all once that launcher has retired (with no job running)",
                limit,
            )

    def terminate(self, key: TaskKey, grace: float, run: int = 0) -> bool:
        """SIGTERM the task's process group, SIGKILL after ``grace`` (the launcher keeps
        the deadline, also while no engine runs)."""
        lkey = self._lkey(key, run)
        if lkey not in self._watches:
            return False
        with self._lock:
            live = self._transport is not None and not self._outbox and not self._syncing
        self._stops[lkey] = (time.time() + grace, self._conn if live else None)
        self._write({"op": "terminate", "key": lkey, "grace": grace})
        # Out now, not at the end of this loop iteration: the stop is durable and its
        # caller is about to be told, and a launcher that has it signals on time even if
        # this engine dies the next instant.
        self._flush_batch()
        return True

    def release(self, key: TaskKey, run: int = 0) -> None:
        """Stop watching a task that outlived SIGKILL (its job ended ``unkillable``); the
        launcher still reaps it whenever it dies, and its end is then acknowledged."""
        lkey = self._lkey(key, run)
        self._stops.pop(lkey, None)
        if self._watches.pop(lkey, None) is not None:
            self._released.add(lkey)

    def done(self, key: TaskKey, run: int = 0) -> None:
        """The engine recorded the task's end: the launcher may forget it."""
        lkey = launcher_key(key, run)
        lkey = self._aliases.pop(lkey, lkey)
        with self._lock:
            self._acks.append(lkey)
        self._ack_soon()

    def keeper_lost(self) -> bool:
        """True while the connected launcher runs without its keeper (killed, say): the
        jobs run on, but a spawner crash now would lose their exit statuses (nobody above
        it inherits them). It retires once they end, and the next start brings a new one."""
        return self._serving and self._conn is not None and not self._launcher_alive()

    def pids(self) -> dict[TaskKey, int]:
        """The process of every task running now."""
        return {w.key: w.pid for w in self._watches.values() if w.pid is not None}

    def watching(self, key: TaskKey, run: int = 0) -> bool:
        """True while a task is started or running (its end not reported yet)."""
        return self._lkey(key, run) in self._watches

    def _lkey(self, key: TaskKey, run: int) -> str:
        lkey = launcher_key(key, run)
        return self._aliases.get(lkey, lkey) if self._aliases else lkey
