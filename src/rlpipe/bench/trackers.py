"""``rlpipe bench trackers``: does logging to experiment trackers slow training? The same short run
with and without ``logging.trackers``, interleaved.

Each pair runs one variant twice through ``rlpipe.trainer.run.run`` inside one local Ray instance:
once with no tracker and once with the trackers asked for (default W&B and MLflow; W&B offline
unless ``WANDB_MODE`` says otherwise, MLflow in a file store in the bench's temporary results
directory), alternating which goes first so that drift in the machine's load falls on both sides.
What is compared is the training loop: the last step's wall time in ``metrics.parquet`` (from the
loop's start, after the initial validation), which a tracker could slow through the driver (its
threads share the driver's interpreter) but not through the end of the run (``run_info.json`` is
written before the trackers finish; their end is reported apart as ``end_s``).

The result: per pair the ratio with/without, their mean, standard deviation and range, and the noise
of the runs without trackers (their coefficient of variation, and the ratio of each to the one
before it), so that a difference can be read against the noise of the same run: within the noise
when the mean ratio is within two coefficients of variation of 1. The JSON carries each run's
load record (``rlpipe.trainer.conditions``) and the machine's load average before and after; on a
machine that other work shares, the numbers say so (``contended_runs``).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

from rlpipe.bench import emit
from rlpipe.config import ConfigError, load_config, load_yaml
from rlpipe.config.checks import check_trackers
from rlpipe.contract import METRICS_FILE, RUN_INFO_FILE
from rlpipe.trainer import local_ray, ray_reaper
from rlpipe.trainer import run as train_run


def _config(src: str, tmp: Path, trackers: list[str], steps: int | None) -> str:
    data = load_yaml(src) or {}
    data.setdefault("logging", {})["trackers"] = trackers
    data["logging"].pop("tensorboard", None)
    data.setdefault("workflow", {})["results_dir"] = str(tmp / "results")
    if steps is not None:
        data.setdefault("train", {})["n_grpo_steps"] = steps
    path = tmp / f"config_{'_'.join(trackers) or 'none'}.yaml"
    path.write_text(yaml.safe_dump(data))
    check_trackers(load_config(str(path)))
    return str(path)


def _one(config: str, variant: str, out: Path, base: str, dataset: str, threads: int) -> dict:
    start = time.time()
    info = train_run.run(config, variant, str(out), base, dataset, threads=threads)
    now = time.time()
    total, end = now - start, now - (out / RUN_INFO_FILE).stat().st_mtime  # end: after run_info.json was written
    loop = float(pd.read_parquet(out / METRICS_FILE)["wall_time"].max())
    cond = info.get("conditions") or {}
    return {"loop_s": round(loop, 3), "run_s": round(total, 3), "end_s": round(end, 3),
            "steps": info["total_optimizer_steps"], "contended": bool(cond.get("contended")),
            "other_cpu_frac": cond.get("other_cpu_frac")}


def _pairs(cfgs: dict[str, str], variant: str, base: str, dataset: str, pairs: int, threads: int,
           tmp: Path) -> list[dict]:
    out = []
    for i in range(pairs):
        order = ("none", "trackers") if i % 2 == 0 else ("trackers", "none")
        pair = {side: _one(cfgs[side], variant, tmp / f"{side}_{i}", base, dataset, threads) for side in order}
        pair["ratio"] = pair["trackers"]["loop_s"] / pair["none"]["loop_s"]
        pair["first"] = order[0]
        out.append(pair)
        print(f"rlpipe bench trackers: pair {i + 1}/{pairs}: without {pair['none']['loop_s']:.2f} s, with "
              f"{pair['trackers']['loop_s']:.2f} s (x{pair['ratio']:.3f})", flush=True)
    return out


def summarize(pairs: list[dict]) -> dict:
    """The ratios' mean and spread, and the noise of the runs without trackers."""
    ratios = [p["ratio"] for p in pairs]
    base = [p["none"]["loop_s"] for p in pairs]
    mean = statistics.mean(ratios)
    cv = statistics.stdev(base) / statistics.mean(base) if len(base) > 1 else math.nan
    noise = [b / a for a, b in zip(base, base[1:], strict=False)]  # two runs without trackers, one after the other
    return {"ratio_mean": mean, "ratio_sd": statistics.stdev(ratios) if len(ratios) > 1 else math.nan,
            "ratio_min": min(ratios), "ratio_max": max(ratios), "baseline_cv": cv, "baseline_ratios": noise,
            "within_noise": bool(math.isfinite(cv) and abs(mean - 1) <= 2 * cv),
            "contended_runs": sum(p[s]["contended"] for p in pairs for s in ("none", "trackers")),
            "end_s_trackers_median": statistics.median(p["trackers"]["end_s"] for p in pairs),
            "end_s_none_median": statistics.median(p["none"]["end_s"] for p in pairs)}


def run_bench(config: str, variant: str, base: str, dataset: str, trackers: list[str], pairs: int,
              threads: int, steps: int | None) -> dict:
    import ray

    os.environ.setdefault("WANDB_MODE", "offline")  # a benchmark uploads nothing
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlpipe-bench-trackers-") as d:
        tmp = Path(d)
        cfgs = {"none": _config(config, tmp, [], steps), "trackers": _config(config, tmp, trackers, steps)}
        watchdog = local_ray.init_ray(load_config(cfgs["none"]), num_cpus=threads + 1)
        try:
            results = _pairs(cfgs, variant, base, dataset, pairs, threads, tmp)
        finally:
            ray.shutdown()
            if watchdog is not None:
                ray_reaper.stop(watchdog)
    return {"bench": "trackers", "variant": variant, "trackers": trackers, "threads": threads,
            "load_avg_start": list(load_start), "load_avg_end": list(os.getloadavg()), "cpus": os.cpu_count(),
            **summarize(results), "pairs": results}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="rlpipe bench trackers", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="a pipeline config (its logging.trackers is replaced)")
    ap.add_argument("--variant", default="onpolicy")
    ap.add_argument("--base", required=True, help="an rlpipe checkpoint or a local HF model directory")
    ap.add_argument("--dataset", required=True, help="the dataset directory")
    ap.add_argument("--trackers", nargs="+", default=["wandb", "mlflow"], choices=["tensorboard", "wandb", "mlflow"])
    ap.add_argument("--pairs", type=int, default=4, help="pairs of runs (with and without), interleaved")
    ap.add_argument("--steps", type=int, default=None, help="override train.n_grpo_steps")
    ap.add_argument("--threads", type=int, default=2, help="the job's threads, as a training job's")
    ap.add_argument("--out", default=None, help="write the JSON here (atomically)")
    a = ap.parse_args(argv)
    if a.pairs < 2:
        ap.error("--pairs must be >= 2 (the noise needs two runs without trackers)")
    try:
        result = run_bench(a.config, a.variant, os.path.abspath(a.base), os.path.abspath(a.dataset),
                           a.trackers, a.pairs, a.threads, a.steps)
    except ConfigError as e:
        ap.error(str(e))
    emit(result, a.out)
    print(f"rlpipe bench trackers: loop time with {'+'.join(a.trackers)} / without: x{result['ratio_mean']:.3f} "
          f"(sd {result['ratio_sd']:.3f}, per pair {result['ratio_min']:.3f}-{result['ratio_max']:.3f}); runs "
          f"without trackers vary by {100 * result['baseline_cv']:.1f}% (coefficient of variation); "
          f"{'within' if result['within_noise'] else 'beyond'} that noise; {result['contended_runs']} of "
          f"{2 * a.pairs} runs contended; load {result['load_avg_start'][0]:.2f} -> {result['load_avg_end'][0]:.2f} "
          f"on {result['cpus']} CPUs", flush=True)
    return result


if __name__ == "__main__":
    main()
