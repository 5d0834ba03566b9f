"""Snapshots at submit: a queued job runs its working directory as it was when submitted.

Real git repositories in temp dirs, a real engine on one simulated GPU (a job holding it
keeps the snapshot job queued while its files are edited), real processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.spec import SpecError

from .conftest import EngineFactory, Served, make_config, wait_for


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def make_repo(path: Path) -> Path:
    """A repo: tracked code.txt, sub/run.sh (executable), .gitignore ignoring *.log; then
    an untracked new.txt and an ignored secret.log."""
    (path / "sub").mkdir(parents=True)
    git(path, "init", "-q")
    (path / "code.txt").write_text("code v1\n")
    (path / "sub" / "run.sh").write_text("#!/bin/sh\necho run v1\n")
    (path / "sub" / "run.sh").chmod(0o755)
    (path / ".gitignore").write_text("*.log\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "one")
    (path / "new.txt").write_text("untracked v1\n")
    (path / "secret.log").write_text("ignored\n")
    return path


async def hold_the_gpu(engine: Engine, gate: Path) -> int:
    """A job that holds the only GPU until ``gate`` exists (what comes next waits)."""
    job = await engine.submit(
        {"shell": f"while [ ! -e {gate} ]; do sleep 0.05; done", "gpus": 1, "name": "holder"}
    )
    assert job.status is JobStatus.RUNNING
    return job.id


def snapshot_of(engine: Engine, job: Any) -> dict[str, Any]:
    snap = job.spec.get("snapshot")
    assert isinstance(snap, dict), job.spec
    return snap


def tree_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


async def test_a_git_snapshot_runs_the_code_as_submitted(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(simulate="1xA100-80GB")
    repo = make_repo(tmp_path / "repo")
    gate = tmp_path / "go"
    await hold_the_gpu(engine, gate)
    line = "cat ../code.txt ../new.txt; ./run.sh; test -e ../secret.log && echo LEAK; pwd"
    job = await engine.submit(
        {"shell": line, "gpus": 1, "cwd": str(repo / "sub"), "snapshot": True}
    )
    assert job.status is JobStatus.QUEUED
    snap = snapshot_of(engine, job)
    assert snap["commit"] == git(repo, "rev-parse", "HEAD")
    assert snap["dirty"] is True  # (new.txt is untracked)
    tree = engine.snapshots.job_tree(job.id)
    assert snap["path"] == str(tree / "sub") and snap["source"] == str(repo.resolve())
    assert tree_files(tree) == {"code.txt", "new.txt", ".gitignore", "sub/run.sh"}
    assert snap["files"] == 4
    assert snap["bytes"] == sum((tree / f).stat().st_size for f in tree_files(tree))
    # The working tree moves on after the submission.
    (repo / "code.txt").write_text("code v2\n")
    (repo / "new.txt").write_text("untracked v2\n")
    (repo / "sub" / "run.sh").write_text("#!/bin/sh\necho run v2\n")
    gate.touch()
    done = await engine.wait(job.id, timeout=15)
    assert done.status is JobStatus.COMPLETED, done.message
    out = engine.log_path(job.id).read_text().splitlines()
    assert out == ["code v1", "untracked v1", "run v1", str(tree / "sub")]
    # Shared, read-only content; the executable stays executable.
    assert (tree / "sub" / "run.sh").stat().st_mode & 0o777 == 0o555
    assert (tree / "code.txt").stat().st_mode & 0o777 == 0o444
    # The detail shows it: the job's JSON carries the record.
    detail, _ = await engine.job_detail(job.id)
    assert detail["spec"]["snapshot"]["commit"] == snap["commit"]
    # ... and the TUI's detail says it on the cwd line.
    from gpulayer_tui.screens.job_detail import job_fields

    line = job_fields(detail, time.time())["cwd"].plain
    assert line == f"{repo / 'sub'}  (snapshot: commit {snap['commit'][:12]} dirty)"
    # A restart takes a new copy and runs at the same place in it (it ran in the repo's
    # top, where ../code.txt is not: tester h156).
    again = await engine.restart(job.id)
    rerun = await engine.wait(again.id, timeout=15)
    assert rerun.status is JobStatus.COMPLETED, rerun.message
    fresh = engine.snapshots.job_tree(again.id)
    assert rerun.spec["cwd"] == str(repo / "sub")
    out = engine.log_path(again.id).read_text().splitlines()
    assert out == ["code v2", "untracked v2", "run v2", str(fresh / "sub")]


async def test_a_clean_repo_is_not_dirty_and_a_plain_job_is_not_copied(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a")
    job = await engine.submit(
        {"command": ["cat", "a.txt"], "gpus": 0, "cwd": str(repo), "snapshot": True}
    )
    assert snapshot_of(engine, job)["dirty"] is False
    plain = await engine.submit({"command": ["true"], "gpus": 0, "cwd": str(repo)})
    assert "snapshot" not in plain.spec
    assert not engine.snapshots.job_tree(plain.id).exists()
    assert (await engine.wait(job.id, timeout=10)).status is JobStatus.COMPLETED


async def test_outside_git_the_directory_is_copied_by_the_plain_rules(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(simulate="1xA100-80GB")
    work = tmp_path / "work"
    for skipped in (".git", "__pycache__", ".venv", "venv", "node_modules", "out"):
        (work / skipped).mkdir(parents=True)
        (work / skipped / "f").write_text("no\n")
    (work / "data.txt").write_text("data v1\n")
    (work / "model.ckpt").write_text("big\n")
    (work / "keep" / "deep").mkdir(parents=True)
    (work / "keep" / "deep" / "x.py").write_text("print(1)\n")
    (work / ".gpulayerignore").write_text("# comments\n*.ckpt\nout/\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside secret\n")
    (work / "out-link").symlink_to(outside)
    (work / "in-link").symlink_to("data.txt")
    os.mkfifo(work / "fifo")  # (a FIFO would block a reader: skipped)
    gate = tmp_path / "go"
    await hold_the_gpu(engine, gate)
    job = await engine.submit(
        {"shell": "cat data.txt in-link", "gpus": 1, "cwd": str(work), "snapshot": True}
    )
    snap = snapshot_of(engine, job)
    assert "commit" not in snap and "dirty" not in snap  # (not a git tree)
    tree = engine.snapshots.job_tree(job.id)
    assert snap["path"] == str(tree)
    assert tree_files(tree) == {
        "data.txt",
        ".gpulayerignore",
        "keep/deep/x.py",
        "out-link",
        "in-link",
    }
    # Symlinks are copied as symlinks: the one pointing out of the tree is not followed.
    assert os.readlink(tree / "out-link") == str(outside)
    stored = [p.read_bytes() for p in engine.snapshots.objects.iterdir()]
    assert b"outside secret\n" not in stored
    (work / "data.txt").write_text("data v2\n")
    gate.touch()
    done = await engine.wait(job.id, timeout=15)
    assert done.status is JobStatus.COMPLETED, done.message
    assert engine.log_path(job.id).read_text() == "data v1\ndata v1\n"


LINKED = make_config(snapshot={"files": "linked"})
PRIVATE = make_config(snapshot={"files": "private"})


async def test_two_jobs_of_one_tree_share_its_objects(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(config=LINKED)
    repo = make_repo(tmp_path / "repo")
    spec = {"command": ["true"], "gpus": 0, "cwd": str(repo), "snapshot": True}
    one = await engine.submit(spec)
    two = await engine.submit(spec)
    # One submission of two jobs reads the tree once; its trees share the objects too.
    three, four = await engine.submit_many([spec, spec])
    trees = [engine.snapshots.job_tree(j.id) for j in (one, two, three, four)]
    inodes = {(t / "code.txt").stat().st_ino for t in trees}
    assert len(inodes) == 1
    assert (trees[0] / "code.txt").stat().st_nlink == 5  # four trees and the store
    assert len(list(engine.snapshots.objects.iterdir())) == 4


async def test_a_dependency_that_ends_while_the_snapshot_is_made_releases_the_job(
    make_engine: EngineFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dependency is seen running, then ends (and its end is committed) while the copy
    is made in a thread: the job must not wait for it for ever."""
    engine = await make_engine()
    repo = make_repo(tmp_path / "repo")
    gate = tmp_path / "go"
    parent = await engine.submit(
        {"shell": f"while [ ! -e {gate} ]; do sleep 0.01; done", "gpus": 0}
    )
    build = engine.snapshots.build

    def build_while_the_parent_ends(*args: Any) -> Any:
        made = build(*args)
        gate.touch()
        deadline = time.monotonic() + 10
        while parent.id in engine.book or engine.book.live(parent.id) is not None:
            assert time.monotonic() < deadline, "the parent did not end"
            time.sleep(0.01)
        return made

    monkeypatch.setattr(engine.snapshots, "build", build_while_the_parent_ends)
    child = await engine.submit(
        {
            "command": ["true"],
            "gpus": 0,
            "cwd": str(repo),
            "snapshot": True,
            "depends_on": [parent.id],
        }
    )
    done = await engine.wait(child.id, timeout=15)
    assert done.status is JobStatus.COMPLETED, done.message


# What a job that makes a file of its copy writable and writes it can do (any job of an
# engine run as root: root ignores the read-only mode).
TAMPER = "chmod u+w code.txt && echo INJECTED >> code.txt && cat code.txt"


async def test_private_copies_keep_a_jobs_writes_to_itself(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(config=PRIVATE)
    repo = make_repo(tmp_path / "repo")
    base = {"gpus": 0, "cwd": str(repo), "snapshot": True}
    writer, batch_mate = await engine.submit_many(
        [{**base, "shell": TAMPER}, {**base, "shell": "sleep 0.5; cat code.txt"}]
    )
    later = await engine.submit({**base, "shell": "cat code.txt", "depends_on": [writer.id]})
    trees = [engine.snapshots.job_tree(j.id) for j in (writer, batch_mate, later)]
    assert len({(t / "code.txt").stat().st_ino for t in trees}) == 3  # copies, not links
    assert (trees[2] / "code.txt").stat().st_mode & 0o777 == 0o444  # (the writer's: made 0644)
    assert (trees[2] / "sub" / "run.sh").stat().st_mode & 0o777 == 0o555
    for job in (writer, batch_mate, later):
        done = await engine.wait(job.id, timeout=15)
        assert done.status is JobStatus.COMPLETED, done.message
    assert engine.log_path(writer.id).read_text() == "code v1\nINJECTED\n"
    assert engine.log_path(batch_mate.id).read_text() == "code v1\n"
    assert engine.log_path(later.id).read_text() == "code v1\n"
    assert list(engine.snapshots.objects.iterdir()) == []  # (no object store)


# The same size, and the mtime set back to the store's: only the mode tells.
SAME_SIZE = (
    "chmod u+w code.txt && printf 'code v9\\n' | dd of=code.txt conv=notrunc 2>/dev/null "
    "&& touch -d @0 code.txt"
)


@pytest.mark.parametrize("tamper", [TAMPER, SAME_SIZE], ids=["append", "same-size"])
async def test_linked_objects_written_through_a_link_are_never_linked_again(
    make_engine: EngineFactory, tmp_path: Path, tamper: str
) -> None:
    engine = await make_engine(config=LINKED)
    repo = make_repo(tmp_path / "repo")
    base = {"gpus": 0, "cwd": str(repo), "snapshot": True}
    writer = await engine.submit({**base, "shell": tamper})
    done = await engine.wait(writer.id, timeout=15)
    assert done.status is JobStatus.COMPLETED, done.message
    # The repo did not change: a new snapshot of it runs what it holds, not the write.
    later = await engine.submit({**base, "shell": "cat code.txt"})
    done = await engine.wait(later.id, timeout=15)
    assert engine.log_path(later.id).read_text() == "code v1\n"
    tree = engine.snapshots.job_tree(later.id)
    assert (tree / "code.txt").stat().st_ino != (
        engine.snapshots.job_tree(writer.id) / "code.txt"
    ).stat().st_ino
    assert (tree / "code.txt").stat().st_mtime_ns == 0  # (the store's mark)


async def test_a_snapshot_too_big_is_refused_and_nothing_is_stored(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(config=make_config(snapshot={"max_mb": 1}))
    work = tmp_path / "work"
    work.mkdir()
    (work / "weights.bin").write_bytes(b"\0" * (3 * 1024 * 1024))
    spec = {"command": ["true"], "gpus": 0, "cwd": str(work), "snapshot": True}
    with pytest.raises(
        SpecError, match=r"snapshot of .*work is at least 3.00 MiB, over \[snapshot\] max_mb = 1"
    ):
        await engine.submit(spec)
    # In a git tree the whole listing is measured: the message says its size.
    repo = make_repo(tmp_path / "repo")
    (repo / "weights.bin").write_bytes(b"\0" * (3 * 1024 * 1024))
    with pytest.raises(SpecError, match=r"snapshot of .*repo is 3.01 MiB, over \[snapshot\]"):
        await engine.submit({**spec, "cwd": str(repo)})
    # Just past the limit: rounded, it read "is 1.00 MB, over max_mb = 1".
    edge = tmp_path / "edge"
    edge.mkdir()
    (edge / "w").write_bytes(b"\0" * (1024 * 1024 - 4096 + 1))  # (+ its folder's 4 KiB)
    with pytest.raises(
        SpecError, match=r"is 1048577 bytes, over \[snapshot\] max_mb = 1 \(1048576"
    ):
        await engine.submit({**spec, "cwd": str(edge)})
    # One job of a submission that cannot be snapshotted refuses the whole submission.
    small = tmp_path / "small"
    small.mkdir()
    (small / "a").write_text("a")
    with pytest.raises(SpecError, match="job 2 of 2: snapshot of"):
        await engine.submit_many([{**spec, "cwd": str(small)}, spec])
    assert await engine.list_jobs() == []
    assert list(engine.snapshots.jobs.iterdir()) == []
    assert list(engine.snapshots.tmp.iterdir()) == []
    assert list(engine.snapshots.objects.iterdir()) == []  # (the small one's went too)


async def test_a_snapshot_is_refused_while_the_disk_is_below_its_floor(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # The floor that holds new jobs back did not hold snapshots: one was copied onto a
    # disk below it (and another filled a disk to 0, failing a running job's writes).
    st = os.statvfs(tmp_path)
    free_mb = st.f_bavail * st.f_frsize // 1024**2
    engine = await make_engine(config=make_config(logs={"min_free_mb": free_mb + 1024}))
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.py").write_text("print(1)\n")
    spec = {"command": ["true"], "gpus": 0, "cwd": str(work), "snapshot": True}
    with pytest.raises(
        SpecError, match=r"down to \d+ MiB free, below \[logs\] min_free_mb = \d+ \(kept for"
    ):
        await engine.submit(spec)
    assert await engine.list_jobs() == []
    assert list(engine.snapshots.tmp.iterdir()) == []


def test_a_copy_stops_at_the_floor_within_one_big_file(tmp_path: Path) -> None:
    # Free space was looked at between files only: one big file was copied whole, 235 MB
    # past the floor.
    from gpulayer_tui.engine.snapshot import MB, SnapshotError, SnapshotStore, _Budget

    state = tmp_path / "state"
    state.mkdir()
    store = SnapshotStore(state)
    store.prepare()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(48 * MB))
    st = os.statvfs(state)
    free = st.f_bavail * st.f_frsize
    budget = _Budget(str(tmp_path), 10**12, time.monotonic() + 60, str(state), free - 20 * MB)
    tree = Path(tempfile.mkdtemp(dir=store.tmp))
    with pytest.raises(SnapshotError, match=r"below \[logs\] min_free_mb"):
        store._copy_file(str(big), "big.bin", tree / "big.bin", budget, 0, private=True)
    copied = (tree / "big.bin").stat().st_size if (tree / "big.bin").exists() else 0
    assert copied < 40 * MB  # (stopped within the file, some 20 MB into it)


async def test_a_git_failure_or_an_unreadable_file_refuses_the_submission(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    repo = make_repo(tmp_path / "repo")
    (repo / ".git" / "index").write_bytes(b"not an index")
    spec = {"command": ["true"], "gpus": 0, "cwd": str(repo), "snapshot": True}
    with pytest.raises(SpecError, match="git ls-files` failed") as err:
        await engine.submit(spec)
    assert err.value.field == "snapshot"
    with pytest.raises(SpecError, match="missing does not exist; nothing was stored"):
        await engine.submit({**spec, "cwd": str(tmp_path / "missing")})
    (tmp_path / "file").write_text("")
    with pytest.raises(SpecError, match="file is not a directory"):
        await engine.submit({**spec, "cwd": str(tmp_path / "file")})
    if os.geteuid() != 0:  # (root reads everything)
        work = tmp_path / "work"
        work.mkdir()
        (work / "locked").write_text("x")
        (work / "locked").chmod(0)
        with pytest.raises(SpecError, match="cannot read locked"):
            await engine.submit({**spec, "cwd": str(work)})
    assert await engine.list_jobs() == []


async def test_who_may_snapshot_and_what_a_spec_may_say(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(config=make_config(snapshot={"default": True}))
    work = tmp_path / "work"
    work.mkdir()
    (work / "a").write_text("a")
    spec: dict[str, Any] = {"command": ["true"], "gpus": 0, "cwd": str(work)}
    # [snapshot] default = true: the engine's user's submissions get one unless they say.
    assert "snapshot" in (await engine.submit(spec, os.geteuid())).spec
    assert "snapshot" not in (await engine.submit({**spec, "snapshot": False})).spec
    # Another user's: the default does not apply, and asking is refused (the engine
    # would read their directory with its own rights).
    other = os.geteuid() + 1000
    assert "snapshot" not in (await engine.submit(spec, other)).spec
    with pytest.raises(SpecError, match="only the engine's user"):
        await engine.submit({**spec, "snapshot": True}, other)
    # Where a copy lies is the engine's to say, never the submitter's.
    made = {"path": "/etc", "source": "/etc"}
    with pytest.raises(SpecError, match="snapshot: give true or false"):
        await engine.submit({**spec, "snapshot": made})
    with pytest.raises(SpecError, match="needs cwd"):
        await engine.submit({"command": ["true"], "gpus": 0, "snapshot": True})


def _blocks(path: Path) -> int:
    """The disk space ``path`` takes, as ``du`` counts it."""
    return path.lstat().st_blocks * 512


def _folder_blocks(tree: Path) -> int:
    """The disk space of the folders under ``tree`` (not itself)."""
    return sum(_blocks(p) for p in tree.rglob("*") if p.is_dir() and not p.is_symlink())


async def test_clean_removes_a_jobs_tree_and_the_objects_only_it_held(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(config=LINKED)
    repo = make_repo(tmp_path / "repo")
    spec = {"command": ["true"], "gpus": 0, "cwd": str(repo), "snapshot": True}
    first = await engine.submit(spec)
    await engine.wait(first.id, timeout=10)
    (repo / "new.txt").write_text("untracked v2\n")  # this content is only the second's
    second = await engine.submit(spec)
    await engine.wait(second.id, timeout=10)
    objects = engine.snapshots.objects
    before = {p.name for p in objects.iterdir()}
    assert len(before) == 5
    # What the trees give back is said, the dry run's too (it was left out: tester h156):
    # the first's own new.txt and its folders, on disk (their lengths said 1.6 KiB of
    # 1.5 MB: h197); the rest the second still links.
    first_tree = engine.snapshots.job_tree(first.id)
    own = _blocks(first_tree / "new.txt") + _folder_blocks(first_tree)
    preview = await engine.retention.preview(None, keep=1)
    assert preview["snapshot_bytes"] == own
    done = await engine.retention.clean(None, keep=1)
    assert done.pop("database_bytes_freed") >= 0
    assert done.pop("bytes") >= 0
    assert done.pop("ids") == [first.id]
    assert done == {
        "jobs": 1,
        "files": 1,
        "snapshots": 1,
        "snapshot_bytes": own,
        "spared": [],
        "spared_why": {},
        "left": [],
        "left_count": 0,
    }
    assert not engine.snapshots.job_tree(first.id).exists()
    kept = engine.snapshots.job_tree(second.id)
    assert (kept / "new.txt").read_text() == "untracked v2\n"
    after = {p.name for p in objects.iterdir()}
    assert len(after) == 4 and after < before  # the shared ones stay
    assert all((objects / name).stat().st_nlink == 2 for name in after)
    # The last job goes: its tree and every object with it.
    whole = sum(_blocks(kept / f) for f in tree_files(kept)) + _folder_blocks(kept)
    last = await engine.retention.clean(time.time() + 1, None)
    assert last["snapshots"] == 1 and last["snapshot_bytes"] == whole
    assert not kept.exists() and list(objects.iterdir()) == []


async def test_a_queued_snapshot_job_survives_an_engine_restart(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine(simulate="1xA100-80GB")
    repo = make_repo(tmp_path / "repo")
    gate = tmp_path / "go"
    await hold_the_gpu(engine, gate)
    job = await engine.submit(
        {"command": ["cat", "code.txt"], "gpus": 1, "cwd": str(repo), "snapshot": True}
    )
    (repo / "code.txt").write_text("code v2\n")
    await engine.stop()
    engine = await make_engine(simulate="1xA100-80GB")
    gate.touch()
    done = await engine.wait(job.id, timeout=15)
    assert done.status is JobStatus.COMPLETED, done.message
    assert engine.log_path(job.id).read_text() == "code v1\n"


async def test_a_services_restarts_run_from_the_same_snapshot(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    work = tmp_path / "work"
    work.mkdir()
    (work / "v.txt").write_text("v1\n")
    job = await engine.submit(
        {
            "kind": "service",
            "command": ["cat", "v.txt"],
            "gpus": 0,
            "port": False,
            "restart": "always",
            "max_restarts": 1,
            "cwd": str(work),
            "snapshot": True,
        }
    )
    (work / "v.txt").write_text("v2\n")
    done = await engine.wait(job.id, timeout=20)
    assert done.status is JobStatus.COMPLETED, done.message
    # Both runs read the snapshot's v1; the second follows the line that says it began.
    lines = engine.log_path(job.id, 0).read_text().splitlines()
    assert [line for line in lines if not line.startswith("--- gpulayer-tui:")] == ["v1", "v1"]
    assert lines[1].startswith("--- gpulayer-tui: replica 0, run 2 of job")


def test_submit_snapshot_through_the_cli(served: Served, tmp_path: Path) -> None:
    served.start("--simulate", "1xA100-80GB")
    repo = make_repo(tmp_path / "repo")
    done = served.cli("submit", "--snapshot", "--cwd", str(repo), "--json", "--", "cat", "code.txt")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["id"]
    wait_for(lambda: served.cli("wait", str(job_id)).returncode == 0, timeout=20)
    status = served.cli("status", str(job_id))
    commit = git(repo, "rev-parse", "HEAD")
    assert f"snapshot    commit {commit[:12]} (dirty)  4 files" in status.stdout
    detail = json.loads(served.cli("status", str(job_id), "--json").stdout)
    assert detail["job"]["spec"]["snapshot"]["commit"] == commit
    assert served.cli("logs", str(job_id)).stdout == "code v1\n"
    # Refused with the reason and the limit; nothing stored.
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "w", "wb") as fh:  # (sparse: its size is what counts)
        fh.truncate(600 * 1024 * 1024 + 1)
    refused = served.cli("submit", "--snapshot", "--cwd", str(big), "--", "true")
    assert refused.returncode != 0
    assert "over [snapshot] max_mb = 512" in refused.stderr
    assert len(json.loads(served.cli("jobs", "--json").stdout)) == 1


def _deep(root: Path, levels: int) -> Path:
    """``root/d/d/.../d`` (``levels`` folders) with a file at the bottom, made through
    descriptors (no path grows past what the kernel takes)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        with contextlib.suppress(FileExistsError):
            os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    os.close(fd)
    return root


async def test_deep_trees_are_refused_and_a_jobs_own_deep_tree_is_cleaned(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # shutil.rmtree recursed: a 1,100-deep tree left in tmp/ stopped every later engine
    # start (RecursionError), and clean answered 500 after removing the rows, leaking
    # every later job's tree.
    engine = await make_engine()
    deep = _deep(tmp_path / "deep", 300)
    spec = {"command": ["true"], "gpus": 0, "cwd": str(deep), "snapshot": True}
    with pytest.raises(SpecError, match=r"d/\.\.\. is more than 256 folders deep"):
        await engine.submit_many([spec, spec])
    assert list(engine.snapshots.tmp.iterdir()) == []
    # Within the limit, two jobs of one folder share a reading: the second's tree is a
    # copy of the first's (os.walk recursed there too).
    fine = _deep(tmp_path / "fine", 200)
    jobs = await engine.submit_many([{**spec, "cwd": str(fine)}] * 2)
    for job in jobs:
        assert (await engine.wait(job.id, timeout=10)).status is JobStatus.COMPLETED
    # A job may make its own tree as deep as it likes; clean removes it, and the others.
    _deep(engine.snapshots.job_tree(jobs[0].id), 1100)
    done = await engine.retention.clean(time.time() + 1, None)
    assert done["snapshots"] == 2 and list(engine.snapshots.jobs.iterdir()) == []
    # One left in tmp/ (an engine killed while building) never stops the next start.
    _deep(engine.snapshots.tmp / "tree-left", 1100)
    (engine.snapshots.tmp / "tree-left" / "d").chmod(0o500)
    await engine.stop()
    again = await make_engine()
    assert list(again.snapshots.tmp.iterdir()) == []


async def test_the_tree_is_all_that_is_copied(
    make_engine: EngineFactory, tmp_path: Path, paths: Any
) -> None:
    engine = await make_engine(config=make_config(snapshot={"max_mb": 1}))
    # A tracked file under a folder that is now an ignored symlink: git still lists it,
    # and its copy was read through the link, from outside the tree.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("SECRET-OUTSIDE")
    repo = make_repo(tmp_path / "repo")
    (repo / "data").mkdir()
    (repo / "data" / "x.txt").write_text("tracked")
    git(repo, "add", "data")
    git(repo, "commit", "-q", "-m", "data")
    (repo / "data" / "x.txt").unlink()
    (repo / "data").rmdir()
    (repo / "data").symlink_to(outside)
    with (repo / ".gitignore").open("a") as ignore:
        ignore.write("data\n")
    spec = {"command": ["true"], "gpus": 0, "cwd": str(repo), "snapshot": True}
    job = await engine.submit(spec)
    tree = Path(snapshot_of(engine, job)["path"])
    assert not (tree / "data").exists() and "code.txt" in tree_files(tree)
    # The state dir is never copied into itself: refused as the cwd, left out inside it.
    with pytest.raises(SpecError, match="is in the engine's state dir"):
        await engine.submit({**spec, "cwd": str(engine.paths.state_dir)})
    # Folders count toward max_mb (4 KiB each on disk): 20,000 empty ones were 80 MB of
    # store, "0 bytes" by the files' sizes.
    many = tmp_path / "many"
    for i in range(300):
        (many / f"d{i}").mkdir(parents=True)
    with pytest.raises(SpecError, match=r"over \[snapshot\] max_mb = 1"):
        await engine.submit({**spec, "cwd": str(many)})


async def test_clean_removes_a_tree_left_without_its_job(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A tree that could not be removed with its job (a file the job made immutable) was
    # left for ever: its row was gone, and nothing pointed at it. (Played here by removing
    # the row behind the engine's back.)
    import sqlite3

    engine = await make_engine()
    work = tmp_path / "work"
    work.mkdir()
    (work / "a").write_text("a")
    spec = {"command": ["true"], "gpus": 0, "cwd": str(work), "snapshot": True}
    left = await engine.submit(spec)
    kept = await engine.submit(spec)
    for job in (left, kept):
        await engine.wait(job.id, timeout=10)
    await engine.store.flush()
    with sqlite3.connect(engine.paths.database) as db:
        db.execute("DELETE FROM jobs WHERE id = ?", (left.id,))
    assert (await engine.retention.clean(0.0, None))["snapshots"] == 1  # (no job is old)
    assert not engine.snapshots.job_tree(left.id).exists()
    assert engine.snapshots.job_tree(kept.id).exists()


async def test_a_folder_git_ignores_is_refused_not_run_empty(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Submitted from build/ (in .gitignore), the job ran in an empty folder and failed
    # for its missing files (tester h49).
    engine = await make_engine()
    repo = make_repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("*.log\nbuild/\n")
    (repo / "build").mkdir()
    (repo / "build" / "run.py").write_text("print(1)\n")
    spec = {"command": ["true"], "gpus": 0, "cwd": str(repo / "build"), "snapshot": True}
    with pytest.raises(SpecError, match="git lists none of its files"):
        await engine.submit(spec)
    job = await engine.submit({**spec, "cwd": str(repo / "sub")})  # (a tracked folder)
    assert job.status is not JobStatus.FAILED, job.message
    (repo / "empty").mkdir()  # (a folder with nothing in it is no loss)
    assert (await engine.submit({**spec, "cwd": str(repo / "empty")})).id
    # At the repository's top too: `*` in .gitignore, git lists nothing (it ran in an
    # empty folder: tester h156).
    top = tmp_path / "top"
    top.mkdir()
    git(top, "init", "-q")
    (top / ".gitignore").write_text("*\n")
    (top / "d.txt").write_text("data\n")
    with pytest.raises(SpecError, match="git lists none of its files"):
        await engine.submit({**spec, "cwd": str(top)})
    (top / "d.txt").unlink()
    (top / ".gitignore").unlink()
    assert (await engine.submit({**spec, "cwd": str(top)})).id  # (only .git there: no loss)
    with pytest.raises(SpecError, match=f"snapshot: {tmp_path / 'gone'} does not exist"):
        await engine.submit({**spec, "cwd": str(tmp_path / "gone")})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the repo to another user")
async def test_a_repository_git_refuses_to_read_is_refused_not_copied_whole(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Another user's repo ("detected dubious ownership") was copied as a plain folder, its
    # ignored files (secret.log) with it, and no commit said (tester h49).
    engine = await make_engine()
    repo = make_repo(tmp_path / "repo")
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, 65534, 65534)
    spec = {"command": ["true"], "gpus": 0, "cwd": str(repo), "snapshot": True}
    with pytest.raises(SpecError, match="git refuses to read its repository"):
        await engine.submit(spec)
    assert await engine.list_jobs() == []


async def test_a_submissions_copies_keep_the_disk_floor_and_the_timeout(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Private copies for the other jobs of one submission were not checked: three copies
    # of a 400 MB tree went 600 MiB below [logs] min_free_mb, and took past the timeout
    # (tester h49).
    from gpulayer_tui.engine.snapshot import MB, SnapshotError

    work = tmp_path / "work"
    work.mkdir()
    (work / "big.bin").write_bytes(os.urandom(192 * MB))
    st = os.statvfs(tmp_path)
    free_mb = st.f_bavail * st.f_frsize // MB
    # One copy leaves 96 MB above the floor, a second goes 96 below it: margins wider
    # than what the tests beside it write meanwhile (at 36 MB, one failed under -n2).
    config = make_config(logs={"min_free_mb": free_mb - 288}, snapshot={"files": "private"})
    engine = await make_engine(config=config)
    spec = {"command": ["true"], "gpus": 0, "cwd": str(work), "snapshot": True}
    with pytest.raises(SpecError, match=r"another copy of .* below \[logs\] min_free_mb"):
        await engine.submit_many([spec, spec])  # (the first fits; its copy would not)
    assert await engine.list_jobs() == []
    assert list(engine.snapshots.tmp.iterdir()) == []
    one = engine.snapshots.build(str(work), 10**12, 60, private=False)
    with pytest.raises(SnapshotError, match="took longer than \\[snapshot\\] timeout"):
        many = tmp_path / "many"
        many.mkdir()
        for i in range(200):
            (many / f"f{i}").write_text("x")
        engine.snapshots.clone(engine.snapshots.build(str(many), 10**12, 60), time.monotonic() - 1)
    engine.snapshots.discard([one])
    # The limit passed is said with its value (it was not: tester h156).
    with pytest.raises(SnapshotError, match=r"took longer than \[snapshot\] timeout = 30 s;"):
        engine.snapshots.build(str(work), 10**12, 0.0, configured_timeout=30)


def test_a_submission_asking_for_snapshots_is_waited_for_long_enough() -> None:
    # At 30 s the CLI gave up on a submission the engine made a minute later (h49).
    from gpulayer_tui.client import SNAPSHOT_WAIT_S, Client
    from gpulayer_tui.engine.paths import Paths

    client = Client(Paths(Path("/nonexistent"), Path("/nonexistent/c.toml")), timeout=30)
    assert client._submit_timeout({"command": ["true"]}) == 30
    assert client._submit_timeout({"command": ["true"], "snapshot": True}) == SNAPSHOT_WAIT_S
    batch = {"jobs": [{"command": ["a"]}, {"command": ["b"], "snapshot": True}]}
    assert client._submit_timeout(batch) == SNAPSHOT_WAIT_S


async def test_a_submodule_is_copied_as_its_own_git_lists_it(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Its own .gitignore was not heeded (copied by the plain rules, with no ignore list):
    # its ignored checkpoints were copied, and a snapshot over max_mb could not be made
    # smaller by any ignore entry (tester h156).
    inner = tmp_path / "inner"
    inner.mkdir()
    git(inner, "init", "-q")
    (inner / ".gitignore").write_text("*.ign\n")
    (inner / "code.py").write_text("print(1)\n")
    git(inner, "add", "-A")
    git(inner, "commit", "-q", "-m", "inner")
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / "main.py").write_text("print(0)\n")
    git(outer, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(inner), "mod")
    git(outer, "add", "-A")
    git(outer, "commit", "-q", "-m", "outer")
    (outer / "mod" / "ckpt.ign").write_bytes(b"\0" * 1000)  # (ignored by the submodule)
    (outer / "mod" / "new.txt").write_text("untracked in the submodule\n")
    engine = await make_engine()
    job = await engine.submit({"command": ["true"], "gpus": 0, "cwd": str(outer), "snapshot": True})
    tree = engine.snapshots.job_tree(job.id)
    assert tree_files(tree) == {
        ".gitmodules",
        "main.py",
        "mod/.gitignore",
        "mod/code.py",
        "mod/new.txt",
    }
    await engine.wait(job.id, timeout=10)


async def test_a_repository_inside_the_tree_that_git_does_not_track_is_copied(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # git lists it as "nested/" (its own repository, neither a submodule nor ignored):
    # the entry was skipped, and the job ran without the code in its folder, no word
    # said (tester h176 #2). Copied as its own git lists it, as a submodule is.
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / "main.py").write_text("print(0)\n")
    git(outer, "add", "-A")
    git(outer, "commit", "-q", "-m", "outer")
    nested = outer / "nested"
    nested.mkdir()
    git(nested, "init", "-q")
    (nested / ".gitignore").write_text("*.ign\n")
    (nested / "inner.py").write_text("print(1)\n")
    (nested / "ckpt.ign").write_bytes(b"\0" * 100)  # (ignored by its own .gitignore)
    engine = await make_engine()
    job = await engine.submit({"command": ["true"], "gpus": 0, "cwd": str(outer), "snapshot": True})
    tree = engine.snapshots.job_tree(job.id)
    assert tree_files(tree) == {"main.py", "nested/.gitignore", "nested/inner.py"}
    await engine.wait(job.id, timeout=10)


async def test_linked_files_set_by_hand_where_they_are_not_safe_is_warned(
    make_engine: EngineFactory,
) -> None:
    # Chosen by hand as root, one job's write changed what another sharing the file ran,
    # and nothing said so (tester h156).
    from gpulayer_tui.engine.snapshot import writes_read_only_files

    engine = await make_engine(config=LINKED)
    warned = [c for c in await engine.doctor_checks() if c["check"] == "snapshot"]
    if writes_read_only_files():
        assert [c["status"] for c in warned] == ["warn"]
        assert 'files = "linked" while the engine ignores read-only modes' in warned[0]["detail"]
    else:
        assert warned == []
    engine.config = make_config(snapshot={"files": "auto"})  # (as a reload makes it)
    assert not [c for c in await engine.doctor_checks() if c["check"] == "snapshot"]
