"""The README's first command, end to end: the demo on the embedded default.

SQLite and kombu's SQLite-backed broker, real beat and worker processes, no servers. The demo
itself judges the run (strict and one-off runs fired and reached the broker on time, the
invoice job run twice by hand created exactly one invoice) and exits non-zero otherwise; this
test runs it as a user would and checks its verdict lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance import support
from tests.acceptance.support import ROOT

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]


@support.embedded_pass_only
def test_demo_on_the_embedded_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_"))}
    done = subprocess.run(
        [sys.executable, "-m", "example_project.demo", "--seconds", "30",
         "--data-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    output = done.stdout + done.stderr
    print(output)  # the figures, in the test log
    assert done.returncode == 0, output
    assert "ok   exactly one invoice (1)" in output
    assert "ok   all of them on time" in output
    fired = [
        line for line in output.splitlines() if "strict every 5 s" in line and "SUCCEEDED" in line
    ]
    assert len(fired) >= 4, output
    # The two invoice runs by hand say so (else they read as the daily 06:00 run, early).
    by_hand = [line for line in output.splitlines() if "daily invoice acme (run now)" in line]
    assert len(by_hand) >= 2, output
