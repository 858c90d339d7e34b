"""Stops when told, measured: SIGTERM to a running ``rlpipe train``, as the ``stop_train`` part of
``rlpipe gpu-check`` does it on a GPU (the CPU tests do the same in tests/test_stop.py):

    python -m rlpipe.bench.stop_check --config C --variant onpolicy --base BASE --dataset DS \\
        --run-dir RUN --out stop.json [--steps 1000] [--checkpoint-every 4] [--threads N]

1. Writes ``RUN.yaml``: ``--config`` with the variant's step count raised to ``--steps`` (far more
   than the run can take before the signal: a run that finishes first proves nothing) and its
   checkpoint every ``--checkpoint-every`` steps, validated as ``rlpipe train`` reads it.
2. Starts ``rlpipe train`` of that variant into ``RUN`` (in this process's group: a kill of the
   part reaches it) and waits until it is inside its training loop: its first periodic checkpoint
   (``checkpoints/last.pt``, written atomically) is on disk while the run still runs.
3. Notes its Ray processes (``rlpipe.trainer.ray_reaper``'s rule: the processes below the run, and
   every process whose command line names the run's Ray session or that holds a file in its
   directory; read from /proc, Linux only), then sends SIGTERM to the ``rlpipe train`` process
   alone, as Snakemake passes it on.
4. Records the seconds to exit and the exit status (143 expected: 128 + SIGTERM), the Ray processes
   still running ``GOAL_S`` after the signal (none expected; any left are then killed, so that none
   holds the GPU), and whether ``checkpoints/last.pt`` loads (``rlpipe.lm.checkpoint``) with the
   optimizer step the run said it stopped at. A run still alive ``--kill-after-s`` (default
   ``KILL_AFTER_S``) after the signal is killed and recorded so.
   ``met`` says whether all of it met the goal: exit 143 within
   ``GOAL_S`` seconds, no Ray process left, the checkpoint loads.

The JSON is written atomically. Exit 0 once measured (whether or not the goal was met), 1 when the
run could not be brought into its loop (its log's tail is in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlpipe.config import ConfigError
from rlpipe.config.pipeline import apply_overrides, load_yaml, parse_config
from rlpipe.io import write_json, write_text
from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.trainer import ray_reaper, stop

GOAL_S = 30.0  # the job, its Ray processes and Snakemake gone within this long of the signal
KILL_AFTER_S = 60.0  # a run still alive this long after the signal is killed (--kill-after-s)
START_TIMEOUT_S = 120.0  # no checkpoint this long after the start: the run never reached its loop
POLL_S = 0.2
STEP_LINE = re.compile(r"^\[[^\]]+\] step (\d+)/\d+", re.M)
STOPPED_AT = re.compile(r"stopped by SIG[A-Z]+ after optimizer step (\d+)")


def stop_config(config: Path, variant: str, steps: int, checkpoint_every: int) -> dict:
    """``config`` with ``variant``'s step count and checkpoint interval set (in the variant's own
    overrides, which win over ``train``), validated; raises ``ConfigError`` naming what is wrong."""
    data = load_yaml(config)
    variants = data.get("variants") or {}
    if not isinstance(variants.get(variant), dict):
        raise ConfigError(f"{config}: no variant {variant!r} (variants: {', '.join(sorted(variants))})")
    data = apply_overrides(data, {"variants": {variant: {"n_grpo_steps": steps, "checkpoint_every": checkpoint_every}}})
    parse_config(data)
    return data


@dataclass(frozen=True)
class Proc:
    """A process as /proc shows it: its pid, start time (clock ticks after boot: a pid reused by a
    later process has another) and command name."""
    pid: int
    start: int
    name: str


def proc_entry(pid: int) -> Proc | None:
    """``pid``'s entry, or None if it is gone or a zombie (dead, not yet reaped)."""
    stat = ray_reaper.proc_stat(pid)
    if stat is None:
        return None
    name, fields = stat
    return None if fields[0] in ("Z", "X") else Proc(pid, int(fields[19]), name)


def descendants(pid: int) -> list[int]:
    """The pids below ``pid``: its children, theirs, and so on."""
    found, todo = [], [pid]
    while todo:
        kids = [c for c, _ in stop.children(todo.pop())]
        found += kids
        todo += kids
    return found


def ray_processes(pid: int) -> list[Proc]:
    """The processes of the run whose driver is ``pid``: its descendants (its Ray instance, the
    watchdog), and every process of its Ray session (``ray_reaper.session_pids``: by the session
    directory its watchdog was given), which a renamed or re-parented Ray worker may be alone in."""
    below = descendants(pid)
    pids = set(below)
    session = session_dir(below)
    if session is not None:
        pids |= set(ray_reaper.session_pids(ray_reaper.scan(), os.path.realpath(session), exclude=[os.getpid(), pid]))
    return [p for p in map(proc_entry, sorted(pids)) if p is not None]


def session_dir(pids: list[int]) -> str | None:
    """The Ray session directory named on the command line of the run's watchdog
    (``rlpipe.trainer.ray_reaper --session DIR``) among ``pids``, or None."""
    for pid in pids:
        info = ray_reaper.read_proc(pid, with_files=False)
        cmd = list(info.cmdline) if info else []
        if ray_reaper.__name__ in cmd and "--session" in cmd[:-1]:
            return cmd[cmd.index("--session") + 1]
    return None


def alive(procs: list[Proc]) -> list[Proc]:
    """Those of ``procs`` still running (the same process: same pid and start time; not a zombie)."""
    return [p for p in procs if proc_entry(p.pid) == p]


def _describe(procs: list[Proc]) -> list[str]:
    return [f"{p.pid} {p.name}" for p in procs]


def _wait_in_loop(proc: subprocess.Popen, ckpt: Path, timeout_s: float) -> str | None:
    """None once ``ckpt`` exists while ``proc`` runs; else why not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"rlpipe train exited with status {proc.returncode} before its first checkpoint"
        if ckpt.is_file():
            return None
        time.sleep(POLL_S)
    return f"no checkpoint within {timeout_s:g} s of the start"


def _checkpoint(path: Path) -> dict:
    try:
        extra = load_checkpoint(path).extra
    except Exception as e:  # a torn or unreadable checkpoint is the finding, not a crash of the check
        return {"loads": False, "error": f"{type(e).__name__}: {e}"}
    return {"loads": True, "step": int(extra["step"]) if "step" in extra else None}


def _stop(proc: subprocess.Popen, ray: list[Proc], kill_after_s: float = KILL_AFTER_S) -> dict:
    """SIGTERM to ``proc``; its exit and the Ray processes left ``GOAL_S`` after the signal."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=kill_after_s)
        exit_s = round(time.monotonic() - t0, 2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc, exit_s = None, None
    while alive(ray) and time.monotonic() - t0 < GOAL_S:
        time.sleep(POLL_S)
    left = alive(ray)
    gone_s = round(time.monotonic() - t0, 2) if not left else None
    rec = {"exit_s": exit_s, "exit_code": rc, "ray_processes_gone_s": gone_s,
           "ray_processes_left_after_goal": _describe(left)}
    for p in left:  # recorded; now gone, so that none holds the GPU for what runs next
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, signal.SIGKILL)
    return rec


def check(config: Path, variant: str, base: str, dataset: str | None, run_dir: Path, threads: int | None,
          steps: int, checkpoint_every: int, start_timeout_s: float, kill_after_s: float = KILL_AFTER_S) -> dict:
    """Run the check (module docstring); the record for the JSON."""
    cfg_file = run_dir.with_name(run_dir.name + ".yaml")
    write_text(cfg_file, yaml.safe_dump(stop_config(config, variant, steps, checkpoint_every), sort_keys=False))
    log = run_dir.with_name(run_dir.name + ".log")
    cmd = [sys.executable, "-m", "rlpipe.cli", "train", "--config", str(cfg_file), "--variant", variant,
           "--base", base, "--out", str(run_dir), *(["--dataset", dataset] if dataset else []),
           *(["--threads", str(threads)] if threads else [])]
    rec: dict = {"variant": variant, "command": cmd, "goal_s": GOAL_S, "signal": "SIGTERM", "met": False}
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        why = _wait_in_loop(proc, run_dir / "checkpoints" / "last.pt", start_timeout_s)
        if why is not None:
            return rec | {"error": why, "log_tail": _tail(log)}
        rec["signal_after_s"] = round(time.monotonic() - t0, 2)
        rec["step_at_signal"] = _last(STEP_LINE, log)
        ray = ray_processes(proc.pid)
        rec["ray_processes_at_signal"] = _describe(ray)
        rec |= _stop(proc, ray, kill_after_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rec["stopped_at_step"] = _last(STOPPED_AT, log)
    ckpt = _checkpoint(run_dir / "checkpoints" / "last.pt")
    rec["checkpoint"] = ckpt | {"matches_stop": ckpt.get("step") is not None
                                and ckpt.get("step") == rec["stopped_at_step"]}
    rec["log_tail"] = _tail(log)
    rec["met"] = (rec["exit_code"] == 128 + signal.SIGTERM and rec["exit_s"] is not None and rec["exit_s"] <= GOAL_S
                  and bool(rec["ray_processes_at_signal"]) and not rec["ray_processes_left_after_goal"]
                  and ckpt["loads"])
    return rec


def _last(pattern: re.Pattern, log: Path) -> int | None:
    found = pattern.findall(log.read_text(errors="replace")) if log.is_file() else []
    return int(found[-1]) if found else None


def _tail(log: Path, lines: int = 15) -> list[str]:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip()][-lines:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlpipe.bench.stop_check", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the pipeline config the run trains with")
    ap.add_argument("--variant", required=True, help="the variant to train and stop")
    ap.add_argument("--base", required=True, help="the base model (rlpipe checkpoint or HF directory)")
    ap.add_argument("--dataset", default=None, help="keyword dataset directory")
    ap.add_argument("--run-dir", required=True, help="the run's directory (its config and log go beside it)")
    ap.add_argument("--out", required=True, help="the JSON (written atomically)")
    ap.add_argument("--threads", type=int, default=None, help="rlpipe train --threads")
    ap.add_argument("--steps", type=int, default=1000, help="the run's step count: far more than it reaches")
    ap.add_argument("--checkpoint-every", type=int, default=4, help="the run's checkpoint interval (steps)")
    ap.add_argument("--start-timeout-s", type=float, default=START_TIMEOUT_S,
                    help="give up when no checkpoint is written within this long of the start")
    ap.add_argument("--kill-after-s", type=float, default=KILL_AFTER_S,
                    help=f"kill the run when it is still alive this long after the signal (>= the goal, {GOAL_S:g} s)")
    a = ap.parse_args(argv)
    for name in ("steps", "checkpoint_every"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.kill_after_s < GOAL_S:
        ap.error(f"--kill-after-s must be >= the goal of {GOAL_S:g} s, got {a.kill_after_s:g}")
    run_dir = Path(a.run_dir).resolve()
    if run_dir.exists():
        ap.error(f"--run-dir {run_dir} exists: give a new directory (the run must start afresh)")
    try:
        stop_config(Path(a.config), a.variant, a.steps, a.checkpoint_every)
    except ConfigError as e:
        ap.error(str(e))
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    rec = check(Path(a.config), a.variant, a.base, a.dataset, run_dir, a.threads, a.steps, a.checkpoint_every,
                a.start_timeout_s, a.kill_after_s)
    write_json(a.out, rec)
    print(f"stop check: {'met' if rec['met'] else 'not met'}: exit {rec.get('exit_code')} after {rec.get('exit_s')} s, "
          f"Ray processes left {rec.get('ray_processes_left_after_goal')}, checkpoint {rec.get('checkpoint')}",
          file=sys.stderr)
    return 1 if "error" in rec else 0


if __name__ == "__main__":
    raise SystemExit(main())
