"""Group-relative advantages: the delta modes, ``compute_advantages``, ``reward_stats`` and
``compute_group_normalized_rewards`` (seed 001 Problem 2; seed 003 ``compute_deltas``).

Shape letters: B rows (responses), G group size. Rows are prompt-major: rows ``g*G .. g*G+G-1``
are one prompt's group, so ``reshape(-1, G)`` gives the (B/G, G) grouped view.

How this departs from the seeds, and why:

* ``compute_advantages`` is the tensor-level core (seed 003's ``compute_deltas``) and
  ``compute_group_normalized_rewards`` (seed 001 Problem 2) scores responses and then calls it.
  The group std is torch's default Bessel-corrected std (``unbiased=True``), as the course reference
  and seed 003's ``rewards.std()`` do. A group whose rewards all tie gets advantage exactly 0 in the
  centered / normalized modes (seed 003: "if all rewards are equal -> no update occurs"); without
  this, float round-off in ``r - mean`` divided by ``0 + eps`` can produce O(1) advantages. A group
  of size 1 has no std; it always ties, so its advantage is 0.
* ``max_rewards`` follows seed 003's code (the reward itself where it is the group max, 0
  elsewhere), not its prose formula ``R - mean``; the code is the version that was run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "ADVANTAGE_MODES",
    "AdvantageMode",
    "compute_advantages",
    "compute_group_normalized_rewards",
    "reward_stats",
]

AdvantageMode = Literal["rewards", "centered_rewards", "normalized_rewards", "max_rewards"]


def _centered(grouped: Tensor, eps: float) -> Tensor:
    return grouped - grouped.mean(dim=-1, keepdim=True)  # (B/G, G)


def _normalized(grouped: Tensor, eps: float) -> Tensor:
    if grouped.shape[-1] == 1:  # unbiased std of one sample is undefined; the group ties anyway
        return torch.zeros_like(grouped)
    std = grouped.std(dim=-1, keepdim=True)  # (B/G, 1), Bessel-corrected like the course reference
    return _centered(grouped, eps) / (std + eps)  # (B/G, G)


def _max_only(grouped: Tensor, eps: float) -> Tensor:
    best = grouped.max(dim=-1, keepdim=True).values  # (B/G, 1)
    return torch.where(grouped == best, grouped, torch.zeros_like(grouped))  # (B/G, G)


# Delta modes (seed 003): (B/G, G) grouped rewards, eps -> (B/G, G) advantages.
ADVANTAGE_MODES: dict[str, Callable[[Tensor, float], Tensor]] = {
    "rewards": lambda grouped, eps: grouped.clone(),
    "centered_rewards": _centered,
    "normalized_rewards": _normalized,
    "max_rewards": _max_only,
}
# Modes that subtract the group mean: a fully tied group must give exactly zero there.
_BASELINED_MODES = ("centered_rewards", "normalized_rewards")


def _check_rewards(raw_rewards: Tensor, group_size: int) -> Tensor:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if raw_rewards.ndim != 1:
        raise ValueError(f"raw_rewards must have shape (B,), got {tuple(raw_rewards.shape)}")
    if raw_rewards.numel() == 0:
        raise ValueError("raw_rewards is empty")
    if raw_rewards.numel() % group_size != 0:
        raise ValueError(f"number of rewards ({raw_rewards.numel()}) must be divisible by group_size ({group_size})")
    bad = (~torch.isfinite(raw_rewards)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"raw_rewards[{i}] is {raw_rewards[i].item()}; rewards must be finite")
    return raw_rewards if raw_rewards.is_floating_point() else raw_rewards.float()


def compute_advantages(raw_rewards: Tensor, group_size: int, mode: AdvantageMode, advantage_eps: float) -> Tensor:
    """Per-response advantages from already-scored rewards (seed 003 ``compute_deltas``).

    Args:
        raw_rewards: (B,) rewards, prompt-major: rows ``g*G .. g*G+G-1`` are one prompt's group.
        group_size: G.
        mode: ``"rewards"`` (r), ``"centered_rewards"`` (r - mean, Dr. GRPO Eq. 4),
            ``"normalized_rewards"`` ((r - mean) / (std + eps), Eq. 1, Bessel-corrected std) or
            ``"max_rewards"`` (r where r is its group's max, else 0; seed 003's code).
        advantage_eps: added to the group std in ``normalized_rewards``.

    Returns:
        (B,) advantages. In the centered/normalized modes a group whose rewards all tie gets exactly 0.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; valid: {sorted(ADVANTAGE_MODES)}")
    if advantage_eps < 0:
        raise ValueError(f"advantage_eps must be >= 0, got {advantage_eps}")
    rewards = _check_rewards(raw_rewards, group_size)  # (B,)
    grouped = rewards.reshape(-1, group_size)  # (B/G, G)
    adv = ADVANTAGE_MODES[mode](grouped, advantage_eps)  # (B/G, G)
    if mode in _BASELINED_MODES:
        tied = grouped.amax(dim=-1, keepdim=True) == grouped.amin(dim=-1, keepdim=True)  # (B/G, 1)
        adv = torch.where(tied, torch.zeros_like(adv), adv)  # (B/G, G)
    return adv.reshape(-1)  # (B,)


def reward_stats(raw_rewards: Tensor, group_size: int) -> dict[str, float]:
    """``reward/{mean,std,min,max}`` over the batch (std Bessel-corrected, 0 for one reward) and
    ``reward/zero_std_frac``, the fraction of groups whose rewards all tie (zero advantage signal)."""
    rewards = _check_rewards(raw_rewards, group_size)  # (B,)
    grouped = rewards.reshape(-1, group_size)  # (B/G, G)
    tied = grouped.amax(dim=-1) == grouped.amin(dim=-1)  # (B/G,)
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "reward/min": rewards.min().item(),
        "reward/max": rewards.max().item(),
        "reward/zero_std_frac": tied.float().mean().item(),
    }


def compute_group_normalized_rewards(
    reward_fn: Callable[[str, str], Mapping[str, float]],
    rollout_responses: Sequence[str],
    repeated_ground_truths: Sequence[str],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """Score each response and normalize rewards within its group (seed 000 Eq. 1 / Dr. GRPO Eq. 4).

    Args:
        reward_fn: ``(response, ground_truth) -> {"reward", "format_reward", "answer_reward"}``.
        rollout_responses: B = n_prompts * G responses, prompt-major.
        repeated_ground_truths: B ground truths (each repeated G times).
        group_size: G.
        advantage_eps: added to the group std.
        normalize_by_std: divide by the group std (Eq. 1, Bessel-corrected) or only center (Eq. 4).

    Returns:
        advantages (B,), raw_rewards (B,) float32, and metadata: ``reward/mean|std|min|max``,
        ``reward/zero_std_frac`` and, when ``reward_fn`` returns them, the batch means
        ``reward/format_reward`` and ``reward/answer_reward``.
    """
    if len(rollout_responses) != len(repeated_ground_truths):
        raise ValueError(f"len(rollout_responses) ({len(rollout_responses)}) != "
                         f"len(repeated_ground_truths) ({len(repeated_ground_truths)})")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if len(rollout_responses) == 0 or len(rollout_responses) % group_size != 0:
        raise ValueError(f"len(rollout_responses) ({len(rollout_responses)}) must be a positive "
                         f"multiple of group_size ({group_size})")
    scores = []
    for i, (response, truth) in enumerate(zip(rollout_responses, repeated_ground_truths, strict=True)):
        score = reward_fn(response, truth)
        if not isinstance(score, Mapping) or "reward" not in score:
            raise ValueError(f"reward_fn must return a mapping with key 'reward'; got {score!r} for response {i}")
        scores.append(score)
    raw_rewards = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)  # (B,)
    mode = "normalized_rewards" if normalize_by_std else "centered_rewards"
    advantages = compute_advantages(raw_rewards, group_size, mode, advantage_eps)  # (B,)
    metadata = reward_stats(raw_rewards, group_size)
    for key in ("format_reward", "answer_reward"):
        if all(key in s for s in scores):
            metadata[f"reward/{key}"] = sum(float(s[key]) for s in scores) / len(scores)
    return advantages, raw_rewards, metadata
