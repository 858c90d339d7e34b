"""Tracks and families as data: a track is one task's dataset, base model, train settings and variants.

The seeds define two tracks, both built in: ``keyword`` (seed 000: the top-level ``data``,
``tokenizer``, ``model``, ``pretrain``, ``train`` and ``variants`` sections) and ``math`` (seeds
001/004: the ``math`` section). A user adds a track as one entry of the ``tracks`` table
(``TrackConfig``) in an overlay; nothing in the package names it. ``workflow_tracks`` turns every
active track, built-in or not, into one ``Track`` record, and the workflow derives every path and
input from that record alone (``rlpipe.workflow.layout``).

Departures from the seeds, and why: the seeds run one task per handout. Keeping the built-in
tracks' config keys (``math.*`` and the top-level sections) keeps every existing overlay, result
path and resolved config valid; they are read into the same record a user's entry becomes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from rlpipe.config.base import _Invalid, _Section
from rlpipe.config.sections import (
    KEYWORD_TRACK,
    MATH_TRACK,
    SYSTEMS_TRACK,
    ModelSection,
    PretrainConfig,
    TokenizerConfig,
)

#: Names a user's track cannot take: the built-in tracks and the legacy systems family track.
RESERVED_TRACKS = (KEYWORD_TRACK, MATH_TRACK, SYSTEMS_TRACK)
#: Where a user's track writes (``results/tracks/<name>/``): data, tokenizer, base, runs, eval, report.
USER_TRACK_DIR = "tracks"
#: The pretraining corpus a track that pretrains its own base model reads from its dataset directory.
CORPUS_FILE = "corpus.txt"


class TrackConfig(_Section):
    """A user's track: a task with its dataset, base model, train overrides and variants.

    Families name it (``families.<f>.track``), ``workflow.tracks`` switches it on, and it writes under
    ``results/tracks/<name>/`` the same files the built-in tracks write: ``data/`` (when built by
    ``dataset_command``), ``tokenizer/`` and ``base/`` (when pretrained), ``runs/<variant>/``,
    ``eval/<base|variant>/`` and ``report/``."""

    description: str = Field("", description="What the track is (shown in its report section).")
    dataset_dir: str | None = Field(
        None, min_length=1, description="An existing directory holding the task's files (the train and validation "
        "JSONL the task reads, and corpus.txt when the base model is pretrained here).")
    dataset_command: str | None = Field(
        None, min_length=1, description="A shell command that writes the dataset into the directory '{out}' "
        "(run by the workflow's build_track_data rule, from the repository root); give it or dataset_dir.")
    base_model: str | None = Field(
        None, min_length=1, description="The policy's starting point: an rlpipe checkpoint (.pt) or a local "
        "HuggingFace directory of a causal LM (never downloaded). null: train a tokenizer and pretrain the "
        "`model` preset on the dataset's corpus.txt with the `tokenizer` and `pretrain` sections below.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="Tokenizer (when pretrained).")
    model: ModelSection = Field(default_factory=ModelSection, description="Base model (when pretrained).")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="Pretraining (when pretrained).")
    train: dict[str, Any] = Field(
        {}, description="Overrides of the shared train section for this track's runs (dotted keys allowed); "
                        "train.task names the task (a built-in, 'text', 'module:Class' or an entry point).")
    variants: dict[str, dict[str, Any] | None] = Field(
        {"onpolicy": {}}, description="Variant name -> overrides of the track's train settings (null drops one): "
                                      "results/tracks/<name>/runs/<variant>; a systems family compares them.")
    timed: bool = Field(
        True, description="Each variant runs alone on workflow.threads_per_variant threads, so its timings compare "
                          "(false: workflow.family_threads, two runs share the cores).")
    evaluate: bool = Field(
        True, description="Evaluate the base model and each variant's final policy with `rlpipe eval` (format "
                          "and answer reward categories) and write the track's report section.")
    eval_size: int = Field(256, ge=1, description="Validation examples each evaluation scores.")
    eval_max_tokens: int | None = Field(
        None, ge=1, description="Max new tokens in evaluation; default: the track's train.sampling_max_tokens.")

    @model_validator(mode="after")
    def check_cross_fields(self) -> TrackConfig:
        if (self.dataset_dir is None) == (self.dataset_command is None):
            raise _Invalid("@dataset_dir or @dataset_command: give exactly one (a directory of the task's files, "
                           "or a command that writes them into '{out}')")
        if self.dataset_command is not None and "{out}" not in self.dataset_command:
            raise _Invalid("@dataset_command must contain '{out}', the directory it writes the dataset into")
        if self.base_model is not None and self.model.base_checkpoint is not None:
            raise _Invalid("@model.base_checkpoint: use base_model to start a track from a checkpoint")
        return self


class FamilyConfig(_Section):
    """One experiment family: variants of one track's GRPO run, each replicated
    over seeds. ``rlpipe.config.family_pipeline`` derives the family's own pipeline config (the
    track's, with ``train`` = the track's train settings + ``base``, ``variants`` = this table); the
    workflow runs family x variant x seed as one ``rlpipe train`` job each, and ``rlpipe
    family-report`` writes the family's report section from this metadata alone (no variant name is
    special)."""

    track: str = Field(
        "math", min_length=1,
        description="The track whose task, base model and train settings the runs start from: 'keyword' (the "
                    "train section), 'math' (train + math.train) or a user's entry of the tracks table. "
                    "'systems' is short for track 'keyword' with systems: true. Skipped when the track is not in "
                    "workflow.tracks.")
    systems: bool = Field(
        False, description="Seed 000's systems comparison: the family's variants are its track's variants table "
                           "(give none here) and its replicates compare speed, so each runs alone on "
                           "workflow.threads_per_variant threads, and a replicate identical to one of the track's "
                           "own runs (its first seed, with no base) reads that run. Skipped when the table is empty.")
    question: str = Field(
        "", description="The seed problem the family answers (shown at the top of its report section).")
    base: dict[str, Any] = Field(
        {}, description="Overrides of the track's train settings shared by every variant (dotted keys allowed).")
    variants: dict[str, dict[str, Any] | None] | None = Field(
        None, description="Variant name -> overrides of base (null drops one). The first is the reference "
                          "unless `reference` names another. Required, except for a systems family (which "
                          "takes its track's variants table).")
    reference: str | None = Field(
        None, description="Variant every other one is compared against (default: the first).")
    replicates: int = Field(
        1, ge=1, le=64, description="Seeds per variant: train.seed, train.seed + 1, ... (confidence intervals "
                                    "need >= 2; with 1 the report calls every difference unreplicated).")
    x: str | None = Field(
        None, description="Dotted train key that orders the variants along an axis (a sweep, e.g. "
                          "learning_rate): the report then plots final reward against it.")

    @property
    def is_systems(self) -> bool:
        """A timed comparison of its track's variants table."""
        return self.systems or self.track == SYSTEMS_TRACK

    @property
    def base_track(self) -> str:
        """The track whose base model, dataset and train settings the family starts from."""
        return KEYWORD_TRACK if self.track == SYSTEMS_TRACK else self.track

    @model_validator(mode="after")
    def check_cross_fields(self) -> FamilyConfig:
        if self.is_systems:
            if self.variants is not None:
                raise _Invalid("@variants: a systems family takes its track's variants table; give none here")
            return self  # its reference is checked against that table (family_pipeline)
        if self.variants is None:
            raise _Invalid("@variants: required (variant name -> overrides of base)")
        kept = [k for k, v in self.variants.items() if v is not None]
        if not kept:
            raise _Invalid("@variants: every variant is null; a family needs at least one")
        if self.reference is not None and self.reference not in kept:
            raise _Invalid(f"@reference '{self.reference}' is not one of the variants ({', '.join(kept)})")
        return self


@dataclass(frozen=True)
class Track:
    """Everything the workflow needs of one active track, built-in or a user's.

    ``subdir`` is the one path scheme: every output of the track lives under
    ``<results_dir>/<subdir>`` ("" for keyword, which keeps the design card's ``results/runs/<v>``;
    "math/" for math; "tracks/<name>/" for a user's track)."""

    name: str
    subdir: str
    pipeline: Any  # PipelineConfig: the track's own pipeline config (variants = its runs)
    data_subdir: str  # where a built dataset lives under subdir ("data/keywords" for keyword, else "data")
    dataset_dir: str | None  # a given directory; None: built by the track's data rule
    dataset_command: str | None  # a user's data command (None for the built-in data rules)
    base_model: str | None  # a given HF directory or checkpoint; None: the track's base/model.pt
    pretrains: bool  # base/model.pt comes from this track's tokenizer + pretraining rules
    timed: bool  # its variants run alone (threads_per_variant)
    evaluate: bool  # rlpipe eval of base and final policies, and the track's report
    eval_size: int | None
    eval_max_tokens: int | None
