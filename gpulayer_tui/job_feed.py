"""Which page of job history the TUI asks for next.

The TUI never loads the whole history: it loads the active jobs and the newest page, then
one more page each time the user nears the end of the jobs table. A filter or a sort is a
new *view*: the engine serves its first page (SQLite filters and sorts; see
``GET /v1/jobs``), so the rows the table shows first are the true first rows of that view
across all of history, not of what happened to be loaded. This module only keeps the
paging state; the app does the fetching.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .wire import JobRowJSON

PAGE = 500
"""Rows per page."""


@dataclass(frozen=True, slots=True)
class JobView:
    """A view of the history: what it holds and in what order."""

    text: str = ""
    statuses: tuple[str, ...] = ()
    sort: str = "id"
    descending: bool = True

    def query(self) -> dict[str, Any]:
        """The view as ``GET /v1/jobs`` parameters."""
        query: dict[str, Any] = {}
        if self.text:
            query["q"] = self.text
        if self.statuses:
            query["status"] = ",".join(self.statuses)
        if self.sort != "id":
            query["sort"] = self.sort
        if self.sort != "id" or not self.descending:
            query["order"] = "desc" if self.descending else "asc"
        return query


class JobFeed:
    """The paging state of one view: where the next page starts, and whether there is one.

    Each :meth:`show` bumps :attr:`generation`, so a page that arrives for a view the user
    already left is recognised (:meth:`took` ignores it).
    """

    def __init__(self) -> None:
        self.view = JobView()
        self.generation = 0
        self.more = True
        self.pages = 0
        """Pages of this view taken so far."""
        self._before: int | None = None
        self._offset = 0
        self.unanswered = False
        """The last ask for a page of this view got no answer (the engine went away): the
        rows shown are those loaded before, not the view's."""

    @property
    def frontier(self) -> int | None:
        """Newest first, with pages still to take: the oldest id taken (``None`` before
        the first page, after the last, and in other orders)."""
        keyed = self.view.sort == "id" and self.view.descending
        return self._before if keyed and self.more and self.pages > 0 else None

    @property
    def known_more(self) -> bool:
        """True when the engine said the view has rows beyond those taken, or its pages
        could not be asked for (the count is not the view's: a cleared filter with no
        engine said "1,500 jobs" of 3,025, as if whole: tester h191)."""
        return self.more and (self.pages > 0 or self.unanswered)

    def show(self, view: JobView) -> bool:
        """Switch to ``view``; True if it differs (its first page is then wanted)."""
        if view == self.view:
            return False
        self.view = view
        self.restart()
        return True

    def restart(self) -> None:
        """Take the view from its first page again (a reload replaces every row: asked
        where the last page ended, it loaded the page after the one shown, and an engine
        restart left an attached table with its running jobs only)."""
        self.generation += 1
        self.more = True
        self.pages = 0
        self._before = None
        self._offset = 0
        self.unanswered = False

    def next_query(self) -> dict[str, Any]:
        """Parameters of the next page."""
        query = self.view.query()
        query["limit"] = PAGE
        keyed = self.view.sort == "id" and self.view.descending
        if keyed and self._before is not None:
            query["before"] = self._before
        elif not keyed and self._offset:
            query["offset"] = self._offset
        return query

    def took(self, generation: int, rows: list[JobRowJSON], more: bool) -> bool:
        """Record a page fetched for ``generation``; False (and nothing changes) if the view
        changed since it was asked for."""
        if generation != self.generation:
            return False
        self.unanswered = False
        self.more = more and bool(rows)
        self.pages += 1
        if rows:
            self._before = rows[-1]["id"]
            self._offset += len(rows)
        return True
