"""Re-capture sample_traces/bf16_causal_fwd_stack/ (naive and sdpa_math with Python stacks) so that its
findings' source lines point at today's attntrace/capture/variants.py.

On the GPU machine, which has torch but not polars (the capture needs no polars):
    python bench/gpu/capture_stack_sample.py capture OUT_DIR
Then here, where lint runs, to write OUT_DIR/run.json as `attntrace run` does:
    python bench/gpu/capture_stack_sample.py finalize OUT_DIR
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path


def capture(out: Path) -> None:
    from attntrace.capture import options, runner

    shape = options.Shape(4, 16, 2048, 64, None, None, None, None)
    config = runner.RunConfig(("naive", "sdpa_math"), shape, "bf16", True, False, 3, 5, "cuda", out, True)
    meta, results = runner.run(config, progress=lambda line: print(line, file=sys.stderr))
    (out / "captured.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]},
                                                  default=str, indent=1))


def finalize(out: Path) -> None:
    import orjson

    from attntrace.report.compare import analyse_run

    captured = json.loads((out / "captured.json").read_text())
    captured["meta"]["config"]["out_dir"] = str(out)
    report = analyse_run(captured["meta"], captured["results"], lint=True)
    report["config"]["out_dir"] = "."  # as attntrace run --out DIR records it, relative to run.json
    (out / "run.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    (out / "captured.json").unlink()


if __name__ == "__main__":
    {"capture": capture, "finalize": finalize}[sys.argv[1]](Path(sys.argv[2]))
