"""What an actor's failure says about its cause, in words for the driver's error message.

Ray reports an actor's failure to the driver in one of three shapes, and each carries its cause
differently:
- the actor raised in ``__init__`` (a bad device, an unreadable input): ``ActorDiedError`` with
  ``actor_init_failed``; the exception and its traceback are only text, in ``error_msg``;
- a method raised mid-run: ``RayTaskError`` whose ``cause`` is the exception itself and whose
  ``str`` ends with the remote traceback;
- the process went away without a Python error (``ray.kill``, SIGKILL, the kernel's OOM killer, a
  crash): ``ActorDiedError`` whose message says how Ray saw it (``killed by `ray.kill```, or the
  worker's exit type), with the process id; there is no traceback. What the process printed is in
  its log file under the Ray session's log directory (``worker-<id>-<job>-<pid>.err``); its last
  lines are quoted when it printed anything besides Ray's own header, and the file is named only
  then (on a cluster that file lies on the node that ran the actor: it is read only when it is on
  this machine).

The driver's message then states the case, the exception (type and message) and the last frames
of its traceback, instead of pointing to "the Ray logs": a job log need not contain them (Ray
forwards a worker's output to the driver asynchronously, and a driver that fails at once may exit
before it arrives).

An actor on another node whose node left the cluster (its machine failed, or the allocation lost it)
first answers ``ActorUnavailableError`` ("Socket closed"), which says nothing of why; once Ray's
health check declares that node dead (``node_lost`` waits for it, bounded), the message names the
node and Ray's reason ("health check failed due to missing too many heartbeats").
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MARKS = re.compile(r"^\s*[\^~]+\s*$")  # Python 3.11's caret lines under a traceback's code
_FRAME = re.compile(r'^\s*File "')
_PID = re.compile(r"\bpid[:=] ?(\d+)")
_EXIT = re.compile(r"Worker exit type: (\w+)")
#: the traceback frames and log lines quoted in a message
TAIL = 4
_MAX_TEXT = 400  # an exception's message, cut (a message can hold a whole tensor)
_FIX = "Rerunning fails the same way until the cause above is fixed (a setting, an input or the code)."
_KILLED = "Nothing in the run caused this: a rerun is safe."
_SIGNAL = ("If the kernel's OOM killer ended it (`dmesg` says so), free memory or lower the batch sizes; "
           "otherwise a rerun is safe.")


@dataclass(frozen=True)
class Cause:
    """``case`` completes "the <actor> ...": e.g. "failed at start-up: its __init__ raised
    RuntimeError: ..."; ``lines`` are the quoted traceback or log lines; ``advice`` says what to do."""

    case: str
    lines: list[str] = field(default_factory=list)
    advice: str = _FIX


def describe(err: BaseException) -> Cause:
    """The cause behind a ``RayActorError`` or ``RayTaskError`` from an actor."""
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = getattr(err, "cause", None)
        text = f"{type(cause).__name__}: {_one_line(str(cause))}" if cause is not None else _exception_line(str(err))
        return Cause(f"raised {text}", _frames(str(err)))
    msg = _ANSI.sub("", getattr(err, "error_msg", None) or str(err))
    if getattr(err, "actor_init_failed", False):
        return Cause(f"failed at start-up: its __init__ raised {_exception_line(msg)}", _frames(msg))
    if "ray.kill" in msg:
        return Cause("died: it was killed with ray.kill (by an operator or another program)", advice=_KILLED)
    pid = _PID.search(msg)
    exit_type = _EXIT.search(msg)
    how = f"Ray saw worker exit type {exit_type.group(1)}" if exit_type else "Ray gave no exit type"
    case = (f"died: its process{f' (pid {pid.group(1)})' if pid else ''} exited without a Python error, "
            f"so it was killed by a signal (SIGKILL, the kernel's OOM killer) or crashed ({how})")
    return Cause(case, _log_tail(int(pid.group(1))) if pid else [], advice=_SIGNAL)


#: how long the driver waits for Ray to declare an unreachable actor's node dead (its health check
#: misses a few heartbeats first: ~15 s measured on Ray 2.60)
NODE_LOSS_WAIT_S = 45.0
_NODE_LOST = ("A lost node is not the run's fault: a rerun is safe once the allocation has its nodes "
              "(SLURM requeues or reruns the job on healthy ones).")


def node_lost(node: dict[str, str], wait_s: float) -> Cause | None:
    """The cause when an actor's node (``placement.node_ref``'s record) has left the Ray cluster,
    waiting up to ``wait_s`` for Ray to declare it dead; None while it is alive."""
    deadline = time.monotonic() + wait_s
    while True:
        state = next((n for n in ray.nodes() if n["NodeID"] == node["node_id"]), None)
        if state is not None and not state.get("Alive"):
            why = state.get("DeathReasonMessage") or "no reason given"
            return Cause(f"died: its node {node['node_name']} (Ray node {node['node_id'][:8]}, {node['address']}) "
                         f"left the Ray cluster ({why})", advice=_NODE_LOST)
        if time.monotonic() >= deadline:
            return None
        time.sleep(1.0)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + " ..."


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in _ANSI.sub("", text).splitlines() if ln.strip() and not _MARKS.match(ln)]


def _exception_line(text: str) -> str:
    """The exception of a traceback's text: the unindented lines after its last frame."""
    lines = _lines(text)
    frames = [i for i, ln in enumerate(lines) if _FRAME.match(ln)]
    rest = lines[frames[-1] + 1:] if frames else lines[-1:]
    exc = [ln for ln in rest if not ln.startswith(" ")]
    return _one_line(" ".join(exc)) if exc else "an exception (no text)"


def _frames(text: str) -> list[str]:
    """The last ``TAIL // 2`` frames of a traceback's text (file and line, then the code)."""
    lines = _lines(text)
    frames = [i for i, ln in enumerate(lines) if _FRAME.match(ln)]
    out: list[str] = []
    for i in frames[-(TAIL // 2):]:
        out.append(lines[i].strip())
        if i + 1 < len(lines) and lines[i + 1].startswith("    ") and not _FRAME.match(lines[i + 1]):
            out.append("  " + lines[i + 1].strip())
    return out


def worker_log(pid: int) -> Path | None:
    """The stderr log file of this Ray session's worker process ``pid``, if it is on this machine."""
    try:
        logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    except Exception:  # not connected, or attached to a cluster without a local node
        return None
    found = list(logs.glob(f"worker-*-{pid}.err"))
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _log_tail(pid: int) -> list[str]:
    """"last lines of <file>:" and those lines, when the worker printed anything of its own."""
    path = worker_log(pid)
    if path is None:
        return []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    own = [ln for ln in _lines(text) if not ln.startswith((":job_id:", ":actor_name:", ":task_name:"))]
    return [f"last lines of its log {path}:", *(f"  {ln}" for ln in own[-TAIL:])] if own else []
