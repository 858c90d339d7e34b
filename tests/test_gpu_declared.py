"""Every job of the workflow declares the GPUs its command uses: no more, no fewer.

One ``snakemake -n -p`` per config plans the whole DAG; each planned job's shell command is read as
the command itself would read it, and what it would take on a machine with GPUs is compared with the
job's ``gpu`` resource (what Snakemake counts against ``--resources gpu=N`` and the SLURM profile
turns into ``--gpus``):

- ``rlpipe train``: the GPUs the trainer acquires for its variant (``variant_gpus`` of the config
  file it reads);
- ``rlpipe bench scaling``: every point is a training run on a config the bench writes (its own
  ``point_config``), one per mode: the most any of them acquires;
- a command with a device (``--device``; ``rlpipe eval`` without one: ``train.device`` of its config;
  ``rlpipe pretrain``: ``pretrain.device``): ``cuda`` or ``auto`` take a GPU where there is one;
- ``rlpipe bench weight-sync``: its ``--placements`` (all of them by default: two GPUs where Ray
  finds them);
- ``CUDA_VISIBLE_DEVICES=`` (empty) before a command: it sees no GPU;
- the commands that never touch a device (data, tokenizer, reports, figures, the toy grid, the
  test gate): none. A command this test does not know fails it, so a new rule is classified here.

The configs: the smoke workflow with GPUs declared (as the SLURM tests run it), config/gpu.yaml with
the one-GPU overlay the docs give, and the smoke workflow with every device on ``auto`` and no GPU
declared (each job must then keep off a GPU the machine may have).
"""

from __future__ import annotations

import copy
import hashlib
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config

from rlpipe.bench import scaling
from rlpipe.config import load_config, variant_gpus, workflow_tracks
from rlpipe.contract import SCALING_MODES
from rlpipe.workflow import loading
from rlpipe.workflow.resolved import resolved_text
from rlpipe.workflow.runs import Runs

pytestmark = pytest.mark.dag

ROOT = Path(__file__).resolve().parents[1]
GPUS_DECLARED = {"workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 2}}
ONE_GPU = {"workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 1},
           "variants": {"disagg_rdt": {"weight_sync.backend": "cuda_ipc"}}}
AUTO_NO_GPU = {"train": {"device": "auto"}, "pretrain": {"device": "auto"},
               "math": {"train": {"device": "auto"}, "pretrain": {"device": "auto"}}}
CONFIGS = {"smoke-gpus": ("config/smoke.yaml", GPUS_DECLARED), "gpu-one": ("config/gpu.yaml", ONE_GPU),
           "smoke-auto": ("config/smoke.yaml", AUTO_NO_GPU)}
#: commands that use no torch device at all
NO_DEVICE = {"build-corpus", "build-dataset", "build-math-data", "train-tokenizer", "import-base", "eval-base",
             "aggregate", "plot", "math-report", "family-report", "scaling-report", "results-page", "toy-sort",
             "toy-sort-report", "pytest"}
#: the GPUs a weight-sync placement needs (rlpipe.bench.weight_sync: PLACEMENT_GPUS)
PLACEMENT_NEEDS = {"cpu": 0, "gpu-shared": 1, "gpu": 2}
WRAPPERS = ("rlpipe.watch", "rlpipe.ray_slurm")


def segments(shell: str) -> list[tuple[dict, list[str]]]:
    """(environment assignments, argv) of every simple command in a job's shell line, with the
    rlpipe.watch / rlpipe.ray_slurm wrappers and ``sh -c`` unwrapped."""
    lex = shlex.shlex(shell, posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    out, cur = [], []
    for tok in [*lex, ";"]:
        if tok and set(tok) <= set(";&|()<>"):
            if cur:
                out.extend(_unwrap(cur))
            cur = []
        else:
            cur.append(tok)
    return out


def _unwrap(argv: list[str], env: dict | None = None) -> list[tuple[dict, list[str]]]:
    env = dict(env or {})
    if argv[:1] == ["env"]:
        argv = argv[1:]
    while argv and "=" in argv[0] and not argv[0].startswith("-") and argv[0].split("=")[0].isidentifier():
        k, _, v = argv.pop(0).partition("=")
        env[k] = v
    if argv[:1] == ["python"] and len(argv) > 2 and argv[1] == "-m" and argv[2] in WRAPPERS:
        return _unwrap(argv[argv.index("--") + 1:], env)
    if argv[:2] == ["sh", "-c"]:
        return [(dict(env, **e), a) for e, a in segments(argv[2])]
    return [(env, argv)] if argv else []


def options(argv: list[str]) -> dict[str, str]:
    return {a: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "")
            for i, a in enumerate(argv) if a.startswith("--")}


def command_name(argv: list[str]) -> str | None:
    if argv[:3] == ["python", "-m", "pytest"]:
        return "pytest"
    if argv[:1] != ["rlpipe"]:
        return None  # rm, mkdir, mv, cd: shell plumbing
    return " ".join(argv[1:3]) if argv[1] == "bench" else argv[1]


def device_needs(device: str) -> int:
    return 1 if device.startswith("cuda") or device == "auto" else 0


def gpus_needed(env: dict, argv: list[str], tmp: Path) -> int:
    """The GPUs one command takes on a machine that has them (see the module docstring)."""
    name = command_name(argv)
    if name is None or env.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    o = options(argv)
    if name in NO_DEVICE:
        return 0
    if name == "train":
        return variant_gpus(load_config(o["--config"]), o["--variant"])
    if name == "bench scaling":
        cfg = load_config(o["--config"])
        point = {"axis": "model", "d_model": 32, "batch": cfg.train.rollout_batch_size,
                 "length": cfg.train.sampling_max_tokens}
        modes = (o.get("--modes") or ",".join(SCALING_MODES)).split(",")
        return max(variant_gpus(load_config(p), n) for p, n in
                   (scaling.point_config(o["--config"], m, point, 2, tmp) for m in modes))
    if name in ("bench sampler", "bench update", "bench trl"):
        return device_needs(o.get("--device") or "cpu")  # their argparse default: cpu
    if name == "eval":
        return device_needs(o.get("--device") or load_config(o["--config"]).train.device)
    if name == "pretrain":
        return device_needs(load_config(o["--config"]).pretrain.device)
    if name == "bench weight-sync":
        return max(PLACEMENT_NEEDS[p] for p in (o.get("--placements") or ",".join(PLACEMENT_NEEDS)).split(","))
    raise AssertionError(f"this test does not know what `{' '.join(argv[:3])}` uses: classify it in gpus_needed")


def write_resolved_configs(workdir: Path, files: list[str]) -> None:
    """The resolved config files the jobs would read (a dry run writes none: rlpipe.workflow.resolved),
    rebuilt as Snakemake merges the config files and written at the paths the commands name."""
    overlays: dict = {}  # Snakemake: the --configfile files, then the Snakefile's configfile under them
    for f in files:
        update_config(overlays, yaml.safe_load((workdir / f).read_text()))
    merged = copy.deepcopy(overlays)
    update_config(merged, yaml.safe_load((workdir / "config" / "config.yaml").read_text()))
    update_config(merged, overlays)
    loading.drop_null_entries(merged)
    cfg = loading.load_checked(merged)
    tracks = workflow_tracks(cfg)
    runs = Runs(cfg, tracks)
    cfgs = [cfg, *(t.pipeline for t in tracks.values()), *(runs.family_cfg(f) for f in runs.families)]
    texts = {hashlib.sha256(t.encode()).hexdigest()[:16]: t for t in map(resolved_text, cfgs)}
    for path in (workdir / "results" / "config").glob("*.yaml"):
        path.unlink()
    for h, text in texts.items():
        (workdir / "results" / "config").mkdir(parents=True, exist_ok=True)
        (workdir / "results" / "config" / f"resolved-{h}.yaml").write_text(text)


def config_path(workdir: Path, named: str) -> str:
    """The rebuilt file with the hash of the path a command names (its name part is the workflow's)."""
    h = Path(named).stem.rsplit("-", 1)[1]
    path = workdir / "results" / "config" / f"resolved-{h}.yaml"
    assert path.is_file(), f"no resolved config with hash {h} ({named}): the test rebuilds them differently"
    return str(path)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_job_declares_the_gpus_its_command_uses(name, tmp_path, monkeypatch, run_snakemake, dry_run):
    base, overlay = CONFIGS[name]
    shutil.copytree(ROOT / "config", tmp_path / "config")
    (tmp_path / "config" / "test.yaml").write_text(yaml.safe_dump(overlay))
    files = [base, "config/test.yaml"]
    monkeypatch.chdir(tmp_path)
    out = run_snakemake(tmp_path, "-n", "-p", "--configfile", *files).stdout
    write_resolved_configs(tmp_path, files)
    jobs = dry_run.jobs(out)
    assert len(jobs) > 20 and all(j["shell"] for j in jobs), out[-2000:]
    wrong, seen = [], set()
    for job in jobs:
        seen.add(job["rule"])
        needs = 0
        for env, argv in segments(job["shell"]):
            argv = [config_path(tmp_path, a) if i and argv[i - 1] == "--config" else a for i, a in enumerate(argv)]
            needs = max(needs, gpus_needed(env, argv, tmp_path))
        declared = int(job["resources"].get("gpu", 0))
        if declared != needs:
            wrong.append(f"{job['rule']} {job['wildcards']}: uses {needs} GPUs, declares {declared}: {job['shell']}")
    assert not wrong, "\n".join(wrong)
    # the rules that run on a device are all in this DAG (config/gpu.yaml runs no family)
    on_device = {"train_variant", "bench_scaling", "bench_sampler", "bench_update", "bench_weight_sync",
                 "evaluate_model", "pretrain_base", *(("train_family_run",) if name.startswith("smoke") else ())}
    assert on_device <= seen, on_device - seen
