"""Sorting rewards (seed 003 §1).

``sort_distance_reward`` and ``sort_inclusion_ordering_reward`` are the seed's functions, exact
(raw counts; unequal lengths raise ValueError, the seed's assert). ``sort_*_reward_fn(response,
prompt)`` wrap them for text or list responses, scoring the first n numbers and dividing by the
maximum (n, resp. 2n - 1) to land in [0, 1]; see there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from rlpipe.tasks.reward_dict import RewardDict, never_raise, scores, zeros

# --------------------------------------------------------------------------- sorting (seed 003)


def _as_list(x: Any) -> list:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _check_lengths(prompt: list, response: list) -> None:
    if len(prompt) != len(response):
        raise ValueError(f"prompt and response lengths differ: {len(prompt)} != {len(response)}")


def _distance(prompt: list, response: list) -> int:
    # strict=False on purpose: the text wrappers score a response with fewer numbers than the
    # prompt, and the missing positions earn nothing (the seed function checks lengths first).
    return sum(1 for x, y in zip(response, sorted(prompt), strict=False) if x == y)


def _inclusion_ordering(prompt: list, response: list) -> int:
    inclusion = sum(1 for x in prompt if x in response)  # prompt tokens present in the response
    ordering = sum(1 for x, y in zip(response, response[1:], strict=False) if x <= y)  # sorted adjacent pairs
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


def _int_list(x: Any) -> list[int] | None:
    """``x`` as a list of ints (a list, tuple or 1-D tensor/array of ints), else None."""
    if not (isinstance(x, (list, tuple)) or hasattr(x, "tolist")):
        return None
    values = _as_list(x)
    ok = isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return values if ok else None


def _sort_response(response: Any, n: int) -> tuple[list[int], bool] | None:
    """The first ``n`` integers of a response (text: every ``-?\\d+`` in order; else its items)
    and whether it held exactly ``n``; None when it is neither text nor a list of ints."""
    if isinstance(response, str):
        found = re.findall(r"-?\d+", response)
        if any(len(f) > 64 for f in found):  # absurd numbers: no valid answer, and int() caps digits
            return None
        nums = [int(f) for f in found]
    else:
        nums = _int_list(response)
        if nums is None:
            return None
    return nums[:n], len(nums) == n


def _sort_reward_dict(response: Any, prompt: Any, score: Callable[[list, list], int],
                      best: Callable[[int], int]) -> RewardDict:
    p = _int_list(prompt)
    parsed = _sort_response(response, len(p)) if p else None
    if not p or parsed is None:
        return zeros()
    nums, exact_count = parsed
    solved = exact_count and nums == sorted(p)
    return scores(exact_count, solved, reward=score(p, nums) / best(len(p)))


@never_raise
def sort_distance_reward_fn(response: Any, prompt: Any) -> RewardDict:
    """``sort_distance_reward / n`` as a task reward (``prompt``: the n numbers to sort, a list or
    tensor). ``response``: text (its integers are read in order) or a list/tensor of ints. Only its
    first n numbers are scored and missing ones earn nothing (no padding, so no free ordering
    points). format_reward = 1 iff it holds exactly n numbers; answer_reward = 1 iff it also equals
    sorted(prompt); reward = the normalised partial credit. Malformed input scores zeros."""
    return _sort_reward_dict(response, prompt, _distance, lambda n: n)


@never_raise
def sort_inclusion_ordering_reward_fn(response: Any, prompt: Any) -> RewardDict:
    """``sort_inclusion_ordering_reward / (2n - 1)`` (n inclusion points + n - 1 sorted pairs) as a
    task reward; responses, format_reward and answer_reward as in ``sort_distance_reward_fn``."""
    return _sort_reward_dict(response, prompt, _inclusion_ordering, lambda n: 2 * n - 1)

