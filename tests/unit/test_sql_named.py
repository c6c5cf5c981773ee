"""Every raw SQL statement is named in its package's ``queries.py`` (docs/ARCHITECTURE.md).

Checked on the source, outside the ``queries`` modules and the migrations:

- no string literal (or f-string) that starts a statement: ``SELECT ... FROM``, ``SELECT 1``,
  ``UPDATE t SET``, ``INSERT INTO``, ``DELETE FROM``, ``WITH name AS (``, in any case
  (docstrings and English sentences such as "Update a schedule" aside);
- no ``.execute(...)``, ``.executemany(...)`` or ``.raw(...)`` whose statement is an f-string.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("celery_scheduler", "django_app")
STATEMENT = re.compile(
    r"\s*(select\s.*\bfrom\b|select\s+\w+\s*(\(|$)|update\s+\S+\s+(\S+\s+){0,2}set\s"
    r"|insert\s+(ignore\s+)?into\s|delete\s+from\s|with\s+(recursive\s+)?\w+(\s*\(.*?\))?\s+as\s)",
    re.IGNORECASE | re.DOTALL,
)
EXECUTE = {"execute", "executemany", "raw"}


def checked() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts and path.name != "queries.py"
    ]


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (module, class and function docstrings)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    where = path.relative_to(ROOT)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                str(part.value) if isinstance(part, ast.Constant) else "x" for part in node.values
            )
            if STATEMENT.match(text):
                found.append(f"{where}:{node.lineno}: statement literal (f-string)")
            for part in node.values:
                skip.add(id(part))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in skip and STATEMENT.match(node.value):
                found.append(f"{where}:{node.lineno}: statement literal")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in EXECUTE
            and node.args
            and isinstance(node.args[0], ast.JoinedStr)
        ):
            found.append(f"{where}:{node.lineno}: .{node.func.attr}() of an f-string")
    return found


def test_statements_live_in_queries_modules() -> None:
    found = [offence for path in checked() for offence in offences(path)]
    assert found == [], f"{len(found)} raw statements outside queries.py:\n" + "\n".join(found)
