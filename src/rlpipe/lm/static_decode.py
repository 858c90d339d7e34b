"""A decode step over a static KV cache, for ``torch.compile`` (nanoGPT / gpt-fast style).

The eager sampler (``rlpipe.lm.sampler``) grows its cache views by one position per step and
compacts the batch as rows finish, so every step has new shapes: fine eagerly, a recompile per
step for a compiler. Here every decode step of one ``generate`` call has the same shapes:

- the K/V buffers are (N, H, S, Dh) for the whole call, S = prompt + new tokens rounded up to a
  multiple of ``BUCKET`` (so calls with slightly different prompt lengths share a graph);
- the new token's K/V are written at position ``L`` with ``index_copy_`` (L a tensor, not a shape);
- attention reads all S positions under a (N, S) key mask (prompt padding and unwritten positions
  masked), so the attention shape does not change;
- rows that finished keep decoding until every row has (no compaction): their samples are
  discarded by the loop exactly as before.

RoPE uses real cos/sin tables (inductor does not lower complex tensors); the eager model uses a
complex64 rotation. The two agree to float rounding, so the compiled path yields the eager path's
tokens and log-probs within a tolerance (``tests/test_static_decode.py``), not bit for bit.

``StaticDecodeAdapter(model, compiled=False)`` runs the same static step eagerly (the reference the
compiled step is tested against). Compiled steps are cached per model object; a new (N, S) shape
compiles once more; at the portable CPU level (``ATEN_CPU_CAPABILITY=default``), where inductor cannot
build a bf16 kernel, the step runs eagerly under CPU autocast (``inductor_vectorizes_cpu``).
``rlpipe.lm.decode_package`` compiles the same step ahead of time instead, once
per model shape and machine (``decode="aot"``). Only our ``TransformerLM`` is supported (HF models
keep their own cache).
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch import Tensor

from rlpipe.lm.attention import sdpa
from rlpipe.lm.device import inductor_cache_per_kernel_level
from rlpipe.lm.model import TransformerLM

BUCKET = 32  # S is rounded up to a multiple of this (at most the context length)

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rope_cos_sin(model: TransformerLM, device) -> tuple[Tensor, Tensor]:
    """(context_length, Dh/2) float32 cos and sin: the real and imaginary parts of the model's own
    complex RoPE table."""
    table = model.rope(device)
    return table.real.contiguous(), table.imag.contiguous()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Adjacent-pair RoPE of ``x`` (N, H, 1, Dh) with cos/sin (N, 1, 1, Dh/2), in x's dtype."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (N, H, 1, Dh/2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)  # (N, H, 1, Dh)


def decode_step(model: TransformerLM, cos: Tensor, sin: Tensor, tok: Tensor, pos: Tensor, at: Tensor,
                keys: Tensor, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
    """One token per row through ``model`` over a static cache: logits (N, V).

    tok, pos: (N,) the fed token and its RoPE position; at: (1,) long, the cache position written;
    keys: (N, S) bool, True where a row may attend (``at`` included); ks, vs: per layer (N, H, S, Dh),
    written in place at ``at``.
    """
    N = tok.shape[0]
    H, Dh = model.config.num_heads, model.config.head_dim
    c, s = cos[pos][:, None, None], sin[pos][:, None, None]  # (N, 1, 1, Dh/2)
    mask = keys[:, None, None, :]  # (N, 1, 1, S)
    x = model.token_embeddings(tok[:, None])  # (N, 1, D)
    for i, layer in enumerate(model.layers):
        h, attn = layer.ln1(x), layer.attn
        q = _rotate(attn.q_proj(h).view(N, 1, H, Dh).transpose(1, 2), c, s)  # (N, H, 1, Dh)
        k = _rotate(attn.k_proj(h).view(N, 1, H, Dh).transpose(1, 2), c, s)  # (N, H, 1, Dh)
        v = attn.v_proj(h).view(N, 1, H, Dh).transpose(1, 2)  # (N, H, 1, Dh)
        ks[i].index_copy_(2, at, k.to(ks[i].dtype))
        vs[i].index_copy_(2, at, v.to(vs[i].dtype))
        out = sdpa(q, ks[i].to(q.dtype), vs[i].to(q.dtype), attn_mask=mask)  # (N, H, 1, Dh)
        x = x + attn.output_proj(out.transpose(1, 2).reshape(N, 1, -1))  # (N, 1, D)
        x = x + layer.ffn(layer.ln2(x))
    return model.lm_head(model.ln_final(x))[:, -1]  # (N, V)


def _compiled_step(model: TransformerLM):
    fn = _COMPILED.get(model)
    if fn is None:
        inductor_cache_per_kernel_level()
        fn = torch.compile(decode_step, fullgraph=True, dynamic=False)
        if not inductor_vectorizes_cpu():
            fn = _eager_under_cpu_autocast(fn)
        _COMPILED[model] = fn
    return fn


def inductor_vectorizes_cpu() -> bool:
    """Whether torch inductor has a vector ISA for CPU code here. It has none at the portable level
    (``ATEN_CPU_CAPABILITY=default``), and there its C++ for a bf16 kernel does not compile (it calls
    ``at::vec`` conversions, which that level leaves out: "'at::vec' has not been declared")."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return bool(pick_vec_isa())


_SAID_EAGER: list[bool] = []


def _eager_under_cpu_autocast(compiled):
    """``compiled``, except under CPU autocast (bf16, fp16), where the same step runs eagerly (said
    once): inductor cannot build that kernel without a vector ISA (``inductor_vectorizes_cpu``)."""
    def step(model, cos, sin, *rest):
        if cos.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            if not _SAID_EAGER:
                _SAID_EAGER.append(True)
                print("rlpipe: decode 'compiled' runs the static step eagerly under CPU autocast here: torch "
                      "inductor has no vector ISA at this CPU kernel level "
                      f"({torch.backends.cpu.get_cpu_capability()}) and cannot build its bf16 kernel",
                      file=sys.stderr, flush=True)
            return decode_step(model, cos, sin, *rest)
        return compiled(model, cos, sin, *rest)
    return step


class StaticDecodeAdapter:
    """The sampler's adapter interface (``prefill``/``step``) for a ``TransformerLM`` with a static
    cache; ``compacts`` is False: the decode loop keeps every row to the end (static shapes)."""

    compacts = False

    def __init__(self, model: TransformerLM, compiled: bool = True, step_fn=None):
        self.model, self.max_length = model, model.config.context_length
        self.step_fn = step_fn or (_compiled_step(model) if compiled else decode_step)

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor, total: int, n: int) -> Tensor:
        S = min(-(-total // BUCKET) * BUCKET, self.max_length)  # (total rounded up to the bucket)
        self.cache = self.model.new_kv_cache(S)
        padded = not bool(mask.all())
        logits = self.model(ids, positions=pos, attention_mask=mask if padded else None, kv_cache=self.cache,
                            logits_to_keep=1)[:, -1]  # (B, V)
        self.cache.repeat_interleave(n)
        self.L = ids.shape[1]
        for buf in (*self.cache.k, *self.cache.v):  # masked, but 0 * garbage (NaN) would still poison a row
            buf[:, :, self.L:].zero_()
        self.keys = torch.zeros(ids.shape[0] * n, S, dtype=torch.bool, device=ids.device)  # (N, S)
        self.keys[:, : self.L] = mask.repeat_interleave(n, dim=0)
        self.cos, self.sin = rope_cos_sin(self.model, ids.device)
        self.at = torch.tensor([self.L], device=ids.device)  # (1,) the cache position the next step writes
        return logits.repeat_interleave(n, dim=0)  # (N, V)

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        # The position lives on the device and is advanced there: no host-to-device copy per step.
        self.keys.index_fill_(1, self.at, True)
        logits = self.step_fn(self.model, self.cos, self.sin, tok, pos, self.at, self.keys, self.cache.k, self.cache.v)
        self.at.add_(1)
        self.L += 1
        return logits  # (N, V)

    def select(self, idx: Tensor) -> None:
        raise RuntimeError("a static-cache decode never compacts its batch")
