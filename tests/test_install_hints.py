"""The tool's install hints name where this attntrace came from: `pip install 'attntrace[html]'` found nothing
(attntrace is not on PyPI)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from attntrace import install


def test_a_checkout_names_its_own_directory():
    assert install.pip_install("html") == f"pip install '{ROOT}[html]'"


class _Installed:
    def __init__(self, direct_url: dict[str, Any] | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        return json.dumps(self.direct_url) if name == "direct_url.json" and self.direct_url else None


@pytest.mark.parametrize(("direct_url", "hint"), [
    ({"url": "https://github.com/org/attntrace", "vcs_info": {"vcs": "git", "commit_id": "ab12",
                                                              "requested_revision": "v0.1.0"}},
     "pip install 'attntrace[dask] @ git+https://github.com/org/attntrace@v0.1.0'"),
    ({"url": "file:///home/me/attntrace", "dir_info": {}}, "pip install 'attntrace[dask] @ file:///home/me/attntrace'"),
    (None, "pip install 'attntrace[dask]'"),  # where pip recorded nothing: the name is all there is
])
def test_an_installed_copy_names_the_url_pip_installed_it_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               direct_url: dict[str, Any] | None, hint: str):
    """As installed in site-packages (no pyproject.toml beside the package), with pip's record of its source."""
    monkeypatch.setattr(install, "__file__", str(tmp_path / "site-packages" / "attntrace" / "install.py"))
    monkeypatch.setattr(metadata, "distribution", lambda name: _Installed(direct_url))
    install._source.cache_clear()
    try:
        assert install.pip_install("dask") == hint
    finally:
        install._source.cache_clear()
