"""Tiny base model, tokenizer, keyword dataset and config for trainer tests (no pretraining:
mechanics tests only need a valid checkpoint; learning tests train their own)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import yaml

WORDS = ["cat", "dog", "apple", "tree", "ball", "house", "moon", "fish", "bird", "cake", "boat", "hat"]


def make_tokenizer(path: Path):
    from rlpipe.lm.tokenizer import train_bpe

    rng = random.Random(0)
    texts = []
    for _ in range(300):
        w = rng.sample(WORDS, 3)
        texts.append(f"Write a story that includes the word: {w[0]}\nOnce upon a time a {w[1]} saw a {w[2]}. "
                     f"The {w[0]} was happy.<|endoftext|>")
    return train_bpe(texts, 400, path)


def make_base(tmp: Path, pretrain_steps: int = 150, **model_overrides) -> tuple[Path, Path]:
    """(checkpoint path, tokenizer path) of a micro TransformerLM briefly trained on keyword
    stories, so that its responses sometimes contain the keyword (rewards have variance and GRPO
    has a gradient)."""
    from rlpipe.lm.checkpoint import save_checkpoint
    from rlpipe.lm.model import ModelConfig, TransformerLM

    tok = make_tokenizer(tmp / "tokenizer.json")
    torch.manual_seed(0)
    overrides = dict(vocab_size=tok.vocab_size, num_layers=2, d_model=32, num_heads=2, d_ff=64,
                     context_length=128) | model_overrides
    model = TransformerLM(ModelConfig.from_preset("cpu-tiny", **overrides))
    rng = random.Random(1)
    docs = []
    for _ in range(200):
        w = rng.sample(WORDS, 2)
        hit = w[0] if rng.random() < 0.5 else w[1]
        docs += tok.encode(f"Write a story that includes the word: {w[0]}\nThe {hit} was happy.") + [tok.eos_token_id]
    data = torch.tensor(docs)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(pretrain_steps):
        starts = torch.randint(0, len(data) - 33, (16,))
        x = torch.stack([data[s:s + 33] for s in starts])  # (B, 33)
        logits = model(x[:, :-1])  # (B, 32, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_checkpoint(tmp / "base.pt", model, tokenizer=str(tmp / "tokenizer.json"))
    return tmp / "base.pt", tmp / "tokenizer.json"


def make_dataset(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for split, words in (("train", WORDS[:9]), ("val", WORDS[6:])):
        with open(d / f"{split}.jsonl", "w") as f:
            for w in words:
                f.write(json.dumps({"prompt": f"Write a story that includes the word: {w}\n", "keywords": [w]}) + "\n")
    return d


BASE_TRAIN = {
    "n_grpo_steps": 2, "rollout_batch_size": 8, "group_size": 4, "train_batch_size": 8,
    "sampling_max_tokens": 8, "val_size": 3, "val_every": 1, "log_rollouts_every": 1,
    "checkpoint_every": 1, "device": "cpu", "threads": 1, "learning_rate": 1e-2, "ray_timeout_s": 120.0,
}

VARIANTS = {
    "onpolicy": {"mode": "colocated_sync"},
    "k1": {"mode": "colocated_k", "k": 1},
    "k2": {"mode": "colocated_k", "k": 2, "n_grpo_steps": 4},
    "k4": {"mode": "colocated_k", "k": 4, "n_grpo_steps": 4},
    "disagg": {"mode": "disaggregated", "n_grpo_steps": 6},
    "disagg_rdt": {"mode": "disaggregated", "weight_sync.transport": "rdt", "n_grpo_steps": 3},
    "replay": {"mode": "disaggregated", "replay.enabled": True, "replay.max_age": 2, "n_grpo_steps": 4},
    "scorer": {"mode": "disaggregated", "scorer_actor": True, "n_grpo_steps": 2},
    "kl_penalty": {"mode": "colocated_sync", "kl_coef": 0.1},
}


def write_config(path: Path, train: dict | None = None, variants: dict | None = None, **sections) -> Path:
    cfg = {"train": BASE_TRAIN | (train or {}), "variants": variants or VARIANTS,
           "workflow": {"threads_per_variant": 2}} | sections
    path.write_text(yaml.safe_dump(cfg))
    return path
