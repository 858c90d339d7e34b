"""``PipelineConfig``: a whole pipeline config, one field per section (the root of the schema)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rlpipe.config.base import _Invalid, _Section
from rlpipe.config.sections import (
    MATH_TRACK,
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

    @model_validator(mode="after")
    def check_gpus_declared(self) -> PipelineConfig:
        """A run on ``device: cuda`` needs GPUs declared for its job: with 0, Ray would give its actors
        no GPU and they would take one outside its accounting (and outside the job's GPU slots)."""
        for key, device, mode in self._train_devices():
            field = "gpus_per_disaggregated" if mode == "disaggregated" else "gpus_per_colocated"
            if str(device).startswith("cuda") and getattr(self.workflow, field) == 0:
                fix = "1 (its two actors share the GPU) or 2" if mode == "disaggregated" else "1"
                raise _Invalid(f"@{key} is {device!r} but @workflow.{field} is 0 (no GPU declared for a {mode} "
                               f"run): set workflow.{field}: {fix}, or use device: cpu")
        return self

    def _train_devices(self):
        """(dotted key, device, mode) of the train section, each variant and, when its track is on,
        the math track's train section and variants."""
        base = (self.train.device, self.train.mode)
        sections = [("train", "variants", {}, self.variants)]
        if MATH_TRACK in self.workflow.tracks:
            sections.append(("math.train", "math.variants", self.math.train, self.math.variants))
        for where, table, over, variants in sections:
            device, mode = over.get("device", base[0]), over.get("mode", base[1])
            yield f"{where}.device", device, mode
            for name, v in variants.items():
                v = v or {}
                yield f"{table}.{name}.device", v.get("device", device), v.get("mode", mode)
