"""The background writer of the trackers: each tracker on a thread of its own, fed the latest rows.

The run writer hands every flush's rows to ``TrackerSet.submit``, which only swaps a reference under
a lock and returns: a tracker that is slow to import, log in or upload, that blocks on a dead
server, or that raises, never holds up the training loop. Each tracker's thread (``_Pump``) keeps
the latest rows only (memory stays bounded however far a tracker falls behind) and logs the rows
past the last step it logged (``TrackerState``), so a tracker that catches up late still logs
every step once, in order.

A tracker that raises is switched off for the rest of the run, said once in the run's log. At the
end of the run ``finish`` hands each tracker the final rows and files and waits for all of them
together, at most ``timeout`` seconds (a failed or stopped run: ``close``, shorter, so that a stop
stays within its deadlines); one that has not finished by then is named once and left behind on its
daemon thread. ``metrics.parquet`` stays the contract: a tracker is a copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from rlpipe.trainer.trackers.base import RunSpec, Tracker
from rlpipe.trainer.trackers.figures import run_figures
from rlpipe.trainer.trackers.state import TrackerState

#: seconds ``finish`` waits for the trackers at the end of a run (uploads of a W&B online run)
FINISH_TIMEOUT_S = 30.0
#: seconds ``close`` waits after a failure or a stop (within a stop's deadlines)
CLOSE_TIMEOUT_S = 5.0


def say(message: str) -> None:
    print(f"rlpipe trackers: {message}", flush=True)


class _Pump:
    """One tracker's thread: open, then log the latest rows whenever there are new ones, then finish."""

    def __init__(self, tracker: Tracker, spec: RunSpec, state: TrackerState, say: Callable[[str], None]):
        self.tracker, self.spec, self.state, self.say = tracker, spec, state, say
        self._cond = threading.Condition()
        self._rows: list[dict] | None = None  # the latest rows not yet looked at
        self._end: tuple[list[Path], bool] | None = None  # (files, ok) once the run has ended
        self.done = threading.Event()
        self.failed = False
        self._thread = threading.Thread(target=self._work, name=f"rlpipe-tracker-{tracker.name}", daemon=True)
        self._thread.start()

    def submit(self, rows: list[dict]) -> None:
        with self._cond:
            self._rows = rows
            self._cond.notify()

    def end(self, rows: list[dict], files: list[Path], ok: bool) -> None:
        with self._cond:
            if self._end is None:
                self._rows, self._end = rows, (files, ok)
                self._cond.notify()

    def _work(self) -> None:
        name = self.tracker.name
        try:
            self.tracker.open(self.spec)
            while True:
                with self._cond:
                    while self._rows is None and self._end is None:
                        self._cond.wait()
                    rows, end = self._rows, self._end
                    self._rows = None
                if rows is not None:
                    self._log(rows)
                if end is not None:
                    files, ok = end
                    if ok and self.tracker.wants_files:  # the run's figures, drawn once for every tracker
                        files = [*files, *self._figures(rows or [])]
                    self.tracker.finish(files, ok)
                    return
        except BaseException as e:  # a tracker never fails the run: said once, then it is off
            self.failed = True
            first = (str(e).strip() or type(e).__name__).splitlines()[0][:300]
            self.say(f"{name} failed ({type(e).__name__}: {first}); it logs nothing more of this run "
                     "(metrics.parquet has every step)")
        finally:
            self.done.set()

    def _figures(self, rows: list[dict]) -> list[Path]:
        try:
            return run_figures(self.spec.run_dir, rows)
        except Exception as e:  # the tracker still gets its files and ends its run
            self.say(f"{self.tracker.name}: the run's figures could not be drawn ({type(e).__name__}: {e})")
            return []

    def _log(self, rows: list[dict]) -> None:
        after = self.state.after(self.tracker.name)
        new = sorted((r for r in rows if int(r["step"]) > after), key=lambda r: int(r["step"]))
        if new:
            self.tracker.log_rows(new)
            self.state.logged(self.tracker.name, int(new[-1]["step"]))


class TrackerSet:
    """Every tracker of a run, each behind its ``_Pump``."""

    def __init__(self, trackers: list[Tracker], spec: RunSpec, state: TrackerState,
                 say: Callable[[str], None] = say):
        self.spec, self.state, self.say = spec, state, say
        self._pumps = [_Pump(t, spec, state, say) for t in trackers]
        self._ended = False

    @property
    def names(self) -> list[str]:
        return [p.tracker.name for p in self._pumps]

    def submit(self, rows: list[dict]) -> None:
        """Hand the run's rows to every tracker; returns at once."""
        for p in self._pumps:
            p.submit(rows)

    def finish(self, rows: list[dict], files: list[Path], ok: bool = True,
               timeout: float | None = None) -> list[str]:
        """End every tracker's run with the final ``rows`` and ``files``, waiting at most ``timeout``
        seconds for all of them; returns the names of those that had not finished (each said once).
        A second call does nothing."""
        if self._ended:
            return []
        self._ended = True
        timeout = FINISH_TIMEOUT_S if timeout is None else timeout
        for p in self._pumps:
            p.end(rows, files, ok)
        deadline = time.monotonic() + timeout
        late = [p for p in self._pumps if not p.done.wait(max(0.0, deadline - time.monotonic()))]
        for p in late:
            self.say(f"{p.tracker.name} had not finished {timeout:g} s after the run ended; the run ends "
                     "without it (its tracker run may lack the last steps; metrics.parquet has every step)")
        return [p.tracker.name for p in late]

    def close(self, rows: list[dict]) -> list[str]:
        """A run that failed or was stopped: end the trackers' runs as failed, briefly."""
        return self.finish(rows, [], ok=False, timeout=CLOSE_TIMEOUT_S)
