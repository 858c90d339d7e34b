"""Measure the tolerance of every decode's teacher-forced check over seeds and CPU kernels.

Two decodes run different kernels, so the tests compare each one's recorded log-probs with one
eager forward over its *own* tokens (``DecodeCheck`` in ``conftest.py``), never the tokens of two
decodes. The tolerance must sit at least 3x above the largest difference seen over run seeds and
over the CPU kernels torch may pick on another machine (AVX-512, AVX2, the portable default):

    python tests/kernel_tolerance.py --seeds 0 1 2 3 4 --capabilities native avx2 default \
        [--decodes eager,static,compiled,aot,cudagraph]

runs itself once per capability in a subprocess (``ATEN_CPU_CAPABILITY`` is read when torch starts),
builds the tests' micro base model, samples 32 rows x 40 tokens per seed with and without stop strings
and ``min_tokens``, and prints the largest |recorded - teacher-forced| log-prob of each decode. The
AOT decode needs a C++ compiler and builds its package into ``$RLPIPE_DECODE_CACHE`` (a temporary
directory unless set); the compiled and AOT decodes keep their inductor cache per kernel level.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent


def measure(decodes: list[str], seeds: list[int]) -> dict[str, float]:
    """{decode: largest gap} in this process's kernels."""
    sys.path.insert(0, str(HERE))
    import conftest  # the tests' micro model and the check itself
    from rlpipe.lm.policy import load_policy
    from rlpipe.lm.sampler import SamplingParams, generate

    check = conftest.DecodeCheck
    base, _ = conftest._make_base(Path(tempfile.mkdtemp()))
    policy = load_policy(str(base))
    worst = {}
    for decode in decodes:
        gaps = []
        for seed in seeds:
            for kw in ({}, {"min_tokens": 2, "stop": ("was",)}):
                p = SamplingParams(n=8, temperature=check.TEMPERATURE, max_tokens=40, seed=seed, **kw)
                g = generate(policy.model, policy.tokenizer, check.PROMPTS * 4, p, decode=decode)
                gaps.append(check.max_logprob_gap(policy, g, p.temperature, p.min_tokens))
        worst[decode] = max(gaps)
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--capabilities", nargs="+", default=["native", "avx2", "default"])
    ap.add_argument("--decodes", default="eager,static,compiled,aot")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the per-capability subprocess
    args = ap.parse_args(argv)
    decodes = args.decodes.split(",")
    if args.one:
        import torch

        print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), **measure(decodes, args.seeds)}))
        return 0
    env = dict(os.environ)
    env.setdefault("RLPIPE_DECODE_CACHE", tempfile.mkdtemp(prefix="rlpipe-decode-"))
    rows = []
    for cap in args.capabilities:
        env.pop("ATEN_CPU_CAPABILITY", None)
        if cap != "native":
            env["ATEN_CPU_CAPABILITY"] = cap
        cmd = [sys.executable, __file__, "--one", "--decodes", args.decodes, "--seeds", *map(str, args.seeds)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode:
            print(f"{cap}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    for d in decodes:
        largest = max(r[d] for r in rows)
        print(f"{d}: largest gap {largest:.3g} over {len(rows)} kernel levels x {len(args.seeds)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
