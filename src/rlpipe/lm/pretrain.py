"""Tiny-model pretraining: the base model that GRPO post-trains (seed 000 §3.1, "your own LM").

Seed 000 reuses the HW1 TransformerLM pretrained on TinyStoriesV2. rlpipe pretrains it here, on the
corpus from ``rlpipe.tasks.keyword.corpus`` (generated offline by default), with HW1's recipe: next-token
cross-entropy, AdamW, linear warm-up then cosine decay to ``min_lr_ratio * learning_rate``,
gradient-norm clipping, a periodic validation loss on held-out documents, and one checkpoint at
the end (``rlpipe.lm.checkpoint``, atomic; ``extra`` holds the final losses and step count), plus a
JSON log beside it (``<out stem>.log.json``: loss curve, timings, optional zero-shot reward).

Departures and choices the seeds leave open:
- Data: documents are tokenised once and packed into one flat stream, each followed by EOS
  (``<|endoftext|>``, the token the sampler stops on); a step samples ``batch_size`` windows of
  ``seq_len + 1`` tokens, as HW1's ``get_batch`` does, except that every window *starts at a
  document start*. GRPO prompts start at position 0 with nothing before them, and so does every
  training document's first part; with HW1's anywhere-windows the keyword prompt usually sits
  after the tail of another story, and in our measurements the keyword-copy behaviour appeared
  only after 2x the steps (or not at all within 1000 steps). Validation documents are a seeded
  ``pretrain.val_fraction`` of the documents, so no validation text is trained on; the validation
  loss is the mean over fixed, evenly spaced document windows, so evaluations are comparable.
- Weight decay applies to matrices only (not RMSNorm gains), the usual AdamW practice.
- The base model's zero-shot keyword reward is measured by the keyword task
  (``rlpipe.tasks.keyword.eval``, ``rlpipe eval-base``: this layer knows no task); that is how the
  default corpus mix (``data.keyword_prompt_fraction``, ``data.keyword_hit_rate``) was tuned to
  give GRPO an imperfect but learnable starting point. Measured with the defaults (700 steps of
  32 x 128 tokens, 2 idle cores, 208 s): the loss plateaus at ~1.1 until the copy circuit forms
  between steps 400 and 600 (val loss 1.01 -> 0.85); zero-shot reward 0.33 on 256 prompts. With
  half the tokens per step the onset took ~2x the steps, so the budget buys tokens, not steps.
- ``rlpipe import-base`` (``import_base_main``) turns ``model.base_checkpoint`` + ``tokenizer.path``
  into the same checkpoint format instead of pretraining: an rlpipe checkpoint or a HW1-style
  state dict (parameter names match HW1; shapes come from ``model.preset`` + ``model.overrides``).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from rlpipe.config import ConfigError, PipelineConfig, PretrainConfig, load_config
from rlpipe.io import write_json
from rlpipe.lm.checkpoint import CheckpointError, check_state_dict, load_checkpoint, save_checkpoint
from rlpipe.lm.device import autocast, resolve_device
from rlpipe.lm.documents import read_documents
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.tokenizer import load_tokenizer

# --------------------------------------------------------------------------- model config


def build_model_config(cfg: PipelineConfig, vocab_size: int):
    """``ModelConfig.from_preset(model.preset, vocab_size=<tokenizer>, **model.overrides)``."""

    overrides = dict(cfg.model.overrides)
    overrides.setdefault("vocab_size", vocab_size)
    try:
        mc = ModelConfig.from_preset(cfg.model.preset, **overrides)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"model.overrides / model.preset: {e}") from None
    if mc.vocab_size < vocab_size:
        raise ConfigError(f"model.overrides.vocab_size ({mc.vocab_size}) is smaller than the tokenizer's {vocab_size}")
    if cfg.pretrain.seq_len > mc.context_length:
        raise ConfigError(f"pretrain.seq_len ({cfg.pretrain.seq_len}) exceeds the model context_length "
                          f"({mc.context_length})")
    return mc


# --------------------------------------------------------------------------- data


@dataclass
class TokenStreams:
    train: Tensor  # (N_train,) int64, documents each followed by EOS
    val: Tensor  # (N_val,)
    train_starts: Tensor  # (D_train,) offsets of documents that start a full window
    val_starts: Tensor  # (D_val,)
    documents: int


def _starts(offsets: list[int], n_tokens: int, seq_len: int) -> Tensor:
    return torch.tensor([o for o in offsets if o + seq_len + 1 <= n_tokens], dtype=torch.long)


def pack_corpus(corpus_path: str | Path, tokenizer, val_fraction: float, seq_len: int, seed: int,
                batch_docs: int = 2048) -> TokenStreams:
    """Tokenise every document, append EOS, and split documents (seeded) into train/val streams."""

    rng = random.Random(f"rlpipe-pretrain-split-{seed}")
    streams: dict[str, list[int]] = {"train": [], "val": []}
    offsets: dict[str, list[int]] = {"train": [], "val": []}
    n_docs = 0
    batch: list[str] = []

    def flush() -> None:
        for ids in tokenizer.encode_batch(batch):
            split = "val" if rng.random() < val_fraction else "train"
            offsets[split].append(len(streams[split]))
            streams[split].extend(ids + [tokenizer.eos_token_id])
        batch.clear()

    for doc in read_documents(corpus_path):
        batch.append(doc)
        n_docs += 1
        if len(batch) == batch_docs:
            flush()
    flush()
    for name, split in (("training", "train"), ("validation", "val")):
        if len(streams[split]) < seq_len + 1:
            raise ConfigError(f"{corpus_path}: the {name} split has {len(streams[split])} tokens, fewer than "
                              f"pretrain.seq_len + 1 = {seq_len + 1} (more data.num_stories or another "
                              "pretrain.val_fraction)")
    train, val = (torch.tensor(streams[k], dtype=torch.long) for k in ("train", "val"))
    return TokenStreams(train, val, _starts(offsets["train"], train.numel(), seq_len),
                        _starts(offsets["val"], val.numel(), seq_len), n_docs)


def gather_windows(stream: Tensor, begin: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """The windows of ``seq_len + 1`` tokens starting at ``begin`` (B,) -> inputs, targets (B, T)."""
    windows = stream[begin[:, None] + torch.arange(seq_len + 1)[None, :]]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


def sample_windows(stream: Tensor, batch_size: int, seq_len: int, gen: torch.Generator,
                   starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Windows of ``seq_len + 1`` tokens -> inputs, targets (B, T). With ``starts`` (document
    offsets) every window begins at a document start; without, anywhere (HW1's ``get_batch``)."""
    if starts is not None and starts.numel():
        begin = starts[torch.randint(0, starts.numel(), (batch_size,), generator=gen)]  # (B,)
    else:
        begin = torch.randint(0, stream.numel() - seq_len, (batch_size,), generator=gen)  # (B,)
    return gather_windows(stream, begin, seq_len)


def lr_at(step: int, p: PretrainConfig) -> float:
    """Learning rate for 0-based ``step``: linear warm-up to the peak, cosine to the floor."""
    peak, floor = p.learning_rate, p.learning_rate * p.min_lr_ratio
    if step < p.warmup_steps:
        return peak * (step + 1) / p.warmup_steps
    span = max(1, p.max_steps - p.warmup_steps)
    progress = min(1.0, (step - p.warmup_steps) / span)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def compute_dtype(p: PretrainConfig, device: torch.device) -> str:
    """``pretrain.dtype`` resolved on ``device``: ``auto`` is bf16 autocast on CUDA and fp32 on CPU.

    Why fp32 on CPU: a CPU without bf16 units (no AVX512-BF16, no AMX) emulates bf16 matmuls, many
    times slower than its fp32 ones (``rlpipe bench pretrain-precision`` measures the ratio here), and a
    CPU-dependent precision would make the same config give another base model on another CPU."""
    if p.dtype != "auto":
        return p.dtype
    return "bfloat16" if device.type == "cuda" else "float32"


def lm_loss(model, x: Tensor, y: Tensor, device: torch.device, dtype: str = "float32") -> Tensor:
    """Next-token cross-entropy of ``model`` on inputs ``x`` and targets ``y`` (B, T), with the
    matmuls in ``dtype`` (``bfloat16``: autocast; the loss is taken in fp32 either way)."""
    with autocast(device, dtype):
        logits = model(x.to(device))  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten())


@torch.no_grad()
def validation_loss(model, stream: Tensor, seq_len: int, device: torch.device, starts: Tensor | None = None,
                    max_windows: int = 64, batch_size: int = 16, dtype: str = "float32") -> float:
    """Mean loss over up to ``max_windows`` evenly spaced windows (the same ones every call),
    beginning at document ``starts`` when given, as the training windows do."""
    if starts is not None and starts.numel():
        n = min(max_windows, starts.numel())
        begin = starts[torch.linspace(0, starts.numel() - 1, n).long()]  # (W,)
    else:
        n = min(max_windows, (stream.numel() - 1) // seq_len)
        begin = torch.linspace(0, stream.numel() - seq_len - 1, n).long()  # (W,)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, n, batch_size):
        x, y = gather_windows(stream, begin[i:i + batch_size], seq_len)  # (B, T), (B, T)
        total += lm_loss(model, x, y, device, dtype).item() * x.shape[0]
    model.train(was_training)
    return total / n


# --------------------------------------------------------------------------- training


@dataclass
class PretrainResult:
    steps: int
    train_loss: float
    val_loss: float
    wall_time_s: float
    log: dict = field(default_factory=dict)


def _optimizer(model, p: PretrainConfig, device: torch.device) -> torch.optim.AdamW:
    decay = [t for t in model.parameters() if t.ndim >= 2]
    no_decay = [t for t in model.parameters() if t.ndim < 2]
    groups = [{"params": decay, "weight_decay": p.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=p.learning_rate, betas=(0.9, 0.95), fused=device.type == "cuda")


def train_loop(model, streams: TokenStreams, p: PretrainConfig, device: torch.device,
               progress: bool = True) -> tuple[list[dict], float]:
    """Run ``p.max_steps`` optimizer steps; return the log rows and the last smoothed train loss."""
    from tqdm import tqdm

    opt = _optimizer(model, p, device)
    dtype = compute_dtype(p, device)
    gen = torch.Generator().manual_seed(p.seed)
    rows: list[dict] = []
    t0, ema = time.perf_counter(), None
    model.train()
    bar = tqdm(range(p.max_steps), desc="pretrain", disable=not progress, mininterval=2.0)
    for step in bar:
        lr = lr_at(step, p)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sample_windows(streams.train, p.batch_size, p.seq_len, gen, streams.train_starts)  # (B, T)
        loss = lm_loss(model, x, y, device, dtype)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip).item()
        opt.step()
        value = loss.item()
        ema = value if ema is None else 0.9 * ema + 0.1 * value
        row = {"step": step + 1, "lr": lr, "train_loss": value, "grad_norm": grad_norm,
               "time_s": time.perf_counter() - t0}
        if (step + 1) % p.eval_every == 0 or step + 1 == p.max_steps:
            row["val_loss"] = validation_loss(model, streams.val, p.seq_len, device, streams.val_starts,
                                              dtype=dtype)
            bar.write(f"pretrain: step {step + 1}/{p.max_steps} train_loss {ema:.3f} "
                      f"val_loss {row['val_loss']:.3f} ({row['time_s']:.0f}s)")
        rows.append(row)
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.1e}", refresh=False)
    bar.close()
    return rows, ema


def pretrain(cfg: PipelineConfig, corpus_path: str | Path, tokenizer_path: str | Path, out_path: str | Path,
             progress: bool = True) -> PretrainResult:
    """Pretrain ``model.preset`` on the corpus; write ``out_path`` and ``<stem>.log.json``."""

    p = cfg.pretrain  # ranges and the device string were checked when the config was parsed
    if p.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"pretrain.device is {p.device!r} but CUDA is not available")
    if not Path(corpus_path).is_file():
        raise FileNotFoundError(f"--corpus: {corpus_path} not found (build it with `rlpipe build-corpus`)")
    tokenizer = load_tokenizer(tokenizer_path)
    model_cfg = build_model_config(cfg, tokenizer.vocab_size)
    device = resolve_device(p.device)
    torch.set_num_threads(p.threads)
    torch.manual_seed(p.seed)
    t0 = time.perf_counter()
    streams = pack_corpus(corpus_path, tokenizer, p.val_fraction, p.seq_len, p.seed)
    t_pack = time.perf_counter() - t0
    model = TransformerLM(model_cfg).to(device)
    rows, train_loss = train_loop(model, streams, p, device, progress)
    val_loss = rows[-1]["val_loss"]
    wall = time.perf_counter() - t0
    log = {
        "model_config": model_cfg.to_dict(), "parameters": sum(t.numel() for t in model.parameters()),
        "device": str(device), "dtype": compute_dtype(p, device), "threads": p.threads, "documents": streams.documents,
        "train_tokens": streams.train.numel(), "val_tokens": streams.val.numel(),
        "tokens_seen": p.max_steps * p.batch_size * p.seq_len, "pack_time_s": t_pack, "wall_time_s": wall,
        "steps": p.max_steps, "train_loss": train_loss, "val_loss": val_loss, "curve": rows,
    }
    save_checkpoint(out_path, model, tokenizer=str(tokenizer_path),
                    extra={"train_loss": train_loss, "val_loss": val_loss, "steps": p.max_steps,
                           "tokens_seen": log["tokens_seen"], "wall_time_s": wall})
    write_json(log_path(out_path), log)
    return PretrainResult(p.max_steps, train_loss, val_loss, wall, log)


def log_path(checkpoint_path: str | Path) -> Path:
    p = Path(checkpoint_path)
    return p.with_name(p.stem + ".log.json")


# --------------------------------------------------------------------------- entry points


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe pretrain", description="Pretrain the base TransformerLM.")
    ap.add_argument("--config", required=True)
    ap.add_argument("--corpus", required=True, help="corpus text (rlpipe build-corpus)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (rlpipe train-tokenizer)")
    ap.add_argument("--out", required=True, help="checkpoint path to write")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    res = pretrain(cfg, args.corpus, args.tokenizer, args.out, progress=not args.no_progress)
    print(f"pretrain: {res.steps} steps, train_loss {res.train_loss:.3f}, val_loss {res.val_loss:.3f}, "
          f"{res.wall_time_s:.0f}s -> {args.out}")
    return 0


def import_base_main(argv: list[str] | None = None) -> int:
    """``rlpipe import-base``: ``model.base_checkpoint`` + ``tokenizer.path`` -> an rlpipe checkpoint."""

    ap = argparse.ArgumentParser(prog="rlpipe import-base", description=import_base_main.__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    src, tok_spec = cfg.model.base_checkpoint, cfg.tokenizer.path
    if not src:
        raise ConfigError("model.base_checkpoint is required for import-base")
    if not tok_spec:
        raise ConfigError("tokenizer.path is required with model.base_checkpoint")
    if not Path(src).is_file():
        raise ConfigError(f"model.base_checkpoint: file not found: {src}")
    tokenizer = load_tokenizer(tok_spec)
    try:
        model = load_checkpoint(src).model
    except CheckpointError:  # not an rlpipe checkpoint: a HW1-style state dict
        payload = torch.load(src, map_location="cpu", weights_only=True)
        state = payload.get("model", payload) if isinstance(payload, dict) else payload
        with torch.device("meta"):
            model = TransformerLM(build_model_config(cfg, tokenizer.vocab_size))
        check_state_dict(model, state, source=f"model.base_checkpoint {src}")
        model.load_state_dict(state, strict=True, assign=True)
    if model.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"model.base_checkpoint vocab ({model.config.vocab_size}) is smaller than "
                          f"tokenizer.path's ({tokenizer.vocab_size})")
    save_checkpoint(args.out, model, tokenizer=str(tok_spec), extra={"imported_from": str(src)})
    print(f"import-base: {src} + {tok_spec} -> {args.out}")
    return 0
