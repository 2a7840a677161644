"""The test `diff` judges a step-time change with: steady steps, medians, and a one-sided Welch t-test on log
step times, which has power at 3 to 10 steps where min-max ranges almost always overlap."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

STEADY_RATIO = 1.5  # a step slower than this times the shortest is warm-up (the profiler's first steps run slow)
# Step times of one program vary between captures more than within one: a relative noise of at least 1% per
# step keeps a change of a fraction of a percent between two very steady traces from reading as certain.
MIN_LOG_SD = 0.01


def steady(steps: list[float]) -> list[float]:
    """The steps at the trace's steady pace (at most STEADY_RATIO x the shortest); all of them when fewer than 2
    would remain."""
    positive = [s for s in steps if s > 0]
    if not positive:
        return []
    bound = STEADY_RATIO * min(positive)
    kept = [s for s in positive if s <= bound]
    return kept if len(kept) >= 2 else positive


@dataclass(frozen=True)
class Change:
    base_median: float
    new_median: float
    change_pct: float | None
    confidence: float  # that the new steps are slower than the base ones, from the one-sided test; 0..1
    base_steps: int
    new_steps: int


def compare(base: list[float], new: list[float]) -> Change:
    b, n = steady(base), steady(new)
    b_med = statistics.median(b) if b else 0.0
    n_med = statistics.median(n) if n else 0.0
    pct = 100.0 * (n_med - b_med) / b_med if b_med else None
    return Change(b_med, n_med, pct, slower_confidence(b, n), len(b), len(n))


def slower_confidence(base: list[float], new: list[float]) -> float:
    """P(new slower than base) by a one-sided Welch t-test on log step times; 0.5 when the data cannot say."""
    if not base or not new:
        return 0.5
    lb, ln = [math.log(x) for x in base], [math.log(x) for x in new]
    vb = max(statistics.variance(lb) if len(lb) > 1 else 0.0, MIN_LOG_SD ** 2)
    vn = max(statistics.variance(ln) if len(ln) > 1 else 0.0, MIN_LOG_SD ** 2)
    se2 = vb / len(lb) + vn / len(ln)
    t = (statistics.fmean(ln) - statistics.fmean(lb)) / math.sqrt(se2)
    df = se2 ** 2 / ((vb / len(lb)) ** 2 / max(len(lb) - 1, 1) + (vn / len(ln)) ** 2 / max(len(ln) - 1, 1))
    return student_t_cdf(t, df)


def student_t_cdf(t: float, df: float) -> float:
    """The CDF of Student's t distribution with `df` degrees of freedom (df > 0)."""
    x = df / (df + t * t)
    tail = 0.5 * _regularized_beta(x, df / 2.0, 0.5)
    return 1.0 - tail if t > 0 else tail


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) by its continued fraction (Lentz's method), the standard route for the t distribution."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _regularized_beta(1.0 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return front * f / a
