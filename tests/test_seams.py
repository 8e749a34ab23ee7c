"""The controller's parts and the mirror's modules meet their owner through a seam
(:class:`autoresearch.loop.state.LoopHost` / ``LoopState``, :class:`autoresearch.tracking._common.Mirror`),
never through another object's private members (issue 8, "real seams")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "autoresearch"
# Reaches owned by other parts of issue 8 (the facade, the stores): remove when they go.
ALLOWED: set[tuple[str, str]] = {
    # Not ours: MLflow's SQL store (mlflow 3.17), whose bulk path the mirror uses on SQLite (issue 16);
    # any change there sends the mirror back to log_batch (tracking/_metrics.py bulk_log).
    ("tracking/_metrics.py", "store._check_run_is_active"), ("tracking/_metrics.py", "store._get_run"),
    ("tracking/_metrics.py", "store._update_latest_metrics_if_necessary"),
    ("tracking/_sync.py", "client._tracking_client"),
}


def private_reaches(path: Path) -> list[tuple[int, str]]:
    """``x._name`` where ``x`` is not ``self``/``cls`` nor a module this file imports."""
    tree = ast.parse(path.read_text())
    modules = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names if alias.name.startswith("_")}  # private modules: _limits.done(...)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in modules):
            continue
        text = ast.unparse(node)
        if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self":
            text = text.removeprefix("self.")
        out.append((node.lineno, text))
    return out


def test_loop_and_tracking_reach_no_private_member_of_another_object() -> None:
    found = []
    for sub in ("loop", "tracking"):
        for path in sorted((ROOT / sub).glob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found += [f"{rel}:{line}: {text}" for line, text in private_reaches(path) if (rel, text) not in ALLOWED]
    assert found == []


def test_the_check_sees_a_reach_through_a_parameter(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f(c):\n    c._update(force=True)\n    self._ok = os._exit\n")
    assert private_reaches(sample) == [(4, "c._update")]
