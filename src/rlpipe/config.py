"""The one typed config of rlpipe.

A pipeline config is a YAML file with one section per stage (``data``, ``tokenizer``, ``model``,
``pretrain``, ``train``, ``ray``, ``workflow``) plus a ``variants`` table. Every field is a
dataclass field below with its default and a ``help`` text; nothing else in the code base holds a
default. ``load_config`` reads YAML, rejects unknown keys and wrong types with the dotted key in
the message, and ``TrainConfig.derived`` computes every derived size once, failing on remainders
(the seed-001 asserts, with key names).

Variants are overrides of ``train`` (dotted keys, e.g. ``weight_sync.transport: rdt``);
``resolve_variant`` applies one and validates the result, so a typo in a variant fails before any
work starts. The JSON schema that Snakemake validates against is generated from these dataclasses
(``json_schema()``), so the two can never drift; a test checks the checked-in copy.

Departures from the seeds: the CPU default config scales seed 000 §3.1.2's hyperparameters down
(see ``config/config.yaml``); the dataclass defaults here are the seed's values.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A config value or key is invalid. The message names the dotted key."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its help text (used for the JSON schema and the README)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    if dataclasses.is_dataclass(default):
        return field(default_factory=type(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


# --------------------------------------------------------------------------- sections


@dataclass
class DataConfig:
    """Corpus and keyword-inclusion dataset."""

    corpus_source: Literal["generated", "tinystories"] = _f(
        "generated", "'generated': the embedded offline story generator; 'tinystories': read corpus_path.")
    corpus_path: str | None = _f(None, "TinyStoriesV2-style text file (stories separated by <|endoftext|>).")
    num_stories: int = _f(20000, "Stories to generate (or the first N to read from corpus_path).")
    keyword_prompt_fraction: float = _f(
        0.5, "Fraction of corpus documents that are prompt-formatted keyword examples.")
    keyword_hit_rate: float = _f(
        0.3, "In prompt-formatted corpus examples, probability that the story contains the keyword.")
    keywords_path: str | None = _f(None, "Keyword list (one per line); default: the packaged list.")
    num_prompts: int = _f(2000, "Keyword-inclusion prompts to build (train + validation).")
    max_keywords_per_prompt: int = _f(1, "Each prompt asks for 1..this many keywords.")
    val_fraction: float = _f(0.2, "Fraction of prompts held out for validation.")
    seed: int = _f(0, "Seed for corpus generation and the dataset split.")


@dataclass
class TokenizerConfig:
    vocab_size: int = _f(2048, "BPE vocabulary size (including <|endoftext|>).")
    path: str | None = _f(
        None, "Use this tokenizer instead of training one: a tokenizer.json, a directory, or 'tiktoken:gpt2'.")


@dataclass
class ModelSection:
    preset: Literal["cpu-tiny", "assignment"] = _f("cpu-tiny", "TransformerLM size preset.")
    overrides: dict[str, Any] = _f({}, "ModelConfig fields overriding the preset (e.g. num_layers).")
    base_checkpoint: str | None = _f(
        None, "Import this pretrained checkpoint (with tokenizer.path) instead of pretraining.")


@dataclass
class PretrainConfig:
    max_steps: int = _f(700, "Optimizer steps (cpu-tiny: the keyword-copy behaviour appears at ~400-600).")
    batch_size: int = _f(32, "Sequences per step.")
    seq_len: int = _f(128, "Tokens per training sequence (<= model context).")
    learning_rate: float = _f(5e-3, "Peak AdamW learning rate.")
    min_lr_ratio: float = _f(0.1, "Cosine schedule floor as a fraction of learning_rate.")
    warmup_steps: int = _f(50, "Linear warm-up steps.")
    weight_decay: float = _f(0.1, "AdamW weight decay.")
    grad_clip: float = _f(1.0, "Gradient-norm clip.")
    eval_every: int = _f(100, "Validation-loss interval in steps.")
    val_fraction: float = _f(0.02, "Fraction of the corpus held out for validation loss.")
    device: str = _f("auto", "'auto', 'cpu' or 'cuda'.")
    threads: int = _f(2, "torch CPU threads.")
    seed: int = _f(0, "Seed.")


@dataclass
class WeightSyncConfig:
    transport: Literal["local", "object_store", "rdt"] = _f(
        "object_store", "Learner->Generator weight transport (colocated runs always copy in-process).")
    backend: Literal["gloo", "nccl", "nixl", "cuda_ipc"] = _f("gloo", "RDT backend when transport is 'rdt'.")
    timeout_s: float = _f(120.0, "A sync slower than this fails with an error naming the transport.")


@dataclass
class ReplayConfig:
    enabled: bool = _f(False, "Learner samples training batches from a replay buffer (disaggregated mode).")
    capacity_groups: int = _f(64, "Buffer capacity in prompt groups (FIFO eviction).")
    max_age: int = _f(4, "Drop groups generated more than this many policy versions ago.")
    strategy: Literal["uniform", "recency"] = _f("uniform", "Sampling strategy.")


@dataclass
class TrainConfig:
    """GRPO training. Defaults are seed 000 §3.1.2 plus seed 001's batch knobs."""

    task: Literal["keyword_inclusion", "sorting"] = _f("keyword_inclusion", "Task plug-in.")
    mode: Literal["colocated_sync", "colocated_k", "disaggregated"] = _f(
        "colocated_sync", "Driver: Variant A, Variant B (k rollout batches per sync), or one-version-behind async.")
    k: int = _f(1, "colocated_k: rollout batches generated per policy version (one optimizer step each).")
    n_grpo_steps: int = _f(100, "Rollout batches to generate in total (same total samples across modes).")
    learning_rate: float = _f(5e-4, "AdamW learning rate.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    betas: list[float] = _f([0.9, 0.95], "AdamW betas.")
    max_grad_norm: float = _f(1.0, "Gradient clipping max-norm.")
    group_size: int = _f(4, "G: responses per prompt.")
    rollout_batch_size: int = _f(32, "Responses per rollout batch (prompts x group_size).")
    train_batch_size: int = _f(32, "Responses per optimizer step (== rollout_batch_size is on-policy).")
    gradient_accumulation_steps: int = _f(1, "Microbatches per optimizer step.")
    epochs_per_rollout_batch: int = _f(1, "Passes over each rollout batch.")
    sampling_temperature: float = _f(0.8, "Sampling temperature (the learner scores the same tempered policy).")
    sampling_top_p: float = _f(1.0, "Nucleus sampling threshold.")
    sampling_max_tokens: int = _f(60, "Max new tokens per response.")
    sampling_min_tokens: int = _f(0, "EOS is masked until this many tokens were generated.")
    advantage_eps: float = _f(1e-8, "Added to the group std.")
    advantage_mode: Literal["rewards", "centered_rewards", "normalized_rewards", "max_rewards"] = _f(
        "normalized_rewards", "Seed 003 delta mode; use_std_normalization=false turns normalized into centered.")
    use_std_normalization: bool = _f(True, "Divide advantages by the group std (Eq. 1) or not (Dr. GRPO Eq. 4).")
    loss_type: Literal["no_baseline", "reinforce_with_baseline", "grpo_clip", "grpo_no_clip"] = _f(
        "grpo_clip", "Policy-gradient loss.")
    cliprange: float = _f(0.2, "GRPO-Clip epsilon.")
    length_normalization: Literal["masked_mean", "masked_normalize"] = _f(
        "masked_mean", "Per-sequence reduction (seed 004).")
    normalize_constant: float | None = _f(None, "masked_normalize divisor; default sampling_max_tokens.")
    kl_coef: float = _f(0.0, "k3 KL-to-reference penalty coefficient (0 = monitor only).")
    val_every: int = _f(10, "Validation interval in optimizer steps (also at step 0 and the end).")
    val_size: int = _f(64, "Validation prompts (one greedy-free sample each at sampling temperature).")
    val_seed: int = _f(1234, "Fixed sampling seed for validation.")
    log_rollouts_every: int = _f(25, "Write example rollouts every N steps (plus first and last).")
    checkpoint_every: int = _f(25, "Checkpoint interval in optimizer steps (plus the end).")
    seed: int = _f(0, "Run seed.")
    device: str = _f("auto", "'auto', 'cpu' or 'cuda'.")
    dtype: Literal["float32", "bfloat16"] = _f("float32", "bfloat16 = autocast on CUDA.")
    threads: int = _f(1, "torch threads per compute actor (one CPU 'device': colocated runs one, "
                         "disaggregated two), capped by the job's threads (workflow.threads_per_variant).")
    scorer_actor: bool = _f(False, "Disaggregated: score rewards in a separate Scorer actor.")
    ray_timeout_s: float = _f(600.0, "Max seconds the driver waits on any actor call before failing.")
    weight_sync: WeightSyncConfig = _f(WeightSyncConfig(), "Weight-sync transport.")
    replay: ReplayConfig = _f(ReplayConfig(), "Replay buffer.")

    def derived(self) -> "DerivedSizes":
        return DerivedSizes.of(self)


@dataclass(frozen=True)
class DerivedSizes:
    n_prompts_per_rollout_batch: int
    micro_train_batch_size: int
    train_steps_per_rollout_batch: int
    total_optimizer_steps: int
    rounds: int

    @staticmethod
    def of(t: TrainConfig) -> "DerivedSizes":
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        for key in ("group_size", "rollout_batch_size", "train_batch_size", "gradient_accumulation_steps",
                    "epochs_per_rollout_batch", "n_grpo_steps", "k", "sampling_max_tokens", "threads"):
            need(getattr(t, key) > 0, f"train.{key} must be > 0, got {getattr(t, key)}")
        need(t.rollout_batch_size % t.group_size == 0,
             f"train.rollout_batch_size ({t.rollout_batch_size}) must be divisible by train.group_size ({t.group_size})")
        need(t.train_batch_size % t.gradient_accumulation_steps == 0,
             f"train.train_batch_size ({t.train_batch_size}) must be divisible by "
             f"train.gradient_accumulation_steps ({t.gradient_accumulation_steps})")
        need(t.train_batch_size >= t.group_size,
             f"train.train_batch_size ({t.train_batch_size}) must be >= train.group_size ({t.group_size})")
        need(t.rollout_batch_size % t.train_batch_size == 0,
             f"train.rollout_batch_size ({t.rollout_batch_size}) must be divisible by "
             f"train.train_batch_size ({t.train_batch_size})")
        need(t.train_batch_size % t.group_size == 0,
             f"train.train_batch_size ({t.train_batch_size}) must be divisible by train.group_size "
             f"({t.group_size}) so optimizer steps see whole groups")
        need(t.n_grpo_steps % t.k == 0, f"train.n_grpo_steps ({t.n_grpo_steps}) must be divisible by train.k ({t.k})")
        need(t.mode == "colocated_k" or t.k == 1, f"train.k={t.k} needs train.mode: colocated_k (mode is {t.mode})")
        need(not t.replay.enabled or t.mode == "disaggregated", "train.replay.enabled needs train.mode: disaggregated")
        need(not t.replay.enabled or t.replay.capacity_groups >= t.rollout_batch_size // t.group_size,
             f"train.replay.capacity_groups ({t.replay.capacity_groups}) must hold one rollout batch "
             f"(train.rollout_batch_size / train.group_size = {t.rollout_batch_size // t.group_size} groups)")
        need(0 < t.sampling_top_p <= 1, f"train.sampling_top_p must be in (0, 1], got {t.sampling_top_p}")
        need(t.sampling_temperature > 0, "train.sampling_temperature must be > 0 for GRPO (log-probs of a "
             f"tempered policy), got {t.sampling_temperature}")
        need(t.sampling_min_tokens <= t.sampling_max_tokens,
             "train.sampling_min_tokens must be <= train.sampling_max_tokens")
        need(len(t.betas) == 2, f"train.betas must have two values, got {t.betas}")
        steps_per_batch = t.epochs_per_rollout_batch * (t.rollout_batch_size // t.train_batch_size)
        return DerivedSizes(
            n_prompts_per_rollout_batch=t.rollout_batch_size // t.group_size,
            micro_train_batch_size=t.train_batch_size // t.gradient_accumulation_steps,
            train_steps_per_rollout_batch=steps_per_batch,
            total_optimizer_steps=t.n_grpo_steps * steps_per_batch,
            rounds=t.n_grpo_steps // t.k,
        )


@dataclass
class RayConfig:
    address: str | None = _f(None, "Attach to this Ray cluster instead of starting a local one.")
    include_dashboard: bool = _f(False, "Start the Ray dashboard (local instance only).")
    num_cpus: int | None = _f(None, "CPUs for a local Ray instance (default: the job's threads).")


@dataclass
class WorkflowConfig:
    results_dir: str = _f("results", "Where every output goes.")
    gpus_per_colocated: int = _f(0, "GPUs a colocated variant declares (0 on a CPU config).")
    gpus_per_disaggregated: int = _f(0, "GPUs a disaggregated variant declares.")
    threads_per_variant: int = _f(2, "Snakemake threads per training job (passed to torch and Ray).")
    run_tests: bool = _f(True, "Run the unit tests as the first rule.")
    test_args: str = _f("-m 'not slow and not workflow'", "pytest selection for run_unit_tests.")
    bench_repeats: int = _f(5, "Repeats for the benchmark rules.")


@dataclass
class PipelineConfig:
    data: DataConfig = _f(DataConfig(), "Corpus and keyword dataset.")
    tokenizer: TokenizerConfig = _f(TokenizerConfig(), "Tokenizer.")
    model: ModelSection = _f(ModelSection(), "Base model.")
    pretrain: PretrainConfig = _f(PretrainConfig(), "Pretraining.")
    train: TrainConfig = _f(TrainConfig(), "GRPO base settings shared by all variants.")
    ray: RayConfig = _f(RayConfig(), "Ray.")
    workflow: WorkflowConfig = _f(WorkflowConfig(), "Snakemake workflow settings.")
    variants: dict[str, dict[str, Any]] = _f({}, "Variant name -> overrides of train (dotted keys allowed).")


# --------------------------------------------------------------------------- parsing


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; returns the (possibly converted) value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return from_dict(tp, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (inner,) = typing.get_args(tp)
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and bad values name the dotted key."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key '{dotted}'{hint}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


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
    if isinstance(data.get("variants"), dict):
        data = dict(data, variants={k: v for k, v in data["variants"].items() if v is not None})
    cfg = from_dict(PipelineConfig, data)
    cfg.train.derived()
    for name in cfg.variants:
        resolve_variant(cfg, name)
    return cfg


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
    merged = apply_overrides(to_dict(cfg.train), cfg.variants[name] or {})
    train = from_dict(TrainConfig, merged, f"variants.{name}")
    try:
        train.derived()
    except ConfigError as e:
        raise ConfigError(f"variants.{name}: {e}") from None
    return train


def variant_gpus(cfg: PipelineConfig, name: str) -> int:
    """GPUs a variant's Snakemake job declares: colocated -> 1 device, disaggregated -> 2."""
    mode = resolve_variant(cfg, name).mode
    w = cfg.workflow
    return w.gpus_per_disaggregated if mode == "disaggregated" else w.gpus_per_colocated


# --------------------------------------------------------------------------- JSON schema


def _schema_of(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema_of(a) for a in typing.get_args(tp)]}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if dataclasses.is_dataclass(tp):
        return dataclass_schema(tp)
    if origin is list:
        return {"type": "array", "items": _schema_of(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object"}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
    return {"type": simple[tp]} if tp in simple else {}


def dataclass_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    props = {}
    for f in dataclasses.fields(cls):
        s = _schema_of(hints[f.name])
        s["description"] = f.metadata.get("help", "")
        props[f.name] = s
    return {"type": "object", "additionalProperties": False, "properties": props}


def json_schema() -> dict[str, Any]:
    """JSON schema of a pipeline config (no defaults: those live in the dataclasses only)."""
    schema = dataclass_schema(PipelineConfig)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["description"] = "rlpipe pipeline config (generated by `rlpipe schema`; do not edit by hand)"
    return schema
