"""rlpipe.tasks.keyword.dataset: templates, prompt format, deterministic 80/20 split, JSONL, split report."""

from __future__ import annotations

import json
import re

import pytest

from rlpipe.config import ConfigError, DataConfig, PipelineConfig
from rlpipe.io import read_jsonl
from rlpipe.tasks.keyword.dataset import KeywordExample, build_dataset, load_split, main
from rlpipe.tasks.keyword.prompt import format_keyword_prompt, load_templates
from rlpipe.tasks.keyword.vocabulary import load_keywords, mentions


def _cfg(**data) -> PipelineConfig:
    return PipelineConfig(data=DataConfig(**data))


def test_templates_file():
    templates = load_templates()
    assert len(templates) >= 5 and len(set(templates)) == len(templates)
    assert all("{keywords}" in t for t in templates)
    # Seed 000's example prompt is the first template.
    assert format_keyword_prompt(templates[0], ["apple"]) == "Write a story that includes the word: apple\n"


def test_format_prompt_joins_keywords_and_pluralises():
    t = "Write a story that includes the word{s}: {keywords}"
    assert format_keyword_prompt(t, ["apple", "red"]) == "Write a story that includes the words: apple, red\n"
    assert format_keyword_prompt(t, ["a", "b", "c"]) == "Write a story that includes the words: a, b, c\n"
    with pytest.raises(ValueError):
        format_keyword_prompt(t, [])


def test_bad_template_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("# comment\nWrite about {topic}\n")
    with pytest.raises(ValueError, match="t.txt:2"):
        load_templates(p)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("kw")
    report = build_dataset(_cfg(num_prompts=500, seed=7), out)
    return out, report


def test_split_is_80_20_and_deterministic(dataset, tmp_path):
    out, report = dataset
    train, val = read_jsonl(out / "train.jsonl"), read_jsonl(out / "val.jsonl")
    assert (len(train), len(val)) == (400, 100) and report["counts"] == {"train": 400, "val": 100}
    again = tmp_path / "again"
    build_dataset(_cfg(num_prompts=500, seed=7), again)
    for name in ("train.jsonl", "val.jsonl", "split.json"):
        assert (out / name).read_bytes() == (again / name).read_bytes()
    other = tmp_path / "other"
    build_dataset(_cfg(num_prompts=500, seed=8), other)
    assert (other / "val.jsonl").read_bytes() != (out / "val.jsonl").read_bytes()
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in val})


def test_jsonl_records(dataset):
    out, _ = dataset
    keywords, templates = set(load_keywords()), load_templates()
    for split in ("train", "val"):
        for r in read_jsonl(out / f"{split}.jsonl"):
            assert set(r) == {"prompt", "keywords", "answer", "template"}
            assert len(r["keywords"]) == 1 and r["keywords"][0] in keywords
            assert r["prompt"] == format_keyword_prompt(templates[r["template"]], r["keywords"])
            assert r["prompt"].endswith("\n") and r["prompt"].count("\n") == 1
            assert all(mentions(r["answer"], k) for k in r["keywords"])


def test_split_report_lists_val_only_keywords_and_templates(dataset):
    out, report = dataset
    on_disk = json.loads((out / "split.json").read_text())
    assert on_disk == report
    train_kw = {k for r in read_jsonl(out / "train.jsonl") for k in r["keywords"]}
    val_kw = {k for r in read_jsonl(out / "val.jsonl") for k in r["keywords"]}
    # 100 validation prompts over 400+ keywords: many validation keywords are never trained on.
    assert report["val_only_keywords"] == sorted(val_kw - train_kw) and len(report["val_only_keywords"]) > 10
    assert report["keywords_in_train"] == len(train_kw) and report["keywords_in_val"] == len(val_kw)
    n = len(load_templates())
    assert report["template_count"] == n
    assert report["templates_used"]["train"] == list(range(n))  # 400 draws over n templates
    assert report["seed"] == 7


def test_multi_keyword_prompts(tmp_path):
    build_dataset(_cfg(num_prompts=300, max_keywords_per_prompt=3), tmp_path)
    records = read_jsonl(tmp_path / "train.jsonl") + read_jsonl(tmp_path / "val.jsonl")
    assert {len(r["keywords"]) for r in records} == {1, 2, 3}
    for r in records:
        assert len(set(r["keywords"])) == len(r["keywords"])
        assert ", ".join(r["keywords"]) in r["prompt"]
        assert all(mentions(r["answer"], k) for k in r["keywords"])


def test_load_split(dataset):
    out, _ = dataset
    val = load_split(out, "val")
    assert len(val) == 100 and isinstance(val[0], KeywordExample)
    assert load_split(out, "validation") == val
    with pytest.raises(ValueError, match="split"):
        load_split(out, "test")
    with pytest.raises(FileNotFoundError, match="build-dataset"):
        load_split(out / "missing", "train")


@pytest.mark.parametrize("data, key", [
    ({"val_fraction": 1.5}, "data.val_fraction"),
    ({"val_fraction": 0.0}, "data.val_fraction"),
    ({"num_prompts": 0}, "data.num_prompts"),
    ({"num_prompts": 10**6}, "data.num_prompts"),
    ({"max_keywords_per_prompt": 0}, "data.max_keywords_per_prompt"),
    ({"num_prompts": 2, "val_fraction": 0.1}, "data.val_fraction"),
])
def test_bad_config_fails_before_writing(tmp_path, data, key):
    out = tmp_path / "ds"
    with pytest.raises(ConfigError, match=re.escape(key)):  # from the config itself or from build_dataset
        build_dataset(_cfg(**data), out)
    assert not out.exists()


def test_cli_main(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  num_prompts: 50\n")
    assert main(["--config", str(cfg), "--out", str(tmp_path / "ds")]) == 0
    assert len(load_split(tmp_path / "ds", "train")) == 40
    assert "40 train / 10 val" in capsys.readouterr().out
