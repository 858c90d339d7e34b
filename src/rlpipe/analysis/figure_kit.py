"""The figure kit of the report's plots: the summary they read (``Summary``, ``load_summary``), the
registry of figure kinds (``KINDS``, ``register``, ``@figure``: new figure, atomic PNG save, notes
list) and the helpers every figure shares (``no_data``, ``colors``, ``line_per_variant``, which runs
a panel draws). ``rlpipe.analysis.plots`` and ``rlpipe.analysis.plots_systems`` hold the figures."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on workers; must precede pyplot
import matplotlib.pyplot as plt
import pandas as pd

from rlpipe import contract, io
from rlpipe.analysis.findings import INDICATIVE
from rlpipe.analysis.frames import col
from rlpipe.analysis.summary_rows import contended
from rlpipe.contract import FIGURES, SUMMARY_FILES

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


def save(fig, out: str | Path, rect: tuple | None = None) -> None:
    """Lay out (``rect``: the area the axes may take, leaving room for a footnote) and write the
    PNG atomically."""
    fig.tight_layout(rect=rect)
    with io.atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def register(kind: str) -> Callable[[PlotFn], PlotFn]:
    """Register ``fn(summary, out) -> notes`` as the function drawing ``kind`` (a contract figure)."""
    if kind not in FIGURES:
        raise KeyError(f"figure kind {kind!r} is not in rlpipe.contract.FIGURES")

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


#: Why a timing is no finding, as figures mark it (the report's honesty rule, ``rlpipe.analysis.findings``).
MARK_CONTENDED = "contended"
MARK_UNREPLICATED = "n=1"


def run_marks(s: Summary) -> dict[str, str]:
    """Per variant, how a timing figure marks its run: ``MARK_CONTENDED`` when it was timed under
    contention, else ``MARK_UNREPLICATED`` (each variant of the main comparison is one run)."""
    return {str(row["variant"]): MARK_CONTENDED if contended(row) else MARK_UNREPLICATED
            for row in (s.runs.to_dict("records") if len(s.runs) else [])}


def marks_footnote(fig, marks: dict[str, str] | list[str]) -> None:
    """The footnote that says what a figure's marks mean (only the marks it uses)."""
    used = set(marks.values() if isinstance(marks, dict) else marks)
    parts = ([f"dashed / hatched '{MARK_CONTENDED}': timed while other processes took the CPU ({INDICATIVE}, "
              "no conclusion)"] if MARK_CONTENDED in used else [])
    parts += ([f"'{MARK_UNREPLICATED}': one run, a measurement, not a finding (replicated comparisons: the "
               "systems family page)"] if MARK_UNREPLICATED in used else [])
    if parts:
        fig.text(0.5, 0.005, "; ".join(parts).capitalize() + ".", ha="center", fontsize=7, color="#555555")


def line_per_variant(ax, s: Summary, x: str, y: str, notes: list[str], what: str,
                     marks: dict[str, str] | None = None, **kw) -> int:
    """One line per variant of ``y`` against ``x`` (NaN rows dropped); returns lines drawn. With
    ``marks`` (``run_marks``), a timing figure's legend names each run's mark and a contended run's
    line is dashed."""
    c = colors(s.variants())
    drawn = 0
    for v in s.variants():
        m = s.of("metrics", v)
        d = pd.DataFrame({"x": col(m, x), "y": col(m, y)}).dropna().sort_values("x")
        if len(d):
            mark = (marks or {}).get(v, "")
            style = {"linestyle": "--"} if mark == MARK_CONTENDED else {}
            ax.plot(d["x"], d["y"], marker="o" if len(d) < 30 else None, ms=3, color=c[v],
                    label=f"{v} [{mark}]" if mark else v, **style, **kw)
            drawn += 1
    if not drawn:
        no_data(ax, f"no variant has {what} ({y})", notes)
    return drawn


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
