"""A task's reward called under a guard: one sample that raises, hangs or returns something that is
not a reward dict must not stop a step, an evaluation or the check before a run.

``guarded_rewards`` calls the reward on each sample in a daemon thread with a per-sample deadline
(``REWARD_TIMEOUT_S``, above the math grader's own 10 s per answer). One worker thread scores the
samples in order; only a sample that hangs costs a new thread for the rest (starting a thread per
sample cost many times what the keyword reward itself costs). A sample whose reward raises, hangs
past the deadline, or returns something that is not a reward dict with a finite ``reward`` scores 0
with a logged warning. All of these, and the samples for which a task reward logged a warning under
``rlpipe.tasks`` (``never_raise`` and the math grader do when they score a failure 0 themselves;
that score is kept), are counted as failures (the ``reward/errors`` metric of
``rlpipe.rl.scoring``). A hung call's thread cannot be killed; it is left running as a daemon.

No torch here: the task registry's check before any work (``rlpipe.tasks.registry``) runs in
commands that never load it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

REWARD_TIMEOUT_S = 60.0  # per sample; read at call time (tests lower it)
_TASK_LOGGER = "rlpipe.tasks"  # the task rewards log their swallowed exceptions below this logger
_THREAD_PREFIX = "rlpipe-reward-"


def _zeros() -> dict[str, float]:
    return {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}


_SAMPLE = threading.local()  # .index: the sample a reward worker thread is scoring


class _FailureLog(logging.Handler):
    """Records, per sample index, warnings logged under ``rlpipe.tasks`` by a reward thread."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.failed: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        index = getattr(_SAMPLE, "index", None)  # emit runs in the logging thread: a worker's own index
        if record.threadName.startswith(_THREAD_PREFIX) and index is not None:
            self.failed.setdefault(index, record.getMessage())


def _call_all(fn: Callable, args: Sequence[tuple], timeout_s: float) -> list[tuple[Any, str | None]]:
    """``(value, error)`` of ``fn(*a)`` for each ``a`` in order, each sample within ``timeout_s`` of
    the previous one's end. One daemon worker scores the samples; on a hang it is abandoned with
    the sample it holds, and a new worker takes the rest."""
    n = len(args)
    boxes: list[dict[str, Any]] = [{} for _ in range(n)]
    done = [threading.Event() for _ in range(n)]

    def work(start: int, abandoned: threading.Event) -> None:
        for i in range(start, n):
            if abandoned.is_set():  # it hung on an earlier sample, which a new worker skipped
                return
            _SAMPLE.index = i
            try:
                boxes[i]["value"] = fn(*args[i])
            except Exception as e:  # the failure is reported by the caller
                boxes[i]["error"] = f"raised {type(e).__name__}: {e}"
            done[i].set()
        _SAMPLE.index = None

    out: list[tuple[Any, str | None]] = []
    abandoned: threading.Event | None = None
    for i in range(n):
        if abandoned is None:
            abandoned = threading.Event()
            threading.Thread(target=work, args=(i, abandoned), name=f"{_THREAD_PREFIX}{i}", daemon=True).start()
        if not done[i].wait(timeout_s):
            out.append((None, f"no result within {timeout_s:g}s (hung; its thread is abandoned)"))
            abandoned.set()  # the worker is stuck on sample i: it stops there, a new one takes the rest
            abandoned = None
            continue
        out.append((boxes[i].get("value"), boxes[i].get("error")))
    return out


def call_with_deadline(fn: Callable, args: tuple, timeout_s: float | None = None) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, what went wrong)`` when ``fn(*args)`` raised or ran past
    ``timeout_s`` (default ``REWARD_TIMEOUT_S``): one sample under ``guarded_rewards``' guard."""
    return _call_all(fn, [args], REWARD_TIMEOUT_S if timeout_s is None else timeout_s)[0]


def _valid(value: Any) -> bool:
    try:
        return math.isfinite(float(value["reward"]))
    except (KeyError, TypeError, ValueError, IndexError):
        return False


def guarded_rewards(reward_fn: Callable[[str, Any], dict], responses: Sequence[str], ground_truths: Sequence[Any],
                    timeout_s: float | None = None) -> tuple[list[dict[str, float]], int]:
    """``(reward dicts, number of failed samples)``: ``reward_fn(response, ground_truth)`` per
    sample, a failed one (see the module docstring) scoring 0 with a warning."""
    timeout_s = REWARD_TIMEOUT_S if timeout_s is None else timeout_s
    out: list[dict[str, float]] = []
    failures = 0
    log = _FailureLog()
    task_logger = logging.getLogger(_TASK_LOGGER)
    task_logger.addHandler(log)
    try:
        results = _call_all(reward_fn, list(zip(responses, ground_truths, strict=True)), timeout_s)
        for i, (value, error) in enumerate(results):
            if error is None and not _valid(value):
                error = f"returned {str(value)[:80]!r}, not a reward dict with a finite 'reward'"
            if error is not None:
                logger.warning("reward %s failed on sample %d (scored 0): %s",
                               getattr(reward_fn, "__name__", reward_fn), i, error)
                value = _zeros()
            failures += error is not None or i in log.failed  # a logged failure already scored itself
            out.append(value)
    finally:
        task_logger.removeHandler(log)
    return out, failures
