"""Where a GRPO step's time goes, for both sides of ``rlpipe bench trl``.

rlpipe records every phase of every step itself (``time/<phase>`` metrics columns, the run-output
contract); its split is read from ``metrics.parquet``: generation, scoring, log-prob passes
(reference and old), update, weight copy, and *other* = the step's wall time minus those (driver,
Ray calls, metrics rows). TRL records no phases, and TRL is not changed here: ``PhaseClock`` wraps
the policy's ``generate`` method and the reward function, and a ``TrainerCallback`` closes each
optimizer step, so TRL's split is generation, scoring and *other* (log-prob forward, backward,
optimizer, TRL's bookkeeping). Every number is a median over the optimizer steps.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from rlpipe.contract import metric_time_column

#: rlpipe's phases as the bench groups them: the two log-prob passes are one "logprobs" entry.
RLPIPE_GROUPS = {"generate": ("generate",), "score": ("score",), "logprobs": ("ref_logprobs", "old_logprobs"),
                 "update": ("update",), "weight_sync": ("weight_sync",)}
OTHER = "other"


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4) if xs else 0.0


def rlpipe_phase_split(metrics) -> dict[str, float]:
    """Median seconds per optimizer step of each phase group and of ``other``, plus ``step``,
    from a run's metrics frame (rows with ``step >= 1``; step s's wall is ``wall_time[s] - wall_time[s-1]``)."""
    m = metrics.sort_values("step")
    walls = m["wall_time"].diff().iloc[1:].tolist()
    steps = m.iloc[1:]
    per_group: dict[str, list[float]] = {g: [] for g in RLPIPE_GROUPS}
    other = []
    for i, (_, row) in enumerate(steps.iterrows()):
        used = 0.0
        for group, phases in RLPIPE_GROUPS.items():
            cols = [metric_time_column(p) for p in phases if metric_time_column(p) in row.index]
            seconds = float(sum(row[c] for c in cols if row[c] == row[c]))  # NaN (phase absent) counts 0
            per_group[group].append(seconds)
            used += seconds
        other.append(max(0.0, walls[i] - used))
    out = {g: _median(v) for g, v in per_group.items()}
    out[OTHER] = _median(other)
    out["step"] = _median(walls)
    return out


class PhaseClock:
    """Per-step seconds spent in wrapped callables (``wrap``), closed by ``end_step``."""

    def __init__(self, phases: tuple[str, ...] = ("generate", "score")):
        self.phases = phases
        self._open = dict.fromkeys(phases, 0.0)
        self.steps: list[dict[str, float]] = []
        self._t_step = time.perf_counter()

    def wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._open[phase] += time.perf_counter() - t0
        return timed

    def start(self) -> None:
        self._open = dict.fromkeys(self.phases, 0.0)
        self._t_step = time.perf_counter()

    def end_step(self) -> None:
        now = time.perf_counter()
        self.steps.append({**self._open, "step": now - self._t_step})
        self.start()

    def split(self) -> dict[str, float]:
        """Median seconds per step of each phase, ``other`` (the rest of the step) and ``step``."""
        out = {p: _median([s[p] for s in self.steps]) for p in self.phases}
        out[OTHER] = _median([max(0.0, s["step"] - sum(s[p] for p in self.phases)) for s in self.steps])
        out["step"] = _median([s["step"] for s in self.steps])
        return out

    def callback(self):
        """A ``transformers.TrainerCallback`` that starts the clock with training and closes a step
        at every optimizer step's end."""
        from transformers import TrainerCallback

        clock = self

        class _StepEnd(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                clock.start()

            def on_step_end(self, args, state, control, **kwargs):
                clock.end_step()

        return _StepEnd()
