"""``upload: true`` on a real Ray head: the job's workdir goes through Ray's own
JobSubmissionClient (packaged, uploaded, run from the package), and a workdir or runtime_env that
cannot be packaged is the job's failure, never retried as the machine's. Also: a second kit head
starts beside the session's (no fixed ports)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.backends.ray import RayBackend
from tests.conftest import wait_state

from .conftest import RayHead, _free_port

pytestmark = pytest.mark.slow

SHIPPED = textwrap.dedent("""\
    import os, sys
    import shipped_module
    print("cwd", os.getcwd())
    print("value", shipped_module.VALUE)
    print("ignored", os.path.exists("ignored.bin"))
    """)


def test_upload_ships_the_workdir_through_rays_client(ray_env: RayHead, home: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "shipped_module.py").write_text("VALUE = 'from-the-package-42'\n")
    (code / "main.py").write_text(SHIPPED)
    (code / ".gitignore").write_text("ignored.bin\n")
    (code / "ignored.bin").write_bytes(b"\0" * 1024)  # Ray's packaging honours .gitignore
    api = Api(home, backend=RayBackend(address=ray_env.address, upload=True))
    job = api.submit({"command": [sys.executable, "main.py"], "workdir": str(code)}).id
    view = wait_state(api, job, ("succeeded", "failed"), timeout=120)
    text = api.logs(job).text
    assert view.state == "succeeded", text
    assert "value from-the-package-42" in text and "ignored False" in text
    cwd = next(line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("cwd "))
    assert Path(cwd).resolve() != code.resolve()  # it ran in Ray's copy of the package, not our directory


def test_a_workdir_ray_cannot_package_fails_as_the_users_error_not_retried(ray_env: RayHead, home: Path,
                                                                          tmp_path: Path) -> None:
    backend = RayBackend(address=ray_env.address, upload=True, runtime_env={"py_modules": [str(tmp_path / "nope")]})
    api = Api(home, backend=backend)
    job = api.submit({"command": ["true"], "workdir": str(tmp_path), "max_retries": 2}).id
    wait_state(api, job, "failed", timeout=120)
    rows = api._ledger.query("SELECT end_reason, detail FROM attempts WHERE job_id=?", (job,))
    assert len(rows) == 1, [dict(r) for r in rows]  # not retried: nothing about the machine would change
    assert rows[0]["end_reason"] == "exit" and "could not package and upload" in rows[0]["detail"]
    assert "py_modules" in rows[0]["detail"]  # the hint says what to fix


def test_a_second_kit_head_starts_beside_the_sessions(ray_head: RayHead) -> None:
    other = RayHead(Path(tempfile.mkdtemp(prefix="arr2-", dir="/tmp")), _free_port(), _free_port(), gpus=0, cpus=1)
    try:
        other.start()
        with urllib.request.urlopen(f"{other.address}/api/version", timeout=30) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"{ray_head.address}/api/version", timeout=30) as response:
            assert response.status == 200  # the session's head is untouched
        ports = {(other.dir / f).read_text().strip() for f in ("client.port",)} | {
            (ray_head.dir / "client.port").read_text().strip()}
        assert len(ports) == 2  # each head its own client server port
    except subprocess.CalledProcessError as err:
        log = other.dir / "head.log"
        pytest.fail(f"a second head did not start beside the first: {err.stderr.decode()[-500:]}\n"
                    f"{log.read_text(errors='replace')[-2000:] if log.exists() else ''}")
    finally:
        other.stop(kill=True)
        shutil.rmtree(other.dir, ignore_errors=True)
