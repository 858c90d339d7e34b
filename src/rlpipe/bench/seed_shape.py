"""The shapes of the seed-scale GRPO step (``rlpipe.bench.seed_step``): how long each response and
each prompt is, and the random-weight policy directory the pipeline's own actors load.

Response lengths. Random weights never stop on their own (EOS has probability about 1/V per
token), so each row is capped at a drawn length (``generate``'s ``row_max_tokens``), as a trained
policy stops at ``</answer>``. The lengths are a gamma distribution of shape 2 (an Erlang-2: right
skewed with a long tail, as response lengths are) clipped to ``[lo, max_tokens]``, its scale solved
so that the clipped mean is the target (seed 001's step: mean 400, rows up to 1024). Not random
draws but the distribution's quantiles at ``(i + 0.5) / n`` for ``n`` rows, so every run has exactly
the target's mean and tail (the longest few percent of rows reach ``max_tokens``), assigned to rows
in an order shuffled with a fixed seed (so groups mix short and long answers).

Prompt lengths (``r1_zero``, seed 001's prompt). No Qwen tokenizer is at hand offline, so a prompt's
token count is estimated: the template's characters at ``CHARS_PER_TOKEN`` (byte-level BPE
vocabularies of Qwen's size average about four characters per token of English) plus a MATH
question's tokens, drawn the same way (quantiles of a clipped gamma of shape 2, mean
``QUESTION_MEAN_TOKENS``). The token ids themselves are random.

The policy. ``transformers``' ``Qwen2ForCausalLM`` of the given config with random weights, saved
as a local HF directory with a stand-in tokenizer: a word-level ``tokenizers`` vocabulary of the
model's full size (``<|endoftext|>`` at id 0, then one word per id), so that decoding a response
costs what a real tokenizer's decode costs, while no id is unknown. Its words hold no ``>``, so no
row is ever a candidate for the ``</answer>`` stop string (random text would seldom be one either).
The pipeline's ``Generator`` and ``Learner`` load this directory exactly as they load
``models/Qwen2.5-Math-1.5B``.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from rlpipe.bench.qwen_step import build_policy
from rlpipe.tasks.math.prompt import load_prompt

#: characters per token of the r1_zero template's English (an estimate: no Qwen tokenizer offline)
CHARS_PER_TOKEN = 4.0
#: a MATH question's mean length in tokens (with its LaTeX), and its clip range
QUESTION_MEAN_TOKENS, QUESTION_TOKENS_RANGE = 70, (8, 400)
#: the gamma's shape: an Erlang-2 (its CDF has a closed form)
SHAPE = 2
EOS = "<|endoftext|>"


def erlang2_quantile(p: float, scale: float) -> float:
    """The ``p`` quantile of a gamma of shape 2 and ``scale``: the ``x`` with
    ``1 - exp(-x/scale) (1 + x/scale) = p`` (bisection; the CDF rises monotonically)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    lo, hi = 0.0, 1.0
    while 1.0 - math.exp(-hi) * (1.0 + hi) < p:
        hi *= 2.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 1.0 - math.exp(-mid) * (1.0 + mid) < p:
            lo = mid
        else:
            hi = mid
    return scale * (lo + hi) / 2


def clipped_lengths(n: int, mean: float, lo: int, hi: int, seed: int = 0) -> list[int]:
    """``n`` lengths in ``[lo, hi]``: the quantiles at ``(i + 0.5) / n`` of a shape-2 gamma clipped to
    ``[lo, hi]``, its scale solved so that their mean is ``mean`` (to rounding), shuffled by ``seed``."""
    if not (n >= 1 and 1 <= lo < mean < hi):
        raise ValueError(f"need n >= 1 and 1 <= lo < mean < hi, got n={n}, lo={lo}, mean={mean}, hi={hi}")
    base = [erlang2_quantile((i + 0.5) / n, 1.0) for i in range(n)]

    def lengths(scale: float) -> list[int]:
        return [min(hi, max(lo, round(b * scale))) for b in base]

    a, b = 0.0, float(hi)  # the clipped mean grows with the scale: lo at 0, hi at a large one
    while sum(lengths(b)) / n < mean:
        b *= 2
    for _ in range(60):
        mid = (a + b) / 2
        a, b = (mid, b) if sum(lengths(mid)) / n < mean else (a, mid)
    out = lengths(b)
    random.Random(seed).shuffle(out)
    return out


def r1_zero_template_tokens() -> int:
    """The r1_zero template's length in tokens without its question (``CHARS_PER_TOKEN``)."""
    return math.ceil(len(load_prompt("r1_zero").replace("{question}", "")) / CHARS_PER_TOKEN)


def prompt_lengths(n_prompts: int, seed: int = 0, question_mean: float = QUESTION_MEAN_TOKENS,
                   question_range: tuple[int, int] = QUESTION_TOKENS_RANGE) -> list[int]:
    """Token counts of ``n_prompts`` r1_zero prompts: the template plus a drawn question each."""
    lo, hi = question_range
    return [r1_zero_template_tokens() + q for q in clipped_lengths(n_prompts, question_mean, lo, hi, seed)]


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    """Random token ids (never id 0, the stand-in tokenizer's EOS) of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def stand_in_tokenizer(vocab: int):
    """A word-level ``tokenizers.Tokenizer`` of ``vocab`` ids: ``<|endoftext|>`` at 0, ``w<i>`` at i."""
    tok = Tokenizer(models.WordLevel({EOS: 0, **{f"w{i}": i for i in range(1, vocab)}}, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def write_policy_dir(cfg, path: Path, device: torch.device | str) -> Path:
    """A local HF directory at ``path``: ``Qwen2ForCausalLM(cfg)`` with random weights (created on
    ``device`` in bf16, as the generator holds them; the learner's fp32 masters load them exactly)
    and the stand-in tokenizer of ``cfg.vocab_size``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = build_policy(cfg, device, torch.bfloat16)
    model.save_pretrained(str(path))
    del model
    stand_in_tokenizer(cfg.vocab_size).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "pad_token": EOS}))
    return path
