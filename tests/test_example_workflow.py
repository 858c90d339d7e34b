"""The worked example (examples/wordrev/) as a user runs it: only files outside src/rlpipe/ (an
overlay, a data generator, a template and a reward), and the workflow runs its track's variants, a
systems family, an ablation family, the evaluations, the results page and the report. CI runs it with
config/smoke.yaml added (the smoke caps shrink every track, this one included: a few steps per stage)
in a temporary working directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlpipe.analysis import contract
from rlpipe.config import apply_overrides, load_yaml, parse_config, workflow_tracks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "wordrev"


def test_the_example_overlay_is_a_track_of_its_own_with_two_families():
    cfg = parse_config(apply_overrides(load_yaml(ROOT / "config/config.yaml"), load_yaml(EXAMPLE / "config.yaml")))
    tracks = workflow_tracks(cfg)
    assert list(tracks) == ["wordrev"] and tracks["wordrev"].subdir == "tracks/wordrev/"
    assert tracks["wordrev"].pipeline.train.task == "text"
    assert cfg.workflow.families == ["wordrev_systems", "wordrev_lr"]
    assert cfg.families["wordrev_systems"].is_systems and cfg.families["wordrev_lr"].base_track == "wordrev"


@pytest.mark.workflow
def test_the_example_runs_end_to_end_from_its_overlay(tmp_path):
    shutil.copytree(ROOT / "config", tmp_path / "config")
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "wordrev")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--cores", "2", "--configfile", "config/config.yaml", "examples/wordrev/config.yaml",
           "config/smoke.yaml"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-1500:]}" for p in sorted((tmp_path / "logs").rglob("*.log")))
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}\n{logs}")
    track = tmp_path / "results" / "tracks" / "wordrev"
    for f in ("data/train.jsonl", "data/val.jsonl", "data/corpus.txt", "tokenizer/tokenizer.json", "base/model.pt"):
        assert (track / f).stat().st_size > 0, f
    for v in ("onpolicy", "k2", "disagg"):
        metrics = pd.read_parquet(track / "runs" / v / contract.METRICS_FILE)
        assert metrics["reward/val_mean"].notna().any() and "reward/val_answer_mean" in metrics, v
        assert json.loads((track / "runs" / v / contract.RUN_INFO_FILE).read_text())["finished"], v
    for model in ("base", "onpolicy", "k2", "disagg"):
        assert json.loads((track / "eval" / model / contract.EVAL_FILES["summary"]).read_text())["n"] == 8, model
    assert (track / "report" / contract.MATH_REPORT_FILES["math_json"]).is_file()
    for family in ("wordrev_systems", "wordrev_lr"):
        report = tmp_path / "results" / "families" / family / contract.FAMILY_REPORT_DIR
        assert (report / contract.FAMILY_REPORT_FILES["table"]).is_file(), family
    # the systems family's first seed is the track's own runs: nothing trained twice
    assert not (tmp_path / "results" / "families" / "wordrev_systems" / "runs").exists()
    page = (tmp_path / "results" / "RESULTS.md").read_text()
    assert "## Track wordrev" in page and "wordrev_lr" in page
    assert not (tmp_path / "results" / "runs").exists() and not (tmp_path / "results" / "math").exists()
    assert not (tmp_path / "results" / "tests").exists() and not (tmp_path / "results" / "toy_sort").exists()
    report = subprocess.run([*cmd, "--report", "report.html"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    html = (tmp_path / "report.html").read_text()
    assert "System Message" not in html and "Unknown target name" not in html and "Not run" not in html
