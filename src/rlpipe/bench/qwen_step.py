"""The Qwen2.5-Math-1.5B shape (seeds 001 and 004's policy) with random weights, for the benches that
measure the seed's scale without downloading it (``rlpipe.bench.seed_step``, ``rlpipe.bench.seed_shape``):

- ``QWEN_MATH_1_5B``: the published model's ``config.json`` shape, and ``qwen_config`` (with overrides,
  for a tiny model of the same kind: grouped-query attention, tied embeddings);
- ``build_policy``: ``Qwen2ForCausalLM`` with random weights on a device (or ``meta``: shapes only);
- ``hf_generate_s``: HF ``generate`` timed at a fixed length, the yardstick the generation engine
  is compared with.

The time and memory of a step do not depend on the weights' values, so random weights measure it.
(This module once projected a seed-scale step from one small measured batch; ``seed_step`` now
measures whole steps.)
"""

from __future__ import annotations

import time

import torch

#: Qwen2.5-Math-1.5B's shape (its published config.json), for a random-weight stand-in
QWEN_MATH_1_5B = {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                  "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu"}


def qwen_config(**overrides):
    """A ``transformers.Qwen2Config`` of ``QWEN_MATH_1_5B`` (with ``overrides``)."""
    from transformers import Qwen2Config

    return Qwen2Config(**{**QWEN_MATH_1_5B, **overrides})


def build_policy(cfg, device: torch.device | str, dtype: torch.dtype = torch.bfloat16):
    """``Qwen2ForCausalLM(cfg)`` with random weights, created on ``device`` in ``dtype`` (on
    ``meta``: shapes only, nothing allocated)."""
    from transformers import Qwen2ForCausalLM

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def hf_generate_s(model, device: torch.device, ids: torch.Tensor, tokens: int) -> float:
    """Seconds of HF ``generate`` sampling exactly ``tokens`` new tokens (EOS off) for every row of
    ``ids`` (B, P), after an untimed call of two tokens (temperature 1, top-p 1, the KV cache on)."""
    kw = {"attention_mask": torch.ones_like(ids), "do_sample": True, "temperature": 1.0, "top_p": 1.0,
          "pad_token_id": 0, "eos_token_id": None}
    use_cache, model.config.use_cache = model.config.use_cache, True
    try:
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
            t0 = _sync(device)
            out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
            t1 = _sync(device)
    finally:
        model.config.use_cache = use_cache
    if out.shape != (ids.shape[0], ids.shape[1] + tokens):
        raise RuntimeError(f"HF generate returned shape {tuple(out.shape)}, expected "
                           f"{(ids.shape[0], ids.shape[1] + tokens)}")
    return t1 - t0
