"""Job logs: never opened through a symlink, never appended to another job's file, and
given from files made ahead (``O_TMPFILE``) once the spawner knows the logs' directory.

Real files on the test's filesystem throughout; the engine tests run real jobs.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from gpulayer_tui.engine.logfiles import SPARE, LogFiles, open_log
from gpulayer_tui.engine.models import JobStatus

from .conftest import EngineFactory


def _inode(fd_or_path: int | Path) -> int:
    return os.stat(fd_or_path).st_ino


@pytest.fixture
def logs() -> list[LogFiles]:
    made: list[LogFiles] = []
    yield made
    for files in made:
        files.close()


def _ready(logs: list[LogFiles], directory: Path, said: list[str]) -> LogFiles:
    """Log files whose spares lie in ``directory`` (a first start there names it)."""
    files = LogFiles(said.append)
    logs.append(files)
    os.close(files.open(str(directory / "first.log"), fresh=True))
    while files.wanted():
        files.make_one()
    assert len(files.spare) == SPARE
    return files


def test_a_first_start_takes_a_file_made_ahead(tmp_path: Path, logs: list[LogFiles]) -> None:
    files = _ready(logs, tmp_path, [])
    spare = files.spare[-1]
    os.utime(spare, (1, 1))  # made long ago
    fd = files.open(str(tmp_path / "7.log"), fresh=True)
    try:
        assert fd == spare and len(files.spare) == SPARE - 1
        path = tmp_path / "7.log"
        info = os.lstat(path)
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_ino == _inode(fd) and info.st_nlink == 1
        assert abs(info.st_mtime - time.time()) < 60  # its times are the start's
        os.write(fd, b"one\n")
        os.pwrite(fd, b"two\n", 0)  # appends whatever the offset: O_APPEND
        assert path.read_bytes() == b"one\ntwo\n"
    finally:
        os.close(fd)
    assert files.wanted()  # one is missing now: made again when the spawner is idle


def test_a_symlink_at_the_log_is_refused_and_its_target_untouched(
    tmp_path: Path, logs: list[LogFiles]
) -> None:
    bait = tmp_path / "bait"
    bait.write_text("precious\n")
    logdir = tmp_path / "jobs"
    logdir.mkdir()
    for fresh in (True, False):
        link = logdir / f"{fresh}.log"
        link.symlink_to(bait)
        with pytest.raises(OSError) as refused:
            open_log(str(link), fresh, print)
        assert refused.value.errno == 40  # ELOOP: O_NOFOLLOW, or the fresh check
    files = _ready(logs, logdir, [])
    spares = list(files.spare)
    with pytest.raises(OSError, match=r"not a regular file \(a symbolic link\)"):
        files.open(str(logdir / "True.log"), fresh=True)
    os.mkfifo(logdir / "fifo.log")  # (said "(a symlink?)" of a FIFO)
    with pytest.raises(OSError, match=r"not a regular file \(a FIFO\)"):
        files.open(str(logdir / "fifo.log"), fresh=True)
    assert files.spare == spares  # the spare that could not be named is kept
    assert bait.read_text() == "precious\n"
    assert os.path.islink(logdir / "True.log")


def test_a_file_left_at_a_first_starts_log_is_set_aside(
    tmp_path: Path, logs: list[LogFiles]
) -> None:
    said: list[str] = []
    files = _ready(logs, tmp_path, said)
    (tmp_path / "9.log").write_text("someone else's output\n")
    fd = files.open(str(tmp_path / "9.log"), fresh=True)
    os.write(fd, b"mine\n")
    os.close(fd)
    assert (tmp_path / "9.log").read_text() == "mine\n"
    (aside,) = tmp_path.glob("9.log.old-*")
    assert aside.read_text() == "someone else's output\n"
    assert said == [f"{tmp_path / '9.log'} was there before its first start: kept aside as .old-*"]
    (tmp_path / "10.log").mkdir()
    with pytest.raises(IsADirectoryError):
        files.open(str(tmp_path / "10.log"), fresh=True)


def test_a_later_run_appends_and_another_directory_gets_a_created_file(
    tmp_path: Path, logs: list[LogFiles]
) -> None:
    files = _ready(logs, tmp_path, [])
    (tmp_path / "3.log").write_bytes(b"run 1\n")
    fd = files.open(str(tmp_path / "3.log"), fresh=False)  # a retry: the same log goes on
    os.write(fd, b"run 2\n")
    os.close(fd)
    assert (tmp_path / "3.log").read_bytes() == b"run 1\nrun 2\n"
    assert len(files.spare) == SPARE
    other = tmp_path / "elsewhere"
    other.mkdir()
    fd = files.open(str(other / "1.log"), fresh=True)
    os.close(fd)
    assert (other / "1.log").is_file()
    assert files.directory == str(other) and files.spare == []  # made there from now on


def test_a_directory_that_cannot_hold_spares_is_asked_again_only_later(
    tmp_path: Path, logs: list[LogFiles]
) -> None:
    files = LogFiles(print)
    logs.append(files)
    gone = tmp_path / "gone"
    gone.mkdir()
    os.close(files.open(str(gone / "1.log"), fresh=True))
    (gone / "1.log").unlink()
    gone.rmdir()
    assert files.wanted()
    files.make_one()  # ENOENT here; EOPNOTSUPP where O_TMPFILE is not supported
    assert files.spare == [] and not files.wanted()  # (the spawner's loop would spin)


async def test_jobs_write_to_their_own_logs_and_a_planted_link_fails_only_its_job(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    first = await engine.submit({"shell": "echo first"})
    assert (await engine.wait(first.id)).status is JobStatus.COMPLETED
    bait = tmp_path / "bait"
    bait.write_text("precious\n")
    # The next two ids' logs: a link planted at one, a stale file at the other.
    engine.log_path(first.id + 1).symlink_to(bait)
    engine.log_path(first.id + 2).write_text("stale\n")
    planted = await engine.submit({"shell": "echo planted"})
    stale = await engine.submit({"shell": "echo fresh"})
    later = [await engine.submit({"shell": f"echo job {n}"}) for n in range(SPARE + 2)]
    failed = await engine.wait(planted.id)
    assert failed.status is JobStatus.FAILED
    assert f"cannot write the job's log {engine.log_path(planted.id)}" in failed.message
    assert "not a regular file" in failed.message
    assert bait.read_text() == "precious\n"
    assert (await engine.wait(stale.id)).status is JobStatus.COMPLETED
    assert engine.log_path(stale.id).read_text() == "fresh\n"
    for n, job in enumerate(later):
        assert (await engine.wait(job.id)).status is JobStatus.COMPLETED
        assert engine.log_path(job.id).read_text() == f"job {n}\n"
