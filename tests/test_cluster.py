"""``ray.address``: a training job attaches to an existing Ray cluster (issue 14, network and cluster).

A head node is started with ``ray start --head`` on 127.0.0.1 from a directory that is *not* the job's
working directory, and ``rlpipe train`` runs as a subprocess from a third directory with relative
``--base``/``--dataset`` paths and a checkpoint whose tokenizer reference is relative: the actors run
in the cluster's working directory, so every path that crosses to them must be absolute
(``rlpipe.trainer.run`` resolves them). Token authentication stays on: the job finds the token that
``ray start`` wrote. The test stops the head it started (its process group only), whatever happens.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from rlpipe.lm.checkpoint import save_payload

pytestmark = pytest.mark.ray

RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """(address, env) of a fresh head node, in its own process group; only that group is stopped
    afterwards (``ray stop`` would also kill every other Ray instance of this user, e.g. the test
    session's)."""
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_worker_niceness": "0"}
    start = [str(RAY), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"]
    log = open(head_dir / "ray_start.log", "w")
    proc = subprocess.Popen(start, cwd=head_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 180
        while "Ray runtime started" not in (head_dir / "ray_start.log").read_text():
            assert proc.poll() is None and time.time() < deadline, (head_dir / "ray_start.log").read_text()[-3000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", env
    finally:
        # `ray start --block` rarely exits on SIGTERM within 30 s (measured: the wait always ran out), so
        # SIGKILL the group after 5 s: the head's processes hold nothing the test needs afterwards
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        log.close()
        # `ray start` registered the head as this machine's current cluster; it is gone now
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        if current.is_file() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


def test_training_attaches_to_a_cluster_started_elsewhere(tmp_path, tiny_base, write_config, ray_head):
    address, env = ray_head
    work = tmp_path / "job"
    (work / "inputs" / "tok").mkdir(parents=True)
    base, data = tiny_base
    payload = torch.load(base, weights_only=True)
    shutil.copy(payload["tokenizer"], work / "inputs" / "tok" / "tokenizer.json")
    payload["tokenizer"] = "inputs/tok/tokenizer.json"  # relative to the job's directory, as the workflow writes it
    save_payload(work / "inputs" / "base.pt", payload)
    shutil.copytree(data, work / "inputs" / "data")
    cfg = write_config(work / "c.yaml", ray={"address": address})
    cmd = [sys.executable, "-m", "rlpipe.cli", "train", "--config", "c.yaml", "--variant", "onpolicy",
           "--base", "inputs/base.pt", "--dataset", "inputs/data", "--out", "run", "--threads", "1"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = pd.read_parquet(work / "run" / "metrics.parquet")
    assert m["step"].tolist() == [0, 1, 2] and m["reward/val_mean"].notna().all()
    assert yaml.safe_load((work / "run" / "config.yaml").read_text())["ray"]["address"] == address
    assert cfg.exists()
