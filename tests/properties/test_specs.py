"""The job spec is total: any input is one SpecError or a spec the OS can run and the ledger
can store; a refused submit writes nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import event, example, given
from hypothesis import strategies as st

from autoresearch.engine.spec import JobSpec, make_spec, parse_duration, parse_memory_mb
from autoresearch.errors import AutoresearchError
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


COUNTS = st.one_of(st.integers(-2, 2**31 + 1), st.sampled_from([MAX_COUNT, 2**40, 2**40 + 1]), NUMBERS, st.booleans())
WORDS = st.lists(st.text(min_size=1, max_size=12).filter(lambda w: w.strip() != ""), min_size=1, max_size=3)
PLAIN = st.fixed_dictionaries({"command": st.one_of(WORDS, WORDS, ARGV, TEXT, NASTY_TEXT)}, optional={
    "name": st.one_of(TEXT, NASTY_TEXT), "shell": st.booleans(), "workdir": st.one_of(TEXT, NASTY_TEXT),
    "env": st.dictionaries(st.one_of(TEXT, NASTY_TEXT), st.one_of(TEXT, NASTY_TEXT, NUMBERS, st.none()), max_size=3),
    "tags": st.dictionaries(TEXT, st.one_of(TEXT, NUMBERS, st.booleans()), max_size=2),
    "gpus": COUNTS, "cpus": st.one_of(COUNTS, st.floats(-1, 2**32)), "nodes": COUNTS, "max_retries": COUNTS,
    "memory": st.one_of(COUNTS, NASTY_TEXT), "timeout": st.one_of(NUMBERS, NASTY_TEXT, st.none()),
    "grace": st.one_of(NUMBERS, NASTY_TEXT), "priority": st.one_of(st.sampled_from(["normal", " Best_Effort",
                                                                                     "besteffort", "CRITICAL"]),
                                                                   NASTY_TEXT),
    "retry_on_exit_codes": st.lists(COUNTS, max_size=2), "checkpoint": st.one_of(st.booleans(), TEXT),
    "experiment": TEXT, "mounts": st.dictionaries(NASTY_TEXT, NASTY_TEXT, max_size=2),
    "image": st.one_of(TEXT, st.just("x" * 513))})


@FAST
@given(data=st.one_of(PLAIN, PLAIN.map(lambda d: {**dict(list(d.items())[:2]), "command": d["command"]}), SPECS))
@example(data={"command": ["python", "train.py"], "gpus": 1, "env": {"SEED": 3, "X": None}, "memory": "16G"})
@example(data={"command": "python t.py", "shell": True, "timeout": "5m", "priority": "Best_Effort"})
@example(data={"command": ["x"], "cpus": 2, "grace": 0, "retry_on_exit_codes": [3]})
def test_the_fast_path_agrees_with_the_model_wherever_it_answers(data: dict[str, Any]) -> None:
    """A submit validates plain specs by hand (no pydantic import); wherever that path answers,
    its answer is exactly the pydantic model's, and it never accepts what the model refuses."""
    from pydantic import ValidationError

    from autoresearch.engine.spec import _fast, pydantic_model

    fast = _fast(data)
    if fast is None:
        event("declined: the model decides")
        return
    event("answered by hand")
    try:
        reference = pydantic_model().model_validate(data).model_dump()
    except (ValidationError, AutoresearchError) as err:
        raise AssertionError(f"the fast path accepted what the model refuses: {err}") from None
    assert fast == reference
    assert [type(v) for v in fast.values()] == [type(v) for v in reference.values()]
