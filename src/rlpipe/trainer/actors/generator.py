"""Generator role: its own copy of the policy weights, producing G responses per prompt.

As in seed 000 §3.1.1 the Generator keeps a second copy of the model (the way vLLM-backed RL
systems do) and only changes weights through ``load_weights``. It records the policy version it
holds, stamps every rollout batch with it, and logs each version change and each sampling start
(who, version, wall time) so the one-version-behind bound can be checked after a run.

Sampling seeds are a function of (run seed, the first optimizer step that trains on the batch),
not of call order, so colocated
``k=1`` reproduces Variant A exactly and a resumed run samples what an uninterrupted one would.

The policy is either backend (``rlpipe.lm.policy.load_policy``): our ``TransformerLM`` from an rlpipe
checkpoint, or a local HuggingFace ``AutoModelForCausalLM`` directory (bf16 weights on CUDA when
``train.dtype`` is ``bfloat16``). Seed 001 samples with vLLM; rollouts here always go through our
KV-cache sampler (``rlpipe.lm.sampler.generate``), which drives both. Validation reports the mean
reward and, for tasks whose reward dicts have them, the format and answer rewards
(``reward/val_format_mean``, ``reward/val_answer_mean``).

Policy lag (seed 001 Problem 14; ``train.policy_lag`` L > 1, disaggregated only). Real asynchronous
systems get staleness from queueing, so its amount depends on timing. To sweep it as a controlled
variable, the generator keeps the last L versions it received (``deque`` of host copies, in pinned
memory on a GPU, so the history takes no GPU memory: L copies of a bf16 1.5B model would be about
3 GB each; the buffers of the oldest copy are reused for the newest) and samples
rollouts with the oldest, in a second model; validation still uses the newest weights, so the
validation curve shows the learner's policy, not the lagged one. Every batch is stamped with the
version it was sampled with, so the learner's ``staleness/*`` metrics and the version log show the
lag, and the disaggregated driver checks the bound on every batch. Cost: L weight copies and one
model more of memory, one weight copy per rollout batch. A resumed run restarts the history from
its checkpoint, so its first L batches after the restart are less stale than uninterrupted ones.
"""

from __future__ import annotations

import copy
import time
from collections import deque

import torch

from rlpipe.lm.device import autocast, resolve_device, setup_process
from rlpipe.lm.policy import load_policy
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.rl.records import RolloutBatch, VersionEvent
from rlpipe.rl.reward_guard import guarded_rewards
from rlpipe.rl.scoring import reward_means
from rlpipe.tasks import Example
from rlpipe.trainer.profiling import Profiler
from rlpipe.trainer.weight_sync.payload import _load_into, flat_weights


def sample_seed(run_seed: int, step: int) -> int:
    return (run_seed * 1_000_003 + step * 7_919 + 17) % (2**31 - 1)


class Generator:
    def __init__(self, checkpoint: str, train_cfg, *, tokenizer: str | None = None, stop: tuple[str, ...] = (),
                 include_stop: bool = False, threads: int = 1, profiler: Profiler | None = None):
        setup_process(threads, train_cfg.seed)
        self.cfg = train_cfg
        self.device = resolve_device(train_cfg.device)
        policy = load_policy(checkpoint, device=self.device, dtype=train_cfg.dtype, tokenizer=tokenizer)
        self.model = policy.model.eval()
        self.tokenizer = policy.tokenizer
        self.stop = tuple(stop)
        self.include_stop = include_stop  # the task's grader reads the stop string (r1_zero's </answer>)
        self.version = 0
        self.prof = profiler or Profiler("generator")
        self.version_log: list[VersionEvent] = [VersionEvent("generator", 0, time.time(), "init")]
        self.lag = train_cfg.policy_lag
        if self.lag > 1:  # the last `lag` versions received, oldest first; rollouts use the oldest
            self._history: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=self.lag)
            self._remember()
            self._lagged_model = copy.deepcopy(self.model)
            self._lagged_version: int | None = None  # the version in _lagged_model; None before any rollout

    # -- sampling -----------------------------------------------------------------------------
    def _sampling_params(self, n: int, seed: int):
        c = self.cfg
        return SamplingParams(n=n, temperature=c.sampling_temperature, top_p=c.sampling_top_p,
                              max_tokens=c.sampling_max_tokens, min_tokens=c.sampling_min_tokens,
                              stop=self.stop, include_stop_str_in_output=self.include_stop, seed=seed)

    @torch.inference_mode()
    def _sample(self, examples: list[Example], n: int, seed: int, model=None):
        with autocast(self.device, self.cfg.dtype):
            return generate(self.model if model is None else model, self.tokenizer, [e.prompt for e in examples],
                            self._sampling_params(n, seed), device=self.device, decode=self.cfg.decode)

    def _rollout_policy(self):
        """``(model, version)`` that rollouts sample with: the newest weights, or with
        ``policy_lag`` L > 1 the oldest of the last L versions received."""
        if self.lag == 1:
            return self.model, self.version
        version, weights = self._history[0]
        if version != self._lagged_version:
            with torch.no_grad():
                _load_into(flat_weights(self._lagged_model), weights)
            self._lagged_version = version
        return self._lagged_model, version

    def _remember(self) -> None:
        """The current weights into the history, on the host (pinned on a GPU: the copy back to the
        device for a rollout is then one fast transfer each)."""
        flat = flat_weights(self.model)
        if len(self._history) == self.lag:  # the oldest copy's buffers take the newest weights
            copies = self._history.popleft()[1]
        else:
            copies = {k: torch.empty(v.shape, dtype=v.dtype, device="cpu", pin_memory=v.is_cuda)
                      for k, v in flat.items()}
        with torch.no_grad():
            for k, v in flat.items():
                copies[k].copy_(v.detach(), non_blocking=v.is_cuda)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the copies are complete before the model changes
        self._history.append((self.version, copies))

    def generate(self, examples: list[Example], step: int) -> RolloutBatch:
        """G responses for each prompt, sampled with the weights of ``self.version`` (with a policy
        lag, of the version L syncs older); ``step`` is the first optimizer step that will train on
        the batch (events and seeds are keyed by it)."""
        g = self.cfg.group_size
        model, version = self._rollout_policy()
        self.version_log.append(VersionEvent("generator", version, time.time(), "sample_start"))
        with self.prof.phase("generate", step, version):
            out = self._sample(examples, g, sample_seed(self.cfg.seed, step), model)
        return RolloutBatch(
            prompts=[e.prompt for e in examples for _ in range(g)],
            ground_truths=[e.ground_truth for e in examples for _ in range(g)],
            prompt_ids=out.prompt_ids,
            response_ids=out.response_ids,
            responses=out.response_text,
            behaviour_logprobs=[lp.detach().float().cpu() for lp in out.logprobs],
            finish_reasons=out.finish_reason,
            policy_version=version,
            group_size=g,
        )

    def validate(self, examples: list[Example], reward_fn, step: int) -> tuple[dict[str, float], list[dict]]:
        """``({"reward/val_mean", "reward/val_format_mean", "reward/val_answer_mean"}, examples)``:
        mean rewards of one response per validation prompt, sampled with the fixed validation seed
        at the training temperature (format/answer when the task's reward dicts have them), and a
        few scored examples."""
        with self.prof.phase("validate", step, self.version):
            responses = self._sample(examples, 1, self.cfg.val_seed).response_text
            scores, _ = guarded_rewards(reward_fn, responses, [e.ground_truth for e in examples])
            rewards = [float(s["reward"]) for s in scores]  # a failing sample scores 0 (logged)
        shown = [{"prompt": e.prompt, "response": r, "reward": w, "ground_truth": e.ground_truth}
                 for e, r, w in list(zip(examples, responses, rewards, strict=True))[:4]]
        return reward_means(scores, prefix="reward/val"), shown

    # -- weights ------------------------------------------------------------------------------
    def mark_loaded(self, version: int) -> None:
        """Record that a weight sync of learner ``version`` has been copied into ``self.model``."""
        self.version = int(version)
        self.version_log.append(VersionEvent("generator", self.version, time.time(), "load_weights"))
        if self.lag > 1:
            if self._lagged_version is None:  # no rollout yet (a resume): history starts here
                self._history.clear()
            self._remember()

    def drain_logs(self):
        events, self.version_log = self.version_log, []
        return self.prof.drain(), events
