"""Paths are resolved beneath their root (docs/security.md): where the server makes a link or a file
for a job, a link on the way is never followed, and a tenant's job makes it write only in its own
places. Mounts outside containers are refused on engines whose nodes are not this host."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoresearch.api import Api
from autoresearch.backends import Backend
from autoresearch.engine.runtime import _prepare_mounts
from autoresearch.errors import SpecError
from tests.conftest import wait_state
from tests.tools.conftest import NEEDS_BWRAP


@pytest.fixture
def places(tmp_path: Path) -> SimpleNamespace:
    root, outside, data = tmp_path / "root", tmp_path / "outside", tmp_path / "data"
    for folder in (root, outside, data):
        folder.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    return SimpleNamespace(root=root, outside=outside, data=data)


def test_a_mount_through_a_link_in_the_workdir_is_refused_at_submit(home: Path, places: SimpleNamespace) -> None:
    api = Api(backend="local")
    with pytest.raises(SpecError, match="leads outside the workdir"):
        api.submit({"command": ["true"], "workdir": str(places.root), "mounts": {"link/pwn": str(places.data)}})
    with pytest.raises(SpecError, match="leads outside the workdir"):
        api.submit({"command": ["true"], "workdir": str(places.root), "mounts": {"../up": str(places.data)}})
    assert api.list_jobs().jobs == [] and list(places.outside.iterdir()) == []


def test_a_link_swapped_in_after_submit_is_not_followed_at_launch(places: SimpleNamespace) -> None:
    """The runtime's own walk (openat, O_NOFOLLOW) holds even when the check at submit saw a folder."""
    spec = {"workdir": str(places.root), "mounts": {"link/pwn": str(places.data)}}
    with pytest.raises(OSError, match="through a link"):
        _prepare_mounts(spec)
    assert list(places.outside.iterdir()) == []
    (places.root / "sub" / "deeper").mkdir(parents=True)
    _prepare_mounts({"workdir": str(places.root), "mounts": {"sub/deeper/data": str(places.data)}})
    assert (places.root / "sub" / "deeper" / "data").resolve() == places.data  # beneath it: made
    _prepare_mounts({"workdir": str(places.root), "mounts": {"sub/deeper/data": str(places.data)}})  # made once
    (places.root / "file").write_text("x")
    with pytest.raises(OSError):
        _prepare_mounts({"workdir": str(places.root), "mounts": {"file/x": str(places.data)}})


@NEEDS_BWRAP
def test_a_tenants_job_cannot_make_links_in_the_shared_root(home: Path, places: SimpleNamespace) -> None:
    api = Api(backend="local")
    api.register_tenant("team-a")
    for mounts in ({"data": str(places.data)}, {"/tmp/anywhere": str(places.data)}):
        with pytest.raises(SpecError, match="a place this project may not write"):
            api.submit({"command": ["true"], "workdir": str(places.root), "mounts": mounts}, project="team-a")
    with pytest.raises(SpecError, match="outside this project's own places"):
        api.submit({"command": ["true"], "workdir": str(places.root), "checkpoint": str(places.outside / "ck")},
                   project="team-a")
    assert not (places.root / "data").exists() and not (places.outside / "ck").exists()
    job = api.submit({"command": ["true"], "workdir": str(places.root), "mounts": {"data": str(places.data)}})
    wait_state(api, job.id, "succeeded")  # a single-user job still links in its own workdir
    assert (places.root / "data").resolve() == places.data


@pytest.mark.parametrize("kind", ["slurm", "ray"])
def test_mounts_are_refused_where_the_nodes_are_not_this_host(kind: str, tmp_path: Path) -> None:
    from autoresearch.backends import _factory

    engine = SimpleNamespace(name=kind, capabilities=_factory(kind).capabilities)  # the real flags, no cluster
    spec = SimpleNamespace(gpus=0, nodes=1, priority="normal", image="", mounts={"data": str(tmp_path)})
    with pytest.raises(SpecError, match="runs jobs on its own nodes"):
        Backend.check(engine, spec)  # type: ignore[arg-type]
    Backend.check(engine, SimpleNamespace(gpus=0, nodes=1, priority="normal", image="", mounts={}))  # type: ignore[arg-type]


def test_a_patch_that_plants_a_link_as_the_worktree_marker_writes_nothing_through_it(tmp_path: Path) -> None:
    from autoresearch.loop.proposers.code import MARKER, prepare_trial_workdir

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print('loss: 1')\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    patch = (f"diff --git a/{MARKER} b/{MARKER}\nnew file mode 120000\n--- /dev/null\n+++ b/{MARKER}\n"
             f"@@ -0,0 +1 @@\n+{victim}\n\\ No newline at end of file\n")
    with pytest.raises(SpecError, match=MARKER):
        prepare_trial_workdir(repo, patch, tmp_path / "trial-1")
    assert victim.read_text() == "precious\n"
