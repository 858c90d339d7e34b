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


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_per_kernel_level() -> str:
    """Point torch inductor's on-disk cache at a directory of this CPU kernel level (``AVX512``,
    ``AVX2``, ``DEFAULT``: ``torch.backends.cpu.get_cpu_capability()``) unless the user chose one;
    returns the directory. Call before the first ``torch.compile``/AOTInductor build of a process.

    Why: inductor's cache key does not separate ``ATEN_CPU_CAPABILITY`` levels. Measured on an AVX-512
    machine: kernels cached natively, reused by the same decode step under ``ATEN_CPU_CAPABILITY=avx2``,
    gave NaN and log-probs 12 nats off; the same run with a fresh cache matched the eager step to 2e-6."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # torch's own default location

    default, chosen = default_cache_dir(), os.environ.get(INDUCTOR_CACHE_ENV)
    # torch writes its default into the variable the first time it looks (an optimizer step does), so
    # only another value is the user's choice
    if chosen and os.path.abspath(chosen) != os.path.abspath(default):
        return chosen
    path = f"{default}_{torch.backends.cpu.get_cpu_capability().lower()}"
    os.environ[INDUCTOR_CACHE_ENV] = path
    return path


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
