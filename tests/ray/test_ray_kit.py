"""The Ray kit's start script, with a stand-in `ray` on PATH (no Ray needed): a head that exits while
starting (Ray's raylet has a fixed 30 s to register, which a loaded machine misses) is started once more."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ray.conftest import KIT, _free_port

# Fails its first start (as `ray start` does when its raylet misses the 30 s); later starts serve the Jobs API.
FAKE_RAY = """#!{python}
import http.server, os, sys
count = os.path.join(os.environ["FAKE_RAY_DIR"], "starts")
n = int(open(count).read()) + 1 if os.path.exists(count) else 1
open(count, "w").write(str(n))
if n <= int(os.environ.get("FAKE_RAY_FAILS", "1")):
    print("Exception: The current node timed out during startup.", flush=True)
    sys.exit(1)
port = int(next(a.split("=")[1] for a in sys.argv if a.startswith("--dashboard-port=")))

class Jobs(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")

http.server.HTTPServer(("127.0.0.1", port), Jobs).serve_forever()
"""


def _kit(tmp_path: Path, fails: int) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(FAKE_RAY.format(python=sys.executable))
    (bin_dir / "ray").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_RAY_DIR": str(tmp_path),
           "FAKE_RAY_FAILS": str(fails)}
    return subprocess.run([str(KIT / "start.sh"), "--dir", str(tmp_path / "head"), "--port", str(_free_port()),
                           "--dashboard-port", str(_free_port()), "--wait", "60"],
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_head_that_exits_while_starting_is_started_once_more(tmp_path: Path) -> None:
    try:
        done = _kit(tmp_path, fails=1)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "starts").read_text() == "2"
        assert "starting it once more" in (tmp_path / "head" / "head.log").read_text()
    finally:
        subprocess.run([str(KIT / "stop.sh"), "--dir", str(tmp_path / "head"), "--kill"], capture_output=True,
                       timeout=60)


def test_a_head_that_exits_twice_is_reported_with_its_log(tmp_path: Path) -> None:
    done = _kit(tmp_path, fails=2)
    assert done.returncode == 1
    assert (tmp_path / "starts").read_text() == "2"  # once more, not for ever
    assert "the Ray head exited" in done.stderr and "timed out during startup" in done.stderr
    assert not (tmp_path / "head" / "head.pid").exists()
