"""Every key of the TUI, designed once and written here once.

Screens and tables build their ``BINDINGS`` from :func:`bindings`; the help screen (``?``)
and the command palette (``ctrl+p`` or ``:``) are generated from :data:`KEYMAP`, so the
footer, the help and the palette cannot drift apart.

The design, k9s- and lazygit-like:

- ``1`` ``2`` ``3`` ``4`` switch screens (dashboard, jobs, strays, users), so no letter is
  taken from the screens: vim movement works in every table (``j``/``k``, ``g``/``G``).
- One key, one idea, on every screen: ``/`` filters, ``o``/``O`` order by the next /
  previous column, ``r`` reverses the order, ``s``/``S`` cycle the status filter, ``f``
  follows output, ``]`` shows the next replica, ``c`` cancels, ``R`` restarts an ended
  job, ``e`` edits a waiting one, ``x`` signals a process, ``enter`` opens, ``esc`` goes
  back (or clears, or closes).
- ``/`` finds: it filters the jobs table and searches the job detail's log.
- Modal forms say their own keys in a footer line: ``ctrl+s`` submits, ``esc`` cancels.

Scoping of ``n``: it is the App's "new job" on every screen, but in the job detail, while
a search of the log is active (after ``/``), ``n`` / ``N`` go to the next / previous
match, as in ``less`` and vim. Such a key is declared with ``when``: the screen's
``check_action`` declines it outside that state, so the key falls through to the App's
binding (and the footer shows "New job" again); ``esc`` ends the search.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from textual.binding import Binding

APP = "app"
"""Bindings of the App itself: they work on every (non-modal) screen."""
TABLE = "table"
"""Movement in the tables (jobs, GPU processes, strays, users)."""

SCREEN_TITLES: dict[str, str] = {
    APP: "Everywhere",
    TABLE: "In tables",
    "dashboard": "Dashboard",
    "jobs": "Jobs",
    "detail": "Job detail",
    "strays": "Strays",
    "users": "Users",
    "submit": "New job form",
    "edit": "Edit job form",
    "adopt": "Adopt dialog",
    "signal": "Signal dialog",
    "drain": "Drain dialog",
    "confirm": "Confirmation",
    "quit": "Quit dialog",
    "help": "Help",
}
"""Every keymap scope, in the order the help screen lists them."""


KEY_WORDS = {
    "colon": ":",
    "escape": "esc",
    "question_mark": "?",
    "slash": "/",
    "greater_than_sign": ">",
    "less_than_sign": "<",
    "asterisk": "*",
}
"""Textual's key names as a keyboard shows them (help said "ctrl+p, colon" and "escape"
beside "esc": tester h87)."""


@dataclass(frozen=True)
class Key:
    """One binding: what it does, where, and whether the footer and palette show it."""

    keys: str
    """Textual key names, comma-separated (the first is the main one)."""
    action: str
    """The action, run on the scope's node (the App for :data:`APP`)."""
    description: str
    """What it does, as the footer, help and palette say it."""
    scopes: tuple[str, ...]
    """Where it works: screen names from :data:`SCREEN_TITLES`."""
    show: bool = True
    """Shown in the footer."""
    display: str | None = None
    """How help and the footer write the key(s), when not as named."""
    palette: bool = True
    """Offered in the command palette (movement and dialog answers are not)."""
    priority: bool = False
    footer: str | None = None
    """The footer's shorter word for it, where ``description`` would crowd out other keys
    at 80 columns (help and the palette say ``description``)."""
    help_keys: str | None = None
    """How help and the palette write the key(s) where they say more than the footer's
    ``display`` (``esc, backspace``: the footer has room for ``esc`` alone)."""
    when: str | None = None
    """The state it acts in, when not always (say "while searching"): outside it the
    screen's ``check_action`` declines the action and the key falls through to the next
    binding of the same key (the App's). Only such a key may shadow an App key."""

    @property
    def shown_keys(self) -> str:
        """The key(s) as help writes them: ``o / O``, ``ctrl+s``."""
        return (
            self.help_keys
            or self.display
            or ", ".join(KEY_WORDS.get(k.strip(), k.strip()) for k in self.keys.split(","))
        )

    def binding(self) -> Binding:
        """The Textual binding."""
        return Binding(
            self.keys,
            self.action,
            self.footer or self.description,
            show=self.show,
            key_display=self.display,
            priority=self.priority,
        )


KEYMAP: tuple[Key, ...] = (
    # -- everywhere ---------------------------------------------------------------------------
    Key("1", "show_area('dashboard')", "Dashboard", (APP,), footer="Dash"),
    Key("2", "show_area('jobs')", "Jobs", (APP,)),
    Key("3", "show_area('strays')", "Strays", (APP,)),
    Key("4", "show_area('users')", "Users", (APP,)),
    Key("n", "new_job", "New job", (APP,), footer="New"),
    Key("t", "next_theme", "Theme", (APP,), show=False),
    Key(
        "ctrl+p,colon",
        "command_palette",
        "Command palette",  # (help; the footer keeps Textual's "palette")
        (APP,),
        show=False,
        palette=False,
        footer="palette",
    ),
    Key("question_mark", "help", "Help", (APP,), display="?"),
    Key("q", "quit_app", "Quit", (APP,)),
    Key("ctrl+c", "quit_app", "Quit", (APP,), show=False, priority=True, palette=False),
    # -- movement in tables -------------------------------------------------------------------
    Key("j", "cursor_down", "Down", (TABLE,), show=False, palette=False),
    Key("k", "cursor_up", "Up", (TABLE,), show=False, palette=False),
    Key(
        "g,home", "scroll_top", "First row", (TABLE,), show=False, display="g, home", palette=False
    ),
    Key(
        "G,shift+g,end",
        "scroll_bottom",
        "Last row",
        (TABLE,),
        show=False,
        display="G, end",
        palette=False,
    ),
    # -- dashboard ----------------------------------------------------------------------------
    Key("enter", "open_job", "Open the process's job", ("dashboard",), show=False),
    Key("o,greater_than_sign", "sort(1)", "Sort", ("dashboard", "jobs"), display="o, >"),
    Key(
        "O,shift+o,less_than_sign",
        "sort(-1)",
        "Sort by previous column",
        ("dashboard", "jobs"),
        show=False,
        display="O, <",
    ),
    Key("r", "reverse_sort", "Reverse sort", ("dashboard", "jobs"), show=False),
    Key("v", "cycle_density", "Panel view (auto/full/compact/rows)", ("dashboard",), show=False),
    Key(
        "T,shift+t",
        "toggle_tree",
        "Process tree (jobs over their processes)",
        ("dashboard",),
        show=False,
        display="T",
    ),
    # -- jobs ---------------------------------------------------------------------------------
    # (priority: in the filter line it applies the filter and goes to the table before the
    # next key is routed; see "down" below)
    Key("enter", "open_job", "Open", ("jobs",), priority=True),
    Key("c", "cancel_job", "Cancel job", ("jobs", "detail"), footer="Cancel"),
    Key(
        "space",
        "toggle_mark",
        "Mark or unmark the job (c cancels every marked one)",
        ("jobs",),
        show=False,  # (at 80 columns it pushed Cancel and New out of the footer)
        footer="Mark",
    ),
    Key(
        "asterisk",
        "mark_shown",
        "Mark every waiting or running job shown (or, with all marked, none)",
        ("jobs",),
        show=False,
        display="*",
    ),
    Key(
        "R,shift+r", "restart_job", "Restart job", ("jobs", "detail"), display="R", footer="Restart"
    ),
    Key("e", "edit_job", "Edit job or scale a service", ("jobs", "detail"), footer="Edit"),
    # Before the next key is routed (priority): as a plain binding it ran once the key had
    # bubbled up, and "/q" typed in one burst quit the app (the "q" went to the table).
    Key(
        "slash",
        "start_filter",
        "Filter",
        ("jobs",),
        display="/",
        priority=True,
    ),
    Key("s", "cycle_status(1)", "Status filter", ("jobs",), footer="Status"),
    Key("S,shift+s", "cycle_status(-1)", "Status filter back", ("jobs",), show=False, display="S"),
    Key(
        "escape",
        "clear_filter",
        "Clear filter (with none set: unmark every job)",
        ("jobs",),
        display="esc",
        footer="Clear",
    ),
    # Down and enter leave the filter line before the next key is routed (as plain
    # bindings they ran once the line's message reached the screen, and "logger", enter,
    # "j" filtered "loggerj": tester h56); in the table they skip, and do what they do there.
    Key(
        "down",
        "focus_table",
        "Leave the filter line",
        ("jobs",),
        show=False,
        palette=False,
        priority=True,
    ),
    # -- job detail ---------------------------------------------------------------------------
    Key("f", "toggle_follow", "Follow output", ("detail",), footer="Follow"),
    Key(
        "right_square_bracket",
        "next_replica",
        "Next replica",
        ("detail",),
        display="]",
        footer="Replica",
    ),
    # (only forward: replica 63 of 64 was 63 presses away: tester h168)
    Key(
        "left_square_bracket",
        "previous_replica",
        "Previous replica",
        ("detail",),
        display="[",
        show=False,
    ),
    Key("u", "toggle_usage", "GPU usage", ("detail",), footer="Usage"),
    Key(
        "slash",
        "search_log",
        "Search the log",
        ("detail",),
        display="/",
        footer="Search",
        priority=True,  # (see the jobs' "/": the keys after it are the term)
    ),
    Key(
        "enter",
        "leave_search",
        "Keep the term, to the log",
        ("detail",),
        show=False,
        palette=False,
        priority=True,  # (as the jobs' enter: "n" typed right after it is the next match)
        when="in the search line",
    ),
    Key("n", "next_match", "Next match", ("detail",), when="while searching", footer="Next"),
    Key(
        "N,shift+n",
        "previous_match",
        "Previous match",
        ("detail",),
        display="N",
        footer="Prev",  # (only n was offered: N was found in help alone, tester h89)
        when="while searching",
    ),
    Key("g", "scroll_top", "Top of the log", ("detail",), show=False),
    Key("G,shift+g", "scroll_bottom", "End of the log", ("detail",), show=False, display="G"),
    # (in help and the palette; kept out of the footer so that "esc Back" stays in it)
    Key("w", "toggle_wrap", "Wrap lines", ("detail",), show=False),
    # (a browser session has no terminal to hand to a pager: help said P there, and P did
    # nothing: tester h181)
    Key(
        "P,shift+p",
        "open_pager",
        "Open in $PAGER",
        ("detail",),
        show=False,
        display="P",
        when="in a terminal, not in a browser",
    ),
    # (before "back": while a search is open esc ends it, and the footer says so; it said
    # "esc Back", which ended the search and stayed: tester h95)
    Key(
        "escape,backspace",
        "end_search",
        "End the search",
        ("detail",),
        display="esc",
        footer="End search",
        when="while searching",
    ),
    # (help said "esc" alone, and backspace, which the README names, was nowhere: h183)
    Key("escape,backspace", "back", "Back", ("detail",), display="esc", help_keys="esc, backspace"),
    # -- strays (and the dashboard's process table) -------------------------------------------
    Key("x", "signal_process", "Signal the process", ("dashboard", "strays"), footer="Signal"),
    Key("a", "adopt_selected", "Adopt", ("strays",)),
    Key(
        "p",
        "adopt_pid",
        "Adopt a pid",
        ("strays",),
        footer="By pid",
        priority=True,  # ("p123" in one burst: "1" went to the table, and showed area 1)
    ),
    # Said in the footer while the pid line is open (it named neither: tester h87); enter
    # a priority key, as the line's own enter binding hid it from the footer.
    Key(
        "enter",
        "submit_pid",
        "Adopt the pid typed",
        ("strays",),
        footer="Adopt",
        palette=False,
        priority=True,
        when="while typing a pid",
    ),
    Key(
        "escape",
        "close_pid",
        "Close the pid field",
        ("strays",),
        display="esc",
        footer="Close",
        palette=False,
        when="while typing a pid",
    ),
    # -- modal forms and dialogs (they say their keys in their own footer) ---------------------
    # Tab moves between fields before the next key is routed: as a plain binding it ran
    # only once the key had bubbled up to the app, behind the screen's checks of what was
    # typed, and a key typed right after it went to the field it left ("-1", tab, "5"
    # read GPUs -15: tester h46).
    Key(
        "tab",
        "app.focus_next",
        "Next field",
        ("submit", "edit", "adopt"),
        show=False,
        palette=False,
        priority=True,
    ),
    Key(
        "shift+tab",
        "app.focus_previous",
        "Previous field",
        ("submit", "edit", "adopt"),
        show=False,
        palette=False,
        priority=True,
    ),
    # Enter in a field likewise: it moved to the next field once the field's message had
    # reached the screen, and the keys typed right after it stayed in the field it left
    # ("sleep 5", enter, "nm" read "sleep 5nm": tester h56). Elsewhere (a button, a
    # checkbox) the action skips, and enter does what it does there.
    Key(
        "enter",
        "enter_field",
        "Next field (submit past the last)",
        ("submit", "edit", "adopt"),
        show=False,
        palette=False,
        priority=True,
    ),
    Key("ctrl+s", "submit", "Submit", ("submit",), priority=True),
    Key("escape", "cancel", "Cancel", ("submit",), display="esc"),
    Key("ctrl+s", "save", "Save", ("edit",), priority=True),
    Key("escape", "cancel", "Cancel", ("edit",), display="esc"),
    Key("ctrl+s", "adopt", "Adopt", ("adopt",), priority=True),
    Key("escape", "cancel", "Cancel", ("adopt",), display="esc"),
    Key("ctrl+s", "drain", "Drain", ("drain",), priority=True),
    Key("escape", "cancel", "Cancel", ("drain",), display="esc"),
    Key("y", "send", "Send the signal", ("signal",), palette=False),
    Key("k", "toggle_kill", "SIGKILL instead of SIGTERM", ("signal",), palette=False),
    Key("n,escape", "cancel", "Cancel", ("signal",), display="n, esc", palette=False),
    Key("y", "answer(True)", "Yes", ("confirm",), palette=False),
    Key("n,escape", "answer(False)", "No", ("confirm",), display="n, esc", palette=False),
    Key("k", "choose('handover')", "Keep running", ("quit",), palette=False),
    Key("s", "choose('stop')", "Stop", ("quit",), palette=False),
    Key("escape,c", "choose('stay')", "Stay", ("quit",), display="esc, c", palette=False),
    Key("escape,q,question_mark", "dismiss", "Close", ("help",), display="esc", palette=False),
    # (only down and pgdn scrolled it: j/k, the table keys everywhere else, did nothing)
    Key("j", "scroll_help(1)", "Scroll down", ("help",), show=False, palette=False),
    Key("k", "scroll_help(-1)", "Scroll up", ("help",), show=False, palette=False),
    Key("g", "scroll_help(-100000)", "Top", ("help",), show=False, palette=False),
    Key("G", "scroll_help(100000)", "End", ("help",), show=False, palette=False),
)


def keys_of(scope: str) -> list[Key]:
    """The keymap entries of one scope, in the keymap's order."""
    return [k for k in KEYMAP if scope in k.scopes]


ON_JOBS_TABLE = frozenset({"toggle_mark", "mark_shown"})
"""Jobs-screen actions bound on the jobs table itself, run on the screen (``screen.``):
as the screen's own bindings they ran once the key had bubbled back up, after the
table's ``j``/``k`` typed later, and "space j space" typed in one burst marked rows 2
and 3 (tester h112); as a priority binding, ahead of the ``j`` typed before. The table
runs its own bindings as each key reaches it (:class:`~.widgets.own_keys.OwnKeys`)."""


def bindings(scope: str) -> list[Binding]:
    """The Textual bindings of one scope (a screen's or table's ``BINDINGS``)."""
    return [k.binding() for k in keys_of(scope) if k.action not in ON_JOBS_TABLE]


def jobs_table_bindings() -> list[Binding]:
    """The jobs table's bindings of :data:`ON_JOBS_TABLE` actions (run on its screen)."""
    out = []
    for key in keys_of("jobs"):
        if key.action in ON_JOBS_TABLE:
            out.append(replace(key.binding(), action=f"screen.{key.action}"))
    return out


def key_names(key: Key) -> list[str]:
    """Every key name a binding answers to, normalised as Textual matches them."""
    return [name.strip() for name in key.keys.split(",")]
