"""The benchmark's broker-side clock: drain Celery's Redis queue and timestamp each message.

``python -m bench.drain <redis url> <expected> <deadline epoch> <out.json> [queue ...]``

BRPOP wakes on the first message; every list is then emptied atomically (LRANGE + DEL in
one Lua call) and the whole batch gets the wall time of that moment, so a message's
timestamp is at most one drain round trip after Redis accepted it. Task ids come from the
protocol-2 ``headers.id`` (a byte search, not a JSON parse, to keep up at 100k msg/s).
Stops when ``expected`` distinct task ids arrived or at the deadline.
"""

from __future__ import annotations

import json
import sys
import time

import redis

DRAIN = """
local out = {}
for _, key in ipairs(KEYS) do
  local items = redis.call('LRANGE', key, 0, -1)
  if #items > 0 then
    redis.call('DEL', key)
    for i = #items, 1, -1 do out[#out + 1] = items[i] end
  end
end
return out
"""
ID_MARK = b'"id": "'


def task_id(raw: bytes) -> str:
    at = raw.find(ID_MARK)
    return raw[at + len(ID_MARK) : raw.index(b'"', at + len(ID_MARK))].decode()


def main(argv: list[str]) -> None:
    url, expected, deadline, out = argv[0], int(argv[1]), float(argv[2]), argv[3]
    queues = argv[4:] or ["celery"]
    client = redis.Redis.from_url(url)
    drain = client.register_script(DRAIN)
    arrivals: dict[str, float] = {}
    deliveries = 0
    while len(arrivals) < expected and time.time() < deadline:
        first = client.brpop(queues, timeout=0.5)
        if first is None:
            continue
        batch = [first[1], *drain(keys=queues)]
        now = time.time()
        deliveries += len(batch)
        for raw in batch:
            arrivals.setdefault(task_id(raw), now)
    with open(out, "w") as fh:
        json.dump({"arrivals": arrivals, "deliveries": deliveries}, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
