"""Batched autoregressive sampler with a KV cache: the Generator's hot path (seed 000 §3.1.1).

Seed 000 asks the Generator to "produce G responses per prompt via autoregressive decoding ...
apply sampling and record log probabilities for each generated token"; seed 001 does this with
vLLM (``SamplingParams(temperature, top_p, max_tokens, stop=["</answer>"], include_stop_str_in_
output=True)``). rlpipe has no vLLM, so this module is a small vLLM-like sampler with the same
option names, driving both our ``TransformerLM`` and a HuggingFace ``AutoModelForCausalLM``
(Qwen 2.5 Math) through a small adapter per model type.

How it decodes. Prompts are tokenised and left-padded to (B, P); one prefill forward pass runs
over them with a key-padding mask and per-row RoPE positions (every row starts at position 0),
then the prefilled cache is repeated ``n`` times (prompt-major rows, N = B*n) and every step feeds
one token for all rows. Our model's cache is preallocated per layer and written in place; HF
models use their own ``past_key_values`` with ``attention_mask`` and ``position_ids``. Finished
rows keep decoding (static shapes) until at most half the rows are active, then the batch is
compacted; the loop stops when every row has finished (the fixed-shape decodes, which never
compact, look only every ``ACTIVE_CHECK_EVERY`` steps: each look makes the host wait for the
device). ``use_kv_cache=False`` recomputes the whole sequence each step with the same sampling
loop: the naive reference for tests and the benchmark.

What the returned log-probs mean. ``logprobs[i][t]`` is the log-probability of the sampled token
under the distribution it was actually drawn from: ``log_softmax(logits / temperature)`` with
EOS masked while fewer than ``min_tokens`` tokens exist, and, for ``top_p < 1``, renormalised over
the nucleus. At temperature T != 1 they are log-probs of the *tempered* distribution:
``rlpipe.rl.grpo.get_response_log_probs(model, input_ids, labels, temperature=T)`` (a fresh forward
pass with ``logits / T``) reproduces them (not with top_p < 1 or inside the min_tokens window,
where the sampling distribution is truncated). Temperature 0 is greedy (argmax) and, since a
point mass carries no information, reports the untempered model log-probs (T = 1) instead.

Output. ``Generation`` holds per-row lists (prompt ids, response ids, text, (T_i,) float32
log-probs, finish reason); ``response_mask()``, ``padded_response_ids()`` and
``padded_logprobs()`` give right-padded (N, T) tensors for the learner.

Randomness (a departure from a single batch-global ``torch.Generator``). Every row draws one
uniform per step from its own ``torch.Generator`` seeded by ``hash(seed, prompt token ids,
occurrence of that prompt in the call, sample index j)`` and samples by inverting the CDF. So a
row's sample does not depend on what else is in the batch: the same prompt gives the same G
samples alone, in any batch, or split across generator actors (up to float rounding of the
logits, which moves a draw only if it lands within ~1e-6 of a CDF step); the global RNG is untouched
when a seed is given. ``seed=None`` draws one seed from torch's global RNG, so ``torch.manual_seed``
still makes unseeded runs repeatable.

Stop strings (vLLM semantics): checked once at least ``min_tokens`` tokens exist, only for rows
whose new token could end a stop string (its text contains a stop string's last character or an
incomplete UTF-8 byte), by decoding just the row's tail. ``response_ids``/``logprobs`` keep every
token up to and including the one that completed the stop string; ``response_text`` is cut before
the stop string (or after it with ``include_stop_str_in_output``). An EOS token, when sampled, is
the last entry of ``response_ids``/``logprobs`` but is not part of ``response_text``. Tail decoding
assumes a context-free detokeniser (byte-level BPE: ours, GPT-2, Qwen).
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from array import array
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlpipe.lm import decode_package
from rlpipe.lm.cuda_graph_decode import CudaGraphDecodeAdapter, resolve_decode
from rlpipe.lm.model import TransformerLM
from rlpipe.lm.static_decode import StaticDecodeAdapter

FINISH_REASONS = ("length", "eos", "stop")  # code 0, 1, 2 in the decode loop
ACTIVE_CHECK_EVERY = 8  # static-shape decodes: steps between host reads of the active-row count
_LENGTH, _EOS, _STOP = 0, 1, 2


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 60
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be an int >= 1, got {self.n!r}")
        if not self.temperature >= 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}"
            )
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"SamplingParams.stop must hold non-empty strings, got {stop!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"SamplingParams.seed must be an int or None, got {self.seed!r}")


@dataclass
class Generation:
    """N = len(prompts) * n rows, prompt-major: row i*n + j is sample j of prompt i."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_text: list[str]
    logprobs: list[Tensor]  # each (T_i,) float32
    finish_reason: list[str]  # "eos" | "stop" | "length"
    params: SamplingParams = field(default_factory=SamplingParams)

    def __len__(self) -> int:
        return len(self.response_ids)

    def _width(self, length: int | None) -> int:
        return max((len(r) for r in self.response_ids), default=0) if length is None else length

    def response_mask(self, length: int | None = None) -> Tensor:
        """(N, T) bool, True on response tokens, right-padded to ``length`` (default: longest)."""
        T = self._width(length)
        lens = torch.tensor([len(r) for r in self.response_ids])
        return torch.arange(T)[None, :] < lens[:, None]  # (N, T)

    def padded_response_ids(self, pad_id: int, length: int | None = None) -> Tensor:
        """(N, T) long, right-padded with ``pad_id``."""
        out = torch.full((len(self), self._width(length)), pad_id, dtype=torch.long)
        for i, r in enumerate(self.response_ids):
            out[i, : len(r)] = torch.tensor(r[: out.shape[1]], dtype=torch.long)
        return out

    def padded_logprobs(self, length: int | None = None) -> Tensor:
        """(N, T) float32, 0 on padding."""
        out = torch.zeros(len(self), self._width(length))
        for i, lp in enumerate(self.logprobs):
            out[i, : len(lp)] = lp[: out.shape[1]]
        return out


# ----------------------------------------------------------------------------------- adapters


class _OwnAdapter:
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


class _HFAdapter:
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


class _NaiveAdapter:
    """No cache: every step re-runs the whole (left-padded) sequence. Reference and baseline."""

    def __init__(self, model):
        self.model = model
        self.own = isinstance(model, TransformerLM)
        self.max_length = _make_adapter(model, True).max_length

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


# generate(decode=...): rlpipe.lm.static_decode, decode_package, cuda_graph_decode ("auto": cudagraph on CUDA)
DECODES = ("auto", "eager", "static", "compiled", "aot", "cudagraph")


def _make_adapter(model, use_kv_cache: bool, decode: str = "eager"):
    base = getattr(model, "_orig_mod", model)
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    if not use_kv_cache:
        return _NaiveAdapter(model)
    if isinstance(base, TransformerLM):
        if decode == "aot":
            return StaticDecodeAdapter(base, step_fn=decode_package.load(base).step)
        if decode == "cudagraph":
            return CudaGraphDecodeAdapter(base)
        if decode != "eager":
            return StaticDecodeAdapter(base, compiled=decode == "compiled")
        return _OwnAdapter(model)
    if hasattr(base, "config") and hasattr(base, "get_output_embeddings"):
        return _HFAdapter(model)
    raise TypeError(
        f"generate() drives a TransformerLM or a transformers CausalLM, got {type(model).__name__}"
    )


# ------------------------------------------------------------------------------ preparation


def _prompt_ids(tokenizer, prompts) -> list[list[int]]:
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings or token-id lists, not a single string")
    prompts = list(prompts)
    text_idx = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    texts = [prompts[i] for i in text_idx]
    encoded = dict(zip(text_idx, tokenizer.encode_batch(texts), strict=True)) if text_idx else {}
    out = []
    for i, p in enumerate(prompts):
        ids = encoded[i] if i in encoded else (p.tolist() if isinstance(p, Tensor) else [int(t) for t in p])
        if not ids:
            raise ValueError(
                f"prompt {i} has no tokens; to sample unconditionally pass [tokenizer.eos_token_id]"
            )
        out.append(list(ids))
    return out


def _left_pad(prompt_ids: list[list[int]], pad_id: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """ids (B, P) left-padded, key mask (B, P) bool, RoPE positions (B, P) starting at 0 per row."""
    P = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), P), pad_id, dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
    lens = torch.tensor([len(p) for p in prompt_ids])
    pad = (P - lens)[:, None]  # (B, 1)
    ar = torch.arange(P)[None, :]  # (1, P)
    mask = ar >= pad  # (B, P)
    pos = (ar - pad).clamp(min=0)  # (B, P)
    return ids.to(device), mask.to(device), pos.to(device)


def _row_seeds(prompt_ids: list[list[int]], n: int, seed: int) -> list[int]:
    """One 63-bit seed per row from (seed, prompt ids, occurrence of this prompt, sample j)."""
    seen: Counter = Counter()
    seeds = []
    for p in prompt_ids:
        occurrence = seen[tuple(p)]
        seen[tuple(p)] += 1
        base = hashlib.blake2b(digest_size=16)
        base.update(seed.to_bytes(16, "little", signed=True))
        base.update(occurrence.to_bytes(8, "little"))
        base.update(array("q", p).tobytes())
        for j in range(n):
            h = base.copy()
            h.update(j.to_bytes(8, "little"))
            seeds.append(int.from_bytes(h.digest()[:8], "little") >> 1)
    return seeds


def _uniforms(seeds: list[int], steps: int, device) -> Tensor:
    """(N, steps) uniforms in (0, 1], row r from its own generator seeded with seeds[r]."""
    g = torch.Generator()
    rows = []
    for s in seeds:
        g.manual_seed(s)
        rows.append(torch.rand(steps, generator=g))
    return (1.0 - torch.stack(rows)).to(device)  # (N, steps)


def _decode_all(tokenizer, batch: list[list[int]]) -> list[str]:
    if hasattr(tokenizer, "decode_batch"):
        return tokenizer.decode_batch(batch)
    return [tokenizer.decode(ids) for ids in batch]


_STOP_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stop_candidates(tokenizer, stops: tuple[str, ...], V: int, device) -> Tensor:
    """(V,) bool: token v could complete a stop string (contains a stop's last char, or partial UTF-8)."""
    key = (stops, V, str(device))
    try:
        cache = _STOP_TABLES.setdefault(tokenizer, {})
    except TypeError:  # tokenizer not weak-referenceable: build the table every call
        cache = {}
    if key not in cache:
        batch = [[v] for v in range(V)]
        texts = _decode_all(tokenizer, batch)
        ends = {s[-1] for s in stops} | {"\ufffd"}
        cache[key] = torch.tensor([any(c in t for c in ends) for t in texts], dtype=torch.bool, device=device)
    return cache[key]


@contextlib.contextmanager
def _eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# --------------------------------------------------------------------------------- sampling


def _sample(logits: Tensor, u: Tensor, temperature: float, top_p: float) -> tuple[Tensor, Tensor]:
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


@dataclass
class _LoopState:
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

    def flush(self) -> None:
        self.ends[self.rows] = self.ends_cur
        self.reasons[self.rows] = self.reasons_cur

    def compact(self, adapter, tok: Tensor) -> Tensor:
        self.flush()
        keep = self.active.nonzero()[:, 0]
        adapter.select(keep)
        for name in ("rows", "u", "pos", "active", "ends_cur", "reasons_cur"):
            setattr(self, name, getattr(self, name).index_select(0, keep))
        return tok.index_select(0, keep)


def _check_stops(
    st: _LoopState, tok: Tensor, step: int, cand_table: Tensor, tokenizer, stops: tuple[str, ...], window: int
) -> None:
    """Finish rows whose newest token completed a stop string; decode only candidate rows' tails."""
    cand = (st.active & cand_table[tok]).nonzero()[:, 0].tolist()
    if not cand:
        return
    lo = max(0, step + 1 - window)
    tails = st.tokens[st.rows[cand], lo : step + 1].tolist()
    texts = _decode_all(tokenizer, tails)
    hit = [r for r, text in zip(cand, texts, strict=True) if any(s in text for s in stops)]
    if hit:
        idx = torch.tensor(hit, device=tok.device)
        st.active[idx] = False
        st.ends_cur[idx] = step + 1
        st.reasons_cur[idx] = _STOP


def _decode_loop(
    adapter, logits: Tensor, st: _LoopState, params: SamplingParams, tokenizer, eos: int
) -> None:
    """Sample up to ``max_tokens`` tokens for every row into ``st`` (in place)."""
    M, stops = params.max_tokens, params.stop
    if stops:
        cand_table = _stop_candidates(tokenizer, stops, logits.shape[-1], logits.device)
        window = max(len(s.encode("utf-8")) for s in stops) + 1
    full = True  # rows == arange(N): plain slicing instead of index_put
    compacts = getattr(adapter, "compacts", True)
    # Reading the active count makes the host wait for the device. A compacting decode needs it every
    # step; a static one only to stop early, so it looks every ACTIVE_CHECK_EVERY steps (finished rows
    # decode on and are cut at their ends, so the extra steps change no output).
    check_every = 1 if compacts else ACTIVE_CHECK_EVERY
    tok = None
    for step in range(M):
        if step:
            logits = adapter.step(tok, st.pos)
            st.pos += 1
        logits = logits.float()  # (n_cur, V)
        if step < params.min_tokens:
            logits[:, eos] = float("-inf")
        tok, lp = _sample(logits, st.u[:, step], params.temperature, params.top_p)
        if full:
            st.tokens[:, step], st.logps[:, step] = tok, lp
        else:
            st.tokens[st.rows, step], st.logps[st.rows, step] = tok, lp
        newly = st.active & (tok == eos)
        st.ends_cur.masked_fill_(newly, step + 1)
        st.reasons_cur.masked_fill_(newly, _EOS)
        st.active &= ~newly
        if stops and step + 1 >= params.min_tokens:
            _check_stops(st, tok, step, cand_table, tokenizer, stops, window)
        if (step + 1) % check_every:
            continue
        n_active = int(st.active.sum())
        if n_active == 0:
            break
        if step + 1 < M and n_active <= st.active.shape[0] // 2 and compacts:
            tok, full = st.compact(adapter, tok), False
    st.flush()


def _finish(prompt_ids, st: _LoopState, params: SamplingParams, tokenizer) -> Generation:
    """Cut each row at its end, decode texts, apply stop-string truncation. Runs outside
    inference_mode so the returned tensors are ordinary (usable in autograd as old log-probs)."""
    ends, reasons = st.ends.tolist(), st.reasons.tolist()
    tokens, logps = st.tokens.cpu(), st.logps.cpu()
    n = params.n
    resp = [tokens[r, : ends[r]].tolist() for r in range(len(ends))]
    text_ids = [ids[:-1] if reasons[r] == _EOS else ids for r, ids in enumerate(resp)]
    texts = _decode_all(tokenizer, text_ids)
    texts = [_cut_at_stop(t, params) if reasons[r] == _STOP else t for r, t in enumerate(texts)]
    return Generation(
        prompt_ids=[list(prompt_ids[r // n]) for r in range(len(ends))],
        response_ids=resp,
        response_text=texts,
        logprobs=[logps[r, : ends[r]].clone() for r in range(len(ends))],
        finish_reason=[FINISH_REASONS[c] for c in reasons],
        params=params,
    )


def _cut_at_stop(text: str, params: SamplingParams) -> str:
    """Truncate at the stop string that ends last (the one the final token completed)."""
    best = None  # (end, -start, start, stop)
    for s in params.stop:
        i = text.rfind(s)
        if i >= 0 and (best is None or (i + len(s), -i) > best[:2]):
            best = (i + len(s), -i, i, s)
    if best is None:
        return text
    return text[: best[0]] if params.include_stop_str_in_output else text[: best[2]]


def generate(
    model, tokenizer, prompts, params: SamplingParams, device=None, *, use_kv_cache: bool = True,
    decode: str = "eager",
) -> Generation:
    """Sample ``params.n`` responses for each prompt (a string or a list of token ids).

    Returns a ``Generation`` with N = len(prompts) * n rows, prompt-major. ``device`` defaults to
    the model's device. ``use_kv_cache=False`` runs the naive full-recomputation decoder.
    ``decode`` (our ``TransformerLM`` only; HF models always decode eagerly): ``"eager"`` grows the
    cache and compacts finished rows; ``"static"``, ``"compiled"``, ``"aot"`` and ``"cudagraph"`` run
    the fixed-shape step of ``rlpipe.lm.static_decode``: eagerly, through ``torch.compile``, from the
    AOTInductor package of ``rlpipe.lm.decode_package`` (built on first use when this machine has
    none), or replayed from a CUDA graph captured once per batch shape (``rlpipe.lm.cuda_graph_decode``;
    without CUDA it warns and runs the same buffers eagerly); ``"auto"`` is ``"cudagraph"`` on a CUDA
    device and ``"eager"`` elsewhere.
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    prompt_ids = _prompt_ids(tokenizer, prompts)
    if not prompt_ids:
        return Generation([], [], [], [], [], params)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    adapter = _make_adapter(model, use_kv_cache, resolve_decode(decode, device))
    P, M = max(len(p) for p in prompt_ids), params.max_tokens
    total = P + M - 1  # the last sampled token is never fed back
    if adapter.max_length is not None and total > adapter.max_length:
        raise ValueError(
            f"longest prompt ({P} tokens) + max_tokens ({M}) - 1 = {total} exceeds the model's context "
            f"length {adapter.max_length}; shorten the prompts or lower max_tokens"
        )
    seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
    N = len(prompt_ids) * params.n
    with torch.inference_mode(), _eval_mode(model):
        ids, mask, pos = _left_pad(prompt_ids, tokenizer.pad_token_id, device)
        logits = adapter.prefill(ids, mask, pos, max(total, P), params.n)  # (N, V)
        st = _LoopState(
            tokens=torch.full((N, M), tokenizer.pad_token_id, dtype=torch.long, device=device),
            logps=torch.zeros(N, M, device=device),
            ends=torch.full((N,), M, dtype=torch.long, device=device),
            reasons=torch.zeros(N, dtype=torch.long, device=device),
            rows=torch.arange(N, device=device),
            u=_uniforms(_row_seeds(prompt_ids, params.n, seed), M, device),
            pos=mask.sum(-1).repeat_interleave(params.n),
            active=torch.ones(N, dtype=torch.bool, device=device),
            ends_cur=torch.full((N,), M, dtype=torch.long, device=device),
            reasons_cur=torch.zeros(N, dtype=torch.long, device=device),
        )
        _decode_loop(adapter, logits, st, params, tokenizer, tokenizer.eos_token_id)
    return _finish(prompt_ids, st, params, tokenizer)
