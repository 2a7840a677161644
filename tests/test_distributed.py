"""`lint --scheduler`: a LocalCluster of 2 worker processes gives the local run's report byte for byte; a worker
killed mid-run costs nothing when Dask retries the trace, and becomes that trace's one-line error when it cannot."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import DATA, need, sample

from attntrace.checks.catalog import load_rules
from attntrace.cli import main
from attntrace.distributed import runner
from attntrace.read import workers
from attntrace.report import engine

distributed = need("distributed", "dask")
dask = need("dask", "dask")
NAMES = ["bf16_causal_fwd/naive", "bf16_causal_fwd/sdpa", "bf16_causal_fwd/sdpa_math", "fp32_causal_fwd/naive"]
POLL_S, POLL_LIMIT_S = 0.05, 120.0  # how often and how long to wait for the cluster to reach a state


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    for i, name in enumerate(NAMES):
        shutil.copy(sample(name), tmp_path / f"trace{i}.pt.trace.json.gz")
    (tmp_path / "notes.json").write_bytes(b'{"not": "a trace"}')  # passed over, as in a local run
    (tmp_path / "broken.json").write_bytes(b'{"traceEvents": [')  # one-line error, as in a local run
    return tmp_path


def _cluster(**config: Any) -> Any:
    with dask.config.set(config):
        return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with _cluster() as local:
        yield local


def _lint(args: list[str]) -> tuple[int, bytes]:
    result = CliRunner().invoke(main, ["lint", *args, "--format", "json", "--fail-on", "never"])
    return result.exit_code, result.stdout_bytes


def test_a_cluster_gives_the_local_report_byte_for_byte(cluster: Any, traces: Path) -> None:
    local = _lint([str(traces), "-j", "1"])
    clustered = _lint([str(traces), "--scheduler", cluster.scheduler_address])
    assert clustered == local
    report = orjson.loads(clustered[1])
    assert [Path(t["path"]).name for t in report["traces"]] == ["broken.json", *(f"trace{i}.pt.trace.json.gz"
                                                                                 for i in range(4))]
    assert report["findings"] and clustered[0] == 2  # the broken trace is an error, the others are analysed


def test_a_trace_big_enough_for_the_parallel_decode_gives_the_local_report(cluster: Any) -> None:
    """A Dask worker is a daemonic process, which may not start the decode's worker processes: it decodes alone
    (before, every trace over about 1 MB gzipped was `internal error (daemonic processes are not allowed to have
    children)`)."""
    if workers.read_workers(workers.PARALLEL_MIN_PIECES) < 2:
        pytest.skip("one usable core: no parallel decode to compare with")
    big = str(DATA / "hta_trace_diff_v100.json.gz")  # 32 MB of JSON: pieces decoded by several processes here
    local = _lint([big])
    clustered = _lint([big, "--scheduler", cluster.scheduler_address])
    assert clustered == local
    assert orjson.loads(local[1])["traces"][0]["error"] is None


def test_standard_input_is_read_by_the_client(cluster: Any, traces: Path) -> None:
    data = Path(sample("bf16_causal_fwd/naive")).read_bytes()
    args = ["lint", "-", str(traces / "trace1.pt.trace.json.gz"), "--format", "json", "--fail-on", "never"]
    local = CliRunner().invoke(main, [*args, "-j", "1"], input=data)
    clustered = CliRunner().invoke(main, [*args, "--scheduler", cluster.scheduler_address], input=data)
    assert clustered.stdout_bytes == local.stdout_bytes
    first = orjson.loads(clustered.stdout_bytes)["traces"][0]
    assert first["path"] == "-" and first["error"] is None


def test_local_n_starts_its_own_cluster_with_the_same_output(traces: Path) -> None:
    args = [sys.executable, "-m", "attntrace", "lint", str(traces), "--format", "json", "--fail-on", "never"]
    local = subprocess.run([*args, "-j", "1"], capture_output=True, check=False)
    clustered = subprocess.run([*args, "--scheduler", "local:2"], capture_output=True, check=False)
    assert clustered.stdout == local.stdout and clustered.returncode == local.returncode == 2
    # The broken trace's one line, and no Dask log lines:
    assert clustered.stderr == local.stderr, clustered.stderr.decode()


def test_nsys_exports_go_through_the_cluster_as_through_local_workers() -> None:
    """An export is a SQLite file that sqlite3 opens by path: the Dask path reads it as the local one does."""
    exports = [str(DATA / "nsys/h100_2gpu_1s.sqlite"), str(DATA / "nsys/mock.sqlite")]
    args = [sys.executable, "-m", "attntrace", "lint", *exports, "--format", "json", "--fail-on", "never"]
    local = subprocess.run([*args, "-j", "1"], capture_output=True, check=False)
    clustered = subprocess.run([*args, "--scheduler", "local:1"], capture_output=True, check=False)
    assert clustered.returncode == local.returncode == 0, clustered.stderr.decode()
    assert clustered.stdout == local.stdout
    assert "AT201" in {f["rule"] for f in orjson.loads(clustered.stdout)["findings"]}


def test_a_bad_or_unreachable_scheduler_is_one_line(traces: Path) -> None:
    bad = subprocess.run([sys.executable, "-m", "attntrace", "lint", str(traces), "--scheduler", "localhost"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "is not a scheduler: give tcp://HOST:PORT" in bad.stderr
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    gone = subprocess.run([sys.executable, "-m", "attntrace", "lint", str(traces), "--scheduler",
                           "tcp://127.0.0.1:1"], capture_output=True, text=True, check=False, env=env)
    assert gone.returncode == 2
    assert gone.stderr.splitlines()[-1].startswith("error: tcp://127.0.0.1:1: cannot reach the Dask scheduler")
    assert "Traceback" not in gone.stderr


def _wait_for(condition: Any, what: str) -> Any:
    deadline = time.monotonic() + POLL_LIMIT_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(POLL_S)
    pytest.fail(f"the cluster never reached the state: {what}")


# The kernel's wait states of a thread that waits for a FIFO's writer: in open(), or in poll() after a
# non-blocking open (as attntrace's reader does).
FIFO_WAITS = ("wait_for_partner", "poll_schedule_timeout", "do_sys_poll", "do_poll")


def _worker_blocked_on_fifo(client: Any) -> int | None:
    """The pid of the worker whose task is blocked waiting for the FIFO's writer."""
    for pid in client.run(os.getpid).values():
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                if (task / "wchan").read_text().strip().startswith(FIFO_WAITS):
                    return pid
            except OSError:
                continue
    return None


def _gone(client: Any, pid: int) -> bool:
    try:
        return pid not in client.run(os.getpid).values()
    except OSError:  # the scheduler still lists the dead worker, and cannot reach it
        return False


def _wait_long_for_fifo_writers() -> None:
    from attntrace.read import buffers

    buffers.FIFO_WAIT_S = 600.0  # the test kills the worker long before


def _fifo_beside(traces: Path) -> Path:
    # A directory scan takes regular files only, so the FIFO is named on the command line, after the folder.
    return traces.parent / f"{traces.name}-fifo" / "trace9.pt.trace.json.gz"


def _kill_mid_run(cluster: Any, traces: Path, before_kill: Any) -> dict[str, Any]:
    """Lint `traces` and then a FIFO on the cluster; the FIFO blocks its worker; once every other trace is
    done, kill that worker with SIGKILL (after `before_kill`), and return the report."""
    fifo = _fifo_beside(traces)
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    settings = engine.default_settings(load_rules())
    result: dict[str, Any] = {}
    work = threading.Thread(target=lambda: result.update(
        engine.run([str(traces), str(fifo)], settings, runner=runner(cluster.scheduler_address))))
    with distributed.Client(cluster.scheduler_address) as watcher:
        watcher.run(_wait_long_for_fifo_writers)
        work.start()
        def only_the_fifo_left() -> int | None:
            busy = [k for keys in watcher.processing().values() for k in keys if str(k).startswith("attntrace-")]
            return _worker_blocked_on_fifo(watcher) if len(busy) == 1 else None

        pid = _wait_for(only_the_fifo_left, "every trace done but the FIFO, whose worker is blocked on it")
        before_kill(fifo)
        os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: _gone(watcher, pid), "the killed worker gone from the cluster")
    work.join(timeout=POLL_LIMIT_S)
    assert not work.is_alive()
    return result


def test_a_worker_killed_mid_run_is_retried_without_duplicate_reports(cluster: Any, traces: Path,
                                                                       tmp_path_factory: Any) -> None:
    real = tmp_path_factory.mktemp("real") / "trace9.pt.trace.json.gz"
    shutil.copy(sample("bf16_causal_fwd/flex"), real)
    # The killed worker stays blocked on the FIFO's inode; Dask's retry opens the path anew and finds a trace.
    report = _kill_mid_run(cluster, traces, lambda fifo: os.replace(real, fifo))
    expected = engine.run([str(traces), str(_fifo_beside(traces))], engine.default_settings(load_rules()))
    assert orjson.dumps(report) == orjson.dumps(expected)
    assert len(report["traces"]) == 6 and report["summary"]["errors"] == 1  # broken.json only


def test_a_worker_that_dies_on_a_trace_is_that_traces_one_line_error(traces: Path) -> None:
    # No retry allowed: the trace whose worker died is reported as lost, and all the others as usual.
    with _cluster(**{"distributed.scheduler.allowed-failures": 0}) as strict:
        report = _kill_mid_run(strict, traces, lambda fifo: None)
    lost = report["traces"][-1]
    assert lost["path"].endswith("trace9.pt.trace.json.gz")
    assert lost["error"] == {"kind": "worker-lost", "message": "the Dask worker analysing this trace died (out of "
                                                               "memory, or killed); the other traces were analysed"}
    assert [t["error"] is None for t in report["traces"]] == [False, True, True, True, True, False]


# Loaded by every Python process of the run (PYTHONPATH): in a Dask worker, the rename of a finished annotated copy
# is preceded by the signal to the run (the worker's parent, where the nanny runs), and the worker then waits, so the
# run is interrupted while the copy's temporary file is there and its writer alive.
_SIGNAL_THE_RUN_FROM_A_WORKER = """
import multiprocessing, os, signal, time
_replace = os.replace
def _replace_after_a_signal(src, dst):
    if str(src).endswith(".tmp") and multiprocessing.parent_process() is not None:
        os.kill(os.getppid(), getattr(signal, os.environ["SIGNAL"]))
        time.sleep(60)
    return _replace(src, dst)
os.replace = _replace_after_a_signal
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_leaves_nothing_of_a_local_cluster_behind(tmp_path: Path, signame: str) -> None:
    # The annotated copy a Dask worker was writing stayed as a .tmp file (the worker has no handler of ours and was
    # stopped mid-write), the cluster's dask-scratch-space stayed in $TMPDIR, and the resource tracker warned of
    # "leaked semaphore objects" on the error stream.
    from conftest import ROOT, as_a_shell_starts_it

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SIGNAL_THE_RUN_FROM_A_WORKER)
    temp, out = tmp_path / "temp", tmp_path / "out"
    temp.mkdir()
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "SIGNAL": signame, "TMPDIR": str(temp)}
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", sample("bf16_causal_fwd/naive"),
                           sample("bf16_causal_fwd/sdpa"), "--scheduler", "local:1", "--annotate", str(out),
                           "-o", str(out / "report.json"), "--format", "json"], env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=as_a_shell_starts_it)
    assert done.returncode == 128 + getattr(signal, signame), done.stderr
    assert done.stderr == ""
    assert [name for name in os.listdir(out) if name.endswith(".tmp")] == []
    assert os.listdir(temp) == []


def test_the_scratch_folder_of_a_killed_run_goes_with_the_next_local_cluster(tmp_path: Path) -> None:
    # SIGKILL can remove nothing: the cluster's scratch folder stayed in $TMPDIR for good.
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    big = sample("heldout/gpt2_generate.shapes_stack")
    run = subprocess.Popen([sys.executable, "-m", "attntrace", "lint", big, big, big, "--scheduler", "local:1",
                            "--format", "json", "-o", str(tmp_path / "r.json")], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + POLL_LIMIT_S
    while not list(temp.glob("attntrace-dask-*/attntrace-owner")) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    os.killpg(run.pid, signal.SIGKILL)  # the whole group, as `timeout -s KILL` or the OOM killer's cgroup kill
    run.wait(timeout=60)
    (left,) = temp.glob("attntrace-dask-*")
    again = subprocess.run([sys.executable, "-m", "attntrace", "lint", sample("bf16_causal_fwd/naive"), "--scheduler",
                            "local:1", "--fail-on", "never"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert not left.exists() and os.listdir(temp) == []
