"""The sampler's decode loop: sample one token per row per step on the device, finish rows at EOS, at
their own token cap or at a stop string, and drop finished rows (``rlpipe.lm.sampler.generate``).

Every step is device work only. The host looks at the rows every ``ACTIVE_CHECK_EVERY`` steps for an
adapter that keeps static shapes (``compacts`` False: our static, compiled, AOT and CUDA-graph
decodes) or that compacts into batch buckets (``width``: the HF engine, ``rlpipe.lm.hf_decode``), and
every step for the eager decodes, which shrink the batch as soon as half the rows are done. At a look
it (1) resolves stop strings for the steps since the last look, (2) stops when no row is active, and
(3) compacts when the active rows fit in half the batch. Rows are independent (per-row uniforms), so
the steps a finished row runs on until the next look change no output: its tokens past its end are
cut.

Stop strings (vLLM semantics) are found from the text: a token that could complete one (its text
holds a stop string's last character, or an incomplete UTF-8 byte) marks its row a candidate on the
device; at the look, each candidate row's tail is decoded at each candidate step, the earliest step
that completes a stop string ends the row there, reason ``stop``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

FINISH_REASONS = ("length", "eos", "stop")  # code 0, 1, 2 in the decode loop
ACTIVE_CHECK_EVERY = 8  # static-shape decodes: steps between host looks at the rows
_LENGTH, _EOS, _STOP = 0, 1, 2


def decode_all(tokenizer, batch: list[list[int]]) -> list[str]:
    if hasattr(tokenizer, "decode_batch"):
        return tokenizer.decode_batch(batch)
    return [tokenizer.decode(ids) for ids in batch]


_STOP_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stop_candidates(tokenizer, stops: tuple[str, ...], V: int) -> Tensor:
    """(V,) bool on the CPU: token v could complete a stop string (holds a stop's last char, or partial UTF-8)."""
    key = (stops, V)
    try:
        cache = _STOP_TABLES.setdefault(tokenizer, {})
    except TypeError:  # tokenizer not weak-referenceable: build the table every call
        cache = {}
    if key not in cache:
        texts = decode_all(tokenizer, [[v] for v in range(V)])
        ends = {s[-1] for s in stops} | {"\ufffd"}
        cache[key] = torch.tensor([any(c in t for c in ends) for t in texts], dtype=torch.bool)
    return cache[key]


def sample(logits: Tensor, u: Tensor, temperature: float, top_p: float) -> tuple[Tensor, Tensor]:
    """One token per row by CDF inversion at ``u`` (N,) in (0, 1]; returns (tokens (N,), logprobs (N,))."""
    if temperature == 0:
        tok = logits.argmax(dim=-1)  # (N,)
        return tok, torch.log_softmax(logits, dim=-1).gather(1, tok[:, None])[:, 0]
    if temperature != 1:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)  # (N, V)
    if top_p >= 1:
        cdf = logp.exp().cumsum_(dim=-1)  # (N, V)
        tok = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:]).clamp_(max=logits.shape[-1] - 1)[:, 0]
        return tok, logp.gather(1, tok[:, None])[:, 0]
    probs, order = logp.exp().sort(dim=-1, descending=True, stable=True)  # (N, V)
    keep = probs.cumsum(dim=-1) - probs < top_p  # nucleus: tokens whose preceding mass < top_p
    cdf = (probs * keep).cumsum_(dim=-1)  # (N, V)
    idx = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:]).clamp_(max=logits.shape[-1] - 1)  # (N, 1)
    tok = order.gather(1, idx)[:, 0]
    return tok, logp.gather(1, tok[:, None])[:, 0] - cdf[:, -1].log()


_PER_ROW = ("rows", "u", "pos", "active", "ends_cur", "reasons_cur", "caps", "cand")


@dataclass
class LoopState:
    """Decode-loop buffers. Global (N, M) outputs; ``rows`` maps current batch rows to global rows."""

    tokens: Tensor  # (N, M) long
    logps: Tensor  # (N, M) float32
    ends: Tensor  # (N,) long: response length
    reasons: Tensor  # (N,) long: index into FINISH_REASONS
    rows: Tensor  # (n_cur,) long
    u: Tensor  # (n_cur, M) uniforms
    pos: Tensor  # (n_cur,) long: RoPE position of the next fed token
    active: Tensor  # (n_cur,) bool
    ends_cur: Tensor  # (n_cur,) long
    reasons_cur: Tensor  # (n_cur,) long
    caps: Tensor  # (n_cur,) long: each row's own token cap (at most max_tokens)
    cand: Tensor  # (n_cur,) bool: a token since the last look could have completed a stop string

    def flush(self) -> None:
        self.ends[self.rows] = self.ends_cur
        self.reasons[self.rows] = self.reasons_cur

    def compact(self, adapter, tok: Tensor, width: int) -> Tensor:
        """Keep the active rows, padded with finished ones to ``width`` rows (an adapter's bucket)."""
        self.flush()
        keep = self.active.nonzero()[:, 0]
        if width > keep.shape[0]:
            keep = torch.cat((keep, (~self.active).nonzero()[:, 0][: width - keep.shape[0]]))
        adapter.select(keep)
        for name in _PER_ROW:
            setattr(self, name, getattr(self, name).index_select(0, keep))
        return tok.index_select(0, keep)


@dataclass(frozen=True)
class _Stops:
    table: Tensor  # (V,) bool on the loop's device
    table_cpu: Tensor  # (V,) bool
    stops: tuple[str, ...]
    window: int  # bytes of tail that can hold a stop string
    min_tokens: int


def _resolve_stops(st: LoopState, lo: int, hi: int, sp: _Stops, tokenizer) -> None:
    """Finish candidate rows at the earliest step in [lo, hi] whose token completed a stop string."""
    cand = st.cand.nonzero()[:, 0].tolist()
    st.cand.zero_()
    if not cand:
        return
    idx = torch.tensor(cand, device=st.rows.device)
    ends = st.ends_cur[idx].tolist()
    eos = (st.reasons_cur[idx] == _EOS).tolist()
    start = max(0, hi + 1 - sp.window - (hi - lo))
    tails = st.tokens[st.rows[idx], start: hi + 1].cpu()  # (c, hi + 1 - start)
    queries, where = [], []
    for j, r in enumerate(cand):
        last = min(hi, ends[j] - 1 - int(eos[j]))  # the EOS token is not text
        for s in range(max(lo, sp.min_tokens - 1), last + 1):
            if sp.table_cpu[tails[j, s - start]]:
                queries.append(tails[j, max(0, s + 1 - sp.window) - start: s + 1 - start].tolist())
                where.append((r, s))
    done: dict[int, int] = {}
    for (r, s), text in zip(where, decode_all(tokenizer, queries), strict=True):
        if r not in done and any(stop in text for stop in sp.stops):
            done[r] = s
    if done:
        rows = torch.tensor(list(done), device=st.rows.device)
        st.active[rows] = False
        st.ends_cur[rows] = torch.tensor([s + 1 for s in done.values()], device=st.rows.device)
        st.reasons_cur[rows] = _STOP


def _step_finish(st: LoopState, tok: Tensor, step: int, eos: int, sp: _Stops | None) -> None:
    """Device-only: EOS, stop-string candidates, then each row's own cap."""
    newly = st.active & (tok == eos)
    st.ends_cur.masked_fill_(newly, step + 1)
    st.reasons_cur.masked_fill_(newly, _EOS)
    st.active &= ~newly
    if sp is not None and step + 1 >= sp.min_tokens:
        st.cand |= st.active & sp.table[tok]
    capped = st.active & (st.caps <= step + 1)
    st.ends_cur.masked_fill_(capped, step + 1)
    st.reasons_cur.masked_fill_(capped, _LENGTH)
    st.active &= ~capped


def decode_loop(adapter, logits: Tensor, st: LoopState, params, tokenizer, eos: int) -> None:
    """Sample up to ``params.max_tokens`` tokens for every row into ``st`` (in place)."""
    M = params.max_tokens
    sp = None
    if params.stop:
        table = stop_candidates(tokenizer, params.stop, logits.shape[-1])
        window = max(len(s.encode("utf-8")) for s in params.stop) + 1
        sp = _Stops(table.to(logits.device), table, params.stop, window, params.min_tokens)
    full = True  # rows == arange(N): plain slicing instead of index_put
    compacts = getattr(adapter, "compacts", True)
    width = getattr(adapter, "width", lambda m: m)
    check_every = ACTIVE_CHECK_EVERY if not compacts or hasattr(adapter, "width") else 1
    tok, last_look = None, 0
    for step in range(M):
        if step:
            logits = adapter.step(tok, st.pos)
            st.pos += 1
        logits = logits.float()  # (n_cur, V)
        if step < params.min_tokens:
            logits[:, eos] = float("-inf")
        tok, lp = sample(logits, st.u[:, step], params.temperature, params.top_p)
        if full:
            st.tokens[:, step], st.logps[:, step] = tok, lp
        else:
            st.tokens[st.rows, step], st.logps[st.rows, step] = tok, lp
        _step_finish(st, tok, step, eos, sp)
        if (step + 1) % check_every and step + 1 < M:
            continue
        if sp is not None:
            _resolve_stops(st, last_look, step, sp, tokenizer)
        last_look = step + 1
        n_active = int(st.active.sum())
        if n_active == 0:
            break
        w = width(n_active)
        if step + 1 < M and compacts and w <= st.active.shape[0] // 2:
            tok, full = st.compact(adapter, tok, w), False
    st.flush()
