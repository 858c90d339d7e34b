"""Run one part of ``rlpipe gpu-check`` in its own process group, under its own time limit.

A part is a command (a list of arguments, run from the project root). It gets a new session, so
its whole process group -- the part and whatever it starts (torch's compile workers, a local Ray
instance's raylet and workers) -- is ended together: at the limit, SIGTERM to the group, then
SIGKILL after a grace period; after a normal exit, the same sweep clears anything it left
behind, so a leftover process cannot hold the GPU for the next part. A part that fails, times out
or is refused is recorded (status, seconds, the last lines of its stderr) and the caller goes on.

A part's time: its hard limit (``limit_s``) and its share (``min_s``, the estimate of what it takes):
``run_parts`` caps each part at ``min(limit_s, time left - the shares of the parts after it that can
still run)``, never below its own share while the budget lasts. So a part that hangs, or overruns
its estimate, uses up only the slack of the budget and its own share, and every later part still
gets its share (when the shares, each with a kill's grace, add up to at most the budget); when an
early part overran anyway, the parts at the end of the order give way first.

Statuses: ``ok``; ``failed`` (non-zero exit); ``timeout`` (killed at its limit); ``unsupported``
(argparse refused a flag: the bench does not have it yet); ``skipped`` (a part it needs did not
succeed, or the check's time budget was spent).

A part's own session also keeps a signal to the check's process group from reaching it. Ctrl-C
raises ``KeyboardInterrupt`` in the check, whose cleanup kills the running part's group; SIGTERM
(a scheduler's or a remote runner's time limit) would end the check at once and leave the part
running on the GPU, holding its GPU slot, into a rerun. So while ``run_parts`` runs, SIGTERM raises
``SystemExit`` instead, and the same cleanup runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: seconds between SIGTERM and SIGKILL for a part's process group (Ray's processes and torch's
#: workers end on SIGTERM within a second; SIGKILL then frees whatever still holds the GPU). Kept
#: for every later part (``reserved_s``), so it weighs on the check's budget once per part
GRACE_S = 3.0
#: a part is not started with less time than this left in the check's budget
MIN_PART_S = 5.0
#: stderr lines kept in the record
TAIL_LINES = 15


@dataclass(frozen=True)
class Part:
    """One part: ``argv`` run under ``limit_s``; ``result_file`` (a JSON the part writes) is read
    back, or ``collect(part_dir)`` builds the result; ``needs`` names parts that must be ``ok``;
    ``min_s``: the share of the budget kept for it while earlier parts run (0: none)."""
    name: str
    argv: list[str]
    limit_s: float
    result_file: str | None = None
    needs: tuple[str, ...] = ()
    collect: Callable[[], dict] | None = None
    env: dict[str, str] = field(default_factory=dict)
    min_s: float = 0.0


def _kill_group(pgid: int, grace_s: float | None = None, reap: Callable[[], Any] = lambda: None) -> bool:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``. True if any
    process was still there. ``reap`` collects the leader's exit status (a zombie leader would
    otherwise keep the group alive)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + (GRACE_S if grace_s is None else grace_s)
    while time.monotonic() < deadline:
        reap()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` non-empty lines of a log file (empty if there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip()][-lines:]


def _status(rc: int | None, timed_out: bool, stderr_tail: list[str]) -> tuple[str, str | None]:
    if timed_out:
        return "timeout", None
    if rc == 0:
        return "ok", None
    refused = next((ln for ln in stderr_tail if "unrecognized arguments:" in ln), None)
    if rc == 2 and refused:
        flags = refused.split("unrecognized arguments:", 1)[1].strip()
        return "unsupported", f"not supported by this bench yet: {flags}"
    return "failed", None


def _read_result(part: Part) -> Any:
    try:
        if part.collect is not None:
            return part.collect()
        if part.result_file and Path(part.result_file).is_file():
            text = Path(part.result_file).read_text()
            try:
                return json.loads(text)
            except json.JSONDecodeError:  # a JSON line per record (rlpipe bench's stdout format)
                return [json.loads(ln) for ln in text.splitlines() if ln.strip()][-1]
    except Exception as e:  # a result we cannot read is recorded, never fatal
        return {"unreadable": f"{type(e).__name__}: {e}"}
    return None


def run_part(part: Part, log_dir: Path, limit_s: float | None = None, cwd: str | Path | None = None,
             monitor: Any = None) -> dict:
    """Run ``part`` (its limit, or ``limit_s`` if smaller); return its record. ``monitor``, if given,
    has ``start()`` and ``stop() -> dict`` and is run alongside (the GPU busy sampler)."""
    limit = part.limit_s if limit_s is None else min(part.limit_s, limit_s)
    record: dict[str, Any] = {"name": part.name, "command": part.argv, "limit_s": round(limit, 1)}
    log_dir.mkdir(parents=True, exist_ok=True)
    out_log, err_log = log_dir / f"{part.name}.out", log_dir / f"{part.name}.err"
    t0 = time.monotonic()
    timed_out, rc = False, None
    with open(out_log, "wb") as out, open(err_log, "wb") as err:
        proc = subprocess.Popen(part.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd,
                                env={**os.environ, **part.env}, start_new_session=True)
        if monitor is not None:
            monitor.start()
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid, reap=proc.poll)
            rc = proc.wait() if rc is None else rc
            if monitor is not None:
                record["monitor"] = monitor.stop()
    record["seconds"] = round(time.monotonic() - t0, 2)
    record["returncode"] = rc
    record["stderr_tail"] = tail(err_log)
    record["status"], note = _status(rc, timed_out, record["stderr_tail"])
    if note:
        record["note"] = note
    if timed_out:
        record["note"] = f"killed after its limit of {limit:.0f} s"
    record["result"] = _read_result(part)
    return record


def skipped(part: Part, reason: str) -> dict:
    """The record of a part that was not started."""
    return {"name": part.name, "command": part.argv, "limit_s": part.limit_s, "status": "skipped",
            "seconds": 0.0, "note": reason, "stderr_tail": [], "result": None}


@contextlib.contextmanager
def sigterm_raises() -> Any:
    """SIGTERM raises ``SystemExit(128 + 15)`` in the main thread while inside (Python's default ends
    the process without running any cleanup), once: a second SIGTERM is ignored until the cleanup
    is done. Elsewhere than the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the kill of the running part must not be cut short
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_parts(parts: list[Part], log_dir: Path, budget_s: float, cwd: str | Path | None = None,
              monitor_for: Callable[[Part], Any] | None = None,
              on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """Run ``parts`` in order within ``budget_s`` seconds in all, each under ``part_limit`` (its
    limit, at most the time the shares kept for the parts after it leave: ``room_s``); a part whose
    ``needs`` did not all succeed, or whose room is under ``MIN_PART_S``, is skipped. ``on_record`` sees
    each record as it is made (to save progress). A SIGTERM to this process kills the running part's
    process group, then ends this process (``sigterm_raises``)."""
    with sigterm_raises():
        return _run_parts(parts, log_dir, budget_s, cwd, monitor_for, on_record)


def reserved_s(later: list[Part], records: dict[str, dict]) -> float:
    """Seconds kept for the ``later`` parts: each one's share and its kill's grace, for every part
    that can still run (none of its ``needs`` has a record that is not ``ok``)."""
    return sum(p.min_s + GRACE_S for p in later
               if p.min_s > 0 and all(records.get(n, {}).get("status", "ok") == "ok" for n in p.needs))


def room_s(part: Part, left_s: float, reserved: float) -> float:
    """The time ``part`` may take with ``left_s`` of the budget left and ``reserved`` kept for the
    parts after it: what is left beyond ``reserved``, but at least its share, and never past the
    budget (each with the kill's grace)."""
    return min(left_s - GRACE_S, max(part.min_s, left_s - GRACE_S - reserved))


def part_limit(part: Part, left_s: float, reserved: float) -> float:
    """The limit ``part`` runs under: its own limit, at most its ``room_s``."""
    return min(part.limit_s, room_s(part, left_s, reserved))


def _run_parts(parts: list[Part], log_dir: Path, budget_s: float, cwd: str | Path | None,
               monitor_for: Callable[[Part], Any] | None, on_record: Callable[[dict], None] | None) -> list[dict]:
    deadline = time.monotonic() + budget_s
    records: dict[str, dict] = {}
    for i, part in enumerate(parts):
        missing = [n for n in part.needs if records.get(n, {}).get("status") != "ok"]
        left = deadline - time.monotonic()
        room = room_s(part, left, reserved_s(parts[i + 1:], records))
        if missing:
            rec = skipped(part, f"needs {', '.join(missing)}, which did not succeed")
        elif room < MIN_PART_S:
            rec = skipped(part, f"the check's time budget ({budget_s:.0f} s) was spent")
        else:
            rec = run_part(part, log_dir, limit_s=room, cwd=cwd, monitor=monitor_for(part) if monitor_for else None)
        rec["estimate_s"] = part.min_s
        records[part.name] = rec
        if on_record is not None:
            on_record(rec)
    return list(records.values())
