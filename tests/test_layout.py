"""The package's layout: no import cycle between its modules, lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scrapy_retryafter"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside a function."""
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                found.update({target} & files.keys())
                found.update({f"{target}.{alias.name}" for alias in node.names} & files.keys())
            elif isinstance(node, ast.Import):
                found.update({alias.name for alias in node.names} & files.keys())
        # The package's __init__ only re-exports: importing it from a module is not a dependency on every module.
        graph[name] = found - {name, "scrapy_retryafter"}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()

    def walk(start: str, path: list[str]) -> None:
        for module in graph.get(path[-1], ()):
            if module == start:
                found.add(min(tuple(path[i:] + path[:i]) for i in range(len(path))))
            elif module not in path:
                walk(start, [*path, module])

    for module in graph:
        walk(module, [module])
    return found


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    graph = imports()
    assert "scrapy_retryafter.extension" in graph["scrapy_retryafter.middleware"]  # the graph is read at all
    assert cycles(graph) == set()
