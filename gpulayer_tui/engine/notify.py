"""Notifications: when a job ends, or a service replica restarts or gives up (``[notify]``).

The :class:`Notifier` listens on the event bus, so it hears only what is durable: the store
publishes an event after its commit, never before. For each notification it reads the
job as ``GET /v1/jobs/ID`` answers it (environment values replaced by ``(hidden)``: a
notification leaves the engine's users, tokens and keys must not) and adds:

* ``event``: ``job.ended``, ``replica.restarted`` (a replica exited and will start again
  after its back-off), ``replica.gave_up`` (it exited for good: no restart left, or it
  could not start) or ``replica.down`` (its port stopped answering);
* ``event_at``: when that happened (epoch seconds);
* ``replica`` (replica events only): the replica event's data (index, state, message,
  exit code, restarts).

That JSON goes to the stdin of ``[notify] command`` (argv, no shell, its own session,
``GPULAYER_JOB_ID`` and ``GPULAYER_NOTIFY_EVENT`` in its environment, stdout discarded,
the end of its stderr logged if it fails) and/or is POSTed to ``[notify] url``
(``Content-Type: application/json``). Each delivery has ``[notify] timeout`` seconds; a
command still running then is killed with its process group.

Nothing here can hold the engine up or change a job: events are taken from the bus
without waiting, notifications wait in a bounded queue (one that is full drops the new
one, with a warning) and at most :data:`WORKERS` are delivered at once (one job's one
after another, in the order of its events); a failure (a
command that cannot start, exits non-zero or is killed at the timeout; a refused
connection, an HTTP status of 400 or more) is logged with the job's id and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from ..fields import printable
from .access import env_values_hidden
from .config import NotifySettings
from .errors import UnknownJob
from .events import EventBus, Subscription
from .models import Event, EventKind, Job, ReplicaState
from .tasks import cancel_and_wait

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger(__name__)

__all__ = ["JOB_ENDED", "REPLICA_GAVE_UP", "REPLICA_RESTARTED", "Notifier"]

JOB_ENDED = "job.ended"
REPLICA_RESTARTED = "replica.restarted"
REPLICA_GAVE_UP = "replica.gave_up"
REPLICA_DOWN = "replica.down"

WORKERS = 4  # notifications delivered at once
QUEUE_MAX = 256  # notifications waiting; beyond this a new one is dropped (logged)
DROPPED_SAID_EVERY = 100  # a dropped notification is logged for the first of each 100
STOP_WAIT_S = 2.0  # how long a stopping engine waits for notifications under way
STDERR_KEEP = 1000  # bytes of a failed command's stderr that reach the log
STDERR_GRACE_S = 0.5  # how long its stderr is read after the command exits


CURSOR_ROW = "notify_row"
"""The stored cursor (in ``counters``): every stored event up to this row of ``events`` was
considered; those that called for a notification not delivered yet are :data:`OWED`."""
CURSOR_RUN = "notify_run"
"""The engine run that kept the cursor (0: none kept it: notifications were off)."""
OWED = "notify_owed."
"""Settings ``notify_owed.ROW = CHANNELS``: a notification of that row still to deliver,
and to which (:data:`COMMAND` and/or :data:`URL`: one delivered before a stop is not sent
again). Written as it is queued, rewritten as each channel is done, removed once all are:
the next engine sends these and the events after the cursor, nothing else (a low-water
cursor had it send again everything after the oldest one still owed)."""
COMMAND, URL = 1, 2
"""The channels of a notification (bits)."""
CATCH_UP_S = 86400.0
"""How far back a new engine looks for notifications the last one did not deliver."""


@dataclass(frozen=True, slots=True)
class _Pending:
    """One notification to deliver, with the settings of the moment it was decided."""

    event: str
    job_id: int
    at: float
    replica: dict[str, Any] | None
    settings: NotifySettings
    row: int | None = None  # its event's row in the database (None: not stored)
    channels: int = COMMAND | URL  # where it goes still (with the settings': where set)


class Notifier:
    """Sends ``[notify]`` notifications; owns its subscription, queue, workers and HTTP
    session.

    Args:
        bus: The engine's event bus (events arrive only once durable).
        settings: ``[notify]``.
        read_job: Reads a job as the API does (live record, else the stored one).

    Attributes:
        sent: Notifications delivered (each command run or POST that succeeded).
        failed: Deliveries that failed (logged).
        dropped: Notifications dropped because the queue was full (logged).
    """

    def __init__(
        self,
        bus: EventBus,
        settings: NotifySettings,
        read_job: Callable[[int], Awaitable[Job]],
        store: Store | None = None,
    ) -> None:
        self._bus = bus
        self._settings = settings
        self._read_job = read_job
        # The cursor (see CURSOR_ROW and OWED): the highest row considered, and the rows
        # whose notifications are queued or under way; kept in the store once a run has
        # set it out.
        self._store = store
        self._open_rows: dict[int, int] = {}  # row -> its channels still to deliver
        self._seen_row = 0
        self._cursor_kept = False
        self._busy = 0  # notifications being delivered now
        # One job's notifications are delivered one after another, in the order of their
        # events (with WORKERS at once, a job's "job.ended" often reached the hook before
        # the "replica.gave_up" that ended it): its lock, and how many hold or await it.
        self._job_turns: dict[int, tuple[asyncio.Lock, int]] = {}
        self._owed: dict[int, int] = {}  # job id -> its notifications queued or under way
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(QUEUE_MAX)
        self._sub: Subscription | None = None
        self._listener: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._started = False
        self.sent = 0
        self.failed = 0
        self.dropped = 0

    def unsent_warning(self, jobs: list[Job]) -> str | None:
        """What to tell the submitter of ``jobs`` where some ask to be notified and
        ``[notify]`` has nowhere to send (the flag was taken without a word: tester h152);
        None otherwise. Not a refusal: a command or url set before they end still counts.
        """
        marked = [job.id for job in jobs if job.spec.get("notify")]
        if not marked or self._settings.enabled:
            return None
        if len(marked) == 1:
            which = f"job {marked[0]} asks"
        elif len(marked) == len(jobs) and marked == list(range(marked[0], marked[-1] + 1)):
            which = f"jobs {marked[0]}-{marked[-1]} ask"
        else:
            which = f"{len(marked)} of these jobs ask"
        return (
            f"{which} to be notified (notify), but [notify] in the engine's config has no "
            "command or url: nothing is sent unless one is set there (an edit applies at once) "
            "before the job ends"
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start listening if ``[notify]`` has somewhere to send (otherwise the bus does
        not know it exists: with no subscriber, publishers skip building job rows)."""
        self._started = True
        if self._settings.enabled:
            self._listen()

    def reconfigure(self, settings: NotifySettings) -> None:
        """A reloaded ``[notify]``: applies to notifications decided from now on; turned
        off, those still waiting are dropped (they went on with the old settings for half
        an hour, and held `clean` back: tester h49). One under way finishes."""
        self._settings = settings
        if not self._started:
            return
        if not settings.enabled:
            dropped = 0
            while True:
                try:
                    pending = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                dropped += 1
                self._handled(pending)
                self._queue.task_done()
            if dropped:
                log.warning(
                    "[notify] turned off: %d notification%s waiting dropped",
                    dropped,
                    "" if dropped == 1 else "s",
                )
        if settings.enabled:
            if self._listener is None and self._store is not None and self._cursor_kept:
                # (turned on now: from here on, nothing of before is owed)
                self._seen_row = self._store.last_event_row
                self._save_cursor()
            self._listen()
        else:
            self._unlisten()
            if self._store is not None and self._cursor_kept:
                self._store.save_setting(CURSOR_RUN, 0)  # (off: nothing owed for now)

    async def catch_up(self) -> int:
        """At start, once the store is open: queue the notifications the last engine
        decided and did not deliver (it stopped with some waiting, or was killed; an event
        committed just before a crash was never even published). Only that run's, only if
        it kept its cursor (notifications were on), and at most a day's and
        :data:`QUEUE_MAX` of them (the newest). Delivery is at least once after a kill (one
        delivered just before it may come again); after a clean stop, only what was not
        delivered comes again.

        Returns:
            How many notifications were queued.
        """
        store = self._store
        if store is None:
            return 0
        kept_by = await store.setting(CURSOR_RUN)
        row = await store.setting(CURSOR_ROW)
        owed = {
            int(name[len(OWED) :]): channels
            for name, channels in (await store.settings_named(OWED)).items()
        }
        if owed:
            store.drop_settings(OWED)  # (those queued below are written again)
        self._seen_row = store.first_event_row
        queued = 0
        if (
            self._started
            and self._settings.enabled
            and kept_by
            and kept_by == store.previous_run_id
            and row is not None
            and (row < store.first_event_row or owed)
        ):
            since = time.time() - CATCH_UP_S
            events = await store.stored_events(
                row, store.first_event_row, since, sorted(self._settings.on), list(owed)
            )
            decided = [p for p in map(self._decide, events) if p is not None]
            if self._settings.jobs == "marked":
                # (stored events carry no job row: the jobs are looked up, or unmarked
                # ones took the places of the marked and were counted as sent)
                marked = await store.marked_for_notify({p.job_id for p in decided})
                decided = [p for p in decided if p.job_id in marked]
            decided = [
                dataclasses.replace(p, channels=owed[p.row])
                if p.row is not None and p.row in owed
                else p
                for p in decided
            ]
            # (at most QUEUE_MAX, the newest: the older ones are said, not sent)
            skipped = max(0, len(decided) - QUEUE_MAX)
            for pending in decided[skipped:]:
                queued += self._enqueue(pending)
            if queued:
                log.warning(
                    "notifications: %d left undelivered by the last engine are sent now", queued
                )
            if skipped:
                log.warning(
                    "notifications: %d older ones left undelivered by the last engine are not "
                    "sent (after a restart at most %d are, the newest)",
                    skipped,
                    QUEUE_MAX,
                )
        self._cursor_kept = True
        if self._settings.enabled:
            self._save_cursor()
            for pending_row, channels in self._open_rows.items():
                store.save_setting(f"{OWED}{pending_row}", channels)
        return queued

    def _save_cursor(self) -> None:
        store = self._store
        if store is None or not self._cursor_kept:
            return
        store.save_setting(CURSOR_RUN, store.run_id)
        store.save_setting(CURSOR_ROW, self._seen_row)

    def _channel_done(self, pending: _Pending, channel: int) -> None:
        """One channel of ``pending`` was delivered or failed: not owed any more."""
        row = pending.row
        if row is None or row not in self._open_rows:
            return
        left = self._open_rows[row] & ~channel
        if left:
            self._open_rows[row] = left
            if self._store is not None and self._cursor_kept:
                self._store.save_setting(f"{OWED}{row}", left)

    def _handled(self, pending: _Pending) -> None:
        """``pending`` was delivered, failed, or will not be tried."""
        left = self._owed.get(pending.job_id, 0) - 1
        if left > 0:
            self._owed[pending.job_id] = left
        else:
            self._owed.pop(pending.job_id, None)
        row = pending.row
        if row is None or self._open_rows.pop(row, None) is None:
            return
        if self._store is not None and self._cursor_kept:
            self._store.drop_setting(f"{OWED}{row}")
            self._save_cursor()

    async def stop(self) -> None:
        """Stop listening; wait up to :data:`STOP_WAIT_S` for notifications under way, then
        cancel what is left (a command still running is killed)."""
        self._started = False
        self._unlisten()
        if self._workers:
            try:
                async with asyncio.timeout(STOP_WAIT_S):
                    await self._queue.join()
            except TimeoutError:
                log.warning(
                    "notifications: stopping with %d not delivered (the next engine sends them)",
                    self._queue.qsize() + self._busy,
                )
            for task in self._workers:
                task.cancel()
            await asyncio.gather(*self._workers, return_exceptions=True)
            self._workers.clear()
        if self._settings.enabled:
            # (what is left stays owed, and only that: see OWED and catch_up)
            self._save_cursor()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _listen(self) -> None:
        if self._listener is None:
            self._sub = self._bus.subscribe()
            self._listener = asyncio.get_running_loop().create_task(self._follow(self._sub))
        while len(self._workers) < WORKERS:
            self._workers.append(asyncio.get_running_loop().create_task(self._work()))

    def _unlisten(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        if self._listener is not None:
            self._listener.cancel()
            self._listener = None

    # -- deciding -----------------------------------------------------------------------------

    async def _follow(self, sub: Subscription) -> None:
        while True:
            async for event in sub:
                self.consider(event)
            if not sub.overflowed:
                return  # the bus closed (engine stop)
            # Cut off for falling behind (the bus never waits for anyone): listen again.
            log.warning("notifications: fell behind the engine's events; some were missed")
            sub = self._sub = self._bus.subscribe()

    def consider(self, event: Event) -> int:
        """Queue a notification if ``event`` calls for one (never waits); how many were
        queued (0 or 1)."""
        pending = self._decide(event)
        return 0 if pending is None else self._enqueue(pending)

    def _decide(self, event: Event) -> _Pending | None:
        """The notification ``event`` calls for, if any (it counts as considered)."""
        if event.row is not None and event.row > self._seen_row:
            self._seen_row = event.row
        settings = self._settings
        replica: dict[str, Any] | None = None
        if event.kind is EventKind.TRANSITION:
            if event.data.get("status") not in settings.on:
                return None  # (``on`` holds terminal statuses only)
            what = JOB_ENDED
        elif event.kind is EventKind.REPLICA and settings.replicas:
            replica = event.data
            if event.data.get("gave_up"):
                what = REPLICA_GAVE_UP
            elif event.data.get("went_down"):
                what = REPLICA_DOWN
            elif event.data.get("state") == ReplicaState.BACKOFF and not event.data.get(
                "not_started"
            ):
                # (a replica that exited; one waiting on in back-off, not started again, a
                # GPU it ran on gone, notified at every back-off step, for ever)
                what = REPLICA_RESTARTED
            else:
                return None
        else:
            return None
        if event.job_id is None:
            return None
        if settings.jobs == "marked" and event.job is not None:
            if not event.job.get("spec", {}).get("notify"):
                return None  # (with no row in the event, the worker checks the whole job)
        return _Pending(what, event.job_id, event.at, replica, settings, event.row)

    def _enqueue(self, pending: _Pending) -> int:
        """Queue ``pending`` (never waits); 1 if it was queued, 0 if dropped (full)."""
        what = pending.event
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            self.dropped += 1
            # One line per burst, not one per job (a 300-job batch with jobs = "all" and a
            # hanging url wrote 40 alike: tester h63): the first, then every 100th.
            if self.dropped % DROPPED_SAID_EVERY == 1:
                log.warning(
                    "job %d: %s notification dropped: %d notifications already wait "
                    "(%d dropped since the engine started; said once per %d)",
                    pending.job_id,
                    what,
                    QUEUE_MAX,
                    self.dropped,
                    DROPPED_SAID_EVERY,
                )
            return 0
        if pending.row is not None:
            self._open_rows[pending.row] = pending.channels
            if self._store is not None and self._cursor_kept:
                self._store.save_setting(f"{OWED}{pending.row}", pending.channels)
        self._owed[pending.job_id] = self._owed.get(pending.job_id, 0) + 1
        return 1

    def jobs_owed(self) -> frozenset[int]:
        """The jobs with a notification not delivered yet (history cleaning keeps them:
        a notification reads its job as it goes)."""
        return frozenset(self._owed)

    # -- delivering ---------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            pending = await self._queue.get()
            self._busy += 1
            lock, users = self._job_turns.get(pending.job_id, (asyncio.Lock(), 0))
            self._job_turns[pending.job_id] = (lock, users + 1)
            try:
                async with lock:  # (FIFO: taken in the order the queue gave them out)
                    await self._deliver(pending)
            except asyncio.CancelledError:
                raise
            except UnknownJob as err:
                # (cleaned from the history by a cleaning that did not know of it: an
                # engine before this one owed it)
                self.failed += 1
                log.warning(
                    "job %d: %s notification not sent: %s", pending.job_id, pending.event, err
                )
                self._handled(pending)
            except Exception:
                self.failed += 1
                log.exception("job %d: %s notification failed", pending.job_id, pending.event)
                self._handled(pending)
            else:
                self._handled(pending)
            finally:
                self._busy -= 1
                lock, users = self._job_turns[pending.job_id]
                if users > 1:
                    self._job_turns[pending.job_id] = (lock, users - 1)
                else:
                    del self._job_turns[pending.job_id]
                self._queue.task_done()

    async def _deliver(self, pending: _Pending) -> None:
        job = await self._read_job(pending.job_id)
        settings = pending.settings
        if settings.jobs == "marked" and not job.spec.get("notify"):
            return
        body = notification_body(payload(pending.event, pending.at, job, pending.replica))
        sends: list[Awaitable[None]] = []
        timeout = settings.timeout
        if settings.command and pending.channels & COMMAND:
            run = self._run(settings.command, body, pending, timeout)
            sends.append(self._one(pending, COMMAND, run))
        if settings.url and pending.channels & URL:
            post = self._post(settings.url, body, pending, timeout)
            sends.append(self._one(pending, URL, post))
        await asyncio.gather(*sends)

    async def _one(self, pending: _Pending, channel: int, send: Awaitable[bool]) -> None:
        """One channel's delivery: counted, and not owed any more once it is done (a
        stop while the other one runs sends only that one again)."""
        if await send:
            self.sent += 1
        else:
            self.failed += 1
        self._channel_done(pending, channel)

    async def _run(self, argv: list[str], body: bytes, pending: _Pending, timeout: float) -> bool:
        """Run the command with ``body`` on its stdin; True if it exited 0 in time."""
        job_id, what = pending.job_id, pending.event
        env = dict(os.environ, GPULAYER_JOB_ID=str(job_id), GPULAYER_NOTIFY_EVENT=what)
        # stderr through a pipe of our own: asyncio's Process.wait() waits for the pipes it
        # owns to close too, and a child the command left running may hold them for ever.
        err_read, err_write = os.pipe2(os.O_CLOEXEC)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err_write,
                start_new_session=True,  # its own group: a timeout kills all of it
                env=env,
            )
        except (OSError, ValueError) as err:
            os.close(err_read)
            log.warning("job %d: %s notification: cannot run %s: %s", job_id, what, argv[0], err)
            return False
        finally:
            os.close(err_write)
        assert proc.stdin is not None
        stderr = asyncio.StreamReader()
        pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stderr), os.fdopen(err_read, "rb", 0)
        )
        tail = bytearray()
        feeding = asyncio.ensure_future(_feed(proc.stdin, body))
        reading = asyncio.ensure_future(_tail(stderr, tail))
        try:
            async with asyncio.timeout(timeout):
                code = await proc.wait()
            # Done when it exits: a child it left running (a `notify-send &`) may hold
            # its stderr open for ever; the rest of what it wrote is read briefly.
            await asyncio.wait([reading], timeout=STDERR_GRACE_S)
        except TimeoutError:
            log.warning(
                "job %d: %s notification: %s killed after %g s ([notify] timeout)",
                job_id,
                what,
                argv[0],
                timeout,
            )
            return False
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            for task in (feeding, reading):
                await cancel_and_wait(task)
            pipe.close()
        if code != 0:
            # As text: a hook's stderr must not put escapes or forged lines in the log.
            text = printable(bytes(tail).decode(errors="replace").strip(), keep="\n").replace(
                "\n", " | "
            )
            log.warning(
                "job %d: %s notification: %s exited %d%s",
                job_id,
                what,
                argv[0],
                code,
                f": {text}" if text else "",
            )
            return False
        return True

    async def _post(self, url: str, body: bytes, pending: _Pending, timeout: float) -> bool:
        """POST ``body`` to ``url``; True on a 2xx answer in time (a redirect is not
        followed: it is a failure naming where to)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with (
                asyncio.timeout(timeout),
                # (Not followed: a redirected POST arrives as a GET without its body, and
                # was counted delivered: every notification lost, nothing said.)
                self._session.post(
                    url,
                    data=body,
                    headers={"Content-Type": "application/json"},
                    allow_redirects=False,
                ) as answer,
            ):
                status = answer.status
                moved = answer.headers.get("Location", "")
        except TimeoutError:
            why = f"no answer within {timeout:g} s ([notify] timeout)"
        except (aiohttp.ClientError, OSError) as err:
            why = str(err) or type(err).__name__
        else:
            if status < 300:
                return True
            why = f"HTTP {status}"
            if 300 <= status < 400:
                if moved:
                    from urllib.parse import urljoin

                    target = urljoin(url, moved)  # (a Location may be relative)
                    # (its path said: "set [notify] url to http://host/..." left nothing to
                    # set it to: tester h49; the query, where tokens go, stays hidden)
                    shown = shown_url(target, path=True)
                    why += f", redirected to {shown}: set [notify] url to it"
                else:
                    why += " (a redirect that names no Location)"
        shown = shown_url(url)
        if why == url:  # (aiohttp's InvalidURL says only the URL)
            why = "not a URL that can be reached"
        log.warning(
            "job %d: %s notification to %s failed: %s",
            pending.job_id,
            pending.event,
            shown,
            why.replace(url, shown),
        )
        return False


def shown_url(url: str, path: bool = False) -> str:
    """``url`` as logs may show it: scheme, host and port (``path``: and its path). A
    webhook's secret is often in its path or query (Slack, Teams) or its user info, and
    logs go to the journal."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "the [notify] url"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # (a port out of range: said apart, the host still shown)
        port = ":(not a port)"
    if ":" in host:
        host = f"[{host}]"
    if path:
        tail = printable(parts.path)[:300] + ("?..." if parts.query or parts.fragment else "")
        return f"{parts.scheme}://{host}{port}{tail}"
    hidden = "/..." if (parts.path not in ("", "/") or parts.query or parts.fragment) else ""
    return f"{parts.scheme}://{host}{port}{hidden}"


def payload(event: str, at: float, job: Job, replica: dict[str, Any] | None) -> dict[str, Any]:
    """What a notification sends: the job's JSON (environment values hidden) with
    ``event``, ``event_at`` and, for replica events, ``replica``."""
    out: dict[str, Any] = dict(env_values_hidden(job.to_json()))
    out["event"] = event
    out["event_at"] = at
    if replica is not None:
        out["replica"] = replica
    return out


def notification_body(data: dict[str, Any]) -> bytes:
    """``data`` as the JSON sent: strict UTF-8 JSON. A command's bytes that are not UTF-8
    are held as lone surrogates (Python's ``surrogateescape``), which ``json.dumps`` writes
    as ``\\udcXX`` escapes that strict parsers refuse (tester h153): each such byte is
    sent as U+FFFD, as a job's log shows it."""
    text = json.dumps(data, ensure_ascii=False)
    fixed = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return fixed.encode("utf-8")


async def _feed(stdin: asyncio.StreamWriter, body: bytes) -> None:
    """Write ``body`` and close; a command that does not read its stdin is fine."""
    try:
        stdin.write(body)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin.wait_closed()


async def _tail(stream: asyncio.StreamReader, kept: bytearray) -> None:
    """Read ``stream`` to its end into ``kept``, keeping only its last
    :data:`STDERR_KEEP` bytes."""
    while chunk := await stream.read(65536):
        kept += chunk
        del kept[:-STDERR_KEEP]
