"""The MLflow mirror redacts by rule, from the ledger: a job's env and command secrets and a
plan's never reach params, tags or artifacts, whatever their length and whichever process
mirrors them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from autoresearch import tracking
from autoresearch.util.redact import is_secret
from tests.conftest import wait_state
from tests.tracking.conftest import client, make_decision, make_loop

SCRIPT = "import os, sys; print('key', os.environ['OPENAI_API_KEY'], 'hf', os.environ['HF_TOKEN']); print(*sys.argv[1:])"
LONG = "hf_0123456789abcdef"


def _all_text(c: Any, run_id: str, dest: Path, path: str = "") -> str:
    """Every artifact of a run, concatenated."""
    out = []
    for item in c.list_artifacts(run_id, path or None):
        if item.is_dir:
            out.append(_all_text(c, run_id, dest, item.path))
        else:
            out.append(Path(c.download_artifacts(run_id, item.path, str(dest))).read_text())
    return "\n".join(out)


def _assert_clean(blob: str, *values: str) -> None:
    for value in values:
        assert value not in blob, f"{value!r} leaked into MLflow: {blob[:2000]}"


def test_a_syncer_whose_env_lacks_the_secret_still_redacts_params_and_logs(
        api: Any, quiet: Path, tmp_path: Path) -> None:
    view = api.submit({"command": [sys.executable, "-c", SCRIPT, "--api-key", "sk-123", "--token=xyz", "--lr", "1"],
                       "workdir": str(tmp_path), "experiment": "secrets",
                       "env": {"OPENAI_API_KEY": "ab", "HF_TOKEN": LONG, "NOTE": f"uses {LONG}"}})
    wait_state(api, view.id, "succeeded")
    # the mirror runs in another process, started with none of these secrets in its environment
    env = {k: v for k, v in os.environ.items() if not is_secret(k)}
    proc = subprocess.run([sys.executable, "-m", "autoresearch.cli", "sync"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

    c = client(tracking.tracking_uri(quiet))
    exp = c.get_experiment_by_name("secrets")
    (run,) = c.search_runs([exp.experiment_id])
    params = run.data.params
    assert params["command"].endswith("--api-key [REDACTED] --token=[REDACTED] --lr 1")
    assert params["env.NOTE"] == "uses [REDACTED]"
    assert not any(is_secret(k.split(".")[-1]) for k in params)
    log = _all_text(c, run.info.run_id, tmp_path)
    assert "key [REDACTED] hf [REDACTED]" in log and "--api-key [REDACTED] --token=[REDACTED] --lr 1" in log
    _assert_clean(json.dumps([params, run.data.tags]) + log, "sk-123", "xyz", LONG, " ab ")


def test_loop_plan_and_decisions_hide_the_plans_secrets(api: Any, quiet: Path, tmp_path: Path) -> None:
    plan = {"name": "sec", "objective": "loss", "space": {"lr": [0.1]},
            "trial": {"command": "python train.py --api-key sk-999 --lr {lr}", "env": {"WANDB_API_KEY": "w1",
                                                                                         "HF_TOKEN": LONG}}}
    loop = make_loop(api, "sec", plan)
    make_decision(api, loop, "launch", inputs={"command": ["python", "train.py", "--api-key", "sk-999"],
                                               "note": f"token {LONG}"})
    tracking.record_llm_call(api._ledger, loop_id=loop, decision_id=None, name="propose", model="m",
                             inputs={"messages": [f"the plan says sk-999 and {LONG}"]}, outputs="w1",
                             started_at=1.0, ended_at=2.0)
    payload = api._ledger.one("SELECT payload FROM tracking_outbox")["payload"]
    _assert_clean(payload, "sk-999", LONG, '"w1"')
    tracking.sync()

    c = client(tracking.tracking_uri(quiet))
    (run,) = c.search_runs([c.get_experiment_by_name("sec").experiment_id],
                           filter_string="tags.`autoresearch.kind` = 'loop'")
    artifacts = _all_text(c, run.info.run_id, tmp_path)
    stored = json.loads(Path(c.download_artifacts(run.info.run_id, "plan.json", str(tmp_path))).read_text())
    assert stored["trial"]["env"] == {"WANDB_API_KEY": "[REDACTED]", "HF_TOKEN": "[REDACTED]"}
    assert stored["trial"]["command"] == "python train.py --api-key [REDACTED] --lr {lr}"
    assert run.data.params["trial.command"] == "python train.py --api-key [REDACTED] --lr {lr}"
    _assert_clean(artifacts + json.dumps(run.data.params), "sk-999", LONG, '"w1"')
