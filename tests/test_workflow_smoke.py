"""The CI smoke run: the whole workflow on config/smoke.yaml (minutes on 2 cores), then the report,
then what config edits rerun (dry runs against the real run's metadata).

The run is the suite's one smoke run (``smoke_run`` in tests/conftest.py), made once and read by the
tests here and by tests/test_example_workflow.py: the built-in tracks and the worked example's track
side by side, in a temporary working directory holding a copy of config/, so the repository's
results/ are untouched. Needs the complete trainer (`rlpipe train`, pretraining, benchmarks).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from rlpipe import contract

FIGURES = [contract.figure_file(kind) for kind in contract.FIGURES]  # results/figures/ file names
# the first test here may make the run (``smoke_run``), whose setup counts against its timeout
pytestmark = [pytest.mark.workflow, pytest.mark.timeout(1800)]


def test_keyword_track_runs_summary_and_figures(smoke_run):
    results = smoke_run.results
    summary = results / "summary"
    table = pd.read_parquet(summary / contract.SUMMARY_FILES["runs"])
    assert set(table["variant"]) == {"onpolicy", "k2", "disagg"}
    assert table["finished"].all() and (table["wall_time_s"] > 0).all()
    assert table["total_samples"].nunique() == 1  # same samples for every variant: speedups are valid
    assert set(table["device_type"]) <= set(contract.DEVICE_TYPES)
    for v in ("onpolicy", "k2", "disagg"):
        run_dir = results / "runs" / v
        for f in (*contract.RUN_FILES.values(), contract.RUN_CONFIG_FILE, contract.CHECKPOINT_FILE):
            assert (run_dir / f).exists(), f"{v}: {f}"
        info = json.loads((run_dir / contract.RUN_INFO_FILE).read_text())
        assert not set(contract.RUN_INFO_KEYS) - set(info), f"{v}: {set(contract.RUN_INFO_KEYS) - set(info)}"
        assert info["finished"] and (run_dir / contract.FINISHED_MARKER).exists()
        metrics = pd.read_parquet(run_dir / contract.METRICS_FILE)
        assert tuple(metrics.columns) == contract.METRIC_COLUMNS, v
        events = pd.read_parquet(run_dir / contract.EVENTS_FILE)
        assert tuple(events.columns) == contract.EVENT_COLUMNS and set(events["phase"]) <= set(contract.PHASES), v
        assert tuple(pd.read_parquet(run_dir / contract.VERSIONS_FILE).columns) == contract.VERSION_COLUMNS, v
    for f in (*contract.SUMMARY_FILES.values(), *contract.SUMMARY_REPORT_FILES.values()):
        assert (summary / f).stat().st_size > 0, f
    for f in FIGURES:
        assert (results / "figures" / f).stat().st_size > 1000, f


def test_math_track(smoke_run):
    """The MATH track: generated arithmetic data, its own tokenizer and base model, the base model's
    evaluation, an on-policy run with format/answer rewards, the final policy's evaluation, the report."""
    math = smoke_run.results / "math"
    for f in ("data/train.jsonl", "data/val.jsonl", "data/corpus.txt", "tokenizer/tokenizer.json", "base/model.pt"):
        assert (math / f).stat().st_size > 0, f
    for model in ("base", "onpolicy"):
        summary = json.loads((math / "eval" / model / contract.EVAL_FILES["summary"]).read_text())
        assert summary["n"] == 8 and sum(summary["categories"].values()) == 8, model
        examples = pd.read_parquet(math / "eval" / model / contract.EVAL_FILES["examples"])
        assert tuple(examples.columns) == contract.EVAL_COLUMNS and len(examples) == 8
    m = pd.read_parquet(math / "runs" / "onpolicy" / contract.METRICS_FILE)
    assert tuple(m.columns) == contract.METRIC_COLUMNS and list(m["step"]) == [0, 1, 2]
    assert m.loc[m["step"] > 0, ["reward/format_mean", "reward/answer_mean"]].notna().all().all()
    assert m["reward/val_answer_mean"].notna().all() and m["reward/val_format_mean"].notna().all()
    for f in contract.MATH_REPORT_FILES.values():
        assert (math / "report" / f).stat().st_size > 0, f


def test_families_and_the_toy_grid(smoke_run):
    results = smoke_run.results
    # the replicated family (2 seeds x 2 variants): its section states intervals
    fam = results / "families" / "epochs_per_batch"
    for v in ("onpolicy", "e2_epochs"):
        for seed in (0, 1):
            info = json.loads((fam / contract.family_run_dir(v, seed) / contract.RUN_INFO_FILE).read_text())
            assert info["finished"] and info["config"]["seed"] == seed, (v, seed)
    numbers = json.loads((fam / contract.FAMILY_REPORT_DIR / contract.FAMILY_REPORT_FILES["numbers"]).read_text())
    assert numbers["variants"]["onpolicy"]["val_reward_final_n"] == 2
    assert numbers["comparisons"][0]["reward_verdict"] != "unreplicated"
    # the systems family: the variants table, its one seed read from results/runs (nothing retrained)
    sys_fam = results / "families" / "systems"
    numbers = json.loads((sys_fam / contract.FAMILY_REPORT_DIR / contract.FAMILY_REPORT_FILES["numbers"]).read_text())
    assert list(numbers["variants"]) == ["onpolicy", "k2", "disagg"] and numbers["reference"] == "onpolicy"
    assert all(r["samples_per_s_n"] == 1 and r["samples_per_s_mean"] > 0 for r in numbers["variants"].values())
    assert not (sys_fam / "runs").exists()
    for f in contract.TOY_SORT_FILES.values():
        assert (results / "toy_sort" / f).stat().st_size > 0, f


def test_benchmarks(smoke_run, bench_peaks):
    """The update phase and the sampler against the same-run matmul peak; the scaling curves (smoke: the
    base's width and the first of scaling_sizes, in both modes; every phase timed per step, the
    generator's too)."""
    bench = smoke_run.results / "bench"
    upd = json.loads((bench / "update.json").read_text())
    assert upd["matmul_peak_gflops"] > 0 and 0 < upd["fwd_bwd_fraction_of_peak"]
    # each value is rounded to 5 decimals in the JSON: 4 roundings of <= 5e-6 (ms-scale on the smoke model)
    assert upd["update_s"] == pytest.approx(upd["fwd_bwd_s"] + upd["optimizer_s"] + upd["kl_monitor_s"], rel=1e-3,
                                            abs=2e-5)
    assert json.loads((bench / "sampler.json").read_text())["kv_gflops"] > 0
    points = json.loads((bench / contract.SCALING_FILE).read_text())["points"]
    for name in ("update.json", "sampler.json", contract.SCALING_FILE, "weight_sync.json"):  # both peak fractions
        bench_peaks(name, json.loads((bench / name).read_text()))
    assert {(p["mode"], p["d_model"]) for p in points if p["axis"] == "model"} == {
        (m, d) for m in contract.SCALING_MODES for d in (64, 32)}  # smoke.scaling_sizes: 1 of [64, 256]
    assert all(p["samples_per_s"] > 0 and p[contract.scaling_phase_key("generate")] > 0 for p in points)
    exps = pd.read_csv(bench / contract.SCALING_REPORT_DIR / contract.SCALING_REPORT_FILES["table"])
    assert set(exps.loc[exps["axis"] == "model", "mode"]) == set(contract.SCALING_MODES)
    assert exps.loc[exps["axis"] == "model", "exponent"].notna().all()


def test_results_page_answers_every_seed_question(smoke_run):
    """rule write_results_page: numbers with their provenance; the deliverables manifest on a real run:
    every seed question has its section and a written answer; only the families the smoke config
    leaves out read "Not run"."""
    from rlpipe.analysis import deliverables
    from rlpipe.analysis.results_view import ResultsView

    page = (smoke_run.results / "RESULTS.md").read_text()
    assert "## Machine and software" in page and "| torch |" in page and "| onpolicy |" in page
    assert "## The MATH track" in page and "## Experiment families" in page
    done = deliverables.answers(ResultsView.load(smoke_run.results))
    assert deliverables.problems(done, page) == []
    not_run = [" ".join(text) for _, text in done if any(t.startswith("Not run") for t in text)]
    assert all("results/families/" in t for t in not_run), not_run


def test_the_report_holds_every_figure_and_section(smoke_run):
    report = (smoke_run.workdir / "report.html").read_text()
    for name in [*FIGURES, *contract.SUMMARY_REPORT_FILES.values(), contract.MATH_REPORT_FILES["eval_html"],
                 contract.MATH_REPORT_FILES["learning_png"],
                 contract.FAMILY_REPORT_FILES["curves"], contract.FAMILY_REPORT_FILES["health"],
                 contract.TOY_SORT_FILES["table_html"], contract.SCALING_REPORT_FILES["figure"],
                 contract.SCALING_REPORT_FILES["discussion"]]:
        assert name in report, f"{name} missing from the report"
    assert "System Message" not in report and "Unknown target name" not in report


def test_a_finished_run_plans_nothing_and_a_config_edit_reruns_exactly_what_it_affects(smoke_run, dry_run):
    """A second invocation schedules no job (no spurious params/code triggers); reordered keys rerun
    nothing; a learning-rate edit of the shared train section reruns the keyword track's runs and their
    aggregation in the same invocation, nothing upstream, and not the example's track, whose own
    learning rate overrides it; a forced run starts afresh."""
    out = smoke_run.snakemake("-n", "--cores", "2").stdout
    assert dry_run.jobs(out) == [], out[-3000:]
    config = smoke_run.workdir / "config"
    smoke = yaml.safe_load((config / "smoke.yaml").read_text())

    def plan(edited: dict, *args: str) -> list[dict]:
        (config / "edited.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
        files = [f.replace("config/smoke.yaml", "config/edited.yaml") for f in smoke_run.configfiles]
        return dry_run.jobs(smoke_run.snakemake("-n", "--cores", "2", *args, configfiles=files).stdout)

    reordered = dict(reversed(list(smoke.items())))  # every key in another order, values the same
    reordered["model"] = {**smoke["model"], "overrides": dict(reversed(list(smoke["model"]["overrides"].items())))}
    assert plan(reordered) == [], "reordering keys must rerun nothing"
    jobs = plan({**smoke, "train": {**smoke["train"], "learning_rate": 1e-3}})
    rules = {j["rule"] for j in jobs}
    assert {"train_variant", "aggregate_metrics"} <= rules  # in this one invocation ...
    assert not rules & {"build_corpus", "train_tokenizer", "pretrain_base"}  # ... and nothing upstream
    trains = [j for j in jobs if j["rule"] == "train_variant"]
    assert {(j["wildcards"].get("tdir", ""), j["wildcards"]["variant"]) for j in trains} == {
        ("", "onpolicy"), ("", "k2"), ("", "disagg")}
    assert all(j["resources"]["resume"] == "auto" for j in trains)  # a changed run: rlpipe decides
    forced = [j for j in plan(smoke, "results/runs/k2/metrics.parquet", "--forcerun", "train_variant")
              if j["rule"] == "train_variant"]
    assert [(j["wildcards"]["variant"], j["resources"]["resume"]) for j in forced] == [("k2", "never")]
