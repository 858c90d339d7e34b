"""The Snakemake workflow through its CLI, in a temporary working directory.

Dry runs (``snakemake -n``): the DAG holds one training job per configured variant with the GPUs
rlpipe.config.variant_gpus gives; a bad config fails with the key's name; targeting one variant
schedules only that variant. The slow test executes the analysis half of the workflow for real on
synthetic runs (aggregation, every figure, the report) and checks what an edit reruns.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from rlpipe import contract

pytestmark = pytest.mark.dag

ROOT = Path(__file__).resolve().parents[1]
ALL_VARIANTS = {"onpolicy", "k2", "k4", "k8", "disagg", "disagg_rdt", "replay", "kl_penalty"}


@pytest.fixture
def snakemake(run_snakemake):
    """``snakemake(workdir, *args, env=None, check=True)``: the project's Snakefile in ``workdir``
    (tests/conftest.py ``run_snakemake``: the dry runs go through one server process)."""
    return run_snakemake


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "config", tmp_path / "config")
    return tmp_path


def test_default_config_dag(workdir, dry_run, snakemake):
    out = snakemake(workdir, "-n").stdout
    assert dry_run.training_gpus(out) == {**{v: 0 for v in ALL_VARIANTS}, "math/onpolicy": 0}
    rules = dry_run.rules(out)
    assert {"run_unit_tests", "build_corpus", "train_tokenizer", "pretrain_base",
            "build_keyword_dataset", "bench_weight_sync", "bench_sampler", "bench_update", "aggregate_metrics"} <= rules
    assert {"bench_scaling", "report_scaling"} <= rules  # the scaling curves are in the default report
    # TRL is not in the lock: the default run benches it only where it is installed
    assert ("bench_trl" in rules) is (importlib.util.find_spec("trl") is not None)
    assert {r for r in rules if r.startswith("plot_")} >= {"plot_kl", "plot_timeline", "plot_throughput"}


def test_gpu_config_dag(workdir, dry_run, snakemake):
    out = snakemake(workdir, "-n", "--configfile", "config/gpu.yaml").stdout
    assert dry_run.training_gpus(out) == {"onpolicy": 1, "k2": 1, "k4": 1, "k8": 1, "kl_penalty": 1,
                                  "disagg": 2, "disagg_rdt": 2, "replay": 2, "math/onpolicy": 1}


def test_smoke_config_dag_skips_tests(workdir, dry_run, snakemake):
    out = snakemake(workdir, "-n", "--configfile", "config/smoke.yaml").stdout
    assert dry_run.training_gpus(out) == {"onpolicy": 0, "k2": 0, "disagg": 0, "math/onpolicy": 0}
    assert "run_unit_tests" not in dry_run.rules(out)


def test_one_variant_target_schedules_only_it(workdir, dry_run, snakemake):
    out = snakemake(workdir, "-n", "results/runs/k4/metrics.parquet").stdout
    assert set(dry_run.training_gpus(out)) == {"k4"}
    assert "aggregate_metrics" not in out


@pytest.mark.parametrize("bad,key", [
    ({"train": {"lerning_rate": 0.1}}, "lerning_rate"),
    ({"train": {"n_grpo_steps": "many"}}, "n_grpo_steps"),
    ({"variants": {"k2": {"k": 5}}}, "variants.k2"),
    ({"variants": {"k2": {"bogus": 1}}}, "variants.k2.bogus"),
])
def test_bad_config_fails_with_key(workdir, bad, key, snakemake):
    (workdir / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = snakemake(workdir, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- real execution


def fake_upstream(workdir: Path, variants, make_runs) -> None:
    """Outputs of every stage before aggregation, oldest first (no Snakemake metadata: only file
    times count), with synthetic runs that follow the run-output contract."""
    r = workdir / "results"
    for f in ("config/pipeline.yaml", "data/corpus.txt", "tokenizer/tokenizer.json", "base/model.pt",
              "data/keywords/train.jsonl", "data/keywords/val.jsonl", "data/keywords/split.json",
              "base/zero_shot.json"):
        (r / f).parent.mkdir(parents=True, exist_ok=True)
        (r / f).write_text("synthetic\n")
    make_runs(r / "runs", variants)
    (r / "bench").mkdir()
    (r / "bench/weight_sync.json").write_text(json.dumps(
        [{"transport": "object_store", "median_s": 0.2}, {"transport": "rdt", "backend": "gloo", "median_s": 0.05}]))
    (r / "bench/sampler.json").write_text(json.dumps({"tokens_per_s": 1000.0}))
    (r / "bench/update.json").write_text(json.dumps({"update_fraction_of_peak": 0.3}))
    (r / "bench/trl.json").write_text(json.dumps({"bench": "trl", "skipped": True, "reason": "synthetic"}))
    # the analysis half of the keyword track only (the MATH track, the families, the toy grid and the
    # scaling bench have their own tests)
    (workdir / "config/keyword_only.yaml").write_text(
        "workflow: {tracks: [keyword], families: [], toy_sort_seeds: [], bench_scaling: false}\n")


@pytest.mark.slow
def test_analysis_half_runs_and_reports(workdir, tmp_path, make_runs, dry_run, snakemake):
    # a private copy of the package, so the test can "edit" plots.py / aggregate.py (mtime)
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "rlpipe", src / "rlpipe", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(src)}
    fake_upstream(workdir, ("onpolicy", "k2", "disagg"), make_runs)
    smoke = ("--configfile", "config/smoke.yaml", "config/keyword_only.yaml")
    snakemake(workdir, "--cores", "2", *smoke, env=env)
    figures = sorted(p.name for p in (workdir / "results/figures").iterdir())
    assert len(figures) == len(contract.FIGURES)
    assert all((workdir / "results/figures" / f).stat().st_size > 1000 for f in figures)

    snakemake(workdir, *smoke, "--report", "report.html", env=env)
    report = (workdir / "report.html").read_text()
    for name in [*figures, "summary.html", "discussion.html"]:
        assert name in report, name

    assert dry_run.rules(snakemake(workdir, "-n", *smoke, env=env).stdout) == set()  # up to date
    # Snakemake 9 compares input checksums, not just times: an edit must change the content
    plots_py, aggregate_py = src / "rlpipe/analysis/plots.py", src / "rlpipe/analysis/aggregate.py"
    original = plots_py.read_text()
    plots_py.write_text(original + "\n# edited\n")  # editing the plotting code reruns only the figures
    assert dry_run.rules(snakemake(workdir, "-n", *smoke, env=env).stdout) == {
        f"plot_{f.rsplit('.', 1)[0]}" for f in figures}
    plots_py.write_text(original)
    aggregate_py.write_text(aggregate_py.read_text() + "\n# edited\n")  # summary + figures, no training
    out = snakemake(workdir, "-n", *smoke, env=env).stdout
    assert "aggregate_metrics" in dry_run.rules(out) and "train_variant" not in dry_run.rules(out)
    (workdir / "results/runs/k2/metrics.parquet").unlink()  # one variant lost: only it retrains
    out = snakemake(workdir, "-n", *smoke, env=env).stdout
    assert set(dry_run.training_gpus(out)) == {"k2"}


FAKE_RLPIPE = """#!{python}
# stand-in for `rlpipe train`: records its arguments, copies synthetic outputs, writes a checkpoint
import os, shutil, sys
args = sys.argv[1:]
open(os.environ["FAKE_LOG"], "a").write(" ".join(args) + "\\n")
out, variant = args[args.index("--out") + 1], args[args.index("--variant") + 1]
src = os.path.join(os.environ["FAKE_RUNS"], variant)
os.makedirs(out, exist_ok=True)
for name in os.listdir(src):
    shutil.copy(os.path.join(src, name), os.path.join(out, name))
os.makedirs(os.path.join(out, "checkpoints"), exist_ok=True)
open(os.path.join(out, "checkpoints", "last.pt"), "w").write("ckpt")
sys.exit(int(os.environ.get("FAKE_FAIL", "0")))
"""


def test_train_rule_hands_the_resume_decision_to_rlpipe(workdir, tmp_path, make_runs, snakemake):
    """The rule's shell is one call: ``--resume never`` when the invocation forces the job, else
    ``--resume auto``, and the decision itself (fingerprint, FINISHED marker, checkpoint) is
    rlpipe.trainer.resume's, unit-tested in test_resume.py."""

    fake_upstream(workdir, ("onpolicy", "k2", "disagg"), make_runs)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rlpipe").write_text(FAKE_RLPIPE.format(python=sys.executable))
    (bin_dir / "rlpipe").chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
           "FAKE_RUNS": str(make_runs(tmp_path / "template", ("k2",)))}
    target = "results/runs/k2/metrics.parquet"

    def train(fail=False, force=True):
        log.write_text("")
        forcing = ("--forcerun", target) if force else ()
        proc = snakemake(workdir, target, "--cores", "1", "--configfile", "config/smoke.yaml", *forcing,
                         env={**env, "FAKE_FAIL": "1" if fail else "0"}, check=not fail)
        calls = log.read_text().splitlines()
        assert len(calls) == 1 and calls[0].startswith("train --config"), proc.stderr[-2000:]
        return calls[0]

    assert train().endswith("--resume never")  # a forced rerun starts afresh
    assert train(fail=True).endswith("--resume never")
    assert (workdir / "results/runs/k2/checkpoints/last.pt").exists()  # a failed job keeps its checkpoint
    assert train(force=False).endswith("--resume auto")  # rerun after the failure: rlpipe decides


def test_slurm_profile_dry_run(workdir, dry_run, snakemake):
    """workflow/profiles/slurm with its executor plugin: every job becomes a SLURM job, training jobs
    carry the GPUs of their mode, the profile's partition and, across nodes, their nodes."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    shutil.copytree(ROOT / "workflow" / "profiles", workdir / "profiles")
    profile = yaml.safe_load((workdir / "profiles" / "slurm" / "config.yaml").read_text())
    assert "<" not in json.dumps(profile), "the profile must run as shipped: no placeholder"
    (workdir / "config" / "cluster.yaml").write_text(yaml.safe_dump({"workflow": {
        "slurm_account": "proj1", "slurm_partition": "cpuq", "slurm_gpu_partition": "gpuq",
        "nodes_per_disaggregated": 2}}))
    out = snakemake(workdir, "-n", "--workflow-profile", str(workdir / "profiles" / "slurm"),
                    "--configfile", "config/gpu.yaml", "config/cluster.yaml").stdout
    assert dry_run.training_gpus(out) == {"onpolicy": 1, "k2": 1, "k4": 1, "k8": 1, "kl_penalty": 1,
                                          "disagg": 2, "disagg_rdt": 2, "replay": 2, "math/onpolicy": 1}
    jobs = dry_run.jobs(out)
    # account and partitions from the one place (workflow.slurm_*): a job declaring GPUs gets the GPU one
    assert {j["resources"].get("slurm_account") for j in jobs if j["rule"] != "all"} == {"proj1"}
    for j in jobs:
        if j["rule"] != "all":
            gpu = int(j["resources"].get("gpu", 0) or 0)
            assert j["resources"].get("slurm_partition") == ("gpuq" if gpu else "cpuq"), j
    trains = [j for j in jobs if j["rule"] == "train_variant"]
    # memory and time from the model and steps (rlpipe.slurm), not one figure for every model
    assert all(int(j["resources"]["mem_mb"]) >= 4000 and int(j["resources"]["runtime"]) >= 30 for j in trains)
    # nodes_per_disaggregated 2: a disaggregated job spans two nodes with a GPU on each (--nodes, and
    # --gpus-per-node through slurm_extra; tests/test_slurm_multinode.py runs it), a colocated one stays on one
    for j in trains:
        across = int(j["resources"]["gpu"]) == 2
        assert int(j["resources"]["nodes"]) == (2 if across else 1), j
        assert j["resources"].get("slurm_extra", "").strip("'\"") == ("--gpus-per-node=1" if across else ""), j


def _math_standin(workdir: Path, qwen: Path, data: Path, **train) -> Path:
    """An overlay pointing config/math.yaml at local stand-ins: the tiny Qwen2 and the MATH fixture."""
    overlay = {"math": {"base_model_dir": str(qwen), "dataset_dir": str(data), "eval_size": 6,
                        "eval_max_tokens": 24, "train": {"device": "cpu", "dtype": "float32", **train}},
               "workflow": {"gpus_per_colocated": 0, "gpus_per_disaggregated": 0}}
    path = workdir / "config" / "standin.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return path


def test_math_config_validates_and_expands_to_the_math_track_only(workdir, tiny_qwen, math_fixture, dry_run,
                                                                  snakemake):
    from rlpipe.config import apply_overrides, load_yaml, math_pipeline, parse_config, resolve_variant

    overlay = load_yaml(workdir / "config/math.yaml")
    cfg = parse_config(apply_overrides(load_yaml(workdir / "config/config.yaml"), overlay))
    track = math_pipeline(cfg).train
    assert (track.n_grpo_steps, track.learning_rate, track.rollout_batch_size, track.group_size) == (200, 1e-5, 256, 8)
    assert (track.gradient_accumulation_steps, track.loss_type, track.sampling_max_tokens) == (
        128, "reinforce_with_baseline", 1024)
    _math_standin(workdir, tiny_qwen, math_fixture, sampling_max_tokens=24)  # the stand-in's context is 512
    out = snakemake(workdir, "-n", "--configfile", "config/math.yaml", "config/standin.yaml").stdout
    rules = dry_run.rules(out)
    assert {"evaluate_model", "train_variant", "report_track"} <= rules, rules
    # a local HF model and dataset: no data generation, tokenizer or pretraining; no keyword track
    assert not rules & {"build_math_data", "train_tokenizer", "pretrain_base", "bench_weight_sync",
                        "aggregate_metrics"}, rules
    trains = [j for j in dry_run.jobs(out) if j["rule"] == "train_variant"]
    assert trains and all(j["wildcards"]["tdir"] == "math/" for j in trains), trains  # the math track's runs only
    # what the run on the stand-in (slow, below) reads back from run_info: an HF policy recomputes its
    # old log-probs (auto), with gradient checkpointing and no reference model (kl_monitor off, kl_coef 0)
    from rlpipe.trainer.run import resolve_recompute

    standin = parse_config(apply_overrides(apply_overrides(load_yaml(workdir / "config/config.yaml"), overlay),
                                           load_yaml(workdir / "config/standin.yaml")))
    run = resolve_recompute(resolve_variant(math_pipeline(standin), "onpolicy"), str(tiny_qwen))
    assert run.recompute_old_log_probs is True and run.gradient_checkpointing
    assert not run.kl_monitor and run.kl_coef == 0


def test_math_config_names_a_missing_model_directory(workdir, snakemake):
    proc = snakemake(workdir, "-n", "--configfile", "config/math.yaml", check=False)
    assert proc.returncode != 0
    assert "math.base_model_dir: models/Qwen2.5-Math-1.5B is not a local HuggingFace model directory" in (
        proc.stdout + proc.stderr)


@pytest.mark.slow
@pytest.mark.workflow
def test_math_config_runs_the_math_track_on_the_standin(workdir, tiny_qwen, math_fixture, snakemake):
    """`snakemake --configfile config/math.yaml` (+ paths to the stand-ins, seed 001's batch shrunk to
    fit a CPU test): base eval, two GRPO steps on the HF policy, final eval, report.

    Slow by nature (a whole workflow run of HF-policy jobs, minutes on 2 cores), so not in the default
    suite, whose checks cover each part: the DAG and the resolved run settings of this config
    (test_math_config_validates_and_expands_to_the_math_track_only), an HF policy's GRPO run
    (tests/test_hf_policy.py), the evaluation of an HF directory (tests/test_evaluate.py), the MATH
    report (tests/test_math_report.py) and the MATH track through the workflow (the smoke run)."""
    _math_standin(workdir, tiny_qwen, math_fixture, n_grpo_steps=2, rollout_batch_size=8, group_size=4,
                  train_batch_size=8, gradient_accumulation_steps=2, sampling_max_tokens=24, val_every=1,
                  val_size=6, checkpoint_every=1, log_rollouts_every=1, threads=1)
    snakemake(workdir, "--cores", "2", "--configfile", "config/math.yaml", "config/standin.yaml")
    r = workdir / "results" / "math"
    numbers = json.loads((r / "report" / contract.MATH_REPORT_FILES["math_json"]).read_text())
    assert numbers["base"]["n"] == 6 and sum(numbers["base"]["categories"].values()) == 6
    info = json.loads((r / "runs" / "onpolicy" / contract.RUN_INFO_FILE).read_text())
    assert info["finished"] and info["config"]["recompute_old_log_probs"] is True  # auto: an HF policy
    assert info["config"]["gradient_checkpointing"] and not info["config"]["kl_monitor"]
    import pandas as pd

    m = pd.read_parquet(r / "runs" / "onpolicy" / contract.METRICS_FILE)
    assert list(m["step"]) == [0, 1, 2] and m["reward/val_answer_mean"].notna().all()
    assert m["kl/ref_k3"].isna().all()  # no reference model: kl_monitor false, kl_coef 0
    assert (r / "eval" / "onpolicy" / contract.EVAL_FILES["summary"]).is_file()


def test_families_expand_family_variant_seed_and_rerun_exactly_a_changed_replicate(workdir, dry_run, snakemake):
    """Every family x variant x seed is one train_family_run job, except replicates whose settings
    another family's replicate already has (trained once, read by both); each family one report."""
    out = snakemake(workdir, "-n", "--cores", "2", "--configfile", "config/config.yaml", "config/study.yaml").stdout
    jobs = dry_run.jobs(out)
    runs = {(j["wildcards"]["family"], j["wildcards"]["fvariant"], j["wildcards"]["fseed"])
            for j in jobs if j["rule"] == "train_family_run"}
    from rlpipe.config import (
        active_families,
        family_base_track,
        family_pipeline,
        family_seeds,
        load_config,
        parse_config,
        resolve_variant,
        to_dict,
    )
    cfg = load_config(workdir / "config/config.yaml")
    study = yaml.safe_load((workdir / "config/config.yaml").read_text())
    for f, entry in yaml.safe_load((workdir / "config/study.yaml").read_text())["families"].items():
        study["families"][f].update(entry)  # the overlay sets replicates only
    seeds = {f: family_seeds(parse_config(study), f) for f in cfg.families}
    assert all(len(seeds[f]) >= 3 for f in cfg.families)  # study.yaml: every family at least 3 seeds

    def key(track, train, seed, threads):
        return track, json.dumps(dict(to_dict(train), seed=seed), sort_keys=True), threads

    # the variants table's runs are seed train.seed (0) of any identical replicate that runs alone
    timed, shared = cfg.workflow.threads_per_variant, cfg.workflow.family_threads
    seen = {key("keyword", t, 0, timed) for v in cfg.variants for t in [resolve_variant(cfg, v)]}
    expected = set()
    for f in cfg.families:
        fp = family_pipeline(cfg, f)
        threads = timed if cfg.families[f].track == "systems" else shared
        for v in fp.variants:
            for s in seeds[f]:
                k = key(family_base_track(cfg.families[f]), resolve_variant(fp, v), s, threads)
                if k not in seen:
                    seen.add(k)
                    expected.add((f, v, str(s)))
    assert runs == expected
    # the systems family's seed 0 is the variants table's run; the others train, timed
    assert {(v, s) for f, v, s in runs if f == "systems"} == {(v, str(s)) for v in cfg.variants
                                                              for s in seeds["systems"][1:]}
    threads = {(j["wildcards"]["family"] == "systems", j["threads"]) for j in jobs if j["rule"] == "train_family_run"}
    assert threads == {(True, cfg.workflow.threads_per_variant), (False, cfg.workflow.family_threads)}
    # the math families' shared reference trains once, under lr_sweep
    assert ("lr_sweep", "lr1e-4", "0") in runs and ("std_norm", "std", "0") not in runs
    assert ("length_norm", "masked_mean", "0") not in runs and ("kl_drift", "kl0", "0") not in runs
    assert {j["wildcards"]["family"] for j in jobs if j["rule"] == "report_family"} == set(cfg.families)
    assert active_families(cfg) == list(cfg.families)  # the default run includes every family
    default = dry_run.jobs(snakemake(workdir, "-n", "--configfile", "config/config.yaml").stdout)
    assert {j["wildcards"]["fseed"] for j in default if j["rule"] == "train_family_run"} == {"0"}
    assert sum(j["rule"] == "report_family" for j in default) == len(cfg.families)


def test_a_replicate_identical_to_a_table_run_but_not_timed_trains_its_own(workdir, dry_run, snakemake):
    """A keyword family listed before `systems`, whose variant equals the table's onpolicy, runs on
    family_threads: it trains its own run, and the systems family still reads results/runs/onpolicy."""
    path = workdir / "config" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["families"] = {"kw_first": {"track": "keyword", "variants": {"onpolicy": {"mode": "colocated_sync"}}},
                       **cfg["families"]}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = snakemake(workdir, "-n", "-p", "--cores", "2").stdout
    runs = {(j["wildcards"]["family"], j["wildcards"]["fvariant"], j["threads"])
            for j in dry_run.jobs(out) if j["rule"] == "train_family_run"}
    assert ("kw_first", "onpolicy", 1) in runs and not any(f == "systems" for f, _, _ in runs)
    report = next(line for line in out.splitlines() if "family-report" in line and "--family systems" in line)
    assert "results/runs/onpolicy " in report


def test_operational_settings_rerun_nothing_and_a_moved_project_neither(workdir, tmp_path, make_runs, dry_run,
                                                                        snakemake):
    """After a run, raising the timeouts, thread counts and logging intervals (rlpipe.config.identity's
    operational keys) plans no job; an identity key reruns the run; the project copied elsewhere
    (its .snakemake metadata and file times with it) plans nothing either."""
    fake_upstream(workdir, ("onpolicy", "k2", "disagg"), make_runs)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rlpipe").write_text(FAKE_RLPIPE.format(python=sys.executable))
    (bin_dir / "rlpipe").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "calls.log"),
           "FAKE_RUNS": str(make_runs(tmp_path / "template", ("k2",)))}
    target, smoke = "results/runs/k2/metrics.parquet", ("--configfile", "config/smoke.yaml")
    snakemake(workdir, target, "--cores", "1", "--forcerun", target, *smoke, env=env)  # records its params
    (workdir / "config/ops.yaml").write_text(yaml.safe_dump({
        "train": {"ray_timeout_s": 7200.0, "threads": 2, "checkpoint_every": 1, "log_rollouts_every": 1,
                  "weight_sync": {"timeout_s": 900.0}},
        "logging": {"flush_every_s": 60.0}, "pretrain": {"threads": 1}, "ray": {"include_dashboard": True},
        "workflow": {"threads_per_variant": 1, "family_threads": 2}}))
    (workdir / "config/lr.yaml").write_text(yaml.safe_dump({"train": {"learning_rate": 1e-3}}))

    def planned(root: Path, *overlays: str) -> list:
        out = snakemake(root, target, "-n", "--cores", "1", *smoke, *overlays, env=env).stdout
        return dry_run.jobs(out)

    assert planned(workdir) == []
    assert planned(workdir, "config/ops.yaml") == []
    assert [j["rule"] for j in planned(workdir, "config/lr.yaml")] == ["train_variant"]
    moved = tmp_path / "moved" / "project"
    shutil.copytree(workdir, moved, symlinks=True)
    assert planned(moved) == []
