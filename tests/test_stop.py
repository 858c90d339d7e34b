"""Stopping when told (``rlpipe.trainer.stop``): the handlers of ``rlpipe train`` and their deadlines,
Snakemake's signals passed on to its jobs' commands, and SIGTERM to a real run, through ``rlpipe
train`` and through Snakemake: it stops within 30 s, its Ray processes are gone and its checkpoint
loads."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlpipe.trainer.stop import StopInterrupted, StopSignals
from user_env import activated_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def handlers():
    stop = StopSignals(grace_s=30.0, hard_s=60.0, repeat_s=0.3)
    stop.install()
    yield stop
    stop.restore()


def _wait_for_handler(stop: StopSignals, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not stop.requested and time.monotonic() < deadline:
        time.sleep(0.01)


def test_first_signal_asks_to_stop_and_a_later_second_one_interrupts(handlers):
    os.kill(os.getpid(), signal.SIGTERM)
    _wait_for_handler(handlers)
    assert handlers.requested and handlers.exit_code == 128 + signal.SIGTERM
    os.kill(os.getpid(), signal.SIGINT)  # at once: the same request delivered twice (Ctrl-C via Snakemake)
    time.sleep(0.4)
    with pytest.raises(StopInterrupted, match="SIGINT received a second time"):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises in this sleep
    assert handlers.exit_code == 128 + signal.SIGTERM  # the first signal's status


def test_restore_puts_the_previous_handlers_back():
    before = signal.getsignal(signal.SIGTERM)
    stop = StopSignals().install()
    assert signal.getsignal(signal.SIGTERM) == stop._handle
    stop.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_grace_interrupts_a_blocking_main_thread():
    stop = StopSignals(grace_s=0.3, hard_s=60.0).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        start = time.monotonic()
        with pytest.raises(StopInterrupted, match="did not reach the end of a round within 0.3 s of the SIGTERM"):
            time.sleep(20)  # one blocking call, as a ray.get on a long generation
        assert time.monotonic() - start < 10
    finally:
        stop.restore()


def test_hard_deadline_exits_with_the_signal_s_status_whatever_the_main_thread_does():
    code = textwrap.dedent("""
        import os, signal, time
        from rlpipe.trainer.stop import StopSignals, StopRequested
        StopSignals(grace_s=0.2, hard_s=0.8).install()
        os.kill(os.getpid(), signal.SIGTERM)
        while True:  # a main thread that swallows the interruption (stuck in a teardown)
            try:
                time.sleep(60)
            except StopRequested:
                pass
    """)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert time.monotonic() - start < 30
    assert "still running 0.8 s after the SIGTERM: exiting now" in r.stderr


FORWARDER = textwrap.dedent("""
    import signal, subprocess, sys
    from rlpipe.trainer import stop
    got = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))  # stands for Snakemake's own handler
    stop.forward_stop_signals()
    child = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda s, f: sys.exit(7)); "
             "print('command ready', flush=True); time.sleep(60)")
    job = subprocess.Popen(["bash", "-c", f"set -euo pipefail; {sys.executable} -c \\"{child}\\"; echo after"])
    rc = job.wait()
    print("job", rc, "snakemake's handler", got, flush=True)
""")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="forwarding reads /proc (Linux)")
def test_snakemake_s_signal_reaches_the_job_s_command_and_then_its_own_handler():
    """The job shell's command gets the SIGTERM (and exits 7, its own status, which the shell then
    returns: the shell itself was not killed), and the handler that was installed before still runs."""
    p = subprocess.Popen([sys.executable, "-c", FORWARDER], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "command ready"
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    assert out.strip() == f"job 7 snakemake's handler [{int(signal.SIGTERM)}]"


# --------------------------------------------------------------------------- real runs


def _ray_processes(pid: int) -> list:
    import psutil

    return [p for p in psutil.Process(pid).children(recursive=True)
            if p.name() in ("gcs_server", "raylet") or p.name().startswith("ray::")]


def _wait_for(path: Path, proc: subprocess.Popen, within: float = 300) -> None:
    deadline = time.time() + within
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert path.exists() and proc.poll() is None, f"{path} did not appear while the run was going"


def _stopped_cleanly(out: Path, ray_procs: list, live, step: int | None = None) -> int:
    """The checkpoint loads and is a resumable trainer checkpoint (of optimizer step ``step``), no
    process of the run's Ray instance is left (``live``: the ``live_processes`` fixture), no temporary
    file, the run is not marked finished."""
    from rlpipe.lm.checkpoint import load_checkpoint

    ckpt = load_checkpoint(out / "checkpoints" / "last.pt")
    assert {"step", "next_batch", "samples", "version"} <= set(ckpt.extra)
    assert step is None or int(ckpt.extra["step"]) == step
    deadline = time.time() + 10
    while live(ray_procs) and time.time() < deadline:
        time.sleep(0.2)
    assert not live(ray_procs), [p.name() for p in live(ray_procs)]
    assert not (out / "run_info.json").exists()
    assert not list(out.rglob("*.tmp"))
    return int(ckpt.extra["step"])


@pytest.mark.ray
def test_sigterm_to_rlpipe_train_stops_it_with_its_checkpoint_and_its_ray(tmp_path, tiny_base, write_config,
                                                                          live_processes):
    """SIGTERM mid-run to a disaggregated ``rlpipe train``: exit status 143 within 30 s, with the
    checkpoint of the round it stopped at, and no Ray process of the run left."""
    # far more steps than the run can take before the signal, even on a fast idle machine (a run that
    # completes first exits 0 and proves nothing); the variant sets no step count of its own
    cfg = write_config(tmp_path / "c.yaml", train={"n_grpo_steps": 2000, "checkpoint_every": 2},
                       variants={"disagg": {"mode": "disaggregated"}})
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlpipe.cli", "train", "--config", str(cfg), "--variant", "disagg",
           "--out", str(out), "--base", tiny_base[0], "--dataset", tiny_base[1], "--threads", "2"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(out / "checkpoints" / "last.pt", proc)
        ray_procs = _ray_processes(proc.pid)
        assert ray_procs
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert took < 30, f"took {took:.1f} s to stop"
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlpipe train disagg: stopped by SIGTERM after optimizer step "), last
    step = int(last.split("after optimizer step ")[1].split()[0])
    assert f"Rerun with --resume to continue from {out / 'checkpoints' / 'last.pt'} (optimizer step {step})" in last
    _stopped_cleanly(out, ray_procs, live_processes, step)  # the checkpoint is the one written at the stop


@pytest.mark.slow
@pytest.mark.workflow
def test_sigterm_to_snakemake_stops_the_training_job_and_snakemake(tmp_path, live_processes):
    """The smoke workflow, with a long training job: SIGTERM to the Snakemake process alone (not its
    process group; Snakemake would wait for the job to finish) while ``onpolicy`` trains. Snakemake
    exits within 30 s; the job stopped with its checkpoint and its Ray processes."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    (tmp_path / "config" / "long.yaml").write_text(  # the smoke caps' step limit raised: a long training job
        "smoke:\n  grpo_steps: 2000\ntrain:\n  n_grpo_steps: 2000\n  checkpoint_every: 2\n")
    env = activated_env()
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", "config/smoke.yaml", "config/long.yaml", "--cores", "2",
           "results/runs/onpolicy/run_info.json"]
    log = open(tmp_path / "snakemake.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    out = tmp_path / "results" / "runs" / "onpolicy"
    try:
        _wait_for(out / "checkpoints" / "last.pt", proc, within=900)
        ray_procs = _ray_processes(proc.pid)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    job_log = (tmp_path / "logs" / "train_variant" / "onpolicy.log").read_text()
    assert took < 30, f"Snakemake took {took:.1f} s to exit\n{(tmp_path / 'snakemake.log').read_text()[-3000:]}"
    assert proc.returncode != 0
    assert "rlpipe train onpolicy: stopped by SIGTERM after optimizer step" in job_log, job_log[-3000:]
    _stopped_cleanly(out, ray_procs, live_processes)
