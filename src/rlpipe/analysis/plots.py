"""Figures of the report, drawn from ``results/summary`` (``rlpipe.analysis.aggregate``'s output).

``rlpipe plot KIND --summary results/summary --out results/figures/KIND.png``; ``KINDS`` maps each
kind of ``rlpipe.contract.FIGURES`` (exactly those, checked at import) to its function
``f(summary, out) -> list[str]``, which writes the file and returns the "no data" notes it drew.
Figure functions are registered with ``@figure(kind, ...)`` (``rlpipe.analysis.figure_kit``, which
owns the prologue and the epilogue: new matplotlib figure, atomic PNG save, notes list); the function
only draws its axes. This module holds the reward, KL, async and rollout figures; the timing figures
are ``rlpipe.analysis.plots_systems``'s, imported here so that ``KINDS`` is complete.
A panel whose data is missing (variant not run, column all NaN) is never left blank: it carries a
grey "no data: <why>" annotation, so a figure always says what it lacks.

Departures from the seeds: the seeds ask for plots, not their layout. We draw reward against both
steps and wall-clock time (seed 004), KL with the best growth fit overlaid (rlpipe.analysis.kl_text), a
Gantt timeline of the first steps (a whole run is too dense to read), and rollouts as an HTML table.
"""

from __future__ import annotations

import argparse
import html
from pathlib import Path

import numpy as np
import pandas as pd

from rlpipe import io
from rlpipe.analysis.figure_kit import (
    KINDS,
    PHASE_COLORS,
    Summary,
    _disagg_variant,
    _replay_variant,
    colors,
    figure,
    line_per_variant,
    load_summary,
    marks_footnote,
    no_data,
    plt,
    register,
    run_marks,
    save,
)
from rlpipe.analysis.frames import col
from rlpipe.analysis.kl_text import fit_growth
from rlpipe.analysis.plots_systems import (
    MARK_CONTENDED,
    MARK_UNREPLICATED,
    bar_marks,
    plot_phase_breakdown,
    plot_phase_steps,
    plot_throughput,
    plot_timeline,
    plot_weight_sync,
)
from rlpipe.analysis.text_format import words
from rlpipe.contract import FIGURES, SUMMARY_FILES

__all__ = ["KINDS", "MARK_CONTENDED", "MARK_UNREPLICATED", "PHASE_COLORS", "Summary", "bar_marks", "colors",
           "line_per_variant", "load_summary", "main", "no_data", "plot_kl", "plot_phase_breakdown",
           "plot_phase_steps", "plot_replay", "plot_reward_vs_step", "plot_reward_vs_time", "plot_rollouts",
           "plot_throughput", "plot_timeline", "plot_versions", "plot_weight_sync", "plt", "rollouts_html", "save"]


# --------------------------------------------------------------------------- reward and KL


@figure("reward_vs_step", {"figsize": (7, 4.2)})
def plot_reward_vs_step(s: Summary, ax, notes: list[str]) -> None:
    if line_per_variant(ax, s, "step", "reward/val_mean", notes, "validation reward"):
        ax.set(xlabel="optimizer step", ylabel="validation reward", title="Validation reward vs step")
        ax.legend(fontsize=8, ncol=2)
        ax.grid(alpha=0.3)


@figure("reward_vs_time", {"figsize": (7, 4.6)})
def plot_reward_vs_time(s: Summary, ax, notes: list[str]) -> None:
    """Validation reward against wall time: a timing figure, so each run's line carries its mark
    (``figure_kit.run_marks``: dashed "contended", or "n=1"), as ``throughput.png``'s bars do."""
    marks = run_marks(s)
    if line_per_variant(ax, s, "wall_time", "reward/val_mean", notes, "validation reward", marks=marks):
        ax.set(xlabel="wall-clock time (s since training start)", ylabel="validation reward",
               title="Validation reward vs wall-clock time")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        marks_footnote(ax.figure, marks)


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
                            f"<td>{html.escape(str(x['response']))}</td><td>{html.escape(words(x['ground_truth']))}</td>"
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
