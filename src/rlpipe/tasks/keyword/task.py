"""The keyword-inclusion task plug-in.

- ``keyword_inclusion`` (seed 000 §3.1): prompts from the keyword dataset directory
  (``train.jsonl`` / ``val.jsonl``), reward ``keyword_inclusion_reward_fn``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlpipe.io import read_jsonl
from rlpipe.tasks.base import DatasetError, Example, Task
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn


class KeywordInclusionTask(Task):
    name = "keyword_inclusion"

    @classmethod
    def check_dataset(cls, dataset_dir: str | Path | None) -> None:
        if dataset_dir is None:
            raise FileNotFoundError("train.task=keyword_inclusion needs the keyword dataset directory")
        for split in ("train", "val"):
            _check_split_file(Path(dataset_dir) / f"{split}.jsonl")

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


def _check_split_file(path: Path) -> None:
    """Every line of a keyword dataset split parses, with a ``prompt`` string and a non-empty
    ``keywords`` list of strings."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (run `rlpipe build-dataset`)")
    n = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{i}: not JSON ({e.msg})") from None
            kws = r.get("keywords") if isinstance(r, dict) else None
            if not isinstance(r, dict) or not isinstance(r.get("prompt"), str):
                raise DatasetError(f"{path}:{i}: needs a 'prompt' string")
            if not isinstance(kws, list) or not kws or not all(isinstance(k, str) for k in kws):
                raise DatasetError(f"{path}:{i}: needs a non-empty 'keywords' list of strings, got {kws!r}")
            n += 1
    if n == 0:
        raise DatasetError(f"{path} holds no records")
