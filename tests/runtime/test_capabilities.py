"""Capabilities enforced: what a backend cannot do is refused at submit (exit 2, a hint
naming a backend that can), never started, failed as infrastructure and retried."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends import Capabilities, able
from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.errors import SpecError

SINGLE_NODE = Capabilities(gpus=True, preemption=True, multi_node=False)


def submit(api: Api, **spec: Any) -> Any:
    return api.submit({"command": ["train"], "workdir": os.getcwd(), **spec})


def nothing_written(api: Api, fake: FakeBackend) -> None:
    assert api.list_jobs().jobs == [] and fake.attempts() == []


def test_gang_job_on_a_single_node_backend_is_refused_not_retried(home: Path) -> None:
    # Two nodes, so capacity is there; what is missing is the gang launch.
    fake = FakeBackend(nodes=2, gpus=1, capabilities=SINGLE_NODE)
    api = Api(home, backend=fake)
    with pytest.raises(SpecError) as err:
        submit(api, nodes=2)
    assert err.value.message == "the fake backend runs single-node jobs only (the job asks for nodes: 2)"
    assert err.value.hint.startswith("use nodes: 1, or submit to a backend that runs multi-node (gang) jobs: ")
    assert "kubernetes" in err.value.hint.split(": ", 1)[1]
    assert "slurm" in err.value.hint  # Slurm runs gang jobs (--nodes N)
    nothing_written(api, fake)


def test_gpus_on_a_backend_without_gpus_name_one_that_has_them(home: Path) -> None:
    fake = FakeBackend(capabilities=Capabilities(preemption=True))
    api = Api(home, backend=fake)
    with pytest.raises(SpecError, match="the fake backend has no GPUs") as err:
        submit(api, gpus=1)
    assert re.search(r"use gpus: 0, or submit to a backend with GPUs: [a-z, ]*\blocal\b", err.value.hint)
    nothing_written(api, fake)


def test_best_effort_needs_a_backend_that_preempts(home: Path) -> None:
    fake = FakeBackend(gpus=1, capabilities=Capabilities(gpus=True))
    api = Api(home, backend=fake)
    with pytest.raises(SpecError, match="cannot preempt") as err:
        submit(api, priority="best-effort")
    assert re.search(r"use priority: normal, or submit to a backend that preempts: [a-z, ]*\blocal\b", err.value.hint)
    nothing_written(api, fake)
    assert submit(api, priority="normal").state == "starting"  # what it can do still starts


def test_an_image_on_a_backend_without_containers_is_refused(home: Path) -> None:
    fake = FakeBackend(gpus=1)  # the fake, like local, runs no containers
    api = Api(home, backend=fake)
    with pytest.raises(SpecError, match="cannot run containers") as err:
        submit(api, image="nvcr.io/nvidia/pytorch:24.05-py3")
    assert err.value.hint.startswith("leave image out")
    nothing_written(api, fake)
    assert submit(api, image="").state == "starting"


def test_hints_never_name_the_fake() -> None:
    assert "local" in able("preemption") and "local" in able("gpus")
    # The fake can do everything, but it runs nothing: never suggested.
    assert "fake" not in able("preemption") + able("gpus") + able("multi_node") + able("containers")
    assert "local" in able("multi_node")  # a gang runs on the host, one process group per member (issue 11)


def test_cli_refuses_a_gang_bigger_than_the_host_with_exit_2_and_a_hint(home: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "submit", "--nodes", "3", "--gpus", "1", "--",
                          "true"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out
    assert "a gang of 3 members with 1 GPU(s) each needs 3 GPU slots but this host has 2" in out.stderr
    assert "hint: ask for at most 2 node(s)" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_loop_whose_trials_the_backend_cannot_run_is_refused_before_any_trial(home: Path, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    plan = parse_plan({"name": "be", "objective": {"metric": "loss"},
                       "trial": {"command": "train {x}", "priority": "best-effort"},
                       "space": {"x": [1, 2]}, "proposer": "grid"}, base_dir=tmp_path)
    # Trials that would run end at once, so a loop that is not refused fails this test fast.
    fake = FakeBackend(gpus=1, capabilities=Capabilities(gpus=True), programs={"train": Script(exit_code=0)})
    api = Api(home, backend=fake)
    with pytest.raises(SpecError, match="cannot preempt"):
        Controller(plan, runtime=api._runtime).run()
    assert fake.attempts() == [] and api.list_jobs().jobs == []
