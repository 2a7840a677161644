"""Finding the inputs: files, directories (their *.json, *.json.gz and *.sqlite files, sorted), quoted glob patterns,
stdin, and URLs (through attntrace.read.sources). Nothing here opens a trace; it names what to read, or why an
input cannot be read."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from attntrace.read.encodings import NSYS_REPORT_SUFFIXES, nsys_export_command
from attntrace.read.errors import NUL_IN_PATH, TRACE_SUFFIXES, TraceError

_GLOB = re.compile(r"[*?\[]")
# Nsight Systems exports (read/nsys.py) found in a directory; one of another program is passed over there.
EXPORT_SUFFIXES = (".sqlite",)


def input_roots(paths: list[str]) -> tuple[str, ...]:
    """The inputs that name a set of traces (directories, URL prefixes, quoted patterns' folders): a trace
    found under one is known by its name and the path below it (model/identity.py)."""
    from attntrace.read import sources

    roots = []
    for given in paths:
        given = sources.local_path(given) or given
        magic = _GLOB.search(given)
        if given == "-":
            continue
        if magic:
            roots.append(given[:magic.start()].rsplit("/", 1)[0] or ".")
        elif "://" in given:
            if not given.endswith(TRACE_SUFFIXES):
                roots.append(given)
        else:
            with contextlib.suppress(OSError):
                if Path(given).is_dir():
                    roots.append(given)
    return tuple(roots)


def discover(paths: list[str]) -> Iterator[tuple[str, str | None] | TraceError]:
    """Expand directories into their JSON files, sorted; yield (path, the directory or pattern it was found in as
    given, else None) for each input, or why the input is unusable. A directory scan takes regular files only (a
    FIFO there would block); a FIFO or pipe named on the command line is read as a stream. A file named twice
    (`a.json ./a.json`, a link to it, a directory and a file in it) is analysed and reported once, where it came
    first."""
    seen: set[tuple[int, int] | str] = set()
    for item in _discover(paths):
        path = item[0] if isinstance(item, tuple) else item.path
        # Only local files: stdin named twice gets its own error, and a URL is another file at every read.
        key = _identity(path) if path and path != "-" and "://" not in path and "\0" not in path else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        yield item


def _identity(path: str) -> tuple[int, int] | str:
    """The file behind a path: its device and inode, else its real path. Not the path made absolute as text:
    `L/../t.json` through a linked folder L is another file than `t.json`, and was passed over as its duplicate."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return os.path.realpath(path)
    return (status.st_dev, status.st_ino) if status.st_ino else os.path.realpath(path)


def _discover(paths: list[str]) -> Iterator[tuple[str, str | None] | TraceError]:
    stdin_seen = False
    from attntrace.read import sources  # URLs: a small module; fsspec itself is imported only for a URL

    for given in paths:
        if not given:  # an unset shell variable ("$TRACE"): Path("") is the current directory, which it never meant
            yield TraceError("usage", "an empty path", path=given)
            continue
        if "\0" in given:
            yield TraceError("usage", NUL_IN_PATH, path=given)
            continue
        if given == "-":
            if stdin_seen:
                yield TraceError("usage", "stdin ('-') can be read only once", path=given)
            else:
                stdin_seen = True
                yield given, None
            continue
        given = sources.local_path(given) or given
        if sources.is_url(given):
            yield from sources.discover(given)
            continue
        path = Path(given)
        try:
            is_dir = path.is_dir()
            exists = is_dir or os.path.lexists(path)  # a broken or looping link is named by open()'s own error
        except OSError as exc:  # a parent directory that cannot be searched
            yield TraceError("unreadable", exc.strerror or str(exc), path=given)
            continue
        if is_dir:
            found, problems = _walk_traces(path)
            if not found and not problems:
                yield TraceError("not-found", "no trace files (*.json, *.json.gz) or Nsight Systems exports "
                                 "(*.sqlite) in this directory" + _reports_hint(path), path=given)
            yield from ((p, given) for p in found)
            yield from problems
        elif exists:
            yield given, None
        elif _GLOB.search(given):  # a quoted pattern ('traces/rank*.json.gz'), as for URLs
            try:
                matches = sorted(_glob(given))
            except RecursionError:
                yield TraceError("unsupported", "directories nested too deeply to search", path=given)
                continue
            # Files, and links that lead nowhere (dangling, looping): open() names their problem, as in a walk.
            files = [m for m in matches if os.path.isfile(m) or (os.path.islink(m) and not os.path.exists(m))]
            for folder in (m for m in matches if os.path.isdir(m)):  # a matched directory is searched as one
                found, problems = _walk_traces(Path(folder))
                files += found
                yield from problems
            unreadable = _unreadable_under(given)
            yield from unreadable
            if not files and not unreadable:
                yield TraceError("not-found", "no trace file matches this pattern", path=given)
            yield from ((match, given) for match in sorted(set(files)))
        else:
            yield TraceError("not-found", "no such file or directory", path=given)


def _glob(pattern: str) -> list[str]:
    """The paths a quoted pattern matches. A `**` does not follow links to directories, as a directory's walk
    does not: glob.glob follows them, and two links to "." made its walk branch until the OS refused (hours)."""
    if "**" not in pattern:
        return glob.glob(pattern)
    root, rest = _split_pattern(pattern)
    if not rest:
        return []
    # pathlib's `**` never enters a linked directory (Python 3.11 and 3.12; 3.13's default is the same).
    found = Path(root).glob(rest)
    return [str(p) for p in found]


def _split_pattern(pattern: str) -> tuple[str, str]:
    """The folder a pattern searches from (its path before the first component with a wildcard), and the rest."""
    magic = _GLOB.search(pattern)
    cut = pattern.rfind("/", 0, magic.start() if magic else len(pattern))
    return (pattern[:cut] or "/", pattern[cut + 1:]) if cut >= 0 else (".", pattern)


def _unreadable_under(pattern: str) -> list[TraceError]:
    """The folders a pattern's search could not read, which glob passes over in silence: under its root for a
    `**` (a walk, links not followed), else its root alone. A recursive pattern over a folder that held an
    unreadable one reported nothing, and a pattern into an unreadable folder said that nothing matched."""
    root = _split_pattern(pattern)[0]
    problems: list[TraceError] = []

    def unreadable(exc: OSError) -> None:
        problems.append(TraceError("unreadable", f"cannot read this directory ({exc.strerror or exc})",
                                   path=exc.filename or root))

    if not os.path.isdir(root):
        return []
    try:
        if "**" in pattern:
            for _folder, dirs, _files in os.walk(root, followlinks=False, onerror=unreadable):
                dirs.sort()
        else:
            with os.scandir(root):
                pass
    except RecursionError:
        return problems
    except OSError as exc:
        unreadable(exc)
    return sorted(problems, key=lambda e: e.path or "")


def _reports_hint(root: Path) -> str:
    """For a folder with no trace: the Nsight Systems reports it holds, which attntrace reads once exported."""
    try:
        reports = sorted(str(p) for p in root.rglob("*") if p.name.endswith(NSYS_REPORT_SUFFIXES) and p.is_file())
    except (OSError, RecursionError):
        return ""
    if not reports:
        return ""
    return f"; it holds {len(reports)} Nsight Systems report(s) (.nsys-rep, .qdrep): {nsys_export_command(reports[0])}"


def _walk_traces(root: Path) -> tuple[list[str], list[TraceError]]:
    """The trace files under root, sorted, and the folders that could not be read."""
    problems: list[TraceError] = []

    def unreadable(exc: OSError) -> None:
        problems.append(TraceError("unreadable", f"cannot read this directory ({exc.strerror or exc})",
                                   path=exc.filename or str(root)))

    found: list[str] = []
    try:
        _walk(root, found, unreadable)
    except RecursionError:  # os.walk recurses per level (Python 3.11): a tree 1,000 folders deep ends it
        problems.append(TraceError("unsupported", "directories nested too deeply to search", path=str(root)))
    return sorted(found), sorted(problems, key=lambda e: e.path or "")


def _walk(root: Path, found: list[str], unreadable: Callable[[OSError], None]) -> None:
    # followlinks=False: a symlink loop cannot trap the walk.
    for folder, dirs, files in os.walk(root, followlinks=False, onerror=unreadable):
        dirs.sort()
        for name in files:
            if not name.endswith(TRACE_SUFFIXES + EXPORT_SUFFIXES):
                continue
            full = os.path.join(folder, name)
            try:
                mode = os.stat(full).st_mode
            except OSError:
                found.append(full)  # a dangling link or one we may not stat: open() names the problem
                continue
            if stat.S_ISREG(mode):
                found.append(full)
