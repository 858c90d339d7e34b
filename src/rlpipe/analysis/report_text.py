"""The report's discussion, written from the aggregated data (never typed by hand).

``discussion(table, metrics, versions, weight_sync, reference, bench, rollouts)`` returns a JSON-able
dict ``{"reference", "sections": [{"id", "title", "sentences", "numbers"}]}`` with one section per
deliverable of seed 000 §3 and seed 002 §3; ``render_html`` turns it into the report page. Every
sentence is built from measured numbers and says plainly when the data it needs is missing (a
variant not configured, a column that is all NaN).

Choices the seeds leave open (the KL section's are in ``rlpipe.analysis.kl_text``):
- Findings: every gap between variants here is between single runs, so it is stated as a
  measurement with the verdict of ``rlpipe.analysis.findings.is_finding`` (never a finding); the
  replicated comparisons are the family pages'.
- The k-steps "why": the ideal gain of removing all but one in k weight syncs is
  ``wall / (wall - (1 - 1/k) * sync_time)`` of the reference; we report it next to the measured one.
- Contention: a run whose run_info says ``conditions.contended`` was timed while
  other processes took its CPU (``rlpipe.trainer.conditions``). Every sentence that compares timings
  between runs (k-step speedups, the disaggregated speedup and overlap bound, transport latencies
  measured in the runs, replay throughput) says so instead of stating the comparison
  (``contention_caveat``), and the profiling section lists every run's conditions.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from rlpipe import contract
from rlpipe.analysis.bench_text import bench_section, limits_section, trl_section
from rlpipe.analysis.findings import single_runs, timing_load
from rlpipe.analysis.kl_text import kl_section
from rlpipe.analysis.optimization_text import optimization_section
from rlpipe.analysis.provenance import provenance_section
from rlpipe.analysis.rdt_text import rdt_section
from rlpipe.analysis.summary_rows import (
    contended,
    contention_caveat,
    first_row,
    has_columns,
    missing,
    row_of,
)
from rlpipe.analysis.text_format import fnum, fpct, fsec, fx, nan, section
from rlpipe.contract import phase_seconds_column, phase_share_column

PHASE_WHY = {
    "generate": ("autoregressive sampling runs one forward pass per generated token, {tokens} sequential "
                 "steps per batch on average, while the update is one batched forward and backward pass"),
    "update": ("the forward and backward passes plus the optimizer step outweigh sampling when responses "
               "are short"),
    "ref_logprobs": "the frozen reference model scores every response with a full forward pass",
    "score": "reward scoring runs in Python over every response",
    "weight_sync": "every optimizer step ships the whole model to the generator",
    "validate": "validation samples a full set of held-out prompts",
}


# --------------------------------------------------------------------------- formatting


def conditions_sentence(table: pd.DataFrame) -> str:
    """Each run's machine conditions: the larger 1-minute load average and other processes' share."""
    if not len(table) or "other_cpu_frac" not in table.columns:
        return "Run conditions: no run recorded what else the machine was doing while it was timed."
    parts = []
    for _, r in table.iterrows():
        if nan(r.get("other_cpu_frac")) and nan(r.get("load_avg_max")):
            parts.append(f"{r['variant']} not recorded")
            continue
        other = "" if nan(r.get("other_cpu_frac")) else \
            f", other processes {fpct(r['other_cpu_frac'])} of the CPUs"
        parts.append(f"{r['variant']} load average up to {fnum(r.get('load_avg_max'))}{other}"
                     + (" (contended)" if contended(r) else ""))
    unknown = sum(p.endswith(" not recorded") for p in parts)
    if unknown == len(parts):
        return ("Run conditions: no run recorded what else the machine was doing while it was timed (runs from "
                "before conditions were recorded), so no timing comparison could be checked for contention.")
    n = sum(contended(r) for _, r in table.iterrows())
    tail = (f" {n} run(s) were timed under contention: timing comparisons with them draw no conclusion." if n
            else f" No run{' with recorded conditions' if unknown else ''} was timed under contention.")
    return "Run conditions (what else the machine did while each run was timed): " + "; ".join(parts) + "." + tail


# --------------------------------------------------------------------------- systems sections

STACK = (*contract.STACK_PHASES, contract.OTHER)


def profiling_section(table: pd.DataFrame, metrics: pd.DataFrame, ref: str) -> dict:
    title = "Profiling: where the time goes (seed 000 Problem 5 and 7)"
    sec = _profiling(table, metrics, ref, title)
    sec["sentences"].append(conditions_sentence(table))
    sec["numbers"]["contended_runs"] = int(sum(contended(r) for _, r in table.iterrows())) if len(table) else 0
    return sec


def _profiling(table: pd.DataFrame, metrics: pd.DataFrame, ref: str, title: str) -> dict:
    r = row_of(table, ref)
    if r is None:
        return section("profiling", title, [missing(ref)])
    secs = {p: r.get(phase_seconds_column(p), math.nan) for p in STACK}
    shares = {p: r.get(phase_share_column(p), math.nan) for p in STACK}
    known = {p: secs[p] for p in contract.STEP_STACK_PHASES if not nan(secs[p])}  # training-step work
    if not known or sum(known.values()) <= 0:
        return section("profiling", title, [f"No data: no phase timings recorded for '{ref}'."])
    top = max(known, key=known.get)
    parts = ", ".join(f"{p} {fsec(secs[p])} ({fpct(shares[p])})" for p in STACK if not nan(secs[p]) and secs[p] > 0)
    m = metrics[metrics["variant"] == ref] if len(metrics) else metrics
    tokens = m["response/length_mean"].mean() if "response/length_mean" in m.columns else math.nan
    why = PHASE_WHY.get(top, "").format(tokens=fnum(tokens, 3))
    val = "" if nan(secs["validate"]) else (f" Validation (not a training stage, every val_every steps) took "
                                             f"{fsec(secs['validate'])}.")
    s = [f"In '{ref}' ({fsec(r['wall_time_s'])} wall time): {parts}.",
         f"{top} dominates" + (f", {known[top] / known['update']:.1f}x the update time" if known.get("update")
                               and top != "update" else "") + (f": {why}." if why else ".") + val]
    if not nan(r.get("gpu_busy", math.nan)):  # NVML, sampled over the training loop (GPU runs only)
        s.append(f"Its GPU was busy {fpct(r['gpu_busy'])} of the training loop (NVML: the share of time some "
                 "kernel ran, not of the chip's capacity).")
    if contended(r):
        s.append(f"'{ref}' was timed under contention (other processes took {fpct(r.get('other_cpu_frac'))} of the "
                 "CPUs): its phase times include waiting for a core, so its shares may be skewed.")
    return section("profiling", title, s, {"dominant": top, **{phase_share_column(p): shares[p] for p in STACK}})


def rollouts_section(rollouts: pd.DataFrame, table: pd.DataFrame, ref: str) -> dict:
    title = "Example rollouts (seed 000 Problem 5, seed 002 Problem 7)"
    r = rollouts[rollouts["variant"] == ref] if len(rollouts) else rollouts
    if not len(r):
        return section("rollouts", title, [f"No data: no example rollouts logged for '{ref}'."])
    first, final = int(r["step"].min()), int(r["step"].max())
    a, b = r[r["step"] == first]["reward"], r[r["step"] == final]["reward"]
    row = row_of(table, ref) or {}
    s = [(f"Of the example rollouts logged for '{ref}', {int((a > 0).sum())}/{len(a)} satisfy the keyword "
         f"constraint at step {first} and {int((b > 0).sum())}/{len(b)} at step {final}; validation reward went "
         f"from {fnum(row.get('val_reward_initial'))} (step 0) to {fnum(row.get('val_reward_final'))} "
         f"(best {fnum(row.get('val_reward_best'))} at step {row.get('best_step', 'n/a')}).")]
    return section("rollouts", title, s, {"first_step_mean": float(a.mean()), "last_step_mean": float(b.mean())})


# Colocated variants with equal samples do the same compute; a larger gap in its duration is noise.
SAME_WORK_TOLERANCE = 0.05
_WORK_PHASES = ("generate", "ref_logprobs", "update")


def _same_work_ratio(r, base) -> float:
    """Seconds of generation + reference + update of ``r`` over those of ``base`` (NaN if unknown)."""
    a, b = (sum(x[phase_seconds_column(p)] for p in _WORK_PHASES) for x in (r, base))
    return math.nan if nan(a) or nan(b) or b <= 0 or not r["equal_samples"] else a / b


def kstep_section(table: pd.DataFrame, ref: str) -> dict:
    title = "k steps per rollout batch: throughput and speedup (seed 000 Problem 7)"
    base = row_of(table, ref)
    ks = table[table["mode"] == "colocated_k"].sort_values("k") if len(table) else table
    if base is None or not len(ks):
        return section("kstep", title, [missing(ref) if base is None else "No data: no colocated_k variant ran."])
    s, nums = [], {}
    for _, r in ks.iterrows():
        k = int(r["k"]) if not nan(r["k"]) else None
        ideal = math.nan
        if k and not nan(base["time_weight_sync_s"]):
            ideal = base["wall_time_s"] / (base["wall_time_s"] - (1 - 1 / k) * base["time_weight_sync_s"])
        same = "" if r["equal_samples"] else " (NOTE: different sample totals, so this is a throughput ratio)"
        caveat = contention_caveat(r, base)
        nums[f"contended_{r['variant']}"] = bool(caveat)
        speed, reward = single_runs(1.0, r["speedup_vs_ref"], bool(caveat)), \
            single_runs(base["val_reward_final"], r["val_reward_final"])
        nums[f"finding_{r['variant']}"] = bool(speed) or bool(reward)
        rewards = (f"final validation reward {fnum(r['val_reward_final'])} vs {fnum(base['val_reward_final'])} "
                   f"({reward.clause()})")
        if caveat:
            s.append(f"{r['variant']} vs '{ref}' throughput: {caveat}. {r['num_syncs']} weight syncs instead of "
                     f"{base['num_syncs']}; {rewards}.")
        else:
            s.append(f"{r['variant']}: {fnum(r['samples_per_s'])} samples/s vs {fnum(base['samples_per_s'])} for "
                     f"'{ref}', a speedup of {fx(r['speedup_vs_ref'])}{same} ({speed.clause()}); "
                     f"{r['num_syncs']} weight syncs instead of {base['num_syncs']}; removing those syncs alone "
                     f"would give {fx(ideal)}; {rewards}.")
        nums[f"speedup_{r['variant']}"] = r["speedup_vs_ref"]
        nums[f"ideal_{r['variant']}"] = ideal
        work = _same_work_ratio(r, base)
        nums[f"work_ratio_{r['variant']}"] = work
        if not caveat and not nan(work) and abs(work - 1) > SAME_WORK_TOLERANCE:
            s.append(f"{r['variant']} did the same generation, reference and update work as '{ref}', yet "
                     f"those phases took {fpct(abs(work - 1))} {'less' if work < 1 else 'more'} time: that "
                     "part of the gap is the machine's speed during the run (noise), not the schedule.")
    s.append("Why: generating k batches per policy version only saves weight syncs (here "
             f"{fpct(base['share_weight_sync'])} "
             f"of the phase time of '{ref}'); generation and the update still run back to back on one device, "
             "so the gain is bounded by the sync share, while the extra off-policy steps can cost reward.")
    return section("kstep", title, s, nums)


def hours_unit(row: dict) -> str:
    """How a run's wall time x devices is billed: GPU-hours for a run whose run_info says
    ``device_type: gpu`` (``contract.DEVICE_GPU``), device-hours otherwise."""
    unit = contract.device_hours_unit([row.get("device_type")])
    return unit if unit == "GPU-hours" else f"{unit} (CPU runs: wall x devices)"


def time_outside_work(row) -> float:
    """Wall seconds of a run outside generation and training (unknown phases count as 0)."""
    work = (*contract.GEN_PHASES, *contract.TRAIN_PHASES)
    secs = (row[phase_seconds_column(p)] for p in work)
    return row["wall_time_s"] - sum(0.0 if nan(x) else x for x in secs)


def disagg_section(table: pd.DataFrame, ref: str) -> dict:
    title = "Colocated vs disaggregated: wall time and GPU-hours (seed 000 Problem 8, seed 002 Problem 10)"
    base = row_of(table, ref)
    dis = table[table["mode"] == "disaggregated"] if len(table) else table
    if base is None or not len(dis):
        return section("disagg", title, [missing(ref) if base is None else "No data: no disaggregated variant ran."])
    unit = hours_unit(base)
    rows = [base] + [r for _, r in table[table["mode"] == "colocated_k"].iterrows()] + [r for _, r in dis.iterrows()]
    s = ["Wall time and " + unit + ": " + "; ".join(
        f"{r['variant']} {fsec(r['wall_time_s'])} x {fnum(r['devices'])} = {fnum(r['device_hours'], 3)} "
        f"{unit.split(' ')[0]}"
        + (" (contended)" if contended(r) else "") for r in rows) + "."]
    nums = {}
    for _, r in dis.iterrows():
        caveat = contention_caveat(r, base)
        nums[f"contended_{r['variant']}"] = bool(caveat)
        nums[f"speedup_{r['variant']}"] = r["speedup_vs_ref"]
        nums[f"bound_{r['variant']}"] = r["overlap_bound"]
        verdict = single_runs(1.0, r["speedup_vs_ref"], bool(caveat))
        nums[f"finding_{r['variant']}"] = bool(verdict)
        if caveat:
            s.append(f"{r['variant']} ({fnum(r['devices'])} devices) vs '{ref}': its speedup, {unit.split(' ')[0]} "
                     f"ratio and share of the overlap bound were {caveat}.")
            continue
        s.append(f"{r['variant']}: speedup {fx(r['speedup_vs_ref'])} over '{ref}' ({verdict.clause()}) with "
                 f"{fnum(r['devices'])} devices, so "
                 f"{fx(r['device_hours'] / base['device_hours'] if base['device_hours'] else math.nan)} its "
                 f"{unit.split(' ')[0]}. "
                 f"Measured T_gen = {fsec(r['t_gen_s'])}, T_train = {fsec(r['t_train_s'])}: "
                 f"perfect overlap could give at most {fx(r['overlap_bound'])}; the run overlapped "
                 f"{fx(r['overlap_achieved'])} of work per wall second and reached {fpct(r['bound_fraction'])} "
                 "of the bound.")
        if not nan(r["bound_fraction"]) and r["bound_fraction"] > 1:
            s.append(f"The speedup exceeds the overlap bound, so overlap alone does not explain it: '{ref}' spent "
                     f"{fsec(time_outside_work(base))} of its wall time outside generation and training (validation "
                     f"{fsec(base['time_validate_s'])}, weight sync {fsec(base['time_weight_sync_s'])}), "
                     f"{r['variant']} {fsec(time_outside_work(r))}.")
    s.append("Why: overlap hides the shorter side behind the longer one, so the bound is (T_gen + T_train) / "
             "max(T_gen, T_train) and approaches 2x only when both sides take equal time; weight syncs "
             "between processes, the one-version-behind wait, and (on CPU) the driver and Ray processes sharing the "
             "actors' cores eat "
             "into it, while every device is billed for the whole run.")
    return section("disagg", title, s, nums)


def versions_section(table: pd.DataFrame, versions: pd.DataFrame) -> dict:
    title = "Version logging: one-version-behind (seed 002 Problem 10)"
    dis = table[table["mode"] == "disaggregated"] if len(table) else table
    if not len(dis):
        return section("versions", title, ["No data: no disaggregated variant ran."])
    s, nums = [], {}
    for _, r in dis.iterrows():
        v = versions[versions["variant"] == r["variant"]] if len(versions) else versions
        lag = max_version_lag(v)
        n_gen, n_learn = int((v["who"] == "generator").sum()), int((v["who"] == "learner").sum())
        s.append(f"{r['variant']}: {n_learn} learner and {n_gen} generator version events logged; the generator's "
                 f"weights were at most {fnum(lag)} version(s) behind the learner's at any time (max staleness of "
                 f"the samples trained on: {fnum(r['staleness_max'])}).")
        nums[f"lag_{r['variant']}"] = lag
    return section("versions", title, s, nums)


def max_version_lag(versions: pd.DataFrame) -> float:
    """Largest gap, at any moment, between the learner's policy version and the one the
    generator holds (both sides' version logs replayed in time order; each starts at 0)."""
    if not len(versions) or not {"learner", "generator"} <= set(versions["who"]):
        return math.nan
    held = {"learner": 0, "generator": 0}
    lag = 0
    for _, e in versions.sort_values("wall_time", kind="stable").iterrows():
        held[e["who"]] = int(e["version"])
        lag = max(lag, held["learner"] - held["generator"])
    return float(lag)


def replay_section(table: pd.DataFrame) -> dict:
    title = "Replay buffer vs the standard disaggregated run (seed 002 Problem 11)"
    rep = first_row(table, table["replay"].astype(bool)) if has_columns(table, "replay") else None
    if rep is None:
        return section("replay", title, ["No data: no variant with train.replay.enabled ran."])
    base = first_row(table, (table["mode"] == "disaggregated") & ~table["replay"].astype(bool)
                     & (table["transport"] == rep["transport"]))
    s = [(f"{rep['variant']} reused each stored group {fnum(rep['replay_reuse_mean'])} times on average with a mean "
         f"sample age of {fnum(rep['replay_age_mean'])} policy versions (max staleness {fnum(rep['staleness_max'])}).")]
    if base is not None:
        caveat = contention_caveat(rep, base)
        speed = (f"throughput {caveat}" if caveat else
                 f"throughput {fnum(rep['samples_per_s'])} vs {fnum(base['samples_per_s'])} samples/s "
                 f"({single_runs(base['samples_per_s'], rep['samples_per_s']).clause()})")
        reward = single_runs(base["val_reward_final"], rep["val_reward_final"])
        s.append(f"Final / best validation reward: {rep['variant']} {fnum(rep['val_reward_final'])} / "
                 f"{fnum(rep['val_reward_best'])} vs {base['variant']} {fnum(base['val_reward_final'])} / "
                 f"{fnum(base['val_reward_best'])} ({reward.clause()}); {speed}.")
    else:
        s.append(f"No data: no disaggregated run without replay over {rep['transport']} (the replay run's baseline).")
    return section("replay", title, s, {"reuse": rep["replay_reuse_mean"], "age": rep["replay_age_mean"]})


# --------------------------------------------------------------------------- assembly


def discussion(table: pd.DataFrame, metrics: pd.DataFrame, versions: pd.DataFrame, sync: pd.DataFrame,
               reference: str, bench: dict | None = None, rollouts: pd.DataFrame | None = None) -> dict:
    rollouts = rollouts if rollouts is not None else pd.DataFrame(columns=["variant", "step", "reward"])
    return {"reference": reference, "sections": [sec for sec in [
        profiling_section(table, metrics, reference),
        rollouts_section(rollouts, table, reference),
        kl_section(table, metrics, reference),
        kstep_section(table, reference),
        disagg_section(table, reference),
        rdt_section(sync, table, timing_load((bench or {}).get("weight_sync"))),
        versions_section(table, versions),
        replay_section(table),
        bench_section(bench or {}),
        limits_section(bench or {}),
        trl_section(bench or {}),
        optimization_section(table, reference),
        provenance_section(table),
    ] if sec is not None]}  # None: a section with nothing to say in this run (TRL not installed)


def render_html(disc: dict) -> str:
    parts = [("<!doctype html><html><head><meta charset='utf-8'><style>body{font:14px sans-serif;"
             "max-width:60em}h3{margin-bottom:.2em}</style></head><body>"),
             ("<p><i>Every number on this page is computed by rlpipe.analysis.report_text from results/summary "
             f"(reference variant: {html.escape(str(disc.get('reference')))}); none is typed by hand. Each "
             "variant here is one run, so a gap between variants is a measurement, not a finding: findings need "
             "replicates, and the experiment family pages give them with their 95% intervals. The answers to the "
             "seed questions, question by question, open the report (its first section) and results/RESULTS.md."
             "</i></p>")]
    for sec in disc["sections"]:
        parts.append(f"<h3>{html.escape(sec['title'])}</h3>")
        parts += [f"<p>{html.escape(s)}</p>" for s in sec["sentences"]]
    parts.append("</body></html>\n")
    return "\n".join(parts)
