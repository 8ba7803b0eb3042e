"""`stockade completion bash|zsh|fish`: shell completion scripts generated from the argument parser.

Written from the parser itself (subcommands, their options, an option's choices) rather than with a
completion library: the parser is flat (one level of subcommands) and the scripts stay small.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["completion_script"]


@dataclass(frozen=True)
class _Option:
    flags: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...]


@dataclass(frozen=True)
class _Command:
    name: str
    help: str
    options: tuple[_Option, ...]
    choices: tuple[str, ...]
    """The choices of its positional argument, if it has any (`completion bash|zsh|fish`)."""


def _commands(parser: argparse.ArgumentParser) -> list[_Command]:
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: str(choice.help or "") for choice in subs._choices_actions}
    commands = []
    for name, sub in subs.choices.items():
        options: list[_Option] = []
        choices: tuple[str, ...] = ()
        for action in sub._actions:
            if action.option_strings:
                options.append(
                    _Option(
                        tuple(action.option_strings),
                        str(action.help or "").replace("%%", "%"),
                        action.nargs != 0,
                        tuple(map(str, action.choices or ())),
                    )
                )
            elif action.choices:
                choices = tuple(map(str, action.choices))
        commands.append(_Command(name, helps.get(name, ""), tuple(options), choices))
    return commands


def _bash(commands: list[_Command]) -> str:
    cases = []
    for command in commands:
        words = " ".join([*command.choices, *(f for o in command.options for f in o.flags)])
        cases.append(f"    {command.name}) words='{words}' ;;")
    names = " ".join(c.name for c in commands)
    return "\n".join(
        [
            "# bash completion for stockade (`stockade completion bash`)",
            "_stockade() {",
            '  local cur="${COMP_WORDS[COMP_CWORD]}" words',
            '  if [ "$COMP_CWORD" -eq 1 ]; then',
            f"    COMPREPLY=($(compgen -W '{names} --help --version' -- \"$cur\"))",
            "    return",
            "  fi",
            '  case "${COMP_WORDS[1]}" in',
            *cases,
            "    *) words='' ;;",
            "  esac",
            '  if [[ "$cur" == -* || -n "$words" && "${COMP_WORDS[1]}" == completion ]]; then',
            '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
            "  fi",
            "}",
            "complete -o default -F _stockade stockade",
        ]
    )


def _quote_zsh(text: str) -> str:
    return text.replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def _zsh(commands: list[_Command]) -> str:
    lines = [
        "#compdef stockade",
        "# zsh completion for stockade (`stockade completion zsh`)",
        "_stockade() {",
    ]
    lines.append("  local -a commands")
    lines.append("  commands=(")
    lines.extend(f"    '{c.name}:{_quote_zsh(c.help)}'" for c in commands)
    lines.append("  )")
    lines.append("  if (( CURRENT == 2 )); then _describe command commands; return; fi")
    lines.append("  case $words[2] in")
    for command in commands:
        specs = []
        for option in command.options:
            value = (
                ":value:(" + " ".join(option.choices) + ")"
                if option.choices
                else (":value:_files" if option.takes_value else "")
            )
            for flag in option.flags:
                specs.append(f"'{flag}[{_quote_zsh(option.help)}]{value}'")
        if command.choices:
            specs.append(f"'1:value:({' '.join(command.choices)})'")
        else:
            specs.append("'*:file:_files'")
        lines.append(f"    {command.name}) shift words; (( CURRENT-- )); _arguments {' '.join(specs)} ;;")
    lines.extend(["  esac", "}", '_stockade "$@"'])
    return "\n".join(lines)


def _quote_fish(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(commands: list[_Command]) -> str:
    names = " ".join(c.name for c in commands)
    lines = ["# fish completion for stockade (`stockade completion fish`)", "complete -c stockade -f"]
    for command in commands:
        lines.append(
            f"complete -c stockade -n 'not __fish_seen_subcommand_from {names}' -a {command.name}"
            f" -d {_quote_fish(command.help)}"
        )
        seen = f"-n '__fish_seen_subcommand_from {command.name}'"
        if command.choices:
            lines.append(f"complete -c stockade {seen} -a '{' '.join(command.choices)}'")
        for option in command.options:
            flags = " ".join(
                f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}" for flag in option.flags
            )
            value = " -r -F" if option.takes_value else ""
            lines.append(f"complete -c stockade {seen} {flags}{value} -d {_quote_fish(option.help)}")
    return "\n".join(lines)


_SHELLS = {"bash": _bash, "zsh": _zsh, "fish": _fish}


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser` for `shell` (bash, zsh or fish)."""
    return _SHELLS[shell](_commands(parser))
