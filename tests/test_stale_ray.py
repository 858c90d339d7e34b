"""Every Ray start in rlpipe says where it goes: ``address="local"`` (a new instance of its own) or the
configured ``ray.address``. A machine where ``ray start`` once ran and was killed without ``ray stop``
keeps a registration (``ray_current_cluster`` in Ray's temp directory) naming a dead cluster; a
``ray.init()`` without an address attaches to it and refuses ``num_cpus``."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "rlpipe"


def _ray_inits_without_address(path: Path) -> list[int]:
    """Line numbers of ``ray.init(...)`` calls in ``path`` that pass no ``address``."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "init"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "ray"
            and not any(k.arg == "address" for k in node.keywords)]


def test_every_ray_init_in_src_names_its_address():
    calls = {str(p.relative_to(SRC)): lines for p in SRC.rglob("*.py") if (lines := _ray_inits_without_address(p))}
    assert calls == {}, f"ray.init without address= (pass 'local' or ray.address): {calls}"


@pytest.fixture
def stale_registration():
    """An environment whose Ray temp directory registers a cluster that is not there (a short path:
    Ray's socket paths must stay under the kernel's limit)."""
    tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    (Path(tmp) / "ray").mkdir()
    (Path(tmp) / "ray" / "ray_current_cluster").write_text("127.0.0.1:6399\n")
    yield {**os.environ, "RAY_TMPDIR": tmp}
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.ray
def test_weight_sync_bench_starts_its_own_ray_beside_a_dead_cluster(stale_registration, tmp_path):
    cmd = [sys.executable, "-m", "rlpipe.cli", "bench", "weight-sync", "--sizes-mb", "0.05", "--transports", "local",
           "--placements", "cpu", "--repeats", "1", "--out", str(tmp_path / "ws.json")]
    proc = subprocess.run(cmd, env=stale_registration, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ws.json").exists()


@pytest.mark.ray
def test_a_training_run_starts_its_own_ray_beside_a_dead_cluster(stale_registration, tmp_path, tiny_base,
                                                                 write_config):
    """(``rlpipe bench scaling`` starts Ray through the same ``local_ray.init_ray``.) The command's last line
    is the run's flat-reward diagnosis (``rlpipe.cli`` prints it after the trainer)."""
    cfg = write_config(tmp_path / "c.yaml", train={"n_grpo_steps": 1}, variants={"onpolicy": {}})
    cmd = [sys.executable, "-m", "rlpipe.cli", "train", "--config", str(cfg), "--variant", "onpolicy",
           "--out", str(tmp_path / "run"), "--base", tiny_base[0], "--dataset", tiny_base[1], "--threads", "1"]
    proc = subprocess.run(cmd, env=stale_registration, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.parquet").exists()
    assert proc.stdout.strip().splitlines()[-1].startswith(("flat reward", "validation reward")), proc.stdout[-2000:]
