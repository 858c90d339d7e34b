"""Two parts of ``rlpipe gpu-check``, each run in its own process:

    python -m rlpipe.bench.gpu_probe machine --out machine.json   # the machine and its versions
    python -m rlpipe.bench.gpu_probe peaks --out peaks.json       # the device's own limits

``machine``: the GPU (name, compute capability, memory, count), the driver, CUDA and torch versions,
``rlpipe.provenance`` (CPU, package versions, lock hash), and every installed package whose version
differs from ``requirements/lock.txt`` (the lock is for CPU CI; a CUDA image brings its own torch
and friends). ``gpu`` is null where torch sees no CUDA device.

``peaks``: the device's matmul peak at a large shape (8192^3, where a GPU's tensor cores run near
their limit) in bfloat16, float32 with TF32 off and float32 with TF32 on, and the device-to-device
copy rate (``copy_`` of a 1 GiB buffer). The benches report their fraction of a peak measured at
the model's own small shapes; these numbers are the chip's, for the fraction of the real chip.
Timing: warm-up, then CUDA events around a loop (``time.perf_counter`` on CPU, where the same code
runs at small shapes in the tests).
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import torch

from rlpipe.bench.lock_diff import lock_differences
from rlpipe.io import write_json
from rlpipe.provenance import LOCK_FILE, provenance

#: the longest the machine probe waits for ``nvidia-smi`` (``rlpipe gpu-check`` keeps it inside the part's limit)
SMI_TIMEOUT_S = 20.0


def _driver_version() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def gpu_info() -> dict | None:
    """The first visible CUDA device, or None where there is none."""
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "count": torch.cuda.device_count(), "compute_capability": f"{p.major}.{p.minor}",
            "memory_gib": round(p.total_memory / 2**30, 2), "multiprocessors": p.multi_processor_count,
            "driver": _driver_version(), "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}


def machine(lock_file: Path = LOCK_FILE) -> dict:
    """The ``machine`` part's record."""
    lock = lock_file.read_text() if lock_file.is_file() else None
    return {"gpu": gpu_info(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "provenance": provenance(), "lock_file": str(lock_file) if lock else None,
            "lock_differences": None if lock is None else lock_differences(lock)}


class _Timer:
    """Seconds of ``fn`` repeated ``iters`` times: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, iters: int) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return time.perf_counter() - t0


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 8192, iters: int = 20,
                warmup: int = 3, tf32: bool = False) -> dict:
    """FLOP/s of an (n x n) @ (n x n) product in ``dtype``: best of three timed loops."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        out = torch.empty(n, n, device=device, dtype=dtype)
        fn = lambda: torch.matmul(a, b, out=out)  # noqa: E731
        timer = _Timer(device)
        timer(fn, warmup)
        best = min(timer(fn, iters) for _ in range(3)) / iters
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    flops = 2.0 * n ** 3 / best
    return {"shape": [n, n, n], "dtype": str(dtype).removeprefix("torch."), "tf32": tf32, "iters": iters,
            "seconds_per_matmul": best, "tflops": round(flops / 1e12, 2)}


def memcpy_rate(device: torch.device, nbytes: int = 2**30, iters: int = 10) -> dict:
    """Device-to-device ``copy_`` of ``nbytes``: ``gbps`` = bytes copied per second (the unit the
    weight-sync bench uses), ``traffic_gbps`` = bytes read plus written per second."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src).fill_(0)
    timer = _Timer(device)
    fn = lambda: dst.copy_(src)  # noqa: E731
    timer(fn, 2)
    best = min(timer(fn, iters) for _ in range(3)) / iters
    return {"bytes": nbytes, "iters": iters, "seconds_per_copy": best, "gbps": round(nbytes / best / 1e9, 1),
            "traffic_gbps": round(2 * nbytes / best / 1e9, 1)}


def peaks(device: torch.device, n: int = 8192, copy_bytes: int = 2**30) -> dict:
    """The ``peaks`` part's record; each measurement's failure is recorded, not raised."""
    jobs = {"matmul_bf16": lambda: matmul_peak(device, torch.bfloat16, n),
            "matmul_fp32": lambda: matmul_peak(device, torch.float32, n, iters=5),
            "matmul_tf32": lambda: matmul_peak(device, torch.float32, n, tf32=True),
            "memcpy": lambda: memcpy_rate(device, copy_bytes)}
    out: dict = {"device": str(device)}
    for name, job in jobs.items():
        try:
            out[name] = job()
        except Exception as e:  # e.g. out of memory on a small card: the others still run
            out[name] = {"error": f"{type(e).__name__}: {e}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlpipe.bench.gpu_probe", description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("machine", "peaks"))
    ap.add_argument("--out", required=True, help="the part's JSON (written atomically)")
    a = ap.parse_args(argv)
    if a.what == "machine":
        write_json(a.out, machine())
        return 0
    if not torch.cuda.is_available():
        ap.error("peaks: no CUDA device")
    write_json(a.out, peaks(torch.device("cuda")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
