"""Tracks as data: a user's track (the ``tracks`` table) is refused with a message naming the key
when it is wrong, derives the same Track record the built-in tracks do, and the workflow plans its
whole chain (data command, tokenizer, pretraining, runs, evaluations, report) and families on it
with one path scheme, next to unchanged keyword and math paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from rlpipe.config import ConfigError, active_families, family_pipeline, parse_config, workflow_tracks

ROOT = Path(__file__).resolve().parents[1]

REWARD = "def reward(response, ground_truth):\n    return float(ground_truth in response)\n"


def _track(**over) -> dict:
    track = {"dataset_command": "python make.py --out {out}",
             "train": {"task": "text", "text": {"template": "Q {q} A", "reward": "rw.py:reward"}},
             "variants": {"onpolicy": {"mode": "colocated_sync"}, "k2": {"mode": "colocated_k", "k": 2}}}
    return {**track, **over}


def _config(**tracks) -> dict:
    return {"workflow": {"tracks": ["keyword", *tracks]}, "variants": {"onpolicy": {}}, "tracks": tracks,
            "families": {"sys": {"track": next(iter(tracks)), "systems": True},
                         "lr": {"track": next(iter(tracks)), "variants": {"a": {"learning_rate": 1e-4},
                                                                          "b": {"learning_rate": 1e-3}}}}}


def test_a_users_track_is_a_track_record_like_the_built_in_ones():
    cfg = parse_config(_config(mine=_track()))
    tracks = workflow_tracks(cfg)
    assert [t.subdir for t in tracks.values()] == ["", "tracks/mine/"]
    mine = tracks["mine"]
    assert mine.pretrains and mine.evaluate and mine.timed and mine.dataset_command
    assert mine.pipeline.train.task == "text" and list(mine.pipeline.variants) == ["onpolicy", "k2"]
    assert mine.pipeline.train.n_grpo_steps == cfg.train.n_grpo_steps  # the shared train section + overrides
    assert active_families(cfg) == ["sys", "lr"]
    assert list(family_pipeline(cfg, "sys").variants) == ["onpolicy", "k2"]  # the track's table
    assert family_pipeline(cfg, "lr").train.task == "text"


@pytest.mark.parametrize("change,match", [
    ({"workflow": {"tracks": ["keyword", "nope"]}}, r"workflow\.tracks: unknown track 'nope'; known tracks: "
                                                    r"keyword, math, mine"),
    ({"families": {"f": {"track": "nope", "variants": {"a": {}}}}}, r"families\.f\.track: unknown track 'nope'"),
    ({"tracks": {"math": _track()}}, r"tracks\.math: 'math' is a built-in track name"),
    ({"tracks": {"mine": _track(dataset_dir="d")}}, r"tracks\.mine.*give exactly one"),
    ({"tracks": {"mine": _track(dataset_command="make")}}, r"tracks\.mine\.dataset_command must contain '\{out\}'"),
    ({"tracks": {"mine": _track(train={"task": "text", "lerning_rate": 1})}}, r"tracks\.mine\.train"),
    ({"tracks": {"mine": _track(variants={"a": {"k": 4}})}}, r"tracks\.mine\.variants\.a"),
    ({"tracks": {"mine": _track(bogus=1)}}, r"tracks\.mine\.bogus"),
    ({"tracks": {"bad name": _track()}}, r"tracks: name 'bad name'"),
])
def test_a_wrong_track_names_its_key(change, match):
    data = {**_config(mine=_track()), **change}
    if "workflow" not in change:
        data["workflow"] = {"tracks": ["keyword", *data["tracks"]]}
    if "families" not in change:
        data["families"] = {}
    with pytest.raises(ConfigError, match=match):
        parse_config(data)


# --------------------------------------------------------------------------- the workflow


@pytest.fixture
def track_workdir(tmp_path) -> Path:
    shutil.copytree(ROOT / "config", tmp_path / "config")
    (tmp_path / "rw.py").write_text(REWARD)
    overlay = {"workflow": {"tracks": ["mine"], "run_tests": False, "bench_scaling": False, "toy_sort_seeds": []},
               "tracks": {"mine": _track()},
               "families": {k: None for k in yaml.safe_load((ROOT / "config/config.yaml").read_text())["families"]}}
    overlay["families"].update(_config(mine=_track())["families"])
    (tmp_path / "config" / "mine.yaml").write_text(yaml.safe_dump(overlay))
    return tmp_path


@pytest.mark.dag
def test_the_workflow_plans_a_users_track_its_families_and_report_with_one_path_scheme(track_workdir, dry_run,
                                                                                        run_snakemake):
    out = run_snakemake(track_workdir, "-n", "--configfile", "config/config.yaml", "config/mine.yaml").stdout
    jobs = dry_run.jobs(out)
    by_rule = {}
    for j in jobs:
        by_rule.setdefault(j["rule"], []).append(j)
    assert {j["wildcards"]["tdir"] for r in ("build_track_data", "train_tokenizer", "pretrain_base", "train_variant",
                                             "evaluate_model", "report_track") for j in by_rule[r]} == {"tracks/mine/"}
    assert sorted(j["wildcards"]["variant"] for j in by_rule["train_variant"]) == ["k2", "onpolicy"]
    assert sorted(j["wildcards"]["model"] for j in by_rule["evaluate_model"]) == ["base", "k2", "onpolicy"]
    # the systems family's first seed is the track's own runs; the ablation trains its two variants
    assert sorted((j["wildcards"]["family"], j["wildcards"]["fvariant"]) for j in by_rule["train_family_run"]) == [
        ("lr", "a"), ("lr", "b")]
    assert {j["wildcards"]["family"] for j in by_rule["report_family"]} == {"sys", "lr"}
    assert not set(by_rule) & {"build_math_data", "build_keyword_dataset", "aggregate_metrics", "bench_trl"}
    assert "results/tracks/mine/runs/k2/metrics.parquet" in out and "logs/train_variant/tracks/mine/k2.log" in out
    assert "write_results_page" in by_rule


@pytest.mark.dag
def test_a_given_dataset_is_checked_when_the_workflow_parses(track_workdir, run_snakemake):
    data = track_workdir / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"x": 1, "answer": "1"}) + "\n")
    (data / "val.jsonl").write_text(json.dumps({"x": 2, "answer": "2"}) + "\n")
    (data / "corpus.txt").write_text("Q 1 A 1\n")
    overlay = yaml.safe_load((track_workdir / "config" / "mine.yaml").read_text())
    overlay["tracks"]["mine"].pop("dataset_command")
    overlay["tracks"]["mine"]["dataset_dir"] = str(data)
    (track_workdir / "config" / "mine.yaml").write_text(yaml.safe_dump(overlay))
    proc = run_snakemake(track_workdir, "-n", "--configfile", "config/config.yaml", "config/mine.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "track mine:" in text and "train.jsonl:1" in text and "'q'" in text, text[-2000:]
