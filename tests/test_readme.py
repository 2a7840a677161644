"""Every README example is what the command prints today (tests/readme_examples.py)."""

from __future__ import annotations

import pytest
from readme_examples import README, examples, run

EXAMPLES = examples(README.read_text(encoding="utf-8"))


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize(("command", "recorded"), EXAMPLES, ids=[c[:60] for c, _ in EXAMPLES])
def test_a_readme_example_is_the_real_output(command: str, recorded: str):
    assert run(command) == recorded, f"README drifted from `{command}`: run python tests/readme_examples.py"
