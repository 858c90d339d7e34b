"""Phase timing for the driver and the actors (verl's ``marked_timer`` idea).

Each actor owns a ``Profiler``; work is wrapped in ``with prof.phase("generate", step, version)``.
Events carry absolute wall times (``time.time()``: comparable across processes on one host, and
across NTP-synced hosts to a few ms); the run writer converts them to seconds since run start.
The driver drains actors' events once per step, so nothing accumulates unboundedly. Phase names
are ``rlpipe.analysis.contract.PHASES`` (re-exported here).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

from rlpipe.analysis.contract import PHASES, TIMED_PHASES, metric_time_column
from rlpipe.rl.records import PhaseEvent

__all__ = ["PHASES", "Profiler", "seconds_by_phase"]


class Profiler:
    def __init__(self, actor: str):
        self.actor = actor
        self._events: list[PhaseEvent] = []

    @contextlib.contextmanager
    def phase(self, name: str, step: int, version: int) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {PHASES}")
        start = time.time()
        try:
            yield
        finally:
            self._events.append(PhaseEvent(name, self.actor, start, time.time(), step, version))

    def record(self, name: str, start: float, end: float, step: int, version: int) -> None:
        self._events.append(PhaseEvent(name, self.actor, start, end, step, version))

    def drain(self) -> list[PhaseEvent]:
        events, self._events = self._events, []
        return events


def seconds_by_phase(events: list[PhaseEvent]) -> dict[str, float]:
    """Total seconds per phase, as ``time/<phase>`` metric keys (every timed phase present)."""
    out: dict[str, float] = defaultdict(float)
    for e in events:
        out[e.phase] += e.seconds
    return {metric_time_column(p): float(out.get(p, 0.0)) for p in TIMED_PHASES}
