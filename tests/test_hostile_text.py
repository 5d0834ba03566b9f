"""Hostile text: every string a user supplied is shown as text (never markup, never a
terminal escape) by every screen and every CLI table, and nothing a user types ends the
app or the engine."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from textual.widgets import Input

from gpulayer_tui.cli.format import format_job, format_jobs, printable, table
from gpulayer_tui.engine.errors import SpecError

from .conftest import EngineFactory, Served
from .ui_support import until

# Names pass the name rule (no control characters); commands, shell lines and the job's
# output may hold anything but NUL.
NAMES = ["[/bold]x", "[red]r[/red]", "[@click=app.quit]q[/]", "[b]unclosed", "\\[x]", "é[/]"]
COMMANDS: list[list[str]] = [
    ["sh", "-c", "printf '[/bold]\\033[2J\\033]0;pwned\\007 [link=x]y[/link]\\n'; exit 3"],
    ["sh", "-c", "echo '[/]'", "\x1b[31m", "\u202e"],
]


async def test_hostile_names_commands_and_output_never_end_the_tui(embedded_app: Any) -> None:
    app = await embedded_app("2xA100-80GB")
    ids = []
    for n, name in enumerate(NAMES):
        command = COMMANDS[n % len(COMMANDS)]
        job = await app.backend.submit({"name": name, "command": command, "gpus": n % 2})
        ids.append(job["id"])
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("2")
        await until(pilot, lambda: app.screen.query_one("#jobs-table").row_count == len(NAMES))
        for job_id in ids:
            app.open_job(job_id)
            await until(pilot, lambda: getattr(app.screen, "job", None) is not None, "detail")
            await pilot.pause(0.2)  # its log and timeline arrive
            assert app.is_running
            await pilot.press("escape")
            await pilot.pause()
        # The form: a hostile domain name comes back in the engine's refusal.
        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        form.query_one("#command", Input).value = "true"
        form.query_one("#domain", Input).value = "[/bold][@click=app.quit]"
        await pilot.press("ctrl+s")
        await until(
            pilot,
            lambda: "[/bold][@click=app.quit]" in form.form_message,  # type: ignore[attr-defined]
            "the engine's refusal, quoting the name as written",
        )
        assert app.is_running
        await pilot.press("escape", "escape")  # (typed in: the first esc asks)
        await pilot.press("1")
        await pilot.pause(0.2)
        assert app.is_running
        # What the table shows is the name itself.
        await pilot.press("2")
        await pilot.pause()
        table = app.screen.query_one("#jobs-table")
        shown = {str(table.get_row_at(i)[1]) for i in range(table.row_count)}
        assert set(NAMES) <= shown


@pytest.mark.parametrize(
    # (unassigned and noncharacters too: a terminal may give them a column not counted)
    "text",
    ["\x1b[2J", "a\x07b", "\x9b31m", "tab\there", "\u202e", "\u0378", "a\ufffe", "ok"],
)
def test_cli_tables_escape_control_characters(text: str) -> None:
    shown = printable(text)
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in shown)
    assert shown == text if text == "ok" else shown != text
    cell = table(["NAME"], [[text]])
    assert printable(text) in cell and ("\x1b" not in cell) and ("\x07" not in cell)


def test_cli_job_views_escape_what_users_wrote() -> None:
    job: dict[str, Any] = {
        "id": 1,
        "name": "n",
        "kind": "command",
        "status": "failed",
        "termination_reason": "exit_code",
        "exit_code": 3,
        "message": "exited with code 3 \x1b[2J",
        "domains": ["cpu"],
        "gpus": [],
        "pid": 5,
        "started_at": 1.0,
        "ended_at": 2.0,
        "spec": {"command": ["sh", "-c", "\x1b]0;pwned\x07"], "cwd": "/tmp/\x1b[31m"},
        "priority": 0,
        "created_at": 1.0,
        "queued_at": None,
        "owner_uid": 0,
        "kill_at": None,
        "stop_reason": None,
    }
    out = format_job(job, [], 3.0) + format_jobs([job], 3.0)
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;pwned\\x07" in out


def test_a_commands_words_keep_their_boundaries_and_escapes_in_status_and_detail() -> None:
    # `submit -- echo 'a b' c` read as "echo a b c" (four words); the TUI's detail wrote
    # a tab or newline in a word as itself (a newline started a new line).
    from gpulayer_tui.formatting import argv_text
    from gpulayer_tui.screens.job_detail import job_fields

    assert argv_text(["echo", "a b", "c"]) == "echo 'a b' c"
    assert argv_text(["sh", "-c", "it's"]) == "sh -c 'it'\"'\"'s'"
    assert argv_text(["python3", "train.py", "--lr=0.1", "名前", ""]) == (
        "python3 train.py --lr=0.1 名前 ''"
    )
    job: dict[str, Any] = {
        "id": 1,
        "name": "n",
        "kind": "command",
        "status": "running",
        "termination_reason": None,
        "exit_code": None,
        "message": "",
        "domains": ["cpu"],
        "gpus": [],
        "pid": 5,
        "started_at": 1.0,
        "ended_at": None,
        "spec": {"command": ["printf", "a\tb\nc", "x y"], "cwd": "/tmp/a\nb"},
        "priority": 0,
        "created_at": 1.0,
        "queued_at": None,
        "owner_uid": 0,
        "kill_at": None,
        "stop_reason": None,
    }
    assert "  command     printf 'a\\x09b\\x0ac' 'x y'" in format_job(job, [], 3.0)
    shell_job = {**job, "spec": {"shell": "printf '%s' a\\b"}}
    # (repr() doubled the backslash and wrote \' inside single quotes; the line is shown as
    # typed, not as `sh -c '...'`, which quoted it past reading, and said a shell ran a line
    # that runs without one: tester h69)
    assert "  command     printf '%s' a\\b  (shell line)\n" in format_job(shell_job, [], 3.0)
    fields = job_fields(job, 3.0)  # type: ignore[arg-type]
    assert fields["command"].plain == "printf 'a\\x09b\\x0ac' 'x y'"
    assert fields["cwd"].plain == "/tmp/a\\x0ab"
    # A shell line is quoted the same way: repr() doubled its backslashes, so the text
    # \x1b read as an escaped control character.
    job["spec"] = {"shell": "echo \\x1b[31m it's"}
    shown = job_fields(job, 3.0)["command"].plain  # type: ignore[arg-type]
    assert shown == "echo \\x1b[31m it's  (shell line)"


def test_the_cli_json_keeps_the_exact_text(served: Served) -> None:
    served.start("--simulate", "1xA100-80GB")
    done = served.cli("submit", "--name", "[/bold]x", "--json", "--", "sh", "-c", "echo \x1b[31m")
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["name"] == "[/bold]x" and job["spec"]["command"][2] == "echo \x1b[31m"
    listed = served.cli("jobs")
    assert "[/bold]x" in listed.stdout and "\x1b" not in listed.stdout


def test_the_jobs_table_keeps_each_reason_whole_and_fits_a_terminal_only() -> None:
    from gpulayer_tui.cli.format import fit

    reason = "waiting for job 12 and job 13 to complete; " * 4
    row: dict[str, Any] = {
        "id": 7,
        "name": "n",
        "kind": "command",
        "status": "queued",
        "termination_reason": None,
        "exit_code": None,
        "message": reason.strip(),
        "domains": [],
        "gpus": [],
        "pid": None,
        "started_at": None,
        "ended_at": None,
        "spec": {},
    }
    text = format_jobs([row], 0.0)  # type: ignore[list-item]
    assert reason.strip() in text  # piped: whole (it was cut at 70 characters)
    cut = fit(text, 60)
    assert all(len(line) <= 60 for line in cut.splitlines()) and cut.splitlines()[1].endswith("…")
    assert fit(text, None) == text


@pytest.mark.parametrize(
    "name",
    [
        "日本語の名前テスト",
        "e\u0301\u0301\u0301x",
        "🚀 launch",
        "名" * 60,
        "plain",
        # (an emoji sequence is drawn as one wide character: counted as six, the row's
        # columns started four left of the header's: tester h190)
        "\U0001f468\u200d\U0001f469\u200d\U0001f467fam",
        "👍🏽 ok",
        "🇫🇷 flag",
        "\u1100\u1161\u11a8 jamo",
    ],
)
def test_the_jobs_table_lines_up_by_terminal_columns(name: str) -> None:
    # Widths were counted in characters: a wide (CJK, emoji) or combining name pushed its
    # row's columns out of line, and a cut "to the terminal" wrapped all the same.
    from gpulayer_tui.cells import cell_width
    from gpulayer_tui.cli.format import fit

    def row(job_id: int, job_name: str) -> dict[str, Any]:
        return {
            "id": job_id,
            "name": job_name,
            "kind": "command",
            "status": "completed",
            "termination_reason": None,
            "exit_code": 0,
            "message": "done",
            "domains": [],
            "gpus": [],
            "pid": None,
            "started_at": None,
            "ended_at": None,
            "spec": {},
        }

    text = format_jobs([row(1, name), row(2, "x")], 0.0)  # type: ignore[list-item]
    header, first, second = text.splitlines()
    # every column starts at the same terminal column on every line
    start = cell_width(header[: header.index("STATUS")])
    assert cell_width(first[: first.index("completed")]) == start
    assert cell_width(second[: second.index("completed")]) == start
    assert cell_width(first.split("  ")[1].strip()) <= 24  # the NAME column's cut
    for width in (20, 37, 60):
        assert all(cell_width(line) <= width for line in fit(text, width).splitlines())


def test_cell_width_counts_terminal_columns() -> None:
    from gpulayer_tui.cells import cell_width, cut_to_width

    assert cell_width("abc") == 3
    assert cell_width("日本") == 4
    assert cell_width("e\u0301x") == 2
    assert cell_width("a\u200bb") == 2  # zero-width space
    assert cut_to_width("日本語", 4) == "日…"
    assert cut_to_width("日本語", 6) == "日本語"
    assert cut_to_width("abcdef", 4) == "abc…"
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    assert cut_to_width(family * 3, 5) == family * 2 + "…"  # (never inside a sequence)


@pytest.mark.parametrize(
    "text",
    ["\U0001f468\u200d\U0001f469\u200d\U0001f467fam", "👍🏽x", "🇫🇷", "1\ufe0f\u20e3", "각", "日本"],
)
def test_the_cli_counts_columns_as_the_tui_draws_them(text: str) -> None:
    # The CLI's tables and the TUI's (Rich's) disagreed on emoji sequences: the same name
    # lined up in one and not in the other (tester h190).
    from rich.cells import cell_len

    from gpulayer_tui.cells import cell_width

    assert cell_width(text) == cell_len(text)


def _drawn(app: Any) -> str:
    """Every character the screen would send now, escape sequences of its own aside."""
    import io

    from rich.console import Console

    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    console = Console(width=app.size[0], file=io.StringIO(), force_terminal=True)
    return "".join(seg.text for seg in console.render(update) if not seg.control)


# What a process, a user or a job's output may hold that a terminal acts on: OSC (a window
# title), CSI (clear the screen), the one-character C1 CSI, a bidi override, a separator.
HAZARDS = ["\x1b]0;pwned\x07", "\x1b[2J", "\x9b31m", "\u202eRTL", "\u2028LS"]


async def test_escapes_users_and_processes_wrote_never_reach_the_terminal(
    embedded_app: Any, tmp_path: Any
) -> None:
    import subprocess
    import sys

    from gpulayer_tui.engine.simulate import SimLedger
    from gpulayer_tui.fields import unsafe_characters
    from gpulayer_tui.screens.adopt import AdoptScreen
    from gpulayer_tui.screens.dialogs import SignalScreen

    app = await embedded_app("2xA100-80GB")
    engine = app.backend.engine
    # (and a line break: a table cell showed what came before it alone: tester h190)
    argv = [sys.executable, "-c", "import time; time.sleep(600)", "a\nHID", *HAZARDS]
    stray = subprocess.Popen(argv)  # noqa: ASYNC220
    try:
        SimLedger(engine.paths.state_dir).hold(1, stray.pid, 20.0)
        odd_dir = tmp_path / "d\x1b[31mRED"
        odd_dir.mkdir()
        specs: list[dict[str, Any]] = [
            {"name": "argv", "command": ["sh", "-c", "sleep 60", *HAZARDS], "gpus": 1},
            {"name": "cwd", "command": ["true"], "cwd": str(odd_dir)},
            # (it cannot start: its message quotes the program's name)
            {"name": "program", "command": [str(tmp_path / "no\x1b[2Jsuch")]},
            {"name": "output", "shell": "printf '\\302\\233 31m \\342\\200\\256 rtl \\033[2J\\n'"},
        ]
        ids = [(await app.backend.submit(spec))["id"] for spec in specs]
        await engine.sampler.sample_once()
        seen: dict[str, list[str]] = {}

        def look(where: str) -> None:
            unsafe = unsafe_characters(_drawn(app).replace("\n", ""))
            if unsafe:
                seen[where] = sorted(set(unsafe))

        async with app.run_test(size=(200, 50)) as pilot:
            table = app.screen.query_one("ProcessTable")
            await until(pilot, lambda: any(row.pid == stray.pid for row in table.processes))
            look("dashboard")
            assert "a\\x0aHID \\x1b]0;pwned" in _drawn(app)
            await pilot.press("T")  # the process tree
            await pilot.pause(0.2)
            look("tree")
            assert "a\\x0aHID \\x1b]0;pwned" in _drawn(app)
            await pilot.press("T", "2")
            await until(pilot, lambda: app.screen.query_one("#jobs-table").row_count == len(ids))
            look("jobs")
            for job_id in ids:
                app.open_job(job_id)
                await until(pilot, lambda: getattr(app.screen, "job", None) is not None)
                await pilot.pause(0.3)  # its output arrives
                look(f"job {job_id}")
                await pilot.press("escape")
            await pilot.press("3")
            await until(pilot, lambda: stray.pid in app.screen.query_one("StrayTable").rows_by_pid)
            look("strays")
            assert "a\\x0aHID \\x1b]0;pwned\\x07 \\x1b[2J \\x9b31m \\u202eRTL" in _drawn(app)
            await pilot.press("a")
            await until(pilot, lambda: isinstance(app.screen, AdoptScreen))
            look("adopt")
            await pilot.press("escape")
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, SignalScreen))
            look("signal")
            await pilot.press("escape")
            app.notify("quoted: \x1b[2J\u202e", title="job \x9b1")
            await pilot.pause(0.1)
            look("notification")
            assert app.is_running
        assert seen == {}
    finally:
        stray.kill()
        stray.wait()


@pytest.mark.parametrize(
    "blank",
    # (joiners and combining marks alone, too: names shown empty: tester h163)
    [
        *("   ", "\u3164", "\u115f\u1160", " \u034f ", "\u2800", "\uffa0", "\u200d"),
        *("\u200c\u200d", "\u0301\u0301", "\u0e31", "\u20dd", " \u0301", "\u0903"),
    ],
)
async def test_a_name_or_project_that_shows_nothing_is_refused(
    make_engine: EngineFactory, blank: str
) -> None:
    # Accepted, it made a job that looked nameless in every list, or spoofed another's.
    engine = await make_engine()
    for field in ("name", "project"):
        with pytest.raises(SpecError, match=f"{field}: needs a visible character"):
            await engine.submit({"command": ["true"], field: blank})
    running = await engine.submit({"command": ["sleep", "60"]})
    waiting = await engine.submit({"command": ["true"], "depends_on": [running.id]})
    with pytest.raises(SpecError, match="name: needs a visible character"):
        await engine.edit(waiting.id, {"name": blank})
    ok = await engine.submit({"command": ["true"], "name": "a\u3164b"})  # (shows something)
    assert ok.name == "a\u3164b"
    accented = await engine.submit(
        {"command": ["true"], "name": "e\u0301t\u00e9 \U0001f468\u200d\U0001f4bb"}
    )
    assert accented.name == "e\u0301t\u00e9 \U0001f468\u200d\U0001f4bb"
    # A mark first joins the column's space before it: refused, saying which.
    with pytest.raises(SpecError, match="name: starts with U\\+0301, a mark that joins"):
        await engine.submit({"command": ["true"], "name": "\u0301abc"})
    with pytest.raises(SpecError, match="name: starts with U\\+093E, a mark that joins"):
        await engine.submit({"command": ["true"], "name": "\u093eabc"})  # (a spacing one)
    hindi = await engine.submit(
        {"command": ["true"], "name": "\u0928\u092e\u0938\u094d\u0924\u0947"}
    )
    assert hindi.name == "\u0928\u092e\u0938\u094d\u0924\u0947"
    await engine.cancel(running.id)


async def test_a_name_or_project_with_spaces_around_it_is_refused(
    make_engine: EngineFactory,
) -> None:
    # "e1 " and "e1" read alike in every list; renaming one to the other was said
    # "name e1 -> e1" (tester h117).
    engine = await make_engine()
    for field in ("name", "project"):
        for value in ("e1 ", " e1", "\u3000e1"):
            with pytest.raises(SpecError, match=f"{field}: starts or ends with a space"):
                await engine.submit({"command": ["true"], field: value})
    running = await engine.submit({"command": ["sleep", "60"], "name": "e1"})
    waiting = await engine.submit({"command": ["true"], "depends_on": [running.id]})
    with pytest.raises(SpecError, match="name: starts or ends with a space: 'e1 '"):
        await engine.edit(waiting.id, {"name": "e1 "})
    assert (await engine.submit({"command": ["true"], "name": "e 1"})).name == "e 1"
    # A presentation selector: tmux 3.3 draws ❤️ one column wide, Rich and other terminals
    # two, and every border around the name moved (tester h190). Without it, ❤ is taken.
    for field in ("name", "project"):
        with pytest.raises(SpecError, match=f"{field}: emoji presentation selectors"):
            await engine.submit({"command": ["true"], field: "ok\u2764\ufe0fheart"})
    with pytest.raises(SpecError, match=r"name: emoji presentation selectors .*U\+FE0E"):
        await engine.edit(waiting.id, {"name": "x\u2764\ufe0e"})
    assert (await engine.submit({"command": ["true"], "name": "ok\u2764heart"})).name == "ok❤heart"
    # So is a skin-tone modifier: tmux 3.3 draws 👍🏽 four columns wide, Rich two (h197).
    with pytest.raises(SpecError, match="name: emoji skin-tone modifiers are not allowed"):
        await engine.submit({"command": ["true"], "name": "\U0001f44d\U0001f3fd"})
    await engine.cancel(running.id)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("a\u202eb", "invisible formatting characters (bidi overrides, separators) or"),
        ("a\ud7ffb", "unassigned code points (no character yet) are not allowed: U+D7FF"),
        ("\u0378", "unassigned code points (no character yet) are not allowed: U+0378"),
    ],
)
def test_a_name_refused_for_its_characters_says_which_kind(name: str, said: str) -> None:
    # (U+D7FF, unassigned, was said to be an "invisible formatting character": h92)
    from gpulayer_tui.fields import FieldError, check_label

    with pytest.raises(FieldError, match=re.escape(said)):
        check_label("name", name)
