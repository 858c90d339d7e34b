"""The driver's record of the run, step by step: each optimizer step's row (rewards, losses,
samples, the rollouts logged), its weight sync, the phase seconds and throughput attached once the
actors' phase events are drained, and the progress lines.

Driver-side conventions (the metrics are only comparable across variants because of these):
- ``step`` counts optimizer steps (1-based); row 0 is the initial validation (version 0).
- Phase events are keyed by optimizer step: a rollout batch's generation and scoring are charged
  to the first step that trains on it, a weight sync to the step after which it happens.
- ``time/wait`` is the time the driver is blocked on a rollout batch that is not ready yet: in a
  colocated run that is the whole generation; in a disaggregated run, the generation time that
  training did not hide. It overlaps actor phases and is not part of the phase stack.
"""

from __future__ import annotations

import time

from rlpipe.config import TrainConfig
from rlpipe.rl.records import PhaseEvent, RolloutBatch, UpdateResult
from rlpipe.trainer.drivers.progress import ProgressPrinter
from rlpipe.trainer.profiling import seconds_by_phase
from rlpipe.trainer.run_writer import RunWriter


class StepLog:
    """``step``: the last optimizer step whose result the driver has; ``samples``: the samples
    consumed by optimizer steps so far."""

    def __init__(self, writer: RunWriter, train: TrainConfig, total_steps: int, progress: ProgressPrinter):
        self.writer, self.train, self.total_steps, self.progress = writer, train, total_steps, progress
        self.step = 0
        self.samples = 0
        self.tokens = 0
        self.driver_events: list[PhaseEvent] = []
        self._early_events: list[PhaseEvent] = []  # drained before their step's row exists
        self._new_versions: list = []

    def update(self, step: int, res: UpdateResult, batch: RolloutBatch) -> None:
        """Optimizer step ``step``'s row (and its rollouts, at the first, every ``log_rollouts_every``
        and the last step)."""
        self.step = step
        self.samples += res.samples
        self.tokens += res.tokens
        self.writer.add_row({"step": step, "policy_version": res.version,
                             "wall_time": self.writer.rel(time.time()), "samples": self.samples,
                             "_tokens": res.tokens, **batch.reward_metrics, **res.metrics})
        if step == 1 or step % self.train.log_rollouts_every == 0 or step == self.total_steps:
            items = [{"prompt": p, "response": r, "reward": float(w), "ground_truth": g}
                     for p, r, w, g in list(zip(batch.prompts, batch.responses, batch.rewards.tolist(),
                                                batch.ground_truths, strict=False))[:: batch.group_size][:4]]
            self.writer.add_rollouts(step, res.version, items)

    def sync(self, step: int, stats) -> None:
        """The weight sync after step ``step``: bytes, seconds, throughput."""
        self.writer.update_row(step, {"sync/bytes": float(stats.bytes), "sync/seconds": stats.seconds,
                                      "sync/gbps": stats.gbps})

    def waited(self, start: float, step: int, version: int) -> None:
        """The driver was blocked on a rollout batch from ``start`` until now (``time/wait``)."""
        self.driver_events.append(PhaseEvent("wait", "driver", start, time.time(), step, version))

    def finalize(self, logs: list) -> None:
        """Attach phase seconds and throughput to rows; ``logs`` are actors' drained logs."""
        new = self.driver_events
        self.driver_events = []
        for phase_events, version_events in logs:
            new = new + list(phase_events)
            self.writer.add_versions(version_events)
            self._new_versions += [e for e in version_events if e.event in ("optimizer_step", "load_weights")]
        self.writer.add_events(new)
        # Disaggregated, the generator is a step ahead: its events for step s + 1 (and the driver's
        # wait for that batch) are drained in round s, before row s + 1 exists. They are kept for
        # the round that writes that row, else time/generate, time/score and time/wait read 0.
        events = self._early_events + new
        by_step: dict[int, list[PhaseEvent]] = {}
        for e in events:
            by_step.setdefault(e.step, []).append(e)
        rows = sorted(self.writer.rows, key=lambda r: r["step"])
        last = int(rows[-1]["step"]) if rows else -1
        self._early_events = [e for e in events if e.step > last]
        for prev, row in zip(rows, rows[1:], strict=False):
            if "_tokens" not in row:
                continue
            row.update(seconds_by_phase(by_step.get(int(row["step"]), [])))
            dt = max(row["wall_time"] - prev["wall_time"], 1e-9)
            row["perf/samples_per_s"] = (row["samples"] - prev["samples"]) / dt
            row["perf/tokens_per_s"] = row.pop("_tokens") / dt

    def report(self, first_step: int, last_step: int) -> None:
        """Progress lines for completed steps, with the version changes logged since the last call."""
        for e in sorted(self._new_versions, key=lambda e: e.wall_time):
            self.progress.version(e.who, e.version, self.writer.rel(e.wall_time))
        self._new_versions = []
        for row in sorted(self.writer.rows, key=lambda r: r["step"]):
            if first_step <= row["step"] <= last_step:
                self.progress.step(row)
