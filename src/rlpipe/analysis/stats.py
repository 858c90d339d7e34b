"""Replicate statistics: means with 95% confidence intervals, and differences between variants.

Every comparison must say whether a difference exceeds its interval. With the
2-5 replicates a CPU budget allows, the normal approximation (1.96) would understate the interval
badly, so the half-width uses Student's t quantile for n - 1 degrees of freedom; differences use
Welch's interval (unequal variances, Welch-Satterthwaite degrees of freedom). The quantiles are a
table (scipy is not a dependency of rlpipe); between table entries the next smaller degree of freedom
is used, which can only widen the interval.

An unreplicated variant (n = 1) has no seed-to-seed interval. ``binomial_half_width`` then gives the
validation sampling noise of a mean reward over ``n_val`` prompts, a lower bound on the real noise,
so the report can say "unreplicated" and still quote a band.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: two-sided 95% Student t quantiles (t_{0.975, df}), df 1..30, then 40, 60, 120
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
         18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
         26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
Z975 = 1.959964


def t975(df: float) -> float:
    """t_{0.975, df}; the table's next smaller entry for fractional or untabulated df (wider)."""
    if not df >= 1:
        return math.nan
    below = [k for k in _T975 if k <= df]
    return _T975[max(below)] if df <= 120 else Z975


@dataclass(frozen=True)
class MeanCI:
    """Mean of ``n`` finite values and the half-width of its 95% interval (NaN when n < 2)."""

    mean: float
    half: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    def fmt(self, spec: str = ".3f") -> str:
        if self.n == 0:
            return "n/a"
        if self.n == 1 or math.isnan(self.half):
            return f"{self.mean:{spec}} (n=1)"
        return f"{self.mean:{spec}} ± {self.half:{spec}} (n={self.n})"


def _finite(values: Iterable[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _var(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def mean_ci(values: Iterable[float]) -> MeanCI:
    """Mean and 95% t-interval half-width of the finite values (NaN and inf are dropped)."""
    xs = _finite(values)
    if not xs:
        return MeanCI(math.nan, math.nan, 0)
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return MeanCI(mean, math.nan, 1)
    return MeanCI(mean, t975(len(xs) - 1) * math.sqrt(_var(xs) / len(xs)), len(xs))


@dataclass(frozen=True)
class Difference:
    """``mean(b) - mean(a)`` with Welch's 95% interval; ``decided`` is False when it has none."""

    diff: float
    half: float
    n_a: int
    n_b: int

    @property
    def decided(self) -> bool:
        return math.isfinite(self.half)

    @property
    def exceeds(self) -> bool:
        """The interval excludes 0: the difference is larger than the replicate noise."""
        return self.decided and abs(self.diff) > self.half


def welch_difference(a: Iterable[float], b: Iterable[float]) -> Difference:
    """Difference of means b - a with a Welch 95% interval (needs >= 2 values on each side)."""
    xa, xb = _finite(a), _finite(b)
    if not xa or not xb:
        return Difference(math.nan, math.nan, len(xa), len(xb))
    diff = sum(xb) / len(xb) - sum(xa) / len(xa)
    if len(xa) < 2 or len(xb) < 2:
        return Difference(diff, math.nan, len(xa), len(xb))
    va, vb = _var(xa) / len(xa), _var(xb) / len(xb)
    se2 = va + vb
    if se2 == 0:
        return Difference(diff, 0.0, len(xa), len(xb))
    df = se2 ** 2 / (va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1))
    return Difference(diff, t975(df) * math.sqrt(se2), len(xa), len(xb))


@dataclass(frozen=True)
class Ratio:
    """``mean(b) / mean(a)`` with a 95% interval [low, high]; ``decided`` is False when it has none."""

    ratio: float
    low: float
    high: float

    @property
    def decided(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def exceeds(self) -> bool:
        """The interval excludes 1: the ratio differs from 1 beyond the replicate noise."""
        return self.decided and (self.low > 1 or self.high < 1)


def ratio_of_means(a: Iterable[float], b: Iterable[float]) -> Ratio:
    """Ratio of means b / a (a speedup) with a 95% interval from the delta method on its log:
    var(log r) = s_b^2 / (n_b m_b^2) + s_a^2 / (n_a m_a^2), Welch-Satterthwaite degrees of freedom,
    r * exp(+-t * se). Dividing the difference's interval by the reference's mean instead would
    treat that mean as exact and understate the interval of a ratio above 1. Needs >= 2 positive
    values on each side."""
    xa, xb = _finite(a), _finite(b)
    if not xa or not xb or min(xa + xb) <= 0:
        return Ratio(math.nan, math.nan, math.nan)
    ma, mb = sum(xa) / len(xa), sum(xb) / len(xb)
    r = mb / ma
    if len(xa) < 2 or len(xb) < 2:
        return Ratio(r, math.nan, math.nan)
    ca, cb = _var(xa) / (len(xa) * ma ** 2), _var(xb) / (len(xb) * mb ** 2)
    se2 = ca + cb
    if se2 == 0:
        return Ratio(r, r, r)
    df = se2 ** 2 / (ca ** 2 / (len(xa) - 1) + cb ** 2 / (len(xb) - 1))
    half = t975(df) * math.sqrt(se2)
    return Ratio(r, r * math.exp(-half), r * math.exp(half))


def binomial_half_width(p: float, n: int) -> float:
    """95% half-width of a mean of ``n`` rewards in [0, 1] with mean ``p`` (Bernoulli variance is
    the largest such a reward can have): the validation sampling noise of one run."""
    if n < 1 or not math.isfinite(p):
        return math.nan
    p = min(max(p, 0.0), 1.0)
    return Z975 * math.sqrt(max(p * (1 - p), 1.0 / (4 * n)) / n)


def _counts(ns: Iterable[int]) -> list[int]:
    return [int(n) for n in ns if isinstance(n, (int, float)) and math.isfinite(n) and n > 0]


def seeds_phrase(ns: Iterable[int]) -> str:
    """How many seeds stand behind a set of numbers (``ns``: each number's seed count), for a
    sentence: "one seed each" when none is replicated, never "replicated" below two seeds."""
    ns = _counts(ns)
    if not ns:
        return "no seed"
    lo, hi = min(ns), max(ns)
    if hi < 2:
        return "one seed each, so not replicated"
    if lo < 2:
        return f"seed means over 1 to {hi} seeds; a number from one seed is not replicated"
    return f"seed means over {lo} seeds" if lo == hi else f"seed means over {lo} to {hi} seeds"


def interval_phrase(ns: Iterable[int]) -> str:
    """The parenthesis after a list of values: "mean ± 95% CI over 3 seeds" only when every value has
    two or more seeds, "one seed each, no interval" when none has, a mix said as a mix."""
    ns = _counts(ns)
    if not ns:
        return "no seed"
    lo, hi = min(ns), max(ns)
    if hi < 2:
        return "one seed each, no interval"
    if lo < 2:
        return "mean ± 95% CI over seeds where a variant has two or more; one seed, no interval, otherwise"
    return f"mean ± 95% CI over {lo} seeds" if lo == hi else f"mean ± 95% CI over {lo} to {hi} seeds"
