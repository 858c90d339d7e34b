"""A causal LM split into its body (input ids -> final hidden states) and its LM head.

The learner needs log-probs only at response positions, yet a plain forward runs the LM head, the
log-softmax and the entropy over every position of the padded (B, T) batch: prompt tokens and
right-padding included, a third to a half of the positions in rlpipe's batches. Split in two, the
head runs on the (N, D) hidden states of the N response tokens alone
(``rlpipe.rl.logprobs.response_only_log_probs``), as verl and OpenRLHF do by removing padding
before their log-prob kernels. The seeds' ``get_response_log_probs`` is unchanged and stays the
reference the split path is tested against.

``split_lm_head(model)`` returns ``None`` where the logits are not just ``head(hidden)``: an HF
architecture outside ``HF_PLAIN_HEADS`` (some scale or soft-cap their logits after the head), or a
model of unknown kind. Callers then run the full forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from rlpipe.lm.model import TransformerLM

#: HF ``model_type``s whose ``*ForCausalLM.forward`` returns ``lm_head(model(...).last_hidden_state)``
#: with nothing after the head (no logit scale or soft-capping).
HF_PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(frozen=True)
class SplitLM:
    body: Callable[[Tensor], Tensor]  # input_ids (B, T) -> final-normed hidden states (B, T, D)
    head: nn.Module  # (..., D) -> (..., V)


def split_lm_head(model: nn.Module) -> SplitLM | None:
    """``model`` as body + head, or None when its logits are not a plain head over its hidden states."""
    base = getattr(model, "_orig_mod", model)
    if isinstance(base, TransformerLM):
        return SplitLM(model.hidden_states, base.lm_head)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) in HF_PLAIN_HEADS and isinstance(getattr(base, "lm_head", None), nn.Module):
        inner = base.model
        return SplitLM(lambda ids: inner(input_ids=ids, use_cache=False).last_hidden_state, base.lm_head)
    return None
