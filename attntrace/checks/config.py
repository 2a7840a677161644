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

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attntrace.checks.catalog import SEVERITIES, Rule, load_rules, resolve
from attntrace.model.replay import COST_NAMES
from attntrace.read.buffers import read_small_file

FAIL_ON = ("error", "warning", "info", "never")


class ConfigError(ValueError):
    """Bad settings; the message is one line and names where they came from."""


@dataclass(frozen=True)
class Settings:
    enabled: tuple[str, ...]
    params: dict[str, dict[str, Any]]
    fail_on: str = "warning"
    severity: dict[str, str] = field(default_factory=dict)
    # [tool.attntrace.profiler_cost]: the profiler's CPU cost per event measured on the user's machine
    # (`attntrace run --calibrate-profiler`); empty: the defaults in attntrace/profiler_cost.toml.
    profiler_cost: dict[str, Any] = field(default_factory=dict)


def find_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


PROFILER_TABLE = "[tool.attntrace.profiler_cost]"


def write_profiler_costs(pyproject: Path, toml_text: str) -> None:
    """Put `[tool.attntrace.profiler_cost]` (and its measured_on sub-table) into a pyproject.toml: an earlier
    measurement's tables are replaced where they stood, other content is kept byte for byte; a missing file is
    created. `toml_text` starts with the PROFILER_TABLE header (attntrace.capture.profiler_cost.to_toml)."""
    lines = pyproject.read_text().splitlines(keepends=True) if pyproject.exists() else []
    kept: list[str] = []
    at: int | None = None
    inside = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped.startswith(PROFILER_TABLE[:-1])  # the table and its sub-tables
            if inside and at is None:
                at = len(kept)
        if not inside:
            kept.append(line)
    if at is None:
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        at = len(kept)
        toml_text = ("\n" if kept else "") + toml_text
    kept[at:at] = [toml_text if toml_text.endswith("\n") else toml_text + "\n"]
    text = "".join(kept)
    tomllib.loads(text)  # never leave a file that no longer parses
    pyproject.write_text(text)


def read_config_file(path: Path) -> dict[str, Any]:
    """The [tool.attntrace] table of a pyproject.toml (or the whole of another TOML file), checked against
    the shape settings take, so that a wrong one is one line naming the file and key before any analysis."""
    try:
        data = tomllib.loads(read_small_file(path).decode())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read settings ({exc.strerror or exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from exc
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{path}: not valid TOML (nested too deeply)") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits for int(): tomllib raises it as it is
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: 'tool' must be a table, not {_kind(tool)}")
    if path.name == "pyproject.toml" or "attntrace" in tool:
        if path.name != "pyproject.toml" and set(data) & set(KEYS):
            # Both places hold settings: which one was meant is a guess.
            raise ConfigError(f"{path}: settings both at the top level and in [tool.attntrace]; keep one place")
        data = tool.get("attntrace", {})
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: 'tool.attntrace' must be a table, not {_kind(data)}")
        prefix = "tool.attntrace."
    else:  # a settings file of its own: its top level, beside other tools' and a pyproject's tables
        data = {key: value for key, value in data.items() if key not in PYPROJECT_TABLES}
        prefix = ""
    validate(data, str(path), prefix)
    try:
        _one_table_per_rule(data.get("rules") or {}, load_rules())
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return data


# A pyproject.toml's own tables, which a copy of one under another name (--config ci.toml) holds beside ours.
PYPROJECT_TABLES = ("tool", "project", "build-system", "dependency-groups")


KEYS = ("select", "ignore", "fail-on", "fail_on", "rules", "profiler_cost", "min_saving_share")
PROFILER_COSTS = (*COST_NAMES, "launch_call_us")


def validate(data: dict[str, Any], source: str, prefix: str = "") -> None:
    """Check the shape of the settings (not the rule ids, which build() checks against the catalogue)."""
    def wrong(key: str, expected: str, value: Any) -> ConfigError:
        return ConfigError(f"{source}: '{prefix}{key}' must be {expected}, not {_kind(value)}")

    if "fail-on" in data and "fail_on" in data:  # two spellings of one setting: which one wins is a guess
        raise ConfigError(f"{source}: '{prefix}fail-on' and '{prefix}fail_on' are the same setting; keep one")
    for key, value in data.items():
        if key not in KEYS:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}' (known: select, ignore, fail-on, rules, "
                              "profiler_cost, min_saving_share)")
        if key in ("select", "ignore"):
            if isinstance(value, list):
                # The element that is wrong, not the list ("must be a list of rule ids, not a list").
                odd = next((v for v in value if not isinstance(v, str)), None)
                if odd is not None:
                    raise ConfigError(f"{source}: '{prefix}{key}' must be a list of rule ids, names or prefixes, "
                                      f"not a list holding {_kind(odd)}")
            elif not isinstance(value, str):
                raise wrong(key, "a list of rule ids, names or prefixes", value)
        elif key in ("fail-on", "fail_on"):
            if not isinstance(value, str) or value not in FAIL_ON:
                raise wrong(key, f"one of {', '.join(FAIL_ON)}", value)
        elif key == "profiler_cost":
            if not isinstance(value, dict):
                raise wrong(key, "a table of costs (cpu_op_us = 2.0, ...)", value)
            for name, cost in value.items():
                if name == "measured_on":
                    if not isinstance(cost, dict):
                        raise wrong(f"{key}.{name}", "a table", cost)
                elif name not in PROFILER_COSTS:
                    raise ConfigError(f"{source}: unknown key '{prefix}{key}.{name}' (known: "
                                      f"{', '.join(PROFILER_COSTS)}, measured_on)")
                elif isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < 1e6:
                    raise wrong(f"{key}.{name}", "microseconds, a number from 0", cost)
        elif key == "rules":
            if not isinstance(value, dict):
                raise wrong(key, "a table of rules ([tool.attntrace.rules.AT101])", value)
            for rule, overrides in value.items():
                if not isinstance(overrides, dict):
                    raise wrong(f"rules.{rule}", "a table of parameters (e.g. min_bytes = 4194304)", overrides)
                severity = overrides.get("severity")
                if severity is not None and severity not in SEVERITIES:
                    raise wrong(f"rules.{rule}.severity", f"one of {', '.join(SEVERITIES)}", severity)


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return {"dict": "a table", "list": "a list"}.get(type(value).__name__, type(value).__name__)


# An id or id prefix (AT1, AT101); anything else must be a rule's name or ALL.
_ID_PREFIX = re.compile(r"^AT\d{0,3}$", re.IGNORECASE)


def selected(token: str, rules: dict[str, Rule]) -> list[str]:
    """The rules a --select/--ignore token names; an unknown id, name or prefix is an error, as in ruff (a stray
    letter must not match every rule)."""
    text = token.strip()
    if text.upper() != "ALL" and not _ID_PREFIX.match(text) and text.lower() not in {r.name for r in rules.values()}:
        raise ValueError(f"unknown rule {text!r} (rule ids look like AT101 or a prefix such as AT1; "
                         "attntrace rules lists them)")
    return resolve(text, rules)


def build(rules: dict[str, Rule], file_config: dict[str, Any], source: str, select: list[str],
          ignore: list[str], sets: list[str], fail_on: str | None) -> Settings:
    for option, tokens in (("--select", select), ("--ignore", ignore)):
        for token in tokens:
            try:
                selected(token, rules)
            except ValueError as exc:
                raise ConfigError(f"{option}: {exc}") from exc
    try:
        chosen = select or _as_list(file_config.get("select")) or ["ALL"]
        dropped = ignore or _as_list(file_config.get("ignore"))
        enabled = {rid for token in chosen for rid in selected(token, rules)}
        enabled -= {rid for token in dropped for rid in selected(token, rules)}
        params = {rid: {p.name: p.default for p in r.parameters.values()} for rid, r in rules.items()}
        if "min_saving_share" in file_config:  # one threshold for every rule; a rule's own table overrides it
            for rid, rule in rules.items():
                params[rid]["min_saving_share"] = rule.coerce("min_saving_share", file_config["min_saving_share"])
        for rid, overrides in (file_config.get("rules") or {}).items():
            if not isinstance(overrides, dict):
                raise ValueError(f"rules.{rid} must be a table of parameters, not {_kind(overrides)}")
            for name, value in overrides.items():
                if name == "severity":
                    continue
                params[_one(rid, rules)][name] = rules[_one(rid, rules)].coerce(name, value)
        for item in sets:
            key, sep, value = item.partition("=")
            rid, dot, name = key.partition(".")
            if not sep or not dot:
                raise ConfigError(f"--set {item!r} must look like RULE.param=VALUE")
            try:
                params[_one(rid, rules)][name] = rules[_one(rid, rules)].coerce(name, value)
            except ValueError as exc:
                raise ConfigError(f"--set {item!r}: {exc}") from exc
        severity = {_one(rid, rules): str(o["severity"]) for rid, o in (file_config.get("rules") or {}).items()
                    if "severity" in o}
        for rid, level in severity.items():
            if level not in SEVERITIES:
                raise ValueError(f"rules.{rid}.severity must be one of {', '.join(SEVERITIES)}, not {level!r}")
    except ConfigError:
        raise  # named its option already
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    level = fail_on or file_config.get("fail-on") or file_config.get("fail_on") or "warning"
    if level not in FAIL_ON:
        raise ConfigError(f"{source}: fail-on must be one of {', '.join(FAIL_ON)}, not {level!r}")
    return Settings(tuple(sorted(enabled)), params, level, severity, dict(file_config.get("profiler_cost") or {}))


def _one_table_per_rule(tables: dict[str, Any], rules: dict[str, Rule]) -> None:
    """Two tables for one rule in one file ([rules.AT102] and [rules.materialized-scores]): the last one's severity
    was taken, silently. (The API's settings may name a rule either way: they are merged over the file's.)"""
    seen: dict[str, str] = {}
    for given in tables:
        rid = _one(given, rules)
        if rid in seen:
            raise ValueError(f"rules.{seen[rid]} and rules.{given} are the same rule ({rid}); keep one table")
        seen[rid] = given


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
    if not isinstance(value, list):
        raise ValueError(f"select and ignore take a list of rule ids, not {_kind(value)}")
    return [str(v) for v in value]
