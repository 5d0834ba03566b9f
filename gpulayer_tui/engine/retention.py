"""History retention: old finished jobs go, with their timelines and their files.

``gpulayer-tui clean`` (``POST /v1/clean``) removes finished jobs that ended before a time
and/or all but the N that ended last; with ``[history] keep_days`` and/or ``keep_jobs`` the engine
does it by itself at start and every hour. A job's row, its events and its files
(``jobs/ID.log``, a service's ``jobs/ID.K.log``, an older version's ``jobs/ID.exit``) and
its snapshot (``snapshots/jobs/ID/``, then the objects no other snapshot links) go
together; active jobs are never touched, nor finished ones that active jobs depend on (a
restarted engine looks their outcome up), and ids are never given again (the largest is
kept apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import StoreError
from .events import EventBus
from .models import EventKind
from .store import PruneBlocked
from .tasks import cancel_and_wait

if TYPE_CHECKING:
    from .config import HistorySettings
    from .snapshot import SnapshotStore
    from .store import Store

log = logging.getLogger(__name__)

CHUNK = 1000  # jobs deleted per transaction (the writer stays responsive)
EVERY_S = 3600.0  # how often [history] is applied


def _files_of(jobs_dir: Path, ids: set[int]) -> list[Path]:
    """The files of the jobs ``ids`` (names start with ``ID.``), read off the loop."""
    found = []
    with contextlib.suppress(FileNotFoundError), os.scandir(jobs_dir) as entries:
        for entry in entries:
            head = entry.name.split(".", 1)[0]
            if head.isascii() and head.isdigit() and int(head) in ids:
                found.append(Path(entry.path))
    return found


def _largest(jobs_dir: Path, count: int = 3) -> str:
    """The ``count`` largest files of ``jobs_dir``, with their sizes, in words."""
    sizes = []
    with contextlib.suppress(FileNotFoundError), os.scandir(jobs_dir) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    sizes.append((entry.stat(follow_symlinks=False).st_size, entry.path))
    sizes.sort(reverse=True)
    # (not one under half a MiB: "25.log (0 MiB)", a log just removed by that same clean
    # and held open, was named among "the largest": tester h186)
    big = [(size, path) for size, path in sizes[:count] if size >= 2**19]
    return ", ".join(f"{path} ({size / 1024**2:.0f} MiB)" for size, path in big)


def _on_disk(path: Path) -> int:
    """The disk space ``path`` takes (its blocks, as ``du`` counts them; links not
    followed): what removing it frees. Its length said 109 KiB of 9,400 small logs that
    took 37 MB (tester h196)."""
    return path.lstat().st_blocks * 512


def _sizes(paths: list[Path]) -> int:
    """The disk space ``paths`` take (those still there; see :func:`_on_disk`)."""
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += _on_disk(path)
    return total


def _unlink(paths: list[Path]) -> tuple[int, int, list[tuple[Path, str]]]:
    """Remove ``paths``: (how many were removed, the bytes they took, those that could not
    be removed with why). One that cannot be removed (a directory made in a log's place, a
    read-only disk) is passed over: it stopped the whole clean, its job's row deleted and
    its files and those of the chunk's other jobs left on disk, and every later clean too
    (tester h145)."""
    removed = size = 0
    failed: list[tuple[Path, str]] = []
    for path in paths:
        try:
            took = _on_disk(path)
        except OSError:
            took = 0
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as err:
            failed.append((path, err.strerror or str(err)))
            continue
        removed += 1
        size += took
    return removed, size, failed


LEFT_SHOWN = 20
"""Files that could not be removed named in a clean's answer (the rest counted)."""


class _Removed:
    """What a clean removed so far, and what it could not."""

    def __init__(self) -> None:
        self.files = self.trees = self.size = self.tree_bytes = 0
        self.left: list[tuple[Path, str]] = []

    def add(
        self,
        files: int,
        trees: int,
        size: int,
        left: list[tuple[Path, str]],
        tree_bytes: int = 0,
    ) -> None:
        self.files, self.trees, self.size = self.files + files, self.trees + trees, self.size + size
        self.tree_bytes += tree_bytes
        self.left.extend(left)

    @staticmethod
    def ids_of(left: list[tuple[Path, str]]) -> set[int]:
        """The jobs whose files are among ``left``."""
        return {int(path.name.split(".", 1)[0]) for path, _ in left}

    def said(self) -> dict[str, Any]:
        """``left``: the first :data:`LEFT_SHOWN` as ``"PATH: why"``; ``left_count``: all."""
        shown = [f"{path}: {why}" for path, why in self.left[:LEFT_SHOWN]]
        return {"left": shown, "left_count": len(self.left)}


class Retention:
    """Cleans history on demand and on schedule.

    Args:
        store: The database.
        jobs_dir: Where job files are.
        settings: ``[history]``.
        snapshots: The jobs' snapshots (removed with them).
        spared: The finished jobs still needed, kept, each with why: those waiting jobs
            depend on (a restarted engine looks their outcome up; one cleaned away read
            as failed, and cancelled its dependents), and those with a notification
            still to send.
        live: Whether the engine holds a job (a new one's tree is placed before its row
            is committed: never an orphan).
        bus: Where a ``jobs.removed`` event says which jobs went (once their rows are
            deleted): an attached TUI drops them (it kept showing them, and "no job N"
            answered its actions).
    """

    def __init__(
        self,
        store: Store,
        jobs_dir: Path,
        settings: HistorySettings,
        snapshots: SnapshotStore | None = None,
        spared: Callable[[], Mapping[int, str]] = dict,
        live: Callable[[int], bool] = lambda _job_id: False,
        bus: EventBus | None = None,
    ) -> None:
        self._store = store
        self._bus = bus
        self._spared_why = spared
        self._live = live
        self._jobs_dir = jobs_dir
        self._snapshots = snapshots
        self._settings = settings
        self._task: asyncio.Task[None] | None = None
        self._due = asyncio.Event()  # a round is due now (the settings changed)

    def reconfigure(self, settings: HistorySettings) -> None:
        """Use new ``[history]`` settings from now on: a round runs at once when they
        changed (a new ``keep_days`` waited up to an hour, as if not taken)."""
        changed = (settings.keep_days, settings.keep_jobs) != (
            self._settings.keep_days,
            self._settings.keep_jobs,
        )
        self._settings = settings
        if changed:
            self._due.set()

    async def clean(
        self, ended_before: float | None, keep: int | None, by: str = "a clean request"
    ) -> dict[str, Any]:
        """Remove finished jobs that ended before ``ended_before`` and/or all but the ``keep``
        finished ones that ended last; return ``{"jobs": n, "ids": [ids], "files": m, "bytes": f,
        "snapshots": k, "spared": [ids], "database_bytes_freed": b}`` (``f``: the disk
        space the removed files took; ``k``: snapshot trees removed, with the
        objects only they held; ``spared``: jobs that matched but were kept, still needed;
        ``b``: what the database file shrank by, its deleted rows' room given back)."""
        jobs = 0
        # Files of jobs whose rows an earlier clean deleted, killed before it removed them
        # or unable to (recorded with the rows: see Store.files_owed).
        done = await self._owed_files()
        gone: list[int] = []  # (the ids: `clean --json` said how many, not which: h140)
        while True:
            try:
                ids = await self._store.prune(
                    ended_before, keep, CHUNK, frozenset(self._spared_why())
                )
            except PruneBlocked as full:
                # The disk is full, so the rows cannot be deleted: their files go first
                # (what clean is for), then the rows again, in the room that made.
                log.warning(
                    "cleaning history: the database cannot be written (%s); removing the "
                    "files of %d finished jobs first",
                    full,
                    len(full.ids),
                )
                removed = await self._remove_files(full.ids)
                done.add(*removed)
                try:
                    ids = await self._store.prune(
                        ended_before, keep, CHUNK, frozenset(self._spared_why())
                    )
                except PruneBlocked as still:
                    biggest = await asyncio.to_thread(_largest, self._jobs_dir)
                    raise StoreError(
                        f"the database cannot be written ({still}): {removed[0]} file(s) and "
                        f"{removed[1]} snapshot(s) of {len(full.ids)} finished job(s) were "
                        "removed, their rows stay; the ends of jobs that finished since are "
                        "not recorded, so clean cannot see their files. Free space on that "
                        "disk by hand" + (f"; the largest job files: {biggest}" if biggest else "")
                    ) from None
            if not ids:
                break
            jobs += len(ids)
            gone.extend(ids)
            if self._bus is not None:
                self._bus.publish(self._bus.make(EventKind.REMOVED, None, {"ids": list(ids)}))
            removed = await self._remove_files(ids)
            done.add(*removed)
            # (those it could not remove stay owed: tried again at the next clean)
            left = _Removed.ids_of(removed[3])
            await self._store.files_removed([i for i in ids if i not in left])
            if keep is not None and ended_before is None and len(ids) < CHUNK:
                break
        done.trees += await self._orphaned_trees()
        files, trees, size = done.files, done.trees, done.size
        spared_now = self._spared_why()
        if not jobs and not files and self._store.failure:
            # Nothing recorded as finished could go, and nothing can be recorded: a job
            # that filled the disk may have ended unrecorded (its row still says running).
            raise await self._nothing_seen("nothing was cleaned")
        if jobs:
            log.info(
                "history cleaned (%s): %d finished jobs, %d files (%d bytes) and %d "
                "snapshots removed",
                by,
                jobs,
                files,
                size,
                trees,
            )
        if done.left:
            log.warning(
                "cleaning history (%s): %d file(s) could not be removed (tried again at the "
                "next clean): %s",
                by,
                len(done.left),
                "; ".join(done.said()["left"]),
            )
        # The rows' room goes back to the disk too (it stayed in the file for good).
        freed = await self._store.give_back_space() if jobs else 0
        # (said, not only kept: `clean --keep 0` that left a job in the history, with no
        # word why, read as a bug)
        spared = await self._store.finished_past(frozenset(spared_now), ended_before, keep)
        return {
            "jobs": jobs,
            "ids": sorted(gone),
            "files": files,
            "bytes": size,
            "snapshots": trees,
            # (what the snapshots gave back: left out of "bytes", most of it: h156)
            "snapshot_bytes": done.tree_bytes,
            "spared": spared,
            "spared_why": {str(i): spared_now[i] for i in spared},
            "database_bytes_freed": freed,
        } | done.said()

    async def preview(self, ended_before: float | None, keep: int | None) -> dict[str, Any]:
        """What :meth:`clean` with the same arguments would remove now, removing nothing:
        ``{"dry_run": true, "jobs": n, "ids": [ids], "files": m, "bytes": b, "snapshots":
        k, "spared": [ids]}`` (``b``: what the files take; snapshot objects other trees
        share are not counted)."""
        spared_why = self._spared_why()
        spared_now = frozenset(spared_why)
        ids = await self._store.prunable(ended_before, keep, spared_now)
        if not ids and self._store.failure:
            # (as clean says it: "would remove 0", exit 0, while clean itself said why
            # nothing could go: tester h66)
            raise await self._nothing_seen("nothing would be cleaned")
        paths = await asyncio.to_thread(_files_of, self._jobs_dir, set(ids)) if ids else []
        size = await asyncio.to_thread(_sizes, paths) if paths else 0
        trees = tree_bytes = 0
        if self._snapshots is not None and ids:
            held = await asyncio.to_thread(self._snapshots.tree_ids) & set(ids)
            trees = len(held)
            tree_bytes = await asyncio.to_thread(self._snapshots.freed_by, held)
        spared = await self._store.finished_past(spared_now, ended_before, keep)
        preview: dict[str, Any] = {}
        if self._store.failure:
            # What it found is not all there is: a job that ended since the database
            # failed (the one that filled the disk, often) is not recorded as finished,
            # and the preview left it out without a word (tester h123).
            preview["unrecorded"] = str(await self._nothing_seen("not counted"))
        return preview | {
            "dry_run": True,
            "jobs": len(ids),
            "ids": ids,
            "files": len(paths),
            "bytes": size,
            "snapshots": trees,
            "snapshot_bytes": tree_bytes,
            "spared": spared,
            "spared_why": {str(i): spared_why[i] for i in spared},
        }

    async def _nothing_seen(self, said: str) -> StoreError:
        """Why a clean finds nothing while the database cannot be written, naming what
        holds the disk."""
        biggest = await asyncio.to_thread(_largest, self._jobs_dir)
        return StoreError(
            f"{said}: {self._store.failure}, so the ends of jobs that finished meanwhile are "
            "not recorded yet and clean cannot see them. Free space on that disk by hand"
            + (f"; the largest job files: {biggest}" if biggest else "")
        )

    async def _orphaned_trees(self) -> int:
        """Remove snapshot trees whose job has no row any more: one that could not be
        removed with its job (a file a job made immutable, then freed) was left for ever,
        nothing pointing at it."""
        if self._snapshots is None:
            return 0
        trees = await asyncio.to_thread(self._snapshots.tree_ids)
        rows = await self._store.existing(trees)
        gone = {job_id for job_id in trees - rows if not self._live(job_id)}
        if not gone:
            return 0
        return await asyncio.to_thread(self._snapshots.remove_jobs, gone)

    async def _owed_files(self) -> _Removed:
        """Remove the files still owed (see :meth:`.Store.files_owed`)."""
        done = _Removed()
        owed = await self._store.files_owed()
        if not owed:
            return done
        done.add(*await self._remove_files(owed))
        left = _Removed.ids_of(done.left)
        await self._store.files_removed([i for i in owed if i not in left])
        if done.files:
            log.info("cleaning history: removed %d file(s) an earlier clean left", done.files)
        return done

    async def _remove_files(
        self, ids: list[int]
    ) -> tuple[int, int, int, list[tuple[Path, str]], int]:
        """Remove the files and snapshot trees of jobs ``ids``: (files, trees, the bytes
        the files took, the files that could not be removed with why, the bytes the
        trees gave back)."""
        paths = await asyncio.to_thread(_files_of, self._jobs_dir, set(ids))
        files, size, left = await asyncio.to_thread(_unlink, paths)
        trees = tree_bytes = 0
        if self._snapshots is not None:
            tree_bytes = await asyncio.to_thread(self._snapshots.freed_by, set(ids))
            trees = await asyncio.to_thread(self._snapshots.remove_jobs, set(ids))
        return files, trees, size, left, tree_bytes

    def start(self) -> None:
        """Apply ``[history] keep_days`` and ``keep_jobs`` now, every hour, and at once
        when a reload changes them."""
        self._task = asyncio.create_task(self._every_hour(), name="history-retention")

    async def _every_hour(self) -> None:
        try:  # (what a clean killed before it unlinked left: at start, [history] or not)
            owed = await self._owed_files()
            if owed.left:
                log.warning(
                    "cleaning history: %d file(s) of cleaned jobs could not be removed: %s",
                    len(owed.left),
                    "; ".join(owed.said()["left"]),
                )
        except Exception:
            log.exception("removing the files an interrupted clean left failed")
        while True:
            days, count = self._settings.keep_days, self._settings.keep_jobs
            try:
                if days is not None:
                    await self.clean(
                        time.time() - days * 86400, None, f"[history] keep_days = {days:g}"
                    )
                if count is not None:
                    await self.clean(None, count, f"[history] keep_jobs = {count}")
            except Exception:  # a failed round is tried again at the next
                log.exception("cleaning history failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EVERY_S):
                    await self._due.wait()
            self._due.clear()

    async def stop(self) -> None:
        """Stop the hourly round."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
