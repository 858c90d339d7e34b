"""Batched autoregressive sampler with a KV cache: the Generator's hot path (seed 000 §3.1.1).

Seed 000 asks the Generator to "produce G responses per prompt via autoregressive decoding ...
apply sampling and record log probabilities for each generated token"; seed 001 does this with
vLLM. rlpipe has no vLLM, so ``generate`` is a small vLLM-like sampler with vLLM's option names
(``SamplingParams``), driving our ``TransformerLM`` and HuggingFace causal LMs alike.

Where to look:
- ``generate``: prompts left-padded to (B, P), one prefill pass, the cache repeated ``n`` times
  (prompt-major rows, N = B*n), then one token per row per step; ``use_kv_cache=False`` is the
  naive full recomputation (the tests' and the benchmark's reference);
- ``rlpipe.lm.adapters``: how each kind of model prefills and steps (``decode=``);
- ``rlpipe.lm.decode_loop``: sampling on the device, rows finished at EOS, their own cap or a stop
  string (vLLM semantics), compaction of finished rows;
- ``rlpipe.lm.hf_decode``: the engine for HF Qwen2/Llama policies (static arena, CUDA graphs);
- ``Generation``: the output, and what its log-probs mean; ``_row_seeds``: the per-row randomness
  that makes a row's samples independent of the rest of the batch.
"""

from __future__ import annotations

import contextlib
import hashlib
from array import array
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlpipe.lm.adapters import DECODES, make_adapter, resolve
from rlpipe.lm.decode_loop import _EOS, _STOP, FINISH_REASONS, LoopState, decode_all, decode_loop

__all__ = ["DECODES", "FINISH_REASONS", "Generation", "SamplingParams", "generate"]


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
    """N = len(prompts) * n rows, prompt-major: row i*n + j is sample j of prompt i.

    Per-row lists: prompt ids, response ids, text, (T_i,) float32 log-probs, finish reason;
    ``response_mask()``, ``padded_response_ids()`` and ``padded_logprobs()`` give right-padded (N, T)
    tensors for the learner.

    ``logprobs[i][t]`` is the log-probability of the sampled token under the distribution it was
    actually drawn from: ``log_softmax(logits / temperature)`` with EOS masked while fewer than
    ``min_tokens`` tokens exist, and, for ``top_p < 1``, renormalised over the nucleus. At
    temperature T != 1 they are log-probs of the *tempered* distribution:
    ``rlpipe.grpo.get_response_log_probs(model, input_ids, labels, temperature=T)`` reproduces them
    (not with top_p < 1 or inside the min_tokens window, where the distribution is truncated).
    Temperature 0 is greedy (argmax) and reports the untempered model log-probs (T = 1).

    Stop strings: ``response_ids``/``logprobs`` keep every token up to and including the one that
    completed the stop string; ``response_text`` is cut before it (after it with
    ``include_stop_str_in_output``). A sampled EOS is the last entry of ``response_ids``/``logprobs``
    but not part of ``response_text``. Stop detection decodes row tails, which assumes a
    context-free detokeniser (byte-level BPE: ours, GPT-2, Qwen).
    """

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
    """One 63-bit seed per row from (seed, prompt ids, occurrence of this prompt, sample j).

    A departure from one batch-global ``torch.Generator``: every row draws one uniform per step from
    its own generator (``_uniforms``) and samples by inverting the CDF, so a row's samples do not
    depend on what else is in the batch: the same prompt gives the same G samples alone, in any
    batch, or split across generator actors (up to float rounding of the logits, which moves a draw
    only if it lands within ~1e-6 of a CDF step). ``seed=None`` draws one seed from torch's global
    RNG, so ``torch.manual_seed`` still makes unseeded runs repeatable."""
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


@contextlib.contextmanager
def _eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _finish(prompt_ids, st: LoopState, params: SamplingParams, tokenizer) -> Generation:
    """Cut each row at its end, decode texts, apply stop-string truncation. Runs outside
    inference_mode so the returned tensors are ordinary (usable in autograd as old log-probs)."""
    ends, reasons = st.ends.tolist(), st.reasons.tolist()
    tokens, logps = st.tokens.cpu(), st.logps.cpu()
    n = params.n
    resp = [tokens[r, : ends[r]].tolist() for r in range(len(ends))]
    text_ids = [ids[:-1] if reasons[r] == _EOS else ids for r, ids in enumerate(resp)]
    texts = decode_all(tokenizer, text_ids)
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


def _row_caps(row_max_tokens, N: int, M: int, device) -> Tensor:
    """(N,) long: each row's own token cap, checked against N rows and ``max_tokens``."""
    if row_max_tokens is None:
        return torch.full((N,), M, dtype=torch.long, device=device)
    caps = [int(c) for c in row_max_tokens]
    if len(caps) != N:
        raise ValueError(f"row_max_tokens has {len(caps)} entries; generate() samples {N} rows (prompts x n)")
    bad = [c for c in caps if not 1 <= c <= M]
    if bad:
        raise ValueError(f"row_max_tokens must lie in [1, max_tokens={M}], got {bad[0]}")
    return torch.tensor(caps, dtype=torch.long, device=device)


def generate(
    model, tokenizer, prompts, params: SamplingParams, device=None, *, use_kv_cache: bool = True,
    decode: str = "auto", row_max_tokens=None,
) -> Generation:
    """Sample ``params.n`` responses for each prompt (a string or a list of token ids).

    Returns a ``Generation`` with N = len(prompts) * n rows, prompt-major. ``device`` defaults to
    the model's device. ``use_kv_cache=False`` runs the naive full-recomputation decoder.
    ``decode`` picks the adapter (``rlpipe.lm.adapters``): ``"eager"`` grows the cache and compacts
    finished rows; for our ``TransformerLM``, ``"static"``, ``"compiled"``, ``"aot"`` and
    ``"cudagraph"`` run the fixed-shape step of ``rlpipe.lm.static_decode``: eagerly, through
    ``torch.compile``, from the AOTInductor package of ``rlpipe.lm.decode_package`` (built on first
    use when this machine has none), or replayed from a CUDA graph captured once per batch shape
    (``rlpipe.lm.cuda_graph_decode``; without CUDA it warns and runs the same buffers eagerly); for
    an HF Qwen2 or Llama policy, ``"static"`` and ``"cudagraph"`` run the engine of
    ``rlpipe.lm.hf_decode`` (eagerly, or from CUDA graphs per batch bucket). ``"auto"`` (the default)
    is ``"cudagraph"`` on a CUDA device where the model has it and ``"eager"`` elsewhere.
    ``row_max_tokens``: N per-row caps (each at most ``max_tokens``); a row reaching its cap finishes
    with reason ``length``, as vLLM's per-request ``max_tokens``.
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    prompt_ids = _prompt_ids(tokenizer, prompts)
    if not prompt_ids:
        return Generation([], [], [], [], [], params)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    N, P, M = len(prompt_ids) * params.n, max(len(p) for p in prompt_ids), params.max_tokens
    caps = _row_caps(row_max_tokens, N, M, device)
    adapter = make_adapter(model, use_kv_cache, resolve(decode, model, device))
    total = P + M - 1  # the last sampled token is never fed back
    if adapter.max_length is not None and total > adapter.max_length:
        raise ValueError(
            f"longest prompt ({P} tokens) + max_tokens ({M}) - 1 = {total} exceeds the model's context "
            f"length {adapter.max_length}; shorten the prompts or lower max_tokens"
        )
    seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
    with torch.inference_mode(), _eval_mode(model):
        ids, mask, pos = _left_pad(prompt_ids, tokenizer.pad_token_id, device)
        logits = adapter.prefill(ids, mask, pos, max(total, P), params.n)  # (N, V)
        st = LoopState(
            tokens=torch.full((N, M), tokenizer.pad_token_id, dtype=torch.long, device=device),
            logps=torch.zeros(N, M, device=device),
            ends=caps.clone(),
            reasons=torch.zeros(N, dtype=torch.long, device=device),
            rows=torch.arange(N, device=device),
            u=_uniforms(_row_seeds(prompt_ids, params.n, seed), M, device),
            pos=mask.sum(-1).repeat_interleave(params.n),
            active=torch.ones(N, dtype=torch.bool, device=device),
            ends_cur=caps.clone(),
            reasons_cur=torch.zeros(N, dtype=torch.long, device=device),
            caps=caps,
            cand=torch.zeros(N, dtype=torch.bool, device=device),
        )
        decode_loop(adapter, logits, st, params, tokenizer, tokenizer.eos_token_id)
    return _finish(prompt_ids, st, params, tokenizer)
