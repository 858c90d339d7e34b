"""Placement classes: which roles share one Ray actor (one process, one device).

- ``ColocatedWorker``: Generator + Learner + ReferenceModel on one device (seed 000 §3.1-3.3).
  Weight sync is an in-process copy from the learner's model into the generator's model.
- ``LearnerWorker``: Learner + ReferenceModel (the training side of the disaggregated setup), a
  weight *sender*.
- ``GeneratorWorker``: the Generator alone (the rollout side), a weight *receiver*.
- ``Scorer``: reward scoring in its own process (the seed-000 Generator -> Scorer -> Learner flow).

These classes only compose roles and forward calls; the roles hold the logic. Each is turned into
a Ray actor by the driver with resources from the config.

The ReferenceModel is only loaded when something reads it (``reference.needed``: ``kl_coef > 0`` or
``kl_monitor``); otherwise ``update`` passes ``ref_log_probs=None`` and ``initial_kl`` returns ``{}``.
With ``train.recompute_old_log_probs`` the learner rescores each rollout batch after scoring:
``ColocatedWorker.rollout`` does it in place (its learner holds the generator's version), the
disaggregated driver calls ``LearnerWorker.prepare`` on each batch it receives.

The drivers submit a round's calls without waiting between them, so calls can be queued behind an
update that diverges: once the learner has diverged, ``update`` refuses (``NonFiniteLossError``
naming the step that diverged) instead of training on, and the driver, which reads results in
order, reports the first failure. The reference log-probs stay on the device (``reference``): the
learner reads them in the same process.
"""

from __future__ import annotations

import time

from rlpipe.rl.records import RolloutBatch, UpdateResult, train_batches
from rlpipe.rl.scoring import score_batch
from rlpipe.tasks import task_for
from rlpipe.trainer.actors import reference
from rlpipe.trainer.actors.generator import Generator
from rlpipe.trainer.actors.learner import Learner, NonFiniteLossError
from rlpipe.trainer.actors.reference import ReferenceModel
from rlpipe.trainer.profiling import Profiler
from rlpipe.trainer.weight_sync import SyncStats, WeightReceiver, WeightSender, copy_weights


def _reference(checkpoint: str, train_cfg, tokenizer: str | None, prof: Profiler) -> ReferenceModel | None:
    if not reference.needed(train_cfg):
        return None
    return ReferenceModel(checkpoint, train_cfg, tokenizer=tokenizer, profiler=prof)


def _update(learner: Learner, ref_model: ReferenceModel | None, batch: RolloutBatch, step: int) -> UpdateResult:
    if learner.diverged:  # a step queued behind the one that diverged (the drivers submit a round at once)
        raise NonFiniteLossError(f"optimizer step {step} not taken: training diverged at {learner.diverged}")
    due = ref_model is not None and learner.kl_due(step)  # train.kl_monitor_every
    ref = ref_model.log_probs(batch, step, learner.version) if due else None
    return learner.train_step(batch, ref, step)


def _initial_kl(learner: Learner, ref_model: ReferenceModel | None, batch: RolloutBatch) -> dict[str, float]:
    if ref_model is None:
        return {}
    return learner.kl_to_reference_before_training(batch, ref_model.log_probs(batch, 0, 0))


class ColocatedWorker:
    def __init__(self, checkpoint: str, train_cfg, dataset_dir: str | None, threads: int,
                 tokenizer: str | None = None):
        self.cfg = train_cfg
        self.task = task_for(train_cfg, dataset_dir)
        self.prof = Profiler("colocated")
        self.generator = Generator(checkpoint, train_cfg, tokenizer=tokenizer, stop=self.task.stop, threads=threads,
                                   profiler=self.prof, include_stop=self.task.include_stop_str_in_output)
        self.learner = Learner(checkpoint, train_cfg, tokenizer=tokenizer, threads=threads, profiler=self.prof,
                               background_checkpoints=True)
        self.reference = _reference(checkpoint, train_cfg, tokenizer, self.prof)
        self._rollouts: dict[int, list[RolloutBatch]] = {}  # rollout batch index -> its train batches

    def rollout(self, batch_index: int, step: int) -> RolloutBatch:
        """Sample and score rollout batch ``batch_index``; it is also kept here, so that the driver's
        ``update_rollout`` calls name it instead of sending it back."""
        n = self.cfg.derived().n_prompts_per_rollout_batch
        examples = self.task.prompts_for_batch(batch_index, n, self.cfg.seed)
        batch = self.generator.generate(examples, step)
        with self.prof.phase("score", step, batch.policy_version):
            batch = score_batch(batch, self.task, self.cfg)
        if self.cfg.recompute_old_log_probs:  # the learner holds the generator's version here
            batch = self.learner.recompute_old_logprobs(batch, step)
        self._rollouts[batch_index] = train_batches(batch, self.cfg, batch_index)
        return batch

    def update_rollout(self, batch_index: int, part: int, step: int) -> UpdateResult:
        """``update`` on train batch ``part`` of ``train_batches(rollout batch batch_index)``: the batch
        this actor sampled, never sent back to it (a round trip of a few milliseconds per step)."""
        parts = self._rollouts[batch_index]
        result = self.update(parts[part], step)
        if part == len(parts) - 1:
            del self._rollouts[batch_index]
        return result

    def update(self, batch: RolloutBatch, step: int) -> UpdateResult:
        return _update(self.learner, self.reference, batch, step)

    def initial_kl(self, batch: RolloutBatch) -> dict[str, float]:
        return _initial_kl(self.learner, self.reference, batch)

    def sync_weights(self, step: int) -> SyncStats:
        with self.prof.phase("weight_sync", step, self.learner.version):
            stats = copy_weights(self.learner.model, self.generator.model, version=self.learner.version)
            self.generator.mark_loaded(self.learner.version)
        return stats

    def validate(self, step: int) -> tuple[float, list[dict]]:
        examples = self.task.val_examples()[: self.cfg.val_size]
        return self.generator.validate(examples, self.task.reward, step)

    def save(self, path: str, extra: dict) -> None:
        self.learner.save(path, extra)

    def wait_saved(self) -> None:
        self.learner.wait_saved()

    def restore(self, path: str) -> dict:
        extra = self.learner.restore(path)
        copy_weights(self.learner.model, self.generator.model, version=self.learner.version)
        self.generator.mark_loaded(self.learner.version)
        return extra

    def drain_logs(self):
        return self.prof.drain(), self.generator.drain_logs()[1] + self.learner.drain_logs()[1]


class LearnerWorker(WeightSender):
    def __init__(self, checkpoint: str, train_cfg, threads: int, tokenizer: str | None = None):
        self.cfg = train_cfg
        self.prof = Profiler("learner")
        self.learner = Learner(checkpoint, train_cfg, tokenizer=tokenizer, threads=threads, profiler=self.prof,
                               background_checkpoints=True)
        self.reference = _reference(checkpoint, train_cfg, tokenizer, self.prof)

    def prepare(self, batch: RolloutBatch, step: int) -> RolloutBatch:
        """A received (scored) rollout batch, with the learner's old log-probs when
        ``train.recompute_old_log_probs`` is on; unchanged otherwise."""
        if self.cfg.recompute_old_log_probs:
            batch = self.learner.recompute_old_logprobs(batch, step)
        return batch

    def update(self, batch: RolloutBatch, step: int) -> UpdateResult:
        return _update(self.learner, self.reference, batch, step)

    def initial_kl(self, batch: RolloutBatch) -> dict[str, float]:
        return _initial_kl(self.learner, self.reference, batch)

    @property
    def model(self):  # what WeightSender exports
        return self.learner.model

    @property
    def weight_sync_dtype(self):  # the generator's weight dtype: exports cast to it
        return self.learner.sync_dtype

    def save(self, path: str, extra: dict) -> None:
        self.learner.save(path, extra)

    def wait_saved(self) -> None:
        self.learner.wait_saved()

    def restore(self, path: str) -> dict:
        return self.learner.restore(path)

    def drain_logs(self):
        return self.prof.drain(), self.learner.drain_logs()[1]


class GeneratorWorker(WeightReceiver):
    def __init__(self, checkpoint: str, train_cfg, dataset_dir: str | None, threads: int,
                 tokenizer: str | None = None):
        self.cfg = train_cfg
        self.task = task_for(train_cfg, dataset_dir)
        self.generator = Generator(checkpoint, train_cfg, tokenizer=tokenizer, stop=self.task.stop, threads=threads,
                                   include_stop=self.task.include_stop_str_in_output)

    def rollout(self, batch_index: int, step: int) -> RolloutBatch:
        n = self.cfg.derived().n_prompts_per_rollout_batch
        return self.generator.generate(self.task.prompts_for_batch(batch_index, n, self.cfg.seed), step)

    @property
    def model(self):  # what WeightReceiver loads into
        return self.generator.model

    def load_weights(self, state, version: int, checksum: bool = False):
        ack = super().load_weights(state, version, checksum)
        self.generator.mark_loaded(version)
        return ack

    def validate(self, step: int) -> tuple[float, list[dict]]:
        examples = self.task.val_examples()[: self.cfg.val_size]
        return self.generator.validate(examples, self.task.reward, step)

    def ping(self) -> float:
        return time.time()

    def drain_logs(self):
        return self.generator.drain_logs()


class Scorer:
    def __init__(self, train_cfg, dataset_dir: str | None):
        self.cfg = train_cfg
        self.task = task_for(train_cfg, dataset_dir)
        self.prof = Profiler("scorer")

    def score(self, batch: RolloutBatch, step: int) -> RolloutBatch:
        with self.prof.phase("score", step, batch.policy_version):
            return score_batch(batch, self.task, self.cfg)

    def drain_logs(self):
        return self.prof.drain(), []
