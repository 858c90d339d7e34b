"""FLOP accounting for ``TransformerLM`` and a same-run matmul peak: the yardstick of the benches.

Counting convention (Kaplan et al. 2020 / PaLM's MFU): one multiply-add is 2 FLOPs; only matrix
products are counted (norms, RoPE, softmax, SwiGLU's pointwise product and AdamW's elementwise
update are a few FLOPs per element, under 1% here, and are left out). Per token, a forward pass costs

- ``2 * N_mm`` in the weight matrices, with ``N_mm = L * (4 D^2 + 3 D F) + D V`` (attention
  projections, the SwiGLU MLP and the LM head; the embedding lookup is a gather, not a matmul);
- ``4 * L * D * c`` in attention (``QK^T`` and ``AV``) for a token that attends to ``c`` positions.
  Causal self-attention over a sequence of ``T`` tokens sums ``c = 1..T``, i.e. about ``T^2 / 2``
  attended positions per sequence; that is what we count, although the SDPA math kernel on CPU
  computes the full ``T x T`` product and masks half of it (so the hardware does a little more).

A training step (forward + backward) costs 3x the forward (the backward computes gradients for
both activations and weights). A KV-cache decoding step costs one forward of the new token against
its cached context.

The matmul peak is measured, not looked up: square fp32 ``torch.mm`` at a few sizes, on the same
threads as the work it is compared with, median of repeats after a warm-up; the best size's rate
is the peak. On a shared machine it moves with the load as the work does, which is why benches
take it in the same run and quote the fraction.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from rlpipe.lm.model import ModelConfig

PEAK_SIZES = (256, 512, 1024)  # square matmul sides; 1024 fp32 = 4 MB per operand


def matmul_params(cfg: ModelConfig) -> int:
    """``N_mm``: parameters that take part in a matrix product per token (not the embedding table)."""
    d = cfg.d_model
    return cfg.num_layers * (4 * d * d + 3 * d * cfg.d_ff) + d * cfg.vocab_size


def forward_flops(cfg: ModelConfig, seq_lens: Sequence[int], head_tokens: int | None = None) -> float:
    """FLOPs of one forward pass over sequences of the given lengths (causal attention, no padding
    counted: a padded batch's extra columns are overhead of the implementation, not work).
    ``head_tokens``: positions whose logits are needed (the LM head's work); default every token. A
    GRPO log-prob pass needs them at the response tokens only, so that is its useful work."""
    n_head = 2 * cfg.d_model * cfg.vocab_size
    n_body, attn = 2 * matmul_params(cfg) - n_head, 4 * cfg.num_layers * cfg.d_model
    head = sum(seq_lens) if head_tokens is None else head_tokens
    return float(sum(t * n_body + attn * t * (t + 1) / 2 for t in seq_lens) + head * n_head)


def train_flops(cfg: ModelConfig, seq_lens: Sequence[int], head_tokens: int | None = None) -> float:
    """Forward + backward over the sequences: 3x the forward."""
    return 3.0 * forward_flops(cfg, seq_lens, head_tokens)


def decode_flops(cfg: ModelConfig, prompt_len: int, new_tokens: int, rows: int) -> float:
    """FLOPs of KV-cache generation: a prefill of ``rows`` prompts of ``prompt_len`` tokens, then
    ``new_tokens`` single-token steps per row, step i attending to ``prompt_len + i`` positions."""
    n_mm, attn = 2 * matmul_params(cfg), 4 * cfg.num_layers * cfg.d_model
    prefill = forward_flops(cfg, [prompt_len] * rows)
    steps = sum(n_mm + attn * (prompt_len + i + 1) for i in range(new_tokens))
    return prefill + rows * float(steps)


def matmul_peak(sizes: Sequence[int] = PEAK_SIZES, repeats: int = 7, dtype=torch.float32,
                device: str | torch.device = "cpu") -> dict:
    """Best median fp32 GEMM rate over ``sizes`` on the current torch threads.

    Returns ``{"flops_per_s", "size", "by_size": {n: flops_per_s}}``."""
    dev = torch.device(device)
    by_size = {}
    for n in sizes:
        a, b = (torch.randn(n, n, dtype=dtype, device=dev) for _ in range(2))
        out = torch.empty(n, n, dtype=dtype, device=dev)
        torch.mm(a, b, out=out)  # warm-up: page in the buffers, pick the kernel
        times = []
        for _ in range(repeats):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        by_size[n] = 2.0 * n ** 3 / statistics.median(times)
    best = max(by_size, key=by_size.get)
    return {"flops_per_s": by_size[best], "size": best, "by_size": by_size}


def gflops(x: float) -> float:
    return round(x / 1e9, 3)
