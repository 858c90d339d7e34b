"""The CPU time of a run's processes, including those that exit where the run cannot see them.

``rlpipe.trainer.conditions`` counts a run's own CPU time from its processes: the root (Snakemake,
or ``rlpipe train``'s driver) and everything below it. A process that exits is counted through its
parent's ``cutime``/``cstime`` (the kernel adds a child's whole CPU time to its parent's when the
parent reaps it). That fails for a process whose parent dies first: it is re-parented to PID 1 (or
a subreaper outside the run), which reaps it, and its CPU time leaves the run. Ray does this at every
shutdown: the driver stops the raylet, and the workers the raylet forked (the actors, where the
training ran) exit after it, as orphans. Measured over a whole pipeline from Snakemake's process
(``workflow/rules/setup.smk``), every training job's actors were then counted as "other processes",
and an idle machine was called contended.

So a ``Watch`` thread reads ``/proc`` every ``INTERVAL_S`` and keeps the run's *family*: the root, its
descendants, and every process that was once one of them, even after it is re-parented. For each
member it keeps the last seen (ppid, own ticks, reaped children's ticks). When members vanish between
two polls, each is charged to its nearest member ancestor still alive (following the last seen
parents); that ancestor's reaped-children ticks grew by G in the meantime, and the vanished members
under it had X ticks at their last sight (less what they had at the watch's start). If the ancestor
reaped them, G >= X and nothing is added (its ``cutime`` carries them, counted once); what G does not
cover, ``max(X - G, 0)``, was reaped elsewhere and is added to ``lost``. A member whose last seen
parent is outside the family is charged in full.

What it still misses: an orphan's CPU time after its last poll (at most ``INTERVAL_S`` of it; an
actor exiting at shutdown is idle then), and a process that starts, is orphaned and exits between
two polls. Not measured here: processes that leave by ``setsid`` *and* are never seen (none of the
pipeline's). Linux only (``/proc``); elsewhere the caller records no tree. Not in the seeds.
"""

from __future__ import annotations

import threading
from pathlib import Path

#: seconds between two reads of /proc (one read of ~100 processes costs about 5 ms of CPU)
INTERVAL_S = 0.5
_PROC = Path("/proc")

Key = tuple[int, int]  # (pid, start tick): a reused pid is another process


def parse_pid_times(text: str) -> tuple[int, int, int, float, float]:
    """(pid, ppid, start tick, own CPU ticks, CPU ticks of reaped children) from a ``/proc/<pid>/stat``
    line. The command name (field 2) is in parentheses and may hold spaces, so fields are counted
    from the last ')'."""
    head, _, tail = text.rpartition(")")
    rest = tail.split()  # rest[0] is field 3 (state)
    pid = int(head.split("(", 1)[0])
    utime, stime, cutime, cstime = (float(x) for x in rest[11:15])  # fields 14-17
    return pid, int(rest[1]), int(rest[19]), utime + stime, cutime + cstime  # ppid: 4, starttime: 22


def read_all() -> dict[int, tuple[int, int, float, float]]:
    """Every process now: pid -> (ppid, start tick, own ticks, reaped children's ticks)."""
    out = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            try:
                pid, ppid, started, own, children = parse_pid_times((entry / "stat").read_text())
            except (OSError, ValueError, IndexError):  # exited meanwhile, or unreadable
                continue
            out[pid] = (ppid, started, own, children)
    return out


def vanished_ticks(prev: dict[Key, tuple[int, float, float]], alive: dict[Key, tuple[int, float, float]],
                   base: dict[Key, float]) -> float:
    """Ticks of the members in ``prev`` (key -> (ppid, own, children)) gone from ``alive`` that no
    member reaped: per nearest alive member ancestor, ``max(X - G, 0)`` (module docstring)."""
    by_pid = {k[0]: k for k in prev}
    owed: dict[Key | None, float] = {}
    for key in prev.keys() - alive.keys():
        ppid, own, children = prev[key]
        up, hops = by_pid.get(ppid), 0
        while up is not None and up not in alive and hops < len(prev):  # bounded: pids form a tree
            up, hops = by_pid.get(prev[up][0]), hops + 1
        up = up if up in alive else None
        owed[up] = owed.get(up, 0.0) + own + children - base.get(key, 0.0)
    lost = 0.0
    for anc, x in owed.items():
        grown = alive[anc][2] - prev[anc][2] if anc is not None else 0.0
        lost += max(x - grown, 0.0)
    return lost


class Watch:
    """The family of ``root`` (module docstring), polled by a daemon thread every ``interval`` s."""

    def __init__(self, root: int, interval: float = INTERVAL_S):
        self.root, self.interval = root, interval
        self._lock = threading.Lock()
        self.members: dict[Key, tuple[int, float, float]] = {}
        self.lost = 0.0
        self.base: dict[Key, float] = {}
        self.poll()
        self.base = {k: own + ch for k, (_, own, ch) in self.members.items()}
        threading.Thread(target=self._run, name="rlpipe-process-watch", daemon=True).start()

    def _run(self) -> None:
        while True:
            threading.Event().wait(self.interval)
            try:
                self.poll()
            except OSError:  # /proc unreadable for a moment: the next poll catches up
                continue

    def poll(self) -> tuple[dict[Key, float], float]:
        """Read /proc now: ({member key: own + children ticks} of the members alive, lost ticks)."""
        procs = read_all()
        with self._lock:
            children: dict[int, list[int]] = {}
            for pid, (ppid, *_) in procs.items():
                children.setdefault(ppid, []).append(pid)
            known = {k[0] for k in self.members}
            todo = [pid for pid, p in procs.items() if pid == self.root or (pid in known and (pid, p[1]) in
                                                                             self.members)]
            alive: dict[Key, tuple[int, float, float]] = {}
            while todo:
                pid = todo.pop()
                ppid, started, own, ch = procs[pid]
                if (pid, started) not in alive:
                    alive[(pid, started)] = (ppid, own, ch)
                    todo += children.get(pid, [])
            self.lost += vanished_ticks(self.members, alive, self.base)
            self.members = alive
            return {k: own + ch for k, (_, own, ch) in alive.items()}, self.lost


_WATCHES: dict[int, Watch] = {}
_WATCHES_LOCK = threading.Lock()


def watch(root: int) -> Watch:
    """The one watch of ``root`` in this process, started on first use."""
    with _WATCHES_LOCK:
        if root not in _WATCHES:
            _WATCHES[root] = Watch(root)
        return _WATCHES[root]
