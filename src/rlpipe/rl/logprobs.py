"""Log-probs, entropy and the seed-001 prompt/response token layout: ``compute_entropy``,
``get_response_log_probs``, ``tokenize_prompt_and_output`` (the SFT helpers the seed-001 API
builds on), ``pack_token_ids`` and ``pack_response_values``.

Shape letters: B rows (responses), T sequence positions, V vocabulary. In the packed layout a row
is prompt + output, right-padded to T + 1 tokens and shifted by one: ``input_ids``, ``labels`` and
``response_mask`` are (B, T).

How this departs from the seeds, and why:

* ``get_response_log_probs`` divides logits by ``temperature`` before ``log_softmax`` so the learner
  scores the same tempered distribution the sampler drew from; entropy is returned detached
  (a logging quantity) and computed in float32.
* ``pack_token_ids`` builds seed 001's input/label/mask layout from token ids, so the trainer can use
  the sampled ids directly instead of decoding and re-encoding text (which can change the tokens).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

__all__ = [
    "compute_entropy",
    "entropy_from_log_probs",
    "get_response_log_probs",
    "pack_response_values",
    "pack_token_ids",
    "response_only_log_probs",
    "tokenize_prompt_and_output",
]


# --------------------------------------------------------------------------- log-probs, entropy


def compute_entropy(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last axis: (..., V) -> (...).

    Uses ``log_softmax`` (stable for huge logits); ``-inf`` logits (banned tokens) contribute 0.
    Half-precision logits are upcast to float32.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return entropy_from_log_probs(F.log_softmax(logits, dim=-1))  # (..., V) -> (...)


def entropy_from_log_probs(log_p: Tensor) -> Tensor:
    """Entropy from normalised log-probs: (..., V) -> (...). The learner already holds
    ``log_softmax(logits)`` for the sampled tokens' log-probs; reusing it saves a second (B, T, V)
    softmax (``rlpipe bench update``'s profile: ~10% of the forward + backward on cpu-tiny).
    ``-inf`` entries (p = 0) are clamped to the smallest float so that 0 * log 0 = 0: one pass,
    where an ``isfinite`` mask and ``where`` took three."""
    return -(log_p.exp() * log_p.clamp_min(torch.finfo(log_p.dtype).min)).sum(dim=-1)  # (..., V) -> (...)


def _logits_of(output: Any) -> Tensor:
    if isinstance(output, Tensor):
        return output
    if hasattr(output, "logits"):  # HuggingFace ModelOutput
        return output.logits
    if isinstance(output, Mapping) and "logits" in output:
        return output["logits"]
    raise TypeError(f"model output must be a logits tensor or have .logits, got {type(output).__name__}")


def get_response_log_probs(
    model: torch.nn.Module,
    input_ids: Tensor,
    labels: Tensor,
    return_token_entropy: bool = False,
    temperature: float = 1.0,
    **model_kwargs: Any,
) -> dict[str, Tensor]:
    """Per-token log-probs of ``labels`` under ``model(input_ids)``, and optionally entropies.

    Args:
        model: returns logits (B, T, V), as a tensor or an object with ``.logits`` (HF causal LM).
        input_ids: (B, T) token ids (seed-001 layout: right-padded, so no attention mask is needed
            for a causal model; pass one in ``model_kwargs`` if your model wants it).
        labels: (B, T) next-token ids; negative ids (e.g. -100) give log-prob 0 and must be masked.
        return_token_entropy: also return the (B, T) entropy of the next-token distribution.
        temperature: logits are divided by it before ``log_softmax``. The sampler draws from
            softmax(logits / T), so the learner must score the same tempered distribution for the
            importance ratios and on-policy gradients to be right.

    Returns:
        ``{"log_probs": (B, T)}`` (float32, or the logits' dtype if wider), plus
        ``"token_entropy": (B, T)`` (detached) if asked.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids.shape != labels.shape:
        raise ValueError(f"input_ids shape {tuple(input_ids.shape)} != labels shape {tuple(labels.shape)}")
    logits = _logits_of(model(input_ids, **model_kwargs))  # (B, T, V)
    if logits.dtype in (torch.float16, torch.bfloat16):  # log_softmax in half precision is too coarse
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_p = F.log_softmax(logits, dim=-1)  # (B, T, V)
    valid = labels >= 0  # (B, T)
    index = torch.where(valid, labels, torch.zeros_like(labels)).unsqueeze(-1)  # (B, T, 1)
    picked = log_p.gather(dim=-1, index=index).squeeze(-1)  # (B, T)
    out = {"log_probs": torch.where(valid, picked, torch.zeros_like(picked))}  # (B, T)
    if return_token_entropy:
        with torch.no_grad():
            out["token_entropy"] = entropy_from_log_probs(log_p.detach())  # (B, T, V) -> (B, T)
    return out


def response_only_log_probs(
    body: Callable[[Tensor], Tensor],
    head: Callable[[Tensor], Tensor],
    input_ids: Tensor,
    labels: Tensor,
    response_mask: Tensor,
    return_token_entropy: bool = False,
    temperature: float = 1.0,
) -> dict[str, Tensor]:
    """``get_response_log_probs`` at the ``response_mask`` positions (0 elsewhere), with the LM head,
    log-softmax, gather and entropy run on the response tokens' hidden states only.

    Args:
        body: input_ids (B, T) -> final hidden states (B, T, D) (``rlpipe.lm.heads.SplitLM.body``).
        head: (N, D) -> logits (N, V).
        input_ids: (B, T), as for ``get_response_log_probs``.
        labels: (B, T), as for ``get_response_log_probs``.
        response_mask: (B, T) bool, the positions whose log-probs are wanted (labels >= 0 there).
        return_token_entropy: as for ``get_response_log_probs``.
        temperature: as for ``get_response_log_probs``.

    Returns:
        ``{"log_probs": (B, T)}`` float32 (0 off the mask), plus ``"token_entropy": (B, T)``
        (detached, 0 off the mask) if asked. Equal to ``get_response_log_probs`` on the mask up to
        float rounding (the head's matmul runs over N rows instead of B * T).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids.shape != labels.shape or labels.shape != response_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)}, labels {tuple(labels.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must have one shape")
    mask = response_mask.bool()
    if bool((labels[mask] < 0).any()):
        raise ValueError("response_mask selects a position whose label is negative (masked)")
    hidden = body(input_ids)[mask]  # (B, T, D) -> (N, D)
    picked, entropy = _head_log_probs(head, hidden, labels[mask], temperature, return_token_entropy)  # (N,)
    zeros = torch.zeros(mask.shape, dtype=picked.dtype, device=picked.device)  # (B, T)
    out = {"log_probs": zeros.masked_scatter(mask, picked)}  # (B, T)
    if entropy is not None:
        out["token_entropy"] = zeros.masked_scatter(mask, entropy)  # (B, T)
    return out


HEAD_CHUNK_TOKENS = 4096  # response tokens per LM-head / log-softmax chunk (an (N, V) fp32 block each)


def _head_chunk(head: Callable[[Tensor], Tensor], hidden: Tensor, labels: Tensor, temperature: float,
                want_entropy: bool) -> tuple[Tensor, Tensor]:
    """Log-probs (n,) of ``labels`` under ``head(hidden)`` (n, D) -> (n, V), in float32, and the
    detached entropy (n,) (empty unless ``want_entropy``)."""
    logits = head(hidden)  # (n, V)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_p = F.log_softmax(logits, dim=-1)  # (n, V)
    with torch.no_grad():
        entropy = entropy_from_log_probs(log_p.detach()) if want_entropy else log_p.new_empty(0)
    return log_p.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1), entropy  # (n,), (n,)


def _head_log_probs(head: Callable[[Tensor], Tensor], hidden: Tensor, labels: Tensor, temperature: float,
                    want_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """The LM head, log-softmax and gather over ``hidden`` (N, D), ``HEAD_CHUNK_TOKENS`` rows at a
    time: over a 152k vocabulary the (N, V) float32 logits and log-probs of a whole micro-batch are
    the learner's largest tensors. With gradients, each chunk is recomputed in the backward pass
    (``torch.utils.checkpoint``) instead of keeping its (n, V) blocks, so memory holds one chunk's;
    one chunk (N at most the chunk size) runs as a plain call. Same values up to float rounding."""
    N = hidden.shape[0]
    if N <= HEAD_CHUNK_TOKENS:
        picked, entropy = _head_chunk(head, hidden, labels, temperature, want_entropy)
    else:
        parts = []
        for lo in range(0, N, HEAD_CHUNK_TOKENS):
            args = (head, hidden[lo:lo + HEAD_CHUNK_TOKENS], labels[lo:lo + HEAD_CHUNK_TOKENS], temperature,
                    want_entropy)
            if torch.is_grad_enabled() and hidden.requires_grad:
                parts.append(torch.utils.checkpoint.checkpoint(_head_chunk, *args, use_reentrant=False))
            else:
                parts.append(_head_chunk(*args))
        picked, entropy = torch.cat([p for p, _ in parts]), torch.cat([e for _, e in parts])  # (N,)
    return picked, (entropy if want_entropy else None)


# --------------------------------------------------------------------------- token layout


def _as_id_list(ids: Any, what: str, i: int) -> list[int]:
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{what}[{i}] must be a sequence of ints, got {ids!r}")
    return [int(t) for t in ids]


def pack_token_ids(
    prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]], pad_id: int
) -> dict[str, Tensor]:
    """Seed-001 layout from token ids: concat prompt+output, right-pad, shift by one.

    Returns:
        ``input_ids`` (B, T) = all but the last token, ``labels`` (B, T) = all but the first,
        ``response_mask`` (B, T) bool, True where the label is an output token; T + 1 is the
        longest prompt+output. Padding is ``pad_id``.
    """
    if len(prompt_ids) != len(output_ids):
        raise ValueError(f"len(prompt_ids) ({len(prompt_ids)}) != len(output_ids) ({len(output_ids)})")
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty")
    prompts = [_as_id_list(p, "prompt_ids", i) for i, p in enumerate(prompt_ids)]
    outputs = [_as_id_list(o, "output_ids", i) for i, o in enumerate(output_ids)]
    for i, p in enumerate(prompts):
        if not p:  # the first output token is predicted from the last prompt token
            raise ValueError(f"prompt_ids[{i}] is empty; every prompt needs at least one token")
    width = max(len(p) + len(o) for p, o in zip(prompts, outputs, strict=True))  # T + 1
    if width < 2:
        raise ValueError("every sequence has a single token; nothing to predict")
    full = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, T+1)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)  # (B, T+1): True at output tokens
    for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        full[i, : len(p) + len(o)] = torch.tensor(p + o, dtype=torch.long)
        mask[i, len(p): len(p) + len(o)] = True
    return {"input_ids": full[:, :-1], "labels": full[:, 1:], "response_mask": mask[:, 1:]}  # (B, T) each


def pack_response_values(values: Sequence[Tensor], response_mask: Tensor, fill: float = 0.0) -> Tensor:
    """Place per-response-token values (e.g. the sampler's log-probs, each (T_i,)) at the
    ``response_mask`` positions of ``pack_token_ids``'s layout: -> (B, T) float32, ``fill`` elsewhere."""
    counts = response_mask.sum(dim=1).tolist()  # (B,) -> B ints
    if len(values) != response_mask.shape[0]:
        raise ValueError(f"{len(values)} value rows for a mask with {response_mask.shape[0]} rows")
    for i, (v, n) in enumerate(zip(values, counts, strict=True)):
        if v.numel() != n:
            raise ValueError(f"values[{i}] has {v.numel()} entries but response_mask row {i} has {n} tokens")
    out = torch.full(response_mask.shape, fill, dtype=torch.float32)  # (B, T)
    flat = torch.cat([v.reshape(-1).float() for v in values]) if values else torch.zeros(0)  # (sum T_i,)
    # Row-major order of True positions == concatenation order, since each row's mask is contiguous.
    return out.masked_scatter(response_mask.bool(), flat)  # (B, T)


def _encoders(tokenizer: Any) -> tuple[Callable[[str], list[int]], Callable[[str], list[int]]]:
    """(prompt encoder, output encoder). A HF tokenizer adds its special tokens (e.g. BOS) to the
    prompt only; an output is a continuation and must not get them."""
    try:
        accepts_special = "add_special_tokens" in inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        accepts_special = False

    def ids_of(encoded: Any) -> list[int]:
        return list(encoded.ids) if hasattr(encoded, "ids") else list(encoded)

    if accepts_special:
        return (lambda s: ids_of(tokenizer.encode(s)),
                lambda s: ids_of(tokenizer.encode(s, add_special_tokens=False)))
    return (lambda s: ids_of(tokenizer.encode(s)),) * 2


def tokenize_prompt_and_output(
    prompt_strs: Sequence[str], output_strs: Sequence[str], tokenizer: Any
) -> dict[str, Tensor]:
    """Tokenize prompts and outputs separately and lay them out as ``pack_token_ids`` does.

    ``tokenizer`` needs ``.encode(str)`` and ``.pad_token_id`` (an ``rlpipe.lm.tokenizer.Tokenizer`` or a
    HF tokenizer; if ``pad_token_id`` is None, ``eos_token_id`` pads). Padding is masked out anyway.

    Returns:
        ``input_ids``, ``labels``, ``response_mask``: (B, T) each, T + 1 = max(len(prompt) + len(output)).
    """
    if len(prompt_strs) != len(output_strs):
        raise ValueError(f"len(prompt_strs) ({len(prompt_strs)}) != len(output_strs) ({len(output_strs)})")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(tokenizer, "eos_token_id", None)
    if pad_id is None:
        raise ValueError("tokenizer has neither pad_token_id nor eos_token_id to pad with")
    encode_prompt, encode_output = _encoders(tokenizer)
    return pack_token_ids([encode_prompt(p) for p in prompt_strs], [encode_output(o) for o in output_strs],
                          int(pad_id))
