"""Stopping when told: SIGTERM or SIGINT (Ctrl-C) to ``rlpipe train``, or to the Snakemake running it.

``rlpipe train`` (``StopSignals``, installed once its Ray instance is up; before that the default
handlers apply, and there is nothing to save). The first signal asks the driver loop to stop at the
next round boundary (``RunContext.end_round``): the round's rows are finalized, a due validation is
collected, the checkpoint is written (atomically, as always: ``checkpoints/last.pt`` is the old file
or the new one, never a torn one) with the snapshot of the outputs it resumes from, and
``StopRequested`` unwinds the driver: ``ray.shutdown``, the run lock and GPU slots released, exit
status 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), and the resume advice printed.
The run stays unfinished (no ``run_info.json``), so ``--resume auto`` continues it.

Bounded in time, whatever the run is doing (a long generation, a stuck actor, a slow CUDA teardown):
- ``GRACE_S`` after the first signal, if the loop has not stopped yet, the main thread is interrupted
  where it is (a ``ray.get`` included: Ray checks for signals while it waits) with ``StopInterrupted``;
  the checkpoint on disk is then the last periodic one (a checkpoint being written stays a temporary
  file, deleted by the next run);
- ``HARD_S`` after it, the process exits at once (``os._exit``); the watchdog
  (``rlpipe.trainer.ray_reaper``) then stops its Ray processes within a few seconds;
- a second signal a second or more after the first (a user pressing Ctrl-C again) interrupts at once.
  One sooner is the same request delivered twice (a terminal's Ctrl-C reaches the job directly and
  through Snakemake) and is ignored.
The actors may be stopped by the same signal (a signal to a process group reaches Ray's processes,
which share the job's group); the driver's error about it is then reported as the stop it is.

Snakemake (``forward_stop_signals``, the workflow's ``onstart`` hook). Snakemake handles SIGTERM
"gracefully": it starts no new job and waits for the running ones to finish, and on SIGINT it waits
for them too; a signal sent to Snakemake alone (``kill``, a scheduler or ``timeout --foreground``)
therefore never reaches a training job, which can run for hours. The hook passes SIGTERM and SIGINT
on to the command of every running job first (Snakemake's child processes; for a job shell, the
commands it runs, not the shell itself, which then exits with its command's status), then lets
Snakemake's own handler act. The job stops within ``HARD_S`` seconds, and Snakemake exits when it
has. Linux only (it reads /proc); elsewhere Snakemake's behaviour is unchanged.

The seeds call ``ray.init()`` and leave signals to Ray and Python, whose SIGTERM handler exits
without writing anything and whose SIGINT leaves a traceback.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time

GRACE_S = 10.0  # after the first signal: reach a round boundary and write the checkpoint
HARD_S = 20.0  # after the first signal: exit at once (Snakemake must be gone within 30 s)
REPEAT_S = 1.0  # a second signal sooner than this after the first is the same request
SIGNALS = (signal.SIGTERM, signal.SIGINT)
SHELLS = frozenset({"bash", "sh", "dash", "zsh"})


class StopRequested(BaseException):
    """The run was told to stop (a signal); it stopped at a round boundary after writing its checkpoint.
    A BaseException, so that no ``except Exception`` on the way swallows it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class StopInterrupted(StopRequested):
    """The run was told to stop and did not reach a round boundary in time (or was told twice): it
    stopped where it was; the checkpoint on disk is the last one written before."""


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """SIGTERM/SIGINT handlers of ``rlpipe train`` (see the module docstring). ``requested`` is what
    the driver loop reads; ``restore`` puts the previous handlers back and cancels the deadlines."""

    def __init__(self, grace_s: float = GRACE_S, hard_s: float = HARD_S, repeat_s: float = REPEAT_S):
        self.grace_s, self.hard_s, self.repeat_s = grace_s, hard_s, repeat_s
        self.signum: int | None = None
        self._at = 0.0
        self._late = False  # the grace ran out: the next check interrupts the main thread
        self._previous: dict[int, object] = {}
        self._done = threading.Event()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    def install(self) -> StopSignals:
        """Install the handlers (from the main thread only; elsewhere a no-op: Python delivers
        signals to the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        self._done.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum, self._at = signum, time.monotonic()
            print(f"rlpipe train: {signal_name(signum)} received: stopping at the end of this round, after the "
                  f"checkpoint (at most {self.grace_s:g} s; exit within {self.hard_s:g} s)", file=sys.stderr,
                  flush=True)
            threading.Thread(target=self._deadlines, name="rlpipe-stop", daemon=True).start()
            return
        if self._late:
            raise StopInterrupted(f"the run did not reach the end of a round within {self.grace_s:g} s of the "
                                  f"{signal_name(self.signum)}", self.signum)
        if time.monotonic() - self._at >= self.repeat_s:
            raise StopInterrupted(f"{signal_name(signum)} received a second time", self.signum)

    def _deadlines(self) -> None:
        if self._done.wait(self.grace_s):
            return
        self._late = True
        if self._done.is_set():  # restored meanwhile: the signal would reach the previous handler
            return
        # the signal again, to the main thread: it interrupts a blocking call there (PEP 475) and
        # _handle, run there, raises
        signal.pthread_kill(threading.main_thread().ident, self.signum)
        if self._done.wait(max(self.hard_s - self.grace_s, 0.0)):
            return
        print(f"rlpipe train: still running {self.hard_s:g} s after the {signal_name(self.signum)}: exiting now "
              "(the watchdog stops the Ray processes; the checkpoint on disk is the last one written)",
              file=sys.stderr, flush=True)
        os._exit(self.exit_code)


# ----------------------------------------------------------------------------------- Snakemake side

def _stat(pid: int) -> tuple[str, int] | None:
    """(command name, parent pid) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    name = raw[raw.index("(") + 1: raw.rindex(")")]  # the name may hold spaces and parentheses
    return name, int(raw[raw.rindex(")") + 2:].split()[1])


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of ``pid``'s child processes."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] == pid:
                out.append((int(entry), st[0]))
    return out


def job_commands(pid: int) -> list[int]:
    """The processes to pass a stop signal to among the jobs of the Snakemake process ``pid``: each
    child, or for a job shell (``bash -c "set -euo pipefail; rlpipe train ..."``) the shell's
    children. Deeper processes (Ray's, below ``rlpipe train``) are left to the job."""
    out = []
    for child, name in children(pid):
        out += [c for c, _ in children(child)] if name in SHELLS else [child]
    return out


def _forward(signum: int, frame, previous) -> None:
    for pid in job_commands(os.getpid()):
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:  # what the signal would have done: end this process
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def forward_stop_signals() -> None:
    """Pass SIGTERM and SIGINT on to the running jobs' commands before Snakemake's own handlers
    (call it from the main thread, once Snakemake's scheduler has installed them: ``onstart``)."""
    if not os.path.isdir("/proc") or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        previous = signal.getsignal(sig)
        if getattr(previous, "func", None) is _forward:  # installed already
            continue
        signal.signal(sig, functools.partial(_forward, previous=previous))
