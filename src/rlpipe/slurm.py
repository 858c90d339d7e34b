"""The workflow under a cluster executor (SLURM): resources from the work, a job-status check before
anything is submitted, stopping, and a line per killed job. Called from workflow/rules/cluster.smk.

Why each exists (the executor plugin, snakemake-executor-plugin-slurm, alone):
- its default job-status command is ``sacct``, which on a cluster without an accounting database
  fails ("Slurm accounting storage is disabled") on every query, and the plugin then treats every job
  as still running: Snakemake waits forever and prints nothing. :func:`check_status_command` runs the
  very query the plugin will run, once, before any job is submitted, and fails with one line naming
  the setting (``slurm-status-command``) when it cannot be read;
- Snakemake's SIGTERM handler under a cluster executor waits for the running jobs to finish (hours
  for a training job, forever when their status cannot be read); Ctrl-C cancels them but then waits
  for the status thread's sleep (up to 3 minutes). :func:`stop` cancels this directory's SLURM jobs
  (``scancel``, bounded), says which, releases Snakemake's lock and exits 128 + the signal's number;
- a cancelled or timed-out job is one "Error in rule" among many lines; :func:`killed_job_lines`
  gives one line per such job with its SLURM log and the command that resumes it.
The memory and time a training job asks for come from its model and steps (:func:`train_mem_mb`,
:func:`train_runtime_min`) instead of one figure for every model. A training job across nodes
(``workflow.nodes_per_disaggregated``) asks for ``--nodes`` and one GPU share per node
(:func:`gpus_per_node`), and its command starts the allocation's Ray cluster (``rlpipe.ray_slurm``).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from rlpipe.lm.model_config import ModelConfig

# Floors: what a training job needs whatever its model (a local Ray instance, two actor processes
# with torch imported, the driver) and the shortest time limit worth queueing for.
MEM_FLOOR_MB = 4000
RUNTIME_FLOOR_MIN = 30
# Bytes of host memory per model parameter: fp32 weights, gradients and two Adam moments (16), plus a
# reference and a generator copy (8), with half again for checkpoint writes and allocator slack.
BYTES_PER_PARAMETER = 36
# Sustained training throughput assumed for the time limit (FLOP/s; forward + backward = 6 per
# parameter per token): deliberately low, so a job ends before its limit on any current machine.
FLOPS_PER_S = {"cpu": 2e10, "cuda": 2e13}
FAILED_STATES = ("CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE", "FAILED",
                 "BOOT_FAIL")
STATUS_TIMEOUT_S = 30


# ------------------------------------------------------------------------------- resources from the work

def hf_parameters(model_dir: str | Path) -> int | None:
    """Parameters of a HuggingFace decoder from its config.json (embeddings, attention, MLP), or None."""
    import json

    try:
        c = json.loads(Path(model_dir, "config.json").read_text())
        h, layers, ff, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    heads, kv = c.get("num_attention_heads", 1), c.get("num_key_value_heads", c.get("num_attention_heads", 1))
    attn = 2 * h * h + 2 * h * (h * kv // max(heads, 1))  # q, o + k, v (grouped)
    embed = v * h * (1 if c.get("tie_word_embeddings") else 2)
    return embed + layers * (attn + 3 * h * ff)


def model_parameters(model_section, base_model: str | None = None) -> int:
    """Parameters of a track's model: a given HF directory's, else the preset with its overrides."""
    if base_model:
        n = hf_parameters(base_model)
        if n is not None:
            return n
    return ModelConfig.from_preset(model_section.preset, **model_section.overrides).num_parameters()


def train_mem_mb(parameters: int) -> int:
    """Host memory (MB) for a training job: MEM_FLOOR_MB plus BYTES_PER_PARAMETER per parameter."""
    return MEM_FLOOR_MB + math.ceil(parameters * BYTES_PER_PARAMETER / 1e6)


def train_runtime_min(parameters: int, train) -> int:
    """Time limit (minutes) for a training job: RUNTIME_FLOOR_MIN plus its tokens' training FLOPs
    (steps x rollout batch x (prompt context + response) tokens x 6 per parameter, counted twice for
    rollouts and validation) at FLOPS_PER_S of its device."""
    tokens = train.n_grpo_steps * train.rollout_batch_size * train.sampling_max_tokens * 2
    rate = FLOPS_PER_S["cuda" if str(train.device).startswith("cuda") else "cpu"]
    return RUNTIME_FLOOR_MIN + math.ceil(6 * parameters * tokens / rate / 60)


# ------------------------------------------------------------------------------- the executor in use

def gpus_per_node(gpus: int, nodes: int) -> str:
    """sbatch flags (the ``slurm_extra`` resource) of a training job across ``nodes`` nodes: one
    actor per node, so ``--gpus-per-node`` with its share. The plugin's ``--gpus`` (from the ``gpu``
    resource, which ``--resources gpu=N`` counts) is the job's total, which SLURM may otherwise put
    on a single node. Empty for a job on one node, or without GPUs."""
    return f"--gpus-per-node={gpus // nodes}" if nodes > 1 and gpus else ""


def executor_name(workflow) -> str | None:
    plugin = getattr(workflow, "executor_plugin", None)
    return getattr(plugin, "name", None)


def under_slurm(workflow) -> bool:
    """The main Snakemake process submitting through the SLURM executor (not a job inside it)."""
    return executor_name(workflow) == "slurm" and workflow.is_main_process


def run_cores(workflow) -> int | None:
    """The cores a local run was given; None under a cluster executor, where Snakemake has no total
    (``workflow.cores`` raises there)."""
    return workflow.cores if workflow.local_exec else None


def status_command(settings) -> tuple[str, str]:
    """(name, the query) of the job-status command the SLURM plugin will run, by its own rules:
    its ``status_command`` setting, falling back to sacct where squeue would forget finished jobs
    too soon (MinJobAge under 3x the first check's delay) and to squeue where sacct is not installed."""
    from snakemake_executor_plugin_slurm import job_status_query as q

    name = getattr(settings, "status_command", None) or "sacct"
    init = getattr(settings, "init_seconds_before_status_checks", None) or 40
    if name == "squeue":
        age = q.get_min_job_age()
        if (age is None or age < 3 * init) and q.is_query_tool_available("sacct"):
            name = "sacct"
    if name == "sacct" and not q.is_query_tool_available("sacct"):
        name = "squeue"
    query = q.query_job_status_sacct if name == "sacct" else q.query_job_status_squeue
    return name, query("rlpipe-status-check")


def check_status_command(settings) -> None:
    """Run the plugin's job-status query once; raise RuntimeError with one line naming the setting
    when SLURM does not answer it (it would otherwise wait for every job forever)."""
    name, query = status_command(settings)
    try:
        proc = subprocess.run(shlex.split(query), capture_output=True, text=True, timeout=STATUS_TIMEOUT_S)
        problem = None if proc.returncode == 0 else (proc.stderr or proc.stdout).strip().splitlines()[-1:]
    except (OSError, subprocess.TimeoutExpired) as e:
        problem = [f"no answer ({type(e).__name__})"]
    if problem is not None:
        other = "squeue" if name == "sacct" else "sacct"
        raise RuntimeError(
            f"SLURM job status cannot be read with slurm-status-command={name} ({' '.join(problem) or 'failed'}): "
            f"Snakemake would wait for its jobs forever. Set `slurm-status-command: {other}` in the workflow "
            f"profile (or --slurm-status-command {other}); see docs/troubleshooting.md#slurm")


# ------------------------------------------------------------------------------- SLURM's own records

def _run(cmd: list[str], timeout: float = 10) -> str | None:
    """stdout of a SLURM command, or None when it fails or does not answer within ``timeout``."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse_scontrol(text: str) -> list[dict]:
    """``scontrol show job -o`` (one job a line, ``Key=Value`` fields) as dicts. A value may hold
    spaces only in the last fields SLURM prints (Command, WorkDir, StdOut...), which are paths here."""
    jobs = []
    for line in text.splitlines():
        fields, key = {}, None
        for word in line.split(" "):
            k, sep, v = word.partition("=")
            if sep and k and k[0].isalpha() and not k.startswith("/"):
                key, fields[k] = k, v
            elif key is not None:
                fields[key] += " " + word
        if fields.get("JobId"):
            jobs.append(fields)
    return jobs


def jobs_here(workdir: str | Path, timeout: float = 10) -> list[dict] | None:
    """The SLURM jobs whose working directory is ``workdir`` that slurmctld still holds (running,
    pending, or ended within MinJobAge), or None when SLURM does not answer."""
    out = _run(["scontrol", "show", "job", "-o"], timeout)
    if out is None:
        return None
    here = os.path.realpath(workdir)
    return [j for j in parse_scontrol(out) if os.path.realpath(j.get("WorkDir", "")) == here]


def job_label(job: dict) -> str:
    """``train_variant onpolicy`` from the plugin's comment ``rule_<rule>_wildcards_<values joined by _>``
    (an empty wildcard, the keyword track's ``tdir``, leaves a leading ``_``); ``group analysis`` for a
    group job, whose log directory is ``slurm_logs/group_<group>_<its first rules>``."""
    group = re.search(r"/slurm_logs/group_([^/_]+)", job.get("StdOut", ""))
    if group:
        return f"group {group.group(1)}"
    comment = job.get("Comment", "").strip().removeprefix("rule_")
    rule, _, values = comment.partition("_wildcards_")
    return " ".join(x for x in (rule, values.strip("_")) if x) or job.get("JobName", "?")


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that started this Snakemake (the profile reruns incomplete jobs, and
    `rlpipe train --resume auto` continues a run from its checkpoint)."""
    argv = list(sys.argv if argv is None else argv)
    argv[0] = "snakemake" if argv[0].endswith(("snakemake", "__main__.py")) else argv[0]
    return shlex.join(argv)


def killed_job_lines(jobs: list[dict], since_s: float, argv: list[str] | None = None) -> list[str]:
    """One line per job SLURM ended (cancelled, timed out, node failure...) submitted after
    ``since_s`` (epoch seconds): the job, its SLURM log, and the command that resumes it."""
    import datetime as dt

    lines = []
    for j in jobs:
        state = j.get("JobState", "")
        if state not in FAILED_STATES or state == "FAILED":  # a failed command has its own error and log
            continue
        try:
            submitted = dt.datetime.fromisoformat(j.get("SubmitTime", "")).timestamp()
        except ValueError:
            submitted = since_s
        if submitted < since_s - 1:
            continue
        why = {"TIMEOUT": f"ran past its time limit ({j.get('TimeLimit', '?')})",
               "CANCELLED": "was cancelled (scancel or the administrator)"}.get(state, f"ended {state}")
        lines.append(f"rlpipe: SLURM job {j['JobId']} ({job_label(j)}) {why}; SLURM log: {j.get('StdOut', '?')}; "
                     f"resume with: {resume_command(argv)} (training continues from its checkpoint)")
    return lines


def cancel_jobs_here(workdir: str | Path, timeout: float = 10) -> str:
    """scancel this directory's pending and running jobs; one sentence saying what became of them."""
    jobs = jobs_here(workdir, timeout)
    if jobs is None:
        return ("SLURM did not answer (scontrol show job), so its jobs of this run were left as they are; "
                "list them with `squeue --me` and cancel them with `scancel ID`")
    live = [j["JobId"] for j in jobs if j.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED",
                                                              "REQUEUED", "RESIZING")]
    if not live:
        return "no SLURM job of this run was running"
    if _run(["scancel", *live], timeout) is None:
        return (f"scancel did not answer: SLURM jobs {' '.join(live)} may still be running "
                f"(`squeue --me`; `scancel {' '.join(live)}`)")
    return (f"cancelled SLURM jobs {' '.join(live)} (scancel: a training job checkpoints before it ends; "
            "rerun the same command to resume)")


def stop(workflow, signum: int, frame=None) -> None:
    """SIGTERM/SIGINT under the SLURM executor: cancel this directory's jobs, say so, release
    Snakemake's lock and exit 128 + signum, all within seconds whatever SLURM answers."""
    signal.signal(signum, signal.SIG_DFL)  # a second signal ends the process at once
    what = cancel_jobs_here(os.getcwd())
    print(f"rlpipe: {signal.Signals(signum).name}: {what}.", file=sys.stderr, flush=True)
    try:
        workflow.persistence.unlock()
    except Exception:  # exiting regardless; a stale lock is `snakemake --unlock`
        pass
    os._exit(128 + signum)


def install_stop(workflow) -> None:
    """Make SIGTERM and SIGINT end a Snakemake that submits to SLURM (call from onstart)."""
    import functools
    import threading

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, functools.partial(lambda s, f, wf: stop(wf, s, f), wf=workflow))
