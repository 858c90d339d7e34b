"""The generic text task: JSONL examples, a prompt template, stop strings and a user's reward.

The seeds define three tasks (keyword inclusion, sorting, MATH), each with its own prompt and
reward in the package. This task takes all three parts from the config (``train.text``), so a
user's problem runs every comparison (variants, families, replicates) without editing rlpipe:

- ``train.jsonl`` / ``val.jsonl`` (names configurable), one JSON object per line;
- a prompt template, inline or in a file, whose ``{field}`` placeholders name JSONL fields;
- ``answer_field``: the ground truth handed to the reward (null: the whole object);
- the reward by reference (``rlpipe.tasks.text.reward_ref``), returning a float or a reward dict.

``check_dataset`` reads every line of both files before any work and names ``file:line`` and the
missing field; ``rlpipe.tasks.registry.check_task`` then calls the reward on the first examples.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from rlpipe.tasks.base import DatasetError, Example, Task
from rlpipe.tasks.jsonl import jsonl_records
from rlpipe.tasks.text.reward_ref import as_reward_dict, load_reward


def read_template(options: dict) -> str:
    """The prompt template: ``template_file``'s text when set, else ``template``."""
    path = options.get("template_file")
    if path is None:
        return options.get("template", "{prompt}")
    try:
        return Path(path).read_text()
    except OSError as e:
        raise DatasetError(f"train.text.template_file: cannot read {path}: {e.strerror or e}") from None


def template_fields(template: str, where: str) -> list[str]:
    """The field names a template's placeholders use; a malformed template is an error naming it."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise DatasetError(f"{where}: bad prompt template ({e}); write {{{{ and }}}} for literal braces") from None
    fields = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise DatasetError(f"{where}: placeholder {{{name}}} must be a JSONL field name")
        fields.append(name)
    return fields


def load_examples(path: Path, template: str, answer_field: str | None) -> list[Example]:
    """Every line of ``path`` as an ``Example``; errors name ``file:line`` and the field."""
    needed = template_fields(template, "train.text.template") + ([answer_field] if answer_field else [])
    out = []
    for i, row in jsonl_records(path):
        missing = [k for k in needed if k not in row]
        if missing:
            raise DatasetError(f"{path}:{i}: lacks field {missing[0]!r} (the prompt template and "
                               f"train.text.answer_field use {sorted(set(needed))}; the line has {sorted(row)})")
        prompt = template.format_map({k: row[k] for k in needed})
        out.append(Example(prompt, row[answer_field] if answer_field else row))
    if not out:
        raise DatasetError(f"{path}: no examples")
    return out


def _split_paths(dataset_dir: str | Path | None, options: dict) -> tuple[Path, Path]:
    if dataset_dir is None:
        raise FileNotFoundError("the text task needs a dataset directory (--dataset)")
    d = Path(dataset_dir)
    paths = (d / options.get("train_file", "train.jsonl"), d / options.get("val_file", "val.jsonl"))
    for key, p in zip(("train_file", "val_file"), paths, strict=True):
        if not p.is_file():
            raise FileNotFoundError(f"text dataset: {p} does not exist (train.text.{key})")
    return paths


class TextTask(Task):
    name = "text"

    @classmethod
    def check_dataset(cls, dataset_dir: str | Path | None, options: dict | None = None) -> None:
        """Both splits load, every line has the template's fields and the answer field (the reward
        is imported and called by ``rlpipe.tasks.registry.check_task``)."""
        options = options or {}
        template = read_template(options)
        for path in _split_paths(dataset_dir, options):
            load_examples(path, template, options.get("answer_field", "answer"))

    def __init__(self, dataset_dir: str | Path | None, *, reward: str | None = None, template: str = "{prompt}",
                 template_file: str | None = None, answer_field: str | None = "answer",
                 train_file: str = "train.jsonl", val_file: str = "val.jsonl", stop: list[str] | tuple = (),
                 include_stop_str_in_output: bool = False):
        if reward is None:
            raise ValueError("the text task needs train.text.reward ('package.module:function' or 'file.py:function')")
        opts = dict(template=template, template_file=template_file, train_file=train_file, val_file=val_file)
        self.template = read_template(opts)
        train, val = _split_paths(dataset_dir, opts)
        self._train = load_examples(train, self.template, answer_field)
        self._val = load_examples(val, self.template, answer_field)
        self.reward_ref = reward
        self._reward_fn = load_reward(reward)
        self.stop = tuple(stop)
        self.include_stop_str_in_output = bool(include_stop_str_in_output)

    def train_examples(self) -> list[Example]:
        return self._train

    def val_examples(self) -> list[Example]:
        return self._val

    def reward(self, response: str, ground_truth: Any) -> dict[str, float]:
        return as_reward_dict(self._reward_fn(response, ground_truth))
