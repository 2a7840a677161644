from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
CORPUS = ROOT.parent / "shared" / "corpus" / "peer"
# Corpus traces copied into the repository (tests/data/README.md): tests on them run in CI too.
DATA = ROOT / "tests" / "data"


def as_a_shell_starts_it() -> None:
    """A preexec_fn: Ctrl-C's default action, as a shell gives a foreground job, whatever the test process has. A
    process started with SIGINT ignored (pytest run as a background job of a script, or under nohup) keeps ignoring
    it, by design, and a test that sends SIGINT would then test nothing the user meets."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sample(name: str) -> str:
    return str(SAMPLES / f"{name}.pt.trace.json.gz")


@pytest.fixture(scope="session")
def corpus_files() -> list[Path]:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus/peer is absent")
    return sorted(p for p in CORPUS.iterdir() if p.name.endswith((".json", ".json.gz")))


@pytest.fixture(scope="session")
def samples_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every sample trace linted once with the default settings, named relative to the repository as the golden
    file names them: the golden, impact and CI-format tests share it (each linted all 200-odd samples on its own,
    a minute each). Under pytest-xdist the first worker to need it writes it where the others read it."""
    import contextlib
    import fcntl
    import os

    import orjson
    from update_golden import lint_samples

    base = tmp_path_factory.getbasetemp()  # a worker's is .../pytest-N/popen-gwK: its parent is this run's own
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "samples_report.json"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait for the first worker's lint
        if shared.exists():
            return orjson.loads(shared.read_bytes())
        with contextlib.chdir(ROOT):
            report = lint_samples()
        shared.write_bytes(orjson.dumps(report))
        return report


def need(module: str, extra: str) -> Any:
    """Import an optional extra's module, or skip; in CI (CI=true), where `make install` installs the extras,
    a missing one fails instead, so that these tests cannot quietly stop running."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"needs the {extra} extra")


@pytest.fixture(scope="module")
def s3_server() -> Iterator[dict[str, str]]:
    """A real S3 API on localhost (moto's server mode), started here and stopped after the module's tests; yields
    the environment that points boto and s3fs at it."""
    need("moto.server", "test-remote")
    need("s3fs", "s3")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):  # up to about 30 s for the server to answer
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                    break
            except OSError:
                if server.poll() is not None:
                    pytest.fail("moto server exited at start")
                time.sleep(0.1)
        else:
            pytest.fail("moto server did not answer")
        yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
    finally:
        server.terminate()
        server.wait(timeout=30)


# A copy moves its bytes at most once per direction at the memory's speed: above this, the size is wrong.
MAX_COPY_BYTES_PER_US = 10e6  # 10 TB/s, beyond any GPU's memory


def impact_problems(report: dict) -> list[str]:
    """What is impossible in a report's impacts: a finding saving more than its step, a trace whose findings
    (each GPU microsecond counted once: subsumed ones left out) save more than the step, a copy faster than
    memory."""
    problems, per_trace = [], {}
    every = [g for f in report["findings"] for g in (f, *f.get("consequences", ()))]
    for f in every:
        share = f["impact"]["share_of_step"]
        if share > 1.0:
            problems.append(f"{f['trace']}: {f['rule']} saves {share:.0%} of the step")
        if "subsumed_by" not in f:
            per_trace[f["trace"]] = per_trace.get(f["trace"], 0.0) + share
        evidence = f["evidence"]
        if f["rule"] == "AT101" and evidence.get("bytes_per_step") and evidence["gpu_us_per_step"] > 0 \
                and evidence["bytes_per_step"] / evidence["gpu_us_per_step"] > MAX_COPY_BYTES_PER_US:
            problems.append(f"{f['trace']}: AT101 copies {evidence['bytes_per_step']:.3g} bytes in "
                            f"{evidence['gpu_us_per_step']:.1f} us per step")
    problems += [f"{trace}: findings save {total:.0%} of the step" for trace, total in per_trace.items()
                 if total > 1.0 + 1e-3]
    return problems + gpu_time_problems(report)


def gpu_time_problems(report: dict) -> list[str]:
    """Each GPU microsecond counted once: the causes' (top-level, not subsumed) GPU-time savings, and the GPU
    time they claim (evidence.gpu_us_per_step), each add up to no more than the trace's GPU time in its busiest
    step (all devices)."""
    saved: dict[str, float] = {}
    claimed: dict[str, float] = {}
    for f in report["findings"]:
        if "subsumed_by" in f or f["impact"].get("saving") != "gpu time":
            continue
        saved[f["trace"]] = saved.get(f["trace"], 0.0) + f["impact"]["gpu_us_per_step"]
        claimed[f["trace"]] = claimed.get(f["trace"], 0.0) + (f["evidence"].get("gpu_us_per_step") or 0.0)
    problems = []
    for trace in report["traces"]:
        summary = trace.get("summary") or {}
        per_step: dict[Any, float] = {}
        for row in summary.get("per_step") or []:
            per_step[row["step"]] = per_step.get(row["step"], 0.0) + (row.get("gpu_busy_us") or 0.0)
        steps = max(1, summary.get("steps") or 1)
        busy = max(per_step.values(), default=(summary.get("gpu_busy_us") or 0.0) / steps)
        for what, totals in (("save", saved), ("claim", claimed)):
            total = totals.get(trace["path"], 0.0)
            if total > busy * 1.001 + 0.5:
                problems.append(f"{trace['path']}: findings {what} {total:.0f} us of GPU time per step, the busiest "
                                f"step has {busy:.0f}")
    return problems
