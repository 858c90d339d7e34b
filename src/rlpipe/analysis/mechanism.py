"""Whether a family's comparison could answer its question at this scale: the mechanism checks.

A family compares variants that differ in one setting. The comparison can only show an effect
when the mechanism that setting controls was active in the runs; when it was not, a "no
difference" says nothing about the question. Each check reads the runs' health signals and, when
the mechanism was inactive, returns a sentence that says the comparison cannot answer the question
here and names the settings that would make it active:

- the clip (``loss_type`` grpo_clip vs grpo_no_clip, or a ``cliprange`` sweep): the clipped
  variants' ``loss/clip_frac`` stays below ``CLIP_ACTIVE`` of the response tokens;
- reward saturation (any family): every variant's seed-mean validation reward reaches
  ``SATURATED`` of the reward's ceiling within the first ``EARLY`` of its steps, so the final
  rewards cannot separate the variants;
- length normalisation (``length_normalization`` masked_mean vs masked_normalize): the mean
  response length barely moves (``LENGTH_STEADY``), so dividing by a constant is the per-sequence
  mean rescaled by length / constant, a smaller step size rather than another weighting;
- learning signal (any family): in every variant most groups (``ZERO_STD_MOST``) had one reward
  for all their responses, hence zero advantage and no gradient.

Departure from the seeds: seeds 001/004 ask what each ablation shows; they do not ask whether it
could show anything at the scale it ran. The thresholds are ours and are stated in every sentence.
"""

from __future__ import annotations

import math

import pandas as pd

from rlpipe.analysis.family_data import VAL, Family
from rlpipe.analysis.frames import col
from rlpipe.analysis.stats import mean_ci

CLIP_ACTIVE = 0.01  # fraction of response tokens the clip must bind on to change the update
SATURATED = 0.95  # fraction of the reward ceiling
EARLY = 0.25  # fraction of the run's steps
REWARD_CEILING = 1.0  # every built-in task's reward lies in [0, 1]
LENGTH_STEADY = 0.1  # (max - min) / mean of the per-step mean response length
ZERO_STD_MOST = 0.8  # fraction of groups whose responses all got the same reward
CLIP_KEYS = ("loss_type", "cliprange")


def varied(fam: Family) -> set[str]:
    """The train settings whose value differs between the family's variants."""
    keys = set().union(*(s.keys() for s in fam.settings.values())) if fam.settings else set()
    return {k for k in keys if len({repr(s.get(k)) for s in fam.settings.values()}) > 1}


def _steps(fam: Family, variant: str, column: str) -> list[pd.Series]:
    """Each replicate's ``column`` over its optimizer steps (step >= 1), NaNs dropped."""
    out = []
    for r in fam.of(variant):
        m = r.run.metrics
        s = col(m[m["step"] >= 1], column).dropna() if "step" in m.columns else pd.Series(dtype=float)
        if len(s):
            out.append(s)
    return out


def clip_sentences(fam: Family) -> list[str]:
    if not varied(fam) & set(CLIP_KEYS):
        return []
    clipped = [v for v in fam.variants if fam.settings.get(v, {}).get("loss_type") == "grpo_clip"]
    fracs = {v: mean_ci(float(s.mean()) for s in _steps(fam, v, "loss/clip_frac")) for v in clipped}
    fracs = {v: c for v, c in fracs.items() if c.n}
    if not fracs or max(c.mean for c in fracs.values()) >= CLIP_ACTIVE:
        return []
    peak = max(float(s.max()) for v in fracs for s in _steps(fam, v, "loss/clip_frac"))
    where = ", ".join(f"{v} {100 * c.mean:.2g}%" for v, c in fracs.items())
    return [f"Mechanism check: the clip bound on few response tokens (loss/clip_frac, mean over steps and seeds: "
            f"{where}; at most {100 * peak:.2g}% in any step), below the {100 * CLIP_ACTIVE:.0f}% at which it "
            "would change the update noticeably. With and without the clip the gradient is then almost the "
            "same, so this comparison cannot answer whether the clip matters at this scale. What would: a policy "
            "that moves further from the one that sampled the batch, through a larger learning_rate or more "
            "optimizer steps per rollout batch (epochs_per_rollout_batch, a smaller train_batch_size), longer "
            "responses, or a GPU configuration's model and batch sizes (config/gpu.yaml, config/math.yaml)."]


def _reach_step(fam: Family, variant: str, level: float) -> tuple[float, float]:
    """(first step at which the seed-mean validation reward reaches ``level``, last step)."""
    rows = [r.run.metrics[["step", VAL]].dropna() for r in fam.of(variant) if VAL in r.run.metrics.columns]
    rows = [d for d in rows if len(d)]
    if not rows:
        return math.nan, math.nan
    curve = pd.concat(rows).groupby("step")[VAL].mean()
    hit = curve[curve >= level]
    return (float(hit.index[0]) if len(hit) else math.nan), float(curve.index[-1])


def saturation_sentences(fam: Family) -> list[str]:
    level = SATURATED * REWARD_CEILING
    reach = {v: _reach_step(fam, v, level) for v in fam.variants if fam.of(v)}
    if len(reach) < 2 or not all(math.isfinite(a) and b > 0 and a <= EARLY * b for a, b in reach.values()):
        return []
    where = ", ".join(f"{v} by step {a:.0f} of {b:.0f}" for v, (a, b) in reach.items())
    return [f"Mechanism check: the validation reward saturates early: every variant's seed mean reached "
            f"{level:.2f} ({100 * SATURATED:.0f}% of the reward's ceiling) within the first {100 * EARLY:.0f}% of its "
            f"steps ({where}). Final rewards cannot separate variants that all reach the ceiling, so this "
            "comparison cannot answer the question from them here; the curves' early steps (how fast each "
            "variant gets there) still can. What would: a harder task, fewer steps, or a weaker base model."]


def length_sentences(fam: Family) -> list[str]:
    if "length_normalization" not in varied(fam):
        return []
    means = [float(x) for v in fam.variants for s in _steps(fam, v, "response/length_mean") for x in s]
    if not means or min(means) <= 0:
        return []
    lo, hi, avg = min(means), max(means), sum(means) / len(means)
    if (hi - lo) / avg > LENGTH_STEADY:
        return []
    return [f"Mechanism check: the mean response length stayed between {lo:.3g} and {hi:.3g} tokens in every run "
            f"(a spread under {100 * LENGTH_STEADY:.0f}% of its mean; the spread within a batch is not logged). "
            "When every response has about the same length L, dividing each sum by a constant C "
            "(masked_normalize) is the per-sequence mean (masked_mean) times L / C, a smaller step size rather "
            "than another weighting of long and short responses, so this comparison can hardly answer the "
            "question here. What would: a task whose responses vary in length, such as MATH with a real model "
            "(config/math.yaml, on a GPU), or a larger sampling_max_tokens with a model that uses it."]


def signal_sentences(fam: Family) -> list[str]:
    fracs = {v: mean_ci(float(s.mean()) for s in _steps(fam, v, "reward/zero_std_frac")) for v in fam.variants}
    fracs = {v: c for v, c in fracs.items() if c.n}
    if len(fracs) < 2 or min(c.mean for c in fracs.values()) < ZERO_STD_MOST:
        return []
    where = ", ".join(f"{v} {100 * c.mean:.0f}%" for v, c in fracs.items())
    return [f"Mechanism check: in most groups every response got the same reward (reward/zero_std_frac, mean over "
            f"steps and seeds: {where}; the check fires at {100 * ZERO_STD_MOST:.0f}%). Such a group has zero "
            "advantage and gives no gradient, so every variant learnt from a small minority of its samples and "
            "this comparison can hardly answer the question here. What would: a larger group_size, a higher "
            "sampling_temperature, or a task the model solves sometimes but not always."]


CHECKS = (clip_sentences, saturation_sentences, length_sentences, signal_sentences)


def mechanism_sentences(fam: Family) -> list[str]:
    """Every check's sentence whose mechanism was inactive in this family's runs."""
    return [s for check in CHECKS for s in check(fam)]
