"""The HW1 decoder-only Transformer language model (``TransformerLM``), its config and presets.

Architecture (seed 000 asks for "your LM implementation from HW1"): token embedding, ``num_layers``
pre-norm blocks ``x + attn(RMSNorm(x))`` then ``x + SwiGLU(RMSNorm(x))``, a final RMSNorm and an
**untied** LM head (HW1 keeps ``token_embeddings`` and ``lm_head`` separate; the ``assignment``
preset's parameter count below assumes that). Linear layers have no biases, RoPE rotates adjacent
pairs ``(x[2i], x[2i+1])`` of each head, SwiGLU is ``w2(silu(w1 x) * w3 x)``, initialisation is
HW1's truncated normal. Parameter names follow HW1 (``layers.{i}.attn.q_proj.weight`` ...), so a
HW1 state dict loads directly.

Departures from HW1, and why:
- ``forward`` takes optional per-row ``positions`` (left-padded prompts start RoPE at 0 in every
  row), a key-padding ``attention_mask`` and a preallocated ``KVCache`` filled in place, because
  the sampler (the hot path of every GRPO step) needs all three; ``logits_to_keep`` (HF's name)
  skips the LM head on positions whose logits nobody reads.
- Attention is ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels) instead of a
  hand-written softmax, called through ``rlpipe.lm.attention.sdpa`` (the math backend where a CPU's
  bf16 flash kernel would raise); RMSNorm and RoPE compute in fp32 and cast back, so ``torch.autocast``
  (bf16 on GPU) from the caller's side keeps the numerically sensitive parts in fp32. The softmax
  inside SDPA accumulates in fp32 on every backend. Logits come out in the autocast dtype:
  consumers (sampler, GRPO log-probs) call ``.float()`` before any softmax.
- ``gradient_checkpointing_enable()`` (HF's name, so the trainer treats both backends alike) makes
  training forwards recompute each block's activations in the backward pass
  (``torch.utils.checkpoint``, non-reentrant): less activation memory for ~30% more update time.
  Forwards without gradients or with a KV cache never checkpoint.
- The RoPE table is not a registered buffer: it is built in fp32/complex64 per device on first use,
  so ``model.to(torch.bfloat16)`` cannot silently truncate it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from rlpipe.lm.attention import sdpa
from rlpipe.lm.model_config import PRESETS as PRESETS  # re-exported: the presets live without torch
from rlpipe.lm.model_config import ModelConfig as ModelConfig

_RMS_EPS = 1e-5


def _trunc_normal_(w: Tensor, std: float) -> Tensor:
    return nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)


class Linear(nn.Linear):
    """Bias-free linear with HW1's init: N(0, 2/(d_in+d_out)) truncated at 3 sigma."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__(d_in, d_out, bias=False)

    def reset_parameters(self) -> None:
        _trunc_normal_(self.weight, math.sqrt(2.0 / (self.in_features + self.out_features)))


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * g`` computed in fp32, returned in the input dtype."""

    def __init__(self, d_model: int, eps: float = _RMS_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def rope_table(head_dim: int, context_length: int, theta: float, device) -> Tensor:
    """(context_length, head_dim/2) complex64: ``exp(i * pos * theta^(-2k/head_dim))``."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.arange(context_length, dtype=torch.float64, device=device)[:, None] * inv_freq
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x: Tensor, rot: Tensor) -> Tensor:
    """Rotate adjacent pairs of ``x`` (B, T, H, Dh) by ``rot`` (B, T, 1, Dh/2) complex; fp32 math."""
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # (B, T, H, Dh/2)
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)  # (B, T, H, Dh)


class KVCache:
    """Per-layer K/V buffers (B, H, max_length, Dh), allocated once and filled in place.

    All rows share one fill level ``length`` (prompts are left-padded, so padding lives in the
    key mask, not in ragged lengths). Buffers are allocated on the first write so they take the
    dtype the layers produce (bf16 under autocast, fp32 otherwise).
    """

    def __init__(self, num_layers: int, max_length: int):
        self.max_length = max_length
        self.length = 0
        self.k: list[Tensor | None] = [None] * num_layers
        self.v: list[Tensor | None] = [None] * num_layers

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, H, T, Dh) at [length, length+T); return views over [0, length+T)."""
        if self.k[layer] is None:
            shape = (k.shape[0], k.shape[1], self.max_length, k.shape[3])
            self.k[layer] = k.new_empty(shape)
            self.v[layer] = v.new_empty(shape)
        end = self.length + k.shape[2]
        self.k[layer][:, :, self.length : end].copy_(k)
        self.v[layer][:, :, self.length : end].copy_(v)
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def _map(self, fn) -> None:
        self.k = [None if t is None else fn(t) for t in self.k]
        self.v = [None if t is None else fn(t) for t in self.v]

    def repeat_interleave(self, n: int) -> None:
        """Row i becomes rows i*n .. i*n+n-1 (prefill once per prompt, decode n samples)."""
        if n != 1:
            self._map(lambda t: t.repeat_interleave(n, dim=0))

    def select_rows(self, idx: Tensor) -> None:
        """Keep only rows ``idx`` (drop finished sequences)."""
        self._map(lambda t: t.index_select(0, idx))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (Linear(d, d) for _ in range(4))

    def forward(self, x, rot, mask, is_causal, cache: KVCache | None, layer: int) -> Tensor:
        B, T, _ = x.shape
        shape = (B, T, self.num_heads, self.head_dim)
        q = apply_rope(self.q_proj(x).view(shape), rot).transpose(1, 2)  # (B, H, T, Dh)
        k = apply_rope(self.k_proj(x).view(shape), rot).transpose(1, 2)  # (B, H, T, Dh)
        v = self.v_proj(x).view(shape).transpose(1, 2)  # (B, H, T, Dh)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, S, Dh)
        k, v = k.to(q.dtype), v.to(q.dtype)
        out = sdpa(q, k, v, attn_mask=mask, is_causal=is_causal)  # (B, H, T, Dh)
        return self.output_proj(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.attn = RMSNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.ffn = RMSNorm(cfg.d_model), SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x, rot, mask, is_causal, cache, layer) -> Tensor:
        x = x + self.attn(self.ln1(x), rot, mask, is_causal, cache, layer)
        return x + self.ffn(self.ln2(x))


def _attention_mask(attention_mask: Tensor | None, past: int, T: int, device) -> Tensor | None:
    """Boolean (B|1, 1, T, S) mask, True = may attend; None when plain causal suffices.

    Query i (absolute position past+i) sees keys j <= past+i that are real tokens, and always
    itself: a left-pad query would otherwise see no key at all, and some SDPA kernels (older
    PyTorch, some CUDA paths) return NaN for such rows, which would then leak through the cache
    (0 * NaN). Pad outputs are garbage but finite and never attended to.
    """
    S = past + T
    if attention_mask is None and (T == 1 or past == 0):
        return None  # T == 1: every cached key is visible; past == 0: SDPA's is_causal
    q_pos = torch.arange(past, S, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    allowed = k_pos <= q_pos  # (T, S)
    if attention_mask is None:
        return allowed[None, None]
    if attention_mask.shape[-1] != S:
        raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} keys, expected {S} (past + new)")
    keys = attention_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, S)
    if T == 1:
        return keys
    return (allowed & keys) | (k_pos == q_pos)  # (B, 1, T, S)


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # nn.Embedding's own normal_ init, made explicit so that it can be skipped on the meta device
        # (load_checkpoint): there it is wasted work, and meta normal_ imports torch._dynamo (~1.1 s
        # in every process that loads a checkpoint). On real devices it still runs, so the RNG stream
        # (and every seeded model) is unchanged.
        weight = torch.empty(config.vocab_size, config.d_model)  # (V, D)
        if not weight.is_meta:
            nn.init.normal_(weight)
        self.token_embeddings = nn.Embedding(config.vocab_size, config.d_model, _weight=weight, _freeze=False)
        _trunc_normal_(self.token_embeddings.weight, 1.0)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = Linear(config.d_model, config.vocab_size)
        self._rope: dict[torch.device, Tensor] = {}
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        """Recompute each block's activations in the backward pass (see the module docstring)."""
        self.gradient_checkpointing = True

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_kv_cache(self, max_length: int | None = None) -> KVCache:
        return KVCache(self.config.num_layers, max_length or self.config.context_length)

    def _compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype q/k/v will have (SDPA wants a float mask in the query's dtype)."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.lm_head.weight.dtype

    def rope(self, device: torch.device) -> Tensor:
        """The (context_length, Dh/2) complex64 RoPE table on ``device``, built once per device."""
        device = torch.device(device)
        if device not in self._rope:
            cfg = self.config
            self._rope[device] = rope_table(cfg.head_dim, cfg.context_length, cfg.rope_theta, device)
        return self._rope[device]

    def _rope_rows(self, positions: Tensor) -> Tensor:
        return self.rope(positions.device)[positions].unsqueeze(2)  # (B|1, T, 1, Dh/2)

    def forward(
        self,
        input_ids: Tensor,
        *,
        positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
        logits_to_keep: int = 0,
    ) -> Tensor:
        """``input_ids`` (B, T) -> logits (B, T, V) (or (B, logits_to_keep, V)).

        positions: (B, T) RoPE positions per row; default ``past + arange(T)``.
        attention_mask: (B, past + T), 1/True for real tokens, 0 for padding (keys only).
        kv_cache: appended to in place at [past, past + T); ``past = kv_cache.length``.
        logits_to_keep: if > 0, compute the LM head only for the last that-many positions.
        """
        x = self.hidden_states(input_ids, positions=positions, attention_mask=attention_mask, kv_cache=kv_cache)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(x)  # (B, T, V)

    def hidden_states(
        self,
        input_ids: Tensor,
        *,
        positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> Tensor:
        """``input_ids`` (B, T) -> the final-normed hidden states (B, T, D) that ``lm_head`` maps to
        logits; ``forward`` is ``lm_head(hidden_states(...))``. The learner applies the head to the
        response positions only (``rlpipe.lm.heads``)."""
        B, T = input_ids.shape
        past = 0 if kv_cache is None else kv_cache.length
        limit = self.config.context_length
        if kv_cache is not None:
            limit = min(limit, kv_cache.max_length)
        if past + T > limit:
            raise ValueError(
                f"sequence length {past + T} exceeds the limit {limit} (context_length / KV-cache size)"
            )
        if positions is None:
            positions = torch.arange(past, past + T, device=input_ids.device)[None]  # (1, T)
        rot = self._rope_rows(positions)
        mask = _attention_mask(attention_mask, past, T, input_ids.device)
        is_causal = mask is None and T > 1
        if mask is not None:  # additive form once per forward, not a bool->float conversion per layer
            additive = torch.zeros(mask.shape, dtype=self._compute_dtype(input_ids.device), device=mask.device)
            mask = additive.masked_fill_(~mask, float("-inf"))
        x = self.token_embeddings(input_ids)  # (B, T, D)
        recompute = self.gradient_checkpointing and self.training and kv_cache is None and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            if recompute:
                x = torch.utils.checkpoint.checkpoint(layer, x, rot, mask, is_causal, None, i, use_reentrant=False)
            else:
                x = layer(x, rot, mask, is_causal, kv_cache, i)
        if kv_cache is not None:
            kv_cache.length = past + T
        return self.ln_final(x)  # (B, T, D)
