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
