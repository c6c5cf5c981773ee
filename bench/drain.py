"""The benchmark's broker-side clock: drain Celery's Redis queue and timestamp each message.

``python -m bench.drain <redis url> <expected> <deadline epoch> <out.json> [queue ...]``

BRPOP wakes on the first message (timestamped at once); the lists are then emptied oldest
first in slices of ``SLICE`` messages (LRANGE + LTRIM of the list's tail in one Lua call),
each slice getting the wall time its call returned, so a message's timestamp is at most
one small round trip after Redis accepted it (a whole-list drain of a 10,000-message burst
took ~0.2 s, which the first messages' lag then carried). Task ids come from the
protocol-2 ``headers.id`` (a byte search, not a JSON parse, to keep up at 100k msg/s).
Stops when ``expected`` distinct task ids arrived or at the deadline.
"""

from __future__ import annotations

import json
import sys
import time

import redis

SLICE = 1000
DRAIN = """
local out = {}
local room = tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  if room <= 0 then break end
  local items = redis.call('LRANGE', key, -room, -1)
  if #items > 0 then
    redis.call('LTRIM', key, 0, -#items - 1)
    for i = #items, 1, -1 do out[#out + 1] = items[i] end
    room = room - #items
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
        batch: list[bytes] = [first[1]]  # type: ignore[list-item]  # bytes: no decoding
        now = time.time()
        while batch:
            deliveries += len(batch)
            for raw in batch:
                arrivals.setdefault(task_id(raw), now)
            batch = drain(keys=queues, args=[SLICE])
            now = time.time()
    with open(out, "w") as fh:
        json.dump({"arrivals": arrivals, "deliveries": deliveries}, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
