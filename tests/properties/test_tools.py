"""MCP tool inputs (the in-process server, the real mcp.Client): whatever an agent sends, the
answer is a result or an is_error with our error text, never "[internal]" or a dropped
connection, and a refused call writes no job and no loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from hypothesis import event, given
from hypothesis import strategies as st

from tests.properties.strategies import FAST, NASTY_TEXT, TEXT, json_values
from tests.tools.conftest import connect, text

TOOLS: dict[str, list[str]] = {
    "submit": ["command", "name", "gpus", "nodes", "cpus", "memory", "priority", "workdir", "env", "timeout",
               "max_retries", "retry_on_exit_codes", "checkpoint", "experiment", "tags", "mounts"],
    "status": ["job_id", "limit"],
    "list_jobs": ["state", "experiment", "limit", "cursor"],
    "cancel": ["job_id"],
    "logs": ["job_id", "tail_lines", "offset", "max_bytes", "grep", "attempt"],
    "metrics": ["job_id", "names", "series", "max_points"],
    "cluster_status": [],
    "start_loop": ["plan", "resume"],
    "loop_status": ["loop", "recent"],
    "propose_trials": ["loop", "proposals", "rationale", "agent"],
    "leaderboard": ["loop", "top"],
    "trial_patch": ["loop", "trial_id"],
    "stop_loop": ["loop", "rationale"],
}
# Values of the right shape now and then, so calls get past the schema into our code.
SHAPED: dict[str, st.SearchStrategy[Any]] = {
    "job_id": st.one_of(st.integers(min_value=-2, max_value=3), st.sampled_from([10**15, 2**63, 10**30])),
    "offset": st.sampled_from([0, 1, 10**15, 2**63, 10**30, -1]),
    "command": st.lists(st.one_of(TEXT, NASTY_TEXT), max_size=3),
    "env": st.dictionaries(st.one_of(TEXT, NASTY_TEXT), st.one_of(TEXT, NASTY_TEXT), max_size=2),
    "mounts": st.dictionaries(NASTY_TEXT, NASTY_TEXT, max_size=2),
    "workdir": NASTY_TEXT, "plan": st.one_of(NASTY_TEXT, st.sampled_from(["bad.yaml", "outside.yaml"])),
    "grep": NASTY_TEXT, "loop": st.one_of(TEXT, NASTY_TEXT),
    "proposals": st.lists(st.fixed_dictionaries({}, optional={"params": json_values(), "rationale": TEXT}),
                          max_size=2),
    **{name: st.one_of(st.integers(min_value=-1, max_value=5), st.sampled_from([2**63, 10**30])) for name in (
        "limit", "tail_lines", "max_bytes", "attempt", "recent", "top", "trial_id", "max_points", "cursor", "gpus",
        "nodes", "max_retries", "cpus")},
    **{name: st.booleans() for name in ("series", "checkpoint", "resume")},
    **{name: st.one_of(TEXT, NASTY_TEXT) for name in (
        "name", "memory", "priority", "timeout", "state", "experiment", "rationale", "agent")},
    "names": st.lists(st.one_of(TEXT, NASTY_TEXT), max_size=2),
    "retry_on_exit_codes": st.lists(st.integers(min_value=-300, max_value=2**40), max_size=2),
    **{name: st.dictionaries(st.one_of(TEXT, NASTY_TEXT), TEXT, max_size=2) for name in ("tags",)},
}


def arguments(tool: str) -> st.SearchStrategy[dict[str, Any]]:
    optional = {name: st.one_of(SHAPED[name], SHAPED[name], SHAPED[name], json_values()) for name in TOOLS[tool]}
    return st.fixed_dictionaries({}, optional={**optional, "unexpected": json_values()} if not optional else optional)


# Calls that are well formed but for one hostile value: they reach the facade and the ledger.
NEAR_VALID = st.one_of(
    st.tuples(st.just("submit"), st.fixed_dictionaries({"command": SHAPED["command"]}, optional={
        "env": SHAPED["env"], "mounts": SHAPED["mounts"], "workdir": SHAPED["workdir"], "name": TEXT})),
    st.tuples(st.just("logs"), st.fixed_dictionaries({"job_id": st.just(1)}, optional={
        "offset": SHAPED["offset"], "grep": SHAPED["grep"], "tail_lines": st.integers(1, 10)})),
    st.tuples(st.just("metrics"), st.fixed_dictionaries({"job_id": st.sampled_from([1, 2, 10**15])}, optional={
        "names": SHAPED["names"], "series": st.booleans()})),
    st.tuples(st.just("cancel"), st.fixed_dictionaries({"job_id": st.sampled_from([1, 2, 3, 10**15])})),
    st.tuples(st.just("start_loop"), st.fixed_dictionaries({"plan": SHAPED["plan"]})),
)
CALLS = st.lists(st.one_of(NEAR_VALID, st.sampled_from(sorted(TOOLS)).flatmap(
    lambda tool: st.tuples(st.just(tool), arguments(tool)))), min_size=1, max_size=6)
PROMPT_IDS = st.one_of(TEXT, NASTY_TEXT, st.sampled_from(["1", "0", "-1", "99999999999999999999", "²", "١"]))


def counts(api: Any) -> tuple[int, int]:
    tables = {r["name"] for r in api._ledger.query("SELECT name FROM sqlite_master WHERE type='table'")}
    jobs = api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"]
    loops = api._ledger.one("SELECT COUNT(*) AS n FROM loops")["n"] if "loops" in tables else 0
    return jobs, loops


def setup(api: Any, workdir: Path) -> Any:
    from autoresearch.tools.server import build_server

    (workdir / "bad.yaml").write_text("name: x\nobjective: {metric: loss}\ntrial: {comand: 'run {lr}'}\n")
    (workdir / "outside.yaml").write_text("name: out\nobjective: {metric: loss}\n"
                                          "trial: {command: 'true {x}', workdir: ../..}\nspace: {x: [1, 2]}\n")
    return build_server(api, root=workdir)


@FAST
@given(calls=CALLS)
def test_any_tool_call_is_a_result_or_our_error(api: Any, workdir: Path, finished_job: int,
                                                calls: list[tuple[str, dict[str, Any]]]) -> None:
    server = setup(api, workdir)

    async def run() -> None:
        async with connect(server) as client:
            for tool, args in calls:
                before = counts(api)
                result = await client.call_tool(tool, args)
                message = text(result)
                assert "[internal]" not in message and "Traceback" not in message, (tool, args, message)
                if result.is_error:
                    event(f"{tool}: refused")
                    assert counts(api) == before, (tool, args, message)  # nothing half-written
                else:
                    event(f"{tool}: answered")

    anyio.run(run)


@FAST
@given(job_id=PROMPT_IDS)
def test_the_prompt_answers_or_says_why(api: Any, workdir: Path, finished_job: int, job_id: str) -> None:
    from mcp import MCPError

    server = setup(api, workdir)

    async def run() -> None:
        async with connect(server) as client:
            try:
                prompt = await client.get_prompt("diagnose_failed_job", {"job_id": job_id})
            except MCPError as err:
                assert "Internal server error" not in str(err) and "hint:" in str(err), str(err)
                return
            assert prompt.messages

    anyio.run(run)


def test_a_finished_job_is_there(api: Any, finished_job: int) -> None:
    assert json.loads(api._ledger.one("SELECT spec FROM jobs WHERE id=?", (finished_job,))["spec"])["command"]
