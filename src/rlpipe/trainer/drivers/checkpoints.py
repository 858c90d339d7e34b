"""A run's checkpoint (``checkpoints/last.pt``): when one is due, writing it through the learner,
restoring from it, and what a failed run should do next (the resume advice).

The learner writes the file on a thread (``rlpipe.trainer.actors.checkpoint_writer``): a save is
counted as written when the next save returns (each waits for the one before) or ``confirm`` does;
until then it is ``unconfirmed``, and a failure's advice waits for it (``CHECKPOINT_SETTLE_S``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rlpipe.config import TrainConfig
from rlpipe.contract import CHECKPOINT_FILE
from rlpipe.lm.checkpoint import CheckpointError, read_extra

#: How long a failed run's advice waits for a checkpoint still being written (``on_disk``): a save
#: of the tiny models takes milliseconds, of a 1.5B model seconds; an actor that died with its save
#: leaves it unwritten, and the failure is then reported this much later.
CHECKPOINT_SETTLE_S = 10.0


class Checkpoints:
    """This run's checkpoint in ``out_dir``: ``step`` (the one on disk, confirmed) and ``unconfirmed``
    (the step of one the learner may still be writing)."""

    def __init__(self, out_dir: Path, train: TrainConfig, total_steps: int):
        self.path = Path(out_dir) / CHECKPOINT_FILE
        self.train, self.total_steps = train, total_steps
        self.step: int | None = None
        self.unconfirmed: int | None = None

    def due(self, first_step: int, last_step: int) -> bool:
        every = self.train.checkpoint_every
        return any(s % every == 0 for s in range(first_step, last_step + 1)) or last_step == self.total_steps

    def save(self, learner, get: Callable, extra: dict) -> None:
        """The learner writes ``last.pt`` with ``extra`` (step, next batch, samples, wall time); the
        caller has snapshot the outputs first (resume cuts them at the checkpoint's step). The learner
        refuses non-finite weights, and it only gets here after finite steps (divergence raises before)."""
        step = extra["step"]
        get(learner.save.remote(str(self.path), extra), f"checkpoint at step {step}")
        if self.unconfirmed is not None:
            self.step = self.unconfirmed
        self.unconfirmed = step

    def confirm(self, learner, get: Callable) -> None:
        """Wait until the learner's last checkpoint is on disk (its failure is raised here)."""
        if self.unconfirmed is not None:
            get(learner.wait_saved.remote(), f"checkpoint at step {self.unconfirmed}")
            self.step, self.unconfirmed = self.unconfirmed, None

    def restore(self, learner, get: Callable) -> dict:
        """The learner loads ``last.pt``; returns its extra (``step``, ``next_batch``, ``samples``)."""
        extra = get(learner.restore.remote(str(self.path)), f"restore {self.path}")
        self.step = int(extra["step"])
        return extra

    def on_disk(self) -> int | None:
        """The optimizer step of this run's checkpoint on disk, or None. Read from the file when the
        driver has not recorded it: an actor can die after its checkpoint's rename and before the
        ``save`` call returns to the driver, and the advice must match what is on disk. A save still
        in flight is waited for, up to ``CHECKPOINT_SETTLE_S``."""
        if self.unconfirmed is None:
            if self.step is not None and self.path.is_file():
                return self.step
            return self._step_on_disk()
        # a save still being written on the learner's thread when the run fails: give it a moment to
        # land (on a loaded machine the advice once said "no checkpoint" just before it appeared)
        deadline = time.time() + CHECKPOINT_SETTLE_S
        while True:
            step = self._step_on_disk()
            if step == self.unconfirmed or time.time() >= deadline:
                return step
            time.sleep(0.1)

    def _step_on_disk(self) -> int | None:
        if not self.path.is_file():
            return None
        try:
            return int(read_extra(self.path)["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            return None  # unreadable (or mid-rename): not a checkpoint to resume from

    def advice(self) -> str:
        """What a failed or stopped run should do next: resume from the checkpoint, or start afresh."""
        step = self.on_disk()
        if step is not None:
            return f"Rerun with --resume to continue from {self.path} (optimizer step {step})"
        return (f"No checkpoint was written yet (train.checkpoint_every={self.train.checkpoint_every}): "
                "rerun without --resume to start afresh")

    def state(self) -> str:
        step = self.on_disk()
        if step is not None:
            return f"The checkpoint on disk, {self.path}, is from optimizer step {step}"
        return "No checkpoint of this run is on disk"
