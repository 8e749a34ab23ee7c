"""Fair share from config.yaml's ``scheduler:`` section (issue 11): bad input refused with a hint
before anything runs, the pass ordering projects by share and holding them to quotas, and each
project's use shown by ``autoresearch nodes`` (table and --json)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.backends.profiles import load
from autoresearch.errors import CapacityError, SpecError
from tests.runtime.test_cli import cli


def write_config(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(text)


def submit(api: Api, project: str = "", **spec: Any) -> int:
    return int(api.submit({"command": ["train"], "workdir": os.getcwd(), **spec}, project=project).id)


@pytest.mark.parametrize("section, message, hint", [
    ("scheduler: [1, 2]", "scheduler must be a mapping", "write scheduler:"),
    ("scheduler: {projets: {}}", "scheduler: unknown key 'projets'", "did you mean 'projects'?"),
    ("scheduler: {projects: {a: {weight: -1}}}", "scheduler.projects.a.weight must be a number > 0", "relative"),
    ("scheduler: {projects: {a: {weight: .nan}}}", "got 'nan'", "relative"),
    ("scheduler: {projects: {a: {weight: 0}}}", "weight must be a number > 0", "best-effort"),
    ("scheduler: {projects: {a: {weight: true}}}", "weight must be a number > 0", "relative"),
    ("scheduler: {projects: {a: {weight: 1e400}}}", "weight must be a number > 0", "relative"),
    ("scheduler: {default_weight: '2'}", "scheduler.default_weight must be a number > 0", "relative"),
    ("scheduler: {projects: {a: {gpu_quota: -2}}}", "gpu_quota must be a whole number of GPUs >= 0", "gpu_quota: 8"),
    ("scheduler: {projects: {a: {gpu_quota: 1.5}}}", "gpu_quota must be a whole number", "gpu_quota: 8"),
    ("scheduler: {projects: {a: {gpu_quota: 99999999999999}}}", "gpu_quota must be a whole number", "gpu_quota"),
    ("scheduler: {projects: {a: {quota: 2}}}", "scheduler.projects.a: unknown key 'quota'", "'gpu_quota'"),
    ("scheduler: {projects: [a, b]}", "scheduler.projects must be a mapping", "write scheduler:"),
    ("scheduler: {projects: {a: 3}}", "scheduler.projects.a must be a mapping", "weight: 1"),
    ("scheduler: {projects: {\"x\\ny\": {}}}", "is not a project name", "one line"),
])
def test_a_bad_scheduler_section_is_one_error_with_a_hint(home: Path, section: str, message: str, hint: str) -> None:
    write_config(home, section + "\n")
    with pytest.raises(SpecError) as err:
        load(home)
    assert message in err.value.message and str(home / "config.yaml") in err.value.message
    assert hint in err.value.hint


def test_a_good_section_parses_and_none_means_off(home: Path) -> None:
    write_config(home, "scheduler:\n  default_weight: 2\n  projects:\n    a: {weight: 3, gpu_quota: 1}\n    b:\n")
    fair = load(home).fair
    assert (fair.share("a").weight, fair.share("a").quota) == (3.0, 1)
    assert (fair.share("b").weight, fair.share("b").quota) == (2.0, None)  # listed with nothing: the default
    assert fair.share("zzz").weight == 2.0
    write_config(home, "default: local\n")
    assert load(home).fair is None


def test_the_health_section_beside_it_is_not_an_unknown_key(home: Path) -> None:
    write_config(home, "health:\n  preflight_cache: 0\nscheduler: {projects: {a: {weight: 2}}}\n")
    assert load(home).fair.share("a").weight == 2.0  # health: is health/config.py's to parse


def test_cli_refuses_a_broken_section_with_exit_2(home: Path) -> None:
    write_config(home, "scheduler: {projects: {a: {weight: -1}}}\n")
    out = cli("submit", "--", "true", check=False)
    assert out.returncode == 2 and "weight must be a number > 0" in out.stderr and "hint:" in out.stderr
    assert "Traceback" not in out.stderr


def test_quotas_above_the_fleet_and_a_job_above_its_quota_are_refused(home: Path) -> None:
    fake = FakeBackend(nodes=2, gpus=2)  # 4 GPUs
    write_config(home, "scheduler: {projects: {a: {gpu_quota: 3}, b: {gpu_quota: 2}}}\n")
    api = Api(home, backend=fake)
    with pytest.raises(CapacityError, match="add up to 5 GPUs but the fleet has 4") as err:
        submit(api, "a", gpus=1)
    assert "lower the gpu_quota" in err.value.hint
    write_config(home, "scheduler: {projects: {a: {gpu_quota: 2}}}\n")
    with pytest.raises(CapacityError, match="asks for 4 GPU\\(s\\) but project 'a' has a gpu_quota of 2") as err:
        submit(api, "a", gpus=2, nodes=2)
    assert "best-effort" in err.value.hint
    assert api.list_jobs().jobs == [] and fake.attempts() == []  # nothing recorded, nothing started
    assert submit(api, "a", gpus=2, nodes=2, priority="best-effort")  # best-effort may go past the quota


def test_the_pass_holds_a_project_to_its_quota_and_lets_best_effort_backfill(home: Path) -> None:
    fake = FakeBackend(nodes=1, gpus=4)
    write_config(home, "scheduler: {projects: {a: {gpu_quota: 2}}}\n")
    api = Api(home, backend=fake)
    first = [submit(api, "a", gpus=1) for _ in range(3)]
    assert [api.status(j).state == "queued" for j in first] == [False, False, True]  # the third waits for a's quota
    b = submit(api, "b", gpus=1)
    be = submit(api, "a", gpus=1, priority="best-effort")  # backfills the last idle GPU, past a's quota
    assert api.status(b).state != "queued" and api.status(be).state != "queued"
    usage = {p.project: p for p in api.cluster().projects}
    assert (usage["a"].gpus_used, usage["a"].best_effort_gpus, usage["a"].quota, usage["a"].queued) == (3, 1, 2, 1)
    assert (usage["b"].gpus_used, usage["b"].quota, usage["b"].weight) == (1, None, 1.0)


def test_the_pass_serves_the_project_furthest_below_its_share(home: Path) -> None:
    fake = FakeBackend(nodes=1, gpus=2)
    write_config(home, "scheduler: {default_weight: 1}\n")
    api = Api(home, backend=fake)
    a1, a2 = submit(api, "a", gpus=1), submit(api, "a", gpus=1)  # a fills the fleet
    a3 = submit(api, "a", gpus=1)  # then queues before b
    b1 = submit(api, "b", gpus=1)
    assert api.status(a3).state == "queued" and api.status(b1).state == "queued"
    fake.finish(f"{a1}.1")
    api.status(a1)  # a pass: one GPU is free
    assert api.status(b1).state != "queued" and api.status(a3).state == "queued"  # b holds nothing, a holds 1
    assert a2


def test_nodes_shows_each_projects_use(home: Path) -> None:
    write_config(home, "scheduler: {projects: {vision: {weight: 2, gpu_quota: 1}}}\n")
    out = cli("submit", "--gpus", "1", "--", "sleep", "30")
    assert out.returncode == 0, out.stderr
    shown = cli("nodes")
    assert "projects (fair share)" in shown.stdout and "vision" in shown.stdout and "(default)" in shown.stdout
    data = json.loads(cli("nodes", "--json").stdout)
    rows = {p["project"]: p for p in data["projects"]}
    assert rows["vision"] == {"project": "vision", "gpus_used": 0, "best_effort_gpus": 0, "quota": 1, "weight": 2.0,
                              "running": 0, "queued": 0, "guaranteed": 0, "borrow": None, "decayed_gpu_h": 0.0,
                              "share": 0.0}
    assert rows[""]["gpus_used"] == 1 and rows[""]["running"] == 1
    cli("cancel", "1")
