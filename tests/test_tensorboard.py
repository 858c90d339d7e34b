"""logging.tensorboard: the run writer mirrors metric rows to TensorBoard scalars (a live view;
metrics.parquet stays the contract), once per step, resumed runs without duplicates, and a missing
package is a config error before any work."""

from __future__ import annotations

import builtins
import math

import pytest

from rlpipe.analysis import contract
from rlpipe.config import ConfigError, parse_config
from rlpipe.trainer import tensorboard
from rlpipe.trainer.run_writer import RunWriter

pytest.importorskip("tensorboard")


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def row(step: int, **values) -> dict:
    return {"step": step, "policy_version": step, "wall_time": float(step), "samples": 32 * step, **values}


def test_rows_become_namespaced_scalars_once_each_and_nan_is_skipped(tmp_path):
    w = RunWriter(tmp_path, tensorboard=True)
    w.add_row(row(0, **{"reward/val_mean": 0.25}))
    w.add_row(row(1, **{"reward/train_mean": 0.5, "loss/clip_frac": 0.1}))
    w.flush()
    w.add_row(row(2, **{"reward/train_mean": 0.75, "reward/val_mean": 0.5}))
    w.flush()
    w.flush()  # nothing new: no step is written twice
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
    assert parse_config({}).logging.tensorboard is False


def test_a_resumed_run_continues_after_the_checkpoint_step(tmp_path):
    w = RunWriter(tmp_path, tensorboard=True)
    for s in range(3):
        w.add_row(row(s, **{"reward/train_mean": float(s)}))
    w.flush(snapshot=True)  # the checkpoint of step 2 snapshots rows 0..2
    resumed = RunWriter(tmp_path, tensorboard=True)
    resumed.resume_from(2)
    resumed.add_row(row(3, **{"reward/train_mean": 3.0}))
    resumed.flush()
    got = scalars(tmp_path / contract.TENSORBOARD_DIR)
    assert [s for s, _ in got["reward/train_mean"]] == [0, 1, 2, 3]  # 0..2 once, from the first writer


def test_missing_package_is_a_config_error_naming_the_key(monkeypatch):
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ConfigError, match=r"logging\.tensorboard.*pip install -e '\.\[tb\]'"):
        tensorboard.check_available()
