"""`gpulayer-tui install-service` (the systemd unit) and the engine's sd_notify.

Units go to temp dirs (XDG_CONFIG_HOME, --unit-dir): nothing here touches the machine's
systemd. `systemd-analyze verify` checks the generated files where it exists.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Served, wait_for

SCRIPT = Path(sys.executable).parent / "gpulayer-tui"  # (the installed plain script)


def run(
    *args: str, tmp_path: Path, via: list[str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), **env)
    environ.pop("GPULAYER_HOME", None)
    environ.update(env)
    return subprocess.run(
        [*(via or [sys.executable, "-m", "gpulayer_tui"]), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def unit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_the_user_unit_runs_this_installation_and_leaves_jobs_running(tmp_path: Path) -> None:
    out = run("install-service", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    target = tmp_path / "xdg" / "systemd" / "user" / "gpulayer-tui.service"
    assert f"wrote {target}" in out.stdout
    for command in (
        "systemctl --user daemon-reload",
        "systemctl --user enable --now gpulayer-tui.service",
        "loginctl enable-linger",
    ):
        assert command in out.stdout
    lines = unit_lines(target.read_text())
    assert f"ExecStart={sys.executable} -m gpulayer_tui --serve" in lines
    for line in (
        "Type=notify",
        "KillMode=process",
        "Restart=on-failure",
        "TimeoutStopSec=30",
        "WantedBy=default.target",
    ):
        assert line in lines
    assert not any(line.startswith("User=") for line in lines)
    # (the suite imports this checkout: an editable install's folder is not one the
    # interpreter searches, so the unit pins it; nothing else is pinned)
    environment = [line for line in lines if line.startswith("Environment=")]
    assert environment in ([], [f'Environment="PYTHONPATH={REPO}"'])
    assert not re.search(r"@[A-Z_]+@", target.read_text())  # every field filled in
    assert oct(target.stat().st_mode & 0o777) == "0o644"


@pytest.mark.skipif(not SCRIPT.exists(), reason=f"no installed script at {SCRIPT}")
def test_run_as_the_script_the_unit_runs_the_script(tmp_path: Path) -> None:
    out = run("install-service", "--print", tmp_path=tmp_path, via=[str(SCRIPT)])
    assert out.returncode == 0, out.stderr
    assert f"ExecStart={SCRIPT} --serve" in unit_lines(out.stdout)


def test_gpulayer_home_and_config_are_pinned_and_quoted_for_systemd(tmp_path: Path) -> None:
    home = tmp_path / 'state dir %h "x" $HOME'
    (tmp_path / "my config.toml").write_text("")  # (a --config naming no file is refused)
    out = run(
        "--config",
        str(tmp_path / "my config.toml"),
        "install-service",
        "--print",
        tmp_path=tmp_path,
        GPULAYER_HOME=str(home),
    )
    assert out.returncode == 0, out.stderr
    lines = unit_lines(out.stdout)
    escaped = str(home).replace("%", "%%").replace('"', '\\"')
    assert f'Environment="GPULAYER_HOME={escaped}"' in lines
    assert any(
        line.startswith("ExecStart=") and f'--config "{tmp_path}/my config.toml" --serve' in line
        for line in lines
    )
    assert not (tmp_path / "xdg").exists()  # --print writes nothing


def test_the_simulated_gpus_given_are_pinned(tmp_path: Path) -> None:
    # A box with no driver (a demo): the unit could not carry --simulate (tester h152).
    out = run("--simulate", "2xA100-80GB", "install-service", "--print", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    (start,) = [line for line in unit_lines(out.stdout) if line.startswith("ExecStart=")]
    assert start.endswith(" --simulate 2xA100-80GB --serve"), start
    out = run("--simulate-if-no-gpu", "1xL4-24GB", "install-service", "--print", tmp_path=tmp_path)
    (start,) = [line for line in unit_lines(out.stdout) if line.startswith("ExecStart=")]
    assert start.endswith(" --simulate-if-no-gpu 1xL4-24GB --serve"), start


def test_the_python_path_it_ran_with_is_pinned_so_the_unit_imports_this_code(
    tmp_path: Path,
) -> None:
    # An install made with `pip install --target DIR` (or a checkout) runs with PYTHONPATH
    # set; the unit ran without it and failed "No module named gpulayer_tui" (tester h62).
    copy = tmp_path / "target"
    shutil.copytree(REPO / "gpulayer_tui", copy / "gpulayer_tui")
    environ = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), PYTHONPATH="target")
    environ.pop("GPULAYER_HOME", None)
    out = subprocess.run(
        [sys.executable, "-m", "gpulayer_tui", "install-service", "--print"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    lines = unit_lines(out.stdout)
    assert f'Environment="PYTHONPATH={copy}"' in lines
    # What the unit runs, in an environment holding only what the unit sets, imports the
    # copy (not this checkout, not nothing):
    start = next(line for line in lines if line.startswith("ExecStart="))
    words = start.removeprefix("ExecStart=").split()
    assert words[-1] == "--serve" and words[-2:-1] == ["gpulayer_tui"]
    ran = subprocess.run(
        [words[0], "-c", "import gpulayer_tui; print(gpulayer_tui.__file__)"],
        env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert ran.stdout.strip() == str(copy / "gpulayer_tui" / "__init__.py"), ran.stderr


def test_a_control_character_in_a_path_is_refused(tmp_path: Path) -> None:
    out = run("install-service", tmp_path=tmp_path, GPULAYER_HOME=f"{tmp_path}/a\nExecStartPre=x")
    assert out.returncode == 2
    assert "control character" in out.stderr and "\\x0a" in out.stderr
    assert not (tmp_path / "xdg").exists()


def test_a_different_unit_is_replaced_only_with_force(tmp_path: Path) -> None:
    target = tmp_path / "xdg" / "systemd" / "user" / "gpulayer-tui.service"
    first = run("install-service", tmp_path=tmp_path)
    assert first.returncode == 0 and "systemd reads units from" not in first.stdout
    elsewhere = run("install-service", "--unit-dir", str(tmp_path / "mine"), tmp_path=tmp_path)
    assert f"note: systemd reads units from {target.parent}, not from {tmp_path / 'mine'}" in (
        elsewhere.stdout
    )  # (the steps named systemctl, which never reads that folder)
    again = run("install-service", tmp_path=tmp_path)
    assert again.returncode == 0 and "already this unit (unchanged)" in again.stdout
    target.write_text("[Service]\nExecStart=/usr/bin/mine\n")
    refused = run("install-service", tmp_path=tmp_path)
    assert refused.returncode == 1
    assert "exists and is a different unit: not replaced. --force replaces it" in refused.stderr
    assert target.read_text() == "[Service]\nExecStart=/usr/bin/mine\n"
    forced = run("install-service", "--force", tmp_path=tmp_path)
    assert forced.returncode == 0 and f"replaced {target}" in forced.stdout
    assert "Type=notify" in target.read_text()
    assert sorted(p.name for p in target.parent.iterdir()) == ["gpulayer-tui.service"]


def test_the_system_unit_runs_as_the_user_named_and_says_what_security_needs(
    tmp_path: Path,
) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    units = tmp_path / "system"
    units.mkdir()
    out = run(
        "install-service", "--system", "--user", me, "--unit-dir", str(units), tmp_path=tmp_path
    )
    assert out.returncode == 0, out.stderr
    lines = unit_lines((units / "gpulayer-tui.service").read_text())
    assert f"User={me}" in lines and "WantedBy=multi-user.target" in lines
    assert "KillMode=process" in lines and "Type=notify" in lines
    assert "systemctl enable --now gpulayer-tui.service" in out.stdout
    assert "[security] allowed_uids / allowed_groups" in out.stdout


def test_a_system_unit_for_a_user_who_cannot_use_its_state_dir_is_warned_of(
    tmp_path: Path,
) -> None:
    # `--user nobody` with GPULAYER_HOME on a state dir of someone else's (0700) wrote a
    # unit whose engine could never start, and said nothing (tester h49).
    me = pwd.getpwuid(os.getuid())
    other = next((u for u in pwd.getpwall() if u.pw_uid != me.pw_uid), None)
    if other is None:
        pytest.skip("no other user on this machine")
    units, state = tmp_path / "system", tmp_path / "state"
    units.mkdir()
    state.mkdir(mode=0o700)
    args = ("install-service", "--system", "--unit-dir", str(units))
    out = run(*args, "--user", other.pw_name, tmp_path=tmp_path, GPULAYER_HOME=str(state))
    assert out.returncode == 0, out.stderr
    assert f"warning: {state} belongs to uid {me.pw_uid}, not to {other.pw_name}" in out.stderr
    mine = run(*args, "--user", me.pw_name, "--force", tmp_path=tmp_path, GPULAYER_HOME=str(state))
    assert mine.returncode == 0 and "warning" not in mine.stderr, mine.stderr


def test_the_system_unit_refuses_clearly(tmp_path: Path) -> None:
    # Without permission to write there (sysfs refuses new files, even to root).
    out = run(
        "install-service", "--system", "--user", "root", "--unit-dir", "/sys", tmp_path=tmp_path
    )
    assert out.returncode == 1
    assert "no permission to write /sys: a system-wide unit needs root" in out.stderr
    missing = run(
        "install-service", "--system", "--user", "root", "--unit-dir", str(tmp_path / "no"),
        tmp_path=tmp_path,
    )  # fmt: skip
    assert missing.returncode == 1 and "does not exist or is not a directory" in missing.stderr
    nobody = run("install-service", "--system", "--user", "no such user", tmp_path=tmp_path)
    assert nobody.returncode == 2 and "no user named 'no such user'" in nobody.stderr
    mixed = run("install-service", "--user", "root", tmp_path=tmp_path)
    assert mixed.returncode == 2 and "--user applies to --system" in mixed.stderr
    if os.getuid() == 0:  # root, with no --user: jobs would run as root unasked
        as_root = run("install-service", "--system", "--print", tmp_path=tmp_path, SUDO_USER="")
        assert as_root.returncode == 2 and "give --user NAME" in as_root.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("system", [False, True])
def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path, system: bool) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    args = ["--system", "--user", me] if system else []
    out = run("install-service", "--print", *args, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    unit = tmp_path / "gpulayer-tui.service"
    unit.write_text(out.stdout)
    # (system mode: a user-mode verify needs a running user manager)
    check = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr
    assert str(unit) not in check.stderr, check.stderr  # no warning about our file


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    # A path short enough for sun_path (tmp_path can be too long).
    folder = tempfile.mkdtemp(prefix="gpl-notify-", dir="/tmp")
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    yield sock, path
    sock.close()
    shutil.rmtree(folder)


def receive(sock: socket.socket, timeout: float) -> str:
    sock.settimeout(timeout)
    return sock.recv(4096).decode()


@pytest.mark.parametrize("abstract", [False, True])
def test_serve_tells_systemd_ready_then_stopping(
    served: Served, notify_socket: tuple[socket.socket, str], abstract: bool
) -> None:
    sock, path = notify_socket
    address = path
    if abstract:
        sock.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = f"gpulayer-test-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind("\0" + name)
        address = "@" + name
    served.env["NOTIFY_SOCKET"] = address
    proc = served.start("--simulate", "1xA100-80GB", wait=False)
    ready = receive(sock, timeout=30)
    assert ready.splitlines()[0] == "READY=1"
    assert any(line.startswith("STATUS=serving on ") for line in ready.splitlines())
    # Ready means the socket answers: at once, with no waiting.
    assert served.cli("gpus").returncode == 0
    # Jobs do not inherit the notification socket from the engine (the launcher takes the
    # engine's environment; --no-inherit-env leaves out the submitting shell's).
    job = served.cli(
        "submit", "--no-inherit-env", "--shell", "--", "echo notify=${NOTIFY_SOCKET-unset}"
    )
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip()
    assert served.cli("wait", job_id).returncode == 0
    assert served.cli("logs", job_id).stdout.strip() == "notify=unset"
    proc.send_signal(signal.SIGTERM)
    stopping = receive(sock, timeout=30)
    assert stopping.splitlines()[0] == "STOPPING=1"
    assert proc.wait(timeout=30) == 0
    sock.close()


def test_serve_without_notify_socket_sends_nothing(served: Served) -> None:
    served.env.pop("NOTIFY_SOCKET", None)
    served.start("--simulate", "1xA100-80GB")
    wait_for(lambda: served.cli("gpus").returncode == 0)
    assert "serving" in served.stop()


def test_empty_folders_and_hosts_are_refused(tmp_path: Path) -> None:
    # --unit-dir "$UNSET" wrote into the default folder; web --host "$UNSET" listened on
    # every interface and printed "http://:PORT/".
    empty = run("install-service", "--unit-dir", "", tmp_path=tmp_path)
    assert empty.returncode == 2 and "--unit-dir: needs a folder (it was empty)" in empty.stderr
    assert not (tmp_path / "xdg").exists()
    host = run("web", "--host", " ", tmp_path=tmp_path)
    assert host.returncode == 2 and "--host: needs an address (it was empty)" in host.stderr
    # An IPv6 address as a URL writes it: "cannot listen on [::1]:0: Name or service not known".
    from gpulayer_tui.cli.grammar import build_parser

    assert build_parser(only="web").parse_args(["web", "--host", "[::1]"]).host == "::1"
    a_file = tmp_path / "file"
    a_file.write_text("")
    into = run("install-service", "--unit-dir", str(a_file), tmp_path=tmp_path)
    assert into.returncode == 1 and f"{a_file} is not a directory" in into.stderr


@pytest.mark.parametrize(
    "args",
    [("completion", "bash"), ("doctor",), ("install-service", "--print"), ("install-service",)],
)
def test_a_closed_stdout_is_no_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    # `| head -0`, `| :`: a traceback (BrokenPipeError), and install-service said it could
    # not write the unit it had written.
    read, write = os.pipe()
    os.close(read)  # (the reader is gone before anything is written)
    environ = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), GPULAYER_HOME=str(tmp_path))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpulayer_tui", *args],
            env=environ, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    if args == ("install-service",):
        assert (tmp_path / "xdg" / "systemd" / "user" / "gpulayer-tui.service").exists()


@pytest.mark.parametrize(
    "args", [("completion", "bash"), ("doctor",), ("install-service", "--print")]
)
def test_a_full_or_closed_stdout_is_said_without_a_traceback(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    environ = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), GPULAYER_HOME=str(tmp_path))
    command = [sys.executable, "-m", "gpulayer_tui", *args]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            command, env=environ, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.endswith(
        "gpulayer-tui: cannot write the output: No space left on device (the command ran; only "
        "its output was lost)\n"
    )
    closed = subprocess.run(  # (`>&-`: no stdout at all)
        command, env=environ, stdout=None, stderr=subprocess.PIPE, text=True, timeout=60,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert "Traceback" not in closed.stderr, closed.stderr
