"""Baselines: record today's findings by fingerprint, then fail only on findings that are new.

A fingerprint hashes the rule, the trace's identity (its path under the directory given, digit runs of its
file name folded: model/identity.py) and names (op chain, kernel), never timings, so a re-captured trace keeps
the fingerprints of its known problems and two traces never share one."""

from __future__ import annotations

from typing import Any

import orjson

from attntrace.read.buffers import read_small_file
from attntrace.report import all_findings

VERSION = 1


class BaselineError(Exception):
    """A baseline file that cannot be read or written; the message names the file."""


def dump(report: dict[str, Any]) -> bytes:
    label = {t["path"]: t.get("label") or t["path"] for t in report["traces"]}
    entries = sorted(({"fingerprint": f["fingerprint"], "rule": f["rule"], "trace": label[f["trace"]],
                       "message": f["message"]} for f in all_findings(report)),
                     key=lambda e: (e["trace"], e["rule"], e["fingerprint"]))
    unique = list({e["fingerprint"]: e for e in entries}.values())
    return orjson.dumps({"attntrace_baseline": VERSION, "findings": unique}, option=orjson.OPT_INDENT_2) + b"\n"


def load(path: str) -> dict[str, dict[str, Any]]:
    try:
        data = orjson.loads(read_small_file(path))
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read baseline ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise BaselineError(f"{path}: baseline is not valid JSON ({exc})") from exc
    version = data.get("attntrace_baseline") if isinstance(data, dict) else None
    # The integer itself: true and 1.0 equal 1 in Python, and are not a version this program wrote.
    if type(version) is not int or version != VERSION or not isinstance(data.get("findings"), list):
        raise BaselineError(f"{path}: not an attntrace baseline (write one with --write-baseline)")
    known: dict[str, dict[str, Any]] = {}
    for number, entry in enumerate(data["findings"], 1):
        where = f"{path}: baseline entry {number}"
        if not isinstance(entry, dict):
            raise BaselineError(f"{where} must be an object with a fingerprint, not {type(entry).__name__}")
        if not isinstance(entry.get("fingerprint"), str) or not entry["fingerprint"]:
            given = _kind(entry["fingerprint"]) if "fingerprint" in entry else "missing"
            raise BaselineError(f"{where}: 'fingerprint' must be a string, not {given}")
        for key in ("trace", "rule", "message"):
            if key in entry and not isinstance(entry[key], str):
                raise BaselineError(f"{where}: '{key}' must be a string, not {_kind(entry[key])}")
        known[entry["fingerprint"]] = entry
    return known


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return "empty" if not value else repr(value)
    return "null" if value is None else {"dict": "an object", "list": "a list"}.get(
        type(value).__name__, f"the {type(value).__name__} {value!r}")


def apply(report: dict[str, Any], known: dict[str, dict[str, Any]], path: str) -> None:
    """Mark each cause new or known (its consequences share its state), and list the baseline entries of the
    linted traces that are gone."""
    seen = set()
    for finding in report["findings"]:
        finding["baseline"] = "known" if finding["fingerprint"] in known else "new"
        seen.add(finding["fingerprint"])
        for consequence in finding.get("consequences", ()):
            consequence["baseline"] = "known" if consequence["fingerprint"] in known else "new"
            seen.add(consequence["fingerprint"])
    linted = {t.get("label") or t["path"] for t in report["traces"] if not t["error"]}
    # A cut-off trace (--salvage) lacks its last steps: what is missing from it is not judged, not fixed.
    cut = {t.get("label") or t["path"] for t in report["traces"] if not t["error"] and t.get("incomplete")}
    gone = [e for fp, e in sorted(known.items()) if fp not in seen and e.get("trace") in linted]
    report["baseline"] = {
        "path": path,
        "new": sum(f["baseline"] == "new" for f in report["findings"]),
        "known": sum(f["baseline"] == "known" for f in report["findings"]),
        "fixed": [e for e in gone if e.get("trace") not in cut],
    }
    if any(e.get("trace") in cut for e in gone):
        report["baseline"]["not_judged"] = [e for e in gone if e.get("trace") in cut]
