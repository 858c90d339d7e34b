"""``logging.trackers: [tensorboard]``: the run's metric rows as TensorBoard scalars in ``<run>/tensorboard/``.

A view for watching a long run while it goes, as cleanrl does (``tensorboard --logdir results``).
Every measured metric of a row is one scalar under its namespaced name (``reward/val_mean``,
``loss/clip_frac``, ``time/update``, ...) at its optimizer step; NaN (not measured) is skipped.
Written with the ``tensorboard`` package's own event-file writer (the one torch's ``SummaryWriter``
wraps), so the trackers' process does not import torch. Needs ``pip install -e '.[tb]'``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlpipe import contract
from rlpipe.trainer.trackers.base import RunSpec, metric_items


class TensorBoardTracker:
    name = "tensorboard"
    wants_files = False

    def __init__(self) -> None:
        self.writer: Any = None

    def open(self, spec: RunSpec) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(spec.run_dir / contract.TENSORBOARD_DIR))

    def log_rows(self, rows: list[dict]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        for row in rows:
            values = [Summary.Value(tag=name, simple_value=value) for name, value in metric_items(row)]
            self.writer.add_event(Event(wall_time=time.time(), step=int(row["step"]), summary=Summary(value=values)))
        self.writer.flush()

    def finish(self, files: list[Path], ok: bool) -> None:
        self.writer.close()
