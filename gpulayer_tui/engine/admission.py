"""Admission: a submission is validated whole, then stored and answered in one commit.

Every spec of a request is parsed (pydantic), resolved against the domains (unknown domain,
contradictory pins, quarantined pins) and its dependencies (they must exist); any error
refuses the whole request with nothing stored. Then each job gets the next id, is queued
for commit ``pending`` and gets its first verdict (over capacity, a failed dependency, or
the queue), one scheduling pass runs, and the answer waits for the commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..fields import FieldError, blank_label
from .disk import DiskSpace
from .domain import plural
from .errors import KeyReused, KeySpent, Overloaded, SpecError, StoreError
from .fairness import owner_of, user_label
from .jobbook import ActiveJob, JobBook
from .models import Job, JobKind
from .snapshot import Built, SnapshotError, SnapshotStore, files_mode
from .spec import Dependency, JobSpec, SnapshotInfo, env_exec_bytes, exec_bytes, parse_spec

if TYPE_CHECKING:
    from .config import LimitsSettings, SnapshotSettings
    from .health import DomainOps
    from .jobqueue import JobQueue, ResolvedDep
    from .scheduler import Request, Scheduler, Verdict
    from .store import Store

Cancel = Callable[[ActiveJob, str], None]
LAUNCH_WAIT_S = 5.0  # at most this long does a submission wait for its starts
RECENT_KEYS = 10_000  # idempotency keys remembered in memory (older ones: from SQLite)


class Admission:
    """Takes submissions.

    Args:
        book: Where new jobs are created.
        scheduler: Resolves what each job needs.
        queue: Decides each job's first verdict and runs the pass.
        domain_ops: Refuses work pinned only to quarantined domains.
        store: Answers wait for the commit; no work is taken while writes fail.
        limits: ``[limits]`` (``active_jobs``).
        cancel: Stops a job that was admitted but could not be recorded.
        snapshots: Where ``snapshot`` submissions are copied (none: refused).
        snapshot_settings: ``[snapshot]`` (``default``, ``max_mb``, ``timeout``).
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        queue: JobQueue,
        domain_ops: DomainOps,
        store: Store,
        limits: LimitsSettings,
        cancel: Cancel,
        snapshots: SnapshotStore | None = None,
        snapshot_settings: SnapshotSettings | None = None,
        disk: DiskSpace | None = None,
    ) -> None:
        self._book = book
        self._scheduler = scheduler
        self._queue = queue
        self._domain_ops = domain_ops
        self._store = store
        self._limits = limits
        self._cancel = cancel
        self.clusters: list[str] = []  # the configured clusters (the engine keeps it current)
        self._snapshots = snapshots
        self._snapshot_settings = snapshot_settings
        self._disk = disk  # its floor holds for snapshots too (they fill the same disk)
        # Idempotency keys of recent submissions: in flight (a pending future) or just done.
        self._keys: dict[tuple[int | None, str], asyncio.Future[list[int]]] = {}
        self._digests: dict[tuple[int | None, str], str] = {}  # what each of those asked

    def reconfigure(self, limits: LimitsSettings, snapshot: SnapshotSettings | None = None) -> None:
        """Use new ``[limits]`` (and ``[snapshot]``) from now on."""
        self._limits = limits
        if snapshot is not None:
            self._snapshot_settings = snapshot

    async def submit_many(
        self,
        items: list[Any],
        owner_uid: int | None = None,
        key: str | None = None,
        digest: str | None = None,
    ) -> list[Job]:
        """Submit several jobs at once: all are validated first, then stored in one commit.

        Each job comes back ``running``, ``queued`` (with the reason), or ``failed`` with
        ``over_capacity`` (the row stays in history).

        Args:
            items: The specs.
            owner_uid: Who submits (``SO_PEERCRED``).
            key: An idempotency key: a submission with a key this user already used
                (while it is being handled, or stored, even by an earlier engine run)
                returns the jobs the first one made, now, and creates none. The same
                request only: the key reused for other items is refused (``KeyReused``).
            digest: What the request asked for (the API's: its body's digest, cheaper than
                :func:`request_digest` of 500 items with their environments, ~7 ms).

        Raises:
            SpecError: Naming the first invalid item by index; nothing is stored.
            KeyReused: ``key`` was used for a different request; nothing is stored.
            Overloaded: ``[limits] active_jobs`` would be exceeded; nothing is stored.
            StoreError: The database cannot be written: the engine refuses new work.
        """
        if key is None:
            return await self._submit(items, owner_uid, None)
        slot = (owner_uid, key)
        digest = digest or request_digest(items)
        first = self._keys.get(slot)
        if first is not None:  # the same submission is being handled, or was just now
            _same_request(key, self._digests.get(slot), digest)
            return await self._current(await asyncio.shield(first), key)
        stored, stored_digest = await self._store.jobs_with_key(key, owner_uid)
        if stored:
            _same_request(key, stored_digest, digest)
            return await self._current([job.id for job in stored], key)
        spent, spent_digest = await self._store.spent_key(key, owner_uid)
        if spent:
            _same_request(key, spent_digest, digest)
            raise _spent(key)
        if slot in self._keys:  # (another retry got here during that read)
            _same_request(key, self._digests.get(slot), digest)
            return await self._current(await asyncio.shield(self._keys[slot]), key)
        made: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._keys[slot] = made
        self._digests[slot] = digest
        try:
            jobs = await self._submit(items, owner_uid, key, digest)
        except BaseException as err:
            del self._keys[slot]  # nothing was made: a retry may try again
            del self._digests[slot]
            made.set_exception(err)
            made.exception()  # (retrieved: a lone attempt has no waiter)
            raise
        made.set_result([job.id for job in jobs])
        while len(self._keys) > RECENT_KEYS:  # stored ones are found in SQLite
            oldest = next(iter(self._keys))
            del self._keys[oldest]
            self._digests.pop(oldest, None)
        return jobs

    async def resubmit(
        self, data: dict[str, Any], owner_uid: int | None, restart_of: int, note: str = ""
    ) -> Job:
        """Submit an ended job's spec again as a new job whose ``restart_of`` names it
        (the engine's to set: a submission that names one is refused, or anyone could
        forge a job's lineage); ``note`` is said in its submission's timeline entry.

        Raises:
            SpecError, Overloaded, StoreError: As :meth:`submit_many`.
        """
        return (await self._submit([data], owner_uid, None, restart_of=restart_of, note=note))[0]

    async def _current(self, ids: list[int], key: str) -> list[Job]:
        """The jobs ``ids`` as they are now.

        Raises:
            KeySpent: One of them (or every one) was cleaned from the history since: the
                answer can no longer be the one job per item the first one gave (a partial
                clean answered with fewer, and no word: tester h135).
        """
        out = []
        for job_id in ids:
            live = self._book.live(job_id)
            job = live.job if live is not None else await self._store.get_job(job_id)
            if job is not None:  # (a job cleaned from history since is left out)
                out.append(job)
        if len(out) < len(ids):
            kept = [job.id for job in out]
            raise _spent(key, [i for i in ids if i not in kept], kept)
        return out

    async def _submit(
        self,
        items: list[Any],
        owner_uid: int | None,
        key: str | None,
        digest: str | None = None,
        restart_of: int | None = None,
        note: str = "",
    ) -> list[Job]:
        self._check_writable()
        self._check_room(len(items))
        prepared: list[tuple[JobSpec, Request]] = []
        envs: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        in_batch: list[list[tuple[int, bool]]] = []  # each job's earlier jobs of this request
        for index, data in enumerate(items):
            try:
                data, earlier = _batch_dependencies(data, index)
                for other, any_exit in earlier:
                    _check_waitable(prepared[other][0], other, any_exit)
                in_batch.append(earlier)
                spec = parse_spec(data)
                if spec.restart_of is not None:
                    raise SpecError(
                        "restart_of: the engine sets it when it restarts a job "
                        "(gpulayer-tui restart ID); a submission may not name one",
                        "restart_of",
                    )
                if restart_of is not None:
                    spec = spec.model_copy(update={"restart_of": restart_of})
                if spec.cluster is not None and spec.cluster not in self.clusters:
                    # (with none: where one is set up, the next step: tester h131)
                    known = ", ".join(self.clusters) or (
                        f"none configured: [clusters.{spec.cluster}] in config.toml sets one up"
                    )
                    raise SpecError(
                        f"cluster: unknown cluster '{spec.cluster}' (known: {known})", "cluster"
                    )
                if spec.cluster is not None and spec.vram_gb is not None:
                    # (Here, not in the spec's model: jobs stored before still load.)
                    raise SpecError(
                        "vram_gb: Slurm places a cluster job by its GPU count and has no VRAM "
                        "request (leave vram_gb out, or pick a partition whose GPUs are big "
                        "enough)",
                        "vram_gb",
                    )
                _check_arg_max(spec)
                _check_labels(data)
                most = self._queue.limits.of(owner_of(owner_uid)).max_priority
                if most is not None and most < 0 and "priority" not in spec.model_fields_set:
                    # (no priority asked for: the most the user may have, not a default
                    # of 0 that refused every plain submission of theirs)
                    spec = spec.model_copy(update={"priority": most})
                self._queue.limits.check_priority(owner_of(owner_uid), spec.priority)
                request = self._scheduler.request_for(spec)
                if restart_of is not None:
                    _refuse_restart_over_capacity(
                        restart_of, self._scheduler.capacity_verdict(request)
                    )
                self._domain_ops.refuse_quarantined_pins(spec.pinned_domains)
            except SpecError as err:
                prefix = f"job {index + 1} of {len(items)}: " if len(items) > 1 else ""
                raise SpecError(f"{prefix}{err}", err.field) from None
            prepared.append((_shared_env(spec, envs), request))
        specs = [spec for spec, _ in prepared]
        deps = await self._queue.resolve_all(specs)
        # Snapshots are made before anything is stored (a refusal stores nothing).
        built = await self._build_snapshots(specs, owner_uid)
        try:
            if built:
                # A dependency seen running may have ended while the copies were made.
                deps = await self._queue.resolve_all(specs)
            # Again, with no await before the admission: other submissions ran meanwhile.
            self._check_writable()
            self._check_room(len(items))
            self._check_user_queue(owner_uid, len(items))
        except BaseException:
            await self._discard(list(built.values()))
            raise
        if built:
            specs = await self._place_snapshots(specs, built)
        acts: list[ActiveJob] = []
        for spec, (_, request), job_deps, earlier in zip(
            specs, prepared, deps, in_batch, strict=True
        ):
            if earlier:
                # Waits for jobs of this very request: their ids are known now.
                spec = spec.model_copy(
                    update={
                        "depends_on": [
                            *spec.depends_on,
                            *(Dependency(job=acts[k].job.id, any_exit=a) for k, a in earlier),
                        ]
                    }
                )
                job_deps = [*job_deps, *(_batch_dep(acts[k], a) for k, a in earlier)]
            act = self._book.create(
                name=spec.default_name(),
                kind=JobKind.SERVICE if spec.is_service else JobKind.COMMAND,
                spec_json=spec.stored(),
                spec=spec,
                request=request,
                priority=spec.priority,
                owner_uid=owner_uid,
                submit_key=key,
                submit_digest=digest,
                note=note,
            )
            self._queue.enqueue(act, job_deps)
            acts.append(act)
        self._queue.schedule()
        try:
            await self._store.flush()
        except StoreError as err:
            # Refused means not run: jobs that could not be recorded are cancelled (their
            # rows are kept for the store's retry, so history shows them once it writes).
            for act in acts:
                if act.job.id in self._book:
                    self._cancel(act, f"not recorded: {err}")
            raise StoreError(f"the engine refuses new work: {err}") from None
        # The answer says what runs, with its pid: wait (briefly) for the launches.
        await self._book.wait_started([act.job.id for act in acts], LAUNCH_WAIT_S)
        return [act.job for act in acts]

    def _wanted(self, spec: JobSpec, owner_uid: int | None) -> bool:
        """Does ``spec`` get a snapshot? (``[snapshot] default`` when it does not say.)"""
        if isinstance(spec.snapshot, SnapshotInfo):
            raise SpecError(
                "snapshot: give true or false; where the copy lies is the engine's to record",
                "snapshot",
            )
        me = os.geteuid()
        other = owner_uid is not None and owner_uid != me
        settings = self._snapshot_settings
        wanted = spec.snapshot if spec.snapshot is not None else bool(settings and settings.default)
        if not wanted or (spec.snapshot is None and other):
            return False  # ([snapshot] default applies to the engine's user only)
        if other:
            # The engine would read the directory with its own rights, not the submitter's.
            raise SpecError(
                f"snapshot: only the engine's user (uid {me}) may submit with a snapshot; "
                f"uid {owner_uid} may not (see docs/security.md)",
                "snapshot",
            )
        if spec.cwd is None:
            raise SpecError("snapshot: needs cwd (the directory to copy)", "snapshot")
        if self._snapshots is None or settings is None:
            raise SpecError("snapshot: this engine keeps no snapshots", "snapshot")
        return True

    async def _build_snapshots(
        self, specs: list[JobSpec], owner_uid: int | None
    ) -> dict[int, Built]:
        """Each wanted snapshot, built in a thread under ``[snapshot] timeout``; jobs of
        one submission with the same cwd share one reading (their trees are linked)."""
        built: dict[int, Built] = {}
        by_cwd: dict[str, Built] = {}
        # One deadline for the submission's snapshots, copies included: they were
        # unbounded, and a client gave up on a submission the engine made later (h49).
        deadline: float | None = None
        try:
            for index, spec in enumerate(specs):
                try:
                    if not self._wanted(spec, owner_uid):
                        continue
                    assert self._snapshots is not None and self._snapshot_settings is not None
                    assert spec.cwd is not None
                    store, settings = self._snapshots, self._snapshot_settings
                    floor = self._disk.min_free_mb * 1024 * 1024 if self._disk else 0
                    if deadline is None:
                        deadline = time.monotonic() + settings.timeout
                    first = by_cwd.get(spec.cwd)
                    if first is not None:
                        try:
                            built[index] = await asyncio.to_thread(
                                store.clone, first, deadline, floor
                            )
                        except OSError as err:
                            raise SnapshotError(
                                f"snapshot of {spec.cwd} could not be copied for this job: "
                                f"{err.strerror or err}; nothing was stored"
                            ) from None
                        continue
                    try:
                        made = await asyncio.wait_for(
                            asyncio.to_thread(
                                store.build,
                                spec.cwd,
                                settings.max_mb * 1024 * 1024,
                                max(0.1, deadline - time.monotonic()),
                                files_mode(settings.files) == "private",
                                floor,
                                settings.timeout,
                            ),
                            max(0.1, deadline - time.monotonic()) + 10,  # (the thread keeps
                            # its own deadline)
                        )
                    except TimeoutError:
                        raise SnapshotError(
                            f"snapshot of {spec.cwd} took longer than [snapshot] timeout = "
                            f"{settings.timeout:g} s; nothing was stored"
                        ) from None
                    except OSError as err:
                        raise SnapshotError(
                            f"snapshot of {spec.cwd} failed: {err.strerror or err}; nothing "
                            "was stored"
                        ) from None
                    built[index] = by_cwd[spec.cwd] = made
                except SpecError as err:
                    prefix = f"job {index + 1} of {len(specs)}: " if len(specs) > 1 else ""
                    raise SpecError(f"{prefix}{err}", err.field) from None
        except BaseException:
            await self._discard(list(built.values()))
            raise
        finally:
            if self._disk is not None and by_cwd:
                self._disk.forget()  # (the next pass reads the space the copies took)
        return built

    async def _place_snapshots(
        self, specs: list[JobSpec], built: dict[int, Built]
    ) -> list[JobSpec]:
        """Give each built tree to the job it is for (the ids ``create`` will give next)
        and record it in that job's spec. Nothing here awaits unless it fails (a rename
        each, on the loop), so no other submission takes those ids first."""
        assert self._snapshots is not None
        first = self._book.next_id
        placed: list[int] = []
        out = list(specs)
        try:
            for index, made in built.items():
                info = self._snapshots.place(made, first + index)
                placed.append(first + index)
                out[index] = specs[index].model_copy(update={"snapshot": SnapshotInfo(**info)})
        except OSError as err:
            left = [b for i, b in built.items() if first + i not in placed]
            await self._discard(left)
            await asyncio.to_thread(self._snapshots.remove_jobs, set(placed))
            raise SnapshotError(
                f"snapshot could not be stored: {err.strerror or err}; nothing was stored"
            ) from None
        return out

    async def _discard(self, built: list[Built]) -> None:
        if built and self._snapshots is not None:
            await asyncio.to_thread(self._snapshots.discard, built)

    def _check_writable(self) -> None:
        if self._store.failure:
            raise StoreError(f"the engine refuses new work: {self._store.failure}")

    def _check_user_queue(self, owner_uid: int | None, count: int) -> None:
        uid = owner_of(owner_uid)
        limits = self._queue.limits
        most = limits.of(uid).max_queued
        if most is None:
            return
        waiting = self._queue.waiting_of(uid)
        if waiting + count > most:
            raise Overloaded(
                f"user {user_label(uid)} has {plural(waiting, 'job')} waiting; "
                f"{count} more would pass "
                f"{most} ({limits.where(uid, 'max_queued')} max_queued); nothing was stored"
            )

    def _check_room(self, count: int) -> None:
        limit = self._limits.active_jobs
        active = len(self._book)
        if active + count > limit:
            # (while nothing starts, "retry when jobs have ended" waits on what will not
            # come by itself: tester h156)
            closed = self._queue.closed()
            then = (
                f"nothing starts now ({closed}): retry once it does and jobs have ended"
                if closed
                else "retry when jobs have ended"
            )
            raise Overloaded(
                f"too many active jobs: {active} pending, queued or running, "
                f"{count} more would pass the limit of {limit} ([limits] active_jobs); "
                f"nothing was stored; {then}"
            )


def _batch_dependencies(data: Any, index: int) -> tuple[Any, list[tuple[int, bool]]]:
    """Take a request's ``job``-th spec's dependencies on earlier jobs of the same request
    (``{"batch": K}``, K counted from 0; their ids are not known before it is admitted)
    out of its ``depends_on``: ``(the spec without them, [(K, any_exit)])``.

    Raises:
        SpecError: One that is not an earlier job of the request, or not of that shape.
    """
    if not isinstance(data, dict) or not isinstance(data.get("depends_on"), list):
        return data, []
    kept: list[Any] = []
    earlier: list[tuple[int, bool]] = []
    for n, dep in enumerate(data["depends_on"]):
        if not (isinstance(dep, dict) and "batch" in dep):
            kept.append(dep)
            continue
        where = f"depends_on.{n}"
        if set(dep) - {"batch", "any_exit"}:
            raise SpecError(
                f'{where}: a dependency on a job of this request is {{"batch": K, '
                '"any_exit"?: true|false} (K: its place in the request, from 0)',
                "depends_on",
            )
        other, any_exit = dep["batch"], dep.get("any_exit", False)
        if not isinstance(any_exit, bool):
            raise SpecError(f"{where}: any_exit must be true or false", "depends_on")
        if isinstance(other, bool) or not isinstance(other, int) or not 0 <= other < index:
            shown = json.dumps(other)[:40]
            said = (
                "a job of a request may wait only for jobs before it in the request"
                if index == 0
                # (the error's prefix counts jobs from 1: "job 3 of 3" is batch 2; h84
                # read the two numbers as one)
                else f"batch must name a job before it in the request, counted from 0 "
                f"(job 1 is batch 0): 0 to {index - 1}"
            )
            raise SpecError(f"{where}: {said}, not {shown}", "depends_on")
        said_before = next((was for k, was in earlier if k == other), None)
        if said_before is None:
            earlier.append((other, any_exit))
        elif said_before != any_exit:
            # (as for ids, JobSpec's check: one of the two was kept, and the job was
            # cancelled when batch K failed, though it had asked to run whatever its end)
            raise SpecError(
                f"{where}: batch {other} is named twice, once to run whatever its outcome "
                "(any_exit) and once only if it completes",
                "depends_on",
            )
    return {**data, "depends_on": kept}, earlier


def _check_waitable(earlier: JobSpec, other: int, any_exit: bool) -> None:
    """Refuse to wait for the completion of a service that never completes (as for a job
    by id: see ``JobQueue.resolve_all``)."""
    if (
        not any_exit
        and earlier.is_service
        and earlier.restart_policy == "always"
        and earlier.max_restarts is None
    ):
        raise SpecError(
            f"depends_on: batch {other} is a service that restarts always: it never "
            "completes, so this job could only be cancelled (any_exit runs it once the "
            "service ends)",
            "depends_on",
        )


def _batch_dep(earlier: ActiveJob, any_exit: bool) -> ResolvedDep:
    """The dependency on a job created just before in the same request: waited for while
    it is active (one that failed over capacity at once is an ended one)."""
    status = earlier.job.status
    return (earlier.job.id, any_exit, None if status.is_active else status)


def request_digest(items: list[Any]) -> str:
    """What a submission asked for, as a short digest (its items as canonical JSON)."""
    text = json.dumps(items, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids[:5]) + (", ..." if len(ids) > 5 else "")


def _spent(key: str, ids: list[int] | None = None, kept: list[int] | None = None) -> KeySpent:
    """A retry of a submission whose jobs (``ids``; ``kept``: the others, still there)
    were cleaned from the history since."""
    which = f" ({_ids(ids)})" if ids else ""
    rest = f"; jobs {_ids(kept)} of it are still there" if kept else ""
    whose = "some of whose jobs" if kept else "whose jobs"
    return KeySpent(
        f"Idempotency-Key {key!r} was used already, by a submission {whose}{which} were "
        f"removed from the history since (clean){rest}; nothing was stored (send a new key "
        "for a new submission)",
        "Idempotency-Key",
    )


def _same_request(key: str, first: str | None, digest: str) -> None:
    """Refuse ``key`` reused for another request (``first`` is ``None`` for submissions
    stored before digests were kept: those are taken as retries)."""
    if first is not None and first != digest:
        raise KeyReused(
            f"Idempotency-Key {key!r} was used for a different request; nothing was "
            "stored (send a new key for a new submission)",
            "Idempotency-Key",
        )


def _refuse_restart_over_capacity(job_id: int, verdict: Verdict) -> None:
    """A restart that could never run on this machine as it is now (its job failed over
    capacity, and nothing grew since) is refused: it made a new job that failed at once,
    a junk row in the history, as a restart whose dependency failed is refused (tester
    h192). One the machine can run now (a GPU back, a config that adds slots) is made.

    Raises:
        SpecError: Saying why, and what to do instead.
    """
    if verdict.possible is False:
        raise SpecError(
            f"job {job_id} would fail again at once, over capacity: {verdict.message} "
            f"(submit --like {job_id} with a request this machine can run)",
            "job",
        )


def _check_labels(data: Any) -> None:
    """A name or project given that shows nothing is refused (one left out is named by
    its program; a blank one looked like a job with no name, or spoofed another's).

    Raises:
        SpecError: Naming the field.
    """
    if not isinstance(data, dict):
        return
    for field in ("name", "project"):
        value = data.get(field)
        if isinstance(value, str):
            try:
                blank_label(field, value)
            except FieldError as err:
                raise SpecError(str(err), field) from None


_ENGINE_ENV_BYTES: list[int] = []  # the engine's own environment's cost, read once


def _shared_env(spec: JobSpec, envs: dict[tuple[tuple[str, str], ...], dict[str, str]]) -> JobSpec:
    """``spec`` with its environment the same dict as an equal one of the batch before it.

    A batch's jobs mostly share one environment (the shell's, sent once): validated, each
    had a copy of its own, kept while it waited, and a queue of 20,000 held 200 MB of them
    (tester h76). Shared, an environment is never changed in place (a job's spec is
    replaced whole, never edited).
    """
    if not spec.env:
        return spec
    shared = envs.setdefault(tuple(spec.env.items()), spec.env)
    return spec if shared is spec.env else spec.model_copy(update={"env": shared})


def _check_arg_max(spec: JobSpec) -> None:
    """Refuse a job whose command and environment together are more than Linux passes a
    program (``ARG_MAX``): it could only fail at launch, "Argument list too long", after
    being stored. The engine's own environment (the job's starts from it) counts too."""
    if not _ENGINE_ENV_BYTES:
        _ENGINE_ENV_BYTES.append(exec_bytes(f"{k}={v}" for k, v in os.environ.items()))
    argv = spec.command if spec.command is not None else ["sh", "-c", spec.shell or ""]
    own = exec_bytes(argv) + env_exec_bytes(spec.env)
    limit = os.sysconf("SC_ARG_MAX") - 4096  # (room for the variables the engine adds)
    if own + _ENGINE_ENV_BYTES[0] > limit:
        words = "command" if spec.command is not None else "shell"
        field = "env" if exec_bytes(argv) < own / 2 else words
        raise SpecError(
            f"{field}: the command and its environment are {own} bytes together (with the "
            f"engine's own environment, {own + _ENGINE_ENV_BYTES[0]}); Linux passes a "
            f"program at most {limit + 4096} (ARG_MAX), of which the job may have "
            f"{limit - _ENGINE_ENV_BYTES[0]} (the rest is the engine's own environment and "
            "the variables it adds)",
            field,
        )
