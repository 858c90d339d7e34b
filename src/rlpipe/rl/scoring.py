"""Reward scoring of a rollout batch: rewards, group advantages and train-reward metrics.

Used by the ColocatedWorker, by the Scorer actor, and by the disaggregated driver when no Scorer
actor is configured. ``use_std_normalization: false`` turns the default ``normalized_rewards``
delta mode into ``centered_rewards`` (Dr. GRPO Eq. 4), so the seed-001 switch keeps its meaning.

A reward function that fails on one sample must not stop the step: the rewards come through
``rlpipe.rl.reward_guard.guarded_rewards`` (a deadline per sample; a failed sample scores 0 with a
warning), and the failures in the rollout batch the step trained on are its ``reward/errors`` metric.

Besides the reward, every text task's reward dict has ``format_reward`` and ``answer_reward``
(``rlpipe.tasks.reward_dict``): their means are logged for the train batch (``reward/format_mean``,
``reward/answer_mean``) and for validation (``reward/val_format_mean``, ``reward/val_answer_mean``,
``reward_means``), so a run shows whether the policy learns the format, the answers, or both. A key a
task's reward dict lacks is left out (its column stays NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlpipe.rl.advantages import compute_advantages, reward_stats
from rlpipe.rl.records import RolloutBatch
from rlpipe.rl.reward_guard import guarded_rewards

ERRORS_METRIC = "reward/errors"


def reward_means(scores: Sequence[dict], prefix: str = "reward/train") -> dict[str, float]:
    """``{<prefix>_mean, <prefix>_format_mean, <prefix>_answer_mean}`` of reward dicts (the last two
    only when every dict has ``format_reward`` / ``answer_reward``); ``reward/train`` names the
    format and answer means ``reward/format_mean`` and ``reward/answer_mean``."""
    n = max(1, len(scores))
    out = {f"{prefix}_mean": sum(float(s["reward"]) for s in scores) / n}
    for key, name in (("format_reward", "format"), ("answer_reward", "answer")):
        if scores and all(key in s for s in scores):
            column = f"reward/{name}_mean" if prefix == "reward/train" else f"{prefix}_{name}_mean"
            out[column] = sum(float(s[key]) for s in scores) / n
    return out


def advantage_mode(train_cfg) -> str:
    mode = train_cfg.advantage_mode
    if mode == "normalized_rewards" and not train_cfg.use_std_normalization:
        return "centered_rewards"
    return mode


def score_batch(batch: RolloutBatch, task, train_cfg) -> RolloutBatch:
    """Fill ``batch.rewards``/``batch.advantages`` (B,) and ``batch.reward_metrics`` in place."""
    scores, failures = guarded_rewards(task.reward, batch.responses, batch.ground_truths)
    raw = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)  # (B,)
    adv = compute_advantages(raw, batch.group_size, advantage_mode(train_cfg), train_cfg.advantage_eps)
    meta = reward_stats(raw, batch.group_size)
    batch.rewards, batch.advantages = raw, adv.float()
    lengths = torch.tensor([len(r) for r in batch.response_ids], dtype=torch.float32)
    batch.reward_metrics = {
        "reward/train_mean": float(raw.mean()),
        "reward/train_std": meta["reward/std"],
        "reward/zero_std_frac": float(meta["reward/zero_std_frac"]),
        **{k: float(v) for k, v in reward_means(scores).items() if k != "reward/train_mean"},
        ERRORS_METRIC: float(failures),
        "response/length_mean": float(lengths.mean()),
    }
    return batch
