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
reward comparisons pass ``contended=False``. Every timing-derived ratio or exponent, in text or
figure, benchmarks included, carries the load recorded when it was measured (``TimingLoad.clause``)
and is marked ``INDICATIVE`` when contended, decided by the one rule the training runs use
(``rlpipe.contract.decide_contended``). A training run measures other processes' CPU time
over its own interval; a benchmark JSON records only 1-minute load averages, so for it the cores
others kept busy are estimated as the highest recorded load minus the bench's own cores
(``timing_load``), and any run it holds that recorded its own ``conditions`` (the scaling bench's
points) decides by those.

Departure from the seeds: the seeds ask for comparisons in prose and do not define when a
difference counts; this rule is ours, chosen so that no sentence outruns its numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlpipe.analysis.stats import Difference, MeanCI, Ratio
from rlpipe.contract import decide_contended

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


# --------------------------------------------------------------------------- timings and their load

#: How a contended timing is marked, in text and in figures' legends.
INDICATIVE = "contended, indicative only"


@dataclass(frozen=True)
class TimingLoad:
    """The load recorded while a timing was measured: the highest 1-minute load average (NaN when
    none was recorded), the machine's CPUs (0: unknown), and whether the timing was contended
    (``None``: undecidable, no load recorded)."""

    load: float
    cpus: int
    contended: bool | None

    def clause(self) -> str:
        """'load 5.7 on 2 CPUs: contended, indicative only', 'load 0.9 on 2 CPUs' or 'load not
        recorded'; every timing-derived ratio or exponent carries it."""
        if not math.isfinite(self.load):
            return "load not recorded" + (f": {INDICATIVE}" if self.contended else "")
        on = f" on {self.cpus} CPUs" if self.cpus else ""
        return f"load {self.load:.3g}{on}" + (f": {INDICATIVE}" if self.contended else "")


def _loads(data, out: list[float], flags: list[bool]) -> None:
    """Every 1-minute load average under ``load_avg*`` keys of ``data`` (a number, an
    ``os.getloadavg()`` triple whose first entry is the 1-minute value, or lists of those), and
    every ``contended`` flag of a nested run ``conditions`` record."""
    if isinstance(data, dict):
        for k, v in data.items():
            if str(k).startswith("load_avg"):
                _load_values(v, out)
            elif k == "conditions" and isinstance(v, dict):
                if isinstance(v.get("contended"), bool):
                    flags.append(v["contended"])
                _loads(v, out, flags)
            elif isinstance(v, (dict, list)):
                _loads(v, out, flags)
    elif isinstance(data, list):
        for v in data:
            _loads(v, out, flags)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _load_values(v, out: list[float]) -> None:
    if _number(v):
        out.append(float(v))
    elif isinstance(v, list) and v and all(_number(x) for x in v):
        out.append(float(v[0]))  # os.getloadavg(): (1 min, 5 min, 15 min)
    elif isinstance(v, list):
        for x in v:
            _load_values(x, out)


def _cpus(data: dict) -> int:
    for d in (data, data.get("provenance") if isinstance(data.get("provenance"), dict) else {}):
        if _number(d.get("cpus")) and d["cpus"] > 0:
            return int(d["cpus"])
    return 0


def timing_load(data: dict | None, own_cores: float | None = None) -> TimingLoad:
    """The load a benchmark JSON recorded and whether its timings were contended. Nested runs' own
    ``conditions`` (CPU time over each run's interval) decide when there are any: one contended run
    contends the whole bench. Otherwise others' cores are estimated as the highest 1-minute load average minus
    the bench's own cores (``own_cores``; else its ``torch_threads`` / ``threads`` capped at the
    CPUs; else all CPUs, the most lenient reading) and passed to ``decide_contended``."""
    data = data if isinstance(data, dict) else {}
    loads: list[float] = []
    flags: list[bool] = []
    _loads(data, loads, flags)
    cpus = _cpus(data)
    load = max(loads) if loads else math.nan
    if flags:  # measured by CPU time over each run's own interval: the better measure decides
        return TimingLoad(load, cpus, any(flags))
    if not loads or not cpus:
        return TimingLoad(load, cpus, None)
    if own_cores is None:
        threads = next((data[k] for k in ("torch_threads", "threads") if _number(data.get(k))), cpus)
        own_cores = min(float(threads), float(cpus))
    return TimingLoad(load, cpus, bool(decide_contended(max(load - own_cores, 0.0), 1.0, cpus, own_cores)))
