"""ReferenceModel role: the frozen initial checkpoint, scoring sampled tokens under no_grad.

Its log-probs feed KL(pi_theta || pi_ref) monitoring every step (seed 000 §3.2) and, when
``train.kl_coef > 0``, the k3 penalty in the loss. It scores the tempered distribution
(logits / T) like the learner, so that both sides of the KL are the same kind of policy.
"""

from __future__ import annotations

import torch

from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.device import autocast, resolve_device
from rlpipe.lm.tokenizer import load_tokenizer
from rlpipe.rl.grpo import get_response_log_probs, pack_token_ids
from rlpipe.rl.records import RolloutBatch
from rlpipe.trainer.profiling import Profiler


class ReferenceModel:
    def __init__(self, checkpoint: str, train_cfg, *, tokenizer: str | None = None, profiler: Profiler | None = None):
        self.cfg = train_cfg
        self.device = resolve_device(train_cfg.device)
        ckpt = load_checkpoint(checkpoint, device=self.device)
        self.model = ckpt.model.eval().requires_grad_(False)
        self.pad_id = load_tokenizer(tokenizer or ckpt.tokenizer).pad_token_id
        self.prof = profiler or Profiler("reference")

    @torch.no_grad()
    def log_probs(self, batch: RolloutBatch, step: int, version: int) -> torch.Tensor:
        """(B, T) log-probs of the sampled response tokens (label layout of ``pack_token_ids``)."""

        with self.prof.phase("ref_logprobs", step, version):
            packed = pack_token_ids(batch.prompt_ids, batch.response_ids, self.pad_id)
            mb = self.cfg.train_batch_size // self.cfg.gradient_accumulation_steps
            ids, labels = packed["input_ids"].to(self.device), packed["labels"].to(self.device)
            outs = []
            for s in range(0, ids.shape[0], mb):
                with autocast(self.device, self.cfg.dtype):
                    out = get_response_log_probs(self.model, ids[s:s + mb], labels[s:s + mb],
                                                 temperature=self.cfg.sampling_temperature)
                outs.append(out["log_probs"].float())
            return torch.cat(outs).cpu()  # (B, T)
