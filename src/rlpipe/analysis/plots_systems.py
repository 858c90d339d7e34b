"""The report's timing figures (seed 000 Problems 5, 7, 8 and 9): phase breakdown, per-step phase
times, the timeline, throughput and weight-sync latency. Registered in ``figure_kit.KINDS``;
``rlpipe.analysis.plots`` imports this module and checks the kinds against the contract.

Departures from the seeds: a Gantt timeline of the first steps (a whole run is too dense to read),
and throughput bars marked by the report's honesty rule (``bar_marks``): each variant is one run,
so no bar is drawn as if it were a finding.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rlpipe import contract
from rlpipe.analysis.figure_kit import (
    MARK_CONTENDED,
    MARK_UNREPLICATED,
    PHASE_COLORS,
    STACK,
    STEP_PHASES,
    TIMELINE_STEPS,
    Summary,
    _disagg_variant,
    colors,
    figure,
    no_data,
)
from rlpipe.analysis.findings import CONTENDED, INDICATIVE, single_runs
from rlpipe.analysis.frames import col
from rlpipe.analysis.summary_rows import contended, contention_caveat, row_of
from rlpipe.contract import SUMMARY_FILES, phase_seconds_column

# --------------------------------------------------------------------------- profiling


@figure("phase_breakdown", lambda s: {"figsize": (9, 0.5 * max(len(s.variants()), 3) + 1.5)})
def plot_phase_breakdown(s: Summary, ax, notes: list[str]) -> None:
    """Stacked phase seconds per variant, with each run's wall time as a black tick: a stack
    longer than the tick is overlap (disaggregated runs), a shorter one is driver overhead."""
    r = s.runs
    cols = [phase_seconds_column(p) for p in STACK]
    if not len(r) or all(col(r, c).isna().all() for c in cols):
        no_data(ax, f"no phase timings in results/summary/{SUMMARY_FILES['runs']}", notes)
        return
    y = np.arange(len(r))
    left = np.zeros(len(r))
    for p, c in zip(STACK, cols, strict=True):
        w = col(r, c).fillna(0.0).to_numpy()
        if w.any():
            ax.barh(y, w, left=left, color=PHASE_COLORS[p], label=p)
            left += w
    ax.scatter(col(r, "wall_time_s"), y, marker="|", s=400, color="k", label="wall time", zorder=3)
    ax.set_yticks(y, r["variant"])
    ax.invert_yaxis()
    ax.set(xlabel="seconds", title="Time per phase (stacked) vs wall time")
    ax.legend(fontsize=8, ncol=8, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(r) < 5 else -0.15))
    ax.grid(axis="x", alpha=0.3)


@figure("phase_steps", {"ncols": 2, "figsize": (13, 4.2), "sharey": True})
def plot_phase_steps(s: Summary, axes, notes: list[str]) -> None:
    """Per-step phase seconds (stacked areas) for the reference and the disaggregated run."""
    for ax, v in zip(axes, [s.reference, _disagg_variant(s)], strict=True):
        m = s.of("metrics", v) if v else s.metrics.iloc[0:0]
        m = m[col(m, "step") > 0] if len(m) else m
        series = {p: col(m, contract.metric_time_column(p)).fillna(0.0) for p in STEP_PHASES}
        if v is None or not len(m) or all(not x.any() for x in series.values()):
            no_data(ax, f"no per-step phase times for {v or 'a disaggregated variant'}", notes)
            continue
        ax.stackplot(col(m, "step"), *series.values(), labels=STEP_PHASES,
                     colors=[PHASE_COLORS[p] for p in STEP_PHASES])
        ax.set(xlabel="optimizer step", ylabel="seconds in step", title=f"{v}: phase time per step")
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)


@figure("timeline", {"nrows": 2, "figsize": (12, 6.5)})
def plot_timeline(s: Summary, axes, notes: list[str]) -> None:
    """Gantt chart of the first TIMELINE_STEPS steps' events: one lane per actor."""
    for ax, v in zip(axes, [s.reference, _disagg_variant(s)], strict=True):
        ev = s.of("events", v) if v else s.events.iloc[0:0]
        if len(ev):
            ev = ev[(col(ev, "step") >= 1) & (col(ev, "step") <= TIMELINE_STEPS)]
        if v is None or not len(ev):
            no_data(ax, f"no profiling events for {v or 'a disaggregated variant'}", notes)
            continue
        lanes = sorted(ev["actor"].astype(str).unique())
        for phase, g in ev.groupby("phase"):
            lane = g["actor"].astype(str).map(lanes.index)
            ax.barh(lane, col(g, "end") - col(g, "start"), left=col(g, "start"), height=0.6,
                    color=PHASE_COLORS.get(str(phase), "#999999"), label=str(phase), edgecolor="white", lw=0.3)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set(xlabel="seconds since training start",
               title=f"{v}: generation, training and weight sync, steps 1-{TIMELINE_STEPS}")
        ax.legend(fontsize=8, ncol=7, loc="upper right")
        ax.grid(axis="x", alpha=0.3)


# --------------------------------------------------------------------------- throughput and sync


def _bars(ax, r: pd.DataFrame, column: str, title: str, notes: list[str], fmt: str = "{:.2f}",
          marks: list[str] | None = None) -> None:
    """One bar per variant; ``marks`` (from ``bar_marks``) hatch a bar and name why it is no finding."""
    vals = col(r, column)
    if not len(r) or vals.isna().all():
        no_data(ax, f"{column} not measured", notes)
        return
    c = colors(list(r["variant"]))
    marks = marks or [""] * len(r)
    bars = ax.bar(r["variant"], vals.fillna(0.0), color=[c[v] for v in r["variant"]])
    for i, (bar, val, mark) in enumerate(zip(bars, vals, marks, strict=True)):
        if mark:
            bar.set_hatch("//" if mark == MARK_CONTENDED else "..")
            bar.set_alpha(0.55)
        text = "n/a" if math.isnan(val) else fmt.format(val)
        ax.annotate(text + (f"\n{mark}" if mark else ""), (i, 0 if math.isnan(val) else val),
                    ha="center", va="bottom", fontsize=7 if mark else 8)
    ax.margins(y=0.15)  # room for the labels above the tallest bar
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=45)
    ax.grid(axis="y", alpha=0.3)


def bar_marks(r: pd.DataFrame, reference: str) -> list[str]:
    """Per row of the summary table, why its comparison with the reference is no finding, by the
    report's one honesty rule (``rlpipe.analysis.findings``): ``MARK_CONTENDED`` when it or the
    reference was timed under contention, ``MARK_UNREPLICATED`` for a single run, '' for the
    reference itself when uncontended (nothing to compare)."""
    base = row_of(r, reference)
    out = []
    for _, row in r.iterrows():
        row = row.to_dict()
        busy = bool(contention_caveat(row, base)) if row["variant"] != reference else contended(row)
        if row["variant"] == reference and not busy:
            out.append("")
            continue
        verdict = single_runs(1.0, row.get("speedup_vs_ref", math.nan), busy)
        out.append(MARK_CONTENDED if verdict.reason == CONTENDED else
                   "" if verdict else MARK_UNREPLICATED)
    return out


@figure("throughput", {"ncols": 3, "figsize": (15, 4.8)})
def plot_throughput(s: Summary, axes, notes: list[str]) -> None:
    """Samples/s, speedup and device-hours per variant. Each variant is one run, so every bar but the
    reference's is marked: hatched "contended" (timed while other processes took the CPU: no
    conclusion) or dotted "n=1" (unreplicated: a measurement, not a finding)."""
    r = s.runs
    marks = bar_marks(r, s.reference) if len(r) and "variant" in r.columns else None
    _bars(axes[0], r, "samples_per_s", "samples / s", notes, marks=marks)
    _bars(axes[1], r, "speedup_vs_ref", f"speedup vs {s.reference} (x)", notes, marks=marks)
    if len(r) and col(r, "speedup_vs_ref").notna().any():
        axes[1].axhline(1.0, color="k", lw=0.8)
        bound = col(r, "overlap_bound")
        if bound.notna().any():
            axes[1].scatter(r["variant"][bound.notna()], bound.dropna(), marker="_", s=500, color="k",
                            label="overlap bound", zorder=3)
            axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    unit = contract.device_hours_unit(r["device_type"] if "device_type" in r.columns else ())
    _bars(axes[2], r, "device_hours", f"{unit} (wall x devices)", notes, "{:.3g}", marks=marks)
    if marks and any(marks):
        axes[1].figure.text(0.5, 0.005, "Hatched //: contended, no conclusion. Dotted: n=1, one run, a measurement "
                            "not a finding (replicated comparisons: the systems family page).", ha="center",
                            fontsize=8, color="#555555")


@figure("weight_sync", {"ncols": 2, "figsize": (12, 4.2)})
def plot_weight_sync(s: Summary, axes, notes: list[str]) -> None:
    """Left: median sync latency per transport in the training runs (bars). Right: the benchmark's
    latency against payload size per transport, memcpy included (log-log lines: the sweep's slope
    and each transport's distance from the memcpy bound are what matter, not single bars)."""
    w = s.weight_sync
    for ax, source, title in zip(axes, ("run", "bench"), ("measured in training runs", "benchmark, by payload"),
                                 strict=True):
        has = len(w) and "source" in w.columns
        sub = w[(w["source"] == source) & col(w, "median_s").notna()] if has else w.iloc[0:0]
        if not len(sub):
            no_data(ax, f"no weight-sync latency {title}", notes)
            continue
        if source == "run":
            _run_sync_bars(ax, sub, s.runs)
        else:
            _latency_vs_payload(ax, sub)
        ax.set(ylabel="median sync latency (ms)", title=f"Weight sync: {title}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)


def sync_marks(sub: pd.DataFrame, runs: pd.DataFrame) -> pd.Series:
    """Per transport label of the in-run sync latencies, its mark by the report's honesty rule:
    ``MARK_CONTENDED`` when any run behind it was timed under contention, else ``MARK_UNREPLICATED``
    when one run measured it (a transport over two or more runs is unmarked)."""
    out = {}
    for label, g in sub.groupby(sub["label"].astype(str)):
        variants = [str(v) for v in g["variant"].unique()] if "variant" in g.columns else []
        busy = any(contended(row_of(runs, v)) for v in variants)
        out[label] = MARK_CONTENDED if busy else MARK_UNREPLICATED if len(variants) < 2 else ""
    return pd.Series(out, dtype=object)


def _run_sync_bars(ax, sub: pd.DataFrame, runs: pd.DataFrame) -> None:
    """One bar per transport (median over its runs), hatched "contended" or dotted "n=1" as
    ``throughput.png``'s bars are."""
    by = sub["median_s"].groupby(sub["label"].astype(str)).median().sort_values()
    marks = sync_marks(sub, runs).reindex(by.index).fillna("")
    bars = ax.bar(by.index, by.to_numpy() * 1e3, color=[_sync_color(k) for k in by.index])
    for i, (bar, val, mark) in enumerate(zip(bars, by.to_numpy(), marks, strict=True)):
        if mark:
            bar.set_hatch("//" if mark == MARK_CONTENDED else "..")
            bar.set_alpha(0.55)
        ax.annotate(f"{val * 1e3:.3g} ms" + (f"\n{mark}" if mark else ""), (i, val * 1e3), ha="center",
                    va="bottom", fontsize=8)
    ax.tick_params(axis="x", rotation=30)
    if (marks == MARK_CONTENDED).any():
        ax.set_xlabel(f"hatched //: contended ({INDICATIVE})", fontsize=8)


# object-store paths the weight-sync bench measures only for comparison (the trainer never uses them)
BASELINE_SYNC_PATHS = ("object_store/packed", "object_store/tensors")


def _sync_color(label: str) -> str:
    return "#7f7f7f" if "memcpy" in label else "#c44e52" if "rdt" in label else "#4c72b0"


def _latency_vs_payload(ax, bench: pd.DataFrame) -> None:
    """One line per transport label: median latency (ms) against payload bytes, log-log."""
    bench = bench[col(bench, "bytes") > 0]
    markers = "osD^vx*"
    for i, (label, g) in enumerate(bench.groupby(bench["label"].astype(str))):
        g = g.sort_values("bytes")
        baseline = label.split("@")[0] in BASELINE_SYNC_PATHS  # dashed: the bench's comparison paths
        style = {"linestyle": ":" if "memcpy" in label else "--" if baseline else "-", "color": _sync_color(label)}
        ax.plot(g["bytes"] / 1e6, g["median_s"] * 1e3, marker=markers[i % len(markers)], label=label, **style)
    ax.set_xscale("log")
    ax.set_xlabel("payload (MB)")
    ax.legend(fontsize=7)
