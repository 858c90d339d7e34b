"""What every driver loop shares: the run's context, in three parts, and its round boundary.

- ``ray`` (``ray_calls.RayCalls``): the actors and every blocking call to them, failures in words;
- ``log`` (``step_log.StepLog``): each optimizer step's row, phase seconds, progress lines;
- ``checkpoints`` (``checkpoints.Checkpoints``): ``last.pt`` written, confirmed, restored, and the
  resume advice of a failed run.

``RunContext`` holds them and the run's outputs (``writer``), and does what the loop of seed 000's
pseudocode does between rounds (``end_round``): validation, a checkpoint, a stop signal.
- Validation runs on the generator, so it measures exactly the weights the generator holds: in
  colocated k-step runs that is at round ends (the first round end at or after each multiple of
  ``val_every``), plus step 0 and the final step.
- Within a round the drivers submit an actor's calls without waiting between them and ``get``
  the results in submission order, the order the actor runs them: the actor goes from one step to
  the next with no driver round trip, and the driver still logs each step and names the step of a
  failure. Rounds end at a sync point (validation, checkpoint, stop signal).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from rlpipe.config import PipelineConfig, TrainConfig, to_dict
from rlpipe.trainer.drivers.checkpoints import Checkpoints
from rlpipe.trainer.drivers.progress import ProgressPrinter
from rlpipe.trainer.drivers.ray_calls import RayCalls
from rlpipe.trainer.drivers.step_log import StepLog
from rlpipe.trainer.profiling import phase_split
from rlpipe.trainer.run_writer import RunWriter
from rlpipe.trainer.stop import StopRequested, StopSignals, signal_name
from rlpipe.trainer.trackers import open_trackers
from rlpipe.trainer.weight_sync import sync_backend


@dataclass
class RunContext:
    cfg: PipelineConfig
    train: TrainConfig
    variant: str
    base_checkpoint: str
    dataset_dir: str | None
    out_dir: Path
    threads: int
    resume: bool
    tokenizer: str | None = None  # absolute tokenizer reference for the actors (None: the checkpoint's)
    writer: RunWriter = field(init=False)
    pending_val: list = field(default_factory=list)

    def __post_init__(self):
        trackers = open_trackers(self.cfg.logging.trackers, self.out_dir, self.cfg.workflow.results_dir,
                                 self.variant, self.train.seed,
                                 {**to_dict(self.cfg), "train": to_dict(self.train), "variant": self.variant})
        self.writer = RunWriter(self.out_dir, trackers=trackers, flush_every_s=self.cfg.logging.flush_every_s)
        self.sizes = self.train.derived()
        total = self.sizes.total_optimizer_steps
        self.loop_started = time.time()  # when the training loop began (after start-up and restore)
        self.stop = StopSignals()  # rlpipe train installs its handlers (rlpipe.trainer.stop)
        progress = ProgressPrinter(self.variant, total, versions=self.train.mode == "disaggregated")
        self.log = StepLog(self.writer, self.train, total, progress)
        self.checkpoints = Checkpoints(self.out_dir, self.train, total)
        self.ray = RayCalls(self.variant, self.train, bool(self.cfg.ray.address), self.checkpoints,
                            where=lambda: f" after optimizer step {self.log.step} of {total}")

    def wait_get(self, ref, what: str, step: int, version: int):
        """A rollout batch, the driver's wait for it recorded (``time/wait``)."""
        start = time.time()
        out = self.ray.get(ref, what)
        self.log.waited(start, step, version)
        return out

    def begin(self, generator) -> None:
        """Row 0 with the initial validation; the run's clock starts after it, so wall times and
        throughput measure training, not Ray start-up and model loading."""
        self.writer.add_row({"step": 0, "policy_version": 0, "wall_time": 0.0, "samples": 0})
        self.submit_validation(generator, 0)
        self.collect_validation()
        self.writer.t0 = self.loop_started = time.time()
        self.log.report(0, 0)

    def restore(self, learner) -> tuple[int, int]:
        """(next rollout batch, last optimizer step) to continue from; (0, 0) on a fresh run."""
        if not (self.resume and self.checkpoints.path.exists()):
            return 0, 0
        since = time.time()  # the restore logs version events (load_weights): they belong after it
        extra = self.checkpoints.restore(learner, self.ray.get)
        step = int(extra["step"])
        self.writer.resume_from(step, since)
        self.log.samples = int(extra["samples"])
        self.log.step = step
        self.loop_started = time.time()
        self.log.progress.started(step, self.writer.rel(time.time()))
        return int(extra["next_batch"]), step

    def end_round(self, first_step: int, step: int, next_batch: int, generator, learner) -> None:
        """After a round's steps are finalized: validation (on ``generator``), a checkpoint (of
        ``learner``) or a flush when one is due, then the progress lines of steps ``first_step..step``.
        After a stop signal (``rlpipe.trainer.stop``) the checkpoint is always written, then
        ``StopRequested`` ends the run."""
        stopping = self.stop.requested
        if self.validation_due(first_step, step):
            self.submit_validation(generator, step)
        if stopping or self.checkpoints.due(first_step, step):
            self.save_checkpoint(learner, step, next_batch)
            if stopping or step == self.sizes.total_optimizer_steps:
                self.checkpoints.confirm(learner, self.ray.get)  # on disk before the run ends
        else:
            self.collect_validation()
            self.writer.flush_if_due()
        self.log.report(first_step, step)
        if stopping:
            raise StopRequested(f"stopped by {signal_name(self.stop.signum)} after optimizer step {step} of "
                                f"{self.sizes.total_optimizer_steps}", self.stop.signum)

    def save_checkpoint(self, learner, step: int, next_batch: int) -> None:
        """Snapshot the outputs (the snapshot always covers the checkpoint's step; resume cuts it
        there), then the learner writes ``last.pt`` (``Checkpoints.save``)."""
        self.collect_validation()
        self.writer.flush(snapshot=True)
        self.checkpoints.save(learner, self.ray.get, {"step": step, "next_batch": next_batch,
                                                      "samples": self.log.samples,
                                                      "wall_time": self.writer.rel(time.time())})

    def validation_due(self, first_step: int, last_step: int) -> bool:
        every = self.train.val_every
        crossed = any(s % every == 0 for s in range(first_step, last_step + 1))
        return crossed or last_step == self.sizes.total_optimizer_steps

    def submit_validation(self, generator, step: int) -> None:
        self.pending_val.append((step, generator.validate.remote(step)))

    def collect_validation(self) -> None:
        for step, ref in self.pending_val:
            means, _ = self.ray.get(ref, f"validation at step {step}")  # reward/val_mean, val_format, val_answer
            self.writer.update_row(step, means)
        self.pending_val = []

    def run_info(self, devices: int, device_type: str, gpu_fraction: dict[str, float]) -> dict:
        ws = self.train.weight_sync
        return {"variant": self.variant, "mode": self.train.mode, "devices": devices,
                "device_type": device_type, "gpu_fraction": gpu_fraction, "threads": self.threads,
                "total_samples": self.log.samples,
                "total_optimizer_steps": self.sizes.total_optimizer_steps,
                "phase_split": phase_split(self.writer.rows),
                "transport": "local" if self.train.mode != "disaggregated" else ws.transport,
                "backend": sync_backend(ws) if self.train.mode == "disaggregated" else None, "k": self.train.k,
                "replay": self.train.replay.enabled, "config": to_dict(self.train),
                "nodes": self.ray.actor_nodes()}
