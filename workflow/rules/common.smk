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
from rlpipe.config import ConfigError, parse_config, resolve_variant, to_dict, variant_gpus

# An overlay config (`--configfile config/smoke.yaml`) switches a variant of the base table off with
# `name: null`: Snakemake merges config files key by key, so it could not remove a key otherwise.
config["variants"] = {k: v for k, v in (config.get("variants") or {}).items() if v is not None}

try:
    CFG = parse_config(config)
except ConfigError as e:
    raise WorkflowError(f"invalid rlpipe config: {e}") from None

RESULTS = CFG.workflow.results_dir.rstrip("/")
VARIANTS = list(CFG.variants)
REPO = Path(workflow.basedir)
CONFIG_TEXT = yaml.safe_dump(to_dict(CFG), sort_keys=False)
CONFIG_FILE = f"{RESULTS}/config/pipeline-{hashlib.sha256(CONFIG_TEXT.encode()).hexdigest()[:16]}.yaml"
if not os.path.exists(CONFIG_FILE):
    io.write_text(CONFIG_FILE, CONFIG_TEXT)
# File names of a run directory (RUN_FILES: train_variant's declared outputs), of results/summary
# (SUMMARY_FILES, SUMMARY_REPORT_FILES) and the figures (FIGURES: kind -> Figure(category, title,
# ext)) come from the run-output contract, which the trainer's writer, aggregation, the plots and
# the tests share.
from rlpipe.analysis.contract import (
    FIGURES,
    RUN_FILES,
    SUMMARY_FILES,
    SUMMARY_REPORT_FILES,
    Figure,
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


def reference_variant() -> str:
    """Baseline for speedups: `onpolicy` if configured, else the first colocated_sync variant."""
    if "onpolicy" in CFG.variants:
        return "onpolicy"
    sync = [v for v in VARIANTS if resolve_variant(CFG, v).mode == "colocated_sync"]
    return (sync or VARIANTS or ["onpolicy"])[0]


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
    targets = [res("summary", f) for f in SUMMARY_FILES.values()]
    targets += [res("summary", f) for f in SUMMARY_REPORT_FILES.values()]
    targets += [figure_path(k) for k in FIGURES]
    targets += [res("bench", "weight_sync.json"), res("bench", "sampler.json"), res("base", "zero_shot.json")]
    targets += [res("runs", v, f) for v in VARIANTS for f in RUN_FILES.values()]
    return targets


wildcard_constraints:
    # `(?!)` never matches: an empty variants table must not let {variant} match anything.
    variant="|".join(re.escape(v) for v in VARIANTS) or "(?!)",
