"""The fixed-shape decode step (``rlpipe.lm.static_decode``), eager and compiled, against the eager
model: its recorded log-probs equal a full forward's over the same tokens within float rounding
(naive vs optimised)."""

from __future__ import annotations

import pytest
import torch

from rlpipe.lm.policy import load_policy
from rlpipe.lm.static_decode import BUCKET, StaticDecodeAdapter

# Largest |recorded - teacher-forced| log-prob (tests/kernel_tolerance.py; ``decode_check``) of the
# session's micro model, static and compiled decodes, 5 seeds x 32 rows x 40 tokens: 1.9e-6 natively (AVX-512) and with
# ATEN_CPU_CAPABILITY=avx2, 2.9e-6 with =default; the tolerance is 35x the largest. Tokens are never
# compared with the eager sampler's (another kernel: a draw near a CDF step may differ on another CPU).
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def policy(tiny_base):
    return load_policy(tiny_base[0])


def test_static_step_samples_what_the_eager_sampler_samples(policy, decode_check):
    decode_check.against_eager(policy, "static", LOGPROB_TOL)


def test_static_step_with_stop_strings_and_min_tokens(policy, decode_check):
    kw = dict(stop=("was",), include_stop_str_in_output=True, min_tokens=2)
    decode_check.against_eager(policy, "static", LOGPROB_TOL, **kw)


def test_compiled_step_samples_what_the_eager_sampler_samples(policy, decode_check):
    pytest.importorskip("torch._inductor")
    decode_check.against_eager(policy, "compiled", LOGPROB_TOL)  # calls the cached graph a second time


def test_cache_length_is_bucketed(policy):
    adapter = StaticDecodeAdapter(policy.model, compiled=False)
    ids = torch.ones(2, 5, dtype=torch.long)
    adapter.prefill(ids, torch.ones(2, 5, dtype=torch.bool), torch.arange(5).expand(2, 5), total=5 + 11, n=2)
    assert adapter.keys.shape == (4, BUCKET) and adapter.cache.k[0].shape[2] == BUCKET


def test_unknown_decode_is_refused(policy, decode_check):
    with pytest.raises(ValueError, match="decode must be one of"):
        decode_check.sample(policy, "fast")


BF16_DECODE = """
import sys, torch
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.static_decode import StaticDecodeAdapter
torch.manual_seed(0)
model = TransformerLM(ModelConfig.from_preset("cpu-tiny", vocab_size=64, num_layers=2, d_model=32, num_heads=2,
                                              d_ff=64, context_length=64))
ids, mask = torch.randint(0, 64, (2, 5)), torch.ones(2, 5, dtype=torch.bool)
pos = torch.arange(5).expand(2, 5)
out = []
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    for compiled in (False, True):
        a = StaticDecodeAdapter(model, compiled=compiled)
        a.prefill(ids, mask, pos, total=8, n=1)
        out.append(torch.stack([a.step(torch.tensor([1, 2]), torch.tensor([5 + i, 5 + i])).float() for i in range(2)]))
print(torch.backends.cpu.get_cpu_capability(), float((out[0] - out[1]).abs().max()))
"""


def test_compiled_step_under_bf16_autocast_runs_at_the_portable_level():
    """torch inductor cannot build a CPU bf16 kernel at ATEN_CPU_CAPABILITY=default (no vector ISA:
    its C++ does not compile); there the compiled decode runs the same step eagerly, so a bf16 run on
    the portable kernels samples instead of failing, and its logits are the eager step's exactly."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", BF16_DECODE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    level, gap = proc.stdout.split()
    assert level == "DEFAULT" and float(gap) == 0.0
    assert "runs the static step eagerly under CPU autocast" in proc.stderr
