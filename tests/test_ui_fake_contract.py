"""The hand-written backends behind the snapshots (``StaticBackend``, ``ServiceBackend``)
answer in the engine's shapes and tell one consistent story (issue 21: they had drifted:
fields the engine returns were missing, and a queued job owned memory and a slot)."""

from __future__ import annotations

from typing import Any

from gpulayer_tui.engine.models import JobQuery
from gpulayer_tui.engine.simulate import SimLedger
from gpulayer_tui.shapes import JobJSON, JobRowJSON, ProcessJSON, UserJSON
from gpulayer_tui.wire import ACTIVE_STATUSES, JobKind, JobStatus, TerminationReason

from .conftest import EngineFactory
from .test_ui_services import service_jobs
from .ui_support import FIXED_NOW, StaticBackend, gpus_view, jobs_fixture

MIB = 1024**2

# Keys a shape may leave out (its NotRequired ones: with postponed annotations, Python 3.11
# does not tell them from the required ones in __required_keys__).
OPTIONAL = {
    JobJSON: {
        "replicas",
        "attempt",
        "usage",
        "use",
        "cluster",
        "cluster_job_id",
        "cancels_dependents",
    },
    JobRowJSON: {"replicas", "kill_at", "use"},
}


def _keys(shape: Any) -> tuple[set[str], set[str]]:
    allowed = set(shape.__annotations__)  # (a TypedDict's include its bases')
    return allowed - OPTIONAL[shape], allowed


def _fixture_jobs() -> list[dict[str, Any]]:
    return service_jobs()  # (the batch jobs of jobs_fixture() and two services)


def test_every_fake_job_has_the_engines_fields_and_values() -> None:
    required, allowed = _keys(JobJSON)
    for job in _fixture_jobs():
        assert required <= set(job) <= allowed, (job["id"], set(job) ^ required)
        assert job["status"] in {s.value for s in JobStatus}
        assert job["kind"] in {k.value for k in JobKind}
        reason = job["termination_reason"]
        assert reason is None or reason in {r.value for r in TerminationReason}
        # A job's shape follows its status, as the engine's do.
        active = job["status"] in ACTIVE_STATUSES
        assert (reason is None) == active, job["id"]
        assert (job["ended_at"] is None) == active, job["id"]
        if job["status"] in ("queued", "pending"):
            assert job["pid"] is None and not job["gpus"] and job["started_at"] is None
        if reason == "over_capacity":  # refused at submission: never queued, never ran
            assert job["queued_at"] is None and job["started_at"] is None


async def test_the_fake_rows_are_the_engines_rows() -> None:
    required, allowed = _keys(JobRowJSON)
    page = await StaticBackend().jobs_page(limit=100)
    for row in page["jobs"]:
        assert required <= set(row) <= allowed, (row["id"], set(row) ^ required)


async def test_the_fake_shapes_match_a_real_engines(make_engine: EngineFactory) -> None:
    engine = await make_engine("2xA100-80GB")
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "vram_gb": 1})
    real_job = job.to_json()
    real_gpus = engine.gpus()
    fake_job = jobs_fixture()[0]
    assert set(fake_job) == set(real_job), set(fake_job) ^ set(real_job)
    fake_gpus = gpus_view(2)
    assert set(fake_gpus) == set(real_gpus), set(fake_gpus) ^ set(real_gpus)
    real = {d["gpu_index"] is None: d for d in real_gpus["domains"]}  # a GPU one, the cpu one
    for domain in fake_gpus["domains"]:
        same_kind = real[domain["gpu_index"] is None]
        assert set(domain) == set(same_kind), (domain["name"], set(domain) ^ set(same_kind))
        for part in ("gpu", "vram"):  # (the real GPU domain has both once sampled)
            if domain[part] is not None:
                want = set(real[False][part])
                assert set(domain[part]) == want, (part, set(domain[part]) ^ want)
        for proc in domain["processes"]:  # (the real engine lists none here: no GPU holder)
            assert set(proc) == set(ProcessJSON.__annotations__), set(proc) ^ set(
                ProcessJSON.__annotations__
            )
    await engine.cancel(job.id)


async def test_the_fake_why_matches_a_real_engines(make_engine: EngineFactory) -> None:
    engine = await make_engine(cpu_count=1)
    running = await engine.submit({"command": ["sleep", "60"]})
    queued = await engine.submit({"command": ["true"]})
    real = await engine.why(queued.id)
    fake_backend = StaticBackend()
    waiting = next(j["id"] for j in jobs_fixture() if j["status"] == "queued")
    fake = await fake_backend.why(waiting)
    assert set(fake) == set(real), set(fake) ^ set(real)
    assert set(fake["limits"]) == set(real["limits"])
    assert {k for row in fake["fair_share"] for k in row} == {
        k for row in real["fair_share"] for k in row
    }
    assert fake["waiting"] is real["waiting"] is True
    await engine.cancel(running.id)


def test_who_holds_what_is_consistent() -> None:
    jobs = {j["id"]: j for j in jobs_fixture()}
    for n_gpus in (0, 2, 8):
        for domain in gpus_view(n_gpus)["domains"]:
            for job_id in domain["jobs"]:
                # Only a job that runs there holds a domain (never a queued or ended one).
                assert job_id in jobs, (domain["name"], job_id)
                assert jobs[job_id]["status"] == "running", (domain["name"], job_id)
                assert domain["name"] in jobs[job_id]["domains"], (domain["name"], job_id)
            for process in domain["processes"]:
                if process.get("job_id") is not None:
                    assert process["job_id"] in domain["jobs"], (domain["name"], process)
            assert domain["used_slots"] == len(domain["jobs"]), domain["name"]


async def test_the_fake_usage_matches_a_real_engines(make_engine: EngineFactory) -> None:
    """``GET /v1/jobs/ID/usage``, the whole job's ``usage`` and a row's ``use``: the fakes'
    keys are the engine's, and the fakes' figures agree with their jobs."""
    engine = await make_engine("2xA100-80GB")
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "vram_gb": 1})
    assert job.pid is not None
    SimLedger(engine.paths.state_dir).hold(job.gpus[0], job.pid, 2.0)
    await engine.sampler.sample_once()
    await engine.sampler.sample_once()
    real = await engine.usage_of(job.id)
    real_job, _events = await engine.reads.detail(job.id)
    real_row = next(r for rows in [r async for r in engine.reads.rows(JobQuery())] for r in rows)
    fake = StaticBackend()
    fake_usage = await fake.usage(10)
    assert set(fake_usage) == set(real) - {"totals"}  # (totals: the engine's running sums)
    assert real["summary"] is not None and fake_usage["summary"] is not None
    assert set(fake_usage["summary"]) == set(real["summary"])
    assert set(fake_usage["series"][0]) == set(real["series"][0])
    assert "usage" in real_job and (await fake.job(10))["job"]["usage"] == fake_usage["summary"]
    fake_row = next(r for r in (await fake.jobs_page(limit=100))["jobs"] if r["id"] == 10)
    assert set(fake_row["use"]) == set(real_row["use"])
    await engine.cancel(job.id)
    # The fakes' usage tells the same story as their jobs: jobs that ran on GPUs have it,
    # on the GPUs they ran on, over the time they ran; the others have none.
    for one in jobs_fixture():
        usage = await fake.usage(one["id"])
        summary = usage["summary"]
        if not (one["gpus"] and one["started_at"]):
            assert summary is None and usage["series"] == [], one["id"]
            continue
        assert summary is not None and summary["gpus"] == one["gpus"], one["id"]
        assert [s["gpu"] for s in usage["series"]] == one["gpus"]
        ran = (one["ended_at"] or FIXED_NOW) - one["started_at"]
        assert abs(summary["seconds"] - ran) < 1e-6, one["id"]
        assert all(s["t0"] == one["started_at"] for s in usage["series"])
        assert summary["peak_vram"] == max(max(s["vram_mib"]) for s in usage["series"]) * MIB
    # The running job's VRAM is what /gpus says it holds.
    held = next(d for d in gpus_view(2)["domains"] if d["name"] == "gpu0")["vram"]["owned"]
    assert (await fake.usage(10))["summary"]["peak_vram"] == held  # type: ignore[index]


async def test_the_fake_users_match_a_real_engines(make_engine: EngineFactory) -> None:
    """``GET /v1/users`` (the users view, ``4``): the fake's rows have the engine's keys,
    each value of the engine's type, and tell the fixture's story in the engine's order."""
    engine = await make_engine("2xA100-80GB")
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "vram_gb": 1})
    waiting = await engine.submit({"command": ["sleep", "60"], "gpus": 2})
    real = engine.queue.users_view()
    assert real, "the submitter is listed"
    fake = (await StaticBackend().users())["users"]
    want = set(UserJSON.__annotations__)
    for row in [*real, *fake]:
        assert set(row) == want, set(row) ^ want
    for key, value in real[0].items():
        for row in fake:
            if value is not None and row[key] is not None:
                # (ints where the engine's are ints, floats where its are floats)
                assert type(row[key]) is type(value), (key, row[key], value)
    assert [r["fair_usage"] for r in fake] == sorted(r["fair_usage"] for r in fake)
    # The jobs' owner holds and waits for what the fixture's jobs do.
    jobs = jobs_fixture()
    owner = next(r for r in fake if r["uid"] == jobs[0]["owner_uid"])
    running = [j for j in jobs if j["status"] == "running"]
    assert owner["running_jobs"] == len(running)
    assert owner["running_gpus"] == sum(len(j["gpus"]) for j in running)
    assert owner["waiting"] == sum(j["status"] in ("pending", "queued") for j in jobs)
    await engine.cancel(waiting.id)
    await engine.cancel(job.id)
