"""``gpulayer-tui __complete jobs|domains [PREFIX]``: the values the completion scripts
(:mod:`.completion`) offer, from the running engine, one per line as ``VALUE<TAB>TEXT``
(``TEXT`` describes it, for zsh and fish; bash keeps ``VALUE``). ``jobs:active`` offers
only the active jobs (what ``cancel`` takes); ``domains:ACTION`` the domains ``domain
ACTION`` applies to (``drain``: those not drained yet; ``release``: those out of service;
``forget``: the missing GPUs; anything else: every domain).

Hidden, and called on every <Tab>, so it must be quick and quiet: the light client (no
argparse, no engine stack), a short timeout, and with no engine (or any trouble) nothing
at all on stdout or stderr, exit 0.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..client import Client

ACTIVE = ["pending", "queued", "running"]
RECENT = 300  # the newest ids offered after the active ones
TIMEOUT_S = 0.5  # per request: a <Tab> must not hang on a stuck engine


def _text(value: object) -> str:
    from ..fields import printable

    return printable(str(value)).replace("\t", " ")


def _jobs(client: Client, prefix: str, active_only: bool = False) -> list[str]:
    head, comma, last = prefix.rpartition(",")
    if comma:
        # `cancel 12,1<Tab>`: the ids a comma list takes (`cancel`, `wait`, `--after`) go on
        # after its last comma, as the whole word (none was offered past a comma).
        given = head.split(",")
        if not all(word.isdigit() for word in given):
            return []
        return [
            f"{head},{line}"
            for line in _jobs(client, last, active_only)
            if line.split("\t", 1)[0] not in given
        ]
    if prefix and not prefix.isdigit():
        return []
    active = client.jobs_page(status=ACTIVE, limit=1000)["jobs"]
    recent = [] if active_only else client.jobs_page(limit=RECENT)["jobs"]
    typed: list[dict[str, object]] = []
    if prefix and prefix == str(int(prefix)):
        # The job the prefix names itself, older than the newest RECENT: left out, the
        # one newer id that extends it was completed in its place (53 became 530, and
        # `cancel 53<Tab>` cancelled 530).
        try:
            typed = [client.request("GET", f"/jobs/{prefix}")["job"]]
        except Exception:  # (no such job: nothing to add)
            typed = []
        if active_only:
            typed = [row for row in typed if row["status"] in ACTIVE]
    lines: list[str] = []
    seen: set[int] = set()
    for row in (*typed, *active, *recent):
        job_id = row["id"]
        if job_id in seen or not str(job_id).startswith(prefix):
            continue
        seen.add(job_id)
        lines.append(f"{job_id}\t{_text(row['status'])} {_text(row['name'])}")
    return lines


def _domains(client: Client, prefix: str, action: str = "") -> list[str]:
    head, comma, last = prefix.rpartition(",")
    if comma:
        # `--domain gpu0,<Tab>`: a choice of domains goes on after its last comma, as
        # the whole word (none was offered past a comma: tester h153)
        given = head.split(",")
        return [
            f"{head},{line}"
            for line in _domains(client, last, action)
            if line.split("\t", 1)[0] not in given
        ]
    answer = client.request("GET", "/domains")
    lines = []
    if action != "forget":
        for domain in answer["domains"]:
            state = domain["state"]
            if action == "release" and state == "in_service":
                continue  # (release offered domains in service: tester h153)
            if action == "drain" and state == "draining":
                continue
            name = str(domain["name"])
            if name.startswith(prefix) and name.isprintable() and "\t" not in name:
                gpu = domain.get("gpu_index")
                where = "cpu pool" if gpu is None else f"GPU {gpu}"
                lines.append(f"{name}\t{where}, {_text(state)}")
    if action in ("forget", "list"):
        for missing in answer.get("missing") or ():
            name = str(missing["name"])
            if name.startswith(prefix) and name.isprintable() and "\t" not in name:
                lines.append(f"{name}\tmissing: {_text(missing['reason'])[:60]}")
    return lines


def run_complete(words: Sequence[str]) -> int:
    """Print the candidates for ``words`` (``jobs|domains [PREFIX]``); always exit 0."""
    import os
    import sys

    kind, _, detail = words[0].partition(":") if words else ("", "", "")
    if kind not in ("jobs", "domains") or len(words) > 2:
        return 0
    prefix = words[1] if len(words) == 2 else ""
    try:
        from ..client import Client
        from ..engine.paths import resolve_paths

        timeout = float(os.environ.get("GPULAYER_COMPLETE_TIMEOUT", TIMEOUT_S))
        client = Client(resolve_paths(), timeout=timeout if 0 < timeout <= 10 else TIMEOUT_S)
        if kind == "jobs":
            lines = _jobs(client, prefix, active_only=detail == "active")
        else:
            lines = _domains(client, prefix, detail)
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
    except Exception:  # (no engine, a stuck one, a closed pipe: offer nothing)
        try:  # and no "Exception ignored" from the flush at exit into a closed pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
    return 0
