"""One training job across the nodes of its SLURM allocation: a Ray head on the first node, a Ray
worker on each other one, and the training command attached to them through ``ray.address``.

    python -m rlpipe.ray_slurm --nodes 2 -- rlpipe train --config C --variant V ...

The workflow's training rule runs its command through this when ``workflow.nodes_per_disaggregated``
is above 1 (``rlpipe.slurm.train_launcher``). It follows Ray's own SLURM deployment pattern (Ray's
docs, "Deploying on Slurm"): ``srun --nodes=1 --ntasks=1 -w <first node> ray start --head --block``,
then ``srun --nodes=1 --ntasks=1 -w <node> ray start --address=<head> --block`` on each other node,
then the driver on the first node (where the batch script runs). The command is run with
``--ray-address <head>`` appended, and the trainer waits until every node has joined before it
places its actors (``rlpipe.trainer.drivers.placement``).

Where it departs from that pattern, and why:
- each ``ray start`` goes through ``python -m rlpipe.ray_slurm node`` inside its srun step, which
  counts the step's GPUs from ``CUDA_VISIBLE_DEVICES`` (SLURM's allocation: Ray's own count sees only
  the GPUs its NVML query finds), its CPUs from ``SLURM_CPUS_PER_TASK``, takes the node's address
  from Ray's own resolver and picks free ports on that node: Ray's fixed defaults (the GCS at 6379,
  the dashboard agent at 52365, the client server at 10001) collide between two nodes of one host
  (the tests' cluster) and with other users' Ray instances on a shared node;
- the head writes its address to a file in the state directory (``logs/ray/<job id>/`` of the job's
  working directory, which every node shares as Snakemake's does), and the workers start once the
  head answers there, instead of after a fixed ``sleep``; each step's output is in that directory
  (``<node>.log``), where a worker that cannot join says why;
- each step's environment lacks the job's ``SLURM_GPUS`` (the allocation's total), and the step asks
  for ``--gpus-per-node`` instead: srun reads ``SLURM_GPUS`` and would ask one node for the whole
  total ("Invalid generic resource (gres) specification");
- every node and the driver run with ``RAY_AUTH_MODE=token``: Ray 2.60 refuses a node or a driver
  without it ("Authentication token is missing or incorrect"). The token is the file ``ray start
  --head`` writes (``~/.ray/auth_token``) or ``RAY_AUTH_TOKEN``: every node must see the same one;
- when the command ends, however it ends, the steps are stopped (srun's double interrupt, which
  kills a step's tasks); never ``ray stop``, which would stop every Ray instance of the user on the
  node, other jobs' included. Each node's Ray files are under ``/tmp/rlray-<job id>-<node>``.

With ``--nodes 1`` (every other training job) it replaces itself with the command (``exec``).
Outside a SLURM allocation of that many nodes (a local run of the same config) the command runs as
it is, on a local Ray instance, after one line saying so.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

#: the file in the state directory where the head writes "<ip>:<port>"
HEAD_FILE = "head_address"
#: how long the head may take to answer (Ray's start-up is ~15 s on two loaded cores)
HEAD_TIMEOUT_S = 180.0
#: how long the steps get to end after the command before srun is killed
STOP_WAIT_S = 20.0
#: cluster support on whatever the submitter's environment says (sbatch passes it on; with it off a node
#: takes 127.0.0.1 and a worker refuses to join; rlpipe.trainer.local_ray.loopback_only restores it after its
#: own local instance starts, but a user's shell may still have it off)
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_worker_niceness": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}


class LaunchError(RuntimeError):
    """The Ray cluster of the allocation could not be started; the message says where to look."""


def allocation_nodes() -> list[str]:
    """The job's nodes, in SLURM's order (the first one runs the batch script)."""
    out = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.split()


def step_env() -> dict[str, str]:
    """The environment of an srun step and of the command: Ray's token mode, and without the job's
    total GPU count (srun would ask a single node for all of it)."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_GPUS"}
    return env | RAY_ENV


def srun_node(node: str, args: list[str], state_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    """``python -m rlpipe.ray_slurm node ARGS`` as one task on ``node``; its output in ``<node>.log``."""
    gpus = os.environ.get("SLURM_GPUS_PER_NODE")
    cmd = ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--nodelist={node}",
           *([f"--gpus-per-node={gpus}"] if gpus else []),
           sys.executable, "-m", "rlpipe.ray_slurm", "node", "--state-dir", str(state_dir), *args]
    with open(state_dir / f"{node}.log", "ab") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def answers(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def wait_head(state_dir: Path, head: subprocess.Popen, node: str, timeout_s: float = HEAD_TIMEOUT_S) -> str:
    """The head's address once it answers; ``LaunchError`` if its step ends or time runs out."""
    path, deadline = state_dir / HEAD_FILE, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise LaunchError(f"the Ray head on {node} exited (status {head.returncode}) before it answered; "
                              f"its output: {state_dir / f'{node}.log'}")
        address = path.read_text().strip() if path.is_file() else ""
        if address and answers(address):
            return address
        time.sleep(0.5)
    raise LaunchError(f"the Ray head on {node} did not answer within {timeout_s:.0f} s; its output: "
                      f"{state_dir / f'{node}.log'}")


def stop_steps(steps: list[subprocess.Popen]) -> None:
    """End the srun steps: two SIGINTs within a second make srun kill its step's tasks."""
    for _ in range(2):
        for p in steps:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        time.sleep(0.3)
    deadline = time.monotonic() + STOP_WAIT_S
    for p in steps:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_command(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd``, passing SIGTERM and SIGINT on to it (it checkpoints and stops); its exit status."""
    child = subprocess.Popen(cmd, env=env)

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    before = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return child.wait()
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def launch(nodes: int, cmd: list[str], state_dir: Path | None = None) -> int:
    """Start the allocation's Ray cluster, run ``cmd --ray-address <head>``, stop the cluster."""
    hosts = allocation_nodes()[:nodes]
    job = os.environ["SLURM_JOB_ID"]
    state_dir = state_dir or Path("logs") / "ray" / job
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / HEAD_FILE).unlink(missing_ok=True)
    env = step_env()
    steps = [srun_node(hosts[0], ["--head"], state_dir, env)]
    try:
        address = wait_head(state_dir, steps[0], hosts[0])
        steps += [srun_node(h, ["--address", address], state_dir, env) for h in hosts[1:]]
        print(f"rlpipe: Ray head on {hosts[0]} at {address}, workers on {', '.join(hosts[1:])} "
              f"(their output: {state_dir}/<node>.log)", flush=True)
        return run_command([*cmd, "--ray-address", address], env | {"RLPIPE_RAY_LOGS": str(state_dir)})
    finally:
        stop_steps(steps)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_main(state_dir: Path, head: bool, address: str | None) -> int:
    """Inside an srun step: ``ray start --block`` for this node (see the module docstring)."""
    from ray._private.services import get_node_ip_address  # Ray's resolver: the address its raylet uses

    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    gpus = len([d for d in visible.split(",") if d.strip()])
    cpus = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE") or str(os.cpu_count())
    ip = get_node_ip_address()
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--block", f"--node-ip-address={ip}",
           f"--num-cpus={cpus}", f"--num-gpus={gpus}", "--disable-usage-stats",
           f"--temp-dir=/tmp/rlray-{os.environ.get('SLURM_JOB_ID', os.getpid())}-{name}",
           f"--dashboard-agent-listen-port={free_port()}"]
    if head:
        port = free_port()
        cmd += ["--head", f"--port={port}", "--include-dashboard=false", f"--ray-client-server-port={free_port()}"]
        tmp = state_dir / f".{HEAD_FILE}.tmp"
        tmp.write_text(f"{ip}:{port}\n")
        tmp.replace(state_dir / HEAD_FILE)
    else:
        cmd.append(f"--address={address}")
    print(f"rlpipe.ray_slurm: {name}: {' '.join(cmd)}", flush=True)
    # the head's dashboard and autoscaler exporters would take fixed ports (rlpipe.trainer.local_ray says more)
    os.execve(cmd[0], cmd, os.environ | RAY_ENV | {"DASHBOARD_METRIC_PORT": "0", "AUTOSCALER_METRIC_PORT": "0"})
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["node"]:
        p = argparse.ArgumentParser(prog="python -m rlpipe.ray_slurm node")
        p.add_argument("--state-dir", type=Path, required=True)
        p.add_argument("--head", action="store_true")
        p.add_argument("--address")
        a = p.parse_args(argv[1:])
        return node_main(a.state_dir, a.head, a.address)
    p = argparse.ArgumentParser(prog="python -m rlpipe.ray_slurm", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, required=True, help="nodes of the allocation to run Ray on")
    p.add_argument("--state-dir", type=Path, default=None, help="default: logs/ray/<SLURM job id>")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command")
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command given after --")
    have = int(os.environ.get("SLURM_JOB_NUM_NODES") or 0)
    if a.nodes <= 1 or have < a.nodes:
        if a.nodes > 1:
            print(f"rlpipe: not in a SLURM allocation of {a.nodes} nodes (SLURM_JOB_NUM_NODES="
                  f"{os.environ.get('SLURM_JOB_NUM_NODES', 'unset')}): the run stays on this machine", flush=True)
        os.execvp(cmd[0], cmd)  # the command itself, in this process: nothing in between
    try:
        return launch(a.nodes, cmd, a.state_dir)
    except (LaunchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"rlpipe: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
