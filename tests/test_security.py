"""Security on a multi-user box: who may use the socket, who may cancel what, and that
names, env values and paths in specs never reach a shell, a file path or SQL.

Requests from another uid are made by a real client started as ``nobody`` (``setpriv``),
which needs root; those tests are skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.engine.config import ConfigError, parse_config
from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.paths import Paths
from gpulayer_tui.engine.spec import SpecError

from .conftest import REPO, EngineFactory, Served, kill_jobs_of, make_config, wait_for
from .raw_http import request

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


_NOBODY_CLIENT: list[str] = []  # argv prefix that runs the CLI as nobody, once found
_NOBODY_CWD: list[Path] = []  # where that copy of the package is importable from


def _nobody_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's by default) for a process run as ``nobody``, less coverage's
    own variables: under CI's coverage pass, coverage starts in every Python process and
    writes its data file beside the checkout at exit, which nobody may not; its traceback
    on stderr was taken for ours (CI, a checkout nobody can traverse)."""
    return {
        k: v
        for k, v in (os.environ if env is None else env).items()
        if not k.startswith("COVERAGE_")
    }


def _nobody_client(readable: Path) -> list[str] | str:
    """An argv prefix that runs ``gpulayer-tui`` as ``nobody``, or why there is none.

    This interpreter (a venv in the checkout) may sit under a dir ``nobody`` cannot enter
    (a clone in a 0700 temp dir, a pyenv under /root). The CLI's client needs only the
    standard library, so the package is copied to ``readable`` and run with a system Python
    when this one cannot be used.
    """
    if os.geteuid() != 0:
        return "needs root to start a client as another user (setpriv)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    src = readable / "src"
    shutil.copytree(REPO / "gpulayer_tui", src / "gpulayer_tui", dirs_exist_ok=True)
    for path in [src, *src.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    candidates = [[sys.executable], ["/usr/bin/python3"]]
    why = ""
    for python in candidates:
        argv = [*NOBODY, *python, "-c", "import gpulayer_tui.cli.main, gpulayer_tui.client"]
        probe = subprocess.run(argv, cwd=src, capture_output=True, text=True, env=_nobody_env())
        if probe.returncode == 0:
            return [*NOBODY, *python, "-m", "gpulayer_tui"]
        why = probe.stderr.strip()[-200:]
    return f"nobody cannot run the CLI here: {why}"


def _give_nobody_the_config_reader() -> None:
    """``doctor`` reads the config (pydantic), beyond the client's standard library: the
    packages it needs are copied beside nobody's copy of ours (this interpreter's venv
    may be one nobody cannot enter: CI's, in a 0700 temp dir). Skips where nobody's
    Python cannot load them (another version)."""
    import pydantic

    site = Path(pydantic.__file__).parent.parent
    src = _NOBODY_CWD[0]
    for name in ("pydantic", "pydantic_core", "annotated_types", "typing_inspection"):
        if (site / name).is_dir():
            shutil.copytree(site / name, src / name, dirs_exist_ok=True)
    shutil.copy(site / "typing_extensions.py", src / "typing_extensions.py")
    for path in src.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    probe = subprocess.run(
        [*_NOBODY_CLIENT[:-2], "-c", "import pydantic"],
        cwd=src,
        capture_output=True,
        text=True,
        env=_nobody_env(),
    )
    if probe.returncode != 0:
        pytest.skip(f"nobody's Python cannot load pydantic: {probe.stderr.strip()[-200:]}")


@pytest.fixture
def open_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir whose parents ``nobody`` may traverse (pytest's tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="gpulayer-security-", dir="/tmp"))
    base.chmod(0o711)
    home = base / "home"
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    try:
        client = _nobody_client(base)
        if isinstance(client, str):
            pytest.skip(client)
        _NOBODY_CLIENT[:] = client
        _NOBODY_CWD[:] = [base / "src"]
        yield home
    finally:
        # (jobs outlive their engine: a test that failed half-way left its jobs running,
        # a "tick" loop among them, for the rest of the run)
        kill_jobs_of(home, launcher=False)
        shutil.rmtree(base, ignore_errors=True)


def _as_nobody(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    assert _NOBODY_CLIENT, "use the open_home fixture"
    return subprocess.run(
        [*_NOBODY_CLIENT, *args],
        env=_nobody_env(served.env),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=_NOBODY_CWD[0],
    )


def _job_count(home: Path) -> int:
    with sqlite3.connect(home / "gpulayer.db") as db:
        return int(db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])


def test_private_socket_cannot_even_be_reached_by_another_user(open_home: Path) -> None:
    served = Served(open_home)
    try:
        served.start("--simulate", "1xA100-80GB")
        assert stat.S_IMODE(open_home.stat().st_mode) == 0o700
        assert stat.S_IMODE((open_home / "engine.sock").stat().st_mode) == 0o600
        # (every job's environment: 0600 as docs/security.md says, not 0644: tester h105)
        assert stat.S_IMODE((open_home / "gpulayer.db").stat().st_mode) == 0o600
        refused = _as_nobody(served, "jobs")
        assert refused.returncode == 1
        assert f"cannot reach the engine's socket {open_home / 'engine.sock'}" in refused.stderr
        assert "permission denied" in refused.stderr
        # The TUI says the same, before it loads (or may read) its libraries.
        tui = _as_nobody(served)
        assert tui.returncode == 2, (tui.stdout, tui.stderr)
        assert f"cannot reach the engine's socket {open_home / 'engine.sock'}" in tui.stderr
        # An engine of nobody's own on it says whose the dir is (it said "Permission
        # denied (.../jobs)" alone: tester h155).
        theirs = _as_nobody(served, "--serve", "--simulate", "1xA100-80GB")
        assert theirs.returncode == 2, (theirs.stdout, theirs.stderr)
        assert f"{open_home} belongs to root, not to nobody" in theirs.stderr, theirs.stderr
        # doctor says it as a failed check (it ended in a traceback: tester h155).
        _give_nobody_the_config_reader()  # (doctor reads a config: pydantic)
        doctor = _as_nobody(served, "doctor")
        assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
        assert f"cannot reach the engine's socket {open_home / 'engine.sock'}" in doctor.stdout
    finally:
        if served.proc is not None and served.proc.poll() is None:
            served.stop()


class SharedEngine:
    """An engine serving ``open_home`` to root and, where allowed, to nobody."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.served = Served(home)
        self.config = home / "config.toml"
        self.sock = home / "engine.sock"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """A request as the engine's own user (root here); it must succeed."""
        status, data = request(self.sock, method, "/v1" + path, body)
        assert status < 300, (status, data)
        return data

    def allow(self, security: str) -> None:
        """A new ``[security]`` table, applied live."""
        self.config.write_text(f"[security]\n{security}\n")
        assert self.call("POST", "/config/reload")["applied"] is True

    def nobody(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _as_nobody(self.served, *args)


@pytest.fixture
def shared(open_home: Path) -> Iterator[SharedEngine]:
    """Listing anyone opens the socket (0666 in a 0711 dir); SO_PEERCRED decides per
    request. Starts allowing only uid 12345 (not nobody)."""
    engine = SharedEngine(open_home)
    open_home.mkdir()
    engine.config.write_text("[security]\nallowed_uids = [12345]\n")
    try:
        engine.served.start("--simulate", "1xA100-80GB")
        yield engine
    finally:
        if engine.served.proc is not None and engine.served.proc.poll() is None:
            engine.served.stop()


def test_doctor_takes_the_state_dir_the_engine_opened_for_security_as_meant(
    shared: SharedEngine,
) -> None:
    # The engine opens its state dir to 0711 itself when [security] lets others in:
    # doctor warned "mode 711; expected 700" for ever on every such machine.
    assert shared.home.stat().st_mode & 0o777 == 0o711
    checks = {c["check"]: c for c in json.loads(shared.served.cli("doctor", "--json").stdout)}
    assert checks["state dir"]["status"] == "ok", checks["state dir"]
    assert "(mode 711) ([security] lets other users in)" in checks["state dir"]["detail"]
    # Run as root for others, every job is root's: said (found only by a job's `id`: h75).
    if os.geteuid() == 0:
        assert checks["security"]["status"] == "warn"
        assert "every job runs as root" in checks["security"]["detail"]
    else:
        assert "security" not in checks
    os.chmod(shared.home, 0o755)  # (not what the engine made: said)
    checks = {c["check"]: c for c in json.loads(shared.served.cli("doctor", "--json").stdout)}
    assert checks["state dir"]["status"] == "warn"
    assert "is mode 755; expected 711" in checks["state dir"]["detail"]


def test_unlisted_uids_are_refused_naming_the_uid_and_nothing_is_kept(
    shared: SharedEngine,
) -> None:
    home = shared.home
    assert stat.S_IMODE(home.stat().st_mode) == 0o711
    assert stat.S_IMODE((home / "engine.sock").stat().st_mode) == 0o666
    for name in ("gpulayer.db", "gpulayer.db-wal", "gpulayer.db-shm"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((home / "jobs").stat().st_mode) == 0o700
    # nobody (uid 65534) is not listed: every request is refused, naming the uid.
    refused = shared.nobody("submit", "--", "true")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "uid 65534 (nobody) may not use this engine" in refused.stderr
    assert "[security] allowed_uids" in refused.stderr
    assert shared.nobody("jobs").returncode == 1
    # The TUI says the same: it took the refusal for no engine, and tried to start one of
    # its own there, which failed on the state dir's owner (tester h75).
    tui = shared.nobody()
    assert tui.returncode == 2, (tui.stdout, tui.stderr)
    assert "uid 65534 (nobody) may not use this engine" in tui.stderr
    assert "belongs to" not in tui.stderr
    _give_nobody_the_config_reader()  # (doctor reads a config: pydantic)
    doctor = shared.nobody("doctor")  # (a traceback: tester h155)
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
    assert "uid 65534 (nobody) may not use this engine" in doctor.stdout
    assert _job_count(home) == 0
    # Allowing its group applies live (the socket is already open to others); its jobs
    # are its own (SO_PEERCRED) and run as the engine's user.
    shared.allow('allowed_groups = ["nogroup"]')
    theirs_out = shared.nobody("submit", "--", "sh", "-c", "id -u; sleep 60")
    assert theirs_out.returncode == 0, theirs_out.stderr
    theirs = theirs_out.stdout.strip()
    status = json.loads(shared.served.cli("status", theirs, "--json").stdout)["job"]
    assert status["owner_uid"] == 65534
    wait_for(lambda: shared.served.cli("logs", theirs).stdout == f"{os.geteuid()}\n")
    shared.served.cli("cancel", theirs)
    # Cancelled by another (the engine's user here): its message says who (it said
    # "cancelled by user", read as its owner's doing: tester h75).
    import pwd

    me = f"uid {os.geteuid()} ({pwd.getpwuid(os.geteuid()).pw_name})"
    ended = json.loads(shared.served.cli("status", theirs, "--json").stdout)["job"]
    assert ended["message"].startswith(f"cancelled by {me}"), ended["message"]


def test_another_users_job_runs_as_the_engines_user_and_says_so_in_its_env(
    shared: SharedEngine,
) -> None:
    # It ran as root with the submitter's HOME and USER: root's caches and files went
    # into the submitter's home, owned by root (tester h65).
    import pwd

    shared.allow('allowed_groups = ["nogroup"]')
    me = pwd.getpwuid(os.geteuid())
    job = shared.nobody(
        "submit", "--env", "HOME=/home/someone", "--env", "USER=someone",
        "--env", "XDG_RUNTIME_DIR=/run/user/65534", "--env", "KEEP=kept", "--",
        "sh", "-c", 'echo "$HOME $USER $LOGNAME ${XDG_RUNTIME_DIR-unset} $KEEP"',
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    wait_for(lambda: shared.served.cli("wait", job.stdout.strip()).returncode == 0)
    said = shared.served.cli("logs", job.stdout.strip()).stdout
    assert said == f"{me.pw_dir} {me.pw_name} {me.pw_name} unset kept\n"
    # The engine's own user's job keeps what it was given.
    own = shared.served.cli("submit", "--env", "HOME=/elsewhere", "--", "sh", "-c", "echo $HOME")
    assert shared.served.cli("wait", own.stdout.strip()).returncode == 0
    assert shared.served.cli("logs", own.stdout.strip()).stdout == "/elsewhere\n"


def test_a_users_waiting_jobs_are_held_once_it_is_let_out_and_restarts_stay_its_own(
    shared: SharedEngine,
) -> None:
    # Its queued jobs ran later as the engine's user, without a word (tester h65).
    shared.allow('allowed_groups = ["nogroup"]')
    blocker = shared.call("POST", "/jobs", {"command": ["sleep", "60"], "gpus": 1})["job"]
    waiting = shared.nobody("submit", "--gpus", "1", "--", "true").stdout.strip()
    assert waiting, "nobody could not submit"
    shared.allow("allowed_uids = [12345]")  # (nobody out)
    shared.served.cli("cancel", str(blocker["id"]))
    held = "held: its owner, uid 65534 (nobody), may no longer use this engine ([security])"
    wait_for(lambda: shared.call("GET", f"/jobs/{waiting}")["job"]["message"].startswith(held))
    assert shared.call("GET", f"/jobs/{waiting}")["job"]["status"] == "queued"
    why = shared.call("GET", f"/jobs/{waiting}/why")
    assert why["reason"].startswith(held) and why["may_preempt"] is None
    # The engine's own jobs go on meanwhile (the GPU it waits for is free: not kept for it).
    mine = shared.call("POST", "/jobs", {"command": ["true"], "gpus": 1})["job"]
    assert shared.served.cli("wait", str(mine["id"])).returncode == 0
    shared.allow('allowed_groups = ["nogroup"]')  # (let in again: it runs)
    assert shared.served.cli("wait", waiting).returncode == 0
    # An admin's restart of the user's job is still the user's (it became root's, with
    # the user's environment, and the user could no longer see or cancel it).
    again = shared.served.cli("restart", waiting, "--json")
    assert again.returncode == 0, again.stderr
    restarted = json.loads(again.stdout)
    assert restarted["owner_uid"] == 65534
    assert shared.nobody("cancel", str(restarted["id"])).returncode in (0, 1)


def test_an_allowed_users_doctor_takes_the_engines_state_dir_as_the_engines(
    shared: SharedEngine,
) -> None:
    # Every allowed user's doctor failed "state dir ... is not writable", exit 1 (h65).
    _give_nobody_the_config_reader()
    shared.allow('allowed_groups = ["nogroup"]')
    out = shared.nobody("doctor", "--json")
    assert out.stdout, out.stderr
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert checks["state dir"]["status"] == "ok", checks["state dir"]
    assert "its engine's" in checks["state dir"]["detail"]
    assert out.returncode == 0, [c for c in checks.values() if c["status"] == "fail"]


def test_another_user_sees_env_names_not_values_and_logs_only_where_shared(
    shared: SharedEngine,
) -> None:
    shared.allow('allowed_groups = ["nogroup"]')
    secret = {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    mine = shared.call(
        "POST", "/jobs", {"shell": "echo root-only; sleep 60", "name": "root's", "env": secret}
    )["job"]
    assert mine["owner_uid"] == os.geteuid()
    theirs = shared.nobody("submit", "--", "sleep", "60").stdout.strip()
    seen = json.loads(shared.nobody("status", str(mine["id"]), "--json").stdout)
    assert seen["job"]["spec"]["env"] == {"AWS_SECRET_ACCESS_KEY": "(hidden)"}
    assert shared.call("GET", f"/jobs/{mine['id']}")["job"]["spec"]["env"] == secret
    own_env = json.loads(shared.nobody("status", theirs, "--json").stdout)
    assert "(hidden)" not in own_env["job"]["spec"]["env"].values()
    listed = json.loads(shared.nobody("jobs", "--json").stdout)
    assert all("env" not in row["spec"] for row in listed)
    # `submit --like` another user's job runs with this shell's environment: the hidden
    # values were sent back as values (PATH = "(hidden)": its program not found).
    like = shared.nobody("submit", "--like", str(mine["id"]), "--json").stdout
    copy = shared.call("GET", f"/jobs/{json.loads(like)['id']}")["job"]
    assert "(hidden)" not in copy["spec"]["env"].values() and "PATH" in copy["spec"]["env"]
    shared.served.cli("cancel", str(copy["id"]))
    # ... and reads another user's output only where [security] shares it.
    wait_for(lambda: shared.served.cli("logs", str(mine["id"])).stdout == "root-only\n")
    unshared = shared.nobody("logs", str(mine["id"]))
    assert unshared.returncode == 1 and unshared.stdout == ""
    assert "may read only its own jobs' output" in unshared.stderr
    shared.allow('allowed_groups = ["nogroup"]\nshare_logs = true')
    assert shared.nobody("logs", str(mine["id"])).stdout == "root-only\n"
    for job in (str(mine["id"]), theirs):
        shared.served.cli("cancel", job)


def _on_a_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> bytes:
    """What ``argv`` writes to its standard output when that is a terminal (a pty)."""
    master, slave = os.openpty()
    try:
        subprocess.run(argv, stdout=slave, stderr=subprocess.DEVNULL, env=env, cwd=cwd, timeout=60)
    finally:
        os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # (EIO: every writer is gone and all was read)
            break
        if not data:
            break
        out += data
    os.close(master)
    return out


def test_another_users_output_reaches_a_terminal_with_its_controls_escaped(
    shared: SharedEngine,
) -> None:
    # With share_logs, `logs` wrote another user's bytes raw: their output could retitle,
    # clear or (on some terminals) write the clipboard of the reader's terminal.
    shared.allow('allowed_groups = ["nogroup"]\nshare_logs = true')
    mine = shared.call(
        "POST",
        "/jobs",
        {"shell": "printf 'a\\033]0;PWN\\007b\\302\\233c\\233d\\342\\200\\256e\\n'"},
    )
    job = str(mine["job"]["id"])
    assert shared.call("GET", f"/jobs/{job}/wait")["job"]["status"] == "completed"
    raw = b"a\x1b]0;PWN\x07b\xc2\x9bc\x9bd\xe2\x80\xaee\r\n"  # (a pty: CR LF for a newline)
    shown = _on_a_terminal(
        [*_NOBODY_CLIENT, "logs", job], _nobody_env(shared.served.env), _NOBODY_CWD[0]
    )
    # (C1 as UTF-8 and a lone 8-bit CSI byte alike; a bidi override)
    assert shown == b"a\\x1b]0;PWN\\x07b\\x9bc\\x9bd\\u202ee\r\n"
    asked = _on_a_terminal(
        [*_NOBODY_CLIENT, "logs", "--raw", job], _nobody_env(shared.served.env), _NOBODY_CWD[0]
    )
    assert asked == raw
    piped = subprocess.run(  # not a terminal: the bytes as they are
        [*_NOBODY_CLIENT, "logs", job],
        env=_nobody_env(shared.served.env),
        cwd=_NOBODY_CWD[0],
        capture_output=True,
        timeout=60,
    )
    assert piped.stdout == raw.replace(b"\r\n", b"\n")
    own = _on_a_terminal(
        [sys.executable, "-m", "gpulayer_tui", "logs", job], shared.served.env, REPO
    )
    # One's own output: its title sequence and the C1 CSI dropped (colours and progress
    # bars are kept: tests/test_terminal_output.py).
    assert own == b"abc\x9bd\xe2\x80\xaee\r\n"


def test_a_user_cancels_only_its_own_jobs_and_the_engines_user_any(shared: SharedEngine) -> None:
    shared.allow('allowed_groups = ["nogroup"]')
    mine = shared.call("POST", "/jobs", {"command": ["sleep", "60"]})["job"]
    theirs = shared.nobody("submit", "--", "sleep", "60").stdout.strip()
    other = shared.nobody("cancel", str(mine["id"]))
    assert other.returncode == 1
    assert (
        f"job {mine['id']} belongs to uid 0 (root); uid 65534 (nobody) may cancel only its own jobs"
    ) in other.stderr
    assert shared.call("GET", f"/jobs/{mine['id']}")["job"]["status"] == "running"
    # Drain, release and reload are the owner's.
    drain = shared.nobody("domain", "drain", "gpu0")
    assert drain.returncode == 1
    assert "uid 65534 (nobody) may not drain a domain" in drain.stderr
    assert shared.call("GET", "/domains")["domains"][0]["state"] == "in_service"
    own = shared.nobody("cancel", theirs)
    assert own.returncode == 0, own.stderr
    assert shared.nobody("wait", theirs).returncode == 1  # cancelled
    # The engine's user (here root) cancels anyone's jobs.
    assert shared.served.cli("cancel", str(mine["id"])).returncode == 0
    assert shared.call("GET", f"/jobs/{mine['id']}/wait")["job"]["status"] == "cancelled"
    assert shared.call("GET", f"/jobs/{theirs}")["job"]["status"] == "cancelled"


@pytest.mark.parametrize(
    ("security", "message"),
    [
        ({"allowed_uids": [-1]}, "security.allowed_uids.0: must be at least 0, got -1"),
        ({"allowed_uids": [2**32]}, "security.allowed_uids.0: must be at most 4294967294, got"),
        ({"allowed_uids": ["ana"]}, 'security.allowed_uids.0: must be a whole number, got "ana"'),
        ({"allowed_uids": 1000}, "security.allowed_uids: must be a list, got 1000"),
        (
            {"allowed_groups": ["no-such-group-xyz"]},
            "security.allowed_groups: no group named 'no-such-group-xyz' on this machine",
        ),
        ({"allowed_groups": ["a\0b"]}, "security.allowed_groups: no group named 'a\\x00b'"),
        ({"allowed_users": ["ana"]}, "unknown key 'security.allowed_users'"),
    ],
)
def test_security_config_is_validated_with_the_key_named(
    security: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"security": security}, "config.toml")
    assert message in str(err.value)
    assert str(err.value).startswith("config.toml: ")


def test_security_config_accepts_uids_group_names_and_gids() -> None:
    config = parse_config({"security": {"allowed_uids": [0, 1000], "allowed_groups": ["root", 7]}})
    assert config.security.opens_socket
    assert config.security.group_ids() == {0, 7}
    assert not parse_config({}).security.opens_socket


# -- names, env values and paths never reach a shell, a path or SQL ---------------------------

HOSTILE = [
    "../../x",
    "'; DROP TABLE jobs; --",
    '"); DELETE FROM events; --',
    "$(touch pwned-name)",
    "`touch pwned-tick`",
    "a/b\\c",
    "名前 🚀 ﷽",
    "x" * 200,
]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


async def test_hostile_names_and_env_are_stored_verbatim_and_never_interpreted(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    outside = tmp_path / "outside"
    outside.mkdir()
    before = _files(tmp_path)
    ids = {}
    for name in HOSTILE:
        job = await engine.submit(
            {
                "command": ["printenv", "EVIL"],
                "name": name,
                "project": name,
                "cwd": str(outside),
                "env": {"EVIL": name + " $(touch pwned-env); `touch pwned-env2`"},
            }
        )
        ids[job.id] = name
    for job_id, name in ids.items():
        done = await engine.wait(job_id, timeout=10)
        assert done.status is JobStatus.COMPLETED
        assert done.name == name
        out = engine.log_path(job_id).read_text()
        assert out == name + " $(touch pwned-env); `touch pwned-env2`\n"
    listed = {j.id: j.name for j in await engine.list_jobs()}
    assert {i: listed[i] for i in ids} == ids
    # Nothing was created but each job's log (exits are in the launcher's journal), and
    # the tables are intact.
    created = _files(tmp_path) - before
    state = engine.paths.state_dir.relative_to(tmp_path)
    expected = {f"{state}/jobs/{i}.log" for i in ids}
    assert {p for p in created if "/jobs/" in p} == expected
    assert not [p for p in created if "pwned" in p or p.endswith("x.log")]
    assert not list(outside.iterdir())
    with sqlite3.connect(engine.paths.database) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"jobs", "events"} <= tables
        assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] >= 3 * len(ids)


async def test_an_environment_not_utf8_runs_the_same_when_run_again(
    make_engine: EngineFactory,
) -> None:
    # A variable's name holding a byte that is not UTF-8 was stored as three U+FFFD:
    # the first run had it, a restart or the next engine's restore ran another name.
    engine = await make_engine()
    env = {"\udcffK": "1", "V": "a\udcffb"}
    show = (
        "import os; print(sorted(k + b'=' + v for k, v in os.environb.items()"
        " if k in (b'V', b'\\xffK')))"
    )
    first = await engine.submit({"command": [sys.executable, "-c", show], "env": env})
    assert (await engine.wait(first.id, timeout=10)).status is JobStatus.COMPLETED
    said = engine.log_path(first.id).read_text()
    assert said == str(sorted([b"V=a\xffb", b"\xffK=1"])) + "\n", said
    again = await engine.restart(first.id)
    await engine.wait(again.id, timeout=10)
    assert engine.log_path(again.id).read_text() == said
    await engine.stop()
    engine = await make_engine()  # (read back from the database)
    assert (await engine.get(first.id)).spec["env"] == env


async def test_a_command_is_argv_and_only_a_shell_line_goes_through_a_shell(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = await make_engine()
    words = ["$(touch X)", "`touch Y`", "; touch Z", "' \" \\", "$HOME", "*"]
    argv = await engine.submit({"command": ["printf", "%s|", *words], "cwd": str(tmp_path)})
    done = await engine.wait(argv.id, timeout=10)
    assert done.status is JobStatus.COMPLETED
    assert engine.log_path(argv.id).read_text() == "".join(f"{w}|" for w in words)
    assert sorted(os.listdir(tmp_path)) == ["home"]  # no X, Y or Z
    shell = await engine.submit({"shell": "echo $((6 * 7))", "cwd": str(tmp_path)})
    await engine.wait(shell.id, timeout=10)
    assert engine.log_path(shell.id).read_text() == "42\n"
    whoami = await engine.submit({"command": ["id", "-u"]})
    await engine.wait(whoami.id, timeout=10)
    assert engine.log_path(whoami.id).read_text() == f"{os.geteuid()}\n"


async def test_a_state_dir_with_shell_characters_in_its_path_is_safe(tmp_path: Path) -> None:
    state = tmp_path / "st ate '$(touch pwned)' \"`touch pwned2`\";x"
    paths = Paths(state, state / "config.toml")
    engine = Engine(paths, simulate="1xA100-80GB", config=make_config(), cpu_count=2)
    await engine.start()
    try:
        job = await engine.submit({"shell": "exit 7", "cwd": str(tmp_path)})
        done = await engine.wait(job.id, timeout=10)
        # The launcher ran in that state dir (its socket, journal and logs are there): the
        # path was always an argument, never code.
        assert done.exit_code == 7
        assert f"E {job.id} 7 " in (state / "launcher.journal").read_text()  # (then the time)
        assert not [p for p in _files(tmp_path) if Path(p).name.startswith("pwned")]
    finally:
        await engine.stop()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"command": ["true"], "name": "a\0b"}, "name: control characters are not allowed"),
        ({"command": ["true"], "name": "x" * 10_000}, "name: must be at most 200 characters"),
        # (the value in a few characters: it was written out in 309 digits)
        ({"command": ["true"], "timeout": 1e308}, "at most 315360000 s, got 1e+308"),
        ({"command": ["true"], "cwd": "../../x"}, "cwd: '../../x' is not an absolute path"),
        ({"command": ["true"], "cwd": "/tmp\0/x"}, "cwd contains a NUL byte"),
        ({"command": ["true\0rm"]}, "command: contains a NUL byte"),
        ({"command": ["true"], "env": {"A=B": "x"}}, "env: 'A=B' is not a valid variable name"),
        ({"command": ["true"], "env": {"A": "x\0y"}}, "env[A] contains a NUL byte"),
        ({"shell": "echo\0hi"}, "shell: contains a NUL byte"),
        ({"shell": " \t\n "}, "shell: a command is needed (the line is only blanks)"),
        ({"shell": "# x"}, "shell: a command is needed (the line is only a comment)"),
        # A lone surrogate: a codec's words with no field came back (a cwd was taken).
        ({"command": ["\ud800"]}, "command contains an unpaired surrogate U+D800"),
        ({"shell": "echo \ud800"}, "shell contains an unpaired surrogate U+D800"),
        ({"command": ["ls"], "env": {"A": "\ud800"}}, "env[A] contains an unpaired surrogate"),
        ({"command": ["ls"], "env": {"\ud800": "x"}}, "env (a variable's name) contains an"),
        ({"command": ["ls"], "cwd": "/tmp/\ud800"}, "cwd contains an unpaired surrogate U+D800"),
        ({"command": ["ls"], "name": "\ud800"}, "name: an unpaired surrogate is not text"),
        # A dependency that is neither: pydantic's words for each member came back.
        ({"command": ["ls"], "depends_on": [{"x": 1}]}, "depends_on.0: must be a job id, or"),
        ({"command": ["ls"], "depends_on": [{"job": 0}]}, "depends_on.0.job: a job id is 1 or"),
        ({"shell": "  # set up\n\n\t# run\n"}, "(the line is only a comment)"),
    ],
)
async def test_hostile_specs_are_refused_with_the_reason_and_store_nothing(
    make_engine: EngineFactory, spec: dict[str, object], message: str
) -> None:
    engine = await make_engine()
    with pytest.raises(SpecError) as err:
        await engine.submit(spec)
    assert message in str(err.value)
    assert await engine.list_jobs() == []
    with pytest.raises(SpecError, match="unknown status"):
        await engine.list_jobs(["queued') OR 1=1 --"])


def test_open_streams_end_when_their_reader_is_let_out_and_are_bounded_per_user(
    shared: SharedEngine,
) -> None:
    # Checked only when a request started: taken out of [security] (or share_logs turned
    # off), a user kept reading an open `logs -f` and the events stream; and one user
    # holding thousands of streams locked every other user out of the engine.
    shared.allow('allowed_groups = ["nogroup"]\nshare_logs = true')
    mine = shared.call("POST", "/jobs", {"shell": "while :; do echo tick; sleep 0.1; done"})
    job = str(mine["job"]["id"])
    python = _NOBODY_CLIENT[len(NOBODY)]
    reader = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "s.sendall(b'GET /v1/events HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "print('open', flush=True)\n"
        "while s.recv(65536): pass\n"
        "print('ended', flush=True)\n"
    )
    events = subprocess.Popen(
        [*NOBODY, python, "-c", reader, str(shared.sock)],
        stdout=subprocess.PIPE,
        text=True,
        env=_nobody_env(),
    )
    follow = subprocess.Popen(
        [*_NOBODY_CLIENT, "logs", "-f", job],
        env=_nobody_env(shared.served.env),
        cwd=_NOBODY_CWD[0],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert events.stdout is not None and follow.stdout is not None
        assert events.stdout.readline() == "open\n"
        assert follow.stdout.readline() == "tick\n"  # (reading)
        shared.allow('allowed_groups = ["nogroup"]')  # share_logs off: the follow ends
        _, err = follow.communicate(timeout=30)
        assert "may read only its own jobs' output" in err
        assert "lost the engine" not in err  # (the engine answered: it cut the stream off)
        assert events.poll() is None  # (nobody is still let in: its events go on)
        shared.allow("allowed_uids = [12345]")  # nobody out: its events stream ends
        assert events.communicate(timeout=30)[0] == "ended\n"
    finally:
        for proc in (events, follow):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # At most [limits] streams_per_user open per uid (429 past them).
    shared.config.write_text("[security]\nallowed_uids = [12345]\n[limits]\nstreams_per_user = 2\n")
    assert shared.call("POST", "/config/reload")["applied"] is True
    held = []
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(shared.sock))
            sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in sock.recv(4096)
            held.append(sock)
        status, body = request(shared.sock, "GET", "/v1/events")
        assert status == 429 and "has 2 streams open" in body["error"]
    finally:
        for sock in held:
            sock.close()
    shared.served.cli("cancel", job)


def test_a_stream_whose_reader_left_frees_its_slot_though_nothing_was_sent(
    served: Served,
) -> None:
    # A quiet stream noticed its reader was gone only when it next wrote: a quiet job's
    # `logs -f`, Ctrl-C'd, held a slot until the job ended, and the events stream until
    # the next event; past [limits] streams_per_user the user was locked out of both.
    served.home.mkdir(parents=True, mode=0o700)
    (served.home / "config.toml").write_text(
        "[engine]\nsample_interval = 60\n[limits]\nstreams_per_user = 2\n"
    )
    served.start()
    sock_path = served.home / "engine.sock"
    job = json.loads(served.cli("submit", "--json", "--", "sleep", "600").stdout)["id"]

    def stream(path: str) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(sock_path))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        if b"200 OK" in sock.recv(4096):
            return sock
        sock.close()
        return None

    for _ in range(3):  # (each round needs the last round's slots back)
        held = [
            wait_for(lambda path=path: stream(path), timeout=10)
            for path in (f"/v1/jobs/{job}/logs?follow=1", "/v1/events")
        ]
        assert request(sock_path, "GET", "/v1/events")[0] == 429
        for sock in held:
            sock.close()
    served.cli("cancel", str(job))


def test_one_user_stalling_its_submissions_leaves_a_quarter_of_the_slots_to_others(
    shared: SharedEngine,
) -> None:
    # 64 connections of one user, each stalled in its body, held every submission slot
    # for [limits] idle_connection (30 s): every other user's `submit` waited it out, and
    # the stalls could be renewed for ever (tester h100).
    shared.config.write_text(
        '[security]\nallowed_groups = ["nogroup"]\n[limits]\nsubmissions_in_flight = 4\n'
        "idle_connection = 120\n"
    )
    assert shared.call("POST", "/config/reload")["applied"] is True
    stalled = []
    try:
        for _ in range(3):  # (three quarters of 4: all this user may hold)
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(shared.sock))
            sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            stalled.append(sock)
        status, body = 0, {}

        def refused() -> bool:
            nonlocal status, body
            status, body = request(shared.sock, "POST", "/v1/jobs", {"command": ["true"]})
            return status == 429

        wait_for(refused)  # (once the three are being read)
        assert f"at once from uid {os.geteuid()} (" in body["error"], body
        assert ": 3 of its submissions are being handled" in body["error"]
        assert "a quarter is kept for other users" in body["error"]
        # Another user is let in at once (its CLI would have said it retries).
        job = shared.nobody("submit", "--", "true")
        assert job.returncode == 0, job.stderr
        assert "too many submissions" not in job.stderr
        assert shared.served.cli("wait", job.stdout.strip()).returncode == 0
    finally:
        for sock in stalled:
            sock.close()
    # Its slots come back as its stalled clients go.
    wait_for(lambda: request(shared.sock, "POST", "/v1/jobs", {"command": ["true"]})[0] == 201)


def test_allowed_groups_are_the_users_groups_not_its_processes(shared: SharedEngine) -> None:
    # The groups were read from /proc/PID/status of the pid SO_PEERCRED recorded at
    # connect time: a connection handed to a child, its parent gone and the pid reused by
    # a process of an allowed group's member, let an unlisted user in (tester h155). Now
    # the uid's groups as the user database has them decide, as they do for its waiting
    # jobs: a process of nobody's given group adm by setpriv, which the database does not
    # list nobody in, is not let in.
    shared.allow('allowed_groups = ["adm"]')
    argv = list(_NOBODY_CLIENT)
    argv[argv.index("--clear-groups")] = "--groups=adm"
    out = subprocess.run(
        [*argv, "jobs"],
        env=_nobody_env(shared.served.env),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=_NOBODY_CWD[0],
    )
    assert out.returncode == 1 and "uid 65534 (nobody) may not use this engine" in out.stderr
    shared.allow('allowed_groups = ["nogroup"]')  # (nobody's own group in the database)
    assert shared.nobody("jobs").returncode == 0


def test_a_stream_of_a_user_taken_out_of_an_allowed_group_is_cut_within_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # New requests were refused within the groups' cache, but the event and log streams
    # it had open went on for as long as it liked (tester h179): a stream's reader is
    # asked again once the groups read are GROUPS_CACHE_S old, not only at a reload.
    # (The user database is faked at its boundary, os.getgrouplist; the request at
    # aiohttp's, its peer's credentials.)
    import grp
    import pwd
    from types import SimpleNamespace

    from gpulayer_tui.engine import access, api
    from gpulayer_tui.engine.config import parse_config_text

    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(0).gr_name
    member = {"now": True}

    def groups(name: str, gid: int) -> list[int]:
        return [gid, 0] if name == "nobody" and member["now"] else [gid]

    monkeypatch.setattr(access.os, "getgrouplist", groups)
    monkeypatch.setattr(access, "GROUPS_CACHE_S", 0.0)
    monkeypatch.setattr(api, "GROUPS_CACHE_S", 0.0)
    monkeypatch.setattr(api, "peer_creds", lambda request: (1, nobody.pw_uid, nobody.pw_gid))
    access._groups_read.clear()
    config = parse_config_text(f'[security]\nallowed_groups = ["{group}"]\n')
    engine = SimpleNamespace(config=config)
    request: Any = SimpleNamespace(app={api.ENGINE_KEY: engine})
    allowed = api._StillAllowed(request)
    assert allowed() and allowed()
    member["now"] = False  # (taken out of the group; the config unchanged)
    assert not allowed() and allowed.lost
    member["now"] = True
    assert not allowed()  # (once cut, cut: it asks again, and is let in or told why)
    access._groups_read.clear()


def test_a_user_taken_out_of_an_allowed_group_is_held_within_the_groups_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The answer for a waiting job's owner was kept for the config's life: a user taken
    # out of an allowed group had its waiting job started 30 s later (tester h161). It
    # is asked again once the groups read are GROUPS_CACHE_S old. (The user database is
    # faked at its boundary, os.getgrouplist: this test changes no real group.)
    import grp
    import pwd

    from gpulayer_tui.engine import access
    from gpulayer_tui.engine.config import parse_config_text

    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(0).gr_name  # (root's group: nobody is not in it)
    member = {"now": True}

    def groups(name: str, gid: int) -> list[int]:
        return [gid, 0] if name == "nobody" and member["now"] else [gid]

    monkeypatch.setattr(access.os, "getgrouplist", groups)
    monkeypatch.setattr(access, "GROUPS_CACHE_S", 0.0)
    access._groups_read.clear()
    security = parse_config_text(f'[security]\nallowed_groups = ["{group}"]\n').security
    owners = access.OwnerAccess(security)
    assert owners.refusal(nobody.pw_uid) is None
    member["now"] = False  # (taken out of the group)
    assert "may no longer use this engine" in str(owners.refusal(nobody.pw_uid))
    access._groups_read.clear()
