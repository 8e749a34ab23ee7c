"""Job arrays (``autoresearch submit --array``, Slurm's ``sbatch --array``): the index grammar and its
refusals, one job per index with its index in the environment, the ``%N`` cap held while they run,
a bad spec refusing the whole array, and the CLI's ``--wait`` status and ``cancel FIRST-LAST``."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine.spec import MAX_ARRAY, compact_indices, parse_array
from autoresearch.errors import AutoresearchError, NotFoundError, SpecError
from tests.conftest import wait_for, wait_state

CLI = [sys.executable, "-m", "autoresearch.cli"]


@pytest.mark.parametrize(("text", "indices", "cap"), [
    ("0-4", [0, 1, 2, 3, 4], None),
    ("1,3,5-7", [1, 3, 5, 6, 7], None),
    ("0-9:3", [0, 3, 6, 9], None),
    ("0-99%8", list(range(100)), 8),
    (" 3,1,1-2 % 2 ", [1, 2, 3], 2),  # sorted, each once, as Slurm
    ("7", [7], None),
])
def test_array_indices_are_read_as_slurm_writes_them(text: str, indices: list[int], cap: int | None) -> None:
    assert parse_array(text) == (indices, cap)


@pytest.mark.parametrize("text", [
    "", "  ", "a", "1-", "-1", "5-1", "0-9:0", "0-9:2:3", "0-9%0", "0-9%", "0-9%x", "0-9%-1", "²", "1e3", "0x10",
    "nan", "inf", "1;rm -rf /", "[red]1[/red]", "../1", "1-2,,3", f"0-{MAX_ARRAY}", "0-99999999", "0-10%1" + "0" * 20,
    "1" * 10_001, None, 5, 2.5, ["0-3"],
])
def test_bad_array_indices_are_refused_with_the_grammar(text: Any) -> None:
    with pytest.raises(SpecError) as err:
        parse_array(text)
    assert "--array" in str(err.value) and err.value.hint  # it names the option, and says what to write


def test_compact_indices_reads_back_as_the_same_indices() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        indices = sorted(rng.sample(range(80), rng.randint(1, 50)))
        text = compact_indices(indices)
        assert parse_array(text) == (indices, None), text
    assert compact_indices(list(range(100))) == "0-99"
    assert compact_indices([1, 3, 5, 6, 7]) == "1,3,5-7"
    assert compact_indices(list(range(0, 99, 2))) == "0-98:2"


def test_an_array_runs_one_job_per_index_with_its_index_and_at_most_n_at_once(api: Any, tmp_path: Path) -> None:
    script = 'echo "$AUTORESEARCH_ARRAY_INDEX of $AUTORESEARCH_ARRAY_COUNT" > "out.$AUTORESEARCH_ARRAY_INDEX"; sleep 0.3'
    view = api.submit_array({"command": script, "shell": True, "name": "sweep", "workdir": str(tmp_path),
                             "tags": {"who": "me"}}, "1,3,5-7%2")
    assert (view.count, view.indices, view.max_running) == (5, "1,3,5-7", 2)
    assert view.last_id - view.first_id == 4
    ids = list(range(view.first_id, view.last_id + 1))
    ends = [wait_state(api, job_id, "succeeded", timeout=30) for job_id in ids]
    assert [job.name for job in ends] == [f"sweep[{i}]" for i in (1, 3, 5, 6, 7)]  # ids in index order
    assert all(job.tags == {"who": "me", "array": view.array, "array_index": str(i)}
               for job, i in zip(ends, (1, 3, 5, 6, 7), strict=True))
    for i in (1, 3, 5, 6, 7):
        assert (tmp_path / f"out.{i}").read_text() == f"{i} of 5\n"
    # %2: never more than two of them started or running at the same moment
    spans = [(a.started_at, a.ended_at) for job in ends for a in job.attempt_list]
    assert len(spans) == 5
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most == 2, spans  # (two slots: the first two start at once)


def test_a_bad_spec_refuses_the_whole_array_and_records_nothing(api: Any, tmp_path: Path) -> None:
    for spec, array in (({"command": ["true"], "workdir": str(tmp_path), "gpus": 99}, "0-9"),  # more GPUs than exist
                        ({"command": "true", "workdir": str(tmp_path)}, "0-9"),  # a string without shell
                        ({"command": ["true"], "workdir": str(tmp_path / "nope")}, "0-9"),
                        ({"command": ["true"], "workdir": str(tmp_path)}, "0-9%0")):
        with pytest.raises(AutoresearchError):  # (a SpecError; the GPUs a CapacityError)
            api.submit_array(spec, array)
    assert api.list_jobs().jobs == []


def test_a_job_an_array_job_submits_does_not_inherit_its_index(api: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_ARRAY_INDEX", "4")  # as inside an array's job
    monkeypatch.setenv("AUTORESEARCH_ARRAY_COUNT", "9")
    view = api.submit({"command": 'echo "${AUTORESEARCH_ARRAY_INDEX:-none} ${AUTORESEARCH_ARRAY_COUNT:-none}" > out',
                       "shell": True, "workdir": str(tmp_path)})
    wait_state(api, view.id, "succeeded")
    assert (tmp_path / "out").read_text() == "none none\n"


def test_cancel_takes_a_range_whole_or_not_at_all(api: Any, tmp_path: Path) -> None:
    view = api.submit_array({"command": ["sleep", "30"], "workdir": str(tmp_path)}, "0-3%1")
    with pytest.raises(NotFoundError):
        api.cancel([f"{view.first_id}-{view.last_id + 1}"])  # one id too many: nothing is cancelled
    assert all(api.status(j).state in ("queued", "starting", "running") for j in range(view.first_id, view.last_id + 1))
    for bad in (f"{view.last_id}-{view.first_id}", f"1-{MAX_ARRAY + 1}"):
        with pytest.raises(SpecError):
            api.cancel([bad])
    done = api.cancel([f"{view.first_id}-{view.last_id}"])
    assert [v.id for v in done] == list(range(view.first_id, view.last_id + 1))
    wait_for(lambda: all(api.status(j).state == "cancelled" for j in range(view.first_id, view.last_id + 1)))


def test_cli_array_prints_its_ids_and_wait_exits_with_the_highest_status(home: Path, tmp_path: Path) -> None:
    script = "sleep 0.1; case $AUTORESEARCH_ARRAY_INDEX in 1) exit 3;; 2) exit 5;; esac"
    proc = subprocess.run([*CLI, "submit", "--array", "0-3%2", "--wait", "--workdir", str(tmp_path), "--shell",
                           "--", script], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 5, proc.stderr  # as sbatch --wait: the highest of its jobs' statuses
    first, _, last = proc.stdout.strip().partition("-")
    assert int(last) - int(first) == 3
    assert "4 job(s) ended: 2 failed, 2 succeeded" in proc.stderr
    bad = subprocess.run([*CLI, "submit", "--array", "0-3%zz", "--", "true"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "0-99%8" in bad.stderr and not bad.stdout


def test_cancelling_a_whole_array_records_one_cancel_each_and_stops_the_running(api: Any, tmp_path: Path) -> None:
    view = api.submit_array({"command": ["sleep", "30"], "workdir": str(tmp_path), "grace": "1s"}, "0-149%2")
    ids = list(range(view.first_id, view.last_id + 1))
    wait_for(lambda: sum(api.status(j).state == "running" for j in ids[:2]) == 2)
    api.cancel([ids[-1]])  # one already final when the range comes
    done = api.cancel([f"{ids[0]}-{ids[-1]}", str(ids[0])])  # (the first named twice)
    assert [v.id for v in done] == [*ids, ids[0]]  # the views, in the order asked
    counts = {r[0]: r[1] for r in api._ledger.query(
        "SELECT job_id, count(*) FROM events WHERE kind='cancel' GROUP BY job_id")}
    assert counts == {j: 1 for j in ids}  # one cancel each: the duplicate and the ended one asked for nothing
    ends = [wait_state(api, j, "cancelled", timeout=30) for j in ids[:2]]
    assert all(job.attempt_list[-1].end_reason == "cancelled" for job in ends)  # the running ones were stopped
    assert all(api.status(j).state == "cancelled" and api.status(j).attempts == 0 for j in ids[2:])
