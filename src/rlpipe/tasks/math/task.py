"""The MATH task plug-in (seeds 001 and 004).

- ``math``: problems from a dataset directory holding ``train.jsonl`` and a validation file
  (``val.jsonl``, ``validation.jsonl`` as in seed 001's ``MATH/validation.jsonl``, or ``test.jsonl``;
  the first that exists), read by ``rlpipe.tasks.math.data.load_math_jsonl`` (MATH or GSM8K fields).
  The prompt template picks its reward and stop strings together, from one table: ``r1_zero`` ->
  ``r1_zero_reward_fn``, stop ``("</answer>",)`` (seed 001 §3.3); ``question_only`` (seed 004's
  prompt ablation) -> ``question_only_reward_fn``, no stop string (the response runs to EOS or
  ``max_tokens``, its answer is the last ``\\boxed{}``).

Departures from the seeds: seed 001 samples with ``include_stop_str_in_output=True`` so that the
response ends with ``</answer>``, which ``r1_zero_reward_fn`` requires; ``include_stop_str_in_output``
below says so for the sampler's caller. ``strict`` (default False: math-verify's lenient
equivalence, the RL reward) switches to the course-comparable grading of
``rlpipe.tasks.math.grader``; it is passed on every reward call, so it holds in every process
(Ray actors) whatever the process-wide default.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlpipe.tasks.base import DatasetError, Example, Task
from rlpipe.tasks.math.data import MathDataError, load_math_jsonl
from rlpipe.tasks.math.prompt import PROMPT_NAMES
from rlpipe.tasks.math.reward import question_only_reward_fn, r1_zero_reward_fn
from rlpipe.tasks.reward_dict import RewardDict

# prompt template -> (reward function, stop strings)
PROMPT_SETUPS: dict[str, tuple[Callable[..., RewardDict], tuple[str, ...]]] = {
    "r1_zero": (r1_zero_reward_fn, ("</answer>",)),
    "question_only": (question_only_reward_fn, ()),
}
VAL_FILES = ("val.jsonl", "validation.jsonl", "test.jsonl")


def _dataset_files(dataset_dir: str | Path | None) -> tuple[Path, Path]:
    if dataset_dir is None:
        raise ValueError("the math task needs a dataset directory (train.jsonl + validation.jsonl)")
    d = Path(dataset_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"math dataset directory {d} does not exist")
    train = d / "train.jsonl"
    val = next((d / name for name in VAL_FILES if (d / name).is_file()), None)
    missing = ([] if train.is_file() else ["train.jsonl"]) + ([] if val else [" or ".join(VAL_FILES)])
    if missing:
        raise FileNotFoundError(f"math dataset {d} lacks {' and '.join(missing)}")
    assert val is not None
    return train, val


class MathTask(Task):
    name = "math"
    include_stop_str_in_output = True  # r1_zero's grader needs the closing </answer> (seed 001)

    @classmethod
    def check_dataset(cls, dataset_dir: str | Path | None, options: dict | None = None) -> None:
        """Both splits load (every line parses, the fields exist, answers parse): errors name file:line.
        ``options``: ``train.math`` (its field names are used)."""
        fields = {k: v for k, v in (options or {}).items() if k.endswith("_field")}
        try:
            for path in _dataset_files(dataset_dir):
                load_math_jsonl(path, **fields)
        except MathDataError as e:
            raise DatasetError(str(e)) from None
        except ValueError as e:  # no directory given
            raise FileNotFoundError(str(e)) from None

    def __init__(self, dataset_dir: str | Path | None, prompt: str = "r1_zero", *, strict: bool = False,
                 fast: bool = True, problem_field: str = "problem", answer_field: str | None = "answer",
                 solution_field: str | None = "solution"):
        if prompt not in PROMPT_SETUPS:
            raise ValueError(f"math task: unknown prompt {prompt!r}; prompts: {list(PROMPT_NAMES)}")
        self.prompt = prompt
        self._reward_fn, self.stop = PROMPT_SETUPS[prompt]
        self.strict, self.fast = bool(strict), bool(fast)
        train, val = _dataset_files(dataset_dir)
        fields = dict(problem_field=problem_field, answer_field=answer_field, solution_field=solution_field)
        self._train = load_math_jsonl(train, prompt, **fields)
        self._val = load_math_jsonl(val, prompt, **fields)

    def train_examples(self) -> list[Example]:
        return self._train

    def val_examples(self) -> list[Example]:
        return self._val

    def reward(self, response: str, ground_truth: Any) -> dict[str, float]:
        return self._reward_fn(response, ground_truth, fast=self.fast, strict=self.strict)
