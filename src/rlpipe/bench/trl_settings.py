"""The settings both sides of ``rlpipe bench trl`` agree on (``BenchSettings``, translated only by
``grpo_config_kwargs`` and ``rlpipe_train_overrides``), the checks of its inputs, and the one
evaluation path both sides are scored by (see ``rlpipe.bench.trl`` for the bench itself)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from rlpipe.config import ConfigError, TrainConfig, load_config
from rlpipe.lm.checkpoint import CheckpointError, open_base_checkpoint
from rlpipe.lm.policy import load_policy
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.tasks.keyword.dataset import load_split
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn
from rlpipe.tasks.keyword.task import KeywordInclusionTask

DEVICES = ("cpu", "cuda")  # cuda: the one GPU accelerate picks (CUDA_VISIBLE_DEVICES selects it)


class BenchInputError(ValueError):
    """An input of ``rlpipe bench trl`` (checkpoint, dataset, config, a setting) is unusable; the
    message names it."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class BenchSettings:
    """Everything both trainers must agree on; ``grpo_config_kwargs`` and ``rlpipe_train_overrides``
    are the only places it is translated."""

    steps: int = 16  # optimizer steps (= rollout batches, on-policy)
    prompts_per_step: int = 8
    group_size: int = 4  # G, TRL num_generations
    max_new_tokens: int = 40
    temperature: float = 0.8
    top_p: float = 1.0
    learning_rate: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    cliprange: float = 0.2
    advantage_eps: float = 1e-8  # rlpipe only: TRL hard-codes 1e-4
    decode: str = "eager"  # rlpipe only (train.decode): TRL always runs HF generate
    threads: int = 2
    device: str = "cpu"  # both sides: cpu or cuda (one GPU; TRL through accelerate, rlpipe through train.device)
    seed: int = 0
    val_size: int = 64
    val_seed: int = 1234

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def check(self) -> None:
        for name in ("steps", "prompts_per_step", "max_new_tokens", "threads", "val_size"):
            if getattr(self, name) < 1:
                raise BenchInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.device not in DEVICES:
            raise BenchInputError(f"device must be one of {list(DEVICES)}, got {self.device!r}")
        if self.group_size < 2:
            raise BenchInputError(f"group_size must be >= 2 (TRL's GRPO needs 2 generations), got {self.group_size}")


def settings_from_config(train_cfg, *, steps: int, prompts_per_step: int, threads: int) -> BenchSettings:
    """The bench settings: the pipeline's ``train`` section (its sampling, optimizer and loss
    values) with this bench's steps, prompts per step and threads."""
    t = train_cfg
    return BenchSettings(
        steps=steps, prompts_per_step=prompts_per_step, group_size=t.group_size,
        max_new_tokens=t.sampling_max_tokens, temperature=t.sampling_temperature, top_p=t.sampling_top_p,
        learning_rate=t.learning_rate, betas=(float(t.betas[0]), float(t.betas[1])), weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, cliprange=t.cliprange, advantage_eps=t.advantage_eps, decode=t.decode,
        threads=threads,
        seed=t.seed, val_size=t.val_size, val_seed=t.val_seed)


def grpo_config_kwargs(s: BenchSettings, output_dir: str) -> dict:
    """``GRPOConfig(**kwargs)`` for the settings: on-policy (one generation batch per optimizer
    step, one iteration), fp32 on ``s.device``, constant LR, no KL, no eval, nothing saved or reported."""
    return dict(
        output_dir=output_dir, max_steps=s.steps, per_device_train_batch_size=s.samples_per_step,
        gradient_accumulation_steps=1, num_generations=s.group_size, num_iterations=1,
        max_completion_length=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=0,
        learning_rate=s.learning_rate, adam_beta1=s.betas[0], adam_beta2=s.betas[1], adam_epsilon=1e-8,
        weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm, optim="adamw_torch",
        lr_scheduler_type="constant", warmup_steps=0, epsilon=s.cliprange, beta=0.0, loss_type="grpo",
        scale_rewards="group", mask_truncated_completions=False, shuffle_dataset=False, seed=s.seed,
        use_cpu=s.device == "cpu", bf16=False, fp16=False, gradient_checkpointing=False, report_to="none",
        save_strategy="no", eval_strategy="no", logging_steps=s.steps, disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, remove_unused_columns=False,
    )


def rlpipe_train_overrides(s: BenchSettings) -> dict:
    """``train`` section overrides for ``rlpipe train`` (variant colocated_sync) with the settings:
    the same batch, sampling, optimizer and loss; no reference model; the post-update KL forward
    (KL to the previous step, which TRL does not compute) on the first and last step only;
    validation and checkpoint only at step 0 and the end (outside the timed steps)."""
    return {
        "task": "keyword_inclusion", "mode": "colocated_sync", "k": 1, "n_grpo_steps": s.steps,
        "group_size": s.group_size, "rollout_batch_size": s.samples_per_step,
        "train_batch_size": s.samples_per_step, "gradient_accumulation_steps": 1, "epochs_per_rollout_batch": 1,
        "sampling_temperature": s.temperature, "sampling_top_p": s.top_p, "sampling_max_tokens": s.max_new_tokens,
        "sampling_min_tokens": 0, "learning_rate": s.learning_rate, "betas": list(s.betas),
        "weight_decay": s.weight_decay, "max_grad_norm": s.max_grad_norm, "cliprange": s.cliprange,
        "loss_type": "grpo_clip", "advantage_mode": "normalized_rewards", "use_std_normalization": True,
        "advantage_eps": s.advantage_eps, "length_normalization": "masked_mean", "kl_coef": 0.0,
        "decode": s.decode, "kl_monitor": False, "kl_monitor_every": s.steps, "recompute_old_log_probs": False,
        "gradient_checkpointing": False,
        "val_every": s.steps, "val_size": s.val_size, "val_seed": s.val_seed, "checkpoint_every": s.steps,
        "log_rollouts_every": s.steps, "device": s.device, "dtype": "float32", "threads": s.threads, "seed": s.seed,
    }


# --------------------------------------------------------------------------- inputs


def import_trl():
    """The ``trl`` module, or None when it cannot be imported (the ``bench`` extra is missing)."""
    try:
        return importlib.import_module("trl")
    except ImportError:
        return None


def check_inputs(checkpoint: str, dataset: str, config: str | None):
    """Open every input; a bad one raises ``BenchInputError`` naming it. Returns the train section
    of the pipeline config (its defaults when ``config`` is None)."""

    try:
        open_base_checkpoint(checkpoint, "--checkpoint")
    except (FileNotFoundError, CheckpointError) as e:
        raise BenchInputError(str(e)) from None
    try:
        KeywordInclusionTask.check_dataset(dataset)
    except (FileNotFoundError, ValueError) as e:
        raise BenchInputError(f"--dataset: {e}") from None
    if config is None:
        return TrainConfig()
    try:
        return load_config(config).train
    except ConfigError as e:
        raise BenchInputError(f"--config: {e}") from None


# --------------------------------------------------------------------------- shared evaluation


def validation_reward(model, tokenizer, dataset: str, s: BenchSettings) -> float:
    """Mean keyword reward of one sample per validation prompt (the first ``val_size``), sampled
    with rlpipe's sampler at the training temperature and top-p with the fixed ``val_seed`` on
    ``s.device``: the one evaluation path of both sides (and of rlpipe's own validation)."""

    examples = load_split(dataset, "val")[: s.val_size]
    params = SamplingParams(n=1, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens,
                            seed=s.val_seed)
    responses = generate(model, tokenizer, [e.prompt for e in examples], params, device=s.device).response_text
    rewards = [float(keyword_inclusion_reward_fn(r, e.keywords)["reward"])
               for r, e in zip(responses, examples, strict=True)]
    return round(sum(rewards) / len(rewards), 4)


def _policy_reward(path: str, dataset: str, s: BenchSettings) -> float:

    policy = load_policy(path, device=s.device)
    return validation_reward(policy.model, policy.tokenizer, dataset, s)


def prompt_sequence(dataset: str, s: BenchSettings) -> list[dict]:
    """rlpipe's training prompts in its order (rollout batch b = ``prompts_for_batch(b, P, seed)``),
    as TRL dataset rows ``{"prompt", "keywords"}``."""

    task = KeywordInclusionTask(dataset)
    rows = []
    for b in range(s.steps):
        rows += [{"prompt": e.prompt, "keywords": list(e.ground_truth)}
                 for e in task.prompts_for_batch(b, s.prompts_per_step, s.seed)]
    return rows


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
