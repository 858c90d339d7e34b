"""Each cluster job parses the workflow again (``snakemake --mode remote``), so the work of a job's
parse must not grow with the number of runs: the main process has resolved and checked every run,
and a job resolves only its own, when its rule asks. Counted (tests/parse_counts.py: calls of
rlpipe.config's per-run functions in a real ``snakemake --list`` parse), never timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.dag

ROOT = Path(__file__).resolve().parents[1]


def overlay(tmp_path: Path, variants: int) -> Path:
    """A math family of ``variants`` variants x 2 replicates on top of the default config."""
    family = {"track": "math", "question": "parse work", "replicates": 2, "base": {"n_grpo_steps": 20},
              "variants": {f"v{i}": {"learning_rate": 1e-5 * (i + 1)} for i in range(variants)}}
    path = tmp_path / f"family{variants}.yaml"
    path.write_text(yaml.safe_dump({"families": {"parse_work": family}}))
    return path


def parse_counts(*args: str) -> dict[str, int]:
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "parse_counts.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_job_s_parse_does_not_grow_with_the_runs(tmp_path):
    small, large = overlay(tmp_path, 4), overlay(tmp_path, 64)
    job_small = parse_counts("--mode", "subprocess", "--configfile", str(small))
    job_large = parse_counts("--mode", "subprocess", "--configfile", str(large))
    assert job_small == job_large, (job_small, job_large)
    # the control: the main process resolves every run (so the counter does count them)
    main_large = parse_counts("--configfile", str(large))
    assert main_large["apply_overrides"] >= job_large["apply_overrides"] + 64, (main_large, job_large)
