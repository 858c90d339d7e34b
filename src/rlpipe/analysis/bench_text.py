"""The report's benchmark sections: which benchmarks ran, the learner and the sampler against the
matmul peak, and rlpipe against TRL's ``GRPOTrainer`` (``rlpipe bench trl``).

Each sentence is computed from a bench JSON (``results/bench/*.json``). A benchmark that did not run
(an optional extra missing) is one sentence saying how to run it, never a JSON dump. A speed ratio
is called a lead only when every interleaved pair agrees (the spread's minimum is above 1), and a
reward difference is compared with the validation sampling noise. Every timing-derived ratio carries
the load its bench recorded and, when contended by the training runs' rule, the mark "contended,
indicative only" (``rlpipe.analysis.findings.timing_load``).
"""

from __future__ import annotations

import math

from rlpipe.analysis.findings import timing_load
from rlpipe.analysis.stats import binomial_half_width
from rlpipe.analysis.text_format import fnum, nan, section

#: What each bench measures, for the list of benchmarks that ran.
BENCH_LABELS = {"sampler": "the KV-cache sampler against naive recomputation and HF generate",
                "update": "the learner's update against the same-run matmul peak",
                "trl": "rlpipe against TRL's GRPOTrainer", "scaling": "the scaling curves"}
#: How to add an optional bench to a run (TRL is not in the lock, so the default run leaves it out).
ENABLE = {"trl": "pip install -e '.[bench]' and rerun snakemake --cores all (the pipeline runs bench_trl "
                 "whenever TRL is installed)"}


def bench_section(bench: dict) -> dict:
    """Which benchmarks ran (their numbers are in the sections that follow), and, in one sentence
    each, how to add an optional one this run left out (TRL: not in the lock, so not run by default)."""
    s = []
    for name, data in sorted(bench.items()):
        if name.startswith("weight_sync"):
            continue  # reported in the weight-sync section
        data = data if isinstance(data, dict) else {}
        if data.get("error"):
            s.append(f"{name}: its JSON could not be read ({data['error']}).")
        elif data.get("skipped"):
            s.append(_not_run(name, str(data.get("reason") or "skipped")))
        else:
            s.append(f"{BENCH_LABELS.get(name, name)}: measured (results/bench/{name}.json).")
    for name in ENABLE:
        if name not in bench:
            s.append(_not_run(name, "TRL is an optional extra, not in the lock"))
    return section("bench", "Benchmarks", s or ["No benchmark files were found."])


def _not_run(name: str, reason: str) -> str:
    """One sentence: the bench was not run, why (its own install hint cut, the sentence gives it
    once), and how to add it."""
    how = ENABLE.get(name, f"see results/bench/{name}.json")
    reason = reason.split(": pip install")[0]
    return f"{BENCH_LABELS.get(name, name)}: not in this run ({reason}); to add it, {how}."


def _num(d: dict, key: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _compiled_decode_sentences(sp: dict, load: str) -> list[str]:
    """The compiled decodes of the sampler bench, when it measured them (``load``: its load clause)."""
    out = []
    for key, name in (("compiled", "through torch.compile (`train.decode: compiled`, compiled in every process)"),
                      ("aot", "compiled ahead of time (`train.decode: aot`, one package per model shape and "
                              "machine)")):
        frac, over = _num(sp, f"{key}_fraction_of_peak"), _num(sp, f"{key}_over_eager")
        if not nan(frac):
            out.append(f"The same decode step {name}: {fnum(frac * 100)}% of the peak, {fnum(over)}x the eager "
                       f"sampler measured beside it ({load}).")
    return out


def limits_section(bench: dict) -> dict:
    """The learner's update and the sampler against the same-run matmul peak
    (``rlpipe bench update`` / ``rlpipe bench sampler``), and what bounds each."""
    title = "The learner and the sampler against the matmul peak"
    up, sp = bench.get("update") or {}, bench.get("sampler") or {}
    s, nums = [], {}
    up_load, sp_load = timing_load(up), timing_load(sp)
    if not nan(_num(up, "update_fraction_of_peak")):
        frac, fb = _num(up, "update_fraction_of_peak"), _num(up, "fwd_bwd_fraction_of_peak")
        s.append(f"Update phase (forward + backward + AdamW + the KL monitor's forward) on "
                 f"{fnum(_num(up, 'torch_threads'))} thread(s): {fnum(_num(up, 'update_gflops'))} GFLOP/s, "
                 f"{fnum(frac * 100)}% of the same-run fp32 matmul peak ({fnum(_num(up, 'matmul_peak_gflops'))} "
                 f"GFLOP/s); the forward + backward alone reaches {fnum(fb * 100)}% ({up_load.clause()}).")
        s.append(f"Of the update's time, forward + backward is {fnum(_num(up, 'fwd_bwd_share') * 100)}%, "
                 f"the KL monitor's extra forward {fnum(_num(up, 'kl_monitor_share') * 100)}% and AdamW with "
                 f"clipping {fnum(_num(up, 'optimizer_share') * 100)}%. What keeps the rest from the peak: the "
                 f"model's matrices are small (a few hundred wide), so the elementwise work of softmax over the "
                 f"vocabulary, attention, SwiGLU and the loss is not hidden behind matmuls.")
        nums.update(update_fraction=frac, fwd_bwd_fraction=fb, update_contended=up_load.contended)
        if not nan(_num(up, "peak_memory_ratio")):
            s.append(f"Peak memory of the forward and backward: {fnum(_num(up, 'fwd_bwd_peak_mb'))} MB with the LM "
                     f"head on response tokens only (`train.response_only_head`), "
                     f"{fnum(_num(up, 'full_head_fwd_bwd_peak_mb'))} MB with the head over every position "
                     f"({fnum(_num(up, 'peak_memory_ratio'))}x).")
    if not nan(_num(sp, "kv_fraction_of_peak")):
        kf = _num(sp, "kv_fraction_of_peak")
        s.append(f"Generation (KV-cache sampler, batch {fnum(_num(sp, 'batch'))}): {fnum(_num(sp, 'kv_gflops'))} "
                 f"GFLOP/s, {fnum(kf * 100)}% of the same-run peak ({fnum(_num(sp, 'matmul_peak_gflops'))} GFLOP/s; "
                 f"{sp_load.clause()}). "
                 f"Each decoding step multiplies one row per sequence by every weight matrix and then samples "
                 f"in Python: small matrix-vector products and per-token overhead bound it, not FLOPs, which is "
                 f"why batching more sequences per step raises it (see the scaling curves).")
        nums.update(generation_fraction=kf, sampler_contended=sp_load.contended)
        s += _compiled_decode_sentences(sp, sp_load.clause())
    s += _device_peak_sentences(up, sp, nums)
    if not s:
        s.append("No data: results/bench/update.json and sampler.json hold no FLOP measurements.")
    return section("limits", title, s, nums)


def _device_peak_sentences(up: dict, sp: dict, nums: dict) -> list[str]:
    """The same work against the device's own peak (``fraction_of_device_peak``: one large matmul in
    the run's dtype), beside the shape peak quoted above, when the benches measured it."""
    parts = []
    for name, d, key in (("the update", up, "update_device_fraction"),
                         ("generation", sp, "generation_device_fraction")):
        frac = _num(d, "fraction_of_device_peak")
        if not nan(frac):
            parts.append(f"{name} {fnum(frac * 100)}% of {fnum(_num(d, 'device_peak_tflops'))} TFLOP/s "
                         f"({d.get('device_peak_dtype')}, side {d.get('device_peak_matmul_size')})")
            nums[key] = frac
    if not parts:
        return []
    return ["Against the device's own peak (one large square matmul in the run's dtype, measured in the same "
            "run) rather than the shape peak above (fp32 products of about the model's size): "
            + "; ".join(parts) + "."]


def _ratio_sentence(label: str, q: dict, key: str, load: str) -> str:
    lo, hi = q.get(f"{key}_spread") or (math.nan, math.nan)
    verdict = ("faster in every pair" if lo > 1 else "slower in every pair" if hi < 1
               else "not a consistent difference: the pairs disagree")
    return f"{label}: rlpipe / TRL {fnum(q.get(key))}x (pairs {fnum(lo)}..{fnum(hi)}), {verdict} ({load})."


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


def trl_section(bench: dict) -> dict | None:
    """rlpipe against TRL on the same model, prompts and settings: the ratios over interleaved
    pairs, the rewards at equal samples, and where each side's step time goes; None when TRL was
    not measured (no section: ``bench_section`` says how to add it)."""
    title = "rlpipe against TRL's GRPOTrainer"
    t = bench.get("trl")
    if not isinstance(t, dict) or t.get("skipped") or "ratios_rlpipe_over_trl" not in t:
        return None  # the benchmarks section says, in one sentence, how to add it
    q, rl, tr = t["ratios_rlpipe_over_trl"], t["rlpipe"], t["trl"]
    load = timing_load(t)  # the two sides of a pair run one after the other, each on `threads`
    s = [f"{q.get('pairs', 1)} interleaved pairs of runs, {t['settings']['steps']} optimizer steps of "
         f"{t['settings']['prompts_per_step']} prompts x G {t['settings']['group_size']} each, "
         f"{t.get('threads')} thread(s) per side, CPU fp32, rlpipe's sampler decoding "
         f"{t['settings'].get('decode', 'eager')} (`train.decode`).",
         _model_sentence(rl.get("base")),
         *_package_sentence(t.get("decode_package")),
         _ratio_sentence("Samples/s of the median step", q, "step_samples_per_s_median", load.clause()),
         _ratio_sentence("Samples/s over the whole run", q, "samples_per_s", load.clause())]
    n = int(t["settings"].get("val_size", 0))
    a, b = rl.get("val_reward_final", math.nan), tr.get("val_reward_final", math.nan)
    noise = max(binomial_half_width(a, n), binomial_half_width(b, n))
    same = abs(a - b) <= noise
    s.append(f"Validation reward at equal samples (median over pairs, {n} prompts): rlpipe {fnum(a)}, TRL "
             f"{fnum(b)}, from {fnum(rl.get('val_reward_initial'))}; the gap is "
             f"{'within' if same else 'beyond'} the sampling noise of +-{fnum(noise, 2)}.")
    s.append(_phase_sentence("rlpipe", rl.get("phases_s_per_step") or {}))
    s.append(_phase_sentence("TRL", tr.get("phases_s_per_step") or {}))
    return section("trl", title, s, {"step_ratio": q.get("step_samples_per_s_median"),
                                     "samples_ratio": q.get("samples_per_s"), "contended": load.contended})
