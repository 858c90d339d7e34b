"""rlpipe.analysis.results_page: RESULTS.md from a synthetic finished run's results directory."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rlpipe.analysis.results_page import main, render


def prov(cpu="Test CPU 9000", capability="AVX2", torch="2.13.0"):
    return {"cpu_capability": capability, "aten_cpu_capability": None, "cpu_model": cpu, "cpus": 2,
            "python": "3.11.9", "platform": "Linux-x86_64", "versions": {"torch": torch, "ray": "2.60.0"},
            "lock_sha256": "ab" * 32}


@pytest.fixture
def results(tmp_path):
    r = tmp_path / "results"
    for variant, p in (("onpolicy", prov()), ("disagg", prov(capability="AVX512"))):
        d = r / "runs" / variant
        d.mkdir(parents=True)
        (d / "run_info.json").write_text(json.dumps({"variant": variant, "provenance": p}))
    (r / "summary").mkdir()
    pd.DataFrame([
        {"variant": "onpolicy", "mode": "colocated_sync", "val_reward_initial": 0.3125, "val_reward_final": 0.8125,
         "samples_per_s": 40.0, "speedup_vs_ref": 1.0, "wall_time_s": 12.5, "contended": False},
        {"variant": "disagg", "mode": "disaggregated", "val_reward_initial": 0.3125, "val_reward_final": 0.75,
         "samples_per_s": 50.0, "speedup_vs_ref": 1.25, "wall_time_s": 10.0, "contended": True},
    ]).to_csv(r / "summary" / "summary.csv", index=False)
    ev = r / "math" / "eval" / "base"
    ev.mkdir(parents=True)
    (ev / "summary.json").write_text(json.dumps({"n": 512, "accuracy": 0.5, "format_rate": 1.0}))
    ev = r / "tracks" / "wordrev" / "eval" / "onpolicy"  # a user's track
    ev.mkdir(parents=True)
    (ev / "summary.json").write_text(json.dumps({"n": 64, "accuracy": 0.75, "format_rate": 0.5}))
    fam = r / "families" / "lr_sweep" / "report"
    fam.mkdir(parents=True)
    pd.DataFrame([{"variant": "lr1e-4", "replicates": 3, "diverged": 0, "val_reward_final_mean": 0.672,
                   "val_reward_final_ci": 0.051},
                  {"variant": "lr1e-2", "replicates": 1, "diverged": 1, "val_reward_final_mean": 0.0,
                   "val_reward_final_ci": float("nan")}]).to_csv(fam / "summary.csv", index=False)
    return r


def test_page_holds_machine_versions_and_headline_numbers(results):
    page = render(results, date="2030-01-02 03:04 UTC")
    assert "Written 2030-01-02 03:04 UTC" in page
    assert "| CPU model | Test CPU 9000 |" in page
    assert "| CPU capability (torch kernels) | AVX2; AVX512 |" in page  # runs differ: both listed
    assert "| torch | 2.13.0 |" in page and "| ray | 2.60.0 |" in page
    assert "| ATEN_CPU_CAPABILITY | not set |" in page
    assert "| onpolicy | colocated_sync | 0.312 | 0.812 | 40.00 | 1.00x | 12.5 | False |" in page
    assert "| disagg | disaggregated | 0.312 | 0.750 | 50.00 | 1.25x | 10.0 | True |" in page
    assert "| base | 512 | 0.500 | 1.000 |" in page
    assert "## Track wordrev" in page and "| onpolicy | 64 | 0.750 | 0.500 |" in page
    assert "| lr_sweep | lr1e-4 | 3 | 0.672 ± 0.051 | 0 |" in page
    assert "| lr_sweep | lr1e-2 | 1 | 0.000 | 1 |" in page  # one replicate: no interval


def test_a_run_of_a_users_track_only_leaves_the_seed_answers_out(tmp_path):
    ev = tmp_path / "r" / "tracks" / "wordrev" / "eval" / "base"
    ev.mkdir(parents=True)
    (ev / "summary.json").write_text(json.dumps({"n": 8, "accuracy": 0.5, "format_rate": 1.0}))
    page = render(tmp_path / "r", date="d")
    assert "## Track wordrev" in page and "## Answers to the seed questions" not in page
    assert "answers to the seed questions are left out" in page


def test_missing_parts_are_left_out(tmp_path):
    (tmp_path / "r").mkdir()
    page = render(tmp_path / "r", date="d")
    assert "No finished run was found" in page and "recorded no provenance" in page
    assert "systems comparison" not in page and "MATH track" not in page


def test_cli_writes_the_page_atomically(results, tmp_path):
    assert main(["--results", str(results), "--date", "d"]) == 0
    assert (results / "RESULTS.md").read_text() == render(results, date="d")
    out = tmp_path / "docs" / "x.md"
    assert main(["--results", str(results), "--out", str(out), "--date", "d"]) == 0
    assert out.read_text() == render(results, date="d")


def test_not_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="--results: .*nope is not a directory"):
        render(tmp_path / "nope")


def test_run_time_comes_from_the_last_complete_runs_record(results):
    """The page's "Run time" line is read from results/run_timing.json (written by the workflow when
    a run from the start succeeds), never typed; a contended run says so; without a record, it says
    none was timed yet. Either way it says timings need a quiet machine."""
    from rlpipe.analysis import run_timing

    page = render(results)
    assert "## Run time" in page and "No complete run of this pipeline has been timed here yet" in page
    assert "only on a quiet machine" in page
    rules = {"run_unit_tests": 1, "pretrain_base": 2, "train_variant": 8, "aggregate_metrics": 1}
    assert run_timing.is_complete(rules) and not run_timing.is_complete({"aggregate_metrics": 1})
    busy = {"other_cpu_frac": 0.61, "cpus": 2, "contended": True}
    rec = run_timing.record(2775.4, rules, 2, busy, "pipeline-ab.yaml", "2030-01-02 03:04 UTC")
    (results / run_timing.RUN_TIMING_FILE).write_text(json.dumps(rec))
    page = render(results)
    assert ("The last complete run here (12 jobs, finished 2030-01-02 03:04 UTC) took 46 min 15 s with --cores 2 "
            "on 2 CPUs; other processes took 61% of the machine meanwhile: contended, indicative only.") in page
    quiet = {**rec, "wall_s": 754.0, "conditions": {"other_cpu_frac": 0.02, "cpus": 2, "contended": False}}
    (results / run_timing.RUN_TIMING_FILE).write_text(json.dumps(quiet))
    page = render(results)
    assert "took 12 min 34 s with --cores 2 on 2 CPUs; other processes took 2% of the machine meanwhile." in page
    assert "indicative" not in page.split("## Run time")[1].split("##")[0]
