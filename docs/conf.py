"""Sphinx configuration of the documentation site (built by ``bash scripts/docs``).

Sphinx with MyST: pages are Markdown (as the README and SPEC already were), while Sphinx
brings what a Markdown-only generator lacks here: autodoc reads the Python API from its
docstrings, and small directives of our own (docs/_ext/scheduler_reference.py) render the
settings, the management commands, the HTTP API and the metrics from the code itself, so
the reference cannot drift from it. See docs/about.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]

# The reference directives import the package: Django is set up on the example project's
# settings, with a throwaway data dir so a build never touches a demo's database. Nothing is
# read from or written to a database.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
os.environ.setdefault("CELERY_SCHEDULER_DATA_DIR", tempfile.mkdtemp(prefix="cs-docs-"))
os.environ.pop("DATABASE_URL", None)

import django  # noqa: E402  (after the environment above)

django.setup()

project = "celery-scheduler"
author = "celery-scheduler developers"
copyright = "celery-scheduler developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "scheduler_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", ".venv"]

# "#section" links and "page.md#section" links resolve to headings (checked: -n -W).
myst_heading_anchors = 4
myst_enable_extensions = ["deflist"]

html_theme = "furo"
html_title = "celery-scheduler"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# -n checks every link between pages and every heading anchor. Python object references in
# signatures and docstrings (datetime, Django's and Celery's classes, the docstrings' short
# ``errors.X`` names) are not checked: there is no network for intersphinx at build time, and
# a docstring's short name is for the reader of the source.
nitpick_ignore_regex = [(r"py:.*", r".*")]
