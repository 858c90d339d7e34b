"""The GPU busy fraction while a part of ``rlpipe gpu-check`` runs: NVML's utilisation, sampled
every ~100 ms in a background thread of the checking process (which itself never touches CUDA).

NVML's ``utilization.gpu`` is the share of its last sample period (1/6 s to 1 s, by product) in
which at least one kernel ran; it says nothing of how much of the chip a kernel used. Read through
``pynvml`` when it is importable (what ``torch.cuda.utilization`` uses too), else from one
long-running ``nvidia-smi --query-gpu=utilization.gpu -lms 100``. A run's process start, Ray start
and model load count in ``busy_fraction``; ``busy_fraction_active`` is the mean from the first to
the last sample with the GPU busy, closer to the training loop alone.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

INTERVAL_S = 0.1


def _pynvml_reader() -> tuple[Callable[[], list[float]], Callable[[], None]] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # not installed, or no driver
        return None
    return (lambda: [float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in handles]), pynvml.nvmlShutdown


def summarize(samples: list[tuple[float, list[float]]], source: str | None) -> dict:
    """Busy fractions from ``(time, [percent per device])`` samples: per device over all samples,
    ``busy_fraction`` of the busiest device, and ``busy_fraction_active`` of that device from its
    first to its last non-zero sample."""
    if not samples:
        return {"source": source, "samples": 0, "busy_fraction": None, "busy_fraction_active": None,
                "per_device": []}
    n_dev = min(len(v) for _, v in samples)
    per_device = [sum(v[d] for _, v in samples) / len(samples) / 100 for d in range(n_dev)]
    dev = max(range(n_dev), key=per_device.__getitem__) if n_dev else 0
    series = [v[dev] for _, v in samples] if n_dev else []
    busy = [i for i, x in enumerate(series) if x > 0]
    active = series[busy[0]: busy[-1] + 1] if busy else []
    return {"source": source, "samples": len(samples), "interval_s": INTERVAL_S,
            "seconds": round(samples[-1][0] - samples[0][0], 2),
            "busy_fraction": round(per_device[dev], 4) if n_dev else None,
            "busy_fraction_active": round(sum(active) / len(active) / 100, 4) if active else 0.0,
            "active_seconds": round(samples[busy[-1]][0] - samples[busy[0]][0], 2) if busy else 0.0,
            "per_device": [round(x, 4) for x in per_device]}


class BusySampler:
    """``start()``, then ``stop()`` -> ``summarize(...)`` of the samples taken in between."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.samples: list[tuple[float, list[float]]] = []
        self.source: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None

    def _poll(self, read: Callable[[], list[float]]) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append((time.monotonic() - t0, read()))
            except Exception:
                return

    def _stream(self) -> None:
        t0 = time.monotonic()
        assert self._proc is not None and self._proc.stdout is not None
        values: list[float] = []
        for line in self._proc.stdout:  # one line per device per period
            try:
                values.append(float(line.strip()))
            except ValueError:
                continue
            if len(values) == self._devices:
                self.samples.append((time.monotonic() - t0, values))
                values = []

    def start(self) -> None:
        nvml = _pynvml_reader()
        if nvml is not None:
            read, self._close = nvml
            self.source = "pynvml"
            self._thread = threading.Thread(target=self._poll, args=(read,), daemon=True)
        else:
            try:
                q = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20)
                self._devices = len(q.stdout.split()) if q.returncode == 0 else 0
                if not self._devices:
                    return
                self._proc = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                     "-lms", str(int(self.interval_s * 1000))], stdout=subprocess.PIPE, text=True)
            except (OSError, subprocess.TimeoutExpired):
                return
            self.source = "nvidia-smi"
            self._thread = threading.Thread(target=self._stream, daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self.source == "pynvml":
                self._close()
        return summarize(self.samples, self.source)
