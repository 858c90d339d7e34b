"""``rlpipe bench weight-sync``: latency and GB/s of each weight-sync transport over a payload sweep.

Payloads: the pipeline's model (a ``TransformerLM`` from ``--preset``, or ``--checkpoint``) and a
sweep of synthetic fp32 state dicts, ``--sizes-mb`` (default 1, 10, 100 and 1000 MB, in matrices
of at most 1024 x 1024). Per payload the bench starts a sender and a receiver actor (``--actor-
threads`` torch threads each, like the trainer's actors), measures the in-run memcpy bound in the
sender, then runs every transport round-robin: one warm-up sync, ``--repeats`` timed syncs
(fewer for big payloads, at least 3), each ``SyncStats.seconds`` (the driver's wall time of export
+ transfer + in-place load), ``--gap-s`` apart, and a last, untimed sync into a zeroed receiver
whose checksum proves the receiver ended bit-identical to the sender.

The memcpy bound is one ``copy_`` of the payload's byte count inside the sender actor (same
threads as the transports' copies), between two buffers written beforehand (no page faults), after
three untimed copies; median and min over many repeats (more for small payloads). The first
version timed a cold destination in the driver and read 0.89 GB/s at 5 MB.

Runs are ``transport@placement``: ``cpu`` (both models on CPU), ``gpu`` (one GPU each; needs two)
and ``gpu-shared`` (both on one GPU, ``num_gpus=0.5``); ``--placements`` picks some. ``local`` is the
colocated worker's in-process copy (``copy_weights``: one fused ``_foreach_copy_``, device to
device on a GPU), timed inside the sender actor between its model and a zeroed twin on the same
device (no Ray in its seconds). CPU runs: ``object_store/channel`` (the
trainer's default: ``ShmPayload`` views written into one reused Ray shared-memory channel buffer,
``ChannelTransport``), ``object_store`` (the same payload returned as a fresh object-store object
per sync, ``channel: false``; read zero-copy from shared memory), ``object_store/packed`` (the
fresh-object payload packed per dtype, as for GPU models),
``object_store/tensors`` (named torch tensors, the naive baseline), ``rdt/gloo`` and ``local``. GPU runs are
added when Ray sees GPUs; a run that cannot work here is listed with its reason instead of a
number.

Why a gap between syncs (``--gap-s``, default 0.2 s, untimed): in training, syncs are an optimizer
step apart. Back to back, Ray has not yet freed the previous payload when the next is exported,
so the object store places it in fresh shared memory and RDT allocates a fresh pack, and both pay
page faults a training run does not (measured at 100 MB on the 2-core dev machine: object store
~140 ms back to back vs ~50 ms with a 0.2 s gap).

``--thp`` sets ``THP_MEM_ALLOC_ENABLE=1`` in the Ray workers: torch then asks for transparent huge
pages for large CPU allocations, which cuts the page faults of buffers allocated per sync -- above
all the receive buffer Ray allocates for every RDT/gloo transfer (off by default: it is a process-
wide memory policy, and the trainer does not set it).

Two yardsticks per run (``peak_note``): ``fraction_of_memcpy`` (the shape peak: a copy of the
payload's own byte count, above) and ``fraction_of_device_memcpy`` (the device peak: one large warm
``copy_``, ``rlpipe.bench.flops.device_memcpy``, 1 GiB on a GPU, 256 MiB on CPU, measured in the
sender actor: ``device_memcpy_cpu`` / ``device_memcpy_gpu`` per payload).

A sync that fails (a ``WeightSyncError``: a timeout names ``train.weight_sync.timeout_s``, here
``--timeout-s``) is recorded as that run's ``failed`` message, and the bench goes on with the other
runs. With ``--out`` the JSON is rewritten after every payload (``complete: false`` until the
last), so a run stopped from outside keeps the payloads it finished.

The JSON (stdout, and ``--out`` atomically) gives per payload the memcpy bound and per run the
median seconds, GB/s and both fractions; per payload and placement the best object-store path, the
best RDT backend and the winner; at the top, ``cpu_winner`` per payload, ``goal``: does the best
CPU transport reach 0.3 of memcpy at every payload of 100 MB or more?, ``gpu_goal``: do the
same-GPU syncs (``local`` and ``rdt/cuda_ipc`` at ``gpu-shared``) reach 0.3 of the device memcpy at
every payload of 100 MB or more?, and ``fraction_of_shape_peak`` / ``fraction_of_device_peak`` of
the fastest run at the largest payload (``headline`` names it).

Ray is started locally without the dashboard and bound to 127.0.0.1, and shut down at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlpipe import io
from rlpipe.bench import stamp
from rlpipe.bench.flops import device_memcpy, fraction
from rlpipe.config import WeightSyncConfig
from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.trainer.local_ray import local_ray_metrics_off, loopback_only
from rlpipe.trainer.weight_sync import (
    BackendUnavailableError,
    ObjectStoreTransport,
    SyncStats,
    Transport,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    WeightSyncTimeout,
    copy_weights,
    make_transport,
    ray_actor_class,
    weights_checksum,
)

# (transport label, placement); GPU runs are attempted only when Ray reports GPUs
CPU_RUNS = [("object_store", "cpu"), ("object_store/channel", "cpu"), ("object_store/packed", "cpu"),
            ("object_store/tensors", "cpu"), ("rdt/gloo", "cpu"), ("local", "cpu")]
GPU_RUNS = [("object_store/channel", "gpu"), ("object_store", "gpu"), ("rdt/nccl", "gpu"), ("rdt/nixl", "gpu"),
            ("object_store/channel", "gpu-shared"), ("object_store", "gpu-shared"), ("rdt/cuda_ipc", "gpu-shared"),
            ("local", "gpu-shared")]
PLACEMENT_GPUS = {"cpu": 0.0, "gpu": 1.0, "gpu-shared": 0.5}  # num_gpus per actor
GOAL_FRACTION, GOAL_MIN_BYTES = 0.3, 100e6  # the best CPU transport vs memcpy, at payloads >= 100 MB
# same-GPU syncs vs the device's memcpy, at payloads >= GOAL_MIN_BYTES
GPU_GOAL_RUNS, GPU_GOAL_FRACTION = ("local@gpu-shared", "rdt/cuda_ipc@gpu-shared"), 0.3
PEAK_NOTE = ("fraction_of_memcpy (and fraction_of_shape_peak): GB/s over the in-run memcpy of the payload's own byte "
             "count (memcpy_cpu / memcpy_gpu); fraction_of_device_memcpy (and fraction_of_device_peak): GB/s over "
             "the device's large-copy rate (device_memcpy_cpu / device_memcpy_gpu: one warm copy_ of 256 MiB on "
             "CPU, 1 GiB on a GPU, in the sender actor)")
# The naive per-tensor object-store path is a baseline: it shows what packing gains (5x at 100 MB),
# and one 1 GB sync through it takes ~6 s on 2 cores, a quarter of the sweep's time. Above this it
# is skipped, with the reason in the JSON.
BASELINE_MAX_BYTES = 200e6


def _synthetic_rows(mb: float) -> int:
    return max(1, math.ceil(mb * 1e6 / (4 * 1024)))  # fp32 rows of 1024; at least ``mb`` (the goal's >= 100 MB)


def payload_bytes(spec: dict[str, Any]) -> int:
    if spec["kind"] == "synthetic":  # without building it in the driver
        return 4 * 1024 * _synthetic_rows(spec["mb"])
    return sum(t.numel() * t.element_size() for t in build_model(spec).state_dict().values())


def build_model(spec: dict[str, Any], device: str = "cpu", fill: bool = True) -> nn.Module:
    """The payload model for ``spec`` on ``device`` (built inside each actor, so nothing large crosses
    here). A synthetic payload is allocated on ``device`` and filled there (seeded uniform values), or
    with zeros when ``fill`` is False (a receiver, the local twin): 1 GB filled on the host took
    seconds per model, on a GPU a few milliseconds."""
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
    buffers written first, so no page is faulted while timing, and three untimed copies."""
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


def timed_repeats(nbytes: int, repeats: int) -> int:
    """``--repeats`` up to 200 MB, fewer above (at least 3), to keep the sweep's time reasonable."""
    return min(repeats, max(3, math.ceil(repeats * 2e8 / max(nbytes, 1))))


def memcpy_repeats(nbytes: int) -> int:
    return max(10, min(200, int(5e9 / max(nbytes, 1))))


def _payload_spec(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.checkpoint:
        return {"kind": "checkpoint", "path": os.path.abspath(args.checkpoint)}, f"checkpoint {args.checkpoint}"
    return {"kind": "preset", "preset": args.preset}, f"TransformerLM preset {args.preset}"


def _skip_reason(label: str, placement: str, gpus: float, nbytes: int = 0) -> str | None:
    need = {"cpu": 0, "gpu": 2, "gpu-shared": 1}[placement]
    if gpus < need:
        return f"needs {need} GPU(s), Ray sees {gpus:g}"
    if label == "object_store/tensors" and nbytes > BASELINE_MAX_BYTES:
        return f"the per-tensor baseline runs up to {BASELINE_MAX_BYTES / 1e6:g} MB only (time budget)"
    if label.startswith("rdt/"):
        try:
            _transport(label, 60.0)  # the driver-side preflight gives the advice text
        except BackendUnavailableError as e:
            return str(e)
    return None


def _transport(label: str, timeout_s: float) -> Transport:
    """``local``, ``object_store[/payload]`` or ``rdt/backend`` (``make_transport`` with its preflight)."""
    transport, _, variant = label.partition("/")
    if label == "local":
        return InActorLocal(timeout_s)
    if label == "object_store/channel":
        return make_transport(WeightSyncConfig(transport="object_store", channel=True, timeout_s=timeout_s))
    if transport == "object_store":  # a fresh object per sync (``channel: false``) and its variants
        return ObjectStoreTransport(timeout_s, payload=variant or "shared")
    return make_transport(WeightSyncConfig(transport=transport, backend=variant or "gloo", timeout_s=timeout_s))


def _make_pair(spec: dict[str, Any], placement: str, threads: int) -> tuple[Any, Any]:
    gpus = PLACEMENT_GPUS[placement]
    device = "cpu" if placement == "cpu" else "cuda"
    cls = ray_actor_class(BenchPeer, "rdt").options(num_cpus=0, num_gpus=gpus)
    return cls.remote(spec, device, False, threads), cls.remote(spec, device, True, threads)


def _setup_runs(spec: dict[str, Any], runs: list[tuple[str, str]], gpus: float, args: argparse.Namespace,
                results: dict[str, Any]) -> tuple[dict[str, tuple[Any, Any, Any]], dict[str, tuple[Any, Any]]]:
    """Set up every run that can work here; the others go into ``results`` with their reason."""
    active, pairs = {}, {}
    for label, placement in runs:
        key = f"{label}@{placement}"
        reason = _skip_reason(label, placement, gpus, payload_bytes(spec))
        if reason is None:
            if placement not in pairs:
                pairs[placement] = _make_pair(spec, placement, args.actor_threads)
            sender, receiver = pairs[placement]
            transport = _transport(label, args.timeout_s)
            try:
                transport.setup(sender, [receiver])
                active[key] = (transport, sender, receiver)
            except WeightSyncError as e:  # unavailable here, or a set-up that timed out
                reason = str(e)
        if reason is not None:
            results[key] = {"skipped": reason}
    return active, pairs


def _time_runs(active: dict[str, tuple[Any, Any, Any]], repeats: int, gap_s: float) -> dict[str, Any]:
    """Round-robin over the runs (so load from other processes hits all alike): one warm-up
    round, ``repeats`` timed rounds, and an untimed last round (hashing 1 GB takes seconds) in
    which each receiver is re-zeroed first and the sync returns its checksum, so every transport
    must deliver the weights on its own."""
    import ray

    times: dict[str, list[float]] = {k: [] for k in active}
    last: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for i in range(repeats + 2):
        for key, (transport, sender, receiver) in active.items():
            if key in out:  # failed earlier
                continue
            final = i == repeats + 1
            if final:
                ray.get(receiver.reset.remote())
            time.sleep(gap_s)  # syncs are an optimizer step apart in training (module docstring)
            try:
                stats = transport.sync(sender, [receiver], version=i, checksum=final)
            except WeightSyncError as e:  # a timeout names train.weight_sync.timeout_s; the others go on
                out[key] = {"failed": str(e)}
                print(f"  {key}: failed: {e}", file=sys.stderr)
                continue
            if 0 < i <= repeats:
                times[key].append(stats.seconds)
            last[key] = stats
    expected = {}
    for key, (_, sender, _) in active.items():
        if key in out:
            continue
        if sender not in expected:  # one checksum per sender (1 GB takes seconds to hash)
            expected[sender] = ray.get(sender.weights_checksum.remote())
        verified = last[key].checksums == [expected[sender]]
        med, nbytes = statistics.median(times[key]), last[key].bytes
        out[key] = {"median_s": med, "min_s": min(times[key]), "gbps": nbytes / med / 1e9, "all_s": times[key],
                    "bytes": nbytes, "repeats": repeats, "bit_identical": verified}
    return out


def best_of(timed: dict[str, Any], placement: str) -> dict[str, Any]:
    """The fastest object-store path and RDT backend among ``timed`` runs at ``placement``, and
    the winner; ``rdt_over_object_store`` < 1 means RDT is faster."""
    at = {k.rsplit("@", 1)[0]: v for k, v in timed.items() if k.endswith(f"@{placement}") and "failed" not in v}
    obj = min((k for k in at if k.startswith("object_store")), key=lambda k: at[k]["median_s"], default=None)
    rdt = min((k for k in at if k.startswith("rdt")), key=lambda k: at[k]["median_s"], default=None)
    winner = min((k for k in (obj, rdt) if k), key=lambda k: at[k]["median_s"], default=None)
    out: dict[str, Any] = {"object_store": obj, "rdt": rdt, "winner": winner}
    if winner:
        out |= {"winner_gbps": at[winner]["gbps"], "winner_fraction_of_memcpy": at[winner]["fraction_of_memcpy"]}
    if obj and rdt:
        out["rdt_over_object_store"] = at[rdt]["median_s"] / at[obj]["median_s"]
    return out


def bench_payload(spec: dict[str, Any], runs: list[tuple[str, str]], args: argparse.Namespace,
                  gpus: float) -> dict[str, Any]:
    import ray

    nbytes = payload_bytes(spec)
    repeats = timed_repeats(nbytes, args.repeats)
    out: dict[str, Any] = {"bytes": nbytes, "repeats": repeats}
    results: dict[str, Any] = {}
    active, pairs = _setup_runs(spec, runs, gpus, args, results)
    try:
        for placement, (sender, _) in pairs.items():  # in the sender actor: its threads, its device
            kind = "cpu" if placement == "cpu" else "gpu"
            if f"memcpy_{kind}" not in out:
                out[f"memcpy_{kind}"] = ray.get(sender.memcpy_bound.remote(nbytes, memcpy_repeats(nbytes)))
                out[f"device_memcpy_{kind}"] = ray.get(sender.device_memcpy.remote())
        timed = _time_runs(active, repeats, args.gap_s)
    finally:
        for transport, *_ in active.values():
            transport.teardown()
        for pair in pairs.values():
            for a in pair:
                ray.kill(a)
    for key, r in timed.items():
        if "failed" in r:
            continue
        kind = "cpu" if key.endswith("@cpu") else "gpu"
        r["fraction_of_memcpy"] = r["gbps"] / out[f"memcpy_{kind}"]["gbps"]
        r["fraction_of_device_memcpy"] = fraction(r["gbps"], out[f"device_memcpy_{kind}"]["gbps"])
        print(f"  {key}: median {r['median_s'] * 1e3:.1f} ms, {r['gbps']:.2f} GB/s, "
              f"{r['fraction_of_memcpy']:.2f} of memcpy, {r['fraction_of_device_memcpy']:.3g} of the device's",
              file=sys.stderr)
    out["transports"] = {key: results.get(key) or timed[key] for key in [f"{label}@{p}" for label, p in runs]}
    out["best"] = {p: best_of(timed, p) for p in dict.fromkeys(p for _, p in runs)
                   if any(k.endswith(f"@{p}") for k in timed)}
    obj, gloo = timed.get("object_store@cpu"), timed.get("rdt/gloo@cpu")
    if obj and gloo and "failed" not in obj and "failed" not in gloo:
        out["rdt_gloo_over_object_store"] = gloo["median_s"] / obj["median_s"]
    return out


def cpu_verdict(payloads: dict[str, Any]) -> dict[str, Any]:
    """Which transport wins on CPU per payload, and whether the goal is met."""
    best = {name: body["best"]["cpu"] for name, body in payloads.items() if body.get("best", {}).get("cpu")}
    big = {name: b["winner_fraction_of_memcpy"] for name, b in best.items()
           if b.get("winner") and payloads[name]["bytes"] >= GOAL_MIN_BYTES}
    return {
        "cpu_winner": {name: b["winner"] for name, b in best.items()},
        "cpu_rdt_over_best_object_store": {name: b.get("rdt_over_object_store") for name, b in best.items()},
        "goal": {"text": f"the best CPU transport reaches >= {GOAL_FRACTION} of the in-run memcpy at every payload "
                         f">= {GOAL_MIN_BYTES / 1e6:g} MB",
                 "met": all(f >= GOAL_FRACTION for f in big.values()) if big else None,  # None: no such payload
                 "fraction_of_memcpy": big},
    }


def gpu_verdict(payloads: dict[str, Any]) -> dict[str, Any]:
    """Whether the same-GPU syncs reach ``GPU_GOAL_FRACTION`` of the device's memcpy at every
    payload of ``GOAL_MIN_BYTES`` or more (None: no such run was measured)."""
    got = {f"{name} {key}": run.get("fraction_of_device_memcpy")
           for name, body in payloads.items() if body["bytes"] >= GOAL_MIN_BYTES
           for key, run in body.get("transports", {}).items() if key in GPU_GOAL_RUNS and run is not None
           and "skipped" not in run}
    return {"text": f"same-GPU syncs ({', '.join(GPU_GOAL_RUNS)}) reach >= {GPU_GOAL_FRACTION} of the device "
                    f"memcpy at every payload >= {GOAL_MIN_BYTES / 1e6:g} MB (a failed sync misses it)",
            "met": all(f is not None and f >= GPU_GOAL_FRACTION for f in got.values()) if got else None,
            "fraction_of_device_memcpy": got}


def headline(payloads: dict[str, Any]) -> dict[str, Any]:
    """Both fractions of the fastest run at the largest payload: the bench's headline pair."""
    for name, body in sorted(payloads.items(), key=lambda kv: -kv[1]["bytes"]):
        runs = {k: r for k, r in body.get("transports", {}).items() if r and "gbps" in r}
        if runs:
            key = max(runs, key=lambda k: runs[k]["gbps"])
            return {"headline": f"{key}, payload {name}",
                    "fraction_of_shape_peak": fraction(runs[key]["fraction_of_memcpy"], 1.0),
                    "fraction_of_device_peak": runs[key]["fraction_of_device_memcpy"], "peak_note": PEAK_NOTE}
    return {"headline": None, "fraction_of_shape_peak": None, "fraction_of_device_peak": None, "peak_note": PEAK_NOTE}


def _start_ray(num_cpus: int, thp: bool) -> Any:
    import ray

    env = {"env_vars": {"THP_MEM_ALLOC_ENABLE": "1"}} if thp else None
    # address="local": a new instance of its own, never a cluster that `ray start` left registered
    # (a dead one's registration would make ray.init attach, and refuse num_cpus)
    # Ray on Linux binds the host's routable address: loopback instead, and no metrics exporter on fixed
    # ports (both as rlpipe.trainer.local_ray starts a training run's instance)
    with loopback_only():
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=env,
                 _node_ip_address="127.0.0.1", **local_ray_metrics_off())
    return ray


def _sizes(text: str) -> list[float]:
    try:
        sizes = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(not 0 < s <= 1e5 for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes-mb: expected comma-separated sizes in (0, 1e5] MB, got {text!r}")
    return sizes


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rlpipe bench weight-sync", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5,
                   help="timed syncs per transport (after one warm-up); fewer above 200 MB, at least 3")
    p.add_argument("--transports", default=None,
                   help="comma-separated subset of " + ", ".join(dict.fromkeys(lb for lb, _ in CPU_RUNS + GPU_RUNS)))
    p.add_argument("--placements", default=None,
                   help="comma-separated subset of " + ", ".join(PLACEMENT_GPUS) + " (default: all that fit)")
    p.add_argument("--preset", default="cpu-tiny", help="TransformerLM preset for the model payload")
    p.add_argument("--checkpoint", default=None, help="use this model checkpoint instead of --preset")
    p.add_argument("--sizes-mb", type=_sizes, default="1,10,100,1000",
                   help="synthetic payload sweep, comma-separated MB (default 1,10,100,1000)")
    p.add_argument("--gap-s", type=float, default=0.2, help="untimed pause before each sync (see the docstring)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="per-sync timeout (train.weight_sync.timeout_s): a sync past it fails, named; the rest go on")
    p.add_argument("--actor-threads", type=int, default=1, help="torch threads in each bench actor")
    p.add_argument("--thp", action="store_true", help="THP_MEM_ALLOC_ENABLE=1 in the Ray workers (docstring)")
    p.add_argument("--out", default=None, help="also write the JSON here (atomically)")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    if a.gap_s < 0:
        p.error("--gap-s must be >= 0")
    if a.timeout_s <= 0:
        p.error("--timeout-s must be > 0")
    a.placements = None if a.placements is None else [x.strip() for x in a.placements.split(",") if x.strip()]
    if a.placements is not None and (not a.placements or set(a.placements) - set(PLACEMENT_GPUS)):
        p.error(f"--placements: choose from {list(PLACEMENT_GPUS)}, got {a.placements}")
    return a


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    wanted = None if args.transports is None else [t.strip() for t in args.transports.split(",") if t.strip()]
    known = {label for label, _ in CPU_RUNS + GPU_RUNS}
    if wanted is not None and set(wanted) - known:
        print(f"rlpipe bench weight-sync: unknown transport(s) {sorted(set(wanted) - known)}; "
              f"choose from {sorted(known)}", file=sys.stderr)
        return 2
    model_spec, model_source = _payload_spec(args)
    ray = _start_ray(max(2, os.cpu_count() or 2), args.thp)
    try:
        gpus = float(ray.cluster_resources().get("GPU", 0))
        runs = [r for r in CPU_RUNS + (GPU_RUNS if gpus else []) if (wanted is None or r[0] in wanted)
                and (args.placements is None or r[1] in args.placements)]
        report: dict[str, Any] = {
            "host": platform.node(), "cpus": os.cpu_count(), "gpus": gpus, "torch": torch.__version__,
            "ray": ray.__version__, "ray_node_ip": ray.util.get_node_ip_address(), "repeats": args.repeats,
            "actor_threads": args.actor_threads, "gap_s": args.gap_s, "thp": args.thp,
            "sizes_mb": args.sizes_mb, "load_avg_start": list(os.getloadavg()),
            "placements": args.placements, "timeout_s": args.timeout_s,
            "note": "seconds: driver wall time of one sync (export + transfer + in-place load; local: in the actor), "
                    "median of the timed repeats; gbps: payload bytes / median seconds / 1e9; fraction_of_memcpy: "
                    "gbps / the in-run memcpy bound (warm copy_ of the payload's size in the sender actor, same "
                    "threads); fraction_of_device_memcpy: gbps / the device's large-copy rate",
            "peak_note": PEAK_NOTE, "complete": False, "payloads": {},
        }
        payloads = {"model": (model_spec, model_source)}
        for mb in args.sizes_mb:
            payloads[f"synthetic_{mb:g}MB"] = ({"kind": "synthetic", "mb": mb},
                                               f"synthetic {mb:g} MB of fp32 matrices (<= 1024 x 1024)")
        for name, (spec, source) in payloads.items():
            print(f"payload {name}: {source}", file=sys.stderr)
            report["payloads"][name] = {"source": source, **bench_payload(spec, runs, args, gpus)}
            _summarise(report)
            if args.out:  # what is finished survives a kill from outside
                io.write_json(args.out, stamp(report))
        report["complete"] = True
    finally:
        ray.shutdown()
    text = json.dumps(stamp(report), indent=2)
    print(text)
    if args.out:
        io.write_json(args.out, report)
    return 0


def _summarise(report: dict[str, Any]) -> None:
    """The verdicts and the headline over the payloads measured so far."""
    report["load_avg_end"] = list(os.getloadavg())  # other processes on the host skew the numbers
    report |= cpu_verdict(report["payloads"])
    report["gpu_goal"] = gpu_verdict(report["payloads"])
    report |= headline(report["payloads"])


if __name__ == "__main__":
    sys.exit(main())
