"""The launcher's keeper: the subreaper above the spawner, so no job's exit is lost with it.

The keeper holds ``launcher.lock`` (one launcher per state dir), marks itself a child
subreaper (``PR_SET_CHILD_SUBREAPER``) and starts the spawner (:mod:`.launcher`) as its
only child. Jobs are the spawner's children; if the spawner dies, the kernel hands them to
the keeper, which from then on reaps them (SIGKILLing what their process group leaves,
while the leader is an unreaped zombie) and passes each one's exit status to the next
spawner through a pipe (fd 3 of the spawner).

When the spawner dies the keeper also settles the one start it may have been in the middle
of: a journal ``S key`` without ``P key``. The spawner starts jobs one at a time, so there is
at most one. Its process, if it ever existed, is now the keeper's child: alive (recognised
by ``GPULAYER_TASK`` in its environment) or a zombie started after the ``S`` line. Found, it
is journaled ``P`` (and ``E`` if it already ended); not found, ``N``: it never started, and
the engine starts it (once). Only then does a new spawner start, and it reads the journal.

The keeper ends when its spawner retires (exit 0: idle, no engine) and it has no child
left.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import sys
import time

from . import journal, procstat
from .launcher import KEEPER_FD, LOCK, START_FAILED, TASK_ENV, claim, exit_code, waited_code

PR_SET_CHILD_SUBREAPER = 36
ENVIRON_WAIT_S = 1.0
RETRY_FIRST_S = 0.5
"""After a spawner that could not start, the next one waits this long, doubled after
each one more that cannot, up to RETRY_MAX_S (a spawner killed or crashed once it ran is
replaced at once: its jobs' exits wait for it)."""
RETRY_MAX_S = 30.0
GIVE_UP_S = 600.0
"""With no job left to reap, a keeper whose spawners have not started for this long ends
(the engine starts a new one when it needs one)."""


def _say(message: str) -> None:
    """One line in ``launcher.log`` (where the engine points our stderr)."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} keeper: {message}", file=sys.stderr, flush=True)


def _set_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _children() -> list[int]:
    """This process's children (alive or zombies), from every process's parent pid.

    (``/proc/PID/task/TID/children`` would be cheaper, but the kernel documents it as
    unreliable while the list changes, and this runs just as a spawner died and its
    children were handed over.)
    """
    pid = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if name.isascii() and name.isdigit():
            stat = procstat.read_stat(int(name))
            if stat is not None and stat.ppid == pid:
                found.append(stat.pid)
    return found


def _every_process() -> list[int]:
    """Every process's pid but this one's."""
    own = os.getpid()
    return [
        int(name)
        for name in os.listdir("/proc")
        if name.isascii() and name.isdigit() and int(name) != own
    ]


ENDED = "(ended)"


def _adopters() -> set[int]:
    """The processes an orphan of a launcher that died whole can have been handed to.

    A process whose parent dies goes to the nearest child subreaper above that parent, or
    to init. The keeper that died was started as this one is (by an engine, through a
    shell that exits at once): its orphans went where that keeper itself had gone, to a
    process above this keeper too. So they are init and this keeper's ancestors.
    """
    found = {1}
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        stat = procstat.read_stat(pid)
        pid = stat.ppid if stat is not None else 0
    return found


def _own_session() -> int:
    """The keeper's session, which its spawner shares.

    The keeper rarely leads it: the engine starts the keeper through a shell that puts it
    in the background and exits (``sh -c 'exec "$@" &'`` in a new session), so the session
    is that shell's, led by a process long gone. Comparing with the keeper's own pid, as
    this did before, never matched there: CI's crash test then took a start that had run
    (its process dead in this session) for one that never began, and ran it again.

    Nothing of a job's can be in this session: jobs lead sessions of their own and their
    processes stay in those. So a child of ours still in it was started by the spawner and
    was cut short before (or without) its ``setsid``, or ran there: it is the interrupted
    start.
    """
    return os.getsid(0)


def _task_key(pid: int, state_dir: str, wait: float = ENVIRON_WAIT_S) -> str | None:
    """The ``GPULAYER_TASK`` key a live process of this state dir carries, if any;
    :data:`ENDED` if it ended while we looked (it is then a zombie to reap).

    A child caught between its spawn and its exec shows its parent's environment (the
    spawner's, without the key), then for a moment none at all; one that is exiting has
    no memory left to read (the read fails while /proc still says it runs). Both are
    waited out, for up to ``wait`` seconds: until the key shows, or the process is a
    zombie.
    """
    prefix = f"{TASK_ENV}={state_dir}/".encode()
    deadline = time.monotonic() + wait
    while True:
        stat = procstat.read_stat(pid)
        if stat is None:
            return None
        if stat.state in ("Z", "X"):
            return ENDED
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            environ = b""  # exiting: look again, it is about to be a zombie
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                return item[len(prefix) :].decode(errors="replace")
        if time.monotonic() > deadline:
            return None
        time.sleep(0.002)


class Keeper:
    """See the module docstring.

    Args:
        state_dir: The engine's state dir.
        idle: The spawner's idle timeout (passed on).
    """

    def __init__(self, state_dir: str, idle: float) -> None:
        self.state_dir = state_dir
        self.idle = idle
        self.journal_path = os.path.join(state_dir, journal.NAME)
        self.pending: list[bytes] = []  # lines for the next spawner
        self.pipe: int | None = None
        self.spawner = 0
        self.spawners = 0  # started so far (the first is told: see Spawner's ``first``)
        # Reaped children the journal did not name: pid, start ticks, code, led a session.
        self.unknown: list[tuple[int, int, int, bool]] = []
        # Live processes the last look for an interrupted start saw that name no job
        # (pid, start ticks): session leaders of ours made at that start's moment.
        self.unnamed: list[tuple[int, int]] = []
        # Exits of jobs reaped here, told to a spawner: told again to the next one until the
        # journal has them (a spawner may die before it reads its pipe).
        self.reaped: dict[str, int] = {}

    def run(self) -> int:
        """Start spawners until one retires; reap everything in between."""
        failing_since: float | None = None
        retry = RETRY_FIRST_S
        try:
            # A launcher that died whole (keeper and spawner killed at once) left the start
            # it was in the middle of unsettled: its job stayed "running" for ever with no
            # process, and held its slot (tester h66). Its process, if any, went to init.
            self._settle_interrupted_start(anywhere=True)
        except OSError as err:
            _say(f"cannot read or settle the journal yet: {err}")
        while True:
            self._start_spawner()
            status = self._reap_until_spawner_ends()
            if exit_code(status) == 0 and not _children():
                return 0
            try:
                self._settle_interrupted_start()
                entries = journal.replay(self.journal_path)
            except OSError as err:
                # (its journal cannot be read or written: the next spawner that starts
                # settles it, and is told again all that was reaped)
                _say(f"cannot read or settle the journal yet: {err}")
                entries = None
            for key, code in list(self.reaped.items()):
                if entries is not None:
                    entry = entries.get(key)
                    if entry is None or entry.state == journal.EXITED:
                        del self.reaped[key]  # the journal has it: told for good
                        continue
                self.pending.append(f"exit {key} {code}\n".encode())
            if exit_code(status) != START_FAILED:
                failing_since, retry = None, RETRY_FIRST_S
                continue
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > GIVE_UP_S and not _children():
                _say(f"no spawner could start for {GIVE_UP_S:.0f} s; the keeper ends")
                return 1
            _say(f"the spawner could not start; the next one in {retry:g} s")
            self._reap_for(retry)
            retry = min(retry * 2, RETRY_MAX_S)

    def _name_unknown(self) -> None:
        """Reaps the journal did not name when they happened (it could not be read, or
        was being put back) that it names now: their codes are told as any reap's (they
        were lost, the job ended "exit status unknown": seen in CI, a job reaped in the
        instant its journal was renamed back)."""
        if not self.unknown:
            return
        try:
            entries = journal.replay(self.journal_path)
        except OSError:
            return
        for item in list(self.unknown):
            pid, ticks, code, _ = item
            for key, entry in entries.items():
                if entry.state == journal.RUNNING and (entry.pid, entry.ticks) == (pid, ticks):
                    self.unknown.remove(item)
                    self.reaped[key] = code
                    self.pending.append(f"exit {key} {code}\n".encode())
                    _say(f"pid {pid}, reaped before the journal named it, was {key} (exit {code})")
                    break

    def _start_spawner(self) -> None:
        self._name_unknown()
        read, write = os.pipe()
        args = [
            sys.executable,
            "-m",
            "gpulayer_tui.engine.launcher",
            self.state_dir,
            "--idle",
            str(self.idle),
            *(["--first"] if self.spawners == 0 else []),
        ]
        self.spawners += 1
        self.spawner = os.posix_spawn(
            sys.executable, args, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, read, KEEPER_FD)]
        )
        os.close(read)
        self.pipe = write
        lines, self.pending = self.pending, []
        for data in lines:
            self._tell(data)

    def _tell(self, data: bytes) -> None:
        """Pass a line to the spawner (kept for the next one if it is gone)."""
        if self.pipe is not None:
            try:
                os.write(self.pipe, data)
                return
            except BrokenPipeError:
                os.close(self.pipe)
                self.pipe = None
        self.pending.append(data)

    def _reap_until_spawner_ends(self) -> int:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                time.sleep(0.1)  # (no child at all: the spawner is starting)
                continue
            if info is None:
                continue
            pid = info.si_pid
            if pid == self.spawner:
                _, status = os.waitpid(pid, 0)
                if self.pipe is not None:
                    os.close(self.pipe)
                    self.pipe = None
                return status
            self._reap_orphan(pid)

    def _reap_for(self, seconds: float) -> None:
        """Reap what ends (no spawner runs) for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is None or info.si_pid == 0:
                time.sleep(min(0.05, left))
                continue
            self._reap_orphan(info.si_pid)

    def _reap_orphan(self, pid: int) -> None:
        """A job the spawner left us ended: kill its leftovers, reap it, say its code."""
        stat = procstat.read_stat(pid)
        key, state = self._key_of(pid, stat.start_ticks if stat else None)
        if state == journal.EXITED:
            # Its end is journaled already (the spawner died between that line and the
            # reap): reap it; nothing to tell.
            os.waitpid(pid, 0)
            return
        if key is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its group id is safe: it is unreaped
        _, status = os.waitpid(pid, 0)
        code = exit_code(status)
        if key is not None:
            self.reaped[key] = code
            self._tell(f"exit {key} {code}\n".encode())
        else:
            # (A job leads its own session; a start cut short may still be in ours.)
            leader = stat is not None and stat.session in (pid, _own_session())
            self.unknown.append((pid, stat.start_ticks if stat else 0, code, leader))
            del self.unknown[:-64]  # only the newest can be a start being settled
            if leader:
                # (a job's orphaned children, `head` of a pipeline its cancel left, are
                # reaped here every day: said, they read as something gone wrong; h101)
                _say(f"reaped pid {pid}, which the journal does not name (exit {code})")

    def _key_of(self, pid: int, ticks: int | None) -> tuple[str | None, str | None]:
        """The key whose process this is, and its journal state (running, or exited and
        not reaped yet): same pid *and* start time (pids are recycled fast, and the
        journal remembers ended jobs until the engine says so)."""
        try:
            entries = journal.replay(self.journal_path)
        except OSError:
            # (unreadable for now: kept among the unknown reaps, named once it reads
            # again; raised, it ended the keeper, and with it every code it held)
            return None, None
        for key, entry in entries.items():
            if entry.state in (journal.RUNNING, journal.EXITED):
                if entry.pid == pid and entry.ticks == ticks:
                    return key, entry.state
        return None, None

    def _settle_interrupted_start(self, anywhere: bool = False) -> None:
        """The spawner died: decide the start it may have been in the middle of.
        ``anywhere``: the keeper above it died too (this keeper is new): the process of
        that start, if any, is init's now, so it is looked for among every process. One
        that ran and has ended since is gone, but its start mark says it was made
        (``journal.STARTING``): its end is recorded, exit status unknown, and it never
        runs again (it ran a second time: tester h135)."""
        entries = journal.replay(self.journal_path)
        intents = sorted(
            (e.intent_ticks, key) for key, e in entries.items() if e.state == journal.INTENT
        )
        if not intents:
            return
        # Processes the journal already names, by pid *and* start time: a pid alone may be
        # an ended job's, recycled for the very start being settled. (An exited one may
        # still be an unreaped zombie here, its end journaled just before the spawner died.)
        known: set[tuple[int | None, int | None]] = {
            (e.pid, e.ticks)
            for e in entries.values()
            if e.state in (journal.RUNNING, journal.EXITED) and e.pid is not None
        }
        writer = journal.Journal(self.journal_path)  # the only writer while no spawner runs
        try:
            for since, key in intents:
                if self._find(key, since, known, writer, anywhere):
                    continue
                mark = journal.start_mark(self.state_dir, key, since)
                unnamed = [p for p in self.unnamed if p not in known]
                if os.path.exists(mark) and len(unnamed) == 1:
                    # Its process was made, and one (only one) of ours, made at that very
                    # moment and leading its own session (an orphan, when the launcher
                    # died whole), still runs with no job named in its environment: it
                    # (taken for ended, it ran on unwatched, holding nothing, and a
                    # service's replica ran twice: tester h138).
                    pid, ticks = unnamed[0]
                    writer.write("P", key, pid, ticks)
                    known.add((pid, ticks))
                    _say(
                        f"the interrupted start of {key} runs as pid {pid} (its environment "
                        "names no job: taken by the moment it was made, and its session)"
                    )
                elif os.path.exists(mark):
                    writer.write("E", key, None, time.time())
                    _say(
                        f"the start of {key} was interrupted after its process was made: "
                        "it ran and has ended, exit status unknown (not run again)"
                    )
                else:
                    writer.write("N", key)  # no trace: it never started; the engine will
                    _say(f"the start of {key} was interrupted before it began: never ran")
                with contextlib.suppress(OSError):
                    os.unlink(mark)
        finally:
            writer.close()

    def _find(
        self,
        key: str,
        since: int,
        known: set[tuple[int | None, int | None]],
        writer: journal.Journal,
        anywhere: bool = False,
    ) -> bool:
        """Look for the process of the start of ``key`` begun at ``since`` (boot ticks).

        Candidates are this keeper's children that the journal does not name and that
        started at or after ``since``. A live one says whose it is (``GPULAYER_TASK``);
        a dead one cannot, but the spawner starts each job as the leader of a new session
        and only the interrupted start can have begun after ``since``: a zombie that leads
        its own session, or is still in the spawner's (ours), is taken for it. (A job's
        escaped descendant that died in that same tick could be mistaken for it: the
        start is then recorded with that exit status, never run a second time.)
        """
        seen = []
        ended = []
        self.unnamed = []
        own_session = _own_session()
        uid = os.getuid()
        # (only an orphan can be the start of a launcher that died whole: without this, a
        # session leader of another launcher's, made in that very tick, was taken for it)
        adopters = _adopters() if anywhere else set()
        for child in _every_process() if anywhere else _children():
            stat = procstat.read_stat(child)
            if stat is None or (child, stat.start_ticks) in known:
                continue
            if stat.start_ticks < since - 1:
                continue  # it started before this start was begun: not it
            if anywhere and stat.state in ("Z", "X"):
                continue  # (another's zombie: not ours to wait for)
            # (a new keeper comes long after any such exec: every process is read once, not
            # waited on for a second each)
            found = (
                ENDED
                if stat.state in ("Z", "X")
                else _task_key(child, self.state_dir, 0.0 if anywhere else ENVIRON_WAIT_S)
            )
            seen.append((child, stat.start_ticks, stat.session, found))
            if (
                found is None
                and stat.session == child
                and stat.start_ticks <= since + 1
                and (not anywhere or stat.ppid in adopters)
            ):
                # (a live session leader of ours made at that very moment whose environment
                # names no job: one that cleared it, `exec env -i ...`, or wrote over it
                # to set its title; see _settle_interrupted_start. In CI another test's
                # job, its spawner alive, was made in the very tick of a start being
                # settled: taken for it, so an "anywhere" one must be an orphan)
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{child}").st_uid == uid:
                        self.unnamed.append((child, stat.start_ticks))
            if found == key:
                writer.write("P", key, child, stat.start_ticks)
                _say(f"the interrupted start of {key} runs as pid {child}")
                return True
            # A zombie leading its own session was started by the spawner as a job; so
            # was one still in our own session (the spawner's, which nothing else of a
            # job's joins): seen once in CI's crash test, a job that had run and exited
            # there, taken for "never ran" and started a second time.
            if found == ENDED and stat.session in (child, own_session):
                ended.append((child, stat.start_ticks))
        if ended:
            child, ticks = ended[0]
            writer.write("P", key, child, ticks)
            code = waited_code(os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT))
            writer.write("E", key, code)  # (journaled, then reaped: as the spawner does)
            os.waitpid(child, 0)
            _say(f"the interrupted start of {key} ran as pid {child} and ended (of {ended})")
            return True
        for index, (pid, ticks, code, leader) in enumerate(self.unknown):
            if ticks >= since - 1 and leader:
                del self.unknown[index]
                writer.write("P", key, pid, ticks)
                writer.write("E", key, code)
                _say(f"the interrupted start of {key} ran as pid {pid} (reaped) and ended")
                return True
        if seen:
            _say(f"no process for {key} (begun at tick {since}); others: {seen}")
        return False


def keep(state_dir: str, idle: float) -> int:
    """Run a keeper for ``state_dir``, unless one already does (then exit 0)."""
    fd = os.open(
        os.path.join(state_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another keeper serves this state dir
    held = claim(state_dir)  # (kept open for the keeper's whole life)
    if held is None:
        _say("another launcher serves this state dir (its launcher.lock was removed)")
        return 0
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # jobs outlive a stopping engine; so do we
    _set_subreaper()
    return Keeper(state_dir, idle).run()


def main(argv: list[str] | None = None) -> int:
    """``python -m gpulayer_tui.engine.keeper STATE_DIR [--idle S]`` (the engine runs it)."""
    import argparse

    parser = argparse.ArgumentParser(prog="gpulayer-tui launcher")
    parser.add_argument("state_dir")
    parser.add_argument("--idle", type=float, default=60.0, help="exit after idle seconds")
    args = parser.parse_args(argv)
    return keep(os.path.abspath(args.state_dir), args.idle)


if __name__ == "__main__":
    sys.exit(main())
