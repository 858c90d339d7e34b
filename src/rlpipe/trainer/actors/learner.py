"""Learner role: the training copy of the weights, the optimizer and the policy version.

One ``train_step`` call is one optimizer step over one train batch (``train_batch_size`` rows,
whole groups), split into ``gradient_accumulation_steps`` microbatches that each go through
``rlpipe.rl.train_step.grpo_microbatch_train_step``; then gradient clipping (max-norm 1.0) and AdamW.
The version counter increments on every optimizer step.

How this departs from the seed skeleton, and why:
- The seed's ``update_policy`` re-tokenizes prompt + response text. We pack the *sampled token ids*
  instead (``rlpipe.rl.logprobs.pack_token_ids``): decoding then re-encoding can change the token
  sequence, and the importance ratio must compare log-probs of the very tokens that were sampled.
- The learner scores the same tempered distribution the sampler drew from (logits / T), so on the
  first epoch of an on-policy step the ratio is 1 up to float error. By default the clip anchors to
  the behaviour log-probs the sampler recorded. With ``train.recompute_old_log_probs`` (seed 001
  Problem 13; auto-on for an HF policy or bf16, resolved once by ``rlpipe train``)
  ``recompute_old_logprobs`` scores each scored rollout batch once with the learner's weights under
  ``inference_mode`` before it is split into train batches, and those are the old log-probs of every
  epoch and train step on it (``RolloutBatch.old_logprobs``): the sampler's KV-cache decoding and
  the learner's full-sequence forward take different kernels, and in bf16 or with HF models their
  log-probs differ by more than the clip range can ignore, which would bias the ratio (and the clip)
  of every token. ``logprob/sampler_gap`` (mean |behaviour - recomputed| over response tokens)
  logs that mismatch. Colocated, the learner holds the sampler's version when it recomputes;
  disaggregated, it recomputes when the batch arrives, one version after the sampler's, so the
  anchor is the policy being updated (PPO's pi_old) and the gap also includes that version's drift.
  KL importance weights keep using the behaviour log-probs (the tokens' actual sampling policy).
- ``train.gradient_checkpointing`` recomputes activations in the backward pass, for HF models and
  our ``TransformerLM`` alike (``rlpipe.lm.policy.for_training``). The optimizer is seed 001's: AdamW
  (``weight_decay``, ``betas`` from the config), ``gradient_accumulation_steps`` microbatches, clip
  at ``max_grad_norm``; no HF Trainer.
- KL monitoring (seed 000 §3.2) costs one extra ``no_grad`` forward after the step: with the
  pre-step log-probs of the training forward (pi_{t-1}) and the reference log-probs, it gives
  KL(pi_t || pi_ref) and KL(pi_t || pi_{t-1}) on this step's response tokens, with the seed's
  sample estimates (Eq. 8; ``kl/*_k3`` is the low-variance k3 variant). The tokens were sampled by
  the behaviour policy b, not pi_t, so each token's term is weighted by min(pi_t / b, 10)
  (``grpo.kl_importance_weights``). On-policy the weights are ~1 and change nothing; on replayed
  batches several versions old, unweighted k3 read 147 where the log-ratio estimate read 9.4,
  because exp(log pi_ref/pi_t) is huge on old tokens that pi_t has since learned to avoid.
- Precision (``train.dtype: bfloat16``): the forward/backward runs under bf16 autocast over fp32
  master weights, so gradients and AdamW state are fp32, for an HF policy as for our TransformerLM
  (``rlpipe.lm.policy.learner_weight_dtype``; ``train.master_weights: bfloat16`` keeps seed 001's bf16
  weights and state instead). An HF policy's generator holds bf16 weights on CUDA: ``sync_dtype``
  names that dtype, and weight syncs cast to it (``rlpipe.trainer.weight_sync``). ``last.pt`` stores
  the learner's weights and AdamW state as the learner holds them (fp32 by default).
- Staleness per row = learner version when the row is trained - version that generated it.
- Divergence stops the run (``NonFiniteLossError``, naming the optimizer step): a non-finite loss
  or gradient norm (weights not updated), or, after the update, a non-finite parameter or
  non-finite log-probs on the step's response tokens (weights so large that the model no longer
  gives a distribution: ``train.learning_rate: 1e12`` does this in one step). A learner that
  diverged refuses to save, and ``save_checkpoint`` itself refuses non-finite weights, so
  ``last.pt`` is always the last checkpoint taken after a finite step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from rlpipe.lm.checkpoint import CheckpointError, load_training_state, non_finite_tensors
from rlpipe.lm.device import autocast, resolve_device, setup_process
from rlpipe.lm.policy import for_training, hf_dtype, learner_weight_dtype, load_policy
from rlpipe.rl.kl import kl_importance_weights, masked_kl
from rlpipe.rl.logprobs import pack_response_values, pack_token_ids
from rlpipe.rl.masked import masked_mean_or_zero
from rlpipe.rl.records import RolloutBatch, UpdateResult, VersionEvent
from rlpipe.rl.train_step import grpo_microbatch_train_step
from rlpipe.trainer.actors.checkpoint_writer import CheckpointWriter
from rlpipe.trainer.actors.reference import policy_log_probs, token_log_probs
from rlpipe.trainer.profiling import Profiler

SAMPLER_GAP_METRIC = "logprob/sampler_gap"


class NonFiniteLossError(RuntimeError):
    """Training diverged (NaN/inf loss, gradient, weights or log-probs); the message names the step."""


REQUIRED_EXTRA = ("step", "next_batch", "samples", "version")  # what a resumable checkpoint carries


@dataclass
class TrainTensors:
    input_ids: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T) bool
    old_log_probs: torch.Tensor  # (B, T) old log-probs (recomputed, else behaviour) at response positions, 0 elsewhere
    raw_rewards: torch.Tensor  # (B, 1)
    advantages: torch.Tensor  # (B, 1)
    behaviour_log_probs: torch.Tensor  # (B, T) the sampler's log-probs at response positions, 0 elsewhere

    def to(self, device: torch.device) -> TrainTensors:
        return TrainTensors(*(t.to(device) for t in vars(self).values()))

    def rows(self, sl: slice) -> TrainTensors:
        return TrainTensors(*(t[sl] for t in vars(self).values()))


def build_train_tensors(batch: RolloutBatch, pad_id: int) -> TrainTensors:
    """Packed (B, T) tensors of ``batch``; the old log-probs are ``batch.old_logprobs`` when the
    learner recomputed them, else the sampler's ``behaviour_logprobs``."""
    packed = pack_token_ids(batch.prompt_ids, batch.response_ids, pad_id)
    mask = packed["response_mask"].bool()  # (B, T)
    behaviour = pack_response_values(batch.behaviour_logprobs, mask)  # (B, T)
    old = behaviour if batch.old_logprobs is None else pack_response_values(batch.old_logprobs, mask)  # (B, T)
    if batch.rewards is None or batch.advantages is None:
        raise ValueError("learner got an unscored rollout batch (rewards/advantages missing)")
    return TrainTensors(packed["input_ids"], packed["labels"], mask, old,
                        batch.rewards.float()[:, None], batch.advantages.float()[:, None], behaviour)


def response_log_probs(model, t: TrainTensors, train_cfg, entropy: bool = False) -> dict:
    return token_log_probs(model, t.input_ids, t.labels, t.response_mask, train_cfg, entropy=entropy)


class Learner:
    def __init__(self, checkpoint: str, train_cfg, *, tokenizer: str | None = None, threads: int = 1,
                 profiler: Profiler | None = None, background_checkpoints: bool = False):
        """``background_checkpoints``: ``save`` returns once the state is copied and the file is
        written on a thread (``checkpoint_writer``; ``wait_saved`` waits for it), as the trainer's
        actors do; otherwise ``save`` returns once the file is written."""
        setup_process(threads, train_cfg.seed)
        self.cfg = train_cfg
        self.sizes = train_cfg.derived()
        self.device = resolve_device(train_cfg.device)
        masters = learner_weight_dtype(self.device, train_cfg.dtype, train_cfg.master_weights)
        self.policy = load_policy(checkpoint, device=self.device, dtype=train_cfg.dtype, tokenizer=tokenizer,
                                  weight_dtype=masters)
        self.model = for_training(self.policy.model, train_cfg.gradient_checkpointing).train()
        # the generator's weight dtype (an HF policy's inference copy: bf16 on CUDA), which syncs cast to
        self.sync_dtype = hf_dtype(self.device, train_cfg.dtype) if self.policy.kind == "hf" else None
        self.pad_id = self.policy.tokenizer.pad_token_id
        # fused on CUDA: one kernel over all parameters per step instead of a few per tensor (same update)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=train_cfg.learning_rate,
                                     weight_decay=train_cfg.weight_decay, betas=tuple(train_cfg.betas),
                                     fused=self.device.type == "cuda")
        self.version = 0
        self.diverged: str | None = None  # why the weights can no longer be trusted (set on divergence)
        self.prof = profiler or Profiler("learner")
        self.version_log: list[VersionEvent] = [VersionEvent("learner", 0, time.time(), "init")]
        self.checkpoints = CheckpointWriter(background=background_checkpoints)

    # -- old log-probs (seed 001 Problem 13) ---------------------------------------------------
    def recompute_old_logprobs(self, batch: RolloutBatch, step: int) -> RolloutBatch:
        """Set ``batch.old_logprobs`` to this policy's log-probs of the sampled tokens (inference
        mode, microbatched) and add ``logprob/sampler_gap`` to its metrics; returns ``batch``."""
        with self.prof.phase("old_logprobs", step, self.version), torch.inference_mode():
            self.model.eval()
            lp = policy_log_probs(self.model, batch, self.pad_id, self.cfg, self.device)  # (B, T)
            self.model.train()
        # a normal host tensor: it goes into the rollout batch, which crosses actor boundaries (and
        # inference tensors cannot take part in autograd later)
        lp = lp.to("cpu", copy=True)
        mask = pack_token_ids(batch.prompt_ids, batch.response_ids, self.pad_id)["response_mask"].bool()  # (B, T)
        rows = [row[m] for row, m in zip(lp, mask, strict=True)]  # (B,) each (T_i,)
        if sum(r.numel() for r in rows) != batch.response_tokens():
            raise ValueError("recomputed old log-probs do not cover the batch's response tokens")
        behaviour = torch.cat([b.float() for b in batch.behaviour_logprobs])  # (sum T_i,)
        recomputed = torch.cat(rows) if rows else torch.zeros(0)  # (sum T_i,)
        gap = float((behaviour - recomputed).abs().mean()) if recomputed.numel() else 0.0
        batch.old_logprobs = rows
        batch.reward_metrics = {**batch.reward_metrics, SAMPLER_GAP_METRIC: gap}
        return batch

    # -- one optimizer step ---------------------------------------------------------------------
    def train_step(self, batch: RolloutBatch, ref_log_probs: torch.Tensor | None, step: int) -> UpdateResult:
        """One optimizer step on ``batch`` (``train_batch_size`` rows). ``ref_log_probs`` (B, T)."""
        if len(batch) != self.cfg.train_batch_size:
            raise ValueError(f"train_step got {len(batch)} rows, expected train.train_batch_size="
                             f"{self.cfg.train_batch_size}")
        with self.prof.phase("update", step, self.version):
            cpu = build_train_tensors(batch, self.pad_id)
            tokens = int(cpu.response_mask.sum())  # on the host, before the copy: no device sync
            t = cpu.to(self.device)
            ref = None if ref_log_probs is None else ref_log_probs.to(self.device)
            staleness = (self.version - batch.versions()).float()  # (B,) on the host
            sums, pre_lp = self._accumulate_gradients(t, ref, step)
            metrics = self._optimizer_step(step, sums)
            metrics.update(self._after_update(t, pre_lp, ref, step))
        metrics["staleness/mean"] = float(staleness.mean())
        metrics["staleness/max"] = float(staleness.max())
        return UpdateResult(self.version, metrics, len(batch), tokens)

    def kl_due(self, step: int) -> bool:
        """Whether optimizer step ``step`` measures the KLs (``train.kl_monitor_every``); always with a
        KL penalty, whose loss reads the reference every step. Between measured steps the post-update
        check for non-finite log-probs is skipped too; non-finite weights are still caught every step."""
        c, every = self.cfg, self.cfg.kl_monitor_every
        return c.kl_coef > 0 or step % every == 0 or step in (1, self.sizes.total_optimizer_steps)

    def _diverged(self, step: int, what: str, updated: bool) -> NonFiniteLossError:
        self.diverged = f"optimizer step {step}: {what}"
        kept = ("the weights were updated and are now unusable" if updated else "the weights were not updated")
        return NonFiniteLossError(f"training diverged at optimizer step {step}: {what}; {kept} and are never "
                                  f"checkpointed. Lower train.learning_rate (now {self.cfg.learning_rate:g})")

    def _accumulate_gradients(self, t: TrainTensors, ref: torch.Tensor | None, step: int):
        """Forward and backward of every microbatch. Returns the per-microbatch losses and the
        summed metrics as device tensors (read on the host once, by ``_optimizer_step``: a read per
        microbatch would stall the device each time) and the pre-step log-probs (B, T)."""
        c, mb = self.cfg, self.sizes.micro_train_batch_size
        gas = c.gradient_accumulation_steps
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        pre_lp = torch.zeros_like(t.old_log_probs)  # (B, T)
        losses, clips, ents = [], [], []
        for s in range(0, t.input_ids.shape[0], mb):
            sl, m = slice(s, s + mb), t.rows(slice(s, s + mb))
            with autocast(self.device, c.dtype):
                out = response_log_probs(self.model, m, c, entropy=True)
            lp = out["log_probs"].float()  # (mb, T)
            loss, md = grpo_microbatch_train_step(
                lp, m.response_mask, gas, c.loss_type, raw_rewards=m.raw_rewards, advantages=m.advantages,
                old_log_probs=m.old_log_probs, cliprange=c.cliprange,
                length_normalization=c.length_normalization,
                normalize_constant=c.normalize_constant or float(c.sampling_max_tokens),
                ref_log_probs=None if ref is None else ref[sl], kl_coef=c.kl_coef)
            pre_lp[sl] = lp.detach()
            losses.append(loss.detach().float())
            clips.append(torch.as_tensor(md.get("loss/clip_frac", 0.0), device=self.device).float())
            ents.append(masked_mean_or_zero(out["token_entropy"].float(), m.response_mask).detach())
        return {"losses": losses, "clips": clips, "entropies": ents}, pre_lp

    def _optimizer_step(self, step: int, sums: dict) -> dict[str, float]:
        """Clip and step, unless a loss or the gradient norm is not finite; the step's loss metrics.
        The losses, metrics and gradient norm come to the host in one transfer: the one
        synchronisation the step needs before it may change the weights."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        n, gas = len(sums["losses"]), self.cfg.gradient_accumulation_steps
        host = torch.stack([*sums["losses"], *sums["clips"], *sums["entropies"], grad_norm.float()]).tolist()
        losses, clips, ents, norm = host[:n], host[n:2 * n], host[2 * n:3 * n], host[-1]
        bad_loss = next((v for v in losses if not math.isfinite(v)), None)
        if bad_loss is not None or not math.isfinite(norm):
            self.opt.zero_grad(set_to_none=True)
            what = f"non-finite loss {bad_loss}" if bad_loss is not None else f"non-finite gradient norm {norm}"
            raise self._diverged(step, what, updated=False)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {"loss/policy": sum(losses), "loss/clip_frac": sum(c / gas for c in clips),
                "policy/entropy": sum(e / gas for e in ents), "optim/grad_norm": norm}

    def _after_update(self, t: TrainTensors, pre_lp: torch.Tensor, ref: torch.Tensor | None,
                      step: int) -> dict[str, float]:
        """The post-update checks (every parameter finite; on a KL step, the new policy's log-probs
        too) and the KL metrics, read on the host in one transfer; then the version moves on."""
        params = dict(self.model.named_parameters())
        finite = torch.stack([torch.isfinite(p).all() for p in params.values()]).all()
        kl = self._kl_metrics(t, pre_lp, ref) if self.kl_due(step) else {}
        keys = list(kl)
        host = torch.stack([finite.float(), *(kl[k].float() for k in keys)]).tolist()
        if host[0] != 1.0:
            bad = non_finite_tensors(params, limit=3)
            raise self._diverged(step, f"the update made parameters non-finite: {', '.join(bad)}", updated=True)
        out = dict(zip(keys, host[1:], strict=True))
        n_bad = int(out.pop("_n_bad", 0))
        if n_bad:  # finite but exploded weights: the policy no longer gives a distribution
            biggest = max(float(p.detach().abs().max()) for p in self.model.parameters())
            raise self._diverged(step, f"after the update the policy's log-probs are non-finite on {n_bad} "
                                       f"response tokens (largest |weight| {biggest:.3g})", updated=True)
        self.version += 1
        self.version_log.append(VersionEvent("learner", self.version, time.time(), "optimizer_step"))
        return out

    @torch.no_grad()
    def _kl_metrics(self, t: TrainTensors, pre_lp: torch.Tensor, ref: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The KLs of the updated policy, and ``_n_bad``, its non-finite log-probs on response
        tokens, as device scalars (``_after_update`` reads them)."""
        self.model.eval()
        with autocast(self.device, self.cfg.dtype):
            post = response_log_probs(self.model, t, self.cfg)["log_probs"].float()
        self.model.train()
        out = {"_n_bad": (~torch.isfinite(post) & t.response_mask).sum()}
        w = kl_importance_weights(post, t.behaviour_log_probs)  # (B, T): the tokens' sampling policy
        for est in ("log_ratio", "k3"):
            out[f"kl/prev_{est}"] = masked_kl(post, pre_lp, t.response_mask, est, weights=w)
            if ref is not None:
                out[f"kl/ref_{est}"] = masked_kl(post, ref, t.response_mask, est, weights=w)
        return out

    def kl_to_reference_before_training(self, batch: RolloutBatch, ref_log_probs: torch.Tensor) -> dict:
        """KL(pi_version || pi_ref) on ``batch`` with the current weights (the step-0 value)."""

        t = build_train_tensors(batch, self.pad_id).to(self.device)
        with torch.no_grad(), autocast(self.device, self.cfg.dtype):
            lp = response_log_probs(self.model, t, self.cfg)["log_probs"].float()
        ref = ref_log_probs.to(self.device)
        return {f"kl/ref_{e}": float(masked_kl(lp, ref, t.response_mask, e)) for e in ("log_ratio", "k3")}

    # -- weights and state ---------------------------------------------------------------------
    def save(self, path: str, extra: dict) -> None:
        if self.diverged:
            raise CheckpointError(f"refusing to write checkpoint {path}: training diverged at {self.diverged}; "
                                  "the previous checkpoint is kept")
        extra = dict(extra, version=self.version, torch_rng=torch.get_rng_state())
        # the state is copied now and written on a thread (checkpoint_writer); an HF policy records its directory
        self.checkpoints.save(path, self.model, self.opt, tokenizer=self.policy.tokenizer_ref, extra=extra,
                              hf_pretrained=self.policy.hf_pretrained)

    def wait_saved(self) -> None:
        """Until the last checkpoint asked for is on disk; raises its write's failure."""
        self.checkpoints.wait()

    def restore(self, path: str) -> dict:
        # refuses a damaged or poisoned (NaN/inf) file, or one of another model, before any weight changes
        opt_state, extra = load_training_state(self.model, path)
        missing = [k for k in REQUIRED_EXTRA if k not in extra]
        if missing:
            raise CheckpointError(f"checkpoint {path} is not a resumable trainer checkpoint: extra lacks {missing}")
        if opt_state is not None:
            self.opt.load_state_dict(opt_state)
        self.version = int(extra["version"])
        if "torch_rng" in extra:
            torch.set_rng_state(extra["torch_rng"])
        return dict(extra)

    def drain_logs(self):
        events, self.version_log = self.version_log, []
        return self.prof.drain(), events
