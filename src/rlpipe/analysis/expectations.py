"""The expected effects of the settings a family varies, each checked against its runs.

An explanation in the report names a direction ("A raises X") and is stated as shown only when the
runs show that direction; otherwise the sentence says the data do not show the expected effect,
with the numbers. ``EXPECTATIONS`` lists the mechanisms: a setting (a dotted ``train`` key), the
value or direction of it that should raise or lower a signal, and why.

How a family is checked against an expectation:

- pairs: variants that differ in the expectation's setting and in no other treatment setting (the
  cadence settings that only keep the logging at the same samples, ``CADENCE_KEYS``, are ignored);
  for a numeric setting, neighbours in its order, for a categorical one the two named values;
- the value compared: the seed mean of the signal at the last step that both variants logged,
  averaged over the trailing ``window`` steps (``rlpipe.analysis.series``, the window the health
  figure draws; KL and validation reward are compared at that very step, window 1);
- "shown": every pair differs in the expected direction by more than ``MARGIN`` of the larger
  value; a pair within the margin, or the other way, is stated as not showing the effect.

Departure from the seeds: seeds 001/004 ask to explain the findings; an explanation here is
tied to a check on the data, so it cannot contradict the numbers it sits beside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import pandas as pd

from rlpipe.analysis.family_data import SMOOTH_STEPS, VAL, Family
from rlpipe.analysis.series import band, replicate_frame
from rlpipe.analysis.stats import seeds_phrase
from rlpipe.analysis.text_format import fnum
from rlpipe.contract import HEALTH_COLUMNS

MARGIN = 0.1  # a difference under 10% of the larger value does not show a direction
PREFIX_SHOWN = "Expected effect, shown:"
PREFIX_NOT_SHOWN = "Expected effect, not shown:"
CADENCE_KEYS = frozenset({"val_every", "kl_monitor_every", "log_rollouts_every", "checkpoint_every",
                          "gradient_accumulation_steps", "seed", "variant"})
LABELS = {**HEALTH_COLUMNS, VAL: "validation reward"}


@dataclass(frozen=True)
class Expectation:
    key: str  # dotted train setting
    signal: str  # a metric column
    raises: bool  # True: ``high`` (or the larger value) raises the signal; False: lowers it
    why: str
    high: object = None  # categorical: the value that raises (lowers) it; None: a numeric setting
    low: object = None  # categorical: the value it is compared with
    window: int = SMOOTH_STEPS
    only_if: str | None = None  # a dotted setting unset in every run for ``why`` to hold (else no check)


EXPECTATIONS = (
    Expectation("loss_type", "optim/grad_norm", True,
                "without the group-mean baseline every response with a positive reward is pushed up and none "
                "down, so the per-response terms add up instead of cancelling", "no_baseline",
                "reinforce_with_baseline"),
    Expectation("use_std_normalization", "optim/grad_norm", True,
                "dividing a group's advantages by its reward std, at most 0.5 for rewards in [0, 1], enlarges "
                "them at least twofold, most in groups whose rewards are nearly equal", True, False),
    Expectation("length_normalization", "optim/grad_norm", True,
                "masked_mean divides each response's summed loss by its own length, masked_normalize by a "
                "constant no smaller than any response's length, so every token weighs more under masked_mean",
                "masked_mean", "masked_normalize"),
    Expectation("loss_type", "kl/ref_k3", True,
                "without the clip nothing limits how far the steps on one rollout batch move the policy",
                "grpo_no_clip", "grpo_clip", window=1),
    Expectation("learning_rate", "kl/ref_k3", True,
                "each update moves the policy further from the reference", window=1),
    Expectation("kl_coef", "kl/ref_k3", False,
                "the k3 penalty pulls the policy back towards the reference", window=1),
    Expectation("epochs_per_rollout_batch", "loss/clip_frac", True,
                "each further pass over the same rollout batch trains a policy further from the one that "
                "sampled it"),
    Expectation("train_batch_size", "loss/clip_frac", False,
                "a smaller train batch takes more optimizer steps per rollout batch, so its later steps are "
                "further off-policy"),
    Expectation("k", "loss/clip_frac", True,
                "the later of k batches sampled by one policy version are trained on after more updates"),
    Expectation("policy_lag", "loss/clip_frac", True,
                "a generator further behind the learner samples from an older policy"),
    Expectation("math.prompt", VAL, False,
                "our base model was pretrained only on r1_zero-style prompts and solutions, which end in "
                "<answer> tags and never in \\boxed{}: a question-only prompt is unlike anything it was trained "
                "on, and its reward function grades the last \\boxed{}, a form the model never wrote",
                "question_only", "r1_zero", window=1, only_if="math.base_model_dir"),
)


def flatten(settings: dict, prefix: str = "") -> dict:
    """Nested settings as dotted keys (``{"math": {"prompt": x}}`` -> ``{"math.prompt": x}``)."""
    out = {}
    for k, v in settings.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def pairs(fam: Family, e: Expectation) -> list[tuple[str, str]]:
    """(low, high) variant pairs that differ in ``e.key`` and in no other treatment setting."""
    flat = {v: flatten(fam.settings.get(v, {})) for v in fam.variants if fam.of(v)}
    if e.only_if and any(f.get(e.only_if) for f in flat.values()):
        return []
    keys = set().union(*(f.keys() for f in flat.values())) if flat else set()
    treatment = {k for k in keys if len({repr(f.get(k)) for f in flat.values()}) > 1} - CADENCE_KEYS
    if e.key not in treatment:
        return []
    groups: dict[str, list[str]] = {}
    for v, f in flat.items():
        groups.setdefault(repr(sorted((k, repr(f.get(k))) for k in treatment - {e.key})), []).append(v)
    out = []
    for members in groups.values():
        if e.high is None:
            numeric = [v for v in members if isinstance(flat[v].get(e.key), (int, float))]
            ordered = sorted(numeric, key=lambda v: flat[v][e.key])
            out += [(a, b) for a, b in pairwise(ordered) if flat[a][e.key] != flat[b][e.key]]
        else:
            lows = [v for v in members if flat[v].get(e.key) == e.low]
            highs = [v for v in members if flat[v].get(e.key) == e.high]
            out += [(a, b) for a in lows for b in highs]
    return out


def at_common_step(fam: Family, a: str, b: str, signal: str, window: int) -> tuple[float, float, float]:
    """(step, value of a, value of b): the seed means at the last step both logged, over ``window`` steps."""
    curves = []
    for v in (a, b):
        reps = []
        for r in fam.of(v):
            m = r.run.metrics
            m = m[m["step"] >= (0 if signal == VAL else 1)]
            if signal in m.columns:
                reps.append(replicate_frame(m["step"], m[signal]))
        curves.append(band(reps, window).set_index("step")["mean"] if reps else pd.Series(dtype=float))
    common = sorted(set(curves[0].dropna().index) & set(curves[1].dropna().index))
    if not common:
        return math.nan, math.nan, math.nan
    step = common[-1]
    return float(step), float(curves[0][step]), float(curves[1][step])


def _named(fam: Family, v: str, key: str) -> str:
    """The variant with its setting, 'kl005 (kl_coef 0.05)'; just the name when it is the value."""
    value = flatten(fam.settings.get(v, {})).get(key)
    if str(value) == v:
        return v
    return f"{v} ({key} {value:g})" if isinstance(value, float) else f"{v} ({key} {value})"


def shows(e: Expectation, low_value: float, high_value: float) -> bool:
    """Whether the high setting's value lies beyond the low one's by more than MARGIN, in the expected way."""
    diff = high_value - low_value
    return (diff > 0) == e.raises and abs(diff) > MARGIN * max(abs(low_value), abs(high_value))


def check(fam: Family, e: Expectation) -> str | None:
    """The expectation's sentence for this family (None when the family does not vary its setting,
    or no pair logged the signal at a common step)."""
    found = []
    for a, b in pairs(fam, e):
        step, va, vb = at_common_step(fam, a, b, e.signal, e.window)
        if math.isfinite(va) and math.isfinite(vb):
            found.append((a, b, step, va, vb))
    if not found:
        return None
    verb = "raises" if e.raises else "lowers"
    what = (f"{e.key} {e.high} (vs {e.low})" if e.high is not None else f"a larger {e.key}")
    label = LABELS.get(e.signal, e.signal)
    where = ("at the same step" if e.window <= 1 else
             f"averaged over the {e.window} steps up to the same step")
    facts = "; ".join(f"at step {step:.0f}, {_named(fam, b, e.key)} {fnum(vb)} vs {_named(fam, a, e.key)} {fnum(va)}"
                      for a, b, step, va, vb in found)
    seeds = seeds_phrase([len(fam.of(v)) for a, b, *_ in found for v in (a, b)])
    if all(shows(e, va, vb) for _, _, _, va, vb in found):
        return (f"{PREFIX_SHOWN} {what} {verb} the {label}, because {e.why}; the runs show it ({label} "
                f"{where}, {seeds}): {facts}.")
    return (f"{PREFIX_NOT_SHOWN} {what} is expected to {verb[:-1]} the {label}, because {e.why}; the data do not "
            f"show the expected effect ({label} {where}, {seeds}; a direction counts when the gap exceeds "
            f"{100 * MARGIN:.0f}% of the larger value): {facts}.")


def expectation_sentences(fam: Family) -> list[str]:
    """Every expectation that applies to this family, each stated as shown or not shown."""
    return [s for e in EXPECTATIONS if (s := check(fam, e))]
