"""The run's phase split (median seconds per step) and GPU busy fraction that go into run_info.json."""

from __future__ import annotations

import math

import pytest

from rlpipe import contract
from rlpipe.trainer.profiling import GpuBusy, phase_split


def _row(step: int, wall: float, **phases: float) -> dict:
    row = {"step": step, "wall_time": wall}
    row.update({contract.metric_time_column(p): math.nan for p in contract.TIMED_PHASES})
    row.update({contract.metric_time_column(p): v for p, v in phases.items()})
    return row


def _full(step: int, wall: float, generate: float, update: float, wait: float = 0.0) -> dict:
    zero = {p: 0.0 for p in contract.TIMED_PHASES}
    return _row(step, wall, **(zero | {"generate": generate, "update": update, "wait": wait}))


def test_phase_split_is_the_per_step_median_with_other_and_step():
    rows = [_row(0, 0.0), _full(1, 1.0, 0.5, 0.3, wait=0.5), _full(2, 3.0, 0.6, 0.4, wait=0.6),
            _full(3, 3.9, 0.4, 0.2, wait=0.4)]
    split = phase_split(list(reversed(rows)))  # any order
    assert set(split) == set(contract.PHASE_SPLIT_KEYS)
    assert split["generate"] == pytest.approx(0.5) and split["update"] == pytest.approx(0.3)
    assert split["wait"] == pytest.approx(0.5)  # reported, but not in the stack that `other` is left of
    assert split["step"] == pytest.approx(1.0)  # steps of 1.0, 2.0 and 0.9 s
    assert split["other"] == pytest.approx(0.3)  # the medians of 1.0 - 0.8, 2.0 - 1.0 and 0.9 - 0.6
    assert split["score"] == 0.0


def test_phase_split_of_a_run_without_trained_steps_is_all_none():
    assert set(phase_split([_row(0, 0.0)]).values()) == {None}


def test_gpu_busy_on_cpu_is_null_with_the_reason():
    busy = GpuBusy(0).start()
    out = busy.stop(since=0.0)
    assert out["busy_fraction"] is None and out["reason"] == "no GPU: the run's device is the CPU"
    assert set(out) == set(contract.GPU_BUSY_KEYS)


def test_gpu_busy_where_nvml_cannot_be_read_is_null_with_the_error():
    def broken():
        raise RuntimeError("NVML Shared Library Not Found")

    out = GpuBusy(1, read=broken).start().stop(since=0.0)
    assert out["busy_fraction"] is None and out["reason"].startswith("NVML cannot be read: RuntimeError: NVML")


def test_gpu_busy_averages_the_samples_of_the_training_loop_per_gpu():
    import time

    values = iter([[0.0, 0.0]] + [[50.0, 100.0]] * 10_000)
    busy = GpuBusy(2, interval_s=0.01, read=lambda: next(values))
    busy.samples = [(0.0, [0.0, 0.0])]  # before the loop's clock started: not counted
    busy.start()
    time.sleep(0.3)
    out = busy.stop(since=1.0)
    assert out["samples"] >= 3 and out["per_device"] == [0.5, 1.0] and out["busy_fraction"] == 0.75


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without a GPU")
def test_gpu_busy_of_a_gpu_job_on_a_machine_without_nvml_says_why():
    out = GpuBusy(1).start().stop(since=0.0)  # the real reader: NVML through torch
    assert out["busy_fraction"] is None and out["reason"].startswith("NVML cannot be read: ")


def test_a_gpu_job_without_nvidia_ml_py_says_so_once_and_starts_no_nvidia_smi(tmp_path):
    """The real reader in a process where ``pynvml`` cannot be imported (as on an image without
    nvidia-ml-py): the sampler does not start, the run's log (stderr) says why once, and no
    ``nvidia-smi`` is started in its place (an ``nvidia-smi`` on PATH records every start)."""
    import os
    import subprocess
    import sys

    calls = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho started >> {calls}\necho 50\n")
    smi.chmod(0o755)
    code = """
import json, sys, time
sys.modules["pynvml"] = None  # `import pynvml` raises ImportError, as without nvidia-ml-py
from rlpipe.trainer.profiling import GpuBusy
busy = GpuBusy(1, interval_s=0.02).start()
time.sleep(0.5)
print(json.dumps(busy.stop(since=0.0)))
"""
    env = {**os.environ, "PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = __import__("json").loads(r.stdout.splitlines()[-1])
    assert out["busy_fraction"] is None and out["reason"].startswith("NVML cannot be read: ModuleNotFoundError")
    assert not calls.exists(), f"nvidia-smi started {len(calls.read_text().split())} times"
    said = [ln for ln in r.stderr.splitlines() if "GPU busy fraction is not sampled" in ln]
    assert len(said) == 1 and "nvidia-ml-py" in said[0], r.stderr[-2000:]


def test_a_sampler_that_loses_nvml_says_so_once():
    import time

    lines: list[str] = []
    values = iter([[10.0], [20.0], [30.0]])
    busy = GpuBusy(1, interval_s=0.01, read=lambda: next(values), log=lines.append).start()
    time.sleep(0.2)  # the iterator runs dry after two samples: StopIteration on every later read
    out = busy.stop(since=0.0)
    assert out["samples"] == 2 and out["reason"] is None  # what was sampled counts
    assert len(lines) == 1 and "NVML stopped answering" in lines[0]


def test_the_summary_reads_the_busy_fraction_from_run_info():
    from rlpipe.analysis.aggregate import gpu_busy

    assert gpu_busy({"gpu_busy": {"busy_fraction": 0.42, "reason": None}}) == 0.42
    assert math.isnan(gpu_busy({"gpu_busy": {"busy_fraction": None, "reason": "no GPU"}}))
    assert math.isnan(gpu_busy({}))  # a run from before the key
