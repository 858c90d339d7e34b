"""Faults injected into ``rlpipe train``: each one gives a clear error naming what failed (actor,
step, file), and what is left on disk is never mistaken for valid later.

- actor death (learner, scorer, colocated worker; the generator is in test_disaggregated.py);
- divergence (``train.learning_rate: 1e12``) and the checkpoint refusal behind it;
- a write failing mid-file (disk full, file-size limit);
- two ``rlpipe train`` on one run directory;
- a damaged checkpoint or snapshot on ``--resume``;
- a reward function that raises or hangs on one sample;
- a generation that hangs (its process frozen with SIGSTOP): a timeout naming the actor and step;
- an actor that does not start in time: the start timeout, naming the actor.
Tests that start Ray carry ``ray``; the others run without it. The measured times to fail are
printed (``-s`` shows them) and bounded well below ``train.ray_timeout_s``.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlpipe import contract
from rlpipe.io import OutputWriteError
from rlpipe.lm.checkpoint import CheckpointError, load_checkpoint, save_payload
from rlpipe.trainer import run as run_module
from rlpipe.trainer.drivers.ray_calls import ActorFailure, TrainingDiverged
from rlpipe.trainer.lock import RunLockedError, run_lock
from rlpipe.trainer.resume import ResumeError
from rlpipe.trainer.run_writer import RunWriter, read_snapshot

VARIANTS = {"onpolicy": {"mode": "colocated_sync"}, "disagg": {"mode": "disaggregated"},
            "scorer": {"mode": "disaggregated", "scorer_actor": True}}


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_base, write_config):
    tmp = tmp_path_factory.mktemp("faults")
    return {"tmp": tmp, "base": tiny_base[0], "data": tiny_base[1], "write": write_config}


def config(env, name: str, **train) -> str:
    return str(env["write"](env["tmp"] / f"{name}.yaml", train=train, variants=VARIANTS))


def train(env, cfg: str, variant: str, out: Path, **kw) -> dict:
    return run_module.run(cfg, variant, str(out), env["base"], env["data"], threads=2, **kw)


def temp_files(*dirs: Path) -> list[str]:
    return [p.name for d in dirs if d.exists() for p in d.iterdir() if p.name.endswith(".tmp")]


# --------------------------------------------------------------------------- actor death


def _kill_when(path: Path, actor_name: str, out: Path, record: dict, pids: set[int] | None = None) -> threading.Thread:
    """Once ``path`` exists: check the run holds its lock, then kill the named actor: with
    ``ray.kill``, or (``pids``: the actor processes that are not this run's) its process with SIGKILL."""
    import ray

    def go():
        deadline = time.time() + ACTOR_START_WAIT_S
        while time.time() < deadline and not path.exists():
            time.sleep(0.05)
        try:
            with run_lock(out):
                record["lock_held"] = False
        except RunLockedError:
            record["lock_held"] = True
        if pids is None:
            ray.kill(ray.get_actor(actor_name), no_restart=True)
        else:
            (pid,) = _actor_pids(f"ray::{actor_name.split('/')[1]}") - pids
            os.kill(pid, signal.SIGKILL)
            record["pid"] = pid
        record["killed_at"] = time.time()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


# A death must be reported long before this timeout would fire (half of it, on a loaded machine).
DEATH_TIMEOUT_S = 120.0


@pytest.mark.ray
@pytest.mark.parametrize("variant, actor, role, checkpoint, how", [
    ("disagg", "LearnerWorker", "learner", True, "ray.kill"),
    ("scorer", "Scorer", "scorer", False, "ray.kill"),
    ("onpolicy", "ColocatedWorker", "colocated worker", True, "ray.kill"),
    ("onpolicy", "ColocatedWorker", "colocated worker", True, "SIGKILL"),
])
def test_actor_death_names_actor_and_step_and_advises_resume_only_with_a_checkpoint(
        env, ray_session, tmp_path, variant, actor, role, checkpoint, how):
    timeout = DEATH_TIMEOUT_S
    cfg = config(env, f"death_{variant}", n_grpo_steps=40, checkpoint_every=1 if checkpoint else 100,
                 ray_timeout_s=timeout)
    out = tmp_path / "run"
    trigger = out / (contract.CHECKPOINT_FILE if checkpoint else contract.METRICS_FILE)
    record: dict = {}
    before = _actor_pids(f"ray::{actor}")
    killer = _kill_when(trigger, f"{variant}/{actor}", out, record, pids=before if how == "SIGKILL" else None)
    with pytest.raises(ActorFailure) as err:
        train(env, cfg, variant, out)
    failed_after = time.time() - record["killed_at"]
    killer.join()
    msg = str(err.value)
    print(f"\n{variant}/{actor} killed: failed after {failed_after:.2f}s: {msg}")
    assert failed_after < timeout / 2  # the death is reported at once, not after ray_timeout_s
    assert record["lock_held"]  # the running trainer held <out>/.lock
    assert f"the {role} actor ({variant}/{actor}) died: " in msg
    assert int(_after_step(msg)) >= 1
    assert "Ray logs" not in msg  # the cause is in the message, no pointer to logs a job log lacks
    if how == "ray.kill":
        assert "it was killed with ray.kill" in msg and "a rerun is safe" in msg
    else:
        assert f"its process (pid {record['pid']}) exited without a Python error, so it was killed by a signal" in msg
        assert "OOM killer" in msg
    if checkpoint:
        ck = load_checkpoint(out / contract.CHECKPOINT_FILE)
        assert f"Rerun with --resume to continue from {out / contract.CHECKPOINT_FILE} " \
               f"(optimizer step {ck.extra['step']})" in msg
    else:
        assert "Rerun with --resume" not in msg and "No checkpoint was written yet" in msg
        assert not (out / contract.CHECKPOINT_FILE).exists()


@pytest.mark.ray
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA (device: cuda must fail)")
def test_actor_that_fails_at_start_up_states_the_cause_in_the_job_log(env, ray_session, tmp_path, capsys,
                                                                       monkeypatch):
    """``train.device: cuda`` on a CPU machine: the actor's __init__ raises; the driver's error, the
    last thing ``rlpipe train`` prints, holds the exception, its traceback's last frames and the step.
    (The config declares the GPU that ``device: cuda`` needs; the job then asks Ray for none, as this
    machine has none to give.)"""
    cfg = str(env["write"](env["tmp"] / "startup.yaml", train={"n_grpo_steps": 4, "device": "cuda"},
                           variants=VARIANTS, workflow={"threads_per_variant": 2, "gpus_per_colocated": 1,
                                                        "gpus_per_disaggregated": 2}))
    monkeypatch.setattr(run_module, "variant_gpus", lambda cfg, variant: 0)
    out = tmp_path / "run"
    args = ["--config", cfg, "--variant", "onpolicy", "--out", str(out), "--base", env["base"],
            "--dataset", env["data"], "--threads", "2"]
    assert run_module.main(args) == 1
    err = capsys.readouterr().err
    msg = err[err.index("rlpipe train onpolicy: error: "):]
    print(f"\n{msg}")
    assert ", after optimizer step 0 of 4: the colocated worker actor (onpolicy/ColocatedWorker) failed at " \
           "start-up: its __init__ raised RuntimeError: device 'cuda' requested but CUDA is not available here" in msg
    assert "in resolve_device" in msg and "raise RuntimeError(" in msg  # the traceback's last frame
    assert "Rerunning fails the same way until the cause above is fixed" in msg
    assert "No checkpoint was written yet" in msg and "Ray logs" not in msg


@pytest.mark.ray
def test_actor_that_raises_mid_run_states_the_exception_the_step_and_the_checkpoint(
        env, ray_session, tmp_path, monkeypatch):
    from rlpipe.trainer.actors.workers import ColocatedWorker as Real
    from rlpipe.trainer.drivers import colocated

    def _raise_mid_run(step):
        raise ValueError(f"a bug met at step {step}")

    class ColocatedWorker(Real):
        """The real colocated worker, but its update of optimizer step 3 raises (a bug met
        mid-run); named like the real one, so the driver calls it the colocated worker. Defined
        here, so Ray ships it by value (the actors cannot import a test module)."""

        def update(self, batch, step):
            if step == 3:
                _raise_mid_run(step)
            return super().update(batch, step)

    monkeypatch.setattr(colocated, "ColocatedWorker", ColocatedWorker)
    cfg = config(env, "midrun", n_grpo_steps=6, checkpoint_every=2)
    out = tmp_path / "run"
    with pytest.raises(ActorFailure) as err:
        train(env, cfg, "onpolicy", out)
    msg = str(err.value)
    print(f"\n{msg}")
    assert msg.startswith("update step 3, after optimizer step 2 of 6: the colocated worker actor "
                          "(onpolicy/ColocatedWorker) raised ValueError: a bug met at step 3\n")
    assert "in _raise_mid_run" in msg and 'raise ValueError(f"a bug met at step {step}")' in msg
    assert "Rerunning fails the same way until the cause above is fixed" in msg
    assert f"Rerun with --resume to continue from {out / contract.CHECKPOINT_FILE} (optimizer step 2)" in msg


def _after_step(msg: str) -> str:
    import re

    m = re.search(r"after optimizer step (\d+) of 40", msg)
    assert m, msg
    return m.group(1)


def _actor_pids(title: str) -> set[int]:
    """Pids of this process's descendants whose title contains ``title`` (Ray titles a worker
    ``ray::Class.method`` while it runs that method)."""
    import psutil

    pids = set()
    for proc in psutil.Process().children(recursive=True):  # this worker's Ray only: not another test's
        with contextlib.suppress(psutil.Error):  # (pytest -n 2); a `ps` per poll is slow on a loaded machine
            if title in " ".join(proc.cmdline()):
                pids.add(proc.pid)
    return pids


# Waits derive from the configured timeout, never from how fast an idle machine runs: the timeout sits
# far above one step of the tiny model on 2 cores at load 4-5 (about a second; the test must not time
# out on a healthy call; the actors' start, seconds more on a loaded machine, is bounded apart by
# train.actor_start_timeout_s), and the failure may come up to one more timeout later (the driver can be
# inside the weight-sync wait, bounded by weight_sync.timeout_s, when the frozen actor stops answering)
# plus a fixed allowance for Ray's own clean-up on a loaded machine.
HANG_TIMEOUT_S = 10.0
HANG_MARGIN_S = HANG_TIMEOUT_S + 30.0
ACTOR_START_WAIT_S = 300.0  # a bound for a failing test only: actors start in seconds


def _freeze_when_running(title: str, before: set[int], record: dict) -> threading.Thread:
    """SIGSTOP the first new process titled ``title``: a generation that hangs (a stuck kernel,
    a deadlocked library) rather than dies, so only the driver's timeout can notice."""

    def go():
        deadline = time.time() + ACTOR_START_WAIT_S
        while time.time() < deadline:
            pids = _actor_pids(title) - before
            if pids:
                pid = min(pids)
                os.kill(pid, signal.SIGSTOP)
                record.update(pid=pid, frozen_at=time.time())
                return
            time.sleep(0.02)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


@pytest.mark.ray
@pytest.mark.parametrize("variant, title, role", [
    ("disagg", "ray::GeneratorWorker.rollout", "generator"),
    ("onpolicy", "ray::ColocatedWorker.rollout", "colocated worker"),
])
def test_hung_generation_is_a_timeout_naming_the_actor_and_step(env, ray_session, tmp_path, variant, title, role):
    timeout = HANG_TIMEOUT_S
    # enough steps that the freezer meets a rollout on a loaded machine, where a rollout is milliseconds
    # of a step and the 40-step run once ended unfrozen; no checkpoint before the end
    cfg = config(env, f"hang_{variant}", n_grpo_steps=400, checkpoint_every=1000, ray_timeout_s=timeout,
                 actor_start_timeout_s=ACTOR_START_WAIT_S, weight_sync={"timeout_s": timeout})
    out, record = tmp_path / "run", {}
    freezer = _freeze_when_running(title, _actor_pids(title), record)
    try:
        with pytest.raises(ActorFailure) as err:
            train(env, cfg, variant, out)
    finally:
        freezer.join()
        if "pid" in record:  # let Ray reap it
            with contextlib.suppress(ProcessLookupError):
                os.kill(record["pid"], signal.SIGCONT)
    failed_after = time.time() - record["frozen_at"]
    msg = str(err.value)
    print(f"\n{variant}: generation frozen, failed after {failed_after:.2f}s: {msg}")
    # the driver's next call on the frozen actor times out: the rollout it waits for, or (disaggregated)
    # the weight sync into the frozen generator, whichever the driver reaches first
    rollout = f"no answer from the {role} actor ({variant}/" in msg and f"train.ray_timeout_s={timeout}s" in msg
    sync = variant == "disagg" and "weight sync after optimizer step" in msg and "did not finish within" in msg
    assert rollout or sync, msg
    assert "after optimizer step" in msg  # the step
    assert failed_after < timeout + HANG_MARGIN_S  # a timeout, not a silent stall
    assert "No checkpoint was written yet" in msg and not (out / contract.CHECKPOINT_FILE).exists()


@pytest.mark.ray
def test_an_actor_that_does_not_start_in_time_fails_naming_it_and_the_start_timeout(env, ray_session, tmp_path):
    """``train.actor_start_timeout_s`` bounds the actors' start; after it, ``train.ray_timeout_s`` bounds
    each call (a hung step fails in that time however slowly the actors started)."""
    import ray

    from rlpipe.config import load_config, resolve_variant
    from rlpipe.trainer.drivers.common import RunContext

    class SlowToStart:  # defined here, so that Ray ships it by value (the actor cannot import a test module)
        """An actor whose start (its ``__init__``) takes longer than the run allows."""

        def __init__(self):
            time.sleep(120)

    cfg = load_config(config(env, "slow_start", actor_start_timeout_s=2.0, ray_timeout_s=600.0))
    ctx = RunContext(cfg, resolve_variant(cfg, "onpolicy"), "onpolicy", env["base"], env["data"], tmp_path, 1, False)
    handle = ctx.ray.actor(SlowToStart, gpus=0, cpus=0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(ActorFailure) as err:
            ctx.ray.started()
    finally:
        ray.kill(handle)
    took = time.monotonic() - t0
    msg = str(err.value)
    assert msg.startswith("actor start-up: no answer from the SlowToStart actor (onpolicy/SlowToStart) within "
                          "train.actor_start_timeout_s=2.0s (stuck or overloaded) after optimizer step 0 of 2."), msg
    assert "No checkpoint was written yet" in msg
    assert 1.5 < took < 2.0 + HANG_MARGIN_S, took  # the start timeout (Ray may return a hair early), not ray_timeout_s


def test_weight_sync_failure_names_the_dead_actor_behind_it(env, tmp_path):
    """A sender that dies fails the receiver's load task; the sync error names the sender and the
    step (no Ray needed: the error chain is what Ray and the transport build)."""
    import ray

    from rlpipe.config import load_config, resolve_variant
    from rlpipe.trainer.drivers.common import RunContext
    from rlpipe.trainer.weight_sync import WeightSyncError

    cfg = load_config(config(env, "sync"))
    ctx = RunContext(cfg, resolve_variant(cfg, "disagg"), "disagg", env["base"], env["data"], tmp_path, 1, False)
    ctx.ray.roles = {"aa01": "learner actor (disagg/LearnerWorker)", "bb02": "generator actor (disagg/GeneratorWorker)"}
    ctx.log.step = 1

    class DeadSender:
        def sync(self, sender, receivers, version):
            died = ray.exceptions.RayActorError(actor_id="aa01", error_msg="killed")
            try:
                raise ray.exceptions.RayTaskError("load_weights", "tb", died) from died
            except ray.exceptions.RayTaskError as e:
                raise WeightSyncError(f"weight sync object_store (version {version}) failed: {e}") from e

    with pytest.raises(ActorFailure) as err:
        ctx.ray.sync(DeadSender(), None, [None], 1)
    msg = str(err.value)
    assert msg.startswith("weight sync of step 1's weights, after optimizer step 1 of 2: "
                          "the learner actor (disagg/LearnerWorker) died")
    assert "after optimizer step 1 of 2" in msg and "No checkpoint was written yet" in msg


# --------------------------------------------------------------------------- divergence


@pytest.mark.ray
def test_exploding_learning_rate_stops_at_the_step_and_checkpoints_nothing_after_it(env, ray_session, tmp_path):
    cfg = config(env, "lr", learning_rate=1e12, n_grpo_steps=3, checkpoint_every=1)
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as err:
        train(env, cfg, "onpolicy", out)
    msg = str(err.value)
    assert msg.startswith("update step 1: training diverged at optimizer step 1: ")
    assert "non-finite" in msg and "learning_rate (now 1e+12)" in msg
    assert "No checkpoint of this run is on disk" in msg
    # step 1 already diverged: no checkpoint at all (the only finite weights are the base's)
    assert sorted(p.name for p in (out / contract.CHECKPOINT_DIR).iterdir()) == ["FINGERPRINT"]


@pytest.mark.usefixtures("one_torch_thread")
def test_diverged_learner_keeps_the_last_finite_checkpoint(env, tmp_path, monkeypatch):
    """Two finite steps and a checkpoint, then an exploding step: the learner names the step,
    refuses to save, and last.pt stays the finite step-2 checkpoint (no Ray: the roles directly)."""
    from rlpipe.config import load_config, resolve_variant
    from rlpipe.rl.scoring import score_batch
    from rlpipe.tasks import make_task
    from rlpipe.trainer.actors.generator import Generator
    from rlpipe.trainer.actors.learner import Learner, NonFiniteLossError

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    t = resolve_variant(load_config(config(env, "unit")), "onpolicy")
    task = make_task(t.task, env["data"])
    gen, learner = Generator(env["base"], t, stop=task.stop), Learner(env["base"], t)

    def batch(step):
        return score_batch(gen.generate(task.prompts_for_batch(step, 2, 0), step), task, t)

    for step in (1, 2):
        learner.train_step(batch(step), None, step)
    path = tmp_path / "last.pt"
    learner.save(str(path), {"step": 2, "next_batch": 2, "samples": 16})
    good = path.read_bytes()
    for group in learner.opt.param_groups:
        group["lr"] = 1e12
    with pytest.raises(NonFiniteLossError, match="diverged at optimizer step 3: .*non-finite"):
        learner.train_step(batch(3), None, 3)
    with pytest.raises(CheckpointError, match="refusing to write .*last.pt: training diverged at optimizer step 3"):
        learner.save(str(path), {"step": 3, "next_batch": 3, "samples": 24})
    assert path.read_bytes() == good and temp_files(tmp_path) == []
    ck = load_checkpoint(path)
    assert ck.extra["step"] == 2 and all(torch.isfinite(p).all() for p in ck.model.parameters())


# --------------------------------------------------------------------------- disk full


def _fail_mid_file(monkeypatch, should_fail):
    """``DataFrame.to_parquet`` writes half the file and then fails with ENOSPC when
    ``should_fail(path)``: a disk that fills up in the middle of a write."""
    real = pd.DataFrame.to_parquet

    def to_parquet(self, path, *a, **k):
        if not should_fail(Path(path)):
            return real(self, path, *a, **k)
        real(self, path, *a, **k)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)


def test_disk_full_mid_parquet_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    w = RunWriter(tmp_path)
    for step in (0, 1):
        w.add_row({"step": step, "policy_version": step, "wall_time": float(step), "samples": 8 * step})
    w.flush(snapshot=True)
    ckpt_dir = tmp_path / contract.CHECKPOINT_DIR
    before = (ckpt_dir / contract.METRICS_FILE).read_bytes()
    w.add_row({"step": 2, "policy_version": 2, "wall_time": 2.0, "samples": 16})
    _fail_mid_file(monkeypatch, lambda p: p.parent == ckpt_dir and p.name.startswith(".metrics.parquet"))
    with pytest.raises(OutputWriteError) as err:
        w.flush(snapshot=True)
    assert str(ckpt_dir / contract.METRICS_FILE) in str(err.value) and "No space left" in str(err.value)
    assert err.value.errno == errno.ENOSPC
    assert (ckpt_dir / contract.METRICS_FILE).read_bytes() == before  # the old file, intact
    assert temp_files(tmp_path, ckpt_dir) == []  # the half-written temporary file is gone
    assert [r["step"] for r in read_snapshot(tmp_path, 1)["metrics"]] == [0, 1]


def test_file_size_limit_mid_checkpoint_keeps_the_previous_checkpoint(env, tmp_path):
    """A real short write: the checkpoint is rewritten under RLIMIT_FSIZE (in a subprocess)."""
    path = tmp_path / "last.pt"
    shutil.copy(env["base"], path)
    before = path.read_bytes()
    code = f"""
import resource, signal, sys, torch
from rlpipe.io import OutputWriteError
from rlpipe.lm.checkpoint import load_checkpoint, save_checkpoint
ck = load_checkpoint({str(path)!r})
with torch.no_grad():
    next(ck.model.parameters()).add_(1.0)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process at the limit
resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) // 3}, resource.RLIM_INFINITY))
try:
    save_checkpoint({str(path)!r}, ck.model, tokenizer=ck.tokenizer)
except OutputWriteError as e:
    print(e)
    sys.exit(3)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr[-2000:]
    assert f"could not write {path}" in r.stdout
    assert path.read_bytes() == before and temp_files(tmp_path) == []
    load_checkpoint(path)


@pytest.mark.ray
def test_disk_full_mid_run_fails_naming_the_file_and_resume_continues(env, ray_session, tmp_path, monkeypatch):
    cfg = config(env, "diskfull", n_grpo_steps=3, checkpoint_every=1)
    out = tmp_path / "run"
    ckpt_dir = out / contract.CHECKPOINT_DIR
    calls = []

    def second_snapshot(p: Path) -> bool:
        if p.parent == ckpt_dir and p.name.startswith(".metrics.parquet"):
            calls.append(p)
            return len(calls) == 2  # the snapshot of the step-2 checkpoint
        return False

    _fail_mid_file(monkeypatch, second_snapshot)
    with pytest.raises(OutputWriteError) as err:
        train(env, cfg, "onpolicy", out)
    assert f"could not write {ckpt_dir / contract.METRICS_FILE}" in str(err.value)
    assert temp_files(out, ckpt_dir) == []
    assert pd.read_parquet(ckpt_dir / contract.METRICS_FILE)["step"].tolist() == [0, 1]
    assert load_checkpoint(ckpt_dir / "last.pt").extra["step"] == 1  # consistent with the snapshot
    monkeypatch.undo()
    train(env, cfg, "onpolicy", out, resume="always")
    m = pd.read_parquet(out / contract.METRICS_FILE)
    assert m["step"].tolist() == [0, 1, 2, 3] and m["samples"].tolist() == [0, 8, 16, 24]


# --------------------------------------------------------------------------- two trainers, one directory


def test_second_trainer_on_the_same_run_dir_refuses_at_once(env, tmp_path, no_ray, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom rlpipe.trainer.lock import run_lock\n"
        f"with run_lock({str(out)!r}):\n    print('locked', flush=True)\n    time.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        args = ["--config", config(env, "lock"), "--variant", "onpolicy", "--out", str(out), "--base", env["base"],
                "--dataset", env["data"]]
        with pytest.raises(SystemExit) as exc:
            run_module.main(args)
        assert exc.value.code == 2
        msg = capsys.readouterr().err
        assert f"{out} is in use by another `rlpipe train` (pid {holder.pid} on " in msg
        assert str(out / ".lock") in msg
        assert not (out / contract.CHECKPOINT_DIR).exists() and not (out / "config.yaml").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with run_lock(out):  # the kernel released the killed holder's lock
        pass


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory this process cannot write: mode 0o555, or (as root, which ignores modes) sysfs,
    where nobody can create files."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    return Path("/sys")


@pytest.mark.parametrize("where", ["read-only directory", "below a regular file"])
def test_unwritable_out_is_a_one_line_error_naming_it(env, tmp_path, no_ray, capsys, where):
    if where == "read-only directory":
        out = _read_only_dir(tmp_path) / "rlpipe-run"
    else:
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "run"
    args = ["--config", config(env, "ro"), "--variant", "onpolicy", "--out", str(out), "--base", env["base"],
            "--dataset", env["data"]]
    with pytest.raises(SystemExit) as exc:
        run_module.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"rlpipe train: error: --out {out}: cannot create the run directory or its lock file "
                              f"{out / '.lock'} (") and err[-1].endswith("choose a writable --out"), err
    assert not any("Traceback" in line or "OSError" in line for line in err)
    assert not out.exists()


# --------------------------------------------------------------------------- damaged resume state


@pytest.fixture(scope="module")
def finished_run(env, ray_session):
    cfg = config(env, "resume_src", n_grpo_steps=2, checkpoint_every=1)
    out = env["tmp"] / "resume_src"
    train(env, cfg, "onpolicy", out)
    (out / contract.FINISHED_MARKER).unlink()  # as if it had been killed after its last checkpoint
    return cfg, out


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _poison(p: Path) -> None:
    payload = torch.load(p, weights_only=True)
    payload["model"]["layers.1.ffn.w1.weight"][3, 3] = math.inf
    save_payload(p, payload)  # a valid checksum: the check for non-finite values refuses it


def _cut_second_line(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: data.index(b"\n") + 20])


def _drop_steps(p: Path) -> None:
    df = pd.read_parquet(p)
    df[df.step == 0].to_parquet(p, index=False)


DAMAGE = {  # file under checkpoints/ -> (damage, expected words)
    "truncated metrics snapshot": (contract.METRICS_FILE, _truncate, "is unreadable (truncated or corrupt)"),
    "snapshot without the checkpoint's steps": (contract.METRICS_FILE, _drop_steps, "lacks steps [1, 2]"),
    "truncated rollouts snapshot": (contract.ROLLOUTS_FILE, _cut_second_line, "is unreadable (truncated or corrupt)"),
    "truncated last.pt": ("last.pt", _truncate, "is not a torch checkpoint file"),
    "garbage last.pt": ("last.pt", lambda p: p.write_bytes(b"\x00" * 1000), "is not a torch checkpoint file"),
    "NaN-poisoned last.pt": ("last.pt", _poison, "is poisoned: non-finite (NaN/inf) values in layers.1.ffn.w1.weight"),
    "bit-flipped last.pt": ("last.pt", "flip_tensor_bytes", "is corrupt: its content does not match the sha256"),
}


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["always", "auto"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_resume_state_is_a_clear_error_naming_the_file(env, finished_run, tmp_path, damage, mode, no_ray,
                                                               flip_tensor_bytes):
    """Decision (see rlpipe.trainer.run): an error before Ray, in --resume auto as in always,
    never a crash inside pandas or torch and never a silent restart that discards the run."""
    cfg, src = finished_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    name, hurt, words = DAMAGE[damage]
    hurt = flip_tensor_bytes if hurt == "flip_tensor_bytes" else hurt  # a fixture (conftest)
    target = out / contract.CHECKPOINT_DIR / name
    hurt(target)
    state = {p.name: p.read_bytes() for p in (out / contract.CHECKPOINT_DIR).iterdir()}
    with pytest.raises(ResumeError) as err:
        train(env, cfg, "onpolicy", out, resume=mode)
    msg = str(err.value)
    assert f"cannot resume {out}" in msg and str(target) in msg and words in msg
    assert "--resume never to start afresh" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert {p.name: p.read_bytes() for p in (out / contract.CHECKPOINT_DIR).iterdir()} == state  # untouched


@pytest.mark.ray
def test_the_learner_refuses_a_poisoned_checkpoint_on_restore_too(env, finished_run, tmp_path, monkeypatch):
    cfg, src = finished_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    _poison(out / contract.CHECKPOINT_FILE)
    monkeypatch.setattr(run_module, "_check_resumable", lambda out_dir: None)  # only the actor's check left
    with pytest.raises(CheckpointError, match=r"restore .*last.pt: checkpoint .*last.pt is poisoned"):
        train(env, cfg, "onpolicy", out, resume="always")


# --------------------------------------------------------------------------- reward faults


def test_guarded_rewards_scores_failures_zero_and_counts_them(monkeypatch):
    from rlpipe.rl import reward_guard
    from rlpipe.tasks.reward_dict import never_raise

    release = threading.Event()

    @never_raise
    def swallowed(response, gt):
        raise RuntimeError("swallowed")

    def reward(response, gt):
        if response == "raise":
            raise ValueError("bad sample")
        if response == "hang":
            release.wait(30)
        if response == "nan":
            return {"reward": math.nan}
        if response == "swallowed":
            return swallowed(response, gt)
        return {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}

    responses = ["ok", "raise", "hang", "ok", "nan", "swallowed", None]
    scores, failures = reward_guard.guarded_rewards(reward, responses, ["gt"] * len(responses), timeout_s=2.0)
    release.set()
    assert [s["reward"] for s in scores] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert failures == 4  # raise, hang, nan, and the failure never_raise swallowed (and logged)


def test_a_hung_rewards_worker_never_scores_the_rest_twice():
    """One worker scores the samples in order; after a hang a new worker takes the rest, and the
    abandoned one, once released, stops instead of scoring them again."""
    import time

    from rlpipe.rl import reward_guard

    release, calls = threading.Event(), []

    def reward(response, gt):
        calls.append(response)
        if response == "hang":
            release.wait(30)
        return {"reward": 1.0}

    responses = ["a", "hang", "b", "c"]
    scores, failures = reward_guard.guarded_rewards(reward, responses, ["gt"] * 4, timeout_s=2.0)
    release.set()
    time.sleep(0.2)  # let the released worker run on, if it would
    assert [s["reward"] for s in scores] == [1.0, 0.0, 1.0, 1.0] and failures == 1
    assert sorted(calls) == sorted(responses)  # each sample scored once


@pytest.mark.ray
def test_reward_that_raises_or_hangs_on_one_sample_scores_zero_and_the_run_goes_on(
        env, ray_session, tmp_path, monkeypatch, caplog):
    """Disaggregated without a Scorer actor scores in the driver, i.e. in this process."""
    from rlpipe.rl import reward_guard
    from rlpipe.tasks.keyword.task import KeywordInclusionTask

    real, calls, release = KeywordInclusionTask.reward, [], threading.Event()

    def flaky(self, response, ground_truth):
        calls.append(response)
        if len(calls) == 3:  # batch 0 (step 1), sample 2
            raise RuntimeError("reward bug")
        if len(calls) == 13:  # batch 1 (step 2), sample 4
            release.wait(60)
        return real(self, response, ground_truth)

    monkeypatch.setattr(KeywordInclusionTask, "reward", flaky)
    # far above one keyword reward (microseconds) even at load 4-5; the hung sample costs this once
    timeout = 3.0
    monkeypatch.setattr(reward_guard, "REWARD_TIMEOUT_S", timeout)
    cfg = config(env, "reward", n_grpo_steps=3)
    try:
        train(env, cfg, "disagg", tmp_path / "run")
    finally:
        release.set()
    m = pd.read_parquet(tmp_path / "run" / contract.METRICS_FILE)
    assert m["step"].tolist() == [0, 1, 2, 3]
    assert m["reward/errors"].tolist()[1:] == [1.0, 1.0, 0.0]
    warned = [r.getMessage() for r in caplog.records if r.name == "rlpipe.rl.reward_guard"]
    assert any("failed on sample 2 (scored 0): raised RuntimeError: reward bug" in w for w in warned), warned
    assert any(f"failed on sample 4 (scored 0): no result within {timeout:g}s" in w for w in warned), warned


def test_resume_advice_reads_a_checkpoint_the_driver_has_not_recorded_yet(env, tmp_path):
    """An actor can die between its checkpoint's rename and the driver seeing ``save`` return: the
    advice follows the file on disk, not the driver's record (this was a flaky race in the kill test)."""
    from rlpipe.config import TrainConfig
    from rlpipe.lm.checkpoint import save_checkpoint
    from rlpipe.trainer.drivers.checkpoints import Checkpoints

    ckpts = Checkpoints(tmp_path, TrainConfig(checkpoint_every=1), total_steps=8)  # no writer, no Ray
    assert "No checkpoint was written yet" in ckpts.advice()
    ckpts.path.parent.mkdir(parents=True)
    base = load_checkpoint(env["base"])
    save_checkpoint(ckpts.path, base.model, tokenizer=base.tokenizer, extra={"step": 3})
    assert f"continue from {ckpts.path} (optimizer step 3)" in ckpts.advice()
    assert "is from optimizer step 3" in ckpts.state()
    ckpts.path.write_bytes(b"damaged")  # unreadable: nothing to resume from
    assert "No checkpoint was written yet" in ckpts.advice()

    # a save still being written when the run fails (the learner's thread renames it a moment later,
    # as on a loaded machine): the advice waits for it, within CHECKPOINT_SETTLE_S
    save_checkpoint(ckpts.path, base.model, tokenizer=base.tokenizer, extra={"step": 3})
    ckpts.step, ckpts.unconfirmed = 3, 4
    late = threading.Timer(1.0, save_checkpoint, (ckpts.path, base.model),
                           {"tokenizer": base.tokenizer, "extra": {"step": 4}})
    late.start()
    try:
        assert f"continue from {ckpts.path} (optimizer step 4)" in ckpts.advice()
    finally:
        late.join()
