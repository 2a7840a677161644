"""Hostile inputs, round 11 (issue 43, reliability): remote protocols whose backends no extra installs, and the
ends of a run that signals and dead parents reach. Each test failed before its fix."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import ROOT


def _attntrace(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.parametrize(("url", "module"), [("hf://datasets/org/name/rank0.json", "huggingface_hub"),
                                             ("sftp://host/traces/rank0.json", "paramiko")])
def test_a_protocol_no_extra_covers_names_its_backend_not_the_remote_extra(url: str, module: str):
    # It said "pip install 'attntrace[remote]'", which installs fsspec and aiohttp but not the backend, so the
    # same error came back after the install.
    if importlib.util.find_spec("fsspec") is None:
        pytest.skip("fsspec is not installed")
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    result = _attntrace("lint", url)
    assert result.returncode == 2
    line = result.stderr.splitlines()[0]
    protocol = url.split("://")[0]
    assert line.startswith(f"error: {url}: {protocol}:// needs a package that is not installed (")
    assert "[remote]" not in line and f"backend for {protocol}:// (the module {module!r})" in line


def test_without_fsspec_a_protocol_no_extra_covers_says_the_backend_is_needed_too(monkeypatch: pytest.MonkeyPatch):
    from click.testing import CliRunner

    from attntrace.cli import main

    monkeypatch.setitem(sys.modules, "fsspec", None)  # import raises ImportError
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "hf://datasets/org/name/rank0.json"])
    assert result.exit_code == 2
    line = result.stderr.splitlines()[0]
    assert "needs fsspec and its hf:// backend, which no extra of attntrace installs" in line
