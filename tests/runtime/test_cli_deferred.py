"""The command line's stand-in for a module it may never use (autoresearch/cli/_deferred.py): the
module is imported at the first use of any of its attributes, and then behaves as if imported at
once. Each check runs in a fresh interpreter, where nothing imported ``inspect`` yet."""

from __future__ import annotations

import json
import subprocess
import sys


def run(code: str) -> object:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_dataclass_without_a_docstring_still_gets_the_one_dataclasses_writes() -> None:
    """dataclasses' only use of inspect: the stand-in imports it then, and the docstring is the same."""
    result = run("""
import json, sys
from autoresearch.cli._deferred import defer
defer("inspect")
import dataclasses
deferred = type(sys.modules["inspect"]).__name__
quiet = sorted(m for m in ("ast", "dis", "tokenize") if m in sys.modules)
@dataclasses.dataclass
class Point:
    x: int
    y: float = 0.5
import inspect
print(json.dumps({"deferred": deferred, "quiet": quiet, "doc": Point.__doc__,
                  "real": type(sys.modules["inspect"]).__name__, "same": inspect.signature is dataclasses.inspect.signature,
                  "loaded": sorted(m for m in ("ast", "dis", "tokenize") if m in sys.modules)}))
""")
    assert result == {"deferred": "_Deferred", "quiet": [], "doc": "Point(x: int, y: float = 0.5)", "real": "module",
                      "same": True, "loaded": ["ast", "dis", "tokenize"]}


def test_from_import_and_a_missing_name_behave_as_with_the_module_itself() -> None:
    result = run("""
import json
from autoresearch.cli._deferred import defer
defer("inspect")
from inspect import Parameter
try:
    import inspect
    inspect.no_such_name
except AttributeError as err:
    missing = str(err)
print(json.dumps({"kind": str(Parameter.KEYWORD_ONLY), "missing": missing}))
""")
    assert result == {"kind": "KEYWORD_ONLY", "missing": "module 'inspect' has no attribute 'no_such_name'"}


def test_a_module_imported_already_is_left_alone() -> None:
    result = run("""
import inspect, json, sys
from autoresearch.cli._deferred import defer
defer("inspect")
print(json.dumps(sys.modules["inspect"] is inspect))
""")
    assert result is True


def test_threads_using_the_stand_in_at_once_import_the_module_once() -> None:
    result = run("""
import json, sys, threading
from autoresearch.cli._deferred import defer
defer("inspect")
stand_in = sys.modules["inspect"]
start, got = threading.Barrier(8), []
def use():
    start.wait()
    got.append(stand_in.signature)
threads = [threading.Thread(target=use) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
real = sys.modules["inspect"]
print(json.dumps({"one": len({id(f) for f in got}) == 1 and got[0] is real.signature, "real": real is not stand_in}))
""")
    assert result == {"one": True, "real": True}
