"""The house's shape, checked from the source: no import cycle, and every import runs down the layers.

The import graph is read with ``ast`` from every module of ``autoplan/`` and ``runtime/``, imports inside
functions included (a cycle hidden behind a function-level import is still a cycle). The layers, from the
bottom: ``autoplan.errors`` and ``profiles``; ``autoplan.schema`` (the contract); ``autoplan.cost`` (pure
functions) and ``autoplan.export`` (a plan in another stack's configuration); ``autoplan.search``;
``autoplan.report`` and ``autoplan.launcher``; ``autoplan.cli`` on top.
``runtime`` reads only the contract; ``autoplan.profiler`` is the one part of ``autoplan`` that builds
torch modules and may borrow the runtime's models. ``python -m tests.test_layers`` prints the graph's
packages and their arrows.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autoplan", "runtime")

# what each package may import of this project (besides itself)
ALLOWED: dict[str, set[str]] = {
    "autoplan.errors": set(),
    "autoplan.schema": {"autoplan.errors", "profiles"},
    "autoplan.cost": {"autoplan.errors", "autoplan.schema"},
    "autoplan.search": {"autoplan.errors", "autoplan.schema", "autoplan.cost"},
    "autoplan.report": {"autoplan.errors", "autoplan.schema", "autoplan.cost", "autoplan.search"},
    # a plan in another stack's configuration: reads the contract only
    "autoplan.export": {"autoplan.errors", "autoplan.schema"},
    # the launcher checks a checkpoint folder before any process starts with the runtime's torch-free
    # lock and manifest readers (runtime/train/lock.py, manifest.py)
    # and re-evaluates the plan's memory with the cost model (autoplan/report/recheck.py) rather than trust
    # its predicted block; it checks an --init-from folder with the runtime's torch-free reader of
    # safetensors headers (runtime/hf/files.py)
    "autoplan.launcher": {"autoplan.errors", "autoplan.schema", "autoplan.report.recheck", "runtime.train.lock",
                          "runtime.train.manifest", "runtime.hf.files"},
    "autoplan.profiler": {"autoplan.errors", "autoplan.schema", "autoplan.cost", "runtime"},
    "autoplan.cli": {"autoplan", "runtime"},
    "runtime": {"autoplan.errors", "autoplan.schema"},
}
# the planning path must load without torch (a planner machine has no GPU stack)
TORCH_FREE = ("autoplan.schema", "autoplan.cost", "autoplan.search", "autoplan.report", "autoplan.export")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module this file imports, at any depth of its code (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports_of(path):
            # "from a.b import c": c may be a module or a name; keep the longest module prefix
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def layer_of(module: str) -> str:
    return max((key for key in ALLOWED if module == key or module.startswith(key + ".")), key=len)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_every_import_runs_down_the_layers():
    wrong = []
    for module, targets in graph().items():
        if module in ("autoplan", "runtime"):  # the package roots only name their children
            continue
        mine = layer_of(module)
        allowed = ALLOWED[mine]
        for target in targets:
            theirs = "profiles" if target.startswith("profiles") else layer_of(target)
            if theirs == mine or any(t == a or t.startswith(a + ".") for a in allowed for t in (theirs, target)):
                continue
            wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_planning_path_imports_no_torch():
    files = [p for pkg in TORCH_FREE for p in (ROOT / Path(*pkg.split("."))).rglob("*.py")]
    heavy = [f"{module_name(p)} imports {m}" for p in files for m in imports_of(p)
             if m.split(".")[0] in ("torch", "runtime")]
    assert heavy == []


def test_a_cycle_is_found_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


if __name__ == "__main__":
    arrows: dict[tuple[str, str], int] = defaultdict(int)
    for module, targets in graph().items():
        for target in targets:
            a, b = layer_of(module), layer_of(target) if not target.startswith("profiles") else "profiles"
            if a != b:
                arrows[(a, b)] += 1
    for (a, b), n in sorted(arrows.items()):
        print(f"{a:18s} -> {b:18s} {n:3d} imports")
    print(f"cycles: {cycles(graph()) or 'none'}")
