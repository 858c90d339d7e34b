"""The watchdog that stops a local Ray instance when its ``rlpipe train`` driver is killed.

Why: ``ray.shutdown`` stops the Ray processes a driver started, but a driver killed with SIGKILL
(``kill -9``, the OOM killer, a pre-emption) runs no Python at all. Ray then stops its processes by
itself, but not all at once: on Ray 2.60 the dashboard and runtime-env agents (and sometimes more)
live on with their sockets open until Ray's own timeout reaps them, a minute or more later, and Ray
has no setting that shortens it. The course seeds call ``ray.init()`` and leave this to Ray.
Linux only (it reads /proc); elsewhere no watchdog starts and Ray's own timeout applies.

How: when ``rlpipe train`` starts its own Ray instance (never when it attaches to a cluster with
``ray.address``), it starts this module as a child process in a session of its own, with the
driver's pid and the Ray session directory. The watchdog uses only the standard library and does
nothing but poll, every half second, whether its parent is still the driver (a killed parent's
children are handed to another process, so this cannot be fooled by a reused pid). When the driver
is gone it sends SIGTERM to every process of that Ray session, then SIGKILL to those left after a
few seconds, and exits. On a normal exit (or an exception) the driver calls ``ray.shutdown`` and
then stops the watchdog with SIGTERM, which ends it before it touches anything.

A process belongs to the session when its command line names the session (``session_<date>_<pid>``
as a whole word, as the GCS, raylet, log monitor and dashboard carry it) or one of its open files
lies inside the session directory: Ray's agents and workers rename themselves (``ray::DashboardAgent``,
``ray::<Actor>``) and their command line no longer says which session they belong to, but their
stdout and stderr are log files in it. Another Ray session's processes (a second trainer on the same
machine) match neither, and are never touched.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

POLL_S = 0.5  # how often the watchdog looks for its driver
GRACE_S = 3.0  # SIGTERM, then SIGKILL for what is left after this long
PROC = "/proc"


@dataclass(frozen=True)
class ProcInfo:
    """What the watchdog reads of one process: its pid, its command line and the targets of its
    open file descriptors (as ``readlink`` gives them: absolute paths, or ``socket:[...]`` etc.)."""
    pid: int
    cmdline: tuple[str, ...]
    open_paths: tuple[str, ...] = ()


def session_pids(procs: Iterable[ProcInfo], session_dir: str, exclude: Iterable[int] = ()) -> list[int]:
    """The pids among ``procs`` that belong to the Ray session in ``session_dir`` (see the module
    docstring), except those in ``exclude``."""
    session_dir = os.path.normpath(session_dir)
    name = re.compile(r"(?<![\w.-])" + re.escape(os.path.basename(session_dir)) + r"(?![\w.-])")
    inside = session_dir + os.sep
    skip = set(exclude)
    return [p.pid for p in procs if p.pid not in skip and (
        any(name.search(arg) for arg in p.cmdline)
        or any(path == session_dir or path.startswith(inside) for path in p.open_paths))]


def read_proc(pid: int, with_files: bool = True) -> ProcInfo | None:
    """``pid``'s entry under /proc, or None if it is gone or not ours to read. A zombie has an empty
    command line and no open files, so it never matches (it is dead already)."""
    base = f"{PROC}/{pid}"
    try:
        with open(f"{base}/cmdline", "rb") as f:
            cmdline = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
        paths = []
        if with_files:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    paths.append(os.readlink(f"{base}/fd/{fd}"))
                except OSError:
                    pass
    except OSError:  # gone, or another user's process
        return None
    return ProcInfo(pid, cmdline, tuple(paths))


def scan() -> list[ProcInfo]:
    procs = (read_proc(int(e)) for e in os.listdir(PROC) if e.isdigit())
    return [p for p in procs if p is not None]


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(session_dir: str, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every process of the session, SIGKILL those left after ``grace_s``; the pids found."""
    me = [os.getpid()]
    found = session_pids(scan(), session_dir, exclude=me)
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = found
    while left and time.monotonic() < deadline:
        time.sleep(0.25)  # a scan reads every process's open files: keep it rare on a busy machine
        left = session_pids(scan(), session_dir, exclude=me)
    for _ in range(3):  # a process may have started (a worker) while the others stopped
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        found += [p for p in left if p not in found]
        time.sleep(0.1)
        left = session_pids(scan(), session_dir, exclude=me)
    return found


def watch(driver_pid: int, session_dir: str, poll_s: float = POLL_S) -> list[int]:
    """Wait until this process's parent is no longer ``driver_pid``, then :func:`reap`."""
    while os.getppid() == driver_pid:
        time.sleep(poll_s)
    return reap(session_dir)


def start(session_dir: str) -> subprocess.Popen | None:
    """The watchdog for this process (the driver) and the Ray session in ``session_dir``; None where
    there is no /proc to read (not Linux). Its own session: a signal to the driver's process group
    (Ctrl-C, ``kill -- -PGID``) does not reach it."""
    if not os.path.isdir(PROC):
        return None
    return subprocess.Popen([sys.executable, "-m", __name__, "--pid", str(os.getpid()), "--session", session_dir],
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> None:
    """End the watchdog without it touching anything (the driver shut Ray down itself)."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """``pid``'s command name and the fields of ``/proc/<pid>/stat`` after it (``[0]`` the state:
    ``Z`` a zombie, ``X`` dead; ``[19]`` the start time in clock ticks after boot), or None if it
    is gone or unreadable."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.index("(") + 1: raw.rindex(")")], raw[raw.rindex(")") + 2:].split()


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has, though not yet reaped). Where
    its /proc entry cannot be read (gone, hidden, or not Linux) the kernel is asked instead, which
    counts a zombie as running."""
    stat = proc_stat(pid)
    return _alive(pid) if stat is None else stat[1][0] not in ("Z", "X")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlpipe.trainer.ray_reaper",
                                description="stop a Ray session's processes when its driver dies")
    p.add_argument("--pid", type=int, required=True, help="the driver: this process's parent")
    p.add_argument("--session", required=True, help="the Ray session directory")
    a = p.parse_args(argv)
    if os.getppid() != a.pid and _alive(a.pid):
        p.error(f"--pid {a.pid} is not this process's parent ({os.getppid()}): start it from the driver")
    watch(a.pid, os.path.realpath(a.session))  # open files read back resolved: /tmp may be a link
    return 0


if __name__ == "__main__":
    sys.exit(main())
