"""Writes a run's outputs (``rlpipe.analysis.contract``; CONTRIBUTING.md "Run outputs"), atomically.

Metrics, events and version logs are kept in memory and rewritten as whole parquet files at every
flush (a few hundred rows: cheaper than appending, and a crash can never leave a torn file). Each
checkpoint also snapshots them into ``checkpoints/`` (Snakemake deletes a failed job's declared
outputs, so the run directory's copies may be gone by the time the job is rerun). On ``--resume``
the snapshot is read back and cut at the checkpoint's step, so the resumed run's steps continue
without duplicates or gaps; wall times continue from the last recorded one.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from rlpipe import io
from rlpipe.analysis import contract
from rlpipe.rl.records import PhaseEvent, VersionEvent

# Back-compat alias (tests/test_trainer.py compares ``list(df.columns)`` with it); the contract's
# tuple is the declaration.


class RunWriter:
    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.rows: list[dict] = []
        self.events: list[dict] = []
        self.versions: list[dict] = []
        self.rollouts: list[dict] = []

    def rel(self, t: float) -> float:
        return t - self.t0

    # -- resume ---------------------------------------------------------------------------------
    def resume_from(self, step: int) -> None:
        """Reload outputs of a killed run, dropping everything after optimizer step ``step``."""
        def load(name: str, col: str, limit: float) -> list[dict]:
            p = self.dir / contract.CHECKPOINT_DIR / name
            if not p.exists():
                return []
            df = pd.read_parquet(p)
            return df[df[col] <= limit].to_dict("records")

        self.rows = load(contract.METRICS_FILE, "step", step)
        self.events = load(contract.EVENTS_FILE, "step", step)
        last_wall = max([r["wall_time"] for r in self.rows] or [0.0])
        self.versions = load(contract.VERSIONS_FILE, "wall_time", last_wall)
        if (self.dir / contract.CHECKPOINT_DIR / contract.ROLLOUTS_FILE).exists():
            self.rollouts = [r for r in io.read_jsonl(self.dir / contract.CHECKPOINT_DIR / contract.ROLLOUTS_FILE)
                             if r["step"] <= step]
        self.t0 = time.time() - last_wall

    @property
    def last_step(self) -> int:
        return max([int(r["step"]) for r in self.rows] or [-1])

    # -- adding records -------------------------------------------------------------------------
    def add_row(self, row: dict) -> None:
        full = {c: math.nan for c in contract.METRIC_COLUMNS}
        full.update(row)
        self.rows.append(full)

    def update_row(self, step: int, values: dict) -> None:
        for r in self.rows:
            if r["step"] == step:
                r.update(values)
                return
        raise KeyError(f"no metrics row for step {step}")

    def add_events(self, events: list[PhaseEvent]) -> None:
        for e in events:
            d = asdict(e)
            d["start"], d["end"] = self.rel(e.start), self.rel(e.end)
            self.events.append(d)

    def add_versions(self, events: list[VersionEvent]) -> None:
        for e in events:
            d = asdict(e)
            d["wall_time"] = self.rel(e.wall_time)
            self.versions.append(d)

    def add_rollouts(self, step: int, version: int, items: list[dict]) -> None:
        for it in items:
            self.rollouts.append({"step": step, "version": version, **it})

    # -- output ---------------------------------------------------------------------------------
    def flush(self, snapshot: bool = False) -> None:
        """Write every output; ``snapshot`` also writes the copy that ``resume_from`` reads."""
        for d in (self.dir, self.dir / contract.CHECKPOINT_DIR) if snapshot else (self.dir,):
            self._write(d)

    def _write(self, d: Path) -> None:
        metrics = pd.DataFrame(self.rows, columns=list(contract.METRIC_COLUMNS))
        for c in contract.METRIC_INT_COLUMNS:
            metrics[c] = metrics[c].astype("int64")
        io.write_parquet(d / contract.METRICS_FILE, metrics.sort_values("step"))
        ev = pd.DataFrame(self.events, columns=list(contract.EVENT_COLUMNS))
        io.write_parquet(d / contract.EVENTS_FILE, ev.astype({c: "int64" for c in contract.EVENT_INT_COLUMNS}))
        vs = pd.DataFrame(self.versions, columns=list(contract.VERSION_COLUMNS))
        io.write_parquet(d / contract.VERSIONS_FILE, vs.astype({c: "int64" for c in contract.VERSION_INT_COLUMNS}))
        io.write_jsonl(d / contract.ROLLOUTS_FILE, self.rollouts)

    def finish(self, info: dict) -> None:
        self.flush()
        io.write_json(self.dir / contract.RUN_INFO_FILE,
                      {**info, "wall_time_s": self.rel(time.time()), "finished": True})
