"""Hostile inputs, round 7 (a probe of stdin, web servers, rank jobs and --annotate): what broke the contract,
each test failing on the code before its fix."""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import need, sample

from attntrace.cli import main
from attntrace.read import sources

NAIVE = sample("bf16_causal_fwd/naive")


def lint(*args: str) -> Any:
    return CliRunner().invoke(main, ["lint", "--format", "json", "-j1", "--fail-on", "never", *args])


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be"])
def test_a_gzipped_utf16_trace_is_read(tmp_path: Path, codec: str):
    # gzip's first bytes were sniffed for "{" or "[": a UTF-16 trace, read when plain, was refused when gzipped.
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(gzip.decompress(Path(NAIVE).read_bytes()).decode().encode(codec)))
    result = lint(str(path), NAIVE)
    assert result.exit_code == 0, result.stderr
    report = orjson.loads(result.stdout)
    assert [t["error"] for t in report["traces"]] == [None, None]
    assert len({f["rule"] for f in report["findings"] if f["trace"] == str(path)}) >= 1


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A server that answers 500 and 403, loops its redirects, drips a body a byte at a time, and serves any
    path as the same trace (as a catch-all route does)."""

    trace = gzip.decompress(Path(NAIVE).read_bytes())

    def do_GET(self) -> None:
        if self.path.startswith(("/500", "/403")):
            self.send_error(int(self.path[1:4]))
        elif self.path.startswith("/loop"):
            self.send_response(302)
            self.send_header("Location", self.path)
            self.end_headers()
        elif self.path.startswith("/drip"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.trace)))
            self.end_headers()
            try:
                for byte in self.trace[:200]:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:  # the reader gave up, as it should
                pass
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.trace)))
            self.end_headers()
            self.wfile.write(self.trace)

    do_HEAD = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hostile_server() -> Iterator[str]:
    need("aiohttp", "remote")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_web_server_answers_are_named_as_they_were(hostile_server: str):
    # A 500, a 403 and a redirect loop were all "no such object, bucket or prefix".
    result = lint(f"{hostile_server}/500.json", f"{hostile_server}/403.json", f"{hostile_server}/loop.json", NAIVE)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {hostile_server}/500.json: the server answered HTTP 500",
                                          f"error: {hostile_server}/403.json: the server answered HTTP 403",
                                          f"error: {hostile_server}/loop.json: too many redirects"]
    assert orjson.loads(result.stdout)["traces"][-1]["error"] is None


def test_a_glob_or_prefix_on_a_web_server_is_refused_not_fetched_as_one_trace(hostile_server: str):
    # A web server has no listing: the glob URL was fetched literally and, from a server that answers any path,
    # reported as one trace under the glob's name, exit 0.
    for url in (f"{hostile_server}/job/rank*.pt.trace.json", f"{hostile_server}/job/"):
        result = lint(url)
        assert result.exit_code == 2
        assert result.stderr.splitlines() == [f"error: {url}: an http(s) URL names one file: a web server has no "
                                              "listing to expand a glob or a prefix with (s3://, gs:// and az:// "
                                              "have)"]


def test_a_server_that_drips_does_not_hold_the_run(hostile_server: str, monkeypatch: pytest.MonkeyPatch):
    # One byte every 50 ms kept the 30 s read timeout from ever firing: the run hung, and the local trace beside
    # it was never reported. Each request now has a deadline (60 s; 2 s here).
    monkeypatch.setattr(sources, "HTTP_REQUEST_S", 2.0)
    started = time.monotonic()
    result = lint(f"{hostile_server}/drip.json", NAIVE)
    assert time.monotonic() - started < 60
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {hostile_server}/drip.json: the server did not answer within 30 s, or sent too "
                           "slowly")
    assert orjson.loads(result.stdout)["traces"][-1]["error"] is None


def test_an_annotated_copy_that_cannot_be_written_keeps_the_traces_findings():
    # The copy's failure made the trace an error: "1 unreadable", its findings gone. A good input is still
    # reported; the run fails (exit 2) for the output it could not write.
    if not Path("/proc/self").exists():
        pytest.skip("no /proc here to refuse a file")
    result = lint(NAIVE, "--annotate", "/proc/attntrace-annotated.json")
    assert result.exit_code == 2
    report = orjson.loads(result.stdout)
    (trace,) = report["traces"]
    assert trace["error"] is None and "cannot write" in trace["annotate_error"]
    assert {f["rule"] for f in report["findings"]} == {"AT102"}
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {NAIVE}: --annotate: cannot write") and "findings are in the report" in line


def test_a_salvaged_trace_that_cannot_be_annotated_keeps_its_findings(tmp_path: Path):
    whole = gzip.decompress(Path(NAIVE).read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: len(whole) * 9 // 10])
    result = lint(str(cut), "--salvage", "--annotate", str(tmp_path / "annotated.json"))
    assert result.exit_code == 2
    report = orjson.loads(result.stdout)
    assert report["traces"][0]["error"] is None and "cut-off" in report["traces"][0]["annotate_error"]
    assert report["findings"]


def _job(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    for name, source in files.items():
        (folder / name).write_bytes(Path(sample(source)).read_bytes())
    return folder


def test_a_rank_the_name_does_not_give_leaves_the_others_their_own(tmp_path: Path):
    # One trace without a rank in its name made --group ranks number every trace by input order: the file named
    # rank 3, the straggler, was reported as rank 0.
    folder = _job(tmp_path, {"rank-3.json.gz": "bf16_causal_fwd/sdpa_math", "rank0.json.gz": "bf16_causal_fwd/naive",
                             "rank_1.json.gz": "bf16_causal_fwd/naive", "worker.json.gz": "bf16_causal_fwd/naive"})
    job = orjson.loads(lint(str(folder), "--group", "ranks").stdout)["job"]
    assert job["slowest_ranks"][0]["rank"] == 3 and job["slowest_ranks"][0]["trace"].endswith("rank-3.json.gz")
    assert job["ranks_from_input_order"] == [2] and job["rank_from"] == "name, input order"


def test_a_rank_without_steps_is_said_in_the_job_and_every_format_has_the_job(tmp_path: Path):
    # A rank with no step markers left the step-time spread without a word (the job looked balanced), and the
    # job summary was in the text report only.
    folder = _job(tmp_path, {f"rank{n}.pt.trace.json.gz": "bf16_causal_fwd/naive" for n in range(3)})
    document = orjson.loads(gzip.decompress(Path(sample("bf16_causal_fwd/sdpa_math")).read_bytes()))
    document["traceEvents"] = [e for e in document["traceEvents"]
                               if not str(e.get("name", "")).startswith("ProfilerStep#")]
    (folder / "rank3.pt.trace.json").write_bytes(orjson.dumps(document))
    job = orjson.loads(lint(str(folder)).stdout)["job"]
    assert job["ranks_without_steps"] == [3]
    text = CliRunner().invoke(main, ["lint", str(folder), "--fail-on", "never"]).stdout
    assert "ranks without step markers, not in the step times: 3" in text
    markdown = CliRunner().invoke(main, ["lint", str(folder), "--format", "markdown", "--fail-on", "never"]).stdout
    assert "ranks without step markers, not in the step times: 3" in markdown and "job: 4 ranks" in markdown
    pytest.importorskip("plotly")
    page = CliRunner().invoke(main, ["lint", str(folder), "--format", "html", "--fail-on", "never"]).stdout
    assert "job: 4 ranks" in page and "ranks without step markers" in page


def test_a_distributed_rank_past_its_world_size_leaves_the_name_to_say_it(tmp_path: Path):
    # distributedInfo rank 5 of world size 2 is no rank of that job; the file's name, rank1, still gives one.
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "rank0.pt.trace.json.gz").write_bytes(Path(NAIVE).read_bytes())
    document = orjson.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    document["distributedInfo"] = {"backend": "nccl", "rank": 5, "world_size": 2}
    (folder / "rank1.pt.trace.json").write_bytes(orjson.dumps(document))
    job = orjson.loads(lint(str(folder), "--group", "ranks").stdout)["job"]
    assert [row["rank"] for row in job["per_rank"]] == [0, 1] and job["ranks_from_input_order"] == []
