"""What a job's command line runs: its argv, with no shell where a shell would add nothing.

A ``shell`` spec is a line for ``sh -c``. Most lines in a queue file are plain commands
(``python train.py --lr 0.1``): words of ordinary characters separated by spaces, with no
quoting, expansion, globbing, redirection or control operator. For such a line the shell
does nothing but look the first word up in ``PATH`` and exec it (dash and bash exec the
last simple command of ``-c`` in place), so the launcher can exec it directly and save a
process per job. Anything else, including shell keywords, builtins without a program of
their own and variable assignments, still goes through ``sh -c``.
"""

from __future__ import annotations

import re

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


def shell_argv(line: str) -> list[str]:
    """How a line runs through the shell."""
    return ["sh", "-c", line]
