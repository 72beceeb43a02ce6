"""The tree's import layering, read statically (ast) from every import statement, at module level and
inside functions alike (a lazy import still ties the two modules together):

- the reference imports neither the harness (conformance) nor the kernels (kernels_cu);
- the kernels never import the harness;
- no import cycle among the modules of reference/, conformance/ and kernels_cu/;
- tests/ depend on the package, not on tools/ or benchmarks/;
- tools/ never import tests/.

The checker itself is tested on hand-made graphs, so a clean tree is not mistaken for a checker that
can see nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIRS = ("reference", "conformance", "kernels_cu", "tests", "tools", "benchmarks", "examples")
PACKAGE = ("reference", "conformance", "kernels_cu")
# (importer top-level directory, imported top-level directory): imports that must not exist
FORBIDDEN = {
    ("reference", "conformance"): "the reference imports the harness",
    ("reference", "kernels_cu"): "the reference imports the kernels",
    ("kernels_cu", "conformance"): "the kernels import the harness",
    ("tests", "tools"): "a test imports tools/ (tests depend on the package only)",
    ("tests", "benchmarks"): "a test imports benchmarks/ (tests depend on the package only)",
    ("tools", "tests"): "a tool imports tests/",
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules(root: Path = ROOT, dirs=DIRS) -> dict[str, Path]:
    found = {}
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imported_names(path: Path, module: str) -> list[tuple[str, int]]:
    """(module or module.attribute imported, line) for every import statement of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out += [(f"{base}.{a.name}" if a.name != "*" else base, node.lineno) for a in node.names]
    return out


def resolve(name: str, known) -> str | None:
    """The known module ``name`` refers to: itself, or the module that defines the attribute."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(root: Path = ROOT, dirs=DIRS) -> dict[str, dict[str, int]]:
    """{importer: {imported module of the tree: first line}}; imports of outside modules are left out."""
    known = modules(root, dirs)
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for mod, path in known.items():
        for name, line in imported_names(path, mod):
            target = resolve(name, known)
            if target is None:  # outside the tree, or a directory without modules: keep its top level
                top = name.split(".")[0]
                target = top if top in dirs else None
            if target is not None and target != mod:
                graph[mod].setdefault(target, line)
    return graph


def wrong_way(graph, forbidden=FORBIDDEN) -> list[str]:
    bad = []
    for src, targets in graph.items():
        for dst, line in targets.items():
            why = forbidden.get((src.split(".")[0], dst.split(".")[0]))
            if why:
                bad.append(f"{why}: {src} (line {line}) imports {dst}")
    return bad


def cycles(graph, within=PACKAGE) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) per strongly connected component of more than one module, among
    the modules whose top-level directory is in ``within``."""
    nodes = sorted(m for m in graph if m.split(".")[0] in within)
    keep = set(nodes)
    edges = {m: sorted(d for d in graph[m] if d in keep) for m in nodes}
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):  # Tarjan, iterative over each node's edges
        work = [(v, iter(edges[v]))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(set(comp))

    for v in nodes:
        if v not in index:
            strong(v)
    found = []
    for comp in comps:  # a shortest path back to the component's first module names the cycle
        start = min(comp)
        prev, frontier = {start: None}, [start]
        end = None
        while frontier and end is None:
            nxt = []
            for v in frontier:
                for w in edges[v]:
                    if w == start:
                        end = v
                        break
                    if w in comp and w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [end]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        found.append([*reversed(path), start])
    return found


def _describe(cycle) -> str:
    return " -> ".join(cycle)


# --- the tree --------------------------------------------------------------------------------------

GRAPH = import_graph()


def test_the_graph_sees_the_tree():
    assert len(GRAPH) > 100
    assert "conformance.fuzz" in GRAPH["conformance.cli"]  # imported inside a function
    assert any(d.startswith("reference.") for d in GRAPH["conformance.baseline"])


def test_reference_imports_neither_the_harness_nor_the_kernels():
    bad = [b for b in wrong_way(GRAPH) if b.startswith("the reference")]
    assert not bad, "\n".join(bad)


def test_kernels_never_import_the_harness():
    bad = [b for b in wrong_way(GRAPH) if b.startswith("the kernels")]
    assert not bad, "\n".join(bad)


def test_no_import_cycle_in_the_package():
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(_describe(c) for c in found)


def test_tests_depend_on_the_package_only():
    bad = [b for b in wrong_way(GRAPH) if b.startswith("a test")]
    assert not bad, "\n".join(bad)


def test_tools_never_import_tests():
    bad = [b for b in wrong_way(GRAPH) if b.startswith("a tool")]
    assert not bad, "\n".join(bad)


# --- the checker, on hand-made input ----------------------------------------------------------------

def test_checker_names_a_cycle_and_ignores_chains():
    graph = {"conformance.a": {"conformance.b": 3}, "conformance.b": {"conformance.c": 5},
             "conformance.c": {"conformance.a": 9, "reference.x": 1}, "reference.x": {},
             "conformance.d": {"conformance.a": 1}}
    assert cycles(graph) == [["conformance.a", "conformance.b", "conformance.c", "conformance.a"]]
    assert "conformance.a -> conformance.b -> conformance.c -> conformance.a" in _describe(cycles(graph)[0])
    del graph["conformance.c"]["conformance.a"]
    assert cycles(graph) == []
    # a cycle through tests/ is not the package's
    assert cycles({"tests.a": {"tests.b": 1}, "tests.b": {"tests.a": 1}}) == []


def test_checker_reports_every_wrong_way_edge():
    graph = {"reference.norms": {"conformance.registry": 4, "reference.numerics": 2},
             "kernels_cu.round": {"conformance.rounds": 31, "reference.rounds": 1},
             "tests.test_x": {"tools": 7, "conformance.cli": 1}, "tools.calibration": {"tests.controls": 12}}
    bad = wrong_way(graph)
    assert len(bad) == 4, bad
    assert "the reference imports the harness: reference.norms (line 4) imports conformance.registry" in bad
    assert any("kernels_cu.round (line 31) imports conformance.rounds" in b for b in bad)
    assert any(b.startswith("a test imports tools/") for b in bad)
    assert any(b.startswith("a tool imports tests/") for b in bad)


def test_checker_reads_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "kernels_cu"
    (pkg / "fast").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fast" / "__init__.py").write_text("from .. import loader\n")
    (pkg / "loader.py").write_text("def f():\n    from conformance import rounds\n    return rounds\n")
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "__init__.py").write_text("")
    (tmp_path / "conformance" / "rounds.py").write_text("import kernels_cu.fast\n")
    graph = import_graph(tmp_path, ("kernels_cu", "conformance"))
    assert graph["kernels_cu.fast"] == {"kernels_cu.loader": 1}
    assert graph["kernels_cu.loader"] == {"conformance.rounds": 2}
    assert wrong_way(graph) == ["the kernels import the harness: kernels_cu.loader (line 2) imports conformance.rounds"]
    assert cycles(graph) == [["conformance.rounds", "kernels_cu.fast", "kernels_cu.loader", "conformance.rounds"]]
