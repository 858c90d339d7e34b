"""The report's benchmark sections: which benchmarks ran, the learner and the sampler against the
matmul peak, and rlpipe against TRL's ``GRPOTrainer`` (``rlpipe bench trl``).

Each sentence is computed from a bench JSON (``results/bench/*.json``). A benchmark that did not run
(an optional extra missing) is one sentence saying how to run it, never a JSON dump. A speed ratio
is called a lead only when every interleaved pair agrees (the spread's minimum is above 1), and a
reward difference is compared with the validation sampling noise.
"""

from __future__ import annotations

import math

from rlpipe.analysis.stats import binomial_half_width
from rlpipe.analysis.text_format import fnum, nan, section

#: What each bench measures, for the list of benchmarks that ran.
BENCH_LABELS = {"sampler": "the KV-cache sampler against naive recomputation and HF generate",
                "update": "the learner's update against the same-run matmul peak",
                "trl": "rlpipe against TRL's GRPOTrainer", "scaling": "the scaling curves"}
ENABLE = {"trl": "pip install -e '.[bench]', then snakemake results/bench/trl.json --forcerun bench_trl"}


def bench_section(bench: dict) -> dict:
    """Which benchmarks ran (their numbers are in the sections that follow), and how to run a
    skipped one."""
    s = []
    for name, data in sorted(bench.items()):
        if name.startswith("weight_sync"):
            continue  # reported in the weight-sync section
        data = data if isinstance(data, dict) else {}
        if data.get("error"):
            s.append(f"{name}: its JSON could not be read ({data['error']}).")
        elif data.get("skipped"):
            how = ENABLE.get(name, f"see results/bench/{name}.json")
            reason = data.get("reason", "skipped")
            s.append(f"{BENCH_LABELS.get(name, name)}: not measured, {reason}; to run it: {how}.")
        else:
            s.append(f"{BENCH_LABELS.get(name, name)}: measured (results/bench/{name}.json).")
    return section("bench", "Benchmarks", s or ["No benchmark files were found."])


def _num(d: dict, key: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _compiled_decode_sentences(sp: dict) -> list[str]:
    """The compiled decodes of the sampler bench, when it measured them."""
    out = []
    for key, name in (("compiled", "through torch.compile (`train.decode: compiled`, compiled in every process)"),
                      ("aot", "compiled ahead of time (`train.decode: aot`, one package per model shape and "
                              "machine)")):
        frac, over = _num(sp, f"{key}_fraction_of_peak"), _num(sp, f"{key}_over_eager")
        if not nan(frac):
            out.append(f"The same decode step {name}: {fnum(frac * 100)}% of the peak, {fnum(over)}x the eager "
                       "sampler measured beside it.")
    return out


def limits_section(bench: dict) -> dict:
    """The learner's update and the sampler against the same-run matmul peak
    (``rlpipe bench update`` / ``rlpipe bench sampler``), and what bounds each."""
    title = "The learner and the sampler against the matmul peak"
    up, sp = bench.get("update") or {}, bench.get("sampler") or {}
    s, nums = [], {}
    if not nan(_num(up, "update_fraction_of_peak")):
        frac, fb = _num(up, "update_fraction_of_peak"), _num(up, "fwd_bwd_fraction_of_peak")
        s.append(f"Update phase (forward + backward + AdamW + the KL monitor's forward) on "
                 f"{fnum(_num(up, 'torch_threads'))} thread(s): {fnum(_num(up, 'update_gflops'))} GFLOP/s, "
                 f"{fnum(frac * 100)}% of the same-run fp32 matmul peak ({fnum(_num(up, 'matmul_peak_gflops'))} "
                 f"GFLOP/s); the forward + backward alone reaches {fnum(fb * 100)}%.")
        s.append(f"Of the update's time, forward + backward is {fnum(_num(up, 'fwd_bwd_share') * 100)}%, "
                 f"the KL monitor's extra forward {fnum(_num(up, 'kl_monitor_share') * 100)}% and AdamW with "
                 f"clipping {fnum(_num(up, 'optimizer_share') * 100)}%. What keeps the rest from the peak: the "
                 f"model's matrices are small (a few hundred wide), so the elementwise work of softmax over the "
                 f"vocabulary, attention, SwiGLU and the loss is not hidden behind matmuls.")
        nums.update(update_fraction=frac, fwd_bwd_fraction=fb)
        if not nan(_num(up, "peak_memory_ratio")):
            s.append(f"Peak memory of the forward and backward: {fnum(_num(up, 'fwd_bwd_peak_mb'))} MB with the LM "
                     f"head on response tokens only (`train.response_only_head`), "
                     f"{fnum(_num(up, 'full_head_fwd_bwd_peak_mb'))} MB with the head over every position "
                     f"({fnum(_num(up, 'peak_memory_ratio'))}x).")
    if not nan(_num(sp, "kv_fraction_of_peak")):
        kf = _num(sp, "kv_fraction_of_peak")
        s.append(f"Generation (KV-cache sampler, batch {fnum(_num(sp, 'batch'))}): {fnum(_num(sp, 'kv_gflops'))} "
                 f"GFLOP/s, {fnum(kf * 100)}% of the same-run peak ({fnum(_num(sp, 'matmul_peak_gflops'))} GFLOP/s). "
                 f"Each decoding step multiplies one row per sequence by every weight matrix and then samples "
                 f"in Python: small matrix-vector products and per-token overhead bound it, not FLOPs, which is "
                 f"why batching more sequences per step raises it (see the scaling curves).")
        nums["generation_fraction"] = kf
        s += _compiled_decode_sentences(sp)
    if not s:
        s.append("No data: results/bench/update.json and sampler.json hold no FLOP measurements.")
    return section("limits", title, s, nums)


def _ratio_sentence(label: str, q: dict, key: str) -> str:
    lo, hi = q.get(f"{key}_spread") or (math.nan, math.nan)
    verdict = ("faster in every pair" if lo > 1 else "slower in every pair" if hi < 1
               else "not a consistent difference: the pairs disagree")
    return f"{label}: rlpipe / TRL {fnum(q.get(key))}x (pairs {fnum(lo)}..{fnum(hi)}), {verdict}."


def _phase_sentence(side: str, phases: dict) -> str:
    step = phases.get("step") or math.nan
    parts = [f"{k.replace('_', ' ')} {fnum(v, 3)} s ({fnum(100 * v / step, 2)}%)"
             for k, v in phases.items() if k != "step" and not nan(v)]
    return f"{side}: a step takes {fnum(step, 3)} s (median): " + ", ".join(parts) + "."


def _model_sentence(base: str | None) -> str:
    if base == "hf_dir":
        return ("Both sides ran the exported model with transformers' Llama code, so the ratio is what the "
                "pipeline alone gains.")
    return ("TRL ran the exported model with transformers' Llama code; rlpipe ran the same weights in its own "
            "TransformerLM (logits equal within 1e-4), so the ratio includes what that model code gains "
            "(`rlpipe bench trl --rlpipe-model hf` separates the two).")


def _package_sentence(package: dict | None) -> list[str]:
    """How the AOT decode package was come by (``train.decode: aot``), outside every timed run."""
    if not isinstance(package, dict):
        return []
    how = (f"built once before the first pair ({fnum(package.get('build_s'))} s, once per model shape and machine)"
           if package.get("built_here") else "already in this machine's cache")
    return [f"rlpipe's ahead-of-time compiled decode package was {how}; no timed run includes its build, and "
            "each run loads it before its clock starts."]


def trl_section(bench: dict) -> dict:
    """rlpipe against TRL on the same model, prompts and settings: the ratios over interleaved
    pairs, the rewards at equal samples, and where each side's step time goes."""
    title = "rlpipe against TRL's GRPOTrainer"
    t = bench.get("trl")
    if not isinstance(t, dict) or t.get("skipped") or "ratios_rlpipe_over_trl" not in t:
        how = ENABLE["trl"]
        return section("trl", title, [f"Not measured in this run (TRL is an optional extra): {how}."])
    q, rl, tr = t["ratios_rlpipe_over_trl"], t["rlpipe"], t["trl"]
    s = [f"{q.get('pairs', 1)} interleaved pairs of runs, {t['settings']['steps']} optimizer steps of "
         f"{t['settings']['prompts_per_step']} prompts x G {t['settings']['group_size']} each, "
         f"{t.get('threads')} thread(s) per side, CPU fp32, rlpipe's sampler decoding "
         f"{t['settings'].get('decode', 'eager')} (`train.decode`).",
         _model_sentence(rl.get("base")),
         *_package_sentence(t.get("decode_package")),
         _ratio_sentence("Samples/s of the median step", q, "step_samples_per_s_median"),
         _ratio_sentence("Samples/s over the whole run", q, "samples_per_s")]
    n = int(t["settings"].get("val_size", 0))
    a, b = rl.get("val_reward_final", math.nan), tr.get("val_reward_final", math.nan)
    noise = max(binomial_half_width(a, n), binomial_half_width(b, n))
    same = abs(a - b) <= noise
    s.append(f"Validation reward at equal samples (median over pairs, {n} prompts): rlpipe {fnum(a)}, TRL "
             f"{fnum(b)}, from {fnum(rl.get('val_reward_initial'))}; the gap is "
             f"{'within' if same else 'beyond'} the sampling noise of +-{fnum(noise, 2)}.")
    s.append(_phase_sentence("rlpipe", rl.get("phases_s_per_step") or {}))
    s.append(_phase_sentence("TRL", tr.get("phases_s_per_step") or {}))
    loads = [x for side in (rl, tr) for pair in side.get("load_avg_per_pair", []) for x in pair]
    cpus = t.get("cpus") or 1
    if loads and max(la[0] for la in loads) > cpus:
        s.append(f"The 1-minute load average reached {fnum(max(la[0] for la in loads))} on {cpus} CPUs during "
                 "the pairs: the machine was shared, so these ratios are indicative only.")
    return section("trl", title, s, {"step_ratio": q.get("step_samples_per_s_median"),
                                     "samples_ratio": q.get("samples_per_s")})
