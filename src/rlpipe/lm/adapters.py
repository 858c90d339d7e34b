"""The sampler's adapters: how ``rlpipe.lm.sampler.generate`` prefills and steps each kind of model.

An adapter has ``prefill(ids, mask, pos, total, n) -> (N, V)`` logits of the last prompt token
(the prefilled cache repeated ``n`` times, prompt-major), ``step(tok, pos) -> (n_cur, V)`` logits of
one fed token per row, ``select(idx)`` to keep rows ``idx`` and ``max_length``. Optional:
``compacts`` (False: static shapes to the end) and ``width(m)`` (the rows a compaction to ``m``
active rows keeps: a batch bucket). Which adapter ``generate(decode=...)`` gets (``make_adapter``):

- our ``TransformerLM``: eager ``OwnAdapter`` (a growing cache, compaction); static, compiled, aot:
  ``rlpipe.lm.static_decode``; cudagraph: ``rlpipe.lm.cuda_graph_decode``;
- HF Qwen2 / Llama: eager ``HFAdapter`` (HF's dynamic cache); static (eagerly) and cudagraph:
  ``rlpipe.lm.hf_decode``; other HF architectures: eager only.

``use_kv_cache=False`` gives ``NaiveAdapter``: the whole sequence recomputed every step (the tests'
and the benchmark's reference).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlpipe.lm import decode_package, hf_decode
from rlpipe.lm.cuda_graph_decode import CudaGraphDecodeAdapter, resolve_decode
from rlpipe.lm.model import TransformerLM
from rlpipe.lm.static_decode import StaticDecodeAdapter


class OwnAdapter:
    """``TransformerLM`` with our preallocated ``KVCache``."""

    def __init__(self, model: TransformerLM):
        self.model, self.max_length = model, model.config.context_length

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor, total: int, n: int) -> Tensor:
        self.padded = not bool(mask.all())
        self.cache = self.model.new_kv_cache(total)
        key_mask = mask if self.padded else None
        logits = self.model(ids, positions=pos, attention_mask=key_mask, kv_cache=self.cache, logits_to_keep=1)
        logits = logits[:, -1]  # (B, V)
        self.cache.repeat_interleave(n)
        if self.padded:  # keys: prompt mask, then every generated position is a real token
            self.keys = torch.ones(ids.shape[0] * n, total, dtype=torch.bool, device=ids.device)
            self.keys[:, : ids.shape[1]] = mask.repeat_interleave(n, dim=0)
        return logits.repeat_interleave(n, dim=0)  # (N, V)

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        L = self.cache.length
        if not self.padded:  # every row sits at the same position: the default positions are right
            return self.model(tok[:, None], kv_cache=self.cache)[:, -1]
        return self.model(
            tok[:, None], positions=pos[:, None], attention_mask=self.keys[:, : L + 1], kv_cache=self.cache
        )[:, -1]  # (N, V)

    def select(self, idx: Tensor) -> None:
        self.cache.select_rows(idx)
        if self.padded:
            self.keys = self.keys.index_select(0, idx)


class HFAdapter:
    """A transformers ``*ForCausalLM`` with its own ``past_key_values``."""

    def __init__(self, model):
        self.model = model
        self.max_length = getattr(model.config, "max_position_embeddings", None)

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor, total: int, n: int) -> Tensor:
        from transformers import DynamicCache

        out = self.model(
            input_ids=ids, attention_mask=mask.long(), position_ids=pos,
            past_key_values=DynamicCache(config=self.model.config), use_cache=True, logits_to_keep=1,
        )
        self.cache, self.L = out.past_key_values, ids.shape[1]
        self.cache.batch_repeat_interleave(n)
        self.attn = torch.ones(ids.shape[0] * n, total, dtype=torch.long, device=ids.device)
        self.attn[:, : ids.shape[1]] = mask.repeat_interleave(n, dim=0)
        return out.logits[:, -1].repeat_interleave(n, dim=0)  # (N, V)

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        self.L += 1
        out = self.model(
            input_ids=tok[:, None], attention_mask=self.attn[:, : self.L], position_ids=pos[:, None],
            past_key_values=self.cache, use_cache=True,
        )
        return out.logits[:, -1]  # (N, V)

    def select(self, idx: Tensor) -> None:
        self.cache.batch_select_indices(idx)
        self.attn = self.attn.index_select(0, idx)


class NaiveAdapter:
    """No cache: every step re-runs the whole (left-padded) sequence. Reference and baseline."""

    def __init__(self, model):
        self.model = model
        self.own = isinstance(model, TransformerLM)
        self.max_length = make_adapter(model, True).max_length

    def _last_logits(self) -> Tensor:
        ids, pos, mask = (t[:, : self.L] for t in (self.seq, self.pos, self.keys))
        if self.own:
            return self.model(ids, positions=pos, attention_mask=mask, logits_to_keep=1)[:, -1]
        out = self.model(
            input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False, logits_to_keep=1
        )
        return out.logits[:, -1]

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor, total: int, n: int) -> Tensor:
        N, P = ids.shape[0] * n, ids.shape[1]
        self.seq = ids.new_zeros(N, total)
        self.pos = ids.new_zeros(N, total)
        self.keys = torch.ones(N, total, dtype=torch.bool, device=ids.device)
        for buf, val in ((self.seq, ids), (self.pos, pos), (self.keys, mask)):
            buf[:, :P] = val.repeat_interleave(n, dim=0)
        self.L = P
        return self._last_logits()  # (N, V)

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        self.seq[:, self.L], self.pos[:, self.L] = tok, pos
        self.L += 1
        return self._last_logits()

    def select(self, idx: Tensor) -> None:
        self.seq, self.pos, self.keys = (t.index_select(0, idx) for t in (self.seq, self.pos, self.keys))


# generate(decode=...): rlpipe.lm.static_decode, decode_package, cuda_graph_decode, hf_decode
DECODES = ("auto", "eager", "static", "compiled", "aot", "cudagraph")
HF_DECODES = ("eager", "static", "cudagraph")


def is_hf_causal_lm(model) -> bool:
    base = getattr(model, "_orig_mod", model)
    return not isinstance(base, TransformerLM) and hasattr(base, "config") and hasattr(base, "get_output_embeddings")


def resolve(decode: str, model, device: torch.device) -> str:
    """``auto``: ``cudagraph`` on a CUDA device for our model and for HF models the engine runs
    (``rlpipe.lm.hf_decode``), ``eager`` otherwise; other names unchanged."""
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    decode = resolve_decode(decode, device)
    base = getattr(model, "_orig_mod", model)
    if decode == "cudagraph" and is_hf_causal_lm(base) and hf_decode.unsupported_reason(base) is not None:
        return "eager"  # auto on CUDA for an architecture the engine does not cover
    return decode


def make_adapter(model, use_kv_cache: bool, decode: str = "eager"):
    base = getattr(model, "_orig_mod", model)
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    if not use_kv_cache:
        return NaiveAdapter(model)
    if isinstance(base, TransformerLM):
        if decode == "aot":
            return StaticDecodeAdapter(base, step_fn=decode_package.load(base).step)
        if decode == "cudagraph":
            return CudaGraphDecodeAdapter(base)
        if decode != "eager":
            return StaticDecodeAdapter(base, compiled=decode == "compiled")
        return OwnAdapter(model)
    if is_hf_causal_lm(base):
        if decode not in HF_DECODES:
            raise ValueError(f"decode {decode!r} runs our TransformerLM only; an HF policy ({type(base).__name__}) "
                             f"decodes with one of {HF_DECODES} or 'auto'")
        if decode == "eager":
            return HFAdapter(model)
        return hf_decode.HFStaticAdapter(base, use_graphs=decode == "cudagraph")
    raise TypeError(
        f"generate() drives a TransformerLM or a transformers CausalLM, got {type(model).__name__}"
    )
