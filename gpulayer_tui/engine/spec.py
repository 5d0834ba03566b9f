"""The submission spec of a job or service (pydantic, strict: unknown fields are rejected).

The CLI, the API and the TUI's form all send this shape; the engine validates it here.
Types and the relations between fields are checked by the model; each field's own rule
(ranges, characters) is the wire contract's (:mod:`gpulayer_tui.wire`), the same function
argparse and the form use, so the rules are written once.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from .. import wire
from .errors import SpecError
from .pydantic_words import TYPE_WORDS, constraint_words

__all__ = [
    "SERVICE_ONLY",
    "Dependency",
    "JobSpec",
    "RetrySpec",
    "SnapshotInfo",
    "SpecError",
    "parse_spec",
]


def _rule(check: Any) -> AfterValidator:
    return AfterValidator(check)


# A job id: SQLite's INTEGER range (a larger number names no job and cannot be looked up).
JobId = Annotated[int, _rule(wire.check_job_id)]


class Dependency(BaseModel):
    """One dependency: wait for ``job`` to end; with ``any_exit`` run whatever its outcome."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    job: JobId
    any_exit: bool = False


def _no_nul(value: str, what: str, field: str | None = None) -> None:
    if "\0" in value:
        raise wire.FieldError(field or what, f"{what} contains a NUL byte")
    _encodable(value, what, field)


def _encodable(value: str, what: str, field: str | None = None) -> None:
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:
        # (A codec's own words, with no field, came back; a cwd with one was taken and
        # failed at launch.) U+DC80-U+DCFF, a byte that is not UTF-8, is kept as that byte.
        code = ord(value[err.start])
        raise wire.FieldError(
            field or what,
            f"{what} contains an unpaired surrogate U+{code:04X} (not text: a byte that is "
            "not UTF-8 comes as U+DC80-U+DCFF)",
        ) from None


# Linux passes no single argument or environment string longer than this to a program
# (MAX_ARG_STRLEN: 32 pages): such a job could only fail at launch, "Argument list too
# long", after being stored and echoed back whole.
MAX_ARG_STRLEN = 32 * 4096


def _passable(text: str, field: str, what: str | None = None) -> None:
    size = len(text.encode("utf-8", "surrogateescape"))
    if size >= MAX_ARG_STRLEN:
        raise wire.FieldError(
            field,
            f"{what or field}: {size} bytes; Linux passes no program an argument or "
            f"environment string of {MAX_ARG_STRLEN} bytes or more",
        )


def exec_bytes(strings: Any) -> int:
    """What strings cost a program's start: each, its NUL and its pointer."""
    return sum(len(s.encode("utf-8", "surrogateescape")) + 1 + 8 for s in strings)


# The last environment found valid (a copy), and what it costs a program's start. A
# batch's jobs share one environment, a shell's (dozens to hundreds of variables): checked
# again for each job, it was two fifths of the time a 500-line `submit --file` took to
# admit, while no job of it could start. Equal dicts get the same verdict, so a dict
# compare (at C speed, mostly on identical strings) stands for the check.
_last_valid_env: tuple[dict[str, str], int] = ({}, 0)


def _check_env(env: dict[str, str]) -> None:
    """Refuse a variable name or value that no program could be given.

    Raises:
        wire.FieldError: Names the variable.
    """
    global _last_valid_env
    if env == _last_valid_env[0]:
        return
    for key, value in env.items():
        _encodable(key, "env (a variable's name)", "env")  # (a codec's words came back)
        if not key or "=" in key or "\0" in key:
            shown = repr(key) if len(key) <= 100 else f"{key[:100]!r}... ({len(key)} characters)"
            raise wire.FieldError("env", f"{shown} is not a valid variable name")
        named = f"env[{key}]" if len(key) <= 100 else f"env[{key[:100]}...]"
        _no_nul(value, named, "env")
        _passable(f"{key}={value}", "env", named)
    _last_valid_env = (dict(env), exec_bytes(f"{k}={v}" for k, v in env.items()))


def env_exec_bytes(env: dict[str, str]) -> int:
    """What ``env`` costs a program's start (each ``NAME=value``, its NUL and pointer)."""
    last = _last_valid_env
    if env == last[0]:
        return last[1]
    return exec_bytes(f"{k}={v}" for k, v in env.items())


class RetrySpec(BaseModel):
    """How often a service is placed again after losing a domain (record 000)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_attempts: Annotated[int, _rule(wire.check_max_attempts)] = 10


class SnapshotInfo(BaseModel):
    """Where a job's snapshot lies and what it holds (set by the engine at admission, see
    :mod:`.snapshot`; a submission gives only ``snapshot = true``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    path: str  # the copy of the job's cwd: where it runs
    source: str  # what was copied (the git root, or the cwd)
    commit: str | None = None
    dirty: bool | None = None
    files: int = 0
    bytes: int = 0


SERVICE_ONLY = ("replicas", "restart", "max_restarts", "port", "retry")


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish"})
"""Programs that expand ``$PORT`` themselves when they are a service's argv[0]."""


def _unexpanded_port(spec: JobSpec) -> str | None:
    """A word of a service's argv that holds ``$PORT`` for nothing to expand (the server
    failed at run time: "invalid int value: '$PORT'"; tester h58), or ``None``."""
    if spec.kind != "service" or spec.command is None or spec.port is False:
        return None
    if not spec.command or os.path.basename(spec.command[0]) in SHELLS:
        return None
    for word in spec.command[1:]:
        if "$PORT" in word or "${PORT}" in word:
            return word
    return None


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
        notify: Send a notification when it ends (and, for a service, when a replica
            restarts or gives up), as ``[notify]`` in the config says. Stored only when
            true, so the rows of other jobs do not carry it.
        preemptible: A higher-priority job that has waited ``[scheduling]
            preempt_after`` may stop it (checkpoint signal, SIGTERM, SIGKILL). Stored
            only when true.
        requeue: A preempted job goes back to the queue (the default); ``false``: it
            fails instead. Stored only when false.
        cluster: Run it on this ``[clusters.NAME]`` Slurm cluster instead of here.
        cpus: CPUs per node (cluster jobs).
        mem_gb: Memory per node in GB (cluster jobs).
        snapshot: ``true``: run a copy of ``cwd`` made at submission (``[snapshot]
            default`` when omitted). The engine stores what it made in its place (a
            :class:`SnapshotInfo`); ``false`` and omitted are not stored.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: Literal["command", "service"] = "command"
    command: Annotated[list[str], _rule(wire.check_command)] | None = None
    shell: Annotated[str, _rule(wire.check_shell)] | None = None
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    name: Annotated[str, _rule(lambda v: wire.check_label("name", v))] | None = None
    project: Annotated[str, _rule(lambda v: wire.check_label("project", v))] | None = None
    gpus: Annotated[int, _rule(wire.check_gpus)] | None = None
    vram_gb: Annotated[float, _rule(wire.check_vram_gb)] | None = None
    domain: str | list[str] | None = None
    exclusive: bool = False
    depends_on: list[Dependency | JobId] = Field(default_factory=list, max_length=1024)
    timeout: Annotated[float, _rule(wire.check_timeout)] | None = None
    priority: Annotated[int, _rule(wire.check_priority)] = 0
    replicas: Annotated[int, _rule(wire.check_replicas)] | None = None
    restart: Literal["always", "on_failure"] | None = None
    max_restarts: Annotated[int, _rule(wire.check_max_restarts)] | None = None
    port: bool | None = None
    retry: RetrySpec | None = None
    notify: bool = False
    preemptible: bool = False
    requeue: bool = True
    restart_of: Annotated[int, Field(ge=1)] | None = None  # the job this one restarts
    cluster: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    cpus: Annotated[int, Field(ge=1, le=100_000)] | None = None
    mem_gb: Annotated[float, Field(gt=0, le=1_000_000)] | None = None
    snapshot: bool | SnapshotInfo | None = None

    @field_validator("depends_on")
    @classmethod
    def _one_condition_per_job(cls, deps: list[Dependency | JobId]) -> list[Dependency | JobId]:
        # The same job twice with the same condition is one dependency (`--after 3 --after
        # 3`); with two conditions it is a contradiction, told rather than one picked.
        conditions: dict[int, bool] = {}
        kept: list[Dependency | JobId] = []
        for dep in deps:
            job, any_exit = (dep.job, dep.any_exit) if isinstance(dep, Dependency) else (dep, False)
            if job in conditions:
                if conditions[job] != any_exit:
                    raise ValueError(
                        f"job {job} is named twice, once to run whatever its outcome "
                        "(any_exit) and once only if it completes"
                    )
                continue
            conditions[job] = any_exit
            kept.append(dep)
        return kept

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        # Each problem names its field (FieldError), as the field rules' own errors do:
        # an API client is told which input is at fault ("field" in the 400's body).
        fail = wire.FieldError
        if self.kind != "service":
            given = [name for name in SERVICE_ONLY if getattr(self, name) is not None]
            if given:
                raise fail(
                    given[0],
                    f"{', '.join(given)}: only services have "
                    f'{"this" if len(given) == 1 else "these"} (set kind = "service")',
                )
        if (self.command is None) == (self.shell is None):
            raise fail("command", "give exactly one of 'command' (argv) or 'shell' (a shell line)")
        for word in self.command if self.command is not None else [self.shell or ""]:
            _no_nul(word, "shell" if self.shell is not None else "command")
            _passable(word, "shell" if self.shell is not None else "command")
        if self.cwd is not None:
            _no_nul(self.cwd, "cwd")
            if not os.path.isabs(self.cwd):
                raise fail("cwd", f"{self.cwd!r} is not an absolute path")
        _check_env(self.env)
        unexpanded = _unexpanded_port(self)
        if unexpanded is not None:
            raise fail(
                "command",
                f"{unexpanded!r}: nothing expands $PORT in an argv command (no shell runs "
                "it): give it as a shell line (--shell 'exec ... $PORT'), or let the program "
                "read the PORT environment variable",
            )
        if isinstance(self.domain, list) and not self.domain:
            raise fail("domain", "an empty list pins to nothing; omit it instead")
        if self.vram_gb is not None and self.gpus == 0:
            raise fail("vram_gb", "vram_gb is per GPU, but gpus is 0 (a CPU job)")
        if self.preemptible and self.kind == "service":
            raise fail("preemptible", "services are never preempted")
        if self.cluster is None and (self.cpus is not None or self.mem_gb is not None):
            field = "cpus" if self.cpus is not None else "mem_gb"
            raise fail(field, "only cluster jobs have this (set cluster)")
        if self.cluster is not None and (self.is_service or self.preemptible or self.domain):
            raise fail(
                "cluster",
                "a cluster job is a batch job placed by Slurm (no service, preemptible or domain)",
            )
        if not self.requeue and not self.preemptible:
            raise fail("requeue", "only a preemptible job is requeued (add preemptible)")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if not out.get("notify"):
            out.pop("notify", None)  # (absent means false: old rows, other jobs' rows)
        if not out.get("preemptible"):
            out.pop("preemptible", None)
        if out.get("requeue", True):
            out.pop("requeue", None)
        if not out.get("snapshot"):
            out.pop("snapshot", None)
        return out

    def stored(self) -> dict[str, Any]:
        """The spec as a job keeps it (JSON types; fields at their unset value left out).

        Its environment as given: pydantic's JSON mode re-encodes a dict's keys, and a
        variable's name holding a byte that is not UTF-8 (U+DC80-U+DCFF) was stored as
        three U+FFFD, the job run again (a restart, a requeue, a restore) under another
        name. (A serializer cannot do it: pydantic encodes what one returns.)
        """
        out: dict[str, Any] = self.model_dump(mode="json", exclude_none=True)
        if self.env:
            out["env"] = self.env  # (the same dict: never changed in place, see Admission)
        return out

    @property
    def dependencies(self) -> list[Dependency]:
        """``depends_on`` with bare ids expanded to default-policy dependencies."""
        return [d if isinstance(d, Dependency) else Dependency(job=d) for d in self.depends_on]

    @property
    def run_dir(self) -> str:
        """Where the job runs: its snapshot's copy of ``cwd``, else ``cwd`` (the engine
        user's home when omitted)."""
        if isinstance(self.snapshot, SnapshotInfo):
            return self.snapshot.path
        return self.cwd or os.path.expanduser("~")

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
        """``name`` or the name of the program it runs (:func:`program_name`), held to the
        name rule: at most ``NAME_MAX`` characters, control and other unprintable
        characters escaped (a program's name reaches every table and terminal)."""
        if self.name:
            return self.name
        words = list(self.command) if self.command else shell_words(self.shell or "")
        base = program_name(words, shell=not self.command) or ("job" if self.command else "shell")
        return wire.printable(base)[: wire.NAME_MAX] or "job"


WRAPPERS: dict[str, frozenset[str]] = {
    "exec": frozenset({"-a"}),
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}),
    "nohup": frozenset(),
    "nice": frozenset({"-n", "--adjustment"}),
    "time": frozenset({"-f", "--format", "-o", "--output"}),
    "sudo": frozenset({"-u", "--user", "-g", "--group", "-h", "--host", "-C", "-D", "-r", "-t"}),
    "doas": frozenset({"-u", "-C"}),
    "command": frozenset(),
    "setsid": frozenset(),
    "stdbuf": frozenset(),
    "ionice": frozenset({"-c", "--class", "-n", "--classdata", "-p", "--pid"}),
    "chrt": frozenset(),
    "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}),
}
"""Programs that run another program (their basename), and their options that take a
value as the next word: a default name looks past them."""


_QUOTING = frozenset("'\"\\;&|<>()`")


def shell_words(line: str) -> list[str]:
    """The words of a shell line's first command, as ``sh`` would split them (quotes
    joined, ``VAR="a b"`` one word), up to its first operator (``;``, ``&&``, ``|``,
    ``>``...): split on spaces, ``python3 "my script.py"`` was named ``"my`` (tester h73).
    A line without quotes or operators is split on spaces (no lexer for each line of a
    queue file); one a lexer cannot read (a quote never closed) too."""
    if not any(c in _QUOTING for c in line):
        return line.split()
    import shlex

    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    try:
        for token in lexer:
            if token and all(c in "();<>|&" for c in token):
                break
            words.append(token)
    except ValueError:
        return line.split()
    return words


def program_name(words: list[str], shell: bool = False) -> str:
    """The name of the program a command runs, for a default job name.

    Past wrappers (:data:`WRAPPERS`: ``exec``, ``env``, ``nohup``, ``nice``, ``time``,
    ``sudo``, ...) with their options, and, in a shell line, leading ``VAR=value`` words;
    the program's basename. An interpreter or a launcher (:data:`INTERPRETERS`,
    :data:`LAUNCHERS`) is named by the script it runs (``python3 train.py --lr 3`` ->
    ``train.py``; ``uv run torchrun --nproc_per_node 8 sft.py`` -> ``sft.py``: a sweep's
    jobs were all ``python``), a Python module run with ``-m`` by the module
    (``exec python3 -m http.server $PORT`` -> ``http.server``); inline code (``-c``)
    keeps the interpreter's name. A wrapper that runs nothing is the program itself
    (``env | grep FOO`` -> ``env``; it was "shell": tester h83). Empty when no word is left.
    """
    i = 0
    last_wrapper = ""
    while i < len(words):
        word = words[i]
        wrapper = os.path.basename(word)
        if (shell or wrapper == "env" or i > 0) and _is_assignment(word):
            i += 1
        elif wrapper in WRAPPERS:
            # (exec and command alone run nothing: not a program's name)
            last_wrapper = "" if wrapper in ("exec", "command") else wrapper
            i += 1
            takes_value = WRAPPERS[wrapper]
            while i < len(words) and words[i].startswith("-") and words[i] != "--":
                i += 2 if words[i] in takes_value else 1
            if i < len(words) and words[i] == "--":
                i += 1
            if wrapper == "chrt" and i < len(words) and words[i].isascii() and words[i].isdigit():
                i += 1  # (its priority)
            if wrapper == "timeout" and i < len(words):
                i += 1  # (its duration)
        else:
            break
    if i >= len(words):
        return last_wrapper
    base = _basename(words[i])
    return _script_of(words, i + 1, base) or base


def _basename(word: str) -> str:
    """A path's last part (``train.py/`` too), or the word itself (``/``)."""
    return os.path.basename(word.rstrip("/")) or word


MODULE_LAUNCHERS = frozenset({"torch.distributed.run", "torch.distributed.launch"})
"""Python modules that start a script (``python -m torch.distributed.run ... sft.py``):
named by that script, as ``torchrun`` is."""


INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # name: (options that take a value as the next word, options that give inline code)
    "python": (frozenset({"-W", "-X", "-Q"}), frozenset({"-c"})),
    "pypy": (frozenset({"-W", "-X"}), frozenset({"-c"})),
    "bash": (frozenset({"-o", "-O", "+o", "+O"}), frozenset({"-c"})),
    "sh": (frozenset({"-o", "+o"}), frozenset({"-c"})),
    "dash": (frozenset({"-o", "+o"}), frozenset({"-c"})),
    "zsh": (frozenset({"-o", "+o"}), frozenset({"-c"})),
    "ksh": (frozenset({"-o", "+o"}), frozenset({"-c"})),
    "node": (frozenset({"-r", "--require", "--import"}), frozenset({"-e", "--eval", "-p"})),
    "ruby": (frozenset({"-r", "-I"}), frozenset({"-e"})),
    "perl": (frozenset({"-I", "-M"}), frozenset({"-e", "-E"})),
    "Rscript": (frozenset(), frozenset({"-e"})),
    "julia": (frozenset({"-t", "--threads", "-p", "--project"}), frozenset({"-e", "--eval"})),
    "lua": (frozenset({"-l"}), frozenset({"-e"})),
    "php": (frozenset({"-d", "-c"}), frozenset({"-r"})),
}
"""Interpreters (their basename, ``python3.11`` as ``python``), with their options that
take a value as the next word: their first other word is the script a default name
takes."""

LAUNCHERS = frozenset(
    {
        "torchrun",
        "accelerate",
        "deepspeed",
        "uv",
        "uvx",
        "deno",
        "bun",
        "poetry",
        "pipenv",
        "conda",
        "mamba",
        "micromamba",
        "pixi",
        "hatch",
        "mpirun",
        "mpiexec",
        "apptainer",
        "singularity",
        "srun",
    }
)
"""Programs that start another one after options of their own (whose values cannot be
told from the program): a default name takes the first word that names a script
(:data:`SCRIPT_SUFFIXES`) or an interpreter (named as above)."""

SCRIPT_SUFFIXES = (
    ".py",
    ".sh",
    ".bash",
    ".zsh",
    ".R",
    ".r",
    ".jl",
    ".js",
    ".mjs",
    ".ts",
    ".rb",
    ".pl",
    ".lua",
    ".php",
    ".ipynb",
)


_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})


def _inline_cluster(interpreter: str | None, word: str) -> bool:
    """``bash -lc '...'``, ``sh -ec '...'``: options run together, ``c`` among them (the
    line is inline code, not a script: ``bash -lc 'echo'`` was named ``echo``)."""
    return (
        interpreter in _SHELLS
        and word.startswith("-")
        and not word.startswith("--")
        and "c" in word[1:]
        and word[1:].isalpha()
    )


def _interpreter(base: str) -> str | None:
    """The :data:`INTERPRETERS` entry ``base`` is (``python3.11``: ``python``)."""
    if base in INTERPRETERS:
        return base
    stem = base.rstrip("0123456789.")
    for name in ("python", "pypy"):
        if stem == name or (base.startswith(name) and stem in (name, name + "-dbg")):
            return name
    return None


def _script_of(words: list[str], start: int, base: str) -> str:
    """The script (or Python module) ``base`` runs from ``words[start:]``; empty if none
    (inline code, a REPL, a launcher's word that names nothing known)."""
    interpreter = _interpreter(base)
    if interpreter is None and base not in LAUNCHERS:
        return ""
    takes_value, inline = INTERPRETERS.get(interpreter or "", (frozenset(), frozenset()))
    python = interpreter in ("python", "pypy")
    k = start
    while k < len(words):
        word = words[k]
        if word in inline or _inline_cluster(interpreter, word):
            return ""  # (inline code: the interpreter's own name says as much)
        module = None
        if word in ("-m", "--module") and k + 1 < len(words):
            module, k = words[k + 1], k + 1
        elif python and word.startswith("-m") and len(word) > 2:
            module = word[2:]  # (python3 -mpkg)
        if module is not None and (python or base in LAUNCHERS):
            if module not in MODULE_LAUNCHERS:
                return module
            return _script_of(words, k + 1, "torchrun") or module
        if word.startswith(("-", "+")) and word not in ("-", "--"):
            k += 2 if word in takes_value else 1
            continue
        name = _basename(word)
        if interpreter is not None:
            return name if word not in ("-", "--") else ""
        if name.endswith(SCRIPT_SUFFIXES) or word.startswith("./"):
            return name
        if _interpreter(name) is not None or name in LAUNCHERS:
            return _script_of(words, k + 1, name) or name
        k += 1
    return ""


def _is_assignment(word: str) -> bool:
    name, sep, _ = word.partition("=")
    return bool(sep) and name.isidentifier()


_DEPENDENCY = 'a job id, or {"job": ID, "any_exit": true}'


# Fields whose type pydantic would say in its own words ("Input should be a valid
# dictionary or instance of RetrySpec"; "a valid boolean" of a port number).
_PLAIN = {
    "retry": 'must be an object such as {"max_attempts": 10}',
    "port": "must be true (each replica gets a free $PORT) or false (none)",
}

# Fields of two types: pydantic says why the value is neither, member by member, in its
# own words ("snapshot.bool: Input should be a valid boolean; snapshot.SnapshotInfo.source:
# Field required"). Said once, in ours. (A snapshot's record is the engine's to make.)
_EITHER = {
    "domain": "must be a domain's name or a list of names",
    "snapshot": "must be true (run a copy of cwd made at submission) or false",
}


def _in_our_words(item: Any) -> str:
    said = TYPE_WORDS.get(str(item.get("type"))) or constraint_words(item)
    if said is None:
        return str(item["msg"]).removeprefix("Value error, ")
    try:
        shown = json.dumps(item.get("input"))
    except (TypeError, ValueError):
        shown = repr(item.get("input"))
    return f"{said}, not {shown[:40]}"


def _describe(err: ValidationError) -> tuple[str, str | None]:
    parts = []
    field: str | None = None
    items = err.errors()
    # A dependency is a job id or an object: pydantic says why it is neither member, in
    # its own words ("depends_on.0.Dependency.job: Field required; ... Input should be a
    # valid integer"). Said once per item instead, unless a rule of ours said more.
    ruled = {
        item["loc"][1]
        for item in items
        if item["loc"][:1] == ("depends_on",)
        and isinstance(item.get("ctx", {}).get("error"), wire.FieldError)
    }
    for item in items:
        loc = item["loc"]
        if loc[:1] == ("depends_on",) and len(loc) > 1 and isinstance(loc[1], int):
            if not isinstance(item.get("ctx", {}).get("error"), wire.FieldError):
                field = field or "depends_on"
                if loc[1] not in ruled:
                    parts.append(f"depends_on.{loc[1]}: must be {_DEPENDENCY}")
                continue
        # Validator wrappers ("function-after[check_job_id(), int]") name no field.
        # (nor do union members: "depends_on.0.Dependency.job")
        where = ".".join(
            str(p) for p in item["loc"] if "function-" not in str(p) and p != "Dependency"
        )
        if field is None and item["loc"] and isinstance(item["loc"][0], str):
            field = item["loc"][0]
        if loc and loc[0] in _EITHER and (item["type"] != "extra_forbidden" or len(loc) > 1):
            # (a key inside one, too: "unknown field 'snapshot.SnapshotInfo.dir'" named a
            # class of ours: tester h122)
            parts.append(f"{loc[0]}: {_EITHER[str(loc[0])]}")
            continue
        error = item.get("ctx", {}).get("error")
        if isinstance(error, wire.FieldError):
            msg = error.detail  # the rule's own words, without its field name
            if not where:  # (the whole spec's check: the error names its field)
                field = field or error.field
                where = "" if msg.startswith(f"{error.field}") else error.field
        else:
            msg = _PLAIN.get(where) or _in_our_words(item)
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown field '{where}'")
        elif where:
            parts.append(f"{where}: {msg}")
        else:
            parts.append(msg)
    # A union field reports one error per member; keep each distinct line once.
    return "; ".join(dict.fromkeys(parts)), field


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
        message, field = _describe(err)
        raise SpecError(message, field) from None
