"""Figures of the report, drawn from ``results/summary`` (``rlpipe.analysis.aggregate``'s output).

``rlpipe plot KIND --summary results/summary --out results/figures/KIND.png``; ``KINDS`` maps each
kind of ``rlpipe.analysis.contract.FIGURES`` (exactly those, checked at import) to its function
``f(summary, out) -> list[str]``, which writes the file and returns the "no data" notes it drew.
Figure functions are registered with ``@figure(kind, ...)``, which owns the prologue and the
epilogue (new matplotlib figure, atomic PNG save, notes list); the function only draws its axes.
A panel whose data is missing (variant not run, column all NaN) is never left blank: it carries a
grey "no data: <why>" annotation, so a figure always says what it lacks.

Departures from the seeds: the seeds ask for plots, not their layout. We draw reward against both
steps and wall-clock time (seed 004), KL with the best growth fit overlaid (rlpipe.analysis.kl_text), a
Gantt timeline of the first steps (a whole run is too dense to read), and rollouts as an HTML table.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on workers; must precede pyplot
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from rlpipe import io
from rlpipe.analysis import contract
from rlpipe.analysis.contract import FIGURES, SUMMARY_FILES, phase_seconds_column
from rlpipe.analysis.findings import CONTENDED, single_runs
from rlpipe.analysis.frames import col
from rlpipe.analysis.kl_text import fit_growth
from rlpipe.analysis.summary_rows import contended, contention_caveat, row_of

STACK = (*contract.STACK_PHASES, contract.OTHER)
STEP_PHASES = contract.STEP_STACK_PHASES
PHASE_COLORS = {"generate": "#4c72b0", "score": "#8172b2", "ref_logprobs": "#ccb974", "old_logprobs": "#937860",
                "update": "#dd8452",
                "weight_sync": "#c44e52", "validate": "#55a868", "wait": "#bbbbbb", contract.OTHER: "#dddddd"}
TIMELINE_STEPS = 8

PlotFn = Callable[["Summary", "str | Path"], list[str]]
KINDS: dict[str, PlotFn] = {}  # kind -> function, filled by @figure / @register; == contract.FIGURES


@dataclass
class Summary:
    runs: pd.DataFrame
    metrics: pd.DataFrame
    events: pd.DataFrame
    versions: pd.DataFrame
    rollouts: pd.DataFrame
    weight_sync: pd.DataFrame

    @property
    def reference(self) -> str:
        ref = self.runs.attrs.get("reference") if len(self.runs) else None
        if ref:
            return ref
        names = list(self.runs["variant"]) if len(self.runs) else []
        return "onpolicy" if "onpolicy" in names or not names else names[0]

    def variants(self) -> list[str]:
        return list(self.runs["variant"]) if len(self.runs) else []

    def of(self, frame: str, variant: str) -> pd.DataFrame:
        df = getattr(self, frame)
        return df[df["variant"] == variant] if len(df) and "variant" in df.columns else df.iloc[0:0]


def load_summary(summary_dir: str | Path) -> Summary:
    d = Path(summary_dir)

    def read(key: str) -> pd.DataFrame:
        p = d / SUMMARY_FILES[key]
        return pd.read_parquet(p) if p.exists() else pd.DataFrame(columns=[contract.VARIANT_COLUMN])

    runs = read("runs")
    disc = d / SUMMARY_FILES["discussion_json"]
    if disc.exists():
        runs.attrs["reference"] = json.loads(disc.read_text()).get("reference")
    return Summary(runs, read("metrics"), read("events"), read("versions"), read("rollouts"), read("weight_sync"))


# --------------------------------------------------------------------------- helpers


def no_data(ax, why: str, notes: list[str]) -> None:
    """Mark a panel as empty on purpose: grey background and the reason, in the figure itself."""
    ax.set_facecolor("#f2f2f2")
    ax.text(0.5, 0.5, f"no data:\n{why}", ha="center", va="center", transform=ax.transAxes,
            fontsize=10, color="#555555", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    notes.append(why)


def colors(variants: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {v: cmap(i % 10) for i, v in enumerate(variants)}


def save(fig, out: str | Path) -> None:
    fig.tight_layout()
    with io.atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def register(kind: str) -> Callable[[PlotFn], PlotFn]:
    """Register ``fn(summary, out) -> notes`` as the function drawing ``kind`` (a contract figure)."""
    if kind not in FIGURES:
        raise KeyError(f"figure kind {kind!r} is not in rlpipe.analysis.contract.FIGURES")

    def deco(fn: PlotFn) -> PlotFn:
        if kind in KINDS:
            raise ValueError(f"figure kind {kind!r} registered twice")
        KINDS[kind] = fn
        return fn

    return deco


Layout = dict | Callable[["Summary"], dict]


def figure(kind: str, layout: Layout) -> Callable[[Callable], PlotFn]:
    """Register a matplotlib figure: ``draw(summary, axes, notes)`` draws into the axes of
    ``plt.subplots(**layout)`` (``layout`` may depend on the summary) and appends its "no data"
    notes; the wrapper makes the figure, saves it atomically as PNG and returns the notes."""
    if FIGURES[kind].ext != "png":
        raise ValueError(f"figure {kind!r} is declared .{FIGURES[kind].ext}, @figure draws PNG")

    def deco(draw: Callable) -> PlotFn:
        @functools.wraps(draw)
        def plot(s: Summary, out: str | Path) -> list[str]:
            notes: list[str] = []
            fig, axes = plt.subplots(**(layout(s) if callable(layout) else layout))
            try:
                draw(s, axes, notes)
                save(fig, out)
            finally:
                plt.close(fig)
            return notes

        return register(kind)(plot)

    return deco


def line_per_variant(ax, s: Summary, x: str, y: str, notes: list[str], what: str, **kw) -> int:
    """One line per variant of ``y`` against ``x`` (NaN rows dropped); returns lines drawn."""
    c = colors(s.variants())
    drawn = 0
    for v in s.variants():
        m = s.of("metrics", v)
        d = pd.DataFrame({"x": col(m, x), "y": col(m, y)}).dropna().sort_values("x")
        if len(d):
            ax.plot(d["x"], d["y"], marker="o" if len(d) < 30 else None, ms=3, color=c[v], label=v, **kw)
            drawn += 1
    if not drawn:
        no_data(ax, f"no variant has {what} ({y})", notes)
    return drawn


# --------------------------------------------------------------------------- reward and KL


@figure("reward_vs_step", {"figsize": (7, 4.2)})
def plot_reward_vs_step(s: Summary, ax, notes: list[str]) -> None:
    if line_per_variant(ax, s, "step", "reward/val_mean", notes, "validation reward"):
        ax.set(xlabel="optimizer step", ylabel="validation reward", title="Validation reward vs step")
        ax.legend(fontsize=8, ncol=2)
        ax.grid(alpha=0.3)


@figure("reward_vs_time", {"figsize": (7, 4.2)})
def plot_reward_vs_time(s: Summary, ax, notes: list[str]) -> None:
    if line_per_variant(ax, s, "wall_time", "reward/val_mean", notes, "validation reward"):
        ax.set(xlabel="wall-clock time (s since training start)", ylabel="validation reward",
               title="Validation reward vs wall-clock time")
        ax.legend(fontsize=8, ncol=2)
        ax.grid(alpha=0.3)


@figure("kl", {"ncols": 3, "figsize": (15, 4.2)})
def plot_kl(s: Summary, axes, notes: list[str]) -> None:
    panels = [("kl/ref_log_ratio", "KL(policy || reference), Eq. 8"),
              ("kl/prev_log_ratio", "KL(policy || previous step)")]
    for ax, (column, title) in zip(axes[:2], panels, strict=True):
        k3 = column.replace("log_ratio", "k3")
        drawn = line_per_variant(ax, s, "step", column, [], title)
        if not drawn:
            ax.cla()
            drawn = line_per_variant(ax, s, "step", k3, notes, title + " (log ratio or k3)")
            title += " (k3 estimator)"
        if drawn:
            ax.set(xlabel="optimizer step", ylabel="KL (nats per sequence)", title=title)
            ax.grid(alpha=0.3)
    _overlay_fit(axes[0], s)
    if line_per_variant(axes[2], s, "step", "reward/val_mean", notes, "validation reward"):
        axes[2].set(xlabel="optimizer step", ylabel="validation reward", title="Validation reward")
        axes[2].grid(alpha=0.3)
    handles, labels = axes[2].get_legend_handles_labels()
    if handles:
        axes[2].legend(handles, labels, fontsize=8, ncol=2)


def _overlay_fit(ax, s: Summary) -> None:
    m = s.of("metrics", s.reference)
    d = pd.DataFrame({"t": col(m, "step"), "y": col(m, "kl/ref_log_ratio")}).dropna()
    d = d[d["t"] > 0]
    fit = fit_growth(d["t"], d["y"])
    if not fit["best"]:
        return
    feature = {"linear": d["t"], "quadratic": d["t"] ** 2, "sqrt": np.sqrt(d["t"]), "exponential": d["t"]}[fit["best"]]
    if fit["best"] == "exponential":
        a, logb = np.polyfit(d["t"], np.log(d["y"]), 1)
        yhat = np.exp(logb + a * d["t"])
    else:
        a, b = np.polyfit(feature, d["y"], 1)
        yhat = a * feature + b
    ax.plot(d["t"], yhat, "k--", lw=1, label=f"{s.reference}: {fit['best']} fit (R²={fit['r2'][fit['best']]:.2f})")
    ax.legend(fontsize=8)


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


def _disagg_variant(s: Summary) -> str | None:
    r = s.runs
    if not len(r) or "mode" not in r.columns:
        return None
    dis = r[r["mode"] == "disaggregated"]
    plain = dis[~dis["replay"].astype(bool)] if "replay" in dis.columns else dis  # the plain one-behind run first
    names = list(plain["variant"]) + list(dis["variant"])
    return names[0] if names else None


def _replay_variant(s: Summary) -> str | None:
    r = s.runs
    if not len(r) or "replay" not in r.columns:
        return None
    names = list(r[r["replay"].astype(bool)]["variant"])
    return names[0] if names else None


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


MARK_CONTENDED = "contended"
MARK_UNREPLICATED = "n=1"


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
            by = sub["median_s"].groupby(sub["label"].astype(str)).median().sort_values()  # one bar per transport
            ax.bar(by.index, by.to_numpy() * 1e3, color=[_sync_color(k) for k in by.index])
            for i, val in enumerate(by.to_numpy()):
                ax.annotate(f"{val * 1e3:.3g} ms", (i, val * 1e3), ha="center", va="bottom", fontsize=8)
            ax.tick_params(axis="x", rotation=30)
        else:
            _latency_vs_payload(ax, sub)
        ax.set(ylabel="median sync latency (ms)", title=f"Weight sync: {title}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)


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


# --------------------------------------------------------------------------- async: versions and replay


def _disagg_variants(s: Summary) -> list[str]:
    r = s.runs
    return list(r[r["mode"] == "disaggregated"]["variant"]) if len(r) and "mode" in r.columns else []


@figure("versions", lambda s: {"ncols": max(len(_disagg_variants(s)), 1),
                               "figsize": (6 * max(len(_disagg_variants(s)), 1), 4), "squeeze": False})
def plot_versions(s: Summary, axes, notes: list[str]) -> None:
    """Policy version held by the learner and by the generator over time (step plots): the gap
    between the two staircases is the staleness the one-version-behind rule bounds."""
    names = _disagg_variants(s)
    if not names:
        no_data(axes[0][0], "no disaggregated variant ran", notes)
        return
    for ax, v in zip(axes[0], names, strict=True):
        vs = s.of("versions", v)
        if not len(vs):
            no_data(ax, f"no version log for {v}", notes)
            continue
        for who, color in (("learner", "#dd8452"), ("generator", "#4c72b0")):
            g = vs[vs["who"] == who].sort_values("wall_time")
            if len(g):
                ax.step(col(g, "wall_time"), col(g, "version"), where="post", color=color, label=who)
        ax.set(xlabel="seconds since training start", ylabel="policy version", title=f"{v}: version changes")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)


@figure("replay", {"ncols": 3, "figsize": (15, 4.2)})
def plot_replay(s: Summary, axes, notes: list[str]) -> None:
    rep, base = _replay_variant(s), _disagg_variant(s)
    m = s.of("metrics", rep) if rep else s.of("metrics", "")
    specs = [(axes[0], ("replay/age_mean", "replay/age_max"), "sample age (policy versions)"),
             (axes[1], ("replay/reuse_mean", "replay/size"), "reuse per group / buffer size (groups)")]
    for ax, columns, ylabel in specs:
        drawn = False
        for c in columns:
            d = pd.DataFrame({"x": col(m, "step"), "y": col(m, c)}).dropna()
            if len(d):
                ax.plot(d["x"], d["y"], label=c)
                drawn = True
        if not drawn:
            no_data(ax, "no variant with train.replay.enabled ran" if not len(m) else
                    f"{', '.join(columns)} all NaN", notes)
            continue
        ax.set(xlabel="optimizer step", ylabel=ylabel, title=f"{rep}: " + ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    drawn = []
    for v, color in ((rep, "#c44e52"), (base, "#4c72b0")):
        if v is None:
            continue
        m = s.of("metrics", v)
        d = pd.DataFrame({"x": col(m, "step"), "y": col(m, "reward/val_mean")}).dropna()
        if len(d):
            axes[2].plot(d["x"], d["y"], marker="o", ms=3, color=color, label=v)
            drawn.append(v)
    if drawn:  # the title names only the runs drawn, never "None vs ..."
        axes[2].set(xlabel="optimizer step", ylabel="validation reward", title=" vs ".join(drawn) + ": reward")
        axes[2].legend(fontsize=8)
        axes[2].grid(alpha=0.3)
    else:
        no_data(axes[2], "no replay or plain disaggregated run has validation rewards", notes)


# --------------------------------------------------------------------------- rollouts (HTML)


def rollouts_html(s: Summary) -> tuple[str, list[str]]:
    notes: list[str] = []
    order = [s.reference] + [v for v in s.variants() if v != s.reference]
    parts = [("<!doctype html><html><head><meta charset='utf-8'><style>body{font:13px sans-serif}"
             "table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;padding:3px 6px;"
             "vertical-align:top}td.r1{background:#e6f4e6}td.r0{background:#f8e6e6}</style></head><body>")]
    for v in order:
        r = s.of("rollouts", v)
        parts.append(f"<h3>{html.escape(v)}</h3>")
        if not len(r):
            parts.append(f"<p><i>no data: no example rollouts logged for {html.escape(v)}</i></p>")
            notes.append(f"no rollouts for {v}")
            continue
        first, last = int(r["step"].min()), int(r["step"].max())
        rows = ["<tr><th>when</th><th>step</th><th>prompt</th><th>response</th><th>keywords</th><th>reward</th></tr>"]
        for label, step in (("before (first logged step)", first), ("after (last step)", last)):
            for _, x in r[r["step"] == step].iterrows():
                ok = "r1" if x["reward"] > 0 else "r0"
                rows.append(f"<tr><td>{label}</td><td>{step}</td><td>{html.escape(str(x['prompt']))}</td>"
                            f"<td>{html.escape(str(x['response']))}</td><td>{html.escape(str(x['ground_truth']))}</td>"
                            f"<td class='{ok}'>{x['reward']:.2f}</td></tr>")
        parts.append("<table>" + "".join(rows) + "</table>")
    if not order or not len(s.rollouts):
        parts.append("<p><i>no data: no variant logged example rollouts</i></p>")
    parts.append("</body></html>\n")
    return "\n".join(parts), notes


@register("rollouts")
def plot_rollouts(s: Summary, out) -> list[str]:
    text, notes = rollouts_html(s)
    io.write_text(out, text)
    return notes


if set(KINDS) != set(FIGURES):  # the contract's figure list and the plot functions must agree
    raise ImportError(f"rlpipe.analysis.plots: no plot function for {sorted(set(FIGURES) - set(KINDS))}; "
                      f"not in contract.FIGURES: {sorted(set(KINDS) - set(FIGURES))}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe plot", description="Draw one report figure from results/summary.")
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("--summary", required=True, help="results/summary directory (rlpipe aggregate)")
    ap.add_argument("--out", required=True, help="output file (.png; .html for 'rollouts': contract.figure_file)")
    args = ap.parse_args(argv)
    runs = Path(args.summary) / SUMMARY_FILES["runs"]
    if not runs.exists():
        raise FileNotFoundError(f"--summary {args.summary}: {runs.name} missing (run `rlpipe aggregate` first)")
    notes = KINDS[args.kind](load_summary(args.summary), args.out)
    for n in notes:
        print(f"{args.kind}: no data: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
