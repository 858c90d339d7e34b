"""The run-output contract: every name that crosses a stage boundary, declared once.

A training run writes ``results/runs/<variant>/``; ``rlpipe aggregate`` reads those directories
and writes ``results/summary/``; ``rlpipe plot`` draws ``results/figures/<kind>.<ext>`` from the
summary; the Snakemake workflow declares all of them as outputs; the report text and the tests read
them back. This module is the contract between those parties, on the bottom floor beside
``rlpipe.io`` so that each of them imports it without importing another:

- the trainer's writer (``rlpipe.trainer.run_writer``, phase names in ``rlpipe.trainer.profiling``),
- aggregation (``rlpipe.analysis.aggregate``),
- the figures (``rlpipe.analysis.plots``: ``KINDS`` must cover exactly ``FIGURES``),
- the report text (``rlpipe.analysis.report_text``),
- the workflow (``workflow/rules/common.smk`` imports ``RUN_FILES``, ``SUMMARY_FILES`` and
  ``FIGURES``; ``workflow/report/<kind>.rst`` is each figure's caption),
- and the tests (``tests/test_contract.py`` checks it against CONTRIBUTING.md "Run outputs", the
  drivers, the plot functions and the captions).

Rename a column, add a phase or a figure here and every party follows; a party that keeps its own
copy of a name is a bug. Standard library only: the workflow imports this module at parse time and
analysis must not pull in torch or ray.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

# --------------------------------------------------------------------------- phases

#: Every profiling phase an actor or the driver may record (``Profiler.phase(name, ...)``).
PHASES = ("generate", "score", "ref_logprobs", "old_logprobs", "update", "weight_sync", "wait", "validate")
#: Phases that overlap the actors' work (the driver blocked on a rollout batch): reported, but
#: never stacked or counted in the shares.
OVERLAPPING_PHASES = ("wait",)
#: Phases whose summed seconds make up a run's phase stack (shares are of this stack).
STACK_PHASES = tuple(p for p in PHASES if p not in OVERLAPPING_PHASES)
#: The generation side (T_gen of the overlap bound) and the training side (T_train).
GEN_PHASES = ("generate", "score")
TRAIN_PHASES = ("ref_logprobs", "old_logprobs", "update")
#: Phases with a per-step ``time/<phase>`` metrics column (validation runs every val_every steps
#: and is not part of a step's time).
TIMED_PHASES = tuple(p for p in PHASES if p != "validate")
#: Per-step phases drawn as a stack (the timed phases that are stacked).
STEP_STACK_PHASES = tuple(p for p in TIMED_PHASES if p in STACK_PHASES)
#: Pseudo-phase of the summary: wall time not covered by the stack (colocated driver overhead).
OTHER = "other"


def metric_time_column(phase: str) -> str:
    """The metrics.parquet column of a phase's seconds in one step: ``time/<phase>``."""
    return f"time/{phase}"


def phase_seconds_column(phase: str) -> str:
    """The summary table (runs.parquet) column of a phase's total seconds: ``time_<phase>_s``."""
    return f"time_{phase}_s"


def phase_share_column(phase: str) -> str:
    """The summary table (runs.parquet) column of a phase's share of the stack: ``share_<phase>``."""
    return f"share_{phase}"


# --------------------------------------------------------------------------- run directory

METRICS_FILE = "metrics.parquet"
EVENTS_FILE = "events.parquet"
VERSIONS_FILE = "versions.parquet"
ROLLOUTS_FILE = "rollouts.jsonl"
RUN_INFO_FILE = "run_info.json"
RUN_CONFIG_FILE = "config.yaml"  # the resolved config (its train section is the variant's)
CHECKPOINT_DIR = "checkpoints"  # also holds the snapshot of the files above that resume reads
CHECKPOINT_FILE = f"{CHECKPOINT_DIR}/last.pt"
FINISHED_MARKER = f"{CHECKPOINT_DIR}/FINISHED"  # written by `rlpipe train` when the run finished
FINGERPRINT_FILE = f"{CHECKPOINT_DIR}/FINGERPRINT"  # the settings the checkpoint belongs to
TENSORBOARD_DIR = "tensorboard"  # logging.tensorboard: the metric rows as TensorBoard scalars (a view)
RUN_LOCK_FILE = ".lock"  # held (flock) by the one `rlpipe train` writing this run directory

#: The run's declared outputs (Snakemake's train_variant outputs; what aggregation reads), by key.
#: config.yaml and checkpoints/ are not declared outputs: Snakemake deletes a failed job's outputs,
#: and the checkpoint must survive that to be resumed.
RUN_FILES = MappingProxyType({
    "metrics": METRICS_FILE,
    "events": EVENTS_FILE,
    "versions": VERSIONS_FILE,
    "rollouts": ROLLOUTS_FILE,
    "info": RUN_INFO_FILE,
})

#: metrics.parquet: one row per optimizer step plus a step-0 row (initial validation). float64
#: unless in METRIC_INT_COLUMNS; NaN when not measured at that step.
METRIC_COLUMNS = (
    "step", "policy_version", "wall_time", "samples",
    "reward/train_mean", "reward/train_std", "reward/zero_std_frac", "reward/val_mean", "reward/errors",
    "reward/format_mean", "reward/answer_mean", "reward/val_format_mean", "reward/val_answer_mean",
    "loss/policy", "loss/clip_frac", "optim/grad_norm", "policy/entropy", "logprob/sampler_gap",
    "kl/ref_log_ratio", "kl/ref_k3", "kl/prev_log_ratio", "kl/prev_k3", "response/length_mean",
    *(metric_time_column(p) for p in TIMED_PHASES),
    "perf/samples_per_s", "perf/tokens_per_s", "staleness/mean", "staleness/max",
    "sync/bytes", "sync/seconds", "sync/gbps",
    "replay/size", "replay/age_mean", "replay/age_max", "replay/reuse_mean",
)
METRIC_INT_COLUMNS = ("step", "policy_version", "samples")
#: The KL estimators logged per step (seed 000 Eq. 8's log ratio and k3; to the reference / to
#: the previous policy).
KL_COLUMNS = ("kl/ref_log_ratio", "kl/ref_k3", "kl/prev_log_ratio", "kl/prev_k3")

#: events.parquet: one row per profiling event; start / end in seconds since the run's start.
EVENT_COLUMNS = ("phase", "actor", "start", "end", "step", "version")
EVENT_INT_COLUMNS = ("step", "version")

#: versions.parquet: every change of the policy version held by the generator or the learner.
VERSION_COLUMNS = ("who", "version", "wall_time", "event")
VERSION_INT_COLUMNS = ("version",)
VERSION_HOLDERS = ("generator", "learner")

#: rollouts.jsonl: one JSON object per logged example.
ROLLOUT_KEYS = ("step", "version", "prompt", "response", "reward", "ground_truth")

#: run_info.json, written when the run finishes.
RUN_INFO_KEYS = ("variant", "mode", "devices", "device_type", "threads", "wall_time_s",
                 "total_samples", "total_optimizer_steps", "transport", "backend", "finished")
#: Extra keys the drivers add (k of colocated_k, replay enabled, the variant's train config) and
#: ``rlpipe train`` adds (``conditions``: the machine's load over the run, see below).
RUN_INFO_OPTIONAL_KEYS = ("k", "replay", "config", "conditions", "provenance", "gpu_fraction", "phase_split",
                          "gpu_busy", "nodes")
#: run_info ``phase_split``: median seconds per optimizer step of each timed phase, of the step's
#: time no stacked phase covers (``other``) and of the step itself (``rlpipe.trainer.profiling``).
PHASE_SPLIT_KEYS = (*TIMED_PHASES, OTHER, "step")
#: run_info ``gpu_busy``: NVML's busy fraction of the job's GPUs over the training loop, mean and per
#: GPU; ``busy_fraction`` is None, with the ``reason``, on CPU or where NVML cannot be read.
GPU_BUSY_KEYS = ("busy_fraction", "per_device", "samples", "interval_s", "reason")
#: run_info ``conditions``: what else the machine was doing while the run was timed
#: (``rlpipe.trainer.conditions``; ``None`` = not measured). ``contended`` marks timings taken while
#: other processes took the run's CPU; the report draws no timing conclusion from such a run.
RUN_CONDITIONS_KEYS = ("load_avg_start", "load_avg_end", "cpus", "run_cores", "wall_s", "own_cpu_s",
                       "other_cpu_s", "other_cpu_frac", "contended", "note")

#: Share of the machine's CPUs that other processes may take, beyond the cores the run leaves
#: idle, before the run's timings count as measured under contention. 10%: on the idle 2-core
#: machine the system's own daemons take a few percent; one other busy process takes 50%. The one
#: rule for every timing: training runs (``rlpipe.trainer.conditions``) and benchmarks
#: (``rlpipe.analysis.findings.timing_load``) both decide with ``decide_contended``.
OTHER_CPU_THRESHOLD = 0.10


def decide_contended(other_s: float, wall_s: float, cpus: int, run_cores: float | None = None) -> bool | None:
    """Whether timings were measured under contention: other processes kept busy, on average, more
    cores than the run left idle (``cpus - run_cores``, 0 when ``run_cores`` is None) plus
    ``OTHER_CPU_THRESHOLD`` of the machine. ``None`` when unmeasured.

    Why CPU time and not the load average: it is measured over exactly the run's interval and
    only counts other processes that actually ran, i.e. took a core the run could have had; the
    load average lags by a minute, includes the run itself, and counts tasks blocked on I/O. Why
    the idle-core allowance: on a machine with more cores than the run uses, other work on the
    spare cores does not take the run's CPU time (it still shares caches and memory bandwidth,
    which this does not see). On the 2-core machine every run fills the cores, so the rule is
    "others took more than 10% of the machine". It is an average: short bursts of contention in
    an otherwise quiet run can stay under it."""
    if any(isinstance(x, float) and x != x for x in (other_s, wall_s)) or not wall_s > 0 or cpus <= 0:
        return None
    idle = 0.0 if run_cores is None else max(cpus - run_cores, 0.0)
    return other_s / wall_s > idle + OTHER_CPU_THRESHOLD * cpus

#: run_info ``provenance`` (and every benchmark JSON's): what the numbers came from
#: (``rlpipe.provenance``). ``cpu_capability`` is the ATen kernel set torch used (AVX512, AVX2,
#: DEFAULT...), ``aten_cpu_capability`` the ``ATEN_CPU_CAPABILITY`` override if one was set,
#: ``versions`` {package: version}, ``lock_sha256`` the hash of ``requirements/lock.txt`` (None
#: outside a checkout). Seeded results are bit-identical only when all of these agree.
PROVENANCE_KEYS = ("cpu_capability", "aten_cpu_capability", "cpu_model", "cpus", "python", "platform",
                   "versions", "lock_sha256")
#: The provenance keys whose difference between two runs can change their numbers.
PROVENANCE_COMPARED = ("cpu_capability", "cpu_model", "versions", "lock_sha256")
#: every benchmark JSON's two fractions of the chip and the note saying which is which
#: (``rlpipe.bench.flops``): the achieved rate over the shape-matched peak and over the device peak in
#: the run's dtype; None where nothing was measured, never left out
BENCH_PEAK_KEYS = ("fraction_of_shape_peak", "fraction_of_device_peak", "peak_note")

#: ``device_type`` values the drivers write: a run on GPUs is billed in GPU-hours, any other in
#: device-hours (wall time x devices).
DEVICE_CPU = "cpu"
DEVICE_GPU = "gpu"
DEVICE_TYPES = (DEVICE_CPU, DEVICE_GPU)


def device_hours_unit(device_types: Iterable[object]) -> str:
    """'GPU-hours' when any of these run_info ``device_type`` values is ``DEVICE_GPU``, else
    'device-hours'."""
    return "GPU-hours" if any(d == DEVICE_GPU for d in device_types) else "device-hours"


# --------------------------------------------------------------------------- summary directory

VARIANT_COLUMN = "variant"  # first column of every stacked summary frame

#: results/summary/ data files (aggregate_metrics' plain outputs), by key.
SUMMARY_FILES = MappingProxyType({
    "metrics": "metrics.parquet",
    "events": "events.parquet",
    "versions": "versions.parquet",
    "rollouts": "rollouts.parquet",
    "runs": "runs.parquet",
    "weight_sync": "weight_sync.parquet",
    "table_csv": "summary.csv",
    "discussion_json": "discussion.json",
})
#: results/summary/ pages shown in the report, by key.
SUMMARY_REPORT_FILES = MappingProxyType({
    "table_html": "summary.html",
    "discussion_html": "discussion.html",
})

#: summary rollouts.parquet: the runs' rollouts.jsonl, flattened.
SUMMARY_ROLLOUT_COLUMNS = (VARIANT_COLUMN, *ROLLOUT_KEYS)
#: summary weight_sync.parquet: median sync latency per transport (``source`` run | bench).
WEIGHT_SYNC_COLUMNS = ("source", "variant", "payload", "label", "median_s", "n", "bytes", "gbps", "note")


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Figure:
    """One report figure: its report category, its label, and its file extension."""

    category: str
    title: str
    ext: str = "png"


#: kind -> figure. ``rlpipe plot KIND`` draws ``results/figures/KIND.EXT`` with the function
#: ``rlpipe.analysis.plots.KINDS[KIND]``; ``workflow/report/KIND.rst`` is its caption. Adding a
#: figure is one entry here, one plot function and one caption.
FIGURES = MappingProxyType({
    "reward_vs_step": Figure("2 Reward and KL", "validation reward vs step"),
    "reward_vs_time": Figure("2 Reward and KL", "validation reward vs wall-clock time"),
    "kl": Figure("2 Reward and KL", "KL to reference and to previous policy"),
    "phase_breakdown": Figure("3 Profiling", "time per phase, per variant"),
    "phase_steps": Figure("3 Profiling", "per-step phase times (time series)"),
    "timeline": Figure("3 Profiling", "timeline: onpolicy vs disaggregated"),
    "throughput": Figure("4 Throughput and GPU-hours", "samples/s, speedup, GPU-hours"),
    "weight_sync": Figure("5 Weight sync", "weight-sync latency per transport"),
    "versions": Figure("6 Async versions and replay", "generator/learner policy versions"),
    "replay": Figure("6 Async versions and replay", "replay buffer age and reuse"),
    "rollouts": Figure("7 Example rollouts", "example rollouts before/after", "html"),
})


def figure_file(kind: str) -> str:
    """File name of a figure under results/figures/: ``<kind>.<ext>``."""
    return f"{kind}.{FIGURES[kind].ext}"


# --------------------------------------------------------------------------- MATH evaluation

#: ``rlpipe eval --out DIR`` (seed 001 Problem 1: "serialize the examples, model generations, and
#: corresponding evaluation scores to disk"), by key.
EVAL_FILES = MappingProxyType({
    "examples": "examples.parquet",
    "summary": "summary.json",
})
#: eval examples.parquet: one row per evaluated example, in dataset order (``index`` = position in
#: the validation file). ``ground_truth`` is a string; ``category`` is a key of EVAL_CATEGORIES;
#: ``finish_reason`` is the sampler's (``eos`` | ``stop`` | ``length``).
EVAL_COLUMNS = ("index", "prompt", "response", "ground_truth", "format_reward", "answer_reward", "reward",
                "category", "finish_reason")
EVAL_INT_COLUMNS = ("index",)
EVAL_FLOAT_COLUMNS = ("format_reward", "answer_reward", "reward")
#: Category -> (format_reward, answer_reward). The first three are seed 001 Problem 1(b)'s (1) format
#: and answer right, (2) format right and answer wrong, (3) both wrong; the fourth cannot occur under
#: ``r1_zero`` (its answer reward needs the format) and is counted so that a grader that produces it
#: shows up instead of vanishing from the sum.
EVAL_CATEGORIES = MappingProxyType({
    "format1_answer1": (1, 1),
    "format1_answer0": (1, 0),
    "format0_answer0": (0, 0),
    "format0_answer1": (0, 1),
})
#: eval summary.json keys. ``categories`` maps every EVAL_CATEGORIES key to its count (they sum to
#: ``n``); ``accuracy`` is the mean answer_reward, ``format_rate`` the mean format_reward;
#: ``wall_time_s`` covers generation and scoring (not loading); ``reward_errors`` counts samples whose
#: grader failed and scored 0.
EVAL_SUMMARY_KEYS = ("n", "accuracy", "format_rate", "reward_mean", "categories", "reward_errors",
                     "checkpoint", "dataset", "prompt", "max_tokens", "temperature", "top_p", "seed",
                     "wall_time_s", "tokens_generated")

#: ``rlpipe math-report --out DIR``: the MATH track's report pieces, by key.
MATH_REPORT_FILES = MappingProxyType({
    "eval_html": "eval.html",
    "learning_png": "learning.png",
    "math_json": "math.json",
})
#: math.json top-level keys: ``base`` (the eval labelled ``base``: accuracy, format rate and
#: categories, or null), ``evals`` (every eval by label), ``runs`` (per run label: validation
#: points and initial/final/best answer reward), ``notes`` (what was missing and what stood in).
MATH_JSON_KEYS = ("base", "evals", "runs", "notes")


# --------------------------------------------------------------------------- experiment families

#: results/families/<family>/: ``runs/<variant>/seed<seed>/`` (RUN_FILES, one replicate each) and
#: ``report/`` (``rlpipe family-report``).
FAMILY_RUNS_DIR = "runs"
FAMILY_REPORT_DIR = "report"


def family_run_dir(variant: str, seed: int) -> str:
    """A replicate's run directory, relative to results/families/<family>/."""
    return f"{FAMILY_RUNS_DIR}/{variant}/seed{seed}"


#: ``rlpipe family-report --out DIR``: one family's report section, by key. ``curves``: validation
#: reward vs step and vs wall time (mean and 95% band over seeds; final reward vs the family's
#: ``x`` when it has one); ``health``: the GRPO health signals vs step; ``discussion``: the table and
#: the computed discussion; ``table``: one row per variant (FAMILY_TABLE_COLUMNS); ``numbers``:
#: every number the discussion states (FAMILY_JSON_KEYS).
FAMILY_REPORT_FILES = MappingProxyType({
    "curves": "curves.png",
    "health": "health.png",
    "discussion": "discussion.html",
    "table": "summary.csv",
    "numbers": "family.json",
})
#: family summary.csv: per variant, each replicate statistic as ``<stat>_mean``, ``<stat>_ci``
#: (95% half-width, NaN with one replicate) and ``<stat>_n``, for FAMILY_STATS.
FAMILY_STATS = ("val_reward_initial", "val_reward_final", "val_reward_best", "val_answer_final",
                "samples_per_s", "wall_time_s", "share_generate", "share_update")
FAMILY_TABLE_COLUMNS = ("variant", "x", "replicates", "diverged", "contended",
                        *(f"{s}_{p}" for s in FAMILY_STATS for p in ("mean", "ci", "n")))
#: family.json top-level keys: ``family``, ``question``, ``reference``, ``x``, ``replicates``
#: (configured), ``variants`` (per variant: every FAMILY_STATS mean/ci/n, x, diverged, contended),
#: ``comparisons`` (per non-reference variant: final-reward and samples/s differences with their
#: intervals and verdicts), ``sentences`` (the discussion), ``notes`` (missing data), ``health``
#: (per variant, each HEALTH_COLUMNS signal's [first fifth, last fifth] seed mean), ``answer`` (the
#: written answer, ``rlpipe.analysis.family_answer``).
FAMILY_JSON_KEYS = ("family", "question", "reference", "x", "replicates", "variants", "comparisons",
                    "sentences", "notes", "health", "answer")
#: The GRPO health signals the family figure draws (seeds 001/004 ask for comments on them).
HEALTH_COLUMNS = MappingProxyType({
    "policy/entropy": "entropy (nats/token)",
    "response/length_mean": "response length (tokens)",
    "optim/grad_norm": "grad norm (before clipping)",
    "loss/clip_frac": "clip fraction",
    "reward/zero_std_frac": "zero-std group fraction",
    "kl/ref_k3": "KL to reference (k3)",
    "reward/format_mean": "train format reward",
    "reward/answer_mean": "train answer reward",
})

#: ``rlpipe toy-sort --out DIR`` (seed 003's delta x loss grid, ``rlpipe.tasks.sorting.experiment``):
#: ``curves`` (loss, delta, seed, epoch, reward) and ``finals`` (loss, delta, seed, expected_reward).
TOY_SORT_DATA = MappingProxyType({
    "curves": "curves.parquet",
    "finals": "finals.parquet",
})
#: ``rlpipe toy-sort-report --dir DIR`` (``rlpipe.analysis.toy_sort``), beside the data.
TOY_SORT_FILES = MappingProxyType({
    "curves": "curves.png",
    "table_csv": "table.csv",
    "table_html": "table.html",
})

# --------------------------------------------------------------------------- scaling bench

#: ``rlpipe bench scaling`` (``rlpipe.bench.scaling``) writes results/bench/``SCALING_FILE``: one
#: record per (mode, axis, point), each with the step's two ``BENCH_PEAK_KEYS`` fractions;
#: ``rlpipe scaling-report`` draws and fits it into ``SCALING_REPORT_FILES``.
SCALING_FILE = "scaling.json"
SCALING_AXES = ("model", "batch", "length")  # x: parameters, responses per rollout batch, response tokens
SCALING_X = MappingProxyType({"model": "num_parameters", "batch": "batch", "length": "length"})
SCALING_MODES = ("colocated_sync", "disaggregated")
#: the per-step phase times a scaling point records (medians of time/<phase> over its steady steps)
SCALING_PHASES = ("generate", "score", "update", "weight_sync")
SCALING_REPORT_DIR = "scaling"  # under results/bench/
SCALING_REPORT_FILES = MappingProxyType({
    "figure": "scaling.png",
    "table": "exponents.csv",
    "discussion": "scaling.html",
})
#: exponents.csv: the log-log least-squares slope of each curve (y ~ x^exponent)
SCALING_TABLE_COLUMNS = ("mode", "axis", "quantity", "exponent", "x_min", "x_max", "y_min", "y_max", "points")


def scaling_phase_key(phase: str) -> str:
    """A scaling point's key for a phase's median seconds per step: ``step_<phase>_s``."""
    return f"step_{phase}_s"
