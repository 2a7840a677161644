from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
CORPUS = ROOT.parent / "shared" / "corpus" / "peer"


def sample(name: str) -> str:
    return str(SAMPLES / f"{name}.pt.trace.json.gz")


@pytest.fixture(scope="session")
def corpus_files() -> list[Path]:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus/peer is absent")
    return sorted(p for p in CORPUS.iterdir() if p.name.endswith((".json", ".json.gz")))
