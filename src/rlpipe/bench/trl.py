"""``rlpipe bench trl``: rlpipe's colocated on-policy GRPO side by side with TRL's ``GRPOTrainer``.

One invocation trains the same model (``--checkpoint``, exported once to a HuggingFace
``LlamaForCausalLM`` folder for TRL) on the same keyword task, with the same prompts in the same
order and the same settings, on both sides in interleaved pairs (``run_bench``), and writes the
ratios rlpipe / TRL (median per-step samples/s, samples/s, tokens/s: each the median over the pairs
with its spread), both sides' validation reward at equal samples, where each step's time goes, and
each side's fraction of the chip. ``--device cuda`` puts both sides on one GPU; ``--preset`` swaps
in an untrained larger model (speed only).

Where to look:

- ``rlpipe.bench.trl_sides``: each side's timed run (``run_trl``, ``run_rlpipe``) and what its
  clock covers;
- ``rlpipe.bench.trl_settings``: the settings both sides agree on (``BenchSettings``) and the one
  evaluation path both are scored by;
- ``rlpipe.bench.phase_split``: where a step's time goes on each side;
- ``notes`` here: what cannot be made equal and how each is handled (the JSON's ``notes``);
- ``chip_fractions`` and ``useful_flops``: the FLOPs counted and the peaks they are divided by;
- ``docs/benchmarks.md``: how to read the ratios, and their limits.

Departure from the seeds: the seeds define no comparison with TRL (it answers whether rlpipe is faster
than the library users already know). The bench runs TRL's loss type ``grpo`` with the seed's
GRPO-Clip loss, no KL term, on-policy (seed 000 §3.1.2 Variant A) at the CPU pipeline's scaled-down
settings; the per-step medians are the comparison, the totals the context.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path

from rlpipe.bench import stamp
from rlpipe.bench.flops import PEAK_NOTE, device_peak, fraction, gflops, grpo_step_flops, matmul_peak
from rlpipe.bench.trl_settings import (
    DEVICES,
    BenchInputError,
    BenchSettings,
    _load,
    _policy_reward,
    check_inputs,
    import_trl,
    prompt_sequence,
    settings_from_config,
)
from rlpipe.bench.trl_sides import RLPIPE_MODELS, run_rlpipe, run_trl
from rlpipe.io import write_json
from rlpipe.lm import decode_package
from rlpipe.lm.checkpoint import load_checkpoint, open_base_checkpoint, save_checkpoint
from rlpipe.lm.hf_export import export_hf
from rlpipe.lm.model import PRESETS, ModelConfig, TransformerLM
from rlpipe.lm.tokenizer import load_tokenizer

SKIP_REASON = "trl is not installed: pip install -e '.[bench]'"


# --------------------------------------------------------------------------- the bench


def preset_checkpoint(checkpoint: str, preset: str, out: Path, seed: int = 0) -> str:
    """An untrained ``TransformerLM`` of model preset ``preset`` with ``checkpoint``'s tokenizer and
    vocabulary size, saved at ``out``; returns its path. An unknown preset raises BenchInputError.

    ``--preset assignment`` (about 10x the default model's parameters at the same vocabulary) runs
    the comparison where compute outweighs per-call overhead; nothing pretrained it to the task, so
    its rewards stay near the initial ones and the run measures speed only."""
    import torch

    if preset not in PRESETS:
        raise BenchInputError(f"--preset: unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
    opened = open_base_checkpoint(checkpoint, "--checkpoint")
    base, tok_ref = opened.checkpoint.model_config, opened.tokenizer_ref
    cfg = ModelConfig.from_preset(preset, vocab_size=base.vocab_size,
                                  context_length=max(base.context_length, PRESETS[preset].context_length))
    torch.manual_seed(seed)
    save_checkpoint(out, TransformerLM(cfg), tokenizer=tok_ref)
    return str(out)


def _parameters(checkpoint: str) -> int:
    return load_checkpoint(checkpoint).model_config.num_parameters()


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("trl", "transformers", "torch", "accelerate", "datasets"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def prepare_decode(checkpoint: str, s: BenchSettings, rlpipe_model: str) -> dict | None:
    """``decode: aot`` on our own model: find or build the decode package once, before any timed
    run, and say which and how long a build took (a one-time cost per model shape and machine;
    each ``rlpipe train`` then loads it before its clock starts)."""
    if s.decode != "aot" or rlpipe_model != "native":
        return None
    model = load_checkpoint(checkpoint, device="cpu").model
    path = decode_package.package_path(model)
    seconds = decode_package.ensure_built(model, path)
    built_s = None if seconds is None else round(seconds, 2)
    decode_package.load(model, build_missing=False)
    return {"package": str(path), "built_here": built_s is not None, "build_s": built_s}


def _ratio(a, b):
    return round(a / b, 3) if a and b else None


def notes(s: BenchSettings, rlpipe_base: str) -> list[str]:
    """The settings that could not be made equal and how each was handled, one sentence each (the
    JSON's ``notes``): advantage epsilon, loss normalisation, importance ratio, KL, generation,
    prompts, what the wall time covers, overheads each side has and the other lacks (colocated
    rlpipe keeps two copies of the weights and copies them after every step; TRL generates with the
    training model itself), evaluation,
    threads, pair order, optimizer details, and weight decay where it is not 0 (HF's Trainer
    exempts biases and norm weights; at 0 the two are identical)."""
    model = ("the exported HF LlamaForCausalLM directory (same weights and modeling code as TRL; "
             "--rlpipe-model hf)" if rlpipe_base == "hf_dir" else
             "the rlpipe .pt checkpoint the HF directory was exported from, in rlpipe's own TransformerLM (same "
             "weights, logits equal within 1e-4; --rlpipe-model native). Run --rlpipe-model hf to see the "
             "pipeline's gain with TRL's modelling code")
    out = [
        f"rlpipe trained {model}",
        f"advantage eps: rlpipe {s.advantage_eps:g} (train.advantage_eps), TRL hard-coded 1e-4; both divide by the "
        "Bessel-corrected group std (TRL scale_rewards='group')",
        "loss: TRL loss_type='grpo' (per-sequence token mean, then batch mean) = rlpipe masked_mean; GRPO-Clip "
        f"epsilon {s.cliprange} both; TRL's default 'dapo' not used",
        "importance ratio: TRL on-policy uses detached current log-probs (ratio exactly 1), rlpipe the sampler's "
        "behaviour log-probs (ratio 1 up to rounding); recompute_old_log_probs off, no extra forward either side",
        "KL: TRL beta=0.0 (no reference model); rlpipe kl_coef=0, kl_monitor=false (no reference model), and "
        "its post-update KL-to-previous-step forward (TRL has none) on the first and last step only",
        f"generation: TRL uses HF generate, rlpipe its KV-cache sampler (decode {s.decode}): same temperature/"
        "top-p/top_k off/EOS stop/max tokens, different random streams, so samples differ (rewards compare "
        "statistically)",
        "prompts: TRL gets rlpipe's prompt sequence (prompts_for_batch per step) with shuffle_dataset=False",
        "wall time excludes model loading on both sides; TRL = trainer.train() (includes its dataloader and "
        "optimizer set-up); rlpipe = wall_time of its last optimizer step (clock starts after Ray start-up, model "
        "loading and step-0 validation; excludes final validation and checkpoint)",
        "overheads: TRL computes entropies in the training forward and logs once (logging_steps=steps); rlpipe pays "
        "Ray calls, per-step metric rows and a learner->generator weight copy after every step",
        "eval: TRL eval_strategy='no'; rlpipe validates only at step 0 and after the last step (outside the timing); "
        "reported val rewards come from one path (rlpipe sampler, val_seed, keyword reward) for both",
        f"threads: torch.set_num_threads({s.threads}) for TRL in this process; rlpipe train.threads={s.threads} in its "
        "colocated Ray actor (driver and Ray daemons are separate processes)",
        "order: interleaved pairs (rlpipe, TRL, rlpipe, TRL, ...); each ratio is the median of the per-pair "
        "ratios, with their min and max; compare each side's load_avg_per_pair before trusting a ratio from a "
        "shared machine",
        "lr schedule constant, no warm-up, AdamW eps 1e-8, grad clip "
        f"{s.max_grad_norm}, fp32, {'one GPU' if s.device == 'cuda' else 'CPU'} on both sides",
    ]
    if s.weight_decay:
        out.append(f"weight decay {s.weight_decay}: HF's Trainer skips biases and norm weights, rlpipe decays all")
    return out


DECODES = ("aot", "eager", "static", "compiled", "config")
THROUGHPUT_KEYS = ("step_samples_per_s_median", "samples_per_s", "tokens_per_s")


def _summary(runs: list[dict]) -> dict:
    """One side over the pairs: medians of its throughput, wall and per-step phases. Every other field
    that all pairs share is kept as is; one that differs between pairs is given per pair
    (``<key>_per_pair``) and, when numeric, as its median (``<key>``), never as one pair's value."""
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in (*THROUGHPUT_KEYS, "wall_s")}
    phases = {k: round(statistics.median(r["phases_s_per_step"][k] for r in runs), 4)
              for k in runs[0]["phases_s_per_step"]}
    out = {k: v for k, v in runs[0].items() if all(r.get(k) == v for r in runs)}
    for k in runs[0]:
        if k in out or k in med or k == "phases_s_per_step":
            continue
        values = [r.get(k) for r in runs]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[k] = round(statistics.median(values), 4)
        out[f"{k}_per_pair"] = values
    return {**out, **med, "phases_s_per_step": phases,
            "load_avg_per_pair": [[r["load_avg_before"], r["load_avg_after"]] for r in runs]}


def _pair_ratios(pairs: list[dict]) -> dict:
    """Median rlpipe/TRL ratio of each throughput over the pairs, with its min and max (the spread)."""
    out: dict = {}
    for k in THROUGHPUT_KEYS:
        rs = [p["ratios"][k] for p in pairs if p["ratios"][k] is not None]
        out[k] = round(statistics.median(rs), 3) if rs else None
        out[f"{k}_spread"] = [min(rs), max(rs)] if rs else None
    out["wall_trl_over_rlpipe"] = round(statistics.median(p["ratios"]["wall_trl_over_rlpipe"] for p in pairs), 3)
    out["pairs"] = len(pairs)
    return out


def run_bench(checkpoint: str, dataset: str, config: str | None, s: BenchSettings, work: Path,
              pairs: int = 3, rlpipe_model: str = "native") -> dict:
    """Export, initial rewards, then ``pairs`` interleaved (rlpipe, TRL) runs and their ratios;
    torch's thread count is restored. Interleaving spreads a change of the machine's load over both
    sides; the spread of the per-pair ratios shows how much it moved them."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    threads_before = torch.get_num_threads()
    runs: list[dict] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers' renames that TRL still uses
            hf_dir = str(export_hf(checkpoint, work / "hf_model"))
            torch.set_num_threads(s.threads)
            package = prepare_decode(checkpoint, s, rlpipe_model)
            start_load = _load()
            initial = {"checkpoint": _policy_reward(checkpoint, dataset, s),
                       "hf_dir": _policy_reward(hf_dir, dataset, s)}
            for i in range(pairs):
                (work / f"pair{i}").mkdir(parents=True, exist_ok=True)
                rl = run_rlpipe(checkpoint, hf_dir, config, dataset, s, work / f"pair{i}", rlpipe_model)
                tr = run_trl(hf_dir, dataset, s, work / f"pair{i}" / "trl_out")
                ratios = {k: _ratio(rl[k], tr[k]) for k in THROUGHPUT_KEYS}
                ratios["wall_trl_over_rlpipe"] = _ratio(tr["wall_s"], rl["wall_s"])
                runs.append({"rlpipe": rl, "trl": tr, "ratios": ratios})
    finally:
        torch.set_num_threads(threads_before)
    rl, tr = _summary([p["rlpipe"] for p in runs]), _summary([p["trl"] for p in runs])
    rl["val_reward_initial"], tr["val_reward_initial"] = initial[rl["base"]], initial["hf_dir"]
    peaks = chip_fractions(checkpoint, hf_dir, dataset, s, rl, tr, threads_before)
    return {"bench": "trl", "skipped": False, "settings": asdict(s), "threads": s.threads, "device": s.device,
            **peaks,
            "versions": _versions(), "checkpoint": checkpoint, "dataset": dataset, "cpus": os.cpu_count(),
            "load_avg_start": start_load, "load_avg_end": _load(), "rlpipe": rl, "trl": tr,
            "ratios_rlpipe_over_trl": _pair_ratios(runs), "pairs": runs, "decode_package": package,
            "notes": notes(s, rl["base"]) + _package_note(package)}


def useful_flops(cfg: ModelConfig, prompt_lens: list[int], group_size: int, response_tokens: int) -> float:
    """FLOPs of one side's run (``rlpipe.bench.flops``): each prompt's G samples prefilled and
    decoded, then trained on (forward + backward, the LM head on the response tokens), every
    response at the run's mean length ``response_tokens / samples`` (rounded; per-sample lengths
    are not kept: at these lengths the attention term they change is a few percent)."""
    samples = len(prompt_lens) * group_size
    r = max(1, round(response_tokens / samples))
    return sum(grpo_step_flops(cfg, prompt_lens, group_size, r).values())


def side_fractions(flops: float, wall_s: float, shape_peak: float, chip: dict) -> dict:
    """One side's useful GFLOP/s and its two fractions (shape peak, device peak)."""
    rate = flops / wall_s
    return {"useful_gflops": gflops(rate), "fraction_of_shape_peak": fraction(rate, shape_peak),
            "fraction_of_device_peak": fraction(rate, chip["flops_per_s"])}


def chip_fractions(checkpoint: str, hf_dir: str, dataset: str, s: BenchSettings, rl: dict, tr: dict,
                   threads: int) -> dict:
    """Both sides' fractions of the shape and device peaks (into ``rl`` / ``tr``), measured here on
    the bench's threads and device; the top level repeats rlpipe's with the peaks and the note.

    Each side's useful FLOP/s is ``useful_flops`` over its wall. The device peak is one large square
    fp32 matmul on the bench's device (``rlpipe.bench.flops.device_peak``), the shape peak the best of
    two runs of fp32 matmuls of sides 256-1024 (``matmul_peak``)."""
    import torch

    cfg = load_checkpoint(checkpoint).model_config
    tok = load_tokenizer(hf_dir)
    lens = [len(tok.encode(r["prompt"])) for r in prompt_sequence(dataset, s)]
    torch.set_num_threads(s.threads)
    try:
        shape = max(matmul_peak(device=s.device)["flops_per_s"], matmul_peak(device=s.device)["flops_per_s"])
        chip = device_peak(s.device, torch.float32)
    finally:
        torch.set_num_threads(threads)
    for side in (rl, tr):
        side.update(side_fractions(useful_flops(cfg, lens, s.group_size, side["tokens"]), side["wall_s"], shape, chip))
    return {"fraction_of_shape_peak": rl["fraction_of_shape_peak"], "shape_peak_gflops": gflops(shape),
            "fraction_of_device_peak": rl["fraction_of_device_peak"], "device_peak_tflops": chip["tflops"],
            "device_peak_dtype": chip["dtype"], "device_peak_matmul_size": chip["matmul_size"], "device_peak": chip,
            "peak_note": PEAK_NOTE + " Here the FLOPs are useful_flops (see rlpipe.bench.trl) per side; the top-level "
                         "pair is rlpipe's, each side carries its own."}


def _package_note(package: dict | None) -> list[str]:
    if package is None:
        return []
    how = (f"built here before the pairs in {package['build_s']} s" if package["built_here"]
           else "found in the cache (built earlier on this machine)")
    return [f"decode aot: the AOTInductor decode package {package['package']} was {how}; it is a one-time cost "
            "per model shape and machine, outside every timed run, and each rlpipe run loads it before its clock "
            "starts (milliseconds)"]


def table(result: dict) -> str:
    rows = [("", "rlpipe", "TRL", "rlpipe/TRL")]
    r, t, q = result["rlpipe"], result["trl"], result["ratios_rlpipe_over_trl"]
    for key, label in (("step_samples_per_s_median", "samples/s (median step)"), ("samples_per_s", "samples/s"),
                       ("tokens_per_s", "tokens/s")):
        lo, hi = q[f"{key}_spread"] or (None, None)
        rows.append((label, f"{r[key]:g}", f"{t[key]:g}", f"{q[key]} [{lo}, {hi}]"))
    rows += [("wall s", f"{r['wall_s']:g}", f"{t['wall_s']:g}", ""),
             ("val reward initial", f"{r['val_reward_initial']:g}", f"{t['val_reward_initial']:g}", ""),
             ("val reward final", f"{r['val_reward_final']:g}", f"{t['val_reward_final']:g}", "")]
    for phase in sorted(set(r["phases_s_per_step"]) | set(t["phases_s_per_step"])):
        rv, tv = r["phases_s_per_step"].get(phase), t["phases_s_per_step"].get(phase)
        rows.append((f"s/step {phase}", "" if rv is None else f"{rv:g}", "" if tv is None else f"{tv:g}", ""))
    w = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(row)) for row in rows]
    if r.get("fraction_of_device_peak") is not None:
        lines.append(f"useful FLOP/s over the device peak ({result['device_peak_tflops']:g} TFLOP/s "
                     f"{result['device_peak_dtype']}): rlpipe {r['fraction_of_device_peak']:.3g}, TRL "
                     f"{t['fraction_of_device_peak']:.3g}; over the shape peak: rlpipe "
                     f"{r['fraction_of_shape_peak']:.3g}, TRL {t['fraction_of_shape_peak']:.3g}")
    lines.append(f"{q['pairs']} interleaved pairs (ratio: median [min, max] over pairs); load avg "
                 f"{result['load_avg_start']} -> {result['load_avg_end']}, threads {result['threads']}, "
                 f"rlpipe base: {r['base']}, decode {result['settings'].get('decode', 'eager')}")
    if result.get("model_parameters"):
        lines.append(f"model: {result['model_parameters'] / 1e6:.2f}M parameters"
                     + (f" (untrained preset {result['preset']}: speed only)" if result.get("preset") else ""))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlpipe bench trl", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="pretrained keyword base model (rlpipe .pt)")
    ap.add_argument("--dataset", required=True, help="keyword dataset directory (train.jsonl, val.jsonl)")
    ap.add_argument("--config", default=None, help="pipeline config whose train section gives the settings")
    ap.add_argument("--steps", type=int, default=16, help="optimizer steps on each side")
    ap.add_argument("--pairs", type=int, default=3, help="interleaved (rlpipe, TRL) runs; ratios are medians over them")
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each side")
    ap.add_argument("--device", choices=DEVICES, default="cpu",
                    help="both sides on this device (cuda: one GPU, in the same interleaved pairs)")
    ap.add_argument("--decode", choices=DECODES, default=None,
                    help="rlpipe's sampler decode (default on CPU aot: the AOT-compiled step, its package built once "
                         "before the pairs if this machine has none; on cuda config; eager: the pipeline's default; "
                         "compiled pays its torch.compile time inside the first timed step; config: the config's "
                         "train.decode)")
    ap.add_argument("--preset", default=None,
                    help="bench an untrained model of this preset (e.g. assignment: ~10x the default's parameters) "
                         "with the checkpoint's tokenizer, instead of the checkpoint's own weights")
    ap.add_argument("--rlpipe-model", choices=sorted(RLPIPE_MODELS), default="native",
                    help="rlpipe's side trains the weights in its own TransformerLM (native) or the exported HF "
                         "folder with transformers' Llama code, as TRL does (hf)")
    ap.add_argument("--val-size", type=int, default=None, help="validation prompts (default: train.val_size)")
    ap.add_argument("--work-dir", default=None, help="keep the export, runs and logs here (default: a temp dir)")
    ap.add_argument("--out", default=None, help="write the JSON here (atomically)")
    return ap


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None) -> int:
    """Check every input, then run the pairs (or write the skip record where TRL is not installed).
    ``--device cuda`` without CUDA is refused in one line naming ``--device`` before any work."""
    ap = _parser()
    a = ap.parse_args(argv)
    if a.device == "cuda" and not _cuda_available():
        ap.exit(2, "rlpipe bench trl: --device cuda: CUDA is not available here (no GPU, or a CPU-only torch); "
                   "use --device cpu\n")
    try:
        train_cfg = check_inputs(a.checkpoint, a.dataset, a.config)
        s = settings_from_config(train_cfg, steps=a.steps, prompts_per_step=a.prompts_per_step, threads=a.threads)
        if a.val_size is not None:
            s = BenchSettings(**{**asdict(s), "val_size": a.val_size, "betas": s.betas})
        decode = a.decode or ("aot" if a.device == "cpu" else "config")
        if decode == "aot" and a.device != "cpu":
            raise BenchInputError("--decode aot is CPU only (an AOTInductor package for CPU); with --device cuda "
                                  "choose eager, static, compiled or config")
        if decode != "config":
            s = BenchSettings(**{**asdict(s), "decode": decode, "betas": s.betas})
        s = BenchSettings(**{**asdict(s), "device": a.device, "betas": s.betas})
        s.check()
        if a.pairs < 1:
            raise BenchInputError(f"--pairs must be >= 1, got {a.pairs}")
    except BenchInputError as e:
        ap.error(str(e))
    if import_trl() is None:
        result = {"bench": "trl", "skipped": True, "reason": SKIP_REASON, "device": s.device,
                  "fraction_of_shape_peak": None, "fraction_of_device_peak": None,
                  "peak_note": "skipped: nothing was measured"}
        print(f"rlpipe bench trl: skipped: {SKIP_REASON}", flush=True)
    else:
        with (contextlib.nullcontext(a.work_dir) if a.work_dir else tempfile.TemporaryDirectory(
                prefix="rlpipe-bench-trl-")) as work:
            Path(work).mkdir(parents=True, exist_ok=True)
            checkpoint = a.checkpoint
            if a.preset:
                try:
                    checkpoint = preset_checkpoint(a.checkpoint, a.preset, Path(work).resolve() / f"{a.preset}.pt",
                                                   seed=s.seed)
                except BenchInputError as e:
                    ap.error(str(e))
            result = run_bench(checkpoint, a.dataset, a.config, s, Path(work).resolve(), pairs=a.pairs,
                               rlpipe_model=a.rlpipe_model)
            result.update(preset=a.preset, model_parameters=_parameters(checkpoint))
        print(table(result), flush=True)
    if a.out:
        write_json(a.out, stamp(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
