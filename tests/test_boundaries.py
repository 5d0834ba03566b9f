"""Import boundaries: the engine has no UI imports; the CLI stays lean."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import REPO

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
