"""The reward dictionary every task's reward function returns, and its helpers.

Every text reward function returns ``{"reward", "format_reward", "answer_reward"}`` (floats in
[0, 1]) and never raises, whatever it is given (None, huge or malformed text, odd unicode): bad
input scores zeros (``never_raise``). The rules of each reward live in its task folder:
``tasks/keyword/reward.py``, ``tasks/math/reward.py``, ``tasks/sorting/reward.py``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

RewardDict = dict[str, float]
REWARD_KEYS = ("reward", "format_reward", "answer_reward")


def zeros() -> RewardDict:
    return {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}


def scores(format_ok: bool, answer_ok: bool, reward: float | None = None) -> RewardDict:
    r = float(answer_ok) if reward is None else float(reward)
    return {"reward": r, "format_reward": float(format_ok), "answer_reward": float(answer_ok)}


def never_raise(fn: Callable[..., RewardDict]) -> Callable[..., RewardDict]:
    """Reward functions score bad input as zeros instead of crashing a rollout batch."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> RewardDict:
        try:
            return fn(*args, **kwargs)
        except Exception:
            logger.warning("%s failed; scoring 0", fn.__name__, exc_info=True)
            return zeros()

    return wrapper
