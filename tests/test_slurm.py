"""The workflow on a real SLURM: Debian's packages brought up by tests/slurm/cluster.sh (two nodes on
this host, three fake GPUs each, no accounting database), driven through the shipped
workflow/profiles/slurm exactly as docs/gpu-and-clusters.md#slurm shows.

Where the cluster cannot be brought up (not root, no apt-get) these tests skip with the script's one
line, and fail instead when CI=true (``cluster`` in tests/conftest.py). The whole smoke workflow runs
through it once with GPUs declared (``slurm_smoke``: in CI the suite's one smoke run, else one of its
own): every job through sbatch, each with the GPUs it declares (benchmarks and evaluations too). The
other tests copy its data and base model and train only.

No process of a test outlives it: SLURM's process tracking here (proctrack/linuxproc) loses a
re-parented process, and a job-level Snakemake left by a stopped job once outlived CI. After each test
(and the smoke run) its SLURM jobs still queued or running are cancelled and every process whose
working directory, command line or environment names the test's directory gets SIGTERM, then SIGKILL;
the test fails if one survives that.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from rlpipe import slurm
from slurm_harness import (
    NODE_CPUS,
    SLURM_GPU_POOL,
    assert_none_outlives,
    end_everything_of,
    finish,
    job_records,
    processes_of,
    read,
    slurmctld_pid,
    start,
)

ROOT = Path(__file__).resolve().parents[1]
TRAINS = ["results/runs/onpolicy/metrics.parquet", "results/runs/disagg/metrics.parquet"]
#: the GPUs each job of the smoke workflow declares with slurm_harness.GPUS (train.device stays cpu: the
#: benchmarks and evaluations that run where training runs take none; the scaling bench's points are
#: training runs)
SMOKE_GPUS = {"train_variant onpolicy": 1, "train_variant k2": 1, "train_variant disagg": 2,
              "train_variant math onpolicy": 1, "train_variant tracks_wordrev disagg": 2,
              "bench_scaling": 2, "bench_weight_sync": 2, "bench_sampler": 0, "bench_update": 0,
              "evaluate_model math base": 0}

pytestmark = [pytest.mark.workflow, pytest.mark.timeout(2400)]


@pytest.fixture(autouse=True)
def no_leftovers(request):
    """After each test that has a directory: nothing of it still queued or running (module docstring)."""
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is not None:
        assert_none_outlives(root)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def workdir_with(tmp_path: Path, overlay: dict, name: str) -> Path:
    w = tmp_path / name
    shutil.copytree(ROOT / "config", w / "config")
    (w / "config" / "test.yaml").write_text(yaml.safe_dump(overlay))
    return w


def test_smoke_workflow_runs_every_job_through_sbatch_with_its_gpus(slurm_smoke):
    w, out, jobs = slurm_smoke.workdir, slurm_smoke.output, slurm_smoke.slurm_jobs
    assert "localrule" not in out.replace("localrule all:", ""), "a job ran outside SLURM"
    submitted = set(re.findall(r"submitted with SLURM jobid (\d+)", out))
    by_label = {words(slurm.job_label(j)): j for j in jobs}  # 'train_variant math__onpolicy': the math track's
    # every job Snakemake submitted ran to completion under SLURM, the benchmarks and evaluations too
    assert submitted == {j["JobId"] for j in jobs}, (sorted(submitted), sorted(by_label))
    assert {j["JobState"] for j in jobs} == {"COMPLETED"}, [(k, j["JobState"]) for k, j in by_label.items()]
    timing = json.loads((w / "results/run_timing.json").read_text())
    # the analysis jobs (aggregations, figures, reports, the results page) went as ONE sbatch job, a group
    # within one node's CPUs; each track's preparation chain (data, tokenizer, base) as one job per track;
    # every other job as its own
    (group,) = [j for j in jobs if slurm.job_label(j) == "group analysis"]
    assert int(group["NumCPUs"]) <= NODE_CPUS and group["JobState"] == "COMPLETED", group
    prepare = [j for j in jobs if slurm.job_label(j) == "group prepare"]
    assert len(prepare) == 3, sorted(by_label)  # the keyword, math and example tracks
    grouped = {r: n for r, n in timing["rules"].items() if r.startswith(ANALYSIS_RULES + PREPARE_RULES)}
    assert sum(grouped.values()) >= 20 + 9 and sum(timing["rules"].values()) - timing["rules"].get("all", 0) == (
        len(submitted) - 1 - len(prepare) + sum(grouped.values())), timing
    assert {"bench_scaling", "bench_weight_sync", "bench_sampler", "bench_update", "evaluate_model",
            "train_family_run", "report_family", "aggregate_metrics", "write_results_page"} <= set(timing["rules"])
    # SLURM's own record of the GPUs each job was given (sbatch --gpus) is what the job declares
    assert {k: job_gpus(by_label[k]) for k in SMOKE_GPUS} == SMOKE_GPUS
    for variant, n in (("onpolicy", 1), ("disagg", 2)):
        info = json.loads((w / f"results/runs/{variant}/run_info.json").read_text())
        # the GPUs the run saw (its Ray instance started with CUDA_VISIBLE_DEVICES from SLURM)
        assert info["finished"] is True and (info["devices"], info["device_type"]) == (n, "gpu"), info
    # the scaling bench's points trained on the GPUs its job was given (they found none before)
    assert json.loads((w / "results/bench/scaling.json").read_text())["gpus"] == 2
    assert "its points run on 2 GPU(s)" in (w / "logs/bench_scaling/bench_scaling.log").read_text()
    # the onsuccess hook ran under the cluster executor (it used to fail on workflow.cores); the training
    # jobs: keyword's three variants, math's one and the example track's three
    assert timing["cores"] is None and timing["rules"]["train_variant"] == 7, timing


#: the rules of the analysis and prepare groups (workflow/rules/common.smk, ANALYSIS_GROUP, PREPARE_GROUP),
#: by name prefix
ANALYSIS_RULES = ("aggregate_", "plot_", "report_", "write_results_page")
PREPARE_RULES = ("build_corpus", "build_math_data", "build_track_data", "import_base", "train_tokenizer",
                 "pretrain_base")


def words(label: str) -> str:
    """A job label with its separators as single spaces ('math/' and '_' between wildcards alike)."""
    return " ".join(re.split(r"\s+|_{2,}", label.strip().replace("/", "_")))


def job_gpus(job: dict) -> int:
    """GPUs SLURM allocated a job: TresPerJob=gres:gpu:N (without accounting, the TRES field that would
    count them cannot be configured)."""
    m = re.search(r"gres:gpu:(\d+)", job.get("TresPerJob", ""))
    return int(m.group(1)) if m else 0


def test_gpu_jobs_never_exceed_the_gpus_given(slurm_smoke):
    """--resources gpu=SLURM_GPU_POOL: the GPU jobs running at once never hold more GPUs than that."""
    jobs = slurm_smoke.slurm_jobs
    spans = [(j["StartTime"], j["EndTime"], job_gpus(j)) for j in jobs if job_gpus(j)]
    assert len(spans) >= sum(1 for n in SMOKE_GPUS.values() if n), jobs
    for start_t, _, _ in spans:
        assert sum(n for s, e, n in spans if s <= start_t < e) <= SLURM_GPU_POOL, spans


def test_unreadable_job_status_fails_within_a_minute_naming_the_setting(cluster, tmp_path):
    """The plugin's default, sacct, on a cluster without accounting: it used to wait forever."""
    w = workdir_with(tmp_path, {}, "status")
    t0 = time.monotonic()
    proc = start(w, TRAINS[0], overlays=("config/smoke.yaml",), extra=("--slurm-status-command", "sacct"))
    rc, out = finish(proc, w, timeout=90)
    assert rc != 0 and time.monotonic() - t0 < 60, out[-2000:]
    lines = [x for x in out.splitlines() if "SLURM job status cannot be read" in x]
    assert len(lines) == 1 and "slurm-status-command=sacct" in lines[0], out[-2000:]
    assert "accounting storage is disabled" in lines[0], lines
    assert "submitted with SLURM jobid" not in out


def trained_workdir(smoke, tmp_path: Path, overlay: dict, name: str) -> Path:
    """A workdir holding the smoke run's data and base model (copied with their times), so that
    only training runs; training long enough (smoke.grpo_steps) to be stopped midway."""
    src = smoke.workdir
    w = workdir_with(tmp_path, overlay, name)
    for d in ("results/data", "results/tokenizer", "results/base"):
        shutil.copytree(src / d, w / d)
    return w


def running_training(workdir: Path, variants) -> dict:
    """{variant: job} of this directory's running training jobs with a checkpoint written."""
    jobs = slurm.jobs_here(workdir) or []
    out = {}
    for j in jobs:
        rule, _, variant = slurm.job_label(j).partition(" ")
        if rule == "train_variant" and variant in variants and j.get("JobState") == "RUNNING" and (
                workdir / f"results/runs/{variant}/checkpoints/last.pt").exists():
            out[variant] = j
    return out if set(out) == set(variants) else {}


# ~5 tiny steps a second here: thousands of steps keep a job running for minutes, past a 1-minute --time
LONG = {"smoke": {"grpo_steps": 4000}, "train": {"n_grpo_steps": 4000, "checkpoint_every": 1, "val_every": 200}}


#: How a training job is ended: scancel (default suite), or its 1-minute --time (slow: SLURM's smallest
#: limit, and its controller checks limits every 30 s, so it takes 2-3 minutes by nature; the cancelled
#: case runs the same path, the plugin reporting the ended job and rlpipe.slurm.killed_job_lines naming
#: it, and tests/test_slurm_units.py holds the timed-out line).
KILLS = [pytest.param("k2", "scancel", "was cancelled", id="cancelled"),
         pytest.param("onpolicy", "time limit", "ran past its time limit", id="timed-out", marks=pytest.mark.slow)]
#: After a job fails, Snakemake's exit waits out the plugin's current pause between status checks, which
#: grows by 10 s after each check that finds no job completed (docs/troubleshooting.md): from a 1 s start
#: the checks fall at 1, 12, 33, 64 s instead of 5, 20, 45, 80 s, so the ended job is seen and the pause
#: waited out sooner. One job is checked, so the checks cost nothing.
QUICK_CHECKS = ("--slurm-init-seconds-before-status-checks", "1")


@pytest.mark.parametrize("variant,how,why", KILLS)
def test_a_cancelled_or_timed_out_training_names_its_log_and_resumes(slurm_smoke, tmp_path, variant, how, why):
    """A training job ended by SLURM (scancel, or past its --time): one line naming the job, its SLURM log
    and the command that resumes it; the rerun resumes the run from its checkpoint."""
    w = trained_workdir(slurm_smoke, tmp_path, LONG, "killed")
    target = f"results/runs/{variant}/metrics.parquet"
    limit = ("--set-resources", "train_variant:runtime=1") if how == "time limit" else ()
    proc = start(w, target, overlays=("config/smoke.yaml", "config/test.yaml"),
                 extra=("--keep-going", *limit, *QUICK_CHECKS))
    try:
        job = wait_for(lambda: running_training(w, {variant}), 400, "a checkpointed training job")[variant]
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(read(w)[-3000:]) from None
    if how == "scancel":
        subprocess.run(["scancel", job["JobId"]], check=True, timeout=30)
    rc, out = finish(proc, w, timeout=400)
    assert rc != 0
    lines = [x for x in out.splitlines() if x.startswith("rlpipe: SLURM job ")]
    assert len(lines) == 1, out[-4000:]
    assert f"SLURM job {job['JobId']} (train_variant {variant}) {why}" in lines[0], lines[0]
    assert f"SLURM log: {job['StdOut']}" in lines[0] and Path(job["StdOut"]).is_file(), lines[0]
    assert "resume with: snakemake " in lines[0] and "--workflow-profile" in lines[0], lines[0]
    # the rerun (the printed command, less a 1-minute limit) resumes the run from its checkpoint
    rerun = start(w, target, overlays=("config/smoke.yaml", "config/test.yaml"))
    log = w / f"logs/train_variant/{variant}.log"
    wait_for(lambda: log.exists() and "resuming from" in log.read_text(), 300, "the resumed run")
    os.killpg(rerun.pid, signal.SIGTERM)
    finish(rerun, w, timeout=60)


@pytest.mark.parametrize("sig,status_fails", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["sigterm-running", "ctrl-c-while-status-fails"])
def test_a_stop_signal_ends_snakemake_within_30_s_and_says_what_became_of_its_jobs(
        slurm_smoke, tmp_path, sig, status_fails):
    """SIGTERM used to wait for the running jobs (forever while the status query failed)."""
    w = trained_workdir(slurm_smoke, tmp_path, LONG, "stop")
    proc = start(w, "results/runs/onpolicy/metrics.parquet", overlays=("config/smoke.yaml", "config/test.yaml"))
    try:
        job = wait_for(lambda: running_training(w, {"onpolicy"}), 400, "a checkpointed training job")["onpolicy"]
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(read(w)[-3000:]) from None
    ctld = slurmctld_pid()
    try:
        if status_fails:  # a controller that does not answer: every squeue/scontrol/scancel hangs
            os.kill(ctld, signal.SIGSTOP)
            time.sleep(8)
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        rc, out = finish(proc, w, timeout=30)
        took = time.monotonic() - t0
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert took < 30 and rc == 128 + sig, (took, rc, out[-2000:])
    line = next(x for x in out.splitlines() if x.startswith(f"rlpipe: {signal.Signals(sig).name}: "))
    if status_fails:
        assert "left as they are" in line and "squeue --me" in line, line
        subprocess.run(["scancel", job["JobId"]], timeout=30)
    else:
        assert f"cancelled SLURM jobs {job['JobId']} " in line, line
        state = wait_for(lambda: next((j["JobState"] for j in job_records(w) if j["JobId"] == job["JobId"]
                                       and j["JobState"] not in ("RUNNING", "COMPLETING")), None), 60, "job end")
        assert state == "CANCELLED", state
    assert not (w / ".snakemake" / "locks").exists() or not any((w / ".snakemake" / "locks").iterdir())


def test_what_a_test_leaves_is_ended_even_when_it_ignores_sigterm(tmp_path, live_processes):
    """The leftover that outlived CI ignored SIGTERM and had been re-parented: one like it (its own
    session, SIGTERM ignored) and one whose environment names the test's directory are ended; a
    process of another directory is left alone."""
    w, other = tmp_path / "w", tmp_path.parent / f"{tmp_path.name}-other"
    w.mkdir()
    other.mkdir(exist_ok=True)
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; while :; do sleep 1; done"], cwd=w,
                                start_new_session=True)
    named = subprocess.Popen(["sleep", "300"], cwd="/", env=dict(os.environ, RLPIPE_TEST_DIR=str(w)))
    bystander = subprocess.Popen(["sleep", "300"], cwd=other)
    try:
        time.sleep(0.5)
        found = {p.pid for p in processes_of(tmp_path)}
        assert {stubborn.pid, named.pid} <= found and bystander.pid not in found, found
        ended = end_everything_of(tmp_path, grace=2)
        assert len(ended) >= 2 and live_processes([psutil.Process(bystander.pid)]), ended
        assert not [p for p in (stubborn, named) if p.poll() is None and psutil.pid_exists(p.pid)], ended
        assert not processes_of(tmp_path)
    finally:
        bystander.kill()
        bystander.wait()
        shutil.rmtree(other, ignore_errors=True)
