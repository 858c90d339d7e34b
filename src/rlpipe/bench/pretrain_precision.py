"""``rlpipe bench pretrain-precision``: one pretraining step in fp32 against the same step under
bf16 autocast, on this machine's CPU (or ``--device cuda``), measured side by side.

Why it exists: ``pretrain.dtype: auto`` pretrains in fp32 on CPU. A CPU without bf16 units (no
AVX512-BF16, no AMX) emulates bf16 matmuls, and this bench prints how much slower that makes a step
here. Both precisions step the same model on the same batch, alternating (fp32, bf16, fp32, ...)
after one warm-up step each, so a change of load hits both. The result is one JSON line:
``bf16_over_fp32`` is the ratio of the median step times, with each precision's min/median/max, the
CPU's bf16 flags and the 1-minute load average before and after. The fp32 step's FLOP/s (3x the
forward, ``rlpipe.bench.flops``) is also given as a fraction of the shape and device peaks, and the
bf16 step's as a fraction of the bf16 device peak, measured after the steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from rlpipe.bench import emit
from rlpipe.bench.flops import device_peak, fraction, matmul_peak, peak_fields, train_flops
from rlpipe.lm import attention
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.pretrain import lm_loss

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _step(model: TransformerLM, opt: torch.optim.Optimizer, x: torch.Tensor, dtype: str) -> float:
    """One optimizer step of next-token loss on ``x`` (B, T + 1) in ``dtype``; its wall time in s."""
    device = x.device
    t0 = time.perf_counter()
    loss = lm_loss(model, x[:, :-1], x[:, 1:], device, dtype)  # pretraining's own loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _summary(times: list[float]) -> dict:
    return {"min_s": round(min(times), 4), "median_s": round(statistics.median(times), 4),
            "max_s": round(max(times), 4), "steps": len(times)}


def run_bench(preset: str, vocab: int, batch: int, seq_len: int, repeats: int, device: str) -> dict:
    """Alternate fp32 and bf16 steps of one ``preset`` model; the ratio of their median times."""
    dev = torch.device(device)
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig.from_preset(preset, vocab_size=vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, vocab, (batch, seq_len + 1), device=dev)  # (B, T + 1)
    load_start = os.getloadavg()[0]
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for dtype in times:
        _step(model, opt, x, dtype)  # warm-up
    for _ in range(repeats):
        for dtype in times:
            times[dtype].append(_step(model, opt, x, dtype))
    fp32, bf16 = (statistics.median(times[d]) for d in ("float32", "bfloat16"))
    flags = sorted(attention.cpu_flags() & set(BF16_FLAGS))
    work = train_flops(model.config, [seq_len] * batch)
    shape = matmul_peak(device=dev)["flops_per_s"]
    peaks = peak_fields(work / fp32, shape, device_peak(dev, torch.float32))
    bf16_peak = device_peak(dev, torch.bfloat16)
    return {**peaks, "bfloat16_fraction_of_device_peak": fraction(work / bf16, bf16_peak["flops_per_s"]),
            "bfloat16_device_peak": bf16_peak, "step_gflop": round(work / 1e9, 3),
            "bench": "pretrain_precision", "device": str(dev), "preset": preset, "vocab_size": vocab,
            "batch": batch, "seq_len": seq_len, "threads": torch.get_num_threads(),
            "cpu_bf16_flags": flags, "kernel_level": torch.backends.cpu.get_cpu_capability(),
            "float32": _summary(times["float32"]), "bfloat16": _summary(times["bfloat16"]),
            "bf16_over_fp32": round(bf16 / fp32, 3),
            "load_avg_1m_start": round(load_start, 2), "load_avg_1m_end": round(os.getloadavg()[0], 2)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="rlpipe bench pretrain-precision", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu-tiny", help="the model preset (pretraining's model.preset)")
    ap.add_argument("--vocab", type=int, default=2048, help="vocabulary size (the trained tokenizer's)")
    ap.add_argument("--batch", type=int, default=32, help="sequences per step (pretrain.batch_size)")
    ap.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (pretrain.seq_len)")
    ap.add_argument("--repeats", type=int, default=4, help="timed steps of each precision")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (pretrain.threads)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--out", default=None, help="also write the JSON line here (atomically)")
    args = ap.parse_args(argv)
    for name in ("vocab", "batch", "seq_len", "repeats", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: CUDA is not available here (torch {torch.__version__})")
    torch.set_num_threads(args.threads)
    result = run_bench(args.preset, args.vocab, args.batch, args.seq_len, args.repeats, args.device)
    emit(result, args.out)
    return result
