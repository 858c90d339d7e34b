# Declarations shared by all rule files. The parsed config, the tracks, families and runs, and the
# names the rules call. The logic lives in rlpipe.workflow (tested without Snakemake); this file
# builds its objects once per parse and names their functions. The config is parsed ONCE by
# rlpipe.config (the single source of truth for defaults, validation, variant resolution and GPU
# counts); rules only read `CFG`.
#
# `snakemake --lint` asks for a conda environment or container per job. rlpipe has none on purpose:
# every rule runs the `rlpipe` command of the package installed in the project's virtual environment
# (README set-up), so pyproject.toml pins the software of all rules at once. Each rule carries a
# `# lint: conda` comment pointing here. Rules that read the config file carry a second comment,
# `# lint: CONFIG_FILE`: their shell uses that global instead of a param, because the path changes with
# any config edit and a param would rerun every stage (see the rerun policy below).
#
# Rerun policy (rlpipe.workflow.resolved says why params and the config file look the way they do):
# - Every command reads the resolved config from a content-addressed file,
#   results/config/pipeline-<hash>.yaml, named here when the workflow is parsed, written (atomically,
#   only if absent) when it starts running jobs (onstart: a dry run writes none), and passed as a
#   param, never as an input.
# - Every stage declares the config sections it depends on as `params`, in canonical JSON, and
#   Snakemake's params trigger reruns exactly the stages whose settings changed, in the same
#   invocation: editing `train.*` or one variant reruns the affected variants, not pretraining. (An
#   upstream job that only writes a shared config file would mask this: Snakemake does not check the
#   params of jobs downstream of a job that must rerun when they reach it only through ancient()
#   inputs, so the edit took two invocations to apply.)
# - The unit-test gate is still an ancient() input of training: rerunning the tests (their params or
#   junit.xml changed) does not retrain. The masking above applies to that one case only.

import functools
import importlib.util  # bench.smk: whether TRL is installed
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from rlpipe import io, slurm
from rlpipe.cli import COMMANDS
from rlpipe.config import (
    CORPUS_FILE,
    KEYWORD_TRACK,
    MATH_TRACK,
    eval_base_settings,
    table_reference,
    to_dict,
    variant_gpus,
    workflow_tracks,
)
from rlpipe.workflow import code_inputs as _code, gpus as _gpus, jobs as _jobs, loading, params as _params
from rlpipe.workflow import targets as _targets
from rlpipe.workflow.layout import Layout, trains_tokenizer, user_timed, uses_dataset
from rlpipe.workflow.params import canonical, forced, ident, names_constraint, optional_file
from rlpipe.workflow.resolved import ResolvedConfigs
from rlpipe.workflow.runs import Runs
from rlpipe.workflow.targets import TRACK_FIGURES
from rlpipe.workflow.track_checks import check_paths_of, needs_task_checks

# Overlays switch a table entry off with `name: null`; a target after --configfile is named in one line.
loading.drop_null_entries(config)
loading.check_config_files(workflow.overwrite_configfiles)
# A cluster job parses the workflow again for its one job: the main process has checked every run,
# path, task and prompt before submitting it, so a job's parse repeats none of the work that grows with
# the runs (rlpipe.workflow.loading), and resolves only its own run (rlpipe.workflow.runs).
MAIN = workflow.is_main_process
CFG = loading.load_checked(config, main=MAIN)  # every key, run and path, before any job
RESULTS = CFG.workflow.results_dir.rstrip("/")
for _msg in loading.overlay_warnings(workflow.overwrite_configfiles):
    print(_msg, file=sys.stderr)
REPO = Path(workflow.basedir)

# path -> text of every resolved config this invocation's jobs may read; written by `onstart` below,
# i.e. only when jobs are about to run: a dry run (-n), --report, --lint or an invocation that fails
# before its first job leaves nothing in results/config/.
RESOLVED = ResolvedConfigs(RESULTS)
write_resolved = RESOLVED.path
CONFIG_FILE = write_resolved("pipeline", CFG)

# Tracks (rlpipe.config.workflow_tracks): every track in workflow.tracks, built in (keyword, math) or a
# user's (the `tracks` table), as one Track record; every path and input of a track derives from it
# (rlpipe.workflow.layout). Runs: each run's settings and each family's pipeline, resolved once and
# only when asked for (rlpipe.workflow.runs).
TRACKS = workflow_tracks(CFG, check_runs=MAIN)
LAYOUT = Layout(RESULTS, TRACKS)
RUNS = Runs(CFG, TRACKS, check_runs=MAIN)
TRACK_BY_DIR = LAYOUT.by_dir
TRACK_CONFIG_FILES = {n: CONFIG_FILE if n == KEYWORD_TRACK else write_resolved(n if n == MATH_TRACK else f"track-{n}",
                                                                               t.pipeline)
                      for n, t in TRACKS.items()}
KEYWORD_ON = KEYWORD_TRACK in TRACKS
# The course's unit-test gate and seed 003's toy grid belong to the built-in tracks: a run of a user's
# tracks only (workflow.tracks names neither keyword nor math) skips them, so its overlay needs no key
# that switches them off.
BUILTIN_ON = KEYWORD_ON or MATH_TRACK in TRACKS
RUN_TESTS = CFG.workflow.run_tests and BUILTIN_ON
TOY_SORT_SEEDS = CFG.workflow.toy_sort_seeds if BUILTIN_ON else []
VARIANTS = list(CFG.variants) if KEYWORD_ON else []
# Experiment families whose track is on; each runs on a pipeline config of its own
# (rlpipe.config.family_pipeline), derived and written like the others when first needed.
FAMILIES = RUNS.families
FAMILY_CFG = RUNS.family_cfgs
FAMILY_CONFIG_FILES = RESOLVED.lazy(FAMILIES, lambda f: f"family-{f}", RUNS.family_cfg)


onstart:
    RESOLVED.write_all(FAMILY_CONFIG_FILES)


# A track's given model, dataset, task and prompts, before any job (the task check imports torch:
# only when a track has something to check).
if MAIN and needs_task_checks(CFG, TRACKS):
    from rlpipe.workflow import task_checks

    task_checks.check_inputs(RUNS, RESULTS)
elif MAIN:
    check_paths_of(TRACKS)

# File names of a run directory (RUN_FILES: train_variant's declared outputs), of results/summary
# (SUMMARY_FILES, SUMMARY_REPORT_FILES) and the figures (FIGURES: kind -> Figure(category, title,
# ext)) come from the run-output contract, which the trainer's writer, aggregation, the plots and
# the tests share.
from rlpipe.contract import (
    CHECKPOINT_FILE,
    EVAL_FILES,
    FAMILY_REPORT_DIR,
    FAMILY_REPORT_FILES,
    FIGURES,
    MATH_REPORT_FILES,
    TOY_SORT_DATA,
    TOY_SORT_FILES,
    RUN_FILES,
    SCALING_FILE,
    SCALING_REPORT_DIR,
    SCALING_REPORT_FILES,
    SUMMARY_FILES,
    SUMMARY_REPORT_FILES,
    Figure,
    figure_file,
)

# The names the rule files call, from rlpipe.workflow (`layout` paths, `jobs` per-job functions).


report_code = functools.partial(_code.code_inputs, COMMANDS)  # command names -> the files (a list)


def code_inputs(*commands: str):
    """A report's code as inputs of its rule (report_code), as an input function, read when one of its
    jobs is planned and not at every parse (a job-level Snakemake of a training job, as under SLURM,
    never scans rlpipe's imports)."""
    return lambda wildcards: report_code(*commands)


JOBS = _jobs.Jobs(LAYOUT, RUNS, run_tests=RUN_TESTS, dag_settings=lambda: workflow.dag_settings,
                  code_inputs=report_code, track_configs=TRACK_CONFIG_FILES,
                  family_configs=FAMILY_CONFIG_FILES)
res, track_res, tdir_res, family_res = LAYOUT.res, LAYOUT.track_res, LAYOUT.tdir_res, LAYOUT.family_res
track_of, tdirs, figure_path = LAYOUT.track_of, LAYOUT.tdirs, LAYOUT.figure_path
track_dataset_dir, track_dataset_inputs = LAYOUT.track_dataset_dir, LAYOUT.track_dataset_inputs
track_corpus, track_corpus_inputs = LAYOUT.track_corpus, LAYOUT.track_corpus_inputs
track_tokenizer_inputs, tokenizer_inputs = LAYOUT.track_tokenizer_inputs, LAYOUT.tokenizer_inputs
track_base, track_base_inputs = LAYOUT.track_base, LAYOUT.track_base_inputs
track_run_outputs, run_outputs, family_run_outputs = LAYOUT.track_run_outputs, LAYOUT.run_outputs, LAYOUT.family_run_outputs
track_eval_outputs = LAYOUT.track_eval_outputs
track_threads, family_runs, family_track = RUNS.track_threads, RUNS.family_runs, RUNS.family_track
tests_done, track_config, track_variant = JOBS.tests_done, JOBS.track_config, JOBS.track_variant
train_inputs, train_params, train_mem_mb, train_runtime = (JOBS.train_inputs, JOBS.train_params, JOBS.train_mem_mb,
                                                           JOBS.train_runtime)
resume_mode, eval_inputs, eval_params, eval_gpus = JOBS.resume_mode, JOBS.eval_inputs, JOBS.eval_params, JOBS.eval_gpus
eval_device = JOBS.eval_device
track_report_inputs, track_summary_inputs = JOBS.track_report_inputs, JOBS.track_summary_inputs
family_train_inputs, family_base, family_dataset_arg = JOBS.family_train_inputs, JOBS.family_base, JOBS.family_dataset_arg
family_variant_train, family_mem_mb, family_runtime = JOBS.family_variant_train, JOBS.family_mem_mb, JOBS.family_runtime
family_resume_mode, family_threads, family_report_inputs = (JOBS.family_resume_mode, JOBS.family_threads,
                                                            JOBS.family_report_inputs)


def section_params(*sections: str) -> str:
    return _params.section_params(CFG, *sections)


def pretrain_gpus(t) -> int:
    return _gpus.pretrain_gpus(t)


def scaling_on() -> bool:
    return CFG.workflow.bench_scaling


def scaling_settings() -> str:
    return _params.scaling_settings(CFG)


# The GPUs each job declares, and the device it runs on (rlpipe.workflow.gpus): exactly what its
# command takes, so that --resources gpu=N and the SLURM profile's --gpus count them.
def bench_device() -> str:
    return _gpus.bench_device(CFG)


def bench_gpus() -> int:
    return _gpus.device_gpus(bench_device())


def scaling_gpus() -> int:
    return _gpus.scaling_gpus(CFG)


def weight_sync_placements() -> str:
    return _gpus.weight_sync_placements(CFG.workflow.gpus_per_disaggregated)


def env_prefix(gpus: int) -> str:
    return _gpus.env_prefix(gpus)


def all_targets() -> list:
    """Everything a full run makes (BENCH_NAMES: bench.smk); nothing in a cluster job's parse, which
    never targets `all` (its targets name every run)."""
    if not MAIN:
        return []
    return _targets.all_targets(LAYOUT, RUNS, toy_sort=bool(TOY_SORT_SEEDS), bench_names=BENCH_NAMES,
                                scaling=scaling_on())


# Under a cluster executor, the analysis jobs (the aggregations, every figure and report, the results
# page: seconds of work each, after the last training run) go to the cluster as ONE job, a Snakemake
# group. Apart, each paid a submission, two parses of this workflow (the job's and its job step's) and
# a status poll. Snakemake sizes the group to run its jobs side by side, one CPU and ANALYSIS_MEM_MB
# each; `--cores N` (a node's CPUs) caps it, and stacks the rest in series. A local run ignores groups.
ANALYSIS_GROUP = "analysis"
ANALYSIS_MEM_MB = 2000
# Likewise each track's preparation chain (its data -> tokenizer -> base model: seconds to minutes each,
# one after the other) is one cluster job per track: a group whose connected pieces (the profile leaves
# group-components at 1 for it) are the tracks' chains, so the tracks still prepare side by side. The
# chain's hops then cost no submission, parse or poll; the zero-shot check and the runs, which need
# the base, stay jobs of their own. Only where every pretraining runs on CPUs: a GPU pretraining goes
# to the GPU partition and its data and tokenizer jobs to the CPU one (workflow.slurm_gpu_partition),
# and one job would hold a GPU through the CPU steps.
PREPARE_GROUP = None if any(pretrain_gpus(t) for t in TRACKS.values()) else "prepare"


def results_page_inputs() -> list:
    return _targets.results_page_inputs(LAYOUT, FAMILIES, toy_sort=bool(TOY_SORT_SEEDS))


wildcard_constraints:
    tdir=tdirs(lambda t: True),
    variant=names_constraint(v for t in TRACKS.values() for v in t.pipeline.variants),
    model=names_constraint(["base", *(v for t in TRACKS.values() if t.evaluate for v in t.pipeline.variants)]),
    family=names_constraint(FAMILIES),
    fvariant=names_constraint(v for f in FAMILIES for v in RUNS.family_variants(f)),
    fseed=r"\d+",
