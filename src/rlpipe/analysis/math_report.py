"""``rlpipe math-report``: the MATH track's report pieces, from ``rlpipe eval`` outputs and math runs.

    rlpipe math-report --evals DIR [DIR ...] --labels NAME [NAME ...] \\
                       [--runs RUN_DIR [RUN_DIR ...] --run-labels NAME [NAME ...]] --out DIR

writes ``contract.MATH_REPORT_FILES`` under ``--out``:

- ``eval.html``: per evaluated model (``--labels``, e.g. ``base``, ``onpolicy (final)``) its n,
  accuracy, format rate and seed 001 Problem 1(b)'s category counts, then up to ``EXAMPLES_PER_CATEGORY``
  examples of each category (the first in dataset order: prompt tail, response, ground truth),
  HTML-escaped and truncated. The fourth category (format 0, answer 1) is shown only when it occurs.
- ``learning.png``: format reward and answer reward against optimizer step, train (thin) and
  validation (markers) per run, from each run's ``metrics.parquet``.
- ``math.json`` (keys ``contract.MATH_JSON_KEYS``): the numbers the report quotes.
  A run's final policy is matched to the eval labelled ``<run label> (final)`` (else the eval whose
  label is the run label, else one that starts with it); its accuracy is the run's
  ``final_eval_accuracy``.

Departures from the seeds, and why: seed 001 asks for commentary "including examples of each
category"; the page gives the examples and counts the commentary rests on, for every model
evaluated, not only the base. Seed 001 plots validation reward; we split it into format and answer
reward (the r1_zero reward is the answer reward, so the split shows whether RL first learns the
format). Runs written before the format/answer columns existed still draw: an answer column that
is missing falls back to ``reward/val_mean`` / ``reward/train_mean`` (equal to the answer reward
under r1_zero), a missing format column leaves a "no data" note (no other column measures it); the
figure and ``math.json``'s ``notes`` say which. Nothing here imports torch or Ray.
"""

from __future__ import annotations

import argparse
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on workers; must precede pyplot
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from rlpipe import io
from rlpipe.analysis.aggregate import AggregateError, load_run
from rlpipe.analysis.answers_math import EXAMPLES
from rlpipe.contract import (
    EVAL_CATEGORIES,
    EVAL_COLUMNS,
    EVAL_FILES,
    EVAL_SUMMARY_KEYS,
    MATH_JSON_KEYS,
    MATH_REPORT_FILES,
)

EXAMPLES_PER_CATEGORY = EXAMPLES  # seed 001 Problem 1(b) asks for at least 10 cases
PROMPT_TAIL_CHARS = 300
RESPONSE_CHARS = 800
CATEGORY_TEXT = {  # EVAL_CATEGORIES key -> how the page names it (seed 001 Problem 1(b)'s numbering)
    "format1_answer1": "(1) format 1, answer 1: correct",
    "format1_answer0": "(2) format 1, answer 0: well-formed, wrong answer",
    "format0_answer0": "(3) format 0, answer 0: no parsable answer",
    "format0_answer1": "format 0, answer 1 (the r1_zero grader cannot produce this)",
}
OPTIONAL_CATEGORIES = ("format0_answer1",)  # shown only when it occurs
#: learning.png panels: (panel title, train column, validation column, fallback or None).
#: Fallback columns are the plain reward, which is the answer reward under r1_zero.
PANELS = (
    ("format reward", "reward/format_mean", "reward/val_format_mean", None),
    ("answer reward", "reward/answer_mean", "reward/val_answer_mean", ("reward/train_mean", "reward/val_mean")),
)
VAL_ANSWER, VAL_FORMAT = PANELS[1][2], PANELS[0][2]
VAL_FALLBACK = PANELS[1][3][1]


class MathReportInputError(ValueError):
    """An eval directory or run directory is unusable; the message names the file or key."""


@dataclass
class EvalResult:
    label: str
    summary: dict[str, Any]
    examples: pd.DataFrame


# ----------------------------------------------------------------------------- inputs


def load_eval(directory: str | Path, label: str) -> EvalResult:
    """An ``rlpipe eval`` output directory; errors name the missing file, key or column."""
    d = Path(directory)
    paths = {k: d / name for k, name in EVAL_FILES.items()}
    for p in paths.values():
        if not p.is_file():
            raise MathReportInputError(f"eval {label!r}: {p} does not exist (run rlpipe eval --out {d})")
    try:
        summary = json.loads(paths["summary"].read_text())
    except json.JSONDecodeError as e:
        raise MathReportInputError(f"eval {label!r}: {paths['summary']} is not JSON ({e})") from None
    missing = [k for k in EVAL_SUMMARY_KEYS if k not in summary]
    if missing:
        raise MathReportInputError(f"eval {label!r}: {paths['summary']} lacks keys {missing}")
    examples = pd.read_parquet(paths["examples"])
    lacking = [c for c in EVAL_COLUMNS if c not in examples.columns]
    if lacking:
        raise MathReportInputError(f"eval {label!r}: {paths['examples']} lacks columns {lacking}")
    return EvalResult(label, summary, examples)


def load_metrics(run_dir: str | Path, label: str) -> pd.DataFrame:
    """The run's metrics, read by aggregation's reader (one copy of the checks: file and columns)."""
    try:
        return load_run(run_dir, label).metrics
    except AggregateError as e:
        raise MathReportInputError(f"run {label!r}: {e}") from None


# ----------------------------------------------------------------------------- eval.html


def _cut(text: str, limit: int, tail: bool = False) -> str:
    text = str(text)
    if len(text) <= limit:
        return html.escape(text)
    kept = text[-limit:] if tail else text[:limit]
    mark = f"[... {len(text) - limit} chars]"
    return html.escape(f"{mark} {kept}" if tail else f"{kept} {mark}")


def _pct(count: int, n: int) -> str:
    return f"{count} ({100 * count / n:.1f}%)" if n else str(count)


def eval_section(ev: EvalResult) -> str:
    """One model's HTML block: the summary table, then examples per category."""
    s, n = ev.summary, int(ev.summary["n"])
    shown = [c for c in EVAL_CATEGORIES if c not in OPTIONAL_CATEGORIES or s["categories"].get(c, 0)]
    rows = [("n", str(n)), ("accuracy (mean answer reward)", f"{s['accuracy']:.3f}"),
            ("format rate", f"{s['format_rate']:.3f}"),
            *((CATEGORY_TEXT[c], _pct(int(s["categories"].get(c, 0)), n)) for c in shown),
            ("max tokens / seed", f"{s['max_tokens']} / {s['seed']}"), ("checkpoint", str(s["checkpoint"]))]
    parts = [f"<h2>{html.escape(ev.label)}</h2>", "<table class='summary'>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows]
    parts.append("</table>")
    for c in shown:
        picked = ev.examples[ev.examples["category"] == c].head(EXAMPLES_PER_CATEGORY)
        parts.append(f"<h3>{html.escape(CATEGORY_TEXT[c])} ({len(picked)} of {s['categories'].get(c, 0)} shown)</h3>")
        if not len(picked):
            parts.append("<p><i>no example in this category</i></p>")
            continue
        parts.append("<table><tr><th>#</th><th>prompt (tail)</th><th>response</th><th>ground truth</th>"
                     "<th>finish</th></tr>")
        parts += [f"<tr><td>{int(r['index'])}</td><td>{_cut(r['prompt'], PROMPT_TAIL_CHARS, tail=True)}</td>"
                  f"<td>{_cut(r['response'], RESPONSE_CHARS)}</td><td>{_cut(r['ground_truth'], 200)}</td>"
                  f"<td>{html.escape(str(r['finish_reason']))}</td></tr>" for _, r in picked.iterrows()]
        parts.append("</table>")
    return "\n".join(parts)


def eval_html(evals: list[EvalResult]) -> str:
    style = ("<style>body{font-family:sans-serif;max-width:75em}table{border-collapse:collapse;margin:.5em 0}"
             "td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}"
             "td{white-space:pre-wrap;font-family:monospace;font-size:85%}table.summary td{font-family:inherit}"
             "</style>")
    body = "\n".join(eval_section(ev) for ev in evals) or "<p><i>no data: no eval given</i></p>"
    return f"<!doctype html><html><head><meta charset='utf-8'>{style}</head><body>\n{body}\n</body></html>\n"


# ----------------------------------------------------------------------------- learning.png


def _series(df: pd.DataFrame, column: str, fallback: str | None) -> tuple[pd.DataFrame, str | None]:
    """(step, value) rows where the value was measured, and the column actually read (None: none)."""
    for c in (column, fallback):
        if c and c in df.columns and df[c].notna().any():
            return df.loc[df[c].notna(), ["step", c]].rename(columns={c: "value"}), c
    return df.iloc[0:0][["step"]].assign(value=[]), None


def draw_learning(runs: dict[str, pd.DataFrame], out: str | Path) -> list[str]:
    """learning.png (see the module doc); returns the notes on missing columns drawn into it."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.2), squeeze=False)
    notes: list[str] = []
    for ax, (title, train_col, val_col, fallback) in zip(axes[0], PANELS, strict=True):
        panel_notes = []
        for i, (label, df) in enumerate(runs.items()):
            color = f"C{i % 10}"
            for col, fb, kind in ((train_col, fallback and fallback[0], "train"),
                                  (val_col, fallback and fallback[1], "val")):
                data, used = _series(df, col, fb)
                if used is None:
                    panel_notes.append(f"{label}: no {col}")
                    continue
                if used != col:
                    panel_notes.append(f"{label}: {col} missing, drew {used}")
                style = dict(marker="o", lw=1.8) if kind == "val" else dict(lw=0.8, alpha=0.6, ls="--")
                ax.plot(data["step"], data["value"], color=color, label=f"{label} {kind}", **style)
        if not runs:
            panel_notes.append("no runs given")
        if panel_notes:
            ax.text(0.02, 0.98, "no data / fallback:\n" + "\n".join(panel_notes), transform=ax.transAxes,
                    va="top", fontsize=7, color="#777777")
        notes += [f"{title}: {n}" for n in panel_notes]
        ax.set(title=title, xlabel="optimizer step", ylabel="mean reward", ylim=(-0.03, 1.03))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with io.atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return notes


# ----------------------------------------------------------------------------- math.json


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def run_numbers(df: pd.DataFrame) -> dict[str, Any]:
    """Validation points and initial/final/best validation answer reward of one run."""
    data, used = _series(df, VAL_ANSWER, VAL_FALLBACK)
    points = []
    for idx in data.index:
        row = df.loc[idx]
        points.append({"step": int(row["step"]), "wall_time_s": _num(row["wall_time"]),
                       "val_answer": _num(row[used]),
                       "val_format": _num(row[VAL_FORMAT]) if VAL_FORMAT in df.columns else None})
    values = [p["val_answer"] for p in points]
    best = max(range(len(points)), key=lambda i: values[i]) if points else None
    return {"val_column": used, "val_points": points,
            "initial_val_answer": values[0] if points else None, "final_val_answer": values[-1] if points else None,
            "best_val_answer": values[best] if best is not None else None,
            "best_step": points[best]["step"] if best is not None else None,
            "rise": values[-1] - values[0] if points else None,
            "final_step": int(df["step"].max()) if len(df) else None,
            "final_wall_time_s": _num(df["wall_time"].max()) if len(df) else None}


def final_eval_label(run_label: str, eval_labels: list[str]) -> str | None:
    """The eval of a run's final policy: ``<run> (final)``, else ``<run>``, else one starting with it."""
    for want in (f"{run_label} (final)", run_label):
        if want in eval_labels:
            return want
    return next((e for e in eval_labels if e.startswith(run_label + " ")), None)


def math_numbers(evals: list[EvalResult], runs: dict[str, pd.DataFrame], notes: list[str]) -> dict[str, Any]:
    by_label = {ev.label: ev.summary for ev in evals}
    base = by_label.get("base")
    if base is None:
        notes.append("no eval labelled 'base': base is null")
    out_runs = {}
    for label, df in runs.items():
        numbers = run_numbers(df)
        if numbers["val_column"] is None:
            notes.append(f"run {label!r}: no validation reward column ({VAL_ANSWER} or {VAL_FALLBACK})")
        elif numbers["val_column"] != VAL_ANSWER:
            notes.append(f"run {label!r}: {VAL_ANSWER} missing, used {numbers['val_column']}")
        final = final_eval_label(label, list(by_label))
        numbers["final_eval"] = final
        numbers["final_eval_accuracy"] = by_label[final]["accuracy"] if final else None
        out_runs[label] = numbers
    base_part = None if base is None else {k: base[k] for k in ("n", "accuracy", "format_rate", "categories")}
    result = {"base": base_part, "evals": by_label, "runs": out_runs, "notes": notes}
    return {k: result[k] for k in MATH_JSON_KEYS}


# ----------------------------------------------------------------------------- CLI


def build(evals: list[EvalResult], runs: dict[str, pd.DataFrame], out_dir: str | Path) -> dict[str, Any]:
    """Write the three MATH_REPORT_FILES; returns math.json's content."""
    out = Path(out_dir)
    io.write_text(out / MATH_REPORT_FILES["eval_html"], eval_html(evals))
    notes = [f"learning.png {n}" for n in draw_learning(runs, out / MATH_REPORT_FILES["learning_png"])]
    numbers = math_numbers(evals, runs, notes)
    io.write_json(out / MATH_REPORT_FILES["math_json"], numbers)
    return numbers


def _pairs(ap: argparse.ArgumentParser, dirs: list[str], labels: list[str], what: str) -> list[tuple[str, str]]:
    if len(dirs) != len(labels):
        ap.error(f"{len(dirs)} {what} directories but {len(labels)} labels: give one label each")
    if len(set(labels)) != len(labels):
        ap.error(f"{what} labels must be unique, got {labels}")
    return list(zip(dirs, labels, strict=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe math-report", description=__doc__.splitlines()[0])
    ap.add_argument("--evals", nargs="+", required=True, help="rlpipe eval output directories")
    ap.add_argument("--labels", nargs="+", required=True, help="one name per eval, e.g. base 'onpolicy (final)'")
    ap.add_argument("--runs", nargs="*", default=[], help="math run directories (metrics.parquet)")
    ap.add_argument("--run-labels", nargs="*", default=[], help="one name per run")
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    try:  # every input is read before anything is written
        evals = [load_eval(d, label) for d, label in _pairs(ap, a.evals, a.labels, "eval")]
        runs = {label: load_metrics(d, label) for d, label in _pairs(ap, a.runs, a.run_labels, "run")}
    except (MathReportInputError, OSError, ValueError) as e:
        ap.error(str(e))
    numbers = build(evals, runs, a.out)
    for note in numbers["notes"]:
        print(f"math-report: note: {note}")
    print(f"math-report: {len(evals)} evals, {len(runs)} runs -> {a.out}")
    return 0
