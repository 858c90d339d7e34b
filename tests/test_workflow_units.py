"""rlpipe.workflow, the logic of the Snakemake workflow, without Snakemake: import-following for a
report's code inputs, params, the config checks, resolved config files, the path scheme, each run's
settings and owners, the per-job functions and the targets. (The workflow itself: the dry-run tests.)"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake.exceptions import WorkflowError

from rlpipe.cli import COMMANDS
from rlpipe.config import (
    CORPUS_FILE,
    KEYWORD_TRACK,
    MATH_TRACK,
    family_pipeline,
    family_seeds,
    load_yaml,
    parse_config,
    workflow_tracks,
)
from rlpipe.contract import FAMILY_REPORT_DIR, RUN_FILES
from rlpipe.workflow import code_inputs, gpus, loading, params, targets
from rlpipe.workflow.jobs import Jobs
from rlpipe.workflow.layout import Layout, trains_tokenizer, user_timed, uses_dataset
from rlpipe.workflow.resolved import ResolvedConfigs
from rlpipe.workflow.runs import TRACK_RUN, Runs
from rlpipe.workflow.track_checks import check_track_paths, needs_task_checks

ROOT = Path(__file__).resolve().parents[1]


def wc(**kw) -> SimpleNamespace:
    """Snakemake's wildcards, as the functions read them (attributes)."""
    return SimpleNamespace(**kw)


def dag(**kw) -> SimpleNamespace:
    """Snakemake's workflow.dag_settings: nothing forced unless given."""
    return SimpleNamespace(**{"forceall": False, "forcerun": set(), "forcetargets": False, "targets": set(), **kw})


@pytest.fixture(scope="module")
def default_cfg():
    return loading.load_checked(load_yaml(ROOT / "config" / "config.yaml"))


def plan(cfg, results="results", forced=None):
    tracks = workflow_tracks(cfg)
    layout, runs = Layout(results, tracks), Runs(cfg, tracks)
    jobs = Jobs(layout, runs, run_tests=True, dag_settings=lambda: forced or dag(),
                code_inputs=lambda *c: [f"code:{x}" for x in c], track_configs={n: f"{n}.yaml" for n in tracks},
                family_configs={f: f"{f}.yaml" for f in runs.families})
    return layout, runs, jobs


# --------------------------------------------------------------------------- code inputs
def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_code_inputs_follow_imports_within_the_entry_package(tmp_path):
    pkg = tmp_path / "rlpipe"
    write(pkg / "__init__.py")
    write(pkg / "config.py", "import json\n")
    write(pkg / "rep" / "__init__.py")
    write(pkg / "rep" / "entry.py",
          "import json\nfrom rlpipe.rep import helper\nfrom . import sub\nimport rlpipe.config\n")
    write(pkg / "rep" / "helper.py", "QUESTIONS = 'questions.yaml'\nOTHER = 'absent.yaml'\n")
    write(pkg / "rep" / "sub.py", "from .deep import x\n")
    write(pkg / "rep" / "deep.py", "x = 1\n")
    write(pkg / "rep" / "unused.py", "")
    write(pkg / "rep" / "questions.yaml", "a: 1\n")
    got = code_inputs.code_inputs({"rep": ("rlpipe.rep.entry", "main")}, "rep", root=tmp_path)
    want = [pkg / "rep" / f for f in ("deep.py", "entry.py", "helper.py", "questions.yaml", "sub.py")]
    # not config.py (another package), unused.py, absent.yaml, nor the package's own __init__.py
    # (as today's import-following does: the entry's modules, named rlpipe.rep.*)
    assert got == sorted(str(p) for p in want)


def test_code_inputs_name_an_unknown_command():
    with pytest.raises(WorkflowError, match="code_inputs: no rlpipe command 'nope'"):
        code_inputs.code_inputs(COMMANDS, "nope")


def test_code_inputs_of_the_real_plot_command():
    files = code_inputs.code_inputs(COMMANDS, "plot")
    assert str(ROOT / "src" / "rlpipe" / "analysis" / "plots.py") in files
    assert all("/rlpipe/analysis/" in f for f in files), files  # config and io reach a report through params


# --------------------------------------------------------------------------- params
def test_canonical_ignores_key_order():
    assert params.canonical({"b": 1, "a": {"d": 2, "c": Path("x")}}) == '{"a": {"c": "x", "d": 2}, "b": 1}'


def test_names_constraint_matches_exactly_the_names():
    rx = params.names_constraint(["k2", "a.b", "k2"])
    assert rx == r"a\.b|k2"
    assert re.fullmatch(rx, "a.b") and not re.fullmatch(rx, "axb") and not re.fullmatch(rx, "k")
    assert params.names_constraint([]) == "(?!)" and not re.fullmatch("(?!)", "")


@pytest.mark.parametrize("settings, expected", [
    (dag(), False),
    (dag(forceall=True), True),
    (dag(forcerun={"train_variant"}), True),
    (dag(forcerun={"other_rule"}), False),
    (dag(forcerun={"r/k2/m.parquet"}), True),
    (dag(forcetargets=True, targets={"r/k2/m.parquet"}), True),
    (dag(forcetargets=True, targets={"r/k4/m.parquet"}), False),
    (dag(forcetargets=False, targets={"r/k2/m.parquet"}), False),
])
def test_forced(settings, expected):
    assert params.forced(settings, "train_variant", ["r/k2/m.parquet", "r/k2/info.json"]) is expected


def test_optional_file_and_bench_device(default_cfg):
    assert params.optional_file(None) == [] and params.optional_file("a") == ["a"]
    assert gpus.bench_device(default_cfg) == "cpu"
    assert gpus.bench_device(parse_config({"train": {"device": "auto"}})) == "cpu"  # 'auto' on a CPU config
    gpu = parse_config({"train": {"device": "auto"}, "workflow": {"gpus_per_colocated": 1}})
    assert gpus.bench_device(gpu) == "cuda"


@pytest.mark.parametrize("declared,placements", [(0, "cpu"), (1, "cpu,gpu-shared"), (2, "cpu,gpu-shared,gpu")])
def test_weight_sync_placements_fit_the_gpus_declared(declared, placements):
    assert gpus.weight_sync_placements(declared) == placements


def test_scaling_bench_declares_what_its_points_train_on():
    assert gpus.scaling_gpus(parse_config({})) == 0
    one = parse_config({"workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 1}})
    two = parse_config({"workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 2}})
    assert (gpus.scaling_gpus(one), gpus.scaling_gpus(two)) == (1, 2)
    assert (gpus.env_prefix(0), gpus.env_prefix(1)) == ("env CUDA_VISIBLE_DEVICES=", "env")


# --------------------------------------------------------------------------- loading
def test_drop_null_entries():
    config = {"variants": {"a": {}, "b": None}, "families": None}
    loading.drop_null_entries(config)
    assert config == {"variants": {"a": {}}, "families": {}, "tracks": {}}


def test_a_target_after_configfile_is_named():
    loading.check_config_files(["config/smoke.yaml", "x.YML"])
    with pytest.raises(WorkflowError, match=r"^results/runs/k2/metrics.json: looks like a target; put targets "
                                            r"before --configfile \(or use `rlpipe run`\)$"):
        loading.check_config_files(["config/smoke.yaml", "results/runs/k2/metrics.json"])


def test_load_checked_names_the_key(tmp_path):
    with pytest.raises(WorkflowError, match="^invalid rlpipe config: .*train.learning_rat"):
        loading.load_checked({"train": {"learning_rat": 1.0}})
    with pytest.raises(WorkflowError, match="^invalid rlpipe config: data.keywords_path: /nonexistent does not exist$"):
        loading.load_checked({"data": {"keywords_path": "/nonexistent"}, "workflow": {"results_dir": str(tmp_path)}})


def test_overlay_warnings_name_a_replaced_list(tmp_path):
    a = write(tmp_path / "a.yaml", yaml.safe_dump({"workflow": {"toy_sort_seeds": [1, 2]}}))
    b = write(tmp_path / "b.yaml", yaml.safe_dump({"workflow": {"toy_sort_seeds": [3]}}))
    warnings = loading.overlay_warnings([a, b])
    assert len(warnings) == 1 and warnings[0].startswith("rlpipe config: warning: ")
    assert "workflow.toy_sort_seeds" in warnings[0]
    assert loading.overlay_warnings([a]) == [] and loading.overlay_warnings(None) == []


# --------------------------------------------------------------------------- resolved configs
def test_resolved_configs_are_content_addressed_and_written_once(tmp_path, default_cfg):
    rc = ResolvedConfigs(str(tmp_path))
    p1 = rc.path("pipeline", default_cfg)
    assert re.fullmatch(rf"{tmp_path}/config/pipeline-[0-9a-f]{{16}}\.yaml", p1)
    assert rc.path("pipeline", default_cfg) == p1
    other = parse_config({"train": {"learning_rate": 3e-4}})
    assert rc.path("pipeline", other) != p1
    assert not Path(p1).exists()  # named at parse time, written when jobs run
    lazy = rc.lazy(["x", "y"], lambda k: f"fam-{k}", lambda k: default_cfg if k == "x" else other)
    assert list(lazy) == ["x", "y"] and len(lazy) == 2
    with pytest.raises(KeyError):
        lazy["z"]
    rc.write_all(lazy)
    written = sorted(p.name for p in (tmp_path / "config").iterdir())
    assert len(written) == 4 and sum(n.startswith("fam-") for n in written) == 2
    assert yaml.safe_load(Path(p1).read_text())["train"]["learning_rate"] == default_cfg.train.learning_rate
    Path(p1).write_text("kept")  # present: never rewritten
    rc.write_all(lazy)
    assert Path(p1).read_text() == "kept"


# --------------------------------------------------------------------------- layout
def test_one_path_scheme_for_every_track(default_cfg):
    lay, _, _ = plan(default_cfg, "out/")
    assert lay.res("a", "b") == "out/a/b"
    assert lay.track_res(KEYWORD_TRACK, "runs", "k2") == "out/runs/k2"
    assert lay.track_res(MATH_TRACK, "runs", "onpolicy") == "out/math/runs/onpolicy"
    assert lay.tdir_res("base", "model.pt") == "out/{tdir}base/model.pt"
    assert lay.track_of(wc(tdir="math/")).name == MATH_TRACK
    assert lay.tdirs(lambda t: True) == "(?:|math/)" and lay.tdirs(lambda t: False) == "(?!)"
    assert lay.track_corpus(lay.tracks[KEYWORD_TRACK]) == f"out/data/{CORPUS_FILE}"
    assert lay.track_corpus(lay.tracks[MATH_TRACK]) == f"out/math/data/{CORPUS_FILE}"
    assert lay.track_dataset_inputs(lay.tracks[MATH_TRACK]) == ["out/math/data/train.jsonl", "out/math/data/val.jsonl"]
    assert lay.track_base_inputs(lay.tracks[KEYWORD_TRACK]) == ["out/base/model.pt"]
    assert lay.run_outputs("k2") == {k: f"out/runs/k2/{f}" for k, f in RUN_FILES.items()}
    assert lay.family_run_outputs("lr_sweep", "lr1e-4", 3)["metrics"].startswith("out/families/lr_sweep/runs/lr1e-4/")
    assert trains_tokenizer(lay.tracks[KEYWORD_TRACK]) and not user_timed(lay.tracks[MATH_TRACK])


def test_a_given_dataset_and_tokenizer_are_inputs_as_they_are(tmp_path):
    data = tmp_path / "data"
    for name in ("train.jsonl", "validation.jsonl"):
        write(data / name, "{}\n")
    (data / "sub").mkdir()
    cfg = parse_config({"math": {"dataset_dir": str(data)}, "tokenizer": {"path": "tiktoken:gpt2"}})
    lay = Layout("r", workflow_tracks(cfg))
    given = [str(data / "train.jsonl"), str(data / "validation.jsonl")]  # not the subdirectory
    assert lay.track_dataset_inputs(lay.tracks[MATH_TRACK]) == given
    assert lay.track_dataset_dir(lay.tracks[MATH_TRACK]) == str(data)
    assert lay.tokenizer_inputs() == []  # a spec, not a file
    assert not trains_tokenizer(lay.tracks[KEYWORD_TRACK])


# --------------------------------------------------------------------------- runs
def test_family_variants_and_seeds_agree_with_the_family_pipelines(default_cfg):
    _, runs, _ = plan(default_cfg)
    assert runs.families
    for f in runs.families:
        assert runs.family_variants(f) == list(family_pipeline(default_cfg, f).variants)
        assert runs.family_seeds(f) == family_seeds(default_cfg, f)


def test_identical_runs_train_once(default_cfg):
    _, runs, _ = plan(default_cfg)
    owners = runs.owners
    # the systems family's first seed is the variants table's own run
    assert owners[("systems", "k2", default_cfg.train.seed)] == (TRACK_RUN, KEYWORD_TRACK, "k2")
    # lr_sweep's lr1e-4 is length_norm's masked_mean: it trains once, under lr_sweep (first in config order)
    assert owners[("length_norm", "masked_mean", runs.family_seeds("length_norm")[0])][0] == "lr_sweep"
    assert runs.trains_itself("lr_sweep", "lr1e-2", runs.family_seeds("lr_sweep")[0])


def test_a_family_is_derived_only_when_asked_for(default_cfg, monkeypatch):
    from rlpipe.workflow import runs as runs_module

    calls = []
    real = runs_module.family_pipeline
    monkeypatch.setattr(runs_module, "family_pipeline", lambda cfg, f, **kw: calls.append(f) or real(cfg, f, **kw))
    _, runs, jobs = plan(default_cfg)
    assert calls == [] and len(runs.family_cfgs) == len(runs.families)
    w = wc(family="lr_sweep", fvariant="lr1e-3", fseed="7")
    jobs.family_variant_train(w), jobs.family_runtime(w), jobs.family_train_inputs(w), jobs.family_dataset_arg(w)
    assert calls == ["lr_sweep"]  # once, and no other family


def test_an_unknown_variant_is_named(default_cfg):
    _, runs, _ = plan(default_cfg)
    with pytest.raises(WorkflowError, match=r"^track keyword has no variant 'k3' \(onpolicy, k2, "):
        runs.track_variant("", "k3")


# --------------------------------------------------------------------------- jobs
def test_train_job_functions(default_cfg):
    lay, runs, jobs = plan(default_cfg)
    w = wc(tdir="", variant="k4")
    inputs = jobs.train_inputs(w)
    assert inputs["base"] == ["results/base/model.pt"]
    assert inputs["dataset"] == lay.track_dataset_inputs(lay.tracks["keyword"])
    assert [str(t) for t in inputs["tests"]] == ["results/tests/junit.xml"]
    p = jobs.train_params(w)
    assert '"k": 4' in p["train"] and p["dataset"] == "--dataset results/data/keywords"
    assert jobs.train_threads(w) == default_cfg.workflow.threads_per_variant
    assert jobs.train_mem_mb(w) > 0 and jobs.train_runtime(w) > 0
    assert jobs.track_config(w) == "keyword.yaml"
    assert jobs.resume_mode(w) == "auto"
    _, _, forced_jobs = plan(default_cfg, forced=dag(forcerun={"train_variant"}))
    assert forced_jobs.resume_mode(w) == "never"


def test_eval_and_report_job_functions(default_cfg):
    _, _, jobs = plan(default_cfg)
    base = jobs.eval_params(wc(tdir="math/", model="base"))
    assert base["checkpoint"] == "results/math/base/model.pt" and base["dataset"] == "results/math/data"
    run = jobs.eval_params(wc(tdir="math/", model="onpolicy"))
    assert run["checkpoint"].startswith("results/math/runs/onpolicy/") and run["cfg"] == base["cfg"]
    assert jobs.eval_inputs(wc(tdir="math/", model="onpolicy"))["model"] == "results/math/runs/onpolicy/run_info.json"
    assert jobs.eval_gpus(wc(tdir="math/")) == 0
    assert jobs.track_report_inputs(wc(tdir="math/"))["code"] == ["code:math-report"]


def test_a_shared_replicate_is_read_from_its_owner(default_cfg):
    _, runs, jobs = plan(default_cfg)
    seed = runs.family_seeds("length_norm")[0]
    report = jobs.family_report_inputs(wc(family="length_norm"))
    owner = jobs.family_trained_outputs("length_norm", "masked_mean", seed)["metrics"]
    assert owner.startswith("results/families/lr_sweep/runs/lr1e-4/") and owner in report["metrics"]
    assert jobs.family_resume_mode(wc(family="lr_sweep", fvariant="lr1e-4", fseed=str(seed))) == "auto"
    assert jobs.family_config(wc(family="lr_sweep")) == "lr_sweep.yaml"
    assert jobs.family_threads(wc(family="systems")) == default_cfg.workflow.threads_per_variant


def test_pretrain_gpus(default_cfg):
    t = workflow_tracks(default_cfg)[KEYWORD_TRACK]
    assert gpus.pretrain_gpus(t) == (1 if t.pipeline.pretrain.device.startswith("cuda") else 0)
    assert uses_dataset(t, default_cfg.train) == (default_cfg.train.task == "keyword_inclusion")


# --------------------------------------------------------------------------- targets
def test_targets_hold_each_run_once(default_cfg):
    lay, runs, _ = plan(default_cfg)
    all_ = targets.all_targets(lay, runs, toy_sort=True, bench_names=["sampler"], scaling=False)
    assert all_[0] == "results/RESULTS.md" and len(all_) == len(set(all_))
    assert "results/runs/k2/metrics.parquet" in all_ and "results/bench/sampler.json" in all_
    shared = f"results/families/length_norm/runs/masked_mean/seed{runs.family_seeds('length_norm')[0]}"
    assert not any(p.startswith(shared) for p in all_)  # lr_sweep trains it
    page = targets.results_page_inputs(lay, runs.families, toy_sort=False)
    assert lay.family_res("lr_sweep", FAMILY_REPORT_DIR, "table.csv") in page or any("lr_sweep" in p for p in page)
    assert not any("toy_sort" in p for p in page)


# --------------------------------------------------------------------------- track checks
def test_a_track_s_given_directories_are_checked(tmp_path):
    data = tmp_path / "math"
    data.mkdir()
    cfg = parse_config({"math": {"dataset_dir": str(data)}})
    t = workflow_tracks(cfg)[MATH_TRACK]
    with pytest.raises(WorkflowError, match=r"^invalid rlpipe config: math.dataset_dir: .* holds no train.jsonl"):
        check_track_paths(t)
    write(data / "train.jsonl", "{}\n")
    check_track_paths(t)
    assert needs_task_checks(cfg, workflow_tracks(cfg))
    model = write(tmp_path / "model" / "weights.bin", "")
    cfg = parse_config({"math": {"base_model_dir": str(model.parent)}})
    with pytest.raises(WorkflowError, match="math.base_model_dir: .* is not a local HuggingFace model directory"):
        check_track_paths(workflow_tracks(cfg)[MATH_TRACK])


def test_plain_copy_is_the_yaml_round_trip_it_replaces(default_cfg):
    """rlpipe.config.apply_overrides copies without YAML (the workflow copies every run's settings at
    each parse): the same data, the same key order (sorted where keys compare), no shared objects."""
    from rlpipe.config import to_dict
    from rlpipe.config.pipeline import plain_copy

    for data in (load_yaml(ROOT / "config" / "config.yaml"), to_dict(default_cfg),
                 {"b": [1, {"z": None, "a": 1.5e-4}], "a": "1.0", 3: True}, {1: 2, "a": 3}):
        want, got = yaml.safe_load(yaml.safe_dump(data)), plain_copy(data)
        assert repr(got) == repr(want)
    data = {"a": {"b": [1]}}
    got = plain_copy(data)
    got["a"]["b"].append(2)
    assert data == {"a": {"b": [1]}}


# --------------------------------------------------------------------------- a cluster job's parse
def test_a_job_s_parse_gives_the_main_parse_s_params_and_resources(default_cfg):
    """A cluster job parses with check_runs=False (nothing that grows with the runs is resolved up
    front): the config, tracks, resolved config files and every job's params and resources it computes
    are the main parse's."""
    data = load_yaml(ROOT / "config" / "config.yaml")
    cfg = parse_config(data, check_runs=False)
    assert cfg == default_cfg
    assert workflow_tracks(cfg, check_runs=False) == workflow_tracks(default_cfg)
    main, job = [plan_of(c, check_runs=check) for c, check in ((default_cfg, True), (cfg, False))]
    rc_main, rc_job = ResolvedConfigs("r"), ResolvedConfigs("r")
    for f in main[1].families:
        assert rc_job.path(f, job[1].family_cfg(f)) == rc_main.path(f, main[1].family_cfg(f))
        for v, s in main[1].family_runs(f):
            w = wc(family=f, fvariant=v, fseed=str(s))
            for fn in ("family_variant_train", "family_runtime", "family_mem_mb", "family_train_inputs",
                       "family_base", "family_dataset_arg", "family_threads"):
                assert getattr(job[2], fn)(w) == getattr(main[2], fn)(w), (fn, f, v)
    for t in main[0].tracks.values():
        for v in t.pipeline.variants:
            w = wc(tdir=t.subdir, variant=v)
            for fn in ("train_params", "train_inputs", "train_runtime", "train_mem_mb", "train_threads"):
                assert getattr(job[2], fn)(w) == getattr(main[2], fn)(w), (fn, t.name, v)


def plan_of(cfg, check_runs):
    tracks = workflow_tracks(cfg, check_runs=check_runs)
    layout, runs = Layout("results", tracks), Runs(cfg, tracks, check_runs=check_runs)
    return layout, runs, Jobs(layout, runs, run_tests=True, dag_settings=dag, code_inputs=lambda *c: [],
                              track_configs={}, family_configs={})


def test_a_job_s_parse_still_refuses_a_bad_key():
    with pytest.raises(WorkflowError, match="^invalid rlpipe config: .*learning_rat"):
        loading.load_checked({"train": {"learning_rat": 1.0}}, main=False)
