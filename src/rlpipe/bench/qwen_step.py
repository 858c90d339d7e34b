"""One GRPO step of a Qwen2.5-Math-1.5B-shaped policy, measured at a small batch and projected to
seed 001's scale (a part of ``rlpipe gpu-check``, run in its own process):

    python -m rlpipe.bench.qwen_step --out qwen_step.json [--device cuda]

The policy is ``transformers``' ``Qwen2ForCausalLM`` built from a local config of the published
model's shape (``QWEN_MATH_1_5B``) with random weights: nothing is downloaded, and the time and
memory of a step do not depend on the weights' values. Like ``config/math.yaml`` run colocated:
a generator copy with bf16 weights, a learner with fp32 master weights (so fp32 gradients and AdamW
state) computing under bf16 autocast, as the pipeline's learner does (``rlpipe.lm.policy``;
``--master-weights bfloat16`` measures seed 001's bf16 learner weights instead), AdamW, gradient
checkpointing, micro-batches of 2 rows, ``reinforce_with_baseline``, old log-probs recomputed by
the learner, no reference model. Both copies are held throughout, as in one colocated actor, so
``peak_memory_gib`` counts both. ``measured.dtype`` is the compute dtype (bf16),
``measured.master_weights`` the learner's weight dtype, ``measured.generator_dtype`` the generator's.

Measured (CUDA events around synchronised phases): HF ``generate`` of ``gen_rows`` x
``gen_tokens`` (fixed length; the pipeline's own sampler is not used because it needs a real
tokenizer), and per micro-batch of the seed's full length (prompt + 1024 response tokens) the
no-grad log-prob pass and the forward/backward of the loss (``rlpipe.rl``), then one optimizer
step. ``peak_memory_gib`` is ``torch.cuda.max_memory_allocated`` over the whole step; at the seed's
micro-batch and length it is the seed's peak, since a larger batch only adds micro-batches.

Fractions of the chip, as every bench gives them (``rlpipe.bench.flops``, ``peak_note``): the useful
FLOPs of each measured phase (``<phase>_gflops``; the HF config's grouped-query attention counted;
the LM head at the response tokens only, and gradient checkpointing's recomputed forward not
counted) over its seconds, against the shape peak (``<phase>_fraction_of_peak``) and the device
peak in the policy's dtype (``<phase>_fraction_of_device_peak``), both measured after the step;
the top-level ``fraction_of_shape_peak`` / ``fraction_of_device_peak`` are all the measured work
over all the measured time (the optimizer step counted as time without FLOPs).

The seed-scale step (256 rollouts x 1024 response tokens) is a PROJECTION, not a measurement:
the micro-batch phases scale with the number of micro-batches (exact up to overheads); generation
is projected two ways: by token count (the brief's rule: per-token time constant, an upper bound
when decode is launch-bound) and by decode steps (per-step time constant as the batch grows, a
lower bound).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from rlpipe.bench.flops import (
    PEAK_NOTE,
    decode_flops,
    device_peak,
    forward_flops,
    fraction,
    gflops,
    matmul_peak,
    peak_fields,
    train_flops,
)
from rlpipe.io import write_json
from rlpipe.lm.device import autocast
from rlpipe.lm.policy import for_training
from rlpipe.rl.logprobs import get_response_log_probs
from rlpipe.rl.train_step import grpo_microbatch_train_step

#: Qwen2.5-Math-1.5B's shape (its published config.json), for a random-weight stand-in
QWEN_MATH_1_5B = {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                  "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu"}
#: seed 001's step (config/math.yaml): rollouts, response tokens, micro-batch rows
SEED_SCALE = {"rollouts": 256, "response_tokens": 1024, "micro_rows": 2}
#: config/math.yaml's train.dtype: the compute dtype, and the generator's weights on CUDA
COMPUTE_DTYPE = "bfloat16"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def qwen_config(**overrides):
    """A ``transformers.Qwen2Config`` of ``QWEN_MATH_1_5B`` (with ``overrides``)."""
    from transformers import Qwen2Config

    return Qwen2Config(**{**QWEN_MATH_1_5B, **overrides})


def build_policy(cfg, device: torch.device | str, dtype: torch.dtype = torch.bfloat16):
    """``Qwen2ForCausalLM(cfg)`` with random weights, created on ``device`` in ``dtype`` (on
    ``meta``: shapes only, nothing allocated)."""
    from transformers import Qwen2ForCausalLM

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def project(measured: dict, rollouts: int, response_tokens: int) -> dict:
    """The seed-scale step from the measured phases (see the module docstring). ``measured`` needs
    gen_s, gen_rows, gen_tokens, micro_rows, logprob_s_per_micro, update_s_per_micro, optimizer_s."""
    micro = math.ceil(rollouts / measured["micro_rows"])
    by_tokens = measured["gen_s"] * (rollouts * response_tokens) / (measured["gen_rows"] * measured["gen_tokens"])
    by_steps = measured["gen_s"] * response_tokens / measured["gen_tokens"]
    rest = micro * (measured["logprob_s_per_micro"] + measured["update_s_per_micro"]) + measured["optimizer_s"]
    return {"rollouts": rollouts, "response_tokens": response_tokens, "micro_batches": micro,
            "generate_s_by_tokens": round(by_tokens, 2), "generate_s_by_steps": round(by_steps, 2),
            "logprob_s": round(micro * measured["logprob_s_per_micro"], 2),
            "update_s": round(micro * measured["update_s_per_micro"] + measured["optimizer_s"], 2),
            "step_s_upper": round(by_tokens + rest, 2), "step_s_lower": round(by_steps + rest, 2),
            "note": "a projection from the measured phases, not a measurement: micro-batch phases x micro-batches; "
                    "generation by token count (upper) and by decode steps (lower)"}


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _generate(model, device: torch.device, rows: int, prompt: int, tokens: int, vocab: int) -> float:
    ids = torch.randint(0, vocab, (rows, prompt), device=device)
    kw = {"attention_mask": torch.ones_like(ids), "do_sample": True, "temperature": 1.0, "top_p": 1.0,
          "pad_token_id": 0, "eos_token_id": None}
    model.config.use_cache = True
    model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
    t0 = _sync(device)
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
    t1 = _sync(device)
    assert out.shape == (rows, prompt + tokens), out.shape
    return t1 - t0


def _micro_batch(rows: int, prompt: int, response: int, vocab: int, device: torch.device) -> dict:
    ids = torch.randint(0, vocab, (rows, prompt + response), device=device)  # (B, T)
    mask = torch.zeros(rows, prompt + response - 1, device=device)
    mask[:, prompt - 1:] = 1.0  # (B, T-1): the response tokens' positions
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": mask,
            "advantages": torch.randn(rows, 1, device=device)}


def _update_phases(model, device, rows: int, prompt: int, response: int, n_micro: int, vocab: int,
                   dtype: str = COMPUTE_DTYPE) -> dict:
    """Seconds per micro-batch of the no-grad log-prob pass and of forward/backward (both under
    ``dtype``'s autocast, as the learner computes), and of the optimizer step (after one untimed
    warm-up of each)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0)
    for_training(model, gradient_checkpointing=True)  # as the learner prepares an HF policy
    model.train()
    batches = [_micro_batch(rows, prompt, response, vocab, device) for _ in range(n_micro + 1)]

    def logprob(b):
        with torch.inference_mode(), autocast(device, dtype):
            get_response_log_probs(model, b["input_ids"], b["labels"])

    def update(b):
        with autocast(device, dtype):
            lp = get_response_log_probs(model, b["input_ids"], b["labels"])["log_probs"].float()  # (B, T)
        grpo_microbatch_train_step(lp, b["response_mask"], SEED_SCALE["rollouts"] // rows,
                                   "reinforce_with_baseline", advantages=b["advantages"])

    out = {}
    for name, fn in (("logprob", logprob), ("update", update)):
        fn(batches[0])
        t0 = _sync(device)
        for b in batches[1:]:
            fn(b)
        out[f"{name}_s_per_micro"] = (_sync(device) - t0) / n_micro
    t0 = _sync(device)
    opt.step()
    opt.zero_grad(set_to_none=True)
    out["optimizer_s"] = _sync(device) - t0  # the first step also allocates AdamW's state
    return out


def chip_fractions(cfg, measured: dict, device: torch.device) -> dict:
    """Each measured phase's useful GFLOP/s and its two fractions (into ``measured``), and the whole
    measured step's pair with both peaks (returned: ``peak_fields``), the peaks taken here."""
    m = measured
    seq, head = m["prompt_tokens"] + m["response_tokens"] - 1, m["micro_rows"] * m["response_tokens"]  # (B, T-1)
    flops = {"gen": decode_flops(cfg, m["prompt_tokens"], m["gen_tokens"], m["gen_rows"]),
             "logprob": forward_flops(cfg, [seq] * m["micro_rows"], head_tokens=head),
             "update": train_flops(cfg, [seq] * m["micro_rows"], head_tokens=head)}
    secs = {"gen": m["gen_s"], "logprob": m["logprob_s_per_micro"], "update": m["update_s_per_micro"]}
    shape = max(matmul_peak(device=device)["flops_per_s"] for _ in range(2))
    chip = device_peak(device, m["dtype"])
    for ph, f in flops.items():
        m[f"{ph}_gflops"] = gflops(f / secs[ph])
        m[f"{ph}_fraction_of_peak"] = fraction(f / secs[ph], shape)
        m[f"{ph}_fraction_of_device_peak"] = fraction(f / secs[ph], chip["flops_per_s"])
    n = m["micro_batches_timed"]
    work = flops["gen"] + n * (flops["logprob"] + flops["update"])
    seconds = m["gen_s"] + n * (secs["logprob"] + secs["update"]) + m["optimizer_s"]
    return {**peak_fields(work / seconds, shape, chip),
            "peak_note": PEAK_NOTE + " Here: gen_*, logprob_* and update_* per measured phase (useful FLOPs: the LM "
                         "head at the response tokens, gradient checkpointing's recomputation not counted); the "
                         "top-level pair is all the measured work over all the measured time."}


def build_pair(cfg, device: torch.device | str, master_weights: str = "float32"):
    """``(learner, generator)``: the learner's policy with ``master_weights`` weights and the
    generator's bf16 copy holding the same values (rounded), as a weight sync leaves them."""
    model = build_policy(cfg, device, DTYPES[master_weights])
    gen = build_policy(cfg, device, DTYPES[COMPUTE_DTYPE])  # its own buffers (RoPE), then the learner's weights
    gen.load_state_dict(model.state_dict())  # casts; the tied embedding / LM head stays tied
    return model, gen


def measure(device: torch.device, cfg=None, gen_rows: int = 32, gen_tokens: int = 256, prompt_tokens: int = 128,
            response_tokens: int = 1024, micro_rows: int = 2, n_micro: int = 3,
            master_weights: str = "float32") -> dict:
    """The part's record: the measured phases, peak memory and the seed-scale projection."""
    cfg = qwen_config() if cfg is None else cfg
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model, gen = build_pair(cfg, device, master_weights)
    measured = {"build_s": round(time.perf_counter() - t0, 2), "parameters": parameter_count(model),
                "dtype": COMPUTE_DTYPE, "master_weights": master_weights, "generator_dtype": COMPUTE_DTYPE,
                "gen_rows": gen_rows, "gen_tokens": gen_tokens, "prompt_tokens": prompt_tokens,
                "micro_rows": micro_rows, "micro_batches_timed": n_micro, "response_tokens": response_tokens}
    gen.eval()
    with autocast(device, COMPUTE_DTYPE):
        measured["gen_s"] = _generate(gen, device, gen_rows, prompt_tokens, gen_tokens, cfg.vocab_size)
    measured |= _update_phases(model, device, micro_rows, prompt_tokens, response_tokens, n_micro, cfg.vocab_size)
    del gen
    if device.type == "cuda":
        measured["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    measured["gen_tokens_per_s"] = round(gen_rows * gen_tokens / measured["gen_s"], 1)
    projection = project(measured, SEED_SCALE["rollouts"], SEED_SCALE["response_tokens"])
    del model  # its memory is free before the peaks' large products
    peaks = chip_fractions(cfg, measured, device)
    return {"model": "Qwen2.5-Math-1.5B shape, random weights", "config": dict(QWEN_MATH_1_5B),
            "device": str(device), "measured": measured, **peaks, "projection": projection}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlpipe.bench.qwen_step", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the part's JSON (written atomically)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gen-rows", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--micro-batches", type=int, default=3, help="timed micro-batches of each phase")
    ap.add_argument("--master-weights", choices=list(DTYPES), default="float32",
                    help="the learner's weight dtype (train.master_weights); the generator's is bfloat16")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    write_json(a.out, measure(device, gen_rows=a.gen_rows, gen_tokens=a.gen_tokens, prompt_tokens=a.prompt_tokens,
                              n_micro=a.micro_batches, master_weights=a.master_weights))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
