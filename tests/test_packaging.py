"""The wheel carries the rule files, and a non-editable install lints with them."""

from __future__ import annotations

import shutil
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
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import attntrace.model.data as d; "
            "assert str(d.rules_dir()).startswith(sys.argv[1]), d.rules_dir(); from attntrace.cli import main; "
            "sys.argv = ['attntrace', 'lint', sys.argv[2]]; main()")
    result = subprocess.run([sys.executable, "-c", code, str(target), sample("bf16_causal_fwd/naive")], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert "AT101" in result.stdout


@pytest.mark.slow
def test_make_demo_installs_attntrace_alone_and_prints_the_short_demo(tmp_path: Path):
    """`make demo` installed torch, moto, dask and plotly (the whole dev set) and printed 2,841 lines: it installs
    `.` alone into a venv of its own and prints the README's short demo."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    venv = tmp_path / "demo-venv"
    done = subprocess.run([make, "-s", "demo", f"DEMO_VENV={venv}", f"PYTHON={sys.executable}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 100
    assert lines[-1] == "2 trace(s), 0 unreadable; causes: 0 error, 2 warning, 0 info (3 consequences inside them)"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "list",
                                "--format", "freeze"], capture_output=True, text=True, check=True).stdout.lower()
    names = {line.split("==")[0] for line in installed.splitlines()}
    assert "attntrace" in names and "polars" in names
    assert not names & {"torch", "moto", "dask", "distributed", "plotly", "pytest", "boto3"}
