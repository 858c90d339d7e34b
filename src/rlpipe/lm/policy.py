"""A policy = a causal LM + its tokenizer, from either backend, loaded from local files only.

- ``rlpipe``: our ``TransformerLM`` from an rlpipe checkpoint file (``rlpipe.lm.checkpoint``).
- ``hf``: a HuggingFace ``AutoModelForCausalLM`` directory (``config.json`` + weights +
  ``tokenizer.json``), e.g. a local Qwen2.5-Math-1.5B or ``rlpipe export-hf`` output. Loaded with
  ``local_files_only=True``: rlpipe never downloads.

Seed 001 loads Qwen in bf16 with FlashAttention-2 on GPU. Here the HF weights are bf16 on CUDA when
``dtype`` is ``bfloat16`` and fp32 otherwise (CPU always fp32: CPU bf16 matmuls are slow and make the
learner's and the sampler's numerics drift apart); the attention kernel is transformers' default
(``sdpa``), since flash-attn is not a dependency. Our ``TransformerLM`` keeps fp32 weights and runs
under bf16 autocast instead (``rlpipe.lm.device.autocast``).

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

__all__ = ["HF_CONFIG", "Policy", "for_training", "hf_dtype", "is_hf_dir", "load_hf_model", "load_policy"]


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


def load_policy(path: str | Path, *, device: torch.device | str = "cpu", dtype: str = "float32",
                tokenizer: str | None = None) -> Policy:
    """The policy at ``path``: an HF directory or an rlpipe checkpoint; ``tokenizer`` overrides the
    one the checkpoint references (or the directory's ``tokenizer.json``)."""
    device = torch.device(device)
    p = Path(path)
    if p.is_dir():
        model = load_hf_model(p, device, dtype)
        tok_ref = str(tokenizer or p)
        return Policy(model, load_tokenizer(tok_ref), tok_ref, "hf", str(p), hf_pretrained=str(p.resolve()))
    ckpt = load_checkpoint(p, device=device, dtype=dtype)
    tok_ref = tokenizer or ckpt.tokenizer
    if tok_ref is None:
        raise FileNotFoundError(f"checkpoint {p} references no tokenizer; pass one")
    kind = "hf" if ckpt.hf_pretrained else "rlpipe"
    return Policy(ckpt.model, load_tokenizer(tok_ref), str(tok_ref), kind, str(p), hf_pretrained=ckpt.hf_pretrained)
