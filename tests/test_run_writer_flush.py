"""The run writer's throttled flush: the rounds of a run write their metrics at most every
``logging.flush_every_s`` seconds; an explicit flush (checkpoint, end of run, failure) always writes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.trainer.run_writer import RunWriter


def _row(step: int) -> dict:
    return {"step": step, "policy_version": step, "wall_time": float(step), "samples": 4 * step}


def _steps_on_disk(d) -> list[int]:
    return sorted(pd.read_parquet(d / contract.METRICS_FILE)["step"].astype(int))


def test_rounds_write_at_most_once_per_interval(tmp_path):
    w = RunWriter(tmp_path, flush_every_s=3600.0)
    w.add_row(_row(0))
    assert w.flush_if_due() is True  # nothing written yet: the first round writes
    w.wait()  # (on the writer thread)
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
        w.wait()
        assert _steps_on_disk(tmp_path) == list(range(step + 1))


# --------------------------------------------------------------------------- the writer thread


def _replay(w: RunWriter, steps: int = 12) -> None:
    """A driver's calls: rows added, then changed after a (background) flush was made, events,
    versions and rollouts, a checkpoint snapshot midway and the final flush."""
    from rlpipe.rl.records import PhaseEvent, VersionEvent

    w.t0 = 1000.0
    w.add_row({"step": 0, "policy_version": 0, "wall_time": 0.0, "samples": 0})
    for step in range(1, steps + 1):
        w.add_row({"step": step, "policy_version": step, "wall_time": step * 0.5, "samples": 8 * step,
                   "_tokens": 40, "loss/policy": 0.1 * step})
        w.add_events([PhaseEvent("update", "learner", 1000.0 + step, 1000.2 + step, step, step - 1)])
        w.add_versions([VersionEvent("learner", step, 1000.2 + step, "optimizer_step")])
        w.flush_if_due()
        w.update_row(step, {"time/update": 0.2, "reward/val_mean": step / 100})  # after the flush was queued
        w.rows[-1].pop("_tokens")
        w.add_rollouts(step, step, [{"prompt": "p", "response": f"r{step}", "reward": 1.0, "ground_truth": "g"}])
        if step == steps // 2:
            w.flush(snapshot=True)
    w.flush()


def _files(d) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_background_writer_writes_what_the_synchronous_one_writes(tmp_path):
    """Same calls, same files byte for byte: the state is copied when the flush is made, so rows the
    loop changes afterwards do not leak into (or tear) a write in progress."""
    a, b = RunWriter(tmp_path / "bg", background=True), RunWriter(tmp_path / "sync", background=False)
    _replay(a)
    _replay(b)
    a.close()
    assert a._thread is None and _files(tmp_path / "bg") == _files(tmp_path / "sync")
    assert len(_files(tmp_path / "bg")) == 8  # the four outputs and their snapshot


def test_a_queued_flush_writes_the_state_at_its_call_and_close_writes_the_rest(tmp_path, monkeypatch):
    import threading

    from rlpipe import io

    go, write = threading.Event(), io.write_parquet

    def held(path, df):  # the writer thread waits until the loop has changed its rows
        assert go.wait(30)
        write(path, df)

    monkeypatch.setattr(io, "write_parquet", held)
    w = RunWriter(tmp_path)
    w.add_row(_row(0))
    w.add_row(_row(1))
    w.flush(wait=False)
    w.update_row(1, {"samples": 999})  # the loop goes on while the write is queued or running
    w.add_row(_row(2))
    go.set()
    w.wait()
    on_disk = pd.read_parquet(tmp_path / contract.METRICS_FILE)
    assert on_disk["step"].tolist() == [0, 1] and on_disk["samples"].tolist() == [0, 4]
    w.flush(wait=False)
    w.close()  # what the end of a run, a failure or a stop call: nothing queued is lost
    assert _steps_on_disk(tmp_path) == [0, 1, 2]
    assert pd.read_parquet(tmp_path / contract.METRICS_FILE)["samples"].tolist() == [0, 999, 8]


def test_a_failed_background_write_is_raised_by_the_loop_s_next_call(tmp_path, monkeypatch):
    from rlpipe import io

    w = RunWriter(tmp_path)
    w.add_row(_row(0))

    def full(path, df):
        raise io.OutputWriteError(f"could not write {path}: No space left on device")

    monkeypatch.setattr(io, "write_parquet", full)
    w.flush(wait=False)
    with pytest.raises(io.OutputWriteError, match="No space left"):
        w.wait()
    monkeypatch.undo()
    w.flush()  # reported once; the next write goes ahead
    assert _steps_on_disk(tmp_path) == [0]
    w.close()


def test_a_process_killed_mid_write_leaves_no_torn_file(tmp_path):
    """SIGKILL while the writer thread rewrites large outputs: each file is the previous complete one
    (or absent), never a torn one; what is left besides is rlpipe.io's temporary files."""
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from rlpipe.trainer.run_writer import RunWriter
        w = RunWriter({str(tmp_path)!r})
        for step in range(3000):
            w.add_row({{"step": step, "policy_version": step, "wall_time": float(step), "samples": step}})
            w.add_rollouts(step, step, [{{"prompt": "p" * 200, "response": "r" * 200, "reward": 1.0,
                                          "ground_truth": "g"}}])
        w.flush()
        for i in range(10):
            w.rows[-1]["samples"] = i
            w.flush(wait=False)
        print("flushing", flush=True)
        time.sleep(float(sys.argv[1]))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    for delay in (0.0, 0.1):
        r = subprocess.run([sys.executable, "-c", code, str(delay)], capture_output=True, text=True, timeout=120)
        assert r.returncode == -signal.SIGKILL and "flushing" in r.stdout, r.stderr
        assert len(pd.read_parquet(tmp_path / contract.METRICS_FILE)) == 3000
        assert len((tmp_path / contract.ROLLOUTS_FILE).read_text().splitlines()) == 3000
        left = [p.name for p in tmp_path.iterdir() if p.name not in contract.RUN_FILES.values()]
        assert all(n.startswith(".") and n.endswith(".tmp") for n in left), left
