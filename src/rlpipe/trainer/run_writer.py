"""Writes a run's outputs (``rlpipe.analysis.contract``; CONTRIBUTING.md "Run outputs"), atomically.

Metrics, events and version logs are kept in memory and rewritten as whole parquet files at every
flush (a few hundred rows: cheaper than appending, and a crash can never leave a torn file). A
round's flush is throttled (``flush_if_due``, ``logging.flush_every_s``): a flush costs tens of
milliseconds of pandas and pyarrow work in the driver while the actors wait for their next call,
which on the CPU default was about a tenth of a step. Checkpoints and the end of the run always
flush, so resume and the finished run's outputs are unaffected. Each
checkpoint also snapshots them into ``checkpoints/`` (Snakemake deletes a failed job's declared
outputs, so the run directory's copies may be gone by the time the job is rerun). On ``--resume``
the snapshot is read back and cut at the checkpoint's step, so the resumed run's steps continue
without duplicates or gaps; wall times continue from the last recorded one.

A snapshot that cannot be read (truncated or corrupt parquet/JSONL), lacks the metrics file, or
does not reach the checkpoint's step raises ``SnapshotError`` naming the file (``check_snapshot``
runs before Ray starts; ``resume_from`` reads through the same checks) rather than failing inside
pandas or pyarrow or resuming with a gap in the steps.
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
from rlpipe.trainer.tensorboard import TensorBoardLogger


class SnapshotError(ValueError):
    """A ``checkpoints/`` snapshot file cannot be resumed from; the message names the file."""


def _read_parquet(p: Path, required: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_parquet(p)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise SnapshotError(f"{p} is unreadable (truncated or corrupt): {type(e).__name__}: {e}") from e
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise SnapshotError(f"{p} lacks columns {missing}")
    return df


def read_snapshot(run_dir: str | Path, step: int) -> dict[str, list[dict]]:
    """The snapshot of ``run_dir/checkpoints/`` cut at optimizer step ``step``: ``metrics``,
    ``events``, ``versions``, ``rollouts`` record lists. Raises ``SnapshotError`` naming the file
    when one cannot be read or the metrics do not hold every step ``0..step``."""
    d = Path(run_dir) / contract.CHECKPOINT_DIR
    metrics_path = d / contract.METRICS_FILE
    if not metrics_path.is_file():
        raise SnapshotError(f"{metrics_path} is missing (every checkpoint writes it first)")
    metrics = _read_parquet(metrics_path, ("step", "wall_time", "samples", "policy_version"))
    have = set(metrics["step"].astype(int))
    gap = sorted(set(range(step + 1)) - have)
    if gap:
        raise SnapshotError(f"{metrics_path} lacks steps {gap[:5]}{'...' if len(gap) > 5 else ''} "
                            f"of the checkpoint's 0..{step}")
    rows = metrics[metrics["step"] <= step].to_dict("records")
    last_wall = max([r["wall_time"] for r in rows] or [0.0])
    out = {"metrics": rows, "events": [], "versions": [], "rollouts": []}
    for key, name, cols, col, limit in (("events", contract.EVENTS_FILE, contract.EVENT_COLUMNS, "step", step),
                                        ("versions", contract.VERSIONS_FILE, contract.VERSION_COLUMNS,
                                         "wall_time", last_wall)):
        if (d / name).is_file():
            df = _read_parquet(d / name, cols)
            out[key] = df[df[col] <= limit].to_dict("records")
    rollouts = d / contract.ROLLOUTS_FILE
    if rollouts.is_file():
        try:
            out["rollouts"] = [r for r in io.read_jsonl(rollouts) if r["step"] <= step]
        except (ValueError, KeyError, TypeError) as e:
            raise SnapshotError(f"{rollouts} is unreadable (truncated or corrupt): {e}") from e
    return out


class RunWriter:
    def __init__(self, out_dir: str | Path, tensorboard: bool = False, flush_every_s: float = 0.0):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.flush_every_s = flush_every_s  # flush_if_due writes at most this often (0: every call)
        self._flushed_at = -math.inf
        self.rows: list[dict] = []
        self.events: list[dict] = []
        self.versions: list[dict] = []
        self.rollouts: list[dict] = []
        self.tensorboard = tensorboard  # mirror rows to <run>/tensorboard/ at each flush (live curves)
        self._tb: TensorBoardLogger | None = None
        self._resumed_at = -1  # rows up to this step were written by the killed run (resume)

    def rel(self, t: float) -> float:
        return t - self.t0

    # -- resume ---------------------------------------------------------------------------------
    def resume_from(self, step: int, since: float | None = None) -> None:
        """Reload outputs of a killed run, dropping everything after optimizer step ``step``. The
        clock continues from the snapshot's last wall time at ``since`` (default: now): the time the
        restore began, so that what the actors log while restoring comes after the killed run's rows."""
        snap = read_snapshot(self.dir, step)
        self.rows = [{c: math.nan for c in contract.METRIC_COLUMNS} | r for r in snap["metrics"]]
        self.events, self.versions, self.rollouts = snap["events"], snap["versions"], snap["rollouts"]
        since = time.time() if since is None else since
        self.t0 = since - max([r["wall_time"] for r in self.rows] or [0.0])
        if self._tb is not None:
            self._tb.last_step = min(self._tb.last_step, step)
        self._resumed_at = step

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
        """Version changes, with wall times relative to the run's start. A resumed run drops its
        actors' ``init`` events: they start at version 0 and are then restored (the learner's
        checkpoint, the generator's ``load_weights``), and the killed run already logged version 0's
        start, so ``versions.parquet`` stays monotone in time across a resume."""
        for e in events:
            if self._resumed_at >= 0 and e.event == "init":
                continue
            d = asdict(e)
            d["wall_time"] = self.rel(e.wall_time)
            self.versions.append(d)

    def add_rollouts(self, step: int, version: int, items: list[dict]) -> None:
        for it in items:
            self.rollouts.append({"step": step, "version": version, **it})

    # -- output ---------------------------------------------------------------------------------
    def flush_if_due(self) -> bool:
        """``flush()`` unless the last one was under ``flush_every_s`` seconds ago; True if it wrote."""
        if time.monotonic() - self._flushed_at < self.flush_every_s:
            return False
        self.flush()
        return True

    def flush(self, snapshot: bool = False) -> None:
        """Write every output; ``snapshot`` also writes the copy that ``resume_from`` reads."""
        self._flushed_at = time.monotonic()
        for d in (self.dir, self.dir / contract.CHECKPOINT_DIR) if snapshot else (self.dir,):
            self._write(d)
        if self.tensorboard:
            if self._tb is None:
                self._tb = TensorBoardLogger(self.dir / contract.TENSORBOARD_DIR,
                                             after_step=self._resumed_at)
            self._tb.log_rows(self.rows)

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
