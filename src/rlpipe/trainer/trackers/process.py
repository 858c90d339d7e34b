"""The trackers' own process: what keeps them from slowing the training loop.

Importing W&B and MLflow takes seconds of CPU, and their clients run Python threads; inside the
driver they would hold its interpreter lock while the loop waits to hand out its next round (measured
with ``rlpipe bench trackers``: short runs slowed while the trackers started on threads of the
driver). So the trackers run in a child process, started with ``spawn`` (the driver has Ray's and
other threads, which ``fork`` would copy half-way) when the run context is built: before Ray starts,
so the child's start-up burst (imports, opening the tracker runs) overlaps the trainer's own
start-up, not its loop; afterwards it logs a few rows per flush. It runs at the driver's priority: at
the lowest (``nice 19``), on a machine that others kept busy, the child starved and the trackers had
not finished their runs 30 s after the run ended.

The driver's side (``TrackerProcess``) is bounded and never waits while the run trains:
``submit`` hands over the rows past the last step it handed over, with a non-blocking put into a
queue of ``QUEUE_SIZE`` messages; when the child is behind and the queue is full, nothing is put
and the same rows go with the next submission. In the child, each tracker logs on a thread of its
own (``rlpipe.trainer.trackers.pump``), so one slow or failing tracker holds up no other. At the
end, ``finish`` sends the final rows and files and waits for the child at most the trackers'
timeout plus ``GRACE_S``; a child still alive after that is killed, said once in the run's log.
The child's messages go to the run's own stdout (its log).
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlpipe.trainer.trackers import pump
from rlpipe.trainer.trackers.base import Tracker
from rlpipe.trainer.trackers.naming import run_spec
from rlpipe.trainer.trackers.registry import TRACKER_CLASSES
from rlpipe.trainer.trackers.state import TrackerState

QUEUE_SIZE = 8  # messages in flight at most: the driver's memory stays bounded however far the child lags
GRACE_S = 5.0  # beyond the trackers' own timeout: the child's start-up and exit
_CTX = multiprocessing.get_context("spawn")


def _child(messages: Any, names: list[str], extra: list[Callable[[], Tracker]], run_dir: str,
           results_dir: str, variant: str, seed: int, config: dict) -> None:
    """The child's loop: rows in, each tracker on its thread, until the end message."""
    state = TrackerState(run_dir)
    trackers = [TRACKER_CLASSES[n]() for n in names] + [make() for make in extra]
    spec = run_spec(run_dir, results_dir, state.key, variant, seed, config)
    trackers_set = pump.TrackerSet(trackers, spec, state)
    rows: dict[int, dict] = {}
    while True:
        kind, new, *end = messages.get()
        rows.update({int(r["step"]): r for r in new})
        ordered = [rows[s] for s in sorted(rows)]
        if kind == "rows":
            trackers_set.submit(ordered)
            continue
        files, ok, timeout = end
        trackers_set.finish(ordered, [Path(f) for f in files], ok, timeout)
        return


class TrackerProcess:
    """The driver's handle on the trackers' child process (see the module docstring)."""

    def __init__(self, names: list[str], run_dir: str | Path, results_dir: str | Path, variant: str, seed: int,
                 config: dict[str, Any], extra: list[Callable[[], Tracker]] | None = None):
        self.names = list(names) + [getattr(make, "name", str(make)) for make in extra or []]
        self._queue = _CTX.Queue(maxsize=QUEUE_SIZE)
        self._proc = _CTX.Process(
            target=_child, name="rlpipe-trackers", daemon=True,
            args=(self._queue, list(names), list(extra or []), str(Path(run_dir).resolve()),
                  str(Path(results_dir).resolve()), variant, seed, config))
        self._proc.start()
        self._sent = -1  # the last step handed over
        self._ended = False

    def submit(self, rows: list[dict]) -> None:
        """Hand over the rows past the last step handed over; returns at once."""
        new = [r for r in rows if int(r["step"]) > self._sent]
        if self._ended or not new:
            return
        try:
            self._queue.put_nowait(("rows", new))
        except queue.Full:  # the child is behind: these rows go with the next submission
            return
        self._sent = max(int(r["step"]) for r in new)

    def finish(self, rows: list[dict], files: list[Path], ok: bool = True, timeout: float | None = None) -> bool:
        """End every tracker's run with the final rows and ``files``; waits at most the trackers'
        timeout plus ``GRACE_S``. False if the child had to be killed. A second call does nothing."""
        if self._ended:
            return True
        self._ended = True
        timeout = pump.FINISH_TIMEOUT_S if timeout is None else timeout
        try:
            self._queue.put(("end", list(rows), [str(f) for f in files], ok, timeout), timeout=GRACE_S)
        except queue.Full:
            pass  # the child takes no messages: it is killed below
        self._proc.join(timeout + GRACE_S)
        done = not self._proc.is_alive()
        if done and self._proc.exitcode:  # its traceback is on stderr, above
            pump.say(f"the trackers' process ({', '.join(self.names)}) failed (exit code {self._proc.exitcode}); "
                     "metrics.parquet has every step")
        if not done:
            pump.say(f"the trackers' process ({', '.join(self.names)}) had not ended {timeout + GRACE_S:g} s "
                      "after the run ended; stopped it (metrics.parquet has every step)")
            self._proc.kill()
            self._proc.join(GRACE_S)
        self._queue.cancel_join_thread()  # a kill may leave messages unread: never wait on them
        self._queue.close()
        return done

    def close(self, rows: list[dict]) -> bool:
        """A run that failed or was stopped: end the trackers' runs as failed, briefly."""
        return self.finish(rows, [], ok=False, timeout=pump.CLOSE_TIMEOUT_S)
