"""Proposer overhead benchmarks (not tests): what the LLM, code-edit and agent proposers
add to a loop besides the model's own thinking time. Prints a table of medians measured
in one run.

* llm propose: one ``propose()`` (prompt rendering with 30 trials of history, the real
  SDK client, HTTP to a loopback fake of the provider answering at once, parsing, the
  space gate), for the anthropic and openai clients; and the first call in a process
  (which pays the SDK import).
* space gate: validating one proposal.
* code-edit: building a cumulative patch from search/replace edits (a throwaway git
  index), and preparing a trial's git worktree with it applied.
* agent: ``propose_trials`` recording a submission, and the controller-side proposer
  picking it up.

    python bench/bench_proposers.py [--reps 30]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn: Callable[[], Any], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def first_call_ms(provider: str) -> float:
    """A fresh interpreter's first propose(): SDK import + client + call."""
    code = f"""
import time, os
from tests.fakes.llm_server import FakeLLMServer, anthropic_tool_answer, openai_json_answer
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.proposers._base import ProposerContext
server = FakeLLMServer().start()
ans = {{"rationale": "r", "proposals": [{{"params": {{"x": 0.5}}, "rationale": "r"}}]}}
server.script(anthropic_tool_answer(ans) if "{provider}" == "anthropic" else openai_json_answer(ans))
url = server.url if "{provider}" == "anthropic" else server.openai_url
plan = parse_plan({{"name": "b", "objective": {{"metric": "loss"}}, "trial": {{"command": "true {{x}}"}},
                   "space": {{"x": {{"low": 0.0, "high": 1.0}}}},
                   "proposer": {{"kind": "llm", "provider": "{provider}", "model": "m", "base_url": url}}}})
t0 = time.perf_counter()
from autoresearch.loop.proposers.llm import LLMProposer
LLMProposer(ProposerContext(plan), api_key="k").propose([], 1)
print((time.perf_counter() - t0) * 1000)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    return float(done.stdout.strip().splitlines()[-1])


def bench_llm(reps: int) -> list[tuple[str, float, str]]:
    from autoresearch.loop.plan import parse_plan
    from autoresearch.loop.proposers._base import ProposerContext, TrialRecord
    from autoresearch.loop.proposers.llm import LLMProposer
    from tests.fakes.llm_server import FakeLLMServer, anthropic_tool_answer, openai_json_answer

    history = [TrialRecord(i, {"x": i / 40, "h": 64}, "succeeded", objective=(i / 40 - 0.3) ** 2,
                           rationale="a guess") for i in range(1, 31)]
    rows = []
    with FakeLLMServer() as server:
        for provider in ("anthropic", "openai"):
            url = server.url if provider == "anthropic" else server.openai_url
            plan = parse_plan({"name": "b", "objective": {"metric": "loss"},
                               "trial": {"command": "true {x} {h}"},
                               "space": {"x": {"low": 0.0, "high": 1.0}, "h": {"choices": [32, 64, 128]}},
                               "proposer": {"kind": "llm", "provider": provider, "model": "m", "base_url": url}})
            proposer = LLMProposer(ProposerContext(plan), api_key="k")
            answers = []
            for i in range(reps + 1):
                body = {"rationale": "r", "proposals": [{"params": {"x": 0.5 + i / 1000, "h": 64}, "rationale": "r"},
                                                        {"params": {"x": 0.6 + i / 1000, "h": 32}, "rationale": "r"}]}
                answers.append(anthropic_tool_answer(body) if provider == "anthropic" else openai_json_answer(body))
            server.script(*answers)
            proposer.propose(history, 2)  # warm
            ms = timed(lambda p=proposer: p.propose(history, 2), reps)
            rows.append((f"llm propose, {provider} client (warm, 30-trial history)", statistics.median(ms), "ms"))
    for provider in ("anthropic", "openai"):
        rows.append((f"llm propose, {provider}: first call in a process", first_call_ms(provider), "ms"))
    return rows


def bench_gate(reps: int) -> list[tuple[str, float, str]]:
    from autoresearch.loop.proposers import _gate

    space = _gate.normalize({"lr": {"low": 1e-4, "high": 0.3, "log": True}, "hidden": {"choices": [32, 64, 128]},
                             "layers": {"low": 1, "high": 8, "type": "int"}})
    params = {"lr": 0.5, "hidden": "64", "layers": 3.4}
    ms = timed(lambda: [_gate.coerce(space, params) for _ in range(1000)], reps)
    return [("space gate, one proposal", statistics.median(ms), "us")]  # 1000 per rep: ms/1000 = us


def bench_code(reps: int) -> list[tuple[str, float, str]]:
    from autoresearch.loop.proposers.code import CodeSearch, cleanup_worktrees, prepare_trial_workdir

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "proj"
        repo.mkdir()
        (repo / "train.py").write_text("".join(f"LINE_{i} = {i}\n" for i in range(400)))
        (repo / "data.py").write_text("X = 1\n")
        env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
               "GIT_COMMITTER_EMAIL": "b@b"}
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
            subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
        search = CodeSearch(repo, ["train.py"])
        base = search.make_patch(None, [{"file": "train.py", "search": "LINE_7 = 7\n", "replace": "LINE_7 = 70\n"}])
        counter = iter(range(10_000))
        patch_ms = timed(lambda: search.make_patch(base, [{"file": "train.py", "search": "LINE_9 = 9\n",
                                                            "replace": f"LINE_9 = {1000 + next(counter)}\n"}]), reps)
        root = Path(tmp) / "worktrees"
        ids = iter(range(10_000))
        tree_ms = timed(lambda: prepare_trial_workdir(repo, base, root / f"trial-{next(ids)}"), reps)
        t0 = time.perf_counter()
        removed = cleanup_worktrees(repo, root)
        clean_ms = (time.perf_counter() - t0) * 1000 / max(1, removed)
    return [("code-edit: cumulative patch from edits (400-line file)", statistics.median(patch_ms), "ms"),
            ("code-edit: prepare a trial worktree with its patch", statistics.median(tree_ms), "ms"),
            ("code-edit: remove one worktree (cleanup)", clean_ms, "ms")]


def bench_agent(reps: int) -> list[tuple[str, float, str]]:
    os.environ.setdefault("AUTORESEARCH_GPUS", "2")
    from autoresearch.api import Api
    from autoresearch.loop.plan import parse_plan, plan_json
    from autoresearch.loop.proposers import agent
    from autoresearch.loop.proposers._base import ProposerContext, TrialRecord
    from autoresearch.loop.store import LoopStore

    with tempfile.TemporaryDirectory() as tmp:
        api = Api(Path(tmp) / "home")
        plan = parse_plan({"name": "ag", "objective": {"metric": "loss"}, "trial": {"command": "true {x}"},
                           "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "agent"},
                           "budget": {"trials": 10_000}})
        store = LoopStore.create(api._ledger, "ag", plan_json(plan), plan.digest(), "ag")
        proposer = agent.AgentProposer(ProposerContext(plan, store.loop_id, "ag", api._ledger.home, api._runtime))
        values = iter(range(1, 100_000))
        submit_ms = timed(lambda: api.submit_proposals(
            "ag", [{"params": {"x": next(values) / 100_000}, "rationale": "r"}], "r"), reps)
        pickup = []
        for _ in range(reps):
            got: dict[str, float] = {}
            # The blocking path: the proposer waits (everything earlier is already a trial), then a submission lands.
            history = [TrialRecord(0, p.params, "succeeded", patch=p.patch)
                       for _, p in agent.submitted(api._ledger, store.loop_id)]

            def blocked(h: list[Any] = history, got: dict[str, float] = got) -> None:
                proposer.propose(h, 1)
                got["t"] = time.perf_counter()

            thread = threading.Thread(target=blocked)
            thread.start()
            time.sleep(0.3 + random.uniform(0, agent.POLL_S))  # land anywhere in the poll period
            t0 = time.perf_counter()
            api.submit_proposals("ag", [{"params": {"x": next(values) / 100_000}, "rationale": "r"}], "r")
            thread.join()
            pickup.append((got["t"] - t0) * 1000)
    return [("agent: propose_trials records a submission", statistics.median(submit_ms), "ms"),
            (f"agent: waiting proposer picks it up (poll {agent.POLL_S * 1000:.0f} ms)", statistics.median(pickup), "ms")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    rows = bench_llm(args.reps) + bench_gate(args.reps) + bench_code(args.reps) + bench_agent(min(args.reps, 10))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'median':>10}")
    for name, value, unit in rows:
        print(f"{name:<{width}}  {value:>8.2f} {unit}")


if __name__ == "__main__":
    main()
