"""Every tool through the SDK's in-process client, on a real ledger and real processes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_state
from tests.tools.conftest import connect, text

pytestmark = pytest.mark.anyio

PY = sys.executable


async def call(server: Any, name: str, args: dict[str, Any] | None = None) -> Any:
    async with connect(server) as client:
        return await client.call_tool(name, args or {})


async def ok(server: Any, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await call(server, name, args)
    assert not result.is_error, text(result)
    return dict(result.structured_content)


async def test_submit_then_follow_status_logs_metrics(server: Any, api: Any, workdir: Path) -> None:
    (workdir / "train.py").write_text(
        "from autoresearch import report\n"
        "for step in range(5):\n"
        "    report(step, loss=1.0 / (step + 1), acc=step / 10)\n"
        "print('training done')\n")
    sub = await ok(server, "submit", {"command": [PY, "train.py"], "name": "tiny", "tags": {"lr": "3e-4"}})
    # its state when submit answered: a busy machine may answer after this short job ended
    assert sub["name"] == "tiny" and sub["state"] in ("queued", "starting", "running", "succeeded")
    assert f"status(job_id={sub['id']})" in sub["next_step"]
    wait_state(api, sub["id"], "succeeded")

    status = await ok(server, "status", {"job_id": sub["id"]})
    job = status["job"]
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["tags"] == {"lr": "3e-4"}
    assert job["workdir"] == str(workdir)
    assert [a["end_reason"] for a in job["attempt_list"]] == ["exit"] and job["attempt_list"][0]["node"]

    logs = await call(server, "logs", {"job_id": sub["id"]})
    assert "training done" in text(logs) and logs.structured_content["truncated"] is False

    metrics = await ok(server, "metrics", {"job_id": sub["id"], "series": True})
    by_name = {m["name"]: m for m in metrics["metrics"]}
    assert by_name["loss"]["last"] == pytest.approx(0.2) and by_name["loss"]["best"] == pytest.approx(0.2)
    assert by_name["acc"]["best"] == pytest.approx(0.4) and by_name["acc"]["mode"] == "max"
    assert by_name["loss"]["count"] == 5 and by_name["loss"]["step"] == 4
    assert [p[0] for p in by_name["loss"]["series"]] == [0, 1, 2, 3, 4]

    recent = await ok(server, "status")
    assert [j["id"] for j in recent["jobs"]] == [sub["id"]] and recent["job"] is None


async def test_failed_job_status_carries_failure_class_and_log_excerpt(server: Any, api: Any) -> None:
    sub = await ok(server, "submit", {"command": [PY, "-c", "print('about to fail'); raise SystemExit(3)"]})
    wait_state(api, sub["id"], "failed")
    job = (await ok(server, "status", {"job_id": sub["id"]}))["job"]
    assert job["failure_class"] == "user" and job["exit_code"] == 3
    assert "about to fail" in job["log_excerpt"]


async def test_logs_are_paged_under_16kb_and_say_how_to_get_the_rest(server: Any, api: Any) -> None:
    program = "for i in range(3000): print(f'line {i:05d} ' + 'x' * 40)\nprint('loss: 0.25')"
    sub = await ok(server, "submit", {"command": [PY, "-c", program]})
    wait_state(api, sub["id"], "succeeded")

    tail = await call(server, "logs", {"job_id": sub["id"]})
    page = tail.structured_content
    assert page["truncated"] and len(page["text"].encode()) <= 16_500 and len(text(tail).encode()) <= 16_600
    assert "offset=0" in page["hint"] and "offset=0" in text(tail).splitlines()[-1]
    assert "loss: 0.25" in page["text"] and "line 02999" in page["text"]

    first = (await call(server, "logs", {"job_id": sub["id"], "offset": 0, "max_bytes": 1000})).structured_content
    line = len(("line 00000 " + "x" * 40 + "\n").encode())  # 51 bytes: a cut page ends at a line end
    assert first["text"].startswith("line 00000") and first["next_offset"] == 1000 // line * line
    assert first["truncated"] and first["text"].split("\n[truncated")[0].endswith("x\n") and f"offset={first['next_offset']}" in first["hint"]
    second = (await call(server, "logs", {"job_id": sub["id"], "offset": first["next_offset"],
                                          "max_bytes": 1000})).structured_content
    assert second["offset"] == first["next_offset"] and second["text"].startswith("line 00019 ")

    few = (await call(server, "logs", {"job_id": sub["id"], "tail_lines": 3})).structured_content
    lines, trailer = few["text"].splitlines()[:-1], few["text"].splitlines()[-1]
    assert lines == ["line 02998 " + "x" * 40, "line 02999 " + "x" * 40, "loss: 0.25"]
    assert trailer.startswith("[truncated: ") and "offset=0" in trailer

    grep = (await call(server, "logs", {"job_id": sub["id"], "grep": "^line 0150[0-2]"})).structured_content
    assert grep["text"].splitlines() == [f"{1501 + i}: line 0150{i} " + "x" * 40 for i in range(3)]


async def test_logs_resource_returns_the_tail(server: Any, api: Any) -> None:
    sub = await ok(server, "submit", {"command": [PY, "-c", "print('hello from the job')"]})
    wait_state(api, sub["id"], "succeeded")
    async with connect(server) as client:
        resource = await client.read_resource(f"autoresearch://jobs/{sub['id']}/logs")
        assert "hello from the job" in resource.contents[0].text
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == ["autoresearch://jobs/{job_id}/logs"]


async def test_metrics_series_is_downsampled(server: Any, api: Any) -> None:
    program = "from autoresearch import report\nfor s in range(1000): report(s, loss=1000 - s)"
    sub = await ok(server, "submit", {"command": [PY, "-c", program]})
    wait_state(api, sub["id"], "succeeded")
    metric = (await ok(server, "metrics", {"job_id": sub["id"], "series": True, "max_points": 50}))["metrics"][0]
    assert metric["count"] == 1000 and metric["best"] == 1.0
    assert 2 <= len(metric["series"]) <= 50 and metric["series"][0][0] == 0 and metric["series"][-1][0] == 999
    default = (await ok(server, "metrics", {"job_id": sub["id"], "series": True}))["metrics"][0]
    assert len(default["series"]) <= 200
    none_yet = await ok(server, "metrics", {"job_id": sub["id"], "names": ["nope"]})
    assert none_yet["metrics"] == [] and "no metric named 'nope'; its metrics: loss" in none_yet["next_step"]


async def test_list_jobs_pages_with_a_cursor_and_filters(server: Any, api: Any) -> None:
    ids = [(await ok(server, "submit", {"command": ["true"], "experiment": "e1" if i % 2 else "e0"}))["id"]
           for i in range(5)]
    for job_id in ids:
        wait_state(api, job_id, "succeeded")
    first = await ok(server, "list_jobs", {"limit": 2})
    assert [j["id"] for j in first["jobs"]] == ids[:-3:-1] and first["next_cursor"] == ids[3]
    second = await ok(server, "list_jobs", {"limit": 2, "cursor": first["next_cursor"]})
    third = await ok(server, "list_jobs", {"limit": 2, "cursor": second["next_cursor"]})
    assert [j["id"] for j in second["jobs"] + third["jobs"]] == ids[2::-1] and third["next_cursor"] is None
    e1 = await ok(server, "list_jobs", {"experiment": "e1"})
    assert {j["id"] for j in e1["jobs"]} == {ids[1], ids[3]}
    assert (await ok(server, "list_jobs", {"state": "failed"}))["jobs"] == []


async def test_cancel_stops_a_running_job_and_leaves_an_ended_one(server: Any, api: Any) -> None:
    sub = await ok(server, "submit", {"command": ["sleep", "60"]})
    wait_state(api, sub["id"], "running")
    cancelled = await ok(server, "cancel", {"job_id": sub["id"]})
    assert cancelled["id"] == sub["id"] and (cancelled["cancelling"] or cancelled["state"] == "cancelled")
    assert wait_state(api, sub["id"], "cancelled").end_reason == "cancelled"

    done = await ok(server, "submit", {"command": ["true"]})
    wait_state(api, done["id"], "succeeded")
    again = await ok(server, "cancel", {"job_id": done["id"]})
    assert again["state"] == "succeeded" and "nothing was changed" in again["next_step"]


async def test_cluster_status_shows_gpus_queue_and_cordons(server: Any, api: Any) -> None:
    big = await ok(server, "submit", {"command": ["sleep", "60"], "gpus": 2})
    wait_state(api, big["id"], "running")
    queued = await ok(server, "submit", {"command": ["true"], "gpus": 1, "priority": "best-effort"})
    cluster = await ok(server, "cluster_status")
    assert cluster["gpus_total"] == 2 and cluster["gpus_free"] == 0 and cluster["gpus_used"] == 2
    assert cluster["queued"]["best-effort"] == 1 and cluster["running"] == 1
    node = cluster["nodes"][0]["name"]
    api.cordon(node, reason="ECC errors on GPU 1")
    cordoned = await ok(server, "cluster_status")
    assert cordoned["cordoned"] == [f"{node}: ECC errors on GPU 1"] and cordoned["nodes"][0]["state"] == "cordoned"
    api.cancel([big["id"], queued["id"]])


async def test_checkpoint_and_mounts_resolve_inside_the_root(server: Any, api: Any, workdir: Path) -> None:
    (workdir / "data").mkdir()
    (workdir / "data" / "x.txt").write_text("42")
    (workdir / "run").mkdir()
    sub = await ok(server, "submit", {"command": ["cat", "input/x.txt"], "workdir": "run",
                                      "mounts": {"input": "data"}, "checkpoint": True})
    view = wait_state(api, sub["id"], ("succeeded", "failed"))
    assert view.state == "succeeded", view.log_excerpt
    assert view.workdir == str(workdir / "run")
    assert "42" in (await call(server, "logs", {"job_id": sub["id"]})).structured_content["text"]


async def test_diagnose_failed_job_prompt_fills_in_the_facts(server: Any, api: Any) -> None:
    sub = await ok(server, "submit", {"command": [PY, "-c", "print('loss: 3.5'); import missing_module_xyz"]})
    wait_state(api, sub["id"], "failed")
    async with connect(server) as client:
        names = [p.name for p in (await client.list_prompts()).prompts]
        assert "diagnose_failed_job" in names
        prompt = await client.get_prompt("diagnose_failed_job", {"job_id": str(sub["id"])})
    body = prompt.messages[0].content.text
    assert "failure class user" in body and "missing_module_xyz" in body and '"loss"' in body
    assert f"logs(job_id={sub['id']}" in body


async def test_a_project_scoped_server_sees_only_its_jobs(api: Any, workdir: Path) -> None:
    from autoresearch.tools.server import build_server

    theirs = api.submit({"command": ["true"], "workdir": str(workdir)}, project="other")
    mine_server = build_server(api, project="mine", root=workdir)
    mine = await ok(mine_server, "submit", {"command": ["true"]})
    assert [j["id"] for j in (await ok(mine_server, "list_jobs"))["jobs"]] == [mine["id"]]
    hidden = await call(mine_server, "status", {"job_id": theirs.id})
    assert hidden.is_error and f"no job {theirs.id}" in text(hidden) and "list_jobs" in text(hidden)
    assert (await call(mine_server, "cancel", {"job_id": theirs.id})).is_error
    assert api.status(theirs.id).cancelling is False


async def test_read_only_server_refuses_submit_and_cancel(api: Any, workdir: Path) -> None:
    from autoresearch.tools.server import build_server

    job = api.submit({"command": ["sleep", "30"], "workdir": str(workdir)})
    ro = build_server(api, read_only=True, root=workdir)
    for name, args in (("submit", {"command": ["true"]}), ("cancel", {"job_id": job.id})):
        result = await call(ro, name, args)
        assert result.is_error and "--read-only" in text(result) and "hint:" in text(result)
    assert [j.id for j in api.list_jobs().jobs] == [job.id] and not api.status(job.id).cancelling
    assert (await ok(ro, "status", {"job_id": job.id}))["job"]["id"] == job.id
    api.cancel([job.id])


async def test_extra_tool_families_are_registered_when_present(api: Any, workdir: Path) -> None:
    from autoresearch.tools.server import FAMILIES, available_families, build_server

    assert "loop" in FAMILIES  # the loop package's tools join when autoresearch/tools/loop.py exists
    families = (*FAMILIES, "tests.tools.extra_family", "tests.tools.not_there")
    assert available_families(families)[-1] == "tests.tools.extra_family"
    server = build_server(api, root=workdir, families=families)
    assert (await ok(server, "echo_project", {}))["project"] is None


def test_tool_errors_never_leak_a_traceback(api: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio

    from autoresearch.tools.server import build_server

    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(api, "cluster", boom)
    result = anyio.run(call, build_server(api, root=workdir), "cluster_status")
    assert result.is_error and "secret" not in text(result) and "Traceback" not in text(result)
    assert "hint:" in text(result)


async def test_an_array_is_one_submit_and_one_cancel(server: Any, api: Any, workdir: Path) -> None:
    sub = await ok(server, "submit", {"command": ["sh", "-c", 'echo "$AUTORESEARCH_ARRAY_INDEX" > "i.$AUTORESEARCH_ARRAY_INDEX"'],
                                      "name": "seed", "array": "0-2"})
    assert (sub["count"], sub["last_id"] - sub["id"]) == (3, 2) and sub["name"] == "seed[0]"
    assert f"cancel(job_id={sub['id']}, last_job_id={sub['last_id']})" in sub["next_step"]
    for job_id in range(sub["id"], sub["last_id"] + 1):
        wait_state(api, job_id, "succeeded")
    assert sorted(p.read_text() for p in workdir.glob("i.*")) == ["0\n", "1\n", "2\n"]
    held = await ok(server, "submit", {"command": ["sleep", "30"], "array": "0-3%1"})
    bad = await call(server, "cancel", {"job_id": held["id"], "last_job_id": held["last_id"] + 1})
    assert bad.is_error and f"no job {held['last_id'] + 1}" in text(bad)  # nothing was cancelled
    assert api.status(held["id"] + 3).state == "queued"
    done = await ok(server, "cancel", {"job_id": held["id"], "last_job_id": held["last_id"]})
    assert sum(done["states"].values()) == 4 and done["states"].get("queued") is None
    wrong = await call(server, "submit", {"command": ["true"], "array": "0-9%0"})
    assert wrong.is_error and "0-99%8" in text(wrong)  # the grammar, in the hint
