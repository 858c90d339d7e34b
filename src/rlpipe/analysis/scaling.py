"""``rlpipe scaling-report``: growth curves and exponents from ``rlpipe bench scaling``.

Reads results/bench/``SCALING_FILE`` (and, for the payload curve, the weight-sync bench JSON) and
writes ``SCALING_REPORT_FILES`` into ``--out``:

- ``scaling.png``: per axis (model parameters, rollout batch, response tokens) samples/s of both
  modes (top) and the per-step seconds of each phase (bottom), log-log; a fourth column has
  weight-sync latency and GB/s against payload bytes per transport;
- ``exponents.csv``: every curve's growth exponent b of y ~ x^b, the least-squares slope of
  log y on log x over its points (with 3 points it is a summary of the trend, not a law:
  the range it holds over is in the table);
- ``scaling.html``: sentences computed from the exponents, and every point's samples/s with its
  step's fractions of the shape and the device peak (``BENCH_PEAK_KEYS``; n/a in a JSON from
  before the bench measured them).

Every exponent is timing-derived, so every sentence carries the load its bench recorded and, when
contended by the training runs' rule (``rlpipe.analysis.findings.timing_load``: a point's own run
``conditions`` first), the mark "contended, indicative only"; in the figure a contended point is
drawn hollow and each point is one short run (n=1), as the figure's footnote says.

How to read an exponent: a phase whose seconds per step grow as batch^1 does work proportional to
the batch with no fixed cost; b < 1 means fixed per-step costs (Python, kernel launches, small
matrices that do not fill the machine) are still amortising; samples/s growing as batch^(1-b)
is the same fact seen from the throughput side.
"""

from __future__ import annotations

import argparse
import html
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from rlpipe import io
from rlpipe.analysis.aggregate import read_bench_weight_sync
from rlpipe.analysis.findings import INDICATIVE, TimingLoad, timing_load
from rlpipe.analysis.plots import no_data, save
from rlpipe.contract import (
    BENCH_PEAK_KEYS,
    SCALING_AXES,
    SCALING_PHASES,
    SCALING_REPORT_FILES,
    SCALING_TABLE_COLUMNS,
    SCALING_X,
    scaling_phase_key,
)

AXIS_LABEL = {"model": "parameters", "batch": "responses per rollout batch", "length": "response tokens"}
MODE_STYLE = {"colocated_sync": "-", "disaggregated": "--"}
QUANTITIES = ("samples_per_s", *(scaling_phase_key(p) for p in SCALING_PHASES))


def growth_exponent(xs, ys) -> float:
    """Slope b of log y = a + b log x by least squares over the positive, finite points (NaN when
    fewer than two distinct x remain)."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys, strict=True)
           if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)]
    if len({x for x, _ in pts}) < 2:
        return math.nan
    lx, ly = np.log([x for x, _ in pts]), np.log([y for _, y in pts])
    return float(np.polyfit(lx, ly, 1)[0])


def load_points(path: str | Path) -> pd.DataFrame:
    data = json.loads(Path(path).read_text())
    pts = pd.DataFrame(data.get("points") or [])
    need = {"mode", "axis", *SCALING_X.values(), "samples_per_s"}
    if pts.empty or not need <= set(pts.columns):
        raise ValueError(f"{path}: not an `rlpipe bench scaling` result (needs points with {sorted(need)})")
    pts["contended"] = [bool(timing_load({"conditions": c, "cpus": c.get("cpus")}).contended)
                        if isinstance(c, dict) else False for c in pts.get("conditions", [None] * len(pts))]
    return pts


def _row(mode, axis, quantity, xs, ys) -> dict:
    return {"mode": mode, "axis": axis, "quantity": quantity, "exponent": growth_exponent(xs, ys),
            "x_min": float(min(xs)), "x_max": float(max(xs)), "y_min": float(min(ys)), "y_max": float(max(ys)),
            "points": len(xs)}


def exponents(pts: pd.DataFrame, sync: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per curve: (mode, axis, quantity) of the bench, plus (transport, payload, latency)."""
    rows = []
    for (mode, axis), d in pts.groupby(["mode", "axis"], sort=False):
        d = d.sort_values(SCALING_X[axis])
        for q in QUANTITIES:
            if q in d and (d[q] > 0).sum() >= 2:
                rows.append(_row(mode, axis, q, d[SCALING_X[axis]].tolist(), d[q].tolist()))
    if sync is not None and len(sync):
        for label, d in sync.dropna(subset=["median_s", "bytes"]).groupby("label", sort=True):
            if d["bytes"].nunique() >= 2:
                d = d.sort_values("bytes")
                rows.append(_row(label, "payload", "sync_seconds", d["bytes"].tolist(), d["median_s"].tolist()))
    return pd.DataFrame(rows, columns=list(SCALING_TABLE_COLUMNS))


def _exp(tab: pd.DataFrame, mode: str, axis: str, q: str) -> float:
    r = tab[(tab["mode"] == mode) & (tab["axis"] == axis) & (tab["quantity"] == q)]
    return float(r["exponent"].iloc[0]) if len(r) else math.nan


def _fmt(b: float) -> str:
    return "n/a" if not math.isfinite(b) else f"{b:.2f}"


def sentences(tab: pd.DataFrame, pts: pd.DataFrame, load: TimingLoad | None = None,
              sync_load: TimingLoad | None = None) -> list[str]:
    """The exponents in words; each sentence ends with the load its bench recorded (``load`` for
    the training points, ``sync_load`` for the weight-sync payload curve)."""
    at = f" ({(load or TimingLoad(math.nan, 0, None)).clause()})"
    sync_at = f" ({(sync_load or TimingLoad(math.nan, 0, None)).clause()})"
    out = []
    gen, upd = scaling_phase_key("generate"), scaling_phase_key("update")
    for mode in pts["mode"].unique():
        parts = [f"{AXIS_LABEL[a]}^{_fmt(_exp(tab, mode, a, upd))} (update) and ^{_fmt(_exp(tab, mode, a, gen))} "
                 f"(generation)" for a in SCALING_AXES if a in set(pts["axis"])]
        out.append(f"{mode}: per-step time grows as " + "; as ".join(parts) + f"{at}.")
        b = _exp(tab, mode, "batch", "samples_per_s")
        if math.isfinite(b):
            verdict = ("so larger batches still amortise fixed per-step costs" if b > 0.1 else
                       "so throughput no longer improves with batch: the work is proportional to it")
            out.append(f"{mode}: samples/s grows as batch^{_fmt(b)}, {verdict}{at}.")
    for mode in pts["mode"].unique():
        g, u = _exp(tab, mode, "model", gen), _exp(tab, mode, "model", upd)
        if math.isfinite(g) and math.isfinite(u):
            slower = "generation" if g < u else "the update"
            out.append(f"{mode}: against model size, {slower} grows more slowly (exponent {_fmt(min(g, u))} vs "
                       f"{_fmt(max(g, u))}); an exponent under 1 means that phase is bound by per-token overhead "
                       f"rather than by FLOPs (which grow as parameters^1 at fixed depth and length){at}.")
    sync = tab[tab["axis"] == "payload"]
    for r in sync.itertuples():
        out.append(f"weight sync {r.mode}: latency grows as payload^{_fmt(r.exponent)} from "
                   f"{r.x_min / 1e6:.3g} MB to {r.x_max / 1e6:.3g} MB "
                   f"({r.y_min * 1e3:.3g} ms to {r.y_max * 1e3:.3g} ms); "
                   f"under 1 means a fixed per-sync cost still matters at the small end{sync_at}.")
    return out


def _panel(ax, pts: pd.DataFrame, axis: str, q: str, label: str, color, notes: list[str]) -> None:
    """One line per mode; a contended point (``pts["contended"]``) is drawn hollow, as the figure's
    footnote says."""
    for mode, d in pts[pts["axis"] == axis].groupby("mode", sort=False):
        d = d.sort_values(SCALING_X[axis])
        if q in d and (d[q] > 0).any():
            ax.plot(d[SCALING_X[axis]], d[q], MODE_STYLE.get(mode, ":"), color=color, label=f"{label} ({mode})")
            busy = d["contended"].astype(bool) if "contended" in d else pd.Series(False, index=d.index)
            ax.plot(d[SCALING_X[axis]][~busy], d[q][~busy], "o", color=color)
            if busy.any():
                ax.plot(d[SCALING_X[axis]][busy], d[q][busy], "o", color=color, markerfacecolor="none")


def footnote(pts: pd.DataFrame, load: TimingLoad, sync_load: TimingLoad | None) -> str:
    """The figure's footnote: the loads it was measured at, and what the marks mean."""
    text = f"Each point is one short run (n=1): a measurement, not a finding. Training points: {load.clause()}"
    if sync_load is not None:
        text += f"; weight-sync bench: {sync_load.clause()}"
    if "contended" in pts and pts["contended"].any():
        text += f". Hollow points: that run was contended ({INDICATIVE})"
    return text + "."


def draw(pts: pd.DataFrame, sync: pd.DataFrame | None, out: str | Path, load: TimingLoad | None = None,
         sync_load: TimingLoad | None = None) -> list[str]:
    notes: list[str] = []
    load = load or TimingLoad(math.nan, 0, None)
    if load.contended and "contended" in pts:  # a bench contended as a whole contends every point
        pts = pts.assign(contended=True)
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
    fig.text(0.5, 0.003, footnote(pts, load, sync_load if sync is not None else None), ha="center",
             fontsize=8, color="#555555")
    cmap = plt.get_cmap("tab10")
    try:
        for j, axis in enumerate(SCALING_AXES):
            top, bottom = axes[0, j], axes[1, j]
            if not (pts["axis"] == axis).any():
                no_data(top, f"no {axis} points in the bench", notes)
                no_data(bottom, f"no {axis} points in the bench", notes)
                continue
            _panel(top, pts, axis, "samples_per_s", "samples/s", "black", notes)
            top.set(title=f"samples/s vs {AXIS_LABEL[axis]}", ylabel="samples/s")
            for i, ph in enumerate(SCALING_PHASES):
                _panel(bottom, pts, axis, scaling_phase_key(ph), ph, cmap(i), notes)
            bottom.set(title=f"seconds per step vs {AXIS_LABEL[axis]}", ylabel="s / step",
                       xlabel=AXIS_LABEL[axis])
            for ax in (top, bottom):
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.grid(alpha=0.3, which="both")
                ax.legend(fontsize=7)
        _draw_sync(axes[0, 3], axes[1, 3], sync, notes, sync_load)
        save(fig, out, rect=(0, 0.03, 1, 1))  # room for the footnote
    finally:
        plt.close(fig)
    return notes


def _draw_sync(top, bottom, sync: pd.DataFrame | None, notes: list[str], load: TimingLoad | None) -> None:
    d = None if sync is None else sync.dropna(subset=["median_s", "bytes"])
    if d is None or d.empty:
        no_data(top, "no weight-sync bench JSON", notes)
        no_data(bottom, "no weight-sync bench JSON", notes)
        return
    for label, g in d.groupby("label", sort=True):
        g = g.sort_values("bytes")
        bottom.plot(g["bytes"] / 1e6, g["median_s"] * 1e3, marker="o", label=label)
        top.plot(g["bytes"] / 1e6, g["bytes"] / g["median_s"] / 1e9, marker="o", label=label)
    busy = f"\n({INDICATIVE})" if load is not None and load.contended else ""
    top.set(title=f"weight sync throughput vs payload{busy}", ylabel="GB/s")
    bottom.set(title="weight sync latency vs payload", ylabel="ms", xlabel="payload (MB)")
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)


def _frac(x) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def points_table(pts: pd.DataFrame, meta: dict) -> str:
    """Every point's samples/s and its step's two fractions of the chip (``BENCH_PEAK_KEYS``), with
    the peaks they divide by and the bench's note on the phases that have none."""
    shape, device = BENCH_PEAK_KEYS[:2]
    rows = "".join(
        f"<tr><td>{html.escape(str(r['mode']))}</td><td>{r['axis']}</td><td>{r[SCALING_X[r['axis']]]:.4g}</td>"
        f"<td>{r['samples_per_s']:.3g}</td><td>{_frac(r.get(shape))}</td><td>{_frac(r.get(device))}</td></tr>"
        for _, r in pts.iterrows())
    peaks = (f"shape peak {meta.get('shape_peak_gflops', 'n/a')} GFLOP/s (fp32, sides 256-1024); device peak "
             f"{meta.get('device_peak_tflops', 'n/a')} TFLOP/s ({meta.get('device_peak_dtype', 'n/a')})")
    none = "; ".join(f"{k}: {v}" for k, v in (meta.get("fraction_not_applicable") or {}).items())
    return ("<h4>Points: a step's useful FLOP/s as a fraction of the chip</h4>"
            f"<p>{html.escape(peaks)}.{' No FLOP fraction for ' + html.escape(none) + '.' if none else ''}</p>"
            "<table border=1 cellpadding=4 style='border-collapse:collapse'><tr><th>mode</th><th>axis</th><th>x</th>"
            f"<th>samples/s</th><th>{shape}</th><th>{device}</th></tr>" + rows + "</table>")


def page(tab: pd.DataFrame, text: list[str], meta: dict, notes: list[str], pts: pd.DataFrame | None = None) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(str(r.mode))}</td><td>{r.axis}</td><td>{r.quantity}</td><td>{_fmt(r.exponent)}</td>"
        f"<td>{r.x_min:.4g} to {r.x_max:.4g}</td><td>{r.points}</td></tr>" for r in tab.itertuples())
    center = ", ".join(f"{k} {v}" for k, v in (meta.get("center") or {}).items())
    cond = html.escape(f"{meta.get('steps')} optimizer steps per point, {meta.get('threads')} thread(s), centre "
                       f"point {center or 'n/a'}, {meta.get('seconds')} s in all")
    return ("<html><body style='font-family:sans-serif'><h3>Scaling: growth exponents (y ~ x^b)</h3>"
            + "".join(f"<p>{html.escape(s)}</p>" for s in text)
            + "<table border=1 cellpadding=4 style='border-collapse:collapse'><tr><th>mode / transport</th>"
              "<th>axis</th><th>quantity</th><th>exponent b</th><th>x range</th><th>points</th></tr>"
            + rows + "</table>"
            + (points_table(pts, meta) if pts is not None else "")
            + f"<p>Bench settings: {cond}.</p>"
            + "".join(f"<p><i>Empty panel: {html.escape(n)}</i></p>" for n in notes)
            + "</body></html>")


def write(bench: str | Path, weight_sync: str | Path | None, out: str | Path) -> pd.DataFrame:
    pts = load_points(bench)
    meta = json.loads(Path(bench).read_text())
    sync = read_bench_weight_sync(weight_sync) if weight_sync and Path(weight_sync).is_file() else None
    if sync is not None:
        sync = sync[sync["source"] == "bench"]
    tab = exponents(pts, sync)
    load = timing_load(meta)
    sync_load = timing_load(json.loads(Path(weight_sync).read_text())) if sync is not None else None
    out = Path(out)
    notes = draw(pts, sync, out / SCALING_REPORT_FILES["figure"], load, sync_load)
    text = sentences(tab, pts, load, sync_load)
    io.write_text(out / SCALING_REPORT_FILES["table"], tab.to_csv(index=False))
    io.write_text(out / SCALING_REPORT_FILES["discussion"], page(tab, text, meta, notes, pts))
    return tab


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe scaling-report", description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="rlpipe bench scaling's JSON")
    ap.add_argument("--weight-sync", default=None, help="rlpipe bench weight-sync's JSON (payload curve)")
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    if not Path(a.bench).is_file():
        ap.error(f"--bench: {a.bench} does not exist (run `rlpipe bench scaling` first)")
    try:
        tab = write(a.bench, a.weight_sync, a.out)
    except (ValueError, json.JSONDecodeError) as e:
        ap.error(str(e))
    print(tab.to_string(index=False))
    return 0
