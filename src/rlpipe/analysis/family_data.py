"""A family's replicates and the numbers the family report computes from them: per-variant means
with 95% intervals, divergence, and each variant's comparison with the reference, judged by the
report's one honesty rule (``rlpipe.analysis.findings``). ``rlpipe.analysis.families`` writes the
report from these; the module docstring there says how the numbers depart from the seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from rlpipe import contract
from rlpipe.analysis.aggregate import RunData, load_run, run_row
from rlpipe.analysis.findings import is_finding
from rlpipe.analysis.frames import col, last_valid
from rlpipe.analysis.stats import MeanCI, binomial_half_width, mean_ci, ratio_of_means, welch_difference
from rlpipe.config import ConfigError, family_pipeline, family_reference, load_config, resolve_variant

VAL = "reward/val_mean"
SMOOTH_STEPS = 5  # rolling window of the per-step health signals (train-batch noise)


@dataclass
class Replicate:
    variant: str
    seed: int
    run: RunData
    row: dict


@dataclass
class Family:
    name: str
    question: str
    reference: str
    variants: list[str]
    replicates: int
    x: str | None = None
    x_values: dict[str, object] = field(default_factory=dict)
    settings: dict[str, dict] = field(default_factory=dict)  # variant -> its resolved train section
    val_size: dict[str, int] = field(default_factory=dict)
    runs: list[Replicate] = field(default_factory=list)

    def of(self, variant: str) -> list[Replicate]:
        return [r for r in self.runs if r.variant == variant]


def _dotted(data: dict, key: str):
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def load_family(config: str, name: str, runs: list[tuple[str, int, str]]) -> Family:
    """The family's metadata from the pipeline config and its replicates' run directories
    (``runs``: (variant, seed, directory) triples)."""
    cfg = load_config(config)
    fp = family_pipeline(cfg, name)
    fam_cfg = cfg.families[name]
    fam = Family(name=name, question=fam_cfg.question, reference=family_reference(cfg, name),
                 variants=list(fp.variants), replicates=fam_cfg.replicates, x=fam_cfg.x)
    for v in fam.variants:
        train = resolve_variant(fp, v).model_dump()
        fam.val_size[v] = int(train["val_size"])
        fam.settings[v] = train
        if fam.x:
            fam.x_values[v] = _dotted(train, fam.x)
    for variant, seed, directory in runs:
        if variant not in fam.variants:
            raise ConfigError(f"families.{name}: run {directory} is of variant '{variant}', not in the family "
                              f"({', '.join(fam.variants)})")
        run = load_run(directory, variant)
        row = run_row(run)
        row["val_answer_final"] = last_valid(col(run.metrics, "reward/val_answer_mean"))
        fam.runs.append(Replicate(variant, seed, run, row))
    return fam


# --------------------------------------------------------------------------- numbers


def stat(fam: Family, variant: str, key: str) -> MeanCI:
    return mean_ci(r.row.get(key, math.nan) for r in fam.of(variant))


def noise(fam: Family, variant: str) -> float:
    """Validation sampling noise (95% half-width) of one run's final reward."""
    return binomial_half_width(stat(fam, variant, "val_reward_final").mean, fam.val_size.get(variant, 0))


def diverged(fam: Family, rep: Replicate) -> bool:
    r = rep.row
    if not r.get("finished", False):
        return True
    init, final = r.get("val_reward_initial", math.nan), r.get("val_reward_final", math.nan)
    if not (math.isfinite(init) and math.isfinite(final)):
        return False
    return final < init - binomial_half_width(init, fam.val_size.get(rep.variant, 0))


def variant_numbers(fam: Family, variant: str) -> dict:
    reps = fam.of(variant)
    out: dict = {"replicates": len(reps), "x": fam.x_values.get(variant),
                 "diverged": sum(diverged(fam, r) for r in reps),
                 "contended": sum(bool(r.row.get("contended")) for r in reps)}
    for key in contract.FAMILY_STATS:
        s = stat(fam, variant, key)
        out.update({f"{key}_mean": s.mean, f"{key}_ci": s.half, f"{key}_n": s.n})
    return out


def comparison(fam: Family, variant: str) -> dict:
    """``variant`` against the reference: final reward and samples/s, with verdicts."""
    ref = fam.reference

    def values(v: str, key: str) -> list[float]:
        return [r.row.get(key, math.nan) for r in fam.of(v)]

    reward = welch_difference(values(ref, "val_reward_final"), values(variant, "val_reward_final"))
    speed = welch_difference(values(ref, "samples_per_s"), values(variant, "samples_per_s"))
    ratio = ratio_of_means(values(ref, "samples_per_s"), values(variant, "samples_per_s"))
    contended = any(r.row.get("contended") for v in (ref, variant) for r in fam.of(v))
    band = max(noise(fam, ref), noise(fam, variant))
    return {"variant": variant, "reward_diff": reward.diff, "reward_ci": reward.half,
            "reward_verdict": is_finding(reward).reason,  # a reward does not depend on the machine's load
            "val_noise": band, "speed_ratio": ratio.ratio, "speed_ratio_lo": ratio.low, "speed_ratio_hi": ratio.high,
            "speed_diff": speed.diff, "speed_ci": speed.half,
            # decided on the ratio's interval, the one the sentence prints
            "speed_verdict": is_finding(ratio, contended, null=1.0).reason}


def start_end(fam: Family, variant: str, column: str) -> tuple[float, float]:
    """Seed-mean of a signal over the first and the last fifth of the run's steps (by step, not by
    logged row, so that runs logging at different cadences cover the same part of training)."""
    starts, ends = [], []
    for r in fam.of(variant):
        m = r.run.metrics[r.run.metrics["step"] >= 1]
        d = pd.DataFrame({"step": m["step"].astype(float), "y": col(m, column)}).dropna()
        if len(d):
            lo, hi = float(d["step"].min()), float(d["step"].max())
            fifth = (hi - lo) / 5
            starts.append(float(d.loc[d["step"] <= lo + fifth, "y"].mean()))
            ends.append(float(d.loc[d["step"] >= hi - fifth, "y"].mean()))
    return mean_ci(starts).mean, mean_ci(ends).mean


def health_numbers(fam: Family) -> dict[str, dict[str, list[float]]]:
    """Per variant, each health signal's [first fifth, last fifth] seed mean (family.json ``health``;
    a signal a variant never logged is left out)."""
    out: dict[str, dict[str, list[float]]] = {}
    for v in fam.variants:
        pairs = {c: start_end(fam, v, c) for c in contract.HEALTH_COLUMNS}
        out[v] = {c: [a, b] for c, (a, b) in pairs.items() if math.isfinite(a) and math.isfinite(b)}
    return out
