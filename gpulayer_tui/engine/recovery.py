"""Taking back the active jobs of an earlier engine run (restart, crash, hand-over).

Waiting jobs are queued again. Running jobs go back to the runner of their kind, which
re-attaches them by pid + /proc start time (pidfd opened first); if their process ended
meanwhile, the exit status their wrapper recorded is used, and a job is never left
``running`` without a live process. Adopted jobs are re-verified the same way, never
requeued, and end ``orphaned`` if they vanished.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from .adoption import adopted_request
from .domain import plural
from .errors import SpecError
from .jobbook import ActiveJob, JobBook, Runner
from .jobqueue import JobQueue
from .models import EventKind, Job, JobKind, JobStatus, TerminationReason
from .scheduler import Request, Scheduler
from .spec import JobSpec, parse_spec

log = logging.getLogger(__name__)

Reason = TerminationReason


class Recovery:
    """Restores active jobs at engine start.

    Args:
        book: Where the jobs are taken back.
        scheduler: Resolves their requests against today's domains.
        queue: Where waiting jobs wait again.
        runners: The runner of each kind, which re-attaches its running jobs.
        save_edit: Stores a waiting job's changed spec (a pin that followed a rename).
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        queue: JobQueue,
        runners: Mapping[JobKind, Runner],
        save_edit: Callable[[Job], None],
        waiting_again: Callable[[ActiveJob], None] | None = None,
    ) -> None:
        self._save_edit = save_edit
        # Told of each waiting job taken back (a service waiting to be placed again keeps
        # its time limit: see ServiceRunner.restored_waiting).
        self._waiting_again = waiting_again
        self._book = book
        self._scheduler = scheduler
        self._queue = queue
        self._runners = runners

    async def restore(self, jobs: list[Job], renamed: Mapping[str, str] | None = None) -> None:
        """Take back ``jobs`` (every active row, oldest first). A waiting job pinned to a
        GPU domain that ``renamed`` (old name -> new name, the same GPU) is pinned to the
        new name, stored as an edit: it failed "unknown domain" when the config renamed
        the domain while no engine ran."""
        acts: list[ActiveJob] = []
        for job in jobs:
            spec: JobSpec | None = None
            request: Request | None = None
            problem = ""
            followed = ""
            if job.kind is JobKind.ADOPTED:
                # Never parsed as a runnable spec: an adopted job's command is a label.
                request = adopted_request({**job.spec, "domain": job.domains})
            else:
                try:
                    spec = parse_spec(job.spec)
                    if renamed:  # (running ones too: placed again, a service, a requeue)
                        spec, followed = self._follow(job, spec, renamed)
                    request = self._request(spec)
                except SpecError as err:
                    problem = str(err)
            act = self._book.restore(job, spec, request)
            acts.append(act)
            if followed:
                self._save_edit(job)
                self._book.record(act, EventKind.EDITED, {"message": followed})
            if problem and job.status is not JobStatus.RUNNING:
                self._book.finish(
                    act,
                    JobStatus.FAILED,
                    Reason.OVER_CAPACITY,
                    f"can no longer run on this machine: {problem}",
                )
        # Every await comes first: a scheduling pass may run at any await, and none may run
        # before the running jobs have taken their slots back (below), or a waiting job
        # would be started on a slot that a running one still holds.
        waiting = []
        for act in acts:
            if act.job.status.is_terminal:
                continue
            if act.job.kind is JobKind.ADOPTED and act.job.status is not JobStatus.RUNNING:
                # Interrupted between insert and verdict: never run or requeue it.
                self._book.finish(
                    act,
                    JobStatus.FAILED,
                    Reason.ADOPT_PID_GONE,
                    "adoption was interrupted by an engine restart; adopt the pid again",
                )
            elif act.job.status in (JobStatus.PENDING, JobStatus.QUEUED) and act.spec:
                deps = await self._queue.resolve_dependencies(act.spec, restoring=True)
                waiting.append((act, deps))
        # From here on, no await until the end. The waiting jobs go back in the queue
        # before the running ones are taken back: a running job found ended meanwhile then
        # releases its dependents.
        for act, deps in waiting:
            if act.job.id in self._book:  # (a dependency's end may have settled it)
                self._queue.enqueue(act, deps)
            if self._waiting_again is not None and act.job.id in self._book:
                self._waiting_again(act)
        running: list[int] = []
        ended: list[int] = []
        for act in acts:
            if act.job.status is JobStatus.RUNNING and act.job.id in self._book:
                self._runners[act.job.kind].reattach(act)
                # (one found ended as it was taken back was counted as running: h157)
                alive = act.job.status is JobStatus.RUNNING and act.job.id in self._book
                (running if alive else ended).append(act.job.id)
        if acts:
            log.info(
                "took back %s: %d running (%s), %s%d waiting; a job whose state changed "
                "meanwhile says how in its timeline",
                plural(len(acts), "active job"),
                len(running),
                ", ".join(map(str, running)) or "none",
                f"{len(ended)} found ended ({', '.join(map(str, ended))}), " if ended else "",
                len(waiting),
            )

    def _request(self, spec: JobSpec) -> Request:
        """A taken-back job's request; a pin to a domain that is gone fails it unless the
        rest of a choice can hold it or the domain's GPU is missing (it then waits for it:
        a GPU that did not come up after a reboot failed every job pinned to it).

        Raises:
            SpecError: It can no longer run here.
        """
        try:
            return self._scheduler.request_for(spec)
        except SpecError:
            if not self._scheduler.may_keep_gone_pins(spec):
                raise
            return self._scheduler.request_for(spec, keep_gone=True)

    @staticmethod
    def _follow(job: Job, spec: JobSpec, renamed: Mapping[str, str]) -> tuple[JobSpec, str]:
        """``spec`` pinned to the new names of renamed domains (``job.spec`` too), and
        what its timeline says ("" when none of its pins was renamed)."""
        pins = spec.pinned_domains
        if not set(pins) & renamed.keys():
            return spec, ""
        now = [renamed.get(pin, pin) for pin in pins]
        pinned = now[0] if isinstance(spec.domain, str) else now
        followed = parse_spec({**job.spec, "domain": pinned})
        job.spec = followed.stored()
        said = ", ".join(f"{old} -> {renamed[old]}" for old in pins if old in renamed)
        return followed, f"edited: pinned domain renamed with its GPU ({said})"
