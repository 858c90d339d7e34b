"""A track's given inputs, checked when the workflow is parsed, before any job: its model and dataset
directories here (named by key); its task, files and prompts in ``task_checks``, which imports the
tasks (and torch) and is loaded only when ``needs_task_checks`` says a track has something to check."""

from __future__ import annotations

from pathlib import Path

from snakemake.exceptions import WorkflowError

from rlpipe.config import CORPUS_FILE, KEYWORD_TRACK, MATH_TRACK, PipelineConfig, Track


def check_track_paths(t: Track) -> None:
    """A track's given model and dataset directories exist (named by key, before any job)."""
    if t.name == KEYWORD_TRACK:
        return
    if t.name == MATH_TRACK:
        model_key, data_key = "math.base_model_dir", "math.dataset_dir"
    else:
        model_key, data_key = f"tracks.{t.name}.base_model", f"tracks.{t.name}.dataset_dir"
    base = t.base_model
    if base and not (Path(base, "config.json").is_file() or Path(base).is_file()):
        raise WorkflowError(f"invalid rlpipe config: {model_key}: {base} is not a local HuggingFace model directory "
                            "(no config.json) nor an rlpipe checkpoint file; rlpipe never downloads models")
    if t.dataset_dir and not Path(t.dataset_dir).is_dir():
        raise WorkflowError(f"invalid rlpipe config: {data_key}: {t.dataset_dir} is not a directory")
    if t.name == MATH_TRACK and t.dataset_dir and not Path(t.dataset_dir, "train.jsonl").is_file():
        raise WorkflowError(f"invalid rlpipe config: {data_key}: {t.dataset_dir} holds no train.jsonl "
                            "(a MATH-format directory: train.jsonl and validation.jsonl)")
    if t.dataset_dir and t.pretrains and t.name != MATH_TRACK and not Path(t.dataset_dir, CORPUS_FILE).is_file():
        raise WorkflowError(f"invalid rlpipe config: {data_key}: {t.dataset_dir} holds no {CORPUS_FILE}, which "
                            f"pretraining the track's base model reads (or give {model_key})")


def checks_keywords(cfg: PipelineConfig) -> bool:
    """The keyword track reads a given keyword file: its lines are checked (named file:line)."""
    return bool(cfg.data.keywords_path) and KEYWORD_TRACK in cfg.workflow.tracks


def needs_task_checks(cfg: PipelineConfig, tracks: dict[str, Track]) -> bool:
    """Whether anything needs rlpipe.workflow.task_checks: a given keyword file, or a track with a
    given dataset directory (its prompts; a user's track's task too)."""
    return checks_keywords(cfg) or any(t.dataset_dir for t in tracks.values())


def check_paths_of(tracks: dict[str, Track]) -> None:
    """Every active track's given model and dataset directories (when no task check is needed)."""
    for t in tracks.values():
        check_track_paths(t)
