"""The trackers' own process: what keeps them from slowing the training loop.

Importing W&B and MLflow takes seconds of CPU, and their clients run Python threads; inside the
driver they would hold its interpreter lock while the loop waits to hand out its next round (measured
with ``rlpipe bench trackers``: short runs slowed while the trackers started on threads of the
driver). So the trackers run in a child process, ``python -m rlpipe.trainer.trackers.child`` (a fresh
interpreter: ``fork`` would copy the driver's Ray and other threads half-way, and
``multiprocessing``'s ``spawn`` re-imports the caller's main script, which reruns a script without
a ``__main__`` guard), started when the run context is built: before Ray starts,
so the child's start-up burst (imports, opening the tracker runs) overlaps the trainer's own
start-up, not its loop; afterwards it logs a few rows per flush. It runs at the driver's priority: at
the lowest (``nice 19``), on a machine that others kept busy, the child starved and the trackers had
not finished their runs 30 s after the run ended.

The driver's side (``TrackerProcess``) is bounded and never waits while the run trains:
``submit`` hands over the rows past the last step it handed over, with a non-blocking put into a
queue of ``QUEUE_SIZE`` messages, which a sender thread pickles into the child's stdin; when the
child is behind and the queue is full, nothing is put and the same rows go with the next
submission. In the child, each tracker logs on a thread of its
own (``rlpipe.trainer.trackers.pump``), so one slow or failing tracker holds up no other. At the
end, ``finish`` sends the final rows and files and waits for the child at most the trackers'
timeout plus ``GRACE_S``; a child still alive after that is killed, said once in the run's log.
The child's messages go to the run's own stdout (its log).
"""

from __future__ import annotations

import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from rlpipe.trainer.trackers import pump
from rlpipe.trainer.trackers.base import Tracker
from rlpipe.trainer.trackers.naming import run_spec
from rlpipe.trainer.trackers.registry import TRACKER_CLASSES
from rlpipe.trainer.trackers.state import TrackerState

QUEUE_SIZE = 8  # messages in flight at most: the driver's memory stays bounded however far the child lags
GRACE_S = 5.0  # beyond the trackers' own timeout: the child's start-up and exit
CHILD_MODULE = "rlpipe.trainer.trackers.child"  # its entry point, which calls run_child


def run_child(stream: IO[bytes]) -> None:
    """The child's loop: its set-up, then rows, each tracker on its thread, until the end message.
    The parent's end (no end message) ends the trackers' runs as failed."""
    sys.path[:0] = [p for p in pickle.load(stream) if p not in sys.path]  # the parent's (a test's trackers)
    names, extra, run_dir, results_dir, variant, seed, config = pickle.load(stream)
    state = TrackerState(run_dir)
    trackers = [TRACKER_CLASSES[n]() for n in names] + [make() for make in extra]
    trackers_set = pump.TrackerSet(trackers, run_spec(run_dir, results_dir, state.key, variant, seed, config), state)
    rows: dict[int, dict] = {}
    while True:
        try:
            kind, new, *end = pickle.load(stream)
        except EOFError:  # the driver is gone
            kind, new, end = "end", [], [[], False, pump.CLOSE_TIMEOUT_S]
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
        self._proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE)
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self._queue.put(list(sys.path))
        self._queue.put((list(names), list(extra or []), str(Path(run_dir).resolve()),
                         str(Path(results_dir).resolve()), variant, seed, config))
        self._sender = threading.Thread(target=self._send, name="rlpipe-trackers-sender", daemon=True)
        self._sender.start()
        self._sent = -1  # the last step handed over
        self._ended = False

    def _send(self) -> None:
        """Pickle each queued message into the child's stdin, until the sentinel or a dead child."""
        stdin = self._proc.stdin
        try:
            while (msg := self._queue.get()) is not None:
                pickle.dump(msg, stdin)
                stdin.flush()
        except OSError:  # the child is gone (it says why on stderr; finish names it)
            pass
        finally:
            try:
                stdin.close()
            except OSError:
                pass

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
            self._queue.put(None, timeout=GRACE_S)
        except queue.Full:
            pass  # the child takes no messages: it is killed below
        try:
            code = self._proc.wait(timeout + GRACE_S)
        except subprocess.TimeoutExpired:
            pump.say(f"the trackers' process ({', '.join(self.names)}) had not ended {timeout + GRACE_S:g} s "
                     "after the run ended; stopped it (metrics.parquet has every step)")
            self._proc.kill()
            self._proc.wait()
            return False
        if code:  # its traceback is on stderr, above
            pump.say(f"the trackers' process ({', '.join(self.names)}) failed (exit code {code}); "
                     "metrics.parquet has every step")
        return code == 0

    def close(self, rows: list[dict]) -> bool:
        """A run that failed or was stopped: end the trackers' runs as failed, briefly."""
        return self.finish(rows, [], ok=False, timeout=pump.CLOSE_TIMEOUT_S)
