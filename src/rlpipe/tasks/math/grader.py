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


def _readings(answer: str, lenient: bool) -> tuple[Any, ...]:
    """Parsed readings of an answer: the ``$...$``-wrapped text (or the text itself if it already
    holds an unescaped ``$``); in lenient mode also math-verify's reading of the bare text (prose,
    last number)."""
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


def _grade_local(kind: str, text: str, golds: list[str], fast: bool) -> tuple[bool, bool]:
    """(an answer was read, it matches a gold), in this process. ``kind``: "answer" (an extracted
    answer: ``_readings``) or "prose" (free text: math-verify's own extraction)."""
    with _MV_LOCK:
        if kind == "prose":
            preds = _parse(_TAG.sub(" ", text), max_chars=MAX_TAIL_CHARS)
        else:
            preds = _readings(text, lenient=not fast)
        return bool(preds), _verify_any(preds, golds, fast)


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
            reply["found"], reply["ok"] = _grade_local(req["kind"], req["text"], req["golds"], req["fast"])
        except Exception as err:
            reply["error"] = f"{type(err).__name__}: {err}"[:300]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


_GRADER = _GraderProcess()
atexit.register(_GRADER.close)
os.register_at_fork(after_in_child=_GRADER.forget_after_fork)
_ISOLATED = True


def configure_math_grader(isolated: bool = True, timeout_s: float = 10.0) -> None:
    """``isolated=False`` grades in this process with no time limit (no child process; a
    pathological answer can then hang the caller). ``timeout_s``: per answer when isolated."""
    global _ISOLATED, GRADER_TIMEOUT_S
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    _ISOLATED, GRADER_TIMEOUT_S = isolated, float(timeout_s)
    if not isolated:
        _GRADER.close()


def _grade(kind: str, text: str, ground_truth: Any, fast: bool) -> tuple[bool, bool]:
    global _ISOLATED
    golds = _ground_truths(ground_truth)
    if not text.strip() or (kind == "answer" and len(text.strip()) > MAX_ANSWER_CHARS):
        return False, False  # (too long: it would not be parsed anyway; don't ship it to the child)
    if _ISOLATED:
        payload = {"kind": kind, "text": text, "golds": golds, "fast": bool(fast)}
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
    return _grade_local(kind, text, golds, fast)


def answers_match(answer: str, ground_truth: Any, fast: bool = True) -> bool:
    """Whether ``answer`` (extracted answer text) equals the ground truth (a str or number, or a
    list of acceptable ones) under math-verify; ``fast`` as in the module doc. Thread-safe."""
    return isinstance(answer, str) and _grade("answer", answer, ground_truth, fast)[1]

