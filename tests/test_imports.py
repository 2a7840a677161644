"""Data flows one way (read -> model -> rules -> report -> formats -> api -> cli): no module of the package
imports, even inside a function, one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "attntrace"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports, wherever the import statement is (type-checking ones aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    checking: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            checking |= {id(n) for child in node.body for n in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    return {m for m in found if m in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(files)) - {name} for name, path in files.items()}
    # A package's __init__ that re-exports is not a dependency of its submodules on each other.
    graph = {name: {t for t in targets if not (name.startswith(t + ".") and files[t].name == "__init__.py")}
             for name, targets in graph.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


# The packages in the order data flows through them; a module may import its own package and those before it.
# install (pip hints), allocator (polars' memory), cores (its threads), late_signals (signals during native code)
# and liveness (whether a process runs) use the standard library only, for any layer.
LAYERS = ["attntrace.read", "attntrace.model", "attntrace.checks", "attntrace.report", "attntrace.formats",
          "attntrace.capture"]
FRONT = {"attntrace.api", "attntrace.cli", "attntrace.hook", "attntrace.distributed", "attntrace.__main__"}
ANY_LAYER = {"attntrace", "attntrace.install", "attntrace.allocator", "attntrace.cores", "attntrace.late_signals",
             "attntrace.liveness"}


def _layer(module: str) -> int:
    for n, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return n
    return len(LAYERS) if module in FRONT else -1


def test_no_module_imports_a_layer_above_its_own():
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    assert {m for m in files if _layer(m) == -1} == ANY_LAYER  # every module has its layer
    upward = sorted(f"{name} imports {target}" for name, path in files.items()
                    for target in _imports(path, set(files)) if _layer(target) > _layer(name))
    assert upward == []
