"""The ``train`` section: GRPO training, with its weight-sync, replay and task options and the
cross-field rules of seed 001."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from rlpipe.config.base import _DEVICE_HELP, DEVICE_PATTERN, ConfigError, _expand, _Invalid, _Section

# train.task: a built-in or entry-point name, or 'package.module:Class' (rlpipe.tasks.registry loads it)
TASK_SPEC_PATTERN = r"^[A-Za-z_][\w.-]*(:[A-Za-z_]\w*)?$"


class WeightSyncConfig(_Section):
    """Learner -> Generator weight sync."""

    _prefix: ClassVar[str] = "train.weight_sync"

    transport: Literal["local", "object_store", "rdt"] = Field(
        "object_store", description="Learner->Generator weight transport (colocated runs always copy in-process).")
    backend: Literal["gloo", "nccl", "nixl", "cuda_ipc"] = Field(
        "gloo", description="RDT backend when transport is 'rdt'.")
    timeout_s: float = Field(
        120.0, gt=0, description="A sync slower than this fails with an error naming the transport.")
    channel: bool = Field(
        True, description="Transport 'object_store' (ignored by the others): write every sync into one reused Ray "
        "shared-memory channel buffer (ray.experimental.channel); false: a fresh object-store object per sync.")


class ReplayConfig(_Section):
    """Replay buffer of the disaggregated driver."""

    _prefix: ClassVar[str] = "train.replay"

    enabled: bool = Field(
        False, description="Learner samples training batches from a replay buffer (disaggregated mode).")
    capacity_groups: int = Field(64, ge=1, description="Buffer capacity in prompt groups (FIFO eviction).")
    max_age: int = Field(
        4, ge=0, description="Drop groups generated more than this many policy versions ago (0: current only).")
    strategy: Literal["uniform", "recency"] = Field("uniform", description="Sampling strategy.")


class MathOptions(_Section):
    """Options of the ``math`` task (seeds 001 and 004); ignored by the other tasks."""

    _prefix: ClassVar[str] = "train.math"

    prompt: Literal["r1_zero", "question_only"] = Field(
        "r1_zero", description="Prompt template; it picks its reward function and stop strings "
        "(r1_zero: r1_zero_reward_fn, stop at </answer>; question_only: the last \\boxed{}, seed 004).")
    strict: bool = Field(
        False, description="Course-comparable grading: reject unsimplified answers (2+2, 5!, \\frac{2}{4}) and "
        "decimal approximations of fractions (rlpipe.tasks.math.grader).")
    problem_field: str = Field("problem", min_length=1, description="JSONL field holding the problem text.")
    answer_field: str | None = Field(
        "answer", description="JSONL field holding the short answer (null: always read it from the solution).")
    solution_field: str | None = Field(
        "solution", description="JSONL field holding a worked solution whose last \\boxed{} (or GSM8K '####') "
        "gives the answer when answer_field is absent or empty.")


class TextOptions(_Section):
    """Options of the generic ``text`` task (``rlpipe.tasks.text``): the user's own JSONL dataset,
    prompt template and reward function; ignored by the other tasks."""

    _prefix: ClassVar[str] = "train.text"

    train_file: str = Field("train.jsonl", min_length=1, description="Training split, a JSONL file in --dataset.")
    val_file: str = Field("val.jsonl", min_length=1, description="Validation split, a JSONL file in --dataset.")
    template: str = Field(
        "{prompt}", min_length=1, description="Prompt template: Python format string whose {field} placeholders "
        "name JSONL fields (write {{ and }} for literal braces).")
    template_file: str | None = Field(
        None, min_length=1, description="A file holding the prompt template (replaces `template`); relative paths "
        "are resolved against the working directory when the config is parsed.")
    answer_field: str | None = Field(
        "answer", min_length=1, description="JSONL field passed to the reward as the ground truth (null: the whole "
        "JSON object).")
    reward: str | None = Field(
        None, min_length=3, description="The reward function: 'package.module:function' or 'path/to/file.py:function'. "
        "It is called as fn(response, ground_truth) and returns a float or a dict with 'reward' (and optionally "
        "'format_reward', 'answer_reward'); it runs under the trainer's guard (a time limit; an error scores 0 and "
        "is counted in reward/errors). Required when train.task is 'text'.")
    stop: list[str] = Field([], description="Stop strings: sampling stops at the first one generated.")
    include_stop_str_in_output: bool = Field(
        False, description="Keep the matched stop string at the end of the response (the reward sees it).")

    @model_validator(mode="after")
    def absolute_paths(self) -> TextOptions:
        # Ray actors may run in another working directory: a relative file path is fixed here, once.
        if self.template_file is not None:
            self.template_file = str(Path(self.template_file).expanduser().resolve())
        if self.reward is not None and ".py:" in self.reward:
            path, _, fn = self.reward.rpartition(":")
            self.reward = f"{Path(path).expanduser().resolve()}:{fn}"
        return self


@dataclass(frozen=True)
class DerivedSizes:
    """Sizes computed from a valid ``TrainConfig`` (``TrainConfig.derived``)."""

    n_prompts_per_rollout_batch: int
    micro_train_batch_size: int
    train_steps_per_rollout_batch: int
    total_optimizer_steps: int
    rounds: int


class TrainConfig(_Section):
    """GRPO training. Defaults are seed 000 §3.1.2 plus seed 001's batch knobs."""

    _prefix: ClassVar[str] = "train"

    task: str = Field(
        "keyword_inclusion", pattern=TASK_SPEC_PATTERN,
        description="The task: a built-in name (keyword_inclusion, sorting, math, text), an import path to a Task "
        "class ('package.module:MyTask'), or a name an installed package registers under the 'rlpipe.tasks' "
        "entry-point group. 'math' reads a MATH-format dataset with the r1_zero prompt and grader; 'text' is the "
        "generic JSONL task of train.text.")
    task_options: dict[str, Any] = Field(
        {}, description="Keyword arguments of a plug-in task class's constructor (after the dataset directory); "
        "the built-in tasks take theirs from train.math and train.text.")
    mode: Literal["colocated_sync", "colocated_k", "disaggregated"] = Field(
        "colocated_sync",
        description="Driver: Variant A, Variant B (k rollout batches per sync), or one-version-behind async.")
    k: int = Field(
        1, ge=1, description="colocated_k: rollout batches generated per policy version (one optimizer step each).")
    n_grpo_steps: int = Field(
        100, ge=1, description="Rollout batches to generate in total (same total samples across modes).")
    learning_rate: float = Field(5e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: list[Annotated[float, Field(ge=0, lt=1)]] = Field(
        [0.9, 0.95], min_length=2, max_length=2, description="AdamW betas (two values, each in [0, 1)).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping max-norm.")
    group_size: int = Field(4, ge=1, description="G: responses per prompt.")
    rollout_batch_size: int = Field(32, ge=1, description="Responses per rollout batch (prompts x group_size).")
    train_batch_size: int = Field(
        32, ge=1, description="Responses per optimizer step (== rollout_batch_size is on-policy).")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Microbatches per optimizer step.")
    epochs_per_rollout_batch: int = Field(1, ge=1, description="Passes over each rollout batch.")
    sampling_temperature: float = Field(
        0.8, gt=0, description="Sampling temperature (the learner scores the same tempered policy).")
    sampling_top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    sampling_max_tokens: int = Field(60, ge=1, description="Max new tokens per response.")
    sampling_min_tokens: int = Field(0, ge=0, description="EOS is masked until this many tokens were generated.")
    advantage_eps: float = Field(1e-8, ge=0, description="Added to the group std.")
    advantage_mode: Literal["rewards", "centered_rewards", "normalized_rewards", "max_rewards"] = Field(
        "normalized_rewards",
        description="Seed 003 delta mode; use_std_normalization=false turns normalized into centered.")
    use_std_normalization: bool = Field(
        True, description="Divide advantages by the group std (Eq. 1) or not (Dr. GRPO Eq. 4).")
    loss_type: Literal["no_baseline", "reinforce_with_baseline", "grpo_clip", "grpo_no_clip"] = Field(
        "grpo_clip", description="Policy-gradient loss.")
    cliprange: float = Field(0.2, gt=0, description="GRPO-Clip epsilon.")
    length_normalization: Literal["masked_mean", "masked_normalize"] = Field(
        "masked_mean", description="Per-sequence reduction (seed 004).")
    normalize_constant: float | None = Field(
        None, gt=0, description="masked_normalize divisor; default sampling_max_tokens.")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL-to-reference penalty coefficient (0 = monitor only).")
    val_every: int = Field(
        10, ge=1, description="Validation interval in optimizer steps (also at step 0 and the end).")
    val_size: int = Field(
        64, ge=1, description="Validation prompts (one greedy-free sample each at sampling temperature).")
    val_seed: int = Field(1234, ge=0, description="Fixed sampling seed for validation.")
    log_rollouts_every: int = Field(
        25, ge=1, description="Write example rollouts every N steps (plus first and last).")
    checkpoint_every: int = Field(25, ge=1, description="Checkpoint interval in optimizer steps (plus the end).")
    seed: int = Field(0, ge=0, description="Run seed.")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description=f"{_DEVICE_HELP}.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Compute precision of generation, reference and update. bfloat16: our "
        "TransformerLM runs under torch.autocast (bf16 matmuls; norms, RoPE, softmax, log-probs and losses in "
        "fp32) on CUDA and CPU, with fp32 weights and fp32 AdamW state; an HF policy's learner does the same "
        "(see master_weights), its generator and reference model hold bf16 weights on CUDA (seed 001) and fp32 "
        "on CPU. config/gpu.yaml sets bfloat16.")
    master_weights: Literal["float32", "bfloat16"] = Field(
        "float32", description="Learner weights of an HF policy under dtype bfloat16 on CUDA, and so its "
        "gradients and AdamW state. float32: master weights, forward and backward under bf16 autocast (updates "
        "far below bf16's resolution still count); 16 bytes per parameter (24.7 GB for Qwen2.5-Math-1.5B). "
        "bfloat16: seed 001's bf16 weights and AdamW state, 8 bytes per parameter (12.3 GB), for a GPU too "
        "small for the other. Needs dtype bfloat16; elsewhere (CPU, our TransformerLM) the weights are fp32. "
        "Checkpoints store the learner's weights and AdamW state in this dtype.")
    threads: int = Field(
        1, ge=1, description="torch threads per compute actor (one CPU 'device': colocated runs one, "
                             "disaggregated two), capped by the job's threads (workflow.threads_per_variant).")
    scorer_actor: bool = Field(False, description="Disaggregated: score rewards in a separate Scorer actor.")
    policy_lag: int = Field(
        1, ge=1, le=16, description="Disaggregated: rollouts are sampled with the weights of this many syncs ago "
        "(1: the one-version-behind loop; L: every batch after the first L is L rollout batches stale; "
        "seed 001 Problem 14's policy-lag sweep). The generator keeps the last L versions; validation uses "
        "the newest.")
    ray_timeout_s: float = Field(
        600.0, gt=0, description="Max seconds the driver waits on any actor call before failing, once its "
        "actors have started (train.actor_start_timeout_s bounds their start).")
    actor_start_timeout_s: float | None = Field(
        None, gt=0, description="Max seconds the driver waits for its actors to start (placed, imports, model "
        "and data loaded) before failing; null: train.ray_timeout_s. A start can be slow on a loaded machine or "
        "a busy cluster where a hung step should fail sooner (train.ray_timeout_s).")
    recompute_old_log_probs: bool | None = Field(
        None, description="Recompute old log-probs with the learner's policy under inference_mode after each "
        "rollout (seed 001 Problem 13) instead of using the sampler's. null: on whenever the sampler's numerics "
        "can differ from the learner's (a HuggingFace policy, or dtype bfloat16), off otherwise.")
    decode: Literal["auto", "eager", "static", "compiled", "aot", "cudagraph"] = Field(
        "auto", description="How the sampler decodes: 'eager' "
        "grows the KV cache and drops finished rows; 'static' steps over a fixed-shape cache (an HF Qwen2 or Llama "
        "policy: the engine's static KV arena, finished rows compacted into power-of-two batch buckets); "
        "'cudagraph' replays that step from a CUDA graph per batch shape or bucket. For our TransformerLM only: "
        "'compiled' runs that "
        "step through torch.compile (a C++ compiler on CPU; compilation per batch shape in every process); 'aot' "
        "runs it from an AOTInductor package built once per model shape and machine (CPU, float32; a C++ compiler "
        "for the build; kept in $RLPIPE_DECODE_CACHE, default ~/.cache/rlpipe/decode; `rlpipe build-decode` builds "
        "it ahead). 'cudagraph' is CUDA only (refused with device cpu). 'auto' is 'cudagraph' when the run's device "
        "is CUDA (for an HF policy, when its architecture is Qwen2 or Llama) and 'eager' otherwise. "
        "Tokens and log-probs agree across them to float rounding.")
    response_only_head: bool = Field(
        True, description="Learner, reference and old-log-prob passes run the LM head, log-softmax and entropy on "
        "response tokens only instead of every padded position (same values up to float rounding). false: the "
        "seeds' get_response_log_probs over the whole batch.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass (HuggingFace policies): less memory, "
        "more update time.")
    kl_monitor: bool = Field(
        True, description="Measure KL(pi || pi_ref) every step. With this off and kl_coef 0 no reference model "
        "is loaded (seed 001: it saves a model's memory).")
    kl_monitor_every: int = Field(
        1, ge=1, description="With kl_coef 0: measure both KLs (to the reference and to the previous step) on "
        "every N-th optimizer step only (and the first and last), skipping the reference forward and the "
        "post-update forward between them (two forward passes; their share of a step depends on the machine). "
        "The other steps log no kl/*.")
    math: MathOptions = Field(default_factory=MathOptions, description="Options of the math task.")
    text: TextOptions = Field(default_factory=TextOptions, description="Options of the generic text task.")
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig, description="Weight-sync transport.")
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="Replay buffer.")

    @model_validator(mode="after")
    def check_cross_fields(self) -> TrainConfig:
        self._check_sizes()
        return self

    def _check_sizes(self) -> None:
        """The cross-field rules (seed 001's asserts); ``@key`` names a key of this section."""

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise _Invalid(msg)

        need(self.rollout_batch_size % self.group_size == 0,
             f"@rollout_batch_size ({self.rollout_batch_size}) must be divisible by @group_size ({self.group_size})")
        need(self.train_batch_size % self.gradient_accumulation_steps == 0,
             f"@train_batch_size ({self.train_batch_size}) must be divisible by "
             f"@gradient_accumulation_steps ({self.gradient_accumulation_steps})")
        need(self.train_batch_size >= self.group_size,
             f"@train_batch_size ({self.train_batch_size}) must be >= @group_size ({self.group_size})")
        need(self.rollout_batch_size % self.train_batch_size == 0,
             f"@rollout_batch_size ({self.rollout_batch_size}) must be divisible by "
             f"@train_batch_size ({self.train_batch_size})")
        need(self.train_batch_size % self.group_size == 0,
             f"@train_batch_size ({self.train_batch_size}) must be divisible by @group_size "
             f"({self.group_size}) so optimizer steps see whole groups")
        need(self.n_grpo_steps % self.k == 0,
             f"@n_grpo_steps ({self.n_grpo_steps}) must be divisible by @k ({self.k})")
        need(self.mode == "colocated_k" or self.k == 1,
             f"@k={self.k} needs @mode: colocated_k (mode is {self.mode})")
        need(not self.replay.enabled or self.mode == "disaggregated",
             f"@replay.enabled needs @mode: disaggregated (mode is {self.mode})")
        need(self.master_weights == "float32" or self.dtype == "bfloat16",
             f"@master_weights: bfloat16 needs @dtype: bfloat16 (dtype is {self.dtype})")
        need(self.policy_lag == 1 or self.mode == "disaggregated",
             f"@policy_lag={self.policy_lag} needs @mode: disaggregated (mode is {self.mode})")
        groups = self.rollout_batch_size // self.group_size
        need(not self.replay.enabled or self.replay.capacity_groups >= groups,
             f"@replay.capacity_groups ({self.replay.capacity_groups}) must hold one rollout batch "
             f"(@rollout_batch_size / @group_size = {groups} groups)")
        need(self.task != "text" or self.text.reward is not None,
             "@text.reward is required when @task is 'text' (e.g. 'mypkg.rewards:exact_match' or "
             "'rewards.py:exact_match')")
        need(self.decode != "cudagraph" or not self.device.startswith("cpu"),
             f"@decode: cudagraph needs a CUDA device, but @device is {self.device}; use @decode: auto "
             "(cudagraph on CUDA, eager on CPU), eager, static, compiled or aot")
        need(self.sampling_min_tokens <= self.sampling_max_tokens,
             f"@sampling_min_tokens ({self.sampling_min_tokens}) must be <= "
             f"@sampling_max_tokens ({self.sampling_max_tokens})")

    def derived(self) -> DerivedSizes:
        """Every derived size, computed once. The rules are re-checked, since a section's fields
        can be reassigned after validation (tests do)."""
        try:
            self._check_sizes()
        except _Invalid as e:
            raise ConfigError(_expand(str(e), self._prefix)) from None
        steps_per_batch = self.epochs_per_rollout_batch * (self.rollout_batch_size // self.train_batch_size)
        return DerivedSizes(
            n_prompts_per_rollout_batch=self.rollout_batch_size // self.group_size,
            micro_train_batch_size=self.train_batch_size // self.gradient_accumulation_steps,
            train_steps_per_rollout_batch=steps_per_batch,
            total_optimizer_steps=self.n_grpo_steps * steps_per_batch,
            rounds=self.n_grpo_steps // self.k,
        )
