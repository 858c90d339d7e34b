"""Seed 003's toy-sorting grid (``rlpipe.tasks.sorting.experiment``): its table and figure.

Written under ``rlpipe toy-sort --out DIR`` (``rlpipe.contract.TOY_SORT_FILES``):

- ``curves.png``: mean sampled reward per epoch, one panel per loss mode, one line per delta mode
  (the seed mean, with its 95% band);
- ``table.csv`` / ``table.html``: the final exact expected reward per cell, mean ± 95% CI over
  seeds, and which cells are below the best beyond the Welch interval of the difference.
"""

from __future__ import annotations

import argparse
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on workers; must precede pyplot
import matplotlib.pyplot as plt
import pandas as pd

from rlpipe import io
from rlpipe.analysis.stats import mean_ci, welch_difference
from rlpipe.contract import TOY_SORT_DATA, TOY_SORT_FILES

LOSS_PANELS = ("no_baseline", "reinforce_with_baseline", "grpo_no_clip", "grpo_clip")


def summary_table(finals: pd.DataFrame) -> pd.DataFrame:
    """Per cell: mean ± CI of the final expected reward, and whether it is below the best cell
    beyond the Welch interval of the difference."""
    groups = {k: g["expected_reward"].tolist() for k, g in finals.groupby(["loss", "delta"], sort=False)}
    best = max(groups, key=lambda k: mean_ci(groups[k]).mean)
    rows = []
    for (loss, delta), values in groups.items():
        ci, diff = mean_ci(values), welch_difference(groups[best], values)
        rows.append({"loss": loss, "delta": delta, "seeds": ci.n, "final_mean": ci.mean, "final_ci": ci.half,
                     "vs_best": 0.0 if (loss, delta) == best else diff.diff,
                     "below_best": bool((loss, delta) != best and diff.exceeds)})
    return pd.DataFrame(rows)


def draw(curves: pd.DataFrame, out: str | Path) -> None:
    fig, axes = plt.subplots(1, len(LOSS_PANELS), figsize=(4.5 * len(LOSS_PANELS), 3.8), sharey=True)
    try:
        for ax, loss in zip(axes, LOSS_PANELS, strict=True):
            for i, delta in enumerate(curves["delta"].unique()):
                d = curves[(curves["loss"] == loss) & (curves["delta"] == delta)]
                if not len(d):
                    continue
                stats = [(e, mean_ci(g["reward"])) for e, g in d.groupby("epoch")]
                x = [e for e, _ in stats]
                m = pd.Series([c.mean for _, c in stats])
                h = pd.Series([c.half for _, c in stats]).fillna(0.0)
                ax.plot(x, m, color=f"C{i}", label=delta if loss != "no_baseline" else "raw rewards")
                ax.fill_between(x, m - h, m + h, color=f"C{i}", alpha=0.2)
            ax.set(title=loss, xlabel="epoch", ylabel="mean sampled reward")
            ax.legend(fontsize=7)
        fig.tight_layout()
        with io.atomic_path(out, suffix=".png") as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)


def table_html(tab: pd.DataFrame) -> str:
    best = tab.loc[tab["final_mean"].idxmax()]
    rows = "".join(
        f"<tr><td>{html.escape(r.loss)}</td><td>{html.escape(r.delta if r.loss != 'no_baseline' else '(raw rewards)')}"
        f"</td><td>{r.final_mean:.3f} ± {r.final_ci:.3f} (n={r.seeds})</td><td>{r.vs_best:+.3f}</td>"
        f"<td>{'yes' if r.below_best else 'no'}</td></tr>" for r in tab.itertuples())
    return ("<html><body style='font-family:sans-serif'><h3>Seed 003 toy sorting: final exact expected reward "
            "(max 5)</h3><table border=1 cellpadding=4 style='border-collapse:collapse'><tr><th>loss</th>"
            "<th>delta mode</th><th>mean ± 95% CI</th><th>vs best</th><th>below the best beyond the interval"
            f"</th></tr>{rows}</table><p>Best: {html.escape(best['loss'])} with {html.escape(best['delta'])} "
            f"({best['final_mean']:.3f}). Cells marked 'no' are within replicate noise of it.</p></body></html>")




def write(curves: pd.DataFrame, finals: pd.DataFrame, out: str | Path) -> pd.DataFrame:
    """Every TOY_SORT_FILES file under ``out``; returns the table."""
    tab = summary_table(finals)
    out = Path(out)
    draw(curves, out / TOY_SORT_FILES["curves"])
    io.write_text(out / TOY_SORT_FILES["table_csv"], tab.to_csv(index=False))
    io.write_text(out / TOY_SORT_FILES["table_html"], table_html(tab))
    return tab


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe toy-sort-report", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="holds the grid's data (TOY_SORT_DATA)")
    a = ap.parse_args(argv)
    paths = {k: Path(a.dir) / f for k, f in TOY_SORT_DATA.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        ap.error(f"missing {', '.join(missing)} (run `rlpipe toy-sort` first)")
    tab = write(pd.read_parquet(paths["curves"]), pd.read_parquet(paths["finals"]), a.dir)
    print(tab.to_string(index=False))
    return 0
