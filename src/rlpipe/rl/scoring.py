"""Reward scoring of a rollout batch: rewards, group advantages and train-reward metrics.

Used by the ColocatedWorker, by the Scorer actor, and by the disaggregated driver when no Scorer
actor is configured. ``use_std_normalization: false`` turns the default ``normalized_rewards``
delta mode into ``centered_rewards`` (Dr. GRPO Eq. 4), so the seed-001 switch keeps its meaning.

A reward function that fails on one sample must not stop the step: ``guarded_rewards`` calls it on
each sample in a daemon thread with a per-sample deadline (``REWARD_TIMEOUT_S``, above the math
grader's own 10 s per answer). One worker thread scores the samples in order; only a sample that
hangs costs a new thread for the rest (starting a thread per sample cost many times what the
keyword reward itself costs). A sample whose reward raises, hangs past the deadline, or returns
something that is not a reward dict with a finite ``reward`` scores 0 with a logged warning. All of these, and the
samples for which a task reward logged a warning under ``rlpipe.tasks`` (``never_raise`` and the
math grader do when they score a failure 0 themselves; that score is kept), are counted in the
``reward/errors`` metric: failures in the rollout batch the step trained on. A hung call's thread
cannot be killed; it is left running as a daemon and the step goes on.

Besides the reward, every text task's reward dict has ``format_reward`` and ``answer_reward``
(``rlpipe.tasks.reward_dict``): their means are logged for the train batch (``reward/format_mean``,
``reward/answer_mean``) and for validation (``reward/val_format_mean``, ``reward/val_answer_mean``,
``reward_means``), so a run shows whether the policy learns the format, the answers, or both. A key a
task's reward dict lacks is left out (its column stays NaN).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlpipe.rl.advantages import compute_advantages, reward_stats
from rlpipe.rl.records import RolloutBatch

logger = logging.getLogger(__name__)

REWARD_TIMEOUT_S = 60.0  # per sample; read at call time (tests lower it)
ERRORS_METRIC = "reward/errors"
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


def reward_means(scores: Sequence[dict], prefix: str = "reward/train") -> dict[str, float]:
    """``{<prefix>_mean, <prefix>_format_mean, <prefix>_answer_mean}`` of reward dicts (the last two
    only when every dict has ``format_reward`` / ``answer_reward``); ``reward/train`` names the
    format and answer means ``reward/format_mean`` and ``reward/answer_mean``."""
    n = max(1, len(scores))
    out = {f"{prefix}_mean": sum(float(s["reward"]) for s in scores) / n}
    for key, name in (("format_reward", "format"), ("answer_reward", "answer")):
        if scores and all(key in s for s in scores):
            column = f"reward/{name}_mean" if prefix == "reward/train" else f"{prefix}_{name}_mean"
            out[column] = sum(float(s[key]) for s in scores) / n
    return out


def advantage_mode(train_cfg) -> str:
    mode = train_cfg.advantage_mode
    if mode == "normalized_rewards" and not train_cfg.use_std_normalization:
        return "centered_rewards"
    return mode


def score_batch(batch: RolloutBatch, task, train_cfg) -> RolloutBatch:
    """Fill ``batch.rewards``/``batch.advantages`` (B,) and ``batch.reward_metrics`` in place."""
    scores, failures = guarded_rewards(task.reward, batch.responses, batch.ground_truths)
    raw = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)  # (B,)
    adv = compute_advantages(raw, batch.group_size, advantage_mode(train_cfg), train_cfg.advantage_eps)
    meta = reward_stats(raw, batch.group_size)
    batch.rewards, batch.advantages = raw, adv.float()
    lengths = torch.tensor([len(r) for r in batch.response_ids], dtype=torch.float32)
    batch.reward_metrics = {
        "reward/train_mean": float(raw.mean()),
        "reward/train_std": meta["reward/std"],
        "reward/zero_std_frac": float(meta["reward/zero_std_frac"]),
        **{k: float(v) for k, v in reward_means(scores).items() if k != "reward/train_mean"},
        ERRORS_METRIC: float(failures),
        "response/length_mean": float(lengths.mean()),
    }
    return batch
