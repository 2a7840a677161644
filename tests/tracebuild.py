"""Small traces built in tests from real event shapes: a real sample trace read as plain JSON, changed the way
another writer, PyTorch version or vendor would have written it, and written back."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson

DATA = Path(__file__).resolve().parent / "data"


def read_json(path: str | Path) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def write_json(doc: Any, path: Path, indent: bool = False) -> str:
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0))
    return str(path)


def data(name: str) -> str:
    return str(DATA / name)
