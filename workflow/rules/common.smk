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
#   results/config/pipeline-<hash>.yaml, named here when the workflow is parsed, written (atomically,
#   only if absent) when it starts running jobs (onstart: a dry run writes none), and passed as a
#   param, never as an input. An edit therefore gives a new file and changes no input, and a lost
#   .snakemake directory can never leave a command reading a stale config.
# - Every stage declares the config sections it depends on as `params`, in canonical JSON (sorted
#   keys, so reordering YAML keys changes nothing), and Snakemake's params trigger reruns exactly the stages
#   whose settings changed, in the same invocation: editing `train.*` or one variant reruns the
#   affected variants, not pretraining. (An upstream job that only writes a shared config file would
#   mask this: Snakemake does not check the params of jobs downstream of a job that must rerun when
#   they reach it only through ancient() inputs, so the edit took two invocations to apply.)
# - The unit-test gate is still an ancient() input of training: rerunning the tests (their params or
#   junit.xml changed) does not retrain. The masking above applies to that one case only.

import ast
import hashlib
import importlib.util
import json
import os
import re
import sys
from functools import cache
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

from rlpipe import io, slurm
from rlpipe.cli import COMMANDS
from rlpipe.config import (
    CORPUS_FILE,
    KEYWORD_TRACK,
    MATH_TRACK,
    ConfigError,
    active_families,
    eval_base_settings,
    family_pipeline,
    family_seeds,
    load_yaml,
    overlay_list_replacements,
    parse_config,
    resolve_variant,
    table_reference,
    to_dict,
    track_pipeline,
    variant_gpus,
    workflow_tracks,
)
from rlpipe.config.checks import check_paths, check_trackers
from rlpipe.config.identity import identity
from rlpipe.config.run_command import CONFIG_SUFFIXES

# An overlay config (`--configfile config/smoke.yaml`) switches a variant of the base table off with
# `name: null`: Snakemake merges config files key by key, so it could not remove a key otherwise.
config["variants"] = {k: v for k, v in (config.get("variants") or {}).items() if v is not None}
config["families"] = {k: v for k, v in (config.get("families") or {}).items() if v is not None}
config["tracks"] = {k: v for k, v in (config.get("tracks") or {}).items() if v is not None}

# A target written after --configfile is read by Snakemake as one more config file; it fails before
# this file runs unless it exists and parses (a JSON result does): name it here in one line. The
# safe form, which cannot confuse the two, is `rlpipe run` (rlpipe.config.run_command).
for _f in workflow.overwrite_configfiles or ():
    if Path(str(_f)).suffix.lower() not in CONFIG_SUFFIXES:
        raise WorkflowError(f"{_f}: looks like a target; put targets before --configfile (or use `rlpipe run`)")

def _run_trains(cfg) -> dict:
    """Every run's resolved train settings by track and variant (their template and reward files are checked)."""
    return {f"{n}/{v}: train": to_dict(resolve_variant(p, v)) for n in cfg.workflow.tracks
            for p in [track_pipeline(cfg, n)] for v in p.variants}


# Every key is checked before any job, the paths included (rlpipe.config.checks: inputs exist and are
# readable, workflow.results_dir is writable), so that no job starts on an input it cannot read. A
# job that fails leaves the workflow worse off whatever the job does: Snakemake deletes its outputs
# before it starts, and records the failed job's params against them even when the outputs are
# flagged update() (which restores the old file: its next run with those params would then take the
# old output as theirs). So a bad input is refused here, where nothing has been touched yet.
try:
    CFG = parse_config(config)
    check_paths(CFG, _run_trains(CFG))
    check_trackers(CFG)  # a tracker named but not installed: its extra, before any job
    if CFG.data.keywords_path and KEYWORD_TRACK in CFG.workflow.tracks:  # its lines, named file:line
        from rlpipe.tasks.keyword.vocabulary import load_keywords

        load_keywords(CFG.data.keywords_path)
except ConfigError as e:
    raise WorkflowError(f"invalid rlpipe config: {e}") from None

RESULTS = CFG.workflow.results_dir.rstrip("/")
# Snakemake merges --configfile overlays key by key but replaces a list whole: say so when one
# overlay replaces a list another set (e.g. a shrinking overlay placed after the user's).
for _msg in overlay_list_replacements([(str(f), load_yaml(f)) for f in workflow.overwrite_configfiles or ()]):
    print(f"rlpipe config: warning: {_msg}", file=sys.stderr)
REPO = Path(workflow.basedir)


# path -> text of every resolved config this invocation's jobs may read; written by `onstart` below,
# i.e. only when jobs are about to run: a dry run (-n), --report, --lint or an invocation that fails
# before its first job leaves nothing in results/config/.
RESOLVED_CONFIGS = {}


def write_resolved(name: str, cfg) -> str:
    """The path results/config/<name>-<hash of its content>.yaml of ``cfg``; the file is written
    (once: only if absent) when the workflow starts running jobs."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    path = f"{RESULTS}/config/{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    RESOLVED_CONFIGS[path] = text
    return path


onstart:
    for _path, _text in RESOLVED_CONFIGS.items():
        if not os.path.exists(_path):
            io.write_text(_path, _text)


CONFIG_FILE = write_resolved("pipeline", CFG)
# Tracks (rlpipe.config.workflow_tracks): every track in workflow.tracks, built in (keyword, math) or a
# user's (the `tracks` table), as one Track record: its own resolved pipeline config, where its
# dataset and base model come from, and its directory under results/ (Track.subdir: "" for keyword,
# "math/", "tracks/<name>/"). Every path and input of a track below derives from that record alone.
TRACKS = workflow_tracks(CFG)
TRACK_BY_DIR = {t.subdir: t for t in TRACKS.values()}
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
# Experiment families: each runs on a pipeline config of its own (rlpipe.config.family_pipeline:
# its track's, with the family's base and variants), written like the others; FAMILIES = those whose
# track is on.
FAMILIES = active_families(CFG)
FAMILY_CFG = {f: family_pipeline(CFG, f) for f in FAMILIES}
FAMILY_CONFIG_FILES = {f: write_resolved(f"family-{f}", c) for f, c in FAMILY_CFG.items()}
FAMILY_SEEDS = {f: family_seeds(CFG, f) for f in FAMILIES}


def _check_track_paths(t) -> None:
    """A track's given model and dataset directories exist (named by key, before any job)."""
    if t.name == MATH_TRACK:
        model_key, data_key = "math.base_model_dir", "math.dataset_dir"
    else:
        model_key, data_key = f"tracks.{t.name}.base_model", f"tracks.{t.name}.dataset_dir"
    base = t.base_model
    if base and not (Path(base, "config.json").is_file() or Path(base).is_file()):
        raise WorkflowError(f"invalid rlpipe config: {model_key}: {base} is not a local HuggingFace model directory "
                            "(no config.json) nor an rlpipe checkpoint file; rlpipe never downloads models")
    if t.dataset_dir and not Path(t.dataset_dir).is_dir():
        raise WorkflowError(f"invalid rlpipe config: {data_key}: {t.dataset_dir} is not a directory")
    if t.name == MATH_TRACK and t.dataset_dir and not Path(t.dataset_dir, "train.jsonl").is_file():
        raise WorkflowError(f"invalid rlpipe config: {data_key}: {t.dataset_dir} holds no train.jsonl "
                            "(a MATH-format directory: train.jsonl and validation.jsonl)")
    if t.dataset_dir and t.pretrains and t.name != MATH_TRACK and not Path(t.dataset_dir, CORPUS_FILE).is_file():
        raise WorkflowError(f"invalid rlpipe config: {data_key}: {t.dataset_dir} holds no {CORPUS_FILE}, which "
                            f"pretraining the track's base model reads (or give {model_key})")


def _check_user_task(t) -> None:
    """A user's track with a given dataset directory: its task loads, its files parse and its reward
    answers on the first examples now, at parse time, before any job (rlpipe train checks again
    before Ray starts; a command-built dataset is checked there only, once it exists)."""
    from rlpipe.tasks.base import DatasetError
    from rlpipe.tasks.registry import TaskLoadError, check_task

    try:
        check_task(t.pipeline.train, t.dataset_dir)
    except (DatasetError, FileNotFoundError, TaskLoadError, ValueError) as e:
        raise WorkflowError(f"track {t.name}: {e}") from None


def _check_prompts(t) -> None:
    """Every prompt of a track's given dataset fits its model's context with room for the response,
    for each run's settings (rlpipe.tasks.prompt_budget: tokens counted with the track's tokenizer
    when it exists now, else bounded from the prompt's bytes; rlpipe train counts exactly again)."""
    from rlpipe.tasks.base import DatasetError
    from rlpipe.tasks.prompt_budget import base_context_length, check_prompt_lengths, preset_context_length
    from rlpipe.tasks.registry import TaskLoadError

    p = t.pipeline
    context = (base_context_length(t.base_model) if t.base_model
               else preset_context_length(p.model.preset, p.model.overrides))
    if context is None:
        return
    trained = Path(f"{RESULTS}/{t.subdir}tokenizer/tokenizer.json")
    tokenizer = p.tokenizer.path or (t.base_model if t.base_model and Path(t.base_model, "tokenizer.json").is_file()
                                     else str(trained) if t.pretrains and trained.is_file() else None)
    runs = [resolve_variant(p, v) for v in p.variants]
    runs += [resolve_variant(FAMILY_CFG[f], v) for f in FAMILIES if CFG.families[f].base_track == t.name
             for v in FAMILY_CFG[f].variants]
    seen = set()
    for train in runs:
        key = json.dumps([train.task, to_dict(train.text), to_dict(train.math), train.task_options,
                          train.sampling_max_tokens], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            try:
                check_prompt_lengths(train, t.dataset_dir, context, tokenizer)
            except (DatasetError, FileNotFoundError, TaskLoadError, ValueError) as e:
                raise WorkflowError(f"track {t.name}: {e}") from None


for _t in TRACKS.values():
    if _t.name != KEYWORD_TRACK:
        _check_track_paths(_t)
    if _t.name not in (KEYWORD_TRACK, MATH_TRACK) and _t.dataset_dir:
        _check_user_task(_t)
    if _t.dataset_dir:
        _check_prompts(_t)
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


# --------------------------------------------------------------------------- code inputs
# A report's code is an input of its rule, so that editing it reruns exactly the rules that run it and
# nothing upstream (training lists no code: editing the trainer retrains nothing). The lists are
# derived, never kept by hand: code_inputs("family-report") reads the entry module of that `rlpipe`
# command (rlpipe.cli.COMMANDS) and follows its import statements, transitively, through every rlpipe
# module it loads (with the package __init__ files Python runs on the way), without importing any of
# them (the plots would pull in matplotlib at parse time). It keeps the modules of the entry's own
# package (rlpipe.analysis for every report; the config and io layers below reach a report through its
# params), and each data file beside them that a kept module names (deliverables.py's
# seed_questions.yaml). tests/test_workflow_code_inputs.py holds every planned job that runs a report
# against what importing its entry really loads.
RLPIPE_ROOT = Path(importlib.util.find_spec("rlpipe").origin).parent.parent  # the directory holding rlpipe/


def _module_source(name: str) -> Path | None:
    """The file of an rlpipe module or package; None for a namespace package or a name that is no module."""
    p = RLPIPE_ROOT.joinpath(*name.split("."))
    return next((f for f in (p.with_suffix(".py"), p / "__init__.py") if f.is_file()), None)


@cache
def _module_imports(name: str) -> tuple[frozenset, frozenset]:
    """(the rlpipe modules that loading ``name`` runs directly: its ancestor packages and what its import
    statements name, a submodule imported from a package included; the data files beside it that it
    names in a string)."""
    path = _module_source(name)
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = name.split(".")
    found = {".".join(parts[:i]) for i in range(1, len(parts))}
    data = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[\w.-]+", node.value):
            beside = path.parent / node.value
            if beside.suffix != ".py" and beside.is_file():
                data.add(str(beside))
    rlpipe = frozenset(m for m in found if m.split(".")[0] == "rlpipe" and _module_source(m))
    return rlpipe, frozenset(data)


def code_inputs(*commands: str) -> list:
    """The source files (and the data files they name) of the entry modules of these `rlpipe` commands
    and of every module of the entry's package that they load, as inputs: see above."""
    files = set()
    for command in commands:
        if command not in COMMANDS:
            raise WorkflowError(f"code_inputs: no rlpipe command {command!r}")
        entry = COMMANDS[command][0]
        own = entry.rpartition(".")[0] + "."
        seen, todo = set(), [entry]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            modules, data = _module_imports(m)
            todo += modules
            if m.startswith(own):
                files |= {str(_module_source(m)), *data}
    return sorted(files)


def canonical(value) -> str:
    """Parsed config values as canonical JSON: params compare as text, so key order must not count."""
    return json.dumps(value, sort_keys=True, default=str)


def ident(section, key: str) -> dict:
    """A config section's identity (rlpipe.config.identity): what a params value holds, so that an
    operational key (a timeout, a thread count, a logging interval) reruns nothing, and a file a key
    names counts by its content, not its absolute path (a moved project reruns nothing)."""
    return identity(to_dict(section), key)


def section_params(*sections: str) -> str:
    """The config sections a stage depends on (a params value: a change of an identity key reruns the stage)."""
    return canonical({s: ident(getattr(CFG, s), s) for s in sections})


def scaling_on() -> bool:
    return CFG.workflow.bench_scaling


def scaling_settings() -> str:
    """What a scaling point runs: the train section and the sweep (a change reruns the bench)."""
    w = CFG.workflow
    return canonical({"train": ident(CFG.train, "train"), "sizes": w.scaling_sizes, "batches": w.scaling_batches,
                      "lengths": w.scaling_lengths, "steps": w.scaling_steps})


def forced(rule: str, outputs) -> bool:
    """Whether this invocation forces the job (--forcerun RULE or one of its outputs, -f on its
    outputs, -F). Training reads it as a resource, because resources are no rerun trigger."""
    ds = workflow.dag_settings
    targets = {str(t) for t in getattr(ds, "targets", ()) or ()}
    outs = {str(o) for o in outputs}
    return bool(ds.forceall or rule in ds.forcerun or outs & {str(f) for f in ds.forcerun}
                or (ds.forcetargets and outs & targets))


def tests_done() -> list:
    """Training waits for the unit tests (a broken package never burns GPU hours). ancient():
    re-running the tests later does not make finished runs look outdated."""
    return [ancient(res("tests", "junit.xml"))] if RUN_TESTS else []


def optional_file(path: str | None) -> list:
    return [path] if path else []


def bench_device() -> str:
    """The sampler bench runs where generation runs: train.device, 'auto' meaning cuda on a GPU config."""
    device = CFG.train.device
    if device == "auto":
        return "cuda" if CFG.workflow.gpus_per_colocated > 0 else "cpu"
    return device


# --------------------------------------------------------------------------- tracks
# One path scheme for every track: results/<subdir>{data,tokenizer,base,runs/<variant>,eval/<model>,
# report}/ (subdir "" keeps the keyword track's results/runs/<variant>, the path the design card's
# users rerun; the math track is results/math/; a user's track results/tracks/<name>/). Rules take
# the subdir as the wildcard {tdir} and find the track with track_of().


def track_res(track: str, *parts: str) -> str:
    """A path under a track's directory."""
    return f"{RESULTS}/{TRACKS[track].subdir}" + "/".join(parts)


def tdir_res(*parts: str) -> str:
    """An output pattern under the track directory wildcard {tdir}."""
    return f"{RESULTS}/{{tdir}}" + "/".join(parts)


def track_of(wildcards):
    return TRACK_BY_DIR[wildcards.tdir]


def tdirs(pick) -> str:
    """A {tdir} constraint: the subdirs of the tracks ``pick(track)`` selects ('(?!)': none)."""
    chosen = [re.escape(t.subdir) for t in TRACKS.values() if pick(t)]
    return f"(?:{'|'.join(chosen)})" if chosen else "(?!)"


def track_config(wildcards) -> str:
    """The track's resolved pipeline config: a resource, not a param (see CONFIG_FILE above)."""
    return TRACK_CONFIG_FILES[track_of(wildcards).name]


def track_dataset_dir(t) -> str:
    """Where the track's task reads its files: a given directory or the one its data rule builds."""
    return t.dataset_dir or track_res(t.name, t.data_subdir)


def track_dataset_inputs(t) -> list:
    """The dataset as inputs: the built files (keyword, math), the directory a user's command builds,
    or whatever a given directory holds."""
    if t.dataset_dir:
        return sorted(str(p) for p in Path(t.dataset_dir).iterdir() if p.is_file())
    if t.dataset_command:
        return [track_dataset_dir(t)]
    return [track_res(t.name, t.data_subdir, f) for f in ("train.jsonl", "val.jsonl")]


def track_corpus(t) -> str:
    """The pretraining corpus of a track that pretrains its own base model."""
    if t.name == KEYWORD_TRACK:
        return res("data", CORPUS_FILE)
    if t.name == MATH_TRACK:
        return track_res(t.name, "data", CORPUS_FILE)
    return f"{track_dataset_dir(t)}/{CORPUS_FILE}"


def track_corpus_inputs(t) -> list:
    """The corpus as an input (a user's command-built corpus: its data directory)."""
    return track_dataset_inputs(t) if t.dataset_command else [track_corpus(t)]


def trains_tokenizer(t) -> bool:
    return (t.pretrains or t.name == KEYWORD_TRACK) and t.pipeline.tokenizer.path is None


def track_tokenizer_inputs(t) -> list:
    """The tokenizer file as an input, unless it is a spec such as 'tiktoken:gpt2'."""
    spec = t.pipeline.tokenizer.path
    if spec is None:
        return [track_res(t.name, "tokenizer", "tokenizer.json")]
    return [spec] if Path(spec).exists() else []


def tokenizer_inputs() -> list:
    """The keyword track's tokenizer (import_base)."""
    return track_tokenizer_inputs(TRACKS[KEYWORD_TRACK])


def pretrain_gpus(t) -> int:
    device = t.pipeline.pretrain.device
    return 1 if device.startswith("cuda") or (device == "auto" and CFG.workflow.gpus_per_colocated > 0) else 0


def track_base(t) -> str:
    """What `--base` gets: a given HF directory or checkpoint, or the track's base/model.pt."""
    return t.base_model or track_res(t.name, "base", "model.pt")


def track_base_inputs(t) -> list:
    if t.base_model:
        hf = Path(t.base_model, "config.json")
        return [str(hf)] if hf.is_file() else [t.base_model]
    return [track_res(t.name, "base", "model.pt")]


def uses_dataset(t, train) -> bool:
    """Whether a run reads the track's dataset (the keyword track's sorting runs do not)."""
    return t.name != KEYWORD_TRACK or train.task == "keyword_inclusion"


def track_threads(t) -> int:
    """A timed track's runs run alone (threads_per_variant); the others share the cores."""
    return CFG.workflow.threads_per_variant if t.timed else CFG.workflow.family_threads


def track_run_outputs(track: str, variant: str) -> dict:
    return {k: track_res(track, "runs", variant, f) for k, f in RUN_FILES.items()}


def run_outputs(variant: str) -> dict:
    """The keyword track's runs: results/runs/<variant>."""
    return track_run_outputs(KEYWORD_TRACK, variant)


def track_variant(wildcards):
    """(Track, resolved train settings) of a train_variant job; resolved once per job, not per
    input and param function that asks."""
    return _track_variant(wildcards.tdir, wildcards.variant)


@cache
def _track_variant(tdir: str, variant: str):
    t = TRACK_BY_DIR[tdir]
    if variant not in t.pipeline.variants:
        raise WorkflowError(f"track {t.name} has no variant '{variant}' ({', '.join(t.pipeline.variants) or 'none'})")
    return t, resolve_variant(t.pipeline, variant)


def train_inputs(wildcards) -> dict:
    t, train = track_variant(wildcards)
    inputs = {"base": track_base_inputs(t), "tests": tests_done()}
    if uses_dataset(t, train):
        inputs["dataset"] = track_dataset_inputs(t)
    return inputs


def train_params(wildcards) -> dict:
    """params of train_variant: the resolved settings (a change reruns the run), --base, --dataset."""
    t, train = track_variant(wildcards)
    return {"train": canonical(ident(train, "train")), "base": track_base(t),
            "dataset": f"--dataset {track_dataset_dir(t)}" if uses_dataset(t, train) else ""}


def train_params_count(t) -> int:
    """Parameters of a track's model (a given HF directory's, else its preset's): what its training
    jobs' memory and time come from (rlpipe.slurm)."""
    return slurm.model_parameters(t.pipeline.model, t.base_model)


def train_mem_mb(wildcards) -> int:
    return slurm.train_mem_mb(train_params_count(track_of(wildcards)))


def train_runtime(wildcards) -> int:
    t, train = track_variant(wildcards)
    return slurm.train_runtime_min(train_params_count(t), train)


def family_mem_mb(wildcards) -> int:
    return slurm.train_mem_mb(train_params_count(family_track(wildcards.family)))


def family_runtime(wildcards) -> int:
    train = resolve_variant(FAMILY_CFG[wildcards.family], wildcards.fvariant)
    return slurm.train_runtime_min(train_params_count(family_track(wildcards.family)), train)


def resume_mode(wildcards) -> str:
    """`rlpipe train --resume`: a forced rerun starts afresh; otherwise (a first run, changed
    settings, --rerun-incomplete after a crash) rlpipe.trainer.resume decides."""
    outs = track_run_outputs(track_of(wildcards).name, wildcards.variant).values()
    return "never" if forced("train_variant", outs) else "auto"


def track_eval_outputs(track: str, model: str) -> dict:
    return {k: track_res(track, "eval", model, f) for k, f in EVAL_FILES.items()}


def eval_inputs(wildcards) -> dict:
    """`rlpipe eval` of a track's base model or of a variant's final policy (its checkpoints/last.pt,
    which is not a declared output: the run's run_info.json stands for it)."""
    t = track_of(wildcards)
    model = track_base_inputs(t) if wildcards.model == "base" else track_run_outputs(t.name, wildcards.model)["info"]
    return {"model": model, "dataset": track_dataset_inputs(t)}


def eval_params(wildcards) -> dict:
    """params of evaluate_model, computed once per job (each param reads one key)."""
    return _eval_params(wildcards.tdir, wildcards.model)


@cache
def _eval_params(tdir: str, model: str) -> dict:
    t = TRACK_BY_DIR[tdir]
    policy = track_base(t) if model == "base" else track_res(t.name, "runs", model, CHECKPOINT_FILE)
    size = f"--n {t.eval_size}" + (f" --max-tokens {t.eval_max_tokens}" if t.eval_max_tokens else "")
    return {"cfg": canonical({"eval": [t.eval_size, t.eval_max_tokens], "train": ident(t.pipeline.train, "train")}),
            "checkpoint": policy, "dataset": track_dataset_dir(t), "size": size}


def eval_gpus(wildcards) -> int:
    return 1 if track_of(wildcards).pipeline.workflow.gpus_per_colocated > 0 else 0


def track_report_inputs(wildcards) -> dict:
    t = track_of(wildcards)
    models = ["base", *t.pipeline.variants]
    return {"evals": [track_eval_outputs(t.name, m)["summary"] for m in models],
            "runs": [track_run_outputs(t.name, v)["metrics"] for v in t.pipeline.variants],
            "code": code_inputs("math-report")}


def track_targets(t) -> list:
    targets = [p for v in t.pipeline.variants for p in track_run_outputs(t.name, v).values()]
    if t.evaluate:
        targets += [track_res(t.name, "report", f) for f in MATH_REPORT_FILES.values()]
    return targets + track_systems_targets(t)  # a user's timed track: its systems figures (tracks.smk)


# A user's timed track compares its variants as the keyword track does (tracks.smk: aggregate_track
# and plot_track_<kind>): its summary, discussion and these figures.
TRACK_FIGURES = ("phase_breakdown", "phase_steps", "timeline", "weight_sync")


def user_timed(t) -> bool:
    """A user's track whose variants are timed alone: it gets the systems comparison."""
    return t.name not in (KEYWORD_TRACK, MATH_TRACK) and t.timed and bool(t.pipeline.variants)


def track_summary_inputs(wildcards) -> dict:
    t = track_of(wildcards)
    runs = [track_run_outputs(t.name, v) for v in t.pipeline.variants]
    return {"info": [r["info"] for r in runs], "metrics": [r["metrics"] for r in runs],
            "code": code_inputs("aggregate")}


def track_systems_targets(t) -> list:
    if not user_timed(t):
        return []
    return [track_res(t.name, "summary", f) for f in (*SUMMARY_FILES.values(), *SUMMARY_REPORT_FILES.values())] + [
        track_res(t.name, "figures", figure_file(k)) for k in TRACK_FIGURES]


# --------------------------------------------------------------------------- figures
# FIGURES (rlpipe.analysis.contract): kind -> Figure; `rlpipe plot KIND` draws it (the function
# registered in rlpipe.analysis.plots.KINDS) and workflow/report/<kind>.rst is its caption.


def figure_path(kind: str) -> str:
    return res("figures", figure_file(kind))


def all_targets() -> list:
    targets = [res("RESULTS.md")]
    targets += [p for t in TRACKS.values() for p in track_targets(t)]
    targets += family_targets()
    if TOY_SORT_SEEDS:
        targets += [res("toy_sort", f) for f in TOY_SORT_FILES.values()]
    if not KEYWORD_ON:
        return targets
    targets += [res("summary", f) for f in SUMMARY_FILES.values()]
    targets += [res("summary", f) for f in SUMMARY_REPORT_FILES.values()]
    targets += [figure_path(k) for k in FIGURES]
    targets += [res("bench", f"{b}.json") for b in BENCH_NAMES]  # bench.smk: trl only where installed
    targets += [res("base", "zero_shot.json")]
    if scaling_on():
        targets += [res("bench", SCALING_REPORT_DIR, f) for f in SCALING_REPORT_FILES.values()]
    return targets


def results_page_inputs() -> list:
    """What the results page reads: the summary table, each evaluated track's evaluations and each
    family's table, for the tracks and families this run has."""
    inputs = [res("summary", SUMMARY_FILES["table_csv"])] if KEYWORD_ON else []
    inputs += [track_eval_outputs(t.name, m)["summary"] for t in TRACKS.values() if t.evaluate
               for m in ["base", *t.pipeline.variants]]
    inputs += [family_res(f, FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["table"]) for f in FAMILIES]
    # what the answers read beyond the tables (rlpipe.analysis.results_view): the main discussion,
    # the math track's report and seed 003's grid, for the parts this run has
    inputs += [res("summary", SUMMARY_FILES["discussion_json"])] if KEYWORD_ON else []
    inputs += [track_res(MATH_TRACK, "report", MATH_REPORT_FILES["math_json"])] if MATH_TRACK in TRACKS else []
    inputs += [res("toy_sort", TOY_SORT_FILES["table_csv"])] if TOY_SORT_SEEDS else []
    return inputs


def _names(names) -> str:
    """A wildcard constraint matching exactly these names ('(?!)', which never matches: none)."""
    return "|".join(sorted(re.escape(n) for n in set(names))) or "(?!)"


wildcard_constraints:
    tdir=tdirs(lambda t: True),
    variant=_names(v for t in TRACKS.values() for v in t.pipeline.variants),
    model=_names(["base", *(v for t in TRACKS.values() if t.evaluate for v in t.pipeline.variants)]),
    family=_names(FAMILIES),
    fvariant=_names(v for c in FAMILY_CFG.values() for v in c.variants),
    fseed=r"\d+",


# --------------------------------------------------------------------------- experiment families
# results/families/<family>/runs/<variant>/seed<seed>/ (RUN_FILES, one `rlpipe train` job each) and
# results/families/<family>/report/ (`rlpipe family-report`, one report section per family).
# A family trains from its track's base model and dataset (the Track record above).


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


def family_track(family: str):
    """The Track a family starts from."""
    return TRACKS[CFG.families[family].base_track]


def _family_job_threads(family: str) -> int:
    """A systems-family replicate compares speed: it runs alone, like a timed track's variants
    (workflow.threads_per_variant); every other replicate takes workflow.family_threads."""
    timed = CFG.families[family].is_systems
    return CFG.workflow.threads_per_variant if timed else CFG.workflow.family_threads


def _family_run_key(family: str, variant: str, seed) -> tuple:
    train = resolve_variant(FAMILY_CFG[family], variant)
    return _run_key(family_track(family).name, train, seed, _family_job_threads(family))


# The owner of a replicate that is one of a track's own runs (results/<track subdir>runs/<variant>).
TRACK_RUN = "(track run)"


def _family_run_owners() -> dict:
    """(family, variant, seed) -> the run that trains it. Identical runs (same track, settings,
    seed and job threads) train once:
    - a replicate identical to one of its track's own runs reads that run (the systems family's
      first seed is results/runs/<variant> when its settings equal the table's: no `base`, and a
      variant that does not override the seed);
    - families share identical replicates: the reference settings of several math families are the
      same run (lr_sweep's lr1e-4 is length_norm's masked_mean, std_norm's std, ...), so it trains
      once, under the first family in config order that has it, and every family's report reads it
      under its own variant name."""
    first = {_run_key(name, tr, tr.seed, track_threads(t)): (TRACK_RUN, name, v)
             for name, t in TRACKS.items() for v in t.pipeline.variants for tr in [resolve_variant(t.pipeline, v)]}
    owners = {}
    for f in FAMILIES:
        for v, s in family_runs(f):
            owners[(f, v, s)] = first.setdefault(_family_run_key(f, v, s), (f, v, s))
    return owners


FAMILY_RUN_OWNER = _family_run_owners()


def family_trained_outputs(family: str, variant: str, seed) -> dict:
    """The run files a family replicate reads: those of the run that trains it."""
    owner, a, b = FAMILY_RUN_OWNER[(family, variant, seed)]
    return track_run_outputs(a, b) if owner == TRACK_RUN else family_run_outputs(owner, a, b)


def family_threads(wildcards) -> int:
    return _family_job_threads(wildcards.family)


def family_train_inputs(wildcards) -> dict:
    t = family_track(wildcards.family)
    inputs = {"base": track_base_inputs(t), "tests": tests_done()}
    if uses_dataset(t, FAMILY_CFG[wildcards.family].train):
        inputs["dataset"] = track_dataset_inputs(t)
    return inputs


def family_base(wildcards) -> str:
    return track_base(family_track(wildcards.family))


def family_dataset_arg(wildcards) -> str:
    t = family_track(wildcards.family)
    return f"--dataset {track_dataset_dir(t)}" if uses_dataset(t, FAMILY_CFG[wildcards.family].train) else ""


def family_variant_train(wildcards) -> str:
    """The replicate's resolved train settings (a params value: a change of an identity key reruns exactly it)."""
    train = resolve_variant(FAMILY_CFG[wildcards.family], wildcards.fvariant)
    return canonical(dict(ident(train, "train"), seed=int(wildcards.fseed)))


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
            "code": code_inputs("family-report")}
