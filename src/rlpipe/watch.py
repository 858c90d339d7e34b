"""``python -m rlpipe.watch LOG TAG -- CMD [ARG...]``: run a workflow job's command with its output
in its log, and keep the console told while it works.

A Snakemake job writes its command's output to ``logs/...`` (``CMD > LOG 2>&1``), so the console
said nothing for minutes while the test gate and pretraining ran. Wrapped in this, the job's
command still writes everything to LOG, and every ``RLPIPE_WATCH_EVERY_S`` seconds (``EVERY_S``
by default) the console gets one line on stderr::

    [train k4] 2:15 elapsed | [k4] step 12/100 (12%) | reward 0.375 | ... | ETA 5:08

the last line the command wrote (a training job's latest step line with its ETA,
``rlpipe.trainer.drivers.progress``, in preference to any later line; a tqdm bar up to its last
carriage return; pytest's progress percentage), then one line when it ends. Snakemake's own lines
give the overall progress ("12 of 78 steps (15%) done"). The exit status is the command's; a
signal to this process is passed on to it.

Not in the seeds; a supervising process rather than ``tee`` so that a quiet command (Ray starting,
a long test file) still shows that it is alive.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Seconds between two console lines of a running job: well under the 30 s of silence allowed.
EVERY_S = 15.0
#: Characters of the command's last line shown.
WIDTH = 160


def format_elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


#: A training job's step line (``rlpipe.trainer.drivers.progress``): shown in preference to later
#: lines (Ray's warnings, version changes), so the console keeps the step and its ETA.
STEP_LINE = re.compile(r"^\[[^\]]+\] step \d+/\d+")


def last_line(path: Path, tail_bytes: int = 16000) -> str:
    """The last step line of ``path`` (``STEP_LINE``) if its tail has one, else its last non-blank
    line (carriage returns split lines, as tqdm writes them)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.replace("\r", "\n").split("\n") if ln.strip()]
    steps = [ln for ln in lines if STEP_LINE.match(ln)]
    return (steps or lines or [""])[-1][:WIDTH]


def heartbeat(tag: str, elapsed_s: float, line: str) -> str:
    return f"[{tag}] {format_elapsed(elapsed_s)} elapsed | {line or '(no output yet)'}"


def run(log: Path, tag: str, cmd: list[str], every_s: float = EVERY_S, emit=None) -> int:
    """Run ``cmd`` with stdout and stderr in ``log``; ``emit`` (stderr by default) gets a heartbeat
    every ``every_s`` seconds and a closing line. Returns the command's exit status."""
    emit = emit or (lambda text: print(text, file=sys.stderr, flush=True))
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        forward = lambda sig, _frame: proc.send_signal(sig)  # noqa: E731 - a signal handler
        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            next_beat = start + every_s
            while proc.poll() is None:
                time.sleep(min(0.2, every_s))  # the job's end is noticed within 0.2 s
                now = time.monotonic()
                if now >= next_beat and proc.poll() is None:
                    emit(heartbeat(tag, now - start, last_line(log)))
                    next_beat = now + every_s
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
    rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # killed by a signal: as a shell says
    took = format_elapsed(time.monotonic() - start)
    emit(f"[{tag}] done in {took}" if rc == 0 else f"[{tag}] failed (exit {rc}) after {took}: see {log}")
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m rlpipe.watch LOG TAG -- CMD [ARG...]", file=sys.stderr)
        return 2
    every = float(os.environ.get("RLPIPE_WATCH_EVERY_S", EVERY_S))
    return run(Path(argv[0]), argv[1], argv[3:], every)


if __name__ == "__main__":
    sys.exit(main())
