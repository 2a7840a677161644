"""Settings for lint: CLI flags first, then --config or [tool.attntrace] in the nearest pyproject.toml,
then each rule's defaults.

    [tool.attntrace]
    select = ["AT1", "AT201"]
    ignore = ["AT401"]
    fail-on = "warning"
    [tool.attntrace.rules.AT101]
    min_bytes = 4194304
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attntrace.catalog import Rule, resolve

FAIL_ON = ("error", "warning", "info", "never")


class ConfigError(Exception):
    """Bad settings; the message is one line and names where they came from."""


@dataclass(frozen=True)
class Settings:
    enabled: tuple[str, ...]
    params: dict[str, dict[str, Any]]
    fail_on: str = "warning"
    severity: dict[str, str] = field(default_factory=dict)


def find_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if path.name == "pyproject.toml" or "tool" in data:
        data = data.get("tool", {}).get("attntrace", {})
    return data


def build(rules: dict[str, Rule], file_config: dict[str, Any], source: str, select: list[str],
          ignore: list[str], sets: list[str], fail_on: str | None) -> Settings:
    try:
        chosen = select or _as_list(file_config.get("select")) or ["ALL"]
        dropped = ignore or _as_list(file_config.get("ignore"))
        enabled = {rid for token in chosen for rid in resolve(token, rules)}
        enabled -= {rid for token in dropped for rid in resolve(token, rules)}
        params = {rid: {p.name: p.default for p in r.parameters.values()} for rid, r in rules.items()}
        for rid, overrides in (file_config.get("rules") or {}).items():
            for name, value in overrides.items():
                if name == "severity":
                    continue
                params[_one(rid, rules)][name] = rules[_one(rid, rules)].coerce(name, value)
        for item in sets:
            key, sep, value = item.partition("=")
            rid, dot, name = key.partition(".")
            if not sep or not dot:
                raise ValueError(f"--set {item!r} must look like RULE.param=VALUE")
            params[_one(rid, rules)][name] = rules[_one(rid, rules)].coerce(name, value)
        severity = {_one(rid, rules): str(o["severity"]) for rid, o in (file_config.get("rules") or {}).items()
                    if "severity" in o}
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    level = fail_on or file_config.get("fail-on") or file_config.get("fail_on") or "warning"
    if level not in FAIL_ON:
        raise ConfigError(f"{source}: fail-on must be one of {', '.join(FAIL_ON)}, not {level!r}")
    return Settings(tuple(sorted(enabled)), params, level, severity)


def _one(rid: str, rules: dict[str, Rule]) -> str:
    hits = resolve(rid, rules)
    if len(hits) != 1:
        raise ValueError(f"{rid!r} names {len(hits)} rules, not one")
    return hits[0]


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v for v in value.split(",") if v.strip()]
    return [str(v) for v in value]
