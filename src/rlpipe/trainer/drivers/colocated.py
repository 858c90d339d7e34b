"""Colocated driver: Generator, Learner and ReferenceModel in one ``ColocatedWorker`` actor.

Seed 000 §3.3 Variant A (``colocated_sync``) and Variant B (``colocated_k``) are one loop: a round
generates ``k`` rollout batches with policy version v (their old log-probs are the behaviour
log-probs recorded at sampling, version v, or with ``train.recompute_old_log_probs`` the learner's
log-probs of the same version, computed inside ``ColocatedWorker.rollout``), then takes one
optimizer step per train batch of each (k steps with the on-policy batch knobs; seed 001's
``epochs_per_rollout_batch`` and ``train_batch_size`` multiply that), then syncs weights.
The worker keeps each rollout batch it returns, and the update calls name it (batch index and
train-batch part) instead of sending it back. ``colocated_sync`` is the loop with k = 1, so the two
modes cannot drift apart; a test checks that
a ``colocated_k`` run with k = 1 reproduces a ``colocated_sync`` run bit for bit.

A round's calls are submitted together (``_submit_round``: the rollouts, the initial KL, every
update, the weight sync and the log drain), then their results are read in order. Ray runs the
tasks one submitter gives a synchronous actor one at a time, in submission order
(``max_concurrency=1``; the drivers set no task retries, which would void that), so the worker computes
exactly what it did when the driver waited for each result before the next call, but goes from one
step to the next without a driver round trip in between. Only the round boundary (validation,
checkpoint, stop signal) waits for the driver. Each step's row is written when its result arrives
(its progress line at the round's end, as before), and a failure is raised at the step that failed:
- a step that diverges raises ``TrainingDiverged`` naming it; the round's later calls, already
  queued on the worker, find the learner diverged and refuse to train (``workers``), and the driver
  reads none of their results, so no row, checkpoint or log reflects a step after the failure;
- a dead worker fails every queued call; the first one read names the step, as before;
- ``train.ray_timeout_s`` bounds each result's wait, from when the driver starts reading it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpipe.contract import DEVICE_CPU, DEVICE_GPU
from rlpipe.rl.records import train_batches
from rlpipe.trainer.actors import reference
from rlpipe.trainer.actors.workers import ColocatedWorker
from rlpipe.trainer.drivers.common import RunContext
from rlpipe.trainer.gpu_slots import actor_gpus


@dataclass
class _Round:
    """The refs of one round's calls, in the order the worker runs them."""
    batches: range  # rollout batch indices
    rollouts: list  # one per rollout batch
    initial_kl: object | None  # the step-0 KL to the reference (first round of a fresh run)
    updates: list  # one per optimizer step, batch by batch, train-batch part by part
    sync: object  # the weight sync after the last step
    logs: object  # the worker's phase and version events of the round


def _submit_round(worker, batches: range, step: int, spb: int, initial_kl: bool) -> _Round:
    """Submit every call of a round, without waiting for any (see the module docstring)."""
    rollouts = [worker.rollout.remote(b, b * spb + 1) for b in batches]
    kl = worker.initial_kl.remote(rollouts[0]) if initial_kl else None  # after the rollouts, before any update
    updates = [worker.update_rollout.remote(b, part, step + i * spb + part + 1)
               for i, b in enumerate(batches) for part in range(spb)]
    last = step + len(updates)
    return _Round(batches, rollouts, kl, updates, worker.sync_weights.remote(last), worker.drain_logs.remote())


def run_colocated(ctx: RunContext, gpus: int) -> dict:
    t = ctx.train
    k, spb = t.k, ctx.sizes.train_steps_per_rollout_batch
    share = actor_gpus(t.mode, gpus)
    worker = ctx.ray.actor(ColocatedWorker, gpus=share["colocated"], cpus=ctx.threads,
                       checkpoint=ctx.base_checkpoint, train_cfg=t, dataset_dir=ctx.dataset_dir,
                       threads=ctx.threads, tokenizer=ctx.tokenizer)
    ctx.ray.started()
    next_batch, step = ctx.restore(worker)
    if step == 0:
        ctx.begin(worker)
    for round_start in range(next_batch, t.n_grpo_steps, k):
        first_step = step + 1
        rnd = _submit_round(worker, range(round_start, round_start + k), step, spb,
                            initial_kl=step == 0 and reference.needed(t))  # no reference model: no KL to it
        step = _read_round(ctx, rnd, step, spb)
        ctx.end_round(first_step, step, round_start + k, worker, worker)
    ctx.log.finalize([ctx.ray.get(worker.drain_logs.remote(), "drain logs")])
    ctx.collect_validation()
    return ctx.run_info(devices=max(1, min(gpus, 1)), device_type=DEVICE_GPU if gpus else DEVICE_CPU,
                        gpu_fraction=share)


def _read_round(ctx: RunContext, rnd: _Round, step: int, spb: int) -> int:
    """Read a submitted round's results in order, logging each step; returns the round's last step."""
    batches = [ctx.wait_get(ref, f"rollout batch {b} (for step {b * spb + 1})", b * spb + 1, step)
               for b, ref in zip(rnd.batches, rnd.rollouts, strict=True)]
    if rnd.initial_kl is not None:
        ctx.writer.update_row(0, ctx.ray.get(rnd.initial_kl, "initial KL"))
    subs = [sub for b, batch in zip(rnd.batches, batches, strict=True)
            for sub in train_batches(batch, ctx.train, b)]  # the worker holds the same split
    for sub, ref in zip(subs, rnd.updates, strict=True):
        step += 1
        ctx.log.update(step, ctx.ray.get(ref, f"update step {step}"), sub)
    ctx.log.sync(step, ctx.ray.get(rnd.sync, f"weight sync after step {step}"))
    ctx.log.finalize([ctx.ray.get(rnd.logs, "drain logs")])
    return step
