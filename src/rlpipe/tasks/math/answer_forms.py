"""The answer forms the math grader reads before math-verify does (``rlpipe.tasks.math.grader``): the
fixes for what plain math-verify got wrong against a reference MATH grader, applied to answer and
ground truth alike, and the checks of ``strict`` (course-comparable) mode.

- ``normalise``: synonyms math-verify misreads (``\\varnothing``);
- ``PERCENT``: a trailing percent sign, so that a percentage also reads as its bare number;
- ``choice_letters``: lists of multiple-choice letters, compared as letters;
- ``exact`` and ``form_ok``: strict mode's exact decimals and simplified literals.

What the default and strict mode accept, with examples: ``rlpipe.tasks.math.grader.answers_match``.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any


@functools.lru_cache(maxsize=1)
def lazy_sympy() -> Any:
    """sympy, imported on first use."""
    import sympy  # imported lazily: the keyword task never needs sympy's slow import

    return sympy


DOLLAR = re.compile(r"(?<!\\)\$")  # a math delimiter; an escaped \$ is a dollar sign

_SYNONYMS = ((re.compile(r"\\varnothing(?![A-Za-z])"), r"\\emptyset"),)  # math-verify reads \varnothing as a symbol
# A trailing \% / % / \text{\%}: math-verify reads ``12.5\%`` as 0.125 and matches integers only
# against the bare number (``50\%`` = 50, but ``12.5\%`` != 12.5), so the grader adds the bare
# number as a second reading (strict mode: the only one, as the course grader strips ``\%``).
PERCENT = re.compile(r"\s*(?:\\%|(?<!\\)%|\\text\{\s*\\?%\s*\})(?=\s*(?:(?<!\\)\$)?\s*\.?\s*$)")
_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_CHOICE_SPLIT = re.compile(r"\s*(?:,|;|\band\b)\s*")
_CHOICE = re.compile(r"\(?([A-Z])\)?")


def normalise(answer: str) -> str:
    """``answer`` with synonyms math-verify misreads replaced (it read ``\\varnothing`` as a symbol
    named varnothing; it becomes ``\\emptyset``), stripped."""
    for pattern, repl in _SYNONYMS:
        answer = pattern.sub(repl, answer)
    return answer.strip()


def choice_letters(text: str) -> tuple[str, ...] | None:
    """Sorted capital letters when ``text`` is a list of choice letters (``A, C``, ``\\text{A,C}``,
    ``(A) and (C)``, ``$\\textbf{(B)}$``); None otherwise. When answer and ground truth are both
    such lists they match iff the letters are the same, in any order: math-verify read one as a
    set {a, c}, the other as a tuple."""
    if not isinstance(text, str) or len(text) > 100:
        return None
    t, prev = DOLLAR.sub("", text), None
    while prev != t:
        prev, t = t, _WRAPPER.sub(r"\1", t)
    letters = []
    for part in _CHOICE_SPLIT.split(t.strip().rstrip(".").strip()):
        m = _CHOICE.fullmatch(part)
        if m is None:
            return None
        letters.append(m.group(1))
    return tuple(sorted(letters))


def exact(reading: Any) -> Any:
    """Strict mode: every decimal becomes the rational it spells (``0.333333`` -> 333333/10^6), so
    math-verify's 6-decimal float rounding never applies."""
    if isinstance(reading, str):
        return reading
    sp = lazy_sympy()
    try:
        floats = reading.atoms(sp.Float)
        return reading.xreplace({f: sp.Rational(str(f)) for f in floats}) if floats else reading
    except Exception:  # not a sympy object with atoms: keep it as parsed
        return reading


def _all_rational(expr: Any) -> bool:
    """A rational number, or a tuple/set/interval of rationals (and +-oo): the golds whose
    answers strict mode wants written as simplified literals."""
    sp = lazy_sympy()
    if isinstance(expr, sp.Rational) or expr in (sp.oo, -sp.oo):
        return True
    if isinstance(expr, sp.Interval):
        return _all_rational(expr.start) and _all_rational(expr.end)
    if isinstance(expr, (sp.FiniteSet, sp.Tuple)):
        return bool(expr.args) and all(_all_rational(a) for a in expr.args)
    return False


_SQUASH = re.compile(r"\s+|\\[!,;: ]|\\left|\\right|\^\{?\\circ\}?|\\%|%|\\\$|\.$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_VAR_PREFIX = re.compile(r"^[A-Za-z]\w?=")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)|[+-]?\\infty")
_FRACTION = re.compile(r"[+-]?(?:\\[dt]?frac\{([+-]?\d+)\}\{(\d+)\}|([+-]?\d+)/(\d+))")


def _squash(text: str) -> str:
    return _VAR_PREFIX.sub("", _SQUASH.sub("", text))


def _simplified_literal(text: str) -> bool:
    """An integer, a decimal, +-infinity, or a reduced fraction p/q with q > 1."""
    if _NUMBER.fullmatch(text):
        return True
    m = _FRACTION.fullmatch(text)
    if m is None:
        return False
    p, q = (int(g) for g in (m.groups()[:2] if m.group(1) is not None else m.groups()[2:]))
    return q > 1 and math.gcd(p, q) == 1


def _simplified_form(pred: str, container: bool) -> bool:
    """Whether math-verify's normalised answer string ``pred`` writes each number as a simplified
    literal: the whole string, or each element of a tuple/set/interval."""
    s = _squash(pred)
    if not container:
        return _simplified_literal(_THOUSANDS.sub("", s))
    for opener, closer in (("\\{", "\\}"), ("(", ")"), ("[", "]"), ("(", "]"), ("[", ")"), ("{", "}")):
        if s.startswith(opener) and s.endswith(closer):
            s = s[len(opener):len(s) - len(closer)]
            break
    return all(_simplified_literal(part) for part in s.split(","))


def form_ok(group: tuple[Any, ...], gold: tuple[Any, ...]) -> bool:
    """Strict mode: an answer (one parse: its sympy reading and normalised string) to a rational
    gold must be written in simplest form; other golds set no form requirement.

    When the ground truth is a rational number (or a tuple, set or interval of them, infinities
    allowed), the answer must write each one as a simplified literal: an integer, a decimal, or a
    reduced fraction ``p/q`` / ``\\frac{p}{q}`` with q > 1 (after normalisation, which drops
    ``\\left``, units, ``x =``, thousands commas, ``^\\circ``, and ``\\%``), or spell it exactly as
    the ground truth does. ``2+2``, ``5!``, ``\\frac{2}{4}``, ``\\frac{8}{2}``, ``10^{3}`` fail. The
    form of irrational or symbolic answers (``\\frac{1}{\\sqrt2}`` = ``\\frac{\\sqrt2}{2}``, as in the
    course grader) and of matrix entries is not judged."""
    sp = lazy_sympy()
    exprs = [r for r in gold if not isinstance(r, str)]
    if not exprs or not _all_rational(exprs[0]):
        return True
    container = isinstance(exprs[0], (sp.Interval, sp.FiniteSet, sp.Tuple))
    gold_strs = {_squash(r) for r in gold if isinstance(r, str)}
    return any(_squash(s) in gold_strs or _simplified_form(s, container) for s in group if isinstance(s, str))
