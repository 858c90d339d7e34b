"""Device, precision, thread and seed set-up: one place for pretraining and every actor role."""

from __future__ import annotations

import contextlib
import os
import random

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' requested but CUDA is not available here; set device: cpu")
    return torch.device(name)


def setup_process(threads: int, seed: int) -> None:
    """Pin torch to ``threads`` CPU threads (the Snakemake job's share) and seed every RNG."""
    torch.set_num_threads(max(1, threads))
    os.environ["OMP_NUM_THREADS"] = str(max(1, threads))
    random.seed(seed)
    torch.manual_seed(seed)


def autocast(device: torch.device, dtype: str):
    """``train.dtype``'s compute precision: bf16 autocast on ``device`` (CUDA or CPU) when ``dtype`` is
    ``bfloat16``, plain fp32 otherwise.

    Autocast keeps the parameters, their gradients and the optimizer state in fp32 (the master weights)
    and casts weights to bf16 per op for the matmuls; the model keeps norms and RoPE in fp32, and every
    consumer takes ``.float()`` of the logits before a softmax. It works on CPU too (slower than fp32
    there unless the CPU has bf16 units), so the bf16 path is tested without a GPU."""
    if dtype == "bfloat16" and device.type in ("cuda", "cpu"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
