"""The wheel carries the rule files, and a non-editable install lints with them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, sample


@pytest.mark.slow
def test_wheel_ships_rules_and_lints(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("attntrace-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for rule in sorted(p.name for p in (ROOT / "rules").glob("*.toml")):
        assert f"attntrace/_rules/{rule}" in names
    # Install the wheel alone into a folder that shadows the editable checkout on sys.path.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import attntrace.data as d; "
            "assert str(d.rules_dir()).startswith(sys.argv[1]), d.rules_dir(); from attntrace.cli import main; "
            "sys.argv = ['attntrace', 'lint', sys.argv[2]]; main()")
    result = subprocess.run([sys.executable, "-c", code, str(target), sample("bf16_causal_fwd/naive")], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert "AT101" in result.stdout
