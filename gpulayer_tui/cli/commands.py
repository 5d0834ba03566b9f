"""The subcommands: each turns parsed arguments into API calls and prints the result."""

from __future__ import annotations

import errno
import os
import sys
import time

from .. import jsonlite
from ..client import ApiError, Client, EngineLost, EngineNotRunning, NotText, StreamIdle, quote
from ..pathwalk import UntrustedLink
from .exits import EXIT_FAILED, EXIT_LOST, EXIT_NO_ENGINE, EXIT_OK, EXIT_TIMED_OUT, EXIT_USAGE

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:  # (annotations only: keep `submit` cheap to start)
    import argparse
    from collections.abc import Callable
    from typing import Any

    from ..engine.paths import Paths
    from .terminal_output import OwnOutput

WAIT_SLICE_S = 20.0  # `wait` asks the engine in slices of this (see _wait)
RESTART_PATIENCE_S = 30.0  # how long `wait` and `logs -f` wait for an engine to be back
UNSTORED_GRACE_S = 2.0  # `wait` says a job's end is not stored only once it waited this long
FOLLOW_IDLE_S = 10.0  # `logs -f` asks whether the engine answers after this long quiet
REFUSED = {"over_capacity", "dependency_failed", "launch_failed"}
SERVICE_FLAGS = {
    "replicas": "--replicas",
    "restart": "--restart",
    "max_restarts": "--max-restarts",
    "port": "--no-port",
    "retry": "--max-attempts",
}


_json_printed = False
"""Whether this command printed a JSON document (a refusal after it prints none)."""


def _print_json(data: Any) -> None:
    import json  # (not on the quick path's default output: it imports re)

    global _json_printed
    _json_printed = True
    print(json.dumps(data, indent=2, sort_keys=True))


def _json_refusal(args: argparse.Namespace, said: str) -> None:
    """With ``--json``, a refusal is a document on stdout too (``{"error", "id"?}``), as
    ``wait`` and ``cancel`` answered already: ``status``/``why --json`` of an unknown id
    printed nothing there, and a script reading stdout could not tell why (tester h178).
    Not after a document was printed, nor for ``jobs``, whose list is written page by
    page."""
    if not getattr(args, "json", False) or _json_printed or args.command == "jobs":
        return
    document: dict[str, Any] = {"error": said}
    job = getattr(args, "job", None)
    if isinstance(job, (int, str)) and str(job).isdigit():
        document["id"] = int(job)
    try:
        _print_json(document)
    except OSError:
        pass  # (the refusal is said on stderr as well)


def _error(message: str) -> None:
    from ..fields import printable  # (an engine's message can quote what a user wrote)

    # Line by line: our own messages have several lines; what is escaped is what could
    # act on a terminal (escapes, controls), never the line breaks themselves.
    lines = "\n".join(printable(line) for line in message.split("\n"))
    print(f"gpulayer-tui: {lines}", file=sys.stderr)


def domain_names(given: list[str]) -> list[str]:
    """``--domain`` values, each one name or a comma-separated list (as ``--after``
    takes ids: ``--domain gpu0,gpu1`` was refused as one name, tester h84), in order.
    (A domain name has no comma; empty parts are left to the engine's check, and a name
    given twice too: most often a slip for another, as a repeated ``--after`` id is.)"""
    names = [part.strip() for value in given for part in value.split(",")]
    return [name for name in names if name]


def _spec_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for key in ("name", "project", "gpus", "vram_gb", "timeout"):
        value = getattr(args, key)
        if value is not None:
            spec[key] = value
    if args.domain:
        names = domain_names(args.domain)
        if not names:  # (",": "unknown domain ','" was said)
            parser.error(f"--domain: no domain name in {', '.join(map(repr, args.domain))}")
        spec["domain"] = names[0] if len(names) == 1 else names
    if args.exclusive:
        spec["exclusive"] = True
    if args.notify:
        spec["notify"] = True
    if args.preemptible:
        spec["preemptible"] = True
    for key in ("cluster", "cpus", "mem_gb"):
        if getattr(args, key, None) is not None:
            spec[key] = getattr(args, key)
    if args.no_requeue:
        spec["requeue"] = False
    if getattr(args, "like", None) is None:  # (the job copied may be either)
        # Said in flags (the engine's words name spec fields: "add preemptible").
        if args.no_requeue and not args.preemptible:
            parser.error("--no-requeue applies to --preemptible jobs only: add --preemptible")
        for key, flag in (("cpus", "--cpus"), ("mem_gb", "--mem-gb")):
            if getattr(args, key, None) is not None and getattr(args, "cluster", None) is None:
                parser.error(f"{flag} applies to cluster jobs only: add --cluster NAME")
    if args.snapshot and args.no_snapshot:
        parser.error("give either --snapshot or --no-snapshot, not both")
    if args.snapshot or args.no_snapshot:
        spec["snapshot"] = bool(args.snapshot)
    if args.priority is not None:  # (--priority 0 too: it is asked for, not the default)
        spec["priority"] = args.priority
    deps = _dependencies(args.after, args.after_any)
    if deps:
        spec["depends_on"] = deps
    if args.cwd == "":
        parser.error("--cwd needs a folder (it was empty)")
    from ..fields import typed_folder

    try:
        spec["cwd"] = typed_folder(args.cwd) if args.cwd else os.getcwd()
    except ValueError as err:
        parser.error(f"--cwd {err}")
    except FileNotFoundError:
        if getattr(args, "like", None) is not None:
            pass  # (--like runs in the job's own folder unless --cwd says)
        else:
            parser.error(
                "the current folder no longer exists (it was removed after this shell entered "
                "it): cd to one that does, or give --cwd"
            )
    waits = bool(args.after or args.after_any)
    if (
        args.cwd
        and not getattr(args, "cluster", None)
        and not waits
        and not os.path.isdir(spec["cwd"])
    ):
        # (it was stored, and failed at its start, maybe hours later: tester h71; a Slurm
        # job's folder is the cluster's, which this machine may not have; a job that
        # waits for others may run in a folder one of them makes)
        what = "not a folder" if os.path.exists(spec["cwd"]) else "no such folder"
        parser.error(f"--cwd {spec['cwd']}: {what}")
    from ..fields import engine_sets_env, env_name_shown

    env: dict[str, str] = {} if args.no_inherit_env else dict(os.environ)
    given: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--env expects KEY=VALUE, got {item!r}")
        if key in given and given[key] != value:
            # (the last was kept without a word, as --after 5,5 is refused: tester h100)
            parser.error(f"--env {env_name_shown(key)} is given twice, with two values")
        given[key] = value
        refused = engine_sets_env(key, args.service and not args.no_port)
        if refused:
            parser.error(f"--env {env_name_shown(key)}: {refused}")
        env[key] = value
    if env:
        spec["env"] = env
    service = {
        "replicas": args.replicas,
        "restart": args.restart,
        "max_restarts": args.max_restarts,
        "port": False if args.no_port else None,
        "retry": None if args.max_attempts is None else {"max_attempts": args.max_attempts},
    }
    given = {k: v for k, v in service.items() if v is not None}
    if args.service:
        spec["kind"] = "service"
        spec.update(given)
    elif given and getattr(args, "like", None) is not None:
        spec[LIKE_SERVICE] = given  # (--like of a service is one: _like decides)
    elif given and getattr(args, "spec", None):
        # (a spec file that says kind = "service" is one: its options apply, checked
        # against each spec of the file once it is read; "add --service" said otherwise)
        spec[LIKE_SERVICE] = given
    elif given:
        flags = ", ".join(SERVICE_FLAGS[k] for k in given)
        verb = "applies" if len(given) == 1 else "apply"
        parser.error(f"{flags} only {verb} to services: add --service")
    return spec


LIKE_SERVICE = "__service_options"
"""Where ``--like`` keeps service options given without ``--service`` until it knows
whether the job it copies is a service (then they apply, as to ``--service``)."""


INPUT_MAX = 64 * 1024 * 1024
"""The most a ``--file`` or ``--spec`` is read of (the engine takes no larger request)."""


def _read_input(path: str) -> bytes:
    """The whole of ``path`` (``-``: standard input), up to :data:`INPUT_MAX`.

    Raises:
        ValueError: It is larger (read whole, /dev/zero or an endless pipe grew the CLI
            until a MemoryError traceback: tester h122).
        OSError: It cannot be read.
    """
    if path == "-":
        raw = sys.stdin.buffer.read(INPUT_MAX + 1)
    else:
        with open(path, "rb") as fh:
            raw = fh.read(INPUT_MAX + 1)
    if len(raw) > INPUT_MAX:
        raise ValueError(
            f"{path}: over {INPUT_MAX // 2**20} MiB (the engine takes no larger request; "
            "split it into several submissions)"
        )
    return raw


def _read_spec_file(path: str) -> list[dict[str, Any]]:
    """Specs from a TOML or JSON file: one spec, or ``jobs = [...]`` / a JSON list.

    Raises:
        ValueError: Unreadable file or wrong shape, with the file named.
    """
    try:
        raw = _read_input(path)
    except OSError as err:
        raise ValueError(f"{path}: {err.strerror or err}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte order mark: TOML refused the file over it
    data: Any
    # By its name; a name that says neither (stdin, spec.txt) by its first character: a
    # JSON document starts with "{" or "[" (so may a TOML table: TOML when it is not JSON).
    as_json = path.lower().endswith(".json") or (
        not path.lower().endswith(".toml") and raw.lstrip()[:1] in (b"{", b"[") and _is_json(raw)
    )
    if as_json:
        import json

        from ..fields import keys_once

        try:
            data = json.loads(raw, object_pairs_hook=keys_once)
        except ValueError as err:
            raise ValueError(f"{path}: not valid JSON: {err}") from None
        except RecursionError:
            raise ValueError(f"{path}: not valid JSON: nested too deeply") from None
    else:
        import tomllib

        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid TOML: {err}") from None
        _no_dates(data, path, "")
    if isinstance(data, dict) and "jobs" in data:  # (a spec has no field "jobs")
        if set(data) != {"jobs"} or not isinstance(data["jobs"], list):
            raise ValueError(f"{path}: 'jobs' is a list of spec tables, alone in its file")
        data = data["jobs"]
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(item, dict) for item in items):
        raise ValueError(f"{path}: expected a spec table, or a non-empty 'jobs' list of them")
    base = os.path.dirname(os.path.abspath(path))
    for item in items:
        cwd = item.get("cwd")
        if isinstance(cwd, str) and not os.path.isabs(cwd):
            from ..fields import typed_folder

            try:
                item["cwd"] = cwd = typed_folder(cwd, base)
            except ValueError as err:
                raise ValueError(f"{path}: cwd {err}") from None
        if (
            isinstance(cwd, str)
            and cwd
            and not item.get("cluster")
            and not item.get("depends_on")
            and not os.path.isdir(cwd)
        ):
            # (as --cwd is: it was stored, and failed at its start: tester h122; not a
            # cluster's folder, nor one a job it waits for may make)
            what = "not a folder" if os.path.exists(cwd) else "no such folder"
            raise ValueError(f"{path}: cwd {cwd}: {what}")
    _named_dependencies(items, path)
    return items


def _named_dependencies(items: list[dict[str, Any]], path: str) -> None:
    """A spec file's jobs may wait for one another by name: ``depends_on = ["prep"]`` (or
    ``{job = "prep", any_exit = true}``) names an earlier job of the same file, sent as
    ``{"batch": K}`` (its ids are given only as the whole file is admitted).

    Raises:
        ValueError: A name that no earlier job of the file has, or more than one has.
    """
    for index, item in enumerate(items):
        deps = item.get("depends_on")
        if not isinstance(deps, list):
            continue
        for n, dep in enumerate(deps):
            named = dep.get("job") if isinstance(dep, dict) else dep
            if not isinstance(named, str):
                continue  # (an id, or a shape the engine refuses by name)
            earlier = [k for k in range(index) if items[k].get("name") == named]
            who = f"job {index + 1}" + (f" ({item['name']})" if "name" in item else "")
            if len(earlier) != 1:
                said = (
                    "no job before it in the file has"
                    if not earlier
                    else f"{len(earlier)} jobs before it in the file have"
                )
                raise ValueError(
                    f"{path}: {who}: depends_on {named!r}: {said} that name"
                    " (a name waits for an earlier job of the same file; an id, for any job)"
                )
            ref: dict[str, Any] = {"batch": earlier[0]}
            if isinstance(dep, dict):
                ref.update((key, value) for key, value in dep.items() if key != "job")
            same = [d for d in deps[:n] if isinstance(d, dict) and d.get("batch") == earlier[0]]
            if same and bool(same[0].get("any_exit")) != bool(ref.get("any_exit")):
                # (the engine's words would be "batch 0": a place the file never names)
                raise ValueError(
                    f"{path}: {who}: depends_on names {named!r} twice, once to run whatever "
                    "its outcome (any_exit) and once only if it completes"
                )
            deps[n] = ref


def _command_lines(path: str) -> list[str]:
    """The lines of a ``--file`` (``-``: standard input), stripped.

    Raises:
        ValueError: A line that is not UTF-8 text (the engine stores text: such a line
            would not run as written), with the file and line named.
    """
    raw = _read_input(path)
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte order mark (some editors write one): not a command
    lines = []
    for number, line in enumerate(raw.splitlines(), 1):
        try:
            lines.append(line.decode("utf-8").strip())
        except UnicodeDecodeError:
            raise ValueError(
                f"{path}: line {number} is not UTF-8 text: {repr(line)[2:-1][:80]}"
            ) from None
        if "\0" in lines[-1]:
            raise ValueError(f"{path}: line {number} holds a NUL byte (no command can)")
        trailing = len(lines[-1]) - len(lines[-1].rstrip("\\"))
        if trailing % 2 and not lines[-1].startswith("#"):  # (an even count: escaped ones)
            # The shell would join it with the next line; this file's lines are one job
            # each: the two halves ran as two jobs.
            raise ValueError(
                f"{path}: line {number} ends with a backslash: each line is one job's whole "
                "command (lines are not joined)"
            )
    return lines


def _by_line(message: str, path: str, numbers: list[int]) -> str:
    """The engine's "job K of N: ..." about a ``--file`` batch, as "PATH: line L: ...":
    comments and blank lines make the job's number differ from its line's."""
    head, sep, rest = message.partition(" of ")
    if len(numbers) == 1 and not message.startswith("job 1 of 1: "):
        # (one line is sent as one spec, answered without "job 1 of 1": it named neither
        # the file nor the line, as two lines did; h100)
        return f"{path}: line {numbers[0]}: {message}"
    if not sep or not head.startswith("job ") or not (head[4:].isascii() and head[4:].isdigit()):
        return message
    count, sep, detail = rest.partition(": ")
    index = int(head[4:]) - 1
    if not sep or count != str(len(numbers)) or not 0 <= index < len(numbers):
        return message
    return f"{path}: line {numbers[index]}: {detail}"


def _is_json(raw: bytes) -> bool:
    import json

    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


def _no_dates(value: Any, path: str, where: str) -> None:
    """TOML has dates and times; a spec has none (a timeout is seconds).

    Raises:
        ValueError: Naming the key that holds one.
    """
    import datetime

    if isinstance(value, dict):
        for key, item in value.items():
            _no_dates(item, path, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _no_dates(item, path, f"{where}[{index}]")
    elif isinstance(value, datetime.date | datetime.time):
        hint = " (a number of seconds)" if where.endswith("timeout") else ""
        raise ValueError(
            f"{path}: {where}: a TOML date or time ({value.isoformat()}) is not a spec value{hint}"
        )


OPTION_OF = {"depends_on": "--after", "kind": "--service", "requeue": "--no-requeue"}
"""The option that sets a spec field, where it is not ``--FIELD``."""


def _option_clash(
    base: dict[str, Any], items: list[dict[str, Any]], args: argparse.Namespace
) -> str:
    """Where an option given with ``--spec`` disagrees with a spec of the file (``", job 2:
    --name 'X', but its spec says name = 'toobig'"``), else ``""``. The options fill in
    what the specs leave out; one a spec sets otherwise was silently dropped, while the
    same option reached the specs without it (tester h62)."""
    for number, item in enumerate(items, 1):
        for key, value in base.items():
            if key == "cwd" and not args.cwd:
                continue  # (the shell's folder, not an option: the spec's own is its file's)
            if key in item and item[key] != value:
                where = f", job {number}" if len(items) > 1 else ""
                flag = OPTION_OF.get(key, "--" + key.replace("_", "-"))
                return (
                    f"{where}: {flag} {value!r}, but its spec says {key} = {item[key]!r} "
                    "(options given with --spec fill in what a spec leaves out; leave the "
                    "option out, or the field)"
                )
    return ""


def _merge(base: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """A file's spec on top of the command line's defaults (cwd, environment)."""
    merged = dict(base, **item)
    if isinstance(item.get("env"), dict) and isinstance(base.get("env"), dict):
        merged["env"] = {**base["env"], **item["env"]}
    return merged


def _submit_once(
    client: Client,
    specs: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    rows: bool = False,
) -> list[dict[str, Any]]:
    """Submit ``specs`` so that they are created at most once: the request carries a fresh
    idempotency key, and if the engine took it but did not answer, it is sent once more
    with the same key (the engine returns what the first made, or makes it now). If that
    is not answered either, :class:`EngineLost` says the outcome is unknown.

    ``env`` (this shell's environment, kilobytes) goes under every spec's own, sent once
    for a batch rather than with each of its jobs. With ``rows``, even one job comes back
    as its row (as a batch's do), not whole."""
    key = os.urandom(16).hex()
    try:
        return _submit_keyed(client, specs, key, env, rows)
    except EngineLost:
        time.sleep(0.2)
    noun = "job" if len(specs) == 1 else f"{len(specs):,} jobs"
    lost = (
        f"{_gone(client)}; submitting the {noun} again once it answers (with the same key: "
        "made once whatever the first try did)"
    )
    told = client.on_busy
    # (a restarted engine found starting is waited for by the client, which says so: said
    # with why the submission is asked again)
    client.on_busy = lambda starting: _error(f"{lost}; {starting}")
    try:
        return _submit_keyed(client, specs, key, env, rows)
    except EngineNotRunning:
        pass
    except EngineLost as err:
        # Said of the second try alone, "did not answer in 30 s" came after 60 (h90).
        raise EngineLost(
            err.errno,
            f"{err}; it was asked twice, waiting that long each time, with one key: the "
            "job(s) are made at most once",
        ) from None
    finally:
        client.on_busy = told
    # Gone after taking the first attempt: it may have stored the jobs. A restarted engine
    # is waited for and asked once more with the same key: it answers with what the first
    # made, or makes it now (it said "unknown", and a second submit made them twice).
    # Said, as wait and logs -f say it: silent for 11 s, it looked hung, and a Ctrl-C and
    # a second submit would have made the jobs twice (tester h106).
    _error(lost)
    try:
        _wait_for_engine(client)
        return _submit_keyed(client, specs, key, env, rows)
    except (EngineLost, EngineNotRunning) as err:
        # (why it was not asked again, and what the unknown means: it said only "went
        # away", and a submission stored by then ran once an engine started: tester h147)
        them = "it runs" if len(specs) == 1 else "they run"
        why = (
            f"no engine came back within {err.waited:g} s to ask again"
            if isinstance(err, EngineStayedAway)
            else f"it was not asked again: {err}"
        )
        raise EngineLost(
            0,
            f"the engine at {client.paths.socket_file} went away during the submission and "
            f"{why}: the first try may have stored the {noun}; if so, {them} once an engine "
            "starts (`gpulayer-tui jobs` shows it; look there before submitting again)",
        ) from None


def _submit_keyed(
    client: Client,
    specs: list[dict[str, Any]],
    key: str,
    env: dict[str, str] | None,
    rows: bool = False,
) -> list[dict[str, Any]]:
    if len(specs) == 1 and not rows:
        spec = specs[0] if env is None else _merge({"env": env}, specs[0])
        return [client.submit(spec, key=key)]
    return client.submit_many(specs, key=key, env=env)


def _deps_still_there(client: Client, job_id: int, deps: list[Any]) -> list[Any]:
    """Job ``job_id``'s dependencies less those cleaned from the history since: they had
    ended before it ran (a copy naming one was refused: "depends_on: no job N")."""
    kept = []
    for dep in deps:
        dep_id = dep.get("job") if isinstance(dep, dict) else dep
        if not isinstance(dep_id, int):
            kept.append(dep)  # (the engine says what is wrong with it)
            continue
        try:
            client.job(dep_id)
        except ApiError as err:
            if err.status != 404:
                raise
            print(
                f"--like {job_id}: its dependency job {dep_id} is no longer in the history "
                "(cleaned): left out",
                file=sys.stderr,
            )
            continue
        kept.append(dep)
    return kept


def _like(
    client: Client, args: argparse.Namespace, base: dict[str, Any], cmd: list[str]
) -> dict[str, Any]:
    """``submit --like ID``: job ID's spec again, with what this command line gives on top
    and, unless ``--vram-gb`` is given, the VRAM its usage suggests."""
    detail = client.job(args.like)
    old = detail["job"]
    if old.get("kind") == "adopted":
        from ..fields import ADOPTED_NOT_RUN

        raise ValueError(f"--like {old['id']}: job {old['id']} {ADOPTED_NOT_RUN}")
    # (restart_of: job ID's lineage, not this new job's; the engine refuses one given)
    spec: dict[str, Any] = {
        k: v for k, v in old["spec"].items() if v is not None and k != "restart_of"
    }
    # What this command line gives replaces the job's own (the flags that only switch
    # something on are in base only when given).
    for key in (
        *("name", "project", "gpus", "vram_gb", "timeout", "domain", "depends_on"),
        *("exclusive", "notify", "preemptible", "requeue", "cluster", "cpus", "mem_gb"),
    ):
        if key in base:
            spec[key] = base[key]
    if base.get("gpus") == 0:
        # A GPU job copied as a CPU job: its VRAM per GPU and GPU pins no longer apply
        # (refused: "vram_gb is per GPU, but gpus is 0", and no way to leave them out).
        for key in ("vram_gb", "domain"):
            if key not in base:
                spec.pop(key, None)
    service = base.pop(LIKE_SERVICE, None)
    if service is not None and old.get("kind") != "service":
        flags = ", ".join(SERVICE_FLAGS[k] for k in service)
        verb = "applies" if len(service) == 1 else "apply"
        raise ValueError(
            f"--like {old['id']}: job {old['id']} is not a service, and {flags} only "
            f"{verb} to services: add --service"
        )
    for key in ("kind", "replicas", "restart", "max_restarts", "port", "retry"):
        if key in base:  # (--service, with its options)
            spec[key] = base[key]
    spec.update(service or {})
    if args.priority is not None:  # (--priority 0 too: the copy's was kept)
        spec["priority"] = args.priority
    if "depends_on" not in base and spec.get("depends_on"):
        spec["depends_on"] = _deps_still_there(client, old["id"], spec["depends_on"])
    if "snapshot" in spec:  # (job ID's record of its copy: a new copy is made now)
        spec["snapshot"] = bool(spec["snapshot"])
    if "snapshot" in base:
        spec["snapshot"] = base["snapshot"]
    if args.cwd:
        spec["cwd"] = base["cwd"]
    # The copy runs with this shell's environment (and --env), as any submission does;
    # with --no-inherit-env, with --env alone. (It took the old job's, PATH included: a
    # program found first there ran again; and another user's values read "(hidden)".)
    spec["env"] = base.get("env", {})
    if cmd:
        spec.pop("command", None)
        spec.pop("shell", None)
        spec["shell" if args.shell else "command"] = " ".join(cmd) if args.shell else cmd
    usage = old.get("usage")
    suggestion = None if usage is None else usage.get("suggest_vram_gb")
    if args.vram_gb is None and suggestion is not None and spec.get("gpus", 1) != 0:
        was = spec.get("vram_gb")
        spec["vram_gb"] = suggestion
        said = "none" if was is None else f"{was:g}"
        print(
            f"vram_gb {said} -> {suggestion:g}: job {old['id']} held at most "
            f"{(usage['peak_vram'] or 0) / 1024**3:.1f} GiB per GPU",  # type: ignore[index]
            file=sys.stderr,
        )
    return spec


def _submit(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    base = _spec_from_args(args, parser)
    if getattr(args, "like", None) is not None:
        if args.spec or args.file:
            parser.error("give either --like, --spec or --file, not two of them")
        try:
            like = _like(client, args, base, cmd)
        except ValueError as err:
            _error(str(err))
            return EXIT_USAGE
        jobs = _submit_once(client, [like])
    elif args.spec:
        if cmd or args.file:
            parser.error("give either --spec, --file or a command, not two of them")
        try:
            items = _read_spec_file(args.spec)
        except ValueError as err:
            _error(str(err))
            return EXIT_USAGE
        from ..fields import engine_sets_env, env_name_shown

        for number, item in enumerate(items, 1):
            own = item.get("env")
            port = item.get("kind") == "service" and item.get("port") is not False
            for key in own if isinstance(own, dict) else ():
                refused = engine_sets_env(str(key), port, "set port = false")
                if refused:
                    where = f"{args.spec}" + (f", job {number}" if len(items) > 1 else "")
                    _error(f"{where}: env {env_name_shown(str(key))}: {refused}")
                    return EXIT_USAGE
        service = base.pop(LIKE_SERVICE, None)
        if service is not None:
            for number, item in enumerate(items, 1):
                if item.get("kind") != "service":
                    flags = ", ".join(SERVICE_FLAGS[k] for k in service)
                    verb = "applies" if len(service) == 1 else "apply"
                    where = f"{args.spec}" + (f", job {number}" if len(items) > 1 else "")
                    _error(
                        f"{where} is not a service, and {flags} only {verb} to services: "
                        'add --service, or kind = "service" in the file'
                    )
                    return EXIT_USAGE
            base.update(service)
        env = base.pop("env", None)
        clash = _option_clash(base, items, args)
        if clash:
            _error(f"{args.spec}{clash}")
            return EXIT_USAGE
        try:
            jobs = _submit_once(client, [_merge(base, item) for item in items], env, rows=True)
        except ApiError as err:
            if err.status != 400:
                raise
            # (which file: "unknown field 'bogus_key'" named neither it nor the job; h62)
            raise ApiError(err.status, f"{args.spec}: {err}") from None
    elif args.file:
        if cmd:
            parser.error("give either --file or a command, not both")
        try:
            lines = _command_lines(args.file)
        except ValueError as err:
            _error(str(err))
            return EXIT_USAGE
        except OSError as err:  # (it said "No such file or directory: X", naming no flag)
            _error(f"--file: cannot read {args.file}: {err.strerror or err}")
            return EXIT_USAGE
        # Each line is a shell line as written; the engine runs a plain one without a
        # shell (see engine/commandline.py).
        env = base.pop("env", None)
        numbers = [n for n, ln in enumerate(lines, 1) if ln and not ln.startswith("#")]
        looks_spec = numbers and lines[numbers[0] - 1].replace(" ", "") == "[[jobs]]"
        if args.file.lower().endswith((".toml", ".json")) or looks_spec:
            # (each of its lines ran as a command: `[[jobs]]`, `name = "prep"`, ...)
            _error(
                f"{args.file} is a spec file: submit it with --spec {args.file} "
                "(--file takes one shell command line per line)"
            )
            return EXIT_USAGE
        specs = [dict(base, shell=lines[n - 1]) for n in numbers]
        if not specs:
            _error(f"{args.file}: no command lines found")
            return EXIT_USAGE
        try:
            jobs = _submit_once(client, specs, env, rows=True)
        except ApiError as err:
            if err.field is not None and err.field != "shell" and err.field in base:
                # An option given on the command line, for every line: "f.txt: line 1:
                # --after: no job 99999" blamed the file's first line (tester h111).
                where, at, rest = _by_line(str(err), args.file, numbers).partition(": line ")
                detail = rest.partition(": ")[2] if at else where
                raise ApiError(err.status, detail, field=err.field) from None
            said = _by_line(str(err), args.file, numbers)
            raise ApiError(err.status, said, field=err.field) from None
    else:
        if not cmd:
            parser.error("submit needs a command: gpulayer-tui submit [OPTIONS] -- CMD ARGS...")
        if args.shell:
            base["shell"] = " ".join(cmd)
        else:
            base["command"] = cmd
        jobs = _submit_once(client, [base])
    try:
        if args.json:
            _print_json(jobs if args.file or args.spec else jobs[0])
        else:
            for job in jobs:
                print(job["id"])
        sys.stdout.flush()
    except OSError as err:
        # (`submit > /dev/full` said only that the output was lost: the new job's id was
        # nowhere but in `jobs`: tester h114)
        ids = [job["id"] for job in jobs]
        shown = f"job {ids[0]} was" if len(ids) == 1 else f"jobs {_id_span(ids)} were"
        err.done = f"{shown} submitted"  # type: ignore[attr-defined]
        raise
    # Only a job the engine would not run is a failed submission; one that already ran
    # and ended (fast jobs can, before this call returns) is an ordinary outcome.
    failed = [j for j in jobs if j["termination_reason"] in REFUSED]
    for job in failed:
        _error(f"job {job['id']} {job['status']} ({job['termination_reason']}): {job['message']}")
    return EXIT_FAILED if failed else EXIT_OK


def _terminal_columns() -> int:
    """The terminal's width: ``COLUMNS`` first, as ``shutil`` reads it (a pseudo-terminal
    that says 0 columns, under ``script`` or some CI, cut every row to one character)."""
    from .grammar import _columns

    return _columns()


def _jobs(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..fields import ACTIVE_STATUSES, TERMINAL_STATUSES

    statuses = [s for item in args.status for s in item.split(",") if s]
    known = ["pending", "queued", "running", "completed", "failed", "cancelled", "orphaned"]
    assert set(known) == ACTIVE_STATUSES | TERMINAL_STATUSES
    for status in statuses:
        if status not in known and status != "active":
            # (said here: the engine's list left out "active", which is the CLI's: h94)
            parser.error(
                f"--status: unknown status {status!r} (one of: {', '.join(known)}; "
                "or active: pending, queued and running)"
            )
    if "active" in statuses:  # (the TUI's `s` filter has it: tester h74)
        wide = [t for s in statuses for t in (sorted(ACTIVE_STATUSES) if s == "active" else [s])]
        statuses = list(dict.fromkeys(wide))
    if args.status and not statuses:  # ("--status ''" listed every job, as if not given)
        parser.error("--status needs a status (e.g. running, or queued,failed)")
    if args.sort != "id" and (args.before or args.after):
        parser.error("--before/--after page the newest-first order; use --page with --sort")
    if args.reverse and (args.before or args.after):
        # (--before with it was refused in the API's words, "order=desc"; --after
        # ignored it)
        parser.error(
            "--reverse does not go with --before/--after (--before lists newest first, "
            "--after oldest first)"
        )
    from ..wire import ASCENDING_JOB_SORTS

    ascending = (args.sort in ASCENDING_JOB_SORTS) != args.reverse
    if args.page and (args.page - 1) * args.limit > 2**63 - 1:
        # (said as the offset it makes, which the user never typed)
        most = (2**63 - 1) // args.limit + 1
        parser.error(f"--page {args.page} is past any list (at most {most})")
    query: dict[str, Any] = {
        "status": statuses,
        "q": args.filter,
        "before": args.before,
        "after": args.after,
        "offset": (args.page - 1) * args.limit if args.page else 0,
    }
    if getattr(args, "since", None) is not None:
        # (whole seconds, rounded down: a job of the very second is in)
        query["since"] = int(time.time() - args.since)
    if args.sort != "id":
        query["sort"] = args.sort
    if args.sort != "id" or args.reverse:
        query["order"] = "asc" if ascending else "desc"
    pages = client.iter_jobs(args.limit, **query)
    if args.json:
        # One row per line: as valid JSON as a list, and greppable; printed page by page.
        first, count, last = True, 0, None
        for page in pages:
            for job in page:
                sys.stdout.write(("[\n" if first else ",\n") + jsonlite.dumps(job, sort_keys=True))
                first, count, last = False, count + 1, job
        sys.stdout.write("[]\n" if first else "\n]\n")
        # (on stderr, as for the table: a script could not tell that more jobs followed)
        _say_older(client, args, count, None if last is None else last["id"])
        return EXIT_OK
    jobs = [job for page in pages for job in page]
    from .format import fit, format_jobs

    # On a terminal, a row longer than the window is cut at its edge (the reason column is
    # last); piped, every reason is whole (it used to be cut at 70 characters always).
    width = _terminal_columns() if sys.stdout.isatty() else None
    if not jobs:
        # (on stderr: `jobs | wc -l` counted "no jobs" as a job, and a pipe that reads
        # rows read it as one; tester h178)
        if not (args.page and args.page > 1):
            print("no jobs", file=sys.stderr)
    else:
        print(fit(format_jobs(jobs, time.time(), width, args.sort), width))
    _say_older(client, args, len(jobs), jobs[-1]["id"] if jobs else None)
    return EXIT_OK


def _say_older(client: Client, args: argparse.Namespace, count: int, last: int | None) -> None:
    """Say on stderr how to list the next page when more jobs follow this one (``last``:
    the id of the last job listed)."""
    if not count and args.page and args.page > 1:
        # ("no jobs" alone read as an empty list: the page was past its end; h123)
        print(f"page {args.page} is past the end of the list", file=sys.stderr)
        return
    if last is None or count < args.limit or not client.more_jobs:
        return  # (it said "older" of a list that had no more)
    # (--page 2 was told "older: --before N", which leaves its --page; --after and
    # --reverse were told nothing)
    if args.after:
        print(f"newer: --after {last}", file=sys.stderr)
    elif args.sort == "id" and not args.reverse and not args.page:
        print(f"older: --before {last}", file=sys.stderr)
    else:
        print(f"more: --page {(args.page or 1) + 1}", file=sys.stderr)


def _status(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.json and getattr(args, "plot", False):
        # (the plot went after the JSON: output no JSON reader could read)
        parser.error("--plot draws text: it does not go with --json")
    data = client.job(args.job)
    from ..fields import NOT_COMPLETED_STATUSES

    # (its status says how the job ended, read or not: `status ID | true` exited 0 for a
    # failed job: tester h159)
    code = EXIT_FAILED if data["job"]["status"] in NOT_COMPLETED_STATUSES else EXIT_OK
    try:
        if args.json:
            _print_json(data)
        else:
            from .format import format_job

            print(format_job(data["job"], data["events"], time.time(), last=args.last))
    except BrokenPipeError:
        _lose_stdout()
        return code
    if getattr(args, "plot", False):
        from ..formatting import usage_plot

        width = _terminal_columns() - 30 if sys.stdout.isatty() else 60
        try:
            said = usage_plot(client.usage(args.job), max(10, width), data["job"]["status"])
            print(said)
        except BrokenPipeError:
            _lose_stdout()
    return code


def _exit_when_reader_goes() -> None:
    """Following, exit 0 once whoever reads stdout (a pipe, a socket) has gone: ``logs -f
    | grep -q READY`` returned only when the job next wrote, never for a service that
    said READY and went quiet (tester h178), since a closed reader is seen only by a
    write. A thread waits in ``poll`` for the pipe's error or hang-up, as ``tail -f``
    does; there is nothing left to say to a reader that went away."""
    import select
    import stat
    import threading

    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError):
        return
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return

    def watch() -> None:
        poller = select.poll()
        # (POLLOUT is not asked for: a pipe with room reports it at once, a busy loop;
        # its error and hang-up are reported whatever the mask)
        poller.register(fd, select.POLLERR | select.POLLHUP)
        while True:
            for _, events in poller.poll():
                if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                    os._exit(EXIT_OK)

    threading.Thread(target=watch, name="stdout-reader", daemon=True).start()


def _logs(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    query = []
    if args.follow:
        query.append("follow=1")
        _exit_when_reader_goes()
    if args.replica is not None:
        query.append(f"replica={args.replica}")
    out = sys.stdout.buffer
    safe = _output_filter(client, args)
    written = 0
    asked_again = False
    # Following, a quiet stream is asked about after this long: a quiet job, or an engine
    # that stopped answering (frozen: a stream would wait on it for ever)?
    # Not following, the engine has the client's timeout between chunks (with none, a
    # frozen engine held `logs` for ever).
    idle = min(FOLLOW_IDLE_S, client.timeout or FOLLOW_IDLE_S) if args.follow else client.timeout
    stalled = 0  # plain `logs`: streams in a row cut off with nothing received
    resumed = False  # asking again after a quiet spell: its old stream may still count
    refused = 0
    line_open = False  # what was written last does not end its line
    if args.follow:
        # With no engine at all, say so at once, as `logs` and `wait` do: following, it
        # said "lost the engine; reconnecting" and waited 30 s for one (tester h49).
        # A job that waits is said to (`-f` printed nothing at all: tester h69).
        while True:
            try:
                job = client.job(args.job)["job"]
                break
            except EngineLost:
                # (one that went away mid-ask is a restart to wait out, as `wait` does:
                # a follower started as the engine was killed exited 4; CI saw it)
                _error(f"{_gone(client)}; following job {args.job} once it answers")
                _wait_for_engine(client)
        if job["status"] in ("pending", "queued"):
            from ..fields import printable

            _error(
                printable(f"job {args.job} waits to start ({job['message']}): following it")
                + " from its start"
            )
    # `--tail N` asks for the last lines once; every ask after it goes on from where
    # the output got to (the start of those lines, where none came yet: `-n 0 -f`).
    tail = args.tail
    while True:
        where = f"offset={written}" if tail is None else f"tail={tail}"
        path = f"/jobs/{args.job}/logs?" + "&".join([*query, where])
        headers: dict[str, str] = {}
        asked, got = written, 0
        try:
            for chunk in client.stream(path, idle=idle, headers=headers):
                if not got:
                    lead = _cut_under_reader(headers, asked if tail is None else 0, line_open)
                    if lead:
                        out.write(lead if safe is None else safe.text(lead))
                line_open = not chunk.endswith(b"\n")
                out.write(chunk if safe is None else safe.text(chunk))
                out.flush()
                got += len(chunk)
                # Where the job's output goes on (a cut log's note is not output: asked
                # again after a cut from bytes received, the kept end came again).
                written = _output_after(headers, asked, got)
                tail = None
                asked_again = False
                refused = 0
            if tail is not None and "x-log-offset" in headers:
                written, tail = _output_after(headers, asked, got), None
            if safe is not None:
                out.write(safe.text(b"", final=True))
                out.flush()
            if not written:
                # (it printed nothing at all: a job with no output yet read the same)
                return _no_output(client, args)
            if args.follow and args.replica:
                _say_replica_removed(client, args)
            return EXIT_OK
        except StreamIdle:
            if tail is not None and "x-log-offset" in headers:
                written, tail = _output_after(headers, asked, got), None
            if not args.follow:
                raise EngineLost(
                    errno.ETIMEDOUT,
                    f"the engine at {client.paths.socket_file} stopped sending job {args.job}'s "
                    f"output for {idle:g} s (stopped, or overloaded); {written} bytes came",
                ) from None
            try:
                client.health()  # a quiet job: go on
                resumed = True
                continue
            except (EngineLost, EngineNotRunning):  # frozen, or stopping: as below
                pass
        except ApiError as err:
            # Asked again after a quiet spell, the stream it left may still be counted
            # against [limits] streams_per_user for a moment (the engine sees it gone at
            # its next look, within a second): many quiet followers were refused at once.
            if err.status == 404 and written:
                # Removed while it was read (`clean`): said as output cut short, not as
                # a bad id with exit 2, "nothing changed" (tester h123).
                _error(f"job {args.job}'s output was cut short after {written} bytes: {err}")
                return EXIT_FAILED
            if not (resumed and err.status == 429 and refused < 10):
                raise
            refused += 1
            time.sleep(0.3)
            continue
        except (EngineLost, EngineNotRunning):
            # (With no engine at all it was said before this loop, by the first request:
            # one gone now, even between two requests, is a restart to wait out.)
            if not args.follow:
                # Cut off by an engine that still answers: a reader that paused past its
                # stall limit (`logs N | less`), a log cleaned or removed meanwhile. Asked
                # again from where it got to, it goes on, or is told why (it stopped
                # there: "closed the stream mid-way", exit 4, or 0 with part of a log).
                stalled = stalled + 1 if not got else 0
                if stalled < 2:
                    try:
                        client.health()
                        continue
                    except (EngineNotRunning, EngineLost):
                        pass
                raise
            if not asked_again:
                # An engine that still answers cut the stream off: the reader is no longer
                # let in (taken out of [security], share_logs turned off). Asked again at
                # once, it says why ("lost the engine" came first, and was not true).
                asked_again = True
                try:
                    client.health()
                    continue
                except (EngineNotRunning, EngineLost):
                    pass
        # Following, and the engine went away (a restart): reading is safe to resume where
        # it stopped, once an engine answers again.
        _error(f"{_gone(client)}; reconnecting to follow job {args.job} from byte {written}")
        _wait_for_engine(client)


def _cut_under_reader(headers: dict[str, str], asked: int, line_open: bool) -> bytes:
    """What goes before an answer that begins with a cut log's note: a line break if the
    output shown stopped mid-line, and how much output a cut dropped before it was read
    (``asked``: the offset asked for, 0 for none). The note followed a half line, and the
    output skipped was not said (tester h145)."""
    note = int(headers.get("x-log-note", 0))
    start = int(headers.get("x-log-offset", asked))
    skipped = start - asked if asked else 0
    if not note and skipped <= 0:
        return b""
    lead = b"\n" if line_open else b""
    if skipped > 0:
        lead += (
            f"[gpulayer-tui: {skipped} bytes of output not shown: the log was cut back to "
            "its cap before they were read]\n"
        ).encode()
    return lead


def _output_after(headers: dict[str, str], asked: int, got: int) -> int:
    """The offset in a job's output after ``got`` bytes of a log answer (its headers):
    a cut log's note is not output."""
    start = int(headers.get("x-log-offset", asked))
    return start + max(0, got - int(headers.get("x-log-note", 0)))


def _say_replica_removed(client: Client, args: argparse.Namespace) -> None:
    """A followed replica's output ended while its service runs on: a scale-down removed
    it (the follow ended with no word, exit 0: tester h109)."""
    job = client.job(args.job)["job"]
    count = (job.get("spec") or {}).get("replicas", 1)
    if job["status"] == "running" and isinstance(count, int) and args.replica >= count:
        _error(
            f"replica {args.replica} of job {args.job} was removed by a scale-down (it has "
            f"{count} now): its output ends here"
        )


def _no_output(client: Client, args: argparse.Namespace) -> int:
    """``logs`` got nothing: say why when the job has not run (yet)."""
    job = client.job(args.job)["job"]
    if job.get("kind") == "adopted":
        _error(f"job {args.job} is an adopted process: its output goes where it was started")
        return EXIT_OK
    if job.get("started_at") is not None and job.get("termination_reason") != "launch_failed":
        return EXIT_OK  # (it ran and wrote nothing; a launch that failed never ran)
    if job["status"] in ("pending", "queued"):
        if args.follow:
            return EXIT_OK
        if job.get("attempt") and job.get("kind") != "service":
            # (requeued after a preemption: "has not started yet" of a job that ran; h59)
            _error(
                f"job {args.job} waits to run again: its runs so far wrote nothing "
                "(logs -f waits for the next)"
            )
        else:
            _error(f"job {args.job} has not started yet: no output (logs -f waits for it)")
        return EXIT_OK
    from ..fields import printable

    _error(
        printable(f"job {args.job} ended without starting ({job['status']}: {job['message']}):")
        + " no output"
    )
    return EXIT_FAILED


def _output_filter(client: Client, args: argparse.Namespace) -> _OthersOutput | OwnOutput | None:
    """How ``logs`` writes the job's output on a terminal (``None``: as it is, to a pipe
    or with ``--raw``). Another user's job (``[security] share_logs``) has its control
    characters escaped: its bytes could otherwise set this terminal's title, clear it or
    (on some terminals) write its clipboard. One's own keeps its colours and progress
    bars, less what would change the terminal's state (see :mod:`.terminal_output`)."""
    if args.raw or not sys.stdout.isatty():
        return None
    owner = client.job(args.job)["job"].get("owner_uid")
    if owner is not None and owner != os.getuid():
        return _OthersOutput()
    from .terminal_output import OwnOutput

    return OwnOutput()


class _OthersOutput:
    """Bytes as text with what a terminal could act on escaped (see :func:`printable`:
    C0 and C1 controls, bidi overrides, lone bytes that are not UTF-8 as ``\\xNN``),
    newline, tab and carriage return kept. Decoded incrementally: a character split
    between two chunks is whole."""

    def __init__(self) -> None:
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")

    def text(self, chunk: bytes, final: bool = False) -> bytes:
        from ..fields import printable

        text = self._decoder.decode(chunk, final=final)
        return printable(text, keep="\n\t\r").encode("utf-8", "surrogateescape")


class EngineStayedAway(EngineNotRunning):
    """The engine went away and none came back while the CLI waited."""

    def __init__(self, paths: Paths, waited: float) -> None:
        super().__init__(paths)
        self.waited = waited
        self.args = (f"the engine went away and none came back for {waited:g} s: {self.args[0]}",)


def _gone(client: Client) -> str:
    """How a client that lost its engine says so: stopped on purpose (`gpulayer-tui stop`,
    SIGTERM) or lost ("lost the engine; reconnecting" was said of a deliberate stop: h114)."""
    from ..client import engine_was_stopped

    return "the engine was stopped" if engine_was_stopped(client.paths) else "lost the engine"


def _wait_for_engine(client: Client) -> None:
    """Wait (up to the client's timeout) for an engine to answer again.

    Raises:
        EngineLost: One was there and did not answer in time.
        EngineStayedAway: None was there, all the time waited.
    """
    # An engine that is not there (a restart) is waited for at least RESTART_PATIENCE_S
    # (a GPULAYER_TIMEOUT of a second, for quick answers, gave a restart a second: `wait`
    # exited 4 in the middle of an ordinary restart); one there that does not answer
    # (frozen), for the client's timeout.
    start = time.monotonic()
    frozen = client.timeout or RESTART_PATIENCE_S
    patience = max(frozen, RESTART_PATIENCE_S)
    there = False  # (one was there and did not answer, at the last try)
    while time.monotonic() < start + patience:
        try:
            client.health()
            return
        except EngineNotRunning:
            there = False
            time.sleep(0.25)
        except EngineLost:
            there = True
            patience = frozen
            time.sleep(0.25)
    if there:
        raise EngineLost(
            0,
            f"no engine answered at {client.paths.socket_file} for {patience:g} s",
        )
    # None there: "no engine", exit 3, as it is before any request (it was exit 4, "whether
    # it acted is unknown", for a read-only `wait` or `logs -f` whose engine stayed down).
    raise EngineStayedAway(client.paths, patience)


def _report_end(job: dict[str, Any], as_json: bool, data: Any) -> int:
    if as_json:
        _print_json(data)
    else:
        code = "" if job["exit_code"] is None else f", exit code {job['exit_code']}"
        print(f"job {job['id']} {job['status']}{code}: {job['message']}")
    return EXIT_OK if job["status"] == "completed" else EXIT_FAILED


FLAG_OF_FIELD = {
    "depends_on": "--after/--after-any",
    "kind": "--service",
    "port": "--no-port",
    "command": "the command",  # (given after --: "--command" was named, no such flag; h100)
}
"""A spec field as ``submit`` and ``edit`` spell it, where not ``--`` + the field."""


def _in_flags(message: str, field: str | None, args: argparse.Namespace) -> str:
    """An engine's refusal of a spec field said with the flag typed (``--after: no job
    999``, not ``depends_on: no job 999``: tester h94); a spec file keeps the field's own
    name, as the file spells it."""
    if field is None or args.command not in ("submit", "edit") or getattr(args, "spec", None):
        return message
    lead = f"{field}: "
    at = message.find(lead)
    # (at the start, or after "job 2 of 3: " in a --file batch)
    if at < 0 or (at and not message[:at].endswith(": ")):
        return message
    if field == "shell" and getattr(args, "file", None):
        return message[:at] + message[at + len(lead) :]  # (its file and line say which)
    flag = FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))
    if field == "depends_on":  # (the one of the two given, if one was)
        given = [f for f in ("after", "after_any") if getattr(args, f, None)]
        flag = "--" + given[0].replace("_", "-") if len(given) == 1 else flag
    return f"{message[:at]}{flag}: {message[at + len(lead) :]}"


def _listed_ids(given: Any) -> list[int]:
    """The job ids of ``cancel`` or ``wait``, each once, in order: words of one id or of
    several separated by commas (``cancel 60,61``, as ``--after`` takes them: h69)."""
    words = given if isinstance(given, list) else [given]
    return list(dict.fromkeys(i for w in words for i in (w if isinstance(w, list) else [w])))


def _lose_stdout() -> None:
    """Its reader went away (``| head -1``, ``| grep -q``): what is still to print goes
    nowhere, and the command goes on to its own exit status (see :func:`_wait`)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _outcome(data: dict[str, Any]) -> int:
    """A waited-for job's exit status, as :func:`_waited` returns it."""
    if data.get("timed_out"):
        return EXIT_TIMED_OUT
    return EXIT_OK if data["job"]["status"] == "completed" else EXIT_FAILED


def _waited_said(data: dict[str, Any], as_json: bool, timeout: float | None, quiet: bool) -> int:
    """:func:`_waited`, its output lost if its reader went away: the status stays the
    job's (`wait A B | head -1` exited 0 at once, B not waited for and A's failure not
    told: tester h159)."""
    try:
        return _waited(data, as_json, timeout, quiet)
    except BrokenPipeError:
        _lose_stdout()
        return _outcome(data)


def _wait(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    ids = _listed_ids(args.job)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    if len(ids) == 1:
        try:
            data = _wait_one(client, ids[0], deadline)
        except ApiError as err:
            if args.json:  # (one id, one object: it printed nothing, as cancel did once)
                _print_json({"id": ids[0], "error": str(err)})
            raise
        return _waited_said(data, args.json, args.timeout, False)
    # Several: each in turn under one deadline (all must end, so the order costs no
    # time), each said as its wait returns; one refused (an unknown id) is said and the
    # others go on. Exit: the highest of theirs, as for `cancel X Y`.
    worst = EXIT_OK
    documents: list[Any] = []
    # An unknown id is said before any waiting (a typo among the ids was said once the
    # others had all ended, hours later: tester h159); the others are waited for still.
    unknown: dict[int, ApiError] = {}
    for job_id in ids:
        try:
            client.wait(job_id, 0.0)
        except ApiError as err:
            if err.status == 404:
                unknown[job_id] = err
                _error(str(err))
        except (EngineLost, EngineNotRunning):
            break  # (the waits below say it, and wait for one to come back)
    for job_id in ids:
        try:
            if job_id in unknown:
                raise unknown[job_id]
            data = _wait_one(client, job_id, deadline)
        except ApiError as err:
            if job_id not in unknown:
                _error(str(err))
            worst = max(worst, EXIT_USAGE if err.status in (400, 404) else EXIT_FAILED)
            # (one for each id, in the order given, as cancel's list: a script lined
            # them up with its ids and one was missing; tester h122)
            documents.append({"id": job_id, "error": str(err)})
            continue
        documents.append(data)
        worst = max(worst, _waited_said(data, False, args.timeout, args.json))
    if args.json:
        try:
            _print_json(documents)
        except BrokenPipeError:
            _lose_stdout()
    return worst


def _wait_one(client: Client, job_id: int, deadline: float | None) -> dict[str, Any]:
    """Wait for one job until it ends or ``deadline`` (monotonic) passes; the engine's
    answer (``timed_out`` set if it had not ended)."""
    # In slices the engine answers within, so a stopped engine is noticed (exit 4) instead
    # of waited on for ever; a restarted one is waited on again (waiting changes nothing).
    piece = min(WAIT_SLICE_S, client.timeout or WAIT_SLICE_S)
    asked = False  # (an engine answered once: a missing one later is a restart)
    told = False  # (that a service running on may never end)
    unstored = False  # (its end was not stored at the first ask: see below)
    while True:
        left = piece if deadline is None else max(0.0, deadline - time.monotonic())
        # (the first ask answers at once: what it waits for is said before it waits)
        slice_s = min(left, piece) if told else min(left, UNSTORED_GRACE_S) if unstored else 0.0
        try:
            data = client.wait(job_id, slice_s)
        except (EngineLost, EngineNotRunning) as err:
            # (a slice that ended as the engine stopped found no socket: "no engine", exit
            # 3, in the middle of a restart; with none at all from the start it is said)
            if isinstance(err, EngineNotRunning) and not asked:
                raise
            _error(f"{_gone(client)}; waiting for job {job_id} again once it answers")
            _wait_for_engine(client)
            continue
        asked = True
        if not data.get("timed_out") or (deadline is not None and time.monotonic() >= deadline):
            return dict(data)
        if not told:
            if _end_unstored(data["job"]) and not unstored:
                # An end is stored a moment after it happens (the next group commit): said
                # unstored at once, the database was said to fail when it was fine (tester
                # h192). Said only if it is still not stored after a while.
                unstored = True
                continue
            told = True
            # (not for a deadline about to fall: its own words say the same: "still not
            # stored after 0.5 s")
            soon = deadline is not None and deadline - time.monotonic() < 1.0
            note = _never_ends(data["job"]) or ("" if soon else _end_unstored(data["job"]))
            if note:
                _error(note)


def _waited(data: dict[str, Any], as_json: bool, timeout: float | None, quiet: bool = False) -> int:
    """Say how a waited-for job ended (or that it has not, by the timeout); its exit code.
    ``quiet``: the end goes in a JSON document printed later (a timeout is still said)."""
    job = data["job"]
    if data.get("timed_out"):
        if as_json:  # (a script reads the document it asked for: it got nothing)
            _print_json(data)
        if _end_unstored(job):  # ("job 26 still failed after 0 s": tester h186)
            _error(
                f"job {job['id']} has ended ({job['status']}), but its end is still not "
                f"stored after {timeout:g} s"
            )
        else:
            _error(f"job {job['id']} still {job['status']} after {timeout:g} s")
        return EXIT_TIMED_OUT
    if quiet:
        return EXIT_OK if job["status"] == "completed" else EXIT_FAILED
    return _report_end(job, as_json, data)


def _end_unstored(job: dict[str, Any]) -> str:
    """What ``wait`` says of a job that has ended while its end is not stored yet (the
    engine's database cannot be written): the engine answers a wait once the end is
    durable, and `wait` sat silent for as long as the disk was full while `jobs` showed
    the job ended (tester h186)."""
    from ..wire import ACTIVE_STATUSES

    if job.get("status") in ACTIVE_STATUSES:
        return ""
    return (
        f"job {job['id']} has ended ({job['status']}), but the engine has not stored its end "
        "yet (its database cannot be written: `gpulayer-tui doctor` says why); waiting "
        "until it is"
    )


def _never_ends(job: dict[str, Any]) -> str:
    """What ``wait`` says of a running service that restarts always (it waited in silence,
    for ever: tester h58), else ``""``."""
    spec = job.get("spec") or {}
    if job.get("kind") != "service" or job.get("status") != "running":
        return ""
    if spec.get("restart", "always") != "always" or spec.get("max_restarts") is not None:
        return ""
    return (
        f"job {job['id']} is a service that restarts always: it ends only when it is "
        "cancelled, times out, or is placed again no more; waiting (ctrl+c stops waiting, "
        "not the service)"
    )


def _cancel(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    ids = _listed_ids(args.job)
    if len(ids) == 1:
        try:
            return _cancel_one(client, args, client.cancel(ids[0]), args.json)
        except ApiError as err:
            already = _cancelled_already(client, ids[0], err)
            if already is None:
                if args.json:
                    # (one id gives one object: a refused one is the job, or its id, with
                    # the error, as in a list; it printed nothing: tester h92)
                    _print_json({**_job_or_id(client, ids[0]), "error": str(err)})
                raise
            if args.json:
                _print_json(already)
            return EXIT_OK
    # Every cancel is asked first (they stop side by side), then each end is waited for;
    # an id refused is said and the others go on. Exit: the highest of theirs, but not 2
    # ("nothing was changed") once a job was cancelled (h86: `cancel 99,8` cancelled 8
    # and exited 2).
    worst = EXIT_OK
    asked: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    for entry in _cancel_all(client, ids):
        if "error" not in entry:
            asked.append(entry)
            continue
        job_id, job = entry["id"], entry.get("job")
        if entry.get("status") == 409 and job is not None and job.get("status") == "cancelled":
            _error(f"job {job_id} was cancelled already: {job.get('message', '')}")
            shown.append(job)
            continue
        _error(str(entry["error"]))
        worst = max(worst, EXIT_USAGE if entry.get("status") in (400, 404) else EXIT_FAILED)
        # (--json lists one object per id given: a refused one is the job as it is,
        # or its id, with the error)
        shown.append({**(job or _job_or_id(client, job_id)), "error": entry["error"]})
    if worst == EXIT_USAGE and asked:
        worst = EXIT_FAILED
    for job in asked:
        worst = max(worst, _cancel_one(client, args, job, False, shown))
    if args.json:
        order = {job_id: place for place, job_id in enumerate(ids)}
        _print_json(sorted(shown, key=lambda job: order.get(job["id"], len(ids))))
    return worst


CANCEL_CHUNK = 5_000
"""Ids per ``POST /v1/jobs/cancel`` (an engine lost asks again for one chunk at most)."""


def _cancel_all(client: Client, ids: list[int]) -> list[dict[str, Any]]:
    """Cancel ``ids``, a few thousand per request; the engine's answer for each, in
    order (the job, or ``{"id", "error", "status", "job"?}``).

    An engine lost in the middle is waited for and asked again for the ids not yet
    answered: a cancel asked twice finds the job cancelled already, which is the state
    asked for (it exited 4, "unknown", having cancelled 3,939 of 15,000: tester h106).
    """
    out: list[dict[str, Any]] = []
    for start in range(0, len(ids), CANCEL_CHUNK):
        chunk = ids[start : start + CANCEL_CHUNK]
        while True:
            try:
                answer = client.request("POST", "/jobs/cancel", {"ids": chunk})
                break
            except ApiError as err:
                if err.status in (404, 405) and not out:
                    return _cancel_each(client, ids)  # (an engine from before the route)
                raise
            except (EngineLost, EngineNotRunning) as err:
                if isinstance(err, EngineNotRunning) and not out:
                    raise  # (none there at all: "no engine", exit 3; nothing was asked)
                left = len(ids) - start
                _error(
                    f"{_gone(client)}; asking again for the {left:,} cancel"
                    f"{'' if left == 1 else 's'} not yet answered once it answers"
                )
                _wait_for_engine(client)
        out.extend(answer["jobs"])
    return out


def _cancel_each(client: Client, ids: list[int]) -> list[dict[str, Any]]:
    """As :func:`_cancel_all`, one request per id (an engine without ``/jobs/cancel``)."""
    out: list[dict[str, Any]] = []
    for job_id in ids:
        try:
            out.append(client.cancel(job_id))
        except ApiError as err:
            entry: dict[str, Any] = {"id": job_id, "error": str(err), "status": err.status}
            if err.status == 409:
                try:
                    entry["job"] = dict(client.job(job_id)["job"])
                except (ApiError, EngineLost):
                    pass
            out.append(entry)
    return out


def _job_or_id(client: Client, job_id: int) -> dict[str, Any]:
    """The job's row, or ``{"id": job_id}`` where there is none to read."""
    try:
        return dict(client.job(job_id)["job"])
    except (ApiError, EngineLost):
        return {"id": job_id}


def _cancelled_already(client: Client, job_id: int, err: ApiError) -> dict[str, Any] | None:
    """The job, if a refused cancel found it cancelled already: the state asked for, so
    said on stderr and no failure. `cancel X Y Z` of a chain exited 1, as Y's cancel
    cancelled Z before Z's turn came; a cleanup of every id of a pipeline under
    ``set -e`` stopped there (tester h62). Ended otherwise (completed, failed), it is
    still refused: the job was not stopped."""
    if err.status != 409:
        return None
    try:
        job = dict(client.job(job_id)["job"])
    except (ApiError, EngineLost):
        return None
    if job.get("status") != "cancelled":
        return None
    _error(f"job {job_id} was cancelled already: {job.get('message', '')}")
    return job


def _cancel_one(
    client: Client,
    args: argparse.Namespace,
    job: dict[str, Any],
    as_json: bool,
    shown: list[dict[str, Any]] | None = None,
) -> int:
    """Wait for one cancelled job as asked and say how it ended; its exit code. With
    ``shown``, the job goes there (printed as a list) instead of being printed."""
    dependents = job.get("cancels_dependents") or []
    if dependents and not (as_json or (shown is not None and args.json)):
        # (they went with it unsaid: tester h83)
        noun = "job" if len(dependents) == 1 else "jobs"
        # (those waiting through another were said to wait for it: tester h103)
        chain = " (directly or through one another)" if len(dependents) > 1 else ""
        _error(
            f"{noun} {', '.join(map(str, dependents))} waited{chain} for job {job['id']} to "
            "complete: cancelled too"
        )
    if job["status"] == "running" and not args.no_wait:
        job = _await_stop(client, job, args.timeout)
    if shown is not None:
        shown.append(job)
    if as_json:
        _print_json(job)
    json_out = as_json or (shown is not None and args.json)
    if job["status"] == "running":
        cluster = (job.get("spec") or {}).get("cluster")
        kill_at = job.get("kill_at")
        said = None
        if cluster:
            # Slurm stops it (scancel, then its own KILL): no SIGKILL of ours to wait for.
            said = f"job {job['id']} is stopping on cluster {cluster}: {job['message']}"
        elif job["kind"] == "command" and job.get("pid") is None:
            # Decided, and not started yet: its launcher has not answered (stopped, hung).
            # ("SIGTERM sent ... still running" was said of a job with no process: h143)
            said = (
                f"job {job['id']} has not started yet (its launcher has not answered; see "
                "`gpulayer-tui doctor`): it is stopped as soon as it starts"
            )
            if not args.no_wait:
                waited = "the wait" if args.timeout is None else f"--timeout {args.timeout:g} s"
                _error(f"{said}; not started after {waited}")
                return EXIT_TIMED_OUT if args.timeout is not None else EXIT_FAILED
        elif args.no_wait or (kill_at and time.time() < kill_at):
            # Stopping as asked: SIGTERM is sent, its SIGKILL not due yet.
            clock = time.strftime("%H:%M:%S", time.localtime(kill_at or time.time()))
            said = f"job {job['id']} is stopping: SIGTERM sent, SIGKILL at {clock} if it still runs"
        if said is not None:
            if args.no_wait:
                if not json_out:
                    print(said)
                return EXIT_OK
            waited = "the wait" if args.timeout is None else f"--timeout {args.timeout:g} s"
            _error(f"{said}; still running after {waited}")
            return EXIT_TIMED_OUT if args.timeout is not None else EXIT_FAILED
        _error(
            f"job {job['id']} is still running {_since_kill(job)}: its process may be stuck "
            "in the kernel (uninterruptible sleep); the engine releases it [engine] "
            f"release_after seconds after SIGKILL (see `gpulayer-tui status {job['id']}`)"
        )
        return EXIT_TIMED_OUT if args.timeout is not None else EXIT_FAILED
    if not json_out:
        print(f"job {job['id']} {job['status']}: {job['message']}")
    return EXIT_OK


CANCEL_PAST_KILL_S = 60.0  # how long `cancel` waits past SIGKILL by default


def _await_stop(client: Client, job: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Wait for a cancelled job's end, bounded, and say what it waits for when it is slow."""
    kill_at = job.get("kill_at") or time.time()
    deadline = time.time() + (
        timeout if timeout is not None else max(0.0, kill_at - time.time()) + CANCEL_PAST_KILL_S
    )
    waited = _wait_through(client, job["id"], min(1.0, max(0.0, deadline - time.time())))
    if not waited["timed_out"]:
        return dict(waited["job"])
    clock = time.strftime("%H:%M:%S", time.localtime(kill_at))
    until = time.strftime("%H:%M:%S", time.localtime(deadline))
    cluster = (job.get("spec") or {}).get("cluster")
    if cluster:  # (scancel, then Slurm's own KILL: no SIGKILL of ours)
        doing = f"stopping on cluster {cluster}"
    elif job["kind"] == "command" and waited["job"].get("pid") is None:
        doing = "not started yet (its launcher has not answered): stopped as soon as it starts"
    else:
        doing = f"stopping: SIGTERM sent, SIGKILL at {clock} if it still runs"
    print(f"job {job['id']} is {doing}; waiting until {until}", file=sys.stderr, flush=True)
    left = max(0.0, deadline - time.time())
    return dict(_wait_through(client, job["id"], left)["job"])


def _wait_through(client: Client, job_id: int, timeout: float) -> dict[str, Any]:
    """``client.wait`` for a job whose cancel is stored, going on after an engine that
    restarts meanwhile (the cancel stands: it exited 3, "no engine", though it was done)."""
    deadline = time.monotonic() + timeout
    piece = min(WAIT_SLICE_S, client.timeout or WAIT_SLICE_S)
    while True:
        left = max(0.0, deadline - time.monotonic())
        try:
            data = dict(client.wait(job_id, min(left, piece)))
        except (EngineLost, EngineNotRunning):
            if time.monotonic() >= deadline:
                raise
            _error(f"{_gone(client)}; waiting for job {job_id} to stop once it answers again")
            _wait_for_engine(client)
            continue
        if not data.get("timed_out") or time.monotonic() >= deadline:
            return data


def _since_kill(job: dict[str, Any]) -> str:
    kill_at = job.get("kill_at")
    if not kill_at:
        return "after the wait"
    past = time.time() - kill_at
    if past < 0:
        return f"{-past:.0f} s before its SIGKILL"
    return f"{past:.0f} s after SIGKILL"


def _adopt(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..engine.procs import start_ticks

    body: dict[str, Any] = {"pid": args.pid}
    # Read the start time here, where the user named the pid: if the engine then finds
    # another start time, the pid was recycled in between and adoption is refused.
    ticks = start_ticks(args.pid)
    if ticks is not None:
        body["start_ticks"] = ticks
    if args.name is not None:  # ("" too: refused as `submit --name ""` is, not dropped)
        body["name"] = args.name
    if args.vram_gb is not None:
        body["vram_gb"] = args.vram_gb
    if args.gpu:
        body["gpu"] = True
    if args.domain:
        body["domain"] = domain_names(args.domain)
        if not body["domain"]:
            parser.error(f"--domain: no domain name in {', '.join(map(repr, args.domain))}")
    job = client.request("POST", "/adopt", body)["job"]
    if args.json:
        _print_json(job)
    elif job["status"] == "running":
        print(job["id"])
        # A warning the engine adopted it with (a quarantined GPU, more VRAM declared than
        # free) was only in the job's reason: the id alone read as all well (tester h87).
        _, warned, warning = str(job.get("message") or "").partition("; warning: ")
        if warned:
            _error(f"warning: {warning}")
    if job["status"] != "running":
        _error(f"job {job['id']} {job['status']} ({job['termination_reason']}): {job['message']}")
        return EXIT_FAILED
    return EXIT_OK


def _domain(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.reason is not None and args.action != "drain":
        # (taken and dropped without a word: tester h131)
        parser.error(f"--reason goes with drain (the reason said for it), not {args.action}")
    if args.action == "list":
        answer = client.request("GET", "/domains")
        domains = answer["domains"]
        # Configured, its GPU not listed by the driver now: said, not "unknown" (as drain
        # and doctor say it; tester h102). (An older engine sends no such list.)
        missing = answer.get("missing") or []
        if args.name:  # one domain (it was ignored: every domain was listed)
            domains = [d for d in domains if d["name"] == args.name]
            missing = [m for m in missing if m["name"] == args.name]
            if missing and not domains:
                _error(missing[0]["reason"])
                return EXIT_FAILED
            if not domains:
                _error(f"unknown domain {args.name!r}")
                return EXIT_USAGE
        if args.json:
            _print_json(domains)
        else:
            from ..formatting import kept_drain

            rows = [
                [
                    d["name"],
                    "" if d["gpu_index"] is None else str(d["gpu_index"]),
                    d["state"],
                    d["health"],
                    f"{d['used_slots']}/{d['slots']}",
                    # (an old error does not explain a healthy GPU)
                    (d["state_reason"] or (d["last_error"] if d["health"] != "healthy" else ""))
                    + kept_drain(d),
                ]
                for d in domains
            ]
            from .format import table

            print(table(["DOMAIN", "GPU", "STATE", "HEALTH", "SLOTS", "REASON"], rows))
        # (said under --json too, where it was dropped: the list holds live domains only,
        # and `gpus --json` has the missing ones as data; tester h166)
        for away in missing:
            _error(away["reason"])
        return EXIT_OK
    if not args.name:
        parser.error(f"domain {args.action} needs the domain's name")
    given = args.action == "drain" and args.reason is not None
    body = {"reason": args.reason} if given else None
    answer = client.request("POST", f"/domains/{quote(args.name)}/{args.action}", body)
    if args.action == "forget":
        gone = answer["forgotten"]
        if args.json:
            _print_json(gone)
        else:
            print(
                f"forgot the GPU of {gone['name']} ({gone['gpu_uuid']}): jobs that waited "
                "for it were decided again"
            )
            running = gone.get("still_running") or []  # (an older engine leaves it out)
            if running:
                ids = ", ".join(map(str, running))
                print(
                    f"  job {ids} was running on it and still runs: left to end by itself "
                    "(cancel stops it now); `gpus` lists the GPU until it ends"
                    if len(running) == 1
                    else f"  jobs {ids} were running on it and still run: left to end by "
                    "themselves (cancel stops them now); `gpus` lists the GPU until they end"
                )
        return EXIT_OK
    dom = answer["domain"]
    if args.json:
        _print_json(dom)
    else:
        from ..fields import printable
        from ..formatting import drain_said

        print(printable(f"domain {dom['name']}: {dom['state']}{drain_said(dom, args.action)}"))
        if args.action == "drain" and dom.get("used_slots"):
            _say_still_there(client, dom["name"])
    return EXIT_OK


def _say_still_there(client: Client, name: str) -> None:
    """What still runs on a drained domain, and when it leaves: the drain said nothing of
    a service that kept the GPU while none of its replicas exited (tester h93)."""
    from ..fields import printable
    from ..formatting import still_on_domain

    for line in still_on_domain(client.jobs(["running"], limit=10_000), name):
        print(printable(f"  {line}"))


def _clean(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.older_than is None and args.keep is None:
        parser.error("clean needs --older-than DAYS and/or --keep N")
    body: dict[str, Any] = {}
    if args.older_than is not None:
        body["older_than_days"] = args.older_than
    if args.keep is not None:
        body["keep"] = args.keep
    if args.dry_run:
        body["dry_run"] = True
    try:
        done = client.request("POST", "/clean", body)
    except EngineLost:
        # Asked again of the engine that comes back: a clean asked twice removes what the
        # first left (it exited 4, "whether it acted is unknown", and a kill mid-clean
        # left half of it done: tester h147).
        _error(f"{_gone(client)}; asking for the clean again once it answers")
        _wait_for_engine(client)
        done = client.request("POST", "/clean", body)
    left, left_count = done.get("left") or [], int(done.get("left_count") or 0)
    failed = EXIT_FAILED if left_count else EXIT_OK
    if args.json:
        _print_json(done)
        return failed
    trees = done.get("snapshots", 0)
    spared = done.get("spared") or []
    why = done.get("spared_why")  # (an older engine leaves it out)
    if spared and why is not None:
        # Each with why (which dependent, or its notification: tester h123).
        shown = [f"job {i} ({why.get(str(i), 'still needed')})" for i in spared[:10]]
        more = f" and {len(spared) - 10} more" if len(spared) > 10 else ""
        kept = f"; kept {len(spared)} still needed: {', '.join(shown)}{more}"
    else:
        kept = (
            f"; kept {len(spared)} still needed (a job not ended yet depends on it, or its "
            f"notification is not sent yet): {'job' if len(spared) == 1 else 'jobs'} "
            f"{_some_ids(spared)}"
            if spared
            else ""
        )
    from ..formatting import plural, size_words

    # (counted in words: "1 finished job(s)", "would remove ... (job 1, 2, 3)": tester h94)
    jobs, files = plural(done["jobs"], "finished job"), plural(done["files"], "file")
    if args.older_than is not None:
        # (the moment said: `--older-than 1m` removed what ended a minute ago, meant as a
        # month, and nothing showed the cutoff it was taken for: tester h145)
        cutoff = time.localtime(time.time() - args.older_than * 86400)
        jobs += f" that ended before {time.strftime('%Y-%m-%d %H:%M:%S', cutoff)}"
        if args.keep is not None:
            # (either rule removes a job: jobs past the N kept, ended after the cutoff,
            # were said to have ended before it: tester h172)
            jobs += f" or are past the {args.keep} that ended last"
    tree_bytes = done.get("snapshot_bytes")  # (an older engine leaves it out)
    snapshots = (
        f", {plural(trees, 'snapshot')}"
        + (f" ({size_words(tree_bytes)} on disk)" if tree_bytes is not None else "")
        if trees
        else ""
    )
    if args.dry_run:
        ids = done.get("ids") or []
        print(
            f"would remove {jobs}"
            + (f" ({'job' if len(ids) == 1 else 'jobs'} {_some_ids(ids)})" if ids else "")
            + f" and {files} ({size_words(done.get('bytes', 0))} on disk)"
            + snapshots
            + kept.replace("; kept", "; would keep")
            + "; nothing was removed"
        )
        if done.get("unrecorded"):  # (the database cannot be written: not all is seen)
            _error(f"note: {done['unrecorded']}")
        return EXIT_OK
    freed = done.get("database_bytes_freed") or 0
    took = done.get("bytes")  # (an older engine leaves it out)
    print(
        f"removed {jobs} and {files}"
        # (what freeing the disk is about: only the dry run said it, tester h123)
        + (f" ({size_words(took)} on disk)" if took is not None and done["files"] else "")
        + snapshots
        # (a few pages back is no news: said from a MiB)
        + (f"; the database gave back {size_words(freed)}" if freed >= 1 << 20 else "")
        + kept
    )
    if left_count:
        # (named, and the clean finished: one such file failed it with "HTTP 500", its
        # chunk's files left on disk: tester h145)
        more = f" (and {left_count - len(left)} more)" if left_count > len(left) else ""
        _error(
            f"could not remove {plural(left_count, 'file')}{more}; each is tried again at "
            "the next clean:" + "".join(f"\n  {line}" for line in left)
        )
    return failed


def _some_ids(ids: list[int], shown: int = 10) -> str:
    """Up to ``shown`` ids, then how many more."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(str(job_id) for job_id in ids[:shown]) + more


def _gpus(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    data = client.gpus()
    if args.json:
        _print_json(data)
    else:
        from .format import fit, format_gpus

        # (the command last, whole when piped; on a terminal each line ends at its edge,
        # with "…" where cut: it was cut at 60 characters always, with no mark)
        print(fit(format_gpus(data), _terminal_columns() if sys.stdout.isatty() else None))
    return EXIT_OK


def _store_failure(client: Client) -> str | None:
    """The engine's database failure, if it has one now (asked briefly: an engine that
    does not answer is stopped as before)."""
    timeout, client.timeout = client.timeout, min(client.timeout or 2.0, 2.0)
    try:
        failure = client.health().get("store_failure")
    except (ApiError, EngineLost, EngineNotRunning, OSError):
        return None
    finally:
        client.timeout = timeout
    return str(failure) if failure else None


def _stop(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import signal

    from ..engine.lock import EngineLock

    lock = EngineLock(client.paths.lock)
    pid = lock.holder()  # (also where its lock file was removed)
    if not pid:
        # (its advice to start one read oddly after a stop: tester h117)
        _error(f"no engine is serving {client.paths.state_text}: nothing to stop")
        return EXIT_NO_ENGINE
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            command = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        command = ""
    if "--serve" not in command:
        _error(f"the engine (pid {pid}) runs inside a TUI: quit that TUI to stop it")
        return EXIT_FAILED
    unsaved = _store_failure(client)
    if unsaved and not args.force:
        # (it stopped, said "stopped the engine", and a cancel it had answered "kept,
        # takes effect once stored" was lost: the job ran later: tester h186)
        _error(
            f"the engine (pid {pid}) cannot write its database ({unsaved}): what it has not "
            "stored yet (job ends, cancels and edits it said it keeps) is lost if it stops "
            "now; free the space and let it catch up (`gpulayer-tui doctor` says when), or "
            "stop it anyway with --force"
        )
        return EXIT_FAILED
    try:
        os.kill(pid, signal.SIGTERM)
    except PermissionError:
        _error(f"the engine (pid {pid}) belongs to another user: only they or root may stop it")
        return EXIT_FAILED
    except ProcessLookupError:
        pass
    patience = args.timeout if args.timeout is not None else (client.timeout or 30.0)
    deadline = time.monotonic() + patience
    while lock.is_held_elsewhere():
        if time.monotonic() > deadline:
            _error(f"the engine (pid {pid}) is still stopping after {patience:g} s")
            return EXIT_TIMED_OUT  # (as wait's and cancel's time run out: tester h178)
        time.sleep(0.05)
    print(f"stopped the engine (pid {pid}); running jobs go on, the next engine takes them back")
    if unsaved:  # (--force: said what it cost, not only "stopped": tester h187)
        _error(
            f"warning: it could not write its database ({unsaved}): what it had not stored "
            "is lost (a cancel it had kept included: such a job runs on, or again)"
        )
    return EXIT_OK


def _why(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    data = client.request("GET", f"/jobs/{quote(args.job)}/why")
    if args.json:
        _print_json(data)
        return EXIT_OK
    from ..fields import printable
    from ..formatting import why_lines

    print("\n".join(printable(line) for line in why_lines(data)))
    return EXIT_OK


def _signal(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    body: dict[str, Any] = {"signal": args.signal}
    if args.start_ticks is not None:
        body["start_ticks"] = args.start_ticks
    done = client.request("POST", f"/processes/{args.pid}/signal", body)["done"]
    from ..fields import printable

    print(printable(done))
    return EXIT_OK


def _dependencies(after: list[int], after_any: list[int]) -> list[Any]:
    """``--after`` / ``--after-any`` ids as a spec's ``depends_on``."""
    return [*after, *({"job": i, "any_exit": True} for i in after_any)]


def _edit(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    changes = {
        key: getattr(args, key)
        for key in ("priority", "gpus", "vram_gb", "timeout", "name", "project", "replicas")
        if getattr(args, key) is not None
    }
    for what, field in (("timeout", "timeout"), ("vram", "vram_gb"), ("project", "project")):
        if getattr(args, f"no_{what}"):
            if field in changes:
                flag = "--vram-gb" if what == "vram" else f"--{what}"
                parser.error(f"--no-{what} contradicts {flag}")
            changes[field] = None
    if args.after is not None or args.after_any is not None or args.no_deps:
        if args.no_deps and (args.after or args.after_any):
            parser.error("--no-deps contradicts --after/--after-any")
        changes["depends_on"] = _dependencies(args.after or [], args.after_any or [])
    if not changes:
        parser.error(
            "edit needs at least one of --priority --gpus --vram-gb --timeout --name "
            "--project --replicas --no-timeout --no-vram --no-project --after --after-any --no-deps"
        )
    answer = client.request("PATCH", f"/jobs/{quote(args.job)}", changes)
    job = answer["job"]
    if args.json:
        # (an engine from before "changed" recorded every edit)
        # (with what changed, from -> to by field, as the API says it: tester h94)
        told = {"changed": answer.get("changed", True), "fields": answer.get("fields", {})}
        _print_json({**job, **told})
    else:
        from ..fields import EDIT_WORDS, edit_value, printable

        fields = answer.get("fields") or {}
        if answer.get("changed") is False:
            print(f"job {job['id']}: nothing to change (it has what was asked)")
        else:
            # What changed, as its timeline says it (only the status was printed: the
            # user could not tell that the edit did what was meant: tester h89).
            # (in the order asked, as the timeline has it; a field changed with them after)
            order = [key for key in changes if key in fields]
            order += [key for key in fields if key not in changes]
            now = job.get("spec") or {}
            before = {**now, **{key: pair[0] for key, pair in fields.items()}}
            said = ", ".join(
                f"{EDIT_WORDS.get(key, key)} {edit_value(key, fields[key][0], '', before)} -> "
                f"{edit_value(key, fields[key][1], '', now)}"
                for key in order
            )
            print(printable(f"job {job['id']} edited: {said}" if said else f"job {job['id']}"))
            print(printable(f"  {job['status']}: {job['message']}"))
        dropped = fields.get("vram_gb")
        if dropped and dropped[1] is None and "vram_gb" not in changes:
            _error(
                f"job {job['id']}: vram_gb {dropped[0]:g} dropped: a job on no GPU needs no "
                "GPU memory (--vram-gb with --gpus sets it again)"
            )
    return EXIT_OK


def _pause(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    data = client.request("POST", "/queue/pause")
    when = time.strftime("%H:%M:%S", time.localtime(data["paused_at"]))
    # (as resume says "the queue was not paused": a second pause read as the first, h147)
    already = "the queue was already paused" if data.get("was_paused") else "queue paused"
    print(f"{already} since {when}: nothing new starts until `gpulayer-tui resume`")
    return EXIT_OK


def _resume(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    data = client.request("POST", "/queue/resume")
    # (an engine from before "was_paused" said nothing of it: taken as resumed)
    print("queue resumed" if data.get("was_paused", True) else "the queue was not paused")
    return EXIT_OK


def _restart(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    answer = client.request("POST", f"/jobs/{quote(args.job)}/restart")
    job = answer["job"]
    if args.json:
        _print_json(job)
    else:
        print(job["id"])
    rolling = answer.get("rolling")
    if isinstance(rolling, list):  # (a running service: restarted in place)
        from ..fields import replicas_said

        how = (
            "one at a time, each once the one before it is up again"
            if len(rolling) > 1
            else "(stopped, then started again)"
        )
        _error(
            f"job {job['id']} restarts {replicas_said(rolling)} {how} "
            f"(`gpulayer-tui status {job['id']}` shows where it is)"
        )
        return EXIT_OK
    gone = answer.get("left_out") or []  # (an older engine leaves it out)
    if gone:
        _error(
            f"note: job {job['id']} does not wait for job{'s' if len(gone) > 1 else ''} "
            f"{', '.join(map(str, gone))}, which job {args.job} depended on: cleaned from "
            "the history (it had ended before that job ran)"
        )
    if job.get("termination_reason") in REFUSED:
        # The engine would not run it (over capacity, a dependency that failed): as
        # submit says it; one that already ran and ended is an ordinary outcome.
        _error(f"job {job['id']} {job['status']} ({job['termination_reason']}): {job['message']}")
        return EXIT_FAILED
    return EXIT_OK


def _users(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    data = client.request("GET", "/users")
    if args.json:
        _print_json(data)
        return EXIT_OK
    from ..formatting import USER_HEADS, user_cells
    from .format import table

    print(table(list(USER_HEADS), [user_cells(u) for u in data["users"]]))
    if not data["users"]:  # (a header alone said nothing of why: tester h167)
        _error("no user has used the GPUs recently, and no job runs or waits")
    return EXIT_OK


COMMANDS: dict[str, Callable[[Client, argparse.Namespace, argparse.ArgumentParser], int]] = {
    "why": _why,
    "users": _users,
    "pause": _pause,
    "resume": _resume,
    "restart": _restart,
    "edit": _edit,
    "signal": _signal,
    "submit": _submit,
    "jobs": _jobs,
    "status": _status,
    "logs": _logs,
    "wait": _wait,
    "cancel": _cancel,
    "gpus": _gpus,
    "adopt": _adopt,
    "domain": _domain,
    "clean": _clean,
    "stop": _stop,
}


def _answer_within() -> float:
    """Seconds to wait for the engine's answer: ``GPULAYER_TIMEOUT``, else 30.

    Raises:
        ValueError: It is set to something else than seconds in (0, 86400].
    """
    text = os.environ.get("GPULAYER_TIMEOUT", "").strip()
    if not text:
        return 30.0
    try:
        if not text.isascii() or "_" in text:  # (float() reads "1_0" as 10, and Arabic digits)
            raise ValueError
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:  # (nan too; it was ignored: a typo waited 30 s unsaid)
        from ..fields import printable

        raise ValueError(
            f"GPULAYER_TIMEOUT must be seconds, more than 0 and at most 86400, not "
            f"'{printable(text)[:40]}'"
        )
    return value


def run(args: argparse.Namespace, paths: Paths, parser: argparse.ArgumentParser) -> int:
    """Run one subcommand; map errors to messages and exit codes."""
    try:
        client = Client(paths, timeout=_answer_within())
        client.on_busy = _error
        client.on_warning = lambda warning: _error(f"warning: {warning}")
    except ValueError as err:
        _error(str(err))
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](client, args, parser)
    except EngineNotRunning as err:
        said = str(err)
        if args.command == "logs" and args.replica is None:
            # (its log is still on disk: said where, h123)
            log = os.path.join(paths.jobs_dir, f"{args.job}.log")
            if os.path.isfile(log):
                said += f"; job {args.job}'s log as last written is {log}"
        _error(said)
        return EXIT_NO_ENGINE
    except NotText as err:
        _error(str(err))
        return EXIT_USAGE
    except UntrustedLink as err:
        _error(f"not connecting to the engine: {err}")
        return EXIT_FAILED
    except EngineLost as err:
        _error(str(err))
        return EXIT_LOST
    except ApiError as err:
        said = _in_flags(str(err), err.field, args)
        _json_refusal(args, said)
        _error(said + _other_version(client, err))
        return EXIT_USAGE if err.status in (400, 404) else EXIT_FAILED
    except BrokenPipeError:
        return EXIT_OK
    except PermissionError as err:
        if err.filename is not None:  # a file named on the command line
            _error(f"{err.strerror}: {err.filename}")
            return EXIT_USAGE
        _error(
            f"cannot reach the engine's socket {paths.socket}: permission denied; an engine "
            "serves only its own user unless its config lists yours in [security]"
        )
        return EXIT_FAILED
    except OSError as err:
        if err.filename is None and err.errno in (errno.ENOSPC, errno.EIO, errno.EBADF):
            raise  # (its output could not be written: main() says so, exit 1)
        _error(f"{err.strerror or err}" + (f": {err.filename}" if err.filename else ""))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _other_version(client: Client, err: ApiError) -> str:
    """A refusal from an engine of another version says so: one not restarted since an
    upgrade answered in its own version's terms ("only a waiting job is edited" of what
    the new one does), read as "not allowed" (tester h157). Asked only on a refusal."""
    if err.status not in (400, 404, 409, 422):
        return ""
    from .. import __version__

    client.timeout = 2.0
    try:
        running = client.health().get("version")
    except Exception:  # (no answer: nothing to add to what was refused)
        return ""
    if not running or running == __version__:
        return ""
    return (
        f"\n  (the engine runs gpulayer-tui {running}, this command is {__version__}: an "
        "engine not restarted since an upgrade answers as its own version does; restart it "
        "to run this one: gpulayer-tui stop, then start it again)"
    )


def _id_span(ids: list[int]) -> str:
    """``5-9`` for consecutive ids (a batch's), else the first few and how many more."""
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}-{ids[-1]}"
    shown = ", ".join(str(i) for i in ids[:5])
    return shown if len(ids) <= 5 else f"{shown} and {len(ids) - 5:,} more"
