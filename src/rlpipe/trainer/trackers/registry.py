"""``logging.trackers`` name -> its tracker class (one file per tracker)."""

from __future__ import annotations

from collections.abc import Callable

from rlpipe.trainer.trackers.base import Tracker
from rlpipe.trainer.trackers.mlflow_run import MlflowTracker
from rlpipe.trainer.trackers.tensorboard_run import TensorBoardTracker
from rlpipe.trainer.trackers.wandb_run import WandbTracker

TRACKER_CLASSES: dict[str, Callable[[], Tracker]] = {
    "tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}
