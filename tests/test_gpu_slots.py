"""GPU slot pinning: disjoint slots across processes, release, timeout, a dead holder's slot frees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlpipe.trainer.gpu_slots import ENV, HELD_ENV, SCHEDULER_GPU_VARIABLES, acquire_gpus, actor_gpus

ROOT = Path(__file__).resolve().parents[1]

HOLDER = textwrap.dedent("""
    import sys
    from rlpipe.trainer.gpu_slots import acquire_gpus
    with acquire_gpus(int(sys.argv[1]), total=2, lock_dir=sys.argv[2], timeout_s=10, poll_s=0.05) as s:
        print(",".join(s.devices), flush=True)
        sys.stdin.readline()  # hold until the test says so (or kills us)
""")


@pytest.fixture(autouse=True)
def node(monkeypatch):
    """Every test runs as node "n1", outside any SLURM allocation."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    for name in SCHEDULER_GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_visible(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def _holder(n: int, lock_dir, node: str = "n1") -> tuple[subprocess.Popen, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != ENV} | {"SLURMD_NODENAME": node}
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(n), str(lock_dir)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline().strip()
    assert line, "holder process failed to acquire"
    return p, line.split(",")


def _finish(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(timeout=10)


def test_concurrent_acquirers_get_disjoint_slots(tmp_path, no_visible):
    p, theirs = _holder(1, tmp_path)
    try:
        assert theirs == ["0"]
        with acquire_gpus(1, total=2, lock_dir=tmp_path, timeout_s=5, poll_s=0.05) as mine:
            assert mine.devices == ["1"]
            assert os.environ[ENV] == "1"
            assert mine.lock_paths == [tmp_path / "gpu-n1-1.lock"]
    finally:
        _finish(p)
    assert ENV not in os.environ  # restored on exit


def test_release_on_exit_makes_slots_reusable(tmp_path, no_visible):
    with acquire_gpus(2, total=2, lock_dir=tmp_path, timeout_s=1) as a:
        assert a.devices == ["0", "1"]
    with acquire_gpus(2, total=2, lock_dir=tmp_path, timeout_s=1) as b:
        assert b.devices == ["0", "1"]


def test_timeout_names_the_holder(tmp_path, no_visible):
    p, _ = _holder(2, tmp_path)
    try:
        with pytest.raises(TimeoutError, match=f"pid {p.pid}"):
            with acquire_gpus(1, total=2, lock_dir=tmp_path, timeout_s=0.3, poll_s=0.05):
                pass
    finally:
        _finish(p)


def test_dead_holder_frees_its_slots(tmp_path, no_visible):
    p, theirs = _holder(2, tmp_path)
    assert theirs == ["0", "1"]
    os.kill(p.pid, signal.SIGKILL)  # no cleanup runs: the kernel drops the flock
    p.wait(timeout=10)
    with acquire_gpus(2, total=2, lock_dir=tmp_path, timeout_s=5, poll_s=0.05) as s:
        assert s.devices == ["0", "1"]


def test_existing_visible_devices_are_the_pool(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "5, GPU-ab/cd")
    with acquire_gpus(2, lock_dir=tmp_path, timeout_s=1) as s:
        assert s.devices == ["5", "GPU-ab/cd"]
        assert os.environ[ENV] == "5,GPU-ab/cd"
        assert sorted(x.name for x in tmp_path.iterdir()) == ["gpu-n1-5.lock", "gpu-n1-GPU-ab_cd.lock"]
    assert os.environ[ENV] == "5, GPU-ab/cd"
    with pytest.raises(ValueError, match="needs 3 GPUs but the pool has 2"):
        with acquire_gpus(3, lock_dir=tmp_path):
            pass


def test_zero_gpus_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "3")
    with acquire_gpus(0, lock_dir=tmp_path / "slots") as s:
        assert s.devices == [] and os.environ[ENV] == "3"
    assert not (tmp_path / "slots").exists()


@pytest.mark.parametrize("mode, gpus, want", [
    ("colocated_sync", 0, {"colocated": 0.0}),
    ("colocated_k", 1, {"colocated": 1.0}),
    ("colocated_sync", 2, {"colocated": 1.0}),  # one device per colocated run, whatever was declared
    ("disaggregated", 0, {"learner": 0.0, "generator": 0.0}),
    ("disaggregated", 1, {"learner": 0.5, "generator": 0.5}),  # both on the one GPU, inside Ray's accounting
    ("disaggregated", 2, {"learner": 1.0, "generator": 1.0}),
])
def test_actor_gpus_shares_one_gpu_between_the_disaggregated_actors(mode, gpus, want):
    assert actor_gpus(mode, gpus) == want


@pytest.mark.parametrize("data, key, field", [
    ({"train": {"device": "cuda"}}, "train.device", "gpus_per_colocated"),
    ({"train": {"device": "cuda"}, "workflow": {"gpus_per_colocated": 1},
      "variants": {"d": {"mode": "disaggregated"}}}, "variants.d.device", "gpus_per_disaggregated"),
    ({"workflow": {"gpus_per_colocated": 1}, "variants": {"g": {"mode": "disaggregated", "device": "cuda:0"}}},
     "variants.g.device", "gpus_per_disaggregated"),
    ({"workflow": {"tracks": ["math"]}, "math": {"train": {"device": "cuda"}}}, "math.train.device",
     "gpus_per_colocated"),
])
def test_cuda_with_no_gpu_declared_is_refused_at_parse_time_naming_the_key(data, key, field):
    from rlpipe.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value).startswith(f"{key} is ") and f"but workflow.{field} is 0" in str(err.value), err.value
    ok = {"gpus_per_colocated": 1, "gpus_per_disaggregated": 1} | (data.get("workflow") or {})
    parse_config(data | {"workflow": ok})  # one GPU declared (shared, for a disaggregated run): accepted


@pytest.mark.parametrize("where, data", [
    ("variants.r", {"train": {"device": "cuda"},
                    "variants": {"r": {"mode": "disaggregated", "weight_sync.transport": "rdt",
                                       "weight_sync.backend": "nccl"}}}),
    ("train", {"train": {"device": "cuda", "mode": "disaggregated",
                         "weight_sync": {"transport": "rdt", "backend": "nccl"}}}),
])
def test_nccl_between_two_actors_on_one_gpu_is_refused_at_parse_time(where, data):
    """NCCL refuses two ranks on one device ("Duplicate GPU detected"): with one GPU declared for a
    disaggregated CUDA run, rdt/nccl is refused before any job, naming the key and cuda_ipc."""
    from rlpipe.config import ConfigError, parse_config

    one = data | {"workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 1}}
    with pytest.raises(ConfigError) as err:
        parse_config(one)
    assert str(err.value).startswith(f"{where}.weight_sync.backend is 'nccl'"), err.value
    assert "gpus_per_disaggregated is 1" in str(err.value) and "cuda_ipc" in str(err.value)
    parse_config(data | {"workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 2}})  # one GPU each
    cpu = {**data, "train": {**data["train"], "device": "cpu"}}
    parse_config(cpu | {"workflow": {"gpus_per_disaggregated": 1}})  # no CUDA: the run's preflight decides


def test_the_gpu_overlay_with_one_gpu_per_disaggregated_variant_needs_cuda_ipc():
    """config/gpu.yaml over config.yaml, with one GPU per disaggregated variant: refused for the NCCL
    variant; accepted once that variant syncs over cuda_ipc (what the GPU docs tell the user)."""
    from snakemake.utils import update_config

    from rlpipe.config import ConfigError, parse_config
    from rlpipe.config.pipeline import load_yaml

    data = load_yaml(ROOT / "config" / "config.yaml")
    update_config(data, load_yaml(ROOT / "config" / "gpu.yaml"))
    update_config(data, {"workflow": {"gpus_per_disaggregated": 1}})
    nccl = [v for v, o in data["variants"].items() if (o or {}).get("weight_sync.backend") == "nccl"]
    assert nccl, "config/gpu.yaml has no NCCL variant any more: update this test"
    with pytest.raises(ConfigError, match=f"variants.{nccl[0]}.weight_sync.backend is 'nccl'"):
        parse_config(data)
    update_config(data, {"variants": {v: {"weight_sync.backend": "cuda_ipc"} for v in nccl}})
    parse_config(data)


def test_nodes_sharing_the_lock_dir_never_wait_for_each_others_gpus(tmp_path, no_visible):
    """Each node numbers its GPUs from 0, and a cluster's results directory is shared: node n2's GPU 0
    is not node n1's."""
    p, theirs = _holder(2, tmp_path, node="n2")
    try:
        assert theirs == ["0", "1"]
        with acquire_gpus(2, total=2, lock_dir=tmp_path, timeout_s=0.3, poll_s=0.05) as mine:
            assert mine.devices == ["0", "1"]
    finally:
        _finish(p)


def test_a_schedulers_allocation_is_taken_without_locks(tmp_path, monkeypatch):
    """SLURM gave the job GPU 1 (and only it may use it): no lock, even one another job holds."""
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv("SLURM_STEP_GPUS", "1")
    p, _ = _holder(2, tmp_path)  # (its own environment has no SLURM variables: it locks)
    try:
        with acquire_gpus(1, lock_dir=tmp_path, timeout_s=0.3) as s:  # gpu-n1-1.lock is held
            assert s.devices == ["1"] and os.environ[ENV] == "1" and s.lock_paths == []
    finally:
        _finish(p)


def test_a_nested_acquisition_takes_the_slots_its_holder_holds(tmp_path, no_visible):
    """The scaling bench holds its GPUs for all its runs, and each run acquires them again: it gets
    them at once (it used to wait for its own holder's lock), while another process still cannot."""
    with acquire_gpus(2, total=2, lock_dir=tmp_path, timeout_s=1) as outer:
        with acquire_gpus(1, lock_dir=tmp_path, timeout_s=0.3, poll_s=0.05) as inner:
            assert inner.devices == ["0"] and inner.lock_paths == [] and os.environ[ENV] == "0"
        assert os.environ[ENV] == "0,1" and os.environ[HELD_ENV] == "0,1"
        other = subprocess.run([sys.executable, "-c", HOLDER, "1", str(tmp_path)], env={
            k: v for k, v in os.environ.items() if k not in (ENV, HELD_ENV)}, input="", capture_output=True,
            text=True, timeout=60)
        assert other.returncode != 0 and "TimeoutError" in other.stderr, other.stderr[-500:]
        assert outer.devices == ["0", "1"]
    assert ENV not in os.environ and HELD_ENV not in os.environ
