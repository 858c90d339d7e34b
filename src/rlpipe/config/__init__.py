"""The one typed config of rlpipe: pydantic v2 models, one per section.

The package: ``base`` (the strict section base and ``ConfigError`` messages), ``train`` (the
``train`` section and its options), ``sections`` (every other section and ``PipelineConfig``),
``tracks`` (a user's tracks, families and the workflow's ``Track`` record), ``root``
(``PipelineConfig``), ``pipeline`` (loading, overrides, each track's and family's derived pipeline,
variants), ``smoke`` (the smoke switch's caps, applied to every track) and ``schema`` (the generated
JSON schema). Import everything from ``rlpipe.config``.

A pipeline config is a YAML file with one section per stage (``data``, ``tokenizer``, ``model``,
``pretrain``, ``train``, ``ray``, ``workflow``) plus a ``variants`` table. Every key is a pydantic
field below, ``Field(default, <bounds>, description=...)``: the model field is the only place a
default lives, and every numeric field carries its valid range (``ge``/``gt``/``le``/``lt``).
The models are strict (a bool is not an int, a string is not a number; an int is accepted for a
float field), reject NaN and infinity, and forbid unknown keys. Cross-field rules (the seed-001
divisibility asserts, ``k`` needs ``colocated_k``, replay needs ``disaggregated``, a TinyStories
corpus needs ``data.corpus_path``) are ``model_validator(mode="after")`` checks, so a bad config
fails when it is parsed, before any work. ``TrainConfig.derived`` then computes every derived size
once.

Every failure is a ``ConfigError`` (a ``ValueError``) whose message names the dotted key, e.g.
``train.val_every: must be >= 1, got 0`` or ``unknown config key
'train.lerning_rate'; did you mean 'learning_rate'?``. That holds for ``parse_config`` /
``load_config`` and for building a section directly (``DataConfig(val_fraction=1.5)`` names
``data.val_fraction``): pydantic's ``ValidationError`` never escapes this module.

Variants are overrides of ``train`` (dotted keys, e.g. ``weight_sync.transport: rdt``);
``resolve_variant`` applies one and validates the result (errors name ``variants.<name>.<key>``),
so a typo in a variant fails before any work starts. An overlay config drops a variant by setting
it to ``null``. The JSON schema that Snakemake validates against is generated from these models
(``json_schema()``: bounds and descriptions, no defaults), so the two can never drift; a test
checks the checked-in copy.

Departures from the seeds: the CPU default config scales seed 000 §3.1.2's hyperparameters down
(see ``config/config.yaml``); the ``train`` defaults here are the seed's values (the ``data``,
``tokenizer`` and ``pretrain`` defaults, which the seeds leave open, are tuned for the CPU budget).
Until this module moved to pydantic the sections were hand-checked dataclasses; keys, defaults and
values are unchanged, only out-of-range values that used to fail late (or not at all) now fail here.
"""

from __future__ import annotations

from rlpipe.config.base import DEVICE_PATTERN, ConfigError, from_dict, to_dict
from rlpipe.config.pipeline import (
    EVAL_BASE_TRAIN_KEYS,
    FAMILIES_PREFIX,
    MATH_PREFIX,
    NAME_PATTERN,
    active_families,
    apply_overrides,
    eval_base_settings,
    family_base_track,
    family_pipeline,
    family_reference,
    family_seeds,
    load_config,
    load_yaml,
    math_pipeline,
    parse_config,
    resolve_variant,
    table_reference,
    track_pipeline,
    user_track_pipeline,
    variant_gpus,
    variant_nodes,
    workflow_tracks,
)
from rlpipe.config.root import PipelineConfig
from rlpipe.config.schema import json_schema
from rlpipe.config.sections import (
    KEYWORD_TRACK,
    MATH_TRACK,
    SYSTEMS_TRACK,
    ArithmeticConfig,
    DataConfig,
    LoggingConfig,
    MathPretrainConfig,
    MathTokenizerConfig,
    MathTrackConfig,
    ModelSection,
    PretrainConfig,
    RayConfig,
    TokenizerConfig,
    WorkflowConfig,
)
from rlpipe.config.smoke import SmokeConfig, overlay_list_replacements
from rlpipe.config.tracks import CORPUS_FILE, RESERVED_TRACKS, FamilyConfig, Track, TrackConfig
from rlpipe.config.train import (
    TASK_SPEC_PATTERN,
    DerivedSizes,
    MathOptions,
    ReplayConfig,
    TextOptions,
    TrainConfig,
    WeightSyncConfig,
)

__all__ = [
    "DEVICE_PATTERN", "EVAL_BASE_TRAIN_KEYS", "FAMILIES_PREFIX", "KEYWORD_TRACK", "MATH_PREFIX", "MATH_TRACK",
    "NAME_PATTERN", "SYSTEMS_TRACK", "TASK_SPEC_PATTERN", "ArithmeticConfig", "ConfigError", "DataConfig",
    "DerivedSizes", "FamilyConfig", "LoggingConfig", "MathOptions", "MathPretrainConfig", "MathTokenizerConfig",
    "MathTrackConfig", "ModelSection", "PipelineConfig", "PretrainConfig", "RayConfig", "ReplayConfig", "TextOptions",
    "TokenizerConfig", "TrainConfig", "WeightSyncConfig", "WorkflowConfig", "active_families", "apply_overrides",
    "eval_base_settings", "family_base_track", "family_pipeline", "family_reference", "family_seeds", "from_dict",
    "json_schema", "load_config", "load_yaml", "math_pipeline", "parse_config", "resolve_variant", "table_reference",
    "to_dict", "variant_gpus", "variant_nodes", "CORPUS_FILE", "RESERVED_TRACKS", "Track", "TrackConfig",
    "track_pipeline", "user_track_pipeline", "workflow_tracks", "SmokeConfig", "overlay_list_replacements",
]
