"""``rlpipe train``: run one GRPO variant with the Ray trainer and write its outputs.

Everything that can be checked is checked before Ray starts, each failure naming the key or file:
the config and the variant's derived sizes (``ConfigError``); the base checkpoint, opened and
verified in the driver (a damaged, foreign or NaN-poisoned file raises ``CheckpointError``, not an
actor death) and the tokenizer it references (it must load, and fit the model's vocabulary), or,
when ``--base`` is a HuggingFace model directory (seed 001's Qwen2.5-Math-1.5B, never downloaded),
its ``config.json`` (valid JSON with a ``vocab_size``) and ``tokenizer.json`` (it must load and fit); the
dataset (keyword task: ``train.jsonl`` and ``val.jsonl`` parse, every line a ``prompt`` string and a
non-empty ``keywords`` list; ``InputError`` names file and line); the weight-sync backend; and,
when resuming, ``checkpoints/last.pt`` and the snapshot beside it.

``train.recompute_old_log_probs: null`` (auto) is resolved here, once, before any actor starts: on
for an HF base directory or ``dtype: bfloat16`` (the sampler's and the learner's numerics then
differ), off otherwise. The actors, ``config.yaml`` and ``run_info.json`` all get the resolved bool.

Then ``<out>/.lock`` is taken (``rlpipe.trainer.lock``: a second ``rlpipe train`` on the same
directory refuses at once; an unwritable ``--out`` is a one-line error) before the resume decision
touches the directory, and held to the end. Under it, the temporary files that a killed run left
mid-write (``.<name>.<random>.tmp``, ``rlpipe.io``) are deleted first.

Resuming from a damaged checkpoint or snapshot (truncated, corrupt, bit-flipped so that its recorded
sha256 no longer matches, NaN-poisoned, missing steps) is an error naming the file, in ``--resume
auto`` as in ``always``: silently starting afresh would throw away the run's progress on what may be
a transient fault, so the user decides (the message says how: ``--resume never`` starts afresh and
deletes ``checkpoints/``). There is no older checkpoint to fall back to: a run keeps only
``last.pt`` (and the snapshot cut at its step).

A local Ray instance is started by ``rlpipe.trainer.local_ray`` (loopback only, token
authentication, no metrics exporters on fixed ports, a watchdog that stops it if this process is
killed); ``ray.address`` attaches to a cluster instead (see below).

SIGTERM or SIGINT once Ray is up stops the run at the end of its round, after its checkpoint, within
bounded time (``rlpipe.trainer.stop``); the exit status is then 128 + the signal's number. Over the
training loop a driver thread samples the GPU busy fraction (``rlpipe.trainer.profiling``), which
``run_info.json`` records beside the phase split.

``ray.address`` attaches to an existing (possibly multi-node) cluster instead, which rlpipe does not
start or configure: its GCS, raylets, object managers, agents and workers listen where ``ray start``
put them (by default on every interface of each node, at the node address ``ray start
--node-ip-address`` names), because the nodes must reach each other. The token is then the lock:
start the cluster with token authentication, and give the client ``RAY_AUTH_MODE=token`` and the
cluster's token (``RAY_AUTH_TOKEN`` or the token file ``ray start`` wrote); Ray places the actors
and GPUs (on a local instance the job first pins its GPU slots, see ``rlpipe.trainer.gpu_slots``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from rlpipe import io
from rlpipe.config import (
    ConfigError,
    load_config,
    resolve_variant,
    to_dict,
    variant_gpus,
)
from rlpipe.config.checks import check_trackers
from rlpipe.contract import CHECKPOINT_FILE
from rlpipe.lm import decode_package
from rlpipe.lm.checkpoint import CheckpointError, open_base_checkpoint, read_extra
from rlpipe.lm.device import resolve_device
from rlpipe.lm.model import TransformerLM
from rlpipe.lm.policy import HF_CONFIG, is_hf_dir, load_policy
from rlpipe.lm.tokenizer import load_tokenizer
from rlpipe.provenance import provenance
from rlpipe.tasks import check_task
from rlpipe.tasks.base import DatasetError
from rlpipe.tasks.prompt_budget import base_context_length, check_prompt_lengths
from rlpipe.tasks.registry import TaskLoadError
from rlpipe.trainer import conditions, local_ray, ray_reaper
from rlpipe.trainer import resume as resume_policy
from rlpipe.trainer.actors.learner import REQUIRED_EXTRA
from rlpipe.trainer.drivers.colocated import run_colocated
from rlpipe.trainer.drivers.common import RunContext
from rlpipe.trainer.drivers.disaggregated import run_disaggregated
from rlpipe.trainer.drivers.placement import PlacementError
from rlpipe.trainer.drivers.ray_calls import ActorFailure, TrainingDiverged
from rlpipe.trainer.gpu_slots import acquire_gpus
from rlpipe.trainer.lock import RunDirError, RunLockedError, run_lock
from rlpipe.trainer.profiling import GpuBusy
from rlpipe.trainer.resume import ResumeError
from rlpipe.trainer.run_writer import SnapshotError, read_snapshot
from rlpipe.trainer.stop import StopInterrupted, StopRequested, signal_name
from rlpipe.trainer.weight_sync import WeightSyncError, make_transport


class InputError(ValueError):
    """An input file (base checkpoint, tokenizer, dataset) is unusable; the message names it."""


def _check_hf_base(base: str) -> str:
    """An HF model directory as ``--base``: config.json parses and names a vocab_size, tokenizer.json
    loads and fits it. Returns the directory (the tokenizer reference of the actors)."""
    d = Path(base)
    if not is_hf_dir(d):
        raise InputError(f"--base: {d} is a directory but not a HuggingFace model directory (no {HF_CONFIG}); "
                         "pass an rlpipe checkpoint file or a model directory with config.json and tokenizer.json")
    try:
        vocab = json.loads((d / HF_CONFIG).read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(f"--base: {d / HF_CONFIG} is not a valid JSON model config: {e}") from None
    if not isinstance(vocab, int):
        raise InputError(f"--base: {d / HF_CONFIG} has no integer vocab_size (got {vocab!r})")
    if not (d / "tokenizer.json").is_file():
        raise InputError(f"--base: HF model directory {d} has no tokenizer.json (rlpipe reads the fast tokenizer)")
    try:
        tok = load_tokenizer(d)
    except Exception as e:  # the tokenizer loaders raise many types (OSError, ValueError, Exception)
        raise InputError(f"--base: the tokenizer in {d} (tokenizer.json, tokenizer_config.json) cannot be loaded: "
                         f"{type(e).__name__}: {e}") from None
    if tok.vocab_size > vocab:
        raise InputError(f"--base: the tokenizer in {d} has {tok.vocab_size} tokens but {d / HF_CONFIG} "
                         f"only vocab_size={vocab}")
    return str(d.resolve())


def _check_base(base: str) -> str:
    """Open the base checkpoint (or HF model directory) and its tokenizer here, so a bad one fails
    before any actor. Returns the tokenizer reference as an absolute path (actors on a cluster do not
    share the driver's working directory), or the spec unchanged when it is no path (``tiktoken:gpt2``)."""
    if Path(base).is_dir():
        return _check_hf_base(base)
    return open_base_checkpoint(base, "--base").tokenizer_ref


def _check_inputs(train_cfg, base: str, dataset: str | None) -> str:
    """Every input file, opened and checked; returns the tokenizer reference (see ``_check_base``)."""
    tokenizer = _check_base(base)
    try:
        check_task(train_cfg, dataset)  # the task loads, its dataset reads, its reward runs on a few examples
        context = base_context_length(base)
        if context is not None:  # every prompt fits with the response, counted with the run's tokenizer
            check_prompt_lengths(train_cfg, dataset, context, tokenizer)
    except TaskLoadError as e:
        raise InputError(str(e)) from None
    except DatasetError as e:
        raise InputError(f"--dataset: {e}") from None
    except FileNotFoundError as e:
        raise FileNotFoundError(f"--dataset: {e}") from None
    return tokenizer


def _check_resumable(out_dir: str) -> None:
    """The checkpoint and snapshot a resume would read: loadable, finite, consistent."""
    path = Path(out_dir) / CHECKPOINT_FILE
    fix = "rerun with --resume never to start afresh (deletes its checkpoints/)"
    try:
        extra = read_extra(path)  # the whole file checked, without building the model
        missing = [k for k in REQUIRED_EXTRA if k not in extra]
        if missing:
            raise CheckpointError(f"checkpoint {path} is not a resumable trainer checkpoint: extra lacks {missing}")
        read_snapshot(out_dir, int(extra["step"]))
    except (CheckpointError, SnapshotError) as e:
        raise ResumeError(f"cannot resume {out_dir}: {e}; {fix}") from None


def resolve_recompute(train_cfg, base: str):
    """``train_cfg`` with ``recompute_old_log_probs`` resolved to a bool (see the module docstring)."""
    if train_cfg.recompute_old_log_probs is not None:
        return train_cfg
    auto = is_hf_dir(base) or train_cfg.dtype == "bfloat16"
    return train_cfg.model_copy(update={"recompute_old_log_probs": auto})


def prepare_decode_package(train_cfg, base: str) -> None:
    """``train.decode: aot``: load (or build, once per model shape and machine) the decode package
    here, before Ray starts, so that no timed rollout pays the build; the actors then load it from the
    cache in milliseconds. An HF policy decodes eagerly whatever ``train.decode`` says."""
    if train_cfg.decode != "aot" or is_hf_dir(base):
        return
    device = resolve_device(train_cfg.device)
    if device.type != "cpu" or train_cfg.dtype != "float32":
        raise ConfigError(f"train.decode: aot runs float32 on CPU; this run has train.device={device.type} and "
                          f"train.dtype={train_cfg.dtype}. Use train.decode: compiled (torch.compile) there")
    model = load_policy(base, device="cpu").model
    if not isinstance(model, TransformerLM):  # an HF policy saved as an rlpipe checkpoint
        return
    path = decode_package.package_path(model)
    if not path.exists():
        print(f"rlpipe train: building the AOT decode package {path} (once per model shape and machine)", flush=True)
    try:
        decode_package.load(model)
    except decode_package.DecodePackageError as e:
        raise ConfigError(f"train.decode: aot: {e}") from None


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
        threads: int | None = None, resume: str = "never", seed: int | None = None,
        ray_address: str | None = None) -> dict:
    cfg = load_config(config_path)
    if ray_address:  # --ray-address: the allocation's cluster that rlpipe.ray_slurm started
        cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": ray_address})})
    train_cfg = resolve_variant(cfg, variant)
    if seed is not None:  # one replicate of an experiment family (rlpipe.config.family_seeds)
        if seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {seed}")
        train_cfg = train_cfg.model_copy(update={"seed": seed})
    # absolute: actors on a Ray cluster run in another working directory
    base, dataset = os.path.abspath(base), (os.path.abspath(dataset) if dataset else None)
    tokenizer = _check_inputs(train_cfg, base, dataset)
    train_cfg = resolve_recompute(train_cfg, base)
    prepare_decode_package(train_cfg, base)
    if train_cfg.mode == "disaggregated":
        make_transport(train_cfg.weight_sync)  # an unavailable backend fails before Ray starts
    check_trackers(cfg)  # a tracker named but not installed: its extra, before Ray starts
    gpus = variant_gpus(cfg, variant)
    disagg = train_cfg.mode == "disaggregated"
    actor_threads = _actor_threads(train_cfg.threads, threads or cfg.workflow.threads_per_variant, disagg)
    fingerprint = resume_policy.run_fingerprint(to_dict(train_cfg), to_dict(cfg.model), variant, base, dataset)
    with run_lock(out_dir):  # before anything in out_dir is read or changed
        io.remove_stale_temp_files(out_dir)  # a killed run's half-written files (nobody else writes here)
        decision = resume_policy.decide(out_dir, fingerprint, resume)
        if decision.resume:
            _check_resumable(out_dir)
        print(f"rlpipe train {variant}: {decision.reason}", flush=True)
        resume_policy.prepare(out_dir, fingerprint, decision)
        resolved = to_dict(cfg)
        resolved["train"] = to_dict(train_cfg)
        resolved["variant"] = variant
        io.write_yaml(Path(out_dir) / "config.yaml", resolved)
        os.environ.setdefault("OMP_NUM_THREADS", str(actor_threads))
        ctx = RunContext(cfg, train_cfg, variant, base, dataset, Path(out_dir), actor_threads, decision.resume,
                         tokenizer=tokenizer)
        return _run_with_ray(ctx, cfg, gpus, actor_threads, disagg)


def _run_with_ray(ctx: RunContext, cfg, gpus: int, actor_threads: int, disagg: bool) -> dict:
    import ray

    with _gpu_slots(cfg, gpus) as slots:
        owns_ray = not ray.is_initialized()  # a caller (e.g. a test session) may have started one
        watchdog = None
        if owns_ray:  # a job given GPUs starts Ray with exactly those (its own count may find none)
            watchdog = local_ray.init_ray(cfg, num_cpus=(2 * actor_threads + 1) if disagg else actor_threads,
                                 num_gpus=len(slots.devices) if slots else None)
        try:
            # what else the machine does while the run is timed (rlpipe.trainer.conditions): an
            # attached cluster's actors are not our descendants, so their CPU time is not ours to count
            own_tree = not cfg.ray.address
            start = conditions.sample(own_tree)
            ctx.stop.install()  # after ray.init, which installs its own SIGTERM handler
            busy = GpuBusy(gpus).start(remote=bool(cfg.ray.address))
            try:
                info = _drive(ctx, gpus)
                info["gpu_busy"] = busy.stop(since=ctx.loop_started)  # the training loop, not the start-up
            except BaseException as e:  # the rows since the last (throttled) flush show how far the run got
                busy.stop(since=ctx.loop_started)
                with contextlib.suppress(Exception):
                    ctx.writer.flush()
                if ctx.stop.requested:  # whatever ended the loop after a stop signal, the run was stopped
                    raise _stopped(ctx, e) from (None if isinstance(e, StopRequested) else e)
                raise
            run_cores = actor_threads * (2 if disagg else 1) + 1  # + the driver and Ray's processes
            info["conditions"] = conditions.measure(start, own_tree, run_cores).to_json()
            info["provenance"] = provenance()
            ctx.writer.finish(info)
            resume_policy.mark_finished(ctx.out_dir)
        finally:
            with contextlib.suppress(Exception):  # raised above already, if it failed
                ctx.writer.close()
            try:
                if owns_ray:
                    try:
                        ray.shutdown()
                    finally:
                        if watchdog is not None:
                            ray_reaper.stop(watchdog)
                else:
                    _kill_run_actors(ctx.variant)
            finally:
                ctx.stop.restore()  # only now: a stop's deadlines also bound ray.shutdown
    return info


def _stopped(ctx: RunContext, err: BaseException) -> StopRequested:
    """The run's end after a stop signal, in words: where it stopped and what to rerun. An error on
    the way (an actor stopped by the same signal, sent to the whole process group) is named as such."""
    if isinstance(err, StopRequested):
        return type(err)(f"{err}. {ctx.checkpoints.advice()}", err.signum)
    first = (str(err).strip() or type(err).__name__).splitlines()[0]
    return StopInterrupted(f"stopped by {signal_name(ctx.stop.signum)} after optimizer step {ctx.log.step}; the actors "
                           f"stopped too ({first}). {ctx.checkpoints.advice()}", ctx.stop.signum)


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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlpipe train", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--variant", required=True)
    p.add_argument("--out", required=True, help="run directory, e.g. results/runs/<variant>")
    p.add_argument("--base", required=True, help="base model: an rlpipe checkpoint or a local HF model directory")
    p.add_argument("--dataset", default=None, help="keyword dataset directory")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for this job (torch + Ray)")
    p.add_argument("--seed", type=int, default=None, help="override train.seed (a replicate of a family)")
    p.add_argument("--ray-address", default=None, help="override ray.address: attach to this Ray cluster "
                   "(python -m rlpipe.ray_slurm passes the one it started across the job's nodes)")
    p.add_argument("--resume", nargs="?", const="always", default="never", choices=("auto", "never", "always"),
                   help="auto: continue <out>/checkpoints/last.pt iff it is an unfinished run of the same "
                        "settings, else start afresh; always (bare --resume): continue or fail; never (default)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``rlpipe train``; the command line (``rlpipe.cli``) prints the run's flat-reward diagnosis after it."""
    p = parser()
    a = p.parse_args(argv)
    try:
        info = run(a.config, a.variant, a.out, a.base, a.dataset, a.threads, a.resume, a.seed, a.ray_address)
    except (ConfigError, FileNotFoundError, ResumeError, InputError, CheckpointError, RunLockedError,
            RunDirError) as e:
        p.error(str(e))  # bad input: usage error, exit status 2, nothing started
    except (ActorFailure, TrainingDiverged, WeightSyncError, io.OutputWriteError, PlacementError) as e:
        print(f"rlpipe train {a.variant}: error: {e}", file=sys.stderr, flush=True)
        return 1
    except StopRequested as e:  # SIGTERM/SIGINT: 128 + the signal's number, as a shell reports it
        print(f"rlpipe train {a.variant}: {e}", file=sys.stderr, flush=True)
        return 128 + e.signum
    print(f"variant {a.variant}: {info['total_optimizer_steps']} steps, {info['total_samples']} samples -> {a.out}",
          flush=True)
    return 0
