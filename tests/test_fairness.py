"""A shared box (issue 18): reservations and backfill, per-user limits, fair share.

The scheduler's parts are driven alone, as in tests/test_parts.py (no loop, no SQLite, no
processes): a book, a scheduler over hand-made GPU readings, and the queue, with a clock
the test sets. The limits that reach admission run through a real engine.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from typing import Any

import pytest

from gpulayer_tui.engine.config import SchedulingSettings, UserLimits
from gpulayer_tui.engine.errors import Overloaded, SpecError
from gpulayer_tui.engine.events import EventBus
from gpulayer_tui.engine.fairness import Limits, user_label
from gpulayer_tui.engine.gpus import GIB, ProbeResult, ProbeStatus
from gpulayer_tui.engine.jobbook import ActiveJob, JobBook, release_holds
from gpulayer_tui.engine.jobqueue import JobQueue
from gpulayer_tui.engine.models import JobKind, JobStatus, TerminationReason
from gpulayer_tui.engine.spec import parse_spec

from .conftest import EngineFactory, eventually, make_config
from .test_parts import Journal, Reason, Soon, World, gpu, machine

ME, OTHER = 0, 65534  # root and nobody: users every test machine has


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Box(World):
    """World with users, a clock, ``[scheduling]`` and ``[users.*]``."""

    def __init__(
        self,
        gpus: int = 2,
        users: dict[str, UserLimits] | None = None,
        **scheduling: Any,
    ) -> None:
        self.clock = Clock()
        scheduler = machine(*(gpu(i) for i in range(gpus)))
        self.journal = Journal()
        self.scheduler = scheduler
        self.book = JobBook(self.journal, EventBus())
        self.soon = Soon()
        self.started = []
        self.queue = JobQueue(
            self.book,
            scheduler,
            self._lookup,
            self._start,
            self.soon,
            settings=SchedulingSettings(**scheduling),
            limits=Limits(users or {}),
            clock=self.clock,
        )
        self.book.on_end(release_holds)
        self.book.on_end(self.queue.job_ended)
        self.stored = {}

    def _start(self, act: ActiveJob, domains: list[Any]) -> None:
        super()._start(act, domains)
        act.job.started_at = self.clock.now

    def run(
        self, uid: int = ME, priority: int = 0, deps: list[Any] | None = None, **spec: Any
    ) -> ActiveJob:
        parsed = parse_spec({"command": ["true"], "priority": priority, **spec})
        act = self.book.create(
            name="t",
            kind=JobKind.COMMAND,
            spec_json=parsed.model_dump(mode="json", exclude_none=True),
            spec=parsed,
            request=self.scheduler.request_for(parsed),
            priority=priority,
            owner_uid=uid,
        )
        self.queue.enqueue(act, deps or [])
        self.soon.run()
        return act

    def end(self, act: ActiveJob, status: JobStatus = JobStatus.COMPLETED) -> None:
        self.book.finish(act, status, Reason.EXIT_CODE, "ended", 0, ended_at=self.clock.now)
        self.soon.run()


def status(act: ActiveJob) -> str:
    return act.job.status.value


# -- reservations and backfill ----------------------------------------------------------------


def test_an_exclusive_or_multi_slot_cpu_job_is_not_starved_by_one_slot_jobs() -> None:
    # The cpu pool had no reservation: each slot that freed went to the next one-slot job,
    # and the better job needing the whole pool (or two slots) ran once the queue was empty.
    for spec, needs in (
        ({"exclusive": True}, "an exclusive job"),
        ({"kind": "service", "replicas": 2, "port": False}, "2 cpu slots"),
    ):
        box = Box(gpus=0)
        first, second = box.run(), box.run()
        better = box.run(priority=5, **spec)
        stream = [box.run() for _ in range(4)]
        assert status(better) == "queued", needs
        box.end(first)  # a slot frees: kept for the better job, not given to the stream
        assert all(status(s) == "queued" for s in stream), needs
        assert stream[0].job.message.startswith(
            f"waiting: cpu reserved for job {better.job.id} until it can start"
        ), stream[0].job.message
        assert "cpu reserved for it" in better.job.message
        box.end(second)
        assert status(better) == "running", needs
        assert all(status(s) == "queued" for s in stream), needs


def test_a_one_slot_cpu_job_first_in_line_is_not_kept_off_by_a_bigger_one_behind() -> None:
    box = Box(gpus=0)
    first, second = box.run(), box.run()
    one = box.run(priority=5)  # the best: reserves nothing (the next free slot is its)
    big = box.run(priority=1, exclusive=True)  # behind it: must not keep it off
    box.end(first)
    assert status(one) == "running" and status(big) == "queued"
    box.end(second)
    box.end(one)
    assert status(big) == "running"


def test_a_cpu_job_with_a_timeout_that_ends_first_backfills_the_pool() -> None:
    box = Box(gpus=0)
    first = box.run(timeout=100)
    second = box.run(timeout=100)
    big = box.run(priority=5, exclusive=True)
    box.end(first)  # the pool is kept for `big` from ~100 s (second's timeout)
    longer = box.run(timeout=500)
    assert status(longer) == "queued" and "a job with a timeout that ends before" in (
        longer.job.message
    )
    short = box.run(timeout=50)
    assert status(short) == "running"  # ends before the reservation starts
    assert status(big) == "queued"
    box.end(second)
    box.end(short)
    assert status(big) == "running"


def test_a_two_gpu_job_is_not_starved_by_a_stream_of_one_gpu_jobs() -> None:
    box = Box(gpus=2)
    first, second = box.run(gpus=1), box.run(gpus=1)
    big = box.run(gpus=2)
    stream = [box.run(gpus=1) for _ in range(4)]
    assert status(big) == "queued" and all(status(s) == "queued" for s in stream)
    box.end(first)  # gpu0 frees: it is kept for the 2-GPU job, not given to the stream
    assert status(big) == "queued"
    assert all(status(s) == "queued" for s in stream)
    assert stream[0].job.message.startswith("waiting: gpu0, gpu1 reserved for job 3")
    assert big.job.message.endswith("gpu0, gpu1 reserved for it until it can start")
    # Another of its shape waits behind it, and is not said to have it reserved too
    # (every job of the shape said "reserved for it": tester h189 #2).
    twin = box.run(gpus=2)
    box.soon.run()
    assert status(twin) == "queued" and "reserved for it" not in twin.job.message, twin.job.message
    assert big.job.message.endswith("gpu0, gpu1 reserved for it until it can start")
    box.end(second)  # both free: the 2-GPU job starts at once
    assert status(big) == "running" and sorted(big.job.domains) == ["gpu0", "gpu1"]
    box.end(big)
    assert [status(s) for s in stream] == ["running", "running", "queued", "queued"]


def test_without_reservations_the_stream_starves_the_big_job() -> None:
    box = Box(gpus=2, reserve=False)
    first, second = box.run(gpus=1), box.run(gpus=1)
    big = box.run(gpus=2)
    stream = [box.run(gpus=1) for _ in range(2)]
    box.end(first)
    assert status(stream[0]) == "running" and status(big) == "queued"
    box.end(second)
    assert status(stream[1]) == "running" and status(big) == "queued"  # (what issue 18 saw)


def test_a_service_of_several_replicas_is_not_starved_either() -> None:
    box = Box(gpus=3)
    first, second, third = (box.run(gpus=1) for _ in range(3))
    service = box.run(gpus=1, replicas=2, kind="service")
    stream = [box.run(gpus=1) for _ in range(3)]
    box.end(first)  # gpu0 frees: it is kept for the service's replicas
    assert status(service) == "queued" and all(status(s) == "queued" for s in stream)
    assert service.job.message.endswith("reserved for it until it can start")
    box.end(second)
    assert status(service) == "running" and sorted(service.job.domains) == ["gpu0", "gpu1"]
    box.end(third)
    assert status(stream[0]) == "running"


def test_a_job_that_ends_before_the_reservation_backfills_it() -> None:
    box = Box(gpus=2)
    box.run(gpus=1)
    timed = box.run(gpus=1, timeout=3600)  # gpu1 frees within the hour at the latest
    big = box.run(gpus=2)
    short = box.run(gpus=1, timeout=600)  # sure to end before: may use the free GPU
    untimed = box.run(gpus=1)
    assert status(big) == "queued"
    box.end(box.book.get(1))  # type: ignore[arg-type]
    assert status(short) == "running" and status(untimed) == "queued"
    box.end(short)  # gpu0 free again: a job with no time limit is kept off it
    assert status(untimed) == "queued" and status(big) == "queued"
    assert untimed.job.message.startswith("waiting: gpu0, gpu1 reserved for job 3 from ~")
    assert "from ~" in untimed.job.message and " (in 60 min) " in untimed.job.message
    assert status(timed) == "running"


def test_a_short_job_backfills_even_behind_a_same_shaped_job_without_a_timeout() -> None:
    # Grouped by shape and user alone, the short job sat behind the untimed one (only a
    # group's head is tried) and waited, its reason saying it could have gone.
    box = Box(gpus=2)
    box.run(gpus=1, timeout=60)
    big = box.run(gpus=2)
    untimed = box.run(gpus=1)
    short = box.run(gpus=1, timeout=5)
    assert status(big) == "queued" and status(untimed) == "queued"
    assert status(short) == "running" and short.job.domains == ["gpu1"]


def test_a_reservation_holds_while_the_last_sample_still_lists_an_ended_jobs_memory() -> None:
    # Until the next sample, the memory of a job that just ended was read as a stranger's
    # (unregistered): its GPU looked as if it might never free up, the reservation for
    # the big job behind lapsed, and a job queued after it took the GPU.
    box = Box(gpus=2)
    first, second = box.run(gpus=1, vram_gb=60), box.run(gpus=1, vram_gb=60)
    pids = {first.job.id: 1001, second.job.id: 1002}
    for act in (first, second):
        dom = box.scheduler.domains[act.job.domains[0]]
        pid = pids[act.job.id]
        assert dom.gpu_index is not None
        dom.apply_sample(gpu(dom.gpu_index, used_gib=60, procs=((pid, 60),)), {pid: act.job.id}, {})
    big = box.run(gpus=2, vram_gb=70)
    small = box.run(gpus=1)
    assert status(big) == "queued" and status(small) == "queued"
    box.end(first)  # (no new sample yet: it still lists first's 60 GiB)
    assert status(small) == "queued", small.job.message
    assert small.job.message.startswith("waiting: gpu0, gpu1 reserved for job 3")
    gone = box.scheduler.domains[first.job.domains[0]]
    assert gone.account is not None
    assert gone.account.unregistered == 0 and gone.account.leaving == 60 * GIB
    # The next sample shows it free; a process it left behind would be a stranger's.
    assert gone.gpu_index is not None
    gone.apply_sample(gpu(gone.gpu_index, used_gib=5, procs=((1003, 5),)), {1003: None}, {})
    assert gone.account is not None and gone.account.leaving == 0
    assert gone.account.unregistered == 5 * GIB


def test_why_tells_each_job_of_the_reservation_that_concerns_it() -> None:
    # The pass's first reservation was shown for every job: a cpu job was told of GPUs
    # kept for another, and its own reason said otherwise.
    box = Box(gpus=2)
    box.run(gpus=2)
    gpu_job = box.run(gpus=1)
    box.run(gpus=0), box.run(gpus=0)
    exclusive = box.run(gpus=0, exclusive=True)
    cpu_job = box.run(gpus=0)
    assert [status(a) for a in (gpu_job, exclusive, cpu_job)] == ["queued"] * 3

    def reserved(act: ActiveJob) -> tuple[Any, Any]:
        said = box.queue.explain(act.job.id)["reservation"]
        assert isinstance(said, dict), said
        return said["job"], said["domains"]

    assert reserved(gpu_job) == (gpu_job.job.id, ["gpu0"])
    assert reserved(exclusive) == (exclusive.job.id, ["cpu"])
    assert reserved(cpu_job) == (exclusive.job.id, ["cpu"])


def test_a_reservation_never_waits_on_a_foreign_process() -> None:
    # gpu1 is taken by memory the engine does not own: it is not reserved (it may never
    # free up), so jobs that fit elsewhere keep running.
    box = Box(gpus=2)
    box.scheduler = machine(gpu(0), gpu(1, used_gib=79, procs=((4242, 79),)))
    box.queue._scheduler = box.scheduler
    big = box.run(gpus=2, vram_gb=40)
    small = box.run(gpus=1, vram_gb=10)
    assert status(small) == "running" and status(big) == "queued"


def test_a_reservation_never_waits_on_a_service() -> None:
    # A service runs until someone stops it: a 4-GPU job behind two of its replicas
    # kept the two free GPUs idle for ever ("reserved ... until it can start").
    box = Box(gpus=4)
    service = box.run(gpus=1, replicas=2, kind="service")
    assert status(service) == "running"
    big = box.run(gpus=4)
    small = box.run(gpus=1)
    assert status(big) == "queued" and status(small) == "running"
    assert "reserved" not in big.job.message


def test_a_reservation_whose_start_is_unknown_does_not_offer_backfill() -> None:
    box = Box(gpus=2)
    box.run(gpus=1)  # no timeout: when gpu0 frees is not known
    big = box.run(gpus=2)
    short = box.run(gpus=1, timeout=60)
    assert status(big) == "queued" and status(short) == "queued"
    assert short.job.message == (
        "waiting: gpu0, gpu1 reserved for job 2 until it can start (it is not known when: "
        "the jobs it waits for have no timeout)"
    )


# -- per-user limits ---------------------------------------------------------------------------


def test_a_job_past_its_users_limit_on_its_own_fails_at_once_and_on_a_reload() -> None:
    # It could never start while the limit stands: it waited for ever, its reason saying
    # "0 running now".
    box = Box(gpus=4, users={"default": UserLimits(max_gpus=2, max_vram_gb=100)})
    too_many = box.run(gpus=3)
    assert status(too_many) == "failed"
    assert too_many.job.termination_reason is Reason.OVER_CAPACITY
    assert too_many.job.message == (
        f"needs 3 GPUs and user {user_label(ME)} may run 2 GPUs at once ([users.default] max_gpus)"
    )
    too_big = box.run(gpus=2, vram_gb=60)
    assert status(too_big) == "failed" and "declares 120 GiB of VRAM" in too_big.job.message
    box.run(gpus=2)  # (both GPUs of the limit in use)
    waiting = box.run(gpus=2)
    assert status(waiting) == "queued"
    box.queue.limits = Limits({"default": UserLimits(max_gpus=1)})  # a reload lowers it
    box.queue.recheck_capacity()
    assert status(waiting) == "failed" and "may run 1 GPU at once" in waiting.job.message


def test_a_job_waiting_for_its_dependency_fails_on_a_reload_that_lowers_the_limit() -> None:
    # It was not checked while it waited for its dependency, and once that completed it
    # waited for ever ("user root's limit: 2 GPUs ..., 0 running now").
    box = Box(gpus=4)
    parent = box.run(gpus=1)
    after = box.run(gpus=3, depends_on=[parent.job.id], deps=[(parent.job.id, False, None)])
    fits = box.run(gpus=2, depends_on=[parent.job.id], deps=[(parent.job.id, False, None)])
    assert status(after) == status(fits) == "queued"
    box.queue.limits = Limits({"default": UserLimits(max_gpus=2)})  # a reload lowers it
    box.queue.recheck_capacity()
    assert status(after) == "failed" and after.job.termination_reason is Reason.OVER_CAPACITY
    assert "may run 2 GPUs at once" in after.job.message
    assert status(fits) == "queued" and fits.job.message == f"waiting for job {parent.job.id}"
    box.end(parent)
    assert status(fits) == "running"


def test_a_user_past_its_gpu_limit_waits_and_others_go_on() -> None:
    box = Box(gpus=3, users={"default": UserLimits(max_gpus=1)})
    mine = [box.run(uid=ME, gpus=1) for _ in range(2)]
    theirs = box.run(uid=OTHER, gpus=1)
    assert [status(a) for a in mine] == ["running", "queued"]
    assert status(theirs) == "running"
    assert mine[1].job.message == (
        f"user {user_label(ME)}'s limit: 1 GPU running at once ([users.default] "
        "max_gpus), 1 running now"
    )
    box.end(mine[0])
    assert status(mine[1]) == "running"


def test_why_names_the_domain_out_of_service_a_limit_hides() -> None:
    # The reason is the first blocker: a user's limit hid the drained (or quarantined)
    # GPU a pinned job waited for, and raising the limit would not start it (h148).
    from gpulayer_tui.formatting import why_lines

    box = Box(gpus=3, users={"default": UserLimits(max_gpus=1)})
    running = box.run(gpus=1, domain="gpu0")
    box.scheduler.domains["gpu1"].drain("fan swap")
    pinned = box.run(gpus=1, domain="gpu1")
    anywhere = box.run(gpus=1)
    assert status(running) == "running" and "max_gpus" in pinned.job.message
    said = box.queue.explain(pinned.job.id)["out_of_service"]
    assert said == ["domain gpu1 draining: fan swap"]
    lines = why_lines(box.queue.explain(pinned.job.id))
    assert "  also needs  domain gpu1 draining: fan swap (back in service)" in lines, lines
    # (gpu2 is in service: a job that may run anywhere needs nothing back)
    assert box.queue.explain(anywhere.job.id)["out_of_service"] == []


def test_a_users_own_table_overrides_the_default() -> None:
    users = {"default": UserLimits(max_gpus=1), user_label(OTHER): UserLimits(max_gpus=2)}
    box = Box(gpus=3, users=users)
    theirs = [box.run(uid=OTHER, gpus=1) for _ in range(3)]
    assert [status(a) for a in theirs] == ["running", "running", "queued"]
    assert f"[users.{user_label(OTHER)}] max_gpus" in theirs[2].job.message
    # A table written by uid is named as written: "[users.nobody]" named a table the
    # file does not have (tester h179 #5).
    by_uid = Box(gpus=3, users={str(OTHER): UserLimits(max_gpus=1)})
    first, second = by_uid.run(uid=OTHER, gpus=1), by_uid.run(uid=OTHER, gpus=1)
    assert status(first) == "running" and status(second) == "queued"
    assert f"([users.{OTHER}] max_gpus)" in second.job.message, second.job.message


def test_each_limit_is_credited_to_the_table_that_sets_it() -> None:
    # A user's own table for one key made every limit read as set there: "[users.root]
    # max_gpus" where only [users.default] set it.
    from gpulayer_tui.formatting import why_lines

    me = user_label(ME)
    users = {"default": UserLimits(max_gpus=1), me: UserLimits(max_priority=10)}
    box = Box(gpus=2, users=users)
    first, second = box.run(gpus=1), box.run(gpus=1)
    assert status(first) == "running" and status(second) == "queued"
    assert "([users.default] max_gpus)" in second.job.message, second.job.message
    with pytest.raises(SpecError, match=rf"\(\[users\.{me}\] max_priority\)"):
        box.queue.limits.check_priority(ME, 11)
    lines = why_lines(box.queue.explain(second.job.id))
    said = next(line for line in lines if line.startswith("  limits"))
    assert said.startswith(
        f"  limits      max_gpus 1 ([users.default]); max_priority 10 ([users.{me}]); running"
    ), said
    assert "  waits for" not in "\n".join(lines)
    one = {"job": 5, "waiting": True, "status": "queued", "priority": 0, "user": me}
    text = "\n".join(why_lines({**one, "waiting_for_jobs": [4], "preempting": [3]}))
    assert "  waits for   job 4\n" in text and text.endswith("  preempting  job 3")
    text = "\n".join(why_lines({**one, "waiting_for_jobs": [1, 2]}))
    assert "  waits for   jobs 1, 2\n" in text
    # No limit set anywhere: "none", not "none ([users.default])" of a table not there.
    unset = {"from": "[users.default]", "tables": {}, "running_gpus": 0}
    text = "\n".join(why_lines({**one, "limits": unset}))
    assert "  limits      none; running jobs hold 0 GPU slots" in text


def test_a_reservation_far_off_says_its_day_and_how_far() -> None:
    # "from ~12:01" at 11:02 read as within the hour; it was 25 h away.
    from gpulayer_tui.engine.fairness import clock_and_wait

    now = time.mktime((2026, 12, 2, 11, 2, 0, 0, 0, -1))
    assert clock_and_wait(now + 30, now) == "11:02 (in 30 s)"
    assert clock_and_wait(now + 59 * 60, now) == "12:01 (in 59 min)"
    assert clock_and_wait(now + 25 * 3600 - 60, now) == "Thu 03 Dec 12:01 (in 25 h)"
    assert clock_and_wait(now + 3 * 86400, now) == "Sat 05 Dec 11:02 (in 3 days)"


def test_a_uid_with_no_name_has_a_table_by_its_number() -> None:
    # A uid with no passwd entry (a container's `-u 4321`) is shown by its number, and
    # could not be given limits: a table had to name a user.
    from gpulayer_tui.engine.config import ConfigError, parse_config_text

    nameless = 54_321
    with pytest.raises(KeyError):
        pwd.getpwuid(nameless)
    config = parse_config_text(f"[users.{nameless}]\nmax_gpus = 1\n")
    box = Box(gpus=3, users=config.users)
    theirs = [box.run(uid=nameless, gpus=1) for _ in range(2)]
    assert [status(a) for a in theirs] == ["running", "queued"]
    assert f"user {nameless}'s limit: 1 GPU running at once ([users.{nameless}] max_gpus)" in (
        theirs[1].job.message
    )
    with pytest.raises(ConfigError, match=r"no user named 'nosuchuser' on this machine \(a uid"):
        parse_config_text("[users.nosuchuser]\nmax_gpus = 1\n")
    with pytest.raises(ConfigError, match=r"users.99999999999: not a uid \(at most 4294967294\)"):
        parse_config_text("[users.99999999999]\nmax_gpus = 1\n")
    # One user under its name and its number: the last won, and a swap said no change.
    me = user_label(ME)
    with pytest.raises(ConfigError, match=rf"users.{ME} and users.{me} are the same user"):
        parse_config_text(f"[users.{ME}]\nmax_gpus = 5\n[users.{me}]\nmax_gpus = 1\n")


def test_the_declared_vram_limit_counts_running_jobs() -> None:
    box = Box(gpus=2, users={"default": UserLimits(max_vram_gb=50)})
    first = box.run(gpus=1, vram_gb=30)
    second = box.run(gpus=1, vram_gb=30)
    assert status(first) == "running" and status(second) == "queued"
    assert "50 GiB of declared VRAM running" in second.job.message


# -- fair share ------------------------------------------------------------------------------


def test_the_user_with_less_recent_use_goes_first_within_a_priority() -> None:
    box = Box(gpus=1)
    blocker = box.run(uid=ME, gpus=1)
    box.queue.fair.charge(ME, 36_000, box.clock.now)  # 10 GPU-hours lately
    heavy = box.run(uid=ME, gpus=1)  # submitted first...
    light = box.run(uid=OTHER, gpus=1)  # ... but this user used less
    box.end(blocker)
    assert status(light) == "running" and status(heavy) == "queued"


def test_priority_comes_before_fair_share() -> None:
    box = Box(gpus=1)
    blocker = box.run(uid=ME, gpus=1)
    box.queue.fair.charge(ME, 36_000, box.clock.now)
    urgent = box.run(uid=ME, gpus=1, priority=5)
    light = box.run(uid=OTHER, gpus=1)
    box.end(blocker)
    assert status(urgent) == "running" and status(light) == "queued"


def test_recent_use_decays_with_the_half_life_and_running_jobs_count() -> None:
    box = Box(gpus=2, fairshare_half_life=3600)
    box.queue.fair.charge(ME, 1000, box.clock.now)
    box.clock.now += 3600
    assert box.queue.fair.usage(ME, box.clock.now) == pytest.approx(500)
    running = box.run(uid=OTHER, gpus=1)
    box.clock.now += 100
    held = box.queue.running_by_user(box.clock.now)
    assert held[OTHER].gpus == 1 and held[OTHER].gpu_seconds == pytest.approx(100)
    box.end(running)  # its 100 GPU-seconds are booked to its user
    assert box.queue.fair.usage(OTHER, box.clock.now) == pytest.approx(100)


def test_a_users_share_divides_its_usage() -> None:
    users = {user_label(ME): UserLimits(share=10)}
    box = Box(gpus=1, users=users)
    blocker = box.run(uid=OTHER, gpus=1)
    box.queue.fair.charge(ME, 5000, box.clock.now)
    box.queue.fair.charge(OTHER, 1000, box.clock.now)
    mine = box.run(uid=ME, gpus=1)
    theirs = box.run(uid=OTHER, gpus=1)
    box.end(blocker)
    # 5000 / 10 < 1000 (+ its running job's time): ME goes first.
    assert status(mine) == "running" and status(theirs) == "queued"
    # `users` (and `why`) list them in that order, each with the GPU-hours it used: they
    # showed the quotient as "GPU-H" (ME at 0.14 for 1.39 hours used) and sorted its
    # rounded value, by name on a tie, against the scheduler's true order.
    rows = box.queue.users_view()
    assert [(r["user"], r["gpu_hours"], r["share"]) for r in rows] == [
        (user_label(ME), round(5000 / 3600, 4), 10),
        (user_label(OTHER), round(1000 / 3600, 4), 1),
    ]
    assert rows[0]["fair_usage"] == pytest.approx(5000 / 3600 / 10)


def test_users_lists_a_user_whose_running_jobs_are_all_cpu_jobs() -> None:
    # Only GPU holders, waiting users and recent use were listed: one running CPU jobs
    # alone was missing.
    box = Box(gpus=1)
    box.run(uid=OTHER, gpus=0)
    rows = box.queue.users_view()
    assert [(r["user"], r["running_jobs"], r["running_gpus"]) for r in rows] == [
        (user_label(OTHER), 1, 0)
    ]


def test_users_alike_as_shown_are_listed_in_the_schedulers_order() -> None:
    box = Box(gpus=1)
    box.queue.fair.charge(ME, 1000.0, box.clock.now)
    box.queue.fair.charge(OTHER, 1000.1, box.clock.now)  # (0.2778 GPU-hours both)
    rows = box.queue.users_view()
    assert [r["gpu_hours"] for r in rows] == [0.2778, 0.2778]
    # (Shown to 4 places: 9 GPU-seconds read "0" at 2.)
    box.queue.fair.charge(ME, 9.0, box.clock.now)
    assert box.queue.users_view()[1]["gpu_hours"] == 0.2803
    # By name, nobody came before root; the scheduler takes root (less use) first.
    assert [r["user"] for r in rows] == [user_label(ME), user_label(OTHER)]


# -- through a real engine ---------------------------------------------------------------------


async def test_a_submission_past_max_queued_is_refused_and_nothing_is_stored(
    make_engine: EngineFactory,
) -> None:
    config = make_config(users={"default": {"max_queued": 2}})
    engine = await make_engine("1xA100-80GB", config=config)
    await engine.submit({"command": ["sleep", "60"], "gpus": 1})  # runs
    for _ in range(2):
        await engine.submit({"command": ["true"], "gpus": 1})  # wait
    before = len(await engine.list_jobs())
    with pytest.raises(Overloaded, match=r"max_queued\); nothing was stored"):
        await engine.submit({"command": ["true"], "gpus": 1})
    assert len(await engine.list_jobs()) == before


@pytest.mark.parametrize("cleaned", [False, True])
async def test_fair_share_outlives_a_restart_and_a_clean_of_the_history(
    make_engine: EngineFactory, cleaned: bool
) -> None:
    # Rebuilt from the job rows at every start: `clean` (or [history] keep_jobs) wiped
    # the use of the jobs it removed, once the engine restarted.
    engine = await make_engine("1xA100-80GB")
    job = await engine.submit({"command": ["sleep", "0.3"], "gpus": 1})
    await engine.wait(job.id, timeout=10)
    uid = os.geteuid()
    used = engine.queue.fair.usage(uid, time.time())
    assert used > 0
    if cleaned:
        assert (await engine.retention.clean(time.time() + 1, None))["jobs"] == 1
    await engine.stop()
    again = await make_engine("1xA100-80GB")
    assert (await again.list_jobs() == []) is cleaned
    assert again.queue.fair.usage(uid, time.time()) == pytest.approx(used, rel=0.05)


async def test_a_gpu_job_that_ended_while_no_engine_ran_is_booked(
    make_engine: EngineFactory,
) -> None:
    # Its end learnt at the restart, it held no domain again, and its run was not booked:
    # stopping the engine dodged fair share.
    from .conftest import eventually, pid_reaped

    engine = await make_engine("1xA100-80GB")
    job = await engine.submit({"command": ["sleep", "0.5"], "gpus": 1})
    await engine.stop()
    await eventually(lambda: pid_reaped(job.pid or 0), timeout=10)
    again = await make_engine("1xA100-80GB")
    done = await again.wait(job.id, timeout=10)
    assert done.started_at is not None and done.ended_at is not None
    used = again.queue.fair.usage(os.geteuid(), done.ended_at)
    assert used == pytest.approx(done.ended_at - done.started_at, abs=0.05)


# -- preemption ------------------------------------------------------------------------------


def _stopping(victim: ActiveJob) -> int:
    """What the engine's preempt does first: the stop is decided (the queue counts the
    job as being stopped for its urgent job while it runs with that)."""
    victim.job.stop_reason = TerminationReason.PREEMPTED
    return victim.job.id


def test_a_job_that_waited_long_enough_preempts_lower_priority_preemptible_jobs() -> None:
    box = Box(gpus=2, preempt_after=60)
    stopped: list[tuple[int, int]] = []
    box.queue.preempt = lambda victim, by: stopped.append((_stopping(victim), by.job.id))
    keeper = box.run(gpus=1, priority=0)  # not preemptible: never chosen
    victim = box.run(gpus=1, priority=0, preemptible=True)
    urgent = box.run(gpus=1, priority=5)
    urgent.job.queued_at = box.clock.now
    box.clock.now += 30
    box.queue.schedule()
    assert stopped == []  # it has not waited long enough
    box.clock.now += 31
    box.queue.schedule()
    assert stopped == [(victim.job.id, urgent.job.id)]
    assert urgent.job.message.endswith(f"stopping preemptible job {victim.job.id} for it")
    box.queue.schedule()
    assert len(stopped) == 1  # once: the stop is under way
    assert keeper.job.status is JobStatus.RUNNING


def _exited_and_back_in_the_queue(box: Box, victim: ActiveJob) -> None:
    """A preempted job exits and goes back to ``queued``, as the batch runner does it."""
    release_holds(victim)
    victim.job.stop_reason = None
    box.book.transition(victim, JobStatus.QUEUED, message="preempted; back in the queue")


def _two_slot_box() -> tuple[Box, list[int]]:
    """One GPU of two slots, preemption at once; the ids of the jobs it stops."""
    box = Box(gpus=1, preempt_after=0)
    box.scheduler.domains["gpu0"].slots = 2
    stopped: list[int] = []
    box.queue.preempt = lambda victim, by: stopped.append(_stopping(victim))
    return box, stopped


def test_one_job_of_a_two_slot_domain_is_stopped_when_one_slot_is_enough() -> None:
    # Both preemptible jobs of a 2-slot GPU were stopped (a domain counted as freed only
    # once every job there left): the urgent job needed one slot.
    box, stopped = _two_slot_box()
    first = box.run(gpus=1, preemptible=True)
    box.clock.now += 1
    second = box.run(gpus=1, preemptible=True)
    assert first.job.status is second.job.status is JobStatus.RUNNING
    urgent = box.run(gpus=1, priority=5)
    urgent.job.queued_at = box.clock.now - 100
    box.queue.schedule()
    assert stopped == [second.job.id]  # (the newest: the least work lost)
    # Requeued and started again ahead of it (its stop done), the victim is no longer
    # "being stopped" for it: the urgent job asks again (it waited for ever).
    second.job.stop_reason = None
    box.queue.schedule()
    assert stopped == [second.job.id, second.job.id]


def test_a_job_stopped_for_another_lets_it_start_first() -> None:
    # Requeued, the victim took its slot back while the GPU still showed its memory (the
    # urgent job's VRAM did not fit yet): the urgent job waited for ever behind it.
    box = Box(gpus=1, preempt_after=0)
    stopped: list[int] = []
    box.queue.preempt = lambda victim, by: stopped.append(_stopping(victim))
    victim = box.run(gpus=1, preemptible=True)  # (no VRAM declared)
    urgent = box.run(gpus=1, priority=5, vram_gb=50)
    urgent.job.queued_at = box.clock.now - 100
    box.queue.schedule()
    assert stopped == [victim.job.id]
    # It exits and is requeued, as the batch runner does it; the GPU's next sample still
    # shows its 40 GiB (a process no job holds there now).
    _exited_and_back_in_the_queue(box, victim)
    stale = ProbeResult(ProbeStatus.OK, (gpu(0, used_gib=40, procs=((4242, 40),)),))
    box.scheduler.observe(stale, {}, {})
    box.queue.requeued(victim)
    box.queue.schedule()
    assert victim.job.status is JobStatus.QUEUED, victim.job.message
    assert victim.job.message == f"preempted for job {urgent.job.id}, which starts first"
    assert urgent.job.status is JobStatus.QUEUED
    box.scheduler.observe(ProbeResult(ProbeStatus.OK, (gpu(0),)), {}, {})  # (freed)
    box.queue.schedule()
    assert urgent.job.status is JobStatus.RUNNING


def _calling_off(box: Box) -> list[tuple[int, str]]:
    """What the engine's call-off does while a stop is in its checkpoint lead."""
    called: list[tuple[int, str]] = []

    def call_off(victim: ActiveJob, why: str) -> None:
        victim.job.stop_reason = None
        called.append((victim.job.id, why))

    box.queue.call_off = call_off
    return called


def test_a_preemption_whose_job_could_not_start_after_it_is_called_off() -> None:
    # A drain (or quarantine) of the GPU, or a job taking the other GPU it needed, came
    # while the victim was in its checkpoint lead: it was stopped all the same, and both
    # jobs then waited, the GPU idle.
    for change in ("drain", "taken"):
        box = Box(gpus=2, preempt_after=0)
        stopped: list[int] = []
        box.queue.preempt = lambda victim, by: stopped.append(_stopping(victim))  # noqa: B023
        called = _calling_off(box)
        victim = box.run(gpus=1, preemptible=True, domain="gpu1")
        urgent = box.run(
            gpus=2 if change == "taken" else 1,
            priority=5,
            domain=None if change == "taken" else "gpu1",
        )
        box.queue.schedule()
        assert stopped == [victim.job.id]
        assert urgent.job.message.endswith(f"; stopping preemptible job {victim.job.id} for it")
        if change == "drain":
            box.scheduler.domains["gpu1"].drain("maintenance")
        else:
            other = box.run(gpus=1, priority=9, domain="gpu0")  # (gpu0 was free)
            assert other.job.status is JobStatus.RUNNING
        box.queue.schedule()
        assert called == [
            (
                victim.job.id,
                f"the job it was for, job {urgent.job.id}, could not start once it stopped",
            )
        ], change
        assert "stopping preemptible" not in urgent.job.message


def test_a_pause_calls_off_a_preemption_in_its_lead() -> None:
    closed: list[str] = []
    box = Box(gpus=1, preempt_after=0)
    box.queue._gate = lambda: closed[0] if closed else None
    stopped: list[int] = []
    box.queue.preempt = lambda victim, by: stopped.append(_stopping(victim))
    called = _calling_off(box)
    victim = box.run(gpus=1, preemptible=True)
    box.run(gpus=1, priority=5)
    box.queue.schedule()
    assert stopped == [victim.job.id]
    closed.append("the queue has been paused since 10:00:00 (gpulayer-tui resume)")
    box.queue.schedule()
    assert called == [(victim.job.id, f"the queue is closed: {closed[0]}")]


def test_no_second_job_of_a_shared_gpu_is_stopped_while_the_first_ones_memory_shows() -> None:
    # The first victim exited; the GPU's reading still showed its memory, so the urgent job
    # did not fit yet, and the other job of the GPU was stopped too (its work lost).
    box, stopped = _two_slot_box()
    first = box.run(gpus=1, preemptible=True, vram_gb=30)
    box.clock.now += 1
    second = box.run(gpus=1, preemptible=True, vram_gb=30, priority=1)
    urgent = box.run(gpus=1, priority=10, vram_gb=45)
    urgent.job.queued_at = box.clock.now - 100
    box.queue.schedule()
    assert stopped == [first.job.id]
    _exited_and_back_in_the_queue(box, first)
    # (the first's process, gone, still listed; the second's, its job's)
    stale = ProbeResult(ProbeStatus.OK, (gpu(0, used_gib=60, procs=((4242, 30), (4243, 30))),))
    box.scheduler.observe(stale, {4243: second.job.id}, {})
    box.queue.requeued(first)
    box.queue.schedule()
    assert stopped == [first.job.id] and second.job.status is JobStatus.RUNNING
    assert urgent.job.status is JobStatus.QUEUED


def test_only_the_job_a_preemption_is_for_says_so() -> None:
    # Two waiting jobs of the same shape both said "stopping preemptible job N for it".
    box, stopped = _two_slot_box()
    box.scheduler.domains["gpu0"].slots = 1
    victim = box.run(gpus=1, preemptible=True)
    urgent = box.run(gpus=1, priority=15)
    later = box.run(gpus=1, priority=15)
    box.queue.schedule()
    assert stopped == [victim.job.id]
    assert urgent.job.message.endswith(f"; stopping preemptible job {victim.job.id} for it")
    assert "stopping" not in later.job.message, later.job.message
    # Its victim gone, it starts, and says so (its group's reason was written over it).
    _exited_and_back_in_the_queue(box, victim)
    box.queue.requeued(victim)
    box.queue.schedule()
    assert urgent.job.status is JobStatus.RUNNING
    assert urgent.job.message == "running", urgent.job.message


def test_preemption_stops_the_fewest_jobs_not_every_one_taken_on_the_way() -> None:
    # Newest first, a 10 GiB job was taken, then the 60 GiB one that alone made room:
    # both were stopped.
    box, stopped = _two_slot_box()
    big = box.run(gpus=1, preemptible=True, vram_gb=60)
    box.clock.now += 1
    small = box.run(gpus=1, preemptible=True, vram_gb=10)
    assert big.job.status is small.job.status is JobStatus.RUNNING
    urgent = box.run(gpus=1, priority=5, vram_gb=50)
    urgent.job.queued_at = box.clock.now - 100
    box.queue.schedule()
    assert stopped == [big.job.id]


def test_equal_priority_never_preempts() -> None:
    box = Box(gpus=1, preempt_after=0)
    stopped: list[int] = []
    box.queue.preempt = lambda victim, by: stopped.append(_stopping(victim))
    box.run(gpus=1, preemptible=True)
    waiting = box.run(gpus=1)
    waiting.job.queued_at = box.clock.now - 100
    box.queue.schedule()
    assert stopped == []


PREEMPTIBLE = r"""
import os, signal, sys, time
log = sys.argv[1]
def say(word):
    with open(log, "a") as f:
        f.write(word + "\n")
def checkpoint(*_):
    say("checkpoint")
def term(*_):
    say("term")
    sys.exit(3)
signal.signal(signal.SIGUSR1, checkpoint)
signal.signal(signal.SIGTERM, term)
runs = open(log).read().count("start") if os.path.exists(log) else 0
say("start")
print(f"run {runs}", flush=True)  # (to its job's log)
if runs:  # its second run: done at once
    sys.exit(0)
time.sleep(60)
"""


async def test_preemption_end_to_end_checkpoint_signal_then_requeue(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    from .conftest import eventually

    config = make_config(
        scheduling={"preempt_after": 0, "checkpoint_signal": "SIGUSR1", "checkpoint_grace": 0.5}
    )
    engine = await make_engine("1xA100-80GB", config=config)
    log = tmp_path / "victim.log"
    script = tmp_path / "victim.py"
    script.write_text(PREEMPTIBLE)
    victim = await engine.submit(
        {"command": ["python3", str(script), str(log)], "gpus": 1, "preemptible": True}
    )
    await eventually(lambda: log.exists() and "start" in log.read_text(), timeout=10)
    urgent = await engine.submit({"command": ["true"], "gpus": 1, "priority": 5})
    done = await engine.wait(urgent.id, timeout=30)
    assert done.status is JobStatus.COMPLETED
    again = await engine.wait(victim.id, timeout=30)
    assert again.status is JobStatus.COMPLETED and again.attempt == 1
    assert log.read_text().split() == ["start", "checkpoint", "term", "start"]
    # Both its runs held the GPU: both are booked to its user (the first was not; each
    # start resets started_at), and so is the urgent job.
    ran = [e["at"] for e in await engine.events_of(victim.id) if e.get("status") == "running"]
    first_run = (
        next(
            e["at"]
            for e in await engine.events_of(victim.id)
            if e.get("status") == "queued" and "preempted" in (e.get("message") or "")
        )
        - ran[0]
    )
    assert again.started_at is not None and again.ended_at is not None
    second_run = again.ended_at - again.started_at
    assert done.started_at is not None and done.ended_at is not None
    urgent_run = done.ended_at - done.started_at
    booked = engine.queue.fair.usage(os.geteuid(), again.ended_at)
    assert booked == pytest.approx(first_run + second_run + urgent_run, rel=0.05, abs=0.05)
    events = await engine.events_of(victim.id)
    requeued = [
        e for e in events if e.get("status") == "queued" and "preempted" in (e.get("message") or "")
    ]
    assert requeued and "preempted by job" in requeued[0]["message"]
    assert "requeued once" in requeued[0]["message"]
    # Its second run continued its job's log, after a line that says where it begins;
    # nothing was set aside as an older file.
    job_log = engine.log_path(victim.id)
    first, stopped, marker, second = job_log.read_text().split("\n")[:4]
    assert (first, second) == ("run 0", "run 1")
    # (and, before it, where the first run was stopped)
    assert stopped.startswith("--- gpulayer-tui sent SIGTERM (SIGKILL "), stopped
    assert re.fullmatch(
        rf"--- gpulayer-tui: run 2 of job {victim.id}, started at "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ ---",
        marker,
    ), marker
    assert [p.name for p in job_log.parent.glob("*.old-*")] == []


async def test_a_preempted_jobs_next_run_gets_its_whole_timeout(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # As documented: a preempted job runs again from the start, so its timeout counts
    # from that start (not from its first: it would be stopped the moment it ran again).
    from .conftest import eventually

    config = make_config(
        scheduling={"preempt_after": 0, "checkpoint_signal": None}, engine={"grace_period": 0.3}
    )
    engine = await make_engine("1xA100-80GB", config=config)
    log, script = tmp_path / "runs.log", tmp_path / "victim.py"
    script.write_text(
        "import sys, time\n"
        "runs = open(sys.argv[1]).read().count('start') if len(sys.argv) > 1 else 0\n"
        "open(sys.argv[1], 'a').write('start\\n')\n"
        "time.sleep(60 if runs == 0 else 1.5)\n"
    )
    log.write_text("")
    victim = await engine.submit(
        {
            "command": ["python3", str(script), str(log)],
            "gpus": 1,
            "preemptible": True,
            "timeout": 3,
        }
    )
    await eventually(lambda: log.read_text().count("start") == 1, timeout=10)
    first = time.time()
    await eventually(lambda: time.time() > first + 1.5, timeout=10)
    urgent = await engine.submit({"command": ["sleep", "1"], "gpus": 1, "priority": 5})
    assert (await engine.wait(urgent.id, timeout=30)).status is JobStatus.COMPLETED
    done = await engine.wait(victim.id, timeout=30)
    assert log.read_text().count("start") == 2
    assert done.status is JobStatus.COMPLETED, done.message
    assert done.started_at is not None and done.started_at > first + 2.5


SURVIVES_CHECKPOINT = r"""
import os, signal, sys, time
log, go = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGUSR1, lambda *_: None)  # saves a checkpoint, runs on
signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
with open(log, "a") as f:
    f.write("start\n")
while not os.path.exists(go):
    time.sleep(0.02)
"""


async def test_a_requeued_jobs_next_run_is_never_released_for_the_stop_before_it(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # The stop that preempted its first run armed "release it if it outlives SIGKILL";
    # the requeue left that armed, and it went off during the next run: the job ended
    # orphaned (unkillable) while that run went on, and its GPU was given to another job.
    from .conftest import eventually

    config = make_config(
        engine={"release_after": 0.2, "grace_period": 0.3},
        scheduling={"preempt_after": 0, "checkpoint_signal": "SIGUSR1", "checkpoint_grace": 0.2},
    )
    engine = await make_engine("1xA100-80GB", config=config)
    log, go, script = tmp_path / "runs.log", tmp_path / "go", tmp_path / "victim.py"
    script.write_text(SURVIVES_CHECKPOINT)
    victim = await engine.submit(
        {"command": ["python3", str(script), str(log), str(go)], "gpus": 1, "preemptible": True}
    )
    await eventually(lambda: log.exists() and log.read_text().count("start") == 1, timeout=10)
    urgent = await engine.submit({"command": ["true"], "gpus": 1, "priority": 5})
    assert (await engine.wait(urgent.id, timeout=30)).status is JobStatus.COMPLETED
    requeued_by = time.time()
    await eventually(lambda: log.read_text().count("start") == 2, timeout=10)  # its next run
    # Past the moment the old stop's release would have come (its SIGKILL deadline was
    # before the requeue, plus release_after):
    await eventually(lambda: time.time() > requeued_by + 0.3 + 0.2 + 0.5, timeout=10)
    again = await engine.get(victim.id)
    assert again.status is JobStatus.RUNNING, again.message
    go.touch()
    done = await engine.wait(victim.id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.attempt == 1


async def test_a_job_placed_and_preempted_in_one_pass_goes_back_to_the_queue(
    make_engine: EngineFactory,
) -> None:
    # Started by the pass that also preempted it (for a job held back by its user's
    # limit), it ended failed, "stopped before it started" (launch_failed): lost.
    me = user_label(os.geteuid())
    config = make_config(
        scheduling={"preempt_after": 0, "checkpoint_signal": None},
        users={me: {"max_vram_gb": 70}},
    )
    engine = await make_engine("2xA100-80GB", config=config)
    sweep = {"command": ["sleep", "60"], "gpus": 1, "vram_gb": 30, "preemptible": True}
    first = await engine.submit({**sweep, "priority": -5})
    other = await engine.submit({"command": ["sleep", "1"], "gpus": 1})
    second = await engine.submit({**sweep, "priority": -5})
    urgent = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 2, "vram_gb": 30, "priority": 10}
    )
    assert (await engine.wait(other.id, timeout=20)).status is JobStatus.COMPLETED
    await eventually(
        lambda: engine.book.get(urgent.id).job.status is JobStatus.RUNNING,  # type: ignore[union-attr]
        timeout=20,
    )
    for sweep_job in (first, second):
        now = await engine.get(sweep_job.id)
        assert now.status is JobStatus.QUEUED, (sweep_job.id, now.status, now.message)
        assert now.termination_reason is None
    for job in (urgent, first, second):
        await engine.cancel(job.id)


async def test_a_preempted_job_that_asked_not_to_be_requeued_fails(
    make_engine: EngineFactory,
) -> None:
    config = make_config(scheduling={"preempt_after": 0, "checkpoint_signal": None})
    engine = await make_engine("1xA100-80GB", config=config)
    victim = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 1, "preemptible": True, "requeue": False}
    )
    await engine.submit({"command": ["true"], "gpus": 1, "priority": 1})
    ended = await engine.wait(victim.id, timeout=20)
    assert ended.status is JobStatus.FAILED
    assert ended.termination_reason is Reason.PREEMPTED
    assert ended.message.startswith("preempted by job 2 (priority 1) (not requeued)")


async def test_a_job_held_back_by_its_own_users_limit_preempts_that_users_sweeps(
    make_engine: EngineFactory,
) -> None:
    # It waited the sweeps' whole run: preemption looked only at jobs blocked on GPUs,
    # though stopping the user's own preemptible jobs brings it under its limit.
    me = user_label(os.geteuid())
    config = make_config(
        scheduling={"preempt_after": 0, "checkpoint_signal": None},
        users={me: {"max_gpus": 2}},
    )
    engine = await make_engine("3xA100-80GB", config=config)
    sweeps = [
        await engine.submit({"command": ["sleep", "60"], "gpus": 1, "preemptible": True})
        for _ in range(2)
    ]
    assert all(s.status is JobStatus.RUNNING for s in sweeps)
    urgent = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "priority": 5})
    await eventually(
        lambda: engine.book.get(urgent.id).job.status is JobStatus.RUNNING,  # type: ignore[union-attr]
        timeout=20,
    )
    requeued = [await engine.get(s.id) for s in sweeps]
    assert sorted(s.status.value for s in requeued) == ["queued", "running"]
    for job in (urgent, *sweeps):
        await engine.cancel(job.id)


async def test_why_places_a_job_among_those_that_want_what_it_wants(
    make_engine: EngineFactory,
) -> None:
    # A GPU job was "place 91 of 91 (ahead: 114, 115, ...)", those ahead CPU jobs none of
    # which was in its way.
    engine = await make_engine("1xA100-80GB", cpu_count=1)
    cpu = [await engine.submit({"command": ["sleep", "60"]}) for _ in range(3)]
    gpu = [await engine.submit({"command": ["sleep", "60"], "gpus": 1}) for _ in range(2)]
    said = engine.queue.explain(gpu[1].id)
    assert (said["place"], said["ready"], said["ahead"]) == (1, 1, [])
    said = engine.queue.explain(cpu[2].id)
    assert (said["place"], said["ready"], said["ahead"]) == (2, 2, [cpu[1].id])
    for job in (*cpu, *gpu):
        await engine.cancel(job.id)


def test_why_explains_a_waiting_job_through_the_cli(served: Any) -> None:
    import json

    served.start("--simulate", "1xA100-80GB")
    first = served.cli("submit", "--gpus", "1", "--", "sleep", "60").stdout.strip()
    second = served.cli("submit", "--gpus", "1", "--preemptible", "--", "true").stdout.strip()
    text = served.cli("why", second)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"job {second} (queued, priority 0, user ")
    assert any(line.startswith("  place       1 of 1 in line (ahead: none)") for line in lines)
    assert any("gpu0: slot held by job" in line for line in lines)
    assert any(line.startswith("  fair share  ") for line in lines)
    data = json.loads(served.cli("why", second, "--json").stdout)
    assert data["waiting"] is True and data["place"] == 1 and data["limits"]["max_gpus"] is None
    assert "running" in served.cli("why", first).stdout
    spec = json.loads(served.cli("status", second, "--json").stdout)["job"]["spec"]
    assert spec["preemptible"] is True and "requeue" not in spec
    unknown = served.cli("why", "999")
    assert unknown.returncode != 0 and "999" in unknown.stderr
    users = served.cli("users")
    assert users.returncode == 0, users.stderr
    header, *rows = users.stdout.splitlines()
    assert header.split() == [
        "USER", "GPU-H", "SHARE", "RUNNING", "GPUS/MAX", "VRAM", "GiB/MAX", "WAITING/MAX",
        "MAX", "PRIO",
    ]  # fmt: skip
    assert len(rows) == 1 and rows[0].split()[3:8] == ["1", "1/-", "0/-", "1/-", "-"]
    assert json.loads(served.cli("users", "--json").stdout)["users"][0]["waiting"] == 1
    refused = served.cli("submit", "--no-requeue", "--", "true")
    assert (
        refused.returncode == 2
        and "--no-requeue applies to --preemptible jobs only" in refused.stderr
    )
    # What it waits for is said with how each is doing (only the ids were: tester h147).
    third = served.cli("submit", "--after", f"{first},{second}", "--", "true").stdout.strip()
    lines = served.cli("why", third).stdout.splitlines()
    waits = next(line for line in lines if line.startswith("  waits for"))
    assert waits.startswith(f"  waits for   job {first} (running: running on gpu0"), waits
    assert f"; job {second} (queued: " in waits, waits
    data = json.loads(served.cli("why", third, "--json").stdout)
    assert [d["job"] for d in data["waiting_for"]] == [int(first), int(second)]
    assert [d["status"] for d in data["waiting_for"]] == ["running", "queued"]


async def test_a_priority_above_the_users_max_priority_is_refused(
    make_engine: EngineFactory,
) -> None:
    # Anyone's `--priority 1000` went ahead of everyone on a shared box.
    config = make_config(users={"default": {"max_priority": 5}})
    engine = await make_engine("1xA100-80GB", config=config)
    before = len(await engine.list_jobs())
    with pytest.raises(SpecError, match=r"priority 6 is above 5, the most user .* may ask"):
        await engine.submit({"command": ["true"], "priority": 6})
    assert len(await engine.list_jobs()) == before  # (nothing stored)
    blocker = await engine.submit({"command": ["sleep", "60"], "gpus": 1})
    waiting = await engine.submit({"command": ["true"], "gpus": 1, "priority": 5})
    with pytest.raises(SpecError, match=r"\[users.default\] max_priority"):
        await engine.edit(waiting.id, {"priority": 9})
    assert (await engine.get(waiting.id)).spec.get("priority") == 5
    edited = await engine.edit(waiting.id, {"priority": -3})  # (down is always fine)
    assert edited.spec["priority"] == -3
    await engine.cancel(blocker.id)


async def test_a_user_held_below_priority_0_submits_without_naming_a_priority(
    make_engine: EngineFactory,
) -> None:
    # max_priority = -5 refused every plain submission ("priority 0 is above -5"): the
    # default asked for what the user may not have.
    config = make_config(users={"default": {"max_priority": -5}})
    engine = await make_engine("1xA100-80GB", config=config)
    plain = await engine.submit({"command": ["true"], "gpus": 0})
    assert plain.priority == -5 and plain.spec["priority"] == -5
    lower = await engine.submit({"command": ["true"], "gpus": 0, "priority": -9})
    assert lower.priority == -9
    with pytest.raises(SpecError, match=r"priority 0 is above -5"):
        await engine.submit({"command": ["true"], "gpus": 0, "priority": 0})  # (asked for)
    again = await engine.restart((await engine.wait(plain.id, timeout=10)).id)
    assert again.priority == -5


def _preempting_config(lead: float = 10, grace: float | None = None) -> Any:
    return make_config(
        engine={} if grace is None else {"grace_period": grace},
        scheduling={"preempt_after": 0, "checkpoint_signal": "SIGUSR1", "checkpoint_grace": lead},
    )


async def _being_preempted(
    make_engine: EngineFactory, tmp_path: Any, lead: float = 10, grace: float | None = None
) -> tuple[Any, Any, Any]:
    """An engine whose preemptible job got its checkpoint signal for an urgent one, with
    ``lead`` s of checkpoint lead before its SIGTERM: (engine, victim, urgent)."""
    from .conftest import eventually

    config = _preempting_config(lead, grace)
    engine = await make_engine("1xA100-80GB", config=config)
    log, script = tmp_path / "victim.log", tmp_path / "victim.py"
    script.write_text(PREEMPTIBLE)
    victim = await engine.submit(
        {"command": ["python3", str(script), str(log)], "gpus": 1, "preemptible": True}
    )
    await eventually(lambda: log.exists() and "start" in log.read_text(), timeout=10)
    urgent = await engine.submit({"command": ["sleep", "30"], "gpus": 1, "priority": 5})
    await eventually(lambda: "checkpoint" in log.read_text(), timeout=10)
    return engine, victim, urgent


async def test_a_preemption_whose_sigterm_fell_while_no_engine_ran_still_sends_it(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # The SIGTERM after the checkpoint lead is the engine's own timer: an engine down past
    # the stop's SIGKILL deadline came back and killed the job at once, with no SIGTERM
    # (a job that saves on SIGTERM lost its save).
    from .conftest import eventually

    engine, victim, urgent = await _being_preempted(make_engine, tmp_path, lead=1, grace=2.0)
    config, log = _preempting_config(1, 2.0), tmp_path / "victim.log"
    kill_at = engine.book.get(victim.id).job.kill_at or 0.0
    await engine.stop()
    await eventually(lambda: time.time() > kill_at + 0.5, timeout=10, interval=0.1)
    assert "term" not in log.read_text()
    again = await make_engine("1xA100-80GB", config=config)
    await eventually(lambda: "term" in log.read_text(), timeout=10)
    # (its handler exits 3: requeued, behind the job it was stopped for)
    await eventually(lambda: again.book.get(urgent.id).job.status is JobStatus.RUNNING, timeout=20)
    requeued = await again.get(victim.id)
    assert requeued.status is JobStatus.QUEUED and requeued.attempt == 1, requeued.message
    await again.cancel(urgent.id)
    await again.cancel(victim.id)


async def test_a_cancel_during_a_preemption_ends_the_job_for_good(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # The cancel was lost: the job went back to the queue and ran again, and `cancel`
    # blamed the kernel after waiting 78 s.
    engine, victim, urgent = await _being_preempted(make_engine, tmp_path)
    stopping = await engine.cancel(victim.id)
    assert stopping.stop_reason is TerminationReason.CANCELLED
    done = await engine.wait(victim.id, timeout=10)  # (SIGTERM now, not 10 s later)
    assert done.status is JobStatus.CANCELLED and done.attempt == 0
    await engine.cancel(urgent.id)


async def test_a_preemption_is_called_off_when_the_job_it_was_for_is_cancelled(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # Its SIGTERM came 10 s after the job it was for had been cancelled, and it ran again
    # from the start, its work lost for nothing.
    engine, victim, urgent = await _being_preempted(make_engine, tmp_path)
    await engine.cancel(urgent.id)
    live = await engine.get(victim.id)
    assert live.status is JobStatus.RUNNING and live.stop_reason is None
    called_off = f"(preemption called off: the job it was for, job {urgent.id}, is"
    assert live.message.startswith(f"running on {live.domains[0]} {called_off}")
    log = (tmp_path / "victim.log").read_text().split()
    assert log == ["start", "checkpoint"]  # (no SIGTERM)
    # Its timeline keeps both (the message alone was written over by the next one).
    said = [
        e["message"] for e in await engine.events_of(victim.id) if e["kind"] == "job.preemption"
    ]
    assert said[0].startswith("stopping: preempted by job ")
    assert said[1].startswith(f"called off: the job it was for, job {urgent.id}, is")
    await engine.cancel(victim.id)


async def test_a_preemption_for_another_job_in_a_called_off_lead_sends_no_second_checkpoint(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # The job it was for cancelled, the next waiting job stopped it at once: a second
    # checkpoint signal mid-save, and a fresh lead that put its SIGTERM off again.
    from .conftest import eventually

    engine, victim, urgent = await _being_preempted(make_engine, tmp_path)
    first = engine.book.get(victim.id).job.kill_at
    other = await engine.submit({"command": ["sleep", "30"], "gpus": 1, "priority": 4})
    await engine.cancel(urgent.id)
    live = await eventually(
        lambda: (act := engine.book.get(victim.id)) and act.job.stop_reason and act, timeout=10
    )
    assert f"preempted by job {other.id}" in live.job.message
    assert "SIGUSR1 sent already, SIGTERM in " in live.job.message, live.job.message
    assert live.job.kill_at is not None and first is not None
    assert abs(live.job.kill_at - first) < 1.0  # (the first lead's SIGTERM time kept)
    assert (tmp_path / "victim.log").read_text().split() == ["start", "checkpoint"]
    for job in (victim, other):
        await engine.cancel(job.id)


async def test_a_quarantine_in_a_preemptions_lead_calls_it_off_and_keeps_its_warning(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # The GPU quarantined, the job it was for could not start there: called off, but its
    # note took the place of the victim's quarantine warning for good.
    from gpulayer_tui.engine.simulate import SimLedger

    from .conftest import eventually

    engine, victim, urgent = await _being_preempted(make_engine, tmp_path)
    SimLedger(engine.paths.state_dir).set_gpu(0, lost=True, error="GPU is lost")
    await engine.sampler.sample_once()
    live = engine.book.get(victim.id)
    await eventually(lambda: live.job.stop_reason is None, timeout=10)
    assert live.job.message.startswith("running on gpu0; warning: domain gpu0 quarantined: "), (
        live.job.message
    )
    assert (
        f"(preemption called off: the job it was for, job {urgent.id}, could not start"
        in live.job.message
    )
    for job in (victim, urgent):
        await engine.cancel(job.id)


async def test_an_edit_that_leaves_the_job_below_its_victims_calls_the_preemption_off(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # Lowered below the job being stopped for it, it was shown waiting for itself
    # ("preempted for job N, which starts first") and the victim was stopped anyway.
    engine, victim, urgent = await _being_preempted(make_engine, tmp_path)
    await engine.edit(urgent.id, {"priority": -1})
    live = await engine.get(victim.id)
    assert live.status is JobStatus.RUNNING and live.stop_reason is None
    assert (
        f"(preemption called off: the job it was for, job {urgent.id}, no longer outranks it"
        in live.message
    )
    waiting = await engine.get(urgent.id)
    assert f"preempted for job {urgent.id}" not in waiting.message
    for job in (victim, urgent):
        await engine.cancel(job.id)


async def test_a_preemption_past_its_sigterm_is_not_called_off(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # Once its SIGTERM was sent, a cancel of the job it was for still "called it off: it
    # goes on running", and the launcher's SIGKILL then ended it failed (killed by SIGKILL).
    from .conftest import eventually

    config = _preempting_config(0.3, 1.0)
    engine = await make_engine("1xA100-80GB", config=config)
    log, script = tmp_path / "victim.log", tmp_path / "victim.py"
    script.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: None)\n"
        "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'a').write('term\\n'))\n"
        "open(sys.argv[1], 'a').write('start\\n')\n"
        "time.sleep(60)\n"
    )
    victim = await engine.submit(
        {"command": ["python3", str(script), str(log)], "gpus": 1, "preemptible": True}
    )
    await eventually(lambda: log.exists() and "start" in log.read_text(), timeout=10)
    urgent = await engine.submit({"command": ["sleep", "30"], "gpus": 1, "priority": 5})
    await eventually(lambda: "term" in log.read_text(), timeout=10)  # (SIGTERM sent)
    await engine.cancel(urgent.id)
    live = await engine.get(victim.id)
    assert "called off" not in live.message
    # As decided: stopped (SIGKILL after the grace period), then back in the queue.
    await eventually(lambda: log.read_text().count("start") == 2, timeout=20)
    again = await engine.get(victim.id)
    assert again.status is JobStatus.RUNNING and again.attempt == 1, again.message
    await engine.cancel(victim.id)


async def test_a_preemption_in_its_checkpoint_lead_goes_on_as_decided_across_a_restart(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # The next engine sent SIGTERM at once (2 s into a 10 s lead: its checkpoint cut
    # short) and, knowing nothing of the stop's purpose, stopped another job for it.
    from .conftest import eventually

    engine, victim, urgent = await _being_preempted(make_engine, tmp_path, lead=3)
    lead_ends = time.time() + 3
    await engine.stop()
    again = await make_engine("1xA100-80GB", config=_preempting_config(3))
    assert again.queue.explain(urgent.id)["preempting"] == [victim.id]
    log = tmp_path / "victim.log"
    assert "term" not in log.read_text()  # (not at the restart)
    await eventually(lambda: "term" in log.read_text(), timeout=10)
    assert time.time() >= lead_ends - 0.5
    await eventually(lambda: again.book.get(urgent.id).job.status is JobStatus.RUNNING, timeout=20)
    await again.cancel(urgent.id)


async def test_a_cpu_job_is_preempted_for_a_better_one_in_the_cpu_pool(
    make_engine: EngineFactory,
) -> None:
    # CPU jobs submitted preemptible were never stopped: a higher-priority CPU job waited
    # behind them as if the flag were not there, and nothing said so.
    from .conftest import eventually

    config = make_config(
        scheduling={"preempt_after": 0, "checkpoint_signal": None},
        engine={"grace_period": 0.3},
        cpu={"slots": 2},
    )
    engine = await make_engine("1xA100-80GB", config=config)
    low = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 0, "preemptible": True, "priority": -3}
    )
    other = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 0, "preemptible": True, "priority": -2}
    )

    def running(job_id: int, attempt: int = 0) -> bool:
        act = engine.book.live(job_id)
        return act is not None and act.job.pid is not None and act.job.attempt == attempt

    await eventually(lambda: running(low.id) and running(other.id), timeout=10)
    urgent = await engine.submit({"command": ["true"], "gpus": 0, "priority": 3})
    assert (await engine.wait(urgent.id, timeout=30)).status is JobStatus.COMPLETED
    # The lowest priority was stopped, and only it; it went back to the queue and runs
    # again from the start.
    await eventually(lambda: running(low.id, attempt=1), timeout=10)
    said = [e.get("message", "") for e in await engine.events_of(low.id)]
    assert any(f"preempted by job {urgent.id}" in m for m in said), said
    untouched = await engine.get(other.id)
    assert untouched.status is JobStatus.RUNNING and untouched.attempt == 0
    for job in (low, other):
        await engine.cancel(job.id)


async def test_preempt_after_counts_from_when_the_dependencies_are_met(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # A job that had waited on its dependencies for longer than preempt_after stopped the
    # preemptible job the instant they were met: its wait for them was taken as a wait
    # for room.
    from .conftest import eventually

    config = make_config(scheduling={"preempt_after": 1.0, "checkpoint_signal": None})
    engine = await make_engine("1xA100-80GB", config=config)
    gate = tmp_path / "go"
    victim = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 1, "preemptible": True, "priority": -1}
    )
    dep = await engine.submit({"shell": f"while [ ! -e {gate} ]; do sleep 0.02; done", "gpus": 0})
    urgent = await engine.submit(
        {"command": ["true"], "gpus": 1, "priority": 3, "depends_on": [dep.id]}
    )
    submitted = time.time()
    await eventually(lambda: time.time() > submitted + 1.5, timeout=10)
    gate.touch()
    await engine.wait(dep.id, timeout=10)
    engine.queue.schedule()  # (a pass now: the dependency just met)
    act = engine.book.live(victim.id)
    assert act is not None and act.job.stop_reason is None, act.job.message
    # Once it has waited preempt_after for room, it does stop it.
    assert (await engine.wait(urgent.id, timeout=30)).status is JobStatus.COMPLETED
    stopped = [e.get("message", "") for e in await engine.events_of(victim.id)]
    assert any(f"preempted by job {urgent.id}" in m for m in stopped), stopped
    await engine.cancel(victim.id)


async def test_time_the_queue_was_paused_is_not_counted_toward_preempt_after(
    make_engine: EngineFactory,
) -> None:
    # A job queued while the queue was paused stopped a preemptible job the instant the
    # queue was resumed: the pause was taken as a wait for room.
    from .conftest import eventually

    config = make_config(scheduling={"preempt_after": 1.0, "checkpoint_signal": None})
    engine = await make_engine("1xA100-80GB", config=config)
    victim = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 1, "preemptible": True, "priority": -1}
    )
    await engine.pause()
    urgent = await engine.submit({"command": ["true"], "gpus": 1, "priority": 3})
    paused = time.time()
    await eventually(lambda: time.time() > paused + 1.5, timeout=10)
    await engine.resume()
    engine.queue.schedule()
    act = engine.book.live(victim.id)
    assert act is not None and act.job.stop_reason is None, act.job.message
    # Once it has waited preempt_after for room with the queue open, it does stop it.
    assert (await engine.wait(urgent.id, timeout=30)).status is JobStatus.COMPLETED
    stopped = [e.get("message", "") for e in await engine.events_of(victim.id)]
    assert any(f"preempted by job {urgent.id}" in m for m in stopped), stopped
    await engine.cancel(victim.id)


async def test_a_pause_an_engine_restart_kept_is_not_counted_toward_preempt_after(
    make_engine: EngineFactory,
) -> None:
    from .conftest import eventually

    config = make_config(scheduling={"preempt_after": 1.0, "checkpoint_signal": None})
    engine = await make_engine("1xA100-80GB", config=config)
    victim = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 1, "preemptible": True, "priority": -1}
    )
    await engine.pause()
    urgent = await engine.submit({"command": ["true"], "gpus": 1, "priority": 3})
    paused = time.time()
    await eventually(lambda: time.time() > paused + 1.5, timeout=10)
    await engine.stop()
    again = await make_engine("1xA100-80GB", config=config)  # still paused
    await again.resume()
    again.queue.schedule()
    act = again.book.live(victim.id)
    assert act is not None and act.job.stop_reason is None, act.job.message
    assert (await again.wait(urgent.id, timeout=30)).status is JobStatus.COMPLETED
    await again.cancel(victim.id)


async def test_why_says_whom_the_first_job_in_line_will_preempt_and_when(
    make_engine: EngineFactory,
) -> None:
    # `why` said "reserved gpu1 for this job until it can start" of a job that would stop
    # the preemptible job there in at most a minute (tester h47).
    from gpulayer_tui.formatting import why_lines

    config = make_config(scheduling={"preempt_after": 600})
    engine = await make_engine("1xA100-80GB", config=config)
    victim = await engine.submit({"command": ["sleep", "600"], "gpus": 1, "preemptible": True})
    urgent = await engine.submit({"command": ["true"], "gpus": 1, "priority": 5})
    later = await engine.submit({"command": ["true"], "gpus": 1, "priority": 5})
    coming = engine.queue.explain(urgent.id)["may_preempt"]
    assert isinstance(coming, dict) and coming["jobs"] == [victim.id]
    assert 590 <= float(coming["in_s"]) <= 600, coming
    said = next(line for line in why_lines(engine.queue.explain(urgent.id)) if "preempt" in line)
    assert said.startswith(f"  preempts    job {victim.id} (in ") and said.endswith(
        "once it has waited [scheduling] preempt_after, if it still cannot start)"
    ), said
    assert engine.queue.explain(later.id)["may_preempt"] is None  # (second in line)
    same = await engine.submit({"command": ["true"], "gpus": 1})  # (priority 0: stops none)
    assert engine.queue.explain(same.id)["may_preempt"] is None
    await engine.pause()  # (the wait does not count while paused)
    assert engine.queue.explain(urgent.id)["may_preempt"] is None
    await engine.cancel(victim.id)


async def test_a_reservation_waits_for_its_gpus_jobs_to_stop(make_engine: EngineFactory) -> None:
    # Past their timeout, jobs stopping (SIGKILL in 7 s) were taken for ended: "reserved
    # gpu0, gpu1 for this job now" (tester h129).
    engine = await make_engine("2xA100-80GB")
    stubborn = {"shell": "trap '' TERM; sleep 30", "gpus": 1, "timeout": 1}
    held = [await engine.submit({**stubborn, "domain": f"gpu{n}"}) for n in (0, 1)]
    big = await engine.submit({"command": ["true"], "gpus": 2})

    def stopping() -> bool:
        live = [engine.book.live(j.id) for j in held]
        return all(a is not None and a.job.kill_at is not None for a in live)

    await eventually(stopping, timeout=20)
    engine.queue.schedule()
    reserved = engine.queue.explain(big.id)["reservation"]
    assert isinstance(reserved, dict) and reserved["when"].startswith("from ~"), reserved
    assert "(in " in reserved["when"], reserved
    done = await engine.wait(big.id, timeout=30)  # (once their SIGKILL fell)
    assert done.status is JobStatus.COMPLETED


async def test_the_gpus_reserved_for_a_job_are_those_its_preemption_frees(
    make_engine: EngineFactory,
) -> None:
    # `why` said "reserved gpu0, gpu1, gpu2 for this job" beside "preempts jobs 51, 52,
    # 53", which ran on gpu1-3: the job then ran there, and gpu0 was kept from others for
    # nothing (tester h55).
    config = make_config(scheduling={"preempt_after": 3.0, "checkpoint_signal": None})
    engine = await make_engine("4xA100-80GB", config=config)
    low = [
        await engine.submit(
            {"command": ["sleep", "600"], "gpus": 1, "preemptible": True, "priority": p}
        )
        for p in (1, 0, 0, 0)
    ]
    on = {j.id: (await engine.get(j.id)).domains[0] for j in low}
    urgent = await engine.submit({"command": ["true"], "gpus": 3, "priority": 2})
    engine.queue.schedule()
    why = engine.queue.explain(urgent.id)
    assert why["may_preempt"] == {
        "jobs": [j.id for j in low[1:]],
        "in_s": why["may_preempt"]["in_s"],
    }
    reserved = why["reservation"]
    assert isinstance(reserved, dict) and reserved["job"] == urgent.id
    assert reserved["domains"] == sorted(on[j.id] for j in low[1:]), (reserved, on)
    assert reserved["when"].startswith("from ~"), reserved  # (the preemption's time)
    # It runs there once they are stopped.
    done = await engine.wait(urgent.id, timeout=30)
    assert done.status is JobStatus.COMPLETED and sorted(done.domains) == reserved["domains"]
    assert engine.book.live(low[0].id) is not None  # (priority 1: never stopped)
    for job in low:  # (the three stopped for it run again: sleep 600)
        if engine.book.live(job.id) is not None:
            await engine.cancel(job.id)


async def test_preemption_turned_off_by_a_reload_calls_off_a_stop_in_its_lead(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    # The stop went on, the job it was for no longer said so, and `why` still said it
    # preempted (tester h154): a stop whose SIGTERM is still to come is called off.
    engine, victim, urgent = await _being_preempted(make_engine, tmp_path, lead=30)
    assert engine.queue.explain(urgent.id)["preempting"]
    off = make_config(scheduling={"checkpoint_signal": "SIGUSR1", "checkpoint_grace": 30})
    engine._reconfigure(off)
    live = engine.book.get(victim.id)
    assert live is not None and live.job.stop_reason is None and live.job.kill_at is None
    assert live.job.message == (
        "running on gpu0 (preemption called off: [scheduling] preempt_after was unset by a reload)"
    )
    assert not engine.queue.explain(urgent.id)["preempting"]
    for job in (victim, urgent):
        await engine.cancel(job.id)


def test_a_job_stopping_two_says_jobs() -> None:
    # "stopping preemptible job 44, 45 for it" (tester h154).
    box, stopped = _two_slot_box()
    first = box.run(gpus=1, preemptible=True)
    second = box.run(gpus=1, preemptible=True)
    urgent = box.run(gpus=1, priority=5, exclusive=True)
    urgent.job.queued_at = box.clock.now - 100
    box.queue.schedule()
    assert sorted(stopped) == sorted([first.job.id, second.job.id])
    ids = ", ".join(map(str, sorted(stopped)))
    assert urgent.job.message.endswith(f"; stopping preemptible jobs {ids} for it")


def test_a_job_held_back_by_its_users_gpu_limit_is_not_overtaken_by_that_users_later_jobs() -> None:
    # Held back by its own user's max_gpus, a 2-GPU job of priority 5 was passed by nine
    # 1-GPU jobs of that user submitted after it, each taking the room it waited for
    # (tester h175 #1). Another user's jobs, and the user's CPU jobs, still go on.
    box = Box(gpus=4, users={"default": UserLimits(max_gpus=3)})
    sweeps = [box.run(gpus=1) for _ in range(2)]
    big = box.run(gpus=2, priority=5)
    later = box.run(gpus=1)
    cpu = box.run(gpus=0)
    theirs = box.run(uid=OTHER, gpus=1)
    assert [status(a) for a in sweeps] == ["running", "running"]
    assert status(big) == "queued" and "limit: 3 GPUs running at once" in big.job.message
    assert status(later) == "queued"
    assert later.job.message == (
        f"waits behind job {big.job.id}, which the same limit holds back (user "
        f"{user_label(ME)}'s limit: 3 GPUs running at once ([users.default] max_gpus), "
        "2 running now)"
    )
    assert status(cpu) == "running" and status(theirs) == "running"
    box.end(sweeps[0])
    assert status(big) == "running" and status(later) == "queued"
    box.end(sweeps[1])
    assert status(later) == "running"


def test_a_job_held_back_by_its_users_vram_limit_waits_first_in_line() -> None:
    # v20, submitted after v50, started while v50 waited on the declared-VRAM limit: the
    # order broken within one user (tester h175 #1). A GPU job declaring no VRAM takes
    # nothing from that limit and starts.
    box = Box(gpus=4, users={"default": UserLimits(max_vram_gb=100)})
    big = box.run(gpus=1, vram_gb=60)
    first = box.run(gpus=1, vram_gb=10)
    v50 = box.run(gpus=1, vram_gb=50)
    v20 = box.run(gpus=1, vram_gb=20)
    undeclared = box.run(gpus=1)
    assert status(first) == "running" and status(v50) == "queued"
    assert status(v20) == "queued" and f"waits behind job {v50.job.id}" in v20.job.message
    assert status(undeclared) == "running"
    box.end(first)
    assert status(v50) == "queued" and status(v20) == "queued"  # (60 + 50: past it still)
    box.end(big)
    assert status(v50) == "running" and status(v20) == "running"  # (50 + 20)
