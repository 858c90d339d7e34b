"""Reward functions and prompt templates.

Every text reward function returns ``{"reward", "format_reward", "answer_reward"}`` (floats in
[0, 1]) and never raises, whatever it is given (None, huge or malformed text, odd unicode): bad
input scores zeros. Rules:

* ``keyword_inclusion_reward_fn(response, keywords)`` (seed 000 §3.1): answer = 1 iff every keyword
  occurs in the response under ``mentions_keyword``'s rule (whole words, case-insensitive, simple
  plural; see there). format = 1 iff the response has non-blank text. reward = answer.
* ``r1_zero_reward_fn(response, ground_truth, fast=True)`` (seed 001 §3, the ``r1_zero`` prompt):
  format = 1 iff the response contains ``"</think> <answer>"`` (one space, as the seed grader
  checks) followed later by ``"</answer>"``. The answer is the text between them (the content of
  its last ``\\boxed{}`` if it has one); answer = 1 iff format = 1 and it is equivalent under
  math-verify to the ground truth (or one of them, for a list). reward = answer.
* ``question_only_reward_fn(response, ground_truth, fast=True)`` (seed 004 prompt ablation): no
  format to obey. The answer is the content of the response's last ``\\boxed{}``; without one,
  math-verify's own extraction on the response's last 1,000 characters ("final answer is",
  the last ``$...$``, the last number). format = 1 iff an answer was found; reward = answer.
* Sorting (seed 003 §1): ``sort_distance_reward`` and ``sort_inclusion_ordering_reward`` are the
  seed's functions, exact (they return the raw counts). ``sort_*_reward_fn(response, prompt)`` wrap
  them for text/list responses as documented there, dividing by the maximum to land in [0, 1].

Departures from the seeds and why:

* Equivalence is decided by math-verify instead of the course's ``drgrpo_grader`` (not available
  here). Answer and ground truth are each wrapped in ``$...$`` before parsing (unless they already
  hold a ``$``) because math-verify only reads LaTeX inside delimiters: bare ``\\frac12`` parses
  to nothing. ``fast=True`` (default) compares that one reading strictly. ``fast=False`` is the
  lenient mode (as the seed grader's non-fast path adds checks): it also tries math-verify's
  reading of the undelimited text (prose, last number) and ``strict=False`` (sets vs tuples,
  variables matched by position); it accepts more answers, including some wrong ones.
* math-verify's default timeouts use ``signal.alarm``, which fails off the main thread (Ray actors,
  thread pools) and would make rewards depend on machine speed. We switch them off and bound the
  work instead, deterministically: answers over 400 characters or with brackets nested over 10
  deep are not parsed (the LaTeX parser is slow on deep nesting), and parsed expressions that would
  make sympy evaluate huge numbers (over 10,000 digits, e.g. ``10^{10^{10}}``, ``(2^{100})!``),
  expand high powers of sums (exponent over 100) or do integrals/limits/products are discarded.
  Such answers score 0. Calls into math-verify hold one lock (the ANTLR parser caches are shared).
* An empty keyword list scores 0, not a vacuous 1: no task asks for zero keywords, and a free
  reward would hide a data bug.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import math
import re
import threading
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

RewardDict = dict[str, float]

MAX_ANSWER_CHARS = 400  # longer extracted answers are not parsed (MATH answers are far shorter)
MAX_BRACKET_DEPTH = 10  # deeper ( [ { nesting is not parsed: the LaTeX parser slows steeply with depth
MAX_TAIL_CHARS = 1000  # question_only without \boxed: only the response's tail is searched
MAX_NODES = 300  # parsed expressions with more sympy nodes are discarded
MAX_DIGITS = 10_000  # numbers that could exceed this many digits are discarded
MAX_SYMBOLIC_EXPONENT = 100  # (x+1)^{n}: expanding beyond this is slow


def _zeros() -> RewardDict:
    return {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}


def _scores(format_ok: bool, answer_ok: bool, reward: float | None = None) -> RewardDict:
    r = float(answer_ok) if reward is None else float(reward)
    return {"reward": r, "format_reward": float(format_ok), "answer_reward": float(answer_ok)}


def _never_raise(fn: Callable[..., RewardDict]) -> Callable[..., RewardDict]:
    """Reward functions score bad input as zeros instead of crashing a rollout batch."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> RewardDict:
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the contract is "never raise"; log so bugs stay visible
            logger.warning("%s failed; scoring 0", fn.__name__, exc_info=True)
            return _zeros()

    return wrapper


# --------------------------------------------------------------------------- prompt templates

PROMPT_NAMES = ("r1_zero", "question_only")


@functools.lru_cache(maxsize=None)
def load_prompt(name: str) -> str:
    """The template ``rlpipe/prompts/<name>.prompt`` (package data), without the file's final
    newline, so ``r1_zero`` ends exactly with ``"Assistant: <think>"``."""
    if name not in PROMPT_NAMES:
        raise ValueError(f"unknown prompt {name!r}; prompts: {list(PROMPT_NAMES)}")
    text = importlib.resources.files("rlpipe").joinpath("prompts", f"{name}.prompt").read_text("utf-8")
    return text.removesuffix("\n")


def format_prompt(name: str, question: str) -> str:
    """Insert ``question`` at ``{question}``. Plain replacement, not ``str.format``: questions are
    full of LaTeX braces."""
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    return load_prompt(name).replace("{question}", question)


# --------------------------------------------------------------------------- keyword inclusion

_WORD = re.compile(r"\w+")
_SEPARATOR = r"[\s\-]+"  # between the words of a multi-word keyword: any whitespace or hyphens


def _normalise(text: str) -> str:
    # NFKC makes composed/decomposed accents and compatibility forms compare equal; casefold is
    # unicode-aware lower-casing ("STRASSE" == "Straße").
    return unicodedata.normalize("NFKC", text).casefold()


def _plural_alternatives(word: str) -> str:
    """Regex for ``word`` or its regular English plural."""
    forms = [re.escape(word)]
    if len(word) >= 2 and word.endswith("y") and word[-2] not in "aeiou":
        forms.append(re.escape(word[:-1]) + "ies")  # baby -> babies
    if word.endswith(("s", "x", "z", "ch", "sh", "o")):
        forms.append(re.escape(word) + "es")  # box -> boxes, potato -> potatoes
    if not word.endswith(("s", "x", "z", "ch", "sh")):
        forms.append(re.escape(word) + "s")  # dog -> dogs, day -> days, photo -> photos
    return "(?:" + "|".join(forms) + ")"


@functools.lru_cache(maxsize=8192)
def _keyword_regex(keyword: str) -> re.Pattern[str] | None:
    words = _WORD.findall(_normalise(keyword))
    if not words:
        return None
    parts = [re.escape(w) for w in words[:-1]] + [_plural_alternatives(words[-1])]
    return re.compile(r"(?<!\w)" + _SEPARATOR.join(parts) + r"(?!\w)")


def mentions_keyword(text: str, keyword: str) -> bool:
    """Whether ``keyword`` occurs in ``text``. The rule:

    * both are NFKC-normalised and case-folded;
    * the keyword is split into words (runs of unicode letters, digits, ``_``); its other
      characters only separate words; a keyword with no word characters never matches;
    * the words must appear in order as whole words (no letter, digit or ``_`` touching either
      end: "cat" is not found in "category" or "bobcat", but is in "Cat!", "(cat)", "cat's"),
      separated by any run of whitespace or hyphens ("ice cream" matches "ice-cream");
    * the last word may carry a regular plural: +s, +es after s/x/z/ch/sh/o, consonant+y -> ies
      ("box" -> "boxes", "baby" -> "babies"); irregular plurals ("mice") do not count, nor does a
      singular response word for a plural keyword.
    """
    pattern = _keyword_regex(keyword)
    return pattern is not None and pattern.search(_normalise(text)) is not None


@_never_raise
def keyword_inclusion_reward_fn(response: str, keywords: str | Sequence[str]) -> RewardDict:
    """Seed 000 §3.1: 1 iff every keyword is in the response (``mentions_keyword``). ``keywords``
    is one keyword (a str, possibly several words: a phrase) or a list of them; an empty list, or a
    keyword that is not a str, scores 0. format_reward = 1 iff the response has non-blank text."""
    if not isinstance(response, str):
        return _zeros()
    kws = [keywords] if isinstance(keywords, str) else list(keywords)
    ok = bool(kws) and all(isinstance(k, str) and mentions_keyword(response, k) for k in kws)
    return _scores(bool(response.strip()), ok)


# --------------------------------------------------------------------------- answer extraction

_R1_OPEN, _R1_CLOSE = "</think> <answer>", "</answer>"
_TAG = re.compile(r"</?[A-Za-z_][\w-]*>")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (braces balanced, ``\\{``/``\\}`` skipped);
    None when there is none or it never closes."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped character, e.g. the set braces \{ \}
            continue
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return text[start + len("\\boxed{"):i]
        i += 1
    return None


def r1_zero_answer(response: str) -> str | None:
    """The text between the first ``"</think> <answer>"`` and the next ``"</answer>"``; None when
    the response does not have that format."""
    open_at = response.find(_R1_OPEN)
    if open_at < 0:
        return None
    start = open_at + len(_R1_OPEN)
    end = response.find(_R1_CLOSE, start)
    return None if end < 0 else response[start:end]


def _bracket_depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return deepest


# --------------------------------------------------------------------------- math-verify, bounded

# math-verify and its ANTLR LaTeX parser share caches between calls; one lock keeps concurrent
# graders (thread pools, threaded actors) from interleaving in them. It costs nothing real: the
# work is pure Python and would hold the GIL anyway.
_MV_LOCK = threading.RLock()


@functools.lru_cache(maxsize=1)
def _sympy() -> Any:
    import sympy  # imported lazily: the keyword task never needs sympy's slow import

    return sympy


def _log10_bound(node: Any, memo: dict[int, float | None]) -> float | None:
    """Upper bound on log10(max(|v|, 1/|v|)) for a numeric sub-expression built from literals,
    + * ^ and !, computed without evaluating it; None when unknown (symbols, other functions)."""
    key = id(node)
    if key in memo:
        return memo[key]
    sp = _sympy()
    out: float | None = None
    if isinstance(node, sp.Rational):  # Integer included
        out = max(abs(int(node.p)).bit_length(), int(node.q).bit_length()) * math.log10(2)
    elif isinstance(node, sp.Float):
        v = abs(float(node))
        out = 0.0 if v == 0 else (math.inf if math.isinf(v) else abs(math.log10(v)))
    elif isinstance(node, sp.NumberSymbol):  # pi, E
        out = 1.0
    elif isinstance(node, (sp.Add, sp.Mul)) and node.args:
        parts = [_log10_bound(a, memo) for a in node.args]
        if all(p is not None for p in parts):
            out = max(parts) + math.log10(len(parts)) if isinstance(node, sp.Add) else sum(parts)
    elif isinstance(node, sp.Pow):
        base, exp = _log10_bound(node.base, memo), _log10_bound(node.exp, memo)
        if base is not None and exp is not None:  # |b^e| <= max(|b|, 1/|b|)^|e|
            out = math.inf if exp > 7 else (10.0**exp) * base
    elif isinstance(node, sp.factorial):
        arg = _log10_bound(node.args[0], memo)
        if arg is not None:  # log10(n!) <= n log10(n)
            out = math.inf if arg > 7 else (10.0**arg) * max(arg, 1.0)
    memo[key] = out
    return out


def _cheap_to_compare(expr: Any) -> bool:
    """False for parsed answers whose comparison could make sympy run for minutes (see module doc)."""
    sp = _sympy()
    slow = (sp.Integral, sp.Product, sp.Limit, sp.Derivative)
    memo: dict[int, float | None] = {}
    stack, seen = [expr], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return False
        if isinstance(node, sp.MatrixBase):
            stack.extend(node)  # its entries
            continue
        if not isinstance(node, sp.Basic):
            continue
        if isinstance(node, slow):
            return False
        if isinstance(node, (sp.Pow, sp.factorial)):
            digits = _log10_bound(node, memo)
            if digits is not None and digits > MAX_DIGITS:
                return False
        if isinstance(node, sp.Pow) and not node.base.is_Symbol and node.base.free_symbols:
            exp = _log10_bound(node.exp, memo)
            if exp is not None and exp > math.log10(MAX_SYMBOLIC_EXPONENT):
                return False
        stack.extend(node.args)
    return True


def _parse(text: str, max_chars: int = MAX_ANSWER_CHARS + 2) -> tuple[Any, ...]:
    """math-verify's parse of ``text`` without signal timeouts, minus expensive expressions.
    Callers hold ``_MV_LOCK``."""
    if len(text) > max_chars or _bracket_depth(text) > MAX_BRACKET_DEPTH:
        return ()
    from math_verify import parse

    parsed = parse(text, parsing_timeout=None)
    return tuple(p for p in parsed if isinstance(p, str) or _cheap_to_compare(p))


_DOLLAR = re.compile(r"(?<!\\)\$")  # a math delimiter; an escaped \$ is a dollar sign


def _readings(answer: str, lenient: bool) -> tuple[Any, ...]:
    """Parsed readings of an answer: the ``$...$``-wrapped text (or the text itself if it already
    holds an unescaped ``$``); in lenient mode also math-verify's reading of the bare text (prose, last number)."""
    answer = answer.strip()
    if not answer:
        return ()
    if _DOLLAR.search(answer):
        return _parse(answer)
    wrapped = _parse(f"${answer}$")
    return wrapped + _parse(answer) if lenient else wrapped


@functools.lru_cache(maxsize=4096)
def _gold_readings(gold: str) -> tuple[Any, ...]:
    """Readings of one ground truth (cached: a group's G responses share it). A ``\\boxed{}`` gold
    (a full solution) is reduced to its content; a gold with no math reading also gets the bare-text
    reading."""
    boxed = last_boxed(gold) if "\\boxed{" in gold else None
    readings = _readings(boxed if boxed is not None else gold, lenient=False)
    if all(isinstance(r, str) for r in readings):
        readings = readings + _readings(gold, lenient=True)
    return readings


def _ground_truths(ground_truth: Any) -> list[str]:
    """Acceptable answers as strings: a str or number, or a list/tuple of them (others dropped)."""
    items = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    out = []
    for g in items:
        if isinstance(g, (int, float)) and not isinstance(g, bool):
            g = str(g)
        if isinstance(g, str) and g.strip():
            out.append(g)
    return out


def _verify_any(preds: tuple[Any, ...], ground_truth: Any, fast: bool) -> bool:
    """Whether any parsed prediction equals any acceptable ground truth. Caller holds the lock."""
    from math_verify import verify

    if not preds:
        return False
    for gold in _ground_truths(ground_truth):
        golds = _gold_readings(gold)
        if golds and verify(list(golds), list(preds), strict=fast, timeout_seconds=None):
            return True
    return False


def answers_match(answer: str, ground_truth: Any, fast: bool = True) -> bool:
    """Whether ``answer`` (extracted answer text) equals the ground truth (a str or number, or a
    list of acceptable ones) under math-verify; ``fast`` as in the module doc. Thread-safe."""
    if not isinstance(answer, str):
        return False
    with _MV_LOCK:
        return _verify_any(_readings(answer, lenient=not fast), ground_truth, fast)


# --------------------------------------------------------------------------- MATH graders


@_never_raise
def r1_zero_reward_fn(response: str, ground_truth: Any, fast: bool = True) -> RewardDict:
    """Grade a continuation of the ``r1_zero`` prompt (it starts inside ``<think>``).

    format_reward = 1 iff ``"</think> <answer>"`` and then ``"</answer>"`` occur. The answer is the
    text between them, or the content of its last ``\\boxed{}`` when it has one (an unclosed
    ``\\boxed{`` is no answer). answer_reward = 1 iff format_reward = 1 and ``answers_match``.
    reward = answer_reward (so 1 only when format and answer are both right).
    """
    if not isinstance(response, str):
        return _zeros()
    answer = r1_zero_answer(response)
    if answer is None:
        return _zeros()
    if "\\boxed{" in answer:
        answer = last_boxed(answer)
    return _scores(True, answer is not None and answers_match(answer, ground_truth, fast))


@_never_raise
def question_only_reward_fn(response: str, ground_truth: Any, fast: bool = True) -> RewardDict:
    """Grade a response to the bare-question prompt (no format requirement).

    The answer is the content of the last ``\\boxed{}`` (an unclosed or empty one: no answer);
    without one, math-verify reads the last ``MAX_TAIL_CHARS`` characters itself, XML-like tags
    replaced by spaces (its "final answer is" anchors, the last ``$...$``, the last number). format_reward = 1 iff an answer was found;
    reward = answer_reward.
    """
    if not isinstance(response, str):
        return _zeros()
    with _MV_LOCK:
        if "\\boxed{" in response:
            boxed = last_boxed(response)
            preds = _readings(boxed, lenient=not fast) if boxed is not None else ()
        else:
            # Tags glued to a number ("<answer>5</answer>") hide it from math-verify's number regex.
            tail = _TAG.sub(" ", response[-MAX_TAIL_CHARS:])
            preds = _parse(tail, max_chars=MAX_TAIL_CHARS)
        if not preds:
            return _zeros()
        return _scores(True, _verify_any(preds, ground_truth, fast))


# --------------------------------------------------------------------------- sorting (seed 003)


def _as_list(x: Any) -> list:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _check_lengths(prompt: list, response: list) -> None:
    if len(prompt) != len(response):
        raise ValueError(f"prompt and response lengths differ: {len(prompt)} != {len(response)}")


def _distance(prompt: list, response: list) -> int:
    return sum(1 for x, y in zip(response, sorted(prompt)) if x == y)


def _inclusion_ordering(prompt: list, response: list) -> int:
    inclusion = sum(1 for x in prompt if x in response)  # prompt tokens present in the response
    ordering = sum(1 for x, y in zip(response, response[1:]) if x <= y)  # sorted adjacent pairs
    return inclusion + ordering


def sort_distance_reward(prompt: Sequence[int], response: Sequence[int]) -> float:
    """Seed 003: the number of positions where ``response`` equals ``sorted(prompt)``. Lists or 1-D
    tensors of equal length (a ValueError otherwise, the seed's assert)."""
    p, r = _as_list(prompt), _as_list(response)
    _check_lengths(p, r)
    return float(_distance(p, r))


def sort_inclusion_ordering_reward(prompt: Sequence[int], response: Sequence[int]) -> float:
    """Seed 003: one point per prompt token that appears in the response, plus one per adjacent
    response pair with ``x <= y``. Equal lengths required, as in the seed."""
    p, r = _as_list(prompt), _as_list(response)
    _check_lengths(p, r)
    return float(_inclusion_ordering(p, r))


def _int_items(values: list) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _sort_response(response: Any, n: int) -> tuple[list[int], bool] | None:
    """The first ``n`` integers of a response (text: every ``-?\\d+`` in order; list/tensor: its
    items) and whether it held exactly ``n``; None when it is neither."""
    if isinstance(response, str):
        found = re.findall(r"-?\d+", response)
        if any(len(f) > 64 for f in found):  # absurd numbers: no valid answer, and int() caps digits
            return None
        nums = [int(f) for f in found]
    elif response is None or isinstance(response, (bytes, dict, set)):
        return None
    else:
        nums = _as_list(response)
        if not _int_items(nums):
            return None
    return nums[:n], len(nums) == n


def _sort_reward_dict(response: Any, prompt: Any, score: Callable[[list, list], int],
                      best: Callable[[int], int]) -> RewardDict:
    p = _as_list(prompt)
    if not p or not _int_items(p):
        return _zeros()
    parsed = _sort_response(response, len(p))
    if parsed is None:
        return _zeros()
    nums, exact_count = parsed
    solved = exact_count and nums == sorted(p)
    return _scores(exact_count, solved, reward=score(p, nums) / best(len(p)))


@_never_raise
def sort_distance_reward_fn(response: Any, prompt: Any) -> RewardDict:
    """``sort_distance_reward / n`` as a task reward (``prompt``: the n numbers to sort, a list or
    tensor). ``response``: text (its integers are read in order) or a list/tensor of ints. Only its
    first n numbers are scored and missing ones earn nothing (no padding, so no free ordering
    points). format_reward = 1 iff it holds exactly n numbers; answer_reward = 1 iff it also equals
    sorted(prompt); reward = the normalised partial credit. Malformed input scores zeros."""
    return _sort_reward_dict(response, prompt, _distance, lambda n: n)


@_never_raise
def sort_inclusion_ordering_reward_fn(response: Any, prompt: Any) -> RewardDict:
    """``sort_inclusion_ordering_reward / (2n - 1)`` (n inclusion points + n - 1 sorted pairs) as a
    task reward; responses, format_reward and answer_reward as in ``sort_distance_reward_fn``."""
    return _sort_reward_dict(response, prompt, _inclusion_ordering, lambda n: 2 * n - 1)


# --------------------------------------------------------------------------- registries

REWARD_FNS: dict[str, Callable[..., RewardDict]] = {
    "keyword_inclusion": keyword_inclusion_reward_fn,
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
}

SORT_REWARD_FNS: dict[str, Callable[..., RewardDict]] = {
    "sort_distance": sort_distance_reward_fn,
    "sort_inclusion_ordering": sort_inclusion_ordering_reward_fn,
}
