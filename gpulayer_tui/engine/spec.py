"""The submission spec of a job or service (pydantic, strict: unknown fields are rejected).

The CLI, the API and the TUI's form all send this shape; the engine validates it here,
so the rules are written once.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SpecError(ValueError):
    """A submission is invalid; the message names the field and the problem."""


# A job id: SQLite's INTEGER range (a larger number names no job and cannot be looked up).
JobId = Annotated[int, Field(ge=1, le=2**63 - 1)]


class Dependency(BaseModel):
    """One dependency: wait for ``job`` to end; with ``any_exit`` run whatever its outcome."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    job: JobId
    any_exit: bool = False


def _no_nul(value: str, field: str) -> None:
    if "\0" in value:
        raise ValueError(f"{field} contains a NUL byte")


class RetrySpec(BaseModel):
    """How often a service is placed again after losing a domain (record 000)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_attempts: int = Field(10, ge=1, le=1000)


SERVICE_ONLY = ("replicas", "restart", "max_restarts", "port", "retry")


class JobSpec(BaseModel):
    """What to run and what it needs.

    Attributes:
        command: argv, run without a shell.
        shell: A shell line, run with ``sh -c`` (exactly one of command/shell).
        cwd: Absolute working directory (the CLI sends the caller's).
        env: Variables set for the job on top of the engine's environment.
        name: Label; defaults to the program's name.
        project: Free-form grouping label.
        gpus: GPUs needed, each on its own domain (0 = the CPU pool).
        vram_gb: GiB needed on *each* GPU.
        domain: Pin to a domain (or a list of domains to choose from).
        exclusive: Hold every slot of the chosen domains (nothing else runs there).
        depends_on: Jobs to wait for; by default a dependency that does not complete
            cancels this job (``dependency_failed``), ``any_exit`` waits for any end.
        timeout: Seconds of running before SIGTERM (then SIGKILL after the grace period).
        priority: Higher starts first among jobs that fit; equal priority is FIFO.
        kind: ``command`` (a batch job that finishes) or ``service`` (kept running).
        replicas: Copies of a service; GPU replicas go to distinct domains (1-64).
        restart: When a service's replica is started again: ``always`` or
            ``on_failure`` (non-zero exit only).
        max_restarts: Restarts allowed per replica (unlimited when omitted).
        port: Give each replica a free TCP port as ``$PORT`` and report its endpoint.
        retry: ``max_attempts``: placements of a service after losing a domain.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: Literal["command", "service"] = "command"
    command: list[str] | None = Field(None, min_length=1, max_length=4096)
    shell: str | None = Field(None, min_length=1, max_length=65536)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    name: str | None = Field(None, min_length=1, max_length=200)
    project: str | None = Field(None, min_length=1, max_length=200)
    gpus: int | None = Field(None, ge=0, le=64)
    vram_gb: float | None = Field(None, gt=0, le=1_000_000)
    domain: str | list[str] | None = None
    exclusive: bool = False
    depends_on: list[Dependency | JobId] = Field(default_factory=list, max_length=1024)
    timeout: float | None = Field(None, gt=0, le=10 * 365 * 86400)
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    replicas: int | None = Field(None, ge=1, le=64)
    restart: Literal["always", "on_failure"] | None = None
    max_restarts: int | None = Field(None, ge=0, le=1_000_000)
    port: bool | None = None
    retry: RetrySpec | None = None

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.kind != "service":
            given = [name for name in SERVICE_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: only services have "
                    f'{"this" if len(given) == 1 else "these"} (set kind = "service")'
                )
        if (self.command is None) == (self.shell is None):
            raise ValueError("give exactly one of 'command' (argv) or 'shell' (a shell line)")
        if self.command is not None:
            if not self.command[0]:
                raise ValueError("command: the program name (first word) is empty")
            for word in self.command:
                _no_nul(word, "command")
        if self.shell is not None:
            _no_nul(self.shell, "shell")
        if self.cwd is not None:
            _no_nul(self.cwd, "cwd")
            if not os.path.isabs(self.cwd):
                raise ValueError(f"cwd: {self.cwd!r} is not an absolute path")
        for key, value in self.env.items():
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"env: {key!r} is not a valid variable name")
            _no_nul(value, f"env[{key}]")
        if self.name is not None and any(ord(c) < 32 for c in self.name):
            raise ValueError("name: control characters are not allowed")
        if isinstance(self.domain, list) and not self.domain:
            raise ValueError("domain: an empty list pins to nothing; omit it instead")
        if self.vram_gb is not None and self.gpus == 0:
            raise ValueError("vram_gb is per GPU, but gpus is 0 (a CPU job)")
        return self

    @property
    def dependencies(self) -> list[Dependency]:
        """``depends_on`` with bare ids expanded to default-policy dependencies."""
        return [d if isinstance(d, Dependency) else Dependency(job=d) for d in self.depends_on]

    @property
    def is_service(self) -> bool:
        """True for a long-running service."""
        return self.kind == "service"

    @property
    def replica_count(self) -> int:
        """Replicas to run (1 for a batch job)."""
        return self.replicas or 1

    @property
    def wants_port(self) -> bool:
        """A service gets ``$PORT`` unless it said ``port = false``."""
        return self.is_service and self.port is not False

    @property
    def restart_policy(self) -> str:
        """``always`` (the default for services) or ``on_failure``."""
        return self.restart or "always"

    @property
    def max_attempts(self) -> int:
        """Placements allowed for a service that loses domains (default 10)."""
        return self.retry.max_attempts if self.retry is not None else 10

    @property
    def pinned_domains(self) -> list[str]:
        """The ``domain`` field as a list (empty when not pinned)."""
        if self.domain is None:
            return []
        return [self.domain] if isinstance(self.domain, str) else list(self.domain)

    def default_name(self) -> str:
        """``name`` or the program's basename."""
        if self.name:
            return self.name
        if self.command:
            return os.path.basename(self.command[0]) or self.command[0]
        first = (self.shell or "").strip().split(maxsplit=1)
        return os.path.basename(first[0]) if first else "shell"


def _describe(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"])
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown field '{where}'")
        elif where:
            parts.append(f"{where}: {msg}")
        else:
            parts.append(msg)
    # A union field reports one error per member; keep each distinct line once.
    return "; ".join(dict.fromkeys(parts))


def parse_spec(data: Any) -> JobSpec:
    """Validate a submission.

    Raises:
        SpecError: With every problem named (``gpus: Input should be ...``).
    """
    if not isinstance(data, dict):
        raise SpecError("a job spec must be a JSON object")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_describe(err)) from None
