"""logging.trackers: [tensorboard]: the run writer mirrors metric rows to TensorBoard scalars (a live
view; metrics.parquet stays the contract), once per step, resumed runs without duplicates, and a
missing package is a config error before any work."""

from __future__ import annotations

import importlib.util
import math

import pytest

from rlpipe import contract
from rlpipe.config import ConfigError, parse_config
from rlpipe.config.checks import check_trackers
from rlpipe.trainer.run_writer import RunWriter
from rlpipe.trainer.trackers import open_trackers

pytest.importorskip("tensorboard")


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def row(step: int, **values) -> dict:
    return {"step": step, "policy_version": step, "wall_time": float(step), "samples": 32 * step, **values}


def tb_writer(run_dir) -> RunWriter:
    return RunWriter(run_dir, trackers=open_trackers(["tensorboard"], run_dir, run_dir.parent, "v", 0, {}))


def test_rows_become_namespaced_scalars_once_each_and_nan_is_skipped(tmp_path):
    w = tb_writer(tmp_path)
    w.add_row(row(0, **{"reward/val_mean": 0.25}))
    w.add_row(row(1, **{"reward/train_mean": 0.5, "loss/clip_frac": 0.1}))
    w.flush()
    w.add_row(row(2, **{"reward/train_mean": 0.75, "reward/val_mean": 0.5}))
    w.flush()
    w.flush()  # nothing new: no step is written twice
    w.finish({"variant": "v"})  # the trackers' process has logged everything handed to it
    got = scalars(tmp_path / contract.TENSORBOARD_DIR)
    assert got["reward/train_mean"] == [(1, 0.5), (2, 0.75)]
    assert got["reward/val_mean"] == [(0, 0.25), (2, 0.5)]  # NaN at step 1 (not measured) is skipped
    assert got["loss/clip_frac"] == [(1, pytest.approx(0.1))]
    assert "step" not in got and set(got) <= set(contract.METRIC_COLUMNS)
    assert all(math.isfinite(v) for pts in got.values() for _, v in pts)


def test_off_by_default_writes_no_event_files(tmp_path):
    w = RunWriter(tmp_path)
    w.add_row(row(0, **{"reward/val_mean": 0.25}))
    w.flush()
    assert not (tmp_path / contract.TENSORBOARD_DIR).exists()
    assert parse_config({}).logging.trackers == []


def test_the_former_tensorboard_key_folds_into_trackers():
    assert parse_config({"logging": {"tensorboard": True}}).logging.trackers == ["tensorboard"]
    assert parse_config({"logging": {"tensorboard": True, "trackers": ["wandb"]}}).logging.trackers == [
        "wandb", "tensorboard"]
    assert parse_config({"logging": {"tensorboard": False}}).logging.trackers == []
    with pytest.raises(ConfigError, match=r"logging\.tensorboard is false but logging\.trackers names"):
        parse_config({"logging": {"tensorboard": False, "trackers": ["tensorboard"]}})


def test_a_resumed_run_continues_after_the_last_logged_step(tmp_path):
    w = tb_writer(tmp_path)
    for s in range(4):
        w.add_row(row(s, **{"reward/train_mean": float(s)}))
    w.flush(snapshot=True)  # a checkpoint of step 3 (and the tracker logs 0..3) ...
    w.finish({"variant": "v"})  # ... before the run is killed
    resumed = tb_writer(tmp_path)
    resumed.resume_from(2)  # from an earlier checkpoint: step 3 is computed again
    for s in (3, 4):
        resumed.add_row(row(s, **{"reward/train_mean": float(s)}))
    resumed.finish({"variant": "v"})
    got = scalars(tmp_path / contract.TENSORBOARD_DIR)
    assert [s for s, _ in got["reward/train_mean"]] == [0, 1, 2, 3, 4]  # every step once


def test_missing_package_is_a_config_error_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logging\.trackers names 'tensorboard'.*pip install -e '\.\[tb\]'"):
        check_trackers(parse_config({"logging": {"tensorboard": True}}))
