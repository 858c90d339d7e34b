"""Answer extraction and math-verify grading, bounded in time (seed 001 §3's grader).

Departures from the seeds and why:

* Equivalence is decided by math-verify instead of the course's ``drgrpo_grader`` (not available
  here). Answer and ground truth are each wrapped in ``$...$`` before parsing (unless they already
  hold an unescaped ``$``): math-verify only reads LaTeX inside delimiters, so bare ``\\frac12``
  would parse to nothing. ``fast=True`` (default) compares that one reading strictly.
  ``fast=False`` is a lenient mode (as the seed grader's non-fast path adds checks): it also tries
  math-verify's reading of the bare text (prose, last number) and ``strict=False`` (sets vs
  tuples, variables matched by position); it accepts more answers, including some wrong ones.
* math-verify's own timeouts use ``signal.alarm``, which fails off the main thread (Ray actors,
  thread pools); they are off (``parsing_timeout=None``, ``timeout_seconds=None``). Instead:
  (1) deterministic screening: answers over 400 characters or with brackets nested over 10 deep
  are not parsed (the LaTeX parser slows steeply with depth), and parsed expressions that would
  make sympy build numbers over 10,000 digits (``10^{10^{10}}``, ``(2^{100})!``), expand powers
  over 100 of sums, or do integrals/limits/products are dropped; (2) math-verify runs in a child
  process killed after ``GRADER_TIMEOUT_S`` (10 s) per answer, because screening cannot foresee
  everything (``verify(log(10001), 9123456789)`` makes sympy build ``10001**9123456789``). Both
  score 0. Only answers that hit the time limit make a reward depend on machine speed. If no child
  process can be started, grading falls back to this process, unbounded, with a warning.

Grading policy. Checked against a reference MATH grader, plain math-verify got three kinds of answer
wrong; each is fixed before math-verify sees the text, on both answer and ground truth:

* percentages: math-verify reads ``12.5\\%`` as 0.125 and matches integers only against the bare
  number (``50\\%`` = 50, but ``12.5\\%`` != 12.5). A trailing ``\\%`` / ``%`` / ``\\text{\\%}``
  now adds a second reading, the bare number: ``12.5\\%`` matches 12.5 (and still 0.125).
* ``\\varnothing`` is rewritten to ``\\emptyset`` (math-verify read it as a symbol named varnothing).
* choice letters: when answer and ground truth are both lists of capital letters (``A, C``,
  ``\\text{A,C}``, ``(A) and (C)``, ``\\textbf{(B)}``), they match iff the letters are the same,
  in any order (math-verify read one as a set {a, c}, the other as a tuple).

The default (``strict=False``) is otherwise math-verify's equivalence, more lenient than the
course's grader (the PRM800K/Hendrycks rules behind ``drgrpo_grader``): it accepts unsimplified
answers (``2+2``, ``5!``, ``\\frac{2}{4}``, ``10^{3}`` for 4, 120, 1/2, 1000) and decimals rounded
to 6 places (``0.333333`` for 1/3, ``1.414214`` for sqrt 2). RL reward keeps that leniency.
``strict=True`` (per call, or ``configure_math_grader(strict=True)`` as the default; it travels to
the child process with each request) is for accuracies to compare with numbers published with the
course's grader:

* decimals are exact: each float becomes the rational it spells, so ``0.5`` = 1/2 and ``0.125`` =
  1/8, but ``0.333333`` != 1/3 and ``1.414214`` != sqrt 2 (sympy's 15-digit comparison still applies);
* when the ground truth is a rational number (or a tuple, set or interval of them, infinities
  allowed), the answer must write each one as a simplified literal: an integer, a decimal, or a
  reduced fraction ``p/q`` / ``\\frac{p}{q}`` with q > 1 (after normalisation, which
  drops ``\\left``, units, ``x =``, thousands commas, ``^\\circ``, and ``\\%``), or spell it exactly
  as the ground truth does. ``2+2``, ``5!``, ``\\frac{2}{4}``, ``\\frac{8}{2}``, ``10^{3}`` fail;
* a percentage reads only as its number (the course grader strips ``\\%``): ``25\\%`` = 25 != 0.25.

Strict mode does not judge the form of irrational or symbolic answers (``\\frac{1}{\\sqrt2}`` =
``\\frac{\\sqrt2}{2}``, as in the course grader) nor of matrix entries, and like the default it reads
a number out of surrounding words (``The answer is 5.``), which the course grader would not.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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

# --------------------------------------------------------------------------- answer forms (fixes, strict mode)

_SYNONYMS = ((re.compile(r"\\varnothing(?![A-Za-z])"), r"\\emptyset"),)  # math-verify reads \varnothing as a symbol
_PERCENT = re.compile(r"\s*(?:\\%|(?<!\\)%|\\text\{\s*\\?%\s*\})(?=\s*(?:(?<!\\)\$)?\s*\.?\s*$)")
_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_CHOICE_SPLIT = re.compile(r"\s*(?:,|;|\band\b)\s*")
_CHOICE = re.compile(r"\(?([A-Z])\)?")


def _normalise(answer: str) -> str:
    for pattern, repl in _SYNONYMS:
        answer = pattern.sub(repl, answer)
    return answer.strip()


def choice_letters(text: str) -> tuple[str, ...] | None:
    """Sorted capital letters when ``text`` is a list of choice letters (``A, C``, ``\\text{A,C}``,
    ``(A) and (C)``, ``$\\textbf{(B)}$``); None otherwise."""
    if not isinstance(text, str) or len(text) > 100:
        return None
    t, prev = _DOLLAR.sub("", text), None
    while prev != t:
        prev, t = t, _WRAPPER.sub(r"\1", t)
    letters = []
    for part in _CHOICE_SPLIT.split(t.strip().rstrip(".").strip()):
        m = _CHOICE.fullmatch(part)
        if m is None:
            return None
        letters.append(m.group(1))
    return tuple(sorted(letters))


def _exact(reading: Any) -> Any:
    """Strict mode: every decimal becomes the rational it spells (``0.333333`` -> 333333/10^6), so
    math-verify's 6-decimal float rounding never applies."""
    if isinstance(reading, str):
        return reading
    sp = _sympy()
    try:
        floats = reading.atoms(sp.Float)
        return reading.xreplace({f: sp.Rational(str(f)) for f in floats}) if floats else reading
    except Exception:  # not a sympy object with atoms: keep it as parsed
        return reading


def _all_rational(expr: Any) -> bool:
    """A rational number, or a tuple/set/interval of rationals (and +-oo): the golds whose
    answers strict mode wants written as simplified literals."""
    sp = _sympy()
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


def _form_ok(group: tuple[Any, ...], gold: tuple[Any, ...]) -> bool:
    """Strict mode: an answer (one parse: its sympy reading and normalised string) to a rational
    gold must be written in simplest form; other golds set no form requirement."""
    sp = _sympy()
    exprs = [r for r in gold if not isinstance(r, str)]
    if not exprs or not _all_rational(exprs[0]):
        return True
    container = isinstance(exprs[0], (sp.Interval, sp.FiniteSet, sp.Tuple))
    gold_strs = {_squash(r) for r in gold if isinstance(r, str)}
    return any(_squash(s) in gold_strs or _simplified_form(s, container) for s in group if isinstance(s, str))


# --------------------------------------------------------------------------- readings and verification


def _reading_groups(answer: str, lenient: bool, strict: bool = False) -> tuple[tuple[Any, ...], ...]:
    """Parsed readings of an answer, one group per parse (sympy reading, normalised string): the
    ``$...$``-wrapped text (or the text itself if it already holds an unescaped ``$``); in lenient
    mode also math-verify's reading of the bare text (prose, last number). A percentage is also read
    as its number (``12.5\\%`` as 12.5 besides 0.125); in strict mode only as its number, and
    decimals are exact (``_exact``)."""
    answer = _normalise(answer)
    if not answer:
        return ()
    texts = [answer]
    number = _PERCENT.sub("", answer, count=1).strip()
    if number != answer and number.strip("$ "):
        texts = [number] if strict else [answer, number]
    groups: list[tuple[Any, ...]] = []
    for text in texts:
        if _DOLLAR.search(text):
            groups.append(_parse(text))
            continue
        groups.append(_parse(f"${text}$"))
        if lenient:
            groups.append(_parse(text))
    if strict:
        groups = [tuple(_exact(r) for r in g) for g in groups]
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
    drops readings not in simplest form (``_form_ok``). Caller holds the lock."""
    from math_verify import verify

    for gold in _ground_truths(ground_truth):
        gold_letters = choice_letters(_gold_text(gold)) if letters is not None else None
        if gold_letters is not None:
            if letters == gold_letters:
                return True
            continue
        golds = _gold_readings(gold, strict)
        preds = [r for g in groups if not strict or _form_ok(g, golds) for r in g]
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
                parsed = tuple(_exact(r) for r in parsed)
            groups, letters = ((parsed,) if parsed else ()), None
        else:
            groups = _reading_groups(text, lenient=not fast, strict=strict)
            letters = choice_letters(text)
        return bool(groups) or letters is not None, _verify_any(groups, letters, golds, fast, strict)


# --------------------------------------------------------------------------- killable grader process

GRADER_TIMEOUT_S = 10.0  # per answer; far above the ~0.01-0.3 s a screened answer takes


class _GraderProcess:
    """math-verify in a child Python process, so a runaway sympy computation (which screening
    cannot always foresee, e.g. ``verify(log(10001), 9123456789)`` builds ``10001**9123456789``)
    is killed after ``GRADER_TIMEOUT_S``, from any thread. JSON lines over pipes; the child says
    "ready" once imported and exits when its stdin closes. One request at a time."""

    STARTUP_TIMEOUT_S = 120.0  # importing sympy + math-verify on a loaded machine

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def _start(self) -> None:
        pkg_root = str(Path(__file__).resolve().parents[3])  # the child imports this very rlpipe
        path = os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from rlpipe.tasks.math.grader import _serve_grader; _serve_grader()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        assert self._proc.stdout is not None
        if _read_line(self._proc.stdout.fileno(), self.STARTUP_TIMEOUT_S) != b"ready\n":
            self._kill()
            raise RuntimeError("the math grader child process did not start")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def request(self, payload: dict[str, Any], timeout_s: float) -> tuple[bool, bool] | None:
        """The child's (found, ok), or None when it timed out or died (it restarts on the next
        request). Raises RuntimeError when a child cannot be started at all."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
            try:
                self._proc.stdin.write(json.dumps(payload).encode() + b"\n")
                self._proc.stdin.flush()
                line = _read_line(self._proc.stdout.fileno(), timeout_s)
            except OSError:
                line = None
            if line is None:
                self._kill()
                return None
            reply = json.loads(line)
            if "error" in reply:
                logger.warning("math grader error on %r: %s; scoring 0", payload["text"][:80], reply["error"])
            return bool(reply["found"]), bool(reply["ok"])

    def close(self) -> None:
        with self._lock:
            self._kill()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's grader process and lock state are not ours to use."""
        self._lock, self._proc = threading.Lock(), None


def _read_line(fd: int, timeout_s: float) -> bytes | None:
    """One newline-terminated line from ``fd``, or None on timeout / end of file."""
    deadline, buf = time.monotonic() + timeout_s, b""
    while not buf.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
    return buf


def _serve_grader() -> None:
    """Child side of ``_GraderProcess``: one JSON request per stdin line, one reply per line."""
    logging.disable(logging.WARNING)  # math-verify's "timeout is disabled" notice: we are the timeout
    parent = os.getppid()

    def exit_when_orphaned() -> None:  # a parent killed mid-request would otherwise leave us running
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=exit_when_orphaned, daemon=True).start()
    replies = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the reply stream
    import math_verify  # noqa: F401 - import before "ready" so requests are timed without it

    _sympy()
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin.buffer:
        req = json.loads(line)
        if req["kind"] == "sleep":  # lets tests exercise the timeout without a real runaway
            time.sleep(float(req["text"]))
        reply: dict[str, Any] = {"found": False, "ok": False}
        try:
            reply["found"], reply["ok"] = _grade_local(req["kind"], req["text"], req["golds"], req["fast"],
                                                       req.get("strict", False))
        except Exception as err:
            reply["error"] = f"{type(err).__name__}: {err}"[:300]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


_GRADER = _GraderProcess()
atexit.register(_GRADER.close)
os.register_at_fork(after_in_child=_GRADER.forget_after_fork)
_ISOLATED = True
_STRICT = False


def configure_math_grader(isolated: bool = True, timeout_s: float = 10.0, strict: bool = False) -> None:
    """``isolated=False`` grades in this process with no time limit (no child process; a
    pathological answer can then hang the caller). ``timeout_s``: per answer when isolated.
    ``strict``: the default for calls that pass ``strict=None`` (see the module doc)."""
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
    list of acceptable ones) under math-verify; ``fast`` and ``strict`` (None: the configured
    default) as in the module doc. Thread-safe."""
    return isinstance(answer, str) and _grade("answer", answer, ground_truth, fast, strict)[1]


def parses(answer: str) -> bool:
    """Whether math-verify reads a value from ``answer`` (a ground truth), in this process: used
    to check answers taken from datasets before training starts."""
    if not isinstance(answer, str) or not answer.strip():
        return False
    with _MV_LOCK:
        return any(not isinstance(r, str) for r in _readings(answer, lenient=False))
