"""Actors Ray could never place fail the run at once, naming what they asked for
(``rlpipe.trainer.drivers.placement``), and a job given GPUs starts Ray with them so its actors are
placed (``rlpipe train`` under a scheduler's ``CUDA_VISIBLE_DEVICES``, on CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlpipe.trainer.drivers import actor_errors, placement
from rlpipe.trainer.drivers.placement import PlacementError, check, shortfall

LEARNER, GENERATOR = "learner actor (v/LearnerWorker)", "generator actor (v/GeneratorWorker)"


def test_asks_that_fit_pass():
    assert shortfall({LEARNER: {"CPU": 1, "GPU": 0.5}, GENERATOR: {"CPU": 1, "GPU": 0.5}},
                     {"CPU": 3.0, "GPU": 1.0}) is None
    assert shortfall({LEARNER: {"CPU": 1, "GPU": 0}}, {"CPU": 1.0}) is None  # no GPU asked, none there


def test_a_gpu_ray_never_counted_is_named_with_each_ask(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(PlacementError) as e:
        check({LEARNER: {"CPU": 1, "GPU": 1}, GENERATOR: {"CPU": 1, "GPU": 1}}, {"CPU": 3.0})
    msg = str(e.value)
    assert "ask Ray for 2 GPU" in msg and f"{LEARNER}: 1" in msg and f"{GENERATOR}: 1" in msg
    assert "has 0 GPU" in msg and "CUDA_VISIBLE_DEVICES='1'" in msg


def test_a_worker_that_never_joins_is_named_with_the_nodes_that_did(monkeypatch):
    """A run across nodes waits for them (bounded), then names who joined and where each node's
    output is (rlpipe.ray_slurm's state directory), instead of running on fewer nodes."""
    head = {"NodeID": "ab" * 28, "NodeManagerAddress": "10.0.0.1", "Alive": True}
    monkeypatch.setattr(placement, "alive_nodes", lambda: [head])
    monkeypatch.setenv("RLPIPE_RAY_LOGS", "logs/ray/42")
    with pytest.raises(PlacementError) as e:
        placement.wait_for_nodes(2, timeout_s=0)
    msg = str(e.value)
    assert "needs 2 Ray nodes (workflow.nodes_per_disaggregated) but only 1 joined" in msg
    assert "10.0.0.1 (abababab)" in msg and "logs/ray/42/<node>.log" in msg and "RAY_AUTH_MODE=token" in msg
    monkeypatch.setattr(placement, "alive_nodes", lambda: [head, head | {"NodeID": "cd" * 28}])
    placement.wait_for_nodes(2, timeout_s=0)  # both there: no wait, no error


def test_a_lost_node_is_named_once_ray_declares_it_dead(monkeypatch):
    node = {"node_id": "ef" * 28, "node_name": "gpu07", "address": "10.0.0.7"}
    state = {"NodeID": node["node_id"], "Alive": True}
    monkeypatch.setattr(actor_errors.ray, "nodes", lambda: [state])
    assert actor_errors.node_lost(node, wait_s=0) is None  # alive: not a node loss
    state.update(Alive=False, DeathReasonMessage="health check failed due to missing too many heartbeats")
    cause = actor_errors.node_lost(node, wait_s=0)
    assert cause.case == ("died: its node gpu07 (Ray node efefefef, 10.0.0.7) left the Ray cluster "
                          "(health check failed due to missing too many heartbeats)")
    assert "a rerun is safe" in cause.advice


def test_cpu_shares_above_the_instance_are_named():
    why = shortfall({LEARNER: {"CPU": 2}, GENERATOR: {"CPU": 2}}, {"CPU": 3.0, "GPU": 2.0})
    assert why and "ask Ray for 4 CPU" in why and "ray.num_cpus" in why


@pytest.mark.ray
def test_a_job_given_gpus_places_its_actors(tmp_path, tiny_base, write_config):
    """A scheduler's allocation (SLURM's CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS) on a node whose GPUs
    Ray cannot count (none here): Ray is started with the job's GPUs, the colocated worker asks for one
    and is placed, and the run (on CPU) finishes. Before, Ray counted 0 GPUs and the worker waited
    unplaced until the driver's timeout."""
    cfg = write_config(tmp_path / "c.yaml", train={"n_grpo_steps": 2, "ray_timeout_s": 60},
                       variants={"onpolicy": {"mode": "colocated_sync"}},
                       workflow={"gpus_per_colocated": 1, "threads_per_variant": 1,
                                 "results_dir": str(tmp_path / "results")})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "1", "SLURMD_NODENAME": "n1"}
    cmd = [sys.executable, "-m", "rlpipe.cli", "train", "--config", str(cfg), "--variant", "onpolicy",
           "--out", str(tmp_path / "run"), "--base", tiny_base[0], "--dataset", tiny_base[1], "--threads", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.parquet").exists()
