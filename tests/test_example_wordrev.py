"""The word-list reversal example (examples/wordrev/): its data generator, its reward, and that the
generic text task runs its overlay's track unchanged."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rlpipe.config import apply_overrides, load_yaml, parse_config, workflow_tracks
from rlpipe.tasks.registry import check_task

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "wordrev"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"wordrev_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_data = _module("make_data")
reward = _module("reward").reward


def _build(out: Path, seed: int, **sizes) -> dict[str, int]:
    sizes = {"n_train": 40, "n_val": 20, "n_corpus": 200, "slip": 0.35, **sizes}
    return make_data.build(out, seed, **sizes)  # the default word count and drill fraction


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generator_is_deterministic_and_its_files_parse(tmp_path):
    _build(tmp_path / "a", 3)
    _build(tmp_path / "b", 3)
    _build(tmp_path / "c", 4)
    for name in ("train.jsonl", "val.jsonl", "corpus.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "val.jsonl").read_bytes() != (tmp_path / "c" / "val.jsonl").read_bytes()
    train, val = _rows(tmp_path / "a" / "train.jsonl"), _rows(tmp_path / "a" / "val.jsonl")
    assert (len(train), len(val)) == (40, 20)
    for row in train + val:
        words = row["words"].split()
        assert 3 <= len(words) <= 5 and len(set(words)) == len(words)
        assert set(words) <= set(make_data.vocabulary(make_data.VOCAB)) and row["answer"].split() == words[::-1]
    assert not {r["words"] for r in val} & {r["words"] for r in train}
    assert not list(tmp_path.glob("a/.*"))  # no temporary file left behind


def test_corpus_is_prompt_plus_response_with_the_asked_fractions_of_slips_and_drills(tmp_path):
    stats = _build(tmp_path, 0, n_corpus=3000, slip=0.3, drills=0.4)
    docs = [d for d in (tmp_path / "corpus.txt").read_text().split(make_data.DOC_SEPARATOR) if d]
    assert len(docs) == stats["documents"] == 3000
    val_lists = {r["words"] for r in _rows(tmp_path / "val.jsonl")}
    template = (EXAMPLE / "template.txt").read_text()
    wrong = drills = 0
    for doc in docs:
        prompt, response = doc.split(":")
        words = prompt.removeprefix("Reverse ")
        assert prompt + ":" == template.format(words=words) and words not in val_lists
        scored = reward(response, " ".join(reversed(words.split())))
        assert scored["format_reward"] == 1.0
        if len(words.split()) < make_data.MIN_WORDS:
            drills += 1
            assert scored["answer_reward"] == 1.0  # drills are never slipped
        else:
            wrong += scored["answer_reward"] == 0.0
    assert wrong == stats["wrong"] and 0.25 < wrong / (len(docs) - drills) < 0.35
    assert 0.35 < drills / len(docs) < 0.45
    assert _build(tmp_path / "clean", 0, n_corpus=300, slip=0.0)["wrong"] == 0


@pytest.mark.parametrize(("response", "fmt", "ans"), [
    (" road gold fish lamp.", 1, 1),
    ("road gold fish lamp.\n", 1, 1),
    (" road gold fish lamp", 0, 0),       # no stop
    (" road fish gold lamp.", 1, 0),      # a swapped pair
    (" road gold lamp.", 1, 0),           # a dropped word
    (" lamp fish gold road.", 1, 0),      # forward order
    (" road gold fish lamp lamp.", 1, 0),
    (" road, gold fish lamp.", 0, 0),
    (" Road gold fish lamp.", 0, 0),
    (" road gold fish lamp. road", 0, 0),
    ("", 0, 0),
])
def test_reward_scores_exact_reversal_only(response, fmt, ans):
    assert reward(response, "road gold fish lamp") == {"reward": ans, "format_reward": fmt, "answer_reward": ans}


def test_the_overlays_text_task_runs_the_example(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the overlay's paths are relative to the repository root
    overlay = load_yaml(EXAMPLE / "config.yaml")
    cfg = parse_config(apply_overrides(load_yaml(ROOT / "config/config.yaml"), overlay))
    train = workflow_tracks(cfg)["wordrev"].pipeline.train
    _build(tmp_path, 0)
    task = check_task(train, tmp_path)  # every line, the template, and the reward on examples
    ex = task.val_examples()[0]
    assert ex.prompt == f"Reverse {' '.join(reversed(ex.ground_truth.split()))}:"
    assert task.reward(f" {ex.ground_truth}.", ex.ground_truth)["reward"] == 1.0
    assert task.stop == (".",) and task.include_stop_str_in_output
