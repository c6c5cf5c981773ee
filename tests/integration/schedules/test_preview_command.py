"""``preview_schedule``: in-process through call_command and as a real ``manage.py`` process."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

ROOT = Path(__file__).resolve().parents[3]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("preview_schedule", *args, stdout=out)
    return out.getvalue()


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings"}
    return subprocess.run(
        [sys.executable, "manage.py", "preview_schedule", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_table_marks_the_spring_forward_run() -> None:
    out = run("30 2 * * *", "--tz", "Europe/Berlin", "--start", "2026-03-27T00:00Z", "--count", "4")
    lines = out.splitlines()
    assert lines[0] == "30 2 * * *  (At 02:30)  in Europe/Berlin"
    runs = [line for line in lines if line[:4].strip().isdigit()]
    assert len(runs) == 4
    assert "2026-03-27 01:30Z" in runs[0]
    assert "2026-03-27 02:30 CET (UTC+0100)" in runs[0]
    assert "2026-03-29" not in out  # the day 02:30 does not exist
    assert "2026-03-30 00:30Z" in runs[2]
    assert "2026-03-30 02:30 CEST (UTC+0200)" in runs[2]
    assert "* DST change: clocks move forward 1:00 (02:00 -> 03:00) before this run" in runs[2]
    assert "*" not in runs[3]


def test_json_output_and_naive_start_is_local() -> None:
    out = run(
        "0 * * * *",
        "--tz",
        "Europe/Berlin",
        "--start",
        "2026-10-25T01:30",
        "--count",
        "3",
        "--json",
    )
    payload = json.loads(out)
    assert payload["timezone"] == "Europe/Berlin"
    assert payload["description"] == "Every hour"
    assert payload["start"] == "2026-10-25T01:30:00+02:00"
    assert [r["utc"] for r in payload["runs"]] == [
        "2026-10-25T00:00:00+00:00",
        "2026-10-25T02:00:00+00:00",
        "2026-10-25T03:00:00+00:00",
    ]
    assert [r["local"][11:] for r in payload["runs"]] == [
        "02:00:00+02:00",
        "03:00:00+01:00",
        "04:00:00+01:00",
    ]
    assert "repeated wall time 02:00 runs once" in payload["runs"][0]["note"]
    assert payload["runs"][1]["note"].startswith("DST change: clocks move back 1:00")
    assert payload["runs"][2]["note"] == ""


def test_a_naive_start_the_clocks_skip_lists_the_runs_after_it() -> None:
    """02:30 on 29 March does not exist in Berlin: the runs after it are those from the
    gap's end (03:00 CEST) on. Read with the offset before the change, it was 03:30 CEST,
    and the 03:00 run was left out."""
    out = run("0,45 3 * * *", "--tz", "Europe/Berlin", "--start", "2026-03-29T02:30",
              "--count", "2", "--json")  # fmt: skip
    payload = json.loads(out)
    assert payload["start"] == "2026-03-29T03:00:00+02:00"
    assert [r["local"] for r in payload["runs"]] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T03:45:00+02:00",
    ]
    # An existing wall time keeps "strictly after".
    payload = json.loads(run("0 3 * * *", "--tz", "Europe/Berlin", "--start",
                             "2026-03-29T03:00", "--count", "1", "--json"))  # fmt: skip
    assert payload["runs"][0]["local"] == "2026-03-30T03:00:00+02:00"


def test_default_start_is_now_and_default_count_is_ten() -> None:
    payload = json.loads(run("@hourly", "--json"))
    assert len(payload["runs"]) == 10
    assert payload["timezone"] == "UTC"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0 0 * * * *"], "expected five"),
        (["61 * * * *"], "Invalid minute field '61'"),
        (["0 0 30 2 *"], "never fires"),
        (["@reboot"], "@reboot"),
        (["0 0 * * *", "--tz", "Europe/Berln"], "Use an IANA name such as 'Europe/Berlin'"),
        (["0 0 * * *", "--start", "yesterday"], "Invalid --start 'yesterday'"),
        (["0 0 * * *", "--count", "0"], "count must be an integer from 1 to 1000"),
        (["0 0 * * *", "--count", "1001"], "count must be an integer from 1 to 1000"),
    ],
)
def test_errors_raise_command_error(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_subprocess_success() -> None:
    result = manage(
        "0 9 * * *", "--tz", "America/New_York", "--start", "2026-03-07T00:00-05:00", "--count", "3"
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "2026-03-07 14:00Z" in result.stdout
    assert "2026-03-08 13:00Z" in result.stdout  # 09:00 local both before and after the change
    assert "2026-03-08 09:00 EDT (UTC-0400)" in result.stdout
    assert "clocks move forward 1:00 (02:00 -> 03:00)" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["0 0 31 4 *"], 1, "never fires"),
        (["0 0 * * *", "--tz", "Mars/Olympus"], 1, "Unknown time zone 'Mars/Olympus'"),
        (["0 0 * * *", "--start", "2026-13-01"], 1, "Invalid --start"),
        (["0 0 * * *", "--count", "many"], 2, "invalid int value: 'many'"),
    ],
)
def test_subprocess_errors_exit_non_zero_with_message(
    args: list[str], code: int, message: str
) -> None:
    result = manage(*args)
    assert result.returncode == code
    assert message in result.stderr
    assert result.stdout == ""
