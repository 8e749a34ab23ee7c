"""The search benchmark's development / test split (autoresearch/sim/data/split.json): defaults are
chosen on development workloads and seeds only; the tuning helper refuses the test set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch.errors import SpecError
from autoresearch.sim.benchset import DATA, check_tuning, load_split
from autoresearch.sim.curves import CurveTable

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_split_covers_every_table_once_with_disjoint_seeds() -> None:
    split = load_split()
    shipped = {p.name.removesuffix(".json.gz") for p in DATA.glob("*.json.gz")}
    named = set(split.dev.workloads) | set(split.test.workloads)
    assert shipped <= named, f"tables in no set: {shipped - named}"
    assert not set(split.dev.workloads) & set(split.test.workloads)
    assert len(named) >= 8 and len(split.test.workloads) >= 4
    assert len(split.test.seeds) >= 20 and not set(split.dev.seeds) & set(split.test.seeds)
    for path in split.paths("test"):
        if path.exists():  # each test table loads and is a real recording
            table = CurveTable.load(path)
            assert len(table.curves) >= 100 and table.max_step == 27


def test_tuning_refuses_test_workloads_and_test_seeds() -> None:
    split = load_split()
    dev, test = split.dev, split.test
    check_tuning(dev.workloads, list(dev.seeds)[:20], split)  # the development set is allowed
    with pytest.raises(SpecError, match="test workload"):
        check_tuning([dev.workloads[0], test.workloads[0]], [0], split)
    with pytest.raises(SpecError, match="not development seeds"):
        check_tuning(dev.workloads, [dev.seeds.start, test.seeds.start], split)
    with pytest.raises(SpecError, match="neither set"):
        check_tuning(["not-recorded"], [0], split)
    with pytest.raises(SpecError, match="at least one"):
        check_tuning([], [0], split)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["test"]["workloads"].append(d["dev"]["workloads"][0]), "both dev and test"),
    (lambda d: d["test"].update(seeds=[50, 120]), "seeds overlap"),
    (lambda d: d["dev"].update(seeds=[5, 5]), "first, end"),
    (lambda d: d["dev"].update(workloads="digits-mlp"), "list of names"),
    (lambda d: d.update(format="other"), "format"),
])
def test_a_broken_split_is_refused(tmp_path: Path, edit, match: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((DATA / "split.json").read_text())
    edit(data)
    (tmp_path / "split.json").write_text(json.dumps(data))
    with pytest.raises(SpecError, match=match):
        load_split(tmp_path / "split.json")
    (tmp_path / "bad.json").write_bytes(b"\x00\xff{")
    with pytest.raises(SpecError, match="cannot read"):
        load_split(tmp_path / "bad.json")


def test_the_benchmark_tuning_mode_refuses_a_test_workload_before_running_anything() -> None:
    test = load_split().test.workloads[0]
    proc = subprocess.run([sys.executable, "bench/bench_search.py", "--tune", "random", "--workloads", test,
                           "--seeds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "test workload" in proc.stderr and "search benchmark" not in proc.stdout
    proc = subprocess.run([sys.executable, "bench/bench_search.py", "--tune", "random", "--seed-start",
                           str(load_split().test.seeds.start), "--seeds", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "not development seeds" in proc.stderr


def test_the_external_baselines_are_not_dependencies_of_the_benchmark_or_the_suite() -> None:
    """bench/baselines.py and bench_search.py import without DEHB, SMAC, Syne Tune or ConfigSpace
    (each is imported only when its strategy runs); the package does not name them."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('dehb', 'smac', 'syne_tune', 'ConfigSpace'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import bench.baselines, bench.bench_search\n"
            "assert bench.baselines.is_external('dehb') and not bench.baselines.is_external('optuna:tpe+hb')\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    lines = [line for line in (ROOT / "pyproject.toml").read_text().splitlines() if not line.lstrip().startswith("#")]
    naming = [line.split("=")[0].strip() for line in lines if "dehb" in line or "syne" in line or "smac" in line]
    assert naming == ["bench-search"], naming  # an optional extra of its own, not the package's or the tests'
