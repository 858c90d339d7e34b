"""The run writer's throttled flush: the rounds of a run write their metrics at most every
``logging.flush_every_s`` seconds; an explicit flush (checkpoint, end of run, failure) always writes."""

from __future__ import annotations

import pandas as pd

from rlpipe.analysis import contract
from rlpipe.trainer.run_writer import RunWriter


def _row(step: int) -> dict:
    return {"step": step, "policy_version": step, "wall_time": float(step), "samples": 4 * step}


def _steps_on_disk(d) -> list[int]:
    return sorted(pd.read_parquet(d / contract.METRICS_FILE)["step"].astype(int))


def test_rounds_write_at_most_once_per_interval(tmp_path):
    w = RunWriter(tmp_path, flush_every_s=3600.0)
    w.add_row(_row(0))
    assert w.flush_if_due() is True  # nothing written yet: the first round writes
    w.add_row(_row(1))
    assert w.flush_if_due() is False  # within the interval: the round does not stall on a rewrite
    assert _steps_on_disk(tmp_path) == [0]
    w.flush()  # what checkpoints, the end of the run and a failure call: always writes
    assert _steps_on_disk(tmp_path) == [0, 1]


def test_zero_interval_writes_every_round(tmp_path):
    w = RunWriter(tmp_path, flush_every_s=0.0)
    for step in range(3):
        w.add_row(_row(step))
        assert w.flush_if_due() is True
        assert _steps_on_disk(tmp_path) == list(range(step + 1))
