"""Snapshots at submit (record 000's source bundle): a queued job runs the code as it was.

``submit --snapshot`` (spec ``snapshot = true``, or ``[snapshot] default``) copies the
job's working directory when it is submitted, and the job runs in the copy:

* inside a git work tree, the whole tree's git-tracked files plus untracked files that are
  not ignored (``git ls-files -co --exclude-standard -z``), with the commit
  (``git rev-parse HEAD``) and whether the tree was dirty (``git status --porcelain``);
  the job runs at the same place inside the copy (``repo/sub`` -> ``copy/sub``);
* elsewhere, the directory itself, skipping ``.git``, ``__pycache__``, ``.venv``,
  ``venv``, ``node_modules`` and what a ``.gpulayerignore`` there names (``fnmatch``
  patterns, one a line, matched against the relative path and the name; a trailing ``/``
  matches directories only).

Symlinks are copied as symlinks (never followed, so nothing outside the tree is read: a
file git lists under a folder that is now a symlink is left out); sockets, FIFOs and
devices are skipped; a file that cannot be read refuses the whole snapshot. The state
dir is never copied (a cwd inside it is refused; inside the cwd it is left out). The
size (the files' sizes plus :data:`DIR_BYTES` a folder) is bounded by ``[snapshot]
max_mb``, the depth by :data:`MAX_DEPTH`. Trees are removed by a loop over descriptors
(:func:`_remove_tree`): a job may make its own tree as deep as it likes.

The store, under ``$STATE/snapshots`` (0700, like the rest of the state dir):

* ``objects/<sha256>`` (``<sha256>.x`` for executables): one file per content, read-only
  (0444 or 0555), its mtime set to :data:`OBJECT_MTIME_NS`;
* ``jobs/<id>/``: the job's tree; directories are 0700 and writable, so a job may create
  files in its cwd;
* ``tmp/``: trees being built, and objects being written (emptied at start).

How a tree holds its files (``[snapshot] files``):

* ``linked``: each file a hard link to its object, deduplicated across jobs. The mode
  (0444) is the only guard: a job of an engine not run as root that writes a file fails
  with EACCES. One that makes the file writable first changes every tree sharing it; an
  object whose mtime is no longer the store's is then never linked again (it is replaced
  by a new one), so later snapshots run what was submitted.
* ``private``: each job's own copies (a reflink where the filesystem makes them, else a
  copy; no object store). Root ignores file modes, so this is what ``auto`` (the default)
  picks for an engine that runs as root or with ``CAP_DAC_OVERRIDE``; ``linked`` otherwise.

An object whose link count is 1 is held by the store alone: :meth:`SnapshotStore.remove_jobs`
(history retention) removes job trees and then such objects.

Everything here blocks (it reads the user's files and runs git): it runs in a thread
(``asyncio.to_thread``), under a deadline checked between files and chunks, and git runs
with a timeout.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import logging
import os
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fields import printable
from .errors import SpecError
from .statedir import UnsafeStateDir

log = logging.getLogger(__name__)

SKIP_NAMES = frozenset({".git", "__pycache__", ".venv", "venv", "node_modules"})
IGNORE_FILE = ".gpulayerignore"
CHUNK = 1 << 20
MB = 1024 * 1024
MAX_DEPTH = 256  # folders deep; deeper trees are refused (no project's is, and every
# walk over a tree of ours must stay bounded: see _remove_tree)
DIR_BYTES = 4096  # what a folder costs its filesystem: counted toward [snapshot] max_mb
GIT_TIMEOUT_S = 30.0
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
OBJECT_MTIME_NS = 0
"""Every object's mtime: a write through a tree's link moves it, and such an object is
never linked again."""
_FICLONE = 0x40049409  # ioctl: share the source's extents (btrfs, XFS, bcachefs)
_CAP_DAC_OVERRIDE = 1


def writes_read_only_files() -> bool:
    """Whether this process may write files whatever their mode (root, or
    ``CAP_DAC_OVERRIDE``): then a read-only hard link protects nothing."""
    if os.geteuid() == 0:
        return True
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_DAC_OVERRIDE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def files_mode(setting: str) -> str:
    """``[snapshot] files`` resolved: ``linked`` or ``private``."""
    if setting == "auto":
        return "private" if writes_read_only_files() else "linked"
    return setting


class SnapshotError(SpecError):
    """The working directory cannot be snapshotted (too big, unreadable, git failing, the
    deadline passed); the submission is refused (400) and nothing is stored."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "snapshot")


@dataclass(frozen=True)
class _Entry:
    rel: str  # path relative to the copied root
    kind: str  # "file", "link" or "dir"
    size: int


@dataclass
class Built:
    """A snapshot built in ``tmp/``, not yet a job's (see :meth:`SnapshotStore.place`)."""

    tree: Path
    source: str  # the directory that was copied (the git root, or the cwd)
    rel_cwd: str  # where the job runs, relative to ``tree``
    commit: str | None
    dirty: bool | None
    files: int
    bytes: int
    private: bool = False  # the tree's files are its own copies (not links to objects)


def _mb(size: int) -> str:
    if size < MB:
        return f"{size} bytes"
    # (rounded, a size just past the limit read "is 5.0 MB, over max_mb = 5"; MiB, as
    # max_mb counts: "MB" was said of them, tester h156)
    return f"{size / MB:.2f} MiB" if size < 100 * MB else f"{size / MB:.0f} MiB"


SPACE_CHECK_BYTES = 8 * MB  # a copy looks at the state dir's free space this often


class _Budget:
    """The size limit, the deadline and the free-space floor of one snapshot."""

    def __init__(
        self, cwd: str, max_bytes: int, deadline: float, state_dir: str = "", floor: int = 0
    ) -> None:
        self.cwd = cwd
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.state_dir = state_dir
        self.floor = floor  # bytes the state dir's disk keeps free ([logs] min_free_mb)
        self._space_seen = -SPACE_CHECK_BYTES  # copied bytes at the last look
        self.timeout: float | None = None  # ([snapshot] timeout, said when it is passed)

    def check_space(self, copied: int) -> None:
        """Refuse once the state dir's disk has less than the floor free (checked before
        the copy and every ``SPACE_CHECK_BYTES`` of it: a copy filled the disk to 0, and a
        running job's writes failed). Not the whole tree's size up front: what the store
        holds already is linked, not copied again."""
        if not self.floor or copied - self._space_seen < SPACE_CHECK_BYTES:
            return
        self._space_seen = copied
        try:
            st = os.statvfs(self.state_dir)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if free < self.floor:
            raise SnapshotError(
                # (MiB, as the queue's "waiting for disk space" says: it read "MB" here)
                f"snapshot of {self.cwd}: the engine's disk is down to {free // MB} MiB "
                f"free, below [logs] min_free_mb = {self.floor // MB} (kept for its jobs' "
                f"logs); nothing was stored (make room, or submit with --no-snapshot)"
            )

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            limit = f" = {self.timeout:g} s" if self.timeout is not None else ""
            raise SnapshotError(
                f"snapshot of {self.cwd} took longer than [snapshot] timeout{limit}; nothing "
                "was stored (submit from a smaller directory, or with --no-snapshot)"
            )

    def check_size(self, total: int, partial: bool = False) -> None:
        """Refuse past the limit; ``partial``: ``total`` is what was counted so far."""
        if total > self.max_bytes:
            what = "is at least" if partial else "is"
            size, limit = _mb(total), f"{self.max_bytes // MB}"
            if total < self.max_bytes * 1.01:  # (rounded, it read as the limit itself)
                size, limit = f"{total} bytes", f"{limit} ({self.max_bytes} bytes)"
            raise SnapshotError(
                f"snapshot of {self.cwd} {what} {size}, over [snapshot] max_mb = "
                f"{limit}; nothing was stored (add a .gitignore or "
                f"{IGNORE_FILE} entry, or submit with --no-snapshot)"
            )

    def seconds_left(self) -> float:
        return max(0.1, self.deadline - time.monotonic())


def _git(args: list[str], cwd: str, budget: _Budget) -> subprocess.CompletedProcess[bytes]:
    """Run git (its own config only from the repo: no pager, no prompts)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=min(GIT_TIMEOUT_S, budget.seconds_left()),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SnapshotError(
            f"snapshot of {cwd}: `git {' '.join(args[:2])}` did not answer in time; nothing "
            "was stored"
        ) from None


def _git_root(cwd: str, budget: _Budget) -> str | None:
    """The work tree's top directory, or ``None`` outside git (or without git)."""
    try:
        done = _git(["rev-parse", "--show-toplevel"], cwd, budget)
    except FileNotFoundError:  # no git on this machine: the directory is copied as such
        return None
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        if not why or "not a git repository" in why[0]:
            return None
        # A repository git refuses to read (another user's: "detected dubious ownership")
        # was copied as a plain folder, its ignored files with it (.env, checkpoints), and
        # no commit said (tester h49).
        said = printable(why[0])[:300]
        raise SnapshotError(
            f"snapshot of {cwd}: git refuses to read its repository ({said}); nothing was "
            "stored (submit from a repository git reads for this user, or with --no-snapshot)"
        )
    top = done.stdout.decode("utf-8", "surrogateescape").rstrip("\n")
    return top or None


def _git_listing(root: str, budget: _Budget) -> tuple[list[str], str | None, bool]:
    listed = _git(["ls-files", "-co", "--exclude-standard", "-z"], root, budget)
    if listed.returncode != 0:
        why = listed.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SnapshotError(
            f"snapshot of {root}: `git ls-files` failed: {why[0] if why else listed.returncode}"
            "; nothing was stored"
        )
    names = [os.fsdecode(n) for n in listed.stdout.split(b"\0") if n]
    head = _git(["rev-parse", "--verify", "-q", "HEAD"], root, budget)
    commit = head.stdout.decode().strip() if head.returncode == 0 else None  # (no commit yet)
    status = _git(["status", "--porcelain", "-z"], root, budget)
    if status.returncode != 0:
        raise SnapshotError(f"snapshot of {root}: `git status` failed; nothing was stored")
    return list(dict.fromkeys(names)), commit or None, bool(status.stdout.strip(b"\0"))


def _ignore_rules(root: str) -> list[tuple[str, bool]]:
    """``.gpulayerignore``'s patterns: (pattern, directories only)."""
    try:
        fd = os.open(os.path.join(root, IGNORE_FILE), _READ_FLAGS)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(1 << 20).decode("utf-8", "replace")
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        rules.append((line.rstrip("/").lstrip("/"), line.endswith("/")))
    return rules


def _ignored(rel: str, name: str, is_dir: bool, rules: list[tuple[str, bool]]) -> bool:
    if name in SKIP_NAMES:
        return True
    for pattern, dirs_only in rules:
        if dirs_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def _too_deep(source: str, rel: str) -> SnapshotError:
    return SnapshotError(
        f"snapshot of {source}: {rel.split('/')[0]}/... is more than {MAX_DEPTH} folders "
        f"deep; nothing was stored (leave it out with a .gitignore or {IGNORE_FILE} entry)"
    )


def _unreadable(source: str, rel: str, err: OSError) -> SnapshotError:
    return SnapshotError(
        f"snapshot of {source}: cannot read {rel or '.'} ({err.strerror or err}); nothing "
        "was stored"
    )


def _walk(
    root: str,
    budget: _Budget,
    rules: list[tuple[str, bool]],
    rel: str = "",
    total: int = 0,
    skip: frozenset[tuple[int, int]] = frozenset(),
) -> list[_Entry]:
    """Every entry under ``root/rel`` by the plain rules, without following symlinks. A
    tree past the size limit (folders count :data:`DIR_BYTES` each) or deeper than
    :data:`MAX_DEPTH` is refused as soon as it is (a cwd of ``/`` is not walked to its
    end); folders in ``skip`` (device, inode: the state dir) are left out."""
    out: list[_Entry] = []
    stack = [rel]
    while stack:
        budget.check_time()
        here = stack.pop()
        try:
            with os.scandir(os.path.join(root, here) if here else root) as entries:
                items = sorted(entries, key=lambda e: e.name)
        except OSError as err:
            raise _unreadable(root, here, err) from None
        for entry in items:
            child = f"{here}/{entry.name}" if here else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            is_dir = stat.S_ISDIR(info.st_mode)
            if _ignored(child, entry.name, is_dir, rules):
                continue
            if is_dir:
                if (info.st_dev, info.st_ino) in skip:
                    continue  # (the engine's own state dir: its database, its snapshots)
                if child.count("/") >= MAX_DEPTH:
                    raise _too_deep(root, child)
                out.append(_Entry(child, "dir", 0))
                stack.append(child)
                total += DIR_BYTES
                budget.check_size(total, partial=True)
            elif stat.S_ISLNK(info.st_mode):
                out.append(_Entry(child, "link", 0))
            elif stat.S_ISREG(info.st_mode):
                out.append(_Entry(child, "file", info.st_size))
                total += info.st_size
                budget.check_size(total, partial=True)
            # (sockets, FIFOs, devices: skipped)
    return out


def _git_entries(
    root: str,
    names: list[str],
    budget: _Budget,
    skip: frozenset[tuple[int, int]] = frozenset(),
) -> list[_Entry]:
    out: list[_Entry] = []
    folders: dict[str, bool] = {"": True}  # parent folder -> a real folder of the tree
    for index, rel in enumerate(names):
        if index % 256 == 0:
            budget.check_time()
        if rel.endswith("/") and len(rel) > 1:
            # An untracked repository inside the tree ("nested/"): copied as a submodule
            # is, below. Left out, the job ran without the code in its folder (h176).
            rel = rel[:-1]
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "" in parts:
            continue  # (git never lists these; a path must stay inside the tree)
        if len(parts) > MAX_DEPTH:
            raise _too_deep(root, rel)
        if not _inside(root, parts[:-1], folders, skip):
            # A tracked file under a folder that is now a symlink (an ignored `data ->
            # /datasets`), or under the state dir: read through it, the copy held what
            # lies outside the tree.
            continue
        try:
            info = os.lstat(os.path.join(root, rel))
        except FileNotFoundError:
            continue  # deleted in the work tree: not part of it now
        except OSError as err:
            raise _unreadable(root, rel, err) from None
        if stat.S_ISLNK(info.st_mode):
            out.append(_Entry(rel, "link", 0))
        elif stat.S_ISREG(info.st_mode):
            out.append(_Entry(rel, "file", info.st_size))
        elif stat.S_ISDIR(info.st_mode):  # a submodule, or a repository git does not track
            out.append(_Entry(rel, "dir", 0))
            out.extend(_submodule_entries(root, rel, budget, skip))
    return out


def _submodule_entries(
    root: str, rel: str, budget: _Budget, skip: frozenset[tuple[int, int]]
) -> list[_Entry]:
    """A submodule's entries (under ``rel``): what its own git lists, as for the
    repository, its own ``.gitignore`` heeded (its ignored checkpoints were copied, and a
    snapshot over max_mb could not be made smaller: tester h156); one not checked out, or
    whose git fails, by the plain rules with its ``.gpulayerignore``."""
    sub = os.path.join(root, rel)
    if os.path.lexists(os.path.join(sub, ".git")):
        listed = _git(["ls-files", "-co", "--exclude-standard", "-z"], sub, budget)
        if listed.returncode == 0:
            names = list(dict.fromkeys(os.fsdecode(n) for n in listed.stdout.split(b"\0") if n))
            inner = _git_entries(sub, names, budget, skip)
            return [_Entry(f"{rel}/{e.rel}", e.kind, e.size) for e in inner]
    return _walk(root, budget, _ignore_rules(sub), rel, skip=skip)


def _inside(
    root: str, parents: list[str], known: dict[str, bool], skip: frozenset[tuple[int, int]]
) -> bool:
    """Whether every folder of ``parents`` (under ``root``) is a real folder, not a symlink
    and not a skipped one (each looked at once: ``known``)."""
    rel = ""
    for part in parents:
        rel = f"{rel}/{part}" if rel else part
        ok = known.get(rel)
        if ok is None:
            try:
                info = os.lstat(os.path.join(root, rel))
            except OSError:
                ok = False
            else:
                ok = stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) not in skip
            known[rel] = ok
        if not ok:
            return False
    return True


class SnapshotStore:
    """The content-addressed store of snapshots in the state dir.

    Args:
        state_dir: The engine's state dir (already checked by :mod:`.statedir`).
    """

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "snapshots"
        self.objects = self.root / "objects"
        self.jobs = self.root / "jobs"
        self.tmp = self.root / "tmp"

    # -- layout -------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Make the store's directories (0700, real directories of the engine's user) and
        empty ``tmp/`` (no snapshot is in flight before the engine takes submissions)."""
        for path in (self.root, self.objects, self.jobs, self.tmp):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise UnsafeStateDir(
                    f"{path} is not a directory of the engine's own: the engine keeps "
                    "snapshots only in a real directory it owns"
                )
            if stat.S_IMODE(info.st_mode) != 0o700:
                os.chmod(path, 0o700)
        with os.scandir(self.tmp) as entries:
            stale = [Path(e.path) for e in entries]
        for path in stale:
            try:
                _remove_tree(path)
            except Exception as err:  # (what is left there must never stop an engine)
                log.warning("cannot remove %s (left from an earlier run): %s", path, err)
        self.collect()  # (objects of snapshots that never became a job's)

    def job_tree(self, job_id: int) -> Path:
        """Where job ``job_id``'s tree is (or would be)."""
        return self.jobs / str(job_id)

    # -- building (in a thread) ---------------------------------------------------------------

    def build(
        self,
        cwd: str,
        max_bytes: int,
        timeout: float,
        private: bool = False,
        min_free: int = 0,
        configured_timeout: float | None = None,
    ) -> Built:
        """Copy ``cwd`` (see the module's docstring) into a new tree in ``tmp/``;
        ``private``: with copies of its own, not links to the store's objects;
        ``min_free``: bytes the state dir's disk must keep free ([logs] min_free_mb);
        ``configured_timeout``: ``[snapshot] timeout``, said when the time runs out
        (``timeout`` is what is left of it for this submission).

        Raises:
            SnapshotError: Too big, unreadable, git failing, out of time or of disk space;
                nothing is left.
        """
        budget = _Budget(
            cwd, max_bytes, time.monotonic() + timeout, str(self.root.parent), min_free
        )
        budget.timeout = configured_timeout
        if not os.path.isdir(cwd):
            # (a folder removed since was said "is not a directory": tester h156)
            what = "is not a directory" if os.path.lexists(cwd) else "does not exist"
            raise SnapshotError(f"snapshot: {cwd} {what}; nothing was stored")
        real = os.path.realpath(cwd)
        state = os.stat(self.root.parent)
        skip = frozenset({(state.st_dev, state.st_ino)})  # (never copied into itself)
        state_dir = os.path.realpath(self.root.parent)
        if os.path.commonpath([real, state_dir]) == state_dir:
            raise SnapshotError(
                f"snapshot: {cwd} is in the engine's state dir ({state_dir}), which holds "
                "its database and every snapshot; nothing was stored"
            )
        top = _git_root(real, budget)
        commit: str | None = None
        dirty: bool | None = None
        if top is not None:
            source = os.path.realpath(top)
            names, commit, dirty = _git_listing(source, budget)
            entries = _git_entries(source, names, budget, skip)
            rel_cwd = os.path.relpath(real, source)
            inside = rel_cwd + os.sep
            listed = any(e.rel.startswith(inside) for e in entries) if rel_cwd != "." else entries
            if not listed:
                # (at the top too: a `*` in .gitignore listed nothing, and the job ran in an
                # empty folder: tester h156)
                with os.scandir(real) as found:
                    has_files = any(entry.name != ".git" for entry in found)
                if has_files:
                    # (git lists none of its files: an ignored folder, such as build/. The
                    # job ran in an empty folder, and failed for its missing files: h49)
                    raise SnapshotError(
                        f"snapshot of {cwd}: git lists none of its files (ignored, in "
                        f".gitignore?), so the job would run in an empty folder; nothing "
                        "was stored (submit from a folder git tracks, or with --no-snapshot)"
                    )
        else:
            source = real
            entries = _walk(source, budget, _ignore_rules(source), skip=skip)
            rel_cwd = "."
        budget.cwd = source
        folders = {os.path.dirname(e.rel) for e in entries} | {
            e.rel for e in entries if e.kind == "dir"
        }
        budget.check_size(sum(e.size for e in entries) + DIR_BYTES * len(folders))
        budget.check_space(0)
        tree = Path(tempfile.mkdtemp(prefix="tree-", dir=self.tmp))
        try:
            files, size = self._copy(source, tree, entries, budget, private)
            os.makedirs(tree / rel_cwd, 0o700, exist_ok=True)  # (an empty cwd has no files)
        except BaseException:
            _remove_tree(tree)
            self.collect()  # (objects this tree was the first to store: nobody's now)
            raise
        return Built(tree, source, rel_cwd, commit, dirty, files, size, private)

    def _copy(
        self, source: str, tree: Path, entries: list[_Entry], budget: _Budget, private: bool
    ) -> tuple[int, int]:
        made_dirs: set[str] = {""}
        files = total = 0
        for entry in entries:
            budget.check_time()
            parent = os.path.dirname(entry.rel)
            if not self._make_dirs(tree, parent, made_dirs):
                continue  # (its parent is a link in the copy: never written through)
            target = tree / entry.rel
            src = os.path.join(source, entry.rel)
            if entry.kind == "dir":
                self._make_dirs(tree, entry.rel, made_dirs)  # (kept even when empty)
                continue
            if entry.kind == "link":
                try:
                    os.symlink(os.readlink(src), target)
                except FileNotFoundError:
                    continue
                except OSError as err:
                    raise _unreadable(source, entry.rel, err) from None
                files += 1
                continue
            copied = self._copy_file(src, entry.rel, target, budget, total, private)
            if copied is None:
                continue
            files += 1
            total += copied
            budget.check_space(total)
        return files, total

    @staticmethod
    def _make_dirs(tree: Path, rel: str, made: set[str]) -> bool:
        """Make ``tree/rel`` and its parents (0700); ``False`` if a part is not a directory
        of ours (a symlink copied there)."""
        missing = []
        while rel not in made:  # (a loop, not recursion: a deep tree ran out of stack)
            missing.append(rel)
            rel = os.path.dirname(rel)
        for rel in reversed(missing):
            path = tree / rel
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    return False
            made.add(rel)
        return True

    def _copy_file(
        self, src: str, rel: str, target: Path, budget: _Budget, so_far: int, private: bool
    ) -> int | None:
        """Link ``src``'s content into ``target`` through the object store (``private``:
        copy it there); its size, or ``None`` if it is gone or no longer a regular file."""
        try:
            fd = os.open(src, _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno == errno.ELOOP:  # it became a symlink since it was listed
                return None
            raise _unreadable(budget.cwd, rel, err) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            suffix = ".x" if info.st_mode & 0o111 else ""
            mode = 0o555 if suffix else 0o444
            if private:
                return self._write_copy(fd, rel, target, mode, budget, so_far)
            try:
                digest, size = _hash(fd, budget, so_far)
            except OSError as err:
                raise _unreadable(budget.cwd, rel, err) from None
            name = self.objects / (digest + suffix)
            if self._intact(name, size, mode):
                with contextlib.suppress(FileNotFoundError):
                    os.link(name, target, follow_symlinks=False)
                    return size  # (deduplicated: the content is already stored)
            os.lseek(fd, 0, os.SEEK_SET)
            return self._store_new(fd, rel, target, mode, suffix, budget, so_far)
        finally:
            os.close(fd)

    @staticmethod
    def _intact(name: Path, size: int, mode: int) -> bool:
        """Whether object ``name`` is there as stored (its size, mode and the store's
        mtime); one written through a tree's link is unlinked from the store (the trees
        keep it), so that a new object replaces it. (Against accidents: a job that sets
        all three back on purpose is the engine's own user, who owns the store anyway.)"""
        try:
            info = os.lstat(name)
        except FileNotFoundError:
            return False
        if (
            info.st_size == size
            and info.st_mtime_ns == OBJECT_MTIME_NS
            and stat.S_IMODE(info.st_mode) == mode
        ):
            return True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        return False

    def _write_copy(
        self, fd: int, rel: str, target: Path, mode: int, budget: _Budget, so_far: int
    ) -> int:
        """A private copy of ``fd``'s content at ``target`` (read once, bounded)."""
        out = os.open(target, _NEW_FLAGS, 0o600)
        try:
            size = _pour(fd, out, rel, budget, so_far)
            os.fchmod(out, mode)
            os.fsync(out)  # durable before the job that runs it is visible
        finally:
            os.close(out)
        return size

    def _store_new(
        self, fd: int, rel: str, target: Path, mode: int, suffix: str, budget: _Budget, so_far: int
    ) -> int:
        tmp = self.tmp / f"obj-{os.urandom(8).hex()}"
        out = os.open(tmp, _NEW_FLAGS, 0o600)
        try:
            digest = hashlib.sha256()
            size = _pour(fd, out, rel, budget, so_far, digest)
            os.fchmod(out, mode)
            os.utime(out, ns=(OBJECT_MTIME_NS, OBJECT_MTIME_NS))
            os.fsync(out)  # durable before the job that runs it is visible
        except BaseException:
            os.close(out)
            tmp.unlink()
            raise
        os.close(out)
        name = self.objects / (digest.hexdigest() + suffix)
        try:
            os.link(tmp, name, follow_symlinks=False)
        except FileExistsError:
            # Stored meanwhile (the file changed since it was hashed, to a known content).
            with contextlib.suppress(FileNotFoundError):
                os.link(name, target, follow_symlinks=False)
                tmp.unlink()
                return size
        os.rename(tmp, target)
        return size

    def clone(self, built: Built, deadline: float | None = None, min_free: int = 0) -> Built:
        """Another tree of the same snapshot (one submission's jobs with the same working
        directory read it once): hard links, or private copies of a private tree.

        Args:
            built: The tree to copy.
            deadline: ``time.monotonic()`` by which it must be done (the submission's
                ``[snapshot] timeout``: clones were unbounded, and a client gave up on a
                submission the engine then made).
            min_free: Bytes the state dir's disk must keep free (private copies take
                their whole size: a batch wrote N copies past ``[logs] min_free_mb``).

        Raises:
            SnapshotError: Out of time or of disk space; nothing is left.
        """
        if built.private and min_free:
            try:
                st = os.statvfs(self.root.parent)
            except OSError:
                st = None
            if st is not None and st.f_bavail * st.f_frsize - built.bytes < min_free:
                free = st.f_bavail * st.f_frsize
                raise SnapshotError(
                    f"snapshot of {built.source}: another copy of {_mb(built.bytes)} would take "
                    f"the engine's disk ({free // MB} MiB free) below [logs] min_free_mb = "
                    f"{min_free // MB}; nothing was stored (make room, submit fewer jobs "
                    "at once, or submit with --no-snapshot)"
                )
        tree = Path(tempfile.mkdtemp(prefix="tree-", dir=self.tmp))
        seen = 0
        try:
            stack = [""]  # (a loop, not os.walk's recursion: a deep tree ran out of stack)
            while stack:
                rel = stack.pop()
                with os.scandir(built.tree / rel if rel else built.tree) as entries:
                    items = list(entries)
                for entry in items:
                    seen += 1
                    if deadline is not None and seen % 64 == 0 and time.monotonic() > deadline:
                        raise SnapshotError(
                            f"snapshot of {built.source}: its copies for this submission's "
                            "jobs took longer than [snapshot] timeout; nothing was stored "
                            "(submit fewer jobs at once, or with --no-snapshot)"
                        )
                    child = f"{rel}/{entry.name}" if rel else entry.name
                    if entry.is_dir(follow_symlinks=False):
                        os.mkdir(tree / child, 0o700)
                        stack.append(child)
                    elif entry.is_symlink():
                        os.symlink(os.readlink(entry.path), tree / child)
                    elif built.private:
                        _clone_file(entry.path, tree / child)
                    else:
                        os.link(entry.path, tree / child, follow_symlinks=False)
        except BaseException:
            _remove_tree(tree)
            raise
        return Built(
            tree,
            built.source,
            built.rel_cwd,
            built.commit,
            built.dirty,
            built.files,
            built.bytes,
            built.private,
        )

    def discard(self, built: list[Built]) -> None:
        """Remove trees that did not become a job's, and the objects only they held."""
        for item in built:
            _remove_tree(item.tree)
        self.collect()

    # -- becoming a job's (on the loop: one rename) -------------------------------------------

    def place(self, built: Built, job_id: int) -> dict[str, Any]:
        """Make ``built`` job ``job_id``'s tree; what the job's spec records about it."""
        dest = self.job_tree(job_id)
        os.rename(built.tree, dest)
        return {
            "path": os.path.normpath(os.path.join(dest, built.rel_cwd)),
            "source": built.source,
            "commit": built.commit,
            "dirty": built.dirty,
            "files": built.files,
            "bytes": built.bytes,
        }

    # -- pruning (in a thread) ----------------------------------------------------------------

    def remove_jobs(self, ids: set[int]) -> int:
        """Remove the trees of jobs ``ids`` (history retention), then objects no tree links
        any more; the number of trees removed."""
        removed = 0
        for job_id in ids:
            tree = self.job_tree(job_id)
            if os.path.lexists(tree):
                try:
                    _remove_tree(tree)
                except OSError as err:  # (the others, and the objects, are removed still)
                    log.warning("cannot remove job %d's snapshot %s: %s", job_id, tree, err)
                    continue
                removed += 1
        if removed:
            self.collect()
        return removed

    def freed_by(self, ids: set[int]) -> int:
        """The disk space removing the trees of jobs ``ids`` would give back (blocks, as
        ``du`` counts them: their files' lengths said 1.6 KiB of 301 small files that took
        1.5 MB, tester h197): each file of theirs no other tree (or only the store) would
        still link, and their folders. ``clean`` left the snapshots out of the room it said
        it freed, most of it (tester h156). A file whose ``stat`` fails counts for
        nothing."""
        seen: dict[tuple[int, int], list[int]] = {}  # inode -> [links, size, links here]
        folders_size = 0
        for job_id in ids:
            tree = self.job_tree(job_id)
            if not os.path.isdir(tree) or os.path.islink(tree):
                continue
            # (a loop, not os.walk, which recursed: a job may make its own tree 1,100
            # deep; what lies past MAX_DEPTH, the job's own making, is not counted)
            folders = [(str(tree), 0)]
            while folders:
                folder, depth = folders.pop()
                try:
                    with os.scandir(folder) as found:
                        entries = list(found)
                except OSError:
                    continue
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        folders_size += info.st_blocks * 512
                        if depth < MAX_DEPTH:
                            folders.append((entry.path, depth + 1))
                        continue
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    key = (info.st_dev, info.st_ino)
                    entry_seen = seen.setdefault(key, [info.st_nlink, info.st_blocks * 512, 0])
                    entry_seen[2] += 1
        freed = folders_size
        for links, size, here in seen.values():
            # (an object the store holds keeps one link there: freed when that is all
            # that is left, as collect() removes it; a private copy has none)
            if links - here <= 1:
                freed += size
        return freed

    def tree_ids(self) -> set[int]:
        """The job ids that have a tree in ``jobs/``."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.jobs) as entries:
            return {int(e.name) for e in entries if e.name.isascii() and e.name.isdigit()}
        return set()

    def collect(self) -> int:
        """Remove objects whose link count is 1 (only the store holds them)."""
        gone = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.objects) as entries:
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_nlink == 1:
                        os.unlink(entry.path)
                        gone += 1
                except FileNotFoundError:
                    continue
        return gone


def _pour(fd: int, out: int, rel: str, budget: _Budget, so_far: int, digest: Any = None) -> int:
    """Copy ``fd`` to ``out`` within the budget (hashing it into ``digest`` if given);
    the bytes copied."""
    size = 0
    while True:
        try:
            chunk = os.read(fd, CHUNK)
        except OSError as err:
            raise _unreadable(budget.cwd, rel, err) from None
        if not chunk:
            return size
        size += len(chunk)
        budget.check_size(so_far + size, partial=True)
        budget.check_space(so_far + size)  # (within a file too: one big file is enough)
        if size % (64 * CHUNK) == 0:
            budget.check_time()
        if digest is not None:
            digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(out, view) :]


def _hash(fd: int, budget: _Budget, so_far: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while True:
        chunk = os.read(fd, CHUNK)
        if not chunk:
            return digest.hexdigest(), size
        size += len(chunk)
        budget.check_size(so_far + size, partial=True)
        if size % (64 * CHUNK) == 0:
            budget.check_time()
        digest.update(chunk)


def _clone_file(src: str, target: Path) -> None:
    """``target``: a copy of ``src`` (same mode), sharing its extents where the filesystem
    can (``FICLONE``), else copied in the kernel."""
    fd = os.open(src, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        out = os.open(target, _NEW_FLAGS, 0o600)
        try:
            try:
                fcntl.ioctl(out, _FICLONE, fd)
            except OSError:
                try:
                    left = info.st_size
                    while left > 0 and (done := os.copy_file_range(fd, out, left)):
                        left -= done
                except OSError:  # (a kernel or filesystem without it: read and write)
                    os.lseek(fd, 0, os.SEEK_SET)
                    os.lseek(out, 0, os.SEEK_SET)
                    os.ftruncate(out, 0)
                    while chunk := os.read(fd, CHUNK):
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(out, view) :]
            os.fchmod(out, stat.S_IMODE(info.st_mode))
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FLATTEN_AT = 32  # folders deeper than this are moved up before they are emptied


def _remove_tree(path: Path) -> None:
    """Remove a tree we made, whatever a job did to it: read-only folders, and folders
    as deep as it liked (``shutil.rmtree`` recursed: a job's 1,100-deep tree raised
    RecursionError, and the engine could not start while one lay in ``tmp/``). A loop
    over descriptors, each folder read once, never following a symlink; a folder more
    than :data:`_FLATTEN_AT` deep is first moved up to the top, so neither the
    descriptors held nor any path grows with the depth."""
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    top = os.open(path, _DIR_FLAGS)
    # Each frame: a folder's descriptor, its name, its parent's descriptor, and its
    # subfolders still to remove (None: not read yet).
    stack: list[tuple[int, str, int, list[str] | None]] = [(top, "", -1, None)]
    try:
        while stack:
            fd, name, parent, pending = stack[-1]
            if pending is None:
                pending = _empty_but_folders(fd, top if len(stack) > _FLATTEN_AT else None)
                if not pending and parent < 0:
                    # (the top: folders moved up meanwhile are read on its next turn)
                    pending = _empty_but_folders(fd, None)
                stack[-1] = (fd, name, parent, pending)
            if pending:
                deeper = pending.pop()
                try:
                    child = os.open(deeper, _DIR_FLAGS, dir_fd=fd)
                except PermissionError:
                    os.chmod(deeper, 0o700, dir_fd=fd)
                    child = os.open(deeper, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                stack.append((child, deeper, fd, None))
                continue
            if parent < 0:
                if _empty_but_folders(fd, None):  # (moved up while its last ones went)
                    stack[-1] = (fd, name, parent, None)
                    continue
                break
            stack.pop()
            os.close(fd)
            _retry_writable(parent, lambda p=parent, n=name: os.rmdir(n, dir_fd=p))
    finally:
        for fd, _, _, _ in stack[1:]:
            os.close(fd)
        os.close(top)
    os.rmdir(path)


def _empty_but_folders(fd: int, top: int | None) -> list[str]:
    """Unlink every entry of folder ``fd`` but its subfolders, and return their names;
    with ``top``, move the subfolders up there instead (returning none)."""
    folders: list[str] = []
    with os.scandir(fd) as entries:
        items = list(entries)
    for entry in items:
        if not entry.is_dir(follow_symlinks=False):
            _retry_writable(fd, lambda e=entry.name: os.unlink(e, dir_fd=fd))
        elif top is not None:
            moved = f".flat-{os.urandom(8).hex()}"
            _retry_writable(
                fd,
                lambda e=entry.name, m=moved: os.rename(e, m, src_dir_fd=fd, dst_dir_fd=top),
            )
        else:
            folders.append(entry.name)
    return folders


def _retry_writable(folder: int, action: Any) -> None:
    """``action`` on an entry of ``folder``; again once the folder is writable (a job may
    have made it read-only). A name already gone is no error."""
    try:
        action()
    except FileNotFoundError:
        pass
    except PermissionError:
        os.fchmod(folder, 0o700)
        with contextlib.suppress(FileNotFoundError):
            action()
