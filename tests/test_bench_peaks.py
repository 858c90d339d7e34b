"""Every bench JSON carries both fractions of the chip and the note that says which is which
(``rlpipe.contract.BENCH_PEAK_KEYS``): the achieved rate over the shape-matched peak and
over the device peak in the run's dtype.

``BENCH_RUNS`` is the one list of the benches that write a JSON: every ``rlpipe bench`` subcommand
and gpu-check's ``seed_step`` part. Each runs for real at its tiniest CPU setting and its JSON is read
back with conftest's ``bench_peaks``. The two that start Ray in a subprocess of their own (scaling,
weight-sync) are marked slow here: the default suite's smoke workflow runs both and checks their
JSONs with the same ``bench_peaks``. A new ``rlpipe bench``
subcommand, or a new module under ``rlpipe/bench/`` that writes a JSON, fails
``test_every_json_writing_bench_is_listed`` until it is listed here, and then the parametrized
test until its JSON has the fractions. ``trl`` runs its skip path where trl is not installed (both
fractions None, as the contract allows) and the real pairs where it is.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlpipe.cli import BENCHES

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "src" / "rlpipe" / "bench"

#: modules under rlpipe/bench/ that write a JSON but are not benches with an achieved rate
NOT_A_BENCH = {
    "__init__": "defines emit/stamp, used by the benches",
    "gpu_probe": "measures the device peaks themselves: a fraction of itself would be 1 by definition",
    "gpu_check": "collects its parts' JSONs, each a bench listed here or gpu_probe",
    "gpu_bundle": "a manifest of built wheels, no measurement",
    "stop_check": "times a stop on SIGTERM (seconds to exit, processes left): no work to rate against a peak",
    "trackers": "the same run's time with and without trackers: a ratio of equal work, none to rate against a peak",
    "startup": "a training job's start-up and shutdown, phase by phase: waiting on processes, no work to rate",
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, make_base, make_dataset, write_config):
    """(checkpoint, dataset dir, config) of a micro model; the config's scaling sweep is its centre only."""
    d = tmp_path_factory.mktemp("bench_peaks")
    ckpt, _ = make_base(d, pretrain_steps=1)
    cfg = write_config(d / "c.yaml", workflow={"threads_per_variant": 2, "scaling_sizes": [], "scaling_batches": [],
                                               "scaling_lengths": [], "scaling_steps": 2})
    return str(ckpt), str(make_dataset(d / "data")), str(cfg)


def _cli(tmp: Path, *argv: str) -> dict:
    """``rlpipe <argv> --out F`` in a subprocess (its own Ray instance); the JSON it wrote."""
    out = tmp / "out.json"
    r = subprocess.run([sys.executable, "-m", "rlpipe.cli", *argv, "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _main(module, tmp: Path, *argv: str) -> dict:
    out = tmp / "out.json"
    module.main([*argv, "--out", str(out)])
    return json.loads(out.read_text())


def run_sampler(tmp, inputs):
    from rlpipe.bench import sampler

    return _main(sampler, tmp, "--batch", "2", "--new-tokens", "4", "--repeats", "1", "--threads", "1",
                 "--no-compiled", "--no-aot")


def run_update(tmp, inputs):
    from rlpipe.bench import update

    return _main(update, tmp, "--batch", "4", "--group-size", "2", "--prompt-tokens", "4", "--response-tokens", "4",
                 "--repeats", "1")


def run_pretrain_precision(tmp, inputs):
    from rlpipe.bench import pretrain_precision

    return _main(pretrain_precision, tmp, "--vocab", "64", "--batch", "2", "--seq-len", "8", "--repeats", "1")


def run_scaling(tmp, inputs):
    ckpt, data, cfg = inputs
    return _cli(tmp, "bench", "scaling", "--config", cfg, "--base", ckpt, "--dataset", data,
                "--modes", "colocated_sync", "--threads", "1")


def run_weight_sync(tmp, inputs):
    return _cli(tmp, "bench", "weight-sync", "--sizes-mb", "0.05", "--transports", "local", "--placements", "cpu",
                "--repeats", "1")


def run_trl(tmp, inputs):
    from rlpipe.bench import trl

    ckpt, data, _ = inputs
    return _main(trl, tmp, "--checkpoint", ckpt, "--dataset", data, "--steps", "1", "--pairs", "1",
                 "--prompts-per-step", "2", "--threads", "1", "--val-size", "1", "--decode", "eager")


def run_seed_step(tmp, inputs):
    """The part's own ``measure`` (what its ``main`` writes) at its tiny shape: a Qwen2 config of the same
    kind (grouped-query attention, tied embeddings), micro-sized: the 1.5B shape is for the GPU."""
    from rlpipe.bench import seed_step

    return seed_step.measure(torch.device("cpu"), tmp / "out.json", "tiny", decode="static", math_yaml=ROOT / "config"
                             / "math.yaml", work_dir=tmp)


#: the benches that write a JSON, each at its tiniest CPU setting: ``rlpipe bench <name>`` and the
#: gpu-check part ``seed_step`` (``python -m rlpipe.bench.seed_step``)
BENCH_RUNS = {"sampler": run_sampler, "update": run_update, "scaling": run_scaling, "weight-sync": run_weight_sync,
              "trl": run_trl, "seed_step": run_seed_step, "pretrain-precision": run_pretrain_precision}
#: benches that start Ray in a subprocess of their own: marked slow here, since the default suite's smoke
#: workflow (tests/test_workflow_smoke.py) runs both and checks their JSONs with the same ``bench_peaks``
STARTS_RAY = {"scaling", "weight-sync"}


def _writes_json(path: Path) -> bool:
    return bool(re.search(r"\b(write_json|emit|stamp)\(", path.read_text()))


def test_every_json_writing_bench_is_listed():
    rated = {b for b in BENCHES if b.replace("-", "_") not in NOT_A_BENCH}
    assert rated <= set(BENCH_RUNS), f"a bench without a fraction check: {rated - set(BENCH_RUNS)}"
    modules = {name.replace("-", "_") for name in BENCH_RUNS}
    writers = {p.stem for p in BENCH_DIR.glob("*.py") if _writes_json(p)}
    unlisted = writers - modules - set(NOT_A_BENCH)
    assert not unlisted, f"bench modules writing a JSON, in neither BENCH_RUNS nor NOT_A_BENCH: {unlisted}"
    assert set(NOT_A_BENCH) <= writers  # the exemptions are still writers (else drop them)


@pytest.mark.parametrize("bench", [pytest.param(b, marks=[pytest.mark.ray, pytest.mark.slow]) if b in STARTS_RAY
                                   else b for b in BENCH_RUNS])
def test_bench_json_carries_both_peak_fractions(bench, inputs, tmp_path, bench_peaks):
    bench_peaks(bench, BENCH_RUNS[bench](tmp_path, inputs))
