"""``rlpipe family-report``: one experiment family's report section, computed from its replicates.

A family (``rlpipe.config.FamilyConfig``) is a set of variants of one GRPO run,
each trained on ``replicates`` seeds. This module reads every replicate's run directory and writes
``results/families/<family>/report/`` (``rlpipe.contract.FAMILY_REPORT_FILES``):

- ``curves.png``: validation reward vs optimizer step and vs wall time, the mean over seeds with its
  95% band; with a sweep axis (``x``), the final reward against it.
- ``health.png``: the GRPO health signals (``contract.HEALTH_COLUMNS``: entropy, response length,
  grad norm, clip fraction, zero-std fraction, KL, format and answer reward) vs step, seed means,
  each run smoothed over the same number of steps whatever its logging cadence
  (``rlpipe.analysis.series``; ``curve_series`` and ``health_series`` are what the figures draw).
- ``discussion.html``, ``summary.csv``, ``family.json``: the per-variant table (mean ± CI) and a
  discussion whose every sentence is computed from it.

Nothing here knows a variant's name: the reference is the family's, the sweep axis is its ``x``.

Honesty rules, all computed (the verdicts are ``rlpipe.analysis.findings.is_finding``, the rule the
main discussion uses too; the numbers are ``rlpipe.analysis.family_data``'s):

- A reward difference between two variants is a finding only when its Welch 95% interval excludes
  0, a samples/s ratio only when its 95% interval (delta method on the log ratio) excludes 1
  (``rlpipe.analysis.stats``). With one replicate there is no such interval: the difference is
  called unreplicated and set against the validation sampling noise (binomial, ``val_size``
  prompts), a lower bound on seed-to-seed noise, and is never called a finding.
- A timing comparison draws no conclusion when any run in it was contended (its ``run_info``
  conditions, ``rlpipe.trainer.conditions``).
- Where the mechanism a family varies was inactive in its runs (the clip never bound, the reward
  saturated early, the response length never varied), the page says the comparison cannot answer
  its question here and names what would (``rlpipe.analysis.mechanism``).
- A variant "diverged" when its run did not finish, or its final validation reward fell below its
  initial one by more than the validation noise.

Departure from the seeds: seeds 001/004 ask for curves and 2-5 sentences per experiment; they do
not ask for replicates or intervals. The sentences here are templates filled with measured
numbers, so they stay true when the numbers change; the judgement a human writeup adds is left to
the reader, with the numbers to make it.
"""

from __future__ import annotations

import argparse
import html
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on workers; must precede pyplot
import matplotlib.pyplot as plt
import pandas as pd

from rlpipe import contract, io
from rlpipe.analysis.aggregate import AggregateError
from rlpipe.analysis.expectations import CADENCE_KEYS, expectation_sentences, flatten
from rlpipe.analysis.family_answer import answer
from rlpipe.analysis.family_data import (
    SMOOTH_STEPS,
    VAL,
    Family,
    comparison,
    diverged,
    health_numbers,
    load_family,
    start_end,
    stat,
    variant_numbers,
)
from rlpipe.analysis.findings import FINDING, NO_DATA, NOISE, UNREPLICATED, is_finding
from rlpipe.analysis.frames import col
from rlpipe.analysis.kl_text import kl_growth_sentence
from rlpipe.analysis.mechanism import mechanism_sentences, varied
from rlpipe.analysis.plots import no_data, save
from rlpipe.analysis.provenance import provenance_sentences
from rlpipe.analysis.series import band, replicate_frame, shared_steps
from rlpipe.analysis.stats import MeanCI, interval_phrase, welch_difference
from rlpipe.config import ConfigError

# --------------------------------------------------------------------------- sentences


def _signed(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:+.3f}"


def reward_sentences(fam: Family, comps: list[dict]) -> list[str]:
    finals = {v: stat(fam, v, "val_reward_final") for v in fam.variants}
    ranked = sorted((v for v in fam.variants if finals[v].n), key=lambda v: -finals[v].mean)
    out = [f"Final validation reward ({interval_phrase(finals[v].n for v in ranked)}): "
           + "; ".join(f"{v} {finals[v].fmt()}" for v in ranked) + "."]
    for c in comps:
        v = c["variant"]
        if c["reward_verdict"] == NO_DATA:
            out.append(f"{v} vs {fam.reference}: no final reward on one side, so no comparison.")
        elif c["reward_verdict"] == UNREPLICATED:
            size = "larger" if abs(c["reward_diff"]) > c["val_noise"] else "no larger"
            out.append(f"{v} vs {fam.reference}: {_signed(c['reward_diff'])}, unreplicated, so not a finding: it is "
                       f"{size} than the validation sampling noise alone (±{c['val_noise']:.3f}), which "
                       "understates the seed-to-seed noise.")
        else:
            lo, hi = c["reward_diff"] - c["reward_ci"], c["reward_diff"] + c["reward_ci"]
            out.append(f"{v} vs {fam.reference}: {_signed(c['reward_diff'])} [{lo:+.3f}, {hi:+.3f}], "
                       f"{c['reward_verdict']}.")
    div = {v: n for v in fam.variants if (n := sum(diverged(fam, r) for r in fam.of(v)))}
    if div:
        out.append("Diverged (did not finish, or ended below its initial reward beyond validation noise): "
                   + ", ".join(f"{v} ({n}/{len(fam.of(v))} seeds)" for v, n in div.items()) + ".")
    if fam.x and len(ranked) > 1:
        gap = is_finding(welch_difference(*(final_values(fam, v) for v in (ranked[-1], ranked[0]))))
        out.append(f"Along {fam.x}, the best final reward is at {fam.x}={fam.x_values.get(ranked[0])} "
                   f"({ranked[0]}), the worst at {fam.x}={fam.x_values.get(ranked[-1])} ({ranked[-1]}); "
                   f"the gap between them is {gap.clause()}.")
    return out


def final_values(fam: Family, variant: str) -> list[float]:
    return [r.row.get("val_reward_final", math.nan) for r in fam.of(variant)]


def health_sentences(fam: Family) -> list[str]:
    out = []
    for column, label in (("policy/entropy", "Entropy"), ("response/length_mean", "Response length"),
                          ("loss/clip_frac", "Clip fraction"), ("optim/grad_norm", "Grad norm")):
        parts = []
        for v in fam.variants:
            a, b = start_end(fam, v, column)
            if math.isfinite(a) and math.isfinite(b):
                parts.append(f"{v} {a:.3g}→{b:.3g}")
        if parts:
            out.append(f"{label}, first → last fifth of steps: " + ", ".join(parts) + ".")
    return out


def speed_sentences(fam: Family, comps: list[dict]) -> list[str]:
    """Samples/s against the reference (ratio of means with its delta-method interval; none for a
    contended or unreplicated comparison), and where each variant's step time goes."""
    if not comps:
        return []
    parts, shown = [], 0
    for c in comps:
        ratio = f"{c['speed_ratio']:.2f}x" if math.isfinite(c["speed_ratio"]) else "n/a"
        if math.isfinite(c["speed_ratio_lo"]) and c["speed_verdict"] in (FINDING, NOISE):
            ratio += f" [{c['speed_ratio_lo']:.2f}, {c['speed_ratio_hi']:.2f}]"
            shown += 1
        parts.append(f"{c['variant']} {ratio} ({c['speed_verdict']})")
    # "interval" only where one is printed: none for a contended or unreplicated comparison
    what = ("95% interval" if shown == len(parts) else "95% interval where one is shown" if shown
            else "one seed each, no interval" if max(len(fam.of(v)) for v in fam.variants) < 2
            else "no interval: none is drawn for a contended or unreplicated comparison")
    out = [f"Samples/s relative to {fam.reference} ({what}): " + "; ".join(parts) + "."]
    shares = [(v, stat(fam, v, "share_generate"), stat(fam, v, "share_update")) for v in fam.variants]
    shares = [(v, g, u) for v, g, u in shares if g.n and math.isfinite(g.mean)]
    if shares:
        ci = interval_phrase(g.n for _, g, _ in shares)
        out.append(f"Share of the driver's step time in generation / update ({ci}): "
                   + "; ".join(f"{v} {g.fmt('.2f')} / {u.fmt('.2f')}" for v, g, u in shares) + ".")
    return out


def kl_sentences(fam: Family) -> list[str]:
    """Each variant's KL drift, in a family that varies the KL penalty (seed 001 Problem 15)."""
    if "kl_coef" not in varied(fam):
        return []
    out = []
    for v in fam.variants:
        kl, val = (_band(fam, v, c).set_index("step")["mean"] for c in ("kl/ref_k3", VAL))
        if len(kl) and (s := kl_growth_sentence(v, kl, val)):
            out.append(s)
    return out


def discussion(fam: Family) -> tuple[list[dict], list[str]]:
    comps = [comparison(fam, v) for v in fam.variants if v != fam.reference and fam.of(v)]
    sentences = (reward_sentences(fam, comps) + mechanism_sentences(fam) + expectation_sentences(fam)
                 + health_sentences(fam))
    sentences += kl_sentences(fam) + speed_sentences(fam, comps)
    sentences += provenance_sentences(pd.DataFrame([r.row for r in fam.runs]), "runs of this family")
    return comps, sentences


# --------------------------------------------------------------------------- figures


def replicates(fam: Family, variant: str, column: str, first_step: int = 0) -> list[pd.DataFrame]:
    """Each replicate's logged (step, value, wall time) points of ``column`` from ``first_step`` on."""
    out = []
    for r in fam.of(variant):
        m = r.run.metrics
        m = m[m["step"] >= first_step]
        out.append(replicate_frame(m["step"], col(m, column), col(m, "wall_time")))
    return out


def _band(fam: Family, variant: str, column: str, smooth: int = 1, first_step: int = 0) -> pd.DataFrame:
    """Per step: the seed mean of ``column`` smoothed over ``smooth`` steps (not rows: runs that log
    at different cadences get the same window, ``rlpipe.analysis.series``), its 95% half-width and
    the mean wall time."""
    return band(replicates(fam, variant, column, first_step), smooth)


def curve_series(fam: Family) -> dict[str, pd.DataFrame]:
    """The validation-reward curve of each variant, as ``draw_curves`` draws it (no smoothing)."""
    return {v: d for v in fam.variants if len(d := _band(fam, v, VAL))}


def health_series(fam: Family) -> dict[tuple[str, str], pd.DataFrame]:
    """(health column, variant) -> the curve ``draw_health`` draws: optimizer steps >= 1, smoothed
    over ``SMOOTH_STEPS`` steps; where the variants log a column at different cadences (KL: every
    step with a penalty, every ``kl_monitor_every`` without), every variant at the steps all logged."""
    out = {}
    for c in contract.HEALTH_COLUMNS:
        reps = {v: replicates(fam, v, c, first_step=1) for v in fam.variants}
        shared = shared_steps(reps.values())
        for v, rs in reps.items():
            rs = rs if shared is None else [r[r["step"].isin(shared)] for r in rs]
            if len(d := band(rs, SMOOTH_STEPS)):
                out[(c, v)] = d
    return out


def _draw(ax, d: pd.DataFrame, x: str, color, label: str, marker: str | None = None) -> None:
    ax.plot(d[x], d["mean"], color=color, label=label, marker=marker, ms=3)
    band = d.dropna(subset=["half"])
    if len(band):
        ax.fill_between(band[x], band["mean"] - band["half"], band["mean"] + band["half"], color=color, alpha=0.2)


def draw_curves(fam: Family, out: str | Path, notes: list[str]) -> None:
    panels = 3 if fam.x else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    try:
        series = curve_series(fam)
        for i, v in enumerate(fam.variants):
            if v in series:
                d = series[v]
                _draw(axes[0], d, "step", f"C{i % 10}", f"{v} (n={len(fam.of(v))})", "o")
                _draw(axes[1], d, "t", f"C{i % 10}", v, "o")
        axes[0].set(title=f"{fam.name}: validation reward", xlabel="optimizer step", ylabel="mean reward")
        axes[1].set(title="vs wall-clock time", xlabel="seconds", ylabel="mean reward")
        if not axes[0].lines:
            for ax in axes[:2]:
                no_data(ax, f"no run of {fam.name} logged {VAL}", notes)
        else:
            axes[0].legend(fontsize=7)
        if fam.x:
            _draw_sweep(fam, axes[2], notes)
        save(fig, out)
    finally:
        plt.close(fig)


def _draw_sweep(fam: Family, ax, notes: list[str]) -> None:
    pts = [(fam.x_values[v], stat(fam, v, "val_reward_final"), v) for v in fam.variants
           if isinstance(fam.x_values.get(v), (int, float)) and stat(fam, v, "val_reward_final").n]
    if not pts:
        no_data(ax, f"no numeric {fam.x} with a final reward", notes)
        return
    pts.sort(key=lambda p: p[0])
    xs = [p[0] for p in pts]
    ax.errorbar(xs, [p[1].mean for p in pts], yerr=[0 if math.isnan(p[1].half) else p[1].half for p in pts],
                marker="o", capsize=3)
    if min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set(title=f"final reward vs {fam.x}", xlabel=fam.x, ylabel="final validation reward")


def draw_health(fam: Family, out: str | Path, notes: list[str]) -> None:
    columns = list(contract.HEALTH_COLUMNS.items())
    series = health_series(fam)
    fig, axes = plt.subplots(2, (len(columns) + 1) // 2, figsize=(4.2 * ((len(columns) + 1) // 2), 7))
    try:
        for ax, (column, label) in zip(axes.flat, columns, strict=False):
            for i, v in enumerate(fam.variants):
                if (column, v) in series:
                    _draw(ax, series[column, v], "step", f"C{i % 10}", v)
            ax.set(title=label, xlabel="optimizer step")
            if not ax.lines:
                no_data(ax, f"{column} not logged by {fam.name}'s runs", notes)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="upper right", fontsize=7)
        fig.suptitle(f"{fam.name}: seed means, each point the mean over the {SMOOTH_STEPS} optimizer steps up to it "
                     "(steps, not logged points); where variants log a metric at different cadences, all are "
                     "drawn at the steps every variant logged", fontsize=9)
        save(fig, out)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- pages


def table(fam: Family) -> pd.DataFrame:
    rows = [{"variant": v, **variant_numbers(fam, v)} for v in fam.variants]
    return pd.DataFrame(rows, columns=list(contract.FAMILY_TABLE_COLUMNS))


def _cell(row: pd.Series, key: str, spec: str) -> str:
    return MeanCI(row[f"{key}_mean"], row[f"{key}_ci"], int(row[f"{key}_n"])).fmt(spec)


def page(fam: Family, tab: pd.DataFrame, sentences: list[str], notes: list[str], prose: list[str] = ()) -> str:
    head = ["variant", *([fam.x] if fam.x else []), "seeds", "final val reward", "best val reward",
            "samples/s", "generate share", "update share", "diverged", "contended"]
    body = []
    for _, r in tab.iterrows():
        cells = [r["variant"] + (" (reference)" if r["variant"] == fam.reference else ""),
                 *([str(r["x"])] if fam.x else []), str(r["replicates"]), _cell(r, "val_reward_final", ".3f"),
                 _cell(r, "val_reward_best", ".3f"), _cell(r, "samples_per_s", ".1f"),
                 _cell(r, "share_generate", ".2f"), _cell(r, "share_update", ".2f"), str(r["diverged"]),
                 str(r["contended"])]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    parts = [f"<h2>Family {html.escape(fam.name)}</h2>",
             f"<p><b>Question.</b> {html.escape(fam.question or '(none given)')}</p>",
             "<table border=1 cellpadding=4 style='border-collapse:collapse'><tr>"
             + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(body) + "</table>",
             "<p>" + ("Intervals: Student t 95% over seeds; differences: Welch 95%." if fam.replicates >= 2 else
                      "One seed per variant: no interval over seeds; a difference is set against the "
                      "validation sampling noise, and is not replicated.") + "</p>",
             "<h3>Answer (computed)</h3><p>" + html.escape(" ".join(prose)) + "</p>",
             "<h3>Discussion (computed)</h3><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in sentences) + "</ul>"]
    if notes:
        parts.append("<p><i>Missing data: " + html.escape("; ".join(notes)) + "</i></p>")
    return "<html><body style='font-family:sans-serif;max-width:70em'>" + "".join(parts) + "</body></html>"


def build(fam: Family, out_dir: str | Path) -> dict:
    out = Path(out_dir)
    files = contract.FAMILY_REPORT_FILES
    notes: list[str] = []
    draw_curves(fam, out / files["curves"], notes)
    draw_health(fam, out / files["health"], notes)
    tab = table(fam)
    comps, sentences = discussion(fam)
    io.write_text(out / files["table"], tab.to_csv(index=False))
    numbers = {"family": fam.name, "question": fam.question, "reference": fam.reference, "x": fam.x,
               "replicates": fam.replicates,
               "variants": {r["variant"]: {**{k: r[k] for k in tab.columns if k != "variant"},
                                           "settings": scale_settings(fam, r["variant"])} for r in table_rows(tab)},
               "comparisons": comps, "sentences": sentences, "notes": notes, "health": health_numbers(fam)}
    numbers["answer"] = answer(numbers)
    io.write_text(out / files["discussion"], page(fam, tab, sentences, notes, numbers["answer"]))
    io.write_json(out / files["numbers"], numbers)
    return numbers


SCALE_KEYS = ("task", "n_grpo_steps", "rollout_batch_size", "group_size", "train_batch_size",
              "epochs_per_rollout_batch", "learning_rate", "val_size", "sampling_max_tokens")


def scale_settings(fam: Family, variant: str) -> dict:
    """The variant's settings a written answer quotes (its scale against the seeds' protocols, and
    the settings the family varies): ``family.json`` ``variants.<v>.settings``."""
    flat = flatten(fam.settings.get(variant, {}))
    others = [flatten(fam.settings.get(v, {})) for v in fam.variants]
    varied = {k for k in flat if len({repr(o.get(k)) for o in others}) > 1} - CADENCE_KEYS
    return {k: flat[k] for k in (*SCALE_KEYS, *sorted(varied)) if k in flat}


def table_rows(tab: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in tab.to_dict("records")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe family-report", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the pipeline config holding the families table")
    ap.add_argument("--family", required=True)
    ap.add_argument("--runs", nargs="+", required=True, help="replicate run directories")
    ap.add_argument("--variants", nargs="+", required=True, help="the variant of each run directory")
    ap.add_argument("--seeds", nargs="+", type=int, required=True, help="the seed of each run directory")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if not len(a.runs) == len(a.variants) == len(a.seeds):
        ap.error(f"--runs ({len(a.runs)}), --variants ({len(a.variants)}) and --seeds ({len(a.seeds)}) "
                 "must have the same length")
    try:
        fam = load_family(a.config, a.family, list(zip(a.variants, a.seeds, a.runs, strict=True)))
    except (ConfigError, AggregateError) as e:
        ap.error(str(e))
    numbers = build(fam, a.out)
    print("\n".join(numbers["sentences"]))
    return 0
