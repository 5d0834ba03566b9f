"""What a job's command line runs: its argv, with no shell where a shell would add nothing.

A ``shell`` spec is a line for ``sh -c``. Most lines in a queue file are plain commands
(``python train.py --lr 0.1``): words of ordinary characters separated by spaces, with no
quoting, expansion, globbing, redirection or control operator. For such a line the shell
does nothing but look the first word up in ``PATH`` and exec it (dash and bash exec the
last simple command of ``-c`` in place), so the launcher can exec it directly and save a
process per job. Anything else, including shell keywords, builtins without a program of
their own and variable assignments, still goes through ``sh -c``.

A line that needs the shell but is one simple command (``python3 -m http.server $PORT``:
an expansion, quotes, redirections, leading ``VAR=value`` words) runs as ``sh -c 'exec
LINE'``: dash forks for the last command of ``-c`` and waits, so the job's pid would be
the shell's, and ``kill PID`` would end the shell and leave the program running. With
``exec`` the program takes the shell's pid. Lists, pipelines, subshells, command
substitutions, keywords and builtins run as written.
"""

from __future__ import annotations

import re
import shlex

# Characters that mean nothing to a POSIX shell inside a word (no quote, $, `, \, glob,
# ~, #, redirection, operator, brace or bracket).
_PLAIN_LINE = re.compile(r" *[A-Za-z0-9_./:,+@%=-]+(?: +[A-Za-z0-9_./:,+@%=-]+)* *")

# First words the shell handles itself: reserved words, and builtins that are not (or
# behave unlike) a program of the same name in PATH.
_SHELL_WORDS = frozenset(
    "! { } case do done elif else esac fi for function if in select then time until while "
    ". : alias bg break builtin cd command continue declare eval exec exit export fc fg "
    "getopts hash jobs let local read readonly return set shift source times trap type "
    "typeset ulimit umask unalias unset wait".split()
)


# Builtins of sh that are also programs where a system has them (``kill``, ``echo``): a
# plain line naming one whose program is not there still runs, through the shell.
SHELL_BUILTIN_PROGRAMS = frozenset("[ chdir echo false kill printf pwd test true".split())


def plain_argv(line: str) -> list[str] | None:
    """The argv ``sh -c line`` would exec, or ``None`` if the shell is needed for it.

    Args:
        line: A shell command line.

    Returns:
        The words of a plain command whose first word is a program name (not a keyword,
        builtin or ``NAME=value`` assignment); ``None`` otherwise.
    """
    if not _PLAIN_LINE.fullmatch(line):
        return None
    words = line.split()
    first = words[0]
    if first in _SHELL_WORDS or "=" in first:
        return None
    return words


# Leading assignments whose values need no quoting (the value of one that does, stops the
# match, and the line then runs as written).
_ASSIGNMENTS = re.compile(r"\s*(?:[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_./:,+@%=-]*\s+)*")
# Shell operators that make a line more than one simple command (redirections are fine).
_OPERATOR_CHARS = frozenset(";|()")


def exec_line(line: str) -> str | None:
    """``line`` with ``exec`` before its command, when it is one simple command (so the
    program replaces the shell); ``None`` when the line is anything else."""
    if "\n" in line or "`" in line:
        return None
    prefix = _ASSIGNMENTS.match(line)
    head = prefix.group(0) if prefix else ""
    rest = line[len(head) :]
    lexer = shlex.shlex(rest, posix=True, punctuation_chars="();<>|&")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: the shell says so
        return None
    if not tokens or tokens[0] in _SHELL_WORDS or "=" in tokens[0]:
        return None
    for token in tokens:
        if _OPERATOR_CHARS & set(token) or token.startswith("&"):
            return None
    return f"{head}exec {rest}"


# A word the shell takes as it is: no quote, expansion, glob or tilde in it.
_LITERAL_WORD = re.compile(r"[A-Za-z0-9_./:,+@%-]+")


def literal_program(line: str) -> str | None:
    """The program a one-simple-command line runs, where the shell takes its name as
    written (``vllm serve m --port $PORT``: ``vllm``); ``None`` where it cannot be known
    before the shell runs (an expansion or quote in the name, ``PATH=`` set before it,
    a keyword, a builtin, or more than one command)."""
    if exec_line(line) is None:
        return None
    prefix = _ASSIGNMENTS.match(line)
    head = prefix.group(0) if prefix else ""
    if "PATH=" in head:
        return None
    first = line[len(head) :].split(None, 1)[0]
    if not _LITERAL_WORD.fullmatch(first) or first in SHELL_BUILTIN_PROGRAMS:
        return None
    return first


def shell_argv(line: str) -> list[str]:
    """How a line runs through the shell: ``sh -c LINE``, or ``sh -c 'exec LINE'`` for one
    simple command (see the module's docstring)."""
    return ["sh", "-c", exec_line(line) or line]
