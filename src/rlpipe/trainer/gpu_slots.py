"""GPU slot pinning for concurrent Snakemake jobs.

Snakemake's ``gpu`` resource only *counts*: with ``--resources gpu=4`` it runs up to four 1-GPU
jobs at once but sets no ``CUDA_VISIBLE_DEVICES``, so every job would start on GPU 0. This module
hands each job distinct GPUs with advisory file locks:

* the pool is ``CUDA_VISIBLE_DEVICES`` when it is set (indices or UUIDs, kept as given, so a
  cluster scheduler's allocation is respected), else ``range(total)``;
* slot ``d`` of node ``h`` is the file ``<lock_dir>/gpu-<h>-<d>.lock`` (default
  ``results/.gpu_slots``; ``h`` is SLURM's node name where a job runs under SLURM, else the host
  name): the results directory is shared between nodes on a cluster, and each node numbers its GPUs
  from 0, so a lock names the node as well as the device; a job takes ``n`` slots with non-blocking
  ``fcntl.flock(LOCK_EX)`` and writes its pid into the file for diagnostics;
* a job that a scheduler gave GPUs (SLURM sets ``SLURM_JOB_GPUS`` or ``SLURM_STEP_GPUS`` beside
  ``CUDA_VISIBLE_DEVICES``) takes them without locks: the scheduler already made them exclusive, and
  a flock on a cluster's shared filesystem is not to be relied on;
* if it cannot get all ``n`` it releases what it got and retries every ``poll_s`` (never holding
  some while waiting for more, so two jobs that each need two GPUs cannot deadlock), and raises
  ``TimeoutError`` listing the holders after ``timeout_s``;
* inside the context ``CUDA_VISIBLE_DEVICES`` is the acquired list (Ray, started afterwards in
  the same process, then sees only those GPUs and hands them to its actors); on exit the previous
  value is restored and the locks released.

A killed job frees its slots without cleanup: the kernel drops a ``flock`` when the last
descriptor of the open file closes, which process death does. The descriptors are opened
non-inheritable (Python's default), so subprocesses such as Ray's raylet do not keep a slot alive
after the job exits. ``n = 0`` is a no-op (CPU jobs touch nothing). ``flock`` is per host: the lock
directory must be on the machine's local filesystem (on NFS, flock may not be coherent across
hosts, but jobs on different hosts use different GPUs anyway).

Inside a job, ``actor_gpus`` says what share of those GPUs each compute actor asks Ray for: a
colocated worker one GPU; a disaggregated learner and generator one each with two GPUs, or half of
the one GPU each (``workflow.gpus_per_disaggregated: 1``: Ray's fractional GPUs, both actors on the
same device and inside Ray's accounting; ``run_info.json`` records the shares as ``gpu_fraction``).

Departure from the seeds: the seeds run one experiment at a time by hand; concurrent variants on a
multi-GPU host are a pipeline concern they do not address. Seed 000 gives a disaggregated variant two
GPUs; one GPU shared by the two actors is the same algorithm on half the hardware (its timings then
measure two processes sharing a chip, not two chips).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ENV = "CUDA_VISIBLE_DEVICES"
DEFAULT_LOCK_DIR = Path("results") / ".gpu_slots"


def actor_gpus(mode: str, gpus: int) -> dict[str, float]:
    """The Ray GPUs (``num_gpus``) each compute actor of a run asks for, by role, given the GPUs its
    job declared (``rlpipe.config.variant_gpus``): colocated ``{"colocated": min(gpus, 1)}``;
    disaggregated ``{"learner": s, "generator": s}`` with s = 1 for two GPUs or more, 0.5 for one
    (both on the same GPU) and 0 for none (CPU)."""
    if gpus < 0:
        raise ValueError(f"number of GPUs must be >= 0, got {gpus}")
    if mode != "disaggregated":
        return {"colocated": float(min(gpus, 1))}
    share = 1.0 if gpus >= 2 else 0.5 if gpus == 1 else 0.0
    return {"learner": share, "generator": share}


@dataclass
class GpuSlots:
    devices: list[str]  # what CUDA_VISIBLE_DEVICES is set to inside the context
    lock_paths: list[Path] = field(default_factory=list)
    waited_s: float = 0.0


def gpu_pool(total: int | None = None) -> list[str]:
    """The devices to allocate from: ``CUDA_VISIBLE_DEVICES`` if set, else ``0..total-1``."""
    visible = os.environ.get(ENV)
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    if total is None:
        import torch  # device_count() asks NVML and does not initialise CUDA in this process

        total = torch.cuda.device_count()
    return [str(i) for i in range(total)]


#: Set by SLURM in a job given GPUs (``--gpus``, ``--gres=gpu``): the allocation is the job's alone.
SCHEDULER_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


def node_name() -> str:
    """The node a lock belongs to: SLURM's name for it (several ``slurmd`` may share one host), else
    the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def scheduler_gpus() -> bool:
    """Whether a scheduler gave this job its GPUs (``CUDA_VISIBLE_DEVICES`` and SLURM's GPU variables)."""
    return ENV in os.environ and any(os.environ.get(v) for v in SCHEDULER_GPU_VARIABLES)


#: Set inside ``acquire_gpus``'s locked context to the slots held (and inherited by the processes
#: started there): a nested acquisition, such as each run of the scaling bench, which holds the
#: slots for all its runs, takes from them without locking them a second time.
HELD_ENV = "RLPIPE_GPU_SLOTS_HELD"


def held_gpus() -> bool:
    """Whether this process (or its parent) holds the slots ``CUDA_VISIBLE_DEVICES`` names."""
    return ENV in os.environ and os.environ.get(HELD_ENV) == os.environ[ENV]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _lock_path(lock_dir: Path, device: str) -> Path:
    return lock_dir / f"gpu-{_safe(node_name())}-{_safe(device)}.lock"


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _release(fds: list[int]) -> None:
    for fd in fds:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _holders(paths: list[Path]) -> str:
    out = []
    for p in paths:
        try:
            out.append(f"{p.name}: pid {p.read_text().strip() or '?'}")
        except OSError:
            out.append(f"{p.name}: ?")
    return ", ".join(out)


def _take(pool: list[str], n: int, lock_dir: Path) -> tuple[list[str], list[int]]:
    """One pass: lock up to ``n`` free slots in pool order."""
    got, fds = [], []
    for device in pool:
        fd = _try_lock(_lock_path(lock_dir, device))
        if fd is not None:
            got.append(device)
            fds.append(fd)
            if len(got) == n:
                break
    return got, fds


@contextlib.contextmanager
def _pinned(devices: list[str], name: str = ENV) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` (or ``name``) = ``devices`` inside the context, the previous value after it."""
    previous = os.environ.get(name)
    os.environ[name] = ",".join(devices)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextlib.contextmanager
def acquire_gpus(n: int, total: int | None = None, lock_dir: str | os.PathLike = DEFAULT_LOCK_DIR,
                 timeout_s: float = 3600.0, poll_s: float = 0.5) -> Iterator[GpuSlots]:
    """Hold ``n`` GPUs exclusively among processes sharing ``lock_dir``; pins ``CUDA_VISIBLE_DEVICES``."""
    if n < 0:
        raise ValueError(f"number of GPUs must be >= 0, got {n}")
    if n == 0:
        yield GpuSlots([])
        return
    pool = gpu_pool(total)
    if n > len(pool):
        raise ValueError(f"job needs {n} GPUs but the pool has {len(pool)} ({ENV}={os.environ.get(ENV)!r}, "
                         f"total={total})")
    if scheduler_gpus() or held_gpus():  # the scheduler's allocation, or ours: exclusive already
        with _pinned(pool[:n]):
            yield GpuSlots(pool[:n])
        return
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    while True:
        got, fds = _take(pool, n, lock_dir)
        if len(got) == n:
            break
        _release(fds)  # never hold part of the request while waiting: no deadlock between jobs
        if time.monotonic() - start >= timeout_s:
            paths = [_lock_path(lock_dir, d) for d in pool]
            raise TimeoutError(f"could not get {n} of {len(pool)} GPUs from {lock_dir} within {timeout_s:g} s; "
                               f"held: {_holders(paths)}")
        time.sleep(poll_s)
    try:
        with _pinned(got), _pinned(got, HELD_ENV):
            yield GpuSlots(got, [_lock_path(lock_dir, d) for d in got], time.monotonic() - start)
    finally:
        _release(fds)
