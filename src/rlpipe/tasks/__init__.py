"""Tasks: one folder per task holds everything about it (nanochat's ``tasks/``).

``base.Task`` is the protocol; ``TASKS`` maps a config's ``train.task`` to its class.

- ``keyword/``: vocabulary, corpus, dataset, reward, zero-shot evaluation (seed 000 §3.1).
- ``sorting/``: seed 003's sorting task, its rewards and the non-autoregressive toy model.
- ``math/``: the MATH prompts and the ``r1_zero`` / ``question_only`` graders (seeds 001, 004).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlpipe.config import TrainConfig, to_dict
from rlpipe.tasks.base import Example, Task
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn
from rlpipe.tasks.keyword.task import KeywordInclusionTask
from rlpipe.tasks.math.reward import question_only_reward_fn, r1_zero_reward_fn
from rlpipe.tasks.math.task import MathTask
from rlpipe.tasks.reward_dict import RewardDict
from rlpipe.tasks.sorting.reward import (
    sort_distance_reward_fn,
    sort_inclusion_ordering_reward_fn,
)
from rlpipe.tasks.sorting.task import SortingTask

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

TASKS: dict[str, type[Task]] = {
    KeywordInclusionTask.name: KeywordInclusionTask,
    SortingTask.name: SortingTask,
    MathTask.name: MathTask,
}


def make_task(name: str, dataset_dir: str | Path | None, train_cfg: TrainConfig | None = None) -> Task:
    """Task ``name`` on ``dataset_dir``; ``train_cfg`` supplies task options (``train.math``)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks: {sorted(TASKS)}")
    if name == MathTask.name and train_cfg is not None:
        return MathTask(dataset_dir, **to_dict(train_cfg.math))
    return TASKS[name](dataset_dir)


def task_for(train_cfg: TrainConfig, dataset_dir: str | Path | None) -> Task:
    """The task a run's train config names, with its options."""
    return make_task(train_cfg.task, dataset_dir, train_cfg)


__all__ = ["REWARD_FNS", "SORT_REWARD_FNS", "TASKS", "Example", "KeywordInclusionTask", "MathTask", "SortingTask",
           "Task", "make_task", "task_for"]
