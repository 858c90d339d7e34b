"""``rlpipe gpu-check``: one command that checks a GPU machine, within a fixed time budget.

    rlpipe gpu-check [--out results/gpu-check] [--budget-s 500] [--parts NAME ...]

Writes ``gpu_check.json`` (after every part, atomically, so a killed check still leaves what it
measured) and ``summary.md`` (``rlpipe.bench.gpu_report.render_result``) under ``--out``; the
parts' work (base model, runs, logs) goes to ``--out``/work. Every part is a command run in its
own process group with its own limit and a hard kill (``rlpipe.bench.part_runner``); a failed or
timed-out part is recorded and the next one runs; each part has a share of the budget
(``PART_TIME_S``, ``run_check``). What each part runs, in order: ``build_parts``.

Nothing is downloaded: every part runs offline.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import yaml

from rlpipe.bench import stop_check
from rlpipe.bench.gpu_busy import BusySampler
from rlpipe.bench.gpu_probe import SMI_TIMEOUT_S
from rlpipe.bench.gpu_report import render_result
from rlpipe.bench.part_runner import Part, run_part, run_parts
from rlpipe.config import ConfigError
from rlpipe.config.base import to_dict
from rlpipe.config.pipeline import apply_overrides, load_yaml, parse_config
from rlpipe.io import write_json, write_text

#: the shortened pipeline the check trains (over config/config.yaml + config/gpu.yaml): 16 steps give
#: the loop's median s/step and busy fraction; k4 needs a multiple of 4
CHECK_OVERRIDES = {
    "train": {"n_grpo_steps": 16, "val_every": 8, "checkpoint_every": 16, "log_rollouts_every": 16},
    "workflow": {"run_tests": False, "families": []},
}
#: variant -> the base config's variant it copies (colocated on-policy, k steps, disaggregated)
CHECK_VARIANTS = ("onpolicy", "k4", "disagg")
#: the default of --budget-s: the whole check, at most 500 s (the measured parts' estimates with a tenth
#: of it left free; a runner's time limit around the check should allow a little more)
BUDGET_S = 500.0
#: the share of the budget no part's estimate (nor its kill's grace) may claim: a part that overruns
#: its estimate takes it before it takes the time of the parts after it (a test checks the table)
UNALLOCATED = 0.10
#: the variant the stop check trains and stops (the mode whose job Snakemake was told to stop in
#: the first GPU run)
STOP_VARIANT = "onpolicy"
#: the stop check's own limits: no checkpoint this long after the start fails it with the run's log
#: tail; a run still alive this long after the signal is killed. With Python's start-up and the
#: checkpoint's read-back they fit the part's limit, so a slow start shows as the check's own
#: message, not as a killed part
STOP_START_TIMEOUT_S, STOP_KILL_AFTER_S = 50.0, 35.0
#: a part's start-up before any of its own timeouts runs (Python, torch, Ray) and its report after
PART_OVERHEAD_S = 15.0
#: part -> (estimate, limit), seconds. The estimate is the share of the budget kept for the part
#: while earlier parts run (``part_runner.part_limit``); the limit is its hard kill. The estimates
#: are the first GPU run's times (one H100; each part's own process start, torch and CUDA start-up
#: and, where it trains, a local Ray instance included), rounded up; ``seed_step``'s is reasoned
#: from the H200 run's phases (below). Ordered so that the issue's goals are measured first: the
#: seed-scale step; then the assignment scale's decode (cudagraph vs eager vs HF), the loop's s/step
#: and busy fraction, weight sync; then the update bench and the stop check. The estimates of the
#: parts that run by default and their kills' grace leave ``UNALLOCATED`` of ``BUDGET_S`` free, and
#: every part's own timeouts (``own_timeouts_s``) sit inside its limit (a test checks both).
PART_TIME_S = {
    "machine": (8, 60),            # torch import, CUDA init, every package's metadata, nvidia-smi
    "peaks": (8, 40),              # 3 x 8192^3 matmuls and 1 GiB copies, ~1 s of GPU work; start-up
    "seed_step": (115, 240),       # start-up and the random 1.5B policy written and loaded twice (~20 s);
                                   # a warm-up step (rows capped at 8 tokens: graph capture, ~10 s); per
                                   # step the learner's 256 rows at ~1350 tokens, ~40 s at the H200's
                                   # measured 0.05 s log-probs + 0.22 s forward/backward per micro-batch,
                                   # and generation, ~5 s at the mean 400, ~10 s at 1024 (the engine's goal
                                   # rate); HF generate 32 x 64 tokens (~5 s); two eval chunks (~10 s).
                                   # Its room in the budget's slack takes it to ~170 s; the evaluation
                                   # comes last, and the JSON is written after each measurement
    "bench_sampler": (26, 75),     # BPE + 2 models, batch 64 x 60 tokens: eager, naive, cudagraph
                                   # fp32 + bf16 (capture), HF ours + generate, 2 repeats each; no compile
    "data": (6, 30),
    "tokenizer": (5, 30),
    "pretrain": (24, 60),
    "dataset": (6, 30),            # keyword prompts
    "train_onpolicy": (35, 75),    # Ray start + load + 16 steps + 2 validations + checkpoint: start-up
    "train_k4": (35, 75),          # dominates (16 steps took 34 s on the second H100 run, 24 steps 36 s)
    "train_disagg": (36, 75),      # as onpolicy, two actors sharing the GPU
    "bench_weight_sync": (56, 100),  # Ray; per payload (the model, 1 GB) two actors started and
                                     # their models built on the GPU; 4 transports x (1 warm-up + 3
                                     # timed + 1 verified) syncs; the verifying round hashes each copy.
                                     # With a 100 MB payload too it took 80 s on the second H100 run
    "bench_trl": (54, 120),        # export; rlpipe 8 steps (Ray, 2 validations); TRL import, 8 steps of
                                   # HF generate (64 x 60 tokens); opt-in (OPT_IN)
    "bench_update": (12, 45),      # assignment model, 3 repeats of one update
    "stop_train": (39, 120),       # Ray + load + 4 steps to the first checkpoint, then the stop (goal
                                   # under 30 s) and the checkpoint read back; limit: own_timeouts_s
}
#: parts that run only when ``--parts`` names them, and why
OPT_IN = {"bench_trl": "rlpipe against TRL at the assignment scale, measured on the first GPUs; its share of the "
                       "budget went to seed_step"}
PART_ORDER = tuple(PART_TIME_S)
#: the project's root when rlpipe runs from a checkout (src/rlpipe/bench/ -> the folder above src/)
PROJECT_ROOT = Path(__file__).resolve().parents[3]


def _flag(argv: list[str], flag: str, default: float = 0.0) -> float:
    return float(argv[argv.index(flag) + 1]) if flag in argv else default


def own_timeouts_s(part: Part) -> float:
    """The longest ``part``'s command waits on its own timeouts, one after the other, before it
    reports: the stop check's start timeout and then its wait for the stopped run (at least the
    goal's, for the Ray processes); the machine probe's ``nvidia-smi``; else the longest
    ``--*timeout-s`` it is given (the weight-sync bench's per sync)."""
    if part.name == "machine":
        return SMI_TIMEOUT_S
    if part.name == "stop_train":
        return (_flag(part.argv, "--start-timeout-s", stop_check.START_TIMEOUT_S)
                + max(_flag(part.argv, "--kill-after-s", stop_check.KILL_AFTER_S), stop_check.GOAL_S))
    return max([_flag(part.argv, a) for a in part.argv if a.startswith("--") and a.endswith("timeout-s")], default=0.0)


def check_config(config_dir: Path, results_dir: Path, gpus: int) -> dict:
    """``config.yaml`` + ``gpu.yaml`` + ``CHECK_OVERRIDES``, its variants cut to ``CHECK_VARIANTS``
    and the disaggregated mode's GPUs to what the machine has. Validated; raises ``ConfigError``."""
    data = load_yaml(config_dir / "config.yaml")
    data = apply_overrides(data, load_yaml(config_dir / "gpu.yaml"))
    missing = [v for v in CHECK_VARIANTS if v not in (data.get("variants") or {})]
    if missing:
        raise ConfigError(f"{config_dir / 'config.yaml'}: variants {missing} are missing (the check trains "
                          f"{', '.join(CHECK_VARIANTS)})")
    data["variants"] = {v: data["variants"][v] for v in CHECK_VARIANTS}
    data = apply_overrides(data, CHECK_OVERRIDES)
    data = apply_overrides(data, {"workflow": {"results_dir": str(results_dir),
                                               "gpus_per_disaggregated": max(1, min(2, gpus))}})
    return to_dict(parse_config(data))


def _rl(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlpipe.cli", *args]


def _train_collect(run: Path):
    def collect() -> dict | None:
        import pandas as pd

        info_file = run / "run_info.json"
        if not info_file.is_file():
            return None
        info = json.loads(info_file.read_text())
        info.pop("config", None)
        wall = pd.read_parquet(run / "metrics.parquet", columns=["step", "wall_time"]).sort_values("step")
        steps = wall["wall_time"].diff()[wall["step"] >= 1].dropna()
        return {**info, "steps": int(info.get("total_optimizer_steps") or 0),
                "s_per_step_median": round(float(steps.median()), 4) if len(steps) else None}
    return collect


def build_parts(out: Path, config: Path, gpus: int, dtype: str = "float32") -> list[Part]:
    """The check's parts in ``PART_ORDER`` (``machine`` first), the issue's goals first; ``dtype`` is
    the config's ``train.dtype`` (the learner's, for ``bench update``):

    - ``machine``: GPU, driver, CUDA, torch, and the versions that differ from the lock
      (``gpu_probe machine``). Without a CUDA device the check stops here: ``"gpu": null``, status
      ``no GPU``, exit 0.
    - ``peaks``: bf16, fp32 and TF32 matmul at 8192^3, device-to-device copy (``gpu_probe peaks``).
    - ``seed_step``: seed-scale GRPO steps of a Qwen2.5-Math-1.5B-shaped policy, measured: the
      pipeline's generator and learner at seed 001's settings, responses of drawn lengths (mean 400) and
      of the full 1024 tokens; the generation engine against HF ``generate``; the zero-shot evaluation's
      time projected from two measured chunks (``rlpipe.bench.seed_step``).
    - ``bench_sampler``: ``rlpipe bench sampler`` at the assignment preset, batch 64: the CUDA-graph
      decode against the eager one and HF ``generate`` (the torch.compile decode is left out: its
      compile alone took 14 s).
    - ``data``, ``tokenizer``, ``pretrain``, ``dataset``: the pipeline's own commands on
      ``config/config.yaml`` + ``config/gpu.yaml``, pretraining as configured (its
      base model is the one the training runs start from).
    - ``train_onpolicy``, ``train_k4``, ``train_disagg``: ``rlpipe train`` of each mode at the
      assignment scale, shortened to ``CHECK_OVERRIDES``' steps, with the GPU busy fraction sampled
      through NVML every 100 ms (``rlpipe.bench.gpu_busy``; every part but ``machine`` is sampled).
    - ``bench_weight_sync``: the bench's CLI on the GPU. A bench that has no ``--device`` flag yet is
      recorded as ``unsupported``.
    - ``bench_update``: ``rlpipe bench update`` on the GPU.
    - ``stop_train``: SIGTERM to an ``rlpipe train`` of ``STOP_VARIANT`` inside its loop; seconds to
      exit, exit status, Ray processes left after 30 s, the checkpoint read back
      (``rlpipe.bench.stop_check``).

    Parts in ``OPT_IN`` run only when named (``--parts``): ``bench_trl``, ``rlpipe bench trl`` (rlpipe
    against TRL's ``GRPOTrainer`` at the assignment scale, TRL from the wheel bundle, ``rlpipe gpu-bundle``),
    which gave its share of the budget to ``seed_step``.
    """
    w, parts_dir = out / "work", out / "parts"
    corpus, tok, base, ds = (w / "data/corpus.txt", w / "tokenizer/tokenizer.json", w / "base/model.pt",
                             w / "data/keywords")
    c, threads = str(config), str(max(2, min(8, (os.cpu_count() or 2) // 2)))
    probe = [sys.executable, "-m", "rlpipe.bench.gpu_probe"]

    def res(name: str) -> str:
        return str(parts_dir / f"{name}.json")

    def part(name: str, argv: list[str], result: bool = True, **kw) -> Part:
        estimate, limit = PART_TIME_S[name]
        return Part(name, argv, limit, res(name) if result else None, min_s=estimate, **kw)

    parts = [
        part("machine", [*probe, "machine", "--out", res("machine")]),
        part("peaks", [*probe, "peaks", "--out", res("peaks")]),
        part("seed_step", [sys.executable, "-m", "rlpipe.bench.seed_step", "--out", res("seed_step"), "--math-config",
                           str(Path("config") / "math.yaml"), "--work-dir", str(w)]),
        part("bench_sampler", _rl("bench", "sampler", "--device", "cuda", "--preset", "assignment", "--batch", "64",
                                  "--new-tokens", "60", "--repeats", "2", "--no-aot", "--no-compiled", "--out",
                                  res("bench_sampler"))),
        part("data", _rl("build-corpus", "--config", c, "--out", str(corpus)), result=False),
        part("tokenizer", _rl("train-tokenizer", "--config", c, "--corpus", str(corpus), "--out", str(tok)),
             result=False, needs=("data",)),
        part("pretrain", _rl("pretrain", "--config", c, "--corpus", str(corpus), "--tokenizer", str(tok),
                             "--out", str(base), "--no-progress"), result=False, needs=("tokenizer",)),
        part("dataset", _rl("build-dataset", "--config", c, "--out", str(ds)), result=False),
        *[part(f"train_{v}", _rl("train", "--config", c, "--variant", v, "--base", str(base), "--dataset", str(ds),
                                 "--out", str(w / "runs" / v), "--threads", threads),
               result=False, needs=("pretrain", "dataset"), collect=_train_collect(w / "runs" / v))
          for v in CHECK_VARIANTS],
        part("bench_weight_sync", _rl("bench", "weight-sync", "--checkpoint", str(base), "--sizes-mb", "1000",
                                      "--placements", "gpu-shared,gpu" if gpus >= 2 else "gpu-shared", "--repeats",
                                      "3", "--timeout-s", "30", "--out", res("bench_weight_sync")),
             needs=("pretrain",)),
        part("bench_trl", _rl("bench", "trl", "--device", "cuda", "--checkpoint", str(base), "--dataset", str(ds),
                              "--config", c, "--decode", "config", "--steps", "8", "--pairs", "1", "--threads",
                              threads, "--work-dir", str(w / "trl"), "--out", res("bench_trl")),
             needs=("pretrain", "dataset")),
        part("bench_update", _rl("bench", "update", "--device", "cuda", "--dtype", dtype, "--checkpoint", str(base),
                                 "--repeats", "3", "--out", res("bench_update")), needs=("pretrain",)),
        part("stop_train", [sys.executable, "-m", "rlpipe.bench.stop_check", "--config", c, "--variant", STOP_VARIANT,
                            "--base", str(base), "--dataset", str(ds), "--run-dir", str(w / "runs" / "stop_check"),
                            "--threads", threads, "--start-timeout-s", f"{STOP_START_TIMEOUT_S:g}", "--kill-after-s",
                            f"{STOP_KILL_AFTER_S:g}", "--out", res("stop_train")], needs=("pretrain", "dataset")),
    ]
    assert tuple(p.name for p in parts) == PART_ORDER
    return parts


def select(parts: list[Part], wanted: list[str] | None) -> list[Part]:
    """``machine``, the ``wanted`` parts and every part they need, in ``PART_ORDER``; without
    ``wanted``, every part but the ``OPT_IN`` ones."""
    if not wanted:
        return [p for p in parts if p.name not in OPT_IN]
    by_name = {p.name: p for p in parts}
    keep, todo = {"machine"}, list(wanted)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo += list(by_name[name].needs)
    return [p for p in parts if p.name in keep]


def _git_out(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _is_project_root(root: Path) -> bool:
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return (data.get("project") or {}).get("name") == "rlpipe"


def project_git(root: Path = PROJECT_ROOT) -> dict:
    """The project's own commit: ``{"commit", "dirty"}`` of the git checkout whose top level is
    ``root``, the folder whose ``pyproject.toml`` names rlpipe (the code that runs). Anything else
    records no commit (null, and ``note`` says why) rather than another repository's: a copy of the
    project inside another git repository (``git archive`` unpacked into a larger checkout), a copy
    with no ``.git``, or an installed package."""
    def unknown(why: str) -> dict:
        return {"commit": None, "dirty": None, "note": f"unknown (no git checkout of the project): {why}"}
    root = Path(root).resolve()
    if not _is_project_root(root):
        return unknown(f"{root} holds no pyproject.toml of rlpipe (an installed package)")
    top = _git_out(root, "rev-parse", "--show-toplevel")
    if top is None:
        return unknown(f"{root} is not inside a git repository (or git is missing)")
    if Path(top).resolve() != root:
        return unknown(f"{root} lies inside the git repository {top}, whose commit is not the project's")
    status = _git_out(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": _git_out(root, "rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def _write(out: Path, result: dict) -> None:
    write_json(out / "gpu_check.json", result)
    write_text(out / "summary.md", "# rlpipe gpu-check\n\n" + render_result(result))


def committed_name(result: dict) -> str:
    """The file name a GPU result gets under ``benchmarks/gpu/``: ``<date>-<gpu>.json``."""
    gpu = re.sub(r"[^a-z0-9]+", "-", ((result.get("gpu") or {}).get("name") or "no-gpu").lower()).strip("-")
    return f"{result['date'][:10]}-{gpu}.json"


def _status(records: dict) -> str:
    return "ok" if all(r["status"] == "ok" for r in records.values()) else "partial"


def run_check(out: Path, budget_s: float, wanted: list[str] | None, config_dir: Path) -> dict:
    """Run the check; the result is written to ``out`` after every part.

    Each part also has an estimate (``PART_TIME_S``, with the reasoning beside each number), the
    share of the budget kept for it while earlier parts run: a part is capped at its limit and at
    what the later parts' shares leave, so a part that hangs cannot take the time of the parts after
    it. The estimates add up to less than the budget."""
    t0 = time.monotonic()
    result = {"kind": "rlpipe gpu-check", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "host": platform.node(), "git": project_git(), "budget_s": budget_s, "status": "running",
              "load_avg_start": list(os.getloadavg()), "gpu": None, "machine": None, "parts": {}}
    parts = build_parts(out, out / "work" / "config.yaml", gpus=0)
    rec = run_part(parts[0], out / "logs", limit_s=budget_s)
    result["parts"]["machine"] = rec
    result["machine"] = rec["result"] if isinstance(rec["result"], dict) else None
    result["gpu"] = (result["machine"] or {}).get("gpu")
    if result["gpu"] is None:
        result["status"] = "no GPU" if rec["status"] == "ok" else "failed"
    else:
        cfg = check_config(config_dir, out / "work" / "results", result["gpu"]["count"])
        write_text(out / "work" / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))
        parts = build_parts(out, out / "work" / "config.yaml", result["gpu"]["count"], cfg["train"]["dtype"])
        parts = select(parts, wanted)[1:]

        def progress(r: dict) -> None:
            result["parts"][r["name"]] = r
            result["wall_s"] = round(time.monotonic() - t0, 1)
            _write(out, result)

        try:
            run_parts(parts, out / "logs", budget_s - (time.monotonic() - t0), monitor_for=lambda p: BusySampler(),
                      on_record=progress)
        except (SystemExit, KeyboardInterrupt):  # SIGTERM or Ctrl-C: the running part was killed first
            result["status"] = "stopped"
            result["wall_s"] = round(time.monotonic() - t0, 1)
            _write(out, result)
            raise
        result["status"] = _status(result["parts"])
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["load_avg_end"] = list(os.getloadavg())
    _write(out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/gpu-check", help="folder for gpu_check.json, summary.md, work/, logs/")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole check's time limit in seconds")
    ap.add_argument("--parts", nargs="+", default=None, metavar="NAME",
                    help="run only these parts (and the parts they need): " + ", ".join(PART_ORDER)
                    + f"; {', '.join(OPT_IN)} only when named")
    ap.add_argument("--config-dir", default="config", help="the folder holding config.yaml and gpu.yaml")
    a = ap.parse_args(argv)
    if a.budget_s < 10:
        ap.error(f"--budget-s must be >= 10, got {a.budget_s}")
    unknown = sorted(set(a.parts or ()) - set(PART_ORDER))
    if unknown:
        ap.error(f"--parts: unknown {unknown}; choose from {', '.join(PART_ORDER)}")
    config_dir = Path(a.config_dir)
    for name in ("config.yaml", "gpu.yaml"):
        if not (config_dir / name).is_file():
            ap.error(f"--config-dir: {config_dir / name} does not exist (run from the project root)")
    out = Path(a.out).resolve()
    try:  # bad config files fail here, before any part runs
        check_config(config_dir, out / "work" / "results", gpus=1)
    except ConfigError as e:
        ap.error(str(e))
    result = run_check(out, a.budget_s, a.parts, config_dir)
    print(f"rlpipe gpu-check: {result['status']} in {result['wall_s']} s -> {out / 'gpu_check.json'}, "
          f"{out / 'summary.md'}")
    if result["gpu"] is not None:
        print(f"to publish it: cp {out / 'gpu_check.json'} benchmarks/gpu/{committed_name(result)} && "
              "rlpipe gpu-report --results benchmarks/gpu --page docs/gpu-and-clusters.md")
    return 0
