"""Decisions (an artifact and metrics on the loop's run) and LLM calls (traces, from the outbox)."""

from __future__ import annotations

import json
from typing import Any

from autoresearch.store import outbox
from autoresearch.tracking._bulk import write_texts
from autoresearch.tracking._common import DEFAULT_EXPERIMENT, Mirror, SyncReport, _critical
from autoresearch.tracking._entities import loop_experiment, loop_run, loop_secrets, verdict
from autoresearch.util.redact import redact_obj

DECISION_BATCH = 500  # decisions sent together: one artifact upload and one metrics write per loop run


def sync_decisions(syncer: Mirror, report: SyncReport) -> None:
    """The decisions since the cursor, in order, in batches: per loop run, the files of a batch in one
    ``log_artifacts`` and their metrics in one write (a call per decision cost ~2 round trips of the
    store each, most of a loop's mirror time); the cursor moves past a batch once it is sent."""
    while True:  # every batch waiting (a loop's catch-up), not one a pass
        rows = syncer.store.decisions_after(syncer.cursor("decisions"), DECISION_BATCH)
        batch: list[tuple[str, Any]] = []  # (loop run id, decision row), in id order
        for d in rows:
            run_id = loop_run(syncer, d["loop_id"], report)
            if run_id is None:
                break  # the parent run is blocked; its decisions (and those after them) wait in order
            batch.append((run_id, d))
        if batch:
            with syncer.store.prefetch_decisions([d for _, d in batch]):
                _send_decisions(syncer, batch, report)
        if len(batch) < DECISION_BATCH:
            return


def _send_decisions(syncer: Mirror, batch: list[tuple[str, Any]], report: SyncReport) -> None:
    import tempfile
    from pathlib import Path

    from mlflow.entities import Metric

    by_run: dict[str, list[Any]] = {}
    for run_id, d in batch:
        by_run.setdefault(run_id, []).append(d)
    retags: dict[str, dict[str, str]] = {}
    owners: dict[str, str] = {}  # run id -> its entity (a refused run is blocked, the others go on)
    secrets: dict[Any, list[str]] = {}
    syncer.artifact_locations(list(by_run))
    for run_id, decisions in by_run.items():
        metrics = []
        files: list[tuple[str, str]] = []  # (artifact path, text) to write into a local folder together
        with tempfile.TemporaryDirectory(prefix="autoresearch-decisions-") as tmp:
            direct = syncer.artifact_folder(run_id)  # a local folder: the files go straight in
            for d in decisions:
                record = {k: d[k] for k in d.keys()}
                for key in ("inputs", "outputs", "proposer"):
                    try:
                        record[key] = json.loads(record[key] or "{}")
                    except ValueError:
                        pass
                record["trials"] = syncer.store.trials_of_decision(d["id"])
                if d["loop_id"] not in secrets:  # (a batch is one loop's, mostly: its plan read once)
                    secrets[d["loop_id"]] = loop_secrets(syncer, syncer.store.loop(d["loop_id"]))
                # compact: the C encoder (indent= takes the pure-Python one); the UI shows a .json indented
                text = json.dumps(redact_obj(record, secrets[d["loop_id"]]), default=str)
                if direct is not None:
                    files.append((f"decisions/{d['id']:06d}-{d['kind']}.json", text))
                else:
                    (Path(tmp) / f"{d['id']:06d}-{d['kind']}.json").write_text(text)
                ts = int(d["created_at"] * 1000)
                metrics += [Metric(f"decision.{k}", float(d[k] or 0), ts, int(d["id"]))
                            for k in ("tokens_in", "tokens_out", "cost_usd", "latency_s")]
                if d["kind"] == "promote" and d["trial_id"] is not None:
                    _retag_verdicts(syncer, d, run_id, retags, owners)
                elif d["kind"] == "finish":
                    retags.setdefault(run_id, {}).update(best_tags(record.get("outputs")))
            if direct is None:
                syncer.client.log_artifacts(run_id, tmp, "decisions")
            else:
                write_texts(direct, files)
        syncer.log_metrics(run_id, metrics)
        retags.setdefault(run_id, {})["autoresearch.decisions"] = str(decisions[-1]["id"])
        owners[run_id] = f"loop:{decisions[-1]['loop_id']}"
    for run_id, tags in retags.items():
        syncer.log_batch(run_id, tags=tags, entity=owners.get(run_id))
    syncer.flush()  # (one transaction into a SQLite store) before the cursor passes them
    report.decisions += len(batch)
    report.artifacts += len(batch)
    syncer.move_cursor("decisions", batch[-1][1]["id"])


def best_tags(outputs: object) -> dict[str, str]:
    """The loop run's tags for the best its ``finish`` decision named: the trial, its value (the mean
    over its ended seeds), how many seeds, and whether they confirmed it (``true``; ``false``: its
    repeats had not all ended; ``no repeats``: the plan asked for none). Whatever is malformed in the
    decision is left out, never guessed."""
    if not isinstance(outputs, dict):
        return {}
    tags: dict[str, str] = {}
    trial = outputs.get("best_trial")
    if type(trial) is int:
        tags["autoresearch.best_trial"] = tags["autoresearch.incumbent_trial"] = str(trial)
    value = outputs.get("best_value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        tags["autoresearch.best_value"] = repr(float(value))
    seeds = outputs.get("best_seeds")
    if type(seeds) is int and seeds >= 0:
        tags["autoresearch.best_seeds"] = str(seeds)
    if "best_confirmed" in outputs and "autoresearch.best_trial" in tags:
        flag = outputs["best_confirmed"]
        tags["autoresearch.best_confirmed"] = ("true" if flag is True else "false" if flag is False
                                               else "no repeats" if flag is None else "unknown")
    return tags


def _retag_verdicts(syncer: Mirror, d: Any, loop_run_id: str, retags: dict[str, dict[str, str]],
                    owners: dict[str, str]) -> None:
    """A keep-or-discard decision: the trial's verdict, the incumbent it replaced, the loop's incumbent
    (into ``retags``, run id -> tags, sent once per batch: a later decision's tag wins)."""
    try:
        inputs, outputs = json.loads(d["inputs"] or "{}"), json.loads(d["outputs"] or "{}")
    except ValueError:
        return
    trials = [d["trial_id"]]
    if outputs.get("promoted"):
        retags.setdefault(loop_run_id, {})["autoresearch.incumbent_trial"] = str(d["trial_id"])
        if isinstance(inputs.get("incumbent_trial"), int):
            trials.append(inputs["incumbent_trial"])
    for trial_id in trials:
        run_id = syncer.store.run_id_of(f"trial:{trial_id}")
        trial = syncer.store.trial(trial_id)
        if run_id is not None and trial is not None:
            retags.setdefault(run_id, {})["autoresearch.verdict"] = verdict(syncer, trial)
            owners[run_id] = f"trial:{trial_id}"


def sync_outbox(syncer: Mirror, report: SyncReport) -> None:
    rows = outbox.pending(syncer.ledger, "llm_call", 200)
    if not rows:
        return
    import mlflow

    mlflow.set_tracking_uri(syncer.uri)  # tracing exports through the global URI
    for row in rows:
        run_id = loop_run(syncer, row["loop_id"], report) if row["loop_id"] is not None else None
        loop = syncer.store.loop(row["loop_id"])
        exp_id = syncer.experiment_id(loop_experiment(loop) if loop is not None else DEFAULT_EXPERIMENT)
        with _critical(syncer.ledger.home):
            _send_llm_call(syncer, row, exp_id, run_id)
        report.traces += 1


def _send_llm_call(syncer: Mirror, row: Any, exp_id: str, run_id: str | None) -> None:
    fresh = outbox.entry(syncer.ledger, row["id"])
    if fresh is None or fresh["done_at"] is not None:
        return  # sent by another process meanwhile
    key = f"{syncer.home_id}/llm_call:{row['id']}"
    trace_id = None
    if fresh["sent_ref"] == "sending":  # a previous pass may have created it: adopt, never duplicate
        found = syncer.client.search_traces(locations=[exp_id],
                                            filter_string=f"tags.`autoresearch.llm_call` = '{key}'",
                                            max_results=1)
        trace_id = found[0].info.trace_id if found else None
    if trace_id is None:
        syncer.store.sending(row["id"])
        trace_id = _emit_trace(syncer, row, exp_id, run_id, key)
    outbox.mark_sent(syncer.ledger, row["id"], trace_id)


def _emit_trace(syncer: Mirror, row: Any, exp_id: str, run_id: str | None, key: str) -> str:
    import mlflow

    call = json.loads(row["payload"])
    attributes = {k: call.get(k) for k in ("model", "provider", "prompt_name", "prompt_sha256", "temperature",
                                           "tokens_in", "tokens_out", "cost_usd") if call.get(k) is not None}
    tags = {"autoresearch.llm_call": key, "autoresearch.decision_id": str(row["decision_id"] or ""),
            "autoresearch.loop_id": str(row["loop_id"] or "")}
    span = syncer.client.start_trace(call.get("name") or "llm_call", span_type="LLM", inputs=call.get("inputs"),
                                     attributes=attributes, tags=tags, experiment_id=exp_id,
                                     start_time_ns=int(float(call["started_at"]) * 1e9), run_id=run_id)
    syncer.client.end_trace(span.trace_id, outputs=call.get("outputs"),
                            status="ERROR" if call.get("error") else "OK",
                            end_time_ns=int(float(call["ended_at"]) * 1e9))
    mlflow.flush_trace_async_logging()
    return str(span.trace_id)
