"""``rlpipe train``: run one GRPO variant with the Ray trainer and write its outputs.

Everything that can be checked is checked before Ray starts: the config and the variant's
derived sizes, the base checkpoint, the dataset, the weight-sync backend. A local Ray instance
started here listens on 127.0.0.1 only and has no dashboard unless ``ray.include_dashboard``;
``ray.address`` attaches to an existing cluster instead (then Ray places GPUs; on a local
instance the job first pins its GPU slots, see ``rlpipe.trainer.gpu_slots``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from pathlib import Path

from rlpipe import io
from rlpipe.config import (
    ConfigError,
    load_config,
    resolve_variant,
    to_dict,
    variant_gpus,
)
from rlpipe.trainer import resume as resume_policy
from rlpipe.trainer.drivers.colocated import run_colocated
from rlpipe.trainer.drivers.common import RunContext
from rlpipe.trainer.drivers.disaggregated import run_disaggregated
from rlpipe.trainer.gpu_slots import acquire_gpus
from rlpipe.trainer.resume import ResumeError
from rlpipe.trainer.weight_sync import make_transport


def _check_inputs(train_cfg, base: str, dataset: str | None) -> None:
    if not Path(base).is_file():
        raise FileNotFoundError(f"--base: checkpoint {base} not found (run `rlpipe pretrain` first)")
    if train_cfg.task == "keyword_inclusion":
        if dataset is None or not (Path(dataset) / "train.jsonl").is_file():
            raise FileNotFoundError(f"--dataset: {dataset}/train.jsonl not found (run `rlpipe build-dataset`)")


def _init_ray(cfg, num_cpus: float) -> None:
    import ray

    # Ray starts worker processes at niceness 15 by default: on a shared machine any other process
    # then preempts the training actors and every phase timing is inflated. Run them at normal
    # priority (only affects a Ray instance started here).
    os.environ.setdefault("RAY_worker_niceness", "0")
    env = {"env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning"}}
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, runtime_env=env, log_to_driver=True)
        return
    ray.init(num_cpus=cfg.ray.num_cpus or num_cpus, include_dashboard=cfg.ray.include_dashboard,
             dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1", runtime_env=env,
             logging_level=logging.WARNING, configure_logging=True)


def _actor_threads(per_actor: int, job_threads: int, disagg: bool) -> int:
    """torch threads per compute actor: ``train.threads`` (one CPU "device"), capped so that the
    actors fit in the job's threads. Colocated runs one such device and disaggregated two, as on
    GPUs (1 vs 2), so sync/async speedups and device-hours compare like for like; giving the
    colocated actor every core instead would make the baseline a different machine."""
    cap = max(1, job_threads // 2) if disagg else max(1, job_threads)
    if per_actor > cap:
        print(f"rlpipe train: train.threads={per_actor} exceeds the job's share ({job_threads} threads"
              f"{' for 2 actors' if disagg else ''}); using {cap} per actor")
    return min(per_actor, cap)


def run(config_path: str, variant: str, out_dir: str, base: str, dataset: str | None,
        threads: int | None = None, resume: str = "never") -> dict:
    cfg = load_config(config_path)
    train_cfg = resolve_variant(cfg, variant)
    _check_inputs(train_cfg, base, dataset)
    if train_cfg.mode == "disaggregated":
        make_transport(train_cfg.weight_sync)  # an unavailable backend fails before Ray starts
    gpus = variant_gpus(cfg, variant)
    disagg = train_cfg.mode == "disaggregated"
    actor_threads = _actor_threads(train_cfg.threads, threads or cfg.workflow.threads_per_variant, disagg)
    fingerprint = resume_policy.run_fingerprint(to_dict(train_cfg), to_dict(cfg.model), variant, base, dataset)
    decision = resume_policy.decide(out_dir, fingerprint, resume)
    print(f"rlpipe train {variant}: {decision.reason}", flush=True)
    resume_policy.prepare(out_dir, fingerprint, decision)
    resolved = to_dict(cfg)
    resolved["train"] = to_dict(train_cfg)
    resolved["variant"] = variant
    io.write_yaml(Path(out_dir) / "config.yaml", resolved)
    os.environ.setdefault("OMP_NUM_THREADS", str(actor_threads))
    ctx = RunContext(cfg, train_cfg, variant, base, dataset, Path(out_dir), actor_threads, decision.resume)
    import ray

    with _gpu_slots(cfg, gpus):
        owns_ray = not ray.is_initialized()  # a caller (e.g. a test session) may have started one
        if owns_ray:
            _init_ray(cfg, num_cpus=(2 * actor_threads + 1) if disagg else actor_threads)
        try:
            info = _drive(ctx, gpus)
            ctx.writer.finish(info)
            resume_policy.mark_finished(out_dir)
        finally:
            if owns_ray:
                ray.shutdown()
            else:
                _kill_run_actors(variant)
    return info


def _kill_run_actors(variant: str) -> None:
    import ray

    for name in ("ColocatedWorker", "LearnerWorker", "GeneratorWorker", "Scorer"):
        try:
            ray.kill(ray.get_actor(f"{variant}/{name}"), no_restart=True)
        except ValueError:
            pass


def _drive(ctx, gpus: int) -> dict:
    drivers = {"colocated_sync": run_colocated, "colocated_k": run_colocated,
               "disaggregated": run_disaggregated}
    return drivers[ctx.train.mode](ctx, gpus)


def _gpu_slots(cfg, gpus: int):
    if gpus == 0 or cfg.ray.address:
        return contextlib.nullcontext()

    return acquire_gpus(gpus, lock_dir=Path(cfg.workflow.results_dir) / ".gpu_slots")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlpipe train", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--variant", required=True)
    p.add_argument("--out", required=True, help="run directory, e.g. results/runs/<variant>")
    p.add_argument("--base", required=True, help="base model checkpoint")
    p.add_argument("--dataset", default=None, help="keyword dataset directory")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for this job (torch + Ray)")
    p.add_argument("--resume", nargs="?", const="always", default="never", choices=("auto", "never", "always"),
                   help="auto: continue <out>/checkpoints/last.pt iff it is an unfinished run of the same "
                        "settings, else start afresh; always (bare --resume): continue or fail; never (default)")
    a = p.parse_args(argv)
    try:
        info = run(a.config, a.variant, a.out, a.base, a.dataset, a.threads, a.resume)
    except (ConfigError, FileNotFoundError, ResumeError) as e:
        p.error(str(e))
    print(f"variant {a.variant}: {info['total_optimizer_steps']} steps, {info['total_samples']} samples -> {a.out}")
    return 0
