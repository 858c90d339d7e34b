"""``rlpipe bench startup``: how long a training job takes to start and stop, phase by phase, for
today's code and, side by side, an older revision's.

Each run is a real ``rlpipe train`` in a fresh process (the probe ``rlpipe.bench.startup_probe``):
one variant of ``--config`` (default ``onpolicy``) for ``--steps`` optimizer steps, on ``--base``
and ``--dataset``. Its phases, in seconds from the command's start:

- ``imports``: the interpreter and ``rlpipe.trainer.run``'s imports;
- ``checks``: the input checks, the resume decision and ``config.yaml``, up to ``ray.init``;
- ``ray_start``: ``ray.init``;
- ``actors_ready``: from there to the actors' first answer (the step-0 validation);
- ``first_step``: from there to optimizer step 1's row;
- ``rest``: the other steps and the run's outputs, up to ``ray.shutdown``;
- ``shutdown``: from ``ray.shutdown`` to the process's exit.

``startup_s`` is what a job pays besides training: the command's start to its first step, plus its
shutdown. With ``--baseline REV`` the same runs are made with the ``src/`` of git revision ``REV``
(``git archive``, first on ``PYTHONPATH``), interleaved with today's (alternating which goes
first, so a drift in the machine's load falls on both), ``--repeats`` of each; the table gives each
phase's minimum and median per side and the ratio of the medians. The JSON records every run, the
load average before and after, and the CPUs: a machine that other work shares inflates every phase.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

from rlpipe.bench import emit
from rlpipe.config import ConfigError, load_config, load_yaml

PROBE = Path(__file__).with_name("startup_probe.py")
#: (phase, the stamp it starts at, the stamp it ends at); "start" and "exit" are the bench's own
PHASES = (("imports", "start", "imports"), ("checks", "imports", "ray_init_start"),
          ("ray_start", "ray_init_start", "ray_init_end"), ("actors_ready", "ray_init_end", "first_get"),
          ("first_step", "first_get", "first_step"), ("rest", "first_step", "shutdown_start"),
          ("shutdown", "shutdown_start", "exit"))
SIDES = ("baseline", "current")


def phases(stamps: dict[str, float]) -> dict[str, float | None]:
    """Each phase's seconds (None when a stamp is missing), ``startup_s`` and ``total_s``."""
    out = {name: (stamps[b] - stamps[a] if a in stamps and b in stamps else None) for name, a, b in PHASES}
    needed = ("start", "first_step", "shutdown_start", "exit")
    out["startup_s"] = (stamps["first_step"] - stamps["start"] + stamps["exit"] - stamps["shutdown_start"]
                        if all(k in stamps for k in needed) else None)
    out["total_s"] = stamps["exit"] - stamps["start"]
    return out


def _config(src: str, tmp: Path, steps: int, results: Path) -> str:
    data = load_yaml(src) or {}
    data.setdefault("train", {})["n_grpo_steps"] = steps
    data.setdefault("logging", {})["trackers"] = []
    data.setdefault("workflow", {})["results_dir"] = str(results)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    load_config(str(path))  # a bad config fails here, naming its key, not in every run
    return str(path)


def baseline_src(rev: str, tmp: Path) -> Path:
    """``src/`` of git revision ``rev`` of the checkout this module belongs to, extracted under ``tmp``."""
    repo = Path(__file__).resolve().parents[3]
    archive = tmp / "baseline.tar"
    with open(archive, "wb") as f:
        r = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "src"], stdout=f,
                           stderr=subprocess.PIPE, text=False)
    if r.returncode != 0:
        raise ConfigError(f"--baseline {rev}: git archive failed in {repo}: {r.stderr.decode().strip()}")
    with tarfile.open(archive) as t:
        t.extractall(tmp / "baseline", filter="data")
    return tmp / "baseline" / "src"


def one_run(args: list[str], out: Path, src: Path | None, threads: int) -> dict:
    """One ``rlpipe train`` through the probe; its stamps, phases and exit status."""
    stamps_file = out.parent / f"{out.name}.stamps.json"
    env = {**os.environ, "RLPIPE_STARTUP_STAMPS": str(stamps_file), "OMP_NUM_THREADS": str(threads)}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    start = time.time()
    proc = subprocess.run([sys.executable, str(PROBE), *args, "--out", str(out), "--threads", str(threads)],
                          env=env, capture_output=True, text=True)
    stamps = {"start": start, "exit": time.time()}
    if proc.returncode != 0:
        raise RuntimeError(f"rlpipe train exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    stamps.update(json.loads(stamps_file.read_text()))
    return {"phases": phases(stamps), "load_avg": os.getloadavg()[0]}


def summarize(runs: list[dict]) -> dict[str, dict[str, float | None]]:
    """Per phase (and ``startup_s``, ``total_s``): min and median over ``runs``."""
    keys = [p[0] for p in PHASES] + ["startup_s", "total_s"]
    out = {}
    for k in keys:
        vals = [r["phases"][k] for r in runs if r["phases"][k] is not None]
        out[k] = {"min": min(vals), "median": statistics.median(vals)} if vals else {"min": None, "median": None}
    return out


def run_bench(config: str, variant: str, base: str, dataset: str, steps: int, repeats: int, threads: int,
              baseline: str | None) -> dict:
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlpipe-bench-startup-") as d:
        tmp = Path(d)
        cfg = _config(config, tmp, steps, tmp / "results")
        srcs = {"current": None}
        if baseline:
            srcs["baseline"] = baseline_src(baseline, tmp)
        args = ["--config", cfg, "--variant", variant, "--base", base, "--dataset", dataset]
        runs: dict[str, list[dict]] = {side: [] for side in srcs}
        for i in range(repeats):
            order = [s for s in (SIDES if i % 2 == 0 else SIDES[::-1]) if s in srcs]
            for side in order:
                r = one_run(args, tmp / f"{side}_{i}", srcs[side], threads)
                runs[side].append(r)
                print(f"rlpipe bench startup: {side} run {i + 1}/{repeats}: start-up "
                      f"{r['phases']['startup_s']:.2f} s, total {r['phases']['total_s']:.2f} s", flush=True)
    result = {"bench": "startup", "variant": variant, "steps": steps, "threads": threads, "repeats": repeats,
              "baseline": baseline, "cpus": os.cpu_count(), "load_avg_start": list(load_start),
              "load_avg_end": list(os.getloadavg()), "runs": runs,
              "summary": {side: summarize(rs) for side, rs in runs.items()}}
    if baseline:
        cur, old = (result["summary"][side]["startup_s"]["median"] for side in ("current", "baseline"))
        result["startup_ratio"] = cur / old if cur and old else None
    return result


def table(result: dict) -> str:
    """The phases side by side: min / median per side, and current / baseline of the medians."""
    sides = [s for s in SIDES if s in result["summary"]]
    head = f"{'phase':<13}" + "".join(f"{s + ' min/median (s)':>28}" for s in sides)
    lines = [head + ("   ratio" if len(sides) == 2 else "")]
    for k in [p[0] for p in PHASES] + ["startup_s", "total_s"]:
        cells, meds = "", []
        for s in sides:
            v = result["summary"][s][k]
            cell = "-" if v["min"] is None else f"{v['min']:.2f} / {v['median']:.2f}"
            cells += f"{cell:>28}"
            meds.append(v["median"])
        ratio = f"   x{meds[1] / meds[0]:.2f}" if len(meds) == 2 and meds[0] and meds[1] is not None else ""
        lines.append(f"{k:<13}{cells}{ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="rlpipe bench startup", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config/smoke.yaml", help="a pipeline config (default: the smoke config)")
    ap.add_argument("--variant", default="onpolicy")
    ap.add_argument("--base", required=True, help="an rlpipe checkpoint or a local HF model directory")
    ap.add_argument("--dataset", required=True, help="the dataset directory")
    ap.add_argument("--steps", type=int, default=2, help="train.n_grpo_steps of each run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per side, interleaved")
    ap.add_argument("--threads", type=int, default=2, help="the job's threads, as a training job's")
    ap.add_argument("--baseline", default=None, help="a git revision whose src/ is timed side by side")
    ap.add_argument("--out", default=None, help="write the JSON here (atomically)")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.steps < 1:
        ap.error(f"--repeats and --steps must be >= 1, got {a.repeats} and {a.steps}")
    try:
        result = run_bench(a.config, a.variant, os.path.abspath(a.base), os.path.abspath(a.dataset), a.steps,
                           a.repeats, a.threads, a.baseline)
    except ConfigError as e:
        ap.error(str(e))
    emit(result, a.out)
    print(table(result), flush=True)
    print(f"rlpipe bench startup: load {result['load_avg_start'][0]:.2f} -> {result['load_avg_end'][0]:.2f} on "
          f"{result['cpus']} CPUs" + (f"; start-up current / {a.baseline}: x{result['startup_ratio']:.2f}"
                                      if result.get("startup_ratio") else ""), flush=True)
    return result


if __name__ == "__main__":
    main()
