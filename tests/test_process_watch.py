"""The whole-run contention figure counts only what is not the run's (rlpipe.trainer.process_watch):
real processes, no mocks.

A "run" is a fresh Python process (the root, as Snakemake is for the pipeline) that samples the machine,
runs a child it reaps and a child that leaves an orphan behind (as Ray's raylet does with its workers at
shutdown: the orphan is re-parented outside the run and reaped there), then measures. Each process
reports its own CPU time (``getrusage``), so the truth is known whatever else runs on the machine. The
run is measured once beside a real busy loop outside it and once without; the busy loop's CPU time
must land in "other", the run's own in "own".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

LINUX = Path("/proc/stat").exists()

BURN = """
import json, resource, sys, time
t = time.process_time()
while time.process_time() - t < {burn}: pass
time.sleep({idle})  # an actor idles at shutdown: it exits after the raylet, an orphan
r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(json.dumps(r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime))
"""

ROOT = """
import json, os, resource, subprocess, sys, time
from pathlib import Path
from rlpipe.trainer import conditions as cond
out, busy_pid, burn = Path(sys.argv[1]), int(sys.argv[2]), {burn!r}
def ticks(pid):
    f = open(f"/proc/{{pid}}/stat").read().rpartition(")")[2].split()
    return (float(f[11]) + float(f[12])) / os.sysconf("SC_CLK_TCK")
busy0 = ticks(busy_pid) if busy_pid else 0.0
def cpu():  # this process and every child it reaped
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime
start = cond.sample()
t0 = cpu()
# a child the run reaps
subprocess.run([sys.executable, "-c", burn.format(burn=0.5, idle=0), str(out / "reaped")], check=True)
# a child that starts a grandchild and exits without waiting: the grandchild is orphaned
# (it lives a second first, as the raylet outlives its workers' start; see the module's limits)
spawn = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); "
         "time.sleep(1.0)")
subprocess.run([sys.executable, "-c", spawn, burn.format(burn=1.0, idle=1.5), str(out / "orphan")], check=True)
while not (out / "orphan").exists():
    time.sleep(0.1)
time.sleep(0.5)  # it exits and is reaped outside the run
own = cpu() - t0
c = cond.measure(start, run_cores=1)
busy = ticks(busy_pid) - busy0 if busy_pid else 0.0
truth = own + json.loads((out / "orphan").read_text())  # the orphan was reaped elsewhere
print(json.dumps({{"own": c.own_cpu_s, "truth": truth, "other": c.other_cpu_s, "busy": busy, "wall": c.wall_s,
                  "cpus": c.cpus}}))
"""


def run_beside(tmp_path: Path, busy_loop: bool) -> dict:
    busy = (subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy_loop else None)
    try:
        time.sleep(0.3 if busy else 0)
        res = subprocess.run([sys.executable, "-c", ROOT.format(burn=BURN), str(tmp_path),
                              str(busy.pid if busy else 0)], check=True, capture_output=True, text=True, timeout=120)
    finally:
        if busy:
            busy.kill()
            busy.wait()
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"busy loop {busy_loop}: own {out['own']:.2f} s (truth {out['truth']:.2f} s, error "
          f"{out['own'] - out['truth']:+.2f} s); other {out['other']:.2f} s of which the busy loop "
          f"{out['busy']:.2f} s, over {out['wall']:.1f} s on {out['cpus']} CPUs")
    return out


@pytest.mark.skipif(not LINUX, reason="/proc is Linux-only")
@pytest.mark.parametrize("busy_loop", [False, True], ids=["alone", "beside_a_busy_loop"])
def test_the_runs_own_cpu_time_includes_its_orphans_and_not_a_busy_loop_beside_it(tmp_path, busy_loop):
    out = run_beside(tmp_path, busy_loop)
    # a clock tick (10 ms) per process read, and the orphan's last poll interval (it idles then)
    assert abs(out["own"] - out["truth"]) < 0.15, out
    if busy_loop:  # the busy loop is someone else's: all of it is "other"
        assert out["other"] >= out["busy"] - 0.15, out
        assert out["busy"] > 1.0
