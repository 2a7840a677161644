"""The rule catalogue: one TOML data file per rule in rules/, loaded and validated. Nothing in a rule file
is executed; its detection logic lives in attntrace/checks/."""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from attntrace.model.data import load_toml, rules_dir

SEVERITIES = ("error", "warning", "info")
DOC_FIELDS = ("what", "why", "example", "fix")
NEEDS = {"gpu", "ops", "shapes", "launch_config", "steps"}
RULE_ID = re.compile(r"^AT\d{3}$")
RULE_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


# A warning promises a saving worth acting on (DESIGN.md, "A finding is a cause").
MIN_SAVING_SHARE = "min_saving_share"
DEFAULT_MIN_SAVING_SHARE = 0.02


class RuleFileError(Exception):
    """A rule file that is missing, unparsable or incomplete; the message names the file."""


@dataclass(frozen=True)
class Parameter:
    name: str
    default: Any
    unit: str
    description: str


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str
    summary: str
    needs: tuple[str, ...]
    parameters: dict[str, Parameter]
    docs: dict[str, str]
    path: str

    def coerce(self, param: str, value: Any) -> Any:
        """A user-given value converted to the type of the parameter's default ("1M" for a size in bytes) and
        checked against what its unit allows (a fraction is 0..1, a percentage 0..100, a ratio above 0, a
        speed-up 1 or more, any other threshold 0 or more; never NaN or infinite)."""
        if param not in self.parameters:
            known = ", ".join(sorted(self.parameters)) or "none"
            raise ValueError(f"{self.id} has no parameter {param!r} (known: {known})")
        spec = self.parameters[param]
        default = spec.default
        if isinstance(default, bool):
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        if isinstance(value, str) and value.strip().endswith("%") and spec.unit.startswith("fraction"):
            # Every share is a fraction; "25%" says the same unambiguously.
            value = _percent(value, f"{self.id}.{param}")
        try:
            if isinstance(default, int):
                number: float = parse_size(value) if spec.unit == "bytes" else _whole(value)
            elif isinstance(value, bool):
                raise ValueError(value)
            else:
                number = float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            kind = "a size such as 512K or 1M" if spec.unit == "bytes" else (
                "a whole number" if isinstance(default, int) else "a number")
            raise ValueError(f"{self.id}.{param}: {_given(value)} is not {kind}") from exc
        allowed = _outside(spec.unit, number)
        if allowed:
            what = {"x": "a ratio", "x speed-up": "a speed-up"}.get(spec.unit, spec.unit)
            hint = (f"; for {number:g} percent write \"{number:g}%\" or {number / 100:g}"
                    if spec.unit.startswith("fraction") and 1 < number <= 100 else "")
            raise ValueError(f"{self.id}.{param}: {_given(value)} is out of range ({what}: {allowed}){hint}")
        return type(default)(number)


def _given(value: Any) -> str:
    """A value as an error message shows it: a 400-digit integer was printed whole, and one past 4,300 digits
    replaced the message with Python's own about int conversion."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of about {value.bit_length() * 30103 // 100000 + 1} digits"
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(value: Any) -> int:
    """Bytes from 1048576, "512K", "1M", "1.5GiB"; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in SIZE_UNITS and text[-1:] else ""
    size = float(text[: len(text) - len(unit)]) * SIZE_UNITS[unit]
    if not math.isfinite(size) or size != int(size):
        raise ValueError(value)
    return int(size)


def _percent(value: str, name: str) -> float:
    try:
        return float(value.strip()[:-1]) / 100
    except ValueError as exc:
        raise ValueError(f"{name}: {value!r} is not a percentage such as 25%") from exc


def _whole(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    number = float(value)
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def _outside(unit: str, number: float) -> str | None:
    """What a parameter of this unit may be, when `number` is not that; None when it is."""
    if unit.startswith("fraction"):
        return None if 0 <= number <= 1 else "0 to 1"
    if unit == "percent":
        return None if 0 <= number <= 100 else "0 to 100"
    if unit == "x":
        return None if 0 < number < math.inf else "above 0"
    if unit == "x speed-up":  # below 1 the fix would be slower, and the finding's saving negative
        return None if 1 <= number < math.inf else "1 or more"
    return None if 0 <= number < math.inf else "0 or more"


def _require(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise RuleFileError(f"{where}: missing '{key}'")
    if not isinstance(data[key], kind):
        raise RuleFileError(f"{where}: '{key}' must be a {kind.__name__}")
    return data[key]


def parse_rule(path: Path) -> Rule:
    where = str(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RuleFileError(f"{where}: {exc}") from exc
    rule_id = _require(data, "id", str, where)
    if not RULE_ID.match(rule_id) or path.stem != rule_id:
        raise RuleFileError(f"{where}: id {rule_id!r} must look like AT123 and match the file name")
    name = _require(data, "name", str, where)
    if not RULE_NAME.match(name):
        raise RuleFileError(f"{where}: name {name!r} must be kebab-case")
    severity = _require(data, "severity", str, where)
    if severity not in SEVERITIES:
        raise RuleFileError(f"{where}: severity {severity!r} must be one of {', '.join(SEVERITIES)}")
    needs = tuple(data.get("needs", []))
    if unknown := set(needs) - NEEDS:
        raise RuleFileError(f"{where}: unknown needs {sorted(unknown)}")
    params = {}
    for pname, spec in _require(data, "parameters", dict, where).items() if "parameters" in data else ():
        if not isinstance(spec, dict):
            raise RuleFileError(f"{where}: parameter {pname!r} must be a table")
        for key, kind in (("default", object), ("unit", str), ("description", str)):
            _require(spec, key, kind, f"{where}: parameter {pname!r}")
        params[pname] = Parameter(pname, spec["default"], spec["unit"], spec["description"])
    params.setdefault(MIN_SAVING_SHARE, Parameter(
        MIN_SAVING_SHARE, DEFAULT_MIN_SAVING_SHARE, "fraction of the step",
        "A finding is a warning only when its fix would save at least this share of the step; a smaller one is "
        "info (every rule has it; [tool.attntrace] min_saving_share sets it for all)."))
    docs = _require(data, "docs", dict, where)
    for key in DOC_FIELDS:
        if not str(_require(docs, key, str, f"{where}: [docs]")).strip():
            raise RuleFileError(f"{where}: [docs] '{key}' is empty")
    return Rule(rule_id, name, severity, _require(data, "summary", str, where), needs, params,
                {k: docs[k].strip() if k == "example" else _unwrap(docs[k]) for k in DOC_FIELDS}, where)


def _unwrap(text: str) -> str:
    """Prose wrapped for the data file, joined into one line per paragraph for terminals and CI messages."""
    paragraphs = [" ".join(line.strip() for line in block.splitlines()) for block in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


@cache
def load_rules(directory: Path | None = None) -> dict[str, Rule]:
    folder = directory or rules_dir()
    rules = [parse_rule(p) for p in sorted(folder.glob("AT*.toml"))]
    return {r.id: r for r in rules}


def resolve(selector: str, rules: dict[str, Rule]) -> list[str]:
    """Rule ids matched by an id, a name, or an id prefix such as AT1 or ALL."""
    token = selector.strip()
    if token.upper() == "ALL":
        return list(rules)
    hits = [r.id for r in rules.values() if r.id.startswith(token.upper()) or r.name == token.lower()]
    if not hits:
        raise ValueError(f"unknown rule {token!r}")
    return hits


@dataclass(frozen=True)
class Framework:
    """A framework whose own switches fix findings (rules/frameworks.toml)."""

    name: str
    match: re.Pattern[str]
    fixes: dict[str, str]
    # Op names the framework records in every profiler setting: it is known from them without Python stacks.
    ops: re.Pattern[str] | None = None


@cache
def load_frameworks() -> tuple[Framework, ...]:
    path = rules_dir() / "frameworks.toml"
    if not path.is_file():
        return ()
    found = []
    for number, entry in enumerate(load_toml(path).get("framework", []), 1):
        where = f"{path}: framework {number}"
        ops = entry.get("ops")
        if ops is not None and not isinstance(ops, str):
            raise RuleFileError(f"{where}: 'ops' must be a string")
        found.append(Framework(_require(entry, "name", str, where), re.compile(_require(entry, "match", str, where)),
                               dict(_require(entry, "fixes", dict, where)), re.compile(ops) if ops else None))
    return tuple(found)
