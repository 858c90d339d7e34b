"""Every prompt of a dataset fits the model's context with room for the response, checked before any
work and naming the file and line.

The sampler needs ``prompt tokens + train.sampling_max_tokens - 1 <= context length``; it used to
find out when a too-long prompt was drawn (a validation prompt after Ray had started; a training
prompt perhaps never). ``check_prompt_lengths`` reads every training and validation prompt of the
task at once:

- with the run's tokenizer, it counts tokens exactly (``rlpipe train`` before Ray starts; the
  workflow at parse time when the tokenizer exists then: a given ``tokenizer.path``, a HuggingFace
  base model's, or one a previous invocation trained);
- without one (the workflow at parse time, before the track's tokenizer is trained), it counts
  bytes over ``MAX_BYTES_PER_TOKEN``, a lower bound on the tokens of any tokenizer whose tokens are
  at most that long: it refuses only prompts that no tokenizer fits (a 1M-character prompt), never
  one that may fit. ``rlpipe train`` counts exactly later, before any actor starts.

Prompts of the text, math and keyword tasks are named by ``file:line``; a plug-in task's by its index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlpipe.config import TrainConfig
from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.model import PRESETS
from rlpipe.lm.tokenizer import load_tokenizer
from rlpipe.tasks.base import DatasetError
from rlpipe.tasks.jsonl import jsonl_records
from rlpipe.tasks.keyword.task import KeywordInclusionTask
from rlpipe.tasks.math.task import MathTask, _dataset_files
from rlpipe.tasks.registry import make_task, resolve_task, task_options
from rlpipe.tasks.text.task import TextTask, _split_paths

#: No tokenizer we know of has a token longer than this many UTF-8 bytes (GPT-2's longest is 128).
MAX_BYTES_PER_TOKEN = 256
HF_CONFIG = "config.json"


def preset_context_length(preset: str, overrides: dict[str, Any]) -> int:
    """The context length of our TransformerLM built from ``model.preset`` and ``model.overrides``."""
    return int(overrides.get("context_length", PRESETS[preset].context_length))


def base_context_length(base: str | Path) -> int | None:
    """The context length of a base model: an HF directory's ``max_position_embeddings``, an rlpipe
    checkpoint's ``context_length``; None when it names none."""
    p = Path(base)
    if p.is_dir():
        try:
            value = json.loads((p / HF_CONFIG).read_text()).get("max_position_embeddings")
        except (OSError, ValueError, AttributeError):
            return None
        return int(value) if isinstance(value, int) else None
    ckpt = load_checkpoint(p)
    if ckpt.model_config is not None:
        return ckpt.model_config.context_length
    return getattr(getattr(ckpt.model, "config", None), "max_position_embeddings", None)


def _split_files(train: TrainConfig, dataset_dir: str | Path | None) -> tuple[Path, Path] | None:
    cls = resolve_task(train.task)
    if cls is TextTask:
        return _split_paths(dataset_dir, task_options(cls, train))
    if cls is MathTask:
        return _dataset_files(dataset_dir)
    if cls is KeywordInclusionTask and dataset_dir is not None:
        return Path(dataset_dir, "train.jsonl"), Path(dataset_dir, "val.jsonl")
    return None


def _where(files: tuple[Path, Path] | None, split: int, count: int) -> list[str]:
    """Where each of a split's ``count`` prompts comes from: ``file:line`` when the file's records are
    the examples one to one, else ``training/validation example i``."""
    if files is not None:
        lines = [f"{files[split]}:{n}" for n, _ in jsonl_records(files[split])]
        if len(lines) == count:
            return lines
    return [f"{('training', 'validation')[split]} example {i}" for i in range(count)]


def _prompts(train: TrainConfig, dataset_dir: str | Path | None) -> Iterator[tuple[str, str]]:
    """(where, prompt) of every training and validation example."""
    task = make_task(train.task, dataset_dir, train)
    files = _split_files(train, dataset_dir)
    for split, examples in enumerate((task.train_examples(), task.val_examples())):
        yield from zip(_where(files, split, len(examples)), (ex.prompt for ex in examples), strict=True)


def check_prompt_lengths(train: TrainConfig, dataset_dir: str | Path | None, context_length: int,
                         tokenizer: str | None = None) -> None:
    """Raise ``DatasetError`` naming the first prompt (file:line) too long for ``context_length``
    with ``train.sampling_max_tokens`` new tokens; exact with ``tokenizer``, a lower bound without."""
    room = context_length - train.sampling_max_tokens + 1
    prompts = list(_prompts(train, dataset_dir))
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    if tok is not None:
        counts = [len(ids) for ids in tok.encode_batch([p for _, p in prompts])]
        unit = "tokens"
    else:
        counts = [-(-len(p.encode("utf-8")) // MAX_BYTES_PER_TOKEN) for _, p in prompts]
        unit = f"tokens at least ({MAX_BYTES_PER_TOKEN} bytes per token at most)"
    for (where, prompt), n in zip(prompts, counts, strict=True):
        if n > room:
            raise DatasetError(
                f"{where}: the prompt ({len(prompt)} characters, {n} {unit}) does not fit the model's context "
                f"length {context_length} with train.sampling_max_tokens={train.sampling_max_tokens} "
                f"(at most {room} prompt tokens); shorten it, or lower train.sampling_max_tokens")
