"""rlpipe: reproducible GRPO post-training experiments (Ray trainer + Snakemake workflow)."""

__version__ = "0.1.0"
