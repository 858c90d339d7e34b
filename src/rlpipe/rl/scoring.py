"""Reward scoring of a rollout batch: rewards, group advantages and train-reward metrics.

Used by the ColocatedWorker, by the Scorer actor, and by the disaggregated driver when no Scorer
actor is configured. ``use_std_normalization: false`` turns the default ``normalized_rewards``
delta mode into ``centered_rewards`` (Dr. GRPO Eq. 4), so the seed-001 switch keeps its meaning.
"""

from __future__ import annotations

import torch

from rlpipe.rl.advantages import compute_advantages, reward_stats
from rlpipe.rl.records import RolloutBatch


def advantage_mode(train_cfg) -> str:
    mode = train_cfg.advantage_mode
    if mode == "normalized_rewards" and not train_cfg.use_std_normalization:
        return "centered_rewards"
    return mode


def score_batch(batch: RolloutBatch, task, train_cfg) -> RolloutBatch:
    """Fill ``batch.rewards``/``batch.advantages`` (B,) and ``batch.reward_metrics`` in place."""
    scores = [task.reward(r, gt) for r, gt in zip(batch.responses, batch.ground_truths, strict=True)]
    raw = torch.tensor([s["reward"] for s in scores], dtype=torch.float32)  # (B,)
    adv = compute_advantages(raw, batch.group_size, advantage_mode(train_cfg), train_cfg.advantage_eps)
    meta = reward_stats(raw, batch.group_size)
    batch.rewards, batch.advantages = raw, adv.float()
    lengths = torch.tensor([len(r) for r in batch.response_ids], dtype=torch.float32)
    batch.reward_metrics = {
        "reward/train_mean": float(raw.mean()),
        "reward/train_std": meta["reward/std"],
        "reward/zero_std_frac": float(meta["reward/zero_std_frac"]),
        "reward/format_mean": float(sum(s["format_reward"] for s in scores) / len(scores)),
        "response/length_mean": float(lengths.mean()),
    }
    return batch
