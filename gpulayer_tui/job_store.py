"""The TUI's view of the jobs: the job rows it loaded, by id, kept current by engine events.

It holds the active jobs and the pages of history the user has reached (see
:mod:`.job_feed`), never the whole history.

Events carry the job's JSON, so the store never has to ask the engine again. Widgets pull
what changed since the version they last saw (:meth:`JobStore.changed_since`) on their own
refresh tick, so a burst of 500 events costs one table update, not 500.
"""

from __future__ import annotations

import time

from .wire import ACTIVE_STATUSES, JobRowJSON

NOT_RUNS = frozenset(
    {
        "over_capacity",
        "adopt_pid_gone",
        "adopt_pid_mismatch",
        "adopt_uid_mismatch",
        "adopt_refused",
    }
)
"""Termination reasons of jobs that never ran: refused submissions and adoptions."""


class JobStore:
    """Job rows by id plus a change log."""

    def __init__(self) -> None:
        self.jobs: dict[int, JobRowJSON] = {}
        self.version = 0
        self._changed_at: dict[int, int] = {}
        self.removed: set[int] = set()  # cleaned from the engine's history (ids never return)
        self.loads = 0  # whole reloads so far (after a reconnect: removals may be unsaid)

    def load(self, jobs: list[JobRowJSON]) -> None:
        """Replace everything (initial load, or after the event stream was cut)."""
        self.jobs = {j["id"]: j for j in jobs}
        self.loads += 1
        self.version += 1
        self._changed_at = dict.fromkeys(self.jobs, self.version)

    def extend(self, jobs: list[JobRowJSON]) -> int:
        """Add a page of rows from the history; rows already known are kept as they are
        (events keep those current, and a page may be older than the latest event).

        Returns:
            How many rows were new.
        """
        new = [job for job in jobs if job["id"] not in self.jobs]
        if new:
            self.version += 1
            for job in new:
                self.jobs[job["id"]] = job
                self._changed_at[job["id"]] = self.version
        return len(new)

    def apply(self, job: JobRowJSON) -> None:
        """Take a newer copy of one job (from an event or an API answer)."""
        old = self.jobs.get(job["id"])
        if old is not None and "use" in old and "use" not in job:
            # Event rows carry no usage figures: keep the last a page brought.
            job = {**job, "use": old["use"]}
        self.version += 1
        self.jobs[job["id"]] = job
        self._changed_at[job["id"]] = self.version

    def remove(self, ids: list[int]) -> None:
        """Forget jobs the engine cleaned from its history (a ``jobs.removed`` event)."""
        self.removed.update(ids)
        if len(self.removed) > 100_000:  # (only the latest matter: a detail open on one)
            self.removed = set(ids)
        gone = [job_id for job_id in ids if job_id in self.jobs]
        if gone:
            self.version += 1
            for job_id in gone:
                del self.jobs[job_id]
                self._changed_at.pop(job_id, None)

    def changed_since(self, version: int) -> list[int]:
        """Ids of jobs changed after ``version`` (call with 0 for all)."""
        if version <= 0:
            return list(self.jobs)
        return [job_id for job_id, v in self._changed_at.items() if v > version]

    def summary(self, now: float | None = None) -> dict[str, int]:
        """What the dashboard's summary line shows: running, queued, and runs that failed
        today (refused submissions, ``over_capacity``, and refused adoptions are not
        runs)."""
        midnight = start_of_today(now)
        running = queued = failed_today = refused_today = 0
        for job in self.jobs.values():
            status = job["status"]
            if status == "running":
                running += 1
            elif status in ("queued", "pending"):
                queued += 1
            elif status == "failed" and (job.get("ended_at") or 0) >= midnight:
                # A refused submission (it could never run) is not a run that failed, nor
                # is an adoption refused before it watched anything: counted apart, so the
                # two add up to what the jobs table's "failed" shows (tester h67).
                if job.get("termination_reason") in NOT_RUNS:
                    refused_today += 1
                else:
                    failed_today += 1
        return {
            "running": running,
            "queued": queued,
            "failed_today": failed_today,
            "refused_today": refused_today,
        }

    def idle_warned(self) -> int:
        """Running jobs the engine warned for holding their GPUs idle (``[policy]
        idle_after``: their message says ``idle: ...``)."""
        return sum(
            1
            for j in self.jobs.values()
            if j["status"] == "running" and str(j.get("message") or "").startswith("idle:")
        )

    def active_count(self, launched_only: bool = False) -> int:
        """Jobs that are pending, queued or running (``launched_only``: not adopted)."""
        return sum(
            1
            for j in self.jobs.values()
            if j["status"] in ACTIVE_STATUSES and not (launched_only and j.get("kind") == "adopted")
        )


def start_of_today(now: float | None = None) -> float:
    """Local midnight of ``now``'s day (epoch s)."""
    local = time.localtime(time.time() if now is None else now)
    return time.mktime((local.tm_year, local.tm_mon, local.tm_mday, 0, 0, 0, 0, 0, -1))
