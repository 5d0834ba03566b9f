"""The launcher: one long-lived parent of every job of a state dir (like task-spooler's
server), so jobs start without a shell and their exits are recorded while no engine runs.

It is two processes, started by the engine as ``python -m gpulayer_tui.engine.keeper``:

* the **keeper** (:mod:`.keeper`): a child subreaper that only starts the spawner, reaps
  what the spawner leaves when it dies (so a job's exit status survives its launcher), and
  starts a new spawner;
* the **spawner** (this module): serves the engine on ``launcher.sock`` (JSON lines),
  ``posix_spawn``s each job directly into its own session with its log, watches it by
  pidfd, reaps it, kills what its process group leaves, and records every step in the
  journal (:mod:`.journal`) before it tells anyone.

Exactly once: the engine commits its decision to start a job before it asks (write-ahead);
the spawner journals ``S key`` before the spawn and ``P key pid`` after it. So after any
crash a key is known to have run (``P``/``E``), known never to have run (no line, ``F``,
``N``), or caught in the instant between ``S`` and ``P`` (``S`` alone): then the keeper,
the only process that can inherit the child, tells which (see :mod:`.keeper`). Nothing is
ever started twice.

Requests (engine -> spawner) and events (spawner -> engine), one JSON object per line:

=================================================  =========================================
``{"op": "env", "id", "env"}``                       an environment many spawns share
``{"op": "spawn", "key", "argv", "cwd", "env_id",   start ``key`` with that environment plus
"extra", "log", "fresh", "max_log", "banner"?}``  ``extra`` (idempotent: a known key
                                                   answers with what is known of it;
                                                   ``banner``: a line written in its log
                                                   first, the time of the start after it)
``{"op": "terminate", "key", "grace"}``             SIGTERM the group; SIGKILL after grace
``{"op": "signal", "key", "signal"}``               send a signal to the group
``{"op": "max_log", "bytes"}``                       a new cap for running jobs' logs too
                                                   -> ``{"ev": "max_log", "bytes", "jobs"}``
``{"op": "query"}``                                 -> ``{"ev": "table", "tasks": {...}}``
``{"op": "ack", "keys": [...]}``                    the engine recorded these ends
``{"op": "quit_if_idle"}``                          exit now if nothing runs
``{"ev": "started", "key", "pid", "ticks", "at"}``  it runs (spawned at ``at``; absent
                                                   when re-told of a known start)
``{"ev": "failed", "key", "error"}``                it could not start (never ran)
``{"ev": "exited", "key", "code", "at", ...}``      it ended at ``at`` (``code`` null: unobservable;
                                                   ``dropped``: what its log's cuts dropped;
                                                   ``timed_out``, ``term_at``: stopped here
                                                   for its timeout, SIGTERM sent then)
``{"ev": "log_cut", "key", "dropped", "kept"}``      its log passed ``max_log`` and was cut
=================================================  =========================================

Stdlib only (and :mod:`.journal`, :mod:`.procstat`, :mod:`.logfiles`): it must start fast.

Why this module is longer than ~400 lines: one single-threaded loop owns every child,
fd and timer of the spawner; its handlers share that state and are read together.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from ..fields import printable
from ..unixsock import SocketPath
from . import journal, procstat
from .logfiles import NOTE_READ, LogFiles, cut_note, mark_cut, note_of, unmark_cut

SOCKET = "launch.sock"  # (no longer than engine.sock: AF_UNIX paths are short)
LOCK = "launcher.lock"
FAILED_NOTE = "launcher.failed"  # why the last spawner could not start (see main)
START_FAILED = 3  # a spawner's exit code when it could not start
NEVER_STARTED = "stopped before it started"
"""A start not made: its stop came with it (see Spawner._handle_lines)."""
LOG = "launcher.log"
TASK_ENV = "GPULAYER_TASK"  # "<state dir>/<key>": lets the keeper recognise a job's process
KEEPER_FD = 3  # the keeper's pipe to the spawner (found-again pids and exits)
TICK_S = 0.2
# A job's end is followed by sweeps of what it left in its session, every SWEEP_S until
# two in a row find nothing (at most this many). A process of the job's group dies a
# moment after its SIGKILL, and only then do its children (in groups of their own) become
# the keeper's: one look as the job ended missed them (tester h57).
SESSION_SWEEPS = 10
SWEEP_S = 0.1  # between two sweeps (one read of the keeper's children for all sessions)
KEEPER_WAIT_S = 10.0  # how long a task found dead waits for the keeper's word on its code
DEFAULT_SIGNALS = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGPIPE,
    signal.SIGXFSZ,
)
OUTBOX_LIMIT = 64 * 1024 * 1024
FILES_CHECK_S = 1.0  # how often the spawner checks that its socket and journal still exist


def claim_name(state_dir: str) -> bytes:
    """The abstract Unix socket name a keeper holds for ``state_dir`` (by its device and
    inode, so it names this folder whatever path reaches it).

    ``launcher.lock`` alone did not keep a second launcher out once the file was removed
    under a running one (a tmp cleaner, a person tidying the folder): a new engine found
    no lock, started a second keeper and spawner, and their empty journal made it start
    every running job again. An abstract name lives exactly as long as its keeper and no
    file removal touches it.
    """
    st = os.stat(state_dir)
    return f"\0gpulayer-tui-launcher:{st.st_dev}:{st.st_ino}".encode()


def claim(state_dir: str) -> socket.socket | None:
    """Hold ``state_dir``'s launcher name (see :func:`claim_name`); ``None`` if another
    keeper holds it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # (not inherited by spawns)
    try:
        sock.bind(claim_name(state_dir))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            return None
        raise
    sock.listen(64)  # never accepted: a connect that is queued (or refused as full) says
    return sock  # "held"; one refused outright says nobody holds it


def claimed(state_dir: str) -> bool:
    """Whether a keeper holds ``state_dir``'s launcher name."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(claim_name(state_dir))
    except (BlockingIOError, InterruptedError):
        return True  # its queue is full: held
    except OSError:
        return False  # ECONNREFUSED: no one listens on that name
    finally:
        sock.close()
    return True


RECV_BYTES = 64 * 1024
# A dropped connection's unread requests are read this many RECV_BYTES at most (a socket
# holds a few hundred kilobytes: an engine that went leaves no more than that).
READ_REST_ROUNDS = 64
ENV_CACHE = 256  # environments kept (a spawn names one by id)
# A capped log is measured LOG_CHECK_FIRST_S after its job starts, then at doubling
# intervals up to LOG_CHECK_S; while it grows fast (LOG_FAST_BYTES, or a quarter of its
# cap, since the last look)
# at LOG_CHECK_FIRST_S again: `yes` writes ~1 GB/s, a whole small disk within a second.
LOG_CHECK_S = 1.0
LOG_CHECK_FIRST_S = 0.01
LOG_FAST_BYTES = 1024 * 1024
LOG_KEEP_MAX = 32 * 1024 * 1024  # at most this much of a cut log's end is kept
# A log past its cap by more than this is cut by copying its end, not by a collapse: a
# collapse first writes the whole file back to the disk (ext4), so for a fast writer far
# past its cap each cut took longer than the last, and four `yes` under a 64 KiB cap
# reached 100 MB each (tester h123); the copy reads and writes only the part kept.
COLLAPSE_MAX_OVER = 8 * 1024 * 1024
COLLAPSE_MIN_KEEP = 16 * 1024  # a cut keeping less is made by copying (see _collapse_log)
NOTE_PAD_MAX = 256  # a note is padded with spaces to the end of a line at most this far
FALLOC_FL_COLLAPSE_RANGE = 0x08  # <linux/falloc.h>
TICK_NS = 1_000_000_000 // os.sysconf(
    "SC_CLK_TCK"
)  # an engine this far behind is disconnected (it re-queries)


def exit_code(status: int) -> int:
    """A wait status as a shell would say it: the code, or 128+N for signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def waited_code(info: os.waitid_result | None) -> int | None:
    """What ``waitid`` said of an ended child, as :func:`exit_code` says a wait status."""
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return 128 + info.si_status  # killed by (or dumped core on) signal si_status


def why_not_runnable(argv0: str, cwd: str, env: dict[str, str]) -> tuple[str | None, str]:
    """``(path, "")`` for a program that can be run, else ``(None, reason)`` (the name in
    it written as :func:`~gpulayer_tui.fields.printable` does: a line break or an escape
    in it never reaches a terminal or splits the message)."""
    if "/" in argv0:
        path = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        if os.path.isdir(path):
            return None, f"cannot run {printable(argv0)}: it is a directory"
        if not os.path.exists(path):
            return None, f"command not found: {printable(argv0)} (no such file)"
        if not os.access(path, os.X_OK):
            return None, f"permission denied: {printable(argv0)} is not executable"
        return path, ""
    found = shutil.which(argv0, path=env.get("PATH", os.defpath))
    if found is None:
        return None, f"command not found: {printable(argv0)} (no such program in PATH)"
    return found, ""


def _term_at(entry: journal.Entry) -> float | None:
    """When a job the spawner stopped for its timeout was sent SIGTERM (its SIGKILL
    deadline less the grace period, both journaled), so that the engine can tell a late
    stop from a program that used its grace period to shut down (tester h188 #4)."""
    if entry.kill_at is None:
        return None
    return round(entry.kill_at - entry.timeout_grace, 3)


def _write_banner(log_fd: int, banner: str) -> None:
    """Write ``banner`` and the time into a later run's log, on a line of its own (a
    full disk or a cut log only loses the line: the run starts all the same)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    line = f"{banner}{stamp} ---\n".encode("utf-8", "replace")
    with contextlib.suppress(OSError):
        size = os.fstat(log_fd).st_size
        if size and os.pread(log_fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # (the last run's output ended mid-line)
        os.write(log_fd, line)


class Task:
    """A running job the spawner watches."""

    __slots__ = (
        "child",
        "dead_at",
        "ended_unseen",
        "key",
        "kill_at",
        "leader_gone",
        "log_dropped",
        "log_every",
        "log_fd",
        "log_next",
        "log_seen",
        "mark",
        "max_log",
        "pid",
        "pidfd",
        "ticks",
        "timeout_at",
        "timeout_grace",
    )

    def __init__(self, key: str, pid: int, ticks: int, pidfd: int, child: bool) -> None:
        self.key = key
        self.pid = pid
        self.ticks = ticks
        self.pidfd = pidfd  # -1 once it is known to have ended
        self.child = child  # ours to reap; False: the keeper's (found again after a crash)
        # Nobody of ours is its parent (found again by a new keeper's first spawner after
        # both launcher processes died: init reaps it): its exit status is never known.
        self.ended_unseen = False
        self.kill_at: float | None = None
        # Stopping, its leader ended first (a shell wrapper dies of its SIGTERM at once):
        # the rest of its group has the rest of the grace period (see _pidfd_readable).
        self.leader_gone = False
        self.dead_at: float | None = None  # ended, its code not known yet (keeper's word)
        self.log_fd = -1  # ours, to cut the log back when it grows past max_log
        self.max_log = 0
        self.log_every = LOG_CHECK_FIRST_S  # (see LOG_CHECK_S)
        self.log_next = time.monotonic() + LOG_CHECK_FIRST_S
        self.log_seen = 0  # its size at the last look
        self.log_dropped = 0  # its output that cuts dropped, in all (the note's count)
        self.mark = ""  # its start mark (see journal.STARTING), removed as it ends
        # Its --timeout (wall clock), enforced here only while no engine is connected:
        # an engine enforces it itself, and one stopped for hours left it running on.
        self.timeout_at: float | None = None
        self.timeout_grace = 0.0


class Spawner:
    """The spawner's state and loop (see the module docstring).

    Args:
        state_dir: The engine's state dir (socket, journal, logs live there).
        idle_timeout: Exit after this many seconds with no engine and nothing running.
        keeper_fd: The keeper's pipe (``None`` when run without a keeper, in tests).
        first: The keeper's first spawner: the jobs an earlier launcher left running are
            not that keeper's children (both launcher processes died), so none of their
            exit statuses will come through its pipe.
    """

    def __init__(
        self, state_dir: str, idle_timeout: float, keeper_fd: int | None, first: bool = False
    ) -> None:
        self.state_dir = state_dir
        self.first = first
        st = os.stat(state_dir)
        self.own_dir = (st.st_dev, st.st_ino)  # the folder it serves, whatever its path
        self.idle_timeout = idle_timeout
        self.journal = journal.Journal(os.path.join(state_dir, journal.NAME))
        self.entries = journal.replay(self.journal.path)
        self.marks = os.path.join(state_dir, journal.STARTING)
        self._sweep_marks()
        self.journal_lagging = False  # (said once, until the journal is written again)
        self.tasks: dict[str, Task] = {}
        self.by_pidfd: dict[int, Task] = {}
        self.keeper_exits: dict[str, int | None] = {}  # exits the keeper saw before we did
        # Processes a stopped job started in sessions of their own (setsid, a container
        # runtime): (pid, start ticks) -> when they get SIGKILL if still there.
        self.strays: dict[tuple[int, int], float] = {}
        # Sessions of ended jobs still swept (see SESSION_SWEEPS): leader -> [sweeps left,
        # empty sweeps in a row]; one sweep for them all every SWEEP_S
        self.sweeps: dict[int, list[int]] = {}
        # Ended runs of service replicas among them: their TASK_ENV value -> leader. What
        # such a run started with setsid (a worker in a session of its own) is swept too,
        # found by that variable: each restart left one more running, holding its port
        # or its GPU memory, and a cancel reached only the last run's (tester h58). A
        # batch job's may have left on purpose (a daemon it started); a replica's run is
        # replaced by the next.
        self.run_sweeps: dict[str, int] = {}
        self.next_sweep = 0.0
        self.sel = selectors.DefaultSelector()
        self.client: socket.socket | None = None
        self.inbox = b""
        self.outbox = bytearray()
        self.writing = False  # the client socket is registered for EVENT_WRITE
        self.idle_since = time.monotonic()
        self.quit = False
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.logs = LogFiles(_say)
        self.programs: dict[tuple[str, str, str], str] = {}
        self.envs: dict[int, dict[str, str]] = {}  # environments the engine sent, by id
        self.listening_on = (0, 0)
        self.listener = self._listen()
        self.files_checked = time.monotonic()
        self.keeper_lost = False  # its keeper (parent, subreaper) died: retire once idle
        # (the subreaper that inherits what a job leaves as its leader exits)
        self.keeper_pid = os.getppid() if keeper_fd is not None else 0
        self.orphaned = False  # its state dir's path names another folder: retire once idle
        self.keeper_fd = keeper_fd
        self.keeper_buf = b""
        if keeper_fd is not None:
            os.set_inheritable(keeper_fd, False)
            os.set_blocking(keeper_fd, False)
            self.sel.register(keeper_fd, selectors.EVENT_READ, self._keeper_readable)
        self._resume()

    # -- start-up -----------------------------------------------------------------------------

    def _sweep_marks(self) -> None:
        """Make the start marks' folder; remove the marks of starts the journal has
        settled (a job's is removed as it ends; one whose end a keeper or an earlier
        spawner saw stays until here)."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.marks, 0o700)
        try:
            names = os.listdir(self.marks)
        except OSError:
            return
        for name in names:
            key, _, ticks = name.rpartition(".")
            entry = self.entries.get(key)
            if entry is None or entry.state != journal.INTENT or str(entry.intent_ticks) != ticks:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.marks, name))

    def _listen(self) -> socket.socket:
        try:
            # A leftover: the keeper holds the lock, so it is not in use.
            os.unlink(os.path.join(self.state_dir, SOCKET))
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        where = SocketPath(os.path.join(self.state_dir, SOCKET))
        old = os.umask(0o177)
        try:
            sock.bind(where.path)
        finally:
            os.umask(old)
            where.close()
        sock.listen(8)
        sock.setblocking(False)
        self.sel.register(sock, selectors.EVENT_READ, self._accept)
        st = os.stat(os.path.join(self.state_dir, SOCKET))
        self.listening_on = (st.st_dev, st.st_ino)
        return sock

    def _resume(self) -> None:
        """Watch what an earlier spawner started and left running (its keeper reaps it)."""
        for key, entry in list(self.entries.items()):
            if entry.state != journal.RUNNING or entry.pid is None:
                continue
            pidfd = _pidfd(entry.pid)
            if pidfd is not None and procstat.is_alive(entry.pid, entry.ticks):
                task = Task(key, entry.pid, entry.ticks or 0, pidfd, child=False)
                task.kill_at = entry.kill_at
                task.timeout_at, task.timeout_grace = entry.timeout_at, entry.timeout_grace
                task.ended_unseen = self.first
                # Its log, to keep cutting it back: taken over without it, a runaway log
                # grew past its cap for good. The cap journaled with it applies at once
                # (the engine's max_log, when it connects, may change it).
                task.log_fd = self._log_of(entry.pid)
                if task.log_fd >= 0 and entry.max_log:
                    task.max_log = entry.max_log
                    task.log_next, task.log_every = time.monotonic(), LOG_CHECK_FIRST_S
                self._watch(task)
                continue
            if pidfd is not None:
                os.close(pidfd)
            # Ended while no spawner watched: the keeper reaped it and tells us its code
            # through the pipe; _tick() gives up waiting after KEEPER_WAIT_S.
            task = Task(key, entry.pid, entry.ticks or 0, -1, child=False)
            task.dead_at = time.monotonic()
            task.ended_unseen = self.first
            self.tasks[key] = task
        unseen = [task for task in self.tasks.values() if task.dead_at is not None]
        if self.tasks:
            _say(f"took over {len(self.tasks)} running jobs ({len(unseen)} ended meanwhile)")
        if self.first:
            # No keeper of ours reaped them: waiting KEEPER_WAIT_S for their codes only kept
            # ended jobs "running", holding their slots (CI's crash test: 45 s of it).
            for task in unseen:
                _say(f"{task.key} (pid {task.pid}) ended as init's child: exit status unknown")
                self._ended(task, None)
        self.journal.compact(self.entries)

    def _log_of(self, pid: int) -> int:
        """A descriptor of the log a running job writes (its stdout, when that is still a
        file in our ``jobs/``), or -1."""
        try:
            where = os.readlink(f"/proc/{pid}/fd/1")
            jobs = os.stat(os.path.join(self.state_dir, "jobs"))
            here = os.stat(os.path.dirname(where))
            if (here.st_dev, here.st_ino) != (jobs.st_dev, jobs.st_ino):
                return -1  # (it sent its output elsewhere itself)
            fd = os.open(f"/proc/{pid}/fd/1", os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            return -1
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return -1
        return fd

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until idle (no engine, nothing running) or asked to quit."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # jobs outlive a stopping engine
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while not self.quit:
            spare_wanted = self.logs.wanted()
            ready = self.sel.select(0 if spare_wanted else self._wait_s())
            for sel_key, events in ready:
                sel_key.data(sel_key.fileobj, events)
            if spare_wanted and not ready:
                self.logs.make_one()  # only while nothing waits: off every start's path
            self._tick()
            # What this round said goes out in one send (a spawn's "started" and another
            # job's "exited" share it), not one system call per event.
            if self.outbox and not self.writing:
                self._flush()
        # Retiring: no new engine may connect to a launcher that is going away (unless
        # the path is another folder's now: then the socket there is not ours).
        if not self.orphaned:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.state_dir, SOCKET))
        self.logs.close()
        return 0

    def _wait_s(self) -> float:
        """How long the loop may wait for an event: a tick, or the next log to measure."""
        wait = TICK_S
        for task in self.tasks.values():
            if task.log_fd >= 0 and task.max_log:
                wait = min(wait, task.log_next - time.monotonic())
        return max(0.0, wait)

    def _tick(self) -> None:
        now = time.time()
        self._sweep_sessions()
        for task in list(self.tasks.values()):
            if task.leader_gone:
                due = task.kill_at is None or now >= task.kill_at
                if due or not self._group_runs(task):
                    task.leader_gone = False
                    if due and task.log_fd >= 0:
                        said = "--- gpulayer-tui sent SIGKILL (it still ran) at "
                        _write_banner(task.log_fd, said)
                    self._end_child(task)
            elif task.dead_at is not None:
                if task.key in self.keeper_exits:
                    self._ended(task, self.keeper_exits.pop(task.key))
                elif time.monotonic() - task.dead_at > KEEPER_WAIT_S:
                    _say(f"{task.key} (pid {task.pid}) ended unseen: exit status unknown")
                    self._ended(task, None)  # nobody could see its exit status
            elif task.kill_at is not None and now >= task.kill_at:
                task.kill_at = None
                if task.log_fd >= 0:
                    # (its log said SIGTERM and "SIGKILL later if it still runs", then
                    # nothing: whether it was sent was in the timeline only: tester h127)
                    _write_banner(task.log_fd, "--- gpulayer-tui sent SIGKILL (it still ran) at ")
                self._killpg(task, signal.SIGKILL)
            elif (
                task.timeout_at is not None
                and now >= task.timeout_at
                and self.client is None
                and task.pidfd >= 0
            ):
                self._timed_out(task)
        if self.strays:
            self._kill_strays(now)
        mono = time.monotonic()
        for task in self.tasks.values():
            if task.log_fd >= 0 and task.max_log and mono >= task.log_next:
                size = self._cap_log(task)
                # Fast for its cap too: a job writing 500 KB/s under a 70 KB cap passed it
                # sevenfold between once-a-second looks.
                fast = size - task.log_seen >= min(LOG_FAST_BYTES, task.max_log // 4)
                task.log_every = LOG_CHECK_FIRST_S if fast else min(LOG_CHECK_S, task.log_every * 2)
                task.log_seen = min(size, task.max_log)
                task.log_next = mono + task.log_every
        if mono - self.files_checked >= FILES_CHECK_S:
            self.files_checked = mono
            self._check_files()
        if self.keeper_lost and not self.tasks:
            _say("retiring: its keeper is gone (the engine starts a new launcher)")
            self.quit = True
        if self.orphaned and not self.tasks:
            _say("retiring: its jobs have ended and its folder is gone")
            self.quit = True
        idle = not self.tasks and self.client is None
        if not idle:
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since >= self.idle_timeout:
            self.quit = True

    def _check_files(self) -> None:
        """Its socket and journal still exist (a tmp cleaner, or a person, may remove
        them under it): listen again, or write the journal again from what it knows.
        Without the socket no engine could reach it for as long as any job ran; without
        the journal a spawner started after this one would not know what runs.

        Only in its own folder: when the state dir's path names another folder now (the
        folder was removed and made again, or a symlink on the way was pointed
        elsewhere), that folder is not this launcher's (it would have served another
        state dir's engine, and answered its job 1 with its own job 1's end). It stops
        listening, runs what it runs to the end, and retires; that folder's engine starts
        a launcher of its own (the keeper's name is this folder's, not the path's).
        """
        try:
            st = os.stat(self.state_dir)
            here_dir: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            here_dir = None
        if here_dir != self.own_dir:
            if not self.orphaned:
                _say(
                    f"{self.state_dir} is no longer the folder this launcher was started "
                    "in: it takes no new work, and retires once its jobs have ended"
                )
                self.orphaned = True
                self.sel.unregister(self.listener)
                self.listener.close()
                if self.client is not None:
                    self._drop_client()
            return
        if self.orphaned:  # (the path names its folder again: serve it again)
            _say(f"{self.state_dir} is this launcher's folder again: listening again")
            self.orphaned = False
            self.listener = self._listen()
            return
        path = os.path.join(self.state_dir, SOCKET)
        try:
            st = os.stat(path)
            here = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            here = None
        if here != self.listening_on:
            _say(f"{path} was removed or replaced: listening on it again")
            self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = self._listen()
        if self.journal.moved():
            _say(f"{self.journal.path} was removed or replaced: written again")
            try:
                self.journal.compact(self.entries)
            except OSError as err:
                _say(f"cannot write {self.journal.path} again ({err.strerror}): tried again")
        elif self.journal.pending and self.journal.flush():
            self._journal_caught_up()
        elif self.journal.wants_compaction():
            try:
                self.journal.compact(self.entries)
            except OSError as err:
                # (tried again once it has grown fourfold, not each second of a full disk)
                self.journal.compacted_size = self.journal.size()
                _say(f"cannot compact {self.journal.path} ({err.strerror}): appended to")

    def _journal(self, *fields: object) -> None:
        """A journal line; on a full disk it waits in memory (in order) and is written
        once there is room, checked every :data:`FILES_CHECK_S`: the spawner goes on
        (it died in a traceback, and with it the watch over every running job)."""
        if not self.journal.write(*fields):
            self._journal_lags()
        elif self.journal_lagging:
            self._journal_caught_up()

    def _journal_caught_up(self) -> None:
        _say(f"{self.journal.path} is written again: the lines that waited are in it")
        self.journal_lagging = False

    def _journal_lags(self) -> None:
        if not self.journal_lagging:
            self.journal_lagging = True
            _say(
                f"cannot write its journal {self.journal.path} ({self.journal.problem}): "
                "what it records waits in memory until there is room, and no job starts "
                "until then"
            )

    # -- the engine's connection --------------------------------------------------------------

    def _accept(self, sock: Any, _events: int) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        if self.client is not None:
            self._drop_client(engine_gone=True)  # a new engine replaces an old one
        conn.setblocking(False)
        self.client = conn
        self.inbox = b""
        self.outbox.clear()
        self.writing = False
        self.sel.register(conn, selectors.EVENT_READ, self._client_io)

    def _drop_client(self, engine_gone: bool = False) -> None:
        """Close the engine's connection (``engine_gone``: it closed it; what it wrote
        before is still read and done)."""
        client = self.client
        assert client is not None
        self.sel.unregister(client)
        self.client = None  # (what is said from now on waits in the journal: see _send)
        self.outbox.clear()
        self.writing = False
        if engine_gone:
            # What the engine wrote before it went is still done. A stopping engine wrote
            # a cancel's stop and closed; this process, answering the spawn before it,
            # found the socket closed (EPIPE) and dropped it unread, and the job ran on
            # unsignalled with no engine left to ask again. (Not for a connection dropped
            # mid-read, whose engine reconnects: the rest would be done out of order.)
            self._read_rest(client)
        client.close()
        self.inbox = b""

    def _read_rest(self, conn: Any) -> None:
        """Act on the whole lines still in a dropped connection's socket (a cut last
        line is dropped: its engine sends it again when it reconnects)."""
        for _ in range(READ_REST_ROUNDS):
            try:
                data = conn.recv(RECV_BYTES)
            except OSError:  # (nothing more: EAGAIN, or the connection reset)
                return
            if not data:
                return
            self.inbox += data
            *lines, self.inbox = self.inbox.split(b"\n")
            self._handle_lines(lines)

    def _client_io(self, conn: Any, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush()
        if not events & selectors.EVENT_READ or self.client is None:
            return
        try:
            # 64 KiB: a larger buffer is mmap'd and unmapped on every call (strace: three
            # memory-map calls per request with 1 MiB); a burst of spawns takes more rounds.
            data = conn.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop_client(engine_gone=True)
            return
        self.inbox += data
        *lines, self.inbox = self.inbox.split(b"\n")
        self._handle_lines(lines)

    def _handle_lines(self, lines: list[bytes]) -> None:
        """Act on the requests of one read, in order. A start whose stop came in the same
        read (sent while this process was stopped or starved: the engine took the start
        for made) is not made: said failed, "stopped before it started". It started, and
        was stopped a moment later (tester h143)."""
        stopped: set[str] = set()
        for raw in lines:
            if b'"terminate"' in raw:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    request = json.loads(raw)
                    if request["op"] == "terminate":
                        stopped.add(str(request["key"]))
        for raw in lines:
            if not raw.strip():
                continue
            if stopped and b'"spawn"' in raw:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    request = json.loads(raw)
                    key = str(request["key"])
                    if request["op"] == "spawn" and key in stopped and key not in self.entries:
                        self._send({"ev": "failed", "key": key, "error": NEVER_STARTED})
                        continue
            self._handle(raw)

    def _send(self, event: dict[str, Any]) -> None:
        if self.client is None:
            return  # the journal keeps it; a reconnecting engine asks with "query"
        self.outbox += json.dumps(event, separators=(",", ":")).encode() + b"\n"
        if len(self.outbox) > OUTBOX_LIMIT:
            self._drop_client()

    def _flush(self) -> None:
        if self.client is None:
            return
        try:
            sent = self.client.send(self.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop_client(engine_gone=True)
            return
        del self.outbox[:sent]
        writing = bool(self.outbox)  # the engine reads slowly: wait until it can take more
        if writing != self.writing:
            self.writing = writing
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
            self.sel.modify(self.client, mask, self._client_io)

    def _handle(self, raw: bytes) -> None:
        try:
            request = json.loads(raw)
            op = request["op"]
        except (ValueError, KeyError, TypeError):
            return
        if op == "spawn":
            self._spawn(request)
        elif op == "env":
            # A job environment many jobs share, sent once (a spawn names it by id).
            if len(self.envs) >= ENV_CACHE:
                self.envs.pop(next(iter(self.envs)))
            self.envs[int(request["id"])] = {str(k): str(v) for k, v in request["env"].items()}
        elif op == "terminate":
            self._terminate(str(request["key"]), float(request["grace"]))
        elif op == "signal":
            task = self.tasks.get(str(request["key"]))
            if task is not None:
                self._killpg(task, int(request["signal"]))
        elif op == "max_log":
            limit = int(request["bytes"])
            now = time.monotonic()
            taken = 0
            for task in self.tasks.values():
                if task.log_fd >= 0 and limit > 0:
                    task.max_log, task.log_next, task.log_every = limit, now, LOG_CHECK_FIRST_S
                    taken += 1
                    if task.key in self.entries and self.entries[task.key].max_log != limit:
                        self.entries[task.key].max_log = limit
                        self._journal("L", task.key, limit)
            self._send({"ev": "max_log", "bytes": limit, "jobs": taken})
        elif op == "query":
            self._send({"ev": "table", "tasks": self._table()})
        elif op == "ack":
            for key in request.get("keys", ()):
                if key in self.entries and self.entries[key].state == journal.EXITED:
                    del self.entries[key]
                    self._journal("A", key)
        elif op == "quit_if_idle":
            if not self.tasks:
                self.quit = True

    def _table(self) -> dict[str, Any]:
        table: dict[str, Any] = {}
        for key, entry in self.entries.items():
            if entry.state == journal.INTENT:
                continue  # (the keeper resolves these before a spawner starts)
            table[key] = {
                "state": entry.state,
                "pid": entry.pid,
                "ticks": entry.ticks,
                "code": entry.code,
                "at": entry.ended_at,
                "dropped": entry.log_dropped or None,
                "kill_at": entry.kill_at,
                "timed_out": entry.timed_out or None,
                "term_at": _term_at(entry) if entry.timed_out else None,
            }
        return table

    # -- spawning -----------------------------------------------------------------------------

    def _spawn(self, request: dict[str, Any]) -> None:
        key = str(request["key"])
        known = self.entries.get(key)
        if known is not None:
            # Asked again (the engine reconnected, or restarted): answer what is known;
            # never start a key twice.
            if known.state == journal.RUNNING:
                self._send({"ev": "started", "key": key, "pid": known.pid, "ticks": known.ticks})
            elif known.state == journal.EXITED:
                self._send(
                    {
                        "ev": "exited",
                        "key": key,
                        "code": known.code,
                        "at": known.ended_at,
                        "dropped": known.log_dropped or None,
                    }
                )
            return
        argv = [str(a) for a in request["argv"]]
        cwd = str(request["cwd"])
        shared = self.envs.get(int(request.get("env_id", -1)))
        if shared is None:
            self._send({"ev": "failed", "key": key, "error": "its environment was not sent"})
            return
        env = {**shared, **{str(k): str(v) for k, v in request.get("extra", {}).items()}}
        env[TASK_ENV] = f"{self.state_dir}/{key}"
        max_log = int(request.get("max_log") or 0)
        timeout = request.get("timeout")  # [seconds, grace]: enforced while no engine runs
        error = self._start(
            key,
            argv,
            cwd,
            env,
            str(request["log"]),
            bool(request.get("fresh")),
            max_log,
            None if timeout is None else (float(timeout[0]), float(timeout[1])),
            str(request.get("banner") or ""),
        )
        if error is not None:
            self._send({"ev": "failed", "key": key, "error": error})

    def _program(self, argv0: str, cwd: str, env: dict[str, str]) -> tuple[str | None, str]:
        # A PATH search is ~10 stat calls; a queue of 500 `python ...` need not repeat it.
        cache_key = (argv0, env.get("PATH", ""), cwd if "/" in argv0 else "")
        hit = self.programs.get(cache_key)
        if hit is not None and os.access(hit, os.X_OK):
            return hit, ""
        path, why = why_not_runnable(argv0, cwd, env)
        if path is not None:
            if len(self.programs) > 1024:
                self.programs.clear()
            self.programs[cache_key] = path
        return path, why

    def _start(
        self,
        key: str,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        log: str,
        fresh: bool,
        max_log: int,
        timeout: tuple[float, float] | None = None,
        banner: str = "",
    ) -> str | None:
        """Start ``key``; return why it could not start (it then never ran)."""
        if not os.path.isdir(cwd):
            missing = "is not a directory" if os.path.exists(cwd) else "does not exist"
            return f"working directory {missing}: {cwd}"
        program, why = self._program(argv[0], cwd, env)
        if program is None:
            return why
        try:
            log_fd = self.logs.open(log, fresh)
        except OSError as err:
            return f"cannot write the job's log {log}: {err.strerror}"
        if banner:
            _write_banner(log_fd, banner)
        intent = journal.boot_ticks()
        if not self.journal.write("S", key, intent, required=True):
            # (nothing is started that the journal does not announce first: a spawner
            # killed after the spawn would leave no trace of a running job)
            os.close(log_fd)
            self._journal_lags()
            return (
                f"cannot record its start in {self.journal.path} ({self.journal.problem}): "
                "not started"
            )
        if self.journal_lagging:
            self._journal_caught_up()
        mark = journal.start_mark(self.state_dir, key, intent)
        try:
            os.chdir(cwd)  # posix_spawn has no cwd; this process is single-threaded
            before = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
            pid = self._make_process(program, argv, env, log_fd, mark)
        except OSError as err:
            self._journal("F", key)
            with contextlib.suppress(OSError):  # (made before its exec failed: h138)
                os.unlink(mark)
            os.close(log_fd)
            where = f" ({err.filename})" if err.filename else ""
            return f"cannot start {argv[0]}: {err.strerror}{where}"
        finally:
            os.chdir("/")
        spawned_at = time.time()
        ticks = _start_ticks(pid, before, time.clock_gettime_ns(time.CLOCK_BOOTTIME))
        # (its log's cap too: a spawner that takes it over with no engine connected cuts
        # it back at once, where it grew without bound until the engine came back)
        timeout_at = None if timeout is None else time.time() + timeout[0]
        grace = None if timeout is None else timeout[1]
        self._journal("P", key, pid, ticks, max_log or None, timeout_at, grace)
        entry = self.entries[key] = journal.Entry(journal.RUNNING)
        entry.pid, entry.ticks, entry.max_log = pid, ticks, max_log
        task = Task(key, pid, ticks, os.pidfd_open(pid), child=True)
        task.log_fd, task.max_log, task.mark = log_fd, max_log, mark
        if timeout is not None:
            entry.timeout_at = task.timeout_at = timeout_at
            entry.timeout_grace = task.timeout_grace = timeout[1]
        self._watch(task)
        # (when it was spawned: the engine reads this line later, maybe after the job ended)
        self._send({"ev": "started", "key": key, "pid": pid, "ticks": ticks, "at": spawned_at})
        return None

    def _make_process(
        self, program: str, argv: list[str], env: dict[str, str], log_fd: int, mark: str
    ) -> int:
        """Make the job's process: its output to its log, its start mark made by the
        process itself before its program runs (see journal.STARTING)."""
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_DUP2, self.devnull, 0),
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
            # (in the child: fd 3 there is closed again, the job never sees it)
            (os.POSIX_SPAWN_OPEN, 3, mark, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600),
            (os.POSIX_SPAWN_CLOSE, 3),
        ]
        for attempt in (1, 2):
            try:
                return os.posix_spawn(
                    program,
                    argv,
                    env,
                    file_actions=actions,
                    setsid=True,
                    # Signals this process ignores would stay ignored in the job (SIGTERM
                    # among them): give the job the defaults, and an empty signal mask.
                    setsigdef=DEFAULT_SIGNALS,
                    setsigmask=(),
                )
            except OSError as err:
                # (said of the program whatever was missing: the marks' folder, removed
                # under it, is made again; a file in its place is said as such)
                if os.path.isdir(self.marks):
                    raise
                if attempt == 1 and not os.path.lexists(self.marks):
                    self._sweep_marks()
                    continue
                raise OSError(
                    err.errno,
                    "the launcher's start-mark folder is not a directory",
                    self.marks,
                ) from err
        raise AssertionError("unreachable")

    def _watch(self, task: Task) -> None:
        self.tasks[task.key] = task
        self.by_pidfd[task.pidfd] = task
        self.sel.register(task.pidfd, selectors.EVENT_READ, self._pidfd_readable)

    # -- ends ---------------------------------------------------------------------------------

    def _pidfd_readable(self, pidfd: Any, _events: int) -> None:
        task = self.by_pidfd.pop(pidfd, None)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        if task is None:
            return
        task.pidfd = -1
        if not task.child:
            # Found again after a crash: the keeper is its parent and tells us its code.
            task.dead_at = time.monotonic()
            if task.ended_unseen:
                _say(f"{task.key} (pid {task.pid}) ended as init's child: exit status unknown")
                self._ended(task, None)  # (no keeper of ours reaped it: no one will tell)
            elif task.key in self.keeper_exits:
                self._ended(task, self.keeper_exits.pop(task.key))
            return
        if task.kill_at is not None and time.time() < task.kill_at and self._group_runs(task):
            # Being stopped, and its leader went first: a shell running the job's program
            # dies of SIGTERM at once, and the program itself (a server draining, a trainer
            # saving a checkpoint) was SIGKILLed with the group at that moment, its grace
            # period lost (tester h185). Its end waits until the group is empty or its
            # SIGKILL falls; the leader, our unreaped zombie, keeps the group id ours.
            task.leader_gone = True
            return
        self._end_child(task)

    def _end_child(self, task: Task) -> None:
        """The end of a job whose leader is our child (exited, not reaped yet)."""
        # Whatever is left in its process group would run on untracked, holding memory
        # and ports already given away: kill it while the leader is our unreaped child
        # (its pid, the group id, cannot be reused until we reap it).
        self._killpg(task, signal.SIGKILL)
        # Its status is read without reaping it and journaled first: killed between a
        # reap and the journal line, a spawner took the status with it (CI's crash test:
        # a job's exit code lost). Unreaped, it is the keeper's zombie to reap instead.
        try:
            code: int | None = waited_code(os.waitid(os.P_PID, task.pid, os.WEXITED | os.WNOWAIT))
        except ChildProcessError:
            code = None
        self._ended(task, code)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(task.pid, 0)

    def _ended(self, task: Task, code: int | None) -> None:
        self.tasks.pop(task.key, None)
        if task.ended_unseen:
            # Its leader ended as init's child (both launcher processes had died): what is
            # left of its group is init's too, under no keeper of ours, and ran on after
            # its job ended, past a stop's SIGKILL deadline, on the GPU handed on (tester
            # h188). Found by the run its environment names, wherever it is.
            self._kill_run_anywhere(f"{self.state_dir}/{task.key}")
        # (its own group was killed as it ended: by this process for a child of ours, by
        # the keeper as it reaped one taken over after a crash)
        self._sweep_session(task.pid, task.key)
        if task.log_fd >= 0:
            if task.max_log:
                self._cap_log(task)  # (what it wrote since the last look)
                if not task.child and not task.log_dropped:
                    # Taken over from an earlier spawner: its cuts are in the note.
                    with contextlib.suppress(OSError):
                        task.log_dropped = note_of(task.log_fd)[0]
            os.close(task.log_fd)
            task.log_fd = -1
        # When it ended: the keeper's word if it saw the death first, else now (this is
        # called as soon as the pidfd says so). The engine may learn it much later.
        at = time.time()
        if task.dead_at is not None:  # (a monotonic time: moved onto the wall clock)
            at -= time.monotonic() - task.dead_at
        # (With what all cuts of its log dropped: an engine that learns the end later, no
        # cut seen, told the last total it had seen.)
        dropped = task.log_dropped or None
        self._journal("E", task.key, code, at, dropped)
        if task.mark:  # (after its end is journaled: the mark is no longer asked about)
            with contextlib.suppress(OSError):
                os.unlink(task.mark)
        entry = self.entries.setdefault(task.key, journal.Entry(journal.EXITED))
        entry.state, entry.code, entry.ended_at = journal.EXITED, code, at
        entry.log_dropped = task.log_dropped
        ended = {"ev": "exited", "key": task.key, "code": code, "at": at}
        if dropped:  # (only for a log that was cut: the drain's path stays as it was)
            ended["dropped"] = dropped
        if entry.timed_out:
            ended["timed_out"] = True
            ended["term_at"] = _term_at(entry)
        self._send(ended)

    def _collapse_log(self, task: Task, size: int, keep: int) -> tuple[int, int, int] | None:
        """Cut the log back by removing its first blocks in place, as the filesystem can
        (``FALLOC_FL_COLLAPSE_RANGE``: one step, the job's appends going on at the new
        end), then write the note over the first bytes left: nothing the job writes
        meanwhile is lost (the copy below lost what came between its last look and its
        truncation: whole lines of a fast writer, and its count drifted). ``None`` where
        the filesystem cannot (tmpfs, some network filesystems) or the cut is too small:
        the copy is used.

        Returns:
            The output dropped by every cut so far, the bytes kept after the note, and the
            output this cut dropped.
        """
        if keep < COLLAPSE_MIN_KEEP or not _fallocate_collapse_works():
            return None
        fd = task.log_fd
        block = os.fstatvfs(fd).f_bsize
        before, old_note = note_of(fd)
        length = ((size - keep) // block) * block
        if length <= old_note or length >= size:
            return None
        try:
            at_zero = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return None  # (no /proc: the copy writes its note through the job's own)
        try:
            # Marked before its first blocks go: a reader that finds a marked log with no
            # note waits for the note (logfiles.head_of); unmarked, it took the output
            # left for the whole of it, and its offsets for the file's.
            mark_cut(fd)
            collapsed = False
            try:
                collapsed = _collapse(fd, length)
            finally:
                if not collapsed and not old_note:
                    unmark_cut(fd)  # (never cut after all: its start is output)
            if not collapsed:
                return None
            return self._note_collapsed(task, at_zero, before, length - old_note, size)
        finally:
            os.close(at_zero)

    def _note_collapsed(
        self, task: Task, at_zero: int, before: int, collapsed: int, size: int
    ) -> tuple[int, int, int]:
        """Write the note over the first bytes left by a collapse of ``collapsed`` bytes
        of output (see :meth:`_collapse_log`), through ``at_zero``; its returns."""
        fd = task.log_fd
        # Its first bytes now are output to drop too (less than a block), and the note
        # goes over them: as long as the note's own line, or up to the end of the line it
        # lands in, when that is near (the kept part then starts at a line).
        head = os.pread(fd, NOTE_READ, 0)
        overwritten = len(cut_note(task.max_log, before + size, size)) + 8  # (digits grow)
        newline = head.find(b"\n", overwritten - 1, overwritten + NOTE_PAD_MAX)
        if newline >= 0:
            overwritten = newline + 1
        overwritten = min(overwritten, len(head))
        total = before + collapsed + overwritten
        kept = os.fstat(fd).st_size - overwritten
        note = cut_note(task.max_log, total, kept)
        note = note[:-1] + b" " * (overwritten - len(note)) + b"\n"
        os.pwrite(at_zero, note, 0)
        task.log_dropped = total
        return total, kept, total - before

    def _cap_log(self, task: Task) -> int:
        """Cut a log that grew past its limit back to its last part, with a note; the
        size it had. In place where the filesystem can (:meth:`_collapse_log`: nothing is
        lost); else by copying, as follows.

        The job writes with ``O_APPEND``, so after the cut its next write lands at the new
        end. The note and the tail are written at offset 0 through a second descriptor
        without ``O_APPEND`` (on the job's own, a write at an offset appends), then the
        file is cut to them: the note comes first even while the job writes. What it
        wrote meanwhile (past the end read first) is moved after the tail before the cut,
        so the output stays whole and in order, and the note's count of the output dropped
        true (readers' offsets into the whole output rely on it); only what it writes
        between the last look and the cut itself, a few microseconds, may be lost.
        """
        try:
            size = os.fstat(task.log_fd).st_size
            if size <= task.max_log:
                return size
            keep = min(task.max_log // 2, LOG_KEEP_MAX)
            collapsed = None
            if size - task.max_log <= COLLAPSE_MAX_OVER:
                collapsed = self._collapse_log(task, size, keep)
            if collapsed is not None:
                total, kept, dropped_now = collapsed
                self._send(
                    {
                        "ev": "log_cut",
                        "key": task.key,
                        "dropped": dropped_now,
                        "total": total,
                        "kept": kept,
                        "limit": task.max_log,
                    }
                )
                return size
            tail = os.pread(task.log_fd, keep, size - keep)
            dropped = size - len(tail)
            # How much of the job's output is gone in all: what earlier cuts dropped
            # (their note says), plus what this one drops, less the earlier note itself.
            before, old_note = note_of(task.log_fd)
            total = before + dropped - old_note
            task.log_dropped = total
            data = cut_note(task.max_log, total, len(tail)) + tail
            mark_cut(task.log_fd)  # (before the note: see logfiles.CUT_MARK)
            try:
                at_zero = os.open(f"/proc/self/fd/{task.log_fd}", os.O_WRONLY | os.O_CLOEXEC)
            except OSError:  # (no /proc: cut, then append, as the job does)
                os.ftruncate(task.log_fd, 0)
                os.write(task.log_fd, data)
            else:
                try:
                    os.pwrite(at_zero, data, 0)
                    end, seen = len(data), size
                    for _ in range(8):  # (each round shorter than the last)
                        now = os.fstat(task.log_fd).st_size
                        if now <= seen:
                            break
                        if now - seen > keep:
                            # It wrote more than the part kept since the look: the
                            # newest part is kept instead (all of it was moved, so a
                            # writer faster than the copy stayed far past its cap).
                            tail = os.pread(task.log_fd, keep, now - keep)
                            dropped = now - len(tail)
                            total = before + dropped - old_note
                            task.log_dropped = total
                            data = cut_note(task.max_log, total, len(tail)) + tail
                            os.pwrite(at_zero, data, 0)
                            end, seen = len(data), now
                            continue
                        # (Written before ``seen``, never over what is still to be read.)
                        more = os.pread(task.log_fd, now - seen, seen)
                        os.pwrite(at_zero, more, end)
                        end, seen = end + len(more), seen + len(more)
                    os.ftruncate(at_zero, end)
                finally:
                    os.close(at_zero)
        except OSError as err:
            _say(f"cannot cut back the log of {task.key}: {err}")
            return 0
        self._send(
            {
                "ev": "log_cut",
                "key": task.key,
                "dropped": dropped,
                "total": total,  # (all cuts, the note's count: across engine restarts)
                "kept": len(tail),
                "limit": task.max_log,
            }
        )
        return size

    def _timed_out(self, task: Task) -> None:
        """Its --timeout passed with no engine connected to stop it: stop it as the engine
        would (SIGTERM, SIGKILL after the grace period), journaled as a timeout's stop so
        the next engine ends it ``timeout``, not as a job killed by a signal."""
        task.timeout_at = None
        if task.kill_at is not None:
            return  # (stopping already)
        _say(f"{task.key} (pid {task.pid}) ran past its timeout with no engine: stopping it")
        self._terminate(task.key, task.timeout_grace, timed_out=True)

    def _terminate(self, key: str, grace: float, timed_out: bool = False) -> None:
        task = self.tasks.get(key)
        if task is None or task.pidfd < 0:
            return
        if task.kill_at is not None:
            # Stopping already (a restarted engine asks again, not knowing whether its
            # predecessor's ask arrived): its SIGKILL deadline stands, and no second
            # SIGTERM is sent (to many servers and trainers one is "quit now", cutting
            # short the shutdown or checkpoint the grace period is for).
            return
        task.kill_at = time.time() + max(0.0, grace)
        self._journal("K", key, task.kill_at, "T" if timed_out else None)
        entry = self.entries.get(key)
        if entry is not None:
            entry.kill_at = task.kill_at
            entry.timed_out = timed_out
        # What it started in groups or sessions of its own is not in its group: stopped
        # with it (a service's `setsid` server kept its port after the cancel, `timeout`'s
        # child ran on). Found first: its leader gone, they are no longer below it. So is
        # what a double fork left with the keeper, found by the run its environment names:
        # it ran on after the cancel, on the GPU handed to the next job (tester h126).
        outside = _outside_group(task.pid, self._keeper_children_of(f"{self.state_dir}/{key}"))
        if task.log_fd >= 0:
            # Said in its log, where the output stops: a cancelled or timed-out run's log
            # just ended, no word of why (tester h69).
            why = " for its time limit" if timed_out else ""
            _write_banner(
                task.log_fd,
                f"--- gpulayer-tui sent SIGTERM{why} (SIGKILL {grace:g} s later if it still "
                "runs) at ",
            )
        # SIGCONT after it, as systemd does: a stopped job (ctrl+z, SIGSTOP) never ran its
        # SIGTERM handler and was SIGKILLed after the grace period, said to have outlived
        # a SIGTERM it never saw (tester h171).
        self._killpg(task, signal.SIGTERM)
        self._killpg(task, signal.SIGCONT)
        for pid, ticks in outside:
            self.strays[(pid, ticks)] = task.kill_at
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGCONT)

    def _sweep_session(self, leader: int, key: str) -> None:
        """Sweep the session of the job led by ``leader`` (ended) from the next sweep on
        (see SESSION_SWEEPS); a service replica's run (``key`` ``job.replica.run``) also
        loses what it started in sessions of its own."""
        self.sweeps[leader] = [SESSION_SWEEPS, 0]
        if key.count(".") == 2:
            self.run_sweeps[f"{self.state_dir}/{key}"] = leader

    def _sweep_sessions(self) -> None:
        """Every SWEEP_S, one sweep of the sessions of the jobs that ended: what they left
        in groups of their own is SIGKILLed (not what left the session with ``setsid``:
        it left on purpose). Their leaders gone, such processes are the keeper's children
        (a subreaper inherits orphans as their parent exits), so a sweep reads the
        keeper's list of children, once for all the sessions (a drain ends many jobs a
        tick), not all of /proc. A service whose command ran `timeout 600 server` left
        one server per restart (tester h52). A session is swept until two sweeps in a row
        find nothing in it, or its leader's pid leads a new job.
        """
        if not self.sweeps:
            return
        now = time.monotonic()
        if now < self.next_sweep:
            return
        self.next_sweep = now + SWEEP_S
        found = self._kill_session_leftovers(set(self.sweeps), self.run_sweeps)
        running = {task.pid for task in self.tasks.values() if task.pidfd >= 0}
        for leader, state in list(self.sweeps.items()):
            state[0] -= 1
            state[1] = 0 if leader in found else state[1] + 1
            if state[0] <= 0 or state[1] >= 2 or leader in running:
                del self.sweeps[leader]
        self.run_sweeps = {k: v for k, v in self.run_sweeps.items() if v in self.sweeps}

    def _kill_session_leftovers(self, sessions: set[int], runs: dict[str, int]) -> set[int]:
        """SIGKILL the keeper's children in ``sessions`` outside their leader's group (and
        with them their groups), and those whose TASK_ENV names one of ``runs`` (ended
        replica runs) wherever they are; return the sessions (leaders) that had any."""
        orphans = self._keeper_children()
        if orphans is None:
            return set()  # (no keeper, or a kernel without the list: as before)
        found: set[int] = set()
        for pid in orphans:
            stat = procstat.read_stat(pid)
            if stat is None or stat.state in ("Z", "X"):
                continue
            if stat.session in sessions:
                if stat.pgrp in (stat.session, 0):
                    continue  # (its own group was killed as it ended)
                found.add(stat.session)
            elif runs:
                leader = runs.get(_task_of(pid) or "")
                if leader is None:
                    continue
                found.add(leader)
            else:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(stat.pgrp, signal.SIGKILL)
        return found

    def _group_runs(self, task: Task) -> bool:
        """Whether a process of ``task``'s group other than its leader still runs. Its
        leader gone, what is left of it are the keeper's children (orphans go to the
        subreaper): their list is read, not all of /proc."""
        orphans = self._keeper_children()
        if orphans is None:
            return False  # (no keeper to ask: the group is killed at once, as before)
        for pid in orphans:
            stat = procstat.read_stat(pid)
            if stat is not None and stat.pgrp == task.pid and stat.state not in ("Z", "X"):
                return True
        return False

    def _keeper_children_of(self, run: str) -> frozenset[int]:
        """The keeper's children (orphans it inherited) whose TASK_ENV names ``run``."""
        orphans = self._keeper_children() or []
        return frozenset(pid for pid in orphans if _task_of(pid) == run)

    @staticmethod
    def _kill_run_anywhere(run: str) -> None:
        """SIGKILL every live process whose TASK_ENV names ``run`` (one walk of /proc: a
        rare path, after both launcher processes died)."""
        own = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == own:
                continue
            pid = int(name)
            if _task_of(pid) != run:
                continue
            stat = procstat.read_stat(pid)
            if stat is None or stat.state in ("Z", "X"):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                _say(f"killed pid {pid}, left running by {run.rsplit('/', 1)[-1]} (ended)")

    def _keeper_children(self) -> list[int] | None:
        """The keeper's children (orphans go to it, the subreaper), or ``None`` with no
        keeper or a kernel without the list."""
        try:
            with open(f"/proc/{self.keeper_pid}/task/{self.keeper_pid}/children", "rb") as fh:
                return [int(p) for p in fh.read().split()]
        except (OSError, ValueError):
            return None

    def _kill_strays(self, now: float) -> None:
        """SIGKILL the strays whose stop's grace period is over (still the same process)."""
        for (pid, ticks), kill_at in list(self.strays.items()):
            if now < kill_at:
                continue
            del self.strays[(pid, ticks)]
            if procstat.is_alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _killpg(task: Task, sig: int) -> None:
        """Signal the task's process group, only while its leader holds the group id."""
        try:
            if not task.child:
                # Not our child (found again after a crash): its leader is alive or an
                # unreaped zombie of the keeper while its pidfd can still be signalled.
                if task.pidfd < 0:
                    return
                signal.pidfd_send_signal(task.pidfd, 0)
            os.killpg(task.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # -- the keeper's pipe --------------------------------------------------------------------

    def _keeper_readable(self, fd: Any, _events: int) -> None:
        try:
            data = os.read(int(fd), 65536)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(fd)
            # Its keeper (the subreaper that outlives a spawner crash and keeps the
            # jobs' exit statuses) died. Nothing can start a new one above this process:
            # go on serving, and retire at the first moment no job runs, so that the
            # engine starts a new keeper and spawner.
            _say("its keeper is gone: this launcher retires as soon as no job runs")
            self.keeper_lost = True
            return
        self.keeper_buf += data
        *lines, self.keeper_buf = self.keeper_buf.split(b"\n")
        for raw in lines:
            fields = raw.decode().split(" ")
            if fields[0] == "exit":
                self._keeper_exit(fields[1], None if fields[2] == "-" else int(fields[2]))

    def _keeper_exit(self, key: str, code: int | None) -> None:
        task = self.tasks.get(key)
        if task is not None and task.dead_at is not None:
            self._ended(task, code)
        else:
            self.keeper_exits[key] = code  # its pidfd has not fired yet


_COLLAPSE: list[Any] = []  # [libc.fallocate], or [None] once it proved unusable here


def _fallocate_collapse_works() -> bool:
    """Whether the collapse was not found unusable yet (libc loaded on first use: ctypes
    costs the launcher's start a few milliseconds it does not need)."""
    if not _COLLAPSE:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fallocate = libc.fallocate
            fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
            fallocate.restype = ctypes.c_int
            _COLLAPSE.append(fallocate)
        except (OSError, AttributeError):
            _COLLAPSE.append(None)
    return _COLLAPSE[0] is not None


def _collapse(fd: int, length: int) -> bool:
    """Remove the file's first ``length`` bytes in place; False if the filesystem cannot
    (then not asked again: one state dir, one filesystem)."""
    import ctypes

    if _COLLAPSE[0](fd, FALLOC_FL_COLLAPSE_RANGE, 0, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EPERM):
        _say(f"logs are cut back by copying: this filesystem cannot collapse ({os.strerror(err)})")
        _COLLAPSE[0] = None
        return False
    raise OSError(err, os.strerror(err))


def _task_of(pid: int) -> str | None:
    """The TASK_ENV value in ``pid``'s environment (which job run started it), if any."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read()
    except OSError:
        return None
    prefix = TASK_ENV.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _say(message: str) -> None:
    """One line in ``launcher.log`` (where the engine points our stderr)."""
    try:
        print(
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} launcher: {message}", file=sys.stderr, flush=True
        )
    except OSError:  # (launcher.log on a full disk: what it says is lost, not the launcher)
        pass


def _start_ticks(pid: int, before_ns: int, after_ns: int) -> int:
    """The child's /proc start time, in clock ticks since boot.

    The kernel stamps it with the boot-time clock as it forks, between ``before_ns`` and
    ``after_ns``; when both fall in the same tick (nearly always: a tick is 10 ms) that is
    it. Otherwise /proc says, but reading /proc/PID/stat waits until the child's exec is
    done (a quarter of a millisecond), so that is the exception.
    """
    before, after = before_ns // TICK_NS, after_ns // TICK_NS
    if before == after:
        return before
    return procstat.start_ticks(pid) or 0


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _outside_group(leader: int, also: frozenset[int] = frozenset()) -> list[tuple[int, int]]:
    """``(pid, start ticks)`` of the descendants of ``leader`` that are in another process
    group than its own (the job's group and session are its leader's), from one pass over
    /proc: a signal to the group does not reach them. Another session (``setsid``), and
    also a group of its own in the job's session: GNU ``timeout``, ``bash -m`` and
    ``setpgid`` put a child there, and it ran on after the cancel (tester h52). Also the
    processes ``also`` and their descendants: what the job started that is no longer
    below it (a double fork's daemon, the keeper's child once its parent exited)."""
    children: dict[int, list[procstat.ProcStat]] = {}
    roots: list[procstat.ProcStat] = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = procstat.read_stat(int(name))
                if stat is not None:
                    children.setdefault(stat.ppid, []).append(stat)
                    if stat.pid in also and stat.state not in ("Z", "X"):
                        roots.append(stat)
    found, todo = [(r.pid, r.start_ticks) for r in roots], [leader, *(r.pid for r in roots)]
    while todo:
        for child in children.get(todo.pop(), ()):
            todo.append(child.pid)
            if child.pgrp != leader and child.state not in ("Z", "X"):
                found.append((child.pid, child.start_ticks))
    return found


def main(argv: list[str] | None = None) -> int:
    """``python -m gpulayer_tui.engine.launcher STATE_DIR [--idle S]`` (the keeper runs it).

    A spawner that cannot start (its journal cannot be opened or rewritten: a file made
    read-only or root's, a full disk) says why in one line and in :data:`FAILED_NOTE`, and
    exits :data:`START_FAILED`: the keeper then waits longer before each next try, and the
    engine and ``doctor`` say what is wrong (a traceback a few milliseconds, for ever, and
    jobs shown running that never started: tester h60).
    """
    parser = argparse.ArgumentParser(prog="gpulayer-tui launcher (spawner)")
    parser.add_argument("state_dir")
    parser.add_argument("--idle", type=float, default=60.0, help="exit after idle seconds")
    parser.add_argument("--first", action="store_true", help="the keeper's first spawner")
    args = parser.parse_args(argv)
    keeper_fd = KEEPER_FD if _fd_open(KEEPER_FD) else None
    state_dir = os.path.abspath(args.state_dir)
    try:
        spawner = Spawner(state_dir, args.idle, keeper_fd, args.first)
    except OSError as err:
        why = f"the launcher cannot start: {err}"
        _say(why)
        with contextlib.suppress(OSError):
            Path(state_dir, FAILED_NOTE).write_text(why + "\n")
        return START_FAILED
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(state_dir, FAILED_NOTE))
    return spawner.run()


def start_failure(state_dir: str | os.PathLike[str]) -> str | None:
    """Why the last spawner in ``state_dir`` could not start, if it could not (and none
    has started since)."""
    try:
        return Path(state_dir, FAILED_NOTE).read_text(errors="replace").strip() or None
    except OSError:
        return None


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as err:
        return err.errno != errno.EBADF
    return True


if __name__ == "__main__":
    sys.exit(main())
