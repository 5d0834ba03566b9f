"""Shared fixtures: a temp state dir per test, in-process engines, a real ``--serve``."""

from __future__ import annotations

import asyncio
import fcntl
import inspect
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_textual_snapshot

from gpulayer_tui.engine.config import Config, parse_config
from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.gpus import GpuProbe
from gpulayer_tui.engine.paths import Paths, resolve_paths

pytest_plugins = ["tests.fake_nvml"]

REPO = Path(__file__).resolve().parent.parent


def _snapshot_dirname(cls: type, *, test_location: Any) -> str:
    # SVG snapshots live in the top-level snapshots/ folder, one subfolder per test module.
    return str(REPO / "snapshots" / test_location.basename)


pytest_textual_snapshot.SVGImageExtension.dirname = classmethod(_snapshot_dirname)  # type: ignore[method-assign,assignment]


# Tests that need root (another user's process, a tmpfs, a state dir given to nobody) skip
# without it; where root is there (CI), a skip of one of them is a failure, so they cannot
# silently stop running (GPULAYER_REQUIRE_ROOT=1, set by .ci/run when it runs as root).
ROOT_FIXTURES = frozenset({"tiny_fs", "open_home"})


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: twice the cores, at least 4. The suite mostly waits (real processes,
    sockets, a Slurm controller), so one worker per core leaves the cores idle: on 2 idle
    cores the whole suite took 5:36 with 2 workers, 3:45 with 4 (one run each, before the
    Slurm tests were split), then 2:48-2:52 with 4 and 2:32-2:38 with 6 (two runs each,
    2026-12-01). Not 6: CI's fresh clone took 3:01 with 6 as with 4 (2:59-3:12; its first
    run compiles every module), and the more workers, the more load on the tests."""
    return max(4, 2 * len(os.sched_getaffinity(0)))


UI_MODES = ("embedded", "attached")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``ui_app`` test runs in one of the two ways the TUI reaches an engine, the same
    one every run (by its name), so each way runs about half of them; with
    ``GPULAYER_UI_BOTH_MODES=1`` (or marked ``both_ui_modes``: a test of their sameness),
    in both.

    Both reach the engine through the same socket client (``EmbeddedBackend`` is a
    ``SocketBackend`` that owns its engine), and the ways they differ (start, quit, hand
    over) have tests of their own; every TUI test twice was about a fifth of the suite's
    time.
    """
    if os.environ.get("GPULAYER_UI_BOTH_MODES") == "1":
        return
    import zlib

    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        mode = callspec.params.get("ui_app") if callspec is not None else None
        if mode is None or item.get_closest_marker("both_ui_modes"):
            kept.append(item)
            continue
        # (the test's name without its parameters: the same way for each of its cases)
        name = item.nodeid.split("[", 1)[0]
        chosen = UI_MODES[zlib.crc32(name.encode()) % len(UI_MODES)]
        (kept if mode == chosen else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if (
        report.skipped
        and os.environ.get("GPULAYER_REQUIRE_SLURM") == "1"
        and item.get_closest_marker("needs_slurm")
    ):
        report.outcome = "failed"
        report.longrepr = f"a Slurm test skipped where Slurm is required: {report.longrepr}"
        return
    if not (report.skipped and os.environ.get("GPULAYER_REQUIRE_ROOT") == "1"):
        return
    if item.get_closest_marker("needs_root") or ROOT_FIXTURES & set(
        getattr(item, "fixturenames", ())
    ):
        report.outcome = "failed"
        report.longrepr = f"a root-only test skipped where root is required: {report.longrepr}"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test runs in UTC, whatever the machine's zone: local times in cells,
    timelines and snapshots are then the same everywhere (CI also runs the snapshots with
    another TZ in the environment to prove it)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh GPULAYER_HOME for this test; whatever of it still runs afterwards is killed
    (:func:`kill_jobs_of`: a service replica restarted just as an in-process engine's test
    ended outlived it, under the launcher, and loaded the machine for the tests after)."""
    path = tmp_path / "home"
    monkeypatch.setenv("GPULAYER_HOME", str(path))
    yield path
    kill_jobs_of(path, launcher=False)


@pytest.fixture
def paths(home: Path) -> Paths:
    """Paths inside the test's GPULAYER_HOME."""
    return resolve_paths()


def make_config(**sections: Any) -> Config:
    """A config with fast sampling, plus whatever sections the test gives."""
    data: dict[str, Any] = {
        "engine": {"sample_interval": 0.2, "grace_period": 2.0, "launcher_idle": 2.0}
    }
    for key, value in sections.items():
        if key == "engine":
            data["engine"].update(value)
        else:
            data[key] = value
    return parse_config(data)


EngineFactory = Callable[..., Awaitable[Engine]]

STEADY_WRITER = [
    sys.executable,
    "-c",
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    sys.stdout.write('x' * 9999 + '\\n'); sys.stdout.flush(); time.sleep(0.01)\n",
]
"""A job writing 1 MB a second until the file named after it exists (to pass a log cap)."""


@pytest.fixture
async def make_engine(paths: Paths) -> AsyncIterator[EngineFactory]:
    """Start engines on the test's state dir; all are stopped (jobs killed) at the end."""
    engines: list[Engine] = []

    async def factory(
        simulate: str | None = "2xA100-80GB",
        probe: GpuProbe | None = None,
        config: Config | None = None,
        cpu_count: int = 2,
        service_clock: Any = None,
    ) -> Engine:
        engine = Engine(
            paths,
            probe=probe,
            simulate=None if probe is not None else simulate,
            config=config or make_config(),
            cpu_count=cpu_count,
            service_clock=service_clock,
        )
        await engine.start()
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        for pid in list(engine.executor.pids().values()):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if engine.running:
            await engine.stop()
    # And what the pids above did not name: a job decided to start as the test ended (a
    # preempted one requeued and started again) left `sleep 600` running after the
    # suite, its launcher with it.
    kill_tasks_of(paths.state_dir)


def kill_tasks_of(state_dir: Path) -> None:
    """Kill the processes of jobs started for ``state_dir`` (their GPULAYER_TASK names it)."""
    prefix = f"{state_dir}/"
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("GPULAYER_TASK", "").startswith(
                prefix
            ):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


async def eventually(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02
) -> Any:
    """Poll ``predicate`` (sync or async) until truthy; fail with a message at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {predicate}")
        await asyncio.sleep(interval)


def launcher_gone(home: Path) -> bool:
    """True once no keeper holds ``home``'s launcher lock: the launcher (which outlives its
    engine until it is idle) has exited and holds no file of the state dir open."""
    try:
        fd = os.open(home / "launcher.lock", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Synchronous :func:`eventually`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {predicate}")
        time.sleep(interval)


async def adopt(
    engine: Engine, pid: object, requester_uid: int | None = None, **fields: Any
) -> Any:
    """Adopt ``pid`` on ``engine`` with a request checked by the wire contract, as the API
    does (``fields``: start_ticks, name, vram_gb, gpu, domain)."""
    from gpulayer_tui.wire import parse_adopt_request

    return await engine.adopt(parse_adopt_request({"pid": pid, **fields}), requester_uid)


def pid_reaped(pid: int) -> bool:
    """True once ``pid`` is gone from /proc: reaped, not only a zombie. A launcher stamps
    and journals a job's end before it reaps it, so a test that compares that stamp with
    a time of its own waits for this (a zombie can be seen a moment before the stamp)."""
    return not os.path.exists(f"/proc/{pid}")


def pid_gone(pid: int) -> bool:
    """True once ``pid`` no longer exists or is a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return True
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] in (b"Z", b"X")


@pytest.fixture
def sleepers() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start real foreign processes (``sleep 600``) on demand, to hold simulated GPU memory,
    be adopted or signalled; every one is killed at the end. ``sleepers(full_path=True)``
    starts it by its full path, as a virtual environment's interpreter is."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(full_path: bool = False) -> subprocess.Popen[bytes]:
        program = shutil.which("sleep") if full_path else "sleep"
        assert program is not None
        proc = subprocess.Popen([program, "600"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def sleeper_proc(sleepers: Callable[..., subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """One foreign ``sleep 600`` (see :func:`sleepers`)."""
    return sleepers()


@pytest.fixture
def sleeper(sleeper_proc: subprocess.Popen[bytes]) -> int:
    """The pid of one foreign ``sleep 600`` (see :func:`sleepers`)."""
    return sleeper_proc.pid


async def _start_app_engine(
    paths: Paths, mode: str, simulate: str, cpu_count: int, config: Config | None
) -> tuple[Any, Engine]:
    """A real engine on simulated GPUs and the backend the app gets for it, in ``mode``."""
    from gpulayer_tui.backend import EmbeddedBackend, SocketBackend
    from gpulayer_tui.engine.api import ApiServer

    engine = Engine(paths, simulate=simulate, config=config or make_config(), cpu_count=cpu_count)
    if mode == "embedded":
        backend = EmbeddedBackend(engine)
        await backend.start()
        return backend, engine
    # Attached: the engine serves its socket like a `--serve` would, and the app is handed
    # a plain socket client that does not own it (so quitting never stops the engine).
    await engine.start()
    server = ApiServer(engine, paths.socket)
    await server.start()
    backend = SocketBackend(paths)
    backend.engine = engine  # type: ignore[attr-defined]  # for tests that poke the engine
    backend.server = server  # type: ignore[attr-defined]
    return backend, engine


async def _stop_app_engine(backend: Any, engine: Engine) -> None:
    for job_id, pid in list(engine.executor.pids().items()):
        act = engine.book.get(job_id) if isinstance(job_id, int) else None
        if act is not None and act.job.kind.value == "adopted":
            continue  # not ours to kill, and not a group leader: its test kills it
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    await asyncio.wait_for(backend.close(), timeout=30)
    server = getattr(backend, "server", None)
    if server is not None:
        await server.stop()
    if engine.running:
        await asyncio.wait_for(engine.stop(), timeout=30)


def _app_fixture(mode_of: Callable[[pytest.FixtureRequest], str]) -> Any:
    async def fixture(
        paths: Paths, request: pytest.FixtureRequest
    ) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        from gpulayer_tui.app import build_app

        started: list[tuple[Any, Engine]] = []

        async def factory(
            simulate: str = "2xA100-80GB",
            cpu_count: int = 2,
            config: Config | None = None,
            **kwargs: Any,
        ) -> Any:
            backend, engine = await _start_app_engine(
                paths, mode_of(request), simulate, cpu_count, config
            )
            started.append((backend, engine))
            return build_app(
                backend, config_file=paths.config_file, refresh_interval=0.05, **kwargs
            )

        yield factory
        for backend, engine in started:
            await _stop_app_engine(backend, engine)

    return fixture


embedded_app = pytest.fixture(_app_fixture(lambda request: "embedded"))
"""The real app over a real engine embedded in it (simulated GPUs). Usage:
``app = await embedded_app("2xA100-80GB")`` then ``async with app.run_test()``."""

ui_app = pytest.fixture(params=["embedded", "attached"])(_app_fixture(lambda r: r.param))
"""Like ``embedded_app``, in one of the ways the TUI reaches an engine: embedded, or attached
to an engine serving its socket (``app.backend.engine`` is that engine in both); which one
is fixed per test (:func:`pytest_collection_modifyitems`)."""


class Served:
    """A real ``gpulayer-tui --serve`` process and a way to run the CLI against it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = dict(os.environ, GPULAYER_HOME=str(home))
        self.proc: subprocess.Popen[str] | None = None
        self.log = home.parent / "serve.log"

    def start(self, *args: str, wait: bool = True) -> subprocess.Popen[str]:
        """Start ``--serve`` with ``args``; wait until its socket answers."""
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpulayer_tui", "--serve", *args],
                env=self.env,
                stdout=log,
                stderr=log,
                text=True,
                cwd=REPO,
            )
        if wait:
            proc = self.proc
            wait_for(
                lambda: proc.poll() is not None or self.cli("gpus").returncode == 0,
                timeout=20,
                interval=0.05,
            )
            assert proc.poll() is None, f"--serve exited: {self.log.read_text()[-2000:]}"
        return self.proc

    def stop(self) -> str:
        """SIGTERM the engine; return what it printed in this test."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        return self.log.read_text()

    def cli(
        self, *args: str, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``gpulayer-tui ARGS`` against this engine."""
        return subprocess.run(
            [sys.executable, "-m", "gpulayer_tui", *args],
            env=self.env,
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            cwd=REPO,
        )


@pytest.fixture
def served(home: Path) -> Iterator[Served]:
    """A ``--serve`` helper; the engine is stopped at the end of the test."""
    server = Served(home)
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(timeout=10)
    elif server.proc is not None and server.log.exists():
        # It ended before the test's end: its last words go to the report of a test that
        # fails (a CI run once found "no engine is serving" mid-test, and nothing more).
        tail = server.log.read_text(errors="replace")[-3000:]
        print(f"--serve exited {server.proc.returncode}; serve.log ends:\n{tail}", file=sys.stderr)
    kill_jobs_of(home)


LAUNCHER_MODULES = ("gpulayer_tui.engine.keeper", "gpulayer_tui.engine.launcher")


def kill_jobs_of(home: Path, launcher: bool = True) -> None:
    """Kill what jobs of this test's engine left running (jobs outlive their engine, and a
    test that failed half-way did not cancel them): processes whose GPULAYER_HOME is ours.
    ``launcher=False`` spares the launcher, which retires by itself once idle (killed while
    it exits, under CI's coverage run, it left a half-written coverage file)."""
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.environ().get("GPULAYER_HOME") != str(home):
                continue
            if not launcher and any(m in proc.cmdline() for m in LAUNCHER_MODULES):
                continue
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
