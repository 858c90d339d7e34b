"""A track's task and prompts, checked at parse time, before any job. This module imports the tasks
(and with them torch): the workflow loads it only when ``track_checks.needs_task_checks`` holds."""

from __future__ import annotations

import json
from pathlib import Path

from snakemake.exceptions import WorkflowError

from rlpipe.config import KEYWORD_TRACK, MATH_TRACK, ConfigError, PipelineConfig, Track, to_dict
from rlpipe.tasks.base import DatasetError
from rlpipe.tasks.keyword.vocabulary import load_keywords
from rlpipe.tasks.prompt_budget import base_context_length, check_prompt_lengths, preset_context_length
from rlpipe.tasks.registry import TaskLoadError, check_task
from rlpipe.workflow.runs import Runs
from rlpipe.workflow.track_checks import check_track_paths, checks_keywords

TASK_ERRORS = (DatasetError, FileNotFoundError, TaskLoadError, ValueError)


def check_keywords(cfg: PipelineConfig) -> None:
    """A given keyword file's lines (named file:line)."""
    if checks_keywords(cfg):
        try:
            load_keywords(cfg.data.keywords_path)
        except ConfigError as e:
            raise WorkflowError(f"invalid rlpipe config: {e}") from None


def check_user_task(t: Track) -> None:
    """A user's track with a given dataset directory: its task loads, its files parse and its reward
    answers on the first examples now, at parse time, before any job (rlpipe train checks again
    before Ray starts; a command-built dataset is checked there only, once it exists)."""
    try:
        check_task(t.pipeline.train, t.dataset_dir)
    except TASK_ERRORS as e:
        raise WorkflowError(f"track {t.name}: {e}") from None


def prompt_tokenizer(t: Track, results: str) -> str | None:
    """The tokenizer a track's prompts are counted with: its given one, its base model's, or the one
    it trained (when it exists now); None: bounded from the prompt's bytes."""
    trained = Path(f"{results}/{t.subdir}tokenizer/tokenizer.json")
    if t.pipeline.tokenizer.path:
        return t.pipeline.tokenizer.path
    if t.base_model and Path(t.base_model, "tokenizer.json").is_file():
        return t.base_model
    return str(trained) if t.pretrains and trained.is_file() else None


def check_prompts(t: Track, runs: Runs, results: str) -> None:
    """Every prompt of a track's given dataset fits its model's context with room for the response,
    for each distinct prompt setting of its runs and its families' (rlpipe.tasks.prompt_budget: tokens
    counted with the track's tokenizer when it exists now, else bounded from the prompt's bytes;
    rlpipe train counts exactly again)."""
    p = t.pipeline
    context = (base_context_length(t.base_model) if t.base_model
               else preset_context_length(p.model.preset, p.model.overrides))
    if context is None:
        return
    tokenizer = prompt_tokenizer(t, results)
    trains = [runs.track_train(t.name, v) for v in p.variants]
    trains += [runs.family_train(f, v) for f in runs.families if runs.cfg.families[f].base_track == t.name
               for v in runs.family_cfg(f).variants]
    seen = set()
    for train in trains:
        key = json.dumps([train.task, to_dict(train.text), to_dict(train.math), train.task_options,
                          train.sampling_max_tokens], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            try:
                check_prompt_lengths(train, t.dataset_dir, context, tokenizer)
            except TASK_ERRORS as e:
                raise WorkflowError(f"track {t.name}: {e}") from None


def check_inputs(runs: Runs, results: str) -> None:
    """A given keyword file, then every active track's given paths, task and prompts, track by track."""
    check_keywords(runs.cfg)
    for t in runs.tracks.values():
        check_track_paths(t)
        if t.name not in (KEYWORD_TRACK, MATH_TRACK) and t.dataset_dir:
            check_user_task(t)
        if t.dataset_dir:
            check_prompts(t, runs, results)
