"""The engine refuses a state dir another user could change, and never writes through a
link someone planted there (issue 14: "state dir followed blindly")."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.engine.statedir import UnsafeStateDir, check_state_dir

from .conftest import REPO, wait_for

NOBODY = pwd.getpwnam("nobody").pw_uid


def as_root(test: Any) -> Any:
    """Root only: it gives a directory to nobody."""
    skip = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a dir to nobody")
    return pytest.mark.needs_root(skip(test))


def _serve(home: Path) -> subprocess.CompletedProcess[str]:
    """``--serve`` on ``home``: here it must refuse at once."""
    return subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "--serve", "--simulate", "1xA100-80GB"],
        env=dict(os.environ, GPULAYER_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )


def _bait(tmp_path: Path) -> Path:
    """A file only its owner may write: what a planted link would point at."""
    bait = tmp_path / "only-root.txt"
    bait.write_text("precious\n")
    bait.chmod(0o600)
    return bait


@as_root
def test_a_state_dir_another_user_owns_is_refused_and_its_links_never_followed(
    tmp_path: Path,
) -> None:
    bait, other = _bait(tmp_path), _bait(tmp_path / ".." / tmp_path.name)
    home = tmp_path / "x"
    (home / "jobs").mkdir(parents=True)
    (home / "engine.lock").symlink_to(bait)
    (home / "jobs" / "1.log").symlink_to(other)
    for path in (home, home / "jobs"):
        os.chown(path, NOBODY, -1)
        path.chmod(0o777)
    done = _serve(home)
    assert done.returncode == 2, done.stderr
    assert f"{home} belongs to nobody, not to root" in done.stderr
    assert bait.read_text() == "precious\n"
    assert sorted(p.name for p in home.iterdir()) == ["engine.lock", "jobs"]  # nothing new


def test_a_state_dir_others_may_write_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    done = _serve(home)
    assert done.returncode == 2
    assert f"{home} is writable by others (mode 0777)" in done.stderr
    assert f"chmod 700 {home}" in done.stderr
    # Nothing made there (it was left a jobs/ folder: tester h158).
    assert list(home.iterdir()) == []


def test_jobs_must_be_a_real_private_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (home / "jobs").symlink_to(elsewhere)
    with pytest.raises(UnsafeStateDir, match="jobs is a symlink"):
        check_state_dir(home, home / "jobs")
    (home / "jobs").unlink()
    (home / "jobs").mkdir(mode=0o700)
    (home / "jobs").chmod(0o770)
    with pytest.raises(UnsafeStateDir, match="jobs is writable by its group"):
        check_state_dir(home, home / "jobs")
    (home / "jobs").chmod(0o700)
    check_state_dir(home, home / "jobs")  # and now it is fine


@as_root
def test_a_directory_above_that_another_user_controls_is_refused(tmp_path: Path) -> None:
    above = tmp_path / "theirs"
    home = above / "home"
    (home / "jobs").mkdir(parents=True, mode=0o700)
    os.chown(above, NOBODY, -1)
    with pytest.raises(UnsafeStateDir, match=f"{above}, above the state dir .* belongs to nobody"):
        check_state_dir(home, home / "jobs")
    os.chown(above, 0, -1)
    above.chmod(0o777)
    with pytest.raises(UnsafeStateDir, match=r"is writable by others .*not sticky"):
        check_state_dir(home, home / "jobs")
    above.chmod(0o1777)  # sticky, like /tmp: only an entry's owner may rename it
    check_state_dir(home, home / "jobs")


def test_the_lock_is_never_taken_through_a_link(tmp_path: Path) -> None:
    bait = _bait(tmp_path)
    home = tmp_path / "home"
    (home / "jobs").mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    (home / "engine.lock").symlink_to(bait)
    done = _serve(home)
    assert done.returncode == 2, done.stderr
    assert "engine.lock" in done.stderr
    assert bait.read_text() == "precious\n"


@as_root
def test_a_state_dir_reached_through_another_users_link_is_refused_by_engine_and_cli(
    tmp_path: Path,
) -> None:
    # Tester h155: a link another user planted in /tmp, pointing at a private dir of
    # the engine's user, was taken as its state dir (realpath hid the link); swapped
    # later for a dir of theirs, `submit` sent the whole environment to their engine.
    from .conftest import Served, kill_jobs_of

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # (as /tmp)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = shared / "home"
    link.symlink_to(real)
    os.lchown(link, NOBODY, -1)
    said = f"{link}, on the way to the state dir {link}, is a symlink that belongs to nobody"
    done = _serve(link)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert list(real.iterdir()) == []  # nothing written
    # One pointing nowhere yet: said the same ("cannot be written: File exists" was).
    dangling = shared / "later"
    dangling.symlink_to(tmp_path / "nothing")
    os.lchown(dangling, NOBODY, -1)
    done = _serve(dangling)
    assert done.returncode == 2 and "later, on the way to the state dir" in done.stderr
    # An engine on the real dir: the CLI sends nothing through the link.
    server = Served(real)
    try:
        server.start("--simulate", "1xA100-80GB")
        server.env["GPULAYER_HOME"] = str(link)
        refused = server.cli("submit", "--", "true")
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("gpulayer-tui: not connecting to the engine: " + str(link))
        assert "is a symlink that belongs to nobody" in refused.stderr
        doctor = server.cli("doctor")
        assert doctor.returncode == 1 and "is a symlink that belongs to nobody" in doctor.stdout
        server.env["GPULAYER_HOME"] = str(real)
        assert server.cli("jobs", "--json").stdout.strip() in ("[]", '{"jobs": [], "more": false}')
        # A link of the engine's user's own (or root's) is theirs: it is followed.
        os.lchown(link, 0, -1)
        server.env["GPULAYER_HOME"] = str(link)
        assert server.cli("submit", "--", "true").returncode == 0
    finally:
        if server.proc is not None:
            server.proc.kill()
            server.proc.wait(timeout=10)
        kill_jobs_of(real)


def test_a_config_file_others_may_write_is_refused_at_start_and_on_reload(tmp_path: Path) -> None:
    # Tester h155: a --config file another user could write was taken, and reloaded live:
    # its [notify] command then ran as the engine's user.
    from .conftest import Served, kill_jobs_of
    from .raw_http import request

    home = tmp_path / "home"
    config = tmp_path / "config.toml"
    config.write_text('[notify]\ncommand = ["true"]\n')
    config.chmod(0o666)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gpulayer_tui", "--config", str(config)),
            *("--serve", "--simulate", "1xA100-80GB"),
        ],
        env=dict(os.environ, GPULAYER_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    said = f"the config file {config} is writable by others (mode 0666)"
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert f"chmod go-w {config}" in done.stderr
    config.chmod(0o644)
    server = Served(home)
    try:
        server.start("--simulate", "1xA100-80GB", "--config", str(config))
        # Made writable by others and changed: not applied; the running config stays.
        config.chmod(0o666)
        config.write_text('[notify]\ncommand = ["false"]\n')
        status, answer = request(home / "engine.sock", "POST", "/v1/config/reload")
        assert status == 400 and answer["applied"] is False, answer
        assert said in answer["error"]
        doctor = server.cli("--config", str(config), "doctor")
        assert doctor.returncode == 1 and said in doctor.stdout, doctor.stdout
        # Its mode fixed as the refusal says: the watcher applies it (a chmod changes no
        # byte, and it was taken for a touch: "a reload is due", for ever: tester h193).
        config.chmod(0o644)
        applied = f"{config} is valid and applied"
        wait_for(
            lambda: applied in server.cli("--config", str(config), "doctor").stdout, timeout=20
        )
    finally:
        if server.proc is not None:
            server.proc.kill()
            server.proc.wait(timeout=10)
        kill_jobs_of(home)


@as_root
def test_a_config_file_another_user_owns_or_links_is_refused(tmp_path: Path) -> None:
    from gpulayer_tui.engine.statedir import config_file_problem

    config = tmp_path / "config.toml"
    config.write_text("")
    os.chown(config, NOBODY, -1)
    assert f"the config file {config} belongs to nobody, not to root" in str(
        config_file_problem(config)
    )
    os.chown(config, 0, -1)
    assert config_file_problem(config) is None
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    link = shared / "config.toml"
    link.symlink_to(config)
    os.lchown(link, NOBODY, -1)
    assert "is a symlink that belongs to nobody" in str(config_file_problem(link))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.toml").write_text("")
    os.chown(theirs, NOBODY, -1)
    said = f"{theirs}, above the config file {theirs / 'config.toml'}, belongs to nobody"
    assert said in str(config_file_problem(theirs / "config.toml"))
    assert config_file_problem(tmp_path / "absent.toml") is None  # (load_config: defaults)


@as_root
def test_a_config_file_writable_through_an_acl_or_by_its_group_is_refused(tmp_path: Path) -> None:
    # Tester h161: an ACL entry let another user write the config (its mode's group bits
    # are the ACL's mask, and a user's own private group was excused), and a user whose
    # primary group was the owner's private group could write it too: both ran code as
    # the engine's user. No group write is excused now, and an ACL's writers are named.
    import struct

    from gpulayer_tui.engine.statedir import config_file_problem

    config = tmp_path / "config.toml"
    config.write_text("")
    entries = [(1, 6, 0xFFFFFFFF), (2, 6, NOBODY), (4, 4, 0xFFFFFFFF), (0x10, 6, 0xFFFFFFFF)]
    entries.append((0x20, 4, 0xFFFFFFFF))
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(config, "system.posix_acl_access", acl)
    except OSError as err:
        pytest.skip(f"no POSIX ACLs here: {err}")
    said = config_file_problem(config)
    assert said is not None and "is writable by nobody through its ACL" in said, said
    os.removexattr(config, "system.posix_acl_access")
    config.chmod(0o664)  # (group write: the owner's own group, root here)
    assert "is writable by its group (mode 0664)" in str(config_file_problem(config))
    config.chmod(0o644)
    assert config_file_problem(config) is None


def test_the_config_read_is_the_file_checked(tmp_path: Path) -> None:
    # Checked by name and read by name, another user's file made at that name in a
    # sticky folder between the two was read (tester h161): the engine reads the one
    # descriptor it checked.
    from gpulayer_tui.engine.config import load_engine_config
    from gpulayer_tui.engine.statedir import read_trusted_config

    config = tmp_path / "config.toml"
    assert read_trusted_config(config) is None and load_engine_config(config) is None
    config.write_text("[engine]\nsample_interval = 7\n")
    loaded = load_engine_config(config)
    assert loaded is not None and loaded.engine.sample_interval == 7
    config.chmod(0o666)
    from gpulayer_tui.engine.config import ConfigError

    with pytest.raises(ConfigError, match="is writable by others"):
        load_engine_config(config)


def test_a_link_loop_for_a_state_dir_is_said_by_the_engine_and_every_client(
    tmp_path: Path,
) -> None:
    # doctor, web and the TUI ended in a traceback (ELOOP from the path walk), and the
    # engine called it "a symlink; the engine never writes through one" (tester h161).
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    done = _serve(loop)
    assert done.returncode == 2, done.stderr
    assert "cannot be followed: Too many levels of symbolic links" in done.stderr
    env = dict(os.environ, GPULAYER_HOME=str(loop))
    for args in (("doctor",), ("jobs",)):
        out = subprocess.run(
            [sys.executable, "-m", "gpulayer_tui", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert "Traceback" not in out.stderr, (args, out.stderr)
        assert "Too many levels of symbolic links" in out.stdout + out.stderr, (args, out)


@as_root
def test_a_client_refuses_another_users_state_dir_where_anyone_may_make_one(
    tmp_path: Path,
) -> None:
    # Tester h161: a victim's state dir in /tmp, gone after a reboot, was made by another
    # user, whose engine there got the victim's next `submit` and its environment. A
    # state dir of another user's is used only under directories root or they control.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # (as /tmp)
    theirs = shared / "gl"
    theirs.mkdir()
    os.chown(theirs, NOBODY, -1)
    env = dict(os.environ, GPULAYER_HOME=str(theirs))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpulayer_tui", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )

    refused = cli("submit", "--", "true")
    assert refused.returncode == 1, refused.stderr
    assert f"the state dir {theirs} is nobody's, in " in refused.stderr
    assert ", where any user may make a folder: an engine there may be anyone's" in (refused.stderr)
    # Under directories root owns, none writable by others: a shared engine's (no engine
    # serves it here: that is all that is said). (Not under /tmp, which anyone writes.)
    import shutil
    import tempfile

    safe = Path(tempfile.mkdtemp(prefix="gpulayer-test-", dir="/var/lib"))
    try:
        safe.chmod(0o755)
        (safe / "gl").mkdir()
        os.chown(safe / "gl", NOBODY, -1)
        env["GPULAYER_HOME"] = str(safe / "gl")
        plain = cli("jobs")
        assert plain.returncode == 3 and "no engine is serving" in plain.stderr, plain.stderr
    finally:
        shutil.rmtree(safe)


def test_an_engine_started_on_a_broken_config_link_says_the_defaults_apply(
    tmp_path: Path,
) -> None:
    # A dotfile manager's link to a file not there started an engine on the defaults (no
    # domains, limits or access lists) with no word, where doctor and the watcher warn
    # (tester h193).
    from .conftest import Served, kill_jobs_of

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").symlink_to(tmp_path / "not-there.toml")
    server = Served(home)
    try:
        server.start("--simulate", "1xA100-80GB")
        said = (
            f"gpulayer-tui: warning: the config file {home / 'config.toml'} is a symbolic "
            f"link to {tmp_path / 'not-there.toml'}, which does not exist: the defaults apply"
        )
        assert said in server.log.read_text(), server.log.read_text()
    finally:
        if server.proc is not None:
            server.proc.kill()
            server.proc.wait(timeout=10)
        kill_jobs_of(home)
