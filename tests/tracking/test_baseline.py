"""A --ci gate's baseline looked up in a real MLflow store: by run id, by a loop's parent run (its best
trial), by experiment (its best finished run), and every miss refused with a hint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import NotFoundError, SpecError
from autoresearch.loop.plan import parse_plan


def gated(tmp_path: Path, metric: str = "loss") -> Any:
    return parse_plan({"name": "n", "objective": {"metric": metric}, "trial": {"command": "true {x}"},
                       "space": {"x": [1]}, "gate": {"metric": metric, "max_regression": "1%"}}, base_dir=tmp_path)


def test_baseline_from_mlflow(api: Any, home: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{home}/mlflow.db")  # the store the home's mirror writes to
    exp = client.create_experiment("nightly")

    def run(value: float | None, finished: bool = True, parent: str | None = None) -> str:
        tags = {"mlflow.parentRunId": parent} if parent else None
        run_id = client.create_run(exp, tags=tags).info.run_id
        if value is not None:
            client.log_metric(run_id, "loss", value)
        if finished:
            client.set_terminated(run_id)
        return str(run_id)

    plain = run(1.0)
    run(0.9)
    run(0.1, finished=False)  # still running: not a baseline
    loop = run(None)
    run(0.95, parent=loop)
    run(0.97, parent=loop)

    best = api.resolve_baseline("nightly", gated(tmp_path))
    assert (best.kind, best.value) == ("mlflow-experiment", 0.9) and "experiment nightly" in best.source
    assert api.resolve_baseline(plain, gated(tmp_path)).value == 1.0
    assert api.resolve_baseline(f"run:{plain}", gated(tmp_path)).value == 1.0
    child = api.resolve_baseline(loop, gated(tmp_path))
    assert child.value == 0.95 and f"of MLflow run {loop}" in child.source

    with pytest.raises(NotFoundError) as missing:
        api.resolve_baseline("0" * 32, gated(tmp_path))
    assert "no MLflow run" in missing.value.message and missing.value.hint
    with pytest.raises(NotFoundError) as unknown:
        api.resolve_baseline("nightlies", gated(tmp_path))
    assert "nightly" in unknown.value.hint
    with pytest.raises(SpecError) as no_metric:
        api.resolve_baseline("nightly", gated(tmp_path, "acc"))
    assert "no finished run with metric 'acc'" in no_metric.value.message
    with pytest.raises(SpecError) as run_no_metric:
        api.resolve_baseline(plain, gated(tmp_path, "acc"))
    assert "has no metric 'acc' (its metrics: loss)" in run_no_metric.value.message
