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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.tokenizer import Tokenizer, load_tokenizer

HF_CONFIG = "config.json"


@dataclass
class Policy:
    model: nn.Module
    tokenizer: Tokenizer
    tokenizer_ref: str | None  # what a checkpoint of this policy records as its tokenizer
    kind: Literal["rlpipe", "hf"]
    source: str  # the checkpoint file or HF directory it was loaded from


def is_hf_dir(path: str | Path) -> bool:
    """Whether ``path`` is a HuggingFace model directory (holds ``config.json``)."""
    p = Path(path)
    return p.is_dir() and (p / HF_CONFIG).is_file()


def hf_dtype(device: torch.device, dtype: str) -> torch.dtype:
    """Weight dtype of an HF policy: bf16 on CUDA when asked, fp32 otherwise."""
    return torch.bfloat16 if device.type == "cuda" and dtype == "bfloat16" else torch.float32


def load_hf_model(path: str | Path, device: torch.device, dtype: str = "float32") -> nn.Module:
    """``AutoModelForCausalLM`` from a local directory (never downloads)."""
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not is_hf_dir(p):
        raise FileNotFoundError(f"{p} is not a HuggingFace model directory (no {HF_CONFIG})")
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=hf_dtype(device, dtype), local_files_only=True)
    return model.to(device)


def load_policy(path: str | Path, *, device: torch.device | str = "cpu", dtype: str = "float32",
                tokenizer: str | None = None) -> Policy:
    """The policy at ``path``: an HF directory or an rlpipe checkpoint; ``tokenizer`` overrides the
    one the checkpoint references (or the directory's ``tokenizer.json``)."""
    device = torch.device(device)
    p = Path(path)
    if p.is_dir():
        model = load_hf_model(p, device, dtype)
        tok_ref = str(tokenizer or p)
        return Policy(model, load_tokenizer(tok_ref), tok_ref, "hf", str(p))
    ckpt = load_checkpoint(p, device=device)
    tok_ref = tokenizer or ckpt.tokenizer
    if tok_ref is None:
        raise FileNotFoundError(f"checkpoint {p} references no tokenizer; pass one")
    return Policy(ckpt.model, load_tokenizer(tok_ref), str(tok_ref), "rlpipe", str(p))
