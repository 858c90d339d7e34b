"""Per-token policy-gradient losses and the ``loss_type`` dispatch (seed 001 Problems 3-5, seed 004
GRPO-No-Clip).

Shape letters: B rows (responses), T sequence positions.

Every loss type is a pure function of its inputs, registered in ``_LOSSES`` as a ``_LossSpec``
(the arguments it requires and a function returning ``(per-token loss (B, T), metrics)``); metric
keys are namespaced (``loss/clip_frac``, ``loss/clipped_mask``, ``loss/ratio``). Nothing here
reduces over tokens, touches gradients or mutates its inputs: ``rlpipe.rl.train_step`` does that.

How this departs from the seeds, and why:

* Ratios are ``exp(logp - old_logp)`` (seed 003 §4.2), not seed 003's ``log_probs / old_log_probs``
  in ``compute_loss``, which is not an importance ratio. ``old_log_probs`` is always detached
  (seed 003: differentiating through pi_old collapses the gradient).
* ``grpo_no_clip`` is seed 004's "GRPO-No-Clip" loss type, spelled like the other loss types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = [
    "LOSS_TYPES",
    "RATIO_LOSS_TYPES",
    "LossType",
    "compute_grpo_clip_loss",
    "compute_grpo_no_clip_loss",
    "compute_naive_policy_gradient_loss",
    "compute_policy_gradient_loss",
]

LossType = Literal["no_baseline", "reinforce_with_baseline", "grpo_clip", "grpo_no_clip"]
LossOutput = tuple[Tensor, dict[str, Tensor]]  # (B, T) per-token loss, namespaced metrics


def _per_row(values: Tensor, batch: int, name: str) -> Tensor:
    """(B,) or (B, 1) -> (B, 1), so it broadcasts over the T positions."""
    if values.ndim == 1:
        values = values.unsqueeze(-1)  # (B, 1)
    if values.ndim != 2 or values.shape != (batch, 1):
        raise ValueError(f"{name} must have shape ({batch}, 1) or ({batch},), got {tuple(values.shape)}")
    return values


def _check_log_probs(policy_log_probs: Tensor, other: Tensor | None = None, other_name: str = "") -> None:
    """``policy_log_probs`` must be (B, T) and ``other`` (if given) the same shape."""
    if policy_log_probs.ndim != 2:
        raise ValueError(f"policy_log_probs must have shape (B, T), got {tuple(policy_log_probs.shape)}")
    if other is not None and other.shape != policy_log_probs.shape:
        raise ValueError(f"{other_name} shape {tuple(other.shape)} != policy_log_probs shape "
                         f"{tuple(policy_log_probs.shape)}")


def compute_naive_policy_gradient_loss(raw_rewards_or_advantages: Tensor, policy_log_probs: Tensor) -> Tensor:
    """Per-token ``-A * log pi(o_t)`` (seed 000 Eq. 5).

    Args:
        raw_rewards_or_advantages: (B, 1) or (B,) reward or advantage per response.
        policy_log_probs: (B, T) log-probs of the sampled tokens.

    Returns:
        (B, T) per-token loss.
    """
    _check_log_probs(policy_log_probs)
    adv = _per_row(raw_rewards_or_advantages, policy_log_probs.shape[0], "raw_rewards_or_advantages")  # (B, 1)
    return -adv * policy_log_probs  # (B, T)


def _ratio(policy_log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    """(B, T) importance ratios pi / pi_old; no gradient flows into pi_old."""
    _check_log_probs(policy_log_probs, old_log_probs, "old_log_probs")
    return torch.exp(policy_log_probs - old_log_probs.detach())  # (B, T)


def compute_grpo_no_clip_loss(
    advantages: Tensor, policy_log_probs: Tensor, old_log_probs: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token unclipped importance-ratio loss ``-(pi/pi_old) * A`` (seed 004 GRPO-No-Clip).

    Args:
        advantages: (B, 1) or (B,).
        policy_log_probs: (B, T) log-probs under the policy being trained.
        old_log_probs: (B, T) log-probs under the policy that sampled (detached here).

    Returns:
        (B, T) loss and ``{"loss/ratio": (B, T) detached ratios}``.
    """
    ratio = _ratio(policy_log_probs, old_log_probs)  # (B, T)
    adv = _per_row(advantages, policy_log_probs.shape[0], "advantages")  # (B, 1)
    return -ratio * adv, {"loss/ratio": ratio.detach()}  # (B, T)


def compute_grpo_clip_loss(
    advantages: Tensor, policy_log_probs: Tensor, old_log_probs: Tensor, cliprange: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token GRPO-Clip loss ``-min(r*A, clip(r, 1-eps, 1+eps)*A)`` (seed 000 Eq. 6).

    Args:
        advantages: (B, 1) or (B,).
        policy_log_probs: (B, T).
        old_log_probs: (B, T), detached here.
        cliprange: eps >= 0.

    Returns:
        (B, T) loss and metadata: ``loss/clipped_mask`` (B, T) bool, True where the clipped side was
        strictly smaller (so the gradient through that token is zero); ``loss/clip_frac``, a ()
        tensor, its mean over all B*T positions (``grpo_microbatch_train_step`` recomputes it over
        response tokens); ``loss/ratio`` (B, T) detached.
    """
    if cliprange is None or cliprange < 0:
        raise ValueError(f"cliprange must be >= 0, got {cliprange!r}")
    ratio = _ratio(policy_log_probs, old_log_probs)  # (B, T)
    adv = _per_row(advantages, policy_log_probs.shape[0], "advantages")  # (B, 1)
    unclipped = ratio * adv  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange) * adv  # (B, T)
    clipped_mask = clipped < unclipped  # (B, T)
    loss = -torch.minimum(unclipped, clipped)  # (B, T)
    return loss, {
        "loss/clipped_mask": clipped_mask,
        "loss/clip_frac": clipped_mask.float().mean(),  # ()
        "loss/ratio": ratio.detach(),
    }


@dataclass(frozen=True)
class _LossSpec:
    """One loss type: the ``compute_policy_gradient_loss`` arguments it needs (checked not None
    before ``fn`` runs) and ``fn(policy_log_probs (B, T), args) -> ((B, T) loss, metrics)``."""

    requires: tuple[str, ...]
    fn: Callable[[Tensor, dict[str, Any]], LossOutput]


def _no_baseline(lp: Tensor, a: dict[str, Any]) -> LossOutput:
    return compute_naive_policy_gradient_loss(a["raw_rewards"], lp), {}


def _with_baseline(lp: Tensor, a: dict[str, Any]) -> LossOutput:
    return compute_naive_policy_gradient_loss(a["advantages"], lp), {}


def _clip(lp: Tensor, a: dict[str, Any]) -> LossOutput:
    return compute_grpo_clip_loss(a["advantages"], lp, a["old_log_probs"], a["cliprange"])


def _no_clip(lp: Tensor, a: dict[str, Any]) -> LossOutput:
    return compute_grpo_no_clip_loss(a["advantages"], lp, a["old_log_probs"])


_LOSSES: dict[str, _LossSpec] = {
    "no_baseline": _LossSpec(("raw_rewards",), _no_baseline),
    "reinforce_with_baseline": _LossSpec(("advantages",), _with_baseline),
    "grpo_clip": _LossSpec(("advantages", "old_log_probs", "cliprange"), _clip),
    "grpo_no_clip": _LossSpec(("advantages", "old_log_probs"), _no_clip),
}
LOSS_TYPES: tuple[str, ...] = tuple(_LOSSES)
# Loss types that need log-probs of the sampling policy (an importance ratio).
RATIO_LOSS_TYPES: tuple[str, ...] = tuple(k for k, s in _LOSSES.items() if "old_log_probs" in s.requires)


def compute_policy_gradient_loss(
    policy_log_probs: Tensor,
    loss_type: LossType,
    raw_rewards: Tensor | None = None,
    advantages: Tensor | None = None,
    old_log_probs: Tensor | None = None,
    cliprange: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Dispatch to the per-token loss of ``loss_type`` (seed 001 Problem 5, plus ``grpo_no_clip``).
    Arguments a loss type does not use are ignored.

    Args:
        policy_log_probs: (B, T) log-probs under the policy being trained.
        loss_type: a key of ``LOSS_TYPES``.
        raw_rewards: (B, 1) or (B,); required for ``no_baseline``.
        advantages: (B, 1) or (B,); required for the other loss types.
        old_log_probs: (B, T); required for ``grpo_clip`` and ``grpo_no_clip``.
        cliprange: required for ``grpo_clip``.

    Returns:
        (B, T) per-token loss and the loss's metadata (namespaced ``loss/*`` keys).
    """
    spec = _LOSSES.get(loss_type)
    if spec is None:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {list(LOSS_TYPES)}")
    args = {"raw_rewards": raw_rewards, "advantages": advantages, "old_log_probs": old_log_probs,
            "cliprange": cliprange}
    for name in spec.requires:
        if args[name] is None:
            raise ValueError(f"loss_type {loss_type!r} requires {name}, which is None")
    return spec.fn(policy_log_probs, args)
