"""The GPUs each job declares, and the device it then runs on: a job declares exactly the GPUs its
command takes, so that ``--resources gpu=N`` counts them and the SLURM profile asks for them
(``--gpus``), and a job that declares none keeps off any GPU the machine has.

- Training (``variant_gpus``: 1 per colocated run, ``gpus_per_disaggregated`` per disaggregated one)
  and the scaling bench, whose points are training runs on the pipeline's settings: the most any of
  its modes takes (``scaling_gpus``). With none declared, its points run on the CPU.
- The benchmarks and evaluations that pick a device (``--device``) run where the pipeline trains:
  ``train.device``, with ``auto`` meaning CUDA where the config declares GPUs and the CPU where it
  declares none (``job_device``); they declare one GPU on CUDA, none on the CPU.
- The weight-sync bench measures the placements its GPUs allow (``weight_sync_placements``).
- Pretraining reads ``pretrain.device`` from its config (``auto``: CUDA where there is one); where it
  declares no GPU, its command runs with ``CUDA_VISIBLE_DEVICES`` empty (``env_prefix``).

``tests/test_gpu_declared.py`` reads every planned job's command and checks its declaration.
"""

from __future__ import annotations

from typing import Any

from rlpipe.contract import SCALING_MODES

#: the GPUs each placement of ``rlpipe bench weight-sync`` needs (cpu, one shared GPU, two GPUs)
PLACEMENT_GPUS = {"cpu": 0, "gpu-shared": 1, "gpu": 2}


def job_device(device: str, gpus_per_colocated: int) -> str:
    """The device a one-device job runs on: ``device``, with ``auto`` resolved by what the config
    declares (CUDA with GPUs declared, else the CPU; never a GPU the job did not ask for)."""
    if device == "auto":
        return "cuda" if gpus_per_colocated > 0 else "cpu"
    return device


def device_gpus(device: str) -> int:
    """GPUs a one-device job on ``device`` declares."""
    return 1 if device.startswith("cuda") else 0


def bench_device(cfg: Any) -> str:
    """Where the sampler, update and TRL benches run: where generation and the learner run."""
    return job_device(cfg.train.device, cfg.workflow.gpus_per_colocated)


def mode_gpus(workflow: Any, mode: str) -> int:
    """GPUs one training run of ``mode`` takes (as ``rlpipe.config.variant_gpus``)."""
    return workflow.gpus_per_disaggregated if mode == "disaggregated" else workflow.gpus_per_colocated


def scaling_gpus(cfg: Any) -> int:
    """GPUs the scaling bench holds: each point is a training run on the pipeline's settings, one
    at a time, so the most that any of its modes takes."""
    return max(mode_gpus(cfg.workflow, m) for m in SCALING_MODES)


def weight_sync_placements(gpus: int) -> str:
    """``--placements`` of the weight-sync bench: those its ``gpus`` allow."""
    return ",".join(p for p, need in PLACEMENT_GPUS.items() if need <= gpus)


def env_prefix(gpus: int) -> str:
    """A job's command prefix: ``env``, with ``CUDA_VISIBLE_DEVICES`` empty where it declares no GPU
    (a command that resolves ``auto`` itself then finds none)."""
    return "env" if gpus > 0 else "env CUDA_VISIBLE_DEVICES="


def eval_device(track: Any) -> str:
    """Where a track's evaluation runs: its training's device (``job_device``)."""
    p = track.pipeline
    return job_device(p.train.device, p.workflow.gpus_per_colocated)


def pretrain_gpus(track: Any) -> int:
    """A pretraining job's GPUs: one where its device is CUDA, or ``auto`` on a config that declares GPUs."""
    p = track.pipeline
    return device_gpus(job_device(p.pretrain.device, p.workflow.gpus_per_colocated))
