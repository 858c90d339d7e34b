# Helpers shared by every rule file. The config is parsed ONCE by rlpipe.config (the single source
# of truth for defaults, validation, variant resolution and GPU counts); rules only read `CFG`.
#
# `snakemake --lint` asks for a conda environment or container per job. rlpipe has none on purpose:
# every rule runs the `rlpipe` command of the package installed in the project's virtual environment
# (README set-up), so pyproject.toml pins the software of all rules at once. Each rule carries a
# `# lint: conda` comment pointing here. Rules that read the config file carry a second comment,
# `# lint: CONFIG_FILE`: their shell uses that global instead of a param, because the path changes with
# any config edit and a param would rerun every stage (see the rerun policy below).
#
# Rerun policy (why params and the config file look the way they do):
# - Every command reads the resolved config from a content-addressed file,
#   results/config/pipeline-<hash>.yaml, written here when the workflow is parsed (atomically, only if
#   absent) and passed as a param, never as an input. An edit therefore gives a new file and changes
#   no input, and a lost .snakemake directory can never leave a command reading a stale config.
# - Every stage declares the config sections it depends on as `params`, in canonical JSON (sorted
#   keys, so reordering YAML keys changes nothing), and Snakemake's params trigger reruns exactly the stages
#   whose settings changed, in the same invocation: editing `train.*` or one variant reruns the
#   affected variants, not pretraining. (An upstream job that only writes a shared config file would
#   mask this: Snakemake does not check the params of jobs downstream of a job that must rerun when
#   they reach it only through ancient() inputs, so the edit took two invocations to apply.)
# - The unit-test gate is still an ancient() input of training: rerunning the tests (their params or
#   junit.xml changed) does not retrain. The masking above applies to that one case only.

import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

from rlpipe import io
from rlpipe.config import (
    KEYWORD_TRACK,
    MATH_TRACK,
    SYSTEMS_TRACK,
    ConfigError,
    active_families,
    eval_base_settings,
    family_base_track,
    family_pipeline,
    family_reference,
    family_seeds,
    math_pipeline,
    parse_config,
    resolve_variant,
    table_reference,
    to_dict,
    variant_gpus,
)

# An overlay config (`--configfile config/smoke.yaml`) switches a variant of the base table off with
# `name: null`: Snakemake merges config files key by key, so it could not remove a key otherwise.
config["variants"] = {k: v for k, v in (config.get("variants") or {}).items() if v is not None}
config["families"] = {k: v for k, v in (config.get("families") or {}).items() if v is not None}

try:
    CFG = parse_config(config)
except ConfigError as e:
    raise WorkflowError(f"invalid rlpipe config: {e}") from None

RESULTS = CFG.workflow.results_dir.rstrip("/")
KEYWORD_ON = KEYWORD_TRACK in CFG.workflow.tracks
MATH_ON = MATH_TRACK in CFG.workflow.tracks
VARIANTS = list(CFG.variants) if KEYWORD_ON else []
REPO = Path(workflow.basedir)


def write_resolved(name: str, cfg) -> str:
    """Write ``cfg`` to results/config/<name>-<hash of its content>.yaml (once) and return the path."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    path = f"{RESULTS}/config/{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not os.path.exists(path):
        io.write_text(path, text)
    return path


CONFIG_FILE = write_resolved("pipeline", CFG)
# The MATH track runs every stage command on a pipeline config of its own (rlpipe.config.math_pipeline:
# the math section's tokenizer/model/pretrain/train/variants in place of the keyword track's).
MATH_CFG = math_pipeline(CFG) if MATH_ON else None
MATH_CONFIG_FILE = write_resolved("math", MATH_CFG) if MATH_ON else None
MATH_VARIANTS = list(MATH_CFG.variants) if MATH_ON else []
# Experiment families: each runs on a pipeline config of its own (rlpipe.config.family_pipeline:
# its track's, with the family's base and variants), written like the others; FAMILIES = those whose
# track is on.
FAMILIES = active_families(CFG)
FAMILY_CFG = {f: family_pipeline(CFG, f) for f in FAMILIES}
FAMILY_CONFIG_FILES = {f: write_resolved(f"family-{f}", c) for f, c in FAMILY_CFG.items()}
FAMILY_SEEDS = {f: family_seeds(CFG, f) for f in FAMILIES}


def _check_math_paths() -> None:
    """The math track's local model and dataset directories exist (named by key, before any job)."""
    m = CFG.math
    if m.base_model_dir and not Path(m.base_model_dir, "config.json").is_file():
        raise WorkflowError(f"invalid rlpipe config: math.base_model_dir: {m.base_model_dir} is not a local "
                            "HuggingFace model directory (no config.json); rlpipe never downloads models")
    if m.dataset_dir and not Path(m.dataset_dir, "train.jsonl").is_file():
        raise WorkflowError(f"invalid rlpipe config: math.dataset_dir: {m.dataset_dir} holds no train.jsonl "
                            "(a MATH-format directory: train.jsonl and validation.jsonl)")


if MATH_ON:
    _check_math_paths()
# File names of a run directory (RUN_FILES: train_variant's declared outputs), of results/summary
# (SUMMARY_FILES, SUMMARY_REPORT_FILES) and the figures (FIGURES: kind -> Figure(category, title,
# ext)) come from the run-output contract, which the trainer's writer, aggregation, the plots and
# the tests share.
from rlpipe.analysis.contract import (
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
    family_run_dir,
    figure_file,
)


def res(*parts: str) -> str:
    """A path under the results directory."""
    return "/".join([RESULTS, *parts])


def module_file(name: str) -> str:
    """Source file of an rlpipe module, as an input: editing it reruns only the rules that use it.
    Found without importing (plots would pull in matplotlib at parse time)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise WorkflowError(f"module {name} not found: is rlpipe installed (pip install -e .)?")
    return spec.origin


def canonical(value) -> str:
    """Parsed config values as canonical JSON: params compare as text, so key order must not count."""
    return json.dumps(value, sort_keys=True, default=str)


def section_params(*sections: str) -> str:
    """The config sections a stage depends on (a params value: a change reruns the stage)."""
    return canonical({s: to_dict(getattr(CFG, s)) for s in sections})


def variant_train(variant: str) -> str:
    return canonical(to_dict(resolve_variant(CFG, variant)))


def scaling_on() -> bool:
    return CFG.workflow.bench_scaling


def scaling_settings() -> str:
    """What a scaling point runs: the train section and the sweep (a change reruns the bench)."""
    w = CFG.workflow
    return canonical({"train": to_dict(CFG.train), "sizes": w.scaling_sizes, "batches": w.scaling_batches,
                      "lengths": w.scaling_lengths, "steps": w.scaling_steps})


def forced(rule: str, outputs) -> bool:
    """Whether this invocation forces the job (--forcerun RULE or one of its outputs, -f on its
    outputs, -F). Training reads it as a resource, because resources are no rerun trigger."""
    ds = workflow.dag_settings
    targets = {str(t) for t in getattr(ds, "targets", ()) or ()}
    outs = {str(o) for o in outputs}
    return bool(ds.forceall or rule in ds.forcerun or outs & {str(f) for f in ds.forcerun}
                or (ds.forcetargets and outs & targets))


def resume_mode(wildcards) -> str:
    """`rlpipe train --resume`: a forced rerun starts afresh; otherwise (a first run, changed
    settings, --rerun-incomplete after a crash) rlpipe.trainer.resume decides."""
    return "never" if forced("train_variant", run_outputs(wildcards.variant).values()) else "auto"


def math_resume_mode(wildcards) -> str:
    """resume_mode for train_math_variant."""
    return "never" if forced("train_math_variant", math_run_outputs(wildcards.math_variant).values()) else "auto"


def tests_done() -> list:
    """Training waits for the unit tests (a broken package never burns GPU hours). ancient():
    re-running the tests later does not make finished runs look outdated."""
    return [ancient(res("tests", "junit.xml"))] if CFG.workflow.run_tests else []


def tokenizer_inputs() -> list:
    """The tokenizer file as an input, unless it is a spec such as 'tiktoken:gpt2'."""
    spec = CFG.tokenizer.path
    if spec is None:
        return [res("tokenizer", "tokenizer.json")]
    return [spec] if Path(spec).exists() else []


def optional_file(path: str | None) -> list:
    return [path] if path else []


def pretrain_gpus() -> int:
    device = CFG.pretrain.device
    return 1 if device == "cuda" or (device == "auto" and CFG.workflow.gpus_per_colocated > 0) else 0


def bench_device() -> str:
    """The sampler bench runs where generation runs: train.device, 'auto' meaning cuda on a GPU config."""
    device = CFG.train.device
    if device == "auto":
        return "cuda" if CFG.workflow.gpus_per_colocated > 0 else "cpu"
    return device


def train_inputs(wildcards) -> dict:
    inputs = {
        "base": res("base", "model.pt"),
        "tests": tests_done(),
    }
    if resolve_variant(CFG, wildcards.variant).task == "keyword_inclusion":
        inputs["dataset"] = res("data", "keywords", "train.jsonl")
    return inputs


def run_outputs(variant: str) -> dict:
    return {k: res("runs", variant, f) for k, f in RUN_FILES.items()}


# --------------------------------------------------------------------------- figures
# FIGURES (rlpipe.analysis.contract): kind -> Figure; `rlpipe plot KIND` draws it (the function
# registered in rlpipe.analysis.plots.KINDS) and workflow/report/<kind>.rst is its caption.


def figure_path(kind: str) -> str:
    return res("figures", figure_file(kind))


def all_targets() -> list:
    targets = [res("RESULTS.md")]
    targets += math_targets() if MATH_ON else []
    targets += family_targets()
    if CFG.workflow.toy_sort_seeds:
        targets += [res("toy_sort", f) for f in TOY_SORT_FILES.values()]
    if not KEYWORD_ON:
        return targets
    targets += [res("summary", f) for f in SUMMARY_FILES.values()]
    targets += [res("summary", f) for f in SUMMARY_REPORT_FILES.values()]
    targets += [figure_path(k) for k in FIGURES]
    targets += [res("bench", "weight_sync.json"), res("bench", "sampler.json"), res("bench", "update.json"),
                res("bench", "trl.json"), res("base", "zero_shot.json")]
    if scaling_on():
        targets += [res("bench", SCALING_REPORT_DIR, f) for f in SCALING_REPORT_FILES.values()]
    targets += [res("runs", v, f) for v in VARIANTS for f in RUN_FILES.values()]
    return targets


def results_page_inputs() -> list:
    """What the results page reads: the summary table, the MATH track's evaluations and each
    family's table, for the tracks and families this run has."""
    inputs = [res("summary", SUMMARY_FILES["table_csv"])] if KEYWORD_ON else []
    if MATH_ON:
        inputs += [math_res("eval", m, EVAL_FILES["summary"]) for m in ["base", *MATH_VARIANTS]]
    inputs += [family_res(f, FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["table"]) for f in FAMILIES]
    return inputs


wildcard_constraints:
    # `(?!)` never matches: an empty variants table must not let {variant} match anything.
    variant="|".join(re.escape(v) for v in VARIANTS) or "(?!)",
    math_variant="|".join(re.escape(v) for v in MATH_VARIANTS) or "(?!)",
    math_model="|".join(re.escape(v) for v in ["base", *MATH_VARIANTS]),
    family="|".join(re.escape(f) for f in FAMILIES) or "(?!)",
    fvariant="|".join(sorted({re.escape(v) for c in FAMILY_CFG.values() for v in c.variants})) or "(?!)",
    fseed=r"\d+",


# --------------------------------------------------------------------------- the MATH track
# results/math/: data/ (the generated arithmetic task: train.jsonl, val.jsonl, corpus.txt),
# tokenizer/, base/model.pt, eval/<base|variant>/ (`rlpipe eval`), runs/<variant>/ (RUN_FILES),
# report/ (`rlpipe math-report`). A local HuggingFace model (math.base_model_dir) replaces the
# tokenizer and pretraining stages; a MATH-format directory (math.dataset_dir) replaces the data.


def math_res(*parts: str) -> str:
    return res("math", *parts)


def math_dataset_dir() -> str:
    return CFG.math.dataset_dir or math_res("data")


def math_dataset_inputs() -> list:
    """The dataset files as inputs: the generated ones, or whatever a given directory holds."""
    if CFG.math.dataset_dir is None:
        return [math_res("data", "train.jsonl"), math_res("data", "val.jsonl")]
    return sorted(str(p) for p in Path(CFG.math.dataset_dir).glob("*.jsonl"))


def math_base() -> str:
    """What `--base` gets: the HF directory, or our pretrained checkpoint."""
    return CFG.math.base_model_dir or math_res("base", "model.pt")


def math_base_inputs() -> list:
    d = CFG.math.base_model_dir
    return [os.path.join(d, "config.json")] if d else [math_res("base", "model.pt")]


def math_tokenizer_inputs() -> list:
    spec = MATH_CFG.tokenizer.path
    if spec is None:
        return [math_res("tokenizer", "tokenizer.json")]
    return [spec] if Path(spec).exists() else []


def math_run_outputs(variant: str) -> dict:
    return {k: math_res("runs", variant, f) for k, f in RUN_FILES.items()}


def math_eval_outputs(model: str) -> dict:
    return {k: math_res("eval", model, f) for k, f in EVAL_FILES.items()}


def math_eval_inputs(wildcards) -> dict:
    """`rlpipe eval` of the base model or of a variant's final policy (its checkpoints/last.pt, which
    is not a declared output: the run's run_info.json stands for it)."""
    if wildcards.math_model == "base":
        return {"model": math_base_inputs(), "dataset": math_dataset_inputs()}
    return {"model": math_run_outputs(wildcards.math_model)["info"], "dataset": math_dataset_inputs()}


def math_eval_checkpoint(wildcards) -> str:
    if wildcards.math_model == "base":
        return math_base()
    return math_res("runs", wildcards.math_model, CHECKPOINT_FILE)


def math_variant_train(variant: str) -> str:
    return canonical(to_dict(resolve_variant(MATH_CFG, variant)))


def math_section_params(*sections: str) -> str:
    return canonical({s: to_dict(getattr(MATH_CFG, s)) for s in sections})


def math_targets() -> list:
    targets = [math_res("report", f) for f in MATH_REPORT_FILES.values()]
    targets += [math_res("runs", v, f) for v in MATH_VARIANTS for f in RUN_FILES.values()]
    return targets


# --------------------------------------------------------------------------- experiment families
# results/families/<family>/runs/<variant>/seed<seed>/ (RUN_FILES, one `rlpipe train` job each) and
# results/families/<family>/report/ (`rlpipe family-report`, one report section per family).
# A keyword-track family trains from the keyword base model and dataset, a math-track family from
# the MATH track's (generated or local) ones.


def family_res(family: str, *parts: str) -> str:
    return res("families", family, *parts)


def family_run_outputs(family: str, variant: str, seed) -> dict:
    d = family_res(family, family_run_dir(variant, seed))
    return {k: f"{d}/{f}" for k, f in RUN_FILES.items()}


def family_runs(family: str) -> list:
    """(variant, seed) of every replicate of the family."""
    return [(v, s) for v in FAMILY_CFG[family].variants for s in FAMILY_SEEDS[family]]


def _run_key(track: str, train, seed, threads: int) -> tuple:
    """What a run computes and how it is timed: its track (base model and data), resolved train
    settings and job threads (a run alone on both cores is not a run beside another)."""
    return track, canonical(dict(to_dict(train), seed=int(seed))), threads


def _family_job_threads(family: str) -> int:
    """A systems-family replicate compares speed: it runs alone, like the variants
    (workflow.threads_per_variant); every other replicate takes workflow.family_threads."""
    timed = CFG.families[family].track == SYSTEMS_TRACK
    return CFG.workflow.threads_per_variant if timed else CFG.workflow.family_threads


def _family_run_key(family: str, variant: str, seed) -> tuple:
    train = resolve_variant(FAMILY_CFG[family], variant)
    return _run_key(family_base_track(CFG.families[family]), train, seed, _family_job_threads(family))


# The owner of a replicate that is one of the variants table's own runs (results/runs/<variant>).
TABLE_RUN = "(variants table)"


def _family_run_owners() -> dict:
    """(family, variant, seed) -> the run that trains it. Identical runs (same track, settings,
    seed and job threads) train once:
    - a replicate identical to a run of the variants table reads that run (the systems family's
      first seed is results/runs/<variant> when its settings equal the table's: no `base`, and a
      variant that does not override the seed);
    - families share identical replicates: the reference settings of several math families are the
      same run (lr_sweep's lr1e-4 is length_norm's masked_mean, std_norm's std, ...), so it trains
      once, under the first family in config order that has it, and every family's report reads it
      under its own variant name."""
    first = {_run_key(KEYWORD_TRACK, t, t.seed, CFG.workflow.threads_per_variant): (TABLE_RUN, v, None)
             for v in VARIANTS for t in [resolve_variant(CFG, v)]}
    owners = {}
    for f in FAMILIES:
        for v, s in family_runs(f):
            owners[(f, v, s)] = first.setdefault(_family_run_key(f, v, s), (f, v, s))
    return owners


FAMILY_RUN_OWNER = _family_run_owners()


def family_trained_outputs(family: str, variant: str, seed) -> dict:
    """The run files a family replicate reads: those of the run that trains it."""
    owner, v, s = FAMILY_RUN_OWNER[(family, variant, seed)]
    return run_outputs(v) if owner == TABLE_RUN else family_run_outputs(owner, v, s)


def family_threads(wildcards) -> int:
    return _family_job_threads(wildcards.family)


def _family_math(family: str) -> bool:
    return CFG.families[family].track == MATH_TRACK


def family_train_inputs(wildcards) -> dict:
    f = wildcards.family
    if _family_math(f):
        return {"base": math_base_inputs(), "dataset": math_dataset_inputs(), "tests": tests_done()}
    inputs = {"base": res("base", "model.pt"), "tests": tests_done()}
    if FAMILY_CFG[f].train.task == "keyword_inclusion":
        inputs["dataset"] = res("data", "keywords", "train.jsonl")
    return inputs


def family_base(wildcards) -> str:
    return math_base() if _family_math(wildcards.family) else res("base", "model.pt")


def family_dataset_arg(wildcards) -> str:
    f = wildcards.family
    if _family_math(f):
        return f"--dataset {math_dataset_dir()}"
    if FAMILY_CFG[f].train.task == "keyword_inclusion":
        return f"--dataset {res('data', 'keywords')}"
    return ""


def family_variant_train(wildcards) -> str:
    """The replicate's resolved train settings (a params value: a change reruns exactly it)."""
    return _family_run_key(wildcards.family, wildcards.fvariant, wildcards.fseed)[1]


def family_resume_mode(wildcards) -> str:
    outs = family_run_outputs(wildcards.family, wildcards.fvariant, wildcards.fseed).values()
    return "never" if forced("train_family_run", outs) else "auto"


def family_targets() -> list:
    targets = [family_res(f, FAMILY_REPORT_DIR, name) for f in FAMILIES for name in FAMILY_REPORT_FILES.values()]
    targets += [p for f in FAMILIES for v, s in family_runs(f) if FAMILY_RUN_OWNER[(f, v, s)] == (f, v, s)
                for p in family_run_outputs(f, v, s).values()]
    return targets


def family_report_inputs(wildcards) -> dict:
    f = wildcards.family
    runs = family_runs(f)
    return {"metrics": [family_trained_outputs(f, v, s)["metrics"] for v, s in runs],
            "info": [family_trained_outputs(f, v, s)["info"] for v, s in runs],
            "code": [module_file("rlpipe.analysis.families"), module_file("rlpipe.analysis.stats")]}
