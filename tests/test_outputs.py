"""What --output, --write-baseline, --annotate and diff -o write to: never an input, through a symlink, into a
FIFO or device as it is, and a failed write is one line with exit 2."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import sample


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attntrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.pt.trace.json.gz", tmp_path / "b.pt.trace.json.gz"
    shutil.copy(sample("bf16_causal_fwd/naive"), a)
    shutil.copy(sample("bf16_causal_fwd/sdpa"), b)
    return a, b


@pytest.mark.parametrize("command", [
    ["lint", "a.pt.trace.json.gz", "b.pt.trace.json.gz", "--output", "a.pt.trace.json.gz"],
    ["lint", ".", "--format", "json", "--output", "b.pt.trace.json.gz"],
    ["lint", "a.pt.trace.json.gz", "--write-baseline", "a.pt.trace.json.gz"],
    ["summary", "a.pt.trace.json.gz", "--output", "a.pt.trace.json.gz"],
    ["diff", "a.pt.trace.json.gz", "b.pt.trace.json.gz", "--output", "b.pt.trace.json.gz"],
    ["lint", "a.pt.trace.json.gz", "--annotate", "a.pt.trace.json.gz"],
])
def test_an_input_is_never_written_over(traces: tuple[Path, Path], command: list[str]) -> None:
    before = [_digest(p) for p in traces]
    done = _run(*command, cwd=traces[0].parent)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "input" in done.stderr and done.stderr.strip().count("\n") <= 1, done.stderr
    assert [_digest(p) for p in traces] == before


def test_what_else_the_run_read_is_never_written_over(traces: tuple[Path, Path]) -> None:
    # The config, the baseline, pyproject.toml, and a trace given on stdin named again as /dev/stdin.
    folder = traces[0].parent
    (folder / "pyproject.toml").write_text('[tool.attntrace]\nselect = ["AT1"]\n')
    (folder / "c.toml").write_text('[tool.attntrace]\nselect = ["AT1"]\n')
    _run("lint", "a.pt.trace.json.gz", "--write-baseline", "bl.json", "--fail-on", "never", cwd=folder)
    kept = {p: _digest(p) for p in folder.iterdir() if p.is_file()}
    for command in (["--config", "c.toml", "--output", "c.toml"], ["--output", "pyproject.toml"],
                    ["--baseline", "bl.json", "--output", "bl.json"]):
        done = _run("lint", "a.pt.trace.json.gz", *command, cwd=folder)
        assert done.returncode == 2 and "one of the inputs" in done.stderr, (command, done.stderr)
    with traces[0].open("rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "attntrace", "lint", "-", "--output", "/dev/stdin"],
                              stdin=stdin, cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "one of the inputs" in done.stderr
    assert {p: _digest(p) for p in kept} == kept


@pytest.mark.parametrize("second", ["--write-baseline", "--annotate"])
def test_two_outputs_at_one_file_are_refused_before_the_run(traces: tuple[Path, Path], second: str) -> None:
    done = _run("lint", "a.pt.trace.json.gz", "--output", "out", second, "out", cwd=traces[0].parent)
    assert done.returncode == 2 and "name the same file" in done.stderr and done.stderr.count("\n") == 1
    assert not (traces[0].parent / "out").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("command", [["lint", "a.pt.trace.json.gz"], ["lint", "a.pt.trace.json.gz", "--format", "json"],
                                     ["summary", "a.pt.trace.json.gz"], ["rules"]])
def test_stdout_that_cannot_be_written_is_one_line(traces: tuple[Path, Path], command: list[str]) -> None:
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-m", "attntrace", *command], stdout=full, stderr=subprocess.PIPE,
                              cwd=traces[0].parent, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "No space left" in done.stderr


def test_a_symlink_is_written_through(traces: tuple[Path, Path]) -> None:
    folder = traces[0].parent
    (folder / "report.json").write_text("old")
    (folder / "latest.json").symlink_to("report.json")
    done = _run("lint", "a.pt.trace.json.gz", "--format", "json", "--output", "latest.json", cwd=folder)
    assert done.returncode == 1, done.stderr
    assert (folder / "latest.json").is_symlink() and (folder / "report.json").read_text().startswith("{")


def test_a_fifo_stays_a_fifo_and_gets_the_report(traces: tuple[Path, Path]) -> None:
    fifo = traces[0].parent / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    # A daemon: if the FIFO were replaced by a file, the reader would wait on it forever, not hold up pytest.
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = _run("lint", "a.pt.trace.json.gz", "--format", "json", "--output", "pipe", cwd=fifo.parent)
    reader.join(timeout=60)
    assert done.returncode == 1, done.stderr
    assert fifo.is_fifo() and got and got[0].startswith(b"{")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_full_device_is_one_line_and_exit_2(traces: tuple[Path, Path]) -> None:
    done = _run("lint", "a.pt.trace.json.gz", "--output", "/dev/full", cwd=traces[0].parent)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "/dev/full" in done.stderr and Path("/dev/full").is_char_device()


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_control_characters_in_a_file_name_cannot_start_a_line(tmp_path: Path, fmt: str) -> None:
    # A newline in a name would let it write its own line: "::error ..." in a workflow log is a command.
    name = "x\n::error title=INJECTED::pwned\n\x1b[31m.pt.trace.json.gz"
    shutil.copy(sample("bf16_causal_fwd/naive"), tmp_path / name)
    done = _run("lint", ".", "--format", fmt, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert not any(line.startswith("::error") for line in done.stdout.splitlines())
    assert "\x1b" not in done.stdout and "x\\n::error" in done.stdout


def test_a_pipe_or_backtick_in_a_file_name_stays_inside_its_markdown_cell(tmp_path: Path) -> None:
    shutil.copy(sample("bf16_causal_fwd/naive"), tmp_path / "md|pipe`tick<b>.pt.trace.json.gz")
    done = _run("lint", ".", "--format", "markdown", cwd=tmp_path)
    row = next(line for line in done.stdout.splitlines() if "pipe" in line and "NVIDIA" in line)
    assert "``./md\\|pipe`tick<b>.pt.trace.json.gz``" in row
    assert row.replace("\\|", "").count("|") == 9  # 8 cells


def test_an_existing_file_is_no_directory_for_annotated_copies(traces: tuple[Path, Path]) -> None:
    (traces[0].parent / "plainfile").write_text("x")
    done = _run("lint", "a.pt.trace.json.gz", "b.pt.trace.json.gz", "--annotate", "plainfile", cwd=traces[0].parent)
    assert done.returncode == 2 and "must be a directory" in done.stderr and done.stderr.count("\n") == 1
