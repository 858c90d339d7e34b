"""The keyword-inclusion task plug-in.

- ``keyword_inclusion`` (seed 000 §3.1): prompts from the keyword dataset directory
  (``train.jsonl`` / ``val.jsonl``), reward ``keyword_inclusion_reward_fn``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpipe.tasks.base import DatasetError, Example, Task
from rlpipe.tasks.keyword.dataset import load_split
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn


class KeywordInclusionTask(Task):
    name = "keyword_inclusion"

    @classmethod
    def check_dataset(cls, dataset_dir: str | Path | None, options: dict | None = None) -> None:
        if dataset_dir is None:
            raise FileNotFoundError("train.task=keyword_inclusion needs the keyword dataset directory")
        for split in ("train", "val"):
            try:
                records = load_split(dataset_dir, split)
            except ValueError as e:
                raise DatasetError(str(e)) from None
            if not records:
                raise DatasetError(f"{Path(dataset_dir) / f'{split}.jsonl'} holds no records")

    def __init__(self, dataset_dir: str | Path):
        self._train, self._val = ([Example(e.prompt, e.keywords) for e in load_split(dataset_dir, split)]
                                  for split in ("train", "val"))

    def train_examples(self) -> list[Example]:
        return self._train

    def val_examples(self) -> list[Example]:
        return self._val

    def reward(self, response: str, ground_truth: Any) -> dict[str, float]:
        return keyword_inclusion_reward_fn(response, ground_truth)
