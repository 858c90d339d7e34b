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
"""

from __future__ import annotations

from rlpipe.analysis.contract import DEVICE_CPU, DEVICE_GPU
from rlpipe.trainer.actors import reference
from rlpipe.trainer.actors.workers import ColocatedWorker
from rlpipe.trainer.drivers.common import RunContext, train_batches
from rlpipe.trainer.gpu_slots import actor_gpus


def run_colocated(ctx: RunContext, gpus: int) -> dict:
    t = ctx.train
    k, spb = t.k, ctx.sizes.train_steps_per_rollout_batch
    share = actor_gpus(t.mode, gpus)
    worker = ctx.actor(ColocatedWorker, gpus=share["colocated"], cpus=ctx.threads,
                       checkpoint=ctx.base_checkpoint, train_cfg=t, dataset_dir=ctx.dataset_dir,
                       threads=ctx.threads, tokenizer=ctx.tokenizer)
    next_batch, step = ctx.restore(worker)
    if step == 0:
        ctx.begin(worker)
    for round_start in range(next_batch, t.n_grpo_steps, k):
        first_step = step + 1
        batches = [ctx.wait_get(worker.rollout.remote(b, b * spb + 1), f"rollout batch {b} (for step {b * spb + 1})",
                                b * spb + 1, step)
                   for b in range(round_start, round_start + k)]
        if step == 0 and reference.needed(t):  # no reference model: no KL to it
            ctx.writer.update_row(0, ctx.get(worker.initial_kl.remote(batches[0]), "initial KL"))
        for b, batch in zip(range(round_start, round_start + k), batches, strict=True):
            for part, sub in enumerate(train_batches(batch, t, b)):  # the worker holds the same split
                step += 1
                ctx.log_update(step, ctx.get(worker.update_rollout.remote(b, part, step), f"update step {step}"), sub)
        ctx.log_sync(step, ctx.get(worker.sync_weights.remote(step), f"weight sync after step {step}"))
        ctx.finalize_steps([ctx.get(worker.drain_logs.remote(), "drain logs")])
        ctx.end_round(first_step, step, round_start + k, worker, worker)
    ctx.finalize_steps([ctx.get(worker.drain_logs.remote(), "drain logs")])
    ctx.collect_validation()
    return ctx.run_info(devices=max(1, min(gpus, 1)), device_type=DEVICE_GPU if gpus else DEVICE_CPU,
                        gpu_fraction=share)
