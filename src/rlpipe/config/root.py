"""``PipelineConfig``: a whole pipeline config, one field per section (the root of the schema)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlpipe.config.base import _Section
from rlpipe.config.sections import (
    DataConfig,
    LoggingConfig,
    MathTrackConfig,
    ModelSection,
    PretrainConfig,
    RayConfig,
    TokenizerConfig,
    WorkflowConfig,
)
from rlpipe.config.smoke import SmokeConfig
from rlpipe.config.tracks import FamilyConfig, TrackConfig
from rlpipe.config.train import TrainConfig


class PipelineConfig(_Section):
    """A whole pipeline config: one section per stage plus the variants table."""

    data: DataConfig = Field(default_factory=DataConfig, description="Corpus and keyword dataset.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="Tokenizer.")
    model: ModelSection = Field(default_factory=ModelSection, description="Base model.")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="Pretraining.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="GRPO base settings shared by all variants.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray.")
    workflow: WorkflowConfig = Field(default_factory=WorkflowConfig, description="Snakemake workflow settings.")
    math: MathTrackConfig = Field(default_factory=MathTrackConfig, description="The MATH track.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Live monitoring.")
    variants: dict[str, dict[str, Any]] = Field(
        {}, description="Variant name -> overrides of train (dotted keys allowed): seed 000's systems "
                        "comparison (results/runs/<variant>).")
    tracks: dict[str, TrackConfig | None] = Field(
        {}, description="A user's tracks: name -> a task with its dataset, base model, train overrides and "
                        "variants (results/tracks/<name>/). 'keyword' and 'math' are built in (the sections "
                        "above and the math section). null drops one.")
    families: dict[str, FamilyConfig | None] = Field(
        {}, description="Experiment families: name -> a replicated family of variants with its own "
                        "report section (results/families/<name>/). null drops one.")
    smoke: SmokeConfig = Field(
        default_factory=SmokeConfig, description="A smoke run: caps that shrink every track, the user's "
        "included, without replacing any list of the config (config/smoke.yaml switches it on).")
