"""Nsight Systems SQLite exports (read/nsys.py): the corpus's real exports, exports made here in the real schema
(nsys_build.py), and the files that are not exports or cannot be read."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import DATA
from nsys_build import ELEMENTWISE, FP32_GEMM, TF32_GEMM, Export, Kernel

from attntrace.cli import main
from attntrace.model.loading import load

NSYS = DATA / "nsys"
EXPORTS = sorted(NSYS.glob("*.sqlite"))
TWO_H100 = NSYS / "h100_2gpu_1s.sqlite"


def invoke(*args: str, input: bytes | None = None):
    result = CliRunner().invoke(main, list(args), input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def lint_json(*args: str) -> dict:
    result = invoke("lint", *args, "--format", "json", "--fail-on", "never")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _kernels(gemm: str, registers: int, steps: int = 30) -> list[Kernel]:
    """A GEMM and an elementwise kernel, one after the other, `steps` times."""
    out, t = [], 100.0
    for _ in range(steps):
        out.append(Kernel(gemm, t, 300.0, registers=64, block=128, grid=264))
        out.append(Kernel(ELEMENTWISE, t + 310.0, 200.0, registers=registers, block=256, grid=4096))
        t += 520.0
    return out


@pytest.mark.parametrize("export", EXPORTS, ids=lambda p: p.name)
def test_corpus_exports_are_linted_and_summarised(export: Path) -> None:
    report = lint_json(str(export))
    assert report["summary"]["errors"] == 0
    assert report["traces"][0]["error"] is None
    assert report["traces"][0]["events"] > 0
    summary = invoke("summary", str(export))
    assert summary.exit_code == 0 and "Traceback" not in summary.output
    assert "read from an Nsight Systems export (schema 3.2" in " ".join(summary.output.split())  # lines folded


def test_two_h100_export_has_its_ops_kernels_and_links() -> None:
    trace = load(str(TWO_H100))
    assert trace.devices == [0, 1]
    assert trace.gpu.group_by("kind").len().sort("kind").rows() == [("kernel", 3442), ("memcpy", 904),
                                                                    ("memset", 22)]
    assert set(trace.launches.filter("is_launch")["name"].unique()) == {"cudaLaunchKernel", "cudaLaunchKernelExC"}
    # emit_nvtx's "aten::mm, op_id = 314307" is the op aten::mm, on the thread that launched the kernels.
    assert trace.ops.filter(trace.ops["name"] == "aten::mm").height == 280
    assert trace.gpu_linked["op"].is_not_null().sum() > 2000
    # CUPTI's overhead rows here are CUDA's, not the profiler's: launches that waited for a full command buffer.
    assert "CUDA: 198 command buffer full (launches waited for the GPU's queue) range(s), 911.970 ms of CPU" in (
        trace.meta.notes)
    names = trace.gpu["name"].to_list()
    assert "Memcpy HtoD (Pinned -> Device)" in names and "Memcpy DtoD (Device -> Device)" in names


def test_each_gpu_event_of_two_processes_links_to_its_own_process() -> None:
    # CUPTI counts correlation ids per process: the two ranks' ids overlap (1477488-1479690), and 16 of device 1's
    # events were linked to rank 0's calls (a cudaEventDestroy, a cudaStreamWaitEvent) up to 0.9 s after them.
    linked = load(str(TWO_H100)).gpu_linked.filter(pl.col("launch").is_not_null())
    assert linked.height > 2000
    assert sorted(linked.select("device", "launch_pid").unique().rows()) == [(0, "111"), (1, "112")]
    assert (linked["ts"] >= linked["launch_ts"]).all()
    assert set(linked["launch_api"].unique()) <= {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync",
                                                  "cudaMemsetAsync"}


def test_two_h100_export_fp32_gemms_are_found_with_their_op_chains() -> None:
    # The window is mostly weights copied to the GPUs (920 ms of host copies a second per GPU): the FP32 GEMMs
    # are 4% of its busy time but 87% of its kernels' time, and the rule judges them against the kernels.
    report = lint_json(str(TWO_H100), "--select", "AT201")
    (finding,) = report["findings"]
    assert finding["evidence"]["gemms_per_step"] == 640
    assert 0.8 < finding["evidence"]["share_of_compute"] < 0.95  # of both GPUs' kernels, not 173% of one's
    # The headline chain is a linked one: the GEMMs launched before the window began have none.
    assert finding["where"]["op_chain"] == "aten::linear > aten::matmul > aten::mm"
    assert "aten::einsum > aten::bmm" in finding["evidence"]["op_chains"]
    assert finding["evidence"]["op_chains"][-1] == "(no CPU op linked)"
    assert all("_ffma_" in k for k in finding["evidence"]["kernels"])


def test_a_copy_bound_window_below_the_fp32_share_stays_silent() -> None:
    report = lint_json(str(TWO_H100), "--select", "AT201", "--set", "AT201.min_share=0.9")
    assert report["findings"] == []


def test_kernel_only_rules_fire_on_an_export_without_nvtx(tmp_path: Path) -> None:
    export = Export(kernels=_kernels(FP32_GEMM, registers=255)).write(tmp_path / "fire.sqlite")
    report = lint_json(str(export))
    rules = sorted(f["rule"] for f in report["findings"])
    assert rules == ["AT201", "AT401"]
    occupancy = next(f for f in report["findings"] if f["rule"] == "AT401")
    assert "vectorized_elementwise_kernel" in occupancy["where"]["kernel"]
    skipped = {s["rule"]: s["reason"] for s in report["skipped"]}
    assert {"AT101", "AT102", "AT202", "AT301"} <= skipped.keys()
    assert "emit_nvtx" in skipped["AT101"]


def test_kernel_only_rules_stay_silent_on_tensor_cores_and_full_occupancy(tmp_path: Path) -> None:
    export = Export(kernels=_kernels(TF32_GEMM, registers=32)).write(tmp_path / "quiet.sqlite")
    report = lint_json(str(export))
    assert report["findings"] == []
    assert "AT201" not in {s["rule"] for s in report["skipped"]}


def _stepped(tmp_path: Path, step_name: str) -> Path:
    """Three steps, each a linear layer's ops as emit_nvtx writes them around an FP32 GEMM's launch."""
    kernels, ranges = [], []
    for step in range(3):
        t = 1000.0 * step
        kernels.append(Kernel(FP32_GEMM, t + 40.0, 600.0, registers=64, block=128, grid=264, launch_at_us=t + 30.0))
        ranges += [(step_name.format(n=step + 1), t, t + 900.0),
                   (f"aten::linear, seq = {step}, op_id = {10 * step + 1}", t + 10.0, t + 50.0),
                   (f"aten::matmul, op_id = {10 * step + 2}", t + 15.0, t + 45.0),
                   (f"aten::mm, seq = {step}, op_id = {10 * step + 3}, sizes = [[512, 1024], [1024, 1024]], "
                    f"input_op_ids = [({10 * step}, 0)]", t + 20.0, t + 40.0)]
    return Export(kernels=kernels, ranges=ranges).write(tmp_path / "stepped.sqlite")


@pytest.mark.parametrize("step_name", ["ProfilerStep#{n}", "step"])
def test_nvtx_ranges_give_ops_shapes_and_steps(tmp_path: Path, step_name: str) -> None:
    trace = load(str(_stepped(tmp_path, step_name)))
    assert trace.has_step_markers and trace.step_count >= 2
    mm = trace.ops.filter(trace.ops["name"] == "aten::mm")["idx"].to_list()
    assert trace.op_input(mm[0])[0] == [[512, 1024], [1024, 1024]]
    assert trace.has_shapes
    report = lint_json(str(tmp_path / "stepped.sqlite"), "--select", "AT201")
    (finding,) = report["findings"]
    # (A user's step range is an annotation, and stays in the chain, as record_function's does in Kineto.)
    assert finding["where"]["op_chain"].endswith("aten::linear > aten::matmul > aten::mm")


def test_a_sqlite_file_is_known_by_its_content_not_its_name(tmp_path: Path) -> None:
    renamed = tmp_path / "trace.json"
    renamed.write_bytes((NSYS / "healthy_1pct.sqlite").read_bytes())
    report = lint_json(str(renamed))
    assert report["traces"][0]["error"] is None
    assert report["traces"][0]["events"] == 800  # 400 kernels and their 400 launches


def test_an_export_from_stdin_is_read(tmp_path: Path) -> None:
    result = invoke("lint", "-", "--format", "json", "--fail-on", "never",
                    input=(NSYS / "healthy_1pct.sqlite").read_bytes())
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["traces"][0]["error"] is None


def test_the_export_is_not_written(tmp_path: Path) -> None:
    copy = tmp_path / "mine.sqlite"
    copy.write_bytes(TWO_H100.read_bytes())
    before = (hashlib.sha256(copy.read_bytes()).hexdigest(), os.stat(copy).st_mtime_ns, sorted(os.listdir(tmp_path)))
    lint_json(str(copy))
    after = (hashlib.sha256(copy.read_bytes()).hexdigest(), os.stat(copy).st_mtime_ns, sorted(os.listdir(tmp_path)))
    assert before == after


def _one_line_error(bad: Path, expected: str) -> None:
    """The bad file gets one line and exit 2; the good export beside it is still analysed."""
    good = NSYS / "healthy_1pct.sqlite"
    result = invoke("lint", str(bad), str(good), "--format", "json", "--fail-on", "never")
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}: ") and expected in errors[0], errors
    assert "Traceback" not in result.output
    traces = json.loads(result.stdout)["traces"]
    assert [t["error"] is None for t in traces] == [False, True]


def test_a_truncated_export_gets_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "cut.sqlite"
    bad.write_bytes((NSYS / "mock.sqlite").read_bytes()[:100_000])
    _one_line_error(bad, "damaged or truncated SQLite file")


def test_a_sqlite_file_of_another_program_gets_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "app.db"
    with sqlite3.connect(bad) as other:
        other.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    _one_line_error(bad, "not an Nsight Systems export")


def test_text_where_nsys_writes_integers_gets_one_line(tmp_path: Path) -> None:
    # SQLite keeps any value in any column: the reader's frame builder failed as an "internal error".
    bad = tmp_path / "edited.sqlite"
    bad.write_bytes((NSYS / "mock.sqlite").read_bytes())
    with sqlite3.connect(bad) as export:
        export.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'abc'")
    _one_line_error(bad, "CUPTI_ACTIVITY_KIND_KERNEL holds a value of the wrong type")


def test_an_unknown_schema_version_gets_one_line(tmp_path: Path) -> None:
    bad = Export(kernels=_kernels(TF32_GEMM, 32, steps=1)).write(tmp_path / "future.sqlite")
    with sqlite3.connect(bad) as export:
        export.execute("UPDATE META_DATA_EXPORT SET value = '4.0.0' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    _one_line_error(bad, "schema version 4.0.0, which this reader does not know")


def test_a_locked_export_gets_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "busy.sqlite"
    bad.write_bytes((NSYS / "mock.sqlite").read_bytes())
    writer = sqlite3.connect(bad, isolation_level=None)
    try:
        writer.execute("BEGIN EXCLUSIVE")
        _one_line_error(bad, "locked by another program")
    finally:
        writer.close()


def test_occupancy_says_it_was_skipped_without_device_properties() -> None:
    report = lint_json(str(TWO_H100), "--select", "AT401")
    (skipped,) = report["skipped"]
    assert skipped["rule"] == "AT401" and "TARGET_INFO_GPU" in skipped["reason"]


def test_annotate_writes_a_chrome_trace_of_the_export(tmp_path: Path) -> None:
    export = Export(kernels=_kernels(FP32_GEMM, registers=255)).write(tmp_path / "fire.sqlite")
    out = tmp_path / "annotated.json"
    first = invoke("lint", str(export), "--annotate", str(out), "--fail-on", "never")
    assert first.exit_code == 0, first.output
    document = json.loads(out.read_bytes())
    assert document["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    cats = {e.get("cat") for e in document["traceEvents"]}
    assert {"kernel", "cuda_runtime", "attntrace"} <= cats
    # The copy is a trace like any other: the same rules fire on it, and it is written the same every time.
    again = lint_json(str(out))
    assert sorted(f["rule"] for f in again["findings"]) == ["AT201", "AT401"]
    copy = out.read_bytes()
    invoke("lint", str(export), "--annotate", str(out), "--fail-on", "never")
    assert out.read_bytes() == copy


def _kineto_of(export: Export, path: Path) -> Path:
    """The same kernels and ranges as a Kineto trace: ops as cpu_op/user_annotation, launches and kernels."""
    events: list[dict] = []
    for text, start, end in export.ranges:
        name = text.split(", ")[0]
        cat = "cpu_op" if name.startswith("aten::") else "user_annotation"
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": 4243, "ts": 1e6 + start,
                       "dur": end - start})
    for i, k in enumerate(export.kernels, start=1):
        launch = k.launch_at_us if k.launch_at_us is not None else k.start_us - 5.0
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4243,
                       "ts": 1e6 + launch, "dur": 3.0, "args": {"correlation": i}})
        events.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": 0, "tid": 7, "ts": 1e6 + k.start_us,
                       "dur": k.dur_us, "args": {"correlation": i, "device": 0, "stream": 7,
                                                 "registers per thread": k.registers, "shared memory": k.shared,
                                                 "grid": [k.grid, 1, 1], "block": [k.block, 1, 1]}})
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_diff_compares_a_kineto_trace_with_an_export_of_the_same_program_per_step(tmp_path: Path) -> None:
    export = _stepped(tmp_path, "ProfilerStep#{n}")
    kernels, ranges = [], []
    for step in range(3):
        t = 1000.0 * step
        kernels.append(Kernel(FP32_GEMM, t + 40.0, 600.0, registers=64, block=128, grid=264, launch_at_us=t + 30.0))
        ranges += [(f"ProfilerStep#{step + 1}", t, t + 900.0), ("aten::mm", t + 20.0, t + 40.0)]
    kineto = _kineto_of(Export(kernels=kernels, ranges=ranges), tmp_path / "same.json")
    result = invoke("diff", str(kineto), str(export), "--format", "json")
    assert result.exit_code == 0, result.output
    (compared,) = json.loads(result.stdout)["comparisons"]
    assert compared["steps"] == {"base": 3, "new": 3}
    assert compared["step"]["base_median"] == compared["step"]["new_median"] == 900.0
    assert compared["kernel_classes"]["base"] == compared["kernel_classes"]["new"] == {"gemm_fp32_simt": 1.0}
    # The FP32 GEMM finding is one finding in both formats: neither new nor fixed.
    assert compared["findings"]["new"] == compared["findings"]["fixed"] == []
    assert not compared["regression"]


def test_a_directory_gives_its_exports_and_passes_over_other_sqlite_files(tmp_path: Path) -> None:
    (tmp_path / "run.sqlite").write_bytes((NSYS / "healthy_1pct.sqlite").read_bytes())
    with sqlite3.connect(tmp_path / "cache.sqlite") as other:
        other.execute("CREATE TABLE entries (key TEXT, value BLOB)")
    result = invoke("lint", str(tmp_path), "--format", "json", "--fail-on", "never")
    assert result.exit_code == 0, result.output
    assert [t["path"] for t in json.loads(result.stdout)["traces"]] == [str(tmp_path / "run.sqlite")]


def test_the_python_api_reads_an_export() -> None:
    import attntrace

    report = attntrace.lint([str(NSYS / "h100_2gpu_1s.sqlite")])
    assert {f.rule for f in report.findings} == {"AT102", "AT201", "AT302"}
