"""Progress on stderr for long work, only when stderr is a terminal (CI logs and pipes stay clean)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LARGE_BYTES = 64 << 20  # below this lint finishes in about a second: no bar
VARIANT_LINE = re.compile(r"^\[(?P<index>\d+)/\d+\] (?P<name>.+)$")  # capture.runner's "[i/n] name"


def _terminal() -> bool:
    # No stderr at all (a library caller's process started without one): no bar.
    return sys.stderr is not None and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def _input_bytes(paths: list[str]) -> tuple[int, int]:
    """(trace files, bytes on disk) under the paths, without reading them."""
    from attntrace.read import discover

    files = [item[0] for item in discover(paths) if isinstance(item, tuple) and item[0] != "-"]
    sizes = []
    for path in files:
        try:
            sizes.append(os.path.getsize(path))
        except OSError:
            sizes.append(0)
    return len(files), sum(sizes)


@contextmanager
def file_progress(paths: list[str]) -> Iterator[Callable[[str, int], None] | None]:
    """A callback(path, bytes) that advances a bar of files and bytes, or None when no bar is shown."""
    if not _terminal():
        yield None
        return
    files, total = _input_bytes(paths)
    if total < LARGE_BYTES:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="lint", file=sys.stderr,
              leave=False, dynamic_ncols=True) as bar:
        done = [0]

        def advance(path: str, size: int) -> None:
            done[0] += 1
            bar.set_postfix_str(f"{done[0]}/{files} files", refresh=False)
            bar.update(size)

        yield advance


@contextmanager
def run_progress(variants: int, site: str | None = None) -> Iterator[Callable[[str], None]]:
    """The `run` runner's progress callback: a bar of variants on a terminal; elsewhere only the lines that
    say a variant failed (they are diagnostics, not progress). For one site of `run --from-trace` (`site` says
    which), elsewhere too a line per site and per variant as it starts: at a real model's shapes on a CPU a
    variant takes minutes, and the command said nothing for 6m41s."""
    if not _terminal():
        if site is None:
            yield lambda line: print(line.strip(), file=sys.stderr) if not VARIANT_LINE.match(line) else None
            return
        print(f"measuring {site}", file=sys.stderr, flush=True)
        yield lambda line: print(f"  {line.strip()}", file=sys.stderr, flush=True)
        return
    from tqdm import tqdm

    desc = "run" if site is None else site.split(":")[0]
    with tqdm(total=variants, desc=desc, unit="variant", file=sys.stderr, leave=False, dynamic_ncols=True) as bar:

        def advance(line: str) -> None:
            started = VARIANT_LINE.match(line)
            if started is None:
                bar.write(line.strip(), file=sys.stderr)
                return
            bar.n = int(started["index"]) - 1
            bar.set_postfix_str(started["name"])  # refreshes the bar

        yield advance
