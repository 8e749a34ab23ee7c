"""Loops' report files (from the outbox, ``kind='report'``) → artifacts of the loop's run.

The loop writes its report to disk and records an outbox row (:func:`autoresearch.store.outbox.record_report`);
a pass uploads the directory under ``report/`` and writes the run id into the row. An upload
MLflow refuses is recorded in the row (``sent_ref`` = ``error: ...``) rather than retried
forever; an outage is retried by the next pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import autoresearch.tracking._bulk as _bulk
from autoresearch.store import outbox
from autoresearch.tracking._common import Mirror, SyncReport, _critical
from autoresearch.tracking._entities import loop_run


def sync_reports(syncer: Mirror, report: SyncReport) -> None:
    from autoresearch.tracking._common import is_transient

    for row in outbox.pending(syncer.ledger, "report"):
        run_id = loop_run(syncer, row["loop_id"], report)
        if run_id is None:
            continue  # the loop's run is blocked: the files wait, like its decisions
        try:
            folder = str(json.loads(row["payload"]).get("dir") or "")
        except (ValueError, AttributeError):
            folder = ""
        ref = run_id
        with _critical(syncer.ledger.home):
            fresh = outbox.entry(syncer.ledger, row["id"])
            if fresh is None or fresh["done_at"] is not None:
                continue  # another process sent it meanwhile
            if folder and Path(folder).is_dir():
                try:
                    local = syncer.artifact_folder(run_id)
                    if local is not None:  # a SQLite store's local folder: written directly (~0.3 s of
                        # CPU less than the client's upload, which opens MLflow's store again)
                        _bulk.write_texts(local, _bulk.folder_files(folder, "report"))
                    else:
                        syncer.client.log_artifacts(run_id, folder, "report")
                    report.artifacts += 1
                except Exception as err:
                    if is_transient(err):
                        raise
                    ref = f"error: {err}"
                    syncer.warn(f"report:{row['id']}", f"loop {row['loop_id']}: report not logged ({err})")
            outbox.mark_sent(syncer.ledger, row["id"], ref)
