"""The keyword-inclusion task plug-in.

- ``keyword_inclusion`` (seed 000 §3.1): prompts from the keyword dataset directory
  (``train.jsonl`` / ``val.jsonl``), reward ``keyword_inclusion_reward_fn``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpipe.io import read_jsonl
from rlpipe.tasks.base import Example, Task
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn


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
        return keyword_inclusion_reward_fn(response, ground_truth)
