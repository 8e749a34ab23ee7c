"""Issue 16: a loop's first ending does not load the code that records endings on its way to the
next launch.

Recording an ending needs the health checks (their modules and log signatures) and the metric
lines' patterns: ~35-40 ms of imports and compiles on a 2-core VM, which the pass that recorded the
first ending paid between that ending and the launch of the trial queued behind it (a wave of 16
short trials waited for it). The controller loads them while its first trials run
(``Runtime.prepare_endings``). Counted, not timed: the modules a pass with an ending imports, in a
fresh interpreter (this one has imported them all already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CODE = textwrap.dedent("""
    import json, sys
    from autoresearch.engine import runtime as R
    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    plan = parse_plan({"name": "first", "objective": {"metric": "loss"},
                       "trial": {"command": sys.executable + " -c \\"print('loss: {x}')\\"", "grace": 1},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": 4, "parallel": 2}}, base_dir=".")
    passes = []
    record = R.Runtime.finalize_many

    def spy(self, ended):
        before = set(sys.modules)
        record(self, ended)
        if ended:
            passes.append(sorted(m for m in set(sys.modules) - before if m.startswith("autoresearch")))

    R.Runtime.finalize_many = spy
    view = Controller(plan, home=sys.argv[1]).run()
    print(json.dumps({"passes": passes, "succeeded": view.counts.get("succeeded", 0),
                      "loaded": "autoresearch.health.monitor" in sys.modules}))
""")


def test_the_pass_that_records_a_loops_first_ending_imports_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "AUTORESEARCH_HOME": str(tmp_path / "home"), "AUTORESEARCH_TRACKING": "off",
           "AUTORESEARCH_GPUS": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CODE, str(tmp_path / "home")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["succeeded"] == 4
    assert result["loaded"]  # the health checks did run on these endings
    assert result["passes"], "no pass recorded an ending"
    assert result["passes"][0] == [], f"the first ending's pass imported {result['passes'][0]}"
    assert all(p == [] for p in result["passes"])
