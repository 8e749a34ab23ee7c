"""The mirror's direct artifact writes (a SQLite store's local folder): private, whole, no link followed."""

from __future__ import annotations

import os
import stat

from autoresearch.tracking import _bulk
from autoresearch.tracking._finish import _read_capped


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_new_run_folder_and_subfolders_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        run = tmp_path / "mlartifacts" / "RUN" / "artifacts"
        _bulk.write_texts(str(run), [("logs/a/attempt-1.log", "x" * 10), ("top.json", b"\x00\xff binary")])
        _bulk.write_texts(str(run), [("logs/a/attempt-2.log", "again")])  # folders there: walked, not remade
    finally:
        os.umask(old)
    for folder in (tmp_path / "mlartifacts", run.parent, run, run / "logs", run / "logs" / "a"):
        assert _mode(str(folder)) == 0o700, folder
    assert (run / "logs" / "a" / "attempt-1.log").read_text() == "x" * 10
    assert (run / "logs" / "a" / "attempt-2.log").read_text() == "again"
    assert (run / "top.json").read_bytes() == b"\x00\xff binary"
    for f in run.rglob("*"):
        if f.is_file():
            assert _mode(str(f)) == 0o600, f
    assert not [f for f in run.rglob(".*.tmp")], "a temporary file was left"


def test_a_leftover_temporary_name_is_not_reused(tmp_path):
    _bulk.write_texts(str(tmp_path), [("warm", "")])
    nxt = next(_bulk._TMP) + 1  # the name the next write tries first
    left = tmp_path / f".f.json.{_bulk._PID[0]}-{nxt}.tmp"
    left.write_text("left by a crashed process of this pid")
    _bulk.write_texts(str(tmp_path), [("f.json", "{}")])
    assert (tmp_path / "f.json").read_text() == "{}"
    assert left.read_text() == "left by a crashed process of this pid"


def test_a_link_on_the_way_is_refused(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "logs").symlink_to(elsewhere)
    try:
        _bulk.write_texts(str(run), [("logs/x.log", "secret")])
    except OSError:
        pass
    assert list(elsewhere.iterdir()) == []


def test_folder_files_takes_regular_files_only(tmp_path):
    src = tmp_path / "report"
    (src / "sub").mkdir(parents=True)
    (src / "report.html").write_text("<b>r</b>")
    (src / "sub" / "plot.png").write_bytes(b"\x89PNG\x00" * 1000)
    outside = tmp_path / "secret"
    outside.write_text("not an artifact")
    (src / "link.txt").symlink_to(outside)
    os.mkfifo(src / "pipe")  # a FIFO is not read (it would block the pass)
    files = dict(_bulk.folder_files(str(src), "report"))
    assert files == {"report/report.html": b"<b>r</b>", "report/sub/plot.png": b"\x89PNG\x00" * 1000}


def test_read_capped_whole_and_head_tail(tmp_path, monkeypatch):
    from autoresearch.tracking import _finish

    small = tmp_path / "small.log"
    small.write_bytes(b"line\n\xff\n")
    assert _read_capped(str(small)) == "line\n\ufffd\n"
    monkeypatch.setattr(_finish, "LOG_HEAD", 4)
    monkeypatch.setattr(_finish, "LOG_TAIL", 3)
    big = tmp_path / "big.log"
    big.write_bytes(b"HEAD" + b"m" * 100 + b"END")
    assert _read_capped(str(big)) == "HEAD\n[... 100 bytes cut by autoresearch ...]\nEND"
    assert _read_capped(str(tmp_path / "gone.log")) == ""
