"""The list of checks comes from rules/: every rule file has a detector module and every detector a rule file,
named alike (AT101 hidden-copy <-> checks/at101_hidden_copy.py)."""

from __future__ import annotations

from pathlib import Path

from attntrace.checks import CHECKS
from attntrace.checks.catalog import load_rules

CHECKS_DIR = Path(__file__).resolve().parent.parent / "attntrace" / "checks"


def test_every_rule_file_has_a_detector_and_every_detector_a_rule_file():
    assert set(CHECKS) == set(load_rules())


def test_detector_modules_are_named_for_their_rule():
    rules = load_rules()
    modules = {p.stem for p in CHECKS_DIR.glob("at[0-9][0-9][0-9]_*.py")}
    assert modules == {f"{rid.lower()}_{rule.name.replace('-', '_')}" for rid, rule in rules.items()}


def test_rule_groups_are_documented():
    readme = (Path(__file__).resolve().parent.parent / "rules" / "README.md").read_text()
    for group in {rid[:3] for rid in load_rules()}:
        assert f"{group}xx" in readme
