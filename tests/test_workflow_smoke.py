"""The CI smoke run: the whole workflow on config/smoke.yaml (minutes on 2 cores), then the report.

Runs in a temporary working directory holding a copy of config/, so the repository's results/
are untouched. Needs the complete trainer (`rlpipe train`, pretraining, benchmarks).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ["reward_vs_step.png", "reward_vs_time.png", "kl.png", "phase_breakdown.png", "phase_steps.png",
           "timeline.png", "throughput.png", "weight_sync.png", "versions.png", "replay.png", "rollouts.html"]


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", "config/smoke.yaml", *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for p in sorted((workdir / "logs").rglob("*.log")))
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}\n{logs}")
    return proc


@pytest.mark.workflow
def test_smoke_workflow_end_to_end(tmp_path):
    shutil.copytree(ROOT / "config", tmp_path / "config")
    run(tmp_path, "--cores", "2")
    results = tmp_path / "results"

    table = pd.read_parquet(results / "summary/runs.parquet")
    assert set(table["variant"]) == {"onpolicy", "k2", "disagg"}
    assert table["finished"].all() and (table["wall_time_s"] > 0).all()
    assert table["total_samples"].nunique() == 1  # same samples for every variant: speedups are valid
    for v in ("onpolicy", "k2", "disagg"):
        info = json.loads((results / f"runs/{v}/run_info.json").read_text())
        assert info["finished"] and (results / f"runs/{v}/checkpoints/FINISHED").exists()
    for f in FIGURES:
        assert (results / "figures" / f).stat().st_size > 1000, f

    run(tmp_path, "--report", "report.html")
    report = (tmp_path / "report.html").read_text()
    for name in [*FIGURES, "summary.html", "discussion.html"]:
        assert name in report, f"{name} missing from the report"

    # nothing left to do: a second invocation schedules no job (no spurious params/code triggers)
    out = run(tmp_path, "-n", "--cores", "2").stdout
    assert "Nothing to be done" in out or "rule train_variant" not in out
