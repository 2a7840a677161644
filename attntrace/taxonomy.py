"""Kernel classes from rules/taxonomy.toml: which kernels are GEMMs (and on which units), fused attention
(and which backend), copies, casts, elementwise, reductions, Triton."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from attntrace.data import load_toml, rules_dir

OTHER = "other"


@dataclass(frozen=True)
class KernelClass:
    id: str
    description: str
    pattern: re.Pattern[str]
    attention: str | None
    tensor_core: bool | str | None


@dataclass(frozen=True)
class Taxonomy:
    classes: tuple[KernelClass, ...]

    def classify(self, name: str) -> str:
        for cls in self.classes:
            if cls.pattern.search(name):
                return cls.id
        return OTHER

    def by_id(self, class_id: str) -> KernelClass | None:
        return next((c for c in self.classes if c.id == class_id), None)

    def attention_backend(self, class_id: str) -> str | None:
        cls = self.by_id(class_id)
        return cls.attention if cls else None

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
            pattern=re.compile("|".join(f"(?:{p})" for p in entry["patterns"])),
            attention=entry.get("attention"),
            tensor_core=entry.get("tensor_core"),
        )
        for entry in raw["class"]
    )
    return Taxonomy(classes)
