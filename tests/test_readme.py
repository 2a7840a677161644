"""Every example in the README and the docs is what the command prints today (tests/readme_examples.py), and the
README stays a guide a newcomer reads through."""

from __future__ import annotations

import re

import pytest
from readme_examples import PAGES, README, ROOT, examples, run

EXAMPLES = [(page.relative_to(ROOT).as_posix(), command, recorded)
            for page in PAGES for command, recorded in examples(page.read_text(encoding="utf-8"))]


def test_the_readme_has_examples():
    assert len(examples(README.read_text(encoding="utf-8"))) >= 3


@pytest.mark.parametrize(("page", "command", "recorded"), EXAMPLES, ids=[f"{p}:{c[:60]}" for p, c, _ in EXAMPLES])
def test_an_example_is_the_real_output(page: str, command: str, recorded: str):
    assert run(command) == recorded, f"{page} drifted from `{command}`: run python tests/readme_examples.py"


def test_the_readme_is_a_guide_not_a_work_log():
    text = README.read_text(encoding="utf-8")
    assert len(text) <= 30_000
    assert not re.search(r"\bissues? \d+", text, flags=re.IGNORECASE)


def test_every_page_the_readme_links_to_exists():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(((?!https?:)[^)#]+)", text)
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing
