"""Every planned job that runs a report lists its code as inputs (``rlpipe.workflow.code_inputs``,
called by workflow/rules/common.smk), so that editing any module a report loads reruns it: the source of each
rlpipe module of the entry's package that importing the ``rlpipe <command>`` entry module really
loads, read from a fresh interpreter's ``sys.modules`` (not from the workflow's reading of import
statements), and each data file beside those modules that one of them names (seed_questions.yaml).

Checked on the jobs ``snakemake -n -p`` plans for the default config and for the worked example's user
track (which adds aggregate_track and the plot_track_* rules).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from rlpipe.cli import COMMANDS

pytestmark = pytest.mark.dag

ROOT = Path(__file__).resolve().parents[1]
# rules the two plans must reach, so that a change of the printout's format cannot empty the check
REPORT_RULES = {"aggregate_metrics", "write_results_page", "report_family", "report_track", "report_scaling",
                "run_toy_sort", "aggregate_track", "plot_kl", "plot_track_timeline"}
LOADED = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
          "print(json.dumps({n: getattr(m, '__file__', None) for n, m in list(sys.modules.items())}))")


@cache
def loaded_code(command: str) -> frozenset[Path]:
    """What a report's rule must list for ``rlpipe <command>``: the files of the modules of its entry's
    package that importing the entry loads, and the data files beside them whose names they contain."""
    entry = COMMANDS[command][0]
    proc = subprocess.run([sys.executable, "-c", LOADED, entry], capture_output=True, text=True, timeout=300,
                          check=True)
    own = entry.rpartition(".")[0] + "."
    files = {Path(f).resolve() for n, f in json.loads(proc.stdout.splitlines()[-1]).items() if n.startswith(own) and f}
    data = set()
    for f in files:
        text = f.read_text()
        data |= {d.resolve() for d in f.parent.iterdir() if d.is_file() and d.suffix != ".py" and d.name in text}
    return frozenset(files | data)


def commands_run(shell: str) -> list[str]:
    """The ``rlpipe <command>`` a job's shell runs (``rlpipe bench ...`` is no report: it lists no code)."""
    return [c for c in re.findall(r"(?:^|[\s'\"])rlpipe ([\w-]+)", shell) if c in COMMANDS]


def missing_code(jobs: list[dict]) -> dict[str, list[str]]:
    """rule -> the loaded files its job does not list, for each job that runs a report or lists code."""
    out = {}
    for job in jobs:
        inputs = {Path(p).resolve() for p in job["input"] if p.startswith("/")}
        commands = commands_run(job["shell"])
        reports = [c for c in commands if COMMANDS[c][0].startswith("rlpipe.analysis.")]
        if not reports and not any(p.suffix == ".py" for p in inputs):
            continue
        lacking = {f for c in commands for f in loaded_code(c)} - inputs
        out[job["rule"]] = sorted(str(f.relative_to(ROOT)) for f in lacking)
    return out


def plan(tmp_path: Path, run_snakemake, dry_run, *args: str) -> list[dict]:
    """The jobs ``snakemake -n -p`` plans in a copy of the project's configs (through the tests' dry-run
    server, ``run_snakemake``)."""
    for d in ("config", "examples"):
        shutil.copytree(ROOT / d, tmp_path / d)
    return dry_run.jobs(run_snakemake(tmp_path, "-n", "-p", *args).stdout)


def test_every_report_job_lists_the_code_its_command_loads(tmp_path, run_snakemake, dry_run):
    jobs = plan(tmp_path / "default", run_snakemake, dry_run) + plan(
        tmp_path / "user", run_snakemake, dry_run, "--configfile", "examples/wordrev/config.yaml")
    missing = missing_code(jobs)
    assert REPORT_RULES <= set(missing), sorted(set(missing))
    assert not any(missing.values()), {r: m for r, m in missing.items() if m}
    page = next(j for j in jobs if j["rule"] == "write_results_page")
    assert any(p.endswith("rlpipe/analysis/seed_questions.yaml") for p in page["input"])


def test_a_job_lacking_one_module_is_named():
    job = {"rule": "report_family", "shell": "python -m rlpipe.watch x report_family -- rlpipe family-report --x 1",
           "input": [str(f) for f in loaded_code("family-report") if f.name != "expectations.py"]}
    assert missing_code([job]) == {"report_family": ["src/rlpipe/analysis/expectations.py"]}
    assert missing_code([dict(job, shell="rlpipe bench sampler", input=[])]) == {}
