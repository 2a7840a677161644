"""Kernel classes from rules/taxonomy.toml: which kernels are GEMMs (and on which units), fused attention
(and which backend), copies, casts, elementwise, reductions, Triton."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import polars as pl

from attntrace.model.data import load_toml, rules_dir

OTHER = "other"
COMMUNICATION = "communication"


@dataclass(frozen=True)
class KernelClass:
    id: str
    description: str
    pattern: str  # the class's patterns as one alternation, matched by polars (classify_all)
    attention: str | None
    tensor_core: bool | str | None
    group: str  # what the kernel does, for summaries: attention, gemm, communication, elementwise, ...


KNOWN_NAMES_KEPT = 50_000  # kernel names whose class a process remembers (a few MB at most)
REMEMBERED_UP_TO = 5_000  # a trace with more distinct kernel names is matched in polars alone, not in Python lists


@dataclass(frozen=True)
class Taxonomy:
    classes: tuple[KernelClass, ...]
    # Each kernel name's class, once matched: a directory of small traces of one program names the same kernels
    # in every file, and the match is one regex query (1.6 ms of a small trace's 40).
    known: dict[str | None, str] = field(default_factory=dict, compare=False, repr=False)

    def classify(self, name: str) -> str:
        return self.classify_all(pl.Series([name], dtype=pl.String))[0]

    def classify_all(self, names: pl.Series) -> pl.Series:
        """The class of each kernel name: the first class with a pattern found in it, else OTHER. Matched by
        polars' regex engine, whose time is linear in the name: Python's backtracks, and a pattern like
        `gemm_.*(sm90|sm100)` took seconds on one long name made to defeat it."""
        names = names.cast(pl.String)
        if len(names) > REMEMBERED_UP_TO:
            return self._matched(names)
        wanted = names.to_list()
        matched = {name: self.known[name] for name in set(wanted) if name in self.known}
        new = list(dict.fromkeys(name for name in wanted if name not in matched))
        if new:
            matched.update(zip(new, self._matched(pl.Series(new, dtype=pl.String)).to_list(), strict=True))
            if len(self.known) + len(new) > KNOWN_NAMES_KEPT:
                self.known.clear()
            self.known.update((name, matched[name]) for name in new)
        return pl.Series("cls", [matched[name] for name in wanted], dtype=pl.String)

    def _matched(self, names: pl.Series) -> pl.Series:
        found = pl.lit(OTHER)
        for cls in reversed(self.classes):
            found = pl.when(pl.col("name").str.contains(cls.pattern)).then(pl.lit(cls.id)).otherwise(found)
        return pl.DataFrame({"name": names}).select(found.alias("cls"))["cls"]

    def by_id(self, class_id: str) -> KernelClass | None:
        return next((c for c in self.classes if c.id == class_id), None)

    def attention_backend(self, class_id: str) -> str | None:
        cls = self.by_id(class_id)
        return cls.attention if cls else None

    def group_of(self, class_id: str | None) -> str:
        cls = self.by_id(class_id) if class_id else None
        return cls.group if cls else (class_id or OTHER)

    @property
    def communication_classes(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.classes if c.group == COMMUNICATION)

    @property
    def gemm_classes(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.classes if c.id.startswith("gemm_"))

    @property
    def attention_classes(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.classes if c.attention)


@cache
def load() -> Taxonomy:
    raw = load_toml(rules_dir() / "taxonomy.toml")
    classes = tuple(
        KernelClass(
            id=entry["id"],
            description=entry["description"],
            pattern="|".join(f"(?:{p})" for p in entry["patterns"]),
            attention=entry.get("attention"),
            tensor_core=entry.get("tensor_core"),
            group=entry.get("group") or _default_group(entry),
        )
        for entry in raw["class"]
    )
    return Taxonomy(classes)


def _default_group(entry: dict[str, object]) -> str:
    if entry.get("attention"):
        return "attention"
    class_id = str(entry["id"])
    return "gemm" if class_id.startswith("gemm_") else class_id
