"""Run bf16 attention forward and backward through rlpipe's routing at this process's CPU kernel
level, and print, as JSON, the largest difference from fp32 at each sequence length.

    ATEN_CPU_CAPABILITY=default python tests/attention_probe.py

The shapes are those of the torch failure this routing avoids: causal attention at (2, 4, T, 16) for
T = 8 (short enough that torch's CPU flash kernel never packs for AMX), 64 and 128 (where it does), and
the pretraining loss of a tiny TransformerLM under bf16 autocast (``lm_loss``, where the failure was
first seen). ``tests/test_attention_routing.py`` runs it at each level the machine allows.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from rlpipe.lm import attention
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.pretrain import lm_loss

LENGTHS = (8, 64, 128)


def attention_gaps(T: int, seed: int) -> dict[str, float]:
    """Max |bf16 - fp32| of the output and of each input's gradient, relative to the fp32 max."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 4, T, 16, generator=g) for _ in range(3))  # (B, H, T, Dh)
    grad = torch.randn(2, 4, T, 16, generator=g)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = attention.sdpa(*leaves, is_causal=True)  # (B, H, T, Dh)
        out.backward(grad.to(dtype))
        results[dtype] = [out.float(), *(t.grad.float() for t in leaves)]
    names = ("out", "dq", "dk", "dv")
    return {n: float((a - b).abs().max() / b.abs().max()) for n, a, b in
            zip(names, results[torch.bfloat16], results[torch.float32], strict=True)}


def lm_loss_gap(seed: int) -> float:
    """|bf16 loss - fp32 loss| of a tiny model on random tokens: ``lm_loss`` (bf16 autocast, with a
    backward pass) against the same forward without autocast."""
    torch.manual_seed(seed)
    model = TransformerLM(ModelConfig.from_preset("cpu-tiny", vocab_size=64, num_layers=2, d_model=64,
                                                  num_heads=4, d_ff=128, context_length=128))
    x = torch.randint(0, 64, (2, 129))  # (B, T + 1)
    loss = lm_loss(model, x[:, :-1], x[:, 1:], torch.device("cpu"), "bfloat16")
    loss.backward()
    reference = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    return abs(float(loss) - float(reference))


def main() -> None:
    torch.set_num_threads(1)
    report = {"level": torch.backends.cpu.get_cpu_capability(), "flags": sorted(attention.cpu_flags()),
              "routed": sorted(str(d) for d in attention.math_dtypes()),
              "attention": {T: attention_gaps(T, seed=T) for T in LENGTHS}, "lm_loss": lm_loss_gap(0)}
    report["flags"] = [f for f in report["flags"] if f.startswith(("amx", "avx512"))]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
