"""The default pipeline's test gate (rule run_unit_tests, workflow.test_args of config/config.yaml):
only the fast tests that guard a run, read by pytest from tests/gate_args.txt; no Ray, workflow,
learning or slow test, so it stays within its 2-minute budget on 2 quiet cores. CI runs the rest."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "tests" / "gate_args.txt"


def gate_args() -> list[str]:
    return [ln for ln in GATE.read_text().splitlines() if ln.strip()]


def test_the_default_pipeline_runs_the_gate():
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert cfg["workflow"]["test_args"] == "@tests/gate_args.txt"  # pytest reads its arguments from the file


def test_the_gate_leaves_out_ray_workflow_learning_and_slow_tests():
    args = gate_args()
    expr = args[args.index("-m") + 1]
    for marker in ("slow", "ray", "workflow", "learning", "dag"):
        assert f"not {marker}" in expr, marker
    files = [a for a in args if a.startswith("tests/") and "::" not in a]
    assert files and all((ROOT / f).is_file() for f in files), files
    for f in files:
        text = (ROOT / f).read_text()
        # a whole module of Ray, workflow or learning tests does not belong in the gate
        assert not re.search(r"^pytestmark = .*mark\.(ray|workflow|learning|slow|dag)", text, re.M), f
        assert not re.search(r"^import ray|^from ray", text, re.M), f
