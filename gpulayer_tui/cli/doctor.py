"""``gpulayer-tui doctor``: is this machine and its engine in a state to run work?

Runs without an engine too: config, state dir, disk, lock and socket, and the driver are
checked locally; with an engine, its own checks are added (each domain's health,
queued jobs no domain in service could take, the clock against the newest job).
Exit status 1 when any check fails.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

from ..client import ApiError, Client, EngineLost, EngineNotRunning
from ..engine.paths import Paths
from .format import table

MIB = 1024**2


def _check(name: str, status: str, detail: str) -> dict[str, str]:
    return {"check": name, "status": status, "detail": detail}


def _config(paths: Paths, engines_gpus: tuple[Any, ...] | None = None) -> dict[str, str]:
    """The config file, read here (an engine that answers checks its own itself, against
    the GPUs it sees: see :func:`run_doctor`). Its domains are bound to the GPUs a running
    engine sees (``engines_gpus``: a file named with ``--config``), or else to this
    machine's when the driver answers: a GPU that does not exist, or one claimed twice, is
    what makes an engine refuse to start."""
    from ..engine.config import ConfigError, absent_words, load_engine_config, plan_domains
    from ..engine.gpus import ProbeStatus
    from ..engine.nvml import NvmlProbe

    try:
        there = paths.config_file.exists()
    except PermissionError:
        # (another user's private state dir: a traceback, tester h155)
        return _check("config", "warn", f"{paths.config_file} cannot be read: permission denied")
    if not there:
        gone = absent_words(paths.config_file)
        if gone != "absent":  # (a link leading nowhere was meant to be read: a warning)
            return _check("config", "warn", f"{paths.config_file} is {gone}: defaults apply")
        return _check("config", "ok", f"{paths.config_file} absent: defaults")
    try:
        # (as the engine reads it: one another user could write or replace is refused
        # here too, tester h155)
        config = load_engine_config(paths.config_file)
        if config is None:
            return _check("config", "ok", f"{paths.config_file} absent: defaults")
        if not config.domains:
            return _check("config", "ok", f"{paths.config_file} is valid")
        if engines_gpus is not None:
            # (checked against this machine's driver, none on simulated GPUs: a file the
            # engine then rejected, "gpu 5 does not exist", was called valid: tester h164)
            plan_domains(config, engines_gpus, os.cpu_count() or 1, str(paths.config_file))
            return _check(
                "config", "ok", f"{paths.config_file} is valid (for the GPUs the engine sees)"
            )
        probe = NvmlProbe()
        try:
            result = probe.read()
        finally:
            probe.close()
        if result.status is not ProbeStatus.OK:
            return _check(
                "config",
                "ok",
                f"{paths.config_file} is valid (its GPU domains are checked against the GPUs "
                "when the engine starts: the driver does not answer here)",
            )
        plan_domains(config, result.gpus, os.cpu_count() or 1, str(paths.config_file))
    except ConfigError as err:
        return _check("config", "fail", str(err).replace("\n", "; "))
    return _check("config", "ok", f"{paths.config_file} is valid")


def _theme(paths: Paths) -> list[dict[str, str]]:
    """A warning for a ``[ui] theme`` the TUI does not know (the config was "valid and
    applied", and the TUI said only "unknown theme": tester h131)."""
    from ..engine.config import ConfigError, load_config

    try:
        theme = load_config(paths.config_file).ui.theme if paths.config_file.is_file() else None
    except (ConfigError, OSError):
        return []  # (the config check says why)
    if theme is None:
        return []
    from ..theme_files import theme_names, unknown_theme_words

    ours, textuals = theme_names()
    if theme in ours or theme in textuals:
        return []
    return [_check("ui", "warn", unknown_theme_words(theme))]


def _free_floor_mb(paths: Paths) -> int:
    """``[logs] min_free_mb`` from the config file (the default when it cannot be read)."""
    from ..engine.config import Config, ConfigError, load_config

    try:
        return load_config(paths.config_file).logs.min_free_mb
    except ConfigError:
        return Config().logs.min_free_mb


def _opens_socket(paths: Paths) -> bool:
    """Whether ``[security]`` lets other users reach the engine (False when unreadable)."""
    from ..engine.config import ConfigError, load_config

    try:
        return load_config(paths.config_file).security.opens_socket
    except ConfigError:
        return False


def _unsafe(paths: Paths) -> str | None:
    """Why the engine would refuse the state dir (another user could change it), or None."""
    from ..engine.statedir import UnsafeStateDir, check_state_dir

    jobs = paths.jobs_dir if paths.jobs_dir.exists() else paths.state_dir
    try:
        check_state_dir(paths.state_dir, jobs)
    except UnsafeStateDir as err:
        return str(err)
    except OSError:
        return None  # (unreadable: said by the checks around it)
    return None


def _state_dir(paths: Paths) -> list[dict[str, str]]:
    state = paths.state_dir
    if not state.exists():
        return [_check("state dir", "warn", f"{state} does not exist yet (created at start)")]
    checks = []
    mode = state.stat().st_mode & 0o777
    # (The engine opens it to 0711 itself where [security] lets other users reach its
    # socket: warned of as wrong, for ever, on every such machine.)
    shared = _opens_socket(paths) and paths.socket.parent == state
    expected, why = (0o711, " ([security] lets other users in)") if shared else (0o700, "")
    owner = state.stat().st_uid
    if owner != os.getuid():
        # Another user's engine (one that lets this user in): its state dir is its own to
        # write; this user reaches it through the socket. (Every allowed user's doctor
        # failed "not writable", exit 1: tester h65.)
        from ..engine.access import user_name

        checks.append(
            _check(
                "state dir", "ok", f"{state} (mode {mode:o}, {user_name(owner)}'s: its engine's)"
            )
        )
    elif not os.access(state, os.W_OK):
        checks.append(_check("state dir", "fail", f"{state} is not writable"))
    elif (unsafe := _unsafe(paths)) is not None:
        # (as the engine refuses it: "mode 777; expected 700", a warning and exit 0, of a
        # dir the engine will not start on: tester h153)
        checks.append(_check("state dir", "fail", f"{unsafe} (an engine refuses to start on it)"))
    elif mode & 0o077 and mode != expected:
        checks.append(
            _check("state dir", "warn", f"{state} is mode {mode:o}; expected {expected:o}{why}")
        )
    else:
        checks.append(_check("state dir", "ok", f"{state} (mode {mode:o}){why}"))
    usage = shutil.disk_usage(state)
    free = usage.free
    floor = _free_floor_mb(paths)
    # As the engine judges it (disk.full_note): nearly full is under 64 MiB and under 5 %
    # of the disk (a 40 MiB state dir with 39 MiB free failed "0.0 GiB free").
    from ..engine.disk import FULL_MB, FULL_SHARE

    nearly_full = free < FULL_MB * MIB and free < FULL_SHARE * usage.total
    low = free < 1024 * MIB and free < 0.1 * usage.total
    status = "fail" if nearly_full else "warn" if low else "ok"
    amount = f"{free / 1024**3:.1f} GiB" if free >= 1024 * MIB else f"{free / MIB:.0f} MiB"
    detail = f"{amount} free in {state}"
    if nearly_full:
        detail += " (nearly full)"
    if free < floor * MIB:
        status = "fail"
        detail += f": below [logs] min_free_mb = {floor}, new jobs wait"
        if usage.total < floor * MIB:
            size = usage.total / MIB
            detail += f" (more than the whole filesystem, {size:.0f} MiB: lower it)"
    checks.append(_check("disk space", status, detail))
    return checks


def _driver_locally() -> dict[str, str]:
    from ..engine.gpus import ProbeStatus
    from ..engine.nvml import CPU_STILL_WORKS, NvmlProbe

    probe = NvmlProbe()
    try:
        result = probe.read()
    finally:
        probe.close()
    if result.status is ProbeStatus.OK:
        return _check("driver", "ok", f"{len(result.gpus)} GPU(s), driver {result.driver_version}")
    if result.status is ProbeStatus.NO_DRIVER:
        # (read here, with no engine: "running with 0 GPUs" read as if one ran)
        said = (result.message or "no NVIDIA driver").replace(
            CPU_STILL_WORKS,
            "an engine started here runs with 0 GPUs (CPU jobs work), or on simulated "
            "ones with --simulate (e.g. --simulate 2xA100-80GB).",
        )
        return _check("driver", "warn", said)
    return _check("driver", "fail", result.message or "NVML failed")


def _engine(paths: Paths, timeout: float) -> tuple[list[dict[str, str]], str | None]:
    """The engine's checks, and the config file it reads (``None``: no engine answers)."""
    from ..engine.lock import EngineLock
    from ..pathwalk import UntrustedLink

    client = Client(paths, timeout=timeout)
    try:
        health = client.health()
    except UntrustedLink as err:
        return [_check("engine", "fail", f"not connecting to the engine: {err}")], None
    except PermissionError:
        # (a traceback, for a user another's engine does not serve: tester h155)
        said = (
            f"cannot reach the engine's socket {paths.socket}: permission denied; an engine "
            "serves only its own user unless its config lists yours in [security]"
        )
        return [_check("engine", "fail", said), _driver_locally()], None
    except ApiError as err:  # (403: it serves, but not this user)
        return [_check("engine", "fail", str(err)), _driver_locally()], None
    except EngineLost as err:
        # Frozen or overloaded: the check that matters most then (it ended in a traceback).
        return [_check("engine", "fail", str(err).split(": whether")[0]), _driver_locally()], None
    except EngineNotRunning:
        pid = EngineLock(paths.lock).holder()
        if pid is not None:
            return [
                _check(
                    "engine",
                    "fail",
                    f"pid {pid} holds {paths.lock} but {paths.socket} does not answer",
                ),
                _driver_locally(),
            ], None
        return [
            _check("engine", "warn", f"no engine serving {paths.state_dir} (gpulayer-tui --serve)"),
            *_database(paths),
            *_launcher_failure(paths),
            *_unwatched_jobs(paths),
            _driver_locally(),
        ], None
    from .. import __version__

    running = health.get("version")
    checks = [
        _check(
            "engine",
            "ok",
            f"pid {health['pid']} serving {paths.socket} ({health['backend']}), "
            f"up {health['uptime']:.0f} s" + (f", gpulayer-tui {running}" if running else ""),
        )
    ]
    if running and running != __version__:
        # (an engine keeps its code until restarted: a newer CLI against it was never
        # told, and an answer of another shape ended in a traceback: tester h149)
        checks.append(
            _check(
                "engine version",
                "warn",
                f"the engine runs gpulayer-tui {running}, this command is {__version__}: "
                "stop the engine and start it again to run this version",
            )
        )
    if health.get("store_failure"):
        checks.append(_check("database", "fail", health["store_failure"]))
    if health.get("launcher_problem"):
        checks.append(
            _check(
                "launcher",
                "fail",
                f"{health['launcher_problem']} (no job starts until it does; see launcher.log)",
            )
        )
    capacity = health.get("capacity")
    if capacity == "known":
        backend = health["backend"]
        said = (
            "simulated GPUs (--simulate, or --simulate-if-no-gpu): no driver is read"
            if backend == "simulated"
            else f"GPUs readable through {backend}"
        )
        checks.append(_check("driver", "ok", said))
    elif capacity == "no_gpus":
        checks.append(_check("driver", "warn", health.get("no_gpu_notice") or "no GPUs"))
    else:
        checks.append(_check("driver", "fail", health.get("capacity_message") or "unknown"))
    try:
        checks.extend(client.request("GET", "/doctor")["checks"])
    except (ApiError, EngineLost) as err:
        checks.append(_check("engine checks", "fail", str(err).split(": whether")[0]))
    return checks, health.get("config_file")


def _database(paths: Paths) -> list[dict[str, str]]:
    """With no engine: whether the next one can open its database (a damaged one, or one
    of a newer version, stops it at start; doctor said all was well)."""
    import sqlite3

    from ..engine.store import _DAMAGED_ADVICE, SCHEMA_VERSION

    path = paths.database
    if not path.exists():
        return [_check("database", "ok", f"{path} not made yet (the first engine makes it)")]
    try:
        # (not mode=ro: a WAL database closed cleanly has no -shm to read it through)
        db = sqlite3.connect(path, timeout=5)
    except sqlite3.Error as err:
        return [_check("database", "fail", f"cannot open {path}: {err}")]
    try:
        db.execute("PRAGMA query_only = 1")
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        # (the engine's count of problems: doctor said one where the engine said five)
        problem = "; ".join(str(r[0]) for r in db.execute("PRAGMA quick_check(5)"))
    except sqlite3.Error as err:
        return [_check("database", "fail", f"cannot read {path}: {err}. {_DAMAGED_ADVICE}")]
    finally:
        db.close()
    if problem != "ok":
        # (one line, as the engine says it: SQLite's own line breaks came out as \x0a: h174)
        said = " ".join(str(problem).split())
        return [_check("database", "fail", f"{path} is damaged ({said}). {_DAMAGED_ADVICE}")]
    if version > SCHEMA_VERSION:
        return [
            _check(
                "database",
                "fail",
                f"{path} is of a newer gpulayer-tui (schema {version}; this one reads up to "
                f"{SCHEMA_VERSION}): upgrade this installation",
            )
        ]
    return [_check("database", "ok", f"{path} reads whole (schema {version})")]


def _launcher_failure(paths: Paths) -> list[dict[str, str]]:
    """With no engine: the last launcher that could not start, if none has since."""
    from ..engine.launcher import start_failure

    failure = start_failure(paths.state_dir)
    if failure is None:
        return []
    return [_check("launcher", "fail", f"{failure} (no job starts until it can; see launcher.log)")]


def _unwatched_jobs(paths: Paths) -> list[dict[str, str]]:
    """With no engine: the jobs its launcher still runs, and those that ended meanwhile
    (its journal says; nothing was said of them)."""
    from ..engine import journal, procstat

    try:
        entries = journal.replay(str(paths.state_dir / journal.NAME))
    except OSError:
        return []
    running, ended = [], 0
    for key, entry in entries.items():
        if entry.state == journal.EXITED:
            ended += 1
        elif entry.state == journal.RUNNING and entry.pid is not None:
            if procstat.start_ticks(entry.pid) == entry.ticks:  # (the same process)
                running.append((key, entry.pid))
    checks = []
    if running:
        from ..engine.launch_client import keeper_alive

        shown = ", ".join(f"{_run_words(key)} (pid {pid})" for key, pid in sorted(running)[:10])
        more = f" and {len(running) - 10} more" if len(running) > 10 else ""
        if keeper_alive(paths.state_dir):
            ends = "their ends are recorded, and the next engine learns them"
        else:
            # (killed: its spawner runs them on, but nothing above it keeps their codes)
            ends = (
                "the launcher's keeper process is gone: their ends are recorded only while "
                "its spawner lives"
            )
        checks.append(
            _check(
                "jobs",
                "warn",
                f"{len(running)} still running with no engine to follow them: "
                f"{shown}{more}; {ends}",
            )
        )
    if ended:
        checks.append(
            _check(
                "jobs",
                "ok" if not running else "warn",
                f"{ended} ended with no engine running; the next engine records their ends",
            )
        )
    return checks


def _run_words(key: str) -> str:
    """A launcher key in words: ``7`` and ``7~1`` (its run after a requeue) are job 7,
    ``10.0.1`` is job 10's replica 0 ("10.0.1 (pid 8634)" was said: tester h131)."""
    job, dot, rest = key.partition(".")
    job = job.partition("~")[0]
    if dot:
        return f"job {job} replica {rest.partition('.')[0]}"
    return f"job {job}"


def _engines_gpus(paths: Paths, timeout: float) -> tuple[Any, ...] | None:
    """The GPUs the engine sees (``GET /v1/gpus``: its domains' and those of none), as
    readings a config's domains are bound to; ``None`` when it does not say."""
    from ..engine.gpus import GpuReading

    try:
        view = Client(paths, timeout=timeout).request("GET", "/gpus")
    except (ApiError, EngineLost, EngineNotRunning, OSError):
        return None
    seen = [
        (d["gpu_index"], d.get("gpu_uuid") or "", (d.get("gpu") or {}).get("name") or "")
        for d in view.get("domains") or ()
        if d.get("gpu_index") is not None
    ]
    seen += [
        (g["gpu_index"], g.get("gpu_uuid") or "", (g.get("gpu") or {}).get("name") or "")
        for g in view.get("gpus_without_domain") or ()
        if not g.get("missing")
    ]
    return tuple(
        GpuReading(index=index, uuid=uuid, name=name, memory_total=None, memory_used=None)
        for index, uuid, name in sorted(set(seen))
    )


def _same_file(path: str, paths: Paths) -> bool:
    return os.path.realpath(path) == os.path.realpath(paths.config_file)


def run_doctor(paths: Paths, as_json: bool, config_given: bool = False) -> int:
    """Print the checks; 1 if any failed (2: a bad ``GPULAYER_TIMEOUT``). ``config_given``:
    the config file was named (``--config FILE``): it is checked, whichever the engine
    reads."""
    from .commands import _answer_within

    try:
        # GPULAYER_TIMEOUT when set (it was ignored); 10 s otherwise, a check's patience
        timeout = _answer_within() if os.environ.get("GPULAYER_TIMEOUT", "").strip() else 10.0
    except ValueError as err:
        print(f"gpulayer-tui: {err}", file=sys.stderr)
        return 2
    engine, engine_config = _engine(paths, timeout)
    # An engine that answers checks the config itself (bound to the GPUs it sees, and
    # whether it is applied); only without one is the file read here. A file named with
    # --config that the engine does not read is read here too: the engine's "valid and
    # applied" of its own file read as this one's, a false OK (tester h145).
    local = [] if any(c["check"] == "config" for c in engine) else [_config(paths)]
    if config_given and engine_config is not None and not _same_file(engine_config, paths):
        for check in engine:
            if check["check"] == "config":
                check["check"] = "engine config"
        named = _config(paths, _engines_gpus(paths, timeout))
        named["detail"] += f" (not the engine's config: it reads {engine_config})"
        local = [named]
    checks: list[dict[str, Any]] = [*local, *_theme(paths), *_state_dir(paths), *engine]
    if as_json:
        print(json.dumps(checks, indent=2))
    else:
        marks = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}
        print(
            table(
                ["CHECK", "STATUS", "DETAIL"],
                [[c["check"], marks[c["status"]], c["detail"]] for c in checks],
            )
        )
    return 1 if any(c["status"] == "fail" for c in checks) else 0
