"""Writes a run's outputs (``rlpipe.contract``; CONTRIBUTING.md "Run outputs"), atomically.

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

The writing happens on a writer thread (a bounded queue of whole-state copies taken at the flush
call, so that the loop can go on changing its rows meanwhile): ``flush_if_due`` hands the work over
and returns at once, so a round's rewrite costs the loop only the copy of its rows. Every other
flush (a checkpoint's snapshot, which must be on disk before the checkpoint is; the end of the run; a
failure or a stop) waits until everything queued and itself are written, and ``close`` ends the
thread after the same wait. A write that fails on the thread is raised by the next call of the
loop. A crash mid-write (the thread is a daemon: a killed process does not wait for it) leaves the
previous file and a temporary file of ``rlpipe.io``'s naming, which the next run deletes; never a
torn file. ``background=False`` writes in the calling thread (same files, byte for byte).

Experiment trackers (``logging.trackers``: TensorBoard, W&B, MLflow) get each written state's rows
from the writer (``TrackerProcess.submit``, a non-blocking put: they log from a process of their own,
``rlpipe.trainer.trackers.process``), and ``run_info.json`` at ``finish``; ``close`` after a
failure or a stop ends their runs as failed.

A snapshot that cannot be read (truncated or corrupt parquet/JSONL), lacks the metrics file, or
does not reach the checkpoint's step raises ``SnapshotError`` naming the file (``check_snapshot``
runs before Ray starts; ``resume_from`` reads through the same checks) rather than failing inside
pandas or pyarrow or resuming with a gap in the steps.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from rlpipe import contract, io
from rlpipe.rl.records import PhaseEvent, VersionEvent
from rlpipe.trainer.trackers import TrackerProcess


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


#: queued whole-state writes at most (a flush beyond it waits for the writer: memory stays bounded)
QUEUE_SIZE = 2


class RunWriter:
    def __init__(self, out_dir: str | Path, trackers: TrackerProcess | None = None, flush_every_s: float = 0.0,
                 background: bool = True):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.flush_every_s = flush_every_s  # flush_if_due writes at most this often (0: every call)
        self._flushed_at = -math.inf
        self.background = background
        self._queue: queue.Queue | None = None  # of (snapshot, state) writes; None until the first
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # a failed background write, raised by the next call
        self.rows: list[dict] = []
        self.events: list[dict] = []
        self.versions: list[dict] = []
        self.rollouts: list[dict] = []
        self.trackers = trackers  # handed the rows of every written state (rlpipe.trainer.trackers)
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
        """A flush, handed to the writer thread, unless the last one was under ``flush_every_s``
        seconds ago; True if it was made."""
        if time.monotonic() - self._flushed_at < self.flush_every_s:
            return False
        self.flush(wait=False)
        return True

    def flush(self, snapshot: bool = False, wait: bool = True) -> None:
        """Write every output; ``snapshot`` also writes the copy that ``resume_from`` reads (and
        always waits: a checkpoint follows it). ``wait=False``: return once the state is queued."""
        self._raise_error()
        self._flushed_at = time.monotonic()
        state = {"rows": [dict(r) for r in self.rows], "events": list(self.events),
                 "versions": list(self.versions), "rollouts": list(self.rollouts)}
        if not self.background:
            return self._write_state(snapshot, state)
        if self._thread is None:
            self._queue = queue.Queue(maxsize=QUEUE_SIZE)
            self._thread = threading.Thread(target=self._work, name="rlpipe-run-writer", daemon=True)
            self._thread.start()
        self._queue.put((snapshot, state))  # blocks while QUEUE_SIZE writes are pending
        if wait or snapshot:
            self.wait()

    def wait(self) -> None:
        """Until every queued write is on disk; raises a write's failure."""
        if self._queue is not None:
            self._queue.join()
        self._raise_error()

    def close(self) -> None:
        """Wait for the queued writes, then end the writer thread (a later flush starts another).
        The trackers' runs end here as failed, unless ``finish`` ended them."""
        if self.trackers is not None:
            self.trackers.close(self.rows)
        self._end_thread()

    def _end_thread(self) -> None:
        if self._thread is None:
            return
        try:
            self.wait()
        finally:
            self._queue.put(None)
            self._thread.join()
            self._thread = self._queue = None

    def _raise_error(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise err

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is None:  # after a failure, nothing more until the loop has heard of it
                    self._write_state(*job)
            except BaseException as e:  # handed to the loop, which raises it
                self._error = e
            finally:
                self._queue.task_done()

    def _write_state(self, snapshot: bool, state: dict) -> None:
        for d in (self.dir, self.dir / contract.CHECKPOINT_DIR) if snapshot else (self.dir,):
            self._write(d, state)
        if self.trackers is not None:
            self.trackers.submit(state["rows"])

    @staticmethod
    def _write(d: Path, state: dict) -> None:
        metrics = pd.DataFrame(state["rows"], columns=list(contract.METRIC_COLUMNS))
        for c in contract.METRIC_INT_COLUMNS:
            metrics[c] = metrics[c].astype("int64")
        io.write_parquet(d / contract.METRICS_FILE, metrics.sort_values("step"))
        ev = pd.DataFrame(state["events"], columns=list(contract.EVENT_COLUMNS))
        io.write_parquet(d / contract.EVENTS_FILE, ev.astype({c: "int64" for c in contract.EVENT_INT_COLUMNS}))
        vs = pd.DataFrame(state["versions"], columns=list(contract.VERSION_COLUMNS))
        io.write_parquet(d / contract.VERSIONS_FILE, vs.astype({c: "int64" for c in contract.VERSION_INT_COLUMNS}))
        io.write_jsonl(d / contract.ROLLOUTS_FILE, state["rollouts"])

    def finish(self, info: dict) -> None:
        self.flush()
        self._end_thread()
        io.write_json(self.dir / contract.RUN_INFO_FILE,
                      {**info, "wall_time_s": self.rel(time.time()), "finished": True})
        if self.trackers is not None:
            self.trackers.finish(self.rows, [self.dir / contract.RUN_INFO_FILE])
