"""FLOP accounting for ``TransformerLM`` and a same-run matmul peak: the yardstick of the benches.

Counting convention (Kaplan et al. 2020 / PaLM's MFU): one multiply-add is 2 FLOPs; only matrix
products are counted (norms, RoPE, softmax, SwiGLU's pointwise product and AdamW's elementwise
update are a few FLOPs per element, under 1% here, and are left out). Per token, a forward pass costs

- ``2 * N_mm`` in the weight matrices, with ``N_mm = L * (4 D^2 + 3 D F) + D V`` (attention
  projections, the SwiGLU MLP and the LM head; the embedding lookup is a gather, not a matmul;
  with grouped-query attention, as in an HF Qwen2 config, the K and V projections are ``D x D_kv``);
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

Two yardsticks, and every bench quotes both (``peak_fields``):

- the *shape peak* (``matmul_peak``: fp32, sides 256-1024, one product per timing): what the
  device gives products of about the model's own size, launch and threading overheads included.
  A bench's ``*_fraction_of_peak`` and ``fraction_of_shape_peak`` divide by it; a high fraction
  says the work runs as fast as products of its size can, not that the chip is busy.
- the *device peak* (``device_peak``: one large square product in the run's dtype, 8192 on CUDA,
  2048 on CPU, ten products per timing on CUDA, plus a large warm ``copy_`` for memory bandwidth): what
  the chip itself can do. ``*_fraction_of_device_peak`` / ``fraction_of_device_peak`` divide by
  it: on a GPU, a launch-bound decode is a fraction of a percent of it. Measured once per process
  (per device, dtype and thread count) and cached; on CPU it runs on the caller's torch threads.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence

import torch

from rlpipe.lm import attention
from rlpipe.lm.model import ModelConfig

PEAK_SIZES = (256, 512, 1024)  # square matmul sides; 1024 fp32 = 4 MB per operand
# the device peak's square side and copy size per device type: large enough that launch and
# threading overheads vanish, small enough to take seconds (CPU: ~0.3 s per 2048 fp32 product on
# one loaded core of the dev machine; CUDA: 8192 bf16 is ~1.4 ms on an H100, fp32 ~25 ms)
DEVICE_PEAK_SIZE = {"cuda": 8192, "cpu": 2048}
#: CPU flags of units that multiply in a dtype; a CPU with none of them emulates the dtype's products
#: (converting to fp32 in software), at a rate already reached by side 1024 and several times below
#: fp32's (``rlpipe bench pretrain-precision`` prints the ratio on this machine), so a 2048 product
#: would take seconds per timing and measure nothing a 1024 one does not
NATIVE_CPU_UNITS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}
EMULATED_PEAK_SIZE = 1024
DEVICE_MEMCPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 28}
PEAK_NOTE = ("fraction_of_shape_peak and every *_fraction_of_peak: achieved FLOP/s over the same-run shape peak "
             "(shape_peak_gflops / matmul_peak_gflops: the best fp32 square matmul of sides 256-1024, one product per "
             "timing: what products of about the model's size get here). fraction_of_device_peak and every "
             "*_fraction_of_device_peak: the same FLOP/s over the device peak (device_peak: one large square matmul "
             "in device_peak_dtype, side device_peak_matmul_size, ten products per timing on CUDA: what the chip can "
             "do). FLOPs are counted as in rlpipe.bench.flops (matrix products only).")


def dims(cfg) -> tuple[int, int, int, int, int]:
    """``(L, D, F, V, D_kv)`` of a ``ModelConfig`` or of a ``transformers`` Llama/Qwen2-style config
    (``num_hidden_layers``, ``hidden_size``, ...): depth, width, MLP width, vocabulary and the width
    of the K and V projections, ``D`` without grouped-query attention, ``D * kv_heads / heads`` with it."""
    if isinstance(cfg, ModelConfig):
        return cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.d_model
    heads, d = cfg.num_attention_heads, cfg.hidden_size
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    return cfg.num_hidden_layers, d, cfg.intermediate_size, cfg.vocab_size, d * kv // heads


def matmul_params(cfg) -> int:
    """``N_mm``: parameters that take part in a matrix product per token (not the embedding table):
    ``L (2 D^2 + 2 D D_kv + 3 D F) + D V`` (``dims``; ``4 D^2`` per layer's attention without GQA)."""
    n_layers, d, d_ff, vocab, d_kv = dims(cfg)
    return n_layers * (2 * d * d + 2 * d * d_kv + 3 * d * d_ff) + d * vocab


def forward_flops(cfg, seq_lens: Sequence[int], head_tokens: int | None = None) -> float:
    """FLOPs of one forward pass over sequences of the given lengths (causal attention, no padding
    counted: a padded batch's extra columns are overhead of the implementation, not work).
    ``head_tokens``: positions whose logits are needed (the LM head's work); default every token. A
    GRPO log-prob pass needs them at the response tokens only, so that is its useful work. ``cfg``:
    as ``dims`` takes it."""
    n_layers, d, _, vocab, _ = dims(cfg)
    n_head = 2 * d * vocab
    n_body, attn = 2 * matmul_params(cfg) - n_head, 4 * n_layers * d
    head = sum(seq_lens) if head_tokens is None else head_tokens
    return float(sum(t * n_body + attn * t * (t + 1) / 2 for t in seq_lens) + head * n_head)


def train_flops(cfg, seq_lens: Sequence[int], head_tokens: int | None = None) -> float:
    """Forward + backward over the sequences: 3x the forward."""
    return 3.0 * forward_flops(cfg, seq_lens, head_tokens)


def decode_flops(cfg, prompt_len: int, new_tokens: int, rows: int) -> float:
    """FLOPs of KV-cache generation: a prefill of ``rows`` prompts of ``prompt_len`` tokens, then
    ``new_tokens`` single-token steps per row, step i attending to ``prompt_len + i`` positions."""
    n_layers, d, *_ = dims(cfg)
    n_mm, attn = 2 * matmul_params(cfg), 4 * n_layers * d
    prefill = forward_flops(cfg, [prompt_len] * rows)
    steps = sum(n_mm + attn * (prompt_len + i + 1) for i in range(new_tokens))
    return prefill + rows * float(steps)


def grpo_step_flops(cfg, prompt_lens: Sequence[int], group_size: int, response_len: int) -> dict[str, float]:
    """The useful FLOPs of GRPO over ``prompt_lens`` prompts, by phase: ``generate``, each prompt's
    ``group_size`` responses of ``response_len`` tokens prefilled and decoded, and ``update``, the
    training forward and backward over every prompt + response (the LM head on the response tokens:
    the log-probs GRPO needs). Old/reference log-prob passes and the KL monitor are not counted."""
    return {"generate": float(group_size * sum(decode_flops(cfg, p, response_len, 1) for p in prompt_lens)),
            "update": float(group_size * sum(train_flops(cfg, [p + response_len], head_tokens=response_len)
                                             for p in prompt_lens))}


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


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_rate(fn, work: float, dev: torch.device, inner: int, repeats: int) -> float:
    """``work`` per second of ``fn`` run ``inner`` times per timing: median over ``repeats`` timings
    after one untimed call (kernel choice, paging)."""
    fn()
    _sync(dev)
    times = []
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(dev)
        times.append((time.perf_counter() - t0) / inner)
    return work / statistics.median(times)


def _large_matmul_rate(dev: torch.device, dt: torch.dtype, size: int) -> float:
    """The product as the models' layers run it, ``F.linear`` (``a @ b.T``, the same FLOPs as
    ``a @ b``): on a CPU without bf16 units, ``torch.mm`` in bf16 takes a path several times slower
    than ``F.linear``'s oneDNN one, so a ``torch.mm`` peak would sit below the model's own rate."""
    a, b = (torch.randn(size, size, device=dev).to(dt) for _ in range(2))
    cuda = dev.type == "cuda"
    return _median_rate(lambda: torch.nn.functional.linear(a, b), 2.0 * size ** 3, dev, 10 if cuda else 1,
                        5 if cuda else 3)


def _large_copy_rate(dev: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src).fill_(0)  # both written first: no page faults while timing
    return _median_rate(lambda: dst.copy_(src), nbytes / 1e9, dev, 5 if dev.type == "cuda" else 1, 5)


@functools.cache
def _matmul_rate_cached(device: str, dtype: str, threads: int, size: int, tf32: bool) -> float:
    return _large_matmul_rate(torch.device(device), getattr(torch, dtype), size)


@functools.cache
def _copy_rate_cached(device: str, threads: int, nbytes: int) -> float:
    return _large_copy_rate(torch.device(device), nbytes)


def peak_size(device_type: str, dtype: str, cpu_flags: set[str]) -> int:
    """The device peak's square side: ``DEVICE_PEAK_SIZE`` of the device type, or
    ``EMULATED_PEAK_SIZE`` for a CPU dtype none of whose ``NATIVE_CPU_UNITS`` is in ``cpu_flags``.
    Decided from the CPU's features, not from the kernel level (oneDNN picks its own ISA)."""
    units = NATIVE_CPU_UNITS.get(dtype)
    if device_type == "cpu" and units and not set(units) & cpu_flags:
        return EMULATED_PEAK_SIZE
    return DEVICE_PEAK_SIZE.get(device_type, DEVICE_PEAK_SIZE["cpu"])


def _resolve(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def device_memcpy(device: str | torch.device = "cpu", nbytes: int | None = None) -> dict:
    """The device's copy rate: one large warm ``copy_`` (``DEVICE_MEMCPY_BYTES``, or ``nbytes``),
    GB/s = bytes copied / s / 1e9, on the caller's torch threads; cached per process like
    ``device_peak``. Returns ``{"device", "gbps", "bytes", "threads"}``."""
    dev = _resolve(device)
    nbytes = nbytes or DEVICE_MEMCPY_BYTES.get(dev.type, DEVICE_MEMCPY_BYTES["cpu"])
    threads = torch.get_num_threads()
    gbps = _copy_rate_cached(str(dev), threads, nbytes)
    return {"device": str(dev), "gbps": round(gbps, 3), "bytes": nbytes, "threads": threads}


def device_peak(device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32,
                size: int | None = None, memcpy_bytes: int | None = None) -> dict:
    """The device's own limits in ``dtype``: one large square matmul (``peak_size``: the device's
    ``DEVICE_PEAK_SIZE``, smaller for a dtype this CPU emulates; or ``size``) and one large warm
    ``copy_`` (``DEVICE_MEMCPY_BYTES``, GB/s = bytes copied / s).
    Measured once per process for each device, dtype, torch thread count and size (cached).

    Returns ``{"device", "device_name", "dtype", "tf32" (fp32 products on TF32 tensor cores),
    "tflops", "flops_per_s", "matmul_size", "memcpy_gbps", "memcpy_bytes", "threads"}``."""
    dev = _resolve(device)
    dtype = str(dtype).removeprefix("torch.")
    size = size or peak_size(dev.type, dtype, attention.cpu_flags() if dev.type == "cpu" else set())
    threads = torch.get_num_threads()
    tf32 = dev.type == "cuda" and dtype == "float32" and torch.backends.cuda.matmul.allow_tf32
    flops = _matmul_rate_cached(str(dev), dtype, threads, size, tf32)  # its operands are freed before the copy's
    copy = device_memcpy(dev, memcpy_bytes)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"device": str(dev), "device_name": name, "dtype": dtype, "tf32": tf32, "tflops": round(flops / 1e12, 6),
            "flops_per_s": flops, "matmul_size": size, "memcpy_gbps": copy["gbps"], "memcpy_bytes": copy["bytes"],
            "threads": threads}


def fraction(achieved: float, peak: float) -> float:
    """``achieved / peak`` rounded for a bench JSON (4 significant digits: a decode at 0.1% of a
    GPU's peak keeps its digits)."""
    return float(f"{achieved / peak:.4g}")


def peak_fields(achieved_flops_per_s: float, shape_peak: float, device: dict) -> dict:
    """The headline pair of a bench JSON: the achieved FLOP/s as a fraction of the shape peak and
    of the device peak (``device_peak``), with the device peak's numbers and ``PEAK_NOTE``."""
    return {"fraction_of_shape_peak": fraction(achieved_flops_per_s, shape_peak),
            "shape_peak_gflops": gflops(shape_peak),
            "fraction_of_device_peak": fraction(achieved_flops_per_s, device["flops_per_s"]),
            "device_peak_tflops": device["tflops"], "device_peak_dtype": device["dtype"],
            "device_peak_matmul_size": device["matmul_size"], "device_peak": device, "peak_note": PEAK_NOTE}


def gflops(x: float) -> float:
    return round(x / 1e9, 3)
