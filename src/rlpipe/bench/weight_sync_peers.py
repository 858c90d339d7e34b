"""The payloads and actors of ``rlpipe bench weight-sync`` (``rlpipe.bench.weight_sync`` runs the
sweep): the model or synthetic state dict a run syncs (``build_model``), built inside each actor;
the sender and receiver actor (``BenchPeer``), which also measures the in-run memcpy bound on its
own threads and device; and ``local``, the colocated worker's in-process copy timed inside the
sender (``InActorLocal``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlpipe.bench.flops import device_memcpy
from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.trainer.weight_sync import (
    SyncStats,
    Transport,
    WeightReceiver,
    WeightSender,
    WeightSyncTimeout,
    copy_weights,
    weights_checksum,
)


def _synthetic_rows(mb: float) -> int:
    return max(1, math.ceil(mb * 1e6 / (4 * 1024)))  # fp32 rows of 1024; at least ``mb`` (the goal's >= 100 MB)


def payload_bytes(spec: dict[str, Any]) -> int:
    """The bytes a sync of ``spec`` moves."""
    if spec["kind"] == "synthetic":  # without building it in the driver
        return 4 * 1024 * _synthetic_rows(spec["mb"])
    return sum(t.numel() * t.element_size() for t in build_model(spec).state_dict().values())


def build_model(spec: dict[str, Any], device: str = "cpu", fill: bool = True) -> nn.Module:
    """The payload model for ``spec`` on ``device`` (built inside each actor, so nothing large crosses
    here): ``{"kind": "preset"}`` (a ``TransformerLM`` of that preset), ``"checkpoint"`` (its model)
    or ``"synthetic"`` (``mb`` MB of fp32, in matrices of at most 1024 x 1024). A synthetic payload
    is allocated on ``device`` and filled there (seeded uniform values), or with zeros when ``fill``
    is False (a receiver, the local twin): 1 GB filled on the host took seconds per model, on a GPU
    a few milliseconds."""
    kind = spec["kind"]
    if kind == "synthetic":
        rows = _synthetic_rows(spec["mb"])
        gen = torch.Generator(device=device).manual_seed(0) if fill else None
        layers = []
        for start in range(0, rows, 1024):  # 4 MiB matrices, the last one smaller
            layer = nn.utils.skip_init(nn.Linear, 1024, min(1024, rows - start), bias=False, device=device)
            with torch.no_grad():
                layer.weight.uniform_(-1.0, 1.0, generator=gen) if fill else layer.weight.zero_()
            layers.append(layer)
        return nn.Sequential(*layers)
    if kind == "checkpoint":
        return load_checkpoint(spec["path"]).model.to(device)

    torch.manual_seed(0)
    return TransformerLM(ModelConfig.from_preset(spec["preset"])).to(device)


def memcpy_bound(nbytes: int, repeats: int, device: str = "cpu") -> dict[str, float]:
    """Median (and min) seconds and GB/s of one warm ``copy_`` of ``nbytes`` on ``device``: both
    buffers written first, so no page is faulted while timing, and three untimed copies. The bench
    calls it inside the sender actor (``BenchPeer.memcpy_bound``: the same threads as the
    transports' copies); a first version timed a cold destination in the driver and read 0.89 GB/s
    at 5 MB."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src).fill_(0)
    times = []
    for i in range(repeats + 3):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"seconds": med, "min_s": min(times), "gbps": nbytes / med / 1e9, "repeats": repeats,
            "threads": torch.get_num_threads()}


def _zero(model: nn.Module) -> None:
    with torch.no_grad():
        for t in model.state_dict().values():
            t.zero_()


class BenchPeer(WeightSender, WeightReceiver):
    """Sender or receiver; a receiver starts from zeros so that a sync has something to do."""

    def __init__(self, spec: dict[str, Any], device: str, zero: bool, threads: int):
        # like the trainer's actors (train.threads); several threads per actor on an oversubscribed
        # CPU made each of many copy_ calls wait on descheduled OpenMP workers (10x slower here)
        torch.set_num_threads(threads)
        self.spec = spec
        self.model = build_model(spec, device, fill=not zero)
        self.device = device
        self.zero = zero
        self._twin: nn.Module | None = None
        self.reset()

    def reset(self) -> None:
        """A receiver goes back to zeros before each run, so every run has to deliver the weights."""
        if self.zero:
            _zero(self.model)

    def memcpy_bound(self, nbytes: int, repeats: int) -> dict[str, float]:
        return memcpy_bound(nbytes, repeats, "cpu" if self.device == "cpu" else "cuda")

    def device_memcpy(self) -> dict:
        return device_memcpy("cpu" if self.device == "cpu" else "cuda")

    def local_sync(self, version: int, checksum: bool = False) -> SyncStats:
        """The colocated worker's in-process sync (``copy_weights``) from this actor's model into a
        twin on the same device; zeroed first when ``checksum`` (the bench's verifying round)."""
        if self._twin is None:
            self._twin = build_model(self.spec, self.device, fill=False)
            _zero(self._twin)  # a checkpoint or preset model is built with its weights
        if checksum:
            _zero(self._twin)
        if self.device != "cpu":
            torch.cuda.synchronize()  # nothing queued before the sync's clock starts
        stats = copy_weights(self.model, self._twin, version)  # ends with a device synchronize
        if checksum:
            stats.checksums = [weights_checksum(self._twin)]
        return stats


class InActorLocal(Transport):
    """``local`` in the bench: ``copy_weights`` inside the sender actor (``BenchPeer.local_sync``),
    its seconds measured there; the driver's wait is bounded by ``timeout_s`` like every sync."""

    name = "local"

    def sync(self, sender: Any, receivers: Sequence[Any], version: int, checksum: bool = False) -> SyncStats:
        import ray

        try:
            return ray.get(sender.local_sync.remote(version, checksum), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise WeightSyncTimeout(f"weight sync local (version {version}) did not finish within "
                                    f"train.weight_sync.timeout_s={self.timeout_s:g} s") from e
