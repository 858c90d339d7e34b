"""The Task protocol: prompts, a reward function, validation data.

A task is one small class: ``train_examples``/``val_examples`` return ``Example``s (prompt text and
ground truth), ``reward`` scores one response with the common reward dict, and ``stop`` lists stop
strings for the sampler. Each task lives in its own folder (``tasks/<task>/``) and is registered
in ``rlpipe.tasks.TASKS``.

Prompt order is a deterministic function of (seed, rollout batch index): batch ``i`` takes the
next ``n`` prompts of a per-epoch permutation. A resumed run therefore sees the same prompts as an
uninterrupted one without saving sampler state.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Example:
    prompt: str
    ground_truth: Any


class DatasetError(ValueError):
    """A task's dataset cannot be used; the message names the file (and line)."""


class Task(ABC):
    name: str = ""
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False  # keep the matched stop string in the response

    @classmethod  # noqa: B027 - an optional hook: most tasks need no dataset
    def check_dataset(cls, dataset_dir: str | Path | None, options: dict | None = None) -> None:
        """Open and validate the dataset before any work (the trainer calls it before Ray starts);
        raise ``FileNotFoundError`` or ``DatasetError`` naming the file and line. Default: the task
        needs no dataset."""

    @abstractmethod
    def train_examples(self) -> list[Example]: ...

    @abstractmethod
    def val_examples(self) -> list[Example]: ...

    @abstractmethod
    def reward(self, response: str, ground_truth: Any) -> dict[str, float]: ...

    def prompts_for_batch(self, batch_index: int, n: int, seed: int) -> list[Example]:
        """The ``n`` training prompts of rollout batch ``batch_index`` (deterministic)."""
        pool = self.train_examples()
        if not pool:
            raise ValueError(f"task {self.name}: no training examples")
        out = []
        for pos in range(batch_index * n, batch_index * n + n):
            epoch, idx = divmod(pos, len(pool))
            order = list(range(len(pool)))
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
            out.append(pool[order[idx]])
        return out
