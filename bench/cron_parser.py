"""Cron planning cost: our parser against croniter, per schedule, on the same expressions.

    python -m bench.cron_parser [--count 5000] [--seed 7]

For each of ``count`` random five-field expressions (ranges, steps, lists, names), time
(a) parsing plus the first next fire time and (b) the next fire time alone on an already
parsed trigger, for ``CronTrigger`` and for ``croniter``. The figures go in bench/README.md.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

from croniter import croniter

from celery_scheduler.core.timemath import CronTrigger

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
FIELDS = ((0, 59), (0, 23), (1, 28), (1, 12), (0, 6))


def random_field(rng: random.Random, low: int, high: int) -> str:
    shape = rng.randrange(5)
    if shape == 0:
        return "*"
    if shape == 1:
        return f"*/{rng.randint(2, max(2, (high - low) // 2))}"
    a = rng.randint(low, high)
    if shape == 2:
        return str(a)
    b = rng.randint(a, high)
    if shape == 3:
        return f"{a}-{b}"
    return ",".join(str(v) for v in sorted(rng.sample(range(low, high + 1), 3)))


def expressions(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(random_field(rng, lo, hi) for lo, hi in FIELDS) for _ in range(count)]


def timed(label: str, run: Callable[[], None], count: int) -> float:
    begin = time.perf_counter()
    run()
    per_call = (time.perf_counter() - begin) / count * 1e6
    print(f"{label:44} {per_call:8.1f} µs/schedule")
    return per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    options = parser.parse_args()
    exprs = expressions(options.count, options.seed)
    n = len(exprs)

    def ours_parse_next() -> None:
        for e in exprs:
            CronTrigger(expression=e, timezone="UTC").next_after(START)

    def theirs_parse_next() -> None:
        for e in exprs:
            croniter(e, START).get_next(datetime)

    ours = [CronTrigger(expression=e, timezone="UTC") for e in exprs]
    theirs = [croniter(e, START) for e in exprs]

    def ours_next() -> None:
        for t in ours:
            t.next_after(START)

    def theirs_next() -> None:
        for it in theirs:
            it.set_current(START)
            it.get_next(datetime)

    print(f"{n} random expressions, seed {options.seed}")
    a = timed("ours: parse + next fire time", ours_parse_next, n)
    b = timed("croniter: parse + next fire time", theirs_parse_next, n)
    c = timed("ours: next fire time (parsed)", ours_next, n)
    d = timed("croniter: next fire time (parsed)", theirs_next, n)
    print(f"speed-up: parse+next x{b / a:.1f}, next alone x{d / c:.1f}")


if __name__ == "__main__":
    main()
