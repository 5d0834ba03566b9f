"""The process table's tree view, as a function of rows and jobs (no table needed)."""

from __future__ import annotations

from gpulayer_tui.widgets.process_row import ProcessRow
from gpulayer_tui.widgets.process_tree import JobLine, tree_lines


def _row(gpu: int, pid: int, ppid: int | None, job: int | None, user: str = "ana") -> ProcessRow:
    return ProcessRow(gpu, pid, user, 1 << 30, job, f"python p{pid}.py", ppid=ppid, gpu_util=10)


def test_jobs_over_their_processes_and_children_under_parents() -> None:
    rows = [  # (the table's sort order)
        _row(0, 200, 50, None, "ben"),
        _row(1, 102, 100, 7),
        _row(0, 100, 1, 7),
        _row(2, 101, 100, 7),
        _row(3, 103, 102, 7),
        _row(1, 201, 200, None, "ben"),
        _row(2, 300, 1, None, "cy"),
    ]
    lines = tree_lines(rows, {7: JobLine(99, "ana", "train")})
    shown = [(line.key, line.tree_prefix) for line in lines]
    assert shown == [
        ("0:200", ""),  # ben's processes first: the first row is his
        ("1:201", "└─ "),
        ("job:7", ""),
        ("0:100", "└─ "),
        ("1:102", "   ├─ "),  # siblings keep the table's order: 102 came before 101
        ("3:103", "   │  └─ "),
        ("2:101", "   └─ "),
        ("2:300", ""),
    ]
    job = lines[2]
    assert job.job_line and (job.pid, job.user, job.command) == (99, "ana", "train")
    assert job.gpus == (0, 1, 2, 3) and job.used_bytes == 4 << 30 and job.gpu_util == 40


def test_a_jobs_line_says_what_its_rows_do_not_once_more() -> None:
    # Its leader's pid and one process's figures were said twice, on the job's line and
    # on the process's row under it (the list left by tester h61).
    (job, only) = tree_lines([_row(0, 100, 1, 7)], {7: JobLine(100, "ana", "train")})
    assert job.job_line and (job.pid, job.used_bytes, job.gpu_util) == (0, None, None)
    assert (only.pid, only.used_bytes, only.gpu_util) == (100, 1 << 30, 10)
    # Two processes: the sums, and the leader's pid stays off where a row has it.
    job = tree_lines([_row(0, 100, 1, 7), _row(0, 101, 100, 7)], {7: JobLine(100, "ana", "t")})[0]
    assert (job.pid, job.used_bytes, job.gpu_util) == (0, 2 << 30, 20)


def test_a_process_on_two_gpus_has_its_children_once_and_a_job_without_a_record() -> None:
    rows = [_row(0, 100, 1, 7), _row(1, 100, 1, 7), _row(1, 101, 100, 7)]
    lines = tree_lines(rows, {})
    assert [(line.key, line.tree_prefix) for line in lines] == [
        ("job:7", ""),
        ("0:100", "├─ "),
        ("1:101", "│  └─ "),
        ("1:100", "└─ "),
    ]
    assert lines[0].command == "job 7" and lines[0].pid == 0  # (the job is not loaded)


def test_a_command_line_that_is_not_utf8_reads_as_its_bytes_escaped() -> None:
    # Read with surrogateescape, it reached `gpus --json` as lone surrogates ("\udcff"),
    # which strict JSON decoders refuse.
    import json
    import subprocess
    import sys

    from gpulayer_tui.engine.procs import read_cmdline

    from .conftest import wait_for

    # (a carriage return too: psutil read it as a line feed, and the tables said "\x0a"
    # of a process that held none: tester h197)
    argv = [b"py\xff\xfethon", b"-c", b"import time; time.sleep(60)", b"caf\xc3\xa9 \xc3(", b"a\rb"]
    proc = subprocess.Popen(argv, executable=sys.executable)
    try:
        wait_for(lambda: "time.sleep" in read_cmdline(proc.pid))
        text = read_cmdline(proc.pid)
        assert text == "py\\xff\\xfethon -c import time; time.sleep(60) café \\xc3( a\rb"
        json.dumps(text, ensure_ascii=False).encode("utf-8")  # (no lone surrogate)
    finally:
        proc.kill()
        proc.wait()
