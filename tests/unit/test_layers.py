"""The layering the tree promises (docs/ARCHITECTURE.md), checked on the source.

- ``celery_scheduler.core`` is pure: no Django, Celery, kombu or ``django_app`` import;
- the Celery side (``celery_scheduler``) reaches ``django_app`` at run time in one place,
  the public API's deferred import of its implementation; everything else goes through
  :mod:`celery_scheduler.ports` (imports under ``TYPE_CHECKING`` are for mypy only);
- no module imports another module's private (``_``-prefixed) name;
- the modules' top-level imports have no cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("celery_scheduler", "django_app")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(
    tree: ast.AST, module: str, *, top_level_only: bool = False
) -> Iterator[tuple[ast.ImportFrom | ast.Import, str]]:
    """(node, imported module) for every import that runs (not under ``TYPE_CHECKING``)."""
    package = module if module.count(".") == 0 else module.rsplit(".", 1)[0]

    def walk(node: ast.AST, nested: bool) -> Iterator[tuple[ast.ImportFrom | ast.Import, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                yield from (x for stmt in child.orelse for x in walk_one(stmt, nested))
                continue
            yield from walk_one(child, nested)

    def walk_one(node: ast.AST, nested: bool) -> Iterator[tuple[ast.ImportFrom | ast.Import, str]]:
        if isinstance(node, ast.Import):
            if not (top_level_only and nested):
                yield from ((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if not (top_level_only and nested):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                yield node, base
        else:
            inner = nested or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from walk(node, inner)

    yield from walk(tree, False)


def parsed() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in sources().items()}


def test_the_core_is_pure() -> None:
    banned = ("django", "django_app", "celery", "kombu", "redis", "psycopg")
    found = [
        f"{name}: {target}"
        for name, tree in parsed().items()
        if name.startswith("celery_scheduler.core")
        for _, target in runtime_imports(tree, name)
        if target.split(".")[0] in banned
    ]
    assert found == []


def test_the_celery_side_reaches_django_app_only_through_the_ports() -> None:
    found = sorted(
        f"{name}: {target}"
        for name, tree in parsed().items()
        if name.startswith("celery_scheduler")
        for _, target in runtime_imports(tree, name)
        if target.split(".")[0] == "django_app"
    )
    assert found == ["celery_scheduler.api: django_app.api"]


def test_no_module_imports_another_modules_private_names() -> None:
    found = sorted(
        f"{name}: from {target} import {alias.name}"
        for name, tree in parsed().items()
        for node, target in runtime_imports(tree, name)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    )
    assert found == []


def test_top_level_imports_have_no_cycle() -> None:
    modules = parsed()
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        edges: set[str] = set()
        for statement, target in runtime_imports(tree, name, top_level_only=True):
            candidates = [target]
            if isinstance(statement, ast.ImportFrom):
                candidates += [f"{target}.{alias.name}" for alias in statement.names]
            edges.update(c for c in candidates if c in modules and c != name)
        graph[name] = edges
    cycles: list[str] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    # A package importing its own submodules is how packages re-export; not a cycle.
    cycles = [c for c in cycles if not _package_reexport(c)]
    assert cycles == []


def _package_reexport(cycle: str) -> bool:
    first, *_ = cycle.split(" -> ")
    return all(step.startswith(first) for step in cycle.split(" -> "))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_source_file_parses(package: str) -> None:
    assert any(name.startswith(package) for name in sources())


def test_metrics_are_emitted_through_the_observe_hooks() -> None:
    """One place per metric: the relays, materializers, worker and tenancy checks call
    ``django_app.operations.observe``; only the beat loop sets its own shard gauges."""
    emitters = {"inc", "observe", "observe_many", "set_gauge"}
    allowed = {"django_app.operations.observe", "celery_scheduler.metrics", "celery_scheduler.beat"}
    found = sorted(
        f"{name}:{node.lineno} metrics.{node.func.attr}"
        for name, tree in parsed().items()
        if name not in allowed
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in emitters
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "metrics"
    )
    assert found == []
