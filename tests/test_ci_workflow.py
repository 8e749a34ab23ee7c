"""examples/ci/nightly.yml is a valid GitHub Actions workflow (check-jsonschema's bundled schema of
GitHub workflows, offline; actionlint does not install here) and runs flags the CLI has."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "ci" / "nightly.yml"
LATER_FLAGS: set[str] = set()  # every flag the workflow passes exists (--backend: a profile, passed only when set)


def workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return dict(data)


def schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_workflow_passes_the_github_workflow_schema(tmp_path: Path) -> None:
    pytest.importorskip("check_jsonschema")
    ok = schema_check(WORKFLOW)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on:", "runs-onn:"))
    assert schema_check(broken).returncode != 0  # the check can fail


def test_workflow_runs_a_plan_nightly_with_reports_artifacts_and_a_pr_comment() -> None:
    from autoresearch.cli import build_parser

    data = workflow()
    cron = data["on"]["schedule"][0]["cron"]
    assert len(cron.split()) == 5 and "workflow_dispatch" in data["on"] and "pull_request" in data["on"]
    job = data["jobs"]["sweep"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    steps = {s.get("name", s.get("uses", "")): s for s in job["steps"]}
    sweep = steps["Sweep"]["run"]
    assert 'autoresearch "$PLAN"' in sweep
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", sweep))
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "run")[1]
    known = {o for action in run._actions for o in action.option_strings}
    assert used - known <= LATER_FLAGS, used - known
    assert {"--ci", "--json", "--junit", "--summary", "--baseline", "--max-wall"} <= used
    wall = shlex.split(job["env"]["MAX_WALL"].split("||")[1].strip(" }'"))[0]
    assert wall.endswith("m") and job["timeout-minutes"] > int(wall[:-1]) + 5  # we stop first, with a report
    uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    paths = " ".join(s["with"]["path"] for s in uploads)
    assert all(s["if"] == "always()" for s in uploads) and "reports/" in paths and "mlflow.db" in paths
    comment = steps["Comment the summary on the pull request"]
    assert "pull_request" in comment["if"] and "reports/summary.md" in comment["run"]
