# Helpers shared by every rule file. The config is parsed ONCE by rlpipe.config (the single source
# of truth for defaults, validation, variant resolution and GPU counts); rules only read `CFG`.
#
# `snakemake --lint` asks for a conda environment or container per job. rlpipe has none on purpose:
# every rule runs the `rlpipe` command of the package installed in the project's virtual environment
# (README set-up), so pyproject.toml pins the software of all rules at once. Each rule carries a
# `# lint: conda` comment pointing here; that is the only lint left.
#
# Rerun policy (why params look the way they do): every command reads the one resolved config file
# written by `write_config`, which it takes as an `ancient()` input, so rewriting that file after
# an unrelated edit triggers nothing. Instead each rule declares the config sections it depends on
# as `params`, and Snakemake's params rerun trigger reruns exactly the stages whose settings
# changed: editing `train.*` or one variant reruns the affected variants, not pretraining.

import importlib.util
import os
import re
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

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
CONFIG_FILE = f"{RESULTS}/config/pipeline.yaml"
CONFIG_TEXT = yaml.safe_dump(to_dict(CFG), sort_keys=False)
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


def section_params(*sections: str) -> dict:
    """The config sections a stage depends on (a params value: a change reruns the stage)."""
    return {s: to_dict(getattr(CFG, s)) for s in sections}


def variant_train(variant: str) -> dict:
    return to_dict(resolve_variant(CFG, variant))


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
        "config": ancient(CONFIG_FILE),
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
