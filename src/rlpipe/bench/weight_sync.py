"""``rlpipe bench weight-sync``: latency and GB/s of each weight-sync transport over a payload sweep.

Payloads: the pipeline's model (``--preset`` or ``--checkpoint``) and a sweep of synthetic fp32
state dicts (``--sizes-mb``, default 1, 10, 100 and 1000 MB). Per payload the bench starts a sender
and a receiver actor, measures the in-run memcpy bound in the sender, then times every run
(``transport@placement``) round-robin, ``--gap-s`` apart, and checks with a last, checksummed sync
that each receiver ended bit-identical to its sender. The JSON (stdout, and ``--out`` atomically,
rewritten after every payload, ``complete: false`` until the last) gives per run the median
seconds, GB/s and two fractions of a copy peak; per payload the best object-store path, the best
RDT backend and the winner; and the verdicts over the sweep.

Where to look:

- ``rlpipe.bench.weight_sync_peers``: the payloads and actors (``build_model``, ``BenchPeer``,
  ``memcpy_bound``, ``local``'s in-actor copy);
- ``CPU_RUNS`` / ``GPU_RUNS`` and ``_transport``: which transports run where;
- ``_time_runs``: the timing (warm-up, repeats, the gap between syncs and why, failed syncs);
- ``bench_payload`` and ``PEAK_NOTE``: the two yardsticks (``fraction_of_memcpy``,
  ``fraction_of_device_memcpy``);
- ``cpu_verdict``, ``gpu_verdict``, ``headline``: the verdicts at the top of the JSON;
- ``_start_ray``: the local Ray instance (and ``--thp``);
- ``docs/benchmarks.md``: how to read the numbers.
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
from typing import Any

import torch

from rlpipe import io
from rlpipe.bench import stamp
from rlpipe.bench.flops import fraction
from rlpipe.bench.weight_sync_peers import BenchPeer, InActorLocal, payload_bytes
from rlpipe.config import WeightSyncConfig
from rlpipe.trainer.local_ray import local_ray_metrics_off, loopback_only
from rlpipe.trainer.weight_sync import (
    BackendUnavailableError,
    ObjectStoreTransport,
    Transport,
    WeightSyncError,
    make_transport,
    ray_actor_class,
)

# (transport label, placement); GPU runs are attempted only when Ray reports GPUs. Placements: ``cpu``
# (both models on CPU), ``gpu`` (one GPU each; needs two), ``gpu-shared`` (both on one GPU). On CPU:
# ``object_store/channel`` (the trainer's default: ``ShmPayload`` views written into one reused Ray
# shared-memory channel buffer, ``ChannelTransport``), ``object_store`` (the same payload returned as a
# fresh object-store object per sync, ``channel: false``; read zero-copy from shared memory),
# ``object_store/packed`` (the fresh-object payload packed per dtype, as for GPU models),
# ``object_store/tensors`` (named torch tensors, the naive baseline), ``rdt/gloo``, and ``local`` (the
# colocated worker's in-process ``copy_weights``: one fused ``_foreach_copy_``, device to device on a
# GPU; timed inside the sender actor, no Ray in its seconds). A run that cannot work here is listed with
# its reason instead of a number (``_skip_reason``).
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


def timed_repeats(nbytes: int, repeats: int) -> int:
    """``--repeats`` up to 200 MB, fewer above (at least 3), to keep the sweep's time reasonable."""
    return min(repeats, max(3, math.ceil(repeats * 2e8 / max(nbytes, 1))))


def memcpy_repeats(nbytes: int) -> int:
    """Repeats of the memcpy bound: many (more for small payloads), so its median and min are steady."""
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
    must deliver the weights on its own. A run's seconds are ``SyncStats.seconds``: the driver's
    wall time of export + transfer + in-place load.

    ``gap_s`` (``--gap-s``, default 0.2 s, untimed) before each sync: in training, syncs are an
    optimizer step apart. Back to back, Ray has not yet freed the previous payload when the next is
    exported, so the object store places it in fresh shared memory and RDT allocates a fresh pack,
    and both pay page faults a training run does not (measured at 100 MB on the 2-core dev machine:
    object store ~140 ms back to back vs ~50 ms with a 0.2 s gap).

    A sync that fails (a ``WeightSyncError``: a timeout names ``train.weight_sync.timeout_s``, here
    ``--timeout-s``) is recorded as that run's ``failed`` message, and the other runs go on."""
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
            time.sleep(gap_s)  # syncs are an optimizer step apart in training (docstring)
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
    """One payload: its sender and receiver actors (``--actor-threads`` torch threads each, like the
    trainer's actors), the copy peaks measured in the sender, every run timed (``timed_repeats``),
    and per run two yardsticks (``PEAK_NOTE``): ``fraction_of_memcpy`` (the shape peak: a warm copy
    of the payload's own byte count, ``memcpy_bound``) and ``fraction_of_device_memcpy`` (the device
    peak: one large warm ``copy_``, ``rlpipe.bench.flops.device_memcpy``, 1 GiB on a GPU, 256 MiB on
    CPU)."""
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
    """A local Ray instance of its own, without the dashboard, bound to 127.0.0.1 (``main`` shuts it
    down). ``thp`` (``--thp``) sets ``THP_MEM_ALLOC_ENABLE=1`` in the Ray workers: torch then asks
    for transparent huge pages for large CPU allocations, which cuts the page faults of buffers
    allocated per sync -- above all the receive buffer Ray allocates for every RDT/gloo transfer
    (off by default: it is a process-wide memory policy, and the trainer does not set it)."""
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
    p.add_argument("--gap-s", type=float, default=0.2,
                   help="untimed pause before each sync (syncs are an optimizer step apart in training)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="per-sync timeout (train.weight_sync.timeout_s): a sync past it fails, named; the rest go on")
    p.add_argument("--actor-threads", type=int, default=1, help="torch threads in each bench actor")
    p.add_argument("--thp", action="store_true", help="THP_MEM_ALLOC_ENABLE=1 in the Ray workers (see _start_ray)")
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
    """The verdicts and the headline over the payloads measured so far: ``cpu_winner`` per payload;
    ``goal``: does the best CPU transport reach 0.3 of memcpy at every payload of 100 MB or more?;
    ``gpu_goal``: do the same-GPU syncs (``local`` and ``rdt/cuda_ipc`` at ``gpu-shared``) reach 0.3
    of the device memcpy there?; and the fastest run's two fractions at the largest payload."""
    report["load_avg_end"] = list(os.getloadavg())  # other processes on the host skew the numbers
    report |= cpu_verdict(report["payloads"])
    report["gpu_goal"] = gpu_verdict(report["payloads"])
    report |= headline(report["payloads"])


if __name__ == "__main__":
    sys.exit(main())
