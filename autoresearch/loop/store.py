"""The loop's state in the ledger: loops, trials, decisions (tables from migrations loop-1/2/3).

Write-ahead: a decision row is written *before* the action it describes, and a
proposal's trials are written in the same transaction as its decision, so a crash
at any line leaves either nothing or a decision whose action the next run finishes.
The tracking mirror reads these tables; nothing here imports MLflow.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Any

from autoresearch.loop.proposers._base import Proposal, ProposeResult, ProposerInfo, TrialRecord
from autoresearch.store.ledger import Ledger

MAX_NAME = 64  # a loop name's longest (autoresearch/loop/plan.py checks plans' names against it)
ACTIVE_TRIAL = ("proposed", "queued", "running")
ENDED_TRIAL = ("succeeded", "failed", "stopped", "crashed", "cancelled", "skipped")


def _j(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


class LoopStore:
    def __init__(self, ledger: Ledger, loop_id: int) -> None:
        self.ledger = ledger
        self.loop_id = loop_id

    # -- loops --------------------------------------------------------------------------

    @staticmethod
    def find(ledger: Ledger, name: str) -> Any:
        return ledger.one("SELECT * FROM loops WHERE name=?", (name,))

    @staticmethod
    def job_of(ledger: Ledger, trial_id: int) -> int | None:
        """The job that ran trial ``trial_id`` (of any loop; its first when it was relaunched), None
        for a trial that has none yet."""
        row = ledger.one("SELECT loop_id, job_id FROM trials WHERE id=?", (trial_id,))
        if row is None:
            return None
        return int(row["job_id"]) if row["job_id"] is not None else LoopStore(ledger, row["loop_id"]).job_of_trial(trial_id)

    @staticmethod
    def create(ledger: Ledger, name: str, plan_json: str, digest: str, experiment: str,
               project: str = "") -> LoopStore:
        """A new loop row; ``project`` scopes the loop and its trial jobs (MCP tokens see their own)."""
        now = time.time()
        with ledger.tx() as c:
            cur = c.execute("INSERT INTO loops(name, plan, state, experiment, created_at, updated_at, digest, project) "
                            "VALUES (?,?,?,?,?,?,?,?)",
                            (name, plan_json, "running", experiment, now, now, digest, project))
            return LoopStore(ledger, int(cur.lastrowid or 0))

    @staticmethod
    def keep_as_generation(ledger: Ledger, loop_id: int, name: str) -> str:
        """Rename a finished loop ``name`` to ``name-N`` (the next free N): a new loop takes the name
        (``warm_start: true``). Its trials, decisions and MLflow experiment stay as they are. The
        new name stays a loop name (at most ``MAX_NAME`` characters: a long name is cut before ``-N``)."""

        def kept(n: int) -> str:
            return f"{name[:MAX_NAME - len(str(n)) - 1]}-{n}"

        with ledger.tx() as c:
            n = 1
            while c.execute("SELECT 1 FROM loops WHERE name=?", (kept(n),)).fetchone() is not None:
                n += 1
            c.execute("UPDATE loops SET name=?, updated_at=? WHERE id=?", (kept(n), time.time(), loop_id))
        return kept(n)

    @staticmethod
    def generations(ledger: Ledger, plan_name: str, project: str, limit: int) -> list[str]:
        """The names of the newest finished loops started from plans named ``plan_name`` (their
        experiment) in ``project``, other than the loop named ``plan_name``, newest first."""
        return [r["name"] for r in ledger.query(
            "SELECT name FROM loops WHERE experiment=? AND project=? AND state='finished' AND name<>? "
            "ORDER BY id DESC LIMIT ?", (plan_name, project, plan_name, limit))]

    @staticmethod
    def recent_names(ledger: Ledger, limit: int = 10) -> list[str]:
        """The names of the newest loops, newest first (to suggest one)."""
        return [r["name"] for r in ledger.query("SELECT name FROM loops ORDER BY id DESC LIMIT ?", (limit,))]

    @staticmethod
    def visible_names(ledger: Ledger, project: str | None) -> list[str]:
        """The names of the ten newest loops ``project`` may see (None: any), newest first."""
        return [r["name"] for r in ledger.query(
            "SELECT name FROM loops WHERE ? IS NULL OR project=? ORDER BY id DESC LIMIT 10", (project, project))]

    def loop(self) -> Any:
        return self.ledger.one("SELECT * FROM loops WHERE id=?", (self.loop_id,))

    def set_loop(self, **fields: Any) -> None:
        sets = ", ".join(f"{k}=?" for k in fields)
        with self.ledger.tx() as c:
            c.execute(f"UPDATE loops SET {sets}, updated_at=? WHERE id=?", (*fields.values(), time.time(), self.loop_id))

    # -- decisions ----------------------------------------------------------------------

    def decide(self, kind: str, *, inputs: Any = None, outputs: Any = None, rationale: str = "",
               info: ProposerInfo | None = None, trial_id: int | None = None, conn: Any = None,
               tokens_in: int = 0, tokens_out: int = 0, cost_usd: float = 0.0, latency_s: float = 0.0,
               at: float | None = None) -> int:
        """Write a decision (its ``created_at``: ``at``, else now); its id."""
        row = (self.loop_id, kind, _j(inputs or {}), _j(outputs or {}), rationale,
               _j(asdict(info) if info else {"kind": "controller"}), tokens_in, tokens_out, cost_usd, latency_s,
               time.time() if at is None else at, trial_id)
        sql = ("INSERT INTO decisions(loop_id, kind, inputs, outputs, rationale, proposer, tokens_in, tokens_out, "
               "cost_usd, latency_s, created_at, trial_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)")
        if conn is not None:
            return int(conn.execute(sql, row).lastrowid or 0)
        with self.ledger.tx() as c:
            return int(c.execute(sql, row).lastrowid or 0)

    def has_decision(self, kind: str, trial_id: int) -> bool:
        return self.ledger.one("SELECT 1 FROM decisions WHERE trial_id=? AND kind=? AND loop_id=?",
                               (trial_id, kind, self.loop_id)) is not None

    def decisions(self) -> list[Any]:
        return self.ledger.query("SELECT * FROM decisions WHERE loop_id=? ORDER BY id", (self.loop_id,))

    def decisions_since(self, after_id: int, limit: int = 200) -> list[Any]:
        """Decisions with an id above ``after_id``, oldest first (a CI log follows them)."""
        return self.ledger.query("SELECT id, kind, trial_id, inputs, outputs, rationale FROM decisions WHERE loop_id=? "
                                 "AND id>? ORDER BY id LIMIT ?", (self.loop_id, after_id, limit))

    def last_decision(self, kind: str) -> Any:
        return self.ledger.one("SELECT * FROM decisions WHERE loop_id=? AND kind=? ORDER BY id DESC LIMIT 1",
                               (self.loop_id, kind))

    def last_decision_at(self, kind: str) -> float:
        """When the newest ``kind`` decision was made (0.0: never)."""
        last = self.ledger.one("SELECT MAX(created_at) AS t FROM decisions WHERE loop_id=? AND kind=?",
                               (self.loop_id, kind))
        return float(last["t"] or 0.0) if last else 0.0

    def decisions_of(self, kind: str) -> list[Any]:
        """Every ``kind`` decision (id, outputs, rationale, proposer), oldest first."""
        return self.ledger.query("SELECT id, outputs, rationale, proposer FROM decisions WHERE loop_id=? AND kind=? "
                                 "ORDER BY id", (self.loop_id, kind))

    def trial_decisions(self, kinds: tuple[str, ...]) -> list[Any]:
        """Every decision of ``kinds`` about a trial (id, kind, trial_id, inputs), oldest first."""
        marks = ",".join("?" * len(kinds))
        return self.ledger.query(f"SELECT id, kind, trial_id, inputs FROM decisions WHERE loop_id=? AND kind IN "
                                 f"({marks}) AND trial_id IS NOT NULL ORDER BY id", (self.loop_id, *kinds))

    def promotions(self, after_id: int = 0) -> list[Any]:
        """Every keep-or-discard decision (id, trial_id, outputs, created_at) with an id above
        ``after_id``, oldest first (a range of the ``decisions_by_loop`` index: a live view reads
        only the new ones)."""
        return self.ledger.query("SELECT id, trial_id, outputs, created_at FROM decisions WHERE loop_id=? AND "
                                 "id>? AND kind='promote' ORDER BY id", (self.loop_id, after_id))

    def launched_trials(self) -> set[int]:
        """The trials with a launch decision (written before their job is submitted)."""
        return {r["trial_id"] for r in self.ledger.query(
            "SELECT trial_id FROM decisions WHERE loop_id=? AND kind='launch'", (self.loop_id,))}

    def stop_loop_after(self, after_id: int, since: float) -> tuple[Any, int]:
        """A ``stop_loop`` decision (an agent's, through MCP) made at or after ``since`` among the
        decisions with an id above ``after_id`` (None if none), and the newest decision id: the
        next look starts there, so a look reads the decisions made since the last (issue 16: a
        loop's checks per trial end do not grow with its decisions)."""
        newest = self.ledger.one("SELECT MAX(id) AS m FROM decisions WHERE loop_id=?", (self.loop_id,))
        last = int(newest["m"]) if newest is not None and newest["m"] is not None else after_id
        row = self.ledger.one("SELECT rationale FROM decisions WHERE loop_id=? AND id>? AND id<=? AND "
                              "kind='stop_loop' AND created_at>=? LIMIT 1", (self.loop_id, after_id, last, since))
        return row, last

    def decision_totals(self) -> Any:
        """How many decisions, and their LLM spend (``usd``) and tokens (``tok``)."""
        return self.ledger.one("SELECT COUNT(*) AS n, COALESCE(SUM(cost_usd),0) AS usd, "
                               "COALESCE(SUM(tokens_in + tokens_out),0) AS tok FROM decisions WHERE loop_id=?",
                               (self.loop_id,))

    def decision_totals_since(self, after_id: int) -> Any:
        """:meth:`decision_totals` of the decisions with an id above ``after_id``, and their
        newest id (``last``): a live view adds them up as they come."""
        return self.ledger.one("SELECT COUNT(*) AS n, COALESCE(SUM(cost_usd),0) AS usd, "
                               "COALESCE(SUM(tokens_in + tokens_out),0) AS tok, COALESCE(MAX(id), ?) AS last "
                               "FROM decisions WHERE loop_id=? AND id>?", (after_id, self.loop_id, after_id))

    def rejected_as_noise(self) -> int:
        """Candidates that beat the incumbent, but not beyond the noise floor."""
        row = self.ledger.one("SELECT COUNT(*) AS n FROM decisions WHERE loop_id=? AND kind='promote' AND "
                              "json_extract(outputs, '$.promoted')=0 AND json_extract(outputs, '$.margin')>0",
                              (self.loop_id,))
        return row["n"] if row else 0

    # -- trials -------------------------------------------------------------------------

    def record_proposals(self, result: ProposeResult, proposals: list[Proposal], *, inputs: Any, role: str = "explore",
                         seeds: list[int] | None = None, now: float | None = None) -> list[int]:
        """One propose decision and its trials, atomically; returns the new trial ids. ``now``: the
        trials' creation time on the clock their ends are stamped with (a simulated backend's)."""
        now = time.time() if now is None else now
        ids: list[int] = []
        with self.ledger.tx() as c:
            decision = self.decide(
                "propose", inputs=inputs, rationale=result.rationale, info=result.info, conn=c,
                outputs={"proposals": [{"params": p.params, "rationale": p.rationale, "patch": bool(p.patch),
                                        "parent_trial": p.parent_trial} for p in proposals]},
                tokens_in=result.tokens_in, tokens_out=result.tokens_out, cost_usd=result.cost_usd,
                latency_s=result.latency_s)
            for i, p in enumerate(proposals):
                cur = c.execute(
                    "INSERT INTO trials(loop_id, decision_id, parent_trial, params, patch, seed, proposer, state, role, "
                    "rationale, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (self.loop_id, decision, p.parent_trial, _j(p.params), p.patch, (seeds or [])[i] if seeds else 0,
                     result.info.kind, "proposed", role, p.rationale, now, now))
                ids.append(int(cur.lastrowid or 0))
            c.execute("UPDATE decisions SET outputs=json_set(outputs, '$.trial_ids', json(?)) WHERE id=?",
                      (_j(ids), decision))
        if result.calls:
            self.record_calls(decision, result)
        return ids

    def record_calls(self, decision_id: int, result: ProposeResult) -> None:
        """The model calls behind a propose decision, for the tracking mirror (one ledger insert
        each; the syncer turns them into MLflow traces linked to the loop's run). Never raises:
        the decision is written, and a lost trace must not stop the loop."""
        from autoresearch.store import outbox

        info = result.info
        for call in result.calls:
            try:
                outbox.record_llm_call(self.ledger, loop_id=self.loop_id, decision_id=decision_id,
                                         **{"prompt_name": info.prompt_name or "",
                                            "prompt_sha256": info.prompt_sha256 or "",
                                            "temperature": info.temperature, **call})
            except Exception as err:  # noqa: BLE001 - see the docstring
                print(f"autoresearch: could not record an LLM call of decision {decision_id}: {err}", file=sys.stderr)

    def trials(self, states: tuple[str, ...] | None = None) -> list[Any]:
        if states:
            marks = ",".join("?" * len(states))
            return self.ledger.query(f"SELECT * FROM trials WHERE loop_id=? AND state IN ({marks}) ORDER BY id",
                                     (self.loop_id, *states))
        return self.ledger.query("SELECT * FROM trials WHERE loop_id=? ORDER BY id", (self.loop_id,))

    def trials_by_id(self, ids: list[int]) -> list[Any]:
        return self.ledger.query(f"SELECT * FROM trials WHERE id IN ({','.join('?' * len(ids))})", tuple(ids))

    def trial(self, trial_id: int) -> Any:
        return self.ledger.one("SELECT * FROM trials WHERE id=?", (trial_id,))

    def patches(self) -> dict[int, str]:
        """The patch of every trial that has one, by trial id."""
        return {r["id"]: r["patch"] for r in self.ledger.query(
            "SELECT id, patch FROM trials WHERE loop_id=? AND patch IS NOT NULL", (self.loop_id,))}

    def trial_patch(self, trial_id: int) -> Any:
        """The trial's row (its ``patch``), None when it is not a trial of this loop."""
        return self.ledger.one("SELECT patch FROM trials WHERE id=? AND loop_id=?", (trial_id, self.loop_id))

    def update_trial(self, trial_id: int, conn: Any = None, **fields: Any) -> None:
        """Write ``fields`` to a trial's row (inside ``conn``'s transaction when given, else one of its own)."""
        if conn is None:
            with self.ledger.tx() as c:
                self.update_trial(trial_id, c, **fields)
            return
        sets = ", ".join(f"{k}=?" for k in fields)
        conn.execute(f"UPDATE trials SET {sets}, updated_at=? WHERE id=?", (*fields.values(), time.time(), trial_id))

    def update_trials(self, updates: list[tuple[int, dict[str, Any]]]) -> None:
        """:meth:`update_trial` for several trials, in one transaction."""
        now = time.time()
        with self.ledger.tx() as c:
            for trial_id, fields in updates:
                sets = ", ".join(f"{k}=?" for k in fields)
                c.execute(f"UPDATE trials SET {sets}, updated_at=? WHERE id=?", (*fields.values(), now, trial_id))

    def job_of_trial(self, trial_id: int) -> int | None:
        """A job submitted for the trial whose id never reached the trials row (a crash in between)."""
        row = self.ledger.one(
            "SELECT id FROM jobs WHERE json_extract(spec, '$.tags.\"autoresearch.loop_id\"')=? AND "
            "json_extract(spec, '$.tags.\"autoresearch.trial_id\"')=? ORDER BY id LIMIT 1",
            (str(self.loop_id), str(trial_id)))
        return int(row["id"]) if row else None

    def gpu_seconds(self, now: float | None = None) -> float:
        """Seconds the loop's trials' attempts have run (a running one up to ``now``, by default the
        wall clock's; a retried trial counts every attempt, not the wait between them), GPUs not counted."""
        row = self.ledger.one(
            "SELECT COALESCE(SUM(COALESCE(a.ended_at, ?) - a.started_at), 0) AS s FROM trials t JOIN attempts a "
            "ON a.job_id=t.job_id WHERE t.loop_id=? AND a.started_at IS NOT NULL",
            (time.time() if now is None else now, self.loop_id))
        return float(row["s"] if row else 0.0)

    def counts(self) -> dict[str, int]:
        rows = self.ledger.query("SELECT state, COUNT(*) AS n FROM trials WHERE loop_id=? GROUP BY state",
                                 (self.loop_id,))
        return {r["state"]: r["n"] for r in rows}


def to_record(row: Any, intermediate: list[tuple[int, float]] | None = None) -> TrialRecord:
    state = row["state"]
    return TrialRecord(
        trial_id=row["id"], params=json.loads(row["params"]), state=state, objective=row["objective"],
        metrics=json.loads(row["metrics"] or "{}"), intermediate=intermediate or [], patch=row["patch"],
        parent_trial=row["parent_trial"], seed=row["seed"], failure=row["failure"], rationale=row["rationale"],
        role=row["role"], job_id=row["job_id"])
