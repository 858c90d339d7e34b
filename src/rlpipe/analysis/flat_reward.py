"""Why a run's validation reward did not rise: a diagnosis from its own metrics.

``diagnose(metrics, val_size)`` reads one run's ``metrics.parquet`` (the run-output contract) and,
when the validation reward did not rise beyond its noise, names the signal that explains it, with
its numbers and what to try. The trainer prints it at the end of a run (``rlpipe train``'s log),
``rlpipe aggregate`` puts it in the discussion page (the keyword track's and each timed user
track's) and the summary table, and ``rlpipe results-page`` a sentence per flat run in
``RESULTS.md``. Pure pandas: no torch, no Ray.

Where to look: what "flat" means, ``val_rise``; the signals, their thresholds and why those,
``causes``; how several signals are ranked, ``rank``; the learning-rate signals and a family's
peers, ``_kl_causes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from rlpipe.analysis.frames import col
from rlpipe.contract import METRICS_FILE, RUN_CONFIG_FILE, RUN_INFO_FILE

#: signal thresholds (see ``causes``)
THRESHOLDS = {
    "saturated_low": 0.05, "saturated_high": 0.95, "entropy_ratio": 0.25, "entropy_floor": 0.05,
    "zero_std_frac": 0.5, "clip_frac": 0.2, "prev_k3_small": 1e-5, "ref_k3_small": 1e-3, "ref_k3_drift": 0.05,
}
#: roots named before their consequences, whatever the strengths (``rank``)
ROOTS = {"saturated_0": ("zero_std", "lr_small"), "saturated_1": ("zero_std", "lr_small"), "entropy": ("zero_std",)}
#: a rise below this many standard errors of itself is "flat"
NOISE_SIGMAS = 2.0
#: validation points needed to read the noise off the curve (without val_size)
CURVE_POINTS = 5


@dataclass(frozen=True)
class Cause:
    """One signal that holds: its name, what was measured and what to try."""

    name: str
    evidence: str
    advice: str
    #: e-folds past its threshold (``rank``); the ranking's key
    strength: float = 0.0


@dataclass(frozen=True)
class Peer:
    """A run of the same family at another learning rate: its label, learning rate, final KL to the
    reference and whether its validation reward rose beyond its noise."""

    label: str
    learning_rate: float
    ref_kl_final: float
    rose: bool


@dataclass(frozen=True)
class Diagnosis:
    """A flat run: its rise and noise, and every cause that holds (``causes[0]`` the primary)."""

    initial: float
    final: float
    rise: float
    noise: float
    causes: list[Cause] = field(default_factory=list)

    @property
    def cause(self) -> str:
        return self.causes[0].name if self.causes else "unexplained"

    def sentence(self, label: str = "this run") -> str:
        head = (f"The validation reward of {label} did not rise beyond its noise ({self.initial:.3f} at step 0, "
                f"{self.final:.3f} over the last half of the run: {self.rise:+.3f}, noise {self.noise:.3f}).")
        if not self.causes:
            return (f"{head} None of the signals (zero-variance groups, saturation, entropy, clipping, KL, the "
                    "update's size) explains it: try more steps (train.n_grpo_steps) or a larger "
                    "train.val_size to see a small gain.")
        first = self.causes[0]
        also = "; ".join(c.evidence for c in self.causes[1:])
        return f"{head} Likely cause: {first.evidence}. Try: {first.advice}." + (f" Also: {also}." if also else "")

    def to_json(self) -> dict:
        return {"initial": self.initial, "final": self.final, "rise": self.rise, "noise": self.noise,
                "cause": self.cause, "causes": [c.__dict__ for c in self.causes], "sentence": self.sentence()}


def _train_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    return metrics[col(metrics, "step") >= 1] if "step" in metrics.columns else metrics


def _mean(s: pd.Series) -> float:
    s = s.dropna()
    return float(s.mean()) if len(s) else math.nan


def _quarter(s: pd.Series, last: bool) -> float:
    s = s.dropna()
    if not len(s):
        return math.nan
    n = max(1, len(s) // 4)
    return float((s.iloc[-n:] if last else s.iloc[:n]).mean())


def val_rise(metrics: pd.DataFrame, val_size: int | None = None) -> tuple[float, float, float, float] | None:
    """(initial, final, rise, noise) of the validation reward, or None when it cannot be judged
    (fewer than two validation points, or no ``val_size`` and fewer than ``CURVE_POINTS``).

    Flat: the rise (the mean validation reward over the last half of the validation points minus the
    first one, step 0's) is below ``NOISE_SIGMAS`` (twice) its standard error. For a reward in
    [0, 1] with mean p, one sample's variance is at most p(1 - p), so a validation mean over
    ``val_size`` prompts has a standard error of at most sqrt(p(1 - p) / val_size); without
    ``val_size`` (or for a reward outside [0, 1]) the noise is read off the curve itself (the
    points' scatter around a straight-line fit), which needs ``CURVE_POINTS`` (five) points."""
    val = col(metrics.sort_values("step") if "step" in metrics.columns else metrics, "reward/val_mean").dropna()
    if len(val) < 2:
        return None
    initial = float(val.iloc[0])
    later = val.iloc[1:]
    tail = later.iloc[len(later) // 2:]
    final = float(tail.mean())
    in_unit = bool(((val >= 0) & (val <= 1)).all())
    if val_size and in_unit:
        se0 = math.sqrt(max(initial * (1 - initial), 1e-12) / val_size)
        se1 = math.sqrt(max(final * (1 - final), 1e-12) / (val_size * len(tail)))
        noise = NOISE_SIGMAS * math.hypot(se0, se1)
    elif len(val) >= CURVE_POINTS:
        y = val.to_numpy()
        x = np.arange(len(y), dtype=float)
        resid = y - np.polyval(np.polyfit(x, y, 1), x)  # scatter around the trend, not the trend
        point_se = math.sqrt(float(resid @ resid) / (len(y) - 2))
        noise = NOISE_SIGMAS * point_se * math.sqrt(1 + 1 / len(tail))
    else:
        return None
    return initial, final, final - initial, noise


def _e(ratio: float) -> float:
    """Strength in e-folds of a ratio >= 1 (value over threshold, or threshold over value)."""
    return math.log(max(ratio, 1.0)) if math.isfinite(ratio) and ratio > 0 else 0.0


def _reward_causes(metrics: pd.DataFrame, rows: pd.DataFrame) -> list[Cause]:
    """Saturation, entropy collapse, zero-variance groups, clipping."""
    t, found = THRESHOLDS, []
    train_mean, val = _mean(col(rows, "reward/train_mean")), col(metrics, "reward/val_mean").dropna()
    in_unit = bool(((val >= 0) & (val <= 1)).all()) and 0 <= train_mean <= 1
    if in_unit and train_mean <= t["saturated_low"]:
        found.append(Cause("saturated_0", f"the training reward averaged {train_mean:.3f}: almost no sample earns "
                           "a reward, so almost every group gives zero advantage",
                           "an easier task or a partial reward (a format reward beside the answer), a base model "
                           "pretrained longer, or a larger train.group_size so that a group holds a success",
                           _e(t["saturated_low"] / max(train_mean, 1e-6))))
    elif in_unit and train_mean >= t["saturated_high"]:
        found.append(Cause("saturated_1", f"the training reward averaged {train_mean:.3f}: the base model already "
                           "solves the task, so there is nothing left to learn",
                           "harder prompts or a stricter reward, to leave GRPO headroom",
                           _e((1 - t["saturated_high"]) / max(1 - train_mean, 1e-6))))
    ent = col(rows, "policy/entropy")
    e0, e1 = _quarter(ent, last=False), _quarter(ent, last=True)
    if e0 > 0 and (e1 / e0 <= t["entropy_ratio"] or e1 <= t["entropy_floor"]):
        found.append(Cause("entropy", f"the policy's entropy collapsed from {e0:.3f} to {e1:.3f} nats per token: it "
                           "samples nearly one response per prompt",
                           "a lower train.learning_rate, a higher train.sampling_temperature, or a KL penalty "
                           "(train.kl_coef)",
                           max(_e(t["entropy_ratio"] * e0 / max(e1, 1e-9)), _e(t["entropy_floor"] / max(e1, 1e-9)))))
    zero = _mean(col(rows, "reward/zero_std_frac"))
    if zero >= t["zero_std_frac"]:
        found.append(Cause("zero_std", f"{zero:.0%} of the groups had identical rewards (reward/zero_std_frac), "
                           "and such a group gives zero advantage",
                           "a larger train.group_size, a higher train.sampling_temperature, or partial credit in "
                           "the reward", _e(zero / t["zero_std_frac"])))
    clip = _mean(col(rows, "loss/clip_frac"))
    if clip >= t["clip_frac"]:
        found.append(Cause("clip", f"{clip:.0%} of the tokens were clipped (loss/clip_frac): the updates leave "
                           "the trust region and are cut off",
                           "a lower train.learning_rate or train.epochs_per_rollout_batch, or a larger "
                           "train.cliprange", _e(clip / t["clip_frac"])))
    return found


def final_ref_kl(metrics: pd.DataFrame) -> float:
    """The last logged kl/ref_k3 of the training rows (NaN when none)."""
    ref = col(_train_rows(metrics), "kl/ref_k3").dropna()
    return float(ref.iloc[-1]) if len(ref) else math.nan


_LR_ADVICE = "a larger train.learning_rate (3-10x), or more train.epochs_per_rollout_batch"


def _kl_causes(rows: pd.DataFrame, zero: float, peers: list[Peer], lr: float | None) -> list[Cause]:
    """The update's size: too small (alone, discounted by the zero-variance groups, or against a peer
    at a larger learning rate that moved further and learned) or a drift without a gain.

    A still policy is discounted by what zero-variance groups explain: a fraction z of groups with
    zero advantage shrinks the update by (1 - z), so its KL by at most (1 - z)^2, and ``lr_small``
    keeps only the strength left after that (it is dropped when none is left). ``kl_drift`` is the
    weakest when a run of the same family at a larger learning rate (a peer, see
    ``results_section``) moved the policy further and its reward rose: the policy of this run then
    moved *less* than one that learned, which is the too-small learning rate (``lr_small``, with
    the peer's numbers and a strength of log(peer KL / this KL)), not a drift."""
    t, found = THRESHOLDS, []
    prev = col(rows, "kl/prev_k3").dropna()
    ref_final = final_ref_kl(rows)
    prev_med = float(prev.median()) if len(prev) else math.nan
    moved = prev_med if not math.isnan(prev_med) else ref_final
    # zero-variance groups shrink the update by (1 - z), its KL by at most (1 - z)^2
    explained = (1 - zero) ** 2 if zero >= t["zero_std_frac"] else 1.0
    if not math.isnan(moved) and moved <= t["prev_k3_small"] and not ref_final > t["ref_k3_small"]:
        strength = _e(t["prev_k3_small"] * explained / max(moved, 1e-12))
        if strength > 0:
            found.append(Cause("lr_small", f"the updates barely moved the log-probs (KL between successive policies "
                               f"{prev_med:.1e} per step, final KL to the reference {ref_final:.1e})",
                               _LR_ADVICE, strength))
    learned = [p for p in peers if p.rose and lr is not None and p.learning_rate > lr
               and math.isfinite(p.ref_kl_final) and p.ref_kl_final > ref_final > 0]
    if learned and not found:
        p = max(learned, key=lambda p: p.ref_kl_final / ref_final)
        found.append(Cause("lr_small", f"the learning rate was too small to move the policy: final KL to the "
                           f"reference {ref_final:.3f}, where {p.label} at a {p.learning_rate / lr:.1f}x larger "
                           f"learning rate moved it {p.ref_kl_final / ref_final:.1f}x further "
                           f"({p.ref_kl_final:.3f}) and its reward rose", _LR_ADVICE,
                           _e(p.ref_kl_final / ref_final)))
    if ref_final >= t["ref_k3_drift"]:
        found.append(Cause("kl_drift", f"the policy drifted from the reference (final KL {ref_final:.3f}) "
                           "without a reward gain: what it changes is not what the reward pays for",
                           "read the rollouts against the reward (it may be noisy or reward something else), "
                           "and a lower train.learning_rate or a KL penalty (train.kl_coef)",
                           0.0 if learned else _e(ref_final / t["ref_k3_drift"])))
    return found


def rank(found: list[Cause]) -> list[Cause]:
    """Strongest first, a root before its consequences. Each ``Cause`` carries a ``strength``: how
    far past its threshold the signal is, in e-folds, ``log(value / threshold)`` or its inverse for
    a signal that is "too small". A root comes before its consequence whatever their strengths
    (``ROOTS``): saturation before zero-variance groups (every group then has identical rewards) and
    a collapsed entropy before them (a policy that samples one response per prompt gives identical
    rewards)."""
    ranked = sorted(found, key=lambda c: -c.strength)
    for root, consequences in ROOTS.items():
        at = [i for i, c in enumerate(ranked) if c.name == root]
        before = [i for i, c in enumerate(ranked) if c.name in consequences]
        if at and before and min(before) < at[0]:
            ranked.insert(min(before), ranked.pop(at[0]))
    return ranked


def causes(metrics: pd.DataFrame, peers: list[Peer] = (), learning_rate: float | None = None) -> list[Cause]:
    """Every signal of the table below that holds, ranked by how well it explains the run (``rank``).

    ==============  ==========================================  ===================================
    cause           signal (metrics column)                     threshold (``THRESHOLDS``)
    ==============  ==========================================  ===================================
    saturated_0/1   mean training reward (reward/train_mean)    <= 0.05 or >= 0.95 (rewards in [0, 1])
    entropy         policy/entropy, last quarter / first        <= 0.25, or last <= 0.05 nats
    zero_std        mean reward/zero_std_frac                   >= 0.5 of the groups
    clip            mean loss/clip_frac                         >= 0.2 of the tokens
    lr_small        median kl/prev_k3 (KL between successive    <= 1e-5 per step and final
                    policies) and final kl/ref_k3               kl/ref_k3 <= 1e-3
    kl_drift        final kl/ref_k3                             >= 0.05 with no reward gain
    ==============  ==========================================  ===================================

    The thresholds are our choices, not measured optima: each is a level at which the signal alone
    can stop GRPO from learning (half the groups giving no advantage halves the gradient; a KL of
    1e-5 nats per step is a log-prob change of about 0.3% per token), stated here so a reader can
    judge."""
    rows = _train_rows(metrics)
    found = _reward_causes(metrics, rows)
    zero = _mean(col(rows, "reward/zero_std_frac"))
    return rank(found + _kl_causes(rows, zero if math.isfinite(zero) else 0.0, list(peers), learning_rate))


def diagnose(metrics: pd.DataFrame, val_size: int | None = None, peers: list[Peer] = (),
             learning_rate: float | None = None) -> Diagnosis | None:
    """The diagnosis of a run whose validation reward did not rise beyond its noise; None when it
    rose, or when there are too few validation points to tell. ``peers``: runs of its family at other
    learning rates (``learning_rate`` is this run's)."""
    rise = val_rise(metrics, val_size)
    if rise is None or rise[2] >= rise[3]:
        return None
    initial, final, gain, noise = rise
    return Diagnosis(initial, final, gain, noise, causes(metrics, peers, learning_rate))


def log_line(metrics: pd.DataFrame, val_size: int | None, label: str, peers: list[Peer] = (),
             learning_rate: float | None = None) -> str | None:
    """The trainer's end-of-run line, or None when the reward rose."""
    d = diagnose(metrics, val_size, peers, learning_rate)
    return None if d is None else f"flat reward: {d.sentence(label)}"


def _read_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    cfg_path = run_dir / RUN_CONFIG_FILE
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else {}
    return pd.read_parquet(run_dir / METRICS_FILE), ((cfg or {}).get("train") or {})


def run_log_line(run_dir: str | Path, label: str) -> str | None:
    """``log_line`` for a finished run directory: its metrics and its config's ``train.val_size``."""
    metrics, train = _read_run(Path(run_dir))
    return log_line(metrics, train.get("val_size"), label)


def results_section(results: str | Path) -> list[str]:
    """RESULTS.md's "Flat rewards" section: a sentence for each run under ``results`` (every directory
    holding a run_info.json) whose validation reward did not rise; [] when every one rose. The runs of
    one ``runs/`` directory (a family's variants and seeds) are each other's peers."""
    root = Path(results)
    runs = {}
    for info in sorted(root.rglob(RUN_INFO_FILE)):
        if (info.parent / METRICS_FILE).is_file():
            runs[info.parent] = _read_run(info.parent)
    peers: dict[Path, list[tuple[Path, Peer]]] = {}
    for run_dir, (metrics, train) in runs.items():
        rise, lr = val_rise(metrics, train.get("val_size")), train.get("learning_rate")
        if rise is not None and isinstance(lr, (int, float)):
            peers.setdefault(run_dir.parent.parent, []).append((run_dir, Peer(
                run_dir.relative_to(root).as_posix(), float(lr), final_ref_kl(metrics), rise[2] >= rise[3])))
    lines = []
    for run_dir, (metrics, train) in runs.items():
        mine = [p for d, p in peers.get(run_dir.parent.parent, []) if d.parent != run_dir.parent]
        lr = train.get("learning_rate")
        line = log_line(metrics, train.get("val_size"), f"`{run_dir.relative_to(root).as_posix()}`", mine,
                        float(lr) if isinstance(lr, (int, float)) else None)
        if line:
            lines.append(f"- {line.removeprefix('flat reward: ')}")
    if not lines:
        return []
    return ["## Flat rewards", "", "Runs whose validation reward did not rise beyond its noise, each with the signal "
            "that explains it (rlpipe.analysis.flat_reward):", "", *lines, ""]
