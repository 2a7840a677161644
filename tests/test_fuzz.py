"""Property-based fuzzing: real sample traces, mutated (fields dropped, types changed, events shuffled,
duplicated or deleted, text cut), are always answered with exit 0, 1 or 2, parsable JSON, and no traceback.
A trace whose events alone were mutated (the document whole, not cut) must still be analysed: one odd event
is coerced or skipped, never the end of the trace. Fixed seed (derandomize) and a bounded number of cases,
so CI is repeatable."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import orjson
from click.testing import CliRunner
from conftest import sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attntrace.cli import main

SOURCES = [json.loads(gzip.decompress(Path(sample(name)).read_bytes()))
           for name in ("bf16_causal_fwd/naive", "bf16_causal_fwd/sdpa_cudnn")]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args"]
ARG_FIELDS = ["External id", "correlation", "registers per thread", "shared memory", "grid", "block",
              "est. achieved occupancy %", "bytes", "Input Dims", "Input type", "blocks per SM"]
# Names that mean something to the model: step markers (nested, huge, odd), launches, copies, masks.
NAMES = ["ProfilerStep#1", "ProfilerStep#99999999999999999999", "ProfilerStep#-1", "ProfilerStep#", "bad\ud800name",
         "cudaLaunchKernel", "cudaStreamBeginCapture", "aten::copy_", "aten::masked_fill",
         "Memcpy DtoD (Device -> Device)", "Optimizer.step#AdamW.step", "warm-up", ""]
ODD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                       st.text(max_size=8), st.lists(st.integers(), max_size=3), st.just({}), st.just([[1, "x"]]),
                       st.just("bad\ud800name"), st.just([2**31, 2**40, 2**40]), st.just(1e308),
                       st.just("ProfilerStep#99999999999999999999"), st.just(5))

mutation = st.one_of(
    st.tuples(st.just("drop"), st.integers(0, 10**6), st.sampled_from(FIELDS)),
    st.tuples(st.just("retype"), st.integers(0, 10**6), st.sampled_from(FIELDS), ODD_VALUES),
    st.tuples(st.just("rename"), st.integers(0, 10**6), st.sampled_from(NAMES)),
    st.tuples(st.just("retype_arg"), st.integers(0, 10**6), st.sampled_from(ARG_FIELDS), ODD_VALUES),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("duplicate"), st.integers(0, 10**6)),
    st.tuples(st.just("replace"), st.integers(0, 10**6), ODD_VALUES),
    st.tuples(st.just("shuffle"), st.randoms(use_true_random=False)),
    st.tuples(st.just("meta"), st.sampled_from(["deviceProperties", "traceEvents", "record_shapes"]), ODD_VALUES),
)


def mutate(doc: dict, ops: list[tuple]) -> dict:
    doc = copy.deepcopy(doc)
    # st.just gives one object to every example: a value put into the trace is a copy, or a later mutation of its
    # event would change the strategy's value itself (it became a dict that holds itself).
    ops = [tuple(copy.deepcopy(part) if isinstance(part, dict | list) else part for part in op) for op in ops]
    events = doc["traceEvents"]
    for op in ops:
        kind = op[0]
        if kind == "shuffle":
            op[1].shuffle(events)
        elif kind == "meta":
            doc[op[1]] = op[2]
            events = doc["traceEvents"] if isinstance(doc["traceEvents"], list) else []
        elif not events:
            continue
        elif kind == "drop" and isinstance(events[op[1] % len(events)], dict):
            events[op[1] % len(events)].pop(op[2], None)
        elif kind == "rename" and isinstance(events[op[1] % len(events)], dict):
            events[op[1] % len(events)]["name"] = op[2]
        elif kind == "retype" and isinstance(events[op[1] % len(events)], dict):
            events[op[1] % len(events)][op[2]] = op[3]
        elif kind == "retype_arg" and isinstance(events[op[1] % len(events)], dict):
            args = events[op[1] % len(events)].get("args")
            if isinstance(args, dict):
                args[op[2]] = op[3]
        elif kind == "delete":
            del events[op[1] % len(events)]
        elif kind == "duplicate":
            events.append(copy.deepcopy(events[op[1] % len(events)]))
        elif kind == "replace":
            events[op[1] % len(events)] = op[2]
    return doc


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(source=st.sampled_from(range(len(SOURCES))), ops=st.lists(mutation, max_size=12),
       cut=st.one_of(st.none(), st.floats(0.0, 1.0)), gz=st.booleans())
def test_mutated_traces_never_crash(tmp_path_factory, source, ops, cut, gz):
    data = json.dumps(mutate(SOURCES[source], ops)).encode()  # json, not orjson: big ints must survive
    if cut is not None:
        data = data[: int(len(data) * cut)]
    path = tmp_path_factory.mktemp("fuzz") / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    result = CliRunner().invoke(main, ["lint", str(path), "--format", "json", "--jobs", "1"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2)
    report = orjson.loads(result.stdout)
    assert report["summary"]["traces"] == 1
    if result.exit_code == 2:
        assert result.stderr.count("\n") == 1
    if cut is None and not any(op[0] == "meta" for op in ops):
        assert result.exit_code in (0, 1), result.stderr
        assert report["traces"][0]["error"] is None
