"""The layering the tree promises (docs/ARCHITECTURE.md), checked on the source.

- ``celery_scheduler.core`` is pure: no Django, Celery, kombu or ``django_app`` import;
- the Celery side (``celery_scheduler``) reaches ``django_app`` at run time in one place,
  the public API's deferred import of its implementation; everything else goes through
  :mod:`celery_scheduler.ports` (imports under ``TYPE_CHECKING`` are for mypy only);
- no module imports another module's private (``_``-prefixed) name;
- no import cycle, counting imports inside functions (models <-> querysets, Django's
  custom-manager pattern, is the one kept);
- every module sits in one entry of the declared ORDER and imports only its own entry
  and the ones below;
- an import inside a function says why on its line or the line above (DEFERRED_REASONS).
"""

from __future__ import annotations

import ast
import re
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


# The declared order, lowest first (docs/ARCHITECTURE.md, "Layers", says the same). A
# module belongs to the longest entry that prefixes its name; it may import its own entry
# and the entries below it, never one above.
ORDER: tuple[tuple[str, ...], ...] = (
    ("celery_scheduler.errors",),
    ("celery_scheduler.core",),
    (
        "celery_scheduler",
        "celery_scheduler.faults",
        "celery_scheduler.metrics",
        "celery_scheduler.stopping",
        "celery_scheduler.api_types",
        "celery_scheduler.publishers",
        "celery_scheduler.ports",
        "celery_scheduler.tasks",
        "celery_scheduler.beat",
    ),
    ("django_app", "django_app.conf", "django_app.compat"),
    ("django_app.models", "django_app.querysets"),
    ("django_app.db", "django_app.sqlite3"),
    ("django_app.observe",),
    ("django_app.tenancy",),
    ("django_app.cluster",),
    ("django_app.materialize",),
    ("django_app.relay",),
    ("django_app.schedules",),
    ("django_app.worker",),
    ("django_app.tasks",),
    ("django_app.operations",),
    ("django_app.wiring",),
    ("django_app.tenants", "django_app.api"),
    ("celery_scheduler.api",),
    ("django_app.admin", "django_app.http", "django_app.management", "django_app.templatetags"),
    ("django_app.apps",),
)

# The one cycle kept: the models name their managers, the managers' transition() names
# the Occurrence model (Django's own pattern for custom managers).
ALLOWED_CYCLES = [["django_app.models", "django_app.querysets"]]

# Why an import may run inside a function: written on its line or in a comment of the block
# of imports above it as "# deferred (<reason>): ...", the reason one of these.
DEFERRED_REASONS = {
    "facade": "celery_scheduler.api reaches its implementation on its first call",
    "app registry": "Django models and the admin load only once the apps are ready",
    "optional dependency": "an extra the install may not have (redis, amqp)",
    "import-light": "celery_scheduler imports without Django (and its decorator without Celery)",
    "manager": "the models <-> querysets pair: a manager names the model it manages",
}
DEFERRED = re.compile(r"#\s*deferred \((?P<reason>[^)]*)\)")


def layer_of(module: str) -> int:
    best, level = "", -1
    for index, entries in enumerate(ORDER):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > len(best):
                best, level = entry, index
    return level


def import_graph(*, top_level_only: bool = False) -> dict[str, dict[str, int]]:
    """module -> {imported module of the tree: line of the import}, imports in functions too."""
    modules = parsed()
    graph: dict[str, dict[str, int]] = {}
    for name, tree in modules.items():
        edges: dict[str, int] = {}
        for statement, target in runtime_imports(tree, name, top_level_only=top_level_only):
            # "from package import module" is an import of the module (a package's
            # __init__ here holds a docstring or lazy names, never the module's code).
            candidates = [target]
            if isinstance(statement, ast.ImportFrom):
                candidates = [
                    f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                    for alias in statement.names
                ]
            for c in candidates:
                if c in modules and c != name:
                    edges.setdefault(c, statement.lineno)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    graph = import_graph()
    cycles = [
        " <-> ".join(c)
        + "  ["
        + "; ".join(f"{a}:{graph[a][b]} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        + "]"
        for c in strongly_connected(graph)
        if c not in ALLOWED_CYCLES
    ]
    assert cycles == []


def test_every_module_has_a_declared_layer() -> None:
    assert [name for name in sources() if layer_of(name) < 0] == []


def test_imports_point_down_the_declared_order() -> None:
    graph = import_graph()
    upward = sorted(
        f"{name}:{line} -> {target} ({ORDER[layer_of(name)][0]} below {ORDER[layer_of(target)][0]})"
        for name, edges in graph.items()
        for target, line in edges.items()
        if layer_of(target) > layer_of(name)
    )
    assert upward == []


def test_imports_inside_functions_say_why() -> None:
    """An import inside a function hides an order problem unless its reason is one of
    DEFERRED_REASONS, written on the import's line or in a comment of the imports above it."""
    missing: list[str] = []
    wrong: list[str] = []
    for name, path in sources().items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        top = {id(node) for node, _ in runtime_imports(tree, name, top_level_only=True)}
        for node, target in runtime_imports(tree, name):
            if id(node) in top:
                continue
            # Its own line, the line above, or a comment above it in the same block of imports.
            first = node.lineno - 2
            while first > 0 and _import_block(lines[first - 1]):
                first -= 1
            near = " ".join(lines[first : node.end_lineno or node.lineno])
            match = DEFERRED.search(near)
            if match is None:
                missing.append(f"{name}:{node.lineno} {target}")
            elif match["reason"] not in DEFERRED_REASONS:
                wrong.append(f"{name}:{node.lineno} {match['reason']}")
    assert (sorted(set(missing)), wrong) == ([], [])


def _import_block(line: str) -> bool:
    return not line.strip() or line.strip().startswith(("#", "from ", "import "))


def test_top_level_imports_have_no_cycle() -> None:
    assert strongly_connected(import_graph(top_level_only=True)) in ([], ALLOWED_CYCLES)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_source_file_parses(package: str) -> None:
    assert any(name.startswith(package) for name in sources())


def test_metrics_are_emitted_through_the_observe_hooks() -> None:
    """One place per metric: the relays, materializers, worker and tenancy checks call
    ``django_app.observe``; only the beat loop sets its own shard gauges."""
    emitters = {"inc", "observe", "observe_many", "set_gauge"}
    allowed = {"django_app.observe", "celery_scheduler.metrics", "celery_scheduler.beat"}
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
