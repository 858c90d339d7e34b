"""What every tracker is given and does: the ``Tracker`` protocol, the run it logs (``RunSpec``) and
the metric values of a row.

A tracker is called only from its own thread (``rlpipe.trainer.trackers.pump``), never from the
training loop: ``open`` (the library's import, a login, a server round trip), ``log_rows`` and
``finish`` may take as long as they take, or raise, and the run goes on.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlpipe import contract

#: columns that index a row rather than measure it
_NOT_SCALARS = frozenset({"step"})


@dataclass(frozen=True)
class RunSpec:
    """One training run as the trackers name it (``rlpipe.trainer.trackers.naming``)."""

    run_dir: Path
    results_dir: Path
    key: str  # stable across a resume, new for a fresh start (``rlpipe.trainer.trackers.state``)
    track: str  # the track's name, or the family's for a family replicate
    family: str | None
    variant: str
    seed: int
    group: str  # what a family's replicates (or a track's variants) share: "<track>" or "families/<family>"
    name: str  # "<group>/<variant>/seed<seed>"
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config (config.yaml's content)


class Tracker(Protocol):
    """One experiment tracker's side of a run."""

    name: str
    wants_files: bool  # finish() is handed run_info.json and the run's figures

    def open(self, spec: RunSpec) -> None:
        """Start (or continue, on a resumed run: ``spec.key`` is the same) the tracker's run."""

    def log_rows(self, rows: list[dict]) -> None:
        """Log every metric of ``rows`` (sorted by step, each step new to this tracker) at its step."""

    def finish(self, files: list[Path], ok: bool) -> None:
        """Attach ``files`` (run_info.json, the run's figures) and end the tracker's run, as finished
        (``ok``) or failed (a run that raised or was stopped: it may be resumed later)."""


def metric_items(row: dict) -> list[tuple[str, float]]:
    """A metric row's measured values as (namespaced name, value): NaN (not measured) and the step
    itself skipped, in the contract's column order."""
    out = []
    for name in contract.METRIC_COLUMNS:
        value = row.get(name)
        if name in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        if math.isfinite(value):
            out.append((name, float(value)))
    return out


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys and string values (MLflow's params)."""
    out: dict[str, str] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_params(v, f"{key}."))
        else:
            out[key] = str(v)
    return out
