"""Everything checkable is checked when the config is parsed, naming the key or the file and line:
path keys (rlpipe.config.checks), model overrides, and every prompt against the context length
(rlpipe.tasks.prompt_budget), in the workflow before any job."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from rlpipe.config import ConfigError, parse_config, resolve_variant, track_pipeline
from rlpipe.config.checks import MODEL_FIELDS, check_paths
from rlpipe.lm.model import ModelConfig
from rlpipe.lm.tokenizer import train_bpe
from rlpipe.tasks.base import DatasetError
from rlpipe.tasks.prompt_budget import MAX_BYTES_PER_TOKEN, check_prompt_lengths, preset_context_length

ROOT = Path(__file__).resolve().parents[1]
LONG = "x" * 1_000_000


def test_model_fields_are_the_models():
    assert MODEL_FIELDS == tuple(f.name for f in dataclasses.fields(ModelConfig))


@pytest.mark.parametrize("overrides, message", [
    ({"num_layer": 2}, "unknown model field 'model.overrides.num_layer'; did you mean 'num_layers'?"),
    ({"width": 2}, "the model's fields are vocab_size, context_length"),
    ({"d_model": 0}, "model.overrides.d_model: must be a positive integer, got 0"),
    ({"rope_theta": True}, "model.overrides.rope_theta: must be a positive number"),
])
def test_model_overrides_are_checked_against_the_models_fields(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        parse_config({"model": {"overrides": overrides}})
    assert parse_config({"model": {"overrides": {"num_layers": 2, "rope_theta": 500.0}}})


def test_a_missing_input_path_is_named_by_its_key(tmp_path):
    with pytest.raises(ConfigError, match="^data.keywords_path: /nonexistent does not exist$"):
        check_paths(parse_config({"data": {"keywords_path": "/nonexistent"}}))
    with pytest.raises(ConfigError, match="^math.dataset_dir: .* is not a directory$"):
        (tmp_path / "f").write_text("")
        check_paths(parse_config({"math": {"dataset_dir": str(tmp_path / "f")}}))
    with pytest.raises(ConfigError, match="^tokenizer.path: "):
        check_paths(parse_config({"tokenizer": {"path": str(tmp_path / "none.json")}}))
    check_paths(parse_config({"tokenizer": {"path": "tiktoken:gpt2"}, "workflow": {"results_dir": str(tmp_path)}}))


def test_a_run_s_template_and_reward_files_are_checked(tmp_path):
    cfg = parse_config({"workflow": {"results_dir": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"^k/v: train.text.reward: .*/nope.py does not exist$"):
        check_paths(cfg, {"k/v: train": {"text": {"reward": f"{tmp_path}/nope.py:f"}}})
    with pytest.raises(ConfigError, match=r"^k/v: train.text.template_file: "):
        check_paths(cfg, {"k/v: train": {"text": {"template_file": f"{tmp_path}/t.txt"}}})


def test_the_results_directory_must_be_writable(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="^workflow.results_dir: .*file/results is not writable"):
        check_paths(parse_config({"workflow": {"results_dir": str(tmp_path / "file" / "results")}}))
    check_paths(parse_config({"workflow": {"results_dir": str(tmp_path / "new" / "results")}}))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_results_directory_is_named(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(ConfigError, match="^workflow.results_dir: .* is not writable"):
        check_paths(parse_config({"workflow": {"results_dir": str(ro / "results")}}))


def text_track(root: Path, val_prompt: str = "short", train_prompt: str = "short") -> dict:
    """A user's text-task track on a given dataset directory (an overlay)."""
    data = root / "data"
    data.mkdir(parents=True)
    rows = lambda p: "".join(json.dumps({"prompt": q, "answer": "a"}) + "\n" for q in ["one", p, "two"])  # noqa: E731
    (data / "train.jsonl").write_text(rows(train_prompt))
    (data / "val.jsonl").write_text(rows(val_prompt))
    (data / "corpus.txt").write_text("one two three\n<|endoftext|>\nfour five\n")
    (root / "reward.py").write_text("def score(response, truth):\n    return float(truth in response)\n")
    return {"tracks": {"mine": {"dataset_dir": str(data), "train": {
        "task": "text", "sampling_max_tokens": 60, "text": {"reward": f"{root / 'reward.py'}:score"}}}},
            "workflow": {"tracks": ["mine"], "families": [], "toy_sort_seeds": [], "run_tests": False,
                         "bench_scaling": False}}


def _train(overlay: dict):
    cfg = parse_config(overlay)
    return resolve_variant(track_pipeline(cfg, "mine"), "onpolicy")


def test_a_long_validation_prompt_is_named_by_file_and_line(tmp_path):
    overlay = text_track(tmp_path, val_prompt="word " * 300)
    tok = train_bpe(["word one two three short"] * 20, 300, tmp_path / "tok.json")
    assert len(tok.encode("word " * 300)) > 256 - 60 + 1
    with pytest.raises(DatasetError, match=r"/data/val.jsonl:2: the prompt \(1500 characters, \d+ tokens\) does "
                                           r"not fit the model's context length 256 with train.sampling_max_tokens=60"):
        check_prompt_lengths(_train(overlay), tmp_path / "data", 256, str(tmp_path / "tok.json"))
    check_prompt_lengths(_train(overlay), tmp_path / "data", 2048, str(tmp_path / "tok.json"))
    # without a tokenizer the bytes bound refuses only what no tokenizer fits
    check_prompt_lengths(_train(overlay), tmp_path / "data", 256)


def test_a_million_character_training_prompt_is_refused_without_a_tokenizer(tmp_path):
    overlay = text_track(tmp_path, train_prompt=LONG)
    with pytest.raises(DatasetError, match=r"/data/train.jsonl:2: the prompt \(1000000 characters, 3907 tokens at "
                                           rf"least \({MAX_BYTES_PER_TOKEN} bytes per token at most\)"):
        check_prompt_lengths(_train(overlay), tmp_path / "data", preset_context_length("cpu-tiny", {}))
    assert preset_context_length("cpu-tiny", {"context_length": 128}) == 128


# --------------------------------------------------------------------------- the workflow, before any job

def _dry_run(run_snakemake, workdir: Path, overlay: dict, env: dict | None = None):
    """``snakemake -n`` with the overlay (through the tests' dry-run server unless ``env`` changes what
    Python imports: conftest's ``run_snakemake``)."""
    (workdir / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    return run_snakemake(workdir, "-n", "--cores", "1", "--configfile", "overlay.yaml", check=False, env=env)


def _without(tmp_path: Path, module: str) -> dict:
    """An environment whose interpreters cannot import ``module``, as where it is not installed: a
    sitecustomize (first on PYTHONPATH) marks it absent in sys.modules, which importlib's find_spec
    and import both read as "no such module"."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")])))


@pytest.mark.dag
@pytest.mark.parametrize("case, message", [
    ("keywords", "invalid rlpipe config: data.keywords_path: /nonexistent does not exist"),
    ("overrides", "invalid rlpipe config: unknown model field 'model.overrides.num_layer'; did you mean 'num_layers'?"),
    ("prompt", "track mine: {data}/train.jsonl:2: the prompt (1000000 characters"),
    ("tracker", "invalid rlpipe config: logging.trackers names 'mlflow' but the 'mlflow' package is not installed: "
                "pip install -e '.[mlflow]'"),
])
def test_the_workflow_refuses_before_any_job(tmp_path, run_snakemake, case, message):
    """The issue's three cases and a tracker whose package is missing: each refused by `snakemake -n`,
    one line naming the key or file:line;
    the outputs already there are untouched (no job ran, no metadata was recorded)."""
    workdir = tmp_path / "w"
    shutil.copytree(ROOT / "config", workdir / "config")
    corpus = workdir / "results" / "data" / "corpus.txt"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("a good corpus\n")
    overlay = {"keywords": {"data": {"keywords_path": "/nonexistent"}},
               "overrides": {"model": {"overrides": {"num_layer": 2}}},
               "prompt": text_track(tmp_path / "track", train_prompt=LONG),
               "tracker": {"logging": {"trackers": ["mlflow"]}}}[case]
    proc = _dry_run(run_snakemake, workdir, overlay, _without(tmp_path, "mlflow") if case == "tracker" else None)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert message.format(data=tmp_path / "track" / "data") in text, text[-2000:]
    assert "rule " not in text and not (workdir / ".snakemake" / "metadata").exists()
    assert corpus.read_text() == "a good corpus\n"
