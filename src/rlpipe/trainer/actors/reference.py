"""ReferenceModel role: the frozen initial policy, scoring sampled tokens under no_grad.

Its log-probs feed KL(pi_theta || pi_ref) monitoring every step (seed 000 §3.2) and, when
``train.kl_coef > 0``, the k3 penalty in the loss. It scores the tempered distribution
(logits / T) like the learner, so that both sides of the KL are the same kind of policy.

Departure from seed 000 (which always keeps a reference model): it is loaded only when something
reads it (``needed``: ``train.kl_coef > 0`` or ``train.kl_monitor``). Seed 001 trains a 1.5B HF
policy with no KL term, where a third copy of the weights costs a GPU's worth of memory for nothing;
without it the ``kl/ref_*`` metrics stay NaN and the learner gets ``ref_log_probs=None``.
The policy is either backend (``rlpipe.lm.policy.load_policy``: an rlpipe checkpoint or an HF
directory); ``log_probs`` is microbatched like the learner (``policy_log_probs``). Its log-probs stay
on the device: the reference and the learner share one actor in both placements (``workers``), so
the learner consumes them there, with no copy to the host and back and no synchronisation per step.
"""

from __future__ import annotations

import torch

from rlpipe.lm.device import autocast, resolve_device
from rlpipe.lm.heads import split_lm_head
from rlpipe.lm.policy import for_training, load_policy
from rlpipe.rl.logprobs import get_response_log_probs, pack_token_ids, response_only_log_probs
from rlpipe.rl.records import RolloutBatch
from rlpipe.trainer.profiling import Profiler


def needed(train_cfg) -> bool:
    """Whether a run loads a reference model: a KL penalty or KL monitoring reads it."""
    return train_cfg.kl_coef > 0 or bool(train_cfg.kl_monitor)


def token_log_probs(model, input_ids, labels, response_mask, train_cfg, entropy: bool = False) -> dict:
    """``{"log_probs": (B, T)[, "token_entropy": (B, T)]}`` of ``labels`` at the ``response_mask``
    positions under ``model`` at the sampling temperature. With ``train.response_only_head`` (and a
    model ``rlpipe.lm.heads`` can split) the LM head runs on response tokens only and the other
    positions read 0; otherwise the seeds' ``get_response_log_probs`` over every position."""
    split = split_lm_head(model) if train_cfg.response_only_head else None
    if split is None:
        return get_response_log_probs(model, input_ids, labels, return_token_entropy=entropy,
                                      temperature=train_cfg.sampling_temperature)
    return response_only_log_probs(split.body, split.head, input_ids, labels, response_mask,
                                   return_token_entropy=entropy, temperature=train_cfg.sampling_temperature)


def policy_log_probs(model, batch: RolloutBatch, pad_id: int, train_cfg, device: torch.device) -> torch.Tensor:
    """(B, T) float32 log-probs of ``batch``'s sampled tokens under ``model`` (label layout of
    ``pack_token_ids``, 0 off the response), in microbatches of ``train_batch_size //
    gradient_accumulation_steps`` rows, on ``device``: a caller that hands them to another process
    copies them to the host itself, one consumed where they were computed needs no device-to-host
    synchronisation. Call it under ``no_grad`` or ``inference_mode``."""
    packed = pack_token_ids(batch.prompt_ids, batch.response_ids, pad_id)
    mb = train_cfg.train_batch_size // train_cfg.gradient_accumulation_steps
    ids, labels = packed["input_ids"].to(device), packed["labels"].to(device)  # (B, T) each
    mask = packed["response_mask"].to(device)  # (B, T)
    outs = []
    for s in range(0, ids.shape[0], mb):
        with autocast(device, train_cfg.dtype):
            out = token_log_probs(model, ids[s:s + mb], labels[s:s + mb], mask[s:s + mb], train_cfg)
        outs.append(out["log_probs"].float())  # (mb, T)
    return torch.cat(outs)  # (B, T) on device


class ReferenceModel:
    def __init__(self, checkpoint: str, train_cfg, *, tokenizer: str | None = None, profiler: Profiler | None = None):
        self.cfg = train_cfg
        self.device = resolve_device(train_cfg.device)
        policy = load_policy(checkpoint, device=self.device, dtype=train_cfg.dtype, tokenizer=tokenizer)
        self.model = for_training(policy.model).eval().requires_grad_(False)
        self.pad_id = policy.tokenizer.pad_token_id
        self.prof = profiler or Profiler("reference")

    @torch.no_grad()
    def log_probs(self, batch: RolloutBatch, step: int, version: int) -> torch.Tensor:
        """(B, T) log-probs of the sampled response tokens (label layout of ``pack_token_ids``), on
        this model's device: the learner that reads them lives in the same process (``workers``)."""
        with self.prof.phase("ref_logprobs", step, version):
            return policy_log_probs(self.model, batch, self.pad_id, self.cfg, self.device)
