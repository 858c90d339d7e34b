"""The sorting task plug-in (seed 003's toy task, made autoregressive).

- ``sorting`` (seed 003's toy task, made autoregressive): the prompt lists n digits, the response
  should list them sorted. Departure from seed 003: there the policy is a non-autoregressive toy
  model emitting all positions at once (see ``rlpipe.tasks.sorting.toy_model``); here the same reward drives our
  TransformerLM through the normal sampler, so the sorting task exercises the whole Ray trainer.
  The reward is ``rewards.sort_inclusion_ordering_reward_fn``: seed 003's inclusion + ordering
  count over the first n numbers of the response, divided by its maximum 2n - 1.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rlpipe.tasks.base import Example, Task
from rlpipe.tasks.sorting.reward import sort_inclusion_ordering_reward_fn


class SortingTask(Task):
    name = "sorting"
    stop = ("\n",)

    def __init__(self, dataset_dir: str | Path | None = None, n: int = 4, num_train: int = 512,
                 num_val: int = 64, seed: int = 0):
        rng = random.Random(seed)

        def make(k: int) -> list[Example]:
            out = []
            for _ in range(k):
                digits = [rng.randrange(10) for _ in range(n)]
                out.append(Example(f"Sort: {' '.join(map(str, digits))}\nSorted:", digits))
            return out

        self._train, self._val = make(num_train), make(num_val)

    def train_examples(self) -> list[Example]:
        return self._train

    def val_examples(self) -> list[Example]:
        return self._val

    def reward(self, response: str, ground_truth: Any) -> dict[str, float]:
        return sort_inclusion_ordering_reward_fn(response, list(ground_truth))
