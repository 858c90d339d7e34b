"""Which config keys define what a stage computes (identity) and which only say how it runs (operational).

A run's identity is what its results depend on: the resumed run's fingerprint
(``rlpipe.trainer.resume.run_fingerprint``) and the Snakemake ``params`` that rerun a job are made of
identity keys only (``identity``). Operational keys (timeouts, flush intervals, thread counts,
logging, progress and where Ray or the outputs live) change nothing that is computed: raising
``train.ray_timeout_s`` after a timeout, as the troubleshooting page advises, reruns no job and a
resumed run continues from its checkpoint.

Paths are identity by content, not by name: ``identity`` replaces a file a key names (the text
task's template file, a ``file.py:function`` reward) by the hash of its bytes, so moving or copying
the project directory changes no fingerprint and reruns nothing, while editing the file does.

Every key of every section is placed on one side (``tests/test_config_identity.py`` walks the models:
a new key fails that test until it is placed). The sections of the MATH track (``math.tokenizer``,
``math.model``, ``math.pretrain``) and of a user's track (``tracks.<name>.tokenizer`` ...) are the
top-level sections' classes and are placed under those names (``canonical_key``).

Departure from the previous design: the fingerprint and the params held every key of the resolved
``train`` section, and the absolute paths the text task's options resolve to.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

#: Keys that change nothing computed, each with what it changes instead.
OPERATIONAL_KEYS: dict[str, str] = {
    "train.ray_timeout_s": "how long the driver waits on an actor call before failing",
    "train.actor_start_timeout_s": "how long the driver waits for its actors to start",
    "train.weight_sync.timeout_s": "how long a weight sync may take before failing",
    "train.threads": "torch threads per actor (speed)",
    "train.checkpoint_every": "how often a resumable checkpoint is written",
    "train.log_rollouts_every": "how often example rollouts are logged",
    "pretrain.threads": "torch threads of pretraining (speed)",
    "logging.trackers": "copies of the metrics in experiment trackers (TensorBoard, W&B, MLflow)",
    "logging.tensorboard": "a TensorBoard copy of the metrics (folds into logging.trackers)",
    "logging.flush_every_s": "how often a running job rewrites its metrics",
    "ray.address": "which Ray cluster runs the actors",
    "ray.include_dashboard": "the Ray dashboard",
    "ray.num_cpus": "CPUs of a local Ray instance",
    "workflow.results_dir": "where the outputs are written",
    "workflow.family_threads": "Snakemake threads per learning-comparison job (speed)",
    "workflow.threads_per_variant": "Snakemake threads per timed job (speed)",
    "workflow.nodes_per_disaggregated": "how many nodes a disaggregated job's two actors run on (where they run)",
    "workflow.slurm_account": "the SLURM account jobs are charged to (where they run)",
    "workflow.slurm_partition": "the SLURM partition of CPU jobs (where they run)",
    "workflow.slurm_gpu_partition": "the SLURM partition of GPU jobs (where they run)",
}

#: Keys that define what is computed: a change reruns the stages that read them (and starts a run afresh).
IDENTITY_KEYS: tuple[str, ...] = (
    # data
    "data.corpus_source", "data.corpus_path", "data.num_stories", "data.keyword_prompt_fraction",
    "data.keyword_hit_rate", "data.keywords_path", "data.num_prompts", "data.max_keywords_per_prompt",
    "data.val_fraction", "data.seed",
    # tokenizer, model, pretrain (also math.* and tracks.<name>.*)
    "tokenizer.vocab_size", "tokenizer.path", "model.preset", "model.overrides", "model.base_checkpoint",
    "pretrain.max_steps", "pretrain.batch_size", "pretrain.seq_len", "pretrain.learning_rate",
    "pretrain.min_lr_ratio", "pretrain.warmup_steps", "pretrain.weight_decay", "pretrain.grad_clip",
    "pretrain.eval_every", "pretrain.val_fraction", "pretrain.device", "pretrain.dtype", "pretrain.seed",
    # train
    "train.task", "train.task_options", "train.mode", "train.k", "train.n_grpo_steps", "train.learning_rate",
    "train.weight_decay", "train.betas", "train.max_grad_norm", "train.group_size", "train.rollout_batch_size",
    "train.train_batch_size", "train.gradient_accumulation_steps", "train.epochs_per_rollout_batch",
    "train.sampling_temperature", "train.sampling_top_p", "train.sampling_max_tokens", "train.sampling_min_tokens",
    "train.advantage_eps", "train.advantage_mode", "train.use_std_normalization", "train.loss_type",
    "train.cliprange", "train.length_normalization", "train.normalize_constant", "train.kl_coef", "train.val_every",
    "train.val_size", "train.val_seed", "train.seed", "train.device", "train.dtype", "train.master_weights",
    "train.scorer_actor", "train.policy_lag", "train.recompute_old_log_probs", "train.decode",
    "train.response_only_head", "train.gradient_checkpointing", "train.kl_monitor", "train.kl_monitor_every",
    "train.math.prompt", "train.math.strict", "train.math.problem_field", "train.math.answer_field",
    "train.math.solution_field",
    "train.text.train_file", "train.text.val_file", "train.text.template", "train.text.template_file",
    "train.text.answer_field", "train.text.reward", "train.text.stop", "train.text.include_stop_str_in_output",
    "train.weight_sync.transport", "train.weight_sync.backend", "train.weight_sync.channel",
    "train.replay.enabled", "train.replay.capacity_groups", "train.replay.max_age", "train.replay.strategy",
    # workflow: which jobs exist and what the tests and benchmarks measure
    "workflow.tracks", "workflow.families", "workflow.toy_sort_seeds", "workflow.toy_sort_epochs",
    "workflow.gpus_per_colocated", "workflow.gpus_per_disaggregated", "workflow.run_tests", "workflow.test_args",
    "workflow.bench_repeats", "workflow.bench_sizes_mb", "workflow.bench_sampler_builds",
    "workflow.bench_scaling", "workflow.scaling_sizes",
    "workflow.scaling_batches", "workflow.scaling_lengths", "workflow.scaling_steps",
    # the MATH track
    "math.dataset_dir", "math.base_model_dir", "math.arithmetic.num_train", "math.arithmetic.num_val",
    "math.arithmetic.min_ops", "math.arithmetic.max_ops", "math.arithmetic.max_operand", "math.arithmetic.max_value",
    "math.arithmetic.corpus_documents", "math.arithmetic.drill_fraction", "math.arithmetic.slip_rate",
    "math.arithmetic.seed", "math.train", "math.variants", "math.eval_size", "math.eval_max_tokens",
    # the smoke switch's caps (they shrink what every track computes)
    "smoke.enabled", "smoke.grpo_steps", "smoke.prompts_per_step", "smoke.val_size", "smoke.eval_size",
    "smoke.pretrain_steps", "smoke.replicates", "smoke.toy_sort_seeds", "smoke.toy_sort_epochs", "smoke.bench_max_mb",
    "smoke.scaling_sizes", "smoke.scaling_batches", "smoke.scaling_lengths", "smoke.sampler_builds",
    # tables
    "variants",
    "tracks.*.description", "tracks.*.dataset_dir", "tracks.*.dataset_command", "tracks.*.base_model",
    "tracks.*.train", "tracks.*.variants", "tracks.*.timed", "tracks.*.evaluate", "tracks.*.eval_size",
    "tracks.*.eval_max_tokens",
    "families.*.track", "families.*.systems", "families.*.question", "families.*.base", "families.*.variants",
    "families.*.reference", "families.*.replicates", "families.*.x",
)

_SHARED_SECTION = re.compile(r"^(?:math|tracks\.\*)\.(tokenizer|model|pretrain)\.")
#: Path-valued keys whose file enters the identity by content (hash of its bytes), not by name.
CONTENT_KEYS = ("train.text.template_file", "train.text.reward")


def canonical_key(key: str) -> str:
    """The placed name of a dotted key: ``math.pretrain.threads`` and ``tracks.*.pretrain.threads``
    are ``pretrain.threads`` (the same section class)."""
    return _SHARED_SECTION.sub(r"\1.", key)


def is_operational(key: str) -> bool:
    return canonical_key(key) in OPERATIONAL_KEYS


def file_digest(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _by_content(key: str, value: Any) -> Any:
    """A path-valued key's file as ``sha256:<digest>`` (a ``file.py:function`` reward keeps its function);
    a value that names no readable file is kept as it is (its check names the key elsewhere)."""
    if not isinstance(value, str):
        return value
    path, fn = (value.rpartition(":")[0], value.rpartition(":")[2]) if key.endswith(".reward") else (value, None)
    if key.endswith(".reward") and not path.endswith(".py"):
        return value  # 'package.module:function': an import path, its code is the installed package's
    try:
        digest = f"sha256:{file_digest(path)}"
    except OSError:
        return value
    return f"{digest}:{fn}" if fn is not None else digest


def identity(values: dict[str, Any], section: str) -> dict[str, Any]:
    """``values`` (a section as plain data, ``to_dict``) without its operational keys, and with the
    files of ``CONTENT_KEYS`` by content: what a fingerprint or a Snakemake param holds. ``section``
    is the dotted key of ``values`` (``train``, ``pretrain``, ``math.arithmetic``)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        key = f"{section}.{name}" if section else name
        if is_operational(key):
            continue
        if isinstance(value, dict) and any(k.startswith(f"{canonical_key(key)}.") for k in
                                           (*OPERATIONAL_KEYS, *CONTENT_KEYS)):
            value = identity(value, key)
        elif canonical_key(key) in CONTENT_KEYS:
            value = _by_content(key, value)
        out[name] = value
    return out
