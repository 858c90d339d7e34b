# Helpers shared by every rule file. The config is parsed ONCE by rlpipe.config (the single source
# of truth for defaults, validation, variant resolution and GPU counts); rules only read `CFG`.
#
# Rerun policy (why params look the way they do): every command reads the one resolved config file
# written by `write_config`, which it takes as an `ancient()` input, so rewriting that file after
# an unrelated edit triggers nothing. Instead each rule declares the config sections it depends on
# as `params`, and Snakemake's params rerun trigger reruns exactly the stages whose settings
# changed: editing `train.*` or one variant reruns the affected variants, not pretraining.

import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
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
RUN_FILES = {
    "metrics": "metrics.parquet",
    "events": "events.parquet",
    "versions": "versions.parquet",
    "rollouts": "rollouts.jsonl",
    "info": "run_info.json",
}
SUMMARY_FILES = {
    "metrics": "metrics.parquet",
    "events": "events.parquet",
    "versions": "versions.parquet",
    "rollouts": "rollouts.parquet",
    "runs": "runs.parquet",
    "weight_sync": "weight_sync.parquet",
    "table_csv": "summary.csv",
    "discussion_json": "discussion.json",
}


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


def variant_fingerprint(variant: str) -> str:
    """Hash of everything that defines a run. A checkpoint is resumed only when it carries the
    same fingerprint (a crashed run of the same settings), never after the settings changed."""
    payload = {"train": variant_train(variant), "model": to_dict(CFG.model), "variant": variant}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


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


def tokenizer_arg() -> str:
    return CFG.tokenizer.path or res("tokenizer", "tokenizer.json")


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
@dataclass(frozen=True)
class Figure:
    category: str
    title: str
    ext: str = "png"


# kind -> figure; `rlpipe plot KIND` draws it and workflow/report/<kind>.rst is its caption.
# Adding a figure is one entry here plus a function registered in rlpipe.analysis.plots.KINDS.
FIGURES = {
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
}


def figure_path(kind: str) -> str:
    return res("figures", f"{kind}.{FIGURES[kind].ext}")


def all_targets() -> list:
    targets = [res("summary", f) for f in SUMMARY_FILES.values()]
    targets += [res("summary", "summary.html"), res("summary", "discussion.html")]
    targets += [figure_path(k) for k in FIGURES]
    targets += [res("bench", "weight_sync.json"), res("bench", "sampler.json"), res("base", "zero_shot.json")]
    targets += [res("runs", v, f) for v in VARIANTS for f in RUN_FILES.values()]
    return targets


wildcard_constraints:
    # `(?!)` never matches: an empty variants table must not let {variant} match anything.
    variant="|".join(re.escape(v) for v in VARIANTS) or "(?!)",
