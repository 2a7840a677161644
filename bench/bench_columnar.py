"""Issue 26's lever, measured: decoding a trace's events into columns natively (polars' NDJSON reader over the
event spans) against what the read layer does today (msgspec into one struct per event), beside a bare
`orjson.loads` of the same bytes. In-process, best of N, on one trace:

    python bench/bench_columnar.py TRACE [--repeats 3]

Stages timed:
- orjson: `orjson.loads` of the whole document (the yardstick of the issue);
- msgspec structs: today's decode of the event list into typed structs (attntrace.read.decoding);
- spans: finding each event's span and joining them as NDJSON (one regex substitution of the gaps between
  events, newlines inside an event turned into spaces);
- polars ndjson: `pl.read_ndjson` of those lines with an explicit schema of the columns the model reads.
"""

from __future__ import annotations

import argparse
import gzip
import io
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import polars as pl

# The read layer's own decoder of an event list and its pattern for the list's key: what is measured is today's.
from attntrace.read.decoding import _EVENTS as EVENTS
from attntrace.read.decoding import _EVENTS_KEY

_GAP = re.compile(rb"\}\s*,\s*\{")
ARGS = pl.Struct({"External id": pl.Int64, "correlation": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
                  "grid": pl.List(pl.Int64), "block": pl.List(pl.Int64), "registers per thread": pl.Int64,
                  "shared memory": pl.Int64, "est. achieved occupancy %": pl.Float64, "bytes": pl.Int64,
                  "Input Dims": pl.String, "Input type": pl.String, "Concrete Inputs": pl.String})
SCHEMA = {"ph": pl.String, "cat": pl.String, "name": pl.String, "pid": pl.String, "tid": pl.String,
          "ts": pl.Float64, "dur": pl.Float64, "id": pl.String, "args": ARGS}


def best(repeats: int, work: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        begin = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - begin)
    return min(times), result


def event_list(data: bytes) -> bytes:
    """The bytes of the traceEvents list, "[" to "]" (a document whose list is its last field, as Kineto writes)."""
    key = _EVENTS_KEY.search(data)
    if key is None:
        return data
    begin = key.end() - 1
    end = data.rfind(b"]", begin, data.rfind(b'"traceName"') if b'"traceName"' in data else len(data))
    return data[begin:end + 1]


def as_ndjson(events: bytes) -> bytes:
    body = events[1:events.rfind(b"}") + 1].strip()
    return _GAP.sub(b"}\n{", body.replace(b"\n", b" ").replace(b"\r", b" "))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = Path(args.trace).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    mb = len(data) / 1e6
    events = event_list(data)
    rows: list[tuple[str, float]] = []
    seconds, _ = best(args.repeats, lambda: orjson.loads(data))
    rows.append(("orjson.loads (whole document)", seconds))
    seconds, decoded = best(args.repeats, lambda: EVENTS.decode(events))
    rows.append((f"msgspec structs ({len(decoded)} events)", seconds))
    seconds, lines = best(args.repeats, lambda: as_ndjson(events))
    rows.append(("spans as NDJSON", seconds))
    # Text-typed ids: a pid is a number in most traces and a string ("Spans") in some; columns of strings take both.
    seconds, frame = best(args.repeats, lambda: pl.read_ndjson(io.BytesIO(lines), schema=SCHEMA,
                                                              ignore_errors=True))
    rows.append((f"polars read_ndjson ({frame.height} rows)", seconds))
    print(f"{args.trace}: {mb:.1f} MB")
    for name, took in rows:
        print(f"  {name:45s} {took:7.3f} s  {mb / took:7.1f} MB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
