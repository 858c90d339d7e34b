"""One disaggregated training run across the two nodes of the test SLURM (tests/slurm/cluster.sh: two
nodes on this host, three fake GPUs each, no accounting), as the workflow's training rule runs it with
``workflow.nodes_per_disaggregated: 2``: an sbatch job with ``--nodes=2``, ``--gpus=2`` and
``--gpus-per-node=1`` whose command is ``python -m rlpipe.ray_slurm --nodes 2 -- rlpipe train ...``
(a Ray head on the first node, a worker on the second, both through srun; the trainer attaches with
``--ray-address``).

The learner and the generator run on different nodes: the run's record of each actor's node (Ray's
node id, and the node's name from the environment SLURM gave its step) against SLURM's record of the
job's nodes. Then a node lost mid-run (its srun step killed: every Ray process of that node dies at
once) ends the run with the error a dead actor gives, naming the node, and the advice to resume;
the rerun resumes from the checkpoint and finishes.

Skipped with the script's reason where SLURM cannot be brought up (failed instead when CI=true),
like tests/test_slurm.py, whose cluster fixture this module shares.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlpipe import slurm

# the fixtures: SLURM up (or skipped with its reason); nothing of a test left running after it
from test_slurm import no_leftovers  # noqa: F401

pytestmark = [pytest.mark.workflow, pytest.mark.ray, pytest.mark.timeout(900)]

NODES = 2
#: what the workflow's training rule asks sbatch for with nodes_per_disaggregated 2 and 2 GPUs
#: (the plugin: `nodes` -> --nodes, `gpu` -> --gpus, `slurm_extra` from rlpipe.slurm.gpus_per_node)
#: Ray's health check declares a silent node dead after 1 s x 3 misses instead of 3 s x 5 (a test-speed
#: setting; sbatch passes the environment on to the head's `ray start`)
FAST_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
SBATCH = ["--nodes=2", "--gpus=2", slurm.gpus_per_node(2, NODES), "--cpus-per-task=1", "--mem=3000", "--time=15"]


@pytest.fixture
def jobs_ray_files():
    """Job ids whose nodes' Ray files (``/tmp/rlray-<job>-<node>``, on this host here) go afterwards."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        for d in Path("/tmp").glob(f"rlray-{job_id}-*"):
            shutil.rmtree(d, ignore_errors=True)


def submit(work: Path, base: tuple[str, str], name: str, ids: list[str]) -> str:
    """sbatch the rule's command (through rlpipe.ray_slurm) in ``work``; the job id (added to ``ids``)."""
    train = [sys.executable, "-m", "rlpipe.cli", "train", "--config", "c.yaml", "--variant", "disagg",
             "--base", base[0], "--dataset", base[1], "--out", "run", "--threads", "1", "--resume", "auto"]
    script = work / f"{name}.sh"
    script.write_text("#!/bin/bash\n" + shlex.join([sys.executable, "-m", "rlpipe.ray_slurm", "--nodes", str(NODES),
                                                     "--", *train]) + "\n")
    out = subprocess.run(["sbatch", "--parsable", *SBATCH, "-D", str(work), "-o", str(work / f"{name}.out"),
                          "-J", f"rlpipe-multinode-{name}", str(script)],
                         capture_output=True, text=True, timeout=60, check=True, env=os.environ | FAST_DEATH)
    ids.append(out.stdout.strip().split(";")[0])
    return ids[-1]


def job(job_id: str) -> dict:
    text = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                          timeout=30).stdout
    jobs = slurm.parse_scontrol(text)
    return jobs[0] if jobs else {}


def wait_done(job_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = job(job_id)
        assert j, f"SLURM has no record of job {job_id}"
        if j["JobState"] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return j
        time.sleep(2)
    subprocess.run(["scancel", job_id], timeout=30)
    raise AssertionError(f"job {job_id} still running after {timeout:.0f} s: {job(job_id)}")


def hostnames(nodelist: str) -> set[str]:
    return set(subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=30).stdout.split())


def workdir(tmp_path: Path, write_config, steps: int = 6) -> Path:
    """A job directory whose config runs ``disagg`` for ``steps`` steps across the two nodes."""
    work = tmp_path / "job"
    work.mkdir()
    write_config(work / "c.yaml", train={"ray_timeout_s": 240},
                 variants={"disagg": {"mode": "disaggregated", "n_grpo_steps": steps}},
                 workflow={"nodes_per_disaggregated": NODES, "gpus_per_disaggregated": 2, "threads_per_variant": 1,
                           "results_dir": str(work / "results")})
    return work


def worker_step(job_id: str, node: str) -> str | None:
    """``<job>.<step>`` of the job's srun step on ``node`` (the Ray worker there)."""
    text = subprocess.run(["squeue", "-s", "-h", "-j", job_id, "-o", "%i %N"], capture_output=True, text=True,
                          timeout=30).stdout
    steps = [s for s, n in (ln.split() for ln in text.splitlines() if len(ln.split()) == 2)
             if n == node and re.fullmatch(rf"{job_id}\.\d+", s)]
    return steps[0] if steps else None


def placed(out: str) -> dict[str, tuple[str, str]]:
    """{role: (SLURM node, Ray node id prefix)} from the run's line saying where each actor landed."""
    line = next(x for x in out.splitlines() if x.startswith("rlpipe train disagg: learner on "))
    return {role: (node, ray_id) for role, node, ray_id in re.findall(r"(\w+) on (\w+) \(Ray node (\w+),", line)}


def test_one_run_spans_both_nodes_and_a_lost_node_is_named_and_resumed(cluster, tmp_path, tiny_base,
                                                                      write_config, jobs_ray_files):
    """Learner and generator on different nodes (Ray's node ids, one on each of SLURM's nodes of the
    job); the node of one killed mid-run: the error names it and advises the resume, and the rerun
    resumes from the checkpoint and finishes, again across both nodes."""
    # ~1 step a second here: the node is killed within seconds of the first checkpoint, long before step 20
    work = workdir(tmp_path, write_config, steps=20)
    job_id = submit(work, tiny_base, "lost", jobs_ray_files)
    checkpoint = work / "run" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 400
    while not checkpoint.exists() and time.monotonic() < deadline:
        assert job(job_id).get("JobState") in ("PENDING", "CONFIGURING", "RUNNING"), (work / "lost.out").read_text()
        time.sleep(0.5)
    assert checkpoint.exists(), (work / "lost.out").read_text()[-3000:]
    first = placed((work / "lost.out").read_text())
    allocated = hostnames(job(job_id)["NodeList"])
    assert {n for n, _ in first.values()} == allocated == {"rlnode1", "rlnode2"}, first
    assert first["learner"][1] != first["generator"][1], first
    # rlnode2 runs the Ray worker (the head, and the driver, are on the first node): kill its whole step
    step = worker_step(job_id, "rlnode2")
    assert step, "no Ray worker step on rlnode2"
    subprocess.run(["scancel", "--signal=KILL", step], check=True, timeout=30)
    record = wait_done(job_id, timeout=300)
    out = (work / "lost.out").read_text()
    assert record["JobState"] == "FAILED", out[-4000:]
    role = next(r for r, (n, _) in first.items() if n == "rlnode2")
    error = out[out.index("rlpipe train disagg: error: "):]
    cls = {"learner": "LearnerWorker", "generator": "GeneratorWorker"}[role]
    assert f"the {role} actor (disagg/{cls}) died: its node rlnode2 (Ray node {first[role][1]}" in error, error[:3000]
    assert "left the Ray cluster (health check failed" in error and "a rerun is safe" in error, error[:3000]
    assert re.search(r"Rerun with --resume to continue from \S*run/checkpoints/last.pt \(optimizer step \d+\)",
                     error), error[:3000]
    # the rerun (the same command: --resume auto) continues from the checkpoint and finishes
    rerun = submit(work, tiny_base, "rerun", jobs_ray_files)
    done = wait_done(rerun, timeout=600)
    again = (work / "rerun.out").read_text()
    assert done["JobState"] == "COMPLETED" and "resuming from" in again, again[-4000:]
    info = json.loads((work / "run" / "run_info.json").read_text())
    assert info["finished"] is True and info["total_optimizer_steps"] == 20
    # Ray's records: two different nodes; SLURM's: the job's two nodes, one actor on each
    nodes = info["nodes"]
    assert nodes["learner"]["node_id"] != nodes["generator"]["node_id"], nodes
    assert {n["node_name"] for n in nodes.values()} == hostnames(done["NodeList"]) == {"rlnode1", "rlnode2"}, nodes
    # each node gave its actor the GPU SLURM put there, one per node (TresPerNode), two for the job
    assert info["gpu_fraction"] == {"learner": 1.0, "generator": 1.0} and info["devices"] == 2, info
    assert "gres:gpu:2" in done.get("TresPerJob", "") and "gpu:1" in done.get("TresPerNode", ""), done
    assert "rlpipe: Ray head on rlnode1" in again


def test_one_node_is_the_command_itself_and_outside_slurm_it_stays_local(tmp_path):
    """--nodes 1 (every other training job) replaces itself with the command: same process, same
    status; --nodes 2 outside an allocation of two nodes says so and runs the command as it is."""
    probe = [sys.executable, "-c", "import os, sys; print(os.getpid(), sys.argv[1:]); sys.exit(3)", "--x"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    code = ("import subprocess, sys; p = subprocess.Popen(sys.argv[1:]); print('launcher', p.pid, flush=True); "
            "sys.exit(p.wait())")
    one = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "rlpipe.ray_slurm", "--nodes", "1", "--",
                          *probe], capture_output=True, text=True, timeout=60, env=env)
    launcher = one.stdout.split()[1]
    assert one.returncode == 3 and f"{launcher} ['--x']" in one.stdout, one.stdout + one.stderr
    two = subprocess.run([sys.executable, "-m", "rlpipe.ray_slurm", "--nodes", "2", "--", *probe],
                         capture_output=True, text=True, timeout=60, env=env)
    assert two.returncode == 3 and "['--x']" in two.stdout, two.stdout + two.stderr
    assert "rlpipe: not in a SLURM allocation of 2 nodes (SLURM_JOB_NUM_NODES=unset)" in two.stdout


def test_the_rule_asks_for_one_gpu_share_per_node():
    assert slurm.gpus_per_node(2, 2) == "--gpus-per-node=1"
    assert slurm.gpus_per_node(4, 2) == "--gpus-per-node=2"
    assert slurm.gpus_per_node(0, 2) == "" and slurm.gpus_per_node(2, 1) == ""


def test_the_nodes_and_the_command_have_ray_s_cluster_support_on(monkeypatch):
    """A submitter whose environment turned Ray's cluster support off (a local Ray instance started in
    it does) passes that on through sbatch; each node and the command get it on again, else the node
    takes 127.0.0.1 and a worker aborts ("Multi-node Ray clusters are not supported")."""
    from rlpipe import ray_slurm

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("SLURM_GPUS", "2")
    env = ray_slurm.step_env()
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1" and env["RAY_AUTH_MODE"] == "token"
    assert "SLURM_GPUS" not in env
