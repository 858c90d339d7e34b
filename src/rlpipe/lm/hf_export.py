"""Export an rlpipe ``TransformerLM`` checkpoint as a HuggingFace ``LlamaForCausalLM`` folder.

``rlpipe export-hf CKPT OUT_DIR [--tokenizer PATH]`` writes::

    OUT_DIR/config.json  generation_config.json  model.safetensors     (LlamaForCausalLM.save_pretrained)
    OUT_DIR/tokenizer.json  tokenizer_config.json  special_tokens_map.json

so that ``LlamaForCausalLM.from_pretrained(OUT_DIR)`` and ``AutoTokenizer.from_pretrained(OUT_DIR)``
work offline, and so does ``rlpipe.lm.tokenizer.load_tokenizer(OUT_DIR)`` (it reads the same
``tokenizer_config.json``). The seeds have no such step: seed 000 trains our own model, seed 001
uses Qwen through HF; exporting lets HF tooling (and our sampler's HF path) run our model.

The model is a Llama: pre-norm RMSNorm blocks, SwiGLU, RoPE, no biases, untied head. Mapping
(ours -> HF)::

    token_embeddings.weight          -> model.embed_tokens.weight
    layers.{i}.ln1.weight            -> model.layers.{i}.input_layernorm.weight
    layers.{i}.attn.q_proj.weight    -> model.layers.{i}.self_attn.q_proj.weight   (rows permuted)
    layers.{i}.attn.k_proj.weight    -> model.layers.{i}.self_attn.k_proj.weight   (rows permuted)
    layers.{i}.attn.v_proj.weight    -> model.layers.{i}.self_attn.v_proj.weight
    layers.{i}.attn.output_proj.weight -> model.layers.{i}.self_attn.o_proj.weight
    layers.{i}.ln2.weight            -> model.layers.{i}.post_attention_layernorm.weight
    layers.{i}.ffn.w1 / w3 / w2      -> model.layers.{i}.mlp.gate_proj / up_proj / down_proj
    ln_final.weight                  -> model.norm.weight
    lm_head.weight                   -> lm_head.weight

RoPE: ours rotates adjacent pairs ``(x[2i], x[2i+1])`` of each head (HW1/Meta "interleaved"
layout); HF Llama rotates ``(x[i], x[i + Dh/2])`` (``rotate_half``), with the same frequency
``theta^(-2i/Dh)`` for pair ``i``. So each head's q/k output rows are permuted, ``2i -> i`` and
``2i+1 -> i + Dh/2`` (HF's ``convert_llama_weights_to_hf.permute``): q and k get the same
permutation, so every attention score is unchanged; v and o are not touched. Config:
``num_key_value_heads = num_heads`` (no GQA), ``rms_norm_eps`` read off the model's RMSNorm,
``max_position_embeddings = context_length``, ``tie_word_embeddings = False``, ``hidden_act =
"silu"``, weights kept in float32. Logits agree to float rounding (HF builds its RoPE angles in
fp32, ours in fp64 then complex64).

Tokenizer: the checkpoint's tokenizer reference (``load_checkpoint(...).tokenizer``), or
``--tokenizer`` when it is missing, moved, or a ``tiktoken:`` name (tiktoken encodings have no
tokenizer.json to copy, so they are refused with that hint). ``bos_token`` is the EOS token (our
documents are EOS-separated; nothing adds a BOS: ``add_bos_token`` is false).

Atomic: everything is written into a temporary folder beside OUT_DIR, then renamed onto it; a
previous export there is replaced, any other existing content makes the command refuse.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from rlpipe.io import write_json
from rlpipe.lm.checkpoint import LoadedCheckpoint, load_checkpoint
from rlpipe.lm.model import TransformerLM
from rlpipe.lm.tokenizer import TIKTOKEN_PREFIX, Tokenizer, load_tokenizer

_LAYER_MAP = {  # ours (after "layers.{i}.") -> HF (after "model.layers.{i}.")
    "ln1.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.output_proj.weight": "self_attn.o_proj.weight",
    "ln2.weight": "post_attention_layernorm.weight",
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}
_TOP_MAP = {
    "token_embeddings.weight": "model.embed_tokens.weight",
    "ln_final.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_EXPORT_MARKERS = ("config.json", "model.safetensors")  # an existing OUT_DIR holding these may be replaced


def interleaved_to_half(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Permute the output rows of a q/k projection (H*Dh, D) from adjacent-pair RoPE to HF's
    half-rotation layout: within each head, row ``2i`` -> ``i`` and ``2i+1`` -> ``i + Dh/2``."""
    out_dim, in_dim = w.shape
    head_dim = out_dim // num_heads
    return w.view(num_heads, head_dim // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def hf_state_dict(model: TransformerLM) -> dict[str, torch.Tensor]:
    """Our state dict under LlamaForCausalLM names, q/k rows permuted (see module doc)."""
    heads = model.config.num_heads
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu").contiguous()
        if name in _TOP_MAP:
            out[_TOP_MAP[name]] = t
            continue
        prefix, _, rest = name.partition(".")
        index, _, suffix = rest.partition(".")
        if prefix != "layers" or suffix not in _LAYER_MAP:
            raise KeyError(f"export-hf: no Llama name for parameter {name!r}")
        if suffix in ("attn.q_proj.weight", "attn.k_proj.weight"):
            t = interleaved_to_half(t, heads).contiguous()
        out[f"model.layers.{index}.{_LAYER_MAP[suffix]}"] = t
    return out


def _token_text(tok: Tokenizer, token_id: int) -> str:
    return tok.decode([token_id])  # decode keeps special tokens: the token's own text


def llama_config(model: TransformerLM, tok: Tokenizer):
    """The ``LlamaConfig`` describing ``model`` (ids of EOS/pad from ``tok``)."""
    from transformers import LlamaConfig

    cfg = model.config
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"export-hf: tokenizer {tok.spec!r} has {tok.vocab_size} tokens but the model's "
                         f"vocab_size is {cfg.vocab_size}; pass the tokenizer the model was trained with")
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=cfg.context_length,
        rms_norm_eps=float(model.ln_final.eps), rope_theta=float(cfg.rope_theta), attention_bias=False,
        mlp_bias=False, tie_word_embeddings=False, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, architectures=["LlamaForCausalLM"], torch_dtype="float32",
    )


def _resolve_tokenizer(ckpt: LoadedCheckpoint, checkpoint_path: Path, override) -> Tokenizer:
    """The tokenizer to export: ``override``, else the checkpoint's reference (as stored, or
    relative to the checkpoint's folder)."""
    spec = override if override is not None else ckpt.tokenizer
    if spec is None:
        raise ValueError(f"checkpoint {checkpoint_path} references no tokenizer; pass one (--tokenizer PATH)")
    spec = str(spec)
    if spec.startswith(TIKTOKEN_PREFIX):
        raise ValueError(f"checkpoint {checkpoint_path} uses the tokenizer {spec!r}, which has no tokenizer.json to "
                         "export; pass an equivalent tokenizer.json (--tokenizer PATH)")
    candidates = [Path(spec)]
    if override is None and not Path(spec).is_absolute():
        candidates.append(checkpoint_path.parent / spec)
    for path in candidates:
        if path.exists():
            return load_tokenizer(path)
    where = " or ".join(str(p) for p in candidates)
    raise FileNotFoundError(f"tokenizer {spec!r} of checkpoint {checkpoint_path} not found (looked at {where}); "
                            "pass it with --tokenizer PATH")


@contextlib.contextmanager
def _atomic_dir(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``out_dir``; on success it replaces ``out_dir``."""
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"export-hf: output {out_dir} exists and is not a directory")
        contents = {p.name for p in out_dir.iterdir()}
        if contents and not set(_EXPORT_MARKERS) <= contents:
            raise FileExistsError(f"export-hf: output directory {out_dir} is not empty and holds no previous export "
                                  f"(no {' + '.join(_EXPORT_MARKERS)}); refusing to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    old = None
    try:
        yield tmp
        if out_dir.exists():  # a directory cannot be os.replace'd onto a non-empty one: move it aside first
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
            os.replace(out_dir, old / "previous")
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if old is not None:  # put the previous export back
                os.replace(old / "previous", out_dir)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _write_tokenizer(tok: Tokenizer, folder: Path, context_length: int) -> None:
    try:
        tok.save(folder / "tokenizer.json")
    except NotImplementedError as e:
        raise ValueError(f"export-hf: tokenizer {tok.spec!r} cannot be saved as tokenizer.json ({e})") from e
    eos, pad = _token_text(tok, tok.eos_token_id), _token_text(tok, tok.pad_token_id)
    special = {"bos_token": eos, "eos_token": eos, "pad_token": pad, "unk_token": eos}
    write_json(folder / "special_tokens_map.json", special)
    write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", **special, "model_max_length": context_length,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    })


def export_hf(checkpoint_path, out_dir, *, tokenizer=None) -> Path:
    """Write the checkpoint at ``checkpoint_path`` as a LlamaForCausalLM folder ``out_dir`` (with
    its tokenizer, or ``tokenizer``: a tokenizer.json or a folder holding one). Returns ``out_dir``."""
    from transformers import LlamaForCausalLM

    checkpoint_path, out_dir = Path(checkpoint_path), Path(out_dir)
    ckpt = load_checkpoint(checkpoint_path, device="cpu")  # names the file when it is missing or broken
    if ckpt.hf_pretrained is not None:  # a policy trained from an HF directory: its own architecture
        return _export_hf_policy(ckpt, out_dir)
    tok = _resolve_tokenizer(ckpt, checkpoint_path, tokenizer)
    config = llama_config(ckpt.model, tok)
    weights = hf_state_dict(ckpt.model)
    hf = LlamaForCausalLM(config).to(torch.float32)
    hf.load_state_dict(weights, strict=True)  # every Llama parameter has a source, and no source is left over
    with _atomic_dir(out_dir) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        _write_tokenizer(tok, tmp, ckpt.model_config.context_length)
    return out_dir


HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                      "merges.txt", "generation_config.json", "chat_template.jinja")


def _export_hf_policy(ckpt: LoadedCheckpoint, out_dir: Path) -> Path:
    """A checkpoint of an HF policy (``rlpipe train --base HF_DIR``): ``save_pretrained`` of the trained
    weights, plus the base directory's tokenizer files."""
    base = Path(ckpt.hf_pretrained)
    with _atomic_dir(out_dir) as tmp:
        ckpt.model.to(torch.float32).save_pretrained(tmp, safe_serialization=True)
        for name in HF_TOKENIZER_FILES:
            if (base / name).is_file() and not (tmp / name).exists():
                shutil.copy2(base / name, tmp / name)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe export-hf", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="rlpipe checkpoint (.pt)")
    ap.add_argument("out_dir", help="output folder (LlamaForCausalLM + tokenizer)")
    ap.add_argument("--tokenizer", default=None,
                    help="tokenizer.json (or a folder holding one) to export instead of the checkpoint's reference")
    args = ap.parse_args(argv)
    out = export_hf(args.checkpoint, args.out_dir, tokenizer=args.tokenizer)
    print(f"exported {args.checkpoint} -> {out} (LlamaForCausalLM + tokenizer)")
    return 0
