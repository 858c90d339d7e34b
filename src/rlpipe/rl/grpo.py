"""GRPO algorithm library: advantages, policy-gradient losses, masked reductions, KL estimators,
log-probs/entropy, and the seed-001 prompt/response token layout.

The public names and signatures are the ones seed 001 §5.2 (Problems 2-7) recommends; seed 000 §2
gives the formulas (Eq. 1-8), seed 003 the delta modes / unclipped loss / k3 KL penalty, seed 004
length normalization and the GRPO-No-Clip ablation.

Shape letters: B rows (responses), G group size, T sequence positions, V vocabulary.

How this departs from the seeds, and why:

* Advantages. ``compute_advantages`` is the tensor-level core (seed 003's ``compute_deltas``) and
  ``compute_group_normalized_rewards`` (seed 001 Problem 2) scores responses and then calls it.
  The group std is torch's default Bessel-corrected std (``unbiased=True``), as the course reference
  and seed 003's ``rewards.std()`` do. A group whose rewards all tie gets advantage exactly 0 in the
  centered / normalized modes (seed 003: "if all rewards are equal -> no update occurs"); without
  this, float round-off in ``r - mean`` divided by ``0 + eps`` can produce O(1) advantages. A group
  of size 1 has no std; it always ties, so its advantage is 0.
* ``max_rewards`` follows seed 003's code (the reward itself where it is the group max, 0
  elsewhere), not its prose formula ``R - mean``; the code is the version that was run.
* Ratios are ``exp(logp - old_logp)`` (seed 003 §4.2), not seed 003's ``log_probs / old_log_probs``
  in ``compute_loss``, which is not an importance ratio. ``old_log_probs`` and ``ref_log_probs`` are
  always detached (seed 003: differentiating through pi_old collapses the gradient).
* ``grpo_no_clip`` is seed 004's "GRPO-No-Clip" loss type, spelled like the other loss types.
* ``masked_mean`` returns 0, not NaN, where the mask selects nothing (an all-padding row), and
  every masked reduction uses ``torch.where`` so inf/NaN at masked positions never reach a result
  (``0 * inf`` is NaN, so multiplying by the mask would not do). ``grpo_microbatch_train_step``
  also replaces masked log-probs by 0 *before* the loss so no NaN gradient flows back through them.
* ``masked_normalize`` takes ``normalize_constant`` (the SFT helper's name); the seed-004 worked
  example calls it ``constant_normalizer``, accepted as a keyword alias so that example runs as is.
* ``grpo_microbatch_train_step`` adds keyword-only options: ``length_normalization``
  (``masked_mean`` | ``masked_normalize``, seed 004) and a per-token k3 KL penalty
  (``kl_coef`` * k3(ref), seed 003) reduced with the same length normalization as the policy loss.
  ``kl_coef == 0`` leaves the loss bit-for-bit unchanged (the KL is then only reported).
* ``get_response_log_probs`` divides logits by ``temperature`` before ``log_softmax`` so the learner
  scores the same tempered distribution the sampler drew from; entropy is returned detached
  (a logging quantity) and computed in float32.
* ``pack_token_ids`` builds seed 001's input/label/mask layout from token ids, so the trainer can use
  the sampled ids directly instead of decoding and re-encoding text (which can change the tokens).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

AdvantageMode = Literal["rewards", "centered_rewards", "normalized_rewards", "max_rewards"]
LossType = Literal["no_baseline", "reinforce_with_baseline", "grpo_clip", "grpo_no_clip"]
LengthNormalization = Literal["masked_mean", "masked_normalize"]


# --------------------------------------------------------------------------- advantages


def _centered(grouped: Tensor, eps: float) -> Tensor:
    return grouped - grouped.mean(dim=-1, keepdim=True)  # (n, G)


def _normalized(grouped: Tensor, eps: float) -> Tensor:
    if grouped.shape[-1] == 1:  # unbiased std of one sample is undefined; the group ties anyway
        return torch.zeros_like(grouped)
    std = grouped.std(dim=-1, keepdim=True)  # (n, 1), Bessel-corrected like the course reference
    return _centered(grouped, eps) / (std + eps)


def _max_only(grouped: Tensor, eps: float) -> Tensor:
    best = grouped.max(dim=-1, keepdim=True).values  # (n, 1)
    return torch.where(grouped == best, grouped, torch.zeros_like(grouped))


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
    rewards = _check_rewards(raw_rewards, group_size)
    grouped = rewards.reshape(-1, group_size)  # (n, G)
    adv = ADVANTAGE_MODES[mode](grouped, advantage_eps)  # (n, G)
    if mode in _BASELINED_MODES:
        tied = grouped.amax(dim=-1, keepdim=True) == grouped.amin(dim=-1, keepdim=True)  # (n, 1)
        adv = torch.where(tied, torch.zeros_like(adv), adv)
    return adv.reshape(-1)  # (B,)


def reward_stats(raw_rewards: Tensor, group_size: int) -> dict[str, float]:
    """``reward/{mean,std,min,max}`` over the batch (std Bessel-corrected, 0 for one reward) and
    ``reward/zero_std_frac``, the fraction of groups whose rewards all tie (zero advantage signal)."""
    rewards = _check_rewards(raw_rewards, group_size)
    grouped = rewards.reshape(-1, group_size)  # (n, G)
    tied = grouped.amax(dim=-1) == grouped.amin(dim=-1)  # (n,)
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
    for i, (response, truth) in enumerate(zip(rollout_responses, repeated_ground_truths)):
        score = reward_fn(response, truth)
        if not isinstance(score, Mapping) or "reward" not in score:
            raise ValueError(f"reward_fn must return a mapping with key 'reward'; got {score!r} for response {i}")
        scores.append(score)
    raw_rewards = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)  # (B,)
    mode = "normalized_rewards" if normalize_by_std else "centered_rewards"
    advantages = compute_advantages(raw_rewards, group_size, mode, advantage_eps)
    metadata = reward_stats(raw_rewards, group_size)
    for key in ("format_reward", "answer_reward"):
        if all(key in s for s in scores):
            metadata[f"reward/{key}"] = sum(float(s[key]) for s in scores) / len(scores)
    return advantages, raw_rewards, metadata


# --------------------------------------------------------------------------- per-token losses


def _per_row(values: Tensor, batch: int, name: str) -> Tensor:
    """(B,) or (B, 1) -> (B, 1), so it broadcasts over the T positions."""
    if values.ndim == 1:
        values = values.unsqueeze(-1)
    if values.ndim != 2 or values.shape != (batch, 1):
        raise ValueError(f"{name} must have shape ({batch}, 1) or ({batch},), got {tuple(values.shape)}")
    return values


def _check_log_probs(policy_log_probs: Tensor, other: Tensor | None = None, other_name: str = "") -> None:
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
    adv = _per_row(raw_rewards_or_advantages, policy_log_probs.shape[0], "raw_rewards_or_advantages")
    return -adv * policy_log_probs  # (B, T)


def _ratio(policy_log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    _check_log_probs(policy_log_probs, old_log_probs, "old_log_probs")
    return torch.exp(policy_log_probs - old_log_probs.detach())  # (B, T); no gradient into pi_old


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
    adv = _per_row(advantages, policy_log_probs.shape[0], "advantages")
    return -ratio * adv, {"loss/ratio": ratio.detach()}


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
        strictly smaller (so the gradient through that token is zero); ``loss/clip_frac``, its mean
        over all B*T positions (``grpo_microbatch_train_step`` recomputes it over response tokens);
        ``loss/ratio`` (B, T) detached.
    """
    if cliprange is None or cliprange < 0:
        raise ValueError(f"cliprange must be >= 0, got {cliprange!r}")
    ratio = _ratio(policy_log_probs, old_log_probs)  # (B, T)
    adv = _per_row(advantages, policy_log_probs.shape[0], "advantages")
    unclipped = ratio * adv  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange) * adv  # (B, T)
    clipped_mask = clipped < unclipped
    loss = -torch.minimum(unclipped, clipped)
    return loss, {
        "loss/clipped_mask": clipped_mask,
        "loss/clip_frac": clipped_mask.float().mean(),
        "loss/ratio": ratio.detach(),
    }


@dataclass(frozen=True)
class _LossSpec:
    requires: tuple[str, ...]
    fn: Callable[[Tensor, dict[str, Any]], tuple[Tensor, dict[str, Tensor]]]


def _no_baseline(lp: Tensor, a: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
    return compute_naive_policy_gradient_loss(a["raw_rewards"], lp), {}


def _with_baseline(lp: Tensor, a: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
    return compute_naive_policy_gradient_loss(a["advantages"], lp), {}


def _clip(lp: Tensor, a: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
    return compute_grpo_clip_loss(a["advantages"], lp, a["old_log_probs"], a["cliprange"])


def _no_clip(lp: Tensor, a: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
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

    Requires ``raw_rewards`` for ``no_baseline``; ``advantages`` for the others; ``old_log_probs``
    for ``grpo_clip`` and ``grpo_no_clip``; ``cliprange`` for ``grpo_clip``. Arguments a loss type
    does not use are ignored.

    Returns:
        (B, T) per-token loss and the loss's metadata.
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


# --------------------------------------------------------------------------- masked reductions


def _bool_mask(mask: Tensor, tensor: Tensor) -> Tensor:
    try:
        return torch.broadcast_to(mask != 0, tensor.shape)
    except RuntimeError as err:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not broadcast to tensor shape "
                         f"{tuple(tensor.shape)}") from err


def masked_mean(tensor: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``tensor`` over positions where ``mask`` is nonzero (seed 001 Problem 6).

    Args:
        tensor: any shape, e.g. (B, T).
        mask: same shape (or broadcastable); 1/True = include.
        dim: reduce this dimension, or everything when None.

    Returns:
        ``tensor.mean(dim)``-shaped result. Where the mask selects nothing the result is 0 (not NaN).
        Values at masked-out positions never affect the result or its gradient, even if inf/NaN.
    """
    keep = _bool_mask(mask, tensor)
    kept = torch.where(keep, tensor, torch.zeros_like(tensor))
    total = kept.sum() if dim is None else kept.sum(dim=dim)
    count = keep.sum() if dim is None else keep.sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_normalize(
    tensor: Tensor,
    mask: Tensor,
    normalize_constant: float = 1.0,
    dim: int | None = None,
    *,
    constant_normalizer: float | None = None,
) -> Tensor:
    """Sum of ``tensor`` over masked-in positions divided by a constant (seed 004, Dr. GRPO).

    Args:
        tensor: any shape, e.g. (B, T).
        mask: same shape (or broadcastable); 1/True = include.
        normalize_constant: the divisor (e.g. the max response length).
        dim: reduce this dimension, or everything when None.
        constant_normalizer: alias of ``normalize_constant`` (the seed-004 example's spelling).

    Returns:
        ``tensor.sum(dim)``-shaped result; masked-out values (even inf/NaN) never contribute.
    """
    if constant_normalizer is not None:
        if normalize_constant != 1.0:
            raise ValueError("pass normalize_constant or constant_normalizer, not both")
        normalize_constant = constant_normalizer
    if normalize_constant == 0:
        raise ValueError("normalize_constant must be nonzero")
    keep = _bool_mask(mask, tensor)
    kept = torch.where(keep, tensor, torch.zeros_like(tensor))
    total = kept.sum() if dim is None else kept.sum(dim=dim)
    return total / normalize_constant


# --------------------------------------------------------------------------- KL estimators


def _kl_log_ratio(log_p: Tensor, log_q: Tensor) -> Tensor:
    return log_p - log_q  # seed 000 Eq. 8 summand (Schulman's "k1"): unbiased, high variance, can be < 0


def _kl_k3(log_p: Tensor, log_q: Tensor) -> Tensor:
    log_r = log_q - log_p  # seed 003: q/p - log(q/p) - 1 >= 0, unbiased under x ~ p, low variance
    return torch.exp(log_r) - log_r - 1.0


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"log_ratio": _kl_log_ratio, "k3": _kl_k3}


def _sequence_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    return masked_normalize(per_token, mask, 1.0, dim=-1).mean()


KL_REDUCTIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "sequence_sum": _sequence_sum,  # Eq. 8: sum over a response's tokens, mean over the B responses
    "token_mean": lambda per_token, mask: masked_mean(per_token, mask),
}


def masked_kl(
    log_p: Tensor, log_q: Tensor, mask: Tensor, estimator: str = "k3", reduction: str = "sequence_sum",
    weights: Tensor | None = None,
) -> Tensor:
    """Estimate KL(p || q) from the log-probs both policies give the tokens sampled from p.

    Args:
        log_p: (B, T) log-probs under p (e.g. the current policy, which sampled the tokens).
        log_q: (B, T) log-probs under q (e.g. the frozen reference).
        mask: (B, T) response mask.
        estimator: ``"log_ratio"`` (seed 000 Eq. 7-8) or ``"k3"`` (seed 003).
        reduction: ``"sequence_sum"`` (Eq. 8) or ``"token_mean"`` (per response token).
        weights: optional (B, T) per-token importance weights p/b, for tokens that a behaviour
            policy b sampled instead of p (``kl_importance_weights``). Without them, both
            estimators assume x ~ p, and k3's exp(log q/p) explodes on stale tokens p now avoids.

    Returns:
        Scalar tensor. Masked positions never contribute, even when they hold inf/NaN.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}")
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"unknown KL reduction {reduction!r}; valid: {sorted(KL_REDUCTIONS)}")
    keep = _bool_mask(mask, log_p)
    zero = torch.zeros_like(log_p)
    per_token = KL_ESTIMATORS[estimator](torch.where(keep, log_p, zero), torch.where(keep, log_q, zero))
    if weights is not None:
        per_token = per_token * torch.where(keep, weights, zero)  # (B, T)
    return KL_REDUCTIONS[reduction](per_token, keep)


def kl_importance_weights(log_p: Tensor, log_b: Tensor, cap: float = 10.0) -> Tensor:
    """Per-token truncated importance weights min(p/b, cap), (B, T), for estimating a KL of p from
    tokens sampled by b (replay and one-behind batches). Per token, not per sequence: the
    sequence product's variance grows exponentially with length; the cap bounds the rest."""
    return torch.exp(log_p - log_b).clamp(max=cap)


# --------------------------------------------------------------------------- train step


def _masked_mean_rows(per_token: Tensor, mask: Tensor, constant: float | None) -> Tensor:
    return masked_mean(per_token, mask, dim=1)  # (B,)


def _masked_normalize_rows(per_token: Tensor, mask: Tensor, constant: float | None) -> Tensor:
    if constant is None:
        raise ValueError("length_normalization='masked_normalize' requires normalize_constant "
                         "(e.g. the max response length), which is None")
    return masked_normalize(per_token, mask, constant, dim=1)  # (B,)


LENGTH_NORMALIZATIONS: dict[str, Callable[[Tensor, Tensor, float | None], Tensor]] = {
    "masked_mean": _masked_mean_rows,
    "masked_normalize": _masked_normalize_rows,
}


def _zero_masked(values: Tensor | None, keep: Tensor) -> Tensor | None:
    # Replace masked positions *before* any arithmetic: a NaN there would otherwise poison the
    # gradient through torch.where's unselected branch (0 * NaN = NaN).
    return None if values is None else torch.where(keep, values, torch.zeros_like(values))


def grpo_microbatch_train_step(
    policy_log_probs: Tensor,
    response_mask: Tensor,
    gradient_accumulation_steps: int,
    loss_type: LossType,
    raw_rewards: Tensor | None = None,
    advantages: Tensor | None = None,
    old_log_probs: Tensor | None = None,
    cliprange: float | None = None,
    *,
    length_normalization: LengthNormalization = "masked_mean",
    normalize_constant: float | None = None,
    ref_log_probs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss -> per-response reduction -> batch mean -> / grad-accum steps -> backward().

    Args:
        policy_log_probs: (B, T) log-probs of the policy being trained (requires grad).
        response_mask: (B, T), 1 for response tokens, 0 for prompt/padding.
        gradient_accumulation_steps: microbatches per optimizer step (the loss is divided by it).
        loss_type, raw_rewards, advantages, old_log_probs, cliprange: see
            ``compute_policy_gradient_loss`` (rewards/advantages (B, 1) or (B,)).
        length_normalization: ``"masked_mean"`` (mean over each response's tokens) or
            ``"masked_normalize"`` (sum over them / ``normalize_constant``), seed 004.
        ref_log_probs: (B, T) reference-policy log-probs (detached); with it the k3 KL is reported.
        kl_coef: > 0 adds ``kl_coef * k3(pi || pi_ref)`` to every response token's loss (seed 003).

    Returns:
        The scaled scalar loss (detached, for logging) and metadata: the loss's own keys, with
        ``loss/clip_frac`` taken over response tokens; ``loss/policy`` (unscaled policy loss);
        ``loss/ratio_mean`` for ratio losses; ``kl/ref_k3`` (token mean) when ``ref_log_probs`` given.
        Rows whose mask is all zero contribute 0.
    """
    if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be a positive int, got {gradient_accumulation_steps!r}")
    if length_normalization not in LENGTH_NORMALIZATIONS:
        raise ValueError(f"unknown length_normalization {length_normalization!r}; "
                         f"valid: {list(LENGTH_NORMALIZATIONS)}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_log_probs is None:
        raise ValueError(f"kl_coef={kl_coef} > 0 requires ref_log_probs, which is None")
    _check_log_probs(policy_log_probs, response_mask, "response_mask")
    for name, other in (("old_log_probs", old_log_probs), ("ref_log_probs", ref_log_probs)):
        if other is not None:
            _check_log_probs(policy_log_probs, other, name)
    keep = response_mask != 0  # (B, T)
    log_probs = _zero_masked(policy_log_probs, keep)
    old = _zero_masked(None if old_log_probs is None else old_log_probs.detach(), keep)
    per_token, metadata = compute_policy_gradient_loss(
        log_probs, loss_type, raw_rewards, advantages, old, cliprange)  # (B, T)
    reduce_rows = LENGTH_NORMALIZATIONS[length_normalization]
    policy_loss = reduce_rows(per_token, keep, normalize_constant).mean()
    metadata = dict(metadata)
    metadata["loss/policy"] = policy_loss.detach()
    if "loss/clipped_mask" in metadata:
        metadata["loss/clip_frac"] = masked_mean(metadata["loss/clipped_mask"].float(), keep)
    if "loss/ratio" in metadata:
        metadata["loss/ratio_mean"] = masked_mean(metadata["loss/ratio"], keep)
    loss = policy_loss
    if ref_log_probs is not None:
        k3 = KL_ESTIMATORS["k3"](log_probs, _zero_masked(ref_log_probs.detach(), keep))  # (B, T)
        metadata["kl/ref_k3"] = masked_mean(k3.detach(), keep)
        if kl_coef > 0:  # exactly the policy loss when kl_coef == 0
            loss = loss + kl_coef * reduce_rows(k3, keep, normalize_constant).mean()
    loss = loss / gradient_accumulation_steps
    loss.backward()
    return loss.detach(), metadata


# --------------------------------------------------------------------------- log-probs, entropy


def compute_entropy(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last axis: (..., V) -> (...).

    Uses ``log_softmax`` (stable for huge logits); ``-inf`` logits (banned tokens) contribute 0.
    Half-precision logits are upcast to float32.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    log_p = F.log_softmax(logits, dim=-1)  # (..., V)
    log_p = torch.where(torch.isfinite(log_p), log_p, torch.zeros_like(log_p))  # p = 0 there
    return -(log_p.exp() * log_p).sum(dim=-1)


def _logits_of(output: Any) -> Tensor:
    if isinstance(output, Tensor):
        return output
    if hasattr(output, "logits"):  # HuggingFace ModelOutput
        return output.logits
    if isinstance(output, Mapping) and "logits" in output:
        return output["logits"]
    raise TypeError(f"model output must be a logits tensor or have .logits, got {type(output).__name__}")


def get_response_log_probs(
    model: torch.nn.Module,
    input_ids: Tensor,
    labels: Tensor,
    return_token_entropy: bool = False,
    temperature: float = 1.0,
    **model_kwargs: Any,
) -> dict[str, Tensor]:
    """Per-token log-probs of ``labels`` under ``model(input_ids)``, and optionally entropies.

    Args:
        model: returns logits (B, T, V), as a tensor or an object with ``.logits`` (HF causal LM).
        input_ids: (B, T) token ids (seed-001 layout: right-padded, so no attention mask is needed
            for a causal model; pass one in ``model_kwargs`` if your model wants it).
        labels: (B, T) next-token ids; negative ids (e.g. -100) give log-prob 0 and must be masked.
        return_token_entropy: also return the (B, T) entropy of the next-token distribution.
        temperature: logits are divided by it before ``log_softmax``. The sampler draws from
            softmax(logits / T), so the learner must score the same tempered distribution for the
            importance ratios and on-policy gradients to be right.

    Returns:
        ``{"log_probs": (B, T)}`` (float32, or the logits' dtype if wider), plus
        ``"token_entropy": (B, T)`` (detached) if asked.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids.shape != labels.shape:
        raise ValueError(f"input_ids shape {tuple(input_ids.shape)} != labels shape {tuple(labels.shape)}")
    logits = _logits_of(model(input_ids, **model_kwargs))  # (B, T, V)
    if logits.dtype in (torch.float16, torch.bfloat16):  # log_softmax in half precision is too coarse
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_p = F.log_softmax(logits, dim=-1)  # (B, T, V)
    valid = labels >= 0
    index = torch.where(valid, labels, torch.zeros_like(labels)).unsqueeze(-1)  # (B, T, 1)
    picked = log_p.gather(dim=-1, index=index).squeeze(-1)  # (B, T)
    out = {"log_probs": torch.where(valid, picked, torch.zeros_like(picked))}
    if return_token_entropy:
        with torch.no_grad():
            out["token_entropy"] = compute_entropy(logits)  # (B, T)
    return out


# --------------------------------------------------------------------------- token layout


def _as_id_list(ids: Any, what: str, i: int) -> list[int]:
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{what}[{i}] must be a sequence of ints, got {ids!r}")
    return [int(t) for t in ids]


def pack_token_ids(
    prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]], pad_id: int
) -> dict[str, Tensor]:
    """Seed-001 layout from token ids: concat prompt+output, right-pad, shift by one.

    Returns:
        ``input_ids`` (B, L-1) = all but the last token, ``labels`` (B, L-1) = all but the first,
        ``response_mask`` (B, L-1) bool, True where the label is an output token; L is the longest
        prompt+output. Padding is ``pad_id``.
    """
    if len(prompt_ids) != len(output_ids):
        raise ValueError(f"len(prompt_ids) ({len(prompt_ids)}) != len(output_ids) ({len(output_ids)})")
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty")
    prompts = [_as_id_list(p, "prompt_ids", i) for i, p in enumerate(prompt_ids)]
    outputs = [_as_id_list(o, "output_ids", i) for i, o in enumerate(output_ids)]
    for i, p in enumerate(prompts):
        if not p:  # the first output token is predicted from the last prompt token
            raise ValueError(f"prompt_ids[{i}] is empty; every prompt needs at least one token")
    width = max(len(p) + len(o) for p, o in zip(prompts, outputs))
    if width < 2:
        raise ValueError("every sequence has a single token; nothing to predict")
    full = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)  # (B, L): True at output tokens
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        full[i, : len(p) + len(o)] = torch.tensor(p + o, dtype=torch.long)
        mask[i, len(p): len(p) + len(o)] = True
    return {"input_ids": full[:, :-1], "labels": full[:, 1:], "response_mask": mask[:, 1:]}  # (B, L-1)


def pack_response_values(values: Sequence[Tensor], response_mask: Tensor, fill: float = 0.0) -> Tensor:
    """Place per-response-token values (e.g. the sampler's log-probs, each (T_i,)) at the
    ``response_mask`` positions of ``pack_token_ids``'s layout: -> (B, L-1) float32, ``fill`` elsewhere."""
    counts = response_mask.sum(dim=1).tolist()
    if len(values) != response_mask.shape[0]:
        raise ValueError(f"{len(values)} value rows for a mask with {response_mask.shape[0]} rows")
    for i, (v, n) in enumerate(zip(values, counts)):
        if v.numel() != n:
            raise ValueError(f"values[{i}] has {v.numel()} entries but response_mask row {i} has {n} tokens")
    out = torch.full(response_mask.shape, fill, dtype=torch.float32)  # (B, L-1)
    flat = torch.cat([v.reshape(-1).float() for v in values]) if values else torch.zeros(0)
    # Row-major order of True positions == concatenation order, since each row's mask is contiguous.
    return out.masked_scatter(response_mask.bool(), flat)


def _encoders(tokenizer: Any) -> tuple[Callable[[str], list[int]], Callable[[str], list[int]]]:
    """(prompt encoder, output encoder). A HF tokenizer adds its special tokens (e.g. BOS) to the
    prompt only; an output is a continuation and must not get them."""
    try:
        accepts_special = "add_special_tokens" in inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        accepts_special = False

    def ids_of(encoded: Any) -> list[int]:
        return list(encoded.ids) if hasattr(encoded, "ids") else list(encoded)

    if accepts_special:
        return (lambda s: ids_of(tokenizer.encode(s)),
                lambda s: ids_of(tokenizer.encode(s, add_special_tokens=False)))
    return (lambda s: ids_of(tokenizer.encode(s)),) * 2


def tokenize_prompt_and_output(
    prompt_strs: Sequence[str], output_strs: Sequence[str], tokenizer: Any
) -> dict[str, Tensor]:
    """Tokenize prompts and outputs separately and lay them out as ``pack_token_ids`` does.

    ``tokenizer`` needs ``.encode(str)`` and ``.pad_token_id`` (an ``rlpipe.lm.tokenizer.Tokenizer`` or a
    HF tokenizer; if ``pad_token_id`` is None, ``eos_token_id`` pads). Padding is masked out anyway.

    Returns:
        ``input_ids``, ``labels``, ``response_mask``: (B, L-1) each, L = max(len(prompt) + len(output)).
    """
    if len(prompt_strs) != len(output_strs):
        raise ValueError(f"len(prompt_strs) ({len(prompt_strs)}) != len(output_strs) ({len(output_strs)})")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(tokenizer, "eos_token_id", None)
    if pad_id is None:
        raise ValueError("tokenizer has neither pad_token_id nor eos_token_id to pad with")
    encode_prompt, encode_output = _encoders(tokenizer)
    return pack_token_ids([encode_prompt(p) for p in prompt_strs], [encode_output(o) for o in output_strs],
                          int(pad_id))
