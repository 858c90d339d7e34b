"""Task plug-ins: prompts, a reward function, validation data.

A task is one small class: ``train_examples``/``val_examples`` return ``Example``s (prompt text and
ground truth), ``reward`` scores one response with the common reward dict, and ``stop`` lists stop
strings for the sampler. Register it in ``TASKS``.

- ``keyword_inclusion`` (seed 000 §3.1): prompts from the keyword dataset directory
  (``train.jsonl`` / ``val.jsonl``), reward ``keyword_inclusion_reward_fn``.
- ``sorting`` (seed 003's toy task, made autoregressive): the prompt lists n digits, the response
  should list them sorted. Departure from seed 003: there the policy is a non-autoregressive toy
  model emitting all positions at once (see ``rlpipe.toy_sort``); here the same reward drives our
  TransformerLM through the normal sampler, so the sorting task exercises the whole Ray trainer.
  The reward is ``rewards.sort_inclusion_ordering_reward_fn``: seed 003's inclusion + ordering
  count over the first n numbers of the response, divided by its maximum 2n - 1.

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

from rlpipe.io_utils import read_jsonl


@dataclass(frozen=True)
class Example:
    prompt: str
    ground_truth: Any


class Task(ABC):
    name: str = ""
    stop: tuple[str, ...] = ()

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


class KeywordInclusionTask(Task):
    name = "keyword_inclusion"

    def __init__(self, dataset_dir: str | Path):
        d = Path(dataset_dir)
        for split in ("train", "val"):
            if not (d / f"{split}.jsonl").is_file():
                raise FileNotFoundError(f"keyword dataset: {d / f'{split}.jsonl'} not found "
                                        "(build it with `rlpipe build-dataset`)")
        self._train = [Example(r["prompt"], list(r["keywords"])) for r in read_jsonl(d / "train.jsonl")]
        self._val = [Example(r["prompt"], list(r["keywords"])) for r in read_jsonl(d / "val.jsonl")]

    def train_examples(self) -> list[Example]:
        return self._train

    def val_examples(self) -> list[Example]:
        return self._val

    def reward(self, response: str, ground_truth: Any) -> dict[str, float]:
        from rlpipe.rewards import keyword_inclusion_reward_fn

        return keyword_inclusion_reward_fn(response, ground_truth)


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
        from rlpipe.rewards import sort_inclusion_ordering_reward_fn

        return sort_inclusion_ordering_reward_fn(response, list(ground_truth))


TASKS: dict[str, type[Task]] = {
    KeywordInclusionTask.name: KeywordInclusionTask,
    SortingTask.name: SortingTask,
}


def make_task(name: str, dataset_dir: str | Path | None) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks: {sorted(TASKS)}")
    return TASKS[name](dataset_dir)
