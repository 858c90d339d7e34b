# The workflow under a cluster executor (rlpipe.slurm says why each piece exists).
#
# Account and partitions: workflow.slurm_account, workflow.slurm_partition and
# workflow.slurm_gpu_partition (one overlay, docs/gpu-and-clusters.md#slurm) become every rule's
# slurm_account / slurm_partition resources; a rule that declares a `gpu` resource gets the GPU
# partition. A value given with --set-resources RULE:slurm_partition=... (or in a profile) wins.
import time as _time


def _partition(gpu, cpu_part, gpu_part):
    """A rule's slurm_partition: the GPU partition for its jobs that declare GPUs (per job when its
    `gpu` is computed per job), else the other one."""
    ev = getattr(gpu, "_evaluator", None) if gpu is not None else None
    if ev is None:
        return gpu_part if gpu is not None and (gpu.value or 0) > 0 else cpu_part
    return lambda wildcards: (gpu_part if ev(wildcards) > 0 else cpu_part) or ""


def _cluster_resources() -> None:
    w = CFG.workflow
    given = workflow.resource_settings.overwrite_resources or {}
    for r in workflow.rules:
        settings = {"slurm_account": w.slurm_account,
                    "slurm_partition": _partition(r.resources.get("gpu"), w.slurm_partition,
                                                  w.slurm_gpu_partition or w.slurm_partition)}
        for key, value in settings.items():
            if value is not None and key not in given.get(r.name, {}):
                r.resources[key] = value


_cluster_resources()
_ONSTART_BEFORE_CLUSTER = globals().get("onstart")
_CLUSTER_START = _time.time()


# Under the SLURM executor, before any job is submitted: the job-status query must answer (else
# Snakemake would wait forever), and SIGTERM/Ctrl-C cancel this run's jobs and exit within seconds.
onstart:
    if _ONSTART_BEFORE_CLUSTER is not None:
        _ONSTART_BEFORE_CLUSTER()
    if slurm.under_slurm(workflow):
        try:
            slurm.check_status_command(workflow.executor_settings)
        except RuntimeError as _e:
            raise WorkflowError(str(_e)) from None
        slurm.install_stop(workflow)


# A job SLURM ended (scancel, its time limit, a node failure) gets one line: the job, its SLURM log
# and the command that resumes it.
onerror:
    if slurm.under_slurm(workflow):
        for _line in slurm.killed_job_lines(slurm.jobs_here(os.getcwd()) or [], _CLUSTER_START):
            print(_line, file=sys.stderr, flush=True)
