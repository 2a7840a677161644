"""The README's and docs' examples are real output: each fenced block after a `<!-- example -->` line holds one or
more `$ attntrace ...` commands, each followed by what it prints, run from the repository's root at 100 columns.
tests/test_readme.py checks them; regenerate them all after a change of output (review the diff before committing):

    python tests/readme_examples.py
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Every page whose examples are generated: the README and the docs it points to.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- example -->"
BLOCK = re.compile(re.escape(MARK) + r"\n```\n(.*?)```\n", re.DOTALL)
ENV = {"COLUMNS": "100", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}


def run(command: str) -> str:
    """What `$ attntrace ...` prints (stdout), run as a user would, in a process of its own."""
    args = shlex.split(command)
    assert args[0] == "attntrace", command
    done = subprocess.run([sys.executable, "-m", "attntrace", *args[1:]], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **ENV}, timeout=600)
    return done.stdout


def examples(text: str) -> list[tuple[str, str]]:
    """(command, recorded output) of every example in one page, in order."""
    found = []
    for block in BLOCK.findall(text):
        parts = re.split(r"^\$ (.*)\n", block, flags=re.MULTILINE)
        found += [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    return found


def regenerate(text: str) -> str:
    def block(match: re.Match[str]) -> str:
        commands = re.findall(r"^\$ (.*)$", match.group(1), flags=re.MULTILINE)
        body = "".join(f"$ {c}\n{run(c)}" for c in commands)
        return f"{MARK}\n```\n{body}```\n"

    return BLOCK.sub(block, text)


if __name__ == "__main__":
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if MARK in text:
            page.write_text(regenerate(text), encoding="utf-8")
            print(f"{page.relative_to(ROOT)}: {len(examples(page.read_text(encoding='utf-8')))} example(s) regenerated")
