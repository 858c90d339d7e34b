"""The report's one honesty rule: whether a measured difference between variants is a finding.

A difference is a finding only when all three hold:

- it is replicated: each side has at least ``MIN_REPLICATES`` runs (seeds), so it has a
  seed-to-seed interval at all;
- its 95% interval excludes the null value (0 for a difference, 1 for a ratio such as a speedup);
- it is not contended: no run in a timing comparison was timed while other processes took its CPU.

The family pages (``rlpipe.analysis.families``) and the main discussion
(``rlpipe.analysis.report_text``) both ask ``is_finding``, so a gap one of them calls noise is never
stated as a result by the other. The main discussion has one run per variant, so its gaps are
measurements, never findings; the replicated comparison is a family's.

Contention applies to timings: a reward does not depend on how fast the machine computed it, so
reward comparisons pass ``contended=False``.

Departure from the seeds: the seeds ask for comparisons in prose and do not define when a
difference counts; this rule is ours, chosen so that no sentence outruns its numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlpipe.analysis.stats import Difference, MeanCI, Ratio

MIN_REPLICATES = 2

FINDING = "exceeds the 95% interval"
NOISE = "within replicate noise"
UNREPLICATED = "unreplicated"
CONTENDED = "contended: no conclusion"
NO_DATA = "no data"


@dataclass(frozen=True)
class Verdict:
    """Whether a difference is a finding, and the reason (one of the module's reason strings)."""

    finding: bool
    reason: str

    def __bool__(self) -> bool:
        return self.finding

    def clause(self) -> str:
        """The verdict as a clause to end a sentence that states the difference."""
        return {FINDING: "a finding (replicated, beyond its 95% interval, not contended)",
                NOISE: "within replicate noise, so not a finding",
                UNREPLICATED: "unreplicated, so a measurement, not a finding",
                CONTENDED: "timed under contention, so not a finding",
                NO_DATA: "not measured"}[self.reason]


def _interval(diff) -> tuple[float, float, float, int]:
    """(estimate, low, high, n) of a MeanCI, a stats.Difference, a stats.Ratio or a
    (mean, low, high, n) tuple; n is the smaller side's replicate count."""
    if isinstance(diff, MeanCI):
        return diff.mean, diff.low, diff.high, diff.n
    if isinstance(diff, Difference):
        return diff.diff, diff.diff - diff.half, diff.diff + diff.half, min(diff.n_a, diff.n_b)
    if isinstance(diff, Ratio):  # ratio_of_means gives an interval only with >= 2 runs per side
        return diff.ratio, diff.low, diff.high, MIN_REPLICATES if diff.decided else 1
    mean, low, high, n = diff
    return float(mean), float(low), float(high), int(n)


def is_finding(diff, contended: bool = False, null: float = 0.0) -> Verdict:
    """The verdict on ``diff`` (see the module docstring); ``null`` is 1 for a ratio."""
    est, low, high, n = _interval(diff)
    if contended:
        return Verdict(False, CONTENDED)
    if not math.isfinite(est) or n < 1:
        return Verdict(False, NO_DATA)
    if n < MIN_REPLICATES or not (math.isfinite(low) and math.isfinite(high)):
        return Verdict(False, UNREPLICATED)
    if low > null or high < null:
        return Verdict(True, FINDING)
    return Verdict(False, NOISE)


def single_runs(a: float, b: float, contended: bool = False) -> Verdict:
    """The verdict on a gap between two single runs (values ``a`` and ``b``): never a finding."""
    return is_finding((b - a, math.nan, math.nan, 1), contended)
