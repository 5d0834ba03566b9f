"""Import boundaries: the engine has no UI imports; the CLI stays lean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

HEAVY = ("textual", "rich", "aiohttp", "pydantic", "aiosqlite", "pynvml", "prometheus_client")

ENGINE_MODULES = [
    "gpulayer_tui.engine.engine",
    "gpulayer_tui.engine.api",
    "gpulayer_tui.engine.serve",
    "gpulayer_tui.engine.nvml",
    "gpulayer_tui.engine.simulate",
]


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_engine_imports_neither_textual_nor_rich() -> None:
    loaded = _modules_after("\n".join(f"import {m}" for m in ENGINE_MODULES))
    assert "gpulayer_tui.engine.engine" in loaded  # the import really happened
    ui = sorted(m for m in loaded if m.split(".")[0] in ("textual", "rich"))
    assert ui == []


def test_cli_submit_path_does_not_load_the_engine_stack() -> None:
    loaded = _modules_after(
        "import gpulayer_tui.cli.main, gpulayer_tui.cli.commands, gpulayer_tui.client"
    )
    assert "gpulayer_tui.cli.commands" in loaded
    heavy = sorted(
        m
        for m in loaded
        if m.split(".")[0] in ("textual", "rich", "aiohttp", "pydantic", "aiosqlite", "pynvml")
        or m == "gpulayer_tui.engine.engine"
    )
    assert heavy == []


def test_a_cli_submit_loads_neither_the_engine_nor_heavy_libraries(tmp_path: Path) -> None:
    # A whole `gpulayer-tui submit -- true` (here against no engine: exit 3), not just the
    # imports at the top of the modules: lazy imports on the way count too. The CLI's
    # start-up time is most of a submit, so the budget is strict: only the state-dir helper
    # of the engine package, and no http.client (it pulls in email and ssl).
    code = (
        "import sys, json\n"
        "from gpulayer_tui.__main__ import main\n"
        "sys.argv = ['gpulayer-tui', 'submit', '--', 'true']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 3, exit.code\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = dict(os.environ, GPULAYER_HOME=str(tmp_path / "home"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO, env=env
    )
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert "gpulayer_tui.cli.commands" in loaded  # the submit path really ran
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    allowed = {"gpulayer_tui.engine.paths"}
    engine = sorted(m for m in loaded if m.startswith("gpulayer_tui.engine.") and m not in allowed)
    ui = sorted(m for m in loaded if m in ("gpulayer_tui.app", "gpulayer_tui.tui"))
    assert (heavy, engine, ui) == ([], [], [])
    assert "http.client" not in loaded
