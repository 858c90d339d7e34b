"""The fast generation engine for HuggingFace Qwen2 and Llama policies (``decode="static"`` and
``"cudagraph"``, and ``"auto"`` on CUDA): a static KV cache, a fixed-shape decode step replayed from
a CUDA graph, and finished rows compacted into smaller batch buckets.

HF ``generate`` (and the sampler's eager ``_HFAdapter``) grows a dynamic cache and launches a few
hundred small kernels per token from Python, so at the seeds' scale decoding is launch-bound. Here,
as in gpt-fast and vLLM:

- **one KV arena per (rows, positions) shape**, allocated once and kept for the model's life
  (``HFArena``): per layer (N, Hkv, S, Dh) keys and values in the model's dtype, with S the prompt
  plus new tokens rounded up to ``S_BUCKET``;
- **prefill is one HF forward pass** over the left-padded prompts; its cache is copied into the arena
  (repeated ``n`` times for the samples of each prompt);
- **the decode step** (``decode_step``) runs the HF modules themselves (norms, projections, MLP,
  LM head) over the arena, with RoPE from the model's own rotary embedding and grouped-query
  attention through ``rlpipe.lm.attention.sdpa`` (the query heads of one KV head as that head's
  queries: no repeated K/V). The written position is a device tensor the step advances, so one
  recorded graph serves every position of a window (as ``rlpipe.lm.cuda_graph_decode``); attention
  reads the written positions rounded up to ``S_WINDOW``, not the whole arena (one graph per window);
- **batch buckets**: the step is captured once per power-of-two row count over views of the arena's
  first rows. When at most half of a bucket's rows are still active, the sampler's loop (at its
  periodic look, ``rlpipe.lm.decode_loop``) moves the active rows to the front and replays the
  smaller bucket's graph: a finished row costs at most one bucket's halving, and the tail of long
  answers runs at the tail's batch size.

Sampling, EOS, per-row caps and stop strings stay in the sampler's loop (on the device; stop strings
are looked at every ``ACTIVE_CHECK_EVERY`` steps, not per token). Without CUDA the same arena and
step run eagerly (``decode="static"``): that is what the CPU tests compare with HF ``generate``.
The step computes in the model's dtype (bf16 weights on CUDA: ``rlpipe.lm.policy.hf_dtype``) with
fp32 RoPE tables cast like transformers' own, so it agrees with the HF forward to float rounding.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from rlpipe.lm.attention import sdpa
from rlpipe.lm.cuda_graph_decode import WARMUP_STEPS, autocast_dtype, capture, graphs_available

SUPPORTED = ("qwen2", "llama")  # config.model_type values whose layers decode_step reproduces
S_BUCKET = 128  # arena positions are rounded up to a multiple of this (shared by nearby prompt lengths)
S_WINDOW = 256  # a step attends over the written positions rounded up to a multiple of this
MAX_ARENAS = 2  # arenas kept per model (rollouts and validation shapes); the oldest is dropped

_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {key: HFArena}


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``decode_step`` cannot run ``model`` (None when it can)."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED:
        return f"model_type {kind!r} is not one of {SUPPORTED}"
    if getattr(cfg, "use_sliding_window", False):
        return "the config uses sliding-window attention"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return f"{type(model).__name__} has no model.layers / model.rotary_emb"
    return None


def rope_table(model: nn.Module, S: int, device) -> tuple[Tensor, Tensor]:
    """(S, Dh) float32 cos and sin at positions 0..S-1 from the model's own rotary embedding
    (scaling variants and ``attention_scaling`` included)."""
    pos = torch.arange(S, device=device)[None]  # (1, S)
    probe = torch.zeros(1, dtype=torch.float32, device=device)
    cos, sin = model.model.rotary_emb(probe, pos)
    return cos[0].float().contiguous(), sin[0].float().contiguous()  # (S, Dh)


def _rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def decode_step(model: nn.Module, cos: Tensor, sin: Tensor, tok: Tensor, pos: Tensor, at: Tensor,
                keys: Tensor, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
    """One token per row through an HF Qwen2/Llama ``model`` over a static cache: logits (N, V).

    tok, pos: (N,) fed tokens and RoPE positions; at: (1,) long, the cache position written;
    keys: (N, S) bool, True where a row may attend (``at`` included); ks, vs: per layer
    (N, Hkv, S, Dh), written in place at ``at``.
    """
    cfg, inner = model.config, model.model
    N = tok.shape[0]
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    mask = keys[:, None, None, :]  # (N, 1, 1, S)
    x = inner.embed_tokens(tok[:, None])  # (N, 1, D)
    c, s = cos[pos][:, None, None].to(x.dtype), sin[pos][:, None, None].to(x.dtype)  # (N, 1, 1, Dh)
    for i, layer in enumerate(inner.layers):
        attn, h = layer.self_attn, layer.input_layernorm(x)
        q = attn.q_proj(h).view(N, Hq, 1, Dh)  # (N, Hq, 1, Dh)
        k = attn.k_proj(h).view(N, Hkv, 1, Dh)
        v = attn.v_proj(h).view(N, Hkv, 1, Dh)
        q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
        ks[i].index_copy_(2, at, k.to(ks[i].dtype))
        vs[i].index_copy_(2, at, v.to(vs[i].dtype))
        # grouped-query attention: the Hq/Hkv query heads of each KV head are that head's queries
        out = sdpa(q.view(N, Hkv, Hq // Hkv, Dh), ks[i].to(q.dtype), vs[i].to(q.dtype), attn_mask=mask)
        x = x + attn.o_proj(out.reshape(N, 1, Hq * Dh))  # (N, 1, D)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(inner.norm(x))[:, -1]  # (N, V)


def bucket(m: int) -> int:
    """The batch bucket for ``m`` rows: the next power of two."""
    return 1 << max(0, m - 1).bit_length()


class HFArena:
    """A model's static decode buffers for up to ``Ncap`` rows and ``S`` positions, and one step
    (eager, or a CUDA graph) per batch bucket and attention window over views of their first rows
    and positions."""

    def __init__(self, model: nn.Module, Ncap: int, S: int, device: torch.device, use_graphs: bool):
        cfg = model.config
        Hkv, Hq = cfg.num_key_value_heads, cfg.num_attention_heads
        Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
        dtype = next(model.parameters()).dtype
        self._model = weakref.ref(model)
        self.Ncap, self.S, self.use_graphs = Ncap, S, use_graphs
        self.ks = [torch.zeros(Ncap, Hkv, S, Dh, dtype=dtype, device=device) for _ in model.model.layers]
        self.vs = [torch.zeros_like(k) for k in self.ks]
        self.tok = torch.zeros(Ncap, dtype=torch.long, device=device)  # (Ncap,)
        self.pos = torch.zeros(Ncap, dtype=torch.long, device=device)  # (Ncap,)
        self.at = torch.zeros(1, dtype=torch.long, device=device)  # (1,) the cache position written next
        self.keys = torch.zeros(Ncap, S, dtype=torch.bool, device=device)  # (Ncap, S)
        self.cos, self.sin = rope_table(model, S, device)
        self.steps: dict[tuple, tuple] = {}  # (rows, autocast dtype) -> (replay, logits buffer)
        self.pool = None
        self.fingerprint = _fingerprint(model)

    def run(self, b: int, w: int) -> Tensor:
        """One step over the first ``b`` rows and ``w`` positions: mark ``at`` visible, decode, advance
        ``at``. Attention reads only the window's ``w`` positions (``at`` lies inside it)."""
        self.keys[:b].index_fill_(1, self.at, True)
        logits = decode_step(self._model(), self.cos, self.sin, self.tok[:b], self.pos[:b], self.at,
                             self.keys[:b, :w], [k[:b, :, :w] for k in self.ks], [v[:b, :, :w] for v in self.vs])
        self.at.add_(1)
        return logits  # (b, V)

    def window(self, at: int) -> int:
        """The positions a step writing ``at`` attends over: a multiple of ``S_WINDOW`` with room for
        the capture's warm-up writes, at most the arena's."""
        return min(self.S, -(-(at + WARMUP_STEPS + 1) // S_WINDOW) * S_WINDOW)

    def step(self, b: int, at: int, tok: Tensor, pos: Tensor) -> Tensor:
        """One step over ``b`` rows writing position ``at`` (the host's count: no device read)."""
        self.tok[:b].copy_(tok)
        self.pos[:b].copy_(pos)
        w = self.window(at)
        key = (b, w, autocast_dtype(self.at.device))
        entry = self.steps.get(key)
        if entry is None:
            if self.use_graphs:
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                graph, out = capture(lambda: self.run(b, w), self.pool, key[2], self.at.device)
                self._undo_warmup(b, at)
                entry = (graph.replay, out)
            else:
                entry = (None, None)
            self.steps[key] = entry
        replay, out = entry
        if replay is None:
            return self.run(b, w)
        replay()
        return out  # (b, V), overwritten by the next step

    def _undo_warmup(self, b: int, at: int) -> None:
        """Capture's warm-up runs wrote the cache from ``at`` on and advanced it. Every position past
        ``at`` was still unwritten (zero, masked), so this puts the arena back as it was."""
        span = slice(at, at + WARMUP_STEPS + 1)
        self.at.fill_(at)
        self.keys[:b, span] = False
        for buf in (*self.ks, *self.vs):
            buf[:b, :, span].zero_()

    def load(self, layer_kv: list[tuple[Tensor, Tensor]], keys: Tensor, n: int) -> None:
        """Copy a prefilled cache ((B, Hkv, P, Dh) per layer, repeated ``n`` times) and its (N, S) key
        mask in; positions past the prompt are zeroed (masked, but 0 * a stale NaN would poison a row)."""
        N, P = keys.shape[0], layer_kv[0][0].shape[2]
        for (k, v), dk, dv in zip(layer_kv, self.ks, self.vs, strict=True):
            dk[:N, :, :P].copy_(k.repeat_interleave(n, dim=0))
            dv[:N, :, :P].copy_(v.repeat_interleave(n, dim=0))
            dk[:N, :, P:].zero_()
            dv[:N, :, P:].zero_()
        self.keys[:N].copy_(keys)
        self.at.fill_(P)

    def select(self, idx: Tensor) -> None:
        """Move rows ``idx`` (b,) to the front of every per-row buffer (the next steps run bucket b)."""
        b = idx.shape[0]
        for buf in (*self.ks, *self.vs, self.keys):
            buf[:b].copy_(buf.index_select(0, idx))


def _fingerprint(model: nn.Module) -> tuple:
    return tuple(p.data_ptr() for p in model.parameters())


def arena_for(model: nn.Module, N: int, total: int, device: torch.device, use_graphs: bool) -> HFArena:
    """The model's arena for N rows and ``total`` positions (rows rounded to a bucket, positions to
    ``S_BUCKET``, at most the model's context); built on first use, rebuilt when the parameters moved."""
    limit = getattr(model.config, "max_position_embeddings", None) or total
    need = total + WARMUP_STEPS + 1  # a capture's warm-up steps write past the last real position
    S = min(-(-need // S_BUCKET) * S_BUCKET, max(limit, need))
    arenas = _ARENAS.setdefault(model, {})
    key = (bucket(N), S, str(device), use_graphs)
    arena = arenas.get(key)
    if arena is not None and arena.fingerprint != _fingerprint(model):
        arenas.clear()
        arena = None
    if arena is None:
        while len(arenas) >= MAX_ARENAS:
            arenas.pop(next(iter(arenas)))
        arena = arenas[key] = HFArena(model, bucket(N), S, device, use_graphs)
    else:
        arenas[key] = arenas.pop(key)  # most recently used last
    return arena


class HFStaticAdapter:
    """The sampler's adapter (``prefill``/``step``/``select``) over an ``HFArena``. ``compacts`` with
    ``width``: the loop pads a compaction to ``width(active rows)`` rows (a bucket)."""

    compacts = True

    def __init__(self, model: nn.Module, use_graphs: bool):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"decode 'static'/'cudagraph' for an HF policy: {reason}; use decode 'eager'")
        self.model, self.use_graphs = model, use_graphs
        self.max_length = getattr(model.config, "max_position_embeddings", None)

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor, total: int, n: int) -> Tensor:
        from transformers import DynamicCache

        out = self.model(input_ids=ids, attention_mask=mask.long(), position_ids=pos,
                         past_key_values=DynamicCache(config=self.model.config), use_cache=True, logits_to_keep=1)
        N = ids.shape[0] * n
        use_graphs = self.use_graphs and graphs_available(ids.device)
        self.arena = arena_for(self.model, N, total, ids.device, use_graphs)
        keys = torch.zeros(N, self.arena.S, dtype=torch.bool, device=ids.device)  # (N, S)
        keys[:, : ids.shape[1]] = mask.repeat_interleave(n, dim=0)
        self.arena.load([(layer.keys, layer.values) for layer in out.past_key_values.layers], keys, n)
        self.rows, self.L = N, ids.shape[1]  # L: the position the next step writes (host-side)
        return out.logits[:, -1].repeat_interleave(n, dim=0)  # (N, V)

    def width(self, m: int) -> int:
        return min(bucket(m), self.rows)

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        logits = self.arena.step(self.rows, self.L, tok, pos)  # (rows, V)
        self.L += 1
        return logits

    def select(self, idx: Tensor) -> None:
        self.arena.select(idx)
        self.rows = idx.shape[0]
