"""Plain-text tables for the CLI (no rich: it would double the CLI's start-up time)."""

from __future__ import annotations

import time

from ..cells import cell_width, cut_to_width, pad_to_width
from ..fields import duration_typed, printable, wanted_gpus
from ..formatting import (
    SHELL_LINE_MARK,
    argv_text,
    domains_text,
    duration,
    event_label,
    event_words,
    gib,
    gpus_text,
    live_message,
    placement_words,
    plural,
    reason_words,
    replica_health,
    replica_state,
    run_started_at,
    usage_lines,
    user_text,
)

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from typing import Any

    from ..wire import JobJSON, JobRowJSON, TimelineEntryJSON


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces; unprintable characters in a cell are
    escaped (see :func:`printable`)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], cell_width(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append(
            "  ".join(pad_to_width(c, w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


def _runtime(job: JobRowJSON, now: float) -> str:
    started = run_started_at(job)
    if not started or job.get("status") in ("queued", "pending"):
        return ""  # (a job waiting again: its last start is no run now)
    return duration((job.get("ended_at") or now) - started)


def fit(text: str, width: int | None) -> str:
    """Each line cut to ``width`` columns with an ellipsis (``None``: as it is, for a pipe,
    where nothing a script may grep for should be lost)."""
    if width is None:
        return text
    return "\n".join(cut_to_width(line, width) for line in text.split("\n"))


def format_jobs(
    jobs: list[JobRowJSON], now: float, width: int | None = None, sort: str | None = None
) -> str:
    """The ``jobs`` table. PRIO is there when a listed job has a priority other than 0.

    On a terminal ``width`` columns wide, a table wider than it first loses its columns
    that are empty in every row (GPUS, VRAM, EXIT, ...), then, until REASON starts at
    least :data:`REASON_ROOM` columns before the edge, NAME is cut to 16 and USER (where
    every row is one user's), VRAM, GPUS and DOMAINS go, in that order; then rows are
    cut at the edge. At 80 columns the cut took RUNTIME and EXIT, which a glance at a
    failed sweep looks for (testers h69, h73). The column of the ``sort`` asked for stays
    (``--sort vram`` dropped VRAM: tester h94)."""
    if not jobs:
        return "no jobs"
    headers = ["ID", "NAME", "USER", "STATUS", "PRIO", "DOMAINS", "GPUS", "VRAM", "RUNTIME"]
    headers += ["EXIT", "REASON"]
    rows = []
    for job in jobs:
        spec = job.get("spec", {})
        priority = spec.get("priority") or 0
        rows.append(
            [
                str(job["id"]),
                cut_to_width(job["name"], 24),
                user_text(job),
                job["status"] + (f" {health}" if (health := replica_health(job)) else ""),
                f"{priority:+d}" if priority else "",
                domains_text(job),
                gpus_text(job),
                "" if spec.get("vram_gb") is None else f"{spec['vram_gb']:g}",
                _runtime(job, now),
                "" if job["exit_code"] is None else str(job["exit_code"]),
                live_message(job, now),
            ]
        )
    empty = {i for i in range(len(headers)) if not any(row[i] for row in rows)}
    drop = {headers.index("PRIO")} & empty  # (no job has one: nothing to say)
    text = _table_without(headers, rows, drop)
    if width is None or max(cell_width(line) for line in text.split("\n")) <= width:
        return text
    # (REASON stays: an empty one still heads the column a cut would end in)
    drop = empty - {len(headers) - 1}
    text = _table_without(headers, rows, drop)
    steps: list[str] = ["NAME"]
    if len({row[2] for row in rows}) == 1:
        steps.append("USER")
    steps += ["VRAM", "GPUS", "DOMAINS"]
    sorted_by = {"priority": "PRIO"}.get(sort or "", (sort or "").upper())
    drop -= {i for i, header in enumerate(headers) if header == sorted_by}
    steps = [step for step in steps if step != sorted_by]
    for step in steps:
        if _reason_at(text) <= width - REASON_ROOM:
            break
        if step == "NAME":
            rows = [[row[0], cut_to_width(row[1], 16), *row[2:]] for row in rows]
        else:
            drop = drop | {headers.index(step)}
        text = _table_without(headers, rows, drop)
    return text


REASON_ROOM = 16
"""Columns of REASON a narrow terminal's ``jobs`` table keeps room for, dropping others."""


def _reason_at(text: str) -> int:
    """The terminal column where the table's REASON starts."""
    header = text.split("\n", 1)[0]
    return cell_width(header[: header.index("REASON")]) if "REASON" in header else 0


def _table_without(headers: list[str], rows: list[list[str]], drop: set[int]) -> str:
    keep = [i for i in range(len(headers)) if i not in drop]
    return table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows])


def _when(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def format_job(job: JobJSON, events: list[TimelineEntryJSON], now: float, last: int = 40) -> str:
    """The ``status`` view: fields, then the timeline (its ``last`` entries; 0: all)."""
    spec = job.get("spec", {})
    command = spec.get("command")
    if isinstance(command, str):  # (an adopted process's command line, as /proc has it)
        shown = command
    else:
        # (repr() doubled backslashes and wrote \' inside single quotes, not sh's quoting)
        shown = argv_text(command) if command else str(spec.get("shell", "")) + SHELL_LINE_MARK
    lines = [
        f"job {job['id']}  {job['name']}  [{job['kind']}]",
        # (the reason in words, where the message does not say it: "cancelled
        # (cancelled)", "completed (exit_code)": tester h89)
        f"  status      {job['status']}" + (f" ({why})" if (why := reason_words(job)) else ""),
        f"  message     {live_message(job, now)}",
        f"  command     {shown}",
        *_request_lines(spec),
        *_snapshot_lines(spec),
        f"  domains     {', '.join(job['domains']) or '-'}"
        + (
            f"  ({'GPU' if len(job['gpus']) == 1 else 'GPUs'} {','.join(map(str, job['gpus']))})"
            if job["gpus"]
            else ""
        ),
        f"  exit code   {'-' if job['exit_code'] is None else job['exit_code']}",
        f"  user        {user_text(job) or '-'}",
        f"  created     {_when(job['created_at'])}",
    ]
    if job.get("termination_reason") == "launch_failed":
        lines.append("  started     - (never: its launch failed)")
    elif job.get("started_at"):
        # (waiting again, a requeued job or a service being placed again, it has no
        # runtime now: "runtime" was followed by nothing)
        ran = _runtime(job, now)
        lines.append(
            f"  started     {_when(job['started_at'])}  "
            + (f"runtime {ran}" if ran else "(last start; waiting again)")
        )
    if job.get("pid"):
        lines.append(f"  pid         {job['pid']}")
    if job.get("kind") == "service":
        lines.extend(_replica_lines(job, now))
    usage = job.get("usage")
    if usage is not None:
        active = job.get("status") in ("pending", "queued", "running")
        lines.extend(f"  {label:<11} {text}" for label, text in usage_lines(usage, active))
    lines.append("  timeline")
    if last and len(events) > last:
        earlier = len(events) - last
        lines.append(f"    ... {earlier} earlier (status {job['id']} --last 0 shows all)")
        events = events[-last:]
    for ev in events:
        # (as the TUI's timeline says it: "completed (exit_code): exited with code 0" and
        # "job.edited: edited: priority 0 -> 5" were the wire's words: tester h94)
        reason, message = event_words(ev)
        extra = f" ({reason})" if reason else ""
        said = f": {message}" if message else ""
        lines.append(f"    {_when(ev['at'])}  {event_label(ev)}{extra}{said}")
    # Names, commands and messages are users' text: escaped, never sent as escapes.
    return "\n".join(printable(line) for line in lines)


def _request_lines(spec: dict[str, Any]) -> list[str]:
    """What the job asked for (what ``edit`` changes): shown only where set, so that a
    plain job's view stays short."""
    lines = []
    if spec.get("cwd"):
        lines.append(f"  cwd         {spec['cwd']}")
    asks = []
    # (a count left out is the engine's: "asks for    on gpu3" for a job that waits for
    # one GPU there: tester h91)
    gpus = wanted_gpus(spec) if spec.get("kind") != "adopted" else spec.get("gpus")
    if gpus:
        asks.append(f"{gpus} GPU{'s' if gpus != 1 else ''}")
        copies = spec.get("replicas") or 1
        if spec.get("kind") == "service" and copies > 1:
            # ("asks for 1 GPU" beside the three domains it holds: tester h93)
            asks[-1] += f" per replica ({gpus * copies} in all)"
    if spec.get("vram_gb") is not None:
        asks.append(f"{spec['vram_gb']:g} GiB VRAM per GPU")
    if spec.get("exclusive"):
        asks.append("exclusive")
    domain = spec.get("domain")
    if isinstance(domain, str):
        asks.append(f"on {domain}")
    elif domain:
        names = [str(d) for d in domain]
        # (an adopted process holds every domain it was adopted on: no choice among them)
        takes = len(names) if spec.get("kind") == "adopted" else gpus or 1
        if len(names) == 1:
            asks.append(f"on {names[0]}")
        elif takes >= len(names):  # (all of them: an adopted process holding both GPUs)
            asks.append(f"on {', '.join(names[:-1])} and {names[-1]}")
        elif takes == 1:
            asks.append(f"on {' or '.join(names)}")
        else:
            asks.append(f"on {takes} of {', '.join(names)}")
    if spec.get("cluster"):
        asks.append(f"cluster {spec['cluster']}")
    for key, unit in (("cpus", "CPUs"), ("mem_gb", "GB memory")):
        if spec.get(key) is not None:
            asks.append(f"{spec[key]:g} {unit}")
    if asks:
        lines.append(f"  asks for    {', '.join(asks)}")
    if spec.get("priority"):
        lines.append(f"  priority    {spec['priority']}")
    if spec.get("timeout") is not None:
        # (as typed and as its edit line says it: "5400 s" beside "none -> 1h30m": h96)
        lines.append(f"  timeout     {duration_typed(spec['timeout'])}")
    if spec.get("project"):
        lines.append(f"  project     {spec['project']}")
    # Those it needs completed, then those whose any end will do: "jobs 3, 35, 36 (any
    # end)" read as if all three were any end (tester h86).
    completes: list[str] = []
    any_end: list[str] = []
    for dep in spec.get("depends_on") or []:
        if isinstance(dep, dict):
            (any_end if dep.get("any_exit") else completes).append(str(dep.get("job")))
        else:
            completes.append(str(dep))
    groups = [
        f"job{'s' if len(ids) > 1 else ''} {', '.join(ids)}{said}"
        for ids, said in ((completes, ""), (any_end, " (any end)"))
        if ids
    ]
    if groups:
        lines.append(f"  after       {'; '.join(groups)}")
    if spec.get("restart_of"):
        lines.append(f"  restart of  job {spec['restart_of']}")
    return lines


def _snapshot_lines(spec: dict[str, Any]) -> list[str]:
    """The snapshot a job runs in (``submit --snapshot``): where, which commit, how big."""
    snap = spec.get("snapshot")
    if not isinstance(snap, dict):
        return []
    commit = snap.get("commit")
    if commit:
        source = f"commit {commit[:12]}" + (" (dirty)" if snap.get("dirty") else " (clean)")
    elif snap.get("dirty") is not None:
        source = "git, no commit yet"
    else:
        source = "not a git tree"
    size = snap.get("bytes", 0)
    shown = f"{size / 1024**2:.1f} MB" if size >= 1024**2 else plural(size, "byte")
    return [
        f"  snapshot    {source}  {plural(snap.get('files', 0), 'file')}, {shown}",
        f"  runs in     {snap.get('path', '-')}  (copy of {snap.get('source', '-')})",
    ]


def _replica_lines(job: JobRowJSON, now: float) -> list[str]:
    spec = job.get("spec", {})
    policy = spec.get("restart", "always")
    limit = spec.get("max_restarts")
    # (an ended or never placed service: none up of how many it ran or asks for, as the
    # TUI's detail says it; "replicas 2" read as two running: tester h96)
    count = len(job.get("replicas") or []) or spec.get("replicas") or 1
    lines = [
        f"  replicas    {replica_health(job) or f'0/{count} up'}  restart {policy}"
        + ("" if limit is None else f", max {limit}")
        + f"  {placement_words(job)}"
    ]
    placing = job.get("status") in ("pending", "queued")
    states = {r["index"]: replica_state(r, now, placing=placing) for r in job.get("replicas", [])}
    # A long state (why a replica is starting, a rolling restart's place) is said whole
    # under the table, its first words in the cell: the table was ~190 columns wide with
    # a starting replica's message in STATE (tester h170).
    cells = {i: _state_cell(state) for i, state in states.items()}
    rows = [
        [
            str(r["index"]),
            cells[r["index"]],
            r.get("endpoint") or "-",
            ",".join(r.get("domains", [])),
            "-"
            if r.get("pid") is None or r.get("state") in ("backoff", "exited")
            else str(r["pid"]),
            str(r.get("restarts", 0)),
            "-" if r.get("last_exit_code") is None else str(r["last_exit_code"]),
        ]
        for r in job.get("replicas", [])
    ]
    if rows:
        headers = ["#", "STATE", "ENDPOINT", "DOMAINS", "PID", "RESTARTS", "LAST EXIT"]
        lines.extend("    " + line for line in table(headers, rows).splitlines())
        lines.extend(
            f"    replica {i}: {state}" for i, state in states.items() if cells[i] != state
        )
    return lines


STATE_CELL_MAX = 32
"""Columns of a replica's STATE cell in ``status``; a longer state is said under the table."""


def _state_cell(state: str) -> str:
    """A replica's state as its STATE cell says it: whole if short, else its first words
    (before its details in parentheses or after a ``;``), with a ``*``: said whole below."""
    if len(state) <= STATE_CELL_MAX:
        return state
    head = state.split(" (", 1)[0].split("; ", 1)[0]
    return (head if len(head) <= STATE_CELL_MAX else head[: STATE_CELL_MAX - 1] + "…") + " *"


def _driver_reserves(data: dict[str, Any]) -> str | None:
    """The line saying what the driver keeps of each GPU (not in TOTAL), if anything:
    else an idle GPU's USED/TOTAL and FREE would not add up, with no word of why."""
    kept = {
        dom["name"]: dom["vram"]["driver_reserved"]
        for dom in data["domains"]
        if dom.get("vram") and dom["vram"].get("driver_reserved")
    }
    if not kept:
        return None
    if len(set(kept.values())) == 1 and len(kept) == sum(
        1 for dom in data["domains"] if dom.get("gpu_index") is not None
    ):
        return f"the driver keeps {gib(next(iter(kept.values())))} GiB of each GPU (not in TOTAL)"
    each = ", ".join(f"{name} {gib(size)}" for name, size in kept.items())
    return f"the driver keeps GiB of these GPUs (not in TOTAL): {each}"


def format_gpus(data: dict[str, Any]) -> str:
    """The ``gpus`` view: one row per domain, then foreign (unregistered) processes."""
    lines = []
    if data.get("message"):
        lines.append(printable(f"note: {data['message']}"))
    rows: list[list[str]] = []
    at: list[float] = []  # each row's GPU index (the CPU pool last): GPUs in index order
    foreign = []
    for dom in data["domains"]:
        at.append(float("inf") if dom["gpu_index"] is None else dom["gpu_index"])
        gpu, vram = dom.get("gpu"), dom.get("vram")
        util = "" if not gpu or gpu["utilization"] is None else f"{gpu['utilization']}%"
        temp = "" if not gpu or gpu["temperature"] is None else f"{gpu['temperature']}C"
        notes = [str(gpu["error"])] if gpu and gpu.get("error") else []
        mark = ""
        if dom.get("failures") and gpu:
            # Its last reads failed: the figures are the last good read's, not the GPU's
            # now (they read as live; its memory too: tester h102).
            util, temp = (f"{util}?" if util else ""), (f"{temp}?" if temp else "")
            mark = "?"
            why = dom.get("last_error") or "?"
            # (The reading's own error, said first already, is not said twice; one pair
            # of brackets: "(NVML_ERROR_UNKNOWN) (last 7 reads failed)" read as two.)
            failed = f"last {dom['failures']} reads failed"
            notes.append(failed if why == gpu.get("error") else f"{failed}: {why}")
        rows.append(
            [
                dom["name"],
                "" if dom["gpu_index"] is None else str(dom["gpu_index"]),
                (gpu or {}).get("name", "CPU pool" if dom["gpu_index"] is None else "?"),
                f"{dom['used_slots']}/{dom['slots']}",
                util,
                temp,
                "" if not vram else f"{gib(vram['used'])}{mark}/{gib(vram['total'])}",
                "" if not vram else gib(vram["owned"]),
                # (declared by jobs there beyond what they use: without it the parts did
                # not add up to the total, 40 GiB of 80 unaccounted for)
                "" if not vram else gib(vram.get("reserved_extra", 0)),
                "" if not vram else gib(vram["unregistered"]),
                "" if not vram else gib(vram["unattributed"]),
                # (free as of that read too: "75.0" of a lost GPU read as live; h194)
                "" if not vram else f"{gib(vram['free'])}{mark}",
                dom["state"] + (f" ({'; '.join(notes)})" if notes else ""),
            ]
        )
        # (a job that just ended is still its processes' owner until the next sample: it
        # was said to be "outside its GPUs" for that second, tester h80)
        held = set(dom.get("jobs") or ()) | set(dom.get("leaving_jobs") or ())
        for proc in dom["processes"]:
            owner = proc["job_id"]
            if owner is None or owner not in held:
                # (A job's process on a GPU the job does not hold counts as unregistered
                # there: listed too, or the total named memory no row showed.)
                whose = "" if owner is None else f"job {owner}'s, outside its GPUs: "
                foreign.append(
                    [
                        str(proc["pid"]),
                        dom["name"],
                        gib(proc["used_bytes"]),
                        proc["user"],
                        whose + proc["command"],
                    ]
                )
    elsewhere = 0  # memory no job holds on GPUs without a domain (not "unregistered")
    for other in data.get("gpus_without_domain") or ():
        # A GPU the config leaves out: its load and memory, its jobs' and others', no
        # slots; or one the driver no longer lists while a job still runs there.
        gpu = other.get("gpu") or {}
        util = "" if gpu.get("utilization") is None else f"{gpu['utilization']}%"
        temp = "" if gpu.get("temperature") is None else f"{gpu['temperature']}C"
        total, used = gpu.get("memory_total"), gpu.get("memory_used")
        if total is not None and gpu.get("memory_reserved"):
            total -= gpu["memory_reserved"]  # (what jobs can have, as in the domains' rows)
        state = "missing: not found by the driver" if other.get("missing") else "no domain"
        at.append(other["gpu_index"])
        if other["jobs"]:
            jobs = other["jobs"]
            state += f" (still running: job{'s' if len(jobs) > 1 else ''} "
            state += f"{', '.join(map(str, jobs))})"
        if gpu.get("error"):
            state += f" ({gpu['error']})"
        held = set(other["jobs"])
        mine = theirs = 0
        for proc in other.get("processes") or ():
            if proc["job_id"] is not None and proc["job_id"] in held:
                mine += proc["used_bytes"] or 0
                continue
            theirs += proc["used_bytes"] or 0
            whose = "" if proc["job_id"] is None else f"job {proc['job_id']}'s: "
            where = f"gpu {other['gpu_index']} (no domain)"
            command = whose + proc["command"]
            foreign.append(
                [str(proc["pid"]), where, gib(proc["used_bytes"]), proc["user"], command]
            )
        elsewhere += theirs
        known = total is not None and used is not None
        free = gib(max(0, total - used)) if total is not None and used is not None else ""
        rows.append(
            [
                # (a missing GPU's row said "-" and "?": the domain it was, and its UUID)
                f"({other['name']})" if other.get("missing") and other.get("name") else "-",
                str(other["gpu_index"]),
                gpu.get("name") or (other.get("missing") and other.get("gpu_uuid")) or "?",
                "",
                util,
                temp,
                f"{gib(used)}/{gib(total)}" if known else "",
                gib(mine) if known else "",
                "",
                gib(theirs) if known else "",
                "",
                free,
                state,
            ]
        )
    lines.append(
        table(
            [
                "DOMAIN",
                "GPU",
                "MODEL",
                "SLOTS",
                "UTIL",
                "TEMP",
                "USED/TOTAL GiB",
                "JOBS",
                "RESERVED",
                "UNREG",
                "UNATTR",
                "FREE",
                "STATE",
            ],
            [row for _, row in sorted(zip(at, rows, strict=True), key=lambda pair: pair[0])],
        )
    )
    summary = f"unregistered VRAM: {gib(data['unregistered_total'])} GiB"
    if elsewhere:
        summary += (
            f" (and {gib(elsewhere)} GiB held by processes of no job on GPUs without a domain)"
        )
    lines.append(summary)
    live = {d.get("name") for d in data.get("domains") or ()}
    for gone in data.get("missing_gpus") or ():
        # (by its UUID where another GPU's domain has its name now: as `domain list`)
        forget = gone["gpu_uuid"] if gone["name"] in live else gone["name"]
        lines.append(
            f"not found by the driver: the GPU of {gone['name']} ({gone['gpu_uuid']}), "
            "which this machine had; jobs needing it wait (`gpulayer-tui domain forget "
            f"{forget}` if it was removed for good)"
        )
    kept = _driver_reserves(data)
    if kept:
        lines.append(kept)
    if foreign:
        lines.append("")
        lines.append(table(["PID", "DOMAIN", "GiB", "USER", "COMMAND"], foreign))
    clusters = data.get("clusters") or []
    if clusters:
        lines.append("")
        lines.append(
            table(
                ["CLUSTER", "PARTITION", "STATE", "NODES", "GPUS", "ALLOC", "IDLE", "JOBS"],
                [
                    [
                        c["name"],
                        c["partition"],
                        (c.get("state") or "?").lower()
                        if c.get("answering")
                        else _not_answering(c),
                        str(c.get("nodes", "?")),
                        str(c.get("gpus_total", "?")),
                        str(c.get("gpus_allocated", "?")),
                        str(c.get("gpus_idle", "?")),
                        str(c.get("jobs", 0)),
                    ]
                    for c in clusters
                ],
            )
        )
    return "\n".join(lines)


def _not_answering(cluster: dict[str, Any]) -> str:
    """``not answering since 14:02:11: squeue did not answer within 30 s``."""
    since = cluster.get("down_since")
    why = cluster.get("error")
    # (an answer that is an error is a refusal, as the TUI's panel says it: "not answering:
    # scontrol: Partition nope not found" of a cluster that answered: tester h150)
    words = "not answering" if since or not why else "refused"
    if since:
        words += f" since {time.strftime('%H:%M:%S', time.localtime(since))}"
    return f"{words}: {why}" if why else words
