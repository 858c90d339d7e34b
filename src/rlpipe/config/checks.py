"""Checks of a parsed config that the models' validators cannot make: the model overrides against the
model's fields, and every path key against the file system. Each failure is a ``ConfigError`` naming
the dotted key.

``check_model_overrides`` runs inside ``parse_config`` (it needs nothing but the config), so
``rlpipe train`` and the workflow both refuse ``model.overrides: {num_layer: 2}`` with "did you
mean 'num_layers'?". ``check_paths`` runs where the paths are read: the workflow at parse time,
before any job (``rlpipe.workflow.loading``). It checks each input exists and is readable, and
that the output directory (``workflow.results_dir``) is, or can be created, writable.

``check_one_gpu_nccl`` runs inside ``parse_config`` too: a disaggregated CUDA variant whose two
actors share one GPU (``workflow.gpus_per_disaggregated: 1``) cannot sync over NCCL, which refuses
two ranks on one device ("Duplicate GPU detected"); the run would fail only once its actors met.

``check_trackers`` runs where a run would start (the workflow at parse time, ``rlpipe train`` before
Ray starts): every tracker ``logging.trackers`` names is installed, else the error names the extra
that installs it. It looks the package up without importing it (W&B and MLflow take seconds to import).

``MODEL_FIELDS`` are the fields of ``rlpipe.lm.model.ModelConfig`` (the config layer does not import
torch; a test keeps the two equal).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from pathlib import Path
from typing import Any

from rlpipe.config.base import ConfigError
from rlpipe.config.root import PipelineConfig
from rlpipe.config.sections import ModelSection
from rlpipe.config.train import TrainConfig

#: ``rlpipe.lm.model.ModelConfig``'s fields, in order: what ``model.overrides`` may set.
MODEL_FIELDS = ("vocab_size", "context_length", "num_layers", "d_model", "num_heads", "d_ff", "rope_theta")
TIKTOKEN_PREFIX = "tiktoken:"
#: ``logging.trackers`` name -> (the module it needs, the rlpipe extra that installs it)
TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tb"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def _model_sections(cfg: PipelineConfig) -> dict[str, ModelSection]:
    out = {"model": cfg.model, "math.model": cfg.math.model}
    out.update({f"tracks.{k}.model": t.model for k, t in cfg.tracks.items() if t is not None})
    return out


def check_model_overrides(cfg: PipelineConfig) -> None:
    """Every ``*.model.overrides`` key is a model field, and its value a positive number (an int
    except ``rope_theta``)."""
    for key, section in _model_sections(cfg).items():
        for name, value in section.overrides.items():
            where = f"{key}.overrides.{name}"
            if name not in MODEL_FIELDS:
                close = difflib.get_close_matches(name, MODEL_FIELDS, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"the model's fields are {', '.join(MODEL_FIELDS)}"
                raise ConfigError(f"unknown model field '{where}'; {hint}")
            number = (int, float) if name == "rope_theta" else int
            if isinstance(value, bool) or not isinstance(value, number) or not value > 0:
                kind = "a positive number" if name == "rope_theta" else "a positive integer"
                raise ConfigError(f"{where}: must be {kind}, got {value!r}")


def _readable(key: str, path: str, kind: str) -> None:
    """``path`` exists as a ``kind`` ('file', 'dir' or 'path': either) and can be read."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{key}: {path} does not exist")
    if kind == "file" and not p.is_file():
        raise ConfigError(f"{key}: {path} is not a file")
    if kind == "dir" and not p.is_dir():
        raise ConfigError(f"{key}: {path} is not a directory")
    if not os.access(p, os.R_OK | (os.X_OK if p.is_dir() else 0)):
        raise ConfigError(f"{key}: {path} is not readable")


def _writable(key: str, path: str) -> None:
    """``path`` is a writable directory, or the nearest existing directory above it is."""
    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key}: {path} is not a directory")
    existing = next(q for q in (p, *p.parents) if q.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == p else f" ({existing}, where it would be created, is not writable)"
        raise ConfigError(f"{key}: {path} is not writable{where}")


def _train_files(key: str, train: dict[str, Any]) -> None:
    text = train.get("text") or {}
    if text.get("template_file"):
        _readable(f"{key}.text.template_file", text["template_file"], "file")
    reward = text.get("reward") or ""
    if ".py:" in reward:
        _readable(f"{key}.text.reward", reward.rpartition(":")[0], "file")


def _base_model(key: str, path: str) -> None:
    """A given base model: a local HF directory (config.json) or an rlpipe checkpoint file."""
    p = Path(path).expanduser()
    if not (p.is_file() or (p / "config.json").is_file()):
        raise ConfigError(f"{key}: {path} is not a local HuggingFace model directory (no config.json) nor an rlpipe "
                          "checkpoint file; rlpipe never downloads models")
    _readable(key, path, "path")


def check_paths(cfg: PipelineConfig, trains: dict[str, dict[str, Any]] | None = None) -> None:
    """Every path key of the tracks in ``workflow.tracks`` that is set: inputs exist and are readable
    (base models first), the results directory is writable. ``trains`` maps a dotted key to a resolved
    train section (plain data) whose template and reward files are checked too (the workflow passes
    every run's)."""
    on = set(cfg.workflow.tracks)
    models = [("math.base_model_dir", cfg.math.base_model_dir)] if "math" in on else []
    models += [(f"tracks.{k}.base_model", t.base_model) for k, t in cfg.tracks.items() if t and k in on]
    for key, value in models:
        if value:
            _base_model(key, value)
    d = cfg.data
    inputs = [("data.corpus_path", d.corpus_path if d.corpus_source == "tinystories" else None, "file"),
              ("data.keywords_path", d.keywords_path, "file")] if "keyword" in on else []
    inputs += [("math.dataset_dir", cfg.math.dataset_dir, "dir")] if "math" in on else []
    inputs += [(f"tracks.{k}.dataset_dir", t.dataset_dir, "dir") for k, t in cfg.tracks.items() if t and k in on]
    sections = [("", cfg.tokenizer, cfg.model)] if "keyword" in on else []
    sections += [("math.", cfg.math.tokenizer, cfg.math.model)] if "math" in on else []
    sections += [(f"tracks.{k}.", t.tokenizer, t.model) for k, t in cfg.tracks.items() if t and k in on]
    for prefix, tok, model in sections:
        if tok.path is not None and not tok.path.startswith(TIKTOKEN_PREFIX):
            inputs.append((f"{prefix}tokenizer.path", tok.path, "path"))
        inputs.append((f"{prefix}model.base_checkpoint", model.base_checkpoint, "file"))
    for key, value, kind in inputs:
        if value:
            _readable(key, value, kind)
    for key, train in (trains or {}).items():
        _train_files(key, train)
    _writable("workflow.results_dir", cfg.workflow.results_dir)


def check_one_gpu_nccl(key: str, train: TrainConfig, gpus_per_disaggregated: int) -> None:
    """Refuse ``weight_sync`` over rdt/nccl for a disaggregated CUDA run given one GPU: NCCL cannot
    connect two ranks on the same device, so the learner and the generator sharing it would fail at
    their first sync. ``key`` is the dotted place of the train section (``variants.<name>``)."""
    ws = train.weight_sync
    if (train.mode == "disaggregated" and str(train.device).startswith("cuda") and ws.transport == "rdt"
            and ws.backend == "nccl" and gpus_per_disaggregated == 1):
        raise ConfigError(
            f"{key}.weight_sync.backend is 'nccl' but workflow.gpus_per_disaggregated is 1: the learner and "
            "the generator share one GPU, and NCCL cannot connect two ranks on one device. Set "
            f"{key}.weight_sync.backend: cuda_ipc (same-GPU RDT), or workflow.gpus_per_disaggregated: 2")


def check_trackers(cfg: PipelineConfig) -> None:
    """Every tracker of ``logging.trackers`` is installed; otherwise the error names the extra."""
    for name in cfg.logging.trackers:
        module, extra = TRACKER_PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"logging.trackers names '{name}' but the '{module}' package is not installed: "
                              f"pip install -e '.[{extra}]' (or remove '{name}' from logging.trackers)")
