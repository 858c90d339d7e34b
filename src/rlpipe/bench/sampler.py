"""``rlpipe bench sampler``: KV-cache sampler vs naive recomputation vs HF ``generate``.

Prints ONE JSON line (and with ``--out`` also writes it atomically): rlpipe's KV-cache sampler
against the same loop without a cache and against HF ``generate`` on an HF model of the same shape,
its compiled, ahead-of-time and CUDA-graph decodes against the eager one, each decode's fractions
of the matmul peaks, and the goals (``GOAL_*``). What each key means: ``run_bench``; how to read
the ratios and their limits: ``docs/benchmarks.md``.

Every run samples ``--batch`` rows of ``--new-tokens`` tokens with no early stop
(``min_tokens = max_tokens``) from left-padded prompts of 12..24 tokens (the keyword-inclusion
prompts' length); times are medians over ``--repeats`` runs after one warm-up run on a small
batch; the two runs of each pair alternate, so both see the same machine load. Nothing is
downloaded. The load average is reported because the CPU may be shared with other jobs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
import warnings
from typing import NamedTuple

import torch

from rlpipe.bench import emit
from rlpipe.bench.flops import decode_flops, device_peak, fraction, gflops, matmul_peak, peak_fields
from rlpipe.lm import decode_package
from rlpipe.lm.checkpoint import CheckpointError, open_base_checkpoint
from rlpipe.lm.device import autocast
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.sampler import SamplingParams, _left_pad, generate
from rlpipe.lm.tokenizer import Tokenizer, train_bpe

TEMPERATURE = 0.8  # seed 000 §3.1.2 sampling_temperature
GOAL_FRACTION_OF_PEAK = 0.25  # of the same-run matmul peak, at batch 32 on the default model
GOAL_OVER_HF = 2.0  # our best decode against HF generate on a model of the same shape
GOAL_GRAPH_OVER_EAGER = 10.0  # the CUDA-graph decode against the eager one (assignment preset, batch 64, H100)


def bench_tokenizer(vocab_size: int, tmpdir: str) -> Tokenizer:
    """A BPE of ``vocab_size`` trained on random pseudo-words (enough merges, under a second)."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(4000)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(2000)]
    return train_bpe(texts, vocab_size, os.path.join(tmpdir, "tokenizer.json"))


def _prompts(batch: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(12, 25, (batch,), generator=g).tolist()
    return [torch.randint(1, vocab_size, (n,), generator=g).tolist() for n in lens]


def _paired_median_seconds(fa, fb, repeats: int) -> tuple[float, float]:
    """Median wall times of ``fa`` and ``fb``, run alternately so both see the same machine load."""
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _hf_model(cfg: ModelConfig, eos: int, device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_cfg = Qwen2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.context_length, rope_theta=cfg.rope_theta, tie_word_embeddings=False,
        eos_token_id=eos, pad_token_id=eos, bos_token_id=eos,
    )
    return Qwen2ForCausalLM(hf_cfg).to(device).eval()


def _hf_generate_fn(model, prompts, new_tokens: int, pad_id: int, device):
    ids, mask, _ = _left_pad(prompts, pad_id, device)

    def run():
        with torch.inference_mode():
            model.generate(
                input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=TEMPERATURE, top_p=1.0,
                top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
                eos_token_id=pad_id,
            )
        _sync(device)

    return run


class CheckpointModel(NamedTuple):
    """``--checkpoint``'s TransformerLM, the tokenizer it names, and the file's absolute path."""
    model: TransformerLM
    tokenizer: Tokenizer
    path: str


def open_checkpoint(path: str) -> CheckpointModel:
    """``--checkpoint``: an rlpipe ``TransformerLM`` checkpoint and the tokenizer it names, checked
    before any work (every error names the flag and the file)."""
    opened = open_base_checkpoint(path, "--checkpoint")
    model = opened.checkpoint.model
    if not isinstance(model, TransformerLM):
        raise CheckpointError(f"--checkpoint: {path} holds a {type(model).__name__}; the sampler bench "
                              "drives rlpipe's TransformerLM (its decodes and FLOP counts)")
    return CheckpointModel(model, opened.tokenizer, os.path.abspath(path))


def _model_and_tokenizer(preset: str, checkpoint: CheckpointModel | None) -> tuple[TransformerLM, Tokenizer]:
    """The benched model and its tokenizer: ``checkpoint``'s, else a randomly initialised ``preset``
    with a BPE trained here (its vocabulary at most 2048)."""
    if checkpoint is not None:
        return checkpoint.model, checkpoint.tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tok = bench_tokenizer(min(ModelConfig.from_preset(preset).vocab_size, 2048), tmp)
    return TransformerLM(ModelConfig.from_preset(preset, vocab_size=tok.vocab_size)), tok


def run_bench(preset: str, batch: int, new_tokens: int, repeats: int, device: str, compiled: bool = True,
              aot: bool = True, checkpoint: CheckpointModel | None = None) -> dict:
    """The bench's JSON record:

    - ``kv_tokens_per_s`` / ``naive_tokens_per_s`` / ``kv_over_naive``: ``rlpipe.lm.sampler.generate`` on a
      randomly initialised ``TransformerLM`` (``--preset``, vocabulary from a BPE trained here on
      synthetic text; or ``--checkpoint``'s model and tokenizer, ``checkpoint``), with its KV cache
      and with ``use_kv_cache=False`` (the same sampling loop re-running the whole sequence every
      step). Goal: ratio >= 5 for cpu-tiny on CPU.
    - ``hf_ours_tokens_per_s`` / ``hf_generate_tokens_per_s`` / ``ours_over_hf_generate``: our sampler
      driving a randomly initialised HF ``Qwen2ForCausalLM`` of the same width/depth vs HF's own
      ``generate`` on the same model and batch (sampling, top_k disabled). Goal: ratio >= 1.
    - ``kv_gflops`` / ``matmul_peak_gflops`` / ``kv_fraction_of_peak``: the KV-cache sampler's achieved
      FLOP/s (prefill plus one forward per new token against its cached context, counted as in
      ``rlpipe.bench.flops``) against the best square fp32 matmul rate measured in this process on the
      same threads and the same ``--device``. Decoding multiplies (B, D) rows by (D, D) weights once per
      token: small products plus per-token Python and sampling work, so a low fraction here says what
      bounds generation.
    - ``compiled_tokens_per_s`` / ``compiled_over_eager`` / ``compiled_fraction_of_peak`` /
      ``compile_s``: the same model and batch through the fixed-shape decode step compiled with
      ``torch.compile`` (``generate(decode="compiled")``, ``rlpipe.lm.static_decode``) against the eager
      KV-cache sampler, and the one-off compilation time (the first call's wall minus a steady call's).
      ``--no-compiled`` skips it (no C++ compiler, or no time to compile).
    - ``aot_tokens_per_s`` / ``aot_over_eager`` / ``aot_fraction_of_peak`` / ``aot_build_s``: the same
      step compiled ahead of time (``generate(decode="aot")``, ``rlpipe.lm.decode_package``) against the
      eager sampler; ``aot_build_s`` is the package build when this machine had none (null: it was
      cached). CPU only; ``--no-aot`` skips it.
    - ``cudagraph_tokens_per_s`` / ``cudagraph_over_eager`` / ``cudagraph_over_hf_generate`` /
      ``cudagraph_fraction_of_peak`` / ``cudagraph_capture_s``, and the same with ``cudagraph_bf16_``:
      the fixed-shape step replayed from a CUDA graph (``generate(decode="cudagraph")``,
      ``rlpipe.lm.cuda_graph_decode``), in the model's fp32 and under bf16 autocast (``train.dtype:
      bfloat16``, the GPU config), against the eager sampler in fp32 and HF ``generate``; the capture
      time is the first call's wall minus a steady call's. ``cudagraph_logprob_gap`` /
      ``cudagraph_bf16_logprob_gap``: the largest difference between the log-probs the graph decode
      recorded and a full eager forward's over the same tokens in the same precision
      (``teacher_forced_gap``): float rounding when the graph is right. CUDA only (``--device cuda``).
    - ``best_over_hf_generate``: the fastest of our decodes on our model against HF ``generate`` on
      the HF model of the same shape (the same FLOPs per token).
    - ``kv_fraction_of_device_peak`` (and ``compiled_``/``aot_fraction_of_device_peak``): the same
      FLOP/s against the device peak (``rlpipe.bench.flops.device_peak``: one large square matmul in
      the model's dtype, 8192 on CUDA, 2048 on CPU), ``device_peak_tflops`` / ``device_peak_dtype``;
      ``fraction_of_shape_peak`` / ``fraction_of_device_peak``: the fastest decode's two fractions,
      ``peak_note`` says which is which. On a GPU the shape peak is launch-bound too, so only the
      device fraction says how busy the chip is.
    - ``goals``: the targets (fraction of peak >= 0.25, >= 2x HF ``generate``) and whether this run met
      them; the fraction-of-peak goal is stated for ``--batch 32``.
    """
    dev = torch.device(device)
    torch.manual_seed(0)
    model, tok = _model_and_tokenizer(preset, checkpoint)
    model, cfg = model.to(dev), model.config
    prompts, small = _prompts(batch, cfg.vocab_size), _prompts(min(batch, 8), cfg.vocab_size, seed=1)
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=new_tokens, min_tokens=new_tokens, seed=0)

    def ours(m, use_cache=True, p=prompts):
        return lambda: generate(m, tok, p, params, device=dev, use_kv_cache=use_cache)

    hf = _hf_model(cfg, tok.eos_token_id, dev)
    for warm in (ours(model, p=small), ours(model, False, small), ours(hf, p=small),
                 _hf_generate_fn(hf, small, new_tokens, tok.pad_token_id, dev)):
        warm()
    peak = matmul_peak(device=dev)["flops_per_s"]  # the shape peak on the decode's own device, not the CPU
    chip = device_peak(dev, next(model.parameters()).dtype)
    kv_s, naive_s = _paired_median_seconds(ours(model), ours(model, False), repeats)
    peak = max(peak, matmul_peak(device=dev)["flops_per_s"])
    kv_flops = sum(decode_flops(cfg, len(p), new_tokens, 1) for p in prompts)
    hf_gen = _hf_generate_fn(hf, prompts, new_tokens, tok.pad_token_id, dev)
    hf_ours_s, hf_gen_s = _paired_median_seconds(ours(hf), hf_gen, repeats)
    n_tok = batch * new_tokens
    out = {
        "bench": "sampler", "preset": None if checkpoint else preset,
        "checkpoint": checkpoint.path if checkpoint else None, "device": str(dev), "batch": batch,
        "new_tokens": new_tokens,
        "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))], "repeats": repeats,
        "num_parameters": model.num_parameters(), "vocab_size": cfg.vocab_size,
        "torch_threads": torch.get_num_threads(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "kv_tokens_per_s": round(n_tok / kv_s, 1), "naive_tokens_per_s": round(n_tok / naive_s, 1),
        "kv_over_naive": round(naive_s / kv_s, 2),
        "kv_gflops": gflops(kv_flops / kv_s), "matmul_peak_gflops": gflops(peak),
        "kv_fraction_of_peak": round(kv_flops / kv_s / peak, 4),
        "kv_fraction_of_device_peak": fraction(kv_flops / kv_s, chip["flops_per_s"]),
        "hf_ours_tokens_per_s": round(n_tok / hf_ours_s, 1),
        "hf_generate_tokens_per_s": round(n_tok / hf_gen_s, 1),
        "ours_over_hf_generate": round(hf_gen_s / hf_ours_s, 2),
    }
    best_s = kv_s
    if compiled:
        best_s = min(best_s, _compiled_rows(out, ours(model), lambda: generate(
            model, tok, prompts, params, device=dev, decode="compiled"), kv_flops, peak, repeats))
    if aot and dev.type == "cpu":
        best_s = min(best_s, _aot_rows(out, model, ours(model), lambda: generate(
            model, tok, prompts, params, device=dev, decode="aot"), kv_flops, peak, repeats))
    if dev.type == "cuda":  # the CUDA-graph decode in the model's fp32 (one of the best_s candidates) and
        # under bf16 autocast, whose device fraction is against the bf16 peak
        def graph(dtype):
            return _under(dtype, dev, lambda: generate(model, tok, prompts, params, device=dev, decode="cudagraph"))
        best_s = min(best_s, _cudagraph_rows(out, "cudagraph", ours(model), graph("float32"), kv_flops, peak,
                                             repeats, hf_gen_s))
        bf16_s = _cudagraph_rows(out, "cudagraph_bf16", ours(model), graph("bfloat16"), kv_flops, peak, repeats,
                                 hf_gen_s)
        out["cudagraph_bf16_fraction_of_device_peak"] = fraction(
            kv_flops / bf16_s, device_peak(dev, torch.bfloat16)["flops_per_s"])
        for key, dtype in (("cudagraph", "float32"), ("cudagraph_bf16", "bfloat16")):
            with autocast(dev, dtype):
                g = generate(model, tok, prompts[:8], params, device=dev, decode="cudagraph")
                out[f"{key}_logprob_gap"] = teacher_forced_gap(model, g, eos=tok.eos_token_id)
    for key in ("compiled", "aot", "cudagraph"):
        if f"{key}_tokens_per_s" in out:  # the same tokens and FLOPs at that rate
            out[f"{key}_fraction_of_device_peak"] = fraction(
                kv_flops / (n_tok / out[f"{key}_tokens_per_s"]), chip["flops_per_s"])
    out.update(peak_fields(kv_flops / best_s, peak, chip))
    out["best_over_hf_generate"] = round(hf_gen_s / best_s, 2)
    best_fraction = max(out["kv_fraction_of_peak"], out.get("compiled_fraction_of_peak", 0.0),
                        out.get("aot_fraction_of_peak", 0.0))
    if "cudagraph_over_eager" in out:
        best_fraction = max(best_fraction, out["cudagraph_fraction_of_peak"], out["cudagraph_bf16_fraction_of_peak"])
    out["goals"] = {"fraction_of_peak": GOAL_FRACTION_OF_PEAK,
                    "fraction_of_peak_met": best_fraction >= GOAL_FRACTION_OF_PEAK,
                    "over_hf_generate": GOAL_OVER_HF,
                    "over_hf_generate_met": out["best_over_hf_generate"] >= GOAL_OVER_HF, "stated_for_batch": 32}
    if "cudagraph_over_eager" in out:  # stated for the assignment preset at batch 64 on one H100
        best_graph = max(out["cudagraph_over_eager"], out["cudagraph_bf16_over_eager"])
        out["goals"].update(cudagraph_over_eager=GOAL_GRAPH_OVER_EAGER,
                            cudagraph_over_eager_met=best_graph >= GOAL_GRAPH_OVER_EAGER)
    return out


def _under(dtype: str, dev: torch.device, fn):
    """``fn`` run under ``train.dtype``'s autocast (``rlpipe.lm.device.autocast``)."""
    def run():
        with autocast(dev, dtype):
            fn()
        _sync(dev)
    return run


def teacher_forced_gap(model, g, eos: int) -> float:
    """Largest |recorded - teacher-forced| log-prob over the sampled tokens of ``g``: each row's
    tokens scored by one full forward of ``model`` (the eager kernels) under the distribution they were
    drawn from (``logits / T``, EOS masked in the ``min_tokens`` window), in the caller's precision.
    A correct decode differs from it by float rounding only; a wrong one (stale cache, wrong position)
    by far more. Never compares tokens across kernels."""
    params, dev = g.params, next(model.parameters()).device
    gaps = [0.0]
    with torch.inference_mode():
        for prompt, resp, lp in zip(g.prompt_ids, g.response_ids, g.logprobs, strict=True):
            ids = torch.tensor(prompt + resp, device=dev)[None]  # (1, P + T)
            logits = model(ids)[0, len(prompt) - 1:-1].float()  # (T, V)
            logits[:params.min_tokens, eos] = float("-inf")
            ref = torch.log_softmax(logits / (params.temperature or 1.0), -1)  # (T, V)
            ref = ref.gather(-1, torch.tensor(resp, device=dev)[:, None])[:, 0]  # (T,)
            gaps.append(float((lp.to(dev) - ref).abs().max()))
    return float(f"{max(gaps):.3g}")


def _cudagraph_rows(out: dict, key: str, eager, graph, flops: float, peak: float, repeats: int,
                    hf_gen_s: float) -> float:
    """The CUDA-graph decode against the eager sampler (and HF ``generate``) into ``out`` under
    ``key``; ``{key}_capture_s``: the first call's wall minus a steady call's (warm-up and capture).
    Returns its seconds."""
    n_tok = out["batch"] * out["new_tokens"]
    t0 = time.perf_counter()
    graph()  # captures the graph of this batch shape
    first_s = time.perf_counter() - t0
    eager_s, graph_s = _paired_median_seconds(eager, graph, repeats)
    out.update({f"{key}_tokens_per_s": round(n_tok / graph_s, 1), f"{key}_over_eager": round(eager_s / graph_s, 2),
                f"{key}_over_hf_generate": round(hf_gen_s / graph_s, 2),
                f"{key}_fraction_of_peak": round(flops / graph_s / peak, 4),
                f"{key}_capture_s": round(max(first_s - graph_s, 0.0), 2)})
    return graph_s


def _compiled_rows(out: dict, eager, comp, flops: float, peak: float, repeats: int) -> float:
    """The torch.compile decode against the eager sampler into ``out``; returns its seconds."""
    n_tok = out["batch"] * out["new_tokens"]
    t0 = time.perf_counter()
    comp()  # compiles the graph for this batch shape
    first_s = time.perf_counter() - t0
    eager_s, comp_s = _paired_median_seconds(eager, comp, repeats)
    out.update(compiled_tokens_per_s=round(n_tok / comp_s, 1), compiled_over_eager=round(eager_s / comp_s, 2),
               compiled_fraction_of_peak=round(flops / comp_s / peak, 4),
               compile_s=round(max(first_s - comp_s, 0.0), 1))
    return comp_s


def _aot_rows(out: dict, model, eager, aot, flops: float, peak: float, repeats: int) -> float:
    """The AOT-compiled decode (``decode_package``; built here when this machine has no package,
    and the build time reported) against the eager sampler into ``out``; returns its seconds."""
    n_tok = out["batch"] * out["new_tokens"]
    path = decode_package.package_path(model)
    seconds = decode_package.ensure_built(model, path)
    built_s = None if seconds is None else round(seconds, 1)
    aot()  # loads and checks the package
    eager_s, aot_s = _paired_median_seconds(eager, aot, repeats)
    out.update(aot_tokens_per_s=round(n_tok / aot_s, 1), aot_over_eager=round(eager_s / aot_s, 2),
               aot_fraction_of_peak=round(flops / aot_s / peak, 4), aot_build_s=built_s)
    return aot_s


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="rlpipe bench sampler", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu-tiny", help="a randomly initialised TransformerLM of this preset")
    ap.add_argument("--checkpoint", default=None,
                    help="bench this rlpipe checkpoint's TransformerLM and its tokenizer instead of --preset")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-compiled", dest="compiled", action="store_false",
                    help="skip the torch.compile decode (it needs a C++ compiler on CPU and compiles for a while)")
    ap.add_argument("--no-aot", dest="aot", action="store_false",
                    help="skip the AOT-compiled decode (decode=aot: a package built once per model shape and "
                         "machine, which needs a C++ compiler; CPU only)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--out", default=None, help="also write the JSON line here (atomically)")
    args = ap.parse_args(argv)
    for name in ("batch", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    try:
        checkpoint = open_checkpoint(args.checkpoint) if args.checkpoint else None
    except (FileNotFoundError, CheckpointError) as e:
        ap.error(str(e))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HF generation-config chatter
        result = run_bench(args.preset, args.batch, args.new_tokens, args.repeats, args.device, args.compiled, args.aot,
                           checkpoint=checkpoint)
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
