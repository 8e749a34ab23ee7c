"""The mirror's raw ``executemany`` (tracking/_bulk.py): SQL compiled by SQLAlchemy once, rows handed
to the SQLite driver as tuples, with the same rows and the same errors as ``session.execute``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    create_engine,
    select,
    update,
)
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from autoresearch.tracking import _bulk

META = MetaData()
ITEMS = Table("items", META, Column("run", String, primary_key=True), Column("key", String, primary_key=True),
              Column("value", String), Column("stage", String, default="active"),
              Column("made", Integer, default=lambda: 7))


def _engine(tmp_path: Path, name: str) -> Any:
    engine = create_engine(f"sqlite:///{tmp_path / name}")
    META.create_all(engine)
    return engine


def _upsert() -> Any:
    stmt = insert(ITEMS)
    return stmt.on_conflict_do_update(index_elements=[ITEMS.c.run, ITEMS.c.key], set_={"value": stmt.excluded.value})


def _all(engine: Any) -> list[tuple[Any, ...]]:
    with Session(engine) as s:
        return [tuple(r) for r in s.execute(select(ITEMS).order_by(ITEMS.c.run, ITEMS.c.key))]


def test_the_same_rows_as_sqlalchemy_writes(tmp_path: Path) -> None:
    rows = [{"run": f"r{i % 7}", "key": f"k{i}", "value": f"v{i}", "stage": "active", "made": i} for i in range(50)]
    again = [{"run": "r1", "key": "k1", "value": "changed", "stage": "active", "made": 1}]
    ends = [{"rid": "r2", "st": "gone"}, {"rid": "r3", "st": "'; DROP TABLE items; --"}]
    ours, theirs = _engine(tmp_path, "ours.db"), _engine(tmp_path, "theirs.db")
    end = lambda: update(ITEMS).where(ITEMS.c.run == bindparam("rid")).values(stage=bindparam("st"))  # noqa: E731
    with Session(ours) as s, s.begin():
        _bulk.executemany(s, ("test", "upsert"), _upsert, rows)
        _bulk.executemany(s, ("test", "upsert"), _upsert, again)
        _bulk.executemany(s, ("test", "end"), end, ends)
        _bulk.executemany(s, ("test", "end"), end, [])  # nothing: no statement
    with Session(theirs) as s, s.begin():
        s.execute(_upsert(), rows)
        s.execute(_upsert(), again)
        s.execute(end(), ends)
    assert _all(ours) == _all(theirs)
    assert ("r1", "k1", "changed", "active", 1) in _all(ours) and len(_all(ours)) == 50


def test_a_left_out_column_gets_its_default(tmp_path: Path) -> None:
    """A constant default is filled in; a default computed in Python sends the rows through SQLAlchemy."""
    engine = _engine(tmp_path, "d.db")
    with Session(engine) as s, s.begin():
        _bulk.executemany(s, ("test", "plain"), lambda: insert(ITEMS), [{"run": "a", "key": "k", "value": "v"}])
    assert _all(engine) == [("a", "k", "v", "active", 7)]


def test_the_statement_is_compiled_once(tmp_path: Path) -> None:
    engine = _engine(tmp_path, "c.db")
    made: list[int] = []

    def make() -> Any:
        made.append(1)
        return _upsert()

    with Session(engine) as s, s.begin():
        for i in range(3):
            _bulk.executemany(s, ("test", "once"), make, [{"run": "r", "key": str(i), "value": "v", "stage": "s",
                                                           "made": 0}])
    assert len(made) == 1 and len(_all(engine)) == 3


def test_a_busy_database_is_sqlalchemys_operational_error(tmp_path: Path) -> None:
    """MLflow's session turns SQLAlchemy's OperationalError into its retryable error: the raw call
    raises that one too, not the driver's."""
    engine = create_engine(f"sqlite:///{tmp_path / 'busy.db'}", connect_args={"timeout": 0.05})
    META.create_all(engine)
    holder = sqlite3.connect(tmp_path / "busy.db")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(OperationalError, match="locked"), Session(engine) as s, s.begin():
            _bulk.executemany(s, ("test", "busy"), _upsert, [{"run": "r", "key": "k", "value": "v", "stage": "s",
                                                              "made": 0}])
    finally:
        holder.rollback()
        holder.close()


FLAGS = Table("flags", META, Column("id", Integer, primary_key=True), Column("on", Boolean), Column("v", Float))


def test_a_column_with_a_bind_processor_gets_it(tmp_path: Path) -> None:
    """(MLflow's metrics: is_nan is a Boolean, which SQLAlchemy hands SQLite through a processor.)"""
    rows = [{"id": i, "on": i % 2 == 0, "v": i / 3} for i in range(20)]
    ours, theirs = _engine(tmp_path, "fo.db"), _engine(tmp_path, "ft.db")
    with Session(ours) as s, s.begin():
        _bulk.executemany(s, ("test", "flags"), lambda: insert(FLAGS), rows)
    with Session(theirs) as s, s.begin():
        s.execute(insert(FLAGS), rows)
    read = "SELECT id, \"on\", typeof(\"on\"), v FROM flags ORDER BY id"
    with ours.connect() as a, theirs.connect() as b:
        assert list(a.exec_driver_sql(read)) == list(b.exec_driver_sql(read))


@pytest.mark.parametrize("uri", ["file:///a/b/c", "file:///a/b%20c", "file:///a;x/b", "file://host/a", "file:///",
                                 "file:////x", "file:///a?x#y", "file://localhost/a", "s3://b/x", "/abs", "file:/a",
                                 "mlflow-artifacts:/1/r/artifacts", "file:///a/../b", "file:///\u00e9/\x00"])
def test_a_local_folder_read_as_urlparse_reads_it(uri: str) -> None:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    expected = uri if uri.startswith("/") else (
        unquote(parsed.path) if parsed.scheme == "file" and parsed.netloc in ("", "localhost")
        and parsed.path.startswith("/") else None)
    assert _bulk.local_dir(uri) == expected
