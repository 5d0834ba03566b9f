"""Import boundaries: the engine has no UI imports; the CLI stays lean; no import circles.

Two kinds of proof. The subprocess tests import the code and look at ``sys.modules`` (what
really loads). The import-graph tests read every module's imports (at the top and inside
functions, not those under ``if TYPE_CHECKING:``) and check the contracts of the layers
(see docs/architecture.md) and that no imports run in a circle.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

PACKAGE = REPO / "gpulayer_tui"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> set[str]:
    """Modules ``path`` imports at run time (absolute names), lazy imports included."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join([*base, child.module] if child.module else base)
                else:
                    target = child.module or ""
                found.add(target)
                # "from . import procs" imports the module gpulayer_tui.engine.procs
                for alias in child.names:
                    found.add(f"{target}.{alias.name}")
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


GRAPH = _graph()


def _layer(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in GRAPH.items() if m == prefix or m.startswith(prefix + ".")}


def test_the_import_graph_was_read() -> None:
    # The checks below would pass on an empty graph; make sure it holds what we know.
    assert "gpulayer_tui.engine.jobbook" in GRAPH["gpulayer_tui.engine.engine"]
    assert "gpulayer_tui.wire" in GRAPH["gpulayer_tui.screens.submit"]
    assert "gpulayer_tui.app" in GRAPH["gpulayer_tui.tui"]  # a lazy import counts


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        # The engine is a library: no UI, no CLI, no TUI client.
        (
            "gpulayer_tui.engine",
            (
                "gpulayer_tui.app",
                "gpulayer_tui.screens",
                "gpulayer_tui.widgets",
                "gpulayer_tui.cli",
                "gpulayer_tui.tui",
                "gpulayer_tui.backend",
                "gpulayer_tui.client",
                "gpulayer_tui.view",
                "gpulayer_tui.job_store",
                "gpulayer_tui.themes",
            ),
        ),
        # Screens and widgets see the engine only through the backend and the wire contract.
        ("gpulayer_tui.screens", ("gpulayer_tui.engine", "gpulayer_tui.cli", "gpulayer_tui.app")),
        ("gpulayer_tui.widgets", ("gpulayer_tui.engine", "gpulayer_tui.cli", "gpulayer_tui.app")),
        # The wire contract stands alone (its JSON shapes and its field rules live in
        # modules of their own: shapes are loaded only when used, and the CLI's quick path
        # checks a value without the contract's enums; see wire.py).
        ("gpulayer_tui.wire", ("gpulayer_tui.",)),
        ("gpulayer_tui.shapes", ("gpulayer_tui.",)),
        ("gpulayer_tui.fields", ("gpulayer_tui.",)),
        ("gpulayer_tui.jsonlite", ("gpulayer_tui.",)),
    ],
)
def test_layer_contracts(layer: str, forbidden: tuple[str, ...]) -> None:
    modules = _layer(layer)
    assert modules, layer
    allowed = {
        ("gpulayer_tui.wire", "gpulayer_tui.shapes"),
        ("gpulayer_tui.wire", "gpulayer_tui.fields"),
    }
    broken = sorted(
        f"{module} imports {dep}"
        for module, deps in modules.items()
        for dep in deps
        if any(dep == f or dep.startswith(f if f.endswith(".") else f + ".") for f in forbidden)
        and (module, dep) not in allowed
    )
    assert broken == []


def test_the_wire_contract_is_stdlib_only() -> None:
    stdlib = sys.stdlib_module_names
    outside = sorted(
        name
        for module in ("wire.py", "shapes.py", "fields.py", "jsonlite.py")
        for name in _imports(PACKAGE / module)
        if name.split(".")[0] not in stdlib
        and name not in ("__future__", "gpulayer_tui", "gpulayer_tui.shapes")
        and not name.startswith("gpulayer_tui.fields")
    )
    assert outside == []


def test_no_import_circles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(GRAPH[node]):
            if dep not in index:
                connect(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            connect(module)
    assert circles == []


HEAVY = (
    "textual",
    "rich",
    "aiohttp",
    "pydantic",
    "aiosqlite",
    "pynvml",
    "prometheus_client",
    "textual_serve",  # (and its jinja2: `web` alone loads them)
    "jinja2",
)

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


def test_the_launcher_and_keeper_load_only_the_stdlib() -> None:
    # Their start time matters: psutil (used by engine/procs.py) stays out of them.
    loaded = _modules_after("import gpulayer_tui.engine.launcher, gpulayer_tui.engine.keeper")
    assert "gpulayer_tui.engine.keeper" in loaded
    # (Site hooks such as the editable install's finder load before any import of ours.)
    before = _modules_after("")
    foreign = sorted(
        m
        for m in loaded - before
        if m.split(".")[0] not in (*sys.stdlib_module_names, "gpulayer_tui")
    )
    assert foreign == []


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


@pytest.mark.parametrize(
    "words",
    [["--gpus", "1", "--", "true"], ["--gpus", "1", "--file", "JOBS"]],
    ids=["command", "file"],
)
def test_a_cli_submit_loads_neither_the_engine_nor_heavy_libraries(
    tmp_path: Path, words: list[str]
) -> None:
    # A whole `gpulayer-tui submit -- true` (here against no engine: exit 3), not just the
    # imports at the top of the modules: lazy imports on the way count too. The CLI's
    # start-up time is most of a submit, so the budget is strict: only the state-dir helper
    # of the engine package, and no http.client (it pulls in email and ssl). A batch from
    # a file (`--file`) too: scripts queue many jobs that way.
    lines = tmp_path / "jobs.txt"
    lines.write_text("true\necho 'a b' > out.txt\n")
    argv = ["gpulayer-tui", "submit", *(str(lines) if w == "JOBS" else w for w in words)]
    code = (
        "import sys\n"
        "from gpulayer_tui.__main__ import main\n"
        f"sys.argv = {argv!r}\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 3, exit.code\n"
        "loaded = sorted(sys.modules)\n"
        "import json\n"
        "print(json.dumps(loaded))\n"
    )
    env = dict(os.environ, GPULAYER_HOME=str(tmp_path / "home"))
    # -S: no site-packages, so an editable install's import finder (which loads pathlib
    # and more itself) does not hide what the CLI loads; the package comes from REPO.
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=env,
    )
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert "gpulayer_tui.cli.commands" in loaded  # the submit path really ran
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    allowed = {"gpulayer_tui.engine.paths"}
    engine = sorted(m for m in loaded if m.startswith("gpulayer_tui.engine.") and m not in allowed)
    ui = sorted(m for m in loaded if m in ("gpulayer_tui.app", "gpulayer_tui.tui"))
    assert (heavy, engine, ui) == ([], [], [])
    # Each of these is a few ms of every call (issue 15): the common submit is read without
    # argparse (cli/quick.py), its JSON through _json (jsonlite.py), its values checked by
    # the field rules without the wire contract's enums.
    slow = {
        "http.client",
        "pathlib",
        "typing",
        "gpulayer_tui.wire",
        "urllib.parse",
        "argparse",
        "re",
        "json",
        "enum",
        "gettext",
        "locale",
    }
    assert slow & loaded == set()


def test_each_subcommand_built_alone_is_the_same_as_in_the_whole_grammar() -> None:
    # The CLI builds only the parser of the subcommand it runs (a CLI start cost): each must
    # still be exactly the one the full grammar (--help, the TUI) knows.
    from gpulayer_tui.cli.grammar import SUBCOMMANDS, build_parser, subcommand_of

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(action.choices)

    full = subparsers(build_parser())
    assert set(full) == SUBCOMMANDS
    for name in SUBCOMMANDS:
        alone = subparsers(build_parser(only=name))[name]
        assert [a.option_strings or a.dest for a in alone._actions] == [
            a.option_strings or a.dest for a in full[name]._actions
        ], name
    assert subcommand_of(["--config", "c.toml", "jobs", "--limit", "5"]) == "jobs"
    assert subcommand_of(["--simulate", "jobs"]) is None  # "jobs" is --simulate's value
    assert subcommand_of(["submit", "--", "status"]) == "submit"
    assert subcommand_of(["--serve"]) is None


def test_the_tui_loads_its_themes_from_a_source_checkout_on_pythonpath(tmp_path: Path) -> None:
    # An install maps themes/ into the package; a checkout on PYTHONPATH has no such map,
    # and the TUI ended in "No module named 'gpulayer_tui.themes'" (tester h75).
    import shutil

    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "gpulayer_tui", checkout / "gpulayer_tui", ignore=ignore)
    shutil.copytree(REPO / "themes", checkout / "themes", ignore=ignore)
    script = (
        "import sys\n"
        # (no finder of an editable install: only what PYTHONPATH holds)
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()\n"
        "    and 'editable' not in type(f).__module__]\n"
        f"sys.path.insert(0, {str(checkout)!r})\n"
        "import gpulayer_tui.app as app\n"
        "print(app.__file__)\n"
        "print(app.themes.__file__)\n"
        "print(app.themes.CSS_PATH)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    app_file, themes_file, css = done.stdout.split()
    assert app_file.startswith(str(checkout)) and themes_file.startswith(str(checkout / "themes"))
    assert Path(css).is_file()
