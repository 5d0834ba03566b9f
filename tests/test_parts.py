"""The engine's parts, each built alone: no event loop, no SQLite, no processes.

These are plain (synchronous) tests on purpose: a part that needed a running loop or a
database to be constructed and driven would fail here. The job book writes to an in-memory
journal; the queue schedules its passes through a list the test drains by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from gpulayer_tui.engine.domain import Domain
from gpulayer_tui.engine.errors import SpecError
from gpulayer_tui.engine.events import EventBus
from gpulayer_tui.engine.gpus import GIB, GpuProcess, GpuReading, ProbeResult, ProbeStatus
from gpulayer_tui.engine.jobbook import ActiveJob, JobBook, release_holds, take_holds
from gpulayer_tui.engine.jobqueue import JobQueue
from gpulayer_tui.engine.models import (
    DomainState,
    Event,
    EventKind,
    IllegalTransition,
    Job,
    JobKind,
    JobStatus,
    TerminationReason,
)
from gpulayer_tui.engine.runqueue import RunQueue
from gpulayer_tui.engine.scheduler import Capacity, Request, Scheduler
from gpulayer_tui.engine.spec import parse_spec

Reason = TerminationReason


class Journal:
    """An in-memory stand-in for the store's group-commit writer (commits at once)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.events: list[Event] = []

    def save(
        self, job: Job | None, events: Iterable[Event] = (), wait: bool = False, new: bool = False
    ) -> None:
        if job is not None:
            self.rows.append(dict(job.to_json()))
        self.events.extend(events)

    failure: str | None = None

    def after_commit(
        self, callback: Callable[[], None], early: Callable[[], None] | None = None
    ) -> None:
        if early is not None:
            early()
        callback()

    def statuses(self, job_id: int) -> list[str]:
        return [
            e.data["status"]
            for e in self.events
            if e.job_id == job_id and e.kind is EventKind.TRANSITION
        ]


class Soon:
    """Collects the passes the queue asks for; ``run()`` runs them."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], None]] = []

    def __call__(self, callback: Callable[[], None]) -> Soon:
        self.calls.append(callback)
        return self

    def cancel(self) -> None:
        self.calls.clear()

    def run(self) -> None:
        while self.calls:
            self.calls.pop(0)()


def gpu(index: int, total_gib: float = 80, used_gib: float = 0, procs: tuple[Any, ...] = ()) -> Any:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA A100-SXM4-80GB",
        memory_total=int(total_gib * GIB),
        memory_used=int(used_gib * GIB),
        processes=tuple(GpuProcess(pid, None if b is None else int(b * GIB)) for pid, b in procs),
    )


def machine(*readings: GpuReading, cpu_slots: int = 2) -> Scheduler:
    scheduler = Scheduler()
    domains = [Domain(f"gpu{r.index}", r.index, r.uuid, 1) for r in readings]
    scheduler.replace_domains([*domains, Domain("cpu", None, None, cpu_slots)])
    scheduler.observe(ProbeResult(ProbeStatus.OK, tuple(readings)), {}, {})
    return scheduler


class World:
    """A book, a scheduler and a queue wired like the engine wires them."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.journal = Journal()
        self.scheduler = scheduler
        self.book = JobBook(self.journal, EventBus())
        self.soon = Soon()
        self.started: list[int] = []
        self.queue = JobQueue(self.book, scheduler, self._lookup, self._start, self.soon)
        self.book.on_end(release_holds)
        self.book.on_end(self.queue.job_ended)
        self.stored: dict[int, Job] = {}

    async def _lookup(self, job_id: int) -> Job | None:
        return self.stored.get(job_id)

    def _start(self, act: ActiveJob, domains: list[Domain]) -> None:
        take_holds(act, domains)
        act.job.domains = [d.name for d in domains]
        self.book.transition(act, JobStatus.RUNNING, message="running")
        self.started.append(act.job.id)

    def submit(self, priority: int = 0, deps: Any = (), **spec: Any) -> ActiveJob:
        parsed = parse_spec({"command": ["true"], "priority": priority, **spec})
        act = self.book.create(
            name="t",
            kind=JobKind.COMMAND,
            spec_json=parsed.model_dump(mode="json", exclude_none=True),
            spec=parsed,
            request=self.scheduler.request_for(parsed),
            priority=priority,
        )
        self.queue.enqueue(act, list(deps))
        return act

    def end(self, act: ActiveJob, status: JobStatus = JobStatus.COMPLETED) -> None:
        self.book.finish(act, status, Reason.EXIT_CODE, "ended", 0)


# -- the job book ---------------------------------------------------------------------------


def test_the_book_moves_jobs_only_along_the_table_and_announces_ends_in_order() -> None:
    journal = Journal()
    book = JobBook(journal, EventBus())
    heard: list[str] = []
    book.on_end(lambda act: heard.append(f"first {act.job.id} {act.job.status}"))
    book.on_end(lambda act: heard.append(f"second {act.job.id}"))
    act = book.create(name="a", kind=JobKind.COMMAND, spec_json={}, spec=None, request=None)
    assert act.job.id == 1 and book.get(1) is act and 1 in book
    book.set_reason(act, "waiting for a GPU")  # pending -> queued
    book.set_reason(act, "waiting for a GPU")  # unchanged: nothing written
    book.set_reason(act, "waiting for job 9")  # a refresh, not a transition
    book.transition(act, JobStatus.RUNNING, message="running on gpu0")
    with pytest.raises(ValueError, match="use finish"):
        book.transition(act, JobStatus.COMPLETED)
    book.finish(act, JobStatus.COMPLETED, Reason.EXIT_CODE, "exited with code 0", 0)
    assert heard == ["first 1 completed", "second 1"]
    assert journal.statuses(1) == ["queued", "running", "completed"]
    kinds = [e.kind for e in journal.events]
    assert kinds == [
        EventKind.SUBMITTED,
        EventKind.TRANSITION,
        EventKind.REASON,
        EventKind.TRANSITION,
        EventKind.TRANSITION,
    ]
    assert act.job.exit_code == 0 and act.job.ended_at is not None
    assert book.get(1) is None and book.live(1) is None  # the journal committed at once
    with pytest.raises(IllegalTransition, match="completed -> running"):
        book.transition(act, JobStatus.RUNNING)
    again = book.create(name="b", kind=JobKind.COMMAND, spec_json={}, spec=None, request=None)
    assert again.job.id == 2  # ids are never reused
    book.resume_ids(41)
    assert (
        book.create(name="c", kind=JobKind.COMMAND, spec_json={}, spec=None, request=None).job.id
        == 42
    )


def test_a_queued_job_cannot_go_back_to_pending_or_end_orphaned() -> None:
    book = JobBook(Journal(), EventBus())
    act = book.create(name="a", kind=JobKind.COMMAND, spec_json={}, spec=None, request=None)
    book.transition(act, JobStatus.QUEUED, message="waiting")
    with pytest.raises(IllegalTransition):
        book.transition(act, JobStatus.PENDING)
    with pytest.raises(IllegalTransition):
        book.finish(act, JobStatus.ORPHANED, Reason.ADOPTED_EXIT_UNOBSERVED, "?")
    assert act.job.status is JobStatus.QUEUED


# -- the queue and the pass -----------------------------------------------------------------


def test_the_pass_starts_the_best_job_that_fits_and_gives_the_rest_a_reason() -> None:
    world = World(machine(gpu(0), gpu(1), cpu_slots=1))
    low = world.submit(priority=0)
    high = world.submit(priority=5)
    third = world.submit(priority=0)
    assert world.started == []  # nothing starts before the pass
    world.soon.run()
    assert world.started == [high.job.id]
    assert low.job.status is JobStatus.QUEUED and low.job.message == "the only cpu slot is busy"
    assert third.job.message == "the only cpu slot is busy"
    assert world.scheduler.domains["cpu"].used_slots == 1
    world.end(high)
    world.soon.run()
    assert world.started == [high.job.id, low.job.id]  # FIFO within a priority
    world.end(low)
    world.soon.run()
    assert world.started[-1] == third.job.id
    assert len(world.queue) == 0


def test_dependencies_wait_release_and_cancel() -> None:
    world = World(machine(gpu(0), gpu(1)))
    first = world.submit(gpus=1)
    waits = world.submit(gpus=1, depends_on=[first.job.id], deps=[(first.job.id, False, None)])
    any_exit = world.submit(
        gpus=1,
        depends_on=[{"job": first.job.id, "any_exit": True}],
        deps=[(first.job.id, True, None)],
    )
    world.soon.run()
    assert world.started == [first.job.id]
    assert waits.job.message == f"waiting for job {first.job.id}"
    world.end(first, JobStatus.FAILED)
    assert waits.job.status is JobStatus.CANCELLED
    assert waits.job.termination_reason is Reason.DEPENDENCY_FAILED
    assert waits.job.message == f"dependency job {first.job.id} failed"
    world.soon.run()
    assert world.started == [first.job.id, any_exit.job.id]  # any_exit runs whatever the end


def test_a_dependency_that_already_failed_cancels_at_admission() -> None:
    world = World(machine(gpu(0)))
    act = world.submit(depends_on=[7], deps=[(7, False, JobStatus.FAILED)])
    assert act.job.status is JobStatus.CANCELLED
    assert world.journal.statuses(act.job.id) == ["cancelled"]


async def test_a_dependency_whose_end_is_not_durable_yet_is_taken_as_ended() -> None:
    # Submitted just as its parent completed: the parent had left the active jobs, its end
    # still on its way to the database, which said "running", read as a failure: the
    # dependent was cancelled "dependency job N running" (20 CLI clients at once).
    import asyncio
    import dataclasses

    class SlowJournal(Journal):
        """Commits ends only when told."""

        def __init__(self) -> None:
            super().__init__()
            self.pending: list[asyncio.Future[None]] = []

        def save(  # type: ignore[override]
            self,
            job: Job | None,
            events: Iterable[Event] = (),
            wait: bool = False,
            new: bool = False,
        ) -> asyncio.Future[None] | None:
            super().save(job, events)
            if not wait:
                return None
            self.pending.append(asyncio.get_running_loop().create_future())
            return self.pending[-1]

    world = World(machine(gpu(0)))
    world.journal = journal = SlowJournal()
    world.book = JobBook(journal, EventBus())
    world.queue = JobQueue(world.book, world.scheduler, world._lookup, world._start, world.soon)
    parent = world.submit(gpus=1)
    world.soon.run()
    world.stored[parent.job.id] = dataclasses.replace(parent.job)  # the database: running
    world.end(parent, JobStatus.COMPLETED)
    assert parent.job.id not in world.book and journal.pending  # ended, not durable yet
    spec = parse_spec({"command": ["true"], "depends_on": [parent.job.id]})
    deps = await world.queue.resolve_dependencies(spec)
    assert deps == [(parent.job.id, False, JobStatus.COMPLETED)]


def test_over_capacity_fails_at_once_and_unknown_capacity_waits() -> None:
    world = World(machine(gpu(0), gpu(1)))
    big = world.submit(gpus=3)
    assert big.job.status is JobStatus.FAILED
    assert big.job.termination_reason is Reason.OVER_CAPACITY
    assert big.job.message == "requested 3 GPUs, but this machine has 2"
    huge = world.submit(gpus=1, vram_gb=100)
    assert huge.job.message == "requested 100 GiB per GPU, but the largest GPU has 80 GiB"
    # The probe fails: capacity cannot be read, so a GPU job waits instead of failing.
    world.scheduler.observe(ProbeResult(ProbeStatus.ERROR, message="NVML timed out"), {}, {})
    waiting = world.submit(gpus=1, vram_gb=40)
    world.soon.run()
    assert waiting.job.status is JobStatus.QUEUED
    assert waiting.job.message == "GPU capacity unknown: NVML timed out"
    world.scheduler.observe(ProbeResult(ProbeStatus.OK, (gpu(0), gpu(1))), {}, {})
    world.queue.recheck_capacity()
    world.soon.run()
    assert waiting.job.status is JobStatus.RUNNING


# -- placement and accounting ---------------------------------------------------------------


def test_placement_picks_the_emptiest_fitting_gpu_and_names_the_blocker() -> None:
    scheduler = machine(gpu(0, used_gib=60, procs=((4242, 60),)), gpu(1))
    need_40 = Request(gpus=1, vram_bytes=40 * GIB, pins=(), exclusive=False)
    assert [d.name for d in scheduler.place(need_40)] == ["gpu1"]  # type: ignore[union-attr]
    scheduler.hold(1, need_40, [scheduler.domains["gpu1"]])
    reason = scheduler.place(need_40)
    assert isinstance(reason, str)
    assert "gpu0: 60.0 GiB held by pid 4242; needs 40.0 GiB, 20.0 GiB free" in reason
    assert "gpu1 busy" in reason and "4242" in reason
    both = Request(gpus=2, vram_bytes=None, pins=(), exclusive=False)
    assert scheduler.place(both) == "needs 2 GPUs, 1 available now; gpu1 busy"
    scheduler.release(1, [scheduler.domains["gpu1"]])
    assert len(scheduler.place(both)) == 2  # type: ignore[arg-type]


def test_placement_of_a_job_that_declares_vram_takes_the_smallest_gpu_that_has_it() -> None:
    # A 10 GiB job took the free A100 beside a free L4; the 40 GiB job after it waited.
    scheduler = machine(gpu(0, total_gib=80), gpu(1, total_gib=24))
    need_10 = Request(gpus=1, vram_bytes=10 * GIB, pins=(), exclusive=False)
    need_40 = Request(gpus=1, vram_bytes=40 * GIB, pins=(), exclusive=False)
    small = scheduler.place(need_10)
    assert [d.name for d in small] == ["gpu1"]  # type: ignore[union-attr]
    scheduler.hold(1, need_10, list(small))  # type: ignore[arg-type]
    assert [d.name for d in scheduler.place(need_40)] == ["gpu0"]  # type: ignore[union-attr]
    # Also where the smaller one is shared and already in use (slots: it went to the A100).
    scheduler.domains["gpu1"].slots = 2
    scheduler.domains["gpu1"]._count_slots()
    also = scheduler.place(need_10)
    assert [d.name for d in also] == ["gpu1"]  # type: ignore[union-attr]
    # One that declares nothing may need anything: the emptiest (most free) GPU.
    scheduler.release(1, list(small))  # type: ignore[arg-type]
    unknown = Request(gpus=1, vram_bytes=None, pins=(), exclusive=False)
    assert [d.name for d in scheduler.place(unknown)] == ["gpu0"]  # type: ignore[union-attr]


def test_a_job_that_declares_no_vram_takes_the_gpu_with_the_most_memory_free() -> None:
    # By slots first, it took a GPU of no jobs a process not ours filled to 87 %, beside
    # a shared one with 75 GiB free (tester h189 #4).
    scheduler = machine(
        gpu(0, used_gib=70, procs=((4242, 70),)), gpu(1, used_gib=5, procs=((77, 5),))
    )
    scheduler.domains["gpu1"].slots = 3
    scheduler.domains["gpu1"]._count_slots()
    scheduler.hold(
        9,
        Request(gpus=1, vram_bytes=5 * GIB, pins=(), exclusive=False),
        [scheduler.domains["gpu1"]],
    )
    unknown = Request(gpus=1, vram_bytes=None, pins=(), exclusive=False)
    assert [d.name for d in scheduler.place(unknown)] == ["gpu1"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"domain": "gpu9"}, "domain", "unknown domain 'gpu9'"),
        ({"domain": ["gpu0", "gpu0"]}, "domain", "named twice"),
        ({"domain": ["gpu0", "cpu"], "gpus": 1}, "domain", "cannot mix"),
        ({"domain": "gpu0", "gpus": 0}, "gpus", "gpus is 0 but domain gpu0"),
    ],
)
def test_request_resolution_refuses_contradictions_with_the_field(
    spec: dict[str, Any], field: str, message: str
) -> None:
    scheduler = machine(gpu(0))
    with pytest.raises(SpecError, match=message) as refused:
        scheduler.request_for(parse_spec({"command": ["x"], **spec}))
    assert refused.value.field == field
    assert scheduler.capacity is Capacity.KNOWN


def test_several_pins_are_a_choice_of_one_gpu_unless_gpus_says_more() -> None:
    # `--domain gpu1 --domain gpu2` ("repeat for a choice") asked for both GPUs, and waited
    # while gpu1 was lost with gpu2 idle.
    world = World(machine(gpu(0), gpu(1), gpu(2)))
    spec = {"domain": ["gpu1", "gpu2"]}
    assert world.scheduler.request_for(parse_spec({"command": ["x"], **spec})).gpus == 1
    first, second = world.submit(**spec), world.submit(**spec)
    third = world.submit(**spec)
    world.soon.run()
    assert [d.name for a in (first, second) for d in a.holds] == ["gpu1", "gpu2"]
    assert third.job.status is JobStatus.QUEUED
    both = world.scheduler.request_for(parse_spec({"command": ["x"], "gpus": 2, **spec}))
    assert both.gpus == 2 and both.pins == ("gpu1", "gpu2")


def test_vram_formula_owned_unregistered_unattributed_and_reservations() -> None:
    dom = Domain("gpu0", 0, "GPU-0", 2)
    reading = gpu(
        0,
        total_gib=80,
        used_gib=40,
        procs=((100, 10), (200, 12), (300, None)),  # ours, a stranger, "not available"
    )
    dom.hold(7, 16 * GIB, False)  # declared 16 GiB, holds 10 now: 6 more are reserved
    dom.apply_sample(reading, {100: 7, 200: None, 300: None}, {})
    account = dom.account
    assert account is not None
    assert account.owned == 10 * GIB
    assert account.unregistered == 12 * GIB
    assert account.unattributed == 18 * GIB  # 40 used - 22 listed (pid 300 counts here)
    assert account.reserved_extra == 6 * GIB
    assert account.free == (80 - 10 - 6 - 12 - 18) * GIB
    assert [p.pid for p in account.foreign] == [200, 300]
    dom.unhold(7)
    assert dom.account is not None and dom.account.owned == 0  # no longer ours
    # ... but, until the next sample, not a stranger's either: it is leaving
    assert dom.account.unregistered == 12 * GIB and dom.account.leaving == 10 * GIB
    assert dom.account.free == (80 - 10 - 12 - 18) * GIB
    # A process of a job that never held this GPU is a stranger here.
    dom.apply_sample(reading, {100: 7, 200: 8, 300: None}, {})
    assert dom.account is not None and dom.account.leaving == 10 * GIB
    assert dom.account.unregistered == 12 * GIB
    dom.apply_sample(gpu(0, 80, 22, ((100, 10), (200, 12))), {100: None, 200: None}, {})
    assert dom.account is not None and dom.account.leaving == 0
    assert dom.account.unregistered == 22 * GIB


def test_memory_declared_beyond_use_counts_only_what_is_left_to_hold_it() -> None:
    # A 40 GiB job holding 20, and a stray taking 50 of the 60 left: "reserved 20" beside
    # it made the parts 96 of 80 (tester h48).
    dom = Domain("gpu0", 0, "GPU-0", 4)
    dom.hold(7, 40 * GIB, False)
    dom.apply_sample(gpu(0, 80, 76, ((100, 20), (200, 50))), {100: 7, 200: None}, {})
    account = dom.account
    assert account is not None
    parts = (account.owned, account.reserved_extra, account.unregistered, account.unattributed)
    assert parts == (20 * GIB, 4 * GIB, 50 * GIB, 6 * GIB) and account.free == 0
    assert sum(parts) + account.free == account.total


def test_a_job_that_declares_no_vram_waits_for_a_little_of_the_gpu() -> None:
    # It was placed beside a job holding all 80 GiB ("81.0 GiB of an 80 GiB GPU").
    dom = Domain("gpu0", 0, "GPU-0", 2)
    dom.hold(7, 80 * GIB, False)
    dom.apply_sample(gpu(0, total_gib=80, used_gib=1, procs=((100, 1),)), {100: 7}, {})
    assert dom.blocker(None, False) == (
        "gpu0: 80.0 GiB held or reserved by job 7; 0.0 GiB free (a job that declares no VRAM "
        "waits for 1.0 GiB)"
    )
    dom.unhold(7)
    dom.hold(7, 40 * GIB, False)
    assert dom.blocker(None, False) is None  # (40 GiB free)
    dom.unhold(7)
    # Nor on one a process not ours fills, whatever its slots (it started there, and on
    # a real GPU ran out of memory: tester h129).
    for slots in (2, 1):
        alone = Domain("gpu0", 0, "GPU-0", slots)
        alone.apply_sample(gpu(0, total_gib=80, used_gib=80, procs=((200, 80),)), {200: None}, {})
        said = alone.blocker(None, False)
        assert said is not None and said.startswith("gpu0: 80.0 GiB held by pid 200"), said
        assert said.endswith("0.0 GiB free (a job that declares no VRAM waits for 1.0 GiB)")
        alone.apply_sample(gpu(0, total_gib=80, used_gib=70, procs=((200, 70),)), {200: None}, {})
        assert alone.blocker(None, False) is None  # (10 GiB free)


def test_a_gpu_an_exclusive_job_holds_is_said_held_whole_by_it() -> None:
    # "all 2 slots busy (jobs 20)": one exclusive job held both (tester h189 #5).
    dom = Domain("a0", 0, "GPU-0", 2)
    dom.hold(20, None, True)
    assert dom.blocker(5 * GIB, False) == "a0: held whole by exclusive job 20"
    dom.unhold(20)
    dom.hold(21, None, False)
    dom.hold(22, None, False)
    assert dom.blocker(None, False) == "a0: all 2 slots busy (jobs 21, 22)"


def test_jobs_that_declare_no_vram_each_keep_the_floor_they_were_placed_for() -> None:
    # Two placed one after the other on 1.5 GiB free both passed the 1 GiB floor, the
    # second before a sample saw the first's memory (tester h189 #1).
    dom = Domain("l4", 0, "GPU-0", 3)
    dom.hold(7, int(22.5 * GIB), False)
    dom.apply_sample(gpu(0, total_gib=24, used_gib=22.5, procs=((100, 22.5),)), {100: 7}, {})
    assert dom.blocker(None, False) is None  # (1.5 GiB free)
    dom.hold(8, None, False)
    assert dom.account is not None and dom.account.free == GIB // 2
    said = dom.blocker(None, False)
    assert said is not None and said.endswith(
        "0.5 GiB free (a job that declares no VRAM waits for 1.0 GiB)"
    ), said
    # Once it holds more than the floor, what it holds is what counts.
    dom.apply_sample(
        gpu(0, total_gib=24, used_gib=24, procs=((100, 22.5), (101, 1.5))), {100: 7, 101: 8}, {}
    )
    assert dom.account.free == 0 and dom.account.reserved_extra == 0


def test_domain_states_follow_their_table() -> None:
    dom = Domain("gpu0", 0, None, 1)
    dom.drain("maintenance")
    assert dom.state is DomainState.DRAINING
    assert dom.blocker(None, False) == "domain gpu0 draining: maintenance"
    dom.quarantine("GPU is lost")
    assert (dom.state, dom.drain_reason) == (DomainState.QUARANTINED, "maintenance")
    dom.release()  # (the quarantine; the operator's drain under it stays)
    assert (dom.state, dom.state_reason) == (DomainState.DRAINING, "maintenance")
    dom.release()
    assert dom.state is DomainState.IN_SERVICE and dom.failures == 0
    assert dom.drain_reason is None
    with pytest.raises(IllegalTransition, match="in_service -> in_service"):
        dom.release()
    dom.quarantine("GPU is lost")
    with pytest.raises(IllegalTransition, match="quarantined -> quarantined"):
        dom.quarantine("again")


def test_a_read_begun_before_a_release_does_not_quarantine_again() -> None:
    # The sampler reads in a thread: a read that saw the GPU lost may land just after the
    # operator released the domain. It says nothing about the GPU after the release.
    dom = Domain("gpu0", 0, None, 1)
    lost = GpuReading(0, "GPU-0", "A100", 0, 0, error="GPU is lost", lost=True)
    assert dom.observe(lost, 2, 4, read_at=time.time()) is DomainState.QUARANTINED
    begun = time.time() - 1.0  # (a read still in flight)
    dom.observe(gpu(0), 2, 4, read_at=time.time())  # it answers again
    dom.release()
    assert dom.observe(lost, 2, 4, read_at=begun) is None  # stale: ignored
    assert dom.state is DomainState.IN_SERVICE and dom.failures == 0
    assert dom.observe(lost, 2, 4, read_at=time.time()) is DomainState.QUARANTINED  # a new one


def test_run_queue_orders_by_priority_then_id_and_groups_shapes() -> None:
    queue = RunQueue()
    one = Request(gpus=1, vram_bytes=None, pins=(), exclusive=False)
    cpu = Request(gpus=0, vram_bytes=None, pins=(), exclusive=False)
    queue.push((0, 3), one)
    queue.push((-5, 4), cpu)
    queue.push((0, 1), one)
    assert queue.heads() == [((-5, 4), cpu), ((0, 1), one)]
    assert queue.jobs_of(one) == [(0, 1), (0, 3)]
    assert queue.update_reason(one, "busy") and not queue.update_reason(one, "busy")
    assert queue.take_fresh() == {1, 3, 4} and queue.take_fresh() == set()
    assert queue.remove((0, 1), one) and not queue.remove((0, 1), one)
    assert len(queue) == 2


def test_a_vram_wait_names_every_holder_largest_first() -> None:
    # Only the largest holder was named, and the figures did not add up ("30.0 GiB held
    # by job 27; needs 30.0 GiB, 20.0 GiB free" of an 80 GiB GPU two jobs shared).
    scheduler = Scheduler()
    scheduler.replace_domains([Domain("gpu0", 0, "GPU-0", 6), Domain("cpu", None, None, 2)])
    scheduler.observe(
        ProbeResult(ProbeStatus.OK, (gpu(0, used_gib=10, procs=((4242, 10),)),)), {}, {}
    )
    gpu0 = [scheduler.domains["gpu0"]]
    for job_id, gib_held in ((1, 20), (2, 30)):
        scheduler.hold(
            job_id, Request(gpus=1, vram_bytes=gib_held * GIB, pins=(), exclusive=False), gpu0
        )
    need_30 = Request(gpus=1, vram_bytes=30 * GIB, pins=(), exclusive=False)
    reason = scheduler.place(need_30)
    assert isinstance(reason, str)
    assert (
        "gpu0: 30.0 GiB reserved by job 2, 20.0 GiB reserved by job 1, 10.0 GiB held by pid "
        "4242; needs 30.0 GiB, 20.0 GiB free"
    ) in reason, reason
    # Past three, the rest are counted.
    for job_id in (3, 4):
        scheduler.hold(job_id, Request(gpus=1, vram_bytes=5 * GIB, pins=(), exclusive=False), gpu0)
    reason = scheduler.place(need_30)
    assert isinstance(reason, str)
    assert "held by pid 4242, 2 more (10.0 GiB); needs 30.0 GiB, 10.0 GiB free" in reason, reason


def test_a_vram_wait_names_holders_that_add_up_to_the_gpu() -> None:
    # Two jobs declaring 30 GiB each, one holding 10 of them, beside a stray of 40: the
    # reason named 40 + 30 + 30 = 100 GiB of an 80 GiB GPU, the 30 as "held" (h189 #3).
    scheduler = Scheduler()
    scheduler.replace_domains([Domain("gpu0", 0, "GPU-0", 3), Domain("cpu", None, None, 2)])
    gpu0 = [scheduler.domains["gpu0"]]
    for job_id in (11, 13):
        scheduler.hold(job_id, Request(gpus=1, vram_bytes=30 * GIB, pins=(), exclusive=False), gpu0)
    reading = gpu(0, used_gib=50, procs=((100, 10), (6612, 40)))
    scheduler.observe(ProbeResult(ProbeStatus.OK, (reading,)), {100: 11, 6612: None}, {})
    reason = scheduler.place(Request(gpus=1, vram_bytes=10 * GIB, pins=(), exclusive=False))
    assert isinstance(reason, str)
    assert (
        # (the 30 GiB left after the stray and what job 11 holds, shared out as the
        # account does: 20 + 30 declared beyond use, cut to 30, 12 and 18)
        "gpu0: 40.0 GiB held by pid 6612, 22.0 GiB held or reserved by job 11, 18.0 GiB "
        "reserved by job 13; needs 10.0 GiB, 0.0 GiB free"
    ) in reason, reason


def test_a_slot_wait_names_memory_held_outside_that_would_still_keep_it_out() -> None:
    # A job waiting on gpu0's slot was told only of the slot's holder: once that job was
    # gone (or preempted) it would still not fit, for memory a stray process holds.
    scheduler = machine(gpu(0, used_gib=50, procs=((9288, 50),)))
    gpu0 = [scheduler.domains["gpu0"]]
    scheduler.hold(7, Request(gpus=1, vram_bytes=20 * GIB, pins=(), exclusive=False), gpu0)
    reason = scheduler.place(Request(gpus=1, vram_bytes=40 * GIB, pins=(), exclusive=False))
    assert reason == (
        "waiting for gpu0: slot held by job 7; once it is free, 50.0 GiB held by pid 9288 "
        "still leaves 30.0 GiB, short of the 40.0 GiB asked"
    ), reason
    # What would fit once the slot is free says only the slot.
    fits_later = Request(gpus=1, vram_bytes=30 * GIB, pins=(), exclusive=False)
    assert scheduler.place(fits_later) == "waiting for gpu0: slot held by job 7"


def test_a_multi_gpu_wait_names_memory_held_outside_a_busy_gpu() -> None:
    # A 4-GPU job was told "gpu0 busy", as if the end of the job there would let it start;
    # a stray's 70 GiB there keeps it out for as long as the stray lives (tester h55).
    scheduler = machine(gpu(0, used_gib=70, procs=((7051, 70),)), gpu(1), gpu(2), gpu(3), gpu(4))
    scheduler.hold(
        9, Request(gpus=1, vram_bytes=0, pins=(), exclusive=False), [scheduler.domains["gpu0"]]
    )
    scheduler.hold(
        10, Request(gpus=1, vram_bytes=0, pins=(), exclusive=False), [scheduler.domains["gpu1"]]
    )
    four = Request(
        gpus=4, vram_bytes=20 * GIB, pins=("gpu0", "gpu1", "gpu2", "gpu3"), exclusive=False
    )
    reason = scheduler.place(four)
    assert reason == (
        "needs 4 GPUs, 2 available now; gpu1 busy; gpu0: slot held by job 9; once it is "
        "free, 70.0 GiB held by pid 7051 still leaves 10.0 GiB, short of the 20.0 GiB asked"
    ), reason


def test_a_late_timeout_counts_whole_seconds_down_as_the_runtime_column_does() -> None:
    from gpulayer_tui.engine.batch import late_timeout_message, timeout_message
    from gpulayer_tui.formatting import duration

    job = Job(1, "late", JobKind.COMMAND, {}, started_at=1000.0)
    said = late_timeout_message(job, 5, 1010.7, 10)
    assert "(stopped at 10 s:" in said and duration(1010.7 - 1000.0) == "10s"
    job.started_at = time.time() - 10.7
    assert "(stopped at 10 s:" in timeout_message(job, 5)


def test_a_big_service_s_message_names_a_few_replicas_then_counts_the_rest() -> None:
    from gpulayer_tui.engine.models import Replica, ReplicaState
    from gpulayer_tui.engine.services import service_summary

    job = Job(1, "web", JobKind.SERVICE, {}, domains=["gpu0"])
    job.replicas = [
        Replica(i, ReplicaState.UP, endpoint=f"127.0.0.1:{9000 + i}") for i in range(5)
    ] + [Replica(i, ReplicaState.STARTING, port=9000 + i) for i in range(5, 23)]
    job.replicas += [
        Replica(23, ReplicaState.BACKOFF, message="exited 1"),
        Replica(24, ReplicaState.DOWN),
    ]
    said = service_summary(job)
    assert said.startswith(
        "5/25 up on gpu0 at 127.0.0.1:9000, 127.0.0.1:9001, 127.0.0.1:9002 and 2 more; "
        "replica 5 starting (port 9005 not answering yet); replica 6 starting"
    ), said
    assert said.endswith("; 17 more not up (15 starting, 1 in back-off, 1 down)"), said
    assert len(said) < 400


def test_a_program_loses_its_directory_only_where_it_is_a_path() -> None:
    from gpulayer_tui.fields import program_name
    from gpulayer_tui.formatting import short_command

    assert short_command("/opt/conda/bin/python3 train.py") == "python3 train.py"
    assert short_command("./run.sh --fast") == "run.sh --fast"
    # (`exec -a '[red]stray[/]' sleep 1000` read "] 1000": tester h54)
    assert short_command("[red]stray[/] 1000") == "[red]stray[/] 1000"
    assert program_name("sleep") == "sleep" and program_name("/") == "/"


def test_sizes_that_differ_are_never_said_alike() -> None:
    # "leaves 41.0 GiB, short of the 41.0 GiB asked" and "8 GPUs with 24 GiB each, but
    # only 6 GPUs have that much" (two of them 24 GiB) were said of 41.001 and 24.001 GiB.
    scheduler = machine(gpu(0, used_gib=39, procs=((9288, 39),)), gpu(1, total_gib=24))
    gpu0 = [scheduler.domains["gpu0"]]
    scheduler.hold(7, Request(gpus=1, vram_bytes=0, pins=(), exclusive=False), gpu0)
    asked = int(41.001 * GIB)
    reason = scheduler.place(Request(gpus=1, vram_bytes=asked, pins=("gpu0",), exclusive=False))
    assert reason == (
        "waiting for gpu0: slot held by job 7; once it is free, 39.0 GiB held by pid 9288 "
        "still leaves 41 GiB, short of the 41.001 GiB asked"
    ), reason
    both = Request(gpus=2, vram_bytes=int(24.001 * GIB), pins=(), exclusive=False)
    verdict = scheduler.capacity_verdict(both)
    assert verdict.possible is False
    assert verdict.message == (
        "requested 2 GPUs with 24.001 GiB each, but only 1 GPU has that much"
    ), verdict.message
    # Pinned, of the pinned ones ("only 1 GPU has that much" of a box with more: h129).
    pinned = Request(gpus=2, vram_bytes=30 * GIB, pins=("gpu0", "gpu1"), exclusive=False)
    assert scheduler.capacity_verdict(pinned).message == (
        "requested 2 GPUs with 30 GiB each, but only 1 GPU of the pinned gpu0, gpu1 has that much"
    )
