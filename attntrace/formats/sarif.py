"""SARIF 2.1.0 for GitHub code scanning: the rule catalogue as tool.driver.rules, one result per cause; the
consequences its fix also removes are its relatedLocations, each message naming the consequence's rule and
fingerprint, and are listed in its properties."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from attntrace import __version__
from attntrace.checks.catalog import Rule

LEVEL = {"error": "error", "warning": "warning", "info": "note"}
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _rule(rule: Rule) -> dict[str, Any]:
    docs = rule.docs
    markdown = (f"**What it detects**\n\n{docs['what']}\n\n**Why it is slow**\n\n{docs['why']}\n\n"
                f"**Example**\n\n```python\n{docs['example']}\n```\n\n**Fix**\n\n{docs['fix']}")
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": docs["what"]},
        "help": {"text": f"{docs['why']}\n\nFix: {docs['fix']}", "markdown": markdown},
        "defaultConfiguration": {"level": LEVEL[rule.severity]},
        "properties": {"parameters": {p.name: p.default for p in rule.parameters.values()}},
    }


def _uri(path: str) -> str:
    """A path as SARIF's uri (a URI reference): spaces, '#', '%' and control characters percent-encoded; a URL's
    scheme and the path's slashes kept."""
    return quote(path, safe="/:@")


def _result(finding: dict[str, Any], rule_index: dict[str, int]) -> dict[str, Any]:
    where = finding["where"]
    locations: list[dict[str, Any]] = [{
        "physicalLocation": {"artifactLocation": {"uri": _uri(finding["trace"])}},
        **({"logicalLocations": [{"fullyQualifiedName": where["op_chain"], "kind": "function"}]}
           if where.get("op_chain") else {}),
    }]
    source = where.get("source")
    if source:
        # The user's code that led to the op comes first: that is where code scanning shows the alert.
        locations.insert(0, {"physicalLocation": {"artifactLocation": {"uri": _uri(source["file"])},
                                                  "region": {"startLine": source["line"]}},
                             "message": {"text": f"in {source['function']}()"}})
    result: dict[str, Any] = {
        "ruleId": finding["rule"],
        "ruleIndex": rule_index[finding["rule"]],
        "level": LEVEL[finding["severity"]],
        "message": {"text": f"{finding['message']}. Fix: {finding['fix']}"},
        "locations": locations,
        "partialFingerprints": {"attntrace/v1": finding["fingerprint"]},
        "properties": {"evidence": finding["evidence"], "impact": finding["impact"],
                       "trace": finding["trace"]},
    }
    consequences = finding.get("consequences", ())
    if consequences:
        result["relatedLocations"] = [
            {"id": n, "physicalLocation": {"artifactLocation": {"uri": _uri(c["trace"])}},
             "message": {"text": f"{c['rule']} {c['name']} (counted in this cause, fingerprint {c['fingerprint']}): "
                                 f"{c['message']}"}}
            for n, c in enumerate(consequences, 1)]
        result["properties"]["consequences"] = [
            {"rule": c["rule"], "severity": c["severity"], "message": c["message"], "impact": c["impact"],
             "fingerprint": c["fingerprint"]} for c in consequences]
    if "baseline" in finding:
        result["baselineState"] = "new" if finding["baseline"] == "new" else "unchanged"
    return result


def render(report: dict[str, Any], rules: dict[str, Rule]) -> dict[str, Any]:
    ordered = sorted(rules)
    index = {rid: i for i, rid in enumerate(ordered)}
    artifacts = [{"location": {"uri": _uri(t["path"])}} for t in report["traces"]]  # as the results name them
    invocation: dict[str, Any] = {"executionSuccessful": report["summary"]["errors"] == 0}
    errors = [t for t in report["traces"] if t["error"]]
    if errors:
        invocation["toolExecutionNotifications"] = [
            {"level": "error", "message": {"text": f"{t['path']}: {t['error']['message']}"}} for t in errors]
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "attntrace", "version": __version__, "semanticVersion": __version__,
                                "informationUri": "https://github.com/attntrace/attntrace",
                                "rules": [_rule(rules[rid]) for rid in ordered]}},
            "artifacts": artifacts,
            "invocations": [invocation],
            "results": [_result(f, index) for f in report["findings"]],
        }],
    }
