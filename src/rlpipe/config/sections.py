"""The other sections of a pipeline config (data, tokenizer, model, pretrain, ray, logging,
workflow and the MATH track). Tracks and families are in ``tracks``, the root ``PipelineConfig`` in ``root``."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from rlpipe.config.base import _DEVICE_HELP, DEVICE_PATTERN, _Invalid, _Section


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
        700, ge=1, description="Optimizer steps (cpu-tiny: enough for the keyword-copy behaviour to appear).")
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
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute precision: 'auto' is bf16 autocast on CUDA and fp32 on CPU, where a "
        "CPU without bf16 units (AVX512-BF16 or AMX) emulates bf16 matmuls many times slower than fp32, "
        "and the base model would depend on the CPU's features; 'bfloat16' autocasts on CPU too. The "
        "weights stay fp32 either way.")
    threads: int = Field(2, ge=1, description="torch CPU threads.")
    seed: int = Field(0, ge=0, description="Seed.")


class RayConfig(_Section):
    """Ray."""

    _prefix: ClassVar[str] = "ray"

    address: str | None = Field(None, description="Attach to this Ray cluster instead of starting a local one.")
    include_dashboard: bool = Field(False, description="Start the Ray dashboard (local instance only).")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray instance (default: the job's threads).")


class LoggingConfig(_Section):
    """Live monitoring besides the parquet outputs (which stay the contract)."""

    _prefix: ClassVar[str] = "logging"

    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        [], description="Experiment trackers every run also logs to, through a background writer that never fails, "
                        "stalls or slows the run: 'tensorboard' (scalars in <run>/tensorboard/; pip install -e "
                        "'.[tb]'), 'wandb' (one W&B run per training run, offline unless WANDB_MODE says otherwise, "
                        "under <run>/wandb/; pip install -e '.[wandb]'), 'mlflow' (one MLflow run per training run "
                        "in <results_dir>/mlruns unless MLFLOW_TRACKING_URI is set; pip install -e '.[mlflow]').")
    tensorboard: bool | None = Field(
        None, description="Former switch of the TensorBoard copy, kept so that older configs still run: true adds "
                          "'tensorboard' to logging.trackers (prefer writing it there).")
    flush_every_s: float = Field(
        5.0, ge=0, description="Seconds between rewrites of a running job's metrics, events and TensorBoard files "
                               "(each rewrite pauses the actors while it writes); checkpoints and the end "
                               "of the run always write them. 0 writes after every round.")

    @model_validator(mode="after")
    def fold_tensorboard(self) -> LoggingConfig:
        """The former ``tensorboard`` key folds into ``trackers``: one list says what is on."""
        if len(set(self.trackers)) != len(self.trackers):
            raise _Invalid(f"@trackers names a tracker twice: {self.trackers}")
        if self.tensorboard is False and "tensorboard" in self.trackers:
            raise _Invalid("@tensorboard is false but @trackers names 'tensorboard'; drop @tensorboard")
        if self.tensorboard and "tensorboard" not in self.trackers:
            self.trackers = [*self.trackers, "tensorboard"]
        self.tensorboard = None
        return self


KEYWORD_TRACK, MATH_TRACK = "keyword", "math"
#: A family on this track is seed 000's systems comparison: the keyword track with the top-level
#: ``variants`` table as its variants, timed (see ``FamilyConfig.systems``).
SYSTEMS_TRACK = "systems"


class WorkflowConfig(_Section):
    """Snakemake workflow settings."""

    _prefix: ClassVar[str] = "workflow"

    tracks: list[str] = Field(
        ["keyword", "math"], min_length=1,
        description="Tracks to run: 'keyword' (seed 000: data, base model, variants, benchmarks), 'math' "
                    "(seeds 001/004: the math section) and the names of a user's entries of the tracks table.")

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
                               "[] skips it. Runs with a built-in track (keyword or math in workflow.tracks) only.")
    toy_sort_epochs: int | None = Field(
        None, ge=1, description="Epochs per toy-sorting run (null: seed 003's 100).")
    results_dir: str = Field("results", min_length=1, description="Where every output goes.")
    gpus_per_colocated: int = Field(
        0, ge=0, description="GPUs a colocated variant declares (0 on a CPU config; train.device cuda needs 1).")
    gpus_per_disaggregated: int = Field(
        0, ge=0, description="GPUs a disaggregated variant declares: 2 (one per actor), or 1 (the learner and the "
        "generator share it, half a Ray GPU each; run_info.json records the shares as gpu_fraction); 0 on a CPU "
        "config (train.device cuda needs 1 or 2).")
    nodes_per_disaggregated: int = Field(
        1, ge=1, le=2, description="Nodes a disaggregated training job spans: 2 runs its learner and its generator "
        "on two nodes of one allocation (the job starts a Ray head on its first node and a worker on the other, "
        "and the trainer attaches to it; under the SLURM executor it asks for --nodes=2, and for one GPU per node "
        "when it declares GPUs); 1 keeps both on one node. gpus_per_disaggregated must then be 0 or 2.")
    threads_per_variant: int = Field(
        2, ge=1, description="Snakemake threads per training job (passed to torch and Ray).")
    slurm_account: str | None = Field(
        None, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
        description="SLURM account of every job under the SLURM executor (sbatch --account); null: the executor "
                    "plugin's guess from sacct, or none.")
    slurm_partition: str | None = Field(
        None, min_length=1, pattern=r"^[A-Za-z0-9_.,-]+$",
        description="SLURM partition of the jobs that declare no GPU; null: the cluster's default partition.")
    slurm_gpu_partition: str | None = Field(
        None, min_length=1, pattern=r"^[A-Za-z0-9_.,-]+$",
        description="SLURM partition of the jobs that declare a `gpu` resource (training, pretraining, evaluation, "
                    "the GPU benchmarks); null: workflow.slurm_partition.")
    run_tests: bool = Field(
        True, description="Run the unit tests as the first rule, with a built-in track (keyword or math in "
                          "workflow.tracks) only: a run of a user's tracks only skips them.")
    test_args: str = Field("-m 'not slow and not workflow'", description="pytest selection for run_unit_tests.")
    bench_repeats: int = Field(5, ge=1, description="Repeats for the benchmark rules.")
    bench_sizes_mb: list[Annotated[float, Field(gt=0, le=4096)]] = Field(
        [1, 10, 100, 1000], min_length=1,
        description="Synthetic payload sweep of the weight-sync benchmark, in MB.")
    bench_sampler_builds: bool = Field(
        True, description="`rlpipe bench sampler` also times the torch.compile and AOTInductor decoders (each "
        "built first: minutes of compiling on a CPU, cached for later runs); false: the eager and KV-cache ones.")
    bench_scaling: bool = Field(
        True, description="Run `rlpipe bench scaling` (real short runs over model size, batch and response "
        "length, scaling_steps GRPO steps per point) and put its curves in the report; keyword track only.")
    scaling_sizes: list[Annotated[int, Field(ge=8, le=4096)]] = Field(
        [64, 256], description="`rlpipe bench scaling`: model widths (d_model; the base's own is added).")
    scaling_batches: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        [16, 64], description="`rlpipe bench scaling`: rollout batch sizes (train.rollout_batch_size is added).")
    scaling_lengths: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        [20, 80], description="`rlpipe bench scaling`: response lengths in tokens (train.sampling_max_tokens "
        "is added).")
    scaling_steps: int = Field(3, ge=2, le=100, description="`rlpipe bench scaling`: GRPO steps per point (the "
                               "first is warm-up and not counted).")

    @model_validator(mode="after")
    def check_nodes(self) -> WorkflowConfig:
        """Two nodes hold one actor each: a GPU each, or none (one GPU cannot lie on two nodes)."""
        if self.nodes_per_disaggregated > 1 and self.gpus_per_disaggregated not in (0, self.nodes_per_disaggregated):
            raise _Invalid(f"@nodes_per_disaggregated is {self.nodes_per_disaggregated} (one actor per node) but "
                           f"@gpus_per_disaggregated is {self.gpus_per_disaggregated}: set it to "
                           f"{self.nodes_per_disaggregated} (one GPU per node) or 0 (CPU)")
        return self


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
        "(User/Assistant) and the worked solution, without the r1_zero preamble (more arithmetic per token).")
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

    # Chosen on the 2-core CPU machine: 560 steps of 128 tokens gave a base model GRPO learns from
    # about as fast as from 700; 450 x 144 tokens gave a worse one that GRPO learned from more slowly.
    max_steps: int = Field(
        560, ge=1, description="Optimizer steps (cpu-tiny, 128-token sequences: a base model with headroom for GRPO).")
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
