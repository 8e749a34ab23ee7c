"""No import circles between modules: checked on the source with ``ast`` (tests/test_layers.py's
reading of imports: top level, in functions, under TYPE_CHECKING, ``import_module("x")``).

A circle is a strongly connected part of the graph "module A imports module B" of more than one
module; an import inside a function counts as much as one at the top. There are none: a new one
fails, named by its modules. Break it by moving what both sides need below them (a module of its
own), by handing one side a callable or a class, or by splitting a module along its seam.
"""

from __future__ import annotations

import sys

from tests.test_layers import imports, modules


def module_graph() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports."""
    names = {p[:-3].removesuffix("/__init__").replace("/", "."): p for p in modules()}

    def module_of(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = {module_of(n) for n in imports(path) if n.startswith("autoresearch")}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.add(frozenset(part))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == {frozenset({"a", "b", "c"})}
    assert circles({"a": {"b"}, "b": set()}) == set()
    assert "autoresearch.engine.runtime" in module_graph()["autoresearch.api"]


def test_no_import_circle() -> None:
    found = sorted(sorted(c) for c in circles(module_graph()))
    for circle in found:
        print("import circle:", " -> ".join(circle))
    assert not found, f"import circle(s) {found}: move what both sides need into a module of its own (or below them)"
