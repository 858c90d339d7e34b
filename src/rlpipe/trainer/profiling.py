"""Phase timing for the driver and the actors (verl's ``marked_timer`` idea), and the GPU busy fraction.

Each actor owns a ``Profiler``; work is wrapped in ``with prof.phase("generate", step, version)``.
Events carry absolute wall times (``time.time()``: comparable across processes on one host, and
across NTP-synced hosts to a few ms); the run writer converts them to seconds since run start.
The driver drains actors' events once per step, so nothing accumulates unboundedly. Phase names
are ``rlpipe.contract.PHASES`` (re-exported here).

A run's summary of both goes into ``run_info.json``:
- ``phase_split`` (``phase_split``): the median seconds per optimizer step of each timed phase,
  ``other`` (the step's wall time that no stacked phase covers: driver work, Ray calls, host
  synchronisation; 0 where phases overlap, as generation and training do in a disaggregated run) and
  ``step`` (the median step time). Medians, so that the first steps' warm-up and a checkpoint
  step do not weigh in.
- ``gpu_busy`` (``GpuBusy``): NVML's utilisation of the job's GPUs (``torch.cuda.utilization``, which
  reads NVML through the ``pynvml`` module of the locked ``nvidia-ml-py`` and does not initialise
  CUDA in the driver), sampled every ``GPU_BUSY_INTERVAL_S`` by a background thread of the driver
  over the training loop (after the initial validation, or after the restore of a resumed run).
  NVML's figure is the share of its sample period in which some kernel ran: a launch-bound loop of
  small kernels reads busy while it uses a sliver of the chip. ``null``, with the reason, on CPU or
  where NVML cannot be read; a GPU run whose sampler cannot start (no ``nvidia-ml-py``, no driver)
  or that loses NVML says so once in the run's log, and nothing is sampled in its place (starting
  ``nvidia-smi`` five times a second would load the driver's CPU for the whole timed run).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

from rlpipe.contract import OTHER, PHASES, STEP_STACK_PHASES, TIMED_PHASES, metric_time_column
from rlpipe.rl.records import PhaseEvent

__all__ = ["PHASES", "GpuBusy", "Profiler", "phase_split", "seconds_by_phase"]

GPU_BUSY_INTERVAL_S = 0.2


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


def phase_split(rows: list[dict]) -> dict[str, float | None]:
    """Median seconds per optimizer step of each timed phase, ``other`` and ``step`` (see the module
    docstring), over the metrics ``rows`` of trained steps (step > 0, with a previous row to time
    the step from); None where no step has the value."""
    rows = sorted(rows, key=lambda r: r["step"])
    per: dict[str, list[float]] = defaultdict(list)
    for prev, row in zip(rows, rows[1:], strict=False):
        if row["step"] <= 0:
            continue
        dt = row["wall_time"] - prev["wall_time"]
        phases = {p: row.get(metric_time_column(p)) for p in TIMED_PHASES}
        for p, v in phases.items():
            if v is not None and v == v:
                per[p].append(float(v))
        if dt == dt and all(phases[p] is not None and phases[p] == phases[p] for p in STEP_STACK_PHASES):
            per["step"].append(float(dt))
            per[OTHER].append(max(dt - sum(phases[p] for p in STEP_STACK_PHASES), 0.0))
    return {k: (statistics.median(per[k]) if per[k] else None) for k in (*TIMED_PHASES, OTHER, "step")}


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class GpuBusy:
    """The GPU busy fraction of the job's ``gpus`` GPUs, sampled in a background thread (see the
    module docstring). ``read`` returns one utilisation percentage per GPU (default: NVML through
    ``torch.cuda.utilization``); ``log`` gets the one line a GPU run writes when the sampler cannot
    start or stops (default: stderr, the run's log)."""

    def __init__(self, gpus: int, interval_s: float = GPU_BUSY_INTERVAL_S,
                 read: Callable[[], list[float]] | None = None, log: Callable[[str], None] = _to_stderr):
        self.gpus, self.interval_s = gpus, interval_s
        self.samples: list[tuple[float, list[float]]] = []  # (time.time(), percent per GPU)
        self.reason: str | None = None  # why there is no figure
        self._read = read or self._nvml
        self._log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _nvml(self) -> list[float]:
        """NVML through torch (the job's GPUs: indices into CUDA_VISIBLE_DEVICES, which the GPU slots
        set). Raises ``ModuleNotFoundError`` without ``nvidia-ml-py``."""
        import torch

        return [float(torch.cuda.utilization(i)) for i in range(self.gpus)]  # an index: no CUDA init here

    def _give_up(self, reason: str) -> None:
        self.reason = reason
        self._log(f"rlpipe train: the GPU busy fraction is not sampled ({reason}); run_info.json's gpu_busy "
                  "is null. NVML comes with `pip install nvidia-ml-py` (in requirements/lock.txt)")

    def start(self, remote: bool = False) -> GpuBusy:
        """Start sampling; ``remote``: the actors run on a Ray cluster this process cannot read."""
        if self.gpus <= 0 or remote:
            self.reason = ("the actors run on an attached Ray cluster: their GPUs are not this machine's" if remote
                           else "no GPU: the run's device is the CPU")
            return self
        try:
            self._read()  # fails here, once, where NVML is unavailable (no driver, no pynvml)
        except Exception as e:  # torch raises ModuleNotFoundError, pynvml its own NVMLError types
            self._give_up(f"NVML cannot be read: {type(e).__name__}: {e}")
            return self
        self._thread = threading.Thread(target=self._run, name="rlpipe-gpu-busy", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append((time.time(), self._read()))
            except Exception as e:  # a GPU lost mid-run: keep what was sampled
                self._give_up(f"NVML stopped answering: {type(e).__name__}: {e}")
                return

    def stop(self, since: float) -> dict:
        """Stop sampling; the summary of the samples taken at or after ``since`` (``time.time()``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        kept = [v for t, v in self.samples if t >= since and v]
        if not kept:
            return {"busy_fraction": None, "per_device": [], "samples": 0, "interval_s": self.interval_s,
                    "reason": self.reason or "no sample in the training loop (shorter than the interval)"}
        per_device = [statistics.fmean(v[d] for v in kept) / 100 for d in range(min(len(v) for v in kept))]
        return {"busy_fraction": statistics.fmean(per_device), "per_device": per_device, "samples": len(kept),
                "interval_s": self.interval_s, "reason": None}
