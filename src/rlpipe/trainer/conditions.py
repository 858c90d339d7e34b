"""The machine's conditions over a training run: how busy the machine was with other work.

Timings on a shared machine depend on what else runs there (the same ``disagg``
run gave 1.37x ``onpolicy`` on the idle 2-core machine and 0.93x with one or two other processes
busy), so every run records, in ``run_info.json["conditions"]`` (keys:
``rlpipe.contract.RUN_CONDITIONS_KEYS``):

- ``load_avg_start`` / ``load_avg_end``: the 1-minute load average (``os.getloadavg``) when
  training starts and ends. Context only: it is an exponentially damped average over the last
  minute, so the start value describes the minute *before* the run, and it counts the run's own
  threads and tasks waiting on I/O alike.
- ``cpus``: the CPUs the kernel accounts in ``/proc/stat`` (``cpuN`` lines).
- ``wall_s``, ``own_cpu_s``, ``other_cpu_s``: seconds between the two samples; CPU seconds of the
  run's own processes; CPU seconds every other process (and a hypervisor's ``steal``) took meanwhile:
  the machine's busy time from ``/proc/stat`` (user + nice + system + irq + softirq + steal; guest
  time is already inside user/nice) minus ``own_cpu_s``, clamped at 0.
- ``other_cpu_frac``: ``other_cpu_s / (wall_s * cpus)``, the share of the machine others took.
- ``run_cores``: the cores the run itself asks for (its actors' threads plus one for the driver
  and Ray's own processes), given by the caller.
- ``contended``: see ``decide_contended``; ``None`` when it could not be measured.
- ``note``: why a value is missing (empty when nothing is).

Own CPU time, and its approximation: the run's processes are the sampling process (the driver, or
Snakemake's process for the whole pipeline) and all its descendants, read from ``/proc/<pid>/stat``
(utime + stime + cutime + cstime, in the same clock ticks as ``/proc/stat``; psutil reads the same
fields, so it is not needed). A local Ray instance is started by the driver, so its GCS, raylet and
the workers the raylet forks are descendants. Each process counts its CPU time since the start
sample (its whole lifetime if it started later), including children it reaped. A process whose
parent dies first is re-parented outside the run and reaped there (Ray's workers at every shutdown),
so the first sample starts a watch (``rlpipe.trainer.process_watch``) that follows every process that
was once the run's and adds what such a process had used when last seen; its limits are in that
module (an orphan's last poll interval, and one orphaned before it is first seen). One reaped by the
tree counts its whole lifetime, including any part before the start sample: small next to a run.
When the driver attaches to an existing Ray cluster
(``ray.address``) the actors are not its descendants (and may be on other hosts): other CPU time
is then not measured (``None``) and ``contended`` is ``None``; the load average is still recorded.
Elsewhere than Linux (no ``/proc``) only the load average is recorded.

A resumed run records the conditions of its last segment only.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rlpipe.contract import (  # the one contention rule, shared with the benchmarks' text
    OTHER_CPU_THRESHOLD,  # noqa: F401 - re-exported
    RUN_CONDITIONS_KEYS,
    decide_contended,
)
from rlpipe.trainer import process_watch
from rlpipe.trainer.process_watch import parse_pid_times

#: /proc/stat columns that are busy time (after "cpu"): user nice system idle iowait irq softirq
#: steal guest guest_nice. guest/guest_nice are already counted in user/nice.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
_PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    """One reading of the machine: monotonic time, 1-minute load, busy ticks of all CPUs, the
    number of CPUs, and the CPU ticks of each process of the run's tree by ``(pid, start tick)``
    (``None``: not measured)."""

    t: float
    load: float
    busy_ticks: float
    cpus: int
    tree: dict[tuple[int, int], float] | None
    #: CPU ticks of the run's processes that exited where no process of the run reaped them, up to
    #: this sample, since the run's watch began (``Watch``; 0 without one)
    lost: float = 0.0


@dataclass(frozen=True)
class Conditions:
    """The conditions over a run (see the module docstring); NaN = not measured."""

    load_avg_start: float
    load_avg_end: float
    cpus: int
    run_cores: float
    wall_s: float
    own_cpu_s: float
    other_cpu_s: float
    other_cpu_frac: float
    contended: bool | None
    note: str = ""

    def to_json(self) -> dict:
        """The run_info ``conditions`` dict: NaN becomes ``None`` (JSON has no NaN)."""
        out = {k: getattr(self, k) for k in RUN_CONDITIONS_KEYS}
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


# --------------------------------------------------------------------------- pure arithmetic


def parse_proc_stat(text: str) -> tuple[float, int]:
    """(busy ticks summed over all CPUs, number of CPUs) from the text of ``/proc/stat``."""
    busy, cpus = math.nan, 0
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "cpu":
            values = [float(x) for x in fields[1:]]
            busy = sum(values[i] for i in _BUSY_FIELDS if i < len(values))
        elif fields[0].startswith("cpu") and fields[0][3:].isdigit():
            cpus += 1
    return busy, cpus


def parse_pid_stat(text: str) -> tuple[int, int, int, float]:
    """(pid, ppid, start tick, CPU ticks incl. reaped children) from a ``/proc/<pid>/stat`` line."""
    pid, ppid, started, own, children = parse_pid_times(text)
    return pid, ppid, started, own + children


def descendants(parents: dict[int, int], root: int) -> set[int]:
    """``root`` and every process below it, from a pid -> ppid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def tree_cpu_delta(start: dict[tuple[int, int], float], end: dict[tuple[int, int], float]) -> float:
    """CPU ticks the tree used between two samples: per process (pid and start tick, so a reused
    pid is a new process) its end value minus its start value, or its whole end value if it
    started after the start sample. Processes gone by the end add nothing (module docstring)."""
    return sum(v - start.get(key, 0.0) for key, v in end.items())


def other_cpu_seconds(busy_start: float, busy_end: float, own_s: float, hz: float) -> float:
    """CPU seconds of everything but the run: the machine's busy seconds minus the run's own,
    clamped at 0 (the two are read at slightly different moments)."""
    return max((busy_end - busy_start) / hz - own_s, 0.0)


def conditions_between(start: Sample, end: Sample, hz: float, run_cores: float | None = None,
                       note: str = "") -> Conditions:
    """The conditions over the interval between two samples (pure: no system reads)."""
    wall = end.t - start.t
    cpus = end.cpus or start.cpus
    own = other = frac = math.nan
    if start.tree is not None and end.tree is not None:
        own = (tree_cpu_delta(start.tree, end.tree) + end.lost - start.lost) / hz
        if not (math.isnan(start.busy_ticks) or math.isnan(end.busy_ticks)):
            other = other_cpu_seconds(start.busy_ticks, end.busy_ticks, own, hz)
            frac = other / (wall * cpus) if wall > 0 and cpus > 0 else math.nan
    if math.isnan(other) and not note:
        note = "other CPU time not measured (no /proc on this system)"
    return Conditions(start.load, end.load, cpus, math.nan if run_cores is None else float(run_cores), wall,
                      own, other, frac, decide_contended(other, wall, cpus, run_cores), note)


# --------------------------------------------------------------------------- reading the system


def clock_ticks() -> float:
    """USER_HZ, the unit of /proc/stat and /proc/<pid>/stat times (100 on Linux)."""
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


def _load() -> float:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # not on Windows
        return math.nan


def sample(own_tree: bool = True) -> Sample:
    """Read the machine now. ``own_tree=False`` (the run's work is not this process's
    descendants, e.g. an attached Ray cluster) skips the process tree. With it, the first sample
    of a process starts its ``Watch`` (rlpipe.trainer.process_watch), which follows the run's
    processes until this process exits; later samples read it."""
    try:
        busy, cpus = parse_proc_stat((_PROC / "stat").read_text())
    except OSError:
        busy, cpus = math.nan, 0
    tree, lost = None, 0.0
    if own_tree and (_PROC / "self" / "stat").exists():
        tree, lost = process_watch.watch(os.getpid()).poll()
    return Sample(time.monotonic(), _load(), busy, cpus or (os.cpu_count() or 0), tree, lost)


def measure(start: Sample, own_tree: bool = True, run_cores: float | None = None) -> Conditions:
    """Sample now and return the conditions since ``start``."""
    note = "" if own_tree else ("attached to a Ray cluster: its actors are not this process's descendants, "
                                "so other processes' CPU time is not measured")
    return conditions_between(start, sample(own_tree), clock_ticks(), run_cores, note)
