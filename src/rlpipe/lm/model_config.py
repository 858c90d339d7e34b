"""The shape of a ``TransformerLM`` (``ModelConfig``) and its presets, without torch: the workflow
reads a model's size from them (``rlpipe.slurm``: a training job's memory and time) at every parse.
``rlpipe.lm.model`` re-exports both."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a ``TransformerLM``. Validated on construction; errors name the bad field."""

    vocab_size: int
    context_length: int
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "num_layers", "d_model", "num_heads", "d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be a positive number, got {self.rope_theta!r}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})"
            )
        if (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"ModelConfig.d_model // num_heads = {self.d_model // self.num_heads} must be even for RoPE"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModelConfig:
        """A preset with some fields replaced, e.g. ``from_preset("cpu-tiny", vocab_size=tok.vocab_size)``."""
        if name not in PRESETS:
            raise KeyError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides)

    def replace(self, **overrides) -> ModelConfig:
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise TypeError(f"unknown ModelConfig field(s) {unknown}; fields are {sorted(fields)}")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown, missing = sorted(set(d) - fields), sorted(fields - set(d) - {"rope_theta"})
        if unknown or missing:
            raise ValueError(f"bad model config: unknown fields {unknown}, missing fields {missing}")
        return cls(**d)

    def num_parameters(self) -> int:
        """Closed-form parameter count (untied embeddings/head, no biases)."""
        d, v = self.d_model, self.vocab_size
        per_layer = 4 * d * d + 3 * d * self.d_ff + 2 * d  # q,k,v,o + w1,w2,w3 + two RMSNorm gains
        return 2 * v * d + self.num_layers * per_layer + d  # embeddings + head + blocks + ln_final


PRESETS: dict[str, ModelConfig] = {
    # seed 000's model skeleton (GPT-2 vocabulary): 63.9M parameters, of which 12.5M in the blocks
    # and 2 x 25.7M in the untied embedding and LM head.
    "assignment": ModelConfig(
        vocab_size=50257, context_length=256, num_layers=4, d_model=512, num_heads=16, d_ff=1344,
        rope_theta=10000.0,
    ),
    # The default pipeline on a 2-core CPU (vocab_size is overridden by the trained tokenizer).
    # 1.38M parameters at vocab 2048; d_ff = 3 * d_model (HW1's ~8/3 d, rounded to a multiple of 64).
    # Measured on one shared core (torch 2.13): sampling 4 prompts x G=4 x 60 tokens ~0.3 s, a GRPO
    # train step on those 16 rows ~0.25 s (so 100 steps ~1 min of compute), pretraining ~6.5k tok/s
    # (~2M tokens in 5 min). d_model 192/256 cost 1.5x/3x per GRPO step and pretrain 3.5x slower;
    # d_model 64 x 2 layers is 3x faster but has too little capacity to learn story text.
    "cpu-tiny": ModelConfig(
        vocab_size=2048, context_length=256, num_layers=4, d_model=128, num_heads=4, d_ff=384,
        rope_theta=10000.0,
    ),
}
