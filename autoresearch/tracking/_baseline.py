"""A CI gate's baseline from MLflow (``--baseline RUN_ID`` or ``--baseline EXPERIMENT``).

Only this package imports mlflow, so the facade asks here when the baseline is not a
summary file. Looked up in the store the ledger's mirror writes to (the URI bound at its
first sync, else ``$MLFLOW_TRACKING_URI``, else the home's ``mlflow.db``):

* a run id (32 hex digits, or ``run:ID``): the run's value of the metric; a loop's parent
  run has none of its own, so its best child (trial) run answers;
* an experiment name (or ``experiment:NAME``): its best finished run by the metric.

Every miss is a NotFoundError/SpecError with a hint (exit 2 before any trial runs); a store
that cannot be reached is a TrackingError.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from autoresearch.errors import NotFoundError, SpecError, TrackingError

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_RUNS = 1000  # runs of an experiment looked at for its best


def is_run_id(ref: str) -> bool:
    return bool(RUN_ID.match(ref)) or ref.startswith("run:")


def _store_uri(home: str | os.PathLike[str] | None) -> str:
    from autoresearch.store.ledger import Ledger
    from autoresearch.tracking import tracking_uri
    from autoresearch.tracking._store import MirrorStore

    ledger = Ledger(home)
    return MirrorStore(ledger).state("uri") or tracking_uri(ledger.home)


def _value(run: Any, metric: str) -> float | None:
    value = run.data.metrics.get(metric)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _best(runs: list[Any], metric: str, goal: str) -> tuple[Any, float] | None:
    scored = [(run, v) for run in runs if (v := _value(run, metric)) is not None]
    if not scored:
        return None
    sign = 1.0 if goal == "minimize" else -1.0
    return min(scored, key=lambda rv: sign * rv[1])


def find_baseline(home: str | os.PathLike[str] | None, ref: str, metric: str, goal: str) -> dict[str, Any]:
    """{kind, value, source, run_id} of the baseline ``ref`` names."""
    from autoresearch.tracking._sync import check_uri, fail_fast_http

    uri = _store_uri(home)
    check_uri(uri)
    hint_store = f"the MLflow store is {uri}; set MLFLOW_TRACKING_URI to the one that holds the baseline"
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        raise NotFoundError(f"baseline {ref!r}: there is no MLflow store at {uri}", hint=hint_store)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    with fail_fast_http():
        client = MlflowClient(tracking_uri=uri)
        try:
            if is_run_id(ref):
                return _from_run(client, ref.removeprefix("run:"), metric, goal, hint_store)
            return _from_experiment(client, ref.removeprefix("experiment:"), metric, goal, hint_store)
        except MlflowException as err:
            if "RESOURCE_DOES_NOT_EXIST" in str(getattr(err, "error_code", "")):
                raise NotFoundError(f"baseline {ref!r} is not in the MLflow store", hint=hint_store) from None
            raise TrackingError(f"looking up baseline {ref!r} in MLflow failed: {str(err).splitlines()[0][:200]}",
                                hint=hint_store) from None


def _from_run(client: Any, run_id: str, metric: str, goal: str, hint: str) -> dict[str, Any]:
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise NotFoundError(f"no MLflow run {run_id!r}", hint=hint) from None
    value = _value(run, metric)
    if value is not None:
        return {"kind": "mlflow-run", "value": value, "run_id": run_id, "source": f"MLflow run {run_id}"}
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'",
                                  max_results=MAX_RUNS)
    best = _best([c for c in children if c.info.status == "FINISHED"], metric, goal)
    if best is None:
        have = ", ".join(sorted(run.data.metrics)[:10]) or "none"
        raise SpecError(f"MLflow run {run_id} has no metric {metric!r} (its metrics: {have})",
                        hint="pick a run (or a loop's run whose trials) logged that metric")
    child, value = best
    return {"kind": "mlflow-run", "value": value, "run_id": child.info.run_id,
            "source": f"best trial run {child.info.run_id} of MLflow run {run_id}"}


def _from_experiment(client: Any, name: str, metric: str, goal: str, hint: str) -> dict[str, Any]:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        names = [e.name for e in client.search_experiments(max_results=10)]
        raise NotFoundError(f"baseline {name!r} is not a summary file, an MLflow run id nor an experiment",
                            hint=(f"experiments: {', '.join(names)}; " if names else "") + hint)
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'", max_results=MAX_RUNS)
    best = _best(list(runs), metric, goal)
    if best is None:
        raise SpecError(f"experiment {name!r} has no finished run with metric {metric!r}",
                        hint="pick a baseline whose runs logged that metric")
    run, value = best
    return {"kind": "mlflow-experiment", "value": value, "run_id": run.info.run_id,
            "source": f"best run {run.info.run_id} of MLflow experiment {name}"}
