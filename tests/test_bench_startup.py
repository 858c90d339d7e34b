"""``rlpipe bench startup``: the phases of a training job's start-up, from the probe's stamps, and a
real run through the probe (its stamps come from the trainer as it is; a renamed hook would leave a
phase without a number)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlpipe.bench import startup

STAMPS = {"start": 100.0, "imports": 103.0, "ray_init_start": 103.5, "ray_init_end": 106.0, "first_get": 110.0,
          "first_step": 110.5, "shutdown_start": 111.0, "exit": 112.0}


def test_phases_are_the_gaps_between_the_stamps():
    p = startup.phases(STAMPS)
    assert p == {"imports": 3.0, "checks": 0.5, "ray_start": 2.5, "actors_ready": 4.0, "first_step": 0.5,
                 "rest": 0.5, "shutdown": 1.0, "startup_s": 11.5, "total_s": 12.0}
    assert sum(p[name] for name, _, _ in startup.PHASES) == p["total_s"]


def test_a_missing_stamp_leaves_its_phases_and_the_startup_empty():
    p = startup.phases({k: v for k, v in STAMPS.items() if k != "first_step"})
    assert p["first_step"] is None and p["rest"] is None and p["startup_s"] is None
    assert p["imports"] == 3.0 and p["total_s"] == 12.0


def test_the_table_sets_the_sides_side_by_side_with_the_ratio_of_medians():
    fast = {k: (v - 100.0) / 2 + 100.0 for k, v in STAMPS.items()}  # every phase half as long
    runs = {"baseline": [{"phases": startup.phases(STAMPS)}], "current": [{"phases": startup.phases(fast)}]}
    result = {"summary": {side: startup.summarize(rs) for side, rs in runs.items()}}
    assert result["summary"]["current"]["startup_s"] == {"min": 5.75, "median": 5.75}
    lines = startup.table(result).splitlines()
    assert "baseline" in lines[0] and "current" in lines[0] and "ratio" in lines[0]
    row = next(line for line in lines if line.startswith("startup_s"))
    assert "11.50 / 11.50" in row and "5.75 / 5.75" in row and row.endswith("x0.50")


@pytest.mark.ray
def test_the_bench_times_every_phase_of_a_real_training_job(tiny_base, tmp_path, write_config):
    cfg = write_config(tmp_path / "c.yaml", variants={"onpolicy": {}})
    out = tmp_path / "startup.json"
    cmd = [sys.executable, "-m", "rlpipe.cli", "bench", "startup", "--config", str(cfg), "--base", tiny_base[0],
           "--dataset", tiny_base[1], "--steps", "1", "--repeats", "1", "--threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    phases = result["runs"]["current"][0]["phases"]
    assert all(phases[name] is not None and phases[name] >= 0 for name, _, _ in startup.PHASES), phases
    assert phases["startup_s"] <= phases["total_s"]
    assert "startup_s" in proc.stdout and result["cpus"] and len(result["load_avg_start"]) == 3
