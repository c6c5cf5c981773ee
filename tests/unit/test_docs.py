"""The README stays a visitor's page, and the docs' link check catches what it promises.

The site itself is built (warnings as errors) by ``bash scripts/docs``; these run with the
unit tests and need no Sphinx.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
QUICK_START = ROOT / "docs" / "tutorial" / "quickstart.md"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def check_links_module() -> ModuleType:
    path = ROOT / "docs" / "_ext" / "check_links.py"
    spec = importlib.util.spec_from_file_location("check_links", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_every_relative_link_of_the_readme_names_a_file_of_the_repository() -> None:
    missing = [
        target
        for target, _anchor in LINK.findall(README.read_text())
        if "://" not in target and not (ROOT / target).exists()
    ]
    assert missing == []


def test_the_readme_keeps_both_commands_for_a_fresh_machine() -> None:
    text = README.read_text()
    demo = ".venv/bin/pip install -e '.[demo]' && .venv/bin/celery-scheduler-demo"
    assert demo in text
    assert "\nbash scripts/test\n" in text


def test_the_readme_quick_start_is_the_tested_quick_start_shortened() -> None:
    """Each line of the README's quick start is a line of the page the install test follows."""
    readme = README.read_text()
    section = readme[readme.index("## Quick start") :].split("\n## ", 1)[0]
    full = {line.strip() for line in QUICK_START.read_text().splitlines()}
    lines = [
        line.strip()
        for block in FENCE.findall(section)
        for line in block.splitlines()
        if line.strip()
    ]
    assert lines, "the README's quick start shows no code"
    assert [line for line in lines if line not in full] == []


def test_the_link_check_reports_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    check_links = check_links_module()
    (tmp_path / "a.html").write_text(
        '<a href="b.html#here">ok</a> <a href="b.html#gone">x</a> <a href="c.html">y</a>'
        ' <a href="https://example.org/nowhere">external</a> <a href="#top">self</a>'
        '<h1 id="top">A</h1>'
    )
    (tmp_path / "b.html").write_text('<section id="here"></section>')
    problems = check_links.broken_links(tmp_path)
    assert problems == [
        "a.html: b.html#gone (no id 'gone' in b.html)",
        "a.html: c.html (no file c.html)",
    ]
    assert check_links.main(["check_links", str(tmp_path)]) == 1
    (tmp_path / "a.html").write_text('<a href="b.html#here">ok</a>')
    assert check_links.main(["check_links", str(tmp_path)]) == 0
