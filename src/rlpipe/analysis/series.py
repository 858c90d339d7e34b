"""The series a family figure draws, computed apart from matplotlib so that a test can check them.

Runs log their metrics at different cadences: a run with a KL penalty logs ``kl/ref_k3`` every
step, one without it every ``kl_monitor_every`` steps. Smoothing over a number of *rows* would then
average 5 steps of one run and 25 of the other, and the two curves would no longer be comparable.
Here every smoothing window is a number of *steps*: the value drawn at step s is the mean of the
values a run logged at steps s - window < step <= s (a trailing window), whatever its cadence. The
seed mean at a step is then taken over the replicates that logged that step.

``trailing_mean`` is that window; ``band`` the per-step seed mean with its 95% half-width;
``shared_steps`` the steps a panel draws when its variants log at different cadences (every variant
at the steps all of them logged, so the curves end where the runs' own values do);
``window_value`` the value a figure shows at a given step, for the text to quote the same number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from rlpipe.analysis.stats import mean_ci

BAND_COLUMNS = ("step", "mean", "half", "t")


def trailing_mean(steps, values, window: int) -> np.ndarray:
    """At each point, the mean of the finite ``values`` logged at steps in (step - window, step].

    ``window`` counts optimizer steps, not rows: a run that logs every 5th step gets no smoothing
    from a 5-step window, one that logs every step gets 5 values. ``window <= 1`` returns the values.
    """
    s = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    if window <= 1:
        return y.copy()
    out = np.full(len(y), math.nan)
    ok = np.isfinite(y)
    for i in np.flatnonzero(ok):
        inside = ok & (s > s[i] - window) & (s <= s[i])
        out[i] = float(y[inside].mean())
    return out


def replicate_frame(steps, values, times=None) -> pd.DataFrame:
    """One replicate's logged points of one metric: finite values only, sorted by step."""
    d = pd.DataFrame({"step": pd.to_numeric(pd.Series(steps), errors="coerce").to_numpy(dtype=float),
                      "y": pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float),
                      "t": (pd.to_numeric(pd.Series(times), errors="coerce").to_numpy(dtype=float)
                            if times is not None else math.nan)})
    return d[np.isfinite(d["y"]) & np.isfinite(d["step"])].sort_values("step", kind="stable")


def band(replicates: Iterable[pd.DataFrame], window: int = 1) -> pd.DataFrame:
    """Per step: the seed mean of the replicates' values smoothed over ``window`` steps, its 95%
    half-width (NaN with one replicate at that step) and the mean wall time. Each replicate frame
    has ``step``, ``y`` and ``t`` (``replicate_frame``); each is smoothed on its own steps first."""
    frames = []
    for seed, d in enumerate(replicates):
        if len(d):
            frames.append(d.assign(y=trailing_mean(d["step"], d["y"], window), seed=seed))
    if not frames:
        return pd.DataFrame(columns=list(BAND_COLUMNS))
    d = pd.concat(frames)
    rows = [(step, mean_ci(g["y"]), g["t"].mean()) for step, g in d.groupby("step")]
    return pd.DataFrame({"step": [s for s, _, _ in rows], "mean": [c.mean for _, c, _ in rows],
                         "half": [c.half for _, c, _ in rows], "t": [t for _, _, t in rows]})


def shared_steps(runs_by_variant: Iterable[Iterable[pd.DataFrame]]) -> set[float] | None:
    """The steps every variant logged (in any of its replicates), when the variants log at different
    cadences; None when they all log the same steps (nothing to align). A figure that draws each
    variant only at these steps compares like with like: a run logging every step, smoothed over 5,
    beside one logging every 5th step, drawn as logged, can end on the other side of it than the two
    runs' values at the same step do."""
    logged = [set().union(*(set(d["step"]) for d in reps)) for reps in map(list, runs_by_variant)]
    logged = [s for s in logged if s]
    if len(logged) < 2 or all(s == logged[0] for s in logged):
        return None
    common = set.intersection(*logged)
    return common or None


def window_value(d: pd.DataFrame, step: float, window: int = 1) -> float:
    """Mean of a replicate's ``y`` over the steps in (step - window, step] (NaN when none): the value
    ``band`` draws at ``step`` for that replicate."""
    inside = d[(d["step"] > step - max(window, 1)) & (d["step"] <= step)]["y"].dropna()
    return float(inside.mean()) if len(inside) else math.nan
