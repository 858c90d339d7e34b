"""Masked reductions: ``masked_mean`` (seed 001 Problem 6), its loss-safe twin ``masked_mean_or_zero``,
and ``masked_normalize`` (the SFT helper, seed 004 length normalization).

Shape letters: B rows (responses), T sequence positions.

How this departs from the seeds, and why:

* ``masked_mean`` follows the seed exactly: its result has ``tensor.mean(dim)``'s shape and
  semantics, so a slice where the mask selects nothing is NaN, as torch's mean of an empty set is.
  A loss must not inherit that NaN (one fully padded row would poison the whole microbatch's
  gradient), so the train step aggregates with ``masked_mean_or_zero``, identical except that a
  slice with nothing selected gives 0, i.e. an all-padding row contributes 0 to the loss.
* Every masked reduction here selects with ``torch.where`` so inf/NaN at masked-out positions never
  reach a result or its gradient (``0 * inf`` is NaN, so multiplying by the mask would not do).
* ``masked_normalize`` takes ``normalize_constant`` (the SFT helper's name); the seed-004 worked
  example calls it ``constant_normalizer``, accepted as a keyword alias so that example runs as is.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["masked_mean", "masked_mean_or_zero", "masked_normalize"]


def _bool_mask(mask: Tensor, tensor: Tensor) -> Tensor:
    """``mask != 0`` broadcast to ``tensor``'s shape (e.g. (B, T)); a clear error if it cannot be."""
    try:
        return torch.broadcast_to(mask != 0, tensor.shape)
    except RuntimeError as err:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not broadcast to tensor shape "
                         f"{tuple(tensor.shape)}") from err


def _masked_sum_and_count(tensor: Tensor, mask: Tensor, dim: int | None) -> tuple[Tensor, Tensor]:
    """Sum of the selected values and the number selected, both ``tensor.sum(dim)``-shaped."""
    keep = _bool_mask(mask, tensor)  # (B, T), say
    kept = torch.where(keep, tensor, torch.zeros_like(tensor))  # masked-out inf/NaN never pass
    if dim is None:
        return kept.sum(), keep.sum()  # () each
    return kept.sum(dim=dim), keep.sum(dim=dim)  # e.g. (B,) for dim=1


def masked_mean(tensor: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``tensor`` over positions where ``mask`` is nonzero (seed 001 Problem 6).

    Args:
        tensor: any shape, e.g. (B, T).
        mask: same shape (or broadcastable); 1/True = include.
        dim: reduce this dimension, or everything when None.

    Returns:
        ``tensor.mean(dim)``-shaped result with ``tensor.mean(dim)`` semantics: where the mask
        selects nothing the result is NaN, like the mean of an empty set (use
        ``masked_mean_or_zero`` to get 0 there). Values at masked-out positions never affect the
        result or the gradient that reaches ``tensor``, even if inf/NaN.
    """
    total, count = _masked_sum_and_count(tensor, mask, dim)
    return total / count.to(total.dtype)  # 0 / 0 = NaN where nothing is selected


def masked_mean_or_zero(tensor: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``masked_mean``, except that a slice where the mask selects nothing gives 0, not NaN.

    The loss-safe variant: ``grpo_microbatch_train_step`` reduces per-token losses (and its
    clip-fraction / ratio / KL metrics) with it, so an all-masked row (a fully padded microbatch
    row, or an empty response) contributes 0 to the loss instead of a NaN that would poison the
    gradient of every other row. The result and its gradient stay finite whatever the masked-out
    positions hold.

    Args:
        tensor: any shape, e.g. (B, T).
        mask: same shape (or broadcastable); 1/True = include.
        dim: reduce this dimension, or everything when None.

    Returns:
        ``tensor.mean(dim)``-shaped result; 0 where nothing is selected.
    """
    total, count = _masked_sum_and_count(tensor, mask, dim)
    return total / count.clamp(min=1).to(total.dtype)  # total is 0 where count is 0


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
        ``tensor.sum(dim)``-shaped result (an empty selection sums to 0); masked-out values (even
        inf/NaN) never contribute.
    """
    if constant_normalizer is not None:
        if normalize_constant != 1.0:
            raise ValueError("pass normalize_constant or constant_normalizer, not both")
        normalize_constant = constant_normalizer
    if normalize_constant == 0:
        raise ValueError("normalize_constant must be nonzero")
    total, _ = _masked_sum_and_count(tensor, mask, dim)
    return total / normalize_constant
