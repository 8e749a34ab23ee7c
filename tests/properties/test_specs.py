"""The job spec is total: any input is one SpecError or a spec the OS can run and the ledger
can store; a refused submit writes nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import event, example, given
from hypothesis import strategies as st

from autoresearch.errors import AutoresearchError
from autoresearch.spec import JobSpec, make_spec, parse_duration, parse_memory_mb
from tests.properties.strategies import FAST, NASTY_TEXT, NUMBERS, TEXT, mapping_over, values

KEYS = list(JobSpec.model_fields)
MAX_COUNT = 2**31 - 1  # what SQLite and every scheduler can hold
ARGV = st.lists(st.one_of(TEXT, NASTY_TEXT), min_size=1, max_size=4)
SPECS = st.one_of(
    mapping_over(KEYS, values()),
    st.fixed_dictionaries({"command": ARGV}, optional={
        "env": st.dictionaries(st.one_of(TEXT, NASTY_TEXT), st.one_of(TEXT, NASTY_TEXT), max_size=3),
        "memory": st.one_of(NUMBERS, TEXT, NASTY_TEXT), "timeout": st.one_of(NUMBERS, TEXT, NASTY_TEXT),
        "grace": st.one_of(NUMBERS, NASTY_TEXT), "gpus": NUMBERS, "cpus": NUMBERS, "nodes": NUMBERS,
        "max_retries": NUMBERS, "mounts": st.dictionaries(NASTY_TEXT, NASTY_TEXT, max_size=2),
        "shell": st.booleans(), "priority": st.one_of(TEXT, NASTY_TEXT), "tags": values()}),
)


def check_runnable(spec: JobSpec) -> None:
    """What launching needs: argv and env without NUL, names without '=', sizes SQLite can hold."""
    argv = spec.argv()
    assert argv and all("\0" not in word for word in argv)
    for name, value in spec.env.items():
        assert name and "=" not in name and "\0" not in name and "\0" not in value
    assert 0 <= spec.gpus <= MAX_COUNT and 1 <= spec.nodes <= MAX_COUNT and 0 <= spec.memory <= 2**40
    assert math.isfinite(spec.cpus) and math.isfinite(spec.grace) and spec.grace >= 0
    assert spec.timeout is None or (math.isfinite(spec.timeout) and spec.timeout > 0)
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec  # what the ledger stores reads back


@FAST
@given(data=SPECS)
@example(data={"command": ["echo", "a\0b"]}).via("issue 14")
@example(data={"command": ["true"], "env": {"A=B": "x"}}).via("issue 14")
@example(data={"command": ["true"], "env": {"A": "x\0y"}}).via("issue 14")
@example(data={"command": ["true"], "timeout": float("nan")})
@example(data={"command": ["true"], "memory": 10**400})
def test_any_spec_is_runnable_or_one_error(data: dict[str, Any]) -> None:
    try:
        spec = make_spec(data, check_paths=False)
    except AutoresearchError as err:
        assert err.message and err.hint
        return
    check_runnable(spec)


@FAST
@given(value=st.one_of(NUMBERS, TEXT, NASTY_TEXT, st.booleans(), st.none()))
def test_durations_and_sizes_parse_or_refuse(value: Any) -> None:
    for parse in (parse_duration, parse_memory_mb):
        try:
            out = parse(value)
        except AutoresearchError:
            continue
        assert out is None or (math.isfinite(out) and out >= 0)


@FAST
@given(data=SPECS)
def test_a_refused_submit_writes_nothing(api: Any, workdir: Path, data: dict[str, Any]) -> None:
    before = api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"]
    events = api._ledger.one("SELECT COUNT(*) AS n FROM events")["n"]
    data = {**data, "workdir": str(workdir)} if isinstance(data, dict) and "workdir" not in data else data
    try:
        view = api.submit(data)
    except AutoresearchError:
        event("refused")
        assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == before
        assert api._ledger.one("SELECT COUNT(*) AS n FROM events")["n"] == events
        return
    event("accepted")
    assert view.state == "queued"  # the node is cordoned: accepted jobs wait, nothing runs
    stored = json.loads(api._ledger.one("SELECT spec FROM jobs WHERE id=?", (view.id,))["spec"])
    check_runnable(JobSpec.model_validate(stored))
