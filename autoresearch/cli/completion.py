"""``autoresearch completion bash|zsh|fish``: a shell completion script, written from the parser.

The script is static (commands, flags, choices, their help): completing a word never
starts Python. Install it with, e.g., ``autoresearch completion bash >
~/.local/share/bash-completion/completions/autoresearch``.
"""

from __future__ import annotations

import argparse
from typing import Any

SHELLS = ("bash", "zsh", "fish")
INSTALL = {
    "bash": "autoresearch completion bash > ~/.local/share/bash-completion/completions/autoresearch",
    "zsh": "autoresearch completion zsh > \"${fpath[1]}/_autoresearch\"  (then restart zsh)",
    "fish": "autoresearch completion fish > ~/.config/fish/completions/autoresearch.fish",
}


def add_parser(sub: Any) -> None:
    c = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)",
                       description="Print a completion script for your shell. " +
                                   "; ".join(f"{k}: {v}" for k, v in INSTALL.items()))
    c.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    c.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # The whole command line's parser, as the package that assembles it hands it to every command
    # (``whole_parser``): this module does not import that package, which imports this one.
    print(script(args.whole_parser(), args.shell))
    return 0


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands' parsers, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings]


def _positional_choices(parser: argparse.ArgumentParser) -> list[str]:
    return [str(c) for a in parser._actions if not a.option_strings and a.choices and
            not isinstance(a, argparse._SubParsersAction) for c in a.choices]


def _help(action: argparse.Action | argparse.ArgumentParser | None) -> str:
    text = getattr(action, "help", None) or getattr(action, "description", None) or ""
    return " ".join(str(text).split()).replace("%%", "%")


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](parser)


def _bash(parser: argparse.ArgumentParser) -> str:
    cmds = commands(parser)
    top = " ".join(o for a in _options(parser) for o in a.option_strings)
    cases = []
    for name, sub in cmds.items():
        words = [o for a in _options(sub) for o in a.option_strings] + _positional_choices(sub)
        cases.append(f"        {name}) words=\"{' '.join(words)}\" ;;")
    body = "\n".join(cases)
    return f"""# bash completion for autoresearch (autoresearch completion bash)
_autoresearch() {{
    local cur cmd words i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            --home) ((i++)) ;;
            -*) ;;
            *) cmd="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "{' '.join(cmds)} {top}" -- "$cur"))
        [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=($(compgen -f -X '!*.y*ml' -- "$cur"))
        return
    fi
    case "$cmd" in
{body}
        *) words="" ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=($(compgen -f -- "$cur"))
}}
complete -o filenames -F _autoresearch autoresearch
"""


def _zsh(parser: argparse.ArgumentParser) -> str:
    # zsh runs the bash function through bashcompinit: one source of truth for both shells.
    return ("#compdef autoresearch\n# zsh completion for autoresearch (autoresearch completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + _bash(parser).split("\n", 1)[1])


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(parser: argparse.ArgumentParser) -> str:
    cmds = commands(parser)
    lines = ["# fish completion for autoresearch (autoresearch completion fish)",
             "complete -c autoresearch -f"]
    for name in cmds:
        lines.append(f"complete -c autoresearch -n __fish_use_subcommand -a {name} "
                     f"-d {_fish_quote(_help(_command_help(parser, name)) or name)}")
    for scope, p in [("__fish_use_subcommand", parser)] + [
            (f"'__fish_seen_subcommand_from {name}'", sub) for name, sub in cmds.items()]:
        for action in _options(p):
            flags = " ".join(f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}" for o in action.option_strings)
            takes = "" if action.nargs == 0 else " -r"
            choices = f" -a {_fish_quote(' '.join(map(str, action.choices)))}" if action.choices else ""
            lines.append(f"complete -c autoresearch -n {scope} {flags}{takes}{choices} "
                         f"-d {_fish_quote(_help(action))}")
        values = _positional_choices(p) if p is not parser else []
        if p is cmds.get("run"):  # the plan is a file
            lines.append(f"complete -c autoresearch -n {scope} -F")
        if values:
            lines.append(f"complete -c autoresearch -n {scope} -a {_fish_quote(' '.join(values))}")
    return "\n".join(lines) + "\n"


def _command_help(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return next((c for c in action._choices_actions if c.dest == name), None)
    return None
