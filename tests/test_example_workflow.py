"""The worked example (examples/wordrev/) as a user runs it: only files outside src/rlpipe/ (an
overlay, a data generator, a template and a reward), and the workflow runs its track's variants, a
systems family, an ablation family, the evaluations, the results page and the report. CI runs it in
the suite's one smoke run (config/smoke.yaml: the smoke caps shrink every track, this one included),
beside the built-in tracks; that the overlay alone plans its own track only (no built-in track, gate,
toy grid or benchmark) is tests/test_user_track_workflow.py's dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rlpipe import contract
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
@pytest.mark.timeout(1800)  # it may be the test that makes the run (``smoke_run``)
def test_the_example_track_runs_end_to_end_beside_the_built_in_ones(smoke_run):
    """The suite's smoke run (tests/conftest.py: ``smoke_run``) holds the example's track and families
    beside the built-in tracks: its data, base model, runs, evaluations, report section, families and
    results-page section; the systems family's first seed is the track's own runs (nothing trained twice)."""
    results = smoke_run.results
    track = results / "tracks" / "wordrev"
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
        report = results / "families" / family / contract.FAMILY_REPORT_DIR
        assert (report / contract.FAMILY_REPORT_FILES["table"]).is_file(), family
    assert not (results / "families" / "wordrev_systems" / "runs").exists()
    page = (results / "RESULTS.md").read_text()
    assert "## Track wordrev" in page and "wordrev_lr" in page
    html = (smoke_run.workdir / "report.html").read_text()
    assert "System Message" not in html and "Unknown target name" not in html

