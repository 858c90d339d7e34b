"""``rlpipe bench weight-sync``: median latency of each weight-sync transport.

Two payloads: (a) a model's weights -- a ``TransformerLM`` built from ``--preset`` (or loaded from
``--checkpoint``) -- and (b) a synthetic ~100 MB state dict (``--synthetic-mb``; 4 MiB fp32
matrices). For each payload the bench first measures a local memcpy bound in the same run
(``torch`` ``copy_`` of the same number of bytes, on CPU and, where present, on the GPU) and then
runs every transport between a sender and a receiver actor: one warm-up sync, ``--repeats`` timed
syncs (``SyncStats.seconds``, the driver's wall time of export + transfer + in-place load), and a
checksum comparison proving the receiver ended bit-identical to the sender.

Runs are ``transport@placement``: ``cpu`` (both models on CPU), ``gpu`` (one GPU each; needs two)
and ``gpu-shared`` (both on one GPU, ``num_gpus=0.5``). CPU machines run ``object_store@cpu``
and ``rdt/gloo@cpu``; GPU runs are added when Ray sees GPUs, and a run that cannot work here
(too few GPUs, nixl or cupy missing) is listed with its reason instead of a number. The JSON
(stdout, and ``--out`` atomically) gives per run the median seconds, GB/s, the fraction of the
memcpy bound, and on CPU the ``rdt/gloo / object_store`` latency ratio (goal: <= 0.5 for the
synthetic payload).

Ray is started locally without the dashboard and bound to 127.0.0.1, and shut down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

from rlpipe import io
from rlpipe.config import WeightSyncConfig
from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.trainer.weight_sync import (
    BackendUnavailableError,
    WeightReceiver,
    WeightSender,
    make_transport,
    ray_actor_class,
)

# (transport label, placement); GPU runs are attempted only when Ray reports GPUs
CPU_RUNS = [("object_store", "cpu"), ("rdt/gloo", "cpu")]
GPU_RUNS = [("object_store", "gpu"), ("rdt/nccl", "gpu"), ("rdt/nixl", "gpu"),
            ("object_store", "gpu-shared"), ("rdt/cuda_ipc", "gpu-shared")]
PLACEMENT_GPUS = {"cpu": 0.0, "gpu": 1.0, "gpu-shared": 0.5}  # num_gpus per actor


def build_model(spec: dict[str, Any]) -> nn.Module:
    """The payload model for ``spec`` (built inside each actor, so nothing large crosses here)."""
    kind = spec["kind"]
    if kind == "synthetic":
        n = max(1, round(spec["mb"] * 1e6 / (1024 * 1024 * 4)))  # 4 MiB fp32 matrices
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(n)])
    if kind == "checkpoint":
        return load_checkpoint(spec["path"]).model

    torch.manual_seed(0)
    return TransformerLM(ModelConfig.from_preset(spec["preset"]))


class BenchPeer(WeightSender, WeightReceiver):
    """Sender or receiver; a receiver starts from zeros so that a sync has something to do."""

    def __init__(self, spec: dict[str, Any], device: str, zero: bool, threads: int):
        # like the trainer's actors (train.threads); several threads per actor on an oversubscribed
        # CPU made each of many copy_ calls wait on descheduled OpenMP workers (10x slower here)
        torch.set_num_threads(threads)
        self.model = build_model(spec).to(device)
        self.zero = zero
        self.reset()

    def reset(self) -> None:
        """A receiver goes back to zeros before each run, so every run has to deliver the weights."""
        if self.zero:
            with torch.no_grad():
                for t in self.model.state_dict().values():
                    t.zero_()


def memcpy_bound(nbytes: int, repeats: int, device: str = "cpu") -> dict[str, float]:
    """Median seconds and GB/s of one ``copy_`` of ``nbytes`` on ``device``."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):  # the first copy faults the pages in: not timed
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[1:])
    return {"seconds": med, "gbps": nbytes / med / 1e9}


def _payload_spec(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.checkpoint:
        return {"kind": "checkpoint", "path": os.path.abspath(args.checkpoint)}, f"checkpoint {args.checkpoint}"
    return {"kind": "preset", "preset": args.preset}, f"TransformerLM preset {args.preset}"


def _skip_reason(label: str, placement: str, gpus: float) -> str | None:
    need = {"cpu": 0, "gpu": 2, "gpu-shared": 1}[placement]
    if gpus < need:
        return f"needs {need} GPU(s), Ray sees {gpus:g}"
    if label.startswith("rdt/"):
        try:
            make_transport(_cfg(label, 60.0))  # the driver-side preflight gives the advice text
        except BackendUnavailableError as e:
            return str(e)
    return None


def _cfg(label: str, timeout_s: float) -> Any:
    transport, _, backend = label.partition("/")
    return WeightSyncConfig(transport=transport, backend=backend or "gloo", timeout_s=timeout_s)


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
        reason = _skip_reason(label, placement, gpus)
        if reason is None:
            if placement not in pairs:
                pairs[placement] = _make_pair(spec, placement, args.actor_threads)
            sender, receiver = pairs[placement]
            transport = make_transport(_cfg(label, args.timeout_s))
            try:
                transport.setup(sender, [receiver])
                active[key] = (transport, sender, receiver)
            except BackendUnavailableError as e:
                reason = str(e)
        if reason is not None:
            results[key] = {"skipped": reason}
    return active, pairs


def _time_runs(active: dict[str, tuple[Any, Any, Any]], repeats: int) -> dict[str, Any]:
    """Round-robin over the runs (so load from other processes hits all alike): one warm-up
    round, then ``repeats`` timed rounds; before the last one each receiver is re-zeroed and the
    sync returns its checksum, so every transport must deliver the weights on its own."""
    import ray

    times: dict[str, list[float]] = {k: [] for k in active}
    gbps: dict[str, list[float]] = {k: [] for k in active}
    last: dict[str, Any] = {}
    for i in range(repeats + 1):
        for key, (transport, sender, receiver) in active.items():
            final = i == repeats
            if final:
                ray.get(receiver.reset.remote())
            stats = transport.sync(sender, [receiver], version=i, checksum=final)
            if i:
                times[key].append(stats.seconds)
                gbps[key].append(stats.gbps)
            last[key] = stats
    out = {}
    for key, (_, sender, _) in active.items():
        verified = last[key].checksums == [ray.get(sender.weights_checksum.remote())]
        out[key] = {"median_s": statistics.median(times[key]), "gbps": statistics.median(gbps[key]),
                    "all_s": times[key], "bytes": last[key].bytes, "bit_identical": verified}
    return out


def bench_payload(spec: dict[str, Any], runs: list[tuple[str, str]], args: argparse.Namespace,
                  gpus: float) -> dict[str, Any]:
    import ray

    nbytes = sum(t.numel() * t.element_size() for t in build_model(spec).state_dict().values())
    out: dict[str, Any] = {"bytes": nbytes, "memcpy_cpu": memcpy_bound(nbytes, args.repeats)}
    if torch.cuda.is_available():
        out["memcpy_gpu"] = memcpy_bound(nbytes, args.repeats, "cuda")
    results: dict[str, Any] = {}
    active, pairs = _setup_runs(spec, runs, gpus, args, results)
    try:
        timed = _time_runs(active, args.repeats)
    finally:
        for transport, *_ in active.values():
            transport.teardown()
        for pair in pairs.values():
            for a in pair:
                ray.kill(a)
    for key, r in timed.items():
        bound = out["memcpy_cpu" if key.endswith("@cpu") else "memcpy_gpu"]
        r["fraction_of_memcpy"] = r["gbps"] / bound["gbps"]
        print(f"  {key}: median {r['median_s'] * 1e3:.1f} ms, {r['gbps']:.2f} GB/s", file=sys.stderr)
    out["transports"] = {key: results.get(key) or timed[key] for key in [f"{label}@{p}" for label, p in runs]}
    obj, gloo = timed.get("object_store@cpu", {}), timed.get("rdt/gloo@cpu", {})
    if obj and gloo:
        out["rdt_gloo_over_object_store"] = gloo["median_s"] / obj["median_s"]
    return out


def _start_ray(num_cpus: int) -> Any:
    # Ray on Linux binds to the host's routable address; with "cluster mode" off it uses
    # 127.0.0.1 (the setting is read when ray is imported, hence before the import)
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rlpipe bench weight-sync", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="timed syncs per transport (after one warm-up)")
    p.add_argument("--transports", default=None,
                   help="comma-separated subset of object_store, rdt/gloo, rdt/nccl, rdt/nixl, rdt/cuda_ipc")
    p.add_argument("--preset", default="cpu-tiny", help="TransformerLM preset for the model payload")
    p.add_argument("--checkpoint", default=None, help="use this model checkpoint instead of --preset")
    p.add_argument("--synthetic-mb", type=float, default=100.0, help="size of the synthetic payload (MB)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per-sync timeout")
    p.add_argument("--actor-threads", type=int, default=1, help="torch threads in each bench actor")
    p.add_argument("--out", default=None, help="also write the JSON here (atomically)")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
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
    ray = _start_ray(num_cpus=max(2, os.cpu_count() or 2))
    try:
        gpus = float(ray.cluster_resources().get("GPU", 0))
        runs = [r for r in CPU_RUNS + (GPU_RUNS if gpus else []) if wanted is None or r[0] in wanted]
        report: dict[str, Any] = {
            "host": platform.node(), "cpus": os.cpu_count(), "gpus": gpus, "torch": torch.__version__,
            "ray": ray.__version__, "ray_node_ip": ray.util.get_node_ip_address(), "repeats": args.repeats,
            "actor_threads": args.actor_threads, "load_avg_1m_start": os.getloadavg()[0],
            "note": "seconds: driver wall time of one sync (export + transfer + in-place load), median; "
                    "gbps: payload bytes / seconds / 1e9; fraction_of_memcpy: gbps / local copy_ GB/s",
            "payloads": {},
        }
        payloads = {"model": (model_spec, model_source),
                    "synthetic": ({"kind": "synthetic", "mb": args.synthetic_mb},
                                  f"synthetic {args.synthetic_mb:g} MB of 1024x1024 fp32 matrices")}
        for name, (spec, source) in payloads.items():
            print(f"payload {name}: {source}", file=sys.stderr)
            report["payloads"][name] = {"source": source, **(bench_payload(spec, runs, args, gpus) if spec else {})}
        report["load_avg_1m_end"] = os.getloadavg()[0]  # other processes on the host skew the numbers
        ratio = report["payloads"]["synthetic"].get("rdt_gloo_over_object_store")
        if ratio is not None:
            report["goal"] = {"rdt/gloo <= 0.5 x object_store latency (synthetic, cpu)": ratio <= 0.5,
                              "ratio": ratio}
    finally:
        ray.shutdown()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        io.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
