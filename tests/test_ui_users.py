"""The users screen (``4``): who uses the box, in fair-share order, with their limits;
over a real engine, and over the fixed data for its picture and its failures."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpulayer_tui.app import build_app
from gpulayer_tui.backend import BackendError
from gpulayer_tui.formatting import USER_HEADS
from gpulayer_tui.screens import users as users_screen
from gpulayer_tui.screens.actions import my_uid
from gpulayer_tui.screens.users import EMPTY, NOT_ANSWERED, UsersScreen
from gpulayer_tui.widgets.user_table import SHORT_HEADS, YOU, UserTable

from .ui_support import FIXED_NOW, StaticBackend, until

AppFactory = Callable[..., Awaitable[Any]]


def _cells(table: UserTable, uid: int) -> dict[str, str] | None:
    """The row of ``uid`` as plain text by column head, or None while it is not listed."""
    if uid not in table.rows_by_uid:
        return None
    row = table.get_row(str(uid))
    heads = [str(column.label) for column in table.ordered_columns]
    return dict(zip(heads, (str(cell) for cell in row), strict=True))


async def _open_users(pilot: Any, app: Any) -> UserTable:
    await pilot.press("4")
    await until(pilot, lambda: isinstance(app.screen, UsersScreen) and app.screen.is_mounted)
    return app.screen.query_one(UserTable)


@pytest.fixture
def no_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only job events (and showing the screen) ask for the users: no periodic ask."""
    monkeypatch.setattr(users_screen, "USERS_REFRESH_S", 3600.0)


async def test_a_gpu_job_shows_in_its_users_row(ui_app: AppFactory, no_polling: None) -> None:
    app = await ui_app("2xA100-80GB")
    async with app.run_test(size=(140, 30)) as pilot:
        table = await _open_users(pilot, app)
        empty = app.screen.query_one("#users-empty")
        # A fresh engine: nobody used it yet, said in words.
        await until(pilot, lambda: str(empty.render()) == EMPTY and empty.display, "empty")
        job = await app.backend.submit({"command": ["sleep", "60"], "gpus": 1, "vram_gb": 2})
        me = my_uid()
        row = await until(
            pilot,
            lambda: (cells := _cells(table, me)) and cells["RUNNING"] == "1" and cells,
            "my row, 1 running",
        )
        assert row["GPUS/MAX"] == "1/-" and row["VRAM GiB/MAX"] == "2/-"
        assert row["WAITING/MAX"] == "0/-" and row["MAX PRIO"] == "-"
        assert row["USER"].endswith(YOU)  # this TUI's user's row is marked
        assert not empty.display
        await app.backend.cancel(job["id"])


async def test_the_view_follows_a_job_that_ends(ui_app: AppFactory, no_polling: None) -> None:
    app = await ui_app("2xA100-80GB")
    first = await app.backend.submit({"command": ["sleep", "60"], "gpus": 1})
    async with app.run_test(size=(140, 30)) as pilot:
        table = await _open_users(pilot, app)
        me = my_uid()
        await until(pilot, lambda: (c := _cells(table, me)) and c["RUNNING"] == "1", "1 running")
        # A second one waits (2 GPUs, one is taken), then starts as the first ends.
        second = await app.backend.submit({"command": ["sleep", "60"], "gpus": 2})
        await until(
            pilot, lambda: (c := _cells(table, me)) and c["WAITING/MAX"] == "1/-", "1 waiting"
        )
        await app.backend.cancel(first["id"])
        row = await until(
            pilot,
            lambda: (c := _cells(table, me)) and c["GPUS/MAX"] == "2/-" and c,
            "the second job running on both GPUs",
        )
        assert row["RUNNING"] == "1" and row["WAITING/MAX"] == "0/-"
        await app.backend.cancel(second["id"])
        row = await until(
            pilot, lambda: (c := _cells(table, me)) and c["RUNNING"] == "0" and c, "ended"
        )
        # Still listed: its recent GPU-hours order it.
        assert row["GPUS/MAX"] == "0/-" and float(row["GPU-H"]) > 0


class _Counting(StaticBackend):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def users(self) -> dict[str, Any]:
        self.asked += 1
        return await super().users()


async def test_it_asks_while_shown_and_never_while_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(users_screen, "USERS_REFRESH_S", 0.1)
    backend = _Counting()
    app = build_app(backend, clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(120, 24)) as pilot:
        await pilot.pause(0.3)
        assert backend.asked == 0  # (never shown: never asked)
        table = await _open_users(pilot, app)
        await until(pilot, lambda: table.row_count == 3, "the rows")
        await until(pilot, lambda: backend.asked >= 3, "asked again while shown")
        await pilot.press("1")
        await until(pilot, lambda: app.current_mode == "dashboard")
        await pilot.pause(0.15)  # (one on its way when it was hidden may still answer)
        hidden = backend.asked
        await pilot.pause(0.5)
        assert backend.asked == hidden, "asked while hidden"
        await pilot.press("4")
        await until(pilot, lambda: backend.asked > hidden, "asked once shown again")


class _Refusing(StaticBackend):
    async def users(self) -> dict[str, Any]:
        raise BackendError("the engine says [/bold] no", 503)


async def test_an_engine_refusal_is_a_notice_not_a_crash() -> None:
    app = build_app(_Refusing(), clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(120, 24)) as pilot:
        await _open_users(pilot, app)
        await until(
            pilot,
            lambda: any(n.message == "the engine says [/bold] no" for n in app._notifications),
            "the notice",
        )
        empty = app.screen.query_one("#users-empty")
        await until(pilot, lambda: str(empty.render()) == NOT_ANSWERED, "said in words")
        assert isinstance(app.screen, UsersScreen) and app.is_running


class _Hostile(StaticBackend):
    async def users(self) -> dict[str, Any]:
        answer = await super().users()
        answer["users"][0]["user"] = "[bold red]ana[/]"
        return answer


async def test_a_user_name_is_shown_as_written_never_as_markup() -> None:
    app = build_app(_Hostile(), clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(120, 24)) as pilot:
        table = await _open_users(pilot, app)
        row = await until(pilot, lambda: _cells(table, 1000), "ana's row")
        assert row["USER"] == "[bold red]ana[/]"


def test_users_snapshot(snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # (this TUI runs as nobody, the fixed jobs' owner: its row is the one marked)
    monkeypatch.setattr(users_screen, "my_uid", lambda: 65534)
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    assert snap_compare(app, press=["4"], terminal_size=(120, 24))


async def test_the_marked_row_takes_a_new_themes_colour_at_once(
    monkeypatch: pytest.MonkeyPatch, no_polling: None
) -> None:
    # It kept the old theme's colour until the next ask (for good with no engine): light
    # orange on a white background (tester h167).
    monkeypatch.setattr(users_screen, "my_uid", lambda: 65534)
    app = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(120, 24)) as pilot:
        table = await _open_users(pilot, app)
        await until(pilot, lambda: _cells(table, 65534), "my row")

        def drawn() -> Any:
            return table.get_row("65534")[0].style.color

        before = drawn()
        await pilot.press("t")
        await until(pilot, lambda: app.theme == "gpulayer-light", "the light theme")
        wanted = table.get_component_rich_style("user-table--you").color
        await until(pilot, lambda: drawn() == wanted and drawn() != before, "the new colour")


def test_limits_are_said_as_written_not_in_exponents() -> None:
    # A max_queued of 1000000 read "1e+06", in the CLI and the TUI alike (tester h167).
    from gpulayer_tui.formatting import user_cells

    user = {
        "user": "ana",
        "gpu_hours": 1.5,
        "share": 0.5,
        "running_jobs": 1,
        "running_gpus": 1,
        "max_gpus": 4096,
        "running_vram_gb": 2.5,
        "max_vram_gb": 1000000.0,
        "waiting": 3,
        "max_queued": 1000000,
        "max_priority": None,
    }
    assert user_cells(user) == [
        "ana",
        "1.5000",
        "0.5",
        "1",
        "1/4096",
        "2.5/1000000",
        "3/1000000",
        "-",
    ]


class _Changing(StaticBackend):
    """ana with a long name and a max priority of 10 until :attr:`short` is set."""

    short = False

    async def users(self) -> dict[str, Any]:
        answer = await super().users()
        ana = answer["users"][0]
        ana["max_priority"] = 10
        ana["user"] = "ana" if self.short else "ana-" + "x" * 30
        return answer


def _shown(table: UserTable) -> bool:
    """Whether every column is within the table's width (nothing cut, nothing to scroll)."""
    return table.virtual_size.width <= table.scrollable_content_region.width


async def test_at_80_columns_short_heads_keep_every_cell_whole(no_polling: None) -> None:
    # At 80 columns MAX PRIO was cut: a max priority of 10 read "1" (tester h167).
    backend = _Changing()
    app = build_app(backend, clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await _open_users(pilot, app)
        await until(pilot, lambda: _cells(table, 1000), "ana's row")
        await until(pilot, lambda: table.heads == SHORT_HEADS, "the short heads")
        assert _shown(table)
        assert _cells(table, 1000)["PRIO"] == "10"  # type: ignore[index]
        # Wider, the full heads come back; narrower again, the short ones.
        await pilot.resize_terminal(140, 24)
        await until(pilot, lambda: table.heads == USER_HEADS and _shown(table), "full heads")
        assert _cells(table, 1000)["MAX PRIO"] == "10"  # type: ignore[index]
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: table.heads == SHORT_HEADS and _shown(table), "short again")


async def test_a_column_shrinks_when_its_widest_cell_goes(no_polling: None) -> None:
    # A DataTable's columns only widen: a long name gone kept its width (tester h167).
    backend = _Changing()
    app = build_app(backend, clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(140, 24)) as pilot:
        table = await _open_users(pilot, app)
        await until(pilot, lambda: _cells(table, 1000), "ana's row")
        wide = table.ordered_columns[0].get_render_width(table)
        backend.short = True
        app.screen.fetch_users()
        await until(pilot, lambda: (_cells(table, 1000) or {}).get("USER") == "ana", "short")
        assert table.ordered_columns[0].get_render_width(table) < wide - 20


def test_limits_with_fractions_are_said_exactly() -> None:
    # 999999.5 read "1e+06" and 12345.678 "12345.7", more than it is (tester h170).
    from gpulayer_tui.formatting import figure, why_rows

    assert [figure(v) for v in (999999.5, 12345.678, 10000000, 4096.0, 0.5)] == [
        "999999.5",
        "12345.678",
        "10000000",
        "4096",
        "0.5",
    ]
    data = {
        "job": 8,
        "reason": "waiting",
        "limits": {"max_vram_gb": 999999.5, "max_queued": 10000000, "from": "[users.default]"},
    }
    said = dict(why_rows(data))["limits"]
    assert "max_vram_gb 999999.5" in said and "max_queued 10000000" in said, said
