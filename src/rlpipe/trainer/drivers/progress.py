"""Live progress of ``rlpipe train``: one line per optimizer step on stdout, and the version log.

A step line shows step/total, the train reward of the step's batch, the validation reward when it
was measured at that step, KL(pi || pi_ref) (k3 estimate), samples/s and the ETA::

    [onpolicy] step 12/100 (12%) | reward 0.375 | val 0.333 | kl_ref 0.0123 | 85.3 samples/s | 0:42 elapsed | ETA 5:08

Disaggregated runs also print every policy-version change on both sides (seed 002 Problem 10 asks
for the version log to be printed), with the time since the run's start::

    [generator] v3 -> v4 at 12.3s

Long runs with fast steps print at most one step line per ``min_interval_s`` seconds of run time
(decided from the steps' own wall times, so the k lines of a colocated round, which arrive together,
are thinned the same way as the steps of a disaggregated run), plus every step that has a
validation reward and the last one; a version line then reports the change since the last printed
one (``v3 -> v7``). The formatting is pure (``format_progress``, ``format_version_change``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

MIN_INTERVAL_S = 1.0


@dataclass(frozen=True)
class StepProgress:
    variant: str
    step: int
    total: int
    train_reward: float | None = None  # NaN/None: not measured (step 0)
    val_reward: float | None = None
    kl_ref: float | None = None
    samples_per_s: float | None = None
    elapsed_s: float = 0.0  # run time (s since the run's clock started; continues across --resume)
    eta_s: float | None = None


def _known(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def format_duration(seconds: float) -> str:
    """``65 -> '1:05'``, ``3725 -> '1:02:05'``."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_progress(p: StepProgress) -> str:
    pct = 100 * p.step // max(1, p.total)
    parts = [f"[{p.variant}] step {p.step}/{p.total} ({pct}%)"]
    if _known(p.train_reward):
        parts.append(f"reward {p.train_reward:.3f}")
    if _known(p.val_reward):
        parts.append(f"val {p.val_reward:.3f}")
    if _known(p.kl_ref):
        parts.append(f"kl_ref {p.kl_ref:.4f}")
    if _known(p.samples_per_s):
        parts.append(f"{p.samples_per_s:.1f} samples/s")
    parts.append(f"{format_duration(p.elapsed_s)} elapsed")
    if _known(p.eta_s):
        parts.append(f"ETA {format_duration(p.eta_s)}")
    return " | ".join(parts)


def format_version_change(who: str, old: int, new: int, at_s: float) -> str:
    return f"[{who}] v{old} -> v{new} at {at_s:.1f}s"


def eta_seconds(wall_s: float, step: int, start_wall_s: float, start_step: int, total: int) -> float | None:
    """Remaining time at the mean step time since (``start_step``, ``start_wall_s``), the point
    this process started training from (0 or the resumed step)."""
    done = step - start_step
    if done <= 0:
        return None
    return (wall_s - start_wall_s) / done * max(0, total - step)


def due(wall_s: float, last_printed_s: float | None, min_interval_s: float, forced: bool) -> bool:
    """Whether a line stamped ``wall_s`` is printed: forced ones always, others at most one per
    ``min_interval_s`` of run time."""
    return forced or last_printed_s is None or wall_s - last_printed_s >= min_interval_s


class ProgressPrinter:
    """Turns completed metrics rows and version events into lines (``emit``: ``print`` by default)."""

    def __init__(self, variant: str, total: int, *, versions: bool, min_interval_s: float = MIN_INTERVAL_S,
                 emit: Callable[[str], None] | None = None):
        self.variant, self.total, self.show_versions = variant, total, versions
        self.min_interval_s = min_interval_s
        self.emit = emit or (lambda line: print(line, flush=True))
        self.start: tuple[int, float] = (0, 0.0)  # (step, wall time) training (re)started from
        self.last_printed: dict[str, float] = {}
        self.shown_version: dict[str, int] = {}

    def started(self, step: int, wall_s: float) -> None:
        self.start = (step, wall_s)

    def step(self, row: dict) -> None:
        step, wall = int(row["step"]), float(row["wall_time"])
        val = row.get("reward/val_mean")
        if not due(wall, self.last_printed.get("step"), self.min_interval_s,
                   forced=step in (0, self.total) or _known(val)):
            return
        self.last_printed["step"] = wall
        self.emit(format_progress(StepProgress(
            self.variant, step, self.total, row.get("reward/train_mean"), val, row.get("kl/ref_k3"),
            row.get("perf/samples_per_s"), wall, eta_seconds(wall, step, self.start[1], self.start[0], self.total))))

    def version(self, who: str, version: int, wall_s: float) -> None:
        """A version change of ``who`` (generator | learner) to ``version`` at run time ``wall_s``."""
        old = self.shown_version.get(who, version - 1 if who == "learner" else 0)
        if not self.show_versions or version == old:
            return
        if not due(wall_s, self.last_printed.get(who), self.min_interval_s, forced=version == self.total):
            return
        self.last_printed[who] = wall_s
        self.shown_version[who] = version
        self.emit(format_version_change(who, old, version, wall_s))
