"""The fixed-shape decode step (``rlpipe.lm.static_decode``), eager and compiled, against the eager
sampler: the same tokens, and log-probs within float rounding (naive vs optimised)."""

from __future__ import annotations

import pytest
import torch

from rlpipe.lm.policy import load_policy
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.lm.static_decode import BUCKET, StaticDecodeAdapter

# Measured on the session's micro model (float32, 4 CPU kernels sets): max |log-prob diff| 5e-6
# (RoPE through real cos/sin instead of a complex64 product). A token differs only where a row's
# uniform lands within that distance of a CDF step, which these fixed seeds do not hit.
LOGPROB_TOL = 1e-4

PROMPTS = ["Write a story that includes the word: cat\n", "Write a story", "The dog"]  # uneven: left padding


def _sample(policy, decode: str, **kw):
    params = SamplingParams(n=3, temperature=0.9, max_tokens=12, seed=7, **kw)
    return generate(policy.model, policy.tokenizer, PROMPTS, params, decode=decode)


def _assert_same(a, b):
    assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
    assert a.response_text == b.response_text
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(x, y, atol=LOGPROB_TOL, rtol=0)


@pytest.fixture(scope="module")
def policy(tiny_base):
    return load_policy(tiny_base[0])


def test_static_step_samples_what_the_eager_sampler_samples(policy):
    _assert_same(_sample(policy, "static"), _sample(policy, "eager"))


def test_static_step_with_stop_strings_and_min_tokens(policy):
    kw = dict(stop=("was",), include_stop_str_in_output=True, min_tokens=2)
    _assert_same(_sample(policy, "static", **kw), _sample(policy, "eager", **kw))


def test_compiled_step_samples_what_the_eager_sampler_samples(policy):
    pytest.importorskip("torch._inductor")
    eager = _sample(policy, "eager")
    _assert_same(_sample(policy, "compiled"), eager)
    _assert_same(_sample(policy, "compiled"), eager)  # the cached graph, called again


def test_cache_length_is_bucketed(policy):
    adapter = StaticDecodeAdapter(policy.model, compiled=False)
    ids = torch.ones(2, 5, dtype=torch.long)
    adapter.prefill(ids, torch.ones(2, 5, dtype=torch.bool), torch.arange(5).expand(2, 5), total=5 + 11, n=2)
    assert adapter.keys.shape == (4, BUCKET) and adapter.cache.k[0].shape[2] == BUCKET


def test_unknown_decode_is_refused(policy):
    with pytest.raises(ValueError, match="decode must be one of"):
        _sample(policy, "fast")
