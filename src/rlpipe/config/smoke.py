"""The smoke switch: ``smoke.enabled: true`` shrinks every track, the user's included, in the loader.

A smoke run checks that every stage, rule, figure and report works, in minutes; its numbers mean
nothing. An overlay cannot shrink a track it does not know by name (a user's ``tracks.<name>``), and
Snakemake merges overlays key by key but replaces a list whole, so an overlay that shrank lists
(``workflow.families``, ``workflow.toy_sort_seeds``) silently replaced the user's. The smoke settings
are therefore caps that the loader applies to whatever the merged config holds, and never a list:

- every train section (the shared one, each track's and family's base, and each variant of each,
  once resolved: ``resolve_variant``):
  ``n_grpo_steps`` (kept a multiple of ``k``: a variant whose ``k`` does not divide the steps it
  inherits has them rounded up to the next multiple, said once on stderr), prompts per rollout
  batch (``rollout_batch_size / group_size``, at least one group; ``train_batch_size`` shrunk with
  it to a divisor holding whole groups), the
  validation, checkpoint, rollout-log and KL intervals (at most the steps), ``val_size``;
- every pretraining section (keyword, math, each user track): ``max_steps``, ``eval_every``,
  ``warmup_steps``;
- every track's ``eval_size``, every family's ``replicates``;
- the built-in extras' lists, shortened but never replaced: the first ``toy_sort_seeds`` seeds, the
  weight-sync bench's sizes up to ``bench_max_mb``, the first ``scaling_*`` points of each sweep;
- the sampler bench's compiled and AOT decoders (``workflow.bench_sampler_builds``), switched off.

A value already below its cap is kept, so the caps only ever shrink. ``config/smoke.yaml`` switches
it on (with the keyword track's own small model and data); ``overlay_list_replacements`` names each
list one command-line overlay replaces in another, which the workflow prints as a warning.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar

from pydantic import Field

from rlpipe.config.base import _Section


class SmokeConfig(_Section):
    """Caps a smoke run applies to every track (see ``rlpipe.config.smoke``)."""

    _prefix: ClassVar[str] = "smoke"

    enabled: bool = Field(
        False, description="Shrink every track (the built-in ones and the user's), family and benchmark to the caps "
        "below (config/smoke.yaml sets it): a run that checks the stages, not one whose numbers mean anything.")
    grpo_steps: int = Field(4, ge=1, description="At most this many GRPO steps per run (a multiple of the run's k).")
    prompts_per_step: int = Field(2, ge=1, description="At most this many prompts (groups) per rollout batch.")
    val_size: int = Field(8, ge=1, description="At most this many validation prompts.")
    eval_size: int = Field(8, ge=1, description="At most this many examples per track evaluation.")
    pretrain_steps: int = Field(40, ge=1, description="At most this many pretraining steps per track.")
    replicates: int = Field(2, ge=1, description="At most this many seeds per experiment family.")
    toy_sort_seeds: int = Field(2, ge=0, description="Keep the first N of workflow.toy_sort_seeds.")
    toy_sort_epochs: int = Field(5, ge=1, description="At most this many epochs per toy-sorting run.")
    bench_max_mb: float = Field(
        10, gt=0, description="Keep the weight-sync bench sizes up to this (the smallest is always kept).")
    sampler_builds: bool = Field(
        False, description="Keep workflow.bench_sampler_builds (the sampler bench's compiled and AOT decoders: "
        "minutes of compiling on a CPU, which the tests cover apart).")
    scaling_sizes: int = Field(1, ge=0, description="Keep the first N of workflow.scaling_sizes.")
    scaling_batches: int = Field(0, ge=0, description="Keep the first N of workflow.scaling_batches.")
    scaling_lengths: int = Field(0, ge=0, description="Keep the first N of workflow.scaling_lengths.")


#: train intervals that must not exceed a run's steps
_INTERVALS = ("val_every", "log_rollouts_every", "checkpoint_every", "kl_monitor_every")


_SAID: set[str] = set()


def say_once(message: str) -> None:
    """Print a smoke adjustment on stderr once per process (the config is loaded many times)."""
    if message not in _SAID:
        _SAID.add(message)
        print(f"rlpipe: smoke: {message}", file=sys.stderr, flush=True)


def smoke_steps(n: int, k: int, cap: int, where: str = "train") -> int:
    """``n_grpo_steps`` under the cap, a multiple of ``k``: capped down to the largest multiple of ``k``
    within ``cap`` (at least ``k``), and rounded up to the next multiple of ``k`` where a value already
    below the cap is not one (a variant's ``k`` over the shared section's shrunk steps), said once."""
    steps = min(n, max(k, cap // k * k))
    if steps % k:
        up = -(-steps // k) * k
        say_once(f"{where}.n_grpo_steps {steps} rounded up to {up}, a multiple of its k ({k})")
        steps = up
    return steps


def shrink_train(train: dict[str, Any], s: SmokeConfig, where: str = "train") -> dict[str, Any]:
    """A resolved train section (plain data, every key present) under the smoke caps; ``where`` names
    it in what is said of a value rounded up."""
    out = dict(train)
    k, g = out["k"], out["group_size"]
    out["n_grpo_steps"] = smoke_steps(out["n_grpo_steps"], k, s.grpo_steps, where)
    # at least one group: a track that sets a larger group_size than the batch it inherits still fits
    rollout = max(1, min(out["rollout_batch_size"] // g, s.prompts_per_step)) * g
    accum = out["gradient_accumulation_steps"]
    fits = [t for t in range(min(out["train_batch_size"], rollout) // g * g, 0, -g)
            if rollout % t == 0 and t % accum == 0]
    out["rollout_batch_size"], out["train_batch_size"] = rollout, fits[0] if fits else g
    if not fits:  # no whole-group batch divides by the accumulation: one microbatch per step
        out["gradient_accumulation_steps"] = 1
    for key in _INTERVALS:
        out[key] = min(out[key], out["n_grpo_steps"])
    out["val_size"] = min(out["val_size"], s.val_size)
    return out


def smoke_train(train: dict[str, Any], s: SmokeConfig, where: str = "train") -> dict[str, Any]:
    """``shrink_train`` of a merged train section before it is validated (a track's or family's base:
    the shared section it inherits is already shrunk, and its own overrides may not fit that); left
    as it is when it is not a whole, well-typed section, so that validation names the bad key."""
    if not s.enabled:
        return train
    try:
        return shrink_train(train, s, where)
    except (KeyError, TypeError, ZeroDivisionError):
        return train


def _shrink_pretrain(pre: dict[str, Any], s: SmokeConfig) -> None:
    pre["max_steps"] = min(pre["max_steps"], s.pretrain_steps)
    pre["eval_every"] = min(pre["eval_every"], pre["max_steps"])
    pre["warmup_steps"] = min(pre["warmup_steps"], pre["max_steps"] // 2)


def shrink_pipeline(data: dict[str, Any], s: SmokeConfig) -> dict[str, Any]:
    """A whole resolved pipeline config (``to_dict`` of a ``PipelineConfig``) under the caps (the
    variants' train sections: ``resolve_variant``, once each is resolved)."""
    out = dict(data)
    out["train"] = shrink_train(out["train"], s)  # the shared section: the keyword track's and the benchmarks'
    for pre in [out["pretrain"], out["math"]["pretrain"], *(t["pretrain"] for t in out["tracks"].values() if t)]:
        _shrink_pretrain(pre, s)
    for t in [out["math"], *(t for t in out["tracks"].values() if t)]:
        t["eval_size"] = min(t["eval_size"], s.eval_size)
    for fam in out["families"].values():
        if fam:
            fam["replicates"] = min(fam["replicates"], s.replicates)
    w = out["workflow"]
    w["toy_sort_seeds"] = w["toy_sort_seeds"][:s.toy_sort_seeds]
    w["toy_sort_epochs"] = min(w["toy_sort_epochs"] or s.toy_sort_epochs, s.toy_sort_epochs)
    w["bench_sizes_mb"] = [mb for mb in w["bench_sizes_mb"] if mb <= s.bench_max_mb] or [min(w["bench_sizes_mb"])]
    w["bench_sampler_builds"] = w["bench_sampler_builds"] and s.sampler_builds
    for key in ("scaling_sizes", "scaling_batches", "scaling_lengths"):
        w[key] = w[key][:getattr(s, key)]
    return out


def _lists(data: Any, prefix: str = "") -> dict[str, list]:
    """Every list in nested mappings, by dotted key."""
    if isinstance(data, list):
        return {prefix: data}
    if not isinstance(data, dict):
        return {}
    out = {}
    for k, v in data.items():
        out.update(_lists(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def overlay_list_replacements(overlays: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One message per list that a later overlay replaces in an earlier one (Snakemake merges
    overlays key by key, but a list whole), given (file name, its mapping) in command-line order."""
    seen: dict[str, tuple[str, list]] = {}
    messages = []
    for name, data in overlays:
        for key, value in _lists(data).items():
            if key in seen and seen[key][1] != value:
                messages.append(f"{name} replaces {key}: {seen[key][1]} (set by {seen[key][0]}) with {value}; "
                                "Snakemake merges config files key by key but replaces a list whole: put the file "
                                "whose list you want last")
            seen[key] = (name, value)
    return messages
