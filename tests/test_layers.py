"""Layers point down (docs/architecture.md): checked on the source with ``ast``, no import needed.

* only ``autoresearch/tracking/`` imports mlflow;
* the engine (and what lies below it) never imports the mirror, the loop, the facade or a face;
* the mirror reads the ledger: it imports neither the runtime, nor the loop, the facade or a face;
* the loop asks the mirror through the outbox: it never imports the mirror;
* faces (the command line, the MCP tools) import only the facade, the errors, the facade's
  views and their own package;
* SQL is written only in the stores.

The last two rules are where the code is going, not where it is: today's exceptions are
named below, one module path each, so a *new* violation fails at once. Fixing one makes
its entry stale, and a stale entry fails too: delete it, the list only shrinks.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autoresearch"

MIRROR = ("autoresearch/tracking/",)
LOOP = ("autoresearch/loop/",)
ENGINE = ("autoresearch/engine/", "autoresearch/store/", "autoresearch/backends/", "autoresearch/health/",
          # below the engine: it imports them, so they obey the same rule
          "autoresearch/util/", "autoresearch/errors.py", "autoresearch/report.py")
FACES = ("autoresearch/cli/", "autoresearch/tools/")
ABOVE_ENGINE = ("autoresearch.tracking", "autoresearch.loop", "autoresearch.api", "autoresearch.cli",
                "autoresearch.tools")
FACADE = ("autoresearch.api", "autoresearch.errors", "autoresearch.views", "autoresearch.__version__",
          "autoresearch.loop.views",  # the loop half's views, as the facade returns them
          "autoresearch.tools.server")  # `autoresearch serve` hosts the MCP face
STORES = ("autoresearch/store/", "autoresearch/loop/store.py", "autoresearch/tracking/_store.py",
          "autoresearch/health/store.py")
# The package root: the facade (and the views it returns), the errors and the trial side; every other
# module lives in its layer's package (engine/, store/, util/, loop/, tracking/, backends/, ...).
ROOT_MODULES = {"__init__.py", "api.py", "views.py", "_views_more.py", "errors.py", "report.py"}

# Known violations, to shrink (issue 8: one facade; stores own the SQL). Do not add to them.
FACE_IMPORTS_ALLOWED: set[str] = set()
SQL_ALLOWED: set[str] = set()

_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|PRAGMA|WITH|REPLACE)\s")


def modules() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py"))


def under(path: str, places: tuple[str, ...]) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in places)


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@cache
def tree(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text(), path)


@cache
def imports(path: str) -> frozenset[str]:
    """Every module ``path`` imports anywhere (top level, in functions, under TYPE_CHECKING),
    ``from a import b`` counted as both ``a`` and ``a.b``; ``import_module("x")`` too."""
    parts = path[:-3].split("/")
    package = parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[:len(package) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")):
            found.add(node.args[0].value)
    return frozenset(found)


def writes_sql(path: str) -> bool:
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.match(node.value):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "_connect" and path != "autoresearch/store/ledger.py":
            return True  # a raw connection is SQL by other means
    return False


def face_reaches_past_the_facade(path: str) -> list[str]:
    own = "autoresearch.tools" if path.startswith("autoresearch/tools/") else path[:-3].replace("/", ".")
    if path.startswith("autoresearch/cli/"):
        own = "autoresearch.cli"
    return sorted(name for name in imports(path)
                  if within(name, ("autoresearch",)) and name != "autoresearch" and not within(name, (*FACADE, own)))


def test_the_checks_see_the_package() -> None:
    paths = modules()
    assert "autoresearch/engine/runtime.py" in paths and "autoresearch/tracking/_sync.py" in paths
    assert "mlflow" in {n.split(".")[0] for n in imports("autoresearch/tracking/_sync.py")}
    assert writes_sql("autoresearch/store/ledger.py") and not writes_sql("autoresearch/engine/scheduler.py")
    assert "autoresearch.backends" in imports("autoresearch/engine/runtime.py")
    for place in (*ENGINE, *STORES, *FACE_IMPORTS_ALLOWED, *SQL_ALLOWED):
        if place.endswith("/"):
            assert any(p.startswith(place) for p in paths), place
        elif place not in ("autoresearch/cli/",):
            assert (ROOT / place).exists(), f"{place} is listed here but does not exist: update tests/test_layers.py"


@pytest.mark.parametrize("path", modules())
def test_only_the_mirror_imports_mlflow(path: str) -> None:
    if under(path, MIRROR):
        return
    heavy = sorted(name for name in imports(path) if name.split(".")[0] == "mlflow")
    assert not heavy, f"{path} imports {heavy}: only autoresearch/tracking/ may import mlflow (write to the ledger " \
                      "or the outbox, and let the mirror read it)"


@pytest.mark.parametrize("path", [p for p in modules() if under(p, ENGINE)])
def test_the_engine_imports_nothing_above_it(path: str) -> None:
    upward = sorted(name for name in imports(path) if within(name, ABOVE_ENGINE))
    assert not upward, f"{path} (engine) imports {upward}: the engine writes the ledger; what it needs from " \
                       "the mirror lives in autoresearch/store/outbox.py"


@pytest.mark.parametrize("path", [p for p in modules() if under(p, MIRROR)])
def test_the_mirror_reads_the_ledger_not_the_engine(path: str) -> None:
    upward = sorted(name for name in imports(path) if within(name, ("autoresearch.engine.runtime", *ABOVE_ENGINE))
                    and not within(name, ("autoresearch.tracking",)))
    assert not upward, f"{path} (the mirror) imports {upward}: read the ledger, and a backend through the " \
                       "backends registry"


@pytest.mark.parametrize("path", [p for p in modules() if under(p, LOOP)])
def test_the_loop_asks_the_mirror_through_the_outbox(path: str) -> None:
    mirror = sorted(name for name in imports(path) if within(name, ("autoresearch.tracking",)))
    assert not mirror, f"{path} (the loop) imports {mirror}: record what the mirror should do with " \
                       "autoresearch/store/outbox.py, and let the mirror read the ledger"


@pytest.mark.parametrize("path", [p for p in modules() if under(p, FACES)])
def test_faces_import_only_the_facade(path: str) -> None:
    reached = face_reaches_past_the_facade(path)
    if path in FACE_IMPORTS_ALLOWED:
        assert reached, f"{path} imports only the facade now: delete it from FACE_IMPORTS_ALLOWED"
        return
    assert not reached, f"{path} (a face) imports {reached}: call autoresearch.api instead"


@pytest.mark.parametrize("path", [p for p in modules() if not under(p, STORES)])
def test_sql_only_in_the_stores(path: str) -> None:
    if path in SQL_ALLOWED:
        assert writes_sql(path), f"{path} has no SQL now: delete it from SQL_ALLOWED"
        return
    assert not writes_sql(path), f"{path} writes SQL: put the query in a store ({', '.join(STORES)})"


def test_the_package_root_holds_the_facade_the_errors_and_the_trial_side() -> None:
    extra = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ROOT_MODULES)
    assert not extra, f"autoresearch/{extra[0]} lies in the package root: put it in its layer's package " \
                      "(engine/, store/, util/, ...; docs/architecture.md draws them)"


def test_a_submit_and_its_attempt_never_load_the_mirror(tmp_path: Path) -> None:
    """The same rule, alive: the facade, a pass and an attempt's start and end (tracking on)
    import neither autoresearch.tracking nor mlflow."""
    import os
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from autoresearch.api import Api\n"
        "api = Api(sys.argv[1])\n"
        "job = api.submit({'command': [sys.executable, '-c', 'print(1)'], 'workdir': sys.argv[1]}).id\n"
        "deadline = time.time() + 30\n"
        "while api.status(job).state != 'succeeded' and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(api.status(job).state, sorted(m for m in sys.modules if m.startswith(('mlflow', 'autoresearch.tr'))))\n")
    env = {**os.environ, "AUTORESEARCH_TRACKING": "on", "AUTORESEARCH_SYNC": "off"}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "succeeded []", out.stdout
