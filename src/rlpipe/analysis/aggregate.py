"""Metrics aggregation: every run's outputs -> ``results/summary/`` (names: ``rlpipe.contract``).

``rlpipe aggregate --runs results/runs --out results/summary [--variants ...] [--reference onpolicy]
[--bench results/bench/weight_sync.json ...]`` writes

- ``metrics.parquet``, ``events.parquet``, ``versions.parquet``, ``rollouts.parquet``: the runs'
  files stacked, with a ``variant`` column first;
- ``runs.parquet`` / ``summary.csv`` / ``summary.html``: one row per variant (``summarize``; the HTML
  table is ``rlpipe.analysis.summary_table``'s);
- ``weight_sync.parquet``: median sync latency per transport, from the runs and the bench JSON
  (read by ``rlpipe.analysis.bench_read``);
- ``discussion.json`` / ``discussion.html``: the report's sentences, numbers computed from the
  above (``rlpipe.analysis.report_text``), opened, when a run calls for it, by a "Run health"
  section: each partial run, and each run whose validation reward did not rise beyond its noise
  with the signal that explains it (``rlpipe.analysis.flat_reward``).

A partial run is kept and flagged (``completeness``). The summary's quantities and how each is
computed (the seeds name the quantities, not their formulas): ``summarize``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from rlpipe import contract, io
from rlpipe.analysis import flat_reward, report_text
from rlpipe.analysis.bench_read import read_bench_any, read_bench_weight_sync, sync_label
from rlpipe.analysis.frames import col, last_valid
from rlpipe.analysis.provenance import provenance_stats
from rlpipe.analysis.summary_table import table_html
from rlpipe.analysis.text_format import section
from rlpipe.contract import (
    EVENT_COLUMNS,
    GEN_PHASES,
    PHASES,
    STACK_PHASES,
    SUMMARY_FILES,
    TRAIN_PHASES,
    VERSION_COLUMNS,
    WEIGHT_SYNC_COLUMNS,
    phase_seconds_column,
    phase_share_column,
)

# summary-table column -> the metrics column whose last value it reports
KL_FINAL_COLUMNS = {
    "kl_ref_final": "kl/ref_log_ratio",
    "kl_ref_k3_final": "kl/ref_k3",
    "kl_prev_final": "kl/prev_log_ratio",
    "kl_prev_k3_final": "kl/prev_k3",
}


class AggregateError(ValueError):
    """A run directory is missing a required file or has a malformed one (named in the message)."""


@dataclass
class RunData:
    """One run directory, read back (optional files become empty frames)."""

    variant: str
    metrics: pd.DataFrame
    events: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(EVENT_COLUMNS)))
    versions: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(VERSION_COLUMNS)))
    rollouts: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # the run's resolved config.yaml (its train section)


# --------------------------------------------------------------------------- reading


def _read_parquet(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=list(columns))
    return pd.read_parquet(path)


def load_run(run_dir: str | Path, variant: str | None = None) -> RunData:
    d = Path(run_dir)
    metrics_path = d / contract.METRICS_FILE
    if not metrics_path.exists():
        raise AggregateError(f"{metrics_path}: missing (did `rlpipe train` finish for this variant?)")
    metrics = pd.read_parquet(metrics_path)
    for name in ("step", "wall_time"):
        if name not in metrics.columns:
            raise AggregateError(f"{metrics_path}: required column '{name}' missing")
    info_path, rollouts_path = d / contract.RUN_INFO_FILE, d / contract.ROLLOUTS_FILE
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    rollouts = io.read_jsonl(rollouts_path) if rollouts_path.exists() else []
    config_path = d / contract.RUN_CONFIG_FILE
    config = (yaml.safe_load(config_path.read_text()) or {}) if config_path.exists() else {}
    return RunData(
        variant=variant or info.get("variant") or d.name,
        metrics=metrics.sort_values("step").reset_index(drop=True),
        events=_read_parquet(d / contract.EVENTS_FILE, EVENT_COLUMNS),
        versions=_read_parquet(d / contract.VERSIONS_FILE, VERSION_COLUMNS),
        rollouts=rollouts,
        info=info,
        config=config if isinstance(config, dict) else {},
    )


def load_runs(runs_dir: str | Path, variants: list[str] | None = None) -> list[RunData]:
    """The runs of ``variants`` (all run directories holding metrics.parquet when None)."""
    root = Path(runs_dir)
    if variants is None:
        variants = sorted(p.parent.name for p in root.glob(f"*/{contract.METRICS_FILE}"))
    return [load_run(root / v, v) for v in variants]


# --------------------------------------------------------------------------- per-run numbers


def reward_stats(metrics: pd.DataFrame) -> dict:
    val = col(metrics, "reward/val_mean")
    valid = val.dropna()
    best_idx = valid.idxmax() if len(valid) else None
    initial = metrics.loc[metrics["step"] == 0, "reward/val_mean"] if "reward/val_mean" in metrics else []
    return {
        "val_reward_initial": float(initial.iloc[0]) if len(initial) else math.nan,
        "val_reward_final": last_valid(val),
        "val_reward_best": float(valid.max()) if len(valid) else math.nan,
        "best_step": int(metrics.loc[best_idx, "step"]) if best_idx is not None else -1,
    }


def completeness(run: RunData) -> dict:
    """Steps the run recorded and planned, and whether it is partial: its run_info says
    ``finished: false``, it has no run_info at all, or it recorded fewer optimizer steps than its
    config's ``train.n_grpo_steps``. A partial run is kept, flagged in the table (``partial``,
    ``steps_done``, ``steps_planned``), in the health section and on stderr: its numbers cover only
    the steps it ran."""
    steps = col(run.metrics, "step")
    done = run.info.get("total_optimizer_steps")
    done = int(done) if isinstance(done, int) else (int(steps.max()) if steps.notna().any() else 0)
    planned = (run.info.get("config") or {}).get("n_grpo_steps") or (run.config.get("train") or {}).get("n_grpo_steps")
    planned = int(planned) if isinstance(planned, int) else -1
    partial = not run.info.get("finished", False) or (planned > 0 and done < planned)
    return {"steps_done": done, "steps_planned": planned, "partial": partial}


def partial_sentence(variant: str, c: dict, info: dict) -> str:
    why = ("it has no run_info.json (the run stopped before its end)" if not info else
           "its run_info says finished: false" if not info.get("finished", False) else "it stopped early")
    plan = f" of {c['steps_planned']}" if c["steps_planned"] > 0 else ""
    return (f"Partial run: {variant} recorded {c['steps_done']}{plan} optimizer steps ({why}); its numbers cover "
            "only those steps. Rerun it to completion (the workflow resumes it from its last checkpoint).")


def flat_diagnosis(run: RunData) -> flat_reward.Diagnosis | None:
    return flat_reward.diagnose(run.metrics, (run.config.get("train") or {}).get("val_size"))


def health_section(runs: list[RunData]) -> dict | None:
    """The "Run health" section: partial runs, then flat runs with their cause; None when neither."""
    sentences, numbers = [], {}
    for r in runs:
        c = completeness(r)
        if c["partial"]:
            sentences.append(partial_sentence(r.variant, c, r.info))
            numbers[f"{r.variant}/partial"] = c
    for r in runs:
        d = flat_diagnosis(r)
        if d is not None:
            sentences.append(d.sentence(r.variant))
            numbers[f"{r.variant}/flat_reward"] = d.to_json()
    return section("run_health", "Run health: partial runs and flat rewards", sentences, numbers) if sentences else None


def phase_seconds(run: RunData) -> dict[str, float]:
    """Total seconds per phase (every phase of ``contract.PHASES`` present) over optimizer steps >= 1. From
    the events; runs whose events are missing fall back to the metrics' per-step ``time/<phase>``
    columns."""
    ev = run.events
    if len(ev) and "step" in ev.columns:
        # step 0 is the initial validation (and initial KL) before the run's clock starts: not
        # part of wall_time_s, so not part of the phase totals either
        ev = ev[pd.to_numeric(ev["step"]) >= 1]
    if len(ev):
        dur = pd.to_numeric(ev["end"]) - pd.to_numeric(ev["start"])
        sums = dur.groupby(ev["phase"]).sum()
        return {p: float(sums.get(p, 0.0)) for p in PHASES}
    out = {}
    for p in PHASES:
        per_step = col(run.metrics, contract.metric_time_column(p))
        out[p] = float(per_step.sum()) if per_step.notna().any() else math.nan
    return out


def wall_and_samples(run: RunData) -> tuple[float, float]:
    wall = run.info.get("wall_time_s")
    samples = run.info.get("total_samples")
    if wall is None:
        wall = last_valid(col(run.metrics, "wall_time"))
    if samples is None:
        samples = last_valid(col(run.metrics, "samples"))
    return float(wall), float(samples)


def sync_stats(run: RunData) -> dict:
    sec = col(run.metrics, "sync/seconds").dropna()
    n_events = int((run.events["phase"] == "weight_sync").sum()) if len(run.events) else 0
    return {
        "sync_label": sync_label(run.info),
        "num_syncs": n_events or len(sec),
        "sync_median_s": float(sec.median()) if len(sec) else math.nan,
        "sync_bytes": last_valid(col(run.metrics, "sync/bytes")),
        "sync_gbps": float(col(run.metrics, "sync/gbps").median()),
    }


def conditions_stats(info: dict) -> dict:
    """The run's machine conditions (run_info ``conditions``, ``rlpipe.trainer.conditions``):
    the larger of the start / end load averages, the share of the CPUs other processes took, and
    whether the run was contended. NaN / False for a run that recorded none (older runs, or an
    attached cluster where other CPU time is not measured)."""
    cond = info.get("conditions") if isinstance(info.get("conditions"), dict) else {}

    def num(key):
        v = cond.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan

    loads = [x for x in (num("load_avg_start"), num("load_avg_end")) if not math.isnan(x)]
    return {"load_avg_max": max(loads) if loads else math.nan, "other_cpu_frac": num("other_cpu_frac"),
            "contended": cond.get("contended") is True}


def gpu_busy(info: dict) -> float:
    """NVML's busy fraction of the run's GPUs over its training loop (run_info ``gpu_busy``); NaN on
    CPU, where NVML could not be read, or for a run that recorded none."""
    v = (info.get("gpu_busy") or {}).get("busy_fraction") if isinstance(info.get("gpu_busy"), dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def overlap_numbers(phases: dict[str, float], wall: float) -> dict:
    t_gen = sum(phases.get(p, 0.0) or 0.0 for p in GEN_PHASES)
    t_train = sum(phases.get(p, 0.0) or 0.0 for p in TRAIN_PHASES)
    if max(t_gen, t_train) <= 0 or not wall > 0:
        return {"t_gen_s": t_gen, "t_train_s": t_train, "overlap_bound": math.nan, "overlap_achieved": math.nan}
    return {
        "t_gen_s": t_gen,
        "t_train_s": t_train,
        "overlap_bound": (t_gen + t_train) / max(t_gen, t_train),
        "overlap_achieved": (t_gen + t_train) / wall,
    }


def run_row(run: RunData) -> dict:
    """The summary-table row of one run (everything except the cross-run speedup)."""
    info = run.info
    wall, samples = wall_and_samples(run)
    phases = phase_seconds(run)
    mode = info.get("mode", "unknown")
    stack = sum(phases[p] for p in STACK_PHASES if not math.isnan(phases[p]))
    other = max(wall - stack, 0.0) if mode != "disaggregated" and wall > 0 else math.nan
    busy = stack + (0.0 if math.isnan(other) else other)
    devices = info.get("devices")
    row = {
        "variant": run.variant,
        "mode": mode,
        "device_type": info.get("device_type", "unknown"),
        "devices": float(devices) if devices is not None else math.nan,
        "k": float(info["k"]) if info.get("k") is not None else math.nan,
        "replay": bool(info.get("replay", False)),
        "kl_coef": float((info.get("config") or {}).get("kl_coef", math.nan)),
        "transport": info.get("transport") or "unknown",
        "finished": bool(info.get("finished", False)),
        **completeness(run),
        "flat_reward": getattr(flat_diagnosis(run), "cause", ""),
        **reward_stats(run.metrics),
        "wall_time_s": wall,
        "total_samples": samples,
        "samples_per_s": samples / wall if wall > 0 else math.nan,
        "device_hours": wall * float(devices) / 3600.0 if devices is not None else math.nan,
        **{phase_seconds_column(p): phases[p] for p in PHASES},
        phase_seconds_column(contract.OTHER): other,
        **{phase_share_column(p): (phases[p] / busy if busy > 0 else math.nan) for p in STACK_PHASES},
        phase_share_column(contract.OTHER): (other / busy if busy > 0 and not math.isnan(other) else math.nan),
        **sync_stats(run),
        **{k: last_valid(col(run.metrics, c)) for k, c in KL_FINAL_COLUMNS.items()},
        "staleness_max": float(col(run.metrics, "staleness/max").max()),
        "replay_reuse_mean": float(col(run.metrics, "replay/reuse_mean").mean()),
        "replay_age_mean": float(col(run.metrics, "replay/age_mean").mean()),
        **conditions_stats(info),
        **provenance_stats(info),
        "gpu_busy": gpu_busy(info),
    }
    row.update(overlap_numbers(phases, wall) if mode == "disaggregated" else
               {"t_gen_s": math.nan, "t_train_s": math.nan, "overlap_bound": math.nan,
                "overlap_achieved": math.nan})
    return row


def summarize(runs: list[RunData], reference: str = "onpolicy") -> pd.DataFrame:
    """One row per run; speedups are relative to ``reference`` (NaN when it did not run).

    Definitions (the seeds name the quantities, not their formulas; these are our choices):

    - final / best validation reward: the last / largest non-NaN ``reward/val_mean``.
    - throughput: ``total_samples / wall_time_s`` from run_info (metrics as fallback). The speedup
      versus the reference is the throughput ratio, which equals seed 000 Problem 7's
      ``sync_time / async_time`` when both consumed the same samples (``equal_samples``).
    - device-hours: ``wall_time_s * devices / 3600`` (GPU-hours when ``device_type`` is
      ``contract.DEVICE_GPU``, "gpu", as the drivers write it).
    - phase seconds: sums of the ``events`` durations per phase; ``wait`` (the driver blocked on a
      rollout batch) overlaps the actors' phases, so it is reported but is not part of the phase stack
      or the shares. Shares are of the stacked busy time; for colocated runs the rest of the wall time
      is ``other`` (driver overhead); disaggregated runs overlap phases, so their stack can exceed the
      wall time and ``other`` is NaN.
    - overlap bound (async runs): with T_gen = generate + score and T_train = ref_logprobs + update,
      ``(T_gen + T_train) / max(T_gen, T_train)`` is the best speedup perfect overlap of the two sides
      could give over running them back to back. ``overlap_achieved = (T_gen + T_train) / wall`` is what
      the run got, and ``bound_fraction = speedup_vs_ref / overlap_bound`` compares the measured speedup
      against the bound.
    - conditions: ``load_avg_max`` (larger of the 1-minute load averages at the start and end of
      training), ``other_cpu_frac`` (share of the machine's CPU time other processes took during the
      run) and ``contended`` (decided when the run was recorded, ``rlpipe.trainer.conditions``), from
      run_info ``conditions``; NaN / False for runs that recorded none.
    - weight-sync latency: the median of the per-step ``sync/seconds`` (robust to the first sync's
      warm-up), labelled ``transport[/backend]`` from run_info.
    """
    table = pd.DataFrame([run_row(r) for r in runs])
    if table.empty:
        return table
    ref = table[table["variant"] == reference]
    if len(ref):
        ref_sps = float(ref["samples_per_s"].iloc[0])
        ref_samples = float(ref["total_samples"].iloc[0])
        table["speedup_vs_ref"] = table["samples_per_s"] / ref_sps
        table["equal_samples"] = table["total_samples"] == ref_samples
    else:
        table["speedup_vs_ref"] = math.nan
        table["equal_samples"] = False
    table["bound_fraction"] = table["speedup_vs_ref"] / table["overlap_bound"]
    table.attrs["reference"] = reference
    return table


# --------------------------------------------------------------------------- combined frames


def stack_frames(runs: list[RunData], attr: str, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """The runs' ``attr`` frames stacked, with the variant column first."""
    v = contract.VARIANT_COLUMN
    frames = [getattr(r, attr).assign(**{v: r.variant}) for r in runs if len(getattr(r, attr))]
    if not frames:
        return pd.DataFrame(columns=[v, *columns])
    out = pd.concat(frames, ignore_index=True)
    return out[[v, *[c for c in out.columns if c != v]]]


def rollouts_frame(runs: list[RunData]) -> pd.DataFrame:
    rows = []
    for r in runs:
        for item in r.rollouts:
            gt = item.get("ground_truth")
            rows.append({"variant": r.variant, "step": int(item.get("step", -1)),
                         "version": int(item.get("version", -1)), "prompt": str(item.get("prompt", "")),
                         "response": str(item.get("response", "")), "reward": float(item.get("reward", math.nan)),
                         "ground_truth": gt if isinstance(gt, str) else json.dumps(gt)})
    return pd.DataFrame(rows, columns=list(contract.SUMMARY_ROLLOUT_COLUMNS))


# --------------------------------------------------------------------------- weight sync


def weight_sync_frame(runs: list[RunData], bench_files: list[str | Path]) -> pd.DataFrame:
    rows = []
    for r in runs:
        s = sync_stats(r)
        n = int(col(r.metrics, "sync/seconds").notna().sum())
        if n:
            rows.append({"source": "run", "variant": r.variant, "payload": "", "label": s["sync_label"],
                         "median_s": s["sync_median_s"], "n": n, "bytes": s["sync_bytes"],
                         "gbps": s["sync_gbps"], "note": ""})
    frames = [pd.DataFrame(rows, columns=list(WEIGHT_SYNC_COLUMNS))]
    for f in bench_files:
        p = Path(f)
        if p.name.startswith("weight_sync") and p.exists():
            frames.append(read_bench_weight_sync(p))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(WEIGHT_SYNC_COLUMNS))


# --------------------------------------------------------------------------- output


def write_summary(runs: list[RunData], out: str | Path, reference: str, bench_files: list) -> pd.DataFrame:
    out = Path(out)
    files = {k: out / f for k, f in (*SUMMARY_FILES.items(), *contract.SUMMARY_REPORT_FILES.items())}
    table = summarize(runs, reference)
    metrics = stack_frames(runs, "metrics")
    events = stack_frames(runs, "events", EVENT_COLUMNS)
    versions = stack_frames(runs, "versions", VERSION_COLUMNS)
    rollouts = rollouts_frame(runs)
    sync = weight_sync_frame(runs, bench_files)
    io.write_parquet(files["metrics"], metrics)
    io.write_parquet(files["events"], events)
    io.write_parquet(files["versions"], versions)
    io.write_parquet(files["rollouts"], rollouts)
    io.write_parquet(files["runs"], table)
    io.write_parquet(files["weight_sync"], sync)
    io.write_text(files["table_csv"], table.to_csv(index=False))
    io.write_text(files["table_html"], table_html(table))
    disc = report_text.discussion(table, metrics, versions, sync, reference, read_bench_any(bench_files), rollouts)
    health = health_section(runs)
    if health is not None:
        disc["sections"].insert(0, health)
    io.write_json(files["discussion_json"], disc)
    io.write_text(files["discussion_html"], report_text.render_html(disc))
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe aggregate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="directory holding one run directory per variant")
    ap.add_argument("--out", required=True, help="summary directory to write")
    ap.add_argument("--variants", nargs="*", default=None, help="variants to include (default: all runs)")
    ap.add_argument("--reference", default="onpolicy", help="baseline variant for speedups")
    ap.add_argument("--bench", nargs="*", default=[], help="bench JSON files (weight_sync*.json, sampler*.json)")
    args = ap.parse_args(argv)
    runs = load_runs(args.runs, args.variants)
    if not runs:
        raise AggregateError(f"--runs {args.runs}: no run directory with {contract.METRICS_FILE}")
    table = write_summary(runs, args.out, args.reference, [b for b in args.bench if Path(b).exists()])
    for r in runs:
        c = completeness(r)
        if c["partial"]:
            print(f"rlpipe aggregate: warning: {partial_sentence(r.variant, c, r.info)}", file=sys.stderr)
    print(table[["variant", "val_reward_final", "wall_time_s", "samples_per_s", "speedup_vs_ref"]].to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
