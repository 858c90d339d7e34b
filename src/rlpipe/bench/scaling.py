"""``rlpipe bench scaling``: how a GRPO step's cost grows with model size, batch and response length.

Every point is a real ``rlpipe train`` run (the colocated on-policy driver and the disaggregated
one), ``--steps`` GRPO steps long, on the pipeline's keyword task and tokenizer, through
``rlpipe.trainer.run.run`` inside one Ray instance that the bench starts once (each run's actors
are killed after it). One axis moves at a time from the centre point, which is the pipeline's own
variant (the base's width, ``train.rollout_batch_size``, ``train.sampling_max_tokens``); the other
values come from the config (``workflow.scaling_*``, one place for the defaults):

- ``model``: ``d_model`` in ``scaling_sizes`` (same depth and heads, ``d_ff = 3 d``; randomly
  initialised, since only the cost is measured), x = parameter count;
- ``batch``: ``rollout_batch_size = train_batch_size`` in ``scaling_batches`` (on-policy), x = responses;
- ``length``: response tokens in ``scaling_lengths``: ``sampling_min_tokens = sampling_max_tokens``,
  so every response is exactly that long whatever the model samples (the keyword task has no stop
  string), x = tokens.

GPUs: a point takes what the pipeline's runs take (``workflow.gpus_per_colocated`` /
``gpus_per_disaggregated`` by mode); the bench holds the most of these for all its runs (the workflow's
rule declares the same), and with none declared it hides every GPU and says that its points run on
the CPU.

A point's numbers are medians over its steps after the first (which pays for warm-up):
``samples_per_s`` (``perf/samples_per_s``) and each phase's seconds per step (``time/<phase>``).

Fractions of the chip, as every bench gives them (``rlpipe.bench.flops``, ``peak_note``): a point's
useful FLOPs per step (``flops_per_step``: ``grpo_step_flops`` on that point's model, with the
token counts of the prompts its steady steps sample and its response length) give
``fraction_of_shape_peak`` / ``fraction_of_device_peak`` of the whole step (at ``samples_per_s``)
and ``generate_`` / ``update_fraction_of_peak`` and ``_fraction_of_device_peak`` of those two
phases (over their own seconds). The shape and device peaks are measured once per bench, after
the runs, in the runs' ``train.dtype`` on their device and on one compute actor's threads; the
top-level pair is the first mode's centre point's. ``score`` and ``weight_sync`` do no matrix
products, so they get no FLOP fraction (``fraction_not_applicable`` says why).
The JSON (``--out``, written atomically) holds every point with the run's load record
(``rlpipe.trainer.conditions``); ``rlpipe scaling-report`` draws the curves and fits the growth
exponents. Seed 000 asks for none of this; it is here to show where each phase stops scaling
linearly.
"""

from __future__ import annotations

import argparse
import contextlib
import io as _io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from rlpipe import io
from rlpipe.bench import stamp
from rlpipe.bench.flops import PEAK_NOTE, device_peak, fraction, gflops, grpo_step_flops, matmul_peak, peak_fields
from rlpipe.config import ConfigError, load_config, to_dict
from rlpipe.contract import (
    METRICS_FILE,
    SCALING_AXES,
    SCALING_MODES,
    SCALING_PHASES,
    metric_time_column,
    scaling_phase_key,
)
from rlpipe.lm.checkpoint import load_checkpoint, save_checkpoint
from rlpipe.lm.device import resolve_device
from rlpipe.lm.model import TransformerLM
from rlpipe.lm.tokenizer import load_tokenizer
from rlpipe.tasks import task_for
from rlpipe.trainer import gpu_slots, local_ray, ray_reaper
from rlpipe.trainer import run as train_run

#: the phases with no matrix products of their own: a FLOP fraction would mean nothing there
FRACTION_NOT_APPLICABLE = {
    "score": "the reward is string matching on the host: no matrix products",
    "weight_sync": "a copy of the weights, not FLOPs: its yardstick is the device's copy rate "
                   "(rlpipe bench weight-sync: fraction_of_device_memcpy)"}
SCALING_PEAK_NOTE = PEAK_NOTE + (
    " Here a point's FLOPs are one steady GRPO step's useful work (flops_per_step: rlpipe.bench.flops."
    "grpo_step_flops on that point's model, prompts and response length): each point's fraction_of_shape_peak / "
    "fraction_of_device_peak are the whole step's (FLOPs x samples_per_s / batch), generate_* and update_* that "
    "phase's over its own step_<phase>_s; the top-level pair is the headline point's. score and weight_sync have "
    "none (fraction_not_applicable).")


def points(sizes, batches, lengths, center: dict) -> list[dict]:
    """One-axis-at-a-time design: the centre point once per axis (so each curve has it), then the
    axis's other values. Each point: ``{"axis", "d_model", "batch", "length"}``."""
    out = []
    for axis, values in zip(SCALING_AXES, (sizes, batches, lengths), strict=True):
        key = {"model": "d_model", "batch": "batch", "length": "length"}[axis]
        for v in sorted(set(values) | {center[key]}):
            out.append({**center, key: v, "axis": axis})
    return out


def _checkpoint(base: str, d_model: int, tmp: Path) -> str:
    """A randomly initialised model of width ``d_model`` with the base's depth, heads and tokenizer."""
    path = tmp / f"d{d_model}.pt"
    if not path.exists():
        loaded = load_checkpoint(base)  # a TransformerLM: design() refused an HF base
        cfg = loaded.model_config.replace(d_model=d_model, d_ff=3 * d_model)
        torch.manual_seed(0)
        save_checkpoint(path, TransformerLM(cfg), tokenizer=loaded.tokenizer)
    return str(path)


def point_config(config: str, mode: str, p: dict, steps: int, tmp: Path) -> tuple[str, str]:
    """A pipeline config holding one variant: the point's settings on top of ``train``."""
    cfg = load_config(config)
    name = f"{'coloc' if mode == 'colocated_sync' else 'disagg'}_d{p['d_model']}_b{p['batch']}_l{p['length']}"
    g = cfg.train.group_size
    train = dict(to_dict(cfg.train), mode=mode, k=1, n_grpo_steps=steps, rollout_batch_size=p["batch"],
                 train_batch_size=p["batch"], gradient_accumulation_steps=1, epochs_per_rollout_batch=1,
                 sampling_max_tokens=p["length"], sampling_min_tokens=p["length"], val_every=steps,
                 val_size=2 * g, log_rollouts_every=steps, checkpoint_every=steps)
    # a keyword-track run: a user's tracks inherit this train section too, and one whose own
    # sampling_max_tokens is below the point's length made the point's config invalid
    data = dict(to_dict(cfg), train=train, variants={name: {}}, families={}, tracks={})
    data["workflow"] = dict(data["workflow"], families=None, tracks=["keyword"])
    # a timing point, not an experiment: nothing in the user's trackers (and no tracker's cost in the timing)
    data["logging"] = dict(data["logging"], trackers=[])
    path = tmp / f"{name}.yaml"
    io.write_yaml(path, data)
    return str(path), name


def _summarise(out_dir: Path, info: dict) -> dict:
    m = pd.read_parquet(out_dir / METRICS_FILE)
    steady = m[m["step"] > 1] if (m["step"] > 1).any() else m
    row = {"samples_per_s": float(statistics.median(steady["perf/samples_per_s"].dropna()))}
    for ph in SCALING_PHASES:
        col = metric_time_column(ph)
        vals = steady[col].dropna() if col in steady else []
        row[scaling_phase_key(ph)] = float(statistics.median(vals)) if len(vals) else 0.0
    row["conditions"] = info.get("conditions", {})
    return row


def step_flops(config: str, dataset: str, ckpt: str, p: dict, steps: int) -> dict[str, float]:
    """A steady step's useful FLOPs by phase (``grpo_step_flops``) on the point's model: the mean over
    the rollout batches its steady steps sample (step s samples batch s - 1; the first step is left
    out, as in the timings), every prompt's tokens counted with the checkpoint's tokenizer."""
    train = load_config(config).train
    loaded = load_checkpoint(ckpt)
    tok, task, g = load_tokenizer(loaded.tokenizer), task_for(train, dataset), train.group_size
    per_step = []
    for b in range(1 if steps > 1 else 0, steps):
        prompts = [e.prompt for e in task.prompts_for_batch(b, p["batch"] // g, train.seed)]
        lens = [len(ids) for ids in tok.encode_batch(prompts)]
        per_step.append(grpo_step_flops(loaded.model_config, lens, g, p["length"]))
    return {ph: statistics.mean(f[ph] for f in per_step) for ph in per_step[0]}


def measure_peaks(config: str, threads: int) -> tuple[float, dict]:
    """(shape peak FLOP/s, ``device_peak``) on the runs' device (``train.device``), in their dtype
    (``train.dtype``), on one compute actor's threads (``train.threads``, at most the job's)."""
    train = load_config(config).train
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(train.threads, threads)))
    try:
        dev = resolve_device(train.device)
        shape = max(matmul_peak(device=dev)["flops_per_s"] for _ in range(2))
        return shape, device_peak(dev, train.dtype)
    finally:
        torch.set_num_threads(before)


def point_fractions(point: dict, shape_peak: float, chip: dict) -> dict:
    """A point's useful GFLOP/s per step and its fractions of both peaks: the whole step's (its
    ``flops_per_step`` at ``samples_per_s``) and each FLOP phase's over its own seconds per step
    (None where the phase took no time, e.g. not run)."""
    flops = point["flops_per_step"]
    rate = sum(flops.values()) * point["samples_per_s"] / point["batch"]
    out = {"step_gflops": gflops(rate), "fraction_of_shape_peak": fraction(rate, shape_peak),
           "fraction_of_device_peak": fraction(rate, chip["flops_per_s"])}
    for ph, f in flops.items():
        s = point[scaling_phase_key(ph)]
        out[f"{ph}_fraction_of_peak"] = fraction(f / s, shape_peak) if s > 0 else None
        out[f"{ph}_fraction_of_device_peak"] = fraction(f / s, chip["flops_per_s"]) if s > 0 else None
    return out


def chip_fields(results: list[dict], center: dict, shape_peak: float, chip: dict) -> dict:
    """The bench's top level: the headline point's pair (the first mode's centre point) with both
    peaks (``peak_fields``), ``SCALING_PEAK_NOTE`` and the phases that have no FLOP fraction."""
    head = next(r for r in results if all(r[k] == v for k, v in center.items()))
    rate = sum(head["flops_per_step"].values()) * head["samples_per_s"] / head["batch"]
    return {**peak_fields(rate, shape_peak, chip), "peak_note": SCALING_PEAK_NOTE,
            "headline": f"{head['mode']}, centre point", "fraction_not_applicable": dict(FRACTION_NOT_APPLICABLE)}


def run_point(config, base, dataset, mode, p, steps, threads, tmp: Path) -> dict:
    ckpt = _checkpoint(base, p["d_model"], tmp)
    cfg_path, name = point_config(config, mode, p, steps, tmp)
    out_dir = tmp / "runs" / name
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(_io.StringIO()):  # one line per step per run: keep the bench log short
        info = train_run.run(cfg_path, name, str(out_dir), ckpt, dataset, threads=threads)
    loaded = load_checkpoint(ckpt).model_config
    res = {"mode": mode, **p, "num_parameters": loaded.num_parameters(), "seconds": time.perf_counter() - t0}
    res.update(_summarise(out_dir, info))
    res["flops_per_step"] = step_flops(config, dataset, ckpt, p, steps)
    print(f"  {mode:15s} {p['axis']:6s} d={p['d_model']:<4d} b={p['batch']:<3d} l={p['length']:<3d} "
          f"{res['samples_per_s']:7.1f} samples/s  ({res['seconds']:.1f} s)", flush=True)
    return res


def design(config: str, base: str) -> tuple[dict, list[dict]]:
    """(centre, points), every point checked before anything runs (errors name the workflow.scaling_*
    key)."""
    cfg = load_config(config)
    w, base_cfg = cfg.workflow, load_checkpoint(base).model_config
    if base_cfg is None:
        raise ConfigError(f"rlpipe bench scaling: --base {base} is an HF model; the scaling bench needs an rlpipe "
                          f"TransformerLM checkpoint (its width is varied)")
    center = {"d_model": base_cfg.d_model, "batch": cfg.train.rollout_batch_size,
              "length": cfg.train.sampling_max_tokens}
    for d in w.scaling_sizes:
        try:
            base_cfg.replace(d_model=d, d_ff=3 * d)
        except ValueError as e:
            raise ConfigError(f"workflow.scaling_sizes: {d} does not fit the base's {base_cfg.num_heads} "
                              f"heads: {e}") from None
    for b in w.scaling_batches:
        if b % cfg.train.group_size:
            raise ConfigError(f"workflow.scaling_batches: {b} is not a multiple of train.group_size "
                              f"({cfg.train.group_size})")
    return center, points(w.scaling_sizes, w.scaling_batches, w.scaling_lengths, center)


def bench_gpus(cfg, modes) -> int:
    """The GPUs the bench holds for all its points: each is a training run on the pipeline's GPU
    settings (``rlpipe.config.variant_gpus``: ``workflow.gpus_per_colocated`` or
    ``gpus_per_disaggregated`` by mode), one at a time, so the most that any of ``modes`` takes. The
    workflow's rule declares the same (``rlpipe.workflow.gpus.scaling_gpus``)."""
    w = cfg.workflow
    return max(w.gpus_per_disaggregated if m == "disaggregated" else w.gpus_per_colocated for m in modes)


@contextlib.contextmanager
def bench_devices(cfg, gpus: int):
    """The bench's GPUs, held for all its runs (each run's own acquisition then takes them from us:
    ``rlpipe.trainer.gpu_slots``), with a line saying where the points run. None declared: every
    GPU is hidden (``CUDA_VISIBLE_DEVICES`` empty), so no point, no peak and no actor takes one that
    the job did not declare. On an attached Ray cluster (``ray.address``) Ray places the GPUs."""
    if cfg.ray.address:
        print(f"rlpipe bench scaling: points on the Ray cluster at {cfg.ray.address} ({gpus} GPUs per point at most)",
              flush=True)
        yield []
        return
    if gpus == 0:
        before = os.environ.get(gpu_slots.ENV)
        os.environ[gpu_slots.ENV] = ""
        print("rlpipe bench scaling: no GPU declared (workflow.gpus_per_colocated / gpus_per_disaggregated: 0): "
              "its points run on the CPU", flush=True)
        try:
            yield []
        finally:
            if before is None:
                os.environ.pop(gpu_slots.ENV, None)
            else:
                os.environ[gpu_slots.ENV] = before
        return
    with gpu_slots.acquire_gpus(gpus, lock_dir=Path(cfg.workflow.results_dir) / ".gpu_slots") as slots:
        print(f"rlpipe bench scaling: its points run on {gpus} GPU(s), CUDA_VISIBLE_DEVICES={','.join(slots.devices)}"
              f" (train.device {cfg.train.device})", flush=True)
        yield slots.devices


def run_bench(config, base, dataset, modes, threads) -> dict:
    cfg = load_config(config)
    (center, pts), steps = design(config, base), cfg.workflow.scaling_steps
    import ray

    start, gpus = time.time(), bench_gpus(cfg, modes)
    results = []
    with tempfile.TemporaryDirectory() as tmp, bench_devices(cfg, gpus) as devices:
        # stops Ray if we are killed; started with the GPUs held (its own count may find none)
        watchdog = local_ray.init_ray(cfg, num_cpus=2 * threads + 1, num_gpus=len(devices) if devices else None)
        try:
            done: dict[tuple, dict] = {}  # the centre point is on every axis: run it once per mode
            for mode in modes:
                for p in pts:
                    key = (mode, p["d_model"], p["batch"], p["length"])
                    if key not in done:
                        done[key] = run_point(config, base, dataset, mode, p, steps, threads, Path(tmp))
                    results.append({**done[key], "axis": p["axis"]})
        finally:
            ray.shutdown()
            if watchdog is not None:
                ray_reaper.stop(watchdog)
        shape_peak, chip = measure_peaks(config, threads)  # once, after the runs: on a GPU the driver holds none of it
    for r in results:
        r.update(point_fractions(r, shape_peak, chip))
    return {"bench": "scaling", "steps": steps, "threads": threads, "center": center, "modes": list(modes),
            "gpus": gpus, "load_avg_1m_end": round(os.getloadavg()[0], 2),
            "seconds": round(time.time() - start, 1), **chip_fields(results, center, shape_peak, chip),
            "points": results}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="rlpipe bench scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the pipeline config (its train section is the centre)")
    ap.add_argument("--base", required=True, help="an rlpipe checkpoint: tokenizer, depth and centre width")
    ap.add_argument("--dataset", required=True, help="keyword dataset directory")
    ap.add_argument("--modes", default=",".join(SCALING_MODES))
    ap.add_argument("--threads", type=int, default=2,
                    help="the job's threads, as a training job's (actors get train.threads each, capped to fit)")
    ap.add_argument("--out", default=None, help="write the JSON here (atomically)")
    a = ap.parse_args(argv)
    modes = tuple(a.modes.split(","))
    bad = [m for m in modes if m not in SCALING_MODES]
    if bad:
        ap.error(f"--modes: unknown mode {bad[0]!r}; choose from {', '.join(SCALING_MODES)}")
    if a.threads < 1:
        ap.error("--threads must be >= 1")
    for path, what in ((a.config, "--config"), (a.base, "--base"), (a.dataset, "--dataset")):
        if not os.path.exists(path):
            ap.error(f"{what}: {path} does not exist")
    try:
        result = run_bench(a.config, os.path.abspath(a.base), os.path.abspath(a.dataset), modes, a.threads)
    except ConfigError as e:
        ap.error(str(e))
    text = json.dumps(stamp(result))
    if a.out:
        io.write_text(a.out, text + "\n")
    print(f"rlpipe bench scaling: {len(result['points'])} points in {result['seconds']} s", flush=True)
    return result


if __name__ == "__main__":
    main()
