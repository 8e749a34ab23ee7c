"""An attempt's files are written atomically (a temporary file, then a rename). Two threads of one
process writing the same file at once (a loop's controller and an agent's ``stop_loop`` both
stopping a trial: seen in CI as a FileNotFoundError out of ``stop_loop``) must not rename each
other's temporary file away: each writer has its own."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from autoresearch.backends._supervisor import read_json, temp_path, write_json


def test_threads_writing_one_file_at_once_each_finish_and_leave_whole_json(tmp_path: Path) -> None:
    path = str(tmp_path / "stop.json")
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer(n: int) -> None:
        start.wait()
        try:
            for i in range(400):
                write_json(path, {"writer": n, "i": i, "pad": "x" * 200})
        except BaseException as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    data = read_json(path)
    assert data is not None and data["i"] == 399 and data["writer"] in range(4)
    assert json.loads(Path(path).read_text()) == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stop.json"]  # no temporary file left behind


def test_threads_alive_at_once_each_have_their_own_temporary_file(tmp_path: Path) -> None:
    names: list[str] = []
    together = threading.Barrier(3)

    def name() -> None:
        together.wait()  # all three alive at once (a finished thread's id may be reused)
        names.append(temp_path(str(tmp_path / "f")))
        together.wait()

    threads = [threading.Thread(target=name) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(names)) == 3 and all(n.startswith(str(tmp_path / "f.")) for n in names)
