"""The test SLURM cluster and the workflow driven through it, for the suite's smoke run
(tests/conftest.py, ``smoke_run``) and the SLURM tests (tests/test_slurm.py,
tests/test_slurm_multinode.py).

The cluster is Debian's packages brought up by tests/slurm/cluster.sh: two nodes on this host, three fake
GPUs each, no accounting database. The workflow goes through the shipped workflow/profiles/slurm
exactly as docs/gpu-and-clusters.md#slurm shows (``command``).

No process of a test outlives it: SLURM's process tracking here (proctrack/linuxproc) loses a
re-parented process, and a job-level Snakemake left by a stopped job once outlived CI.
``end_everything_of`` cancels a directory's SLURM jobs still queued or running and ends every process
whose working directory, command line or environment names it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from rlpipe import slurm
from user_env import activated_env

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
PROFILE = ROOT / "workflow" / "profiles" / "slurm"
#: the first status check 5 s after a submission and after each finished job, not the plugin's 40 s (a
#: test-speed setting: the plugin then waits 10 s longer after each check that finds nothing finished,
#: so a job is seen done 5, 20 or 45 s after the last check that saw one; 1 s gives 1, 12, 33: the smoke
#: run's small jobs take 12-20 s under SLURM here, and the whole run took longer with 1 s)
FAST = ["--slurm-init-seconds-before-status-checks", "5"]
#: a test node's CPUs (cluster.sh declares this host's on each, `nproc`): the docs' `--cores N`, which caps
#: a job's threads and the analysis group job (workflow/profiles/slurm) at one node
NODE_CPUS = len(os.sched_getaffinity(0))
#: fake GPUs per variant (train.device stays cpu): what a cluster user's overlay declares
GPUS = {"workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 2}}
#: the smoke run's --resources gpu: two 2-GPU jobs at once, fewer than the cluster's six fake GPUs
#: (tests/slurm/cluster.sh), so that Snakemake's pool, not SLURM, is what bounds them
SLURM_GPU_POOL = 4
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")
SLURM_DAEMONS = ("slurmstepd", "slurmd", "slurmctld", "munged")


def processes_of(root: Path) -> list[psutil.Process]:
    """Processes whose working directory, command line or environment names ``root`` (a test's
    directory): its Snakemake, the jobs SLURM started there, their commands and their Ray instances.
    Not this process or its parents."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    here, out = str(root), []

    def names(text: str) -> bool:
        return text == here or f"{here}/" in text

    for p in psutil.process_iter():
        if p.pid in mine:
            continue
        try:
            if p.name().startswith(SLURM_DAEMONS):  # SLURM's own (a job step's slurmstepd is SLURM's to end)
                continue
            if names(p.cwd()) or any(map(names, p.cmdline())) or any(map(names, p.environ().values())):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:200]}"
    except psutil.Error:
        return f"{p.pid} (gone)"


def end_everything_of(root: Path, grace: float = 10) -> list[str]:
    """Cancel the SLURM jobs still queued or running in ``root``'s workdirs, then SIGTERM every process
    of ``root`` (``processes_of``), SIGKILL what is left after ``grace`` s; returns what was ended."""
    for w in (d for d in [root, *root.iterdir()] if d.is_dir()):
        live = [j["JobId"] for j in slurm.jobs_here(w) or [] if j.get("JobState") not in ENDED]
        if live:
            subprocess.run(["scancel", *live], capture_output=True, timeout=30)
    ended: list[str] = []
    for attempt in range(5):  # a loop in a leftover may start a child between a scan and the kill
        procs = processes_of(root)
        if not procs:
            break
        ended += [describe(p) for p in procs]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill() if attempt else p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=grace if attempt == 0 else 5)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
    return ended


def assert_none_outlives(root: Path) -> None:
    ended = end_everything_of(root)
    survivors = [describe(p) for p in processes_of(root)]
    assert not survivors, f"processes of {root} survived SIGKILL: {survivors} (ended: {ended})"
    if ended:
        print(f"ended what the test left in {root}: {ended}")


def slurmctld_pid() -> int:
    """The test cluster's slurmctld, from the pid file tests/slurm/cluster.sh keeps."""
    return int(Path(os.environ.get("RLPIPE_SLURM_DIR", "/var/lib/rlpipe-slurm"), "run", "slurmctld.pid").read_text())


def controller_running() -> bool:
    """The test cluster's slurmctld is alive: the cluster is someone's (CI's .ci/run, an earlier test
    module), even while its nodes are busy ending a test's jobs."""
    with contextlib.suppress(OSError, ValueError):
        return psutil.pid_exists(slurmctld_pid())
    return False


#: CI brings the cluster up in the background while pip installs (.ci/run): the file it names gets the
#: bring-up's exit status and the second it ended, written at once (a rename) when ``cluster.sh up`` ends
BRINGUP_ENV = "RLPIPE_SLURM_BRINGUP"


def wait_for_bringup(timeout: float = 900) -> None:
    """Wait for a bring-up that ``BRINGUP_ENV`` names, if any, to end (its status: ``Cluster``, ``status``)."""
    status = os.environ.get(BRINGUP_ENV)
    if not status:
        return
    deadline = time.monotonic() + timeout
    while not Path(status).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the test cluster's bring-up ({BRINGUP_ENV}={status}) did not end in {timeout:.0f} s")
        time.sleep(1)


def answers() -> bool:
    """The test cluster answers (``cluster.sh status``: both nodes), once a bring-up in progress ended."""
    wait_for_bringup()
    return shutil.which("sinfo") is not None and subprocess.run(
        ["bash", str(CLUSTER), "status"], capture_output=True).returncode == 0


class Cluster:
    """The test cluster, brought up (or found up) once per pytest process: ``available`` (or
    ``reason``, the script's one line, where it cannot be: not root, no apt-get), and whether this
    process started it (then ``down`` stops it). A cluster that was running stays up for whoever
    started it: the rest of the suite's Snakemake commands ask it (docs/troubleshooting.md, SLURM)."""

    def __init__(self) -> None:
        self.was_up = answers() or (shutil.which("sinfo") is not None and controller_running())
        proc = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True, timeout=600)
        self.available = proc.returncode == 0
        self.reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        if proc.returncode not in (0, 2):
            raise RuntimeError(f"tests/slurm/cluster.sh up failed:\n{proc.stderr[-2000:]}")

    def down(self) -> None:
        if self.available and not self.was_up:
            subprocess.run(["bash", str(CLUSTER), "down"], capture_output=True, timeout=120)


def command(workdir: Path, *targets: str, overlays=("config/smoke.yaml",), extra=()) -> list[str]:
    """The docs' command: targets, the workflow profile, the nodes' CPUs, the overlays, plus what the test
    sets."""
    return [sys.executable, "-m", "snakemake", *targets, "-s", str(ROOT / "Snakefile"), "--directory",
            str(workdir), "--workflow-profile", str(PROFILE), "--cores", str(NODE_CPUS), *FAST, *extra,
            "--configfile", *overlays]


def start(workdir: Path, *targets: str, **kw) -> subprocess.Popen:
    """``command`` started in its own session, output to ``workdir/snakemake.out``; the venv's bin/ leads
    PATH, as for a user who activated it (the jobs' ``rlpipe``, ``python``: sbatch passes it on)."""
    env = activated_env()
    with open(workdir / "snakemake.out", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(command(workdir, *targets, **kw), cwd=workdir, stdout=log, env=env,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


def read(workdir: Path) -> str:
    return (workdir / "snakemake.out").read_text()


def finish_recording_jobs(proc: subprocess.Popen, workdir: Path, timeout: float) -> tuple[int, str, list[dict]]:
    """``finish``, with every SLURM job of ``workdir`` recorded while it runs (slurmctld forgets an
    ended job after MinJobAge: a long run's first jobs would be gone at its end); a job's last record."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update({j["JobId"]: j for j in slurm.jobs_here(workdir) or []})
        with contextlib.suppress(subprocess.TimeoutExpired):  # every 5 s, and at once when it exits
            proc.wait(timeout=5)
    rc, out = finish(proc, workdir, max(1.0, deadline - time.monotonic()))
    seen.update({j["JobId"]: j for j in job_records(workdir)})
    return rc, out, list(seen.values())


def finish(proc: subprocess.Popen, workdir: Path, timeout: float) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"snakemake still running after {timeout:.0f} s:\n{read(workdir)[-3000:]}") from None
    return rc, read(workdir)


def job_records(workdir: Path) -> list[dict]:
    jobs = slurm.jobs_here(workdir)
    assert jobs is not None, "scontrol show job did not answer"
    return jobs
