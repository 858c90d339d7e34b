"""Experiment trackers (``logging.trackers``): a run's metrics, config and files copied to
TensorBoard, Weights & Biases and MLflow, from a process of their own that never fails, stalls or
slows the run. ``open_trackers`` starts it for a run; the run writer (``rlpipe.trainer.run_writer``)
hands it every flush's rows and, at the end, ``run_info.json``.

One file per concept: ``base`` (the protocol and the run's names), ``naming`` (track, family,
variant and seed from the run directory), ``state`` (the key and last logged steps, for resume),
``process`` (the trackers' own process, whose entry point is ``child``, and the driver's
bounded, non-blocking handle on it), ``pump`` (in that process, each tracker on a thread of its
own), ``figures`` (the run's curves), ``registry`` and one file per tracker. Whether a named
tracker is installed is checked before any work by ``rlpipe.config.checks``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlpipe.trainer.trackers.base import RunSpec, Tracker
from rlpipe.trainer.trackers.process import TrackerProcess
from rlpipe.trainer.trackers.pump import say
from rlpipe.trainer.trackers.registry import TRACKER_CLASSES

__all__ = ["TRACKER_CLASSES", "RunSpec", "Tracker", "TrackerProcess", "open_trackers"]


def open_trackers(names: list[str], run_dir: str | Path, results_dir: str | Path, variant: str, seed: int,
                  config: dict[str, Any], extra: list[Callable[[], Tracker]] | None = None) -> TrackerProcess | None:
    """The run's trackers, starting in their own process (None when there are none). ``extra``:
    tracker classes besides the named ones (tests), importable by the child."""
    if not names and not extra:
        return None
    try:
        return TrackerProcess(names, run_dir, results_dir, variant, seed, config, extra)
    except Exception as e:  # a tracker never fails the run, not even one that cannot start
        say(f"could not start the trackers' process ({type(e).__name__}: {e}); the run goes on without "
            "trackers (metrics.parquet has every step)")
        return None
