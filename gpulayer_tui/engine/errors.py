"""The engine's refusals, one class per answer a caller can act on.

The API maps each to one HTTP status (:mod:`.api`), so every client (the CLI, the TUI,
embedded or attached) sees the same answer for the same refusal.
"""

from __future__ import annotations


class SpecError(ValueError):
    """Invalid input: the message names the problem, ``field`` the input at fault (if one).

    Nothing was stored (400).
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownDomain(SpecError):
    """No domain has this name: 404 where the name is the resource (``POST
    /domains/NAME/drain``), like an unknown job id."""


class KeyReused(SpecError):
    """An idempotency key already used for a different request; nothing was stored (422,
    as the IETF Idempotency-Key draft answers: only the same request is a retry)."""


class KeySpent(SpecError):
    """An idempotency key whose jobs were removed from the history since (``clean``):
    the request was acted on once, and a retry makes nothing (409)."""


class UnknownJob(LookupError):
    """No job has this id (404)."""

    def __init__(self, job_id: int, cleaned: bool = False) -> None:
        # (an id below the newest was given once: its row was removed by `clean`)
        super().__init__(
            f"no job {job_id}" + (" (no longer in the history: cleaned)" if cleaned else "")
        )
        self.job_id = job_id


class JobNotActive(RuntimeError):
    """The job already ended; the operation does not apply (409)."""


class DomainRefused(RuntimeError):
    """A domain operation does not apply now; the message says why (409)."""


class Overloaded(RuntimeError):
    """Back-pressure: the engine takes no more work now; nothing was stored (429)."""


class StoreError(RuntimeError):
    """The database cannot be used (newer schema, corrupt, unwritable) (503)."""


class WriteDeferred(StoreError):
    """A write failed and is kept: it is committed once the database takes writes again
    (what waits for it to be durable waits on :meth:`.Store.after_commit`)."""
