"""Reading jobs: the live record of an active job, the stored one of the rest.

Active jobs are read from the job book (their row in SQLite may be a commit behind);
history from SQLite. A job and its timeline are read in one step, so the timeline always
includes the transition the job shows.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..wire import JobJSON, JobRowJSON, UsageJSON, UsageSummaryJSON
from .errors import SpecError, UnknownJob
from .jobbook import JobBook
from .models import Job, JobKind, JobQuery, JobStatus
from .usage import UsageRecorder

if TYPE_CHECKING:
    from .executor import Executor
    from .store import Store


_Rows = list[JobRowJSON]  # (``list`` is a method's name inside JobReader)


class JobReader:
    """Answers questions about jobs.

    Args:
        book: Active and just-ended jobs.
        store: History.
        executor: Where logs are.
        usage: What running jobs use of their GPUs (finished jobs': the store).
    """

    def __init__(
        self, book: JobBook, store: Store, executor: Executor, usage: UsageRecorder
    ) -> None:
        self._book = book
        self._store = store
        self._executor = executor
        self._usage = usage

    async def get(self, job_id: int) -> Job:
        """One job: the live record if active, else the stored one.

        Raises:
            UnknownJob: No such id.
        """
        live = self._book.live(job_id)
        if live is not None:
            return live.job
        job = await self._store.get_job(job_id)
        if job is None:
            raise UnknownJob(job_id, cleaned=job_id < self._book.next_id)
        return job

    async def detail(self, job_id: int) -> tuple[JobJSON, list[dict[str, Any]]]:
        """One job and its timeline, read together: the timeline includes every transition
        the job shows, even one whose commit is still on its way.

        Raises:
            UnknownJob: No such id.
        """
        live = self._book.live(job_id)
        if live is not None:
            # No await between the snapshot and the timeline's pending part.
            snapshot = live.job.to_json()
            events = self._store.job_events(job_id)
            usage = self._usage.live(job_id)
            if usage is not None:
                snapshot["usage"] = usage.summary()
                return snapshot, await events
            summary = await self._usage_summary(job_id)  # it just ended
            if summary is not None:
                snapshot["usage"] = summary
            return snapshot, await events
        job = await self.get(job_id)
        whole = job.to_json()
        summary = await self._usage_summary(job_id)
        if summary is not None:
            whole["usage"] = summary
        return whole, await self._store.job_events(job_id)

    async def _usage_summary(self, job_id: int) -> UsageSummaryJSON | None:
        ending = self._usage.ending(job_id)  # (ended, its record's write on its way)
        if ending is not None:
            return ending["summary"]
        return await self._store.usage_summary(job_id)

    async def usage(self, job_id: int) -> UsageJSON:
        """What a job used of its GPUs: its summary and per-GPU series, live while it
        runs; ``summary`` is ``None`` for a job never seen holding a GPU while running.

        Raises:
            UnknownJob: No such id.
        """
        live = self._usage.live(job_id)
        if live is not None:
            return live.to_json()
        ending = self._usage.ending(job_id)
        if ending is not None:
            return ending
        records = await self._store.usage([job_id])
        if records:
            return records[0]
        await self.get(job_id)  # UnknownJob for an id that never was
        return {"job": job_id, "summary": None, "series": []}

    async def list(
        self, statuses: list[str] | None = None, limit: int = 1000, before_id: int | None = None
    ) -> list[Job]:
        """Jobs newest first; active rows reflect the live state.

        Raises:
            SpecError: For an unknown status name.
        """
        for status in statuses or []:
            if status not in JobStatus.__members__.values():
                known = ", ".join(s.value for s in JobStatus)
                raise SpecError(f"unknown status '{status}' (one of: {known})", "status")
        jobs = await self._store.list_jobs(statuses or [], limit, before_id)
        live = (self._book.live(j.id) for j in jobs)
        return [act.job if act is not None else j for act, j in zip(live, jobs, strict=True)]

    async def rows(self, query: JobQuery) -> AsyncGenerator[_Rows, None]:
        """The rows of the jobs ``query`` asks for, in chunks (see :meth:`.Store.job_rows`);
        an active job's row is its live record's. After ``query.limit`` rows, one more
        comes when there are more.

        Raises:
            SpecError: The query names an unknown status or sort, or mixes ways of paging.
        """
        try:
            query.check()
        except ValueError as err:
            field, _, message = str(err).partition(": ")
            raise SpecError(message, field) from None
        async for chunk in self._store.job_rows(query, time.time()):
            rows = []
            for row in chunk:
                live = self._book.live(row["id"])
                if live is not None:
                    row = live.job.to_row()
                    # Its row was a commit behind: keep the filter's promise.
                    if query.statuses and row["status"] not in query.statuses:
                        continue
                    usage = self._usage.live(row["id"])
                    if usage is not None:
                        row["use"] = usage.row()
                rows.append(row)
            yield rows

    def log_path(self, job_id: int, replica: int | None = None) -> Path:
        """Where the job's output is (it may not exist yet).

        A service writes one log per replica; without ``replica`` its replica 0's log is
        meant. Use :meth:`check_replica` first to validate a user's replica number.
        """
        if replica is not None:
            return self._executor.log_path((job_id, replica))
        path = self._executor.log_path(job_id)
        if not path.exists():
            first = self._executor.log_path((job_id, 0))
            if first.exists():
                return first
        return path

    def check_replica(self, job: Job, replica: int | None) -> int | None:
        """Validate a replica number against a job.

        Returns:
            The replica to read: ``None`` for a job's one log (a batch job's replica 0 is
            that log: 0 is the documented default, and a script reading each replica of
            mixed jobs asks for it).

        Raises:
            SpecError: The job is not a service and ``replica`` is not 0, or the service
                has no such replica.
        """
        if replica is None:
            return None
        if job.kind is not JobKind.SERVICE:
            if replica == 0:
                return None
            raise SpecError(
                f"job {job.id} is not a service; its one log is replica 0, not {replica}",
                "replica",
            )
        count = len(job.replicas) or int(job.spec.get("replicas", 1))
        if replica >= count and self._executor.log_path((job.id, replica)).exists():
            # A replica a scale-down removed: its output is still read (it was "has
            # replicas 0-1, not 3", its log there: tester h108).
            return replica
        if not 0 <= replica < count:
            has = "one replica (0)" if count == 1 else f"replicas 0-{count - 1}"
            raise SpecError(f"job {job.id} has {has}, not {replica}", "replica")
        return replica
