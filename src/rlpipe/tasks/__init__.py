"""Tasks: one folder per task holds everything about it (nanochat's ``tasks/``).

``base.Task`` is the protocol; ``registry`` resolves a config's ``train.task`` (a built-in name of
``TASKS``, an import path, or an entry point) to its class and checks it before any work.

- ``keyword/``: vocabulary, corpus, dataset, reward, zero-shot evaluation (seed 000 §3.1).
- ``sorting/``: seed 003's sorting task, its rewards and the non-autoregressive toy model.
- ``math/``: the MATH prompts and the ``r1_zero`` / ``question_only`` graders (seeds 001, 004).
- ``text/``: the generic task: a user's JSONL, prompt template and reward function.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlpipe.config import TrainConfig
from rlpipe.tasks.base import Example, Task
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn
from rlpipe.tasks.keyword.task import KeywordInclusionTask
from rlpipe.tasks.math.reward import question_only_reward_fn, r1_zero_reward_fn
from rlpipe.tasks.math.task import MathTask
from rlpipe.tasks.registry import BUILTIN, check_task, make_task, resolve_task
from rlpipe.tasks.reward_dict import RewardDict
from rlpipe.tasks.sorting.reward import (
    sort_distance_reward_fn,
    sort_inclusion_ordering_reward_fn,
)
from rlpipe.tasks.sorting.task import SortingTask
from rlpipe.tasks.text.task import TextTask

# Text reward functions by name (prompt ablations pick one with its prompt).
REWARD_FNS: dict[str, Callable[..., RewardDict]] = {
    "keyword_inclusion": keyword_inclusion_reward_fn,
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
}
SORT_REWARD_FNS: dict[str, Callable[..., RewardDict]] = {
    "sort_distance": sort_distance_reward_fn,
    "sort_inclusion_ordering": sort_inclusion_ordering_reward_fn,
}

TASKS: dict[str, type[Task]] = dict(BUILTIN)  # the built-in tasks; train.task may name plug-ins too


def task_for(train_cfg: TrainConfig, dataset_dir: str | Path | None) -> Task:
    """The task a run's train config names (built-in, import path or entry point), with its options."""
    return make_task(train_cfg.task, dataset_dir, train_cfg)


__all__ = ["REWARD_FNS", "SORT_REWARD_FNS", "TASKS", "Example", "KeywordInclusionTask", "MathTask", "SortingTask",
           "Task", "TextTask", "check_task", "make_task", "resolve_task", "task_for"]
