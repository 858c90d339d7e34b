"""Model checkpoints: config + weights + tokenizer reference (+ optimizer state, + ``extra``).

Seed 000's Learner "loads model/optimizer checkpoints" and its Generator "loads a pre-trained
TransformerLM from a checkpoint"; the seeds leave the format open. rlpipe stores one ``torch.save``
file holding only tensors, containers and primitives::

    {"format": "rlpipe.lm.checkpoint", "version": 1, "model_config": {...}, "model": state_dict,
     "tokenizer": "path/to/tokenizer.json" | None, "optimizer": state_dict | None, "extra": {...}}

and loads it with ``torch.load(..., weights_only=True)``, so a checkpoint cannot execute code (a
pickled object is refused). ``extra`` is checked at save time for the same reason: anything
``weights_only`` could not load back (numpy arrays, custom classes) is an error naming its key,
raised before the file is written, not a surprise at resume time. Weights are stored on CPU so a
GPU checkpoint loads on a CPU-only machine. Writes are atomic (``rlpipe.io.torch_save``).
Loading checks every parameter and reports all missing, unexpected and mis-shaped names at once.

HuggingFace policies (``rlpipe.lm.policy``, kind ``hf``) are saved in the same format: their
``model_config`` is ``{"hf_pretrained": <absolute model directory>}`` and ``model`` their state dict.
Loading rebuilds the architecture from that directory (``from_pretrained``, local files only), then
loads the saved weights; a directory that is gone is a ``CheckpointError`` naming the checkpoint and
the directory. Tensors shared between state-dict names (a tied embedding / LM head, as in Qwen2) are
copied to CPU once and stay shared, so the file holds them once.

Each checkpoint records a sha256 of its content (``"sha256"``, beside ``"format"``), and loading
verifies it: a file whose bytes changed after it was written (bit rot, a bad copy, a failing disk)
is refused with a ``CheckpointError`` naming the file, like a truncated one. The zip archive's own
CRCs would catch that too, but torch's reader does not check them. The digest is computed over the
content as loaded (every tensor's dtype, shape and bytes, and every other value, in a fixed order;
``content_digest``), not over the file's bytes, and stored inside the same file: so it is written
atomically by construction, by the same rename (a sidecar would need its own atomic write and could
disagree with the file after a crash between the two renames), and any change that reaches what
``torch.load`` returns is detected, while bytes that never reach it (zip padding) cannot matter.
The price is one sha256 pass over the weights on every save and load (and a CPU copy of each
tensor when loading onto a GPU). Checkpoints written before checksums were recorded have no
``"sha256"`` key; they still load, unverified (the other checks below still apply).

Broken files fail with a ``CheckpointError`` naming the file and the cause (not a zip archive:
empty, truncated or another kind of file; a damaged archive; pickled objects) instead of a
torch/pickle error. Non-finite weights are refused in both directions: ``save_checkpoint`` never
replaces a good checkpoint with a NaN/inf one (it raises before writing), and loading a poisoned
file raises, so a diverged run can never be resumed from it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from rlpipe.io import torch_save
from rlpipe.lm.attention import route_hf_attention
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.tokenizer import Tokenizer, load_tokenizer

FORMAT = "rlpipe.lm.checkpoint"
VERSION = 1
HF_PRETRAINED = "hf_pretrained"  # model_config key of an HF policy's checkpoint: its model directory
HF_CONFIG = "config.json"
CHECKSUM = "sha256"  # payload key of the content digest (absent in checkpoints of older rlpipe)


class CheckpointError(ValueError):
    """A checkpoint file is unreadable, unsafe, or does not match the model."""


@dataclass
class LoadedCheckpoint:
    model: nn.Module  # a TransformerLM, or an HF causal LM when ``hf_pretrained`` is set
    model_config: ModelConfig | None  # None for an HF policy
    tokenizer: str | None
    optimizer_state: dict | None = None
    extra: dict = field(default_factory=dict)
    hf_pretrained: str | None = None  # the HF model directory the architecture comes from


class OpenedBase(NamedTuple):
    """``open_base_checkpoint``'s answer: the checkpoint, the tokenizer reference its actors load
    (absolute when it is a path) and the tokenizer, loaded once to check it."""

    checkpoint: LoadedCheckpoint
    tokenizer_ref: str
    tokenizer: Tokenizer


def _unwrap(model: nn.Module) -> nn.Module:
    # torch.compile wraps the module; its state-dict keys carry an "_orig_mod." prefix we don't want.
    return getattr(model, "_orig_mod", model)


_SAFE_SCALARS = (
    type(None), bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.device, torch.Size,
)


def _check_loadable(obj: Any, where: str) -> None:
    """Raise naming ``where`` if ``obj`` would not survive ``torch.load(weights_only=True)``."""
    if isinstance(obj, _SAFE_SCALARS):
        return
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _check_loadable(item, f"{where}[{i}]")
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise TypeError(f"checkpoint {where} has a key of type {type(k).__name__}: {k!r}")
            _check_loadable(v, f"{where}[{k!r}]")
        return
    raise TypeError(
        f"checkpoint {where} holds a {type(obj).__module__}.{type(obj).__name__}, which weights-only "
        "loading refuses; store tensors, numbers, strings, lists or dicts "
        "(e.g. torch.from_numpy(a) or a.tolist())"
    )


def non_finite_tensors(tensors: dict, limit: int = 5) -> list[str]:
    """Names (with counts) of up to ``limit`` floating tensors in ``tensors`` (a state dict, or
    nested dicts/lists of tensors such as an optimizer state) holding NaN or inf values."""
    bad: list[str] = []

    def walk(obj, name: str) -> None:
        if len(bad) >= limit:
            return
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point() and not bool(torch.isfinite(obj).all()):
                bad.append(f"{name} ({int((~torch.isfinite(obj)).sum())} of {obj.numel()} values)")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{name}.{k}" if name else str(k))
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{name}[{i}]")

    walk(tensors, "")
    return bad


def _model_config(model: nn.Module, hf_pretrained: str | os.PathLike | None) -> dict:
    """What ``model_config`` stores: a ``TransformerLM``'s config, or the HF model directory."""
    config = getattr(model, "config", None)
    if isinstance(config, ModelConfig):
        return config.to_dict()
    source = hf_pretrained or getattr(config, "name_or_path", None)
    if not source or not (Path(source) / "config.json").is_file():
        raise TypeError(
            f"save_checkpoint needs a TransformerLM (with a ModelConfig .config) or an HF model with its local "
            f"directory (hf_pretrained=...), got {type(model).__name__} from {source!r}"
        )
    return {HF_PRETRAINED: os.path.abspath(source)}


def _cpu_state(state: dict) -> dict:
    """CPU copies of a state dict; tensors shared by several names (tied weights) stay shared."""
    copies: dict[tuple, torch.Tensor] = {}
    out = {}
    for k, v in state.items():
        key = (v.data_ptr(), v.dtype, tuple(v.shape), v.stride(), v.device)
        if key not in copies:
            copies[key] = v.detach().to("cpu", copy=True).contiguous()
        out[k] = copies[key]
    return out


def save_checkpoint(path, model: nn.Module, *, tokenizer, optimizer=None, extra: dict | None = None,
                    hf_pretrained: str | os.PathLike | None = None) -> None:
    """Write ``model`` (a ``TransformerLM``, or an HF causal LM whose directory is ``hf_pretrained``,
    default its ``config.name_or_path``), its config and ``tokenizer`` (a path/spec string or a
    ``Tokenizer``, whose ``.spec`` is stored) to ``path`` atomically."""
    model = _unwrap(model)
    model_config = _model_config(model, hf_pretrained)
    tok_ref = getattr(tokenizer, "spec", tokenizer)
    if tok_ref is not None and not isinstance(tok_ref, (str, os.PathLike)):
        raise TypeError(
            f"tokenizer must be a path string, a Tokenizer or None, got {type(tokenizer).__name__}"
        )
    extra = dict(extra or {})
    _check_loadable(extra, "extra")
    opt_state = optimizer.state_dict() if optimizer is not None else None
    if opt_state is not None:
        _check_loadable(opt_state, "optimizer")
    bad = non_finite_tensors(model.state_dict()) + non_finite_tensors({"optimizer": opt_state or {}})
    if bad:
        raise CheckpointError(f"refusing to write checkpoint {path}: non-finite (NaN/inf) values in "
                              f"{', '.join(bad)}; the previous file, if any, is kept")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_config": model_config,
        "model": _cpu_state(model.state_dict()),
        "tokenizer": None if tok_ref is None else str(tok_ref),
        "optimizer": opt_state,
        "extra": extra,
    }
    save_payload(path, payload)


def save_payload(path, payload: dict) -> None:
    """Write a checkpoint ``payload`` atomically with the digest of its content (any digest it
    carries is replaced: the file records what it holds)."""
    payload = {k: v for k, v in payload.items() if k != CHECKSUM}
    payload[CHECKSUM] = content_digest(payload)
    torch_save(path, payload)


def content_digest(payload: dict) -> str:
    """sha256 of a payload's content (without its ``sha256`` entry): tensors by dtype, shape and
    bytes (on CPU), containers in a fixed order, other values by type and ``repr``."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != CHECKSUM})
    return h.hexdigest()


def _feed(h, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}:".encode())
        h.update(t.view(torch.uint8).numpy())  # the bytes, without a copy
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}:".encode())
        for k in sorted(obj, key=repr):
            h.update(f"{k!r}=".encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}:".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def _read(path, device) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is not ours
        with open(path, "rb") as f:
            head = f.read(16)
        raise CheckpointError(
            f"checkpoint {path} is not a torch checkpoint file ({path.stat().st_size} bytes starting "
            f"{head!r}: not a zip archive, so it is empty, truncated or another kind of file)"
        )
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"checkpoint {path} was refused by weights-only loading (it holds pickled objects): {e}"
        ) from e
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path} is damaged or truncated: {e}") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an rlpipe checkpoint (no format={FORMAT!r} marker)")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has version {payload.get('version')!r}; this rlpipe reads {VERSION}"
        )
    recorded = payload.get(CHECKSUM)
    if recorded is not None and recorded != content_digest(payload):
        raise CheckpointError(f"checkpoint {path} is corrupt: its content does not match the sha256 recorded when it "
                              "was written (changed on disk or in a copy)")
    missing = [k for k in ("model_config", "model") if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing}")
    bad = non_finite_tensors(payload["model"]) + non_finite_tensors({"optimizer": payload.get("optimizer") or {}})
    if bad:
        raise CheckpointError(f"checkpoint {path} is poisoned: non-finite (NaN/inf) values in {', '.join(bad)}")
    return payload


def check_state_dict(model: nn.Module, state: dict, source: str = "checkpoint") -> None:
    """Raise ``CheckpointError`` listing every missing, unexpected and mis-shaped parameter."""
    expected = {k: tuple(v.shape) for k, v in _unwrap(model).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = [
        f"{k}: model {expected[k]} vs {source} {got[k]}"
        for k in sorted(set(expected) & set(got))
        if expected[k] != got[k]
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if shapes:
            parts.append("shape mismatches [" + "; ".join(shapes) + "]")
        raise CheckpointError(f"{source} does not match the model: " + ", ".join(parts))


def is_hf_checkpoint_config(model_config: dict) -> bool:
    return isinstance(model_config, dict) and HF_PRETRAINED in model_config


def _load_hf(path, payload: dict, device, dtype: str, weight_dtype: torch.dtype | None) -> LoadedCheckpoint:
    source = payload["model_config"][HF_PRETRAINED]
    if not is_hf_dir(source):
        raise CheckpointError(f"checkpoint {path} holds an HF policy built from {source}, which is gone "
                              "(no config.json there); restore that model directory to load it")
    model = load_hf_model(source, torch.device(device), dtype, weight_dtype)  # the saved weights are cast to it
    check_state_dict(model, payload["model"], source=f"checkpoint {path}")
    model.load_state_dict(payload["model"], strict=True)
    return LoadedCheckpoint(model=model, model_config=None, tokenizer=payload.get("tokenizer"),
                            optimizer_state=payload.get("optimizer"), extra=payload.get("extra") or {},
                            hf_pretrained=source)


def is_hf_dir(path: str | Path) -> bool:
    """Whether ``path`` is a HuggingFace model directory (holds ``config.json``)."""
    p = Path(path)
    return p.is_dir() and (p / HF_CONFIG).is_file()


def hf_dtype(device: torch.device, dtype: str) -> torch.dtype:
    """Weight dtype of an HF policy's inference copies (generator, reference): bf16 on CUDA when
    ``dtype`` is ``bfloat16``, fp32 otherwise. The learner chooses its own (``rlpipe.lm.policy``)."""
    return torch.bfloat16 if device.type == "cuda" and dtype == "bfloat16" else torch.float32


def load_hf_model(path: str | Path, device: torch.device, dtype: str = "float32",
                  weight_dtype: torch.dtype | None = None) -> nn.Module:
    """``AutoModelForCausalLM`` from a local directory (never downloads; see ``rlpipe.lm.policy``),
    with weights in ``weight_dtype`` (default ``hf_dtype(device, dtype)``)."""
    from transformers import AutoModelForCausalLM

    route_hf_attention()
    p = Path(path)
    if not is_hf_dir(p):
        raise FileNotFoundError(f"{p} is not a HuggingFace model directory (no {HF_CONFIG})")
    weights = hf_dtype(device, dtype) if weight_dtype is None else weight_dtype
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=weights, local_files_only=True)
    disable_dropout(model)
    return model.to(device)


def disable_dropout(model: nn.Module) -> None:
    """Switch off every dropout of an HF model (GPT-2 style configs default to 0.1). GRPO needs a
    deterministic policy: with dropout on, the learner's log-probs of a sampled response differ from
    the sampler's and from each other, and the on-policy ratio is not 1 (TRL's GRPOTrainer does the
    same by default). Both the modules and the config's ``*dropout*`` / ``*pdrop*`` values are zeroed,
    since some attention implementations read the probability from the config."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    cfg = getattr(model, "config", None)
    for key, value in (vars(cfg) if cfg is not None else {}).items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(cfg, key, 0.0)


def read_extra(path) -> dict:
    """The ``extra`` dict of the checkpoint at ``path`` (the file fully checked, no model built)."""
    return _read(path, "cpu").get("extra") or {}


def load_checkpoint(path, device="cpu", dtype: str = "float32",
                    weight_dtype: torch.dtype | None = None) -> LoadedCheckpoint:
    """Rebuild the model saved at ``path`` on ``device``: a ``TransformerLM`` (fp32), or an HF policy
    from its directory, its weights in ``weight_dtype`` (default: bf16 on CUDA when ``dtype`` is
    ``bfloat16``, fp32 otherwise; see ``rlpipe.lm.policy``) whatever dtype the file stores them in."""
    payload = _read(path, device)
    if is_hf_checkpoint_config(payload["model_config"]):
        return _load_hf(path, payload, device, dtype, weight_dtype)
    try:
        config = ModelConfig.from_dict(payload["model_config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} has an invalid model_config: {e}") from e
    with torch.device("meta"):
        model = TransformerLM(config)  # no init work: every tensor is replaced by the checkpoint's
    check_state_dict(model, payload["model"], source=f"checkpoint {path}")
    model.load_state_dict(payload["model"], strict=True, assign=True)
    return LoadedCheckpoint(
        model=model.to(device),
        model_config=config,
        tokenizer=payload.get("tokenizer"),
        optimizer_state=payload.get("optimizer"),
        extra=payload.get("extra") or {},
    )


def load_model_state(model: nn.Module, path) -> dict:
    """Copy the weights at ``path`` into an existing ``model`` in place (its device and dtype kept);
    return the checkpoint's ``extra``. The checkpoint's config must equal the model's."""
    return load_training_state(model, path)[1]


def load_training_state(model: nn.Module, path) -> tuple[dict | None, dict]:
    """``load_model_state`` that also returns the optimizer state: ``(optimizer_state, extra)``.
    Works for a ``TransformerLM`` and an HF model (keys and shapes are checked either way)."""
    payload = _read(path, "cpu")
    config = getattr(_unwrap(model), "config", None)
    hf_saved = is_hf_checkpoint_config(payload["model_config"])
    if hf_saved != (not isinstance(config, ModelConfig)):
        kinds = ("an HF policy", "a TransformerLM")
        raise CheckpointError(f"checkpoint {path} holds {kinds[not hf_saved]} but the model is {kinds[hf_saved]}")
    if isinstance(config, ModelConfig) and payload["model_config"] != config.to_dict():
        saved = payload["model_config"]
        diff = {k: (v, saved.get(k)) for k, v in config.to_dict().items() if saved.get(k) != v}
        raise CheckpointError(
            f"checkpoint {path} config differs from the model's: {{field: (model, checkpoint)}} = {diff}"
        )
    check_state_dict(model, payload["model"], source=f"checkpoint {path}")
    _unwrap(model).load_state_dict(payload["model"], strict=True)
    return payload.get("optimizer"), payload.get("extra") or {}


def open_base_checkpoint(path: str | os.PathLike, flag: str = "--base") -> OpenedBase:
    """Open an rlpipe checkpoint and the tokenizer it references, so that a bad one fails before any
    work; every error names ``flag`` and the file. The tokenizer reference is absolute when it is a
    path (actors on a cluster do not share the caller's working directory); a spec such as
    ``tiktoken:gpt2`` stays unchanged."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{flag}: checkpoint {path} not found (run `rlpipe pretrain` first)")
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as e:
        raise CheckpointError(f"{flag}: {e}") from None
    if ckpt.tokenizer is None:
        raise CheckpointError(f"{flag}: checkpoint {path} names no tokenizer (save it with tokenizer=...)")
    try:
        tok = load_tokenizer(ckpt.tokenizer)
    except Exception as e:  # the tokenizer loaders raise many types (OSError, ValueError, Exception)
        raise CheckpointError(f"{flag}: the tokenizer {ckpt.tokenizer} that checkpoint {path} references cannot "
                              f"be loaded: {type(e).__name__}: {e}") from None
    vocab = ckpt.model_config.vocab_size if ckpt.model_config is not None else None
    if vocab is not None and tok.vocab_size > vocab:
        raise CheckpointError(f"{flag}: the tokenizer {ckpt.tokenizer} has {tok.vocab_size} tokens but the model in "
                              f"{path} only {vocab} (vocab_size)")
    ref = os.path.abspath(ckpt.tokenizer) if os.path.exists(ckpt.tokenizer) else ckpt.tokenizer
    return OpenedBase(ckpt, ref, tok)
