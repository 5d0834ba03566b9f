"""``gpulayer-tui completion bash|zsh|fish``: a completion script for that shell.

The word lists are read from the argparse grammar (:mod:`.grammar`) when the script is
generated, so they cannot drift from the command line: every subcommand, every option
(with its help for zsh and fish), which options take a value and what kind (a job id: a
``job_id_arg`` or ``job_ids_arg`` type; a domain or a directory: marked with
``grammar.completes``; a file: metavar ``PATH``; a choice). Job ids and domain names
come from the running engine through the hidden ``gpulayer-tui __complete jobs|domains
PREFIX`` (:mod:`.complete`).

bash and zsh share the scanner (which subcommand, which positional, is an option's value
wanted) and the tables, written in the syntax both read; fish has its own ``complete``
lines.
"""

from __future__ import annotations

import argparse

from .grammar import build_parser, job_id_arg, job_ids_arg

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from collections.abc import Iterable

SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,")


class Option:
    """One option of the grammar: its flags, the kind of value it takes ("" for none)."""

    def __init__(self, flags: list[str], kind: str, help_text: str) -> None:
        self.flags = flags
        self.kind = kind
        self.help = help_text


class Command:
    """A subcommand: its help, its options, and the kind of each positional."""

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text
        self.options: list[Option] = []
        self.positionals: list[str] = []
        self.repeats = False
        """Its last positional takes any number of values (``cancel 41 42 ...``)."""


def _kind(action: argparse.Action) -> str:
    """What a value of ``action`` is: jobs, domains, dirs, files, command, choice:A B, or
    value (anything); "" when it takes none. Marked ones (:func:`.grammar.completes`) may
    also be jobs:active (active jobs only), domains:by-action (``domain ACTION NAME``: the
    domains ACTION applies to) and list:A B (a comma list of those words)."""
    if action.option_strings and action.nargs == 0:
        return ""
    marked = getattr(action, "completes", None)
    if marked:
        assert set(str(marked)) <= SAFE | {":", " "}, marked  # (it goes into scripts)
        return str(marked)
    if action.type in (job_id_arg, job_ids_arg):
        return "jobs"
    if action.choices:
        words = [str(c) for c in action.choices]
        assert all(w and set(w) <= SAFE for w in words), words  # (they go into scripts)
        return "choice:" + " ".join(words)
    if action.metavar == "PATH":
        return "files"
    if action.nargs == argparse.REMAINDER:
        return "command"
    return "value"


def _help(action: argparse.Action) -> str:
    text = action.help if action.help and action.help != argparse.SUPPRESS else ""
    return " ".join(text.split())


def _options(parser: argparse.ArgumentParser) -> list[Option]:
    return [
        Option(list(a.option_strings), _kind(a), _help(a))
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS
    ]


def grammar() -> tuple[list[Option], list[Command]]:
    """The global options and the subcommands, as the argparse grammar has them."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {a.dest: _help(a) for a in sub._choices_actions}
    commands = []
    for name, subparser in sub.choices.items():
        command = Command(name, helps.get(name, ""))
        command.options = _options(subparser)
        plain = [a for a in subparser._actions if not a.option_strings and a.dest != "help"]
        command.positionals = [_kind(a) for a in plain]
        command.repeats = bool(plain) and plain[-1].nargs in ("+", "*")
        commands.append(command)
    return _options(parser), commands


def _check_word(word: str) -> str:
    # Flags and names come from our own grammar; refuse anything a shell would read twice.
    assert word and set(word) <= SAFE, word
    return word


def _case_lines(pairs: Iterable[tuple[list[str], str]], variable: str) -> str:
    """``case`` branches (sh syntax: bash and zsh read it alike) setting ``variable``."""
    groups: dict[str, list[str]] = {}
    for patterns, value in pairs:
        groups.setdefault(value, []).extend(patterns)
    return "\n".join(
        f"        {'|'.join(patterns)}) {variable}='{value}' ;;"
        for value, patterns in groups.items()
    )


def _shared(global_options: list[Option], commands: list[Command]) -> str:
    """The functions bash and zsh share: the tables and the scanner."""
    kinds = [
        ([f"{c.name}:{_check_word(f)}" for f in o.flags], o.kind)
        for c in commands
        for o in c.options
        if o.kind
    ]
    kinds += [([f":{_check_word(f)}" for f in o.flags], o.kind) for o in global_options if o.kind]
    options = [
        ([_check_word(c.name)], " ".join(f for o in c.options for f in o.flags)) for c in commands
    ]
    positionals = [
        ([f"{c.name}:{i}"], kind)
        for c in commands
        for i, kind in enumerate(c.positionals, start=1)
        if kind != "command"
    ]
    positionals += [([f"{c.name}:*"], "command") for c in commands if "command" in c.positionals]
    # (`cancel 41 <TAB>` offered nothing: only its first job id was completed: h49)
    positionals += [
        ([f"{c.name}:*"], c.positionals[-1])
        for c in commands
        if c.repeats and c.positionals[-1] not in ("command", "")
    ]
    global_words = " ".join(f for o in global_options for f in o.flags)
    names = " ".join(c.name for c in commands)
    return f"""\
_gpulayer_tui_subcommands='{names}'

# What the value of option $2 of subcommand $1 is ("" for a flag or an unknown option).
_gpulayer_tui_kind() {{
    case "$1:$2" in
{_case_lines(kinds, "_gpl_kind")}
        *) _gpl_kind='' ;;
    esac
}}

# The options of subcommand $1 (the global ones without a subcommand).
_gpulayer_tui_options() {{
    case "$1" in
{_case_lines(options, "_gpl_words")}
        *) _gpl_words='{global_words}' ;;
    esac
}}

# What positional $2 of subcommand $1 is.
_gpulayer_tui_positional() {{
    case "$1:$2" in
{_case_lines(positionals, "_gpl_kind")}
        *) _gpl_kind='' ;;
    esac
}}

# Read the words before the cursor: the subcommand (_gpl_sub), positionals seen
# (_gpl_pos) and the first of them (_gpl_first: `domain drain`), inside submit's command
# (_gpl_rest=1), an option's value wanted next (_gpl_want: its kind). bash splits
# --opt=value into three words at the "=".
_gpulayer_tui_scan() {{
    _gpl_sub='' _gpl_pos=0 _gpl_rest=0 _gpl_want='' _gpl_first=''
    while [ $# -gt 0 ]; do
        if [ "$_gpl_rest" = 1 ]; then
            _gpl_pos=$((_gpl_pos + 1))
        else
            case "$1" in
                --) [ "$_gpl_sub" = submit ] && _gpl_rest=1 ;;
                -*=*) ;;
                -*)
                    _gpulayer_tui_kind "$_gpl_sub" "$1"
                    if [ -n "$_gpl_kind" ]; then
                        shift
                        if [ "${{1-}}" = "=" ]; then shift; fi
                        if [ $# -eq 0 ]; then _gpl_want=$_gpl_kind; return; fi
                    fi ;;
                *)
                    if [ -z "$_gpl_sub" ]; then
                        _gpl_sub=$1
                    else
                        _gpl_pos=$((_gpl_pos + 1))
                        [ "$_gpl_pos" = 1 ] && _gpl_first=$1
                        _gpulayer_tui_positional "$_gpl_sub" '*'
                        [ "$_gpl_kind" = command ] && _gpl_rest=1
                    fi ;;
            esac
        fi
        shift
    done
}}
"""


def bash_script() -> str:
    """The bash completion script."""
    global_options, commands = grammar()
    return f"""\
# gpulayer-tui completion for bash: eval "$(gpulayer-tui completion bash)" in ~/.bashrc
# (generated from this installation's grammar by `gpulayer-tui completion bash`)
{_shared(global_options, commands)}
# The word $1 as the shell will read it (its backslashes and an opening quote gone), in
# _gpl_word: file names are looked up by what they are, not by what was typed.
_gpulayer_tui_dequote() {{
    local w=$1 i c
    _gpl_word=
    case "$w" in
        \\'*) w=${{w#\\'}}; _gpl_word=${{w%\\'}}; return ;;
        \\"*) w=${{w#\\"}}; w=${{w%\\"}} ;;
    esac
    for ((i = 0; i < ${{#w}}; i++)); do
        c=${{w:i:1}}
        if [[ $c == \\\\ ]]; then ((i++)); c=${{w:i:1}}; fi
        _gpl_word+=$c
    done
}}

# compgen's candidates ($1: -f, -d or -c) for the word $2, one per line (names with
# spaces stay whole; none is globbed), into COMPREPLY.
_gpulayer_tui_compgen() {{
    local _gpl_word
    _gpulayer_tui_dequote "$2"
    mapfile -t COMPREPLY < <(compgen "$1" -- "$_gpl_word")
}}

# Add the candidates of kind $1 for the word $2 to COMPREPLY.
_gpulayer_tui_values() {{
    local line
    case "$1" in
        jobs|jobs:*|domains|domains:*)
            # (in the engine's order, active jobs first: bash sorted them as text, 1 10 11
            # ... 2, finished ones among the running: tester h74; bash 4.4 and later)
            compopt -o nosort 2>/dev/null
            local kind=$1
            [ "$kind" = domains:by-action ] && kind=domains:$_gpl_first
            while IFS= read -r line; do
                [ -n "$line" ] && COMPREPLY+=("${{line%%$'\\t'*}}")
            done < <("$_gpl_cmd" __complete "$kind" "$2" 2>/dev/null) ;;
        choice:*) COMPREPLY=($(compgen -W "${{1#choice:}}" -- "$2")) ;;
        list:*)
            # (the words given already are not offered again: "queued,queued": h172)
            local head= words=" ${{1#list:}} " word
            [[ $2 == *,* ]] && head=${{2%,*}},
            for word in ${{head//,/ }}; do words=${{words// $word / }}; done
            COMPREPLY=($(compgen -P "$head" -W "$words" -- "${{2##*,}}")) ;;
        dirs) compopt -o filenames 2>/dev/null; _gpulayer_tui_compgen -d "$2" ;;
        files) compopt -o filenames 2>/dev/null; _gpulayer_tui_compgen -f "$2" ;;
        command)
            if [ "$_gpl_pos" -gt 0 ]; then  # the command's arguments
                compopt -o filenames 2>/dev/null; _gpulayer_tui_compgen -f "$2"
            else
                _gpulayer_tui_compgen -c "$2"
            fi ;;
    esac
}}

_gpulayer_tui() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} _gpl_cmd=${{COMP_WORDS[0]}}
    local _gpl_sub _gpl_pos _gpl_rest _gpl_want _gpl_kind _gpl_words _gpl_first
    COMPREPLY=()
    [[ $_gpl_cmd == "~/"* ]] && _gpl_cmd=$HOME/${{_gpl_cmd#"~/"}}
    _gpulayer_tui_scan "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"
    if [ "$cur" = "=" ] && [ -n "$_gpl_want" ]; then cur=''; fi
    if [ -n "$_gpl_want" ]; then
        _gpulayer_tui_values "$_gpl_want" "$cur"
    elif [[ $cur == -* && $_gpl_rest != 1 ]]; then
        _gpulayer_tui_options "$_gpl_sub"
        COMPREPLY=($(compgen -W "$_gpl_words" -- "$cur"))
    elif [ -z "$_gpl_sub" ]; then
        COMPREPLY=($(compgen -W "$_gpulayer_tui_subcommands" -- "$cur"))
    else
        _gpulayer_tui_positional "$_gpl_sub" $((_gpl_pos + 1))
        [ -z "$_gpl_kind" ] && _gpulayer_tui_positional "$_gpl_sub" '*'
        _gpulayer_tui_values "$_gpl_kind" "$cur"
    fi
    return 0
}}
complete -F _gpulayer_tui gpulayer-tui
"""


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def zsh_script() -> str:
    """The zsh completion script (also an autoloadable ``_gpulayer-tui`` in $fpath)."""
    global_options, commands = grammar()
    described = " ".join(_zsh_quote(f"{c.name}:{c.help}" if c.help else c.name) for c in commands)
    return f"""\
#compdef gpulayer-tui
# gpulayer-tui completion for zsh: eval "$(gpulayer-tui completion zsh)" in ~/.zshrc, after
# compinit (or save it as _gpulayer-tui in a directory of $fpath).
# (generated from this installation's grammar by `gpulayer-tui completion zsh`)
{_shared(global_options, commands)}
_gpulayer_tui_values() {{
    local line
    local -a values shown
    local kind=$1
    [[ $kind == domains:by-action ]] && kind=domains:$_gpl_first
    case "$kind" in
        jobs|jobs:*|domains|domains:*)
            for line in "${{(@f)$("$_gpl_cmd" __complete "$kind" "$PREFIX" 2>/dev/null)}}"; do
                [[ -z $line ]] && continue
                values+=("${{line%%$'\\t'*}}")
                shown+=("${{line%%$'\\t'*}}  ${{line#*$'\\t'}}")
            done
            (( ${{#values}} )) \\
                && compadd -V "gpulayer-${{kind%%:*}}" -l -d shown -- "${{values[@]}}" ;;
        choice:*) compadd -- ${{=1#choice:}} ;;
        list:*)
            compset -P '*,'
            local -a given; given=(${{(s:,:)IPREFIX}})
            compadd -S '' -F given -- ${{=1#list:}} ;;
        dirs) _files -/ ;;
        files) _files ;;
        command) if (( _gpl_pos > 0 )); then _files; else _command_names -e; fi ;;
    esac
}}

_gpulayer_tui() {{
    local _gpl_cmd=${{words[1]}} _gpl_sub _gpl_pos _gpl_rest _gpl_want _gpl_kind _gpl_words
    local _gpl_first
    local -a subcommands
    _gpl_cmd=${{~_gpl_cmd}}
    _gpulayer_tui_scan "${{(@)words[2,CURRENT-1]}}"
    if [[ -z $_gpl_want && $_gpl_rest != 1 && $PREFIX == --*=* ]]; then
        _gpulayer_tui_kind "$_gpl_sub" "${{PREFIX%%=*}}"
        _gpl_want=$_gpl_kind
        compset -P '*='
    fi
    if [[ -n $_gpl_want ]]; then
        _gpulayer_tui_values "$_gpl_want"
    elif [[ $PREFIX == -* && $_gpl_rest != 1 ]]; then
        _gpulayer_tui_options "$_gpl_sub"
        compadd -- ${{=_gpl_words}}
    elif [[ -z $_gpl_sub ]]; then
        subcommands=({described})
        _describe -t subcommands 'gpulayer-tui subcommand' subcommands
    else
        _gpulayer_tui_positional "$_gpl_sub" $((_gpl_pos + 1))
        [[ -z $_gpl_kind ]] && _gpulayer_tui_positional "$_gpl_sub" '*'
        _gpulayer_tui_values "$_gpl_kind"
    fi
}}

if [[ ${{zsh_eval_context[-1]}} == loadautofunc ]]; then
    _gpulayer_tui "$@"
else
    compdef _gpulayer_tui gpulayer-tui
fi
"""


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_option(condition: str, option: Option) -> str:
    parts = ["complete -c gpulayer-tui", f"-n {_fish_quote(condition)}"]
    for flag in option.flags:
        parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
    kind = option.kind
    if kind.split(":")[0] in ("jobs", "domains"):
        parts.append(f"-x -k -a {_fish_quote(f'(__gpulayer_tui_values {kind})')}")
    elif kind.startswith("list:"):
        words = kind[len("list:") :]
        parts.append(f"-x -a {_fish_quote(f'(__gpulayer_tui_list {words})')}")
    elif kind.startswith("choice:"):
        parts.append(f"-x -a {_fish_quote(kind[len('choice:') :])}")
    elif kind == "files":
        parts.append("-r -F")
    elif kind == "dirs":
        parts.append("-x -a '(__fish_complete_directories)'")
    elif kind:
        parts.append("-x")
    if option.help:
        parts.append(f"-d {_fish_quote(option.help)}")
    return " ".join(parts)


def fish_script() -> str:
    """The fish completion script."""
    global_options, commands = grammar()
    lines = [
        "# gpulayer-tui completion for fish: gpulayer-tui completion fish | source",
        "# (in ~/.config/fish/config.fish; or save it as",
        "# ~/.config/fish/completions/gpulayer-tui.fish)",
        "# (generated from this installation's grammar by `gpulayer-tui completion fish`)",
        "function __gpulayer_tui_values",
        "    set -l cmd (commandline -opc)[1]",
        "    set -l kind $argv[1]",
        "    if test $kind = domains:by-action",  # (`domain ACTION <Tab>`: ACTION's domains)
        "        set -l seen 0",
        "        set kind domains:",
        "        for word in (commandline -opc)[2..-1]",
        "            if test $seen = 0",
        "                test $word = domain; and set seen 1",
        "            else if not string match -q -- '-*' $word",
        "                set kind domains:$word",
        "                break",
        "            end",
        "        end",
        "    end",
        "    command $cmd __complete $kind (commandline -ct | string replace -r '^-[^=]*=' '')"
        " 2>/dev/null",
        "end",
        "# The words $argv after the last comma of the word being typed (a comma list).",
        "function __gpulayer_tui_list",
        "    set -l head (commandline -ct | string replace -r '^-[^=]*=' ''"
        " | string match -r '^.*,')",
        "    for word in $argv",
        "        contains -- $word (string split , -- $head); or echo $head$word",
        "    end",
        "end",
        "# The number of positionals after subcommand $argv[1] is $argv[2].",
        "function __gpulayer_tui_at",
        "    set -l words (commandline -opc)",
        "    set -l seen 0",
        "    set -l count 0",
        "    for word in $words[2..-1]",
        "        if test $seen = 0",
        "            test $word = $argv[1]; and set seen 1",
        "        else if not string match -q -- '-*' $word",
        "            set count (math $count + 1)",
        "        end",
        "    end",
        "    test $seen = 1; or return 1",
        "    test $count = $argv[2]; and return 0",
        "    test (count $argv) -gt 2; and test $count -gt $argv[2]",  # ("more": a list)
        "end",
        "complete -c gpulayer-tui -f",
    ]
    for option in global_options:
        lines.append(_fish_option("__fish_use_subcommand", option))
    for command in commands:
        lines.append(
            f"complete -c gpulayer-tui -n __fish_use_subcommand -a {command.name}"
            + (f" -d {_fish_quote(command.help)}" if command.help else "")
        )
    for command in commands:
        seen = f"__fish_seen_subcommand_from {command.name}"
        for option in command.options:
            lines.append(_fish_option(seen, option))
        for index, kind in enumerate(command.positionals):
            last = index == len(command.positionals) - 1 and command.repeats
            condition = f"__gpulayer_tui_at {command.name} {index}" + (" more" if last else "")
            if kind.split(":")[0] in ("jobs", "domains"):
                lines.append(
                    f"complete -c gpulayer-tui -n {_fish_quote(condition)}"
                    f" -k -a {_fish_quote(f'(__gpulayer_tui_values {kind})')}"
                )
            elif kind.startswith("choice:"):
                lines.append(
                    f"complete -c gpulayer-tui -n {_fish_quote(condition)}"
                    f" -a {_fish_quote(kind[len('choice:') :])}"
                )
            elif kind == "command":
                lines.append(f"complete -c gpulayer-tui -n {_fish_quote(seen)} -F")
    return "\n".join(lines) + "\n"


def completion_script(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    return {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[shell]()
