"""Print the slowest tests across the JUnit XML reports of one ``scripts/test`` run.

One list for the whole run, so the tests that cost CI its time are visible in one place
(pytest's own ``--durations`` lists each pass separately).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def slowest(reports: list[Path], count: int = 20) -> list[tuple[float, str, str]]:
    """The ``count`` slowest test cases as (seconds, pass name, test id), slowest first."""
    cases: list[tuple[float, str, str]] = []
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0), report.stem, test_id))
    return sorted(cases, reverse=True)[:count]


def main(argv: list[str]) -> int:
    for seconds, pass_name, test_id in slowest([Path(arg) for arg in argv if Path(arg).exists()]):
        print(f"{seconds:8.1f}s  {pass_name:<9} {test_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
