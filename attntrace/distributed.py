"""Lint on a Dask cluster (`--scheduler tcp://HOST:PORT | local[:N]`): one task per trace. Workers read their
traces themselves (local paths they can see, or URLs) and return the per-trace report parts; the client puts
them back in input order, so the report is byte-identical to a local run. Dask is an optional extra
(`attntrace[dask]`), imported only here."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from attntrace.install import pip_install
from attntrace.liveness import hold_folder, remove_abandoned_siblings
from attntrace.model.loading import InputError, guarded
from attntrace.read import workers as workers_module

_ADDRESS = re.compile(r"^(tcp|tls|ucx|inproc|ws|wss)://\S+$")
_LOCAL = re.compile(r"^local(?::(\d+))?$")


# The scratch folder of the local cluster running now: its workers' and scheduler's files (dask-scratch-space) go
# here, not into $TMPDIR for good. Removed when the cluster closes, and by an interrupted run's handler
# (attntrace.__main__, through remove_scratch) once the workers are stopped.
_scratch: set[str] = set()
# Its owner file is held while the cluster runs (liveness.hold_folder): a run killed with SIGKILL removes nothing, and
# the next local cluster started in the same temporary folder removes the scratch folders no one holds.
SCRATCH_PREFIX = "attntrace-dask-"


def remove_scratch() -> None:
    """Remove the local cluster's scratch folder; for the handler of SIGINT and SIGTERM."""
    for folder in list(_scratch):
        shutil.rmtree(folder, ignore_errors=True)
        _scratch.discard(folder)


class SchedulerError(Exception):
    """The cluster cannot be used at all (not installed, not reachable); the message is one line."""


def check(value: str) -> str:
    """The --scheduler value, or SchedulerError saying what is expected."""
    local = _LOCAL.match(value)
    if _ADDRESS.match(value) or (local and (local.group(1) is None or int(local.group(1)) > 0)):
        # Asked before any trace is read: a missing extra is a usage error (exit 2), not a finding (exit 1).
        if importlib.util.find_spec("distributed") is None or importlib.util.find_spec("dask") is None:
            raise SchedulerError(f"--scheduler needs Dask, which is not installed: {pip_install('dask')}")
        return value
    raise SchedulerError(f"{value!r} is not a scheduler: give tcp://HOST:PORT (an existing Dask cluster) "
                         "or local[:N] (N worker processes on this machine)")


def _quiet() -> None:
    # distributed logs worker deaths and restarts to stderr, and warns about busy ports; a lost trace is
    # already reported as one line, and nothing else of the cluster's is the user's business here.
    warnings.filterwarnings("ignore", module=r"distributed(\.|$)")
    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


@contextmanager
def _client(scheduler: str) -> Iterator[Any]:
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise SchedulerError(f"--scheduler needs Dask: {pip_install('dask')} ({exc})") from exc
    _quiet()
    local = _LOCAL.match(scheduler)
    # Worker processes start from this environment: keep their logging as quiet as the client's.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "critical")
    if local:
        # Its workers are spawned with multiprocessing: the resource tracker they share must be the quiet one (an
        # interrupted run's tracker printed "There appear to be N leaked semaphore objects" on the error stream).
        workers_module.start_quiet_tracker()
        workers_module.mark_temp_dir()  # the folder its spawned workers use: one SIGKILL left goes at the next run
        scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
        _scratch.add(scratch)
        owner = hold_folder(scratch)
        remove_abandoned_siblings(scratch, SCRATCH_PREFIX)
        try:
            with dask.config.set({"logging.distributed": "critical", "temporary-directory": scratch}):
                workers = int(local.group(1) or os.cpu_count() or 1)
                try:
                    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", silence_logs=logging.CRITICAL,
                                           local_directory=scratch)
                except Exception as exc:
                    raise SchedulerError(f"cannot start {workers} local Dask workers ({type(exc).__name__}: "
                                         f"{exc})") from exc
                with cluster, Client(cluster) as client:
                    yield client
        finally:
            os.close(owner)
            remove_scratch()
        return
    with dask.config.set({"logging.distributed": "critical"}):
        try:
            client = Client(scheduler)  # waits distributed.comm.timeouts.connect (30 s unless configured)
        except Exception as exc:  # OSError, TimeoutError and Dask's own: all mean "not reachable"
            raise SchedulerError(f"{scheduler}: cannot reach the Dask scheduler ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else 'no answer'})") from exc
        with client:
            yield client


def _lost(path: str, exc: BaseException) -> InputError:
    """A task that ended without a result: its worker died (Dask gave up after its retries) or it could not
    run there. The trace gets a one-line error; the others are unaffected."""
    name = type(exc).__name__
    if name == "KilledWorker":
        return InputError(path, "worker-lost", "the Dask worker analysing this trace died (out of memory, or "
                          "killed); the other traces were analysed")
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return InputError(path, "cluster", f"the Dask task failed ({name}{': ' + detail if detail else ''})")


def runner(scheduler: str) -> Callable[[list[str], Callable[[str], Any]], list[Any]]:
    """A `loading.Runner` that sends one task per trace to the cluster and returns the results in input order."""

    def run_on_cluster(paths: list[str], work: Callable[[str], Any]) -> list[Any]:
        if not paths:
            return []
        from distributed import as_completed

        # One slot per trace, filled once: a task that Dask ran again after a worker died still gives one
        # report, and the order is the input order whatever order the workers finish in.
        results: list[Any] = [None] * len(paths)
        with _client(scheduler) as client:
            run_id = uuid.uuid4().hex[:12]  # keys unique to this run: another client's results are never shared
            futures = [client.submit(guarded, path, work, key=f"attntrace-{run_id}-{i}", pure=False)
                       for i, path in enumerate(paths) if path != "-"]
            index = {f.key: int(f.key.rsplit("-", 1)[1]) for f in futures}
            if "-" in paths:  # standard input is this process's: read it here while the workers run
                results[paths.index("-")] = guarded("-", work)
            for future in as_completed(futures):
                i = index[future.key]
                if future.status == "finished":
                    results[i] = future.result()
                elif future.status == "cancelled":
                    results[i] = InputError(paths[i], "cluster", "the Dask task was cancelled")
                else:
                    results[i] = _lost(paths[i], future.exception())
                future.release()
            return results

    return run_on_cluster
