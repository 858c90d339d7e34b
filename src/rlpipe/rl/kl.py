"""KL estimators from sampled tokens: ``KL_ESTIMATORS`` (log-ratio, k3), ``masked_kl`` and the
per-token importance weights ``kl_importance_weights`` (seed 000 §3.2 Eq. 7-8, seed 003 k3).

Shape letters: B rows (responses), T sequence positions.

How this departs from the seeds, and why:

* Seed 000 estimates KL(p || q) with the log-ratio summed over a response (Eq. 8, "k1": unbiased,
  high variance, can be < 0); seed 003 uses k3 = q/p - log(q/p) - 1 (>= 0, unbiased under x ~ p,
  low variance). Both are offered, by name, with a ``sequence_sum`` (Eq. 8) or ``token_mean``
  reduction. ``token_mean`` uses ``masked_mean_or_zero``, so an empty mask gives 0 (as
  ``sequence_sum`` does), never NaN: the value is logged and may feed a penalty.
* Both estimators assume the tokens were drawn from p. For replayed or one-version-behind batches
  they were drawn from a behaviour policy b, so ``masked_kl`` accepts per-token truncated
  importance weights min(p/b, cap) (``kl_importance_weights``), which the seeds do not discuss.
* Masked positions are replaced by 0 before the estimator runs, so inf/NaN there never reach the
  result (see ``rlpipe.rl.masked``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlpipe.rl.masked import _bool_mask, masked_mean_or_zero, masked_normalize

__all__ = ["KL_ESTIMATORS", "KL_REDUCTIONS", "kl_importance_weights", "masked_kl"]


def _kl_log_ratio(log_p: Tensor, log_q: Tensor) -> Tensor:
    return log_p - log_q  # (B, T); seed 000 Eq. 8 summand (Schulman's "k1"): unbiased, high variance, can be < 0


def _kl_k3(log_p: Tensor, log_q: Tensor) -> Tensor:
    log_r = log_q - log_p  # (B, T); seed 003: q/p - log(q/p) - 1 >= 0, unbiased under x ~ p, low variance
    return torch.exp(log_r) - log_r - 1.0


# Per-token estimators: (B, T) log p, (B, T) log q -> (B, T).
KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"log_ratio": _kl_log_ratio, "k3": _kl_k3}


def _sequence_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    return masked_normalize(per_token, mask, 1.0, dim=-1).mean()  # (B, T) -> (B,) -> ()


# Reductions: (B, T) per-token estimates, (B, T) mask -> () scalar.
KL_REDUCTIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "sequence_sum": _sequence_sum,  # Eq. 8: sum over a response's tokens, mean over the B responses
    "token_mean": lambda per_token, mask: masked_mean_or_zero(per_token, mask),  # 0 if no token
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
        () scalar tensor; 0 when the mask selects nothing. Masked positions never contribute,
        even when they hold inf/NaN.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}")
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"unknown KL reduction {reduction!r}; valid: {sorted(KL_REDUCTIONS)}")
    keep = _bool_mask(mask, log_p)  # (B, T)
    zero = torch.zeros_like(log_p)
    per_token = KL_ESTIMATORS[estimator](torch.where(keep, log_p, zero), torch.where(keep, log_q, zero))  # (B, T)
    if weights is not None:
        per_token = per_token * torch.where(keep, weights, zero)  # (B, T)
    return KL_REDUCTIONS[reduction](per_token, keep)  # ()


def kl_importance_weights(log_p: Tensor, log_b: Tensor, cap: float = 10.0) -> Tensor:
    """Per-token truncated importance weights min(p/b, cap), (B, T), for estimating a KL of p from
    tokens sampled by b (replay and one-behind batches). Per token, not per sequence: the
    sequence product's variance grows exponentially with length; the cap bounds the rest."""
    return torch.exp(log_p - log_b).clamp(max=cap)  # (B, T)
