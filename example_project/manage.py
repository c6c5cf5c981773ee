#!/usr/bin/env python
"""``python example_project/manage.py``: the same as the top-level ``manage.py``.

Python puts this script's folder first on ``sys.path``, where ``example_project/celery.py``
would shadow the ``celery`` package; the project root goes there instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(here.parent), *(p for p in sys.path if Path(p or ".").resolve() != here)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
