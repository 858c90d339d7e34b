"""rlpipe.trainer.conditions: the machine's load over a run (project issue 12), by hand.

Fake ``/proc/stat`` and ``/proc/<pid>/stat`` texts give hand-computed busy ticks, process trees and
other processes' CPU seconds; a real sample on this machine must give finite numbers and count the
CPU time this process and a child it reaped burned (measured CPU time, not wall-clock timing).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlpipe import contract
from rlpipe.trainer import conditions as cond

ROOT = Path(__file__).resolve().parents[1]
LINUX = Path("/proc/stat").exists()

# user nice system idle iowait irq softirq steal guest guest_nice
PROC_STAT_START = """cpu  1000 50 300 9000 40 10 20 5 7 0
cpu0 500 25 150 4500 20 5 10 2 7 0
cpu1 500 25 150 4500 20 5 10 3 0 0
intr 12345 0 0
ctxt 999
btime 1700000000
"""
# busy = user + nice + system + irq + softirq + steal (guest is inside user; idle, iowait are not busy)
BUSY_START = 1000 + 50 + 300 + 10 + 20 + 5  # 1385
PROC_STAT_END = PROC_STAT_START.replace("cpu  1000 50 300 9000 40 10 20 5 7 0",
                                        "cpu  1600 50 400 9300 40 10 30 10 9 0")
BUSY_END = 1600 + 50 + 400 + 10 + 30 + 10  # 2100: 715 ticks = 7.15 s busy


def pid_stat(pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0, start: int = 100,
             comm: str = "python") -> str:
    """A /proc/<pid>/stat line (fields 1-22 matter; the rest padded)."""
    fields = ["S", ppid, pid, pid, 0, -1, 4194304, 100, 0, 0, 0, utime, stime, cutime, cstime, 20, 0, 1, 0, start]
    return f"{pid} ({comm}) " + " ".join(map(str, fields)) + " 1000 200" + " 0" * 30


def test_parse_proc_stat_busy_ticks_and_cpus():
    assert cond.parse_proc_stat(PROC_STAT_START) == (BUSY_START, 2)
    assert cond.parse_proc_stat(PROC_STAT_END) == (BUSY_END, 2)
    busy, cpus = cond.parse_proc_stat("intr 1 2\n")
    assert math.isnan(busy) and cpus == 0


def test_parse_pid_stat_with_an_awkward_command_name():
    line = pid_stat(42, 7, utime=150, stime=30, cutime=12, cstime=8, start=5555, comm="ray::Learner (x) )")
    assert cond.parse_pid_stat(line) == (42, 7, 5555, 200.0)


def test_descendants_of_a_process_tree():
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20}
    assert cond.descendants(parents, 10) == {10, 11, 12, 13}
    assert cond.descendants(parents, 21) == {21}


def test_tree_cpu_delta_by_hand():
    start = {(10, 100): 50.0, (11, 120): 30.0, (12, 130): 5.0}
    end = {(10, 100): 80.0,   # driver: +30
           (11, 120): 31.0,   # raylet: +1
           (14, 900): 200.0,  # actor started during the run: all of its 200
           (12, 999): 7.0}    # pid 12 reused by a new process: its own 7, not 7 - 5
    # (12, 130) exited without being reaped by the tree: its time after the start is lost
    assert cond.tree_cpu_delta(start, end) == 30 + 1 + 200 + 7


def test_other_cpu_seconds_and_clamp():
    assert cond.other_cpu_seconds(BUSY_START, BUSY_END, own_s=5.0, hz=100) == pytest.approx(7.15 - 5.0)
    assert cond.other_cpu_seconds(BUSY_START, BUSY_END, own_s=8.0, hz=100) == 0.0  # never negative


def test_contended_decision_at_the_threshold():
    # 2 CPUs, 100 s, the run fills both cores (run_cores 3 >= 2): others may take 10% of 200 CPU s
    assert cond.OTHER_CPU_THRESHOLD == 0.10
    assert cond.decide_contended(20.0, 100.0, 2, run_cores=3) is False  # exactly at the threshold
    assert cond.decide_contended(20.5, 100.0, 2, run_cores=3) is True
    assert cond.decide_contended(20.5, 100.0, 2) is True  # run_cores unknown: no idle-core allowance
    # 16 CPUs, the run uses 5: others may keep 11 idle cores + 1.6 busy before it counts
    assert cond.decide_contended(1260.0, 100.0, 16, run_cores=5) is False
    assert cond.decide_contended(1261.0, 100.0, 16, run_cores=5) is True
    assert cond.decide_contended(math.nan, 100.0, 2) is None
    assert cond.decide_contended(5.0, 0.0, 2) is None


def test_conditions_between_fake_samples():
    start = cond.Sample(t=10.0, load=0.5, busy_ticks=BUSY_START, cpus=2, tree={(10, 1): 100.0})
    end = cond.Sample(t=14.0, load=2.5, busy_ticks=BUSY_END, cpus=2, tree={(10, 1): 300.0, (11, 50): 215.0})
    c = cond.conditions_between(start, end, hz=100, run_cores=3)
    assert c.wall_s == 4.0 and c.cpus == 2 and c.run_cores == 3.0
    assert c.own_cpu_s == pytest.approx(4.15)  # (200 + 215) ticks
    assert c.other_cpu_s == pytest.approx(7.15 - 4.15)
    assert c.other_cpu_frac == pytest.approx(3.0 / (4.0 * 2))
    assert c.contended is True and c.note == ""
    assert (c.load_avg_start, c.load_avg_end) == (0.5, 2.5)
    quiet = cond.conditions_between(start, cond.Sample(14.0, 0.6, BUSY_START + 420, 2, {(10, 1): 500.0}), 100)
    assert quiet.other_cpu_s == pytest.approx(0.2) and quiet.other_cpu_frac == pytest.approx(0.025)
    assert quiet.contended is False


def test_unmeasured_tree_gives_none_not_a_guess():
    start = cond.Sample(0.0, 1.0, BUSY_START, 2, None)
    c = cond.conditions_between(start, cond.Sample(4.0, 1.5, BUSY_END, 2, None), 100, note="attached")
    out = c.to_json()
    assert out["other_cpu_s"] is None and out["other_cpu_frac"] is None and out["contended"] is None
    assert out["load_avg_end"] == 1.5 and out["note"] == "attached"
    json.dumps(out, allow_nan=False)  # strict JSON: no NaN


def test_to_json_keys_are_the_contract_and_documented():
    start = cond.Sample(0.0, 1.0, BUSY_START, 2, {})
    out = cond.conditions_between(start, cond.Sample(4.0, 1.0, BUSY_END, 2, {}), 100).to_json()
    assert tuple(out) == contract.RUN_CONDITIONS_KEYS
    assert "conditions" in contract.RUN_INFO_OPTIONAL_KEYS
    doc = (ROOT / "CONTRIBUTING.md").read_text()
    m = re.search(r"`conditions` \(the machine's load over the run: (.*?)\)", doc, re.S)
    assert m, "CONTRIBUTING.md run_info bullet does not list the conditions keys"
    assert re.findall(r"`(\w+)`", m.group(1)) == list(contract.RUN_CONDITIONS_KEYS)


def _burn_cpu(seconds: float) -> None:
    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        pass


@pytest.mark.skipif(not LINUX, reason="/proc is Linux-only")
def test_real_sample_counts_this_process_and_a_reaped_child():
    start = cond.sample()
    assert start.cpus >= 1 and math.isfinite(start.busy_ticks) and math.isfinite(start.load)
    assert start.tree and any(pid == os.getpid() for pid, _ in start.tree)
    t0 = time.process_time()
    _burn_cpu(0.2)
    burned = time.process_time() - t0
    child = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
             "print(time.process_time())")
    child_cpu = float(subprocess.run([sys.executable, "-c", child], check=True, capture_output=True,
                                     text=True).stdout)
    c = cond.measure(start, run_cores=1)
    out = c.to_json()
    for key in ("load_avg_start", "load_avg_end", "wall_s", "own_cpu_s", "other_cpu_s", "other_cpu_frac"):
        assert isinstance(out[key], float) and math.isfinite(out[key]), key
    assert out["cpus"] == start.cpus and out["contended"] in (True, False)
    # clock ticks are 10 ms: allow a tick or two of rounding per process
    assert c.own_cpu_s >= burned + child_cpu - 0.05
    assert 0.0 <= c.other_cpu_frac <= 1.1  # a share of the machine (give or take a tick per CPU)


@pytest.mark.skipif(not LINUX, reason="/proc is Linux-only")
def test_attached_cluster_is_marked_unmeasured():
    c = cond.measure(cond.sample(own_tree=False), own_tree=False)
    assert c.contended is None and math.isnan(c.other_cpu_s) and "Ray cluster" in c.note
    assert math.isfinite(c.load_avg_end)
