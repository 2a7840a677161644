"""How to install an extra of this attntrace, for the hints the tool prints: attntrace is not on PyPI, so
`pip install 'attntrace[html]'` finds nothing. The hint names where this copy came from: the repository it runs
from (a checkout, an editable install), else the URL pip recorded when it installed it (PEP 610
direct_url.json: a git URL or a path). Standard library only: any layer may use it."""

from __future__ import annotations

import json
import shlex
from functools import cache
from importlib import metadata
from pathlib import Path

PACKAGE = "attntrace"


@cache
def _source() -> str | None:
    """A pip requirement's location for this copy: a directory, or a URL (git+https://..., file://...)."""
    root = Path(__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    try:
        if project.is_file() and f'name = "{PACKAGE}"' in project.read_text(errors="replace"):
            return str(root)
    except OSError:
        pass
    try:
        recorded = metadata.distribution(PACKAGE).read_text("direct_url.json")
        where = json.loads(recorded) if recorded else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return None
    url = where.get("url") if isinstance(where, dict) else None
    if not isinstance(url, str):
        return None
    vcs = where.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        revision = vcs.get("requested_revision")
        return f"{vcs['vcs']}+{url}" + (f"@{revision}" if isinstance(revision, str) else "")
    return url


def pip_install(extra: str) -> str:
    """The command that adds an extra ("html", "capture", "dask", "s3", ...) to this copy of attntrace."""
    source = _source()
    if source is None:
        requirement = f"{PACKAGE}[{extra}]"
    elif "://" in source:
        requirement = f"{PACKAGE}[{extra}] @ {source}"
    else:
        requirement = f"{source}[{extra}]"
    return f"pip install {shlex.quote(requirement)}"
