"""URLs as inputs: a real S3 API on localhost (moto's server mode) with a job's rank traces, a missing key, a
bucket the credentials may not read and a prefix of thousands of small objects; http(s):// and file:// too."""

from __future__ import annotations

import gzip
import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLES, need, sample

# Rank 3 is another program, so that grouped findings miss a rank.
RANK_SAMPLES = ["bf16_causal_fwd/naive"] * 3 + ["bf16_causal_fwd/sdpa_math"]
SMALL_TRACES, SMALL_LOGS = 400, 1700  # 2,100 objects under one prefix: more than one listing page (1,000)
WRONG_SECRET = "wrong-secret-key-never-printed"


def _tiny_trace(step: int) -> bytes:
    event = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
             "ts": step * 100, "dur": 50 + step % 7}
    return gzip.compress(json.dumps({"traceEvents": [event]}).encode(), mtime=0)


def _fill(endpoint: str, admin: dict[str, str]) -> dict[str, str]:
    """Buckets and an IAM user allowed to read `traces` and `many` but not `locked`; then switch moto's
    authorisation on. Returns the user's environment."""
    import boto3

    session = boto3.session.Session(aws_access_key_id=admin["AWS_ACCESS_KEY_ID"],
                                    aws_secret_access_key=admin["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    s3 = session.client("s3", endpoint_url=endpoint)
    for bucket in ("traces", "locked", "many"):
        s3.create_bucket(Bucket=bucket)
    for rank, name in enumerate(RANK_SAMPLES):
        s3.put_object(Bucket="traces", Key=f"job-1/rank{rank}.pt.trace.json.gz", Body=Path(sample(name)).read_bytes())
    s3.put_object(Bucket="traces", Key="job-1/notes.txt", Body=b"not a trace")
    whole = Path(sample("bf16_causal_fwd/naive")).read_bytes()
    s3.put_object(Bucket="traces", Key="broken/cut.pt.trace.json.gz", Body=whole[: len(whole) // 2])
    s3.put_object(Bucket="traces", Key="broken/plain.json", Body=gzip.decompress(whole))
    s3.put_object(Bucket="locked", Key="rank0.pt.trace.json.gz", Body=whole)
    objects = [(f"small/step{i:05d}.json.gz", _tiny_trace(i)) for i in range(SMALL_TRACES)]
    objects += [(f"small/step{i:05d}.log", b"log line\n") for i in range(SMALL_LOGS)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket="many", Key=kv[0], Body=kv[1]), objects))

    iam = session.client("iam", endpoint_url=endpoint)
    iam.create_user(UserName="linter")
    readable = ["arn:aws:s3:::traces", "arn:aws:s3:::traces/*", "arn:aws:s3:::many", "arn:aws:s3:::many/*"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                                                      "Resource": readable}]}
    iam.put_user_policy(UserName="linter", PolicyName="read-traces", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="linter")["AccessKey"]
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=10):
        pass
    return {**admin, "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


@pytest.fixture(scope="module")
def s3_env(s3_server: dict[str, str]) -> dict[str, str]:
    return _fill(s3_server["AWS_ENDPOINT_URL"], s3_server)


def attntrace(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # A fresh process per run: backends read their credentials from the environment when they start.
    return subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600, check=False)


def _findings(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(Path(f["trace"]).name, f["rule"], f["fingerprint"]) for f in report["findings"]]


def test_a_prefix_is_linted_like_a_directory_with_the_same_findings(s3_env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    # A folder named as the prefix is: traces are known by it and their names below it (model/identity.py).
    folder = tmp_path / "job-1"
    folder.mkdir()
    for rank, name in enumerate(RANK_SAMPLES):
        (folder / f"rank{rank}.pt.trace.json.gz").write_bytes(Path(sample(name)).read_bytes())
    remote = attntrace(s3_env, "lint", "s3://traces/job-1/", "--format", "json", "--fail-on", "never")
    local = attntrace({}, "lint", str(folder), "--format", "json", "--fail-on", "never")
    assert remote.returncode == 0, remote.stderr
    report, expected = json.loads(remote.stdout), json.loads(local.stdout)
    assert [t["path"] for t in report["traces"]] == [f"s3://traces/job-1/rank{r}.pt.trace.json.gz"
                                                     for r in range(4)]
    assert _findings(report) == _findings(expected) and report["findings"]
    assert [t["summary"] for t in report["traces"]] == [t["summary"] for t in expected["traces"]]


def test_a_glob_expands_to_the_matching_objects_in_order(s3_env: dict[str, str]) -> None:
    run = attntrace(s3_env, "summary", "s3://traces/job-1/rank[12]*.json.gz", "--format", "json")
    assert run.returncode == 0, run.stderr
    assert [t["path"] for t in json.loads(run.stdout)["traces"]] == [
        "s3://traces/job-1/rank1.pt.trace.json.gz", "s3://traces/job-1/rank2.pt.trace.json.gz"]


def test_a_missing_key_is_one_line_naming_the_url_and_the_rest_is_analysed(s3_env: dict[str, str]) -> None:
    run = attntrace(s3_env, "lint", "s3://traces/job-1/rank0.pt.trace.json.gz", "s3://traces/job-1/absent.json",
                    "--format", "json", "--fail-on", "never")
    assert run.returncode == 2
    assert run.stderr.splitlines() == ["error: s3://traces/job-1/absent.json: no such object, bucket or prefix"]
    traces = json.loads(run.stdout)["traces"]
    assert [t["error"] is None for t in traces] == [True, False]


def test_a_denied_bucket_is_one_line_and_no_credential_is_printed(s3_env: dict[str, str]) -> None:
    for target in ("s3://locked/rank0.pt.trace.json.gz", "s3://locked/"):
        run = attntrace(s3_env, "lint", target, "--format", "json")
        assert run.returncode == 2
        [line] = run.stderr.splitlines()
        assert line.startswith(f"error: {target}: access denied while listing")
        assert s3_env["AWS_SECRET_ACCESS_KEY"] not in run.stdout + run.stderr


def test_a_wrong_secret_key_is_one_line_and_not_printed(s3_env: dict[str, str]) -> None:
    run = attntrace({**s3_env, "AWS_SECRET_ACCESS_KEY": WRONG_SECRET}, "lint", "s3://traces/job-1/")
    assert run.returncode == 2
    [line] = run.stderr.splitlines()
    assert line.startswith("error: s3://traces/job-1/: ")
    assert WRONG_SECRET not in run.stdout + run.stderr


def test_max_size_and_gzip_are_handled_as_for_local_files(s3_env: dict[str, str]) -> None:
    remote = attntrace(s3_env, "lint", "s3://traces/job-1/rank0.pt.trace.json.gz", "--max-size", "20K")
    local = attntrace({}, "lint", sample("bf16_causal_fwd/naive"), "--max-size", "20K")
    assert remote.returncode == local.returncode == 2
    assert remote.stderr.split(": ", 2)[2] == local.stderr.split(": ", 2)[2]
    assert "past the limit of 20480 bytes (--max-size)" in remote.stderr
    run = attntrace(s3_env, "lint", "s3://traces/broken/plain.json", "--max-size", "50K")
    assert run.returncode == 2 and "90049 bytes is over the limit of 51200 bytes (--max-size)" in run.stderr
    run = attntrace(s3_env, "lint", "s3://traces/broken/cut.pt.trace.json.gz")
    assert run.returncode == 2
    assert run.stderr.splitlines() == ["error: s3://traces/broken/cut.pt.trace.json.gz: gzip stream is cut off "
                                       "(--salvage analyses the complete events)"]
    salvaged = attntrace(s3_env, "lint", "s3://traces/broken/cut.pt.trace.json.gz", "--salvage", "--format", "json",
                         "--fail-on", "never")
    assert salvaged.returncode == 0 and json.loads(salvaged.stdout)["traces"][0]["incomplete"] is True


def test_thousands_of_small_objects_under_a_prefix(s3_env: dict[str, str]) -> None:
    run = attntrace(s3_env, "lint", "s3://many/small", "--format", "json", "--fail-on", "never", "-j", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    traces = json.loads(run.stdout)["traces"]
    assert [t["path"] for t in traces] == [f"s3://many/small/step{i:05d}.json.gz" for i in range(SMALL_TRACES)]
    assert all(t["error"] is None and t["steps"] == 1 for t in traces)


def test_diff_reads_urls(s3_env: dict[str, str]) -> None:
    run = attntrace(s3_env, "diff", "s3://traces/job-1/rank0.pt.trace.json.gz", sample("bf16_causal_fwd/naive"),
                    "--format", "json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["comparisons"][0]["errors"] == []


@pytest.fixture
def web_server() -> Any:
    need("aiohttp", "remote")
    handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(SAMPLES)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_and_file_urls_give_the_local_findings(web_server: str) -> None:
    local = attntrace({}, "lint", sample("bf16_causal_fwd/naive"), "--format", "json", "--fail-on", "never")
    for url in (f"{web_server}/bf16_causal_fwd/naive.pt.trace.json.gz", Path(sample("bf16_causal_fwd/naive")).as_uri()):
        run = attntrace({}, "lint", url, "--format", "json", "--fail-on", "never")
        assert run.returncode == 0, run.stderr
        assert _findings(json.loads(run.stdout)) == _findings(json.loads(local.stdout))
    missing = attntrace({}, "lint", f"{web_server}/absent.json")
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [f"error: {web_server}/absent.json: no such object, bucket or prefix"]


class _NoLength(http.server.BaseHTTPRequestHandler):
    """Serves a trace without Content-Length, closing the connection at its end, as a streaming server does."""

    protocol_version = "HTTP/1.0"
    body = gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_stream_of_unknown_length_is_cut_at_max_size() -> None:
    need("aiohttp", "remote")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoLength)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/stream.json"
    try:
        refused = attntrace({}, "lint", url, "--max-size", "50K")
        whole = attntrace({}, "lint", url, "--format", "json", "--fail-on", "never")
    finally:
        server.shutdown()
        server.server_close()
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [f"error: {url}: more than 51200 bytes, the limit (--max-size)"]
    assert whole.returncode == 0 and json.loads(whole.stdout)["traces"][0]["events"] > 0


def test_a_protocol_without_its_package_names_the_extra_and_an_unknown_one_is_refused() -> None:
    if importlib.util.find_spec("gcsfs"):
        pytest.skip("gcsfs is installed")
    run = attntrace({}, "lint", "gs://bucket/rank0.json", "foo://host/rank0.json")
    assert run.returncode == 2
    gcs, foo = run.stderr.splitlines()
    assert gcs.startswith("error: gs://bucket/rank0.json: gs:// needs a package that is not installed")
    from attntrace.install import pip_install

    assert gcs.endswith(pip_install("gcs"))
    assert foo.startswith("error: foo://host/rank0.json: foo:// is not a protocol fsspec knows")


def test_a_password_in_a_url_is_refused_without_printing_it() -> None:
    run = attntrace({}, "lint", "https://user:hunter2@127.0.0.1:9/trace.json")
    assert run.returncode == 2
    assert "hunter2" not in run.stderr and "https://user:***@127.0.0.1:9/trace.json" in run.stderr


def test_plain_lint_imports_neither_fsspec_nor_dask() -> None:
    code = ("import sys\nfrom attntrace.cli import main\n"
            f"try:\n    main(['lint', {sample('naive')!r}, '--fail-on', 'never', '-j', '1'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 's3fs', 'dask', 'distributed')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines()[-1] == "[]"
