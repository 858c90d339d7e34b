"""Measure the noise of every learning test over seeds and CPU kernels.

A learning test asserts that a trained quantity beats a threshold (``learning.check`` in
``conftest.py``). Its margin must be at least 3x the noise of that quantity, where the noise is its
spread over run seeds *and* over the CPU kernels torch may pick on another machine (AVX-512, AVX2,
the portable default): the same seed gives different trajectories under different kernels.

    python tests/learning_noise.py --seeds 0 1 2 --capabilities native avx2 default [-k EXPR] [--out F]

runs ``pytest -m learning`` once per (seed, capability) with ``RLPIPE_LEARNING_SEED`` and
``ATEN_CPU_CAPABILITY`` set, collects the rows each ``learning.check`` writes, and prints per check:
n, mean, sd, min, the threshold, the margin ``(mean - threshold) / sd`` and the stated noise. A check
whose margin is below 3 (or that failed on any run) is flagged. Exit status 1 when any is flagged.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MIN_MARGIN = 3.0


def run_once(seed: int, capability: str, log: Path, select: str | None) -> int:
    # its own store of built models (conftest.SESSION_BUILDS): each run pretrains its bases on its own
    # kernels, whose spread is part of the noise measured here (the README command shares one base)
    builds = tempfile.mkdtemp(prefix=f"builds-{seed}-{capability}-", dir=log.parent)
    env = dict(os.environ, RLPIPE_LEARNING_SEED=str(seed), RLPIPE_LEARNING_LOG=str(log), RLPIPE_TEST_BUILDS=builds)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    cmd = [sys.executable, "-m", "pytest", "-m", "learning", "-q", "-p", "no:cacheprovider", "--no-header"]
    if select:
        cmd += ["-k", select]
    print(f"# seed {seed}, capability {capability}: {' '.join(cmd[3:])}", flush=True)
    return subprocess.run(cmd, env=env, cwd=Path(__file__).parent.parent).returncode


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["test"], r["name"]), []).append(r)
    out = []
    for (test, name), rs in sorted(groups.items()):
        values = [r["value"] for r in rs]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        mean, threshold = statistics.fmean(values), rs[0]["threshold"]
        margin = (mean - threshold) / sd if sd > 0 else float("inf")
        out.append({"test": test, "name": name, "n": len(values), "mean": mean, "sd": sd, "min": min(values),
                    "threshold": threshold, "margin_sd": margin, "stated_noise": rs[0]["stated_noise"],
                    "failed_runs": sum(v <= threshold for v in values),
                    "by_capability": {c: [r["value"] for r in rs if r["capability"] == c]
                                      for c in sorted({r["capability"] for r in rs})}})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--capabilities", nargs="+", default=["native", "avx2", "default"])
    ap.add_argument("-k", dest="select", help="pytest -k expression (a subset of the learning tests)")
    ap.add_argument("--out", type=Path, help="also write the rows and the summary as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "rows.jsonl"
        for capability in args.capabilities:
            for seed in args.seeds:
                run_once(seed, capability, log, args.select)
        rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    summary = summarize(rows)
    bad = 0
    for s in summary:
        flag = s["margin_sd"] < MIN_MARGIN or s["failed_runs"] > 0
        bad += flag
        print(f"{'FLAG ' if flag else 'ok   '}{s['test']} [{s['name']}]: n={s['n']} mean={s['mean']:.4f} "
              f"sd={s['sd']:.4f} min={s['min']:.4f} threshold={s['threshold']} margin={s['margin_sd']:.1f} sd "
              f"(stated noise {s['stated_noise']}) failed={s['failed_runs']}")
        for cap, vals in s["by_capability"].items():
            print(f"       {cap}: " + " ".join(f"{v:.4f}" for v in vals))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 1 if bad or not summary else 0


if __name__ == "__main__":
    sys.exit(main())
