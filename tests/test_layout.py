"""The package's layout shows its architecture: modules import only modules below
them (no import circles), and no library module imports the command line."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "aeroqueue"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at any depth (function-level too),
    leaving out imports made for type hints only."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        tree = ast.parse(path.read_text())
        # Imports for type hints only never run: they make no circle.
        typing_only = {
            id(n) for block in ast.walk(tree)
            if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for stmt in block.body for n in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            deps |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for dep in sorted(graph[node]):
            if dep == start:
                found.append([*path, dep])
            elif dep > start and dep not in path:
                walk(start, dep, [*path, dep])

    for name in sorted(graph):
        walk(name, name, [name])
    return found


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_graph_sees_a_circle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_library_module_imports_the_command_line():
    graph = import_graph()
    library = [m for m in graph if not m.startswith("aeroqueue.cli") and m not in ("aeroqueue.__main__",)]
    offenders = {m: sorted(d for d in graph[m] if d.startswith("aeroqueue.cli")) for m in library}
    assert {m: d for m, d in offenders.items() if d} == {}
