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
    """bf16 autocast on CUDA when asked; fp32 everywhere else."""
    if device.type == "cuda" and dtype == "bfloat16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
