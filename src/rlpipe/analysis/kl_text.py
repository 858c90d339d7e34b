"""The report's KL drift section (seed 000 Problem 6, seed 002 Problem 8), computed from the runs.

Choices the seeds leave open:
- KL growth shape: the KL-to-reference curve (Eq. 8's log-ratio estimator, else k3) is fitted by
  least squares with four two-parameter models, ``a*t + b``, ``a*t^2 + b``, ``a*sqrt(t) + b`` and
  ``b*exp(a*t)``; the best R^2 names the shape (equal parameter counts keep the comparison fair),
  and a log-log fit gives the power-law exponent as a second opinion.
- A shape is named only when its fit reaches R^2 >= ``SHAPE_R2``; below it the section says no
  model fits and gives the curve's first and last values. A correlation over fewer than
  ``CORR_MIN_POINTS`` points is called an indication, not a finding; both state their n.
- "Rapid growth": the step where KL averaged over the trailing 5 steps (steps, not logged rows) rises
  fastest.
- Eq. 8's log ratio is the k1 estimator: unbiased but not non-negative, so a batch mean can dip
  below 0 while the true KL cannot; the section says so when the curve does.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rlpipe.analysis.findings import single_runs
from rlpipe.analysis.frames import last_valid
from rlpipe.analysis.series import trailing_mean
from rlpipe.analysis.summary_rows import first_row, has_columns, row_of
from rlpipe.analysis.text_format import fnum, nan, section

SHAPE_R2 = 0.9  # a growth shape is named only when its fit explains this much of the variance
CORR_MIN_POINTS = 10  # below this many points a correlation is an indication, not a finding


def fit_growth(steps, values) -> dict:
    """Best of linear / quadratic / sqrt / exponential least-squares fits of ``values(steps)``,
    by R^2, plus the log-log power-law exponent. Needs >= 4 finite points."""
    t = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if len(t) < 4 or np.ptp(t) == 0:
        return {"best": None, "r2": {}, "power": math.nan, "n": len(t), "constant": False}
    if np.ptp(y) <= 1e-12 * max(1.0, float(np.abs(y).max())):  # flat curve: no shape to name
        return {"best": None, "r2": {}, "power": math.nan, "n": len(t), "constant": True}
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1e-30

    def r2_linear_in(feature):
        a, b = np.polyfit(feature, y, 1)
        return 1 - float(((y - (a * feature + b)) ** 2).sum()) / ss_tot

    r2 = {"linear": r2_linear_in(t), "quadratic": r2_linear_in(t**2),
          "sqrt": r2_linear_in(np.sqrt(np.clip(t, 0, None)))}
    pos = (y > 0) & (t > 0)
    power = math.nan
    if pos.all():
        a, logb = np.polyfit(t, np.log(y), 1)
        r2["exponential"] = 1 - float(((y - np.exp(logb + a * t)) ** 2).sum()) / ss_tot
    if pos.sum() >= 4:
        power = float(np.polyfit(np.log(t[pos]), np.log(y[pos]), 1)[0])
    best = max(r2, key=r2.get)
    return {"best": best, "r2": r2, "power": power, "n": len(t), "constant": False}


def kl_curve(metrics: pd.DataFrame, variant: str) -> tuple[str | None, pd.DataFrame]:
    """(column used, frame of step/kl/val) for ``variant``: Eq. 8's log ratio, else k3."""
    m = metrics[metrics["variant"] == variant] if len(metrics) else metrics
    for col in ("kl/ref_log_ratio", "kl/ref_k3"):
        if col in m.columns and m[col].notna().sum() >= 2:
            val = m["reward/val_mean"] if "reward/val_mean" in m.columns else np.nan
            return col, pd.DataFrame({"step": m["step"], "kl": m[col], "val": val}).sort_values("step")
    return None, pd.DataFrame(columns=["step", "kl", "val"])


def steepest_growth(df: pd.DataFrame, window: int = 5) -> tuple[int, float]:
    """(step, slope per step) where KL averaged over the trailing ``window`` steps (steps, not rows:
    ``rlpipe.analysis.series.trailing_mean``) rises fastest; (-1, NaN) with fewer than two full windows."""
    d = df.dropna(subset=["kl"]).sort_values("step")
    if not len(d):
        return -1, math.nan
    smooth = pd.Series(trailing_mean(d["step"], d["kl"], window), index=d.index)
    full = d["step"] >= d["step"].iloc[0] + window - 1  # a window that starts before the first point is partial
    slope = (smooth.diff() / d["step"].diff())[full & full.shift(1, fill_value=False)]
    if slope.notna().sum() == 0:
        return -1, math.nan
    i = slope.idxmax()
    return int(d.loc[i, "step"]), float(slope.loc[i])


def kl_section(table: pd.DataFrame, metrics: pd.DataFrame, ref: str) -> dict:
    title = "KL drift analysis (seed 000 Problem 6, seed 002 Problem 8)"
    col, df = kl_curve(metrics, ref)
    if col is None:
        return section("kl", title, [f"No data: no KL-to-reference values for '{ref}'."])
    fit = fit_growth(df["step"][df["step"] > 0], df["kl"][df["step"] > 0])
    both = df.dropna(subset=["kl", "val"])
    corr = float(np.corrcoef(both["kl"], both["val"])[0, 1]) if len(both) >= 3 and both["kl"].std() > 0 \
        and both["val"].std() > 0 else math.nan
    step, slope = steepest_growth(df)
    s = []
    shape = fit["best"] if fit["best"] and fit["r2"][fit["best"]] >= SHAPE_R2 else None
    if fit["best"]:
        r2 = ", ".join(f"{k} {v:.3f}" for k, v in fit["r2"].items())
        power = "" if nan(fit["power"]) else f"; a power-law fit gives KL ~ t^{fit['power']:.2f}"
        s.append(f"In '{ref}', KL to the reference ({col}) grows closest to {shape} in the number of steps (R^2: "
                 f"{r2}; {fit['n']} points){power}." if shape else
                 f"In '{ref}', no two-parameter model fits KL to the reference ({col}) well (R^2: {r2}; "
                 f"{fit['n']} points; a shape is named only at R^2 >= {SHAPE_R2}), so no growth shape is claimed: "
                 f"KL went from {fnum(float(df['kl'].dropna().iloc[0]))} to "
                 f"{fnum(float(df['kl'].dropna().iloc[-1]))}.")
    elif fit["constant"]:
        s.append(f"In '{ref}', KL to the reference ({col}) stayed at {fnum(float(df['kl'].dropna().iloc[-1]))} "
                 "over the run: the policy did not measurably move, so there is no growth shape to name.")
    else:
        s.append(f"Too few KL points ({fit['n']}) in '{ref}' to fit a growth shape.")
    if not nan(corr):
        sign = "higher" if corr > 0 else "lower"
        few = (f"; with fewer than {CORR_MIN_POINTS} points this is an indication, not a finding"
               if len(both) < CORR_MIN_POINTS else "")
        s.append(f"Across the validation points, higher KL goes with {sign} validation reward "
                 f"(Pearson r = {corr:.2f}, {len(both)} points{few}).")
    else:
        s.append("Not enough validation points with KL to correlate KL with validation reward.")
    if step >= 0:
        before = df[(df["step"] <= step)]["val"].dropna()
        after = df[(df["step"] > step)]["val"].dropna()
        s.append(f"KL rises fastest around step {step} ({fnum(slope)} per step, 5-step average); validation "
                 f"reward was {fnum(last_valid(before))} before and {fnum(after.max() if len(after) else math.nan)} "
                 "at best after it - a KL surge without a reward gain would be the sign of instability.")
    base = row_of(table, ref)
    pen = (first_row(table, (table["kl_coef"] > 0) & (table["mode"] == base["mode"]))
           if base and has_columns(table, "kl_coef", "mode") and not base["kl_coef"] > 0 else None)
    if pen and base:
        s.append(penalty_sentence(metrics, pen, base))
    s += negative_k1_sentences(metrics)
    nums = {"best_fit": fit["best"], "shape": shape, "power": fit["power"], "corr_kl_val": corr, "steepest_step": step,
            **{f"r2_{k}": v for k, v in fit["r2"].items()}}
    return section("kl", title, s, nums)


PENALTY_MARGIN = 0.1  # the penalty run's KL must be this fraction below the other's to show its effect


def at_common_step(metrics: pd.DataFrame, a: str, b: str, column: str) -> tuple[float, float, float]:
    """(step, value of a, value of b) at the last step both variants logged ``column`` (NaNs when none):
    runs that log KL at different cadences are compared at one step, not at their own last points."""
    def curve(v: str) -> pd.Series:
        m = metrics[metrics["variant"] == v] if "variant" in metrics.columns else metrics.iloc[0:0]
        if column not in m.columns:
            return pd.Series(dtype=float)
        return m[["step", column]].dropna().groupby("step")[column].mean()
    ca, cb = curve(a), curve(b)
    common = sorted(set(ca.index) & set(cb.index))
    if not common:
        return math.nan, math.nan, math.nan
    return float(common[-1]), float(ca[common[-1]]), float(cb[common[-1]])


def penalty_sentence(metrics: pd.DataFrame, pen: dict, base: dict) -> str:
    """The KL with and without the k3 penalty at one step, and whether the penalty lowered it."""
    col = next((c for c in ("kl/ref_k3", "kl/ref_log_ratio") if c in metrics.columns
                and not math.isnan(at_common_step(metrics, pen["variant"], base["variant"], c)[0])), None)
    step, with_, without = (at_common_step(metrics, pen["variant"], base["variant"], col) if col else
                            (math.nan, math.nan, math.nan))
    reward = (f"the final validation reward is {fnum(pen['val_reward_final'])} with it vs "
              f"{fnum(base['val_reward_final'])} without "
              f"({single_runs(base['val_reward_final'], pen['val_reward_final']).clause()})")
    if nan(step):
        return (f"With the k3 penalty ({pen['variant']}, kl_coef {fnum(pen['kl_coef'])}) no step has a KL value of "
                f"both runs, so the penalty's effect on KL is not measured; {reward}.")
    lowered = with_ < without - PENALTY_MARGIN * max(abs(with_), abs(without))
    effect = ("lower, as the penalty pulling the policy back towards the reference should make it" if lowered else
              f"not lower by more than {100 * PENALTY_MARGIN:.0f}%: the data do not show the expected effect of the "
              "penalty")
    return (f"With the k3 penalty ({pen['variant']}, kl_coef {fnum(pen['kl_coef'])}) KL to the reference ({col}) at "
            f"step {step:.0f}, the last step both runs measured, is {fnum(with_)} vs {fnum(without)} without "
            f"('{base['variant']}'): {effect}; {reward}.")


K1_COLUMNS = ("kl/ref_log_ratio", "kl/prev_log_ratio")


def negative_k1_sentences(metrics: pd.DataFrame) -> list[str]:
    """One sentence explaining negative KL estimates, when a run logged any: Eq. 8's log ratio (k1)
    is unbiased but not non-negative; k3 is non-negative."""
    lows = [(float(metrics[c].min()), c) for c in K1_COLUMNS if c in metrics.columns and metrics[c].notna().any()]
    low = min(lows, default=(math.nan, ""))
    if not low[0] < 0:
        return []
    rows = metrics[metrics[low[1]] == low[0]]
    where = f" in '{rows['variant'].iloc[0]}'" if "variant" in rows.columns and len(rows) else ""
    return [f"Some KL estimates are negative (as low as {fnum(low[0])}{where}, {low[1]}): Eq. 8's log ratio is "
            "the k1 estimator, log(pi / pi_ref) of the sampled tokens, which is unbiased but not non-negative, "
            "so its batch average dips below 0 when the two policies are close; k3 (ratio - 1 - log ratio, "
            "with ratio = pi_ref / pi) is also unbiased and is non-negative for every token."]


KL_GROWTH = "KL growth:"


def kl_growth_sentence(variant: str, kl: pd.Series, val: pd.Series, column: str = "kl/ref_k3") -> str | None:
    """One family variant's KL drift (seed 001 Problem 15: how fast it grows, whether it goes with
    reward): ``kl`` and ``val`` are seed-mean curves indexed by step. None with fewer than 4 KL points."""
    kl = kl.dropna()
    kl = kl[kl.index > 0]
    fit = fit_growth(kl.index, kl.values)
    if fit["best"] is None and not fit["constant"]:
        return None
    shape = fit["best"] if fit["best"] and fit["r2"][fit["best"]] >= SHAPE_R2 else None
    how = ("it stayed flat, so the policy did not measurably move" if fit["constant"] else
           f"closest to {shape} in the step (R^2 {fit['r2'][shape]:.2f})" if shape else
           f"no two-parameter model fits it (best R^2 {max(fit['r2'].values()):.2f} < {SHAPE_R2})")
    out = (f"{KL_GROWTH} in {variant} (seed mean, {column}), KL to the reference went from {fnum(float(kl.iloc[0]))} "
           f"at step {kl.index[0]:.0f} to {fnum(float(kl.iloc[-1]))} at step {kl.index[-1]:.0f}, {how}")
    both = pd.concat({"kl": kl, "val": val.dropna()}, axis=1).dropna()
    if len(both) >= 3 and both["kl"].std() > 0 and both["val"].std() > 0:
        r = float(np.corrcoef(both["kl"], both["val"])[0, 1])
        few = f", an indication only below {CORR_MIN_POINTS} points" if len(both) < CORR_MIN_POINTS else ""
        out += (f"; at the steps with a validation, higher KL goes with {'higher' if r > 0 else 'lower'} validation "
                f"reward (Pearson r = {r:.2f}, {len(both)} points{few})")
    return out + "."

