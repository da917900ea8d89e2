"""The tfring package has no import cycles.

The graph is built statically from the source (ast), without importing
anything: an edge A -> B for every ``import``/``from ... import`` in A that
names tfring module B, at module level or inside a function alike (relative
imports resolved; ``from pkg import name`` is an edge to ``pkg.name`` when
that is a module, a native one included, else to ``pkg``). A lazy import
inside a function only hides a cycle until the function runs, so it counts
too, unless it is listed in LAZY below with the reason it must stay lazy.
Implicit imports of parent packages and ``importlib.import_module`` with a
computed name (tfring/__init__.py's lazy attributes) are not edges.
"""

import ast
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "tfring"))

# (importer, imported) -> why the import sits inside a function. Such an
# edge is left out of the graph; every entry must still be a function-level
# import of the source.
LAZY = {}

# Cycles not yet removed, each as its set of modules: the test fails on any
# other cycle, and on one of these once it is gone (then delete its entry).
KNOWN = []


def modules():
    """Module name -> path of its source (None: a native extension)."""
    found = {}
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            path = os.path.join(d, f)
            rel = os.path.relpath(path, os.path.dirname(ROOT))
            if f.endswith(".py"):
                name = rel[:-3].replace(os.sep, ".")
                found[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
            elif f.endswith(".so") and not f.startswith("lib"):
                found[rel.split(".")[0].replace(os.sep, ".")] = None
    return found


def _imports(tree):
    """(node, at module level) for every import of a tree, at any depth."""
    def walk(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, top
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, top and not nested)

    yield from walk(tree, True)


def import_edges(mods):
    """[(importer, imported, line, at module level)] between tfring modules."""
    edges = []
    for name, path in sorted(mods.items()):
        if path is None:
            continue
        is_pkg = path.endswith("__init__.py")
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node, top in _imports(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    pkg = ".".join(base + ([node.module] if node.module else []))
                else:
                    pkg = node.module
                targets = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in mods else pkg
                           for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import tfring.a.b` names tfring.a.b
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.append((name, t, node.lineno, top))
    return edges


def find_cycles(graph):
    """One cycle (a list of nodes, first repeated last) per strongly
    connected component with more than one module (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in comps:
        # The shortest way from the component's first module back to it
        # (breadth first; the queue grows as it is read).
        start = min(comp)
        prev, queue, end = {start: None}, [start], None
        for v in queue:
            if start in graph[v]:
                end = v
                break
            for w in sorted(graph[v]):
                if w in comp and w not in prev:
                    prev[w] = v
                    queue.append(w)
        path = []
        while end is not None:
            path.append(end)
            end = prev[end]
        cycles.append(path[::-1] + [start])
    return cycles


def component(graph, v):
    """The modules that v reaches and that reach v."""
    def reach(start, edges):
        seen, todo = {start}, [start]
        while todo:
            for w in edges.get(todo.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    back = {}
    for a, bs in graph.items():
        for b in bs:
            back.setdefault(b, set()).add(a)
    return reach(v, graph) & reach(v, back)


def test_the_package_has_no_import_cycle():
    mods = modules()
    edges = import_edges(mods)
    graph, where = {}, {}
    for a, b, line, top in edges:
        if not top and (a, b) in LAZY:
            continue
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
        at = f"{line}{'' if top else ' (in a function)'}"
        if at not in where.setdefault((a, b), []):
            where[(a, b)].append(at)
    found = find_cycles(graph)
    # A cycle is known when every module of its component is in a KNOWN set.
    known = [c for c in found if any(component(graph, c[0]) <= k for k in KNOWN)]
    for k in KNOWN:
        assert any(set(c) <= k for c in known), \
            f"no cycle among {sorted(k)} any more: drop it from KNOWN"
    cycles = [c for c in found if c not in known]
    text = []
    for c in cycles:
        steps = [f"{a} -> {b} (line {', '.join(where[(a, b)])})" for a, b in zip(c, c[1:])]
        text.append(" -> ".join(c) + ":\n    " + "\n    ".join(steps))
    assert not cycles, "import cycles in tfring:\n" + "\n".join(text)


def test_every_lazy_import_allowed_has_a_reason_and_exists():
    edges = {(a, b) for a, b, _, top in import_edges(modules()) if not top}
    for pair, reason in LAZY.items():
        assert len(reason) > 20, f"{pair}: say why it must stay lazy"
        assert pair in edges, f"{pair} is listed in LAZY but is no function-level import"


@pytest.mark.parametrize("graph,cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"a", "c"}, "c": set()}, ["a", "b", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_the_cycle_finder_finds_cycles(graph, cycle):
    assert find_cycles(graph) == ([cycle] if cycle else [])


def test_the_graph_sees_relative_and_function_level_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "tfring"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from tfring.sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\nimport tfring.sub\n")
    monkeypatch.setitem(globals(), "ROOT", str(pkg))
    edges = import_edges(modules())
    assert sorted(edges) == [("tfring.a", "tfring.b", 1, True),
                             ("tfring.b", "tfring.sub.c", 2, False),
                             ("tfring.sub.c", "tfring.a", 1, True),
                             ("tfring.sub.c", "tfring.sub", 2, True)]
    graph = {}
    for a, b, _, _ in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    assert find_cycles(graph) == [["tfring.a", "tfring.b", "tfring.sub.c", "tfring.a"]]


# What only tests and benchmarks may call: tfring._core_testing's hooks.
TEST_HOOKS = ("DirectAllreduce", "emulate_pull_ring", "fuzz_parse", "sha256", "hmac_sha256",
              "random_bytes")


def test_the_package_never_imports_its_test_hooks():
    """tfring._core_testing (csrc/python/testing/) is built beside _core for
    tests and benchmarks: no module of the package imports it, even lazily
    or by a computed name, and _core itself has none of its hooks."""
    mods = modules()
    users = sorted(name for name, path in mods.items()
                   if path and "_core_testing" in open(path).read())
    assert users == [], f"these tfring modules name tfring._core_testing: {users}"
    users = sorted(f"{a}:{line}" for a, b, line, _ in import_edges(mods)
                   if b == "tfring._core_testing")
    assert users == [], users
    if "tfring._core" in mods:
        from tfring import _core
        left = [n for n in TEST_HOOKS if hasattr(_core, n) or hasattr(_core, "_" + n)]
        assert left == [], f"tfring._core still has test hooks: {left}"
