"""The package's layout: no import cycle between its modules, lazy imports included."""

from __future__ import annotations

import ast
import configparser
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


# --------------------------------------------------------------------------
# the pure core: the modules setup.cfg checks with mypy --strict
# --------------------------------------------------------------------------


def pure_core() -> set[str]:
    """The modules of setup.cfg's strict mypy section: the decision modules, which import neither Scrapy nor Twisted."""
    parser = configparser.ConfigParser()
    parser.read(PACKAGE.parent / "setup.cfg", encoding="utf-8")
    strict = [section for section in parser.sections() if section.startswith("mypy-scrapy_retryafter.")]
    assert len(strict) == 1, strict
    return {name.strip() for name in strict[0].removeprefix("mypy-").split(",")}


def framework_imports(path: Path) -> set[str]:
    """Scrapy or Twisted modules imported by ``path``, lazily or not; imports for type checking only aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for statement in node.body for child in ast.walk(statement))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found.update(name for name in names if name.split(".")[0] in {"scrapy", "twisted"})
    return found


def test_the_pure_core_imports_neither_scrapy_nor_twisted_not_even_through_another_module():
    graph = imports()
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    core = pure_core()
    assert {"scrapy_retryafter.board", "scrapy_retryafter.slotchoice", "scrapy_retryafter.hostrecord"} <= core
    assert core <= files.keys(), core - files.keys()  # a renamed module must be renamed in setup.cfg too
    for module in sorted(core):
        reached, todo = set(), [module]
        while todo:
            name = todo.pop()
            if name not in reached:
                reached.add(name)
                todo.extend(graph[name])
        offenders = {name: framework_imports(files[name]) for name in sorted(reached)}
        assert not any(offenders.values()), (module, {k: v for k, v in offenders.items() if v})


def test_the_framework_import_check_sees_lazy_imports_and_skips_type_checking_ones(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scrapy import Request\n"
        "def f():\n    import twisted.internet.reactor\n"
    )
    assert framework_imports(source) == {"twisted.internet.reactor"}


# --------------------------------------------------------------------------
# sizes: modules small enough to read in one sitting
# --------------------------------------------------------------------------

MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250
OVERSIZE: dict[str, str] = {
    # name: why it may be over the limit for now. An entry that fits again must go.
}


def sizes() -> dict[str, int]:
    """``path`` -> lines of each module, ``path::Class`` -> lines of each class (nested ones too)."""
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        found[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                found[f"{name}::{node.name}"] = node.end_lineno - node.lineno + 1
    return found


def oversize(found: dict[str, int]) -> dict[str, int]:
    return {
        name: lines
        for name, lines in found.items()
        if lines > (MAX_CLASS_LINES if "::" in name else MAX_MODULE_LINES)
    }


def test_the_size_check_finds_a_long_class_and_a_long_module():
    found = {"a.py": 401, "a.py::A": 251, "b.py": 400, "b.py::B": 250}
    assert oversize(found) == {"a.py": 401, "a.py::A": 251}


def test_no_module_over_400_lines_and_no_class_over_250_unless_listed_with_why():
    found = sizes()
    assert found["scrapy_retryafter/board.py::CooldownBoard"] > 100  # classes are measured at all
    over = oversize(found)
    assert sorted(set(over) - OVERSIZE.keys()) == [], {name: over[name] for name in set(over) - OVERSIZE.keys()}
    fits = sorted(name for name in OVERSIZE if name not in over)
    assert fits == [], f"no longer over the limit: remove from OVERSIZE {fits}"
