"""Fail on a link of the built site that points at a missing file or anchor.

Sphinx (with ``-n -W``) already fails on a broken cross-reference between pages; this reads
what was really written: every ``href`` and ``src`` of every HTML page under the output
folder, resolved like a browser would, must name a file of the site and, with ``#anchor``,
an ``id`` in that file. External links (``https:``, ``mailto:``...) are not fetched.

Usage: ``python docs/_ext/check_links.py docs/_build/html``; exit status 1 on a broken link.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in {"id", "name"}:
                self.ids.add(value)
            elif name in {"href", "src"} and not (tag == "link" and "://" in value):
                self.links.append(value)


def _parse(path: Path, cache: dict[Path, _Page]) -> _Page:
    if path not in cache:
        page = _Page()
        page.feed(path.read_text(errors="replace"))
        cache[path] = page
    return cache[path]


def broken_links(root: Path) -> list[str]:
    """Each broken link as ``page: link (reason)``."""
    cache: dict[Path, _Page] = {}
    problems = []
    for html in sorted(root.rglob("*.html")):
        for link in _parse(html, cache).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("data:"):
                continue  # external, not checked here
            target = (html.parent / unquote(parts.path)).resolve() if parts.path else html
            if target.is_dir():
                target = target / "index.html"
            where = f"{html.relative_to(root)}: {link}"
            if not target.is_file():
                problems.append(f"{where} (no file {target.relative_to(root.resolve())})")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in _parse(target, cache).ids:
                problems.append(f"{where} (no id {fragment!r} in {target.name})")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    problems = broken_links(root)
    for problem in problems:
        print(f"broken link: {problem}", file=sys.stderr)
    pages = sum(1 for _ in root.rglob("*.html"))
    print(f"checked the links of {pages} pages: {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
