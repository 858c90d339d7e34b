"""One GRPO microbatch train step (seed 001 Problem 7): per-token loss -> per-response reduction
-> batch mean -> / gradient-accumulation steps -> ``backward()``.

Shape letters: B rows (responses), T sequence positions.

How this departs from the seeds, and why:

* The seed reduces each response's per-token loss with ``masked_mean``. Here the reduction is
  ``masked_mean_or_zero`` (``rlpipe.rl.masked``): the same value wherever a row has a response
  token, but an all-masked row (a fully padded microbatch row, an empty response) contributes 0
  instead of the NaN that the seed-conformant ``masked_mean`` gives, which would poison the
  gradient of the whole microbatch. The reported ``loss/clip_frac``, ``loss/ratio_mean`` and
  ``kl/ref_k3`` use it too.
* Masked log-probs (policy, old and reference) are replaced by 0 *before* the loss, so no NaN
  gradient flows back through them (``0 * NaN`` is NaN, even in ``torch.where``'s unselected branch).
* Keyword-only options: ``length_normalization`` (``masked_mean`` | ``masked_normalize``,
  seed 004) and a per-token k3 KL penalty (``kl_coef`` * k3(ref), seed 003) reduced with the same
  length normalization as the policy loss. ``kl_coef == 0`` leaves the loss bit-for-bit unchanged
  (the KL is then only reported).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from rlpipe.rl.kl import KL_ESTIMATORS
from rlpipe.rl.losses import LossType, _check_log_probs, compute_policy_gradient_loss
from rlpipe.rl.masked import masked_mean_or_zero, masked_normalize

__all__ = ["LENGTH_NORMALIZATIONS", "LengthNormalization", "grpo_microbatch_train_step"]

LengthNormalization = Literal["masked_mean", "masked_normalize"]


def _masked_mean_rows(per_token: Tensor, mask: Tensor, constant: float | None) -> Tensor:
    return masked_mean_or_zero(per_token, mask, dim=1)  # (B, T) -> (B,); an all-masked row gives 0


def _masked_normalize_rows(per_token: Tensor, mask: Tensor, constant: float | None) -> Tensor:
    if constant is None:
        raise ValueError("length_normalization='masked_normalize' requires normalize_constant "
                         "(e.g. the max response length), which is None")
    return masked_normalize(per_token, mask, constant, dim=1)  # (B, T) -> (B,)


# Per-response reductions (seed 004): (B, T) per-token loss, (B, T) mask, constant -> (B,).
LENGTH_NORMALIZATIONS: dict[str, Callable[[Tensor, Tensor, float | None], Tensor]] = {
    "masked_mean": _masked_mean_rows,
    "masked_normalize": _masked_normalize_rows,
}


def _zero_masked(values: Tensor | None, keep: Tensor) -> Tensor | None:
    # Replace masked positions *before* any arithmetic: a NaN there would otherwise poison the
    # gradient through torch.where's unselected branch (0 * NaN = NaN).
    return None if values is None else torch.where(keep, values, torch.zeros_like(values))  # (B, T)


def _check_options(gradient_accumulation_steps: int, length_normalization: str, kl_coef: float,
                   ref_log_probs: Tensor | None) -> None:
    if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be a positive int, got {gradient_accumulation_steps!r}")
    if length_normalization not in LENGTH_NORMALIZATIONS:
        raise ValueError(f"unknown length_normalization {length_normalization!r}; "
                         f"valid: {list(LENGTH_NORMALIZATIONS)}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_log_probs is None:
        raise ValueError(f"kl_coef={kl_coef} > 0 requires ref_log_probs, which is None")


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
        loss_type: see ``compute_policy_gradient_loss``.
        raw_rewards: (B, 1) or (B,); see ``compute_policy_gradient_loss``.
        advantages: (B, 1) or (B,); see ``compute_policy_gradient_loss``.
        old_log_probs: (B, T); see ``compute_policy_gradient_loss``.
        cliprange: see ``compute_policy_gradient_loss``.
        length_normalization: ``"masked_mean"`` (mean over each response's tokens, via
            ``masked_mean_or_zero``) or ``"masked_normalize"`` (sum over them /
            ``normalize_constant``), seed 004.
        ref_log_probs: (B, T) reference-policy log-probs (detached); with it the k3 KL is reported.
        kl_coef: > 0 adds ``kl_coef * k3(pi || pi_ref)`` to every response token's loss (seed 003).

    Returns:
        The scaled () loss (detached, for logging) and metadata: the loss's own keys, with
        ``loss/clip_frac`` taken over response tokens; ``loss/policy`` (unscaled policy loss);
        ``loss/ratio_mean`` for ratio losses; ``kl/ref_k3`` (token mean) when ``ref_log_probs`` given.
        Rows whose mask is all zero contribute 0 (and the metrics are 0 if no token is selected).
    """
    _check_options(gradient_accumulation_steps, length_normalization, kl_coef, ref_log_probs)
    _check_log_probs(policy_log_probs, response_mask, "response_mask")
    for name, other in (("old_log_probs", old_log_probs), ("ref_log_probs", ref_log_probs)):
        if other is not None:
            _check_log_probs(policy_log_probs, other, name)
    keep = response_mask != 0  # (B, T) bool
    log_probs = _zero_masked(policy_log_probs, keep)  # (B, T)
    old = _zero_masked(None if old_log_probs is None else old_log_probs.detach(), keep)  # (B, T)
    per_token, metadata = compute_policy_gradient_loss(
        log_probs, loss_type, raw_rewards, advantages, old, cliprange)  # (B, T)
    reduce_rows = LENGTH_NORMALIZATIONS[length_normalization]
    policy_loss = reduce_rows(per_token, keep, normalize_constant).mean()  # (B,) -> ()
    metadata = dict(metadata)
    metadata["loss/policy"] = policy_loss.detach()
    if "loss/clipped_mask" in metadata:
        metadata["loss/clip_frac"] = masked_mean_or_zero(metadata["loss/clipped_mask"].float(), keep)  # ()
    if "loss/ratio" in metadata:
        metadata["loss/ratio_mean"] = masked_mean_or_zero(metadata["loss/ratio"], keep)  # ()
    loss = policy_loss
    if ref_log_probs is not None:
        k3 = KL_ESTIMATORS["k3"](log_probs, _zero_masked(ref_log_probs.detach(), keep))  # (B, T)
        metadata["kl/ref_k3"] = masked_mean_or_zero(k3.detach(), keep)  # ()
        if kl_coef > 0:  # exactly the policy loss when kl_coef == 0
            loss = loss + kl_coef * reduce_rows(k3, keep, normalize_constant).mean()  # (B,) -> ()
    loss = loss / gradient_accumulation_steps
    loss.backward()
    return loss.detach(), metadata
