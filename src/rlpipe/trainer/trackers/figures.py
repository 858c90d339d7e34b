"""The run's figures for the trackers: ``<run>/trackers/curves.png``, made once at the end of a run.

Three panels from the run's own metric rows: reward (train and validation means), the KL to the
reference (k3) and seconds per optimizer step (from the rows' wall times). The report's figures
compare runs and come later, from other jobs; this one is the run alone, beside its numbers in the
tracker. It is drawn on a tracker's thread (the first that asks; the others reuse the file), never
in the training loop. Needs only matplotlib (a core dependency), with the Agg backend.
"""

from __future__ import annotations

import math
import numbers
import threading
from pathlib import Path

from rlpipe import io

TRACKER_DIR = "trackers"
CURVES_FILE = "curves.png"
_lock = threading.Lock()


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(int(r["step"]), float(r[key])) for r in rows
           if isinstance(r.get(key), numbers.Real) and math.isfinite(float(r[key]))]
    return [s for s, _ in pts], [v for _, v in pts]


def _step_seconds(rows: list[dict]) -> tuple[list[int], list[float]]:
    steps, walls = _series(sorted(rows, key=lambda r: int(r["step"])), "wall_time")
    pairs = list(zip(steps, walls, strict=True))
    return ([b[0] for a, b in zip(pairs, pairs[1:], strict=False) if b[0] == a[0] + 1],
            [b[1] - a[1] for a, b in zip(pairs, pairs[1:], strict=False) if b[0] == a[0] + 1])


def run_figures(run_dir: str | Path, rows: list[dict]) -> list[Path]:
    """Draw the run's curves once into ``<run>/trackers/`` and return their paths."""
    out = Path(run_dir) / TRACKER_DIR / CURVES_FILE
    with _lock:
        if out.is_file():
            return [out]
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for key, label in (("reward/train_mean", "train"), ("reward/val_mean", "validation")):
            axes[0].plot(*_series(rows, key), marker=".", label=label)
        axes[0].set(title="reward", xlabel="optimizer step")
        axes[0].legend()
        axes[1].plot(*_series(rows, "kl/ref_k3"), marker=".")
        axes[1].set(title="KL to the reference (k3)", xlabel="optimizer step")
        axes[2].plot(*_step_seconds(rows), marker=".")
        axes[2].set(title="seconds per step", xlabel="optimizer step")
        fig.tight_layout()
        with io.atomic_path(out, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=100, format="png")
        plt.close(fig)
    return [out]
