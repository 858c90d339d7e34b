"""Answer extraction and math-verify grading, bounded in time (seed 001 §3's grader).

The calls: ``answers_match`` (an extracted answer against a ground truth; what the default and
``strict`` mode accept), ``parses`` (a dataset's ground truth has a value), ``last_boxed`` and
``r1_zero_answer`` (extraction), ``configure_math_grader`` (isolation, time limit, strict default);
``rlpipe.tasks.math.reward`` builds the rewards on them.

Departures from the seeds, and where each is explained:

* equivalence is decided by math-verify instead of the course's ``drgrpo_grader`` (not available
  here): how an answer is read, and the lenient ``fast=False`` mode, in ``_reading_groups``;
* plain math-verify got three kinds of answer wrong against a reference MATH grader (percentages,
  ``\\varnothing``, choice letters); the fixes, and strict mode's checks, are in
  ``rlpipe.tasks.math.answer_forms``;
* bounded in time: deterministic screening before sympy sees an answer (``_parse``), then
  math-verify in a child process killed after ``GRADER_TIMEOUT_S`` per answer
  (``rlpipe.tasks.math.grader_process``). Both score 0; only answers that hit the time limit make
  a reward depend on machine speed. If no child process can be started, grading falls back to
  this process, unbounded, with a warning (``_grade``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import re
import threading
from typing import Any

from rlpipe.tasks.math.answer_forms import (
    DOLLAR,
    PERCENT,
    choice_letters,
    exact,
    form_ok,
    lazy_sympy,
    normalise,
)
from rlpipe.tasks.math.grader_process import GraderProcess, serve

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 400  # longer extracted answers are not parsed (MATH answers are far shorter)
MAX_BRACKET_DEPTH = 10  # deeper ( [ { nesting is not parsed: the LaTeX parser slows steeply with depth
MAX_TAIL_CHARS = 1000  # question_only without \boxed: only the response's tail is searched
MAX_NODES = 300  # parsed expressions with more sympy nodes are discarded
MAX_DIGITS = 10_000  # numbers that could exceed this many digits are discarded
MAX_SYMBOLIC_EXPONENT = 100  # (x+1)^{n}: expanding beyond this is slow


# --------------------------------------------------------------------------- answer extraction

_R1_OPEN, _R1_CLOSE = "</think> <answer>", "</answer>"
_TAG = re.compile(r"</?[A-Za-z_][\w-]*>")


def last_boxed(text: str, max_chars: int = 10_000) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (braces balanced, ``\\{``/``\\}`` skipped);
    None when there is none, or it does not close within ``max_chars``."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth, stop = 1, min(len(text), i + max_chars)
    while i < stop:
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


def _log10_bound(node: Any, memo: dict[int, float | None]) -> float | None:
    """Upper bound on log10(max(|v|, 1/|v|)) for a numeric sub-expression built from literals,
    + * ^ and !, computed without evaluating it; None when unknown (symbols, other functions)."""
    key = id(node)
    if key in memo:
        return memo[key]
    sp = lazy_sympy()
    out: float | None = None
    if isinstance(node, sp.Rational):  # Integer included
        out = max(math.log10(abs(int(node.p)) or 1), math.log10(int(node.q)))  # exact for big ints
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
    """False for parsed answers whose comparison could make sympy run for minutes (see ``_parse``)."""
    sp = lazy_sympy()
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
    Callers hold ``_MV_LOCK``.

    math-verify's own timeouts use ``signal.alarm``, which fails off the main thread, so they are
    off (``parsing_timeout=None``, ``timeout_seconds=None``) and this screening bounds the work
    deterministically instead: answers over ``MAX_ANSWER_CHARS`` (400) characters or with brackets
    nested over ``MAX_BRACKET_DEPTH`` (10) deep are not parsed (the LaTeX parser slows steeply with
    depth), and parsed expressions that would make sympy build numbers over ``MAX_DIGITS`` (10,000)
    digits (``10^{10^{10}}``, ``(2^{100})!``), expand powers over ``MAX_SYMBOLIC_EXPONENT`` (100) of
    sums, or do integrals/limits/products are dropped (``_cheap_to_compare``). What it cannot
    foresee, the grader's child process bounds in time (``rlpipe.tasks.math.grader_process``)."""
    if len(text) > max_chars or _bracket_depth(text) > MAX_BRACKET_DEPTH:
        return ()
    from math_verify import parse

    parsed = parse(text, parsing_timeout=None)
    return tuple(p for p in parsed if isinstance(p, str) or _cheap_to_compare(p))


# --------------------------------------------------------------------------- readings and verification


def _reading_groups(answer: str, lenient: bool, strict: bool = False) -> tuple[tuple[Any, ...], ...]:
    """Parsed readings of an answer, one group per parse (sympy reading, normalised string): the
    ``$...$``-wrapped text (or the text itself if it already holds an unescaped ``$``); in lenient
    mode also math-verify's reading of the bare text (prose, last number). A percentage is also read
    as its number (``12.5\\%`` as 12.5 besides 0.125); in strict mode only as its number, and
    decimals are exact (``exact``).

    The wrapping: math-verify only reads LaTeX inside delimiters, so a bare ``\\frac12`` would parse
    to nothing. ``fast=True`` (the default) compares that one reading strictly; ``fast=False`` is
    the lenient mode (as the seed grader's non-fast path adds checks): the bare-text reading too, and
    math-verify's ``strict=False`` (sets vs tuples, variables matched by position), which accepts
    more answers, including some wrong ones."""
    answer = normalise(answer)
    if not answer:
        return ()
    texts = [answer]
    number = PERCENT.sub("", answer, count=1).strip()
    if number != answer and number.strip("$ "):
        texts = [number] if strict else [answer, number]
    groups: list[tuple[Any, ...]] = []
    for text in texts:
        if DOLLAR.search(text):
            groups.append(_parse(text))
            continue
        groups.append(_parse(f"${text}$"))
        if lenient:
            groups.append(_parse(text))
    if strict:
        groups = [tuple(exact(r) for r in g) for g in groups]
    return tuple(g for g in groups if g)


def _readings(answer: str, lenient: bool, strict: bool = False) -> tuple[Any, ...]:
    return tuple(r for group in _reading_groups(answer, lenient, strict) for r in group)


def _gold_text(gold: str) -> str:
    """A ``\\boxed{}`` gold (a full solution) reduced to the box's content."""
    boxed = last_boxed(gold) if "\\boxed{" in gold else None
    return boxed if boxed is not None else gold


@functools.lru_cache(maxsize=4096)
def _gold_readings(gold: str, strict: bool = False) -> tuple[Any, ...]:
    """Readings of one ground truth (cached: a group's G responses share it): those of
    ``_gold_text``; a gold with no math reading also gets the bare-text reading."""
    readings = _readings(_gold_text(gold), lenient=False, strict=strict)
    if all(isinstance(r, str) for r in readings):
        readings = readings + _readings(gold, lenient=True, strict=strict)
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


def _verify_any(groups: tuple[tuple[Any, ...], ...], letters: tuple[str, ...] | None, ground_truth: Any,
                fast: bool, strict: bool) -> bool:
    """Whether the parsed answer (``groups``; ``letters`` if it is a list of choice letters) equals
    any acceptable ground truth. Two choice-letter lists are compared as letters; strict mode
    drops readings not in simplest form (``form_ok``). Caller holds the lock."""
    from math_verify import verify

    for gold in _ground_truths(ground_truth):
        gold_letters = choice_letters(_gold_text(gold)) if letters is not None else None
        if gold_letters is not None:
            if letters == gold_letters:
                return True
            continue
        golds = _gold_readings(gold, strict)
        preds = [r for g in groups if not strict or form_ok(g, golds) for r in g]
        if golds and preds and verify(list(golds), preds, strict=fast, timeout_seconds=None):
            return True
    return False


def _grade_local(kind: str, text: str, golds: list[str], fast: bool, strict: bool = False) -> tuple[bool, bool]:
    """(an answer was read, it matches a gold), in this process. ``kind``: "answer" (an extracted
    answer: ``_reading_groups``) or "prose" (free text: math-verify's own extraction)."""
    with _MV_LOCK:
        if kind == "prose":
            parsed = _parse(_TAG.sub(" ", text), max_chars=MAX_TAIL_CHARS)
            if strict:
                parsed = tuple(exact(r) for r in parsed)
            groups, letters = ((parsed,) if parsed else ()), None
        else:
            groups = _reading_groups(text, lenient=not fast, strict=strict)
            letters = choice_letters(text)
        return bool(groups) or letters is not None, _verify_any(groups, letters, golds, fast, strict)


# --------------------------------------------------------------------------- the time bound

GRADER_TIMEOUT_S = 10.0  # per answer; far above the ~0.01-0.3 s a screened answer takes


def _handle(req: dict[str, Any]) -> tuple[bool, bool]:
    return _grade_local(req["kind"], req["text"], req["golds"], req["fast"], req.get("strict", False))


def _warm_up() -> None:
    import math_verify  # noqa: F401 - imported before the child says "ready"

    lazy_sympy()


def _serve_grader() -> None:
    """The grader's child process (``grader_process.serve``)."""
    serve(_handle, _warm_up)


_GRADER = GraderProcess("from rlpipe.tasks.math.grader import _serve_grader; _serve_grader()")
atexit.register(_GRADER.close)
os.register_at_fork(after_in_child=_GRADER.forget_after_fork)
_ISOLATED = True
_STRICT = False


def configure_math_grader(isolated: bool = True, timeout_s: float = 10.0, strict: bool = False) -> None:
    """``isolated=False`` grades in this process with no time limit (no child process; a
    pathological answer can then hang the caller). ``timeout_s``: per answer when isolated.
    ``strict``: the default for calls that pass ``strict=None`` (see ``answers_match``); it travels
    to the child process with each request."""
    global _ISOLATED, GRADER_TIMEOUT_S, _STRICT
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {strict!r}")
    _ISOLATED, GRADER_TIMEOUT_S, _STRICT = isolated, float(timeout_s), strict
    if not isolated:
        _GRADER.close()


def _grade(kind: str, text: str, ground_truth: Any, fast: bool, strict: bool | None = None) -> tuple[bool, bool]:
    global _ISOLATED
    strict = _STRICT if strict is None else bool(strict)
    golds = _ground_truths(ground_truth)
    if not text.strip() or (kind == "answer" and len(text.strip()) > MAX_ANSWER_CHARS):
        return False, False  # (too long: it would not be parsed anyway; don't ship it to the child)
    if _ISOLATED:
        payload = {"kind": kind, "text": text, "golds": golds, "fast": bool(fast), "strict": strict}
        try:
            reply = _GRADER.request(payload, GRADER_TIMEOUT_S)
        except (OSError, RuntimeError):
            logger.warning("cannot start the math grader process; grading in-process from now on",
                           exc_info=True)
            _ISOLATED = False
        else:
            if reply is None:
                logger.warning("math grading of %r took over %.3g s; scoring 0", text[:80], GRADER_TIMEOUT_S)
                return False, False
            return reply
    return _grade_local(kind, text, golds, fast, strict)


def answers_match(answer: str, ground_truth: Any, fast: bool = True, strict: bool | None = None) -> bool:
    """Whether ``answer`` (extracted answer text) equals the ground truth (a str or number, or a
    list of acceptable ones) under math-verify; ``fast`` as in ``_reading_groups``, ``strict`` (None:
    the configured default) below. Thread-safe.

    The default (``strict=False``) is math-verify's equivalence with the fixes of
    ``rlpipe.tasks.math.answer_forms``, more lenient than the course's grader (the PRM800K/Hendrycks
    rules behind ``drgrpo_grader``): it accepts unsimplified answers (``2+2``, ``5!``,
    ``\\frac{2}{4}``, ``10^{3}`` for 4, 120, 1/2, 1000) and decimals rounded to 6 places
    (``0.333333`` for 1/3, ``1.414214`` for sqrt 2). RL reward keeps that leniency. ``strict=True``
    is for accuracies to compare with numbers published with the course's grader: decimals are
    exact (``0.5`` = 1/2, ``0.125`` = 1/8, but ``0.333333`` != 1/3 and ``1.414214`` != sqrt 2;
    sympy's 15-digit comparison still applies; ``answer_forms.exact``); an answer to a rational
    ground truth must be a simplified literal (``answer_forms.form_ok``); a percentage reads only as
    its number (``25\\%`` = 25 != 0.25). Like the default, it reads a number out of surrounding
    words (``The answer is 5.``), which the course grader would not."""
    return isinstance(answer, str) and _grade("answer", answer, ground_truth, fast, strict)[1]


def parses(answer: str) -> bool:
    """Whether math-verify reads a value from ``answer`` (a ground truth), in this process: used
    to check answers taken from datasets before training starts."""
    if not isinstance(answer, str) or not answer.strip():
        return False
    with _MV_LOCK:
        return any(not isinstance(r, str) for r in _readings(answer, lenient=False))
