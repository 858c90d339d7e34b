"""The one typed config of rlpipe: pydantic v2 models, one per section.

A pipeline config is a YAML file with one section per stage (``data``, ``tokenizer``, ``model``,
``pretrain``, ``train``, ``ray``, ``workflow``) plus a ``variants`` table. Every key is a pydantic
field below, ``Field(default, <bounds>, description=...)``: the model field is the only place a
default lives, and every numeric field carries its valid range (``ge``/``gt``/``le``/``lt``).
The models are strict (a bool is not an int, a string is not a number; an int is accepted for a
float field), reject NaN and infinity, and forbid unknown keys. Cross-field rules (the seed-001
divisibility asserts, ``k`` needs ``colocated_k``, replay needs ``disaggregated``, a TinyStories
corpus needs ``data.corpus_path``) are ``model_validator(mode="after")`` checks, so a bad config
fails when it is parsed, before any work. ``TrainConfig.derived`` then computes every derived size
once.

Every failure is a ``ConfigError`` (a ``ValueError``) whose message names the dotted key, e.g.
``train.val_every: must be >= 1, got 0`` or ``unknown config key
'train.lerning_rate'; did you mean 'learning_rate'?``. That holds for ``parse_config`` /
``load_config`` and for building a section directly (``DataConfig(val_fraction=1.5)`` names
``data.val_fraction``): pydantic's ``ValidationError`` never escapes this module.

Variants are overrides of ``train`` (dotted keys, e.g. ``weight_sync.transport: rdt``);
``resolve_variant`` applies one and validates the result (errors name ``variants.<name>.<key>``),
so a typo in a variant fails before any work starts. An overlay config drops a variant by setting
it to ``null``. The JSON schema that Snakemake validates against is generated from these models
(``json_schema()``: bounds and descriptions, no defaults), so the two can never drift; a test
checks the checked-in copy.

Departures from the seeds: the CPU default config scales seed 000 §3.1.2's hyperparameters down
(see ``config/config.yaml``); the ``train`` defaults here are the seed's values (the ``data``,
``tokenizer`` and ``pretrain`` defaults, which the seeds leave open, are tuned for the CPU budget).
Until this module moved to pydantic the sections were hand-checked dataclasses; keys, defaults and
values are unchanged, only out-of-range values that used to fail late (or not at all) now fail here.
"""

from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config value or key is invalid. The message names the dotted key."""


class _Invalid(ValueError):
    """A cross-field failure raised by a section's validator. ``@key`` in the message stands for
    that section's key and becomes the dotted key (``train.k``, ``variants.k4.k``)."""


DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
_DEVICE_HELP = "'auto', 'cpu', 'cuda' or 'cuda:N'"


class _Section(BaseModel):
    """Base of every section: strict, finite, closed; direct construction raises ConfigError."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    _prefix: ClassVar[str] = ""  # the section's dotted key in a pipeline config

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(_message(e, type(self), self._prefix)) from None

    # Marks this __init__ as pydantic's own (as RootModel does), so nested sections and
    # model_validate are validated by pydantic-core directly and keep their full error locations;
    # only a direct call (``DataConfig(val_fraction=1.5)``) goes through the conversion above.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- sections


class DataConfig(_Section):
    """Corpus and keyword-inclusion dataset."""

    _prefix: ClassVar[str] = "data"

    corpus_source: Literal["generated", "tinystories"] = Field(
        "generated", description="'generated': the embedded offline story generator; 'tinystories': read corpus_path.")
    corpus_path: str | None = Field(
        None, description="TinyStoriesV2-style text file (stories separated by <|endoftext|>).")
    num_stories: int = Field(20000, ge=1, description="Stories to generate (or the first N to read from corpus_path).")
    keyword_prompt_fraction: float = Field(
        0.5, ge=0, le=1, description="Fraction of corpus documents that are prompt-formatted keyword examples.")
    keyword_hit_rate: float = Field(
        0.3, ge=0, le=1,
        description="In prompt-formatted corpus examples, probability that the story contains the keyword.")
    keywords_path: str | None = Field(None, description="Keyword list (one per line); default: the packaged list.")
    num_prompts: int = Field(2000, ge=1, description="Keyword-inclusion prompts to build (train + validation).")
    max_keywords_per_prompt: int = Field(1, ge=1, description="Each prompt asks for 1..this many keywords.")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="Fraction of prompts held out for validation.")
    seed: int = Field(0, ge=0, description="Seed for corpus generation and the dataset split.")

    @model_validator(mode="after")
    def check_cross_fields(self) -> DataConfig:
        if self.corpus_source == "tinystories" and not self.corpus_path:
            raise _Invalid("@corpus_path is required when @corpus_source is 'tinystories'")
        return self


class TokenizerConfig(_Section):
    """Tokenizer."""

    _prefix: ClassVar[str] = "tokenizer"

    vocab_size: int = Field(2048, ge=257, description="BPE vocabulary size (256 bytes + <|endoftext|> + merges).")
    path: str | None = Field(
        None,
        description="Use this tokenizer instead of training one: a tokenizer.json, a directory, or 'tiktoken:gpt2'.")


class ModelSection(_Section):
    """Base model."""

    _prefix: ClassVar[str] = "model"

    preset: Literal["cpu-tiny", "assignment"] = Field("cpu-tiny", description="TransformerLM size preset.")
    overrides: dict[str, Any] = Field({}, description="ModelConfig fields overriding the preset (e.g. num_layers).")
    base_checkpoint: str | None = Field(
        None, description="Import this pretrained checkpoint (with tokenizer.path) instead of pretraining.")


class PretrainConfig(_Section):
    """Pretraining of the base model."""

    _prefix: ClassVar[str] = "pretrain"

    max_steps: int = Field(
        700, ge=1, description="Optimizer steps (cpu-tiny: the keyword-copy behaviour appears at ~400-600).")
    batch_size: int = Field(32, ge=1, description="Sequences per step.")
    seq_len: int = Field(128, ge=2, description="Tokens per training sequence (<= model context).")
    learning_rate: float = Field(5e-3, gt=0, description="Peak AdamW learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine schedule floor as a fraction of learning_rate.")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    eval_every: int = Field(100, ge=1, description="Validation-loss interval in steps.")
    val_fraction: float = Field(
        0.02, gt=0, lt=1, description="Fraction of the corpus held out for validation loss.")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description=f"{_DEVICE_HELP}.")
    threads: int = Field(2, ge=1, description="torch CPU threads.")
    seed: int = Field(0, ge=0, description="Seed.")


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

    task: Literal["keyword_inclusion", "sorting", "math"] = Field(
        "keyword_inclusion", description="Task plug-in (rlpipe.tasks.TASKS); 'math' reads a MATH-format dataset "
        "directory (train.jsonl, val.jsonl) with the r1_zero prompt and grader.")
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
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="bfloat16 = autocast on CUDA.")
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
        600.0, gt=0, description="Max seconds the driver waits on any actor call before failing.")
    recompute_old_log_probs: bool | None = Field(
        None, description="Recompute old log-probs with the learner's policy under inference_mode after each "
        "rollout (seed 001 Problem 13) instead of using the sampler's. null: on whenever the sampler's numerics "
        "can differ from the learner's (a HuggingFace policy, or dtype bfloat16), off otherwise.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass (HuggingFace policies): less memory, "
        "~30% more update time.")
    kl_monitor: bool = Field(
        True, description="Measure KL(pi || pi_ref) every step. With this off and kl_coef 0 no reference model "
        "is loaded (seed 001: it saves a model's memory).")
    kl_monitor_every: int = Field(
        1, ge=1, description="With kl_coef 0: measure both KLs (to the reference and to the previous step) on "
        "every N-th optimizer step only (and the first and last), skipping the reference forward and the "
        "post-update forward between them (about a quarter of a CPU step). The other steps log no kl/*.")
    math: MathOptions = Field(default_factory=MathOptions, description="Options of the math task.")
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
        need(self.policy_lag == 1 or self.mode == "disaggregated",
             f"@policy_lag={self.policy_lag} needs @mode: disaggregated (mode is {self.mode})")
        groups = self.rollout_batch_size // self.group_size
        need(not self.replay.enabled or self.replay.capacity_groups >= groups,
             f"@replay.capacity_groups ({self.replay.capacity_groups}) must hold one rollout batch "
             f"(@rollout_batch_size / @group_size = {groups} groups)")
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


class RayConfig(_Section):
    """Ray."""

    _prefix: ClassVar[str] = "ray"

    address: str | None = Field(None, description="Attach to this Ray cluster instead of starting a local one.")
    include_dashboard: bool = Field(False, description="Start the Ray dashboard (local instance only).")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray instance (default: the job's threads).")


class LoggingConfig(_Section):
    """Live monitoring besides the parquet outputs (which stay the contract)."""

    _prefix: ClassVar[str] = "logging"

    tensorboard: bool = Field(
        False, description="Also write every metric row as TensorBoard scalars to <run>/tensorboard/ "
                           "(live curves: tensorboard --logdir results/runs); needs pip install -e '.[tb]'.")


KEYWORD_TRACK, MATH_TRACK = "keyword", "math"
#: A family on this track is seed 000's systems comparison: the keyword track with the top-level
#: ``variants`` table as its variants, timed (see ``FamilyConfig.track``).
SYSTEMS_TRACK = "systems"


class WorkflowConfig(_Section):
    """Snakemake workflow settings."""

    _prefix: ClassVar[str] = "workflow"

    tracks: list[Literal["keyword", "math"]] = Field(
        ["keyword", "math"], min_length=1,
        description="Tracks to run: 'keyword' (seed 000: data, base model, variants, benchmarks) and 'math' "
                    "(seeds 001/004: the math section).")

    families: list[str] | None = Field(
        None, description="Experiment families to run (names of the families table); null: every family whose "
                          "track is on. An overlay selects a few with a list, or none with [].")
    family_threads: int = Field(
        1, ge=1, description="Snakemake threads per job that compares learning, not speed: family replicates and "
        "the MATH track's runs and evaluations. 1 on the 2-core default: two train at once (their timings are "
        "then flagged contended and draw no conclusion; the systems variants and the systems family's "
        "replicates compare speed on a machine of their own, workflow.threads_per_variant).")
    toy_sort_seeds: list[Annotated[int, Field(ge=0)]] = Field(
        [5, 6, 7], description="Seeds of seed 003's toy-sorting grid (delta modes x loss modes; `rlpipe toy-sort`); "
                               "[] skips it.")
    toy_sort_epochs: int | None = Field(
        None, ge=1, description="Epochs per toy-sorting run (null: seed 003's 100).")
    results_dir: str = Field("results", min_length=1, description="Where every output goes.")
    gpus_per_colocated: int = Field(0, ge=0, description="GPUs a colocated variant declares (0 on a CPU config).")
    gpus_per_disaggregated: int = Field(0, ge=0, description="GPUs a disaggregated variant declares.")
    threads_per_variant: int = Field(
        2, ge=1, description="Snakemake threads per training job (passed to torch and Ray).")
    run_tests: bool = Field(True, description="Run the unit tests as the first rule.")
    test_args: str = Field("-m 'not slow and not workflow'", description="pytest selection for run_unit_tests.")
    bench_repeats: int = Field(5, ge=1, description="Repeats for the benchmark rules.")
    bench_sizes_mb: list[Annotated[float, Field(gt=0, le=4096)]] = Field(
        [1, 10, 100, 1000], min_length=1,
        description="Synthetic payload sweep of the weight-sync benchmark, in MB (issue 13: 1 MB to 1 GB).")
    bench_scaling: bool = Field(
        True, description="Run `rlpipe bench scaling` (real short runs over model size, batch and response "
        "length, ~2 min on 2 cores) and put its curves in the report.")
    scaling_sizes: list[Annotated[int, Field(ge=8, le=4096)]] = Field(
        [64, 256], description="`rlpipe bench scaling`: model widths (d_model; the base's own is added).")
    scaling_batches: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        [16, 64], description="`rlpipe bench scaling`: rollout batch sizes (train.rollout_batch_size is added).")
    scaling_lengths: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        [20, 80], description="`rlpipe bench scaling`: response lengths in tokens (train.sampling_max_tokens "
        "is added).")
    scaling_steps: int = Field(3, ge=2, le=100, description="`rlpipe bench scaling`: GRPO steps per point (the "
                               "first is warm-up and not counted).")


class ArithmeticConfig(_Section):
    """The embedded CPU-learnable math task (``rlpipe.tasks.math.arithmetic``): seeded multi-step
    integer arithmetic with exact answers, graded by the same ``r1_zero_reward_fn`` as MATH."""

    _prefix: ClassVar[str] = "math.arithmetic"

    num_train: int = Field(4000, ge=1, description="Training problems (GRPO prompts).")
    num_val: int = Field(512, ge=1, description="Held-out validation problems (never in the pretraining corpus).")
    min_ops: int = Field(1, ge=1, le=8, description="Fewest operations per problem.")
    max_ops: int = Field(3, ge=1, le=8, description="Most operations per problem.")
    max_operand: int = Field(15, ge=2, le=10000, description="Operands are drawn from 1..max_operand.")
    max_value: int = Field(
        40, ge=2, le=100000, description="Every intermediate result and the answer lie in 0..max_value.")
    corpus_documents: int = Field(
        40000, ge=1, description="Pretraining documents: worked solutions of problems (never val ones).")
    drill_fraction: float = Field(
        0.75, ge=0, lt=1, description="Fraction of corpus documents that are drills: the prompt's last two lines "
        "(User/Assistant) and the worked solution, without the r1_zero preamble (5x more arithmetic per token).")
    slip_rate: float = Field(
        0.35, ge=0, lt=1, description="In corpus solutions, probability that a step miscopies its operator (+ for "
        "-, computed right and carried on, when the chain stays in range): sets the zero-shot accuracy.")
    seed: int = Field(0, ge=0, description="Seed of the problem generator and the split.")

    @model_validator(mode="after")
    def check_cross_fields(self) -> ArithmeticConfig:
        if self.min_ops > self.max_ops:
            raise _Invalid(f"@min_ops ({self.min_ops}) must be <= @max_ops ({self.max_ops})")
        if self.max_operand > self.max_value:
            raise _Invalid(f"@max_operand ({self.max_operand}) must be <= @max_value ({self.max_value})")
        return self


class MathTokenizerConfig(TokenizerConfig):
    """Tokenizer of the math base model: a small vocabulary suits the arithmetic corpus."""

    _prefix: ClassVar[str] = "math.tokenizer"

    vocab_size: int = Field(512, ge=257, description="BPE vocabulary size (256 bytes + <|endoftext|> + merges).")


class MathPretrainConfig(PretrainConfig):
    """Pretraining of the math base model. Its own defaults live on this class (not in a
    ``default_factory``), so that a config giving part of the section (``math.pretrain: {threads:
    1}``) keeps them: with a factory, the other keys fell back to the keyword track's defaults."""

    _prefix: ClassVar[str] = "math.pretrain"

    max_steps: int = Field(
        560, ge=1, description="Optimizer steps (cpu-tiny, 128 tokens: val loss 0.214, zero-shot reward ~0.5; "
                               "450 x 144 tokens gave 0.226 and GRPO learned more slowly from it).")
    eval_every: int = Field(80, ge=1, description="Validation-loss interval in steps.")
    device: str = Field("cpu", pattern=DEVICE_PATTERN, description=f"{_DEVICE_HELP}.")


class MathTrackConfig(_Section):
    """The MATH track (seeds 001 and 004): its data, base model, evaluation and GRPO variants.

    The track is a pipeline of its own, derived from this one by ``math_pipeline``: its ``tokenizer``,
    ``model`` and ``pretrain`` sections replace the keyword track's, its ``train`` overrides the shared
    ``train`` section (with ``task: math``), and its ``variants`` are its runs."""

    _prefix: ClassVar[str] = "math"

    dataset_dir: str | None = Field(
        None, description="MATH-format dataset directory (train.jsonl + validation.jsonl, val.jsonl or test.jsonl); "
        "null: generate the embedded arithmetic task.")
    base_model_dir: str | None = Field(
        None, description="Local HuggingFace model directory (config.json, weights, tokenizer.json), e.g. "
        "Qwen2.5-Math-1.5B; never downloaded. null: pretrain our TransformerLM on the arithmetic corpus.")
    arithmetic: ArithmeticConfig = Field(default_factory=ArithmeticConfig, description="The arithmetic task.")
    tokenizer: MathTokenizerConfig = Field(
        default_factory=MathTokenizerConfig, description="Tokenizer of the math base model.")
    model: ModelSection = Field(default_factory=ModelSection, description="The math base model (when pretrained).")
    pretrain: MathPretrainConfig = Field(
        default_factory=MathPretrainConfig, description="Pretraining of the math base model.")
    train: dict[str, Any] = Field({}, description="Overrides of the shared train section for math runs (dotted "
                                                  "keys allowed); train.task is always 'math'.")
    variants: dict[str, dict[str, Any] | None] = Field(
        {"onpolicy": {}}, description="Math variant name -> overrides of the math train settings (null drops one).")
    eval_size: int = Field(
        512, ge=1, description="Validation examples `rlpipe eval` scores (seed 001 asks for >= 1024 on GPU).")
    eval_max_tokens: int | None = Field(
        None, ge=1, description="Max new tokens in `rlpipe eval`; default: the math runs' sampling_max_tokens.")


class FamilyConfig(_Section):
    """One experiment family (project issue 12): variants of one track's GRPO run, each replicated
    over seeds. ``rlpipe.config.family_pipeline`` derives the family's own pipeline config (the
    track's, with ``train`` = the track's train settings + ``base``, ``variants`` = this table); the
    workflow runs family x variant x seed as one ``rlpipe train`` job each, and ``rlpipe
    family-report`` writes the family's report section from this metadata alone (no variant name is
    special)."""

    track: Literal["keyword", "math", "systems"] = Field(
        "math", description="Whose task, base model and train settings the runs start from: 'keyword' "
                            "(the train section) or 'math' (train + math.train). 'systems': seed 000's systems "
                            "comparison, the keyword track with the top-level `variants` table as the family's "
                            "variants (give none here); its replicates compare speed, so each runs alone on "
                            "workflow.threads_per_variant threads like the variants, and a replicate identical to "
                            "a variants-table run (its first seed, with no base) reads results/runs/<variant>. "
                            "Skipped when the track (systems: keyword) is not in workflow.tracks, or the "
                            "variants table is empty.")
    question: str = Field(
        "", description="The seed problem the family answers (shown at the top of its report section).")
    base: dict[str, Any] = Field(
        {}, description="Overrides of the track's train settings shared by every variant (dotted keys allowed).")
    variants: dict[str, dict[str, Any] | None] | None = Field(
        None, description="Variant name -> overrides of base (null drops one). The first is the reference "
                          "unless `reference` names another. Required, except on the 'systems' track (which "
                          "takes the variants table).")
    reference: str | None = Field(
        None, description="Variant every other one is compared against (default: the first).")
    replicates: int = Field(
        1, ge=1, le=64, description="Seeds per variant: train.seed, train.seed + 1, ... (confidence intervals "
                                    "need >= 2; with 1 the report calls every difference unreplicated).")
    x: str | None = Field(
        None, description="Dotted train key that orders the variants along an axis (a sweep, e.g. "
                          "learning_rate): the report then plots final reward against it.")

    @model_validator(mode="after")
    def check_cross_fields(self) -> FamilyConfig:
        if self.track == SYSTEMS_TRACK:
            if self.variants is not None:
                raise _Invalid("@variants: a 'systems' family takes the top-level variants table; give none here")
            return self  # its reference is checked against that table (family_pipeline)
        if self.variants is None:
            raise _Invalid("@variants: required (variant name -> overrides of base)")
        kept = [k for k, v in self.variants.items() if v is not None]
        if not kept:
            raise _Invalid("@variants: every variant is null; a family needs at least one")
        if self.reference is not None and self.reference not in kept:
            raise _Invalid(f"@reference '{self.reference}' is not one of the variants ({', '.join(kept)})")
        return self


class PipelineConfig(_Section):
    """A whole pipeline config: one section per stage plus the variants table."""

    data: DataConfig = Field(default_factory=DataConfig, description="Corpus and keyword dataset.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="Tokenizer.")
    model: ModelSection = Field(default_factory=ModelSection, description="Base model.")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="Pretraining.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="GRPO base settings shared by all variants.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray.")
    workflow: WorkflowConfig = Field(default_factory=WorkflowConfig, description="Snakemake workflow settings.")
    math: MathTrackConfig = Field(default_factory=MathTrackConfig, description="The MATH track.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Live monitoring.")
    variants: dict[str, dict[str, Any]] = Field(
        {}, description="Variant name -> overrides of train (dotted keys allowed): seed 000's systems "
                        "comparison (results/runs/<variant>).")
    families: dict[str, FamilyConfig | None] = Field(
        {}, description="Experiment families (issue 12): name -> a replicated family of variants with its own "
                        "report section (results/families/<name>/). null drops one.")


# --------------------------------------------------------------------------- errors


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _expand(msg: str, section: str) -> str:
    """``@key`` -> ``<section>.key`` in a cross-field message."""
    return re.sub(r"@([A-Za-z_][\w.]*)", lambda m: _join(section, m.group(1)), msg)


def _dotted(prefix: str, loc: tuple[Any, ...]) -> str:
    out = prefix
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else _join(out, str(part))
    return out


def _section_class(ann: Any) -> type[BaseModel] | None:
    """The section class in ``ann`` (``X`` or ``X | None``), else None."""
    for a in (ann, *typing.get_args(ann)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _model_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section class that ``loc`` (a path of field names, and of the names of a table's
    entries such as ``families.<name>``) points into."""
    parts = iter(loc)
    for part in parts:
        field = cls.model_fields.get(str(part))
        ann = field.annotation if field else None
        if typing.get_origin(ann) is dict:  # a table of sections: the next part names an entry
            ann = typing.get_args(ann)[1]
            if next(parts, None) is None:
                return None
        section = _section_class(ann)
        if section is None:
            return None
        cls = section
    return cls


_BOUND_ERRORS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
                 "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}


def _describe(err: dict[str, Any]) -> str:
    """What is wrong with the value, e.g. ``must be >= 1, got 0``."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _BOUND_ERRORS:
        name, op = _BOUND_ERRORS[kind]
        bound = ctx[name]
        msg = f"must be {op} {int(bound) if isinstance(bound, float) and bound.is_integer() else bound}"
    elif kind == "string_pattern_mismatch" and ctx.get("pattern") == DEVICE_PATTERN:
        msg = f"must be {_DEVICE_HELP}"
    elif kind == "finite_number":
        msg = "must be a finite number"
    elif kind == "too_short":
        msg = f"must have at least {ctx['min_length']} items"
    elif kind == "too_long":
        msg = f"must have at most {ctx['max_length']} items"
    elif kind == "string_too_short":
        msg = "must not be empty"
    else:
        msg = re.sub(r"^Input should\b", "must", err["msg"])
    return f"{msg}, got {err['input']!r}"


def _message(exc: ValidationError, cls: type[BaseModel], prefix: str) -> str:
    """One line per error of ``exc``, each naming the dotted key (``prefix`` + the error's loc)."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _dotted(prefix, loc)
        error = (err.get("ctx") or {}).get("error")
        if err["type"] == "extra_forbidden":
            owner = _model_at(cls, loc[:-1])
            names = list(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
            lines.append(f"unknown config key '{key}'{hint}")
        elif isinstance(error, _Invalid):
            lines.append(_expand(str(error), key))
        elif err["type"] == "missing":
            lines.append(f"{key}: required")
        else:
            lines.append(f"{key}: {_describe(err)}")
    if len(lines) == 1:
        return lines[0]
    return f"{len(lines)} config errors:\n" + "\n".join(f"  - {line}" for line in lines)


def from_dict(cls: type[BaseModel], data: Any, prefix: str = "") -> Any:
    """Validate ``data`` as section ``cls``; errors name ``prefix`` + the dotted key."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_message(e, cls, prefix)) from None


def to_dict(obj: BaseModel) -> dict[str, Any]:
    """Plain data (dicts, lists, scalars) that ``yaml.safe_dump`` and ``json.dumps`` can write."""
    return obj.model_dump()


# --------------------------------------------------------------------------- parsing


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ConfigError(f"override '{dotted}': '{p}' is not a section")
    d[parts[-1]] = value


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` (nested dicts or dotted keys) into a copy of ``base``."""
    out = yaml.safe_load(yaml.safe_dump(base))  # deep copy of plain data
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and "." not in key:
            out[key] = apply_overrides(out[key], value)
        else:
            _set_dotted(out, key, value)
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return data


def parse_config(data: dict[str, Any]) -> PipelineConfig:
    """Validate a whole pipeline config, including every variant's resolved train section.
    A variant set to ``null`` (e.g. by an overlay config) is removed."""
    if not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping, got {type(data).__name__}")
    if isinstance(data.get("variants"), dict):
        data = dict(data, variants={k: v for k, v in data["variants"].items() if v is not None})
    if isinstance(data.get("families"), dict):
        data = dict(data, families={k: v for k, v in data["families"].items() if v is not None})
    cfg = from_dict(PipelineConfig, data)
    _check_names(cfg)
    for name in cfg.variants:
        resolve_variant(cfg, name)
    if MATH_TRACK in cfg.workflow.tracks:
        math_pipeline(cfg)
    for name in active_families(cfg):
        family_pipeline(cfg, name)
    return cfg


MATH_PREFIX = "math"
#: Variant and family names become directory names and Snakemake wildcard values.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def _check_names(cfg: PipelineConfig) -> None:
    tables = {"variants": cfg.variants, "math.variants": cfg.math.variants, "families": cfg.families}
    tables.update({f"families.{k}.variants": f.variants or {} for k, f in cfg.families.items() if f is not None})
    for where, table in tables.items():
        for name in table:
            if not NAME_PATTERN.fullmatch(name):
                raise ConfigError(f"{where}: name '{name}' must be letters, digits, '_' or '-' (it names a "
                                  "directory and a workflow wildcard)")


def math_pipeline(cfg: PipelineConfig) -> PipelineConfig:
    """The MATH track as a pipeline config of its own: ``math.tokenizer``/``model``/``pretrain`` in
    place of the keyword track's, ``train`` = the shared train section + ``math.train`` + ``task:
    math``, ``variants`` = ``math.variants`` (null entries dropped). Every stage command then runs on
    it unchanged. Errors name the ``math.*`` key."""
    m = cfg.math
    try:
        train = apply_overrides(to_dict(cfg.train), dict(m.train))
    except ConfigError as e:
        raise ConfigError(f"{MATH_PREFIX}.train: {e}") from None
    train["task"] = "math"
    from_dict(TrainConfig, train, f"{MATH_PREFIX}.train")
    data = dict(to_dict(cfg), tokenizer=to_dict(m.tokenizer), model=to_dict(m.model),
                pretrain=to_dict(m.pretrain), train=train,
                variants={k: v or {} for k, v in m.variants.items() if v is not None})
    return _derived_pipeline(data, MATH_PREFIX)


def _derived_pipeline(data: dict[str, Any], prefix: str) -> PipelineConfig:
    """Validate a pipeline config derived from the user's (the math track's, a family's) and every
    variant it holds; a variant's error names the key the user wrote (``<prefix>.variants.<v>``)."""
    out = from_dict(PipelineConfig, data)
    for name in out.variants:
        try:
            resolve_variant(out, name)
        except ConfigError as e:
            raise ConfigError(re.sub(r"(?<![\w.])variants\.", f"{prefix}.variants.", str(e))) from None
    return out


FAMILIES_PREFIX = "families"


def active_families(cfg: PipelineConfig) -> list[str]:
    """The families to run: those selected by ``workflow.families`` (all when null) whose track is
    switched on (``workflow.tracks``), in config order; a 'systems' family only while the variants
    table has a variant (selecting it by name with an empty table is an error)."""
    chosen = cfg.workflow.families
    if chosen is not None:
        unknown = [f for f in chosen if f not in cfg.families or cfg.families[f] is None]
        if unknown:
            raise ConfigError(f"workflow.families: unknown family '{unknown[0]}'; configured families: "
                              f"{', '.join(k for k, f in cfg.families.items() if f is not None) or '(none)'}")
        empty = [f for f in chosen if cfg.families[f].track == SYSTEMS_TRACK and not cfg.variants]
        if empty:
            raise ConfigError(f"workflow.families: '{empty[0]}' is a 'systems' family, but the variants table "
                              "is empty (drop it from workflow.families, or set families." + empty[0] + ": null)")

    def on(f: FamilyConfig) -> bool:  # a systems family with no variants table has nothing to compare
        return family_base_track(f) in cfg.workflow.tracks and (f.track != SYSTEMS_TRACK or bool(cfg.variants))

    return [k for k, f in cfg.families.items() if f is not None and on(f) and (chosen is None or k in chosen)]


def family_base_track(fam: FamilyConfig) -> str:
    """The track whose base model, dataset and train settings family ``fam`` starts from."""
    return KEYWORD_TRACK if fam.track == SYSTEMS_TRACK else fam.track


def table_reference(cfg: PipelineConfig) -> str:
    """The variants table's baseline for speedups: ``onpolicy`` if configured, else the first
    colocated_sync variant, else the first."""
    if "onpolicy" in cfg.variants:
        return "onpolicy"
    sync = [v for v in cfg.variants if resolve_variant(cfg, v).mode == "colocated_sync"]
    return (sync or list(cfg.variants) or ["onpolicy"])[0]


def family_pipeline(cfg: PipelineConfig, name: str) -> PipelineConfig:
    """Family ``name`` as a pipeline config of its own: its track's pipeline (``cfg`` itself, or
    ``math_pipeline(cfg)``) with ``train`` = that track's train settings + ``families.<name>.base``
    and ``variants`` = the family's variants (null entries dropped; on the 'systems' track, the
    variants table). ``rlpipe train --variant V
    --seed S`` then runs one replicate unchanged. Errors name the ``families.<name>.*`` key."""
    if name not in cfg.families or cfg.families[name] is None:
        raise ConfigError(f"unknown family '{name}'; configured families: {', '.join(cfg.families) or '(none)'}")
    fam, prefix = cfg.families[name], f"{FAMILIES_PREFIX}.{name}"
    track = math_pipeline(cfg) if fam.track == MATH_TRACK else cfg
    if fam.track == SYSTEMS_TRACK:
        variants = dict(cfg.variants)
        if not variants:
            raise ConfigError(f"{prefix}: a 'systems' family needs the variants table, which is empty")
        if fam.reference is not None and fam.reference not in variants:
            raise ConfigError(f"{prefix}.reference: '{fam.reference}' is not in the variants table "
                              f"({', '.join(variants)})")
    else:
        variants = {k: v or {} for k, v in fam.variants.items() if v is not None}
    try:
        train = apply_overrides(to_dict(track.train), fam.base)
    except ConfigError as e:
        raise ConfigError(f"{prefix}.base: {e}") from None
    from_dict(TrainConfig, train, f"{prefix}.base")
    data = dict(to_dict(track), train=train, families={}, variants=variants)
    data["workflow"] = dict(data["workflow"], families=None)  # the derived config holds no families
    return _derived_pipeline(data, prefix)


def family_reference(cfg: PipelineConfig, name: str) -> str:
    """The variant family ``name`` compares every other one against."""
    fam = cfg.families[name]
    if fam.track == SYSTEMS_TRACK:
        return fam.reference or table_reference(cfg)
    return fam.reference or next(k for k, v in fam.variants.items() if v is not None)


def family_seeds(cfg: PipelineConfig, name: str) -> list[int]:
    """Replicate seeds of family ``name``: its resolved train.seed, then the next ``replicates - 1``."""
    first = family_pipeline(cfg, name).train.seed
    return [first + i for i in range(cfg.families[name].replicates)]


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    data = load_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides)
    try:
        return parse_config(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def resolve_variant(cfg: PipelineConfig, name: str) -> TrainConfig:
    """The train config of variant ``name``: base ``train`` plus the variant's overrides."""
    if name not in cfg.variants:
        raise ConfigError(f"unknown variant '{name}'; configured variants: {', '.join(cfg.variants) or '(none)'}")
    try:
        merged = apply_overrides(to_dict(cfg.train), cfg.variants[name] or {})
    except ConfigError as e:
        raise ConfigError(f"variants.{name}: {e}") from None
    return from_dict(TrainConfig, merged, f"variants.{name}")


#: the train settings ``rlpipe eval-base`` samples with; its Snakemake rule depends on these alone
EVAL_BASE_TRAIN_KEYS = ("sampling_temperature", "sampling_max_tokens", "val_seed")


def eval_base_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """The ``train`` settings the base model's zero-shot evaluation reads (and nothing else of the
    section: an edit of another train key must not rerun it)."""
    return {k: getattr(cfg.train, k) for k in EVAL_BASE_TRAIN_KEYS}


def variant_gpus(cfg: PipelineConfig, name: str) -> int:
    """GPUs a variant's Snakemake job declares: colocated -> 1 device, disaggregated -> 2."""
    mode = resolve_variant(cfg, name).mode
    w = cfg.workflow
    return w.gpus_per_disaggregated if mode == "disaggregated" else w.gpus_per_colocated


# --------------------------------------------------------------------------- JSON schema


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Resolve ``$ref``s into ``$defs`` and drop ``default`` and ``title`` keywords (defaults live
    in the models only). Property *names* are never dropped: ``properties`` maps names to schemas."""
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    out = {}
    for key, value in node.items():
        if key in ("default", "title", "$defs"):
            continue
        if key == "properties":
            out[key] = {name: _inline(s, defs) for name, s in value.items()}
        else:
            out[key] = _inline(value, defs)
    return out


def json_schema() -> dict[str, Any]:
    """JSON schema (draft 2020-12) of a pipeline config, from the models: bounds, descriptions,
    ``additionalProperties: false`` on every section, no defaults, no ``$ref``."""
    raw = PipelineConfig.model_json_schema()
    schema = _inline(raw, raw.get("$defs", {}))
    schema["description"] = "rlpipe pipeline config (generated by `rlpipe schema`; do not edit by hand)"
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
