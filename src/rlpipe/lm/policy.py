"""A policy = a causal LM + its tokenizer, from either backend, loaded from local files only.

- ``rlpipe``: our ``TransformerLM`` from an rlpipe checkpoint file (``rlpipe.lm.checkpoint``).
- ``hf``: a HuggingFace ``AutoModelForCausalLM`` directory (``config.json`` + weights +
  ``tokenizer.json``), e.g. a local Qwen2.5-Math-1.5B or ``rlpipe export-hf`` output. Loaded with
  ``local_files_only=True``: rlpipe never downloads.

Seed 001 loads Qwen in bf16 with FlashAttention-2 on GPU. Here an HF policy's inference copies (the
generator's and the reference model's) have bf16 weights on CUDA when ``dtype`` is ``bfloat16`` and
fp32 otherwise (``hf_dtype``; CPU always fp32: CPU bf16 matmuls are slow and make the learner's and
the sampler's numerics drift apart); the attention kernel is transformers' default (``sdpa``), since
flash-attn is not a dependency. The learner keeps fp32 master weights (so fp32 gradients and AdamW
state) and computes under bf16 autocast (``rlpipe.lm.device.autocast``), as our ``TransformerLM``
always does: an AdamW step moves a weight by at most about lr (seed 001: 1e-5), under half of
bf16's spacing (2**-9 to 2**-8 of the weight's magnitude) for any weight above about 0.005, so bf16
masters round such updates away. ``train.master_weights: bfloat16`` gives
seed 001's bf16 weights and AdamW state instead (``learner_weight_dtype``), where memory is short.

The memory that choice costs, for Qwen2.5-Math-1.5B (1.544e9 parameters, tied embeddings counted
once): bf16 masters hold weights + gradients + two AdamW moments at 2 bytes each, 8 B/param =
12.3 GB; fp32 masters 4 bytes each, 16 B/param = 24.7 GB, plus up to 2 B/param (3.1 GB) of bf16
weight casts that autocast keeps during a forward/backward. A colocated run adds the generator's bf16
copy (3.1 GB) and, with KL, the reference's (3.1 GB); activations come on top. On an 80 GB H100 the
fp32 masters fit with room to spare (+12.3 GB); on a 24 GB card they do not, bf16 masters do.

Everything downstream (sampler, log-probs, losses) takes either model: both map ``input_ids`` to
logits, ours returning a tensor, HF an output object (``rlpipe.rl.logprobs`` reads both).

An rlpipe checkpoint may also hold an HF policy (the trainer's ``last.pt`` of an HF run): its
``model_config`` names the HF directory, which ``load_policy`` rebuilds the model from before loading
the saved weights (``rlpipe.lm.checkpoint``); such a policy has kind ``hf`` and ``hf_pretrained`` set.
HF models used for training and scoring get ``config.use_cache = False`` (``for_training``): a plain
forward would otherwise build a KV cache nobody reads; the sampler passes ``use_cache=True`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from rlpipe.lm.checkpoint import HF_CONFIG, hf_dtype, is_hf_dir, load_checkpoint, load_hf_model, save_checkpoint
from rlpipe.lm.model import ModelConfig
from rlpipe.lm.tokenizer import Tokenizer, load_tokenizer

__all__ = ["HF_CONFIG", "Policy", "for_training", "hf_dtype", "is_hf_dir", "learner_weight_dtype", "load_hf_model",
           "load_policy"]


@dataclass
class Policy:
    model: nn.Module
    tokenizer: Tokenizer
    tokenizer_ref: str | None  # what a checkpoint of this policy records as its tokenizer
    kind: Literal["rlpipe", "hf"]
    source: str  # the checkpoint file or HF directory it was loaded from
    hf_pretrained: str | None = None  # kind "hf": the HF directory the architecture comes from

    def save(self, path, *, optimizer=None, extra: dict | None = None) -> None:
        """An rlpipe checkpoint of this policy (either kind; see ``rlpipe.lm.checkpoint``)."""
        save_checkpoint(path, self.model, tokenizer=self.tokenizer_ref, optimizer=optimizer, extra=extra,
                        hf_pretrained=self.hf_pretrained)


def for_training(model: nn.Module, gradient_checkpointing: bool = False) -> nn.Module:
    """Prepare a learner's or reference model: no KV cache in plain forwards (HF), and activation
    recomputation in the backward pass when asked (HF ``activation_checkpointing_enable``, formerly
    ``gradient_checkpointing_enable``; our
    ``TransformerLM`` checkpoints each block with ``torch.utils.checkpoint``)."""
    config = getattr(model, "config", None)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    if not gradient_checkpointing:
        return model
    if isinstance(config, ModelConfig):
        model.gradient_checkpointing_enable()
    elif hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise ValueError(f"train.gradient_checkpointing: {type(model).__name__} does not support it")
    return model


def learner_weight_dtype(device: torch.device, dtype: str, master_weights: str = "float32") -> torch.dtype:
    """The weight dtype of an HF policy's learner (its master weights, hence its gradients and AdamW
    state): fp32, or with ``master_weights`` ``bfloat16`` the inference copies' dtype (``hf_dtype``:
    bf16 on CUDA under ``dtype`` ``bfloat16``, fp32 elsewhere)."""
    return hf_dtype(device, dtype) if master_weights == "bfloat16" else torch.float32


def load_policy(path: str | Path, *, device: torch.device | str = "cpu", dtype: str = "float32",
                tokenizer: str | None = None, weight_dtype: torch.dtype | None = None) -> Policy:
    """The policy at ``path``: an HF directory or an rlpipe checkpoint; ``tokenizer`` overrides the
    one the checkpoint references (or the directory's ``tokenizer.json``). ``weight_dtype`` sets an
    HF policy's weight dtype (default ``hf_dtype(device, dtype)``, the inference copies'); our
    ``TransformerLM`` is always fp32."""
    device = torch.device(device)
    p = Path(path)
    if p.is_dir():
        model = load_hf_model(p, device, dtype, weight_dtype)
        tok_ref = str(tokenizer or p)
        return Policy(model, load_tokenizer(tok_ref), tok_ref, "hf", str(p), hf_pretrained=str(p.resolve()))
    ckpt = load_checkpoint(p, device=device, dtype=dtype, weight_dtype=weight_dtype)
    tok_ref = tokenizer or ckpt.tokenizer
    if tok_ref is None:
        raise FileNotFoundError(f"checkpoint {p} references no tokenizer; pass one")
    kind = "hf" if ckpt.hf_pretrained else "rlpipe"
    return Policy(ckpt.model, load_tokenizer(tok_ref), str(tok_ref), kind, str(p), hf_pretrained=ckpt.hf_pretrained)
