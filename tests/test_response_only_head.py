"""The LM head on response tokens only (``rlpipe.lm.heads`` + ``response_only_log_probs``) against the
seeds' ``get_response_log_probs`` over every position: naive vs optimised, values and gradients."""

from __future__ import annotations

import pytest
import torch

from rlpipe.lm.heads import split_lm_head
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.policy import load_policy
from rlpipe.rl.logprobs import get_response_log_probs, pack_token_ids, response_only_log_probs

TOL = 1e-5  # measured: max |diff| 1e-6 on the values, 2e-7 on the gradients (float32, the head's matmul
# over N rows instead of B * T); the margin covers other CPU kernels (avx2/default/avx512)


def _batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (3, 7, 5, 2)]
    outputs = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (6, 1, 9, 4)]
    return pack_token_ids(prompts, outputs, pad_id=0)


def _tiny_lm() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(ModelConfig(vocab_size=64, context_length=32, num_layers=2, d_model=32, num_heads=4, d_ff=64))


def _compare(model, packed, temperature=0.8):
    ids, labels, mask = packed["input_ids"], packed["labels"], packed["response_mask"]
    full = get_response_log_probs(model, ids, labels, return_token_entropy=True, temperature=temperature)
    (full["log_probs"] * mask).sum().backward()
    g_full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    split = split_lm_head(model)
    assert split is not None
    out = response_only_log_probs(split.body, split.head, ids, labels, mask, return_token_entropy=True,
                                  temperature=temperature)
    out["log_probs"].sum().backward()
    g_split = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    assert torch.equal(out["log_probs"][~mask], torch.zeros(int((~mask).sum())))  # 0 off the response
    torch.testing.assert_close(out["log_probs"][mask], full["log_probs"][mask], atol=TOL, rtol=0)
    torch.testing.assert_close(out["token_entropy"][mask], full["token_entropy"][mask], atol=TOL, rtol=0)
    for a, b in zip(g_split, g_full, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_transformer_lm_split_matches_full_forward():
    _compare(_tiny_lm(), _batch(64))


@pytest.mark.parametrize("chunk", [1, 5])
def test_chunked_head_matches_full_forward(monkeypatch, chunk):
    """The head in chunks of ``chunk`` response tokens (recomputed in the backward pass): the same
    log-probs, entropy and gradients as the whole batch at once."""
    monkeypatch.setattr("rlpipe.rl.logprobs.HEAD_CHUNK_TOKENS", chunk)
    _compare(_tiny_lm(), _batch(64))


def test_hidden_states_then_head_is_forward():
    model = _tiny_lm()
    ids = _batch(64)["input_ids"]
    assert torch.equal(model.lm_head(model.hidden_states(ids)), model(ids))


def test_hf_llama_split_matches_full_forward(tiny_qwen):
    policy = load_policy(tiny_qwen)  # a Qwen2 directory: one of the plain-head HF architectures
    _compare(policy.model.train(), _batch(policy.tokenizer.vocab_size, seed=1))


def test_hf_architectures_outside_the_list_are_not_split(random_hf):
    model = load_policy(random_hf("gpt2")).model
    assert split_lm_head(model) is None
    assert split_lm_head(torch.nn.Linear(2, 2)) is None


def test_bad_mask_is_refused():
    model, packed = _tiny_lm(), _batch(64)
    split = split_lm_head(model)
    labels = packed["labels"].clone()
    labels[packed["response_mask"]] = -100
    with pytest.raises(ValueError, match="label is negative"):
        response_only_log_probs(split.body, split.head, packed["input_ids"], labels, packed["response_mask"])
    with pytest.raises(ValueError, match="one shape"):
        response_only_log_probs(split.body, split.head, packed["input_ids"], labels[:, 1:], packed["response_mask"])
