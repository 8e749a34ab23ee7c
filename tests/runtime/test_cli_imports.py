"""The fast commands import only what they need (issue 16: status, list and submit start in
<= 150 ms; pydantic cost a submit ~150 ms, rich a read ~40-80 ms). A counter, not a timer:
each command runs in a fresh interpreter through the real entry point, and we look at
sys.modules afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("pydantic", "rich", "yaml", "mlflow", "mcp", "anthropic", "openai", "pynvml", "httpx", "optuna")
PROBE = """
import json, sys
before = set(sys.modules)  # what the interpreter loaded at its start (site, a .pth file) costs the command nothing
heavy_names = set(json.loads(sys.argv[2]))
sys.argv = ["autoresearch", *json.loads(sys.argv[1])]
from autoresearch.cli import main
try:
    code = main()
except SystemExit as exit:
    code = exit.code
added = set(sys.modules) - before
heavy = sorted(({name.split(".")[0] for name in added} | added) & heavy_names)  # packages or modules
sys.stdout.flush()
sys.stderr.write("\\nLOADED " + json.dumps({"code": code, "heavy": heavy}) + "\\n")
"""


def loaded(*args: str, env: dict[str, str] | None = None, watch: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of ``watch`` (module names) ``autoresearch ARGS`` has imported when it ends."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(args)), json.dumps(watch)],
                          capture_output=True, text=True, timeout=60, env=env)
    line = next(row for row in proc.stderr.splitlines() if row.startswith("LOADED "))
    result = json.loads(line.removeprefix("LOADED "))
    assert result["code"] in (0, None), f"autoresearch {' '.join(args)} exited {result['code']}: {proc.stderr}"
    return list(result["heavy"])


@pytest.fixture
def job(home: Path) -> str:
    from autoresearch.api import Api

    api = Api(home)
    view = api.submit({"command": [sys.executable, "-c", "print('loss: 0.5')"], "workdir": str(home.parent)})
    from tests.conftest import wait_state

    wait_state(api, view.id, "succeeded")
    return str(view.id)


@pytest.mark.parametrize("args", [
    ("status",), ("status", "{job}"), ("status", "{job}", "--json"), ("list",), ("list", "--json"),
    ("metrics", "{job}"), ("logs", "{job}"), ("nodes",), ("cancel", "{job}"),
    ("submit", "--", "true"), ("submit", "--json", "--gpus", "1", "--env", "A=1", "--timeout", "5m", "--", "true"),
    ("--help",),
])
def test_fast_commands_import_none_of_the_heavy_packages(job: str, args: tuple[str, ...]) -> None:
    assert loaded(*(a.replace("{job}", job) for a in args)) == []


def test_a_submit_through_a_profile_scans_no_installed_distribution(home: Path) -> None:
    """A profile of a built-in kind is checked without the entry-point scan (importlib.metadata reads
    every installed distribution's metadata: ~0.17 s of a CLI submit through a docker profile here),
    and config.yaml's sections are read without inspect (a dataclass with no docstring imports it).
    The first read parses config.yaml (yaml) and keeps it as JSON; the next imports nothing heavy. The
    check can fail: an unknown kind is looked for among the entry points (and its error lists them)."""
    watch = (*HEAVY, "importlib.metadata", "dis", "socket")  # (dis: imported by inspect alone here)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("backends:\n  box: {kind: local}\n")
    assert "yaml" in loaded("submit", "--backend", "box", "--", "true", watch=watch)  # (and what yaml imports)
    assert loaded("submit", "--backend", "box", "--", "true", watch=watch) == []
    (home / "config.yaml").write_text("backends:\n  box: {kind: local}\n  odd: {kind: nosuchkind}\n")
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["submit", "--backend", "box", "--", "true"]),
                           json.dumps(watch)], capture_output=True, text=True, timeout=60)
    assert "unknown kind 'nosuchkind'" in proc.stderr and '"importlib.metadata"' in proc.stderr


def test_the_probe_sees_a_heavy_import_where_one_is_needed(home: Path) -> None:
    """The check can fail: a job spec file needs yaml, and a shape the hand-written fast path
    declines (gpus: 1.0) goes to the pydantic model."""
    spec = home.parent / "job.yaml"
    spec.write_text("command: [\"true\"]\n")
    assert loaded("submit", "-f", str(spec)) == ["yaml"]
    spec.write_text("command: [\"true\"]\ngpus: 1.0\n")
    assert loaded("submit", "-f", str(spec)) == ["pydantic", "yaml"]


def test_a_read_with_nothing_queued_imports_no_scheduler_and_no_error_only_module(job: str) -> None:
    """A pass that has nothing to place does not import the scheduler nor the zygote's client (for
    launches); difflib (did-you-mean hints) and hashlib (an unsafe project name) wait for an error or
    such a name. A submit places and launches its job, so it imports the scheduler and the zygote's
    client (the check can fail), but not socket.py (~4 ms of enums: the client speaks through _socket)."""
    watch = ("autoresearch.engine.scheduler", "autoresearch.backends._zygote", "socket", "difflib", "hashlib")
    for args in (("status",), ("status", job), ("list",), ("list", "--json"), ("logs", job), ("metrics", job)):
        assert loaded(*args, watch=watch) == [], args
    assert loaded("submit", "--", "true", watch=watch) == ["autoresearch.backends._zygote", "autoresearch.engine.scheduler"]


def test_the_fast_commands_build_no_terminal_helper_they_do_not_use(job: str) -> None:
    """argparse's help formatter imports shutil (and with it bz2 and lzma, ~3 ms) for the terminal's
    width at every add_argument, and a table imported textwrap (~2 ms) for cells that fit: neither
    is imported by a command that prints no help and folds no cell. The check can fail: a cell too
    wide for its column is folded, and help is wrapped, by textwrap. (Where the interpreter's site
    imports shutil itself, as a .pth file may, the command is not charged for it.)"""
    watch = ("shutil", "textwrap")
    wide = dict(os.environ, COLUMNS="300")  # (every cell fits)
    for args in (("status",), ("status", job), ("list",), ("submit", "--", "true")):
        assert loaded(*args, env=wide, watch=watch) == [], args
    assert loaded("list", env=dict(os.environ, COLUMNS="40"), watch=watch) == ["textwrap"]
    assert loaded("--help", env=wide, watch=watch) == ["textwrap"]  # help text is wrapped; shutil still not needed


def test_the_fast_commands_never_import_inspect(job: str) -> None:
    """inspect (with ast, dis and tokenize: ~15 ms of a start) was imported by dataclasses for docstrings
    our dataclasses have, and to read a backend's options off its constructor: neither any more
    (cli/_deferred.py, backends.backend_options). ast and dis are imported by inspect alone here, so
    their absence says the deferred inspect was never used. It can fail: ``--version`` does not
    touch it either, but a plan read by the loop does (pydantic), and so would a dataclass with
    no docstring."""
    watch = ("ast", "dis", "tokenize")
    for args in (("status",), ("status", job), ("status", job, "--json"), ("list",), ("list", "--json"),
                 ("submit", "--", "true"), ("--help",)):
        assert loaded(*args, watch=watch) == [], args
    assert sorted(loaded("schema", "plan", watch=watch)) == ["ast", "dis", "tokenize"]


def test_a_submit_imports_no_table_code(job: str) -> None:
    """A submit answers one line (the job's id): it imports neither the renderer of tables nor the
    Unicode database their cell widths need (~1-2 ms of a submit's start). The argument parser asks
    _table for the terminal's width only. The check can fail: a status read draws a table (its box
    is not ASCII, measured with unicodedata)."""
    watch = ("autoresearch.cli._render", "unicodedata")
    for args in (("submit", "--", "true"), ("submit", "--json", "--", "true")):
        assert loaded(*args, watch=watch) == [], args
    assert loaded("status", watch=watch) == ["autoresearch.cli._render", "unicodedata"]


def test_a_submit_makes_only_the_views_it_returns(job: str) -> None:
    """The cluster's, a node's, a metric's, the health and doctor views (autoresearch/_views_more.py) are
    made at their first use, not by every command that imports the facade: a submit or a job's status
    makes none of them; ``nodes`` does (the check can fail). They are the same classes through
    autoresearch.views, as ever."""
    watch = ("autoresearch._views_more",)
    for args in (("submit", "--", "true"), ("status", job), ("list",)):
        assert loaded(*args, watch=watch) == [], args
    assert loaded("nodes", watch=watch) == ["autoresearch._views_more"]
    out = subprocess.run([sys.executable, "-c", "import autoresearch._views_more as M, autoresearch.views as V\n"
                          "names = ('ClusterView', 'DoctorView', 'GpuHealthView', 'HealthView', 'MetricView',"
                          " 'NodeView', 'ProjectUsageView')\n"
                          "print(all(getattr(V, n) is getattr(M, n) for n in names), hasattr(V, 'NoSuchView'))"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "False"]


def test_the_parser_asks_the_terminal_width_once_per_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse makes a help formatter at every add_argument: the width is looked up once per
    parser built, and again for the next (a changed $COLUMNS is seen)."""
    from autoresearch import cli
    from autoresearch.cli import _table

    calls: list[int] = []
    real = _table.terminal_columns
    monkeypatch.setattr(_table, "terminal_columns", lambda: calls.append(1) or real())
    monkeypatch.setenv("COLUMNS", "61")
    parser = cli.build_parser("submit")
    assert len(calls) == 1
    assert parser._get_formatter()._width == 59  # (argparse's margin of 2)
    monkeypatch.setenv("COLUMNS", "101")
    assert cli.build_parser("status")._get_formatter()._width == 99 and len(calls) == 2


COMPILES = """
import json, re, sys
compiled = []
real = re.compile
def spy(pattern, flags=0):
    compiled.append(sys._getframe(1).f_globals.get("__name__", "?"))
    return real(pattern, flags)
re.compile = spy
import autoresearch.api, autoresearch.cli, autoresearch.engine.jobs, autoresearch.engine.spec, autoresearch.engine.isolation
from autoresearch.cli import _render
from autoresearch.backends import profiles
sys.stdout.write(json.dumps(sorted({name for name in compiled if name.startswith("autoresearch")})))
"""


def test_no_regular_expression_of_ours_is_compiled_at_import() -> None:
    """What a command imports compiles none of our patterns (0.15-0.7 ms each; autoresearch/util/_regex.py):
    they are compiled at their first use. The spy sees one when it is: a duration parsed."""
    out = subprocess.run([sys.executable, "-c", COMPILES], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []
    used = COMPILES.replace("sys.stdout.write", "from autoresearch.util.units import parse_duration\n"
                            "parse_duration('5m')\nsys.stdout.write")
    out = subprocess.run([sys.executable, "-c", used], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == ["autoresearch.util._regex"]


def test_masking_a_command_without_flags_or_assignments_compiles_no_pattern() -> None:
    """The secrets of a job's command are looked for with patterns of flags (``--token X``) and
    assignments (``TOKEN=X``), each of which needs its literal ``-`` or ``=``: a command with neither
    (most of what a status read shows) compiles none of them. One with a flag does."""
    masked = "from autoresearch.util.redact import command_secrets, redact_command\n" \
             "assert command_secrets({!r}) == {!r}\nsys.stdout.write"
    plain = COMPILES.replace("sys.stdout.write", masked.format(["python", "train.py", "data"], []))
    out = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []
    flagged = COMPILES.replace("sys.stdout.write", masked.format(["python", "train.py", "--api-key", "s3cr3t"],
                                                                  ["s3cr3t"]))
    out = subprocess.run([sys.executable, "-c", flagged], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == ["autoresearch.util._regex"]


COMPILED = """
import json, sys
sys.argv = ["autoresearch", *json.loads(sys.argv[1])]
from autoresearch.cli import main
try:
    code = main()
except SystemExit as exit:
    code = exit.code
made = []  # our dataclasses whose methods @dataclass compiled from source when the command made them
for name, module in list(sys.modules.items()):
    if name.startswith("autoresearch") and not name.startswith("autoresearch.health"):
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name and "__dataclass_fields__" in value.__dict__:
                if any(getattr(getattr(value.__dict__.get(m), "__code__", None), "co_filename", "") == "<string>"
                       for m in ("__init__", "__repr__", "__eq__", "__setattr__")):
                    made.append(name + "." + value.__qualname__)
sys.stdout.flush()
sys.stderr.write("\\nMADE " + json.dumps({"code": code, "made": sorted(made)}) + "\\n")
"""


def compiled_at_start(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """Our dataclasses (outside autoresearch.health, loaded when a node's check is due) whose methods were
    compiled from source (``@dataclass``: ~0.3 ms a method) in ``autoresearch ARGS``."""
    proc = subprocess.run([sys.executable, "-c", COMPILED, json.dumps(list(args))], capture_output=True, text=True,
                          timeout=60, env=env)
    line = next(row for row in proc.stderr.splitlines() if row.startswith("MADE "))
    result = json.loads(line.removeprefix("MADE "))
    assert result["code"] in (0, None), f"autoresearch {' '.join(args)} exited {result['code']}: {proc.stderr}"
    return list(result["made"])


def test_a_submit_compiles_no_dataclass_method(home: Path) -> None:
    """The classes a submit, a job's status or a list makes (the backend contract's, the job views, the
    profiles, a metric point) are records (autoresearch/util/_record.py): their methods are written out,
    not compiled from source at each start (1.5-3 ms a class: ~25 ms of a submit's 14 classes). Through a
    profile too. The check can fail: ``nodes`` makes the node views with @dataclass."""
    assert compiled_at_start("submit", "--", "true") == []
    boxed = home.parent / "boxed"
    boxed.mkdir()
    (boxed / "config.yaml").write_text("backends:\n  box: {kind: local}\n")
    env = dict(os.environ, AUTORESEARCH_HOME=str(boxed))
    assert compiled_at_start("submit", "--backend", "box", "--json", "--", "true", env=env) == []
    for args in (("list",), ("status", "1")):
        assert compiled_at_start(*args) == [], args
    assert "autoresearch._views_more.NodeView" in compiled_at_start("nodes")


def test_a_submit_that_runs_a_nodes_check_imports_neither_inspect_nor_socket(home: Path) -> None:
    """A pass that finds a node's check due (every poll_interval_s: 30 s by default) loads the health checks
    (autoresearch/health/). Their dataclasses have docstrings (one without makes dataclasses import
    inspect, with ast, dis and tokenize: ~15 ms; the command's stand-in for inspect, cli/_deferred.py, imports
    it then) and the node's name is os.uname's (socket.py: ~4 ms). A fresh home's first submit runs that
    check; the probe sees it (the check can fail: health loaded)."""
    watch = ("autoresearch.health.monitor", "ast", "dis", "tokenize", "socket")
    env = dict(os.environ, AUTORESEARCH_GPUS="1")  # (a node with a GPU: its check is due at once)
    assert loaded("submit", "--", "true", env=env, watch=watch) == ["autoresearch.health.monitor"]
