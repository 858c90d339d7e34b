"""The seed API, importable as ``rlpipe.grpo``: advantages, policy-gradient losses, masked
reductions, KL estimators, the microbatch train step, log-probs/entropy and the seed-001 token layout.

The public names and signatures are the ones seed 001 §5.2 (Problems 2-7) recommends; seed 000 §2
gives the formulas (Eq. 1-8), seed 003 the delta modes / unclipped loss / k3 KL penalty, seed 004
length normalization and the GRPO-No-Clip ablation. This module only re-exports, for course code
written against ``rlpipe.grpo``; each concept lives in its own module of the ``rl`` layer (which
imports them from there, not from here), whose docstring says how it departs from the seeds and why:

=============================  ========================================================================
module                         what lives there
=============================  ========================================================================
``rlpipe.rl.advantages``       ``compute_advantages`` (delta modes ``ADVANTAGE_MODES``: rewards, centered,
                               normalized, max), ``reward_stats``, ``compute_group_normalized_rewards``
``rlpipe.rl.losses``           per-token losses ``compute_naive_policy_gradient_loss``,
                               ``compute_grpo_clip_loss``, ``compute_grpo_no_clip_loss``; the loss-type
                               registry (``LOSS_TYPES``, ``RATIO_LOSS_TYPES``) and
                               ``compute_policy_gradient_loss``
``rlpipe.rl.masked``           ``masked_mean`` (seed semantics: NaN where nothing is selected),
                               ``masked_mean_or_zero`` (0 there; what losses use), ``masked_normalize``
``rlpipe.rl.kl``               ``KL_ESTIMATORS`` (log_ratio, k3), ``KL_REDUCTIONS``, ``masked_kl``,
                               ``kl_importance_weights``
``rlpipe.rl.train_step``       ``grpo_microbatch_train_step``, ``LENGTH_NORMALIZATIONS``
``rlpipe.rl.logprobs``         ``compute_entropy``, ``get_response_log_probs``, ``pack_token_ids``,
                               ``pack_response_values``, ``tokenize_prompt_and_output``,
                               ``response_only_log_probs`` (the LM head on response tokens only)
=============================  ========================================================================

Imports point one way: ``kl`` imports ``masked``; ``train_step`` imports ``masked``, ``losses`` and
``kl``; ``advantages``, ``losses``, ``masked`` and ``logprobs`` import no other rl module. Nothing in
``rlpipe`` imports this module.

Shape letters: B rows (responses), G group size, T sequence positions, V vocabulary, D model width.
"""

from __future__ import annotations

from rlpipe.rl.advantages import (
    ADVANTAGE_MODES,
    AdvantageMode,
    compute_advantages,
    compute_group_normalized_rewards,
    reward_stats,
)
from rlpipe.rl.kl import KL_ESTIMATORS, KL_REDUCTIONS, kl_importance_weights, masked_kl
from rlpipe.rl.logprobs import (
    compute_entropy,
    entropy_from_log_probs,
    get_response_log_probs,
    pack_response_values,
    pack_token_ids,
    response_only_log_probs,
    tokenize_prompt_and_output,
)
from rlpipe.rl.losses import (
    LOSS_TYPES,
    RATIO_LOSS_TYPES,
    LossType,
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
)
from rlpipe.rl.masked import masked_mean, masked_mean_or_zero, masked_normalize
from rlpipe.rl.train_step import (
    LENGTH_NORMALIZATIONS,
    LengthNormalization,
    grpo_microbatch_train_step,
)

__all__ = [  # every public name of the modules above (the table in the docstring says which)
    "ADVANTAGE_MODES",
    "KL_ESTIMATORS",
    "KL_REDUCTIONS",
    "LENGTH_NORMALIZATIONS",
    "LOSS_TYPES",
    "RATIO_LOSS_TYPES",
    "AdvantageMode",
    "LengthNormalization",
    "LossType",
    "compute_advantages",
    "compute_entropy",
    "compute_group_normalized_rewards",
    "compute_grpo_clip_loss",
    "compute_grpo_no_clip_loss",
    "compute_naive_policy_gradient_loss",
    "entropy_from_log_probs",
    "compute_policy_gradient_loss",
    "get_response_log_probs",
    "grpo_microbatch_train_step",
    "kl_importance_weights",
    "masked_kl",
    "masked_mean",
    "masked_mean_or_zero",
    "masked_normalize",
    "pack_response_values",
    "pack_token_ids",
    "response_only_log_probs",
    "reward_stats",
    "tokenize_prompt_and_output",
]
