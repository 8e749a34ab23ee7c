"""The ``autoresearch`` command: the face for people at a terminal and for CI.

One module per group of commands, each with ``add_parser(sub)`` (argparse only: every
call imports them all) and ``run(args) -> int`` (which imports what it needs):
:mod:`.jobs` (submit, status, list, logs, metrics, cancel, nodes, cordon), :mod:`.health`
(this machine's GPUs; Slurm's health program), :mod:`.loop` (``autoresearch plan.yaml``, run,
schema, report), :mod:`.serve` (the MCP server), :mod:`.tracking` (ui, sync), :mod:`.backends` (profiles and whether
each answers) and :mod:`.completion` (shell completion scripts). They reach the system only through
:class:`autoresearch.api.Api` (:func:`._facade.open_api`); :mod:`._render` prints. No command module
imports this package (it imports them all): what a command needs from it comes in ``args``.

Reads print rich tables for people and JSON with ``--json``. Errors print message
and hint, exit 2 for usage/spec errors and 1 for runtime failures; tracebacks only
with ``--debug``. The global flags (``--debug``, ``--home``) work before or after the
command; a closed pipe (``autoresearch list --json | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from typing import Any, NoReturn

from autoresearch import __version__
from autoresearch.cli import _deferred, backends, completion, doctor, health, jobs, loop, serve, tracking
from autoresearch.errors import AutoresearchError

COMMANDS = (jobs, backends, health, doctor, serve, tracking, loop, completion)  # the order of `autoresearch --help`
EXIT_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


def _global_flags(p: argparse.ArgumentParser, suppress: bool) -> None:
    """``--debug`` and ``--home``; on a subcommand their default is SUPPRESS, so a value given
    before the command is not reset by the subparser's default."""
    extra: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument("--debug", action="store_true", help="show tracebacks", **extra)
    p.add_argument("--home", help="state directory (default $AUTORESEARCH_HOME or ~/.autoresearch)",
                   **({"default": None} | extra))


def build_parser(only: str = "") -> argparse.ArgumentParser:
    """The whole command line; with ``only`` (a command's name), that command's parser alone,
    or the whole one if no command has that name. Building all 27 costs ~10 ms of every start."""
    _Formatter._terminal_width = None  # looked up again for this command line (a test may change $COLUMNS between two)
    p = _Parser(prog="autoresearch", description="Run ML research jobs and loops on GPUs.")
    p.add_argument("--version", action="version", version=f"autoresearch {__version__}",
                   help="print the version and exit")
    _global_flags(p, suppress=False)
    p.set_defaults(whole_parser=build_parser)  # (``completion`` writes its script from the whole command line)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    one = _OneCommand(sub, only)
    for module in COMMANDS:
        module.add_parser(one if only else sub)
    if only and not one.found:
        return build_parser()  # a typo or an unknown word: argparse's own error lists every command
    for command in sub.choices.values():
        _global_flags(command, suppress=True)
    return p


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, finding the terminal's width without importing shutil: argparse
    builds one at every ``add_argument`` (to check the metavar), and shutil costs ~3 ms of a start.
    The width is looked up once per command line built (a submit's parser made 33 formatters, each
    asking the environment and the terminal), not at every ``add_argument``."""

    _terminal_width: int | None = None  # (the terminal's width less argparse's own margin; reset by build_parser)

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            if _Formatter._terminal_width is None:
                from autoresearch.cli._table import terminal_columns

                _Formatter._terminal_width = terminal_columns() - 2
            width = _Formatter._terminal_width
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help uses :class:`_Formatter`; its subcommands' parsers are its kind too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


class _OneCommand:
    """The subparsers action as one command sees it built: ``add_parser`` builds the parser of the
    command named (or aliased) ``name`` and hands every other command a :class:`_Unbuilt`."""

    def __init__(self, sub: Any, name: str) -> None:
        self._sub, self._name, self.found = sub, name, False

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if self._name != name and self._name not in kwargs.get("aliases", ()):
            return _Unbuilt()
        self.found = True
        return self._sub.add_parser(name, **kwargs)


class _Unbuilt:
    """A command's parser that is not built: whatever is added to it goes nowhere."""

    def __getattr__(self, _name: str) -> Any:
        return lambda *_args, **_kwargs: self


def main(argv: list[str] | None = None) -> int:
    _deferred.defer("inspect")  # dataclasses imports it for docstrings ours have (~15 ms of a start)
    argv = sys.argv[1:] if argv is None else argv
    if _first_word(argv).endswith((".yaml", ".yml")):
        argv = ["run", *argv]  # `autoresearch plan.yaml` runs the loop
    parser = build_parser(_command_alone(argv))
    args = parser.parse_args(argv)
    if not args.cmd:
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except AutoresearchError as err:
        if args.debug:
            raise
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_pipe()


def entry() -> NoReturn:
    """The ``autoresearch`` process (the console script, ``python -m autoresearch.cli``): :func:`main`,
    then out without the interpreter's teardown.

    Freeing every module and object at exit, and closing the ledger's connection (the last one
    checkpoints the ledger and removes its ``-wal`` file), cost a command ~20 ms of its ~140 on a
    2-core VM: more than anything it imports. What a normal exit does that matters still happens:
    output flushed, exit handlers run (``atexit``: the MCP server's last pass, logging's flush, a
    temporary directory's removal), and committed transactions are in the WAL file, which the next
    opener of the ledger reads as ever. A command that leaves a thread running (a non-daemon one,
    which the interpreter would wait for), or an interpreter without ``atexit._run_exitfuncs``,
    exits the normal way; so does one that raised (its traceback and status are the interpreter's)."""
    try:
        code = main()
    except SystemExit as stop:  # argparse's --help, --version and usage errors
        if stop.code is not None and not isinstance(stop.code, int):
            raise
        code = stop.code or 0
    threading = sys.modules.get("threading")
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None or (threading is not None and any(
            not thread.daemon for thread in threading.enumerate() if thread is not threading.main_thread())):
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        run_exit_handlers()  # (each at most once: it clears them)
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream: the normal exit says so, as before
        sys.exit(code)
    os._exit(code)


def _first_word(argv: list[str]) -> str:
    """The first word that is not a flag nor the value of ``--home``."""
    words = iter(argv)
    for word in words:
        if word == "--home":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return ""


def _command_alone(argv: list[str]) -> str:
    """The command whose parser alone parses ``argv``; "" (all of them) when the command line's own
    help is asked for before it (``autoresearch --help status`` lists every command)."""
    word = _first_word(argv)
    before = argv[:argv.index(word)] if word else argv
    return "" if {"-h", "--help"} & set(before) else word


def _closed_pipe() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as other Unix tools do.

    stdout is pointed at /dev/null so the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_PIPE
