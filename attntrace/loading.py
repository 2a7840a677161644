"""Turn the paths a user gave into analysed traces or one-line errors, keeping their order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, TypeVar

from attntrace import model, reader
from attntrace.reader import TraceError

T = TypeVar("T")
SKIPPED = "skipped"  # the kind of an InputError that is a note, not a failure


@dataclass(frozen=True)
class InputError:
    path: str
    kind: str
    message: str

    def line(self) -> str:
        return f"{self.path}: {self.message}"


def load(path: str, options: reader.ReadOptions = reader.ReadOptions()) -> model.Trace:  # noqa: B008
    return model.build(reader.read(path, options))


def guarded(path: str, work: Callable[[str], T]) -> T | InputError:
    """Run `work` on one input; any failure becomes a one-line error for that input alone."""
    try:
        return work(path)
    except TraceError as exc:
        return InputError(path, exc.kind, exc.message)
    except MemoryError:
        return InputError(path, "too-large", "out of memory while reading; raise the memory or split the trace")
    except RecursionError:
        return InputError(path, "not-a-trace", "JSON nested too deeply")
    except Exception as exc:  # a bug in attntrace must not hide the other inputs' results
        return InputError(path, "internal", f"internal error ({type(exc).__name__}: {exc}); please report it")


def _call(args: tuple[str, Callable[[str], Any]]) -> Any:
    path, work = args
    return guarded(path, work)


# Runs `work` on every path of a list elsewhere (a cluster), returning one result per path in list order.
Runner = Callable[[list[str], Callable[[str], Any]], list[Any]]


def map_inputs(paths: list[str], work: Callable[[str], T], jobs: int = 1,
               runner: Runner | None = None) -> Iterator[T | InputError]:
    """Apply `work` to every trace found under `paths`, in input order, `jobs` at a time (or by `runner`)."""
    found = list(reader.discover(paths))
    todo = [item[0] for item in found if isinstance(item, tuple)]
    with ExitStack() as stack:
        if runner is not None:
            done: Iterator[T | InputError] = iter(runner(todo, work))
        elif jobs > 1 and len(todo) > 1 and "-" not in todo:
            # spawn, not fork: polars' thread pool does not survive a fork.
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=min(jobs, len(todo)),
                                                           mp_context=get_context("spawn")))
            done = pool.map(_call, [(p, work) for p in todo])
        else:
            done = (guarded(p, work) for p in todo)
        # Results come in input order as each is done, so a caller can show progress.
        for item in found:
            if isinstance(item, TraceError):
                path, _, message = item.message.partition(": ")
                yield InputError(path, item.kind, message)
                continue
            path, in_directory = item
            result = next(done)
            if in_directory and isinstance(result, InputError) and result.kind == "not-a-trace":
                # Other JSON beside the traces (run.json, configs) is passed over, not an error.
                yield InputError(path, SKIPPED, result.message)
            else:
                yield result
