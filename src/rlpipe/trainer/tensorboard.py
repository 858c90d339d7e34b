"""Optional live curves: the run's metric rows, mirrored to TensorBoard (``logging.tensorboard``).

``metrics.parquet`` stays the contract (aggregation, plots and tests read only it); TensorBoard is a
view for watching a long run while it goes, as cleanrl does. Every numeric metric column of a row is
written as a scalar under its namespaced name (``reward/val_mean``, ``loss/clip_frac``,
``time/update``, ...) at its optimizer step, NaN (not measured at that step) skipped. Rows are
written when the run writer flushes, i.e. once per round, when their validation and phase times
are final; a resumed run continues after its checkpoint's step, so no step is written twice.

Needs the ``tensorboard`` package (``pip install -e '.[tb]'``); ``check_available`` fails before Ray
starts, naming the key, when it is missing.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlpipe.analysis import contract
from rlpipe.config import ConfigError

KEY = "logging.tensorboard"
_NOT_SCALARS = frozenset({"step"})


def check_available() -> None:
    """Raise ``ConfigError`` naming ``logging.tensorboard`` when the package is missing."""
    try:
        import tensorboard  # noqa: F401  (the writer below needs it at run time)
    except ImportError:
        raise ConfigError(f"{KEY} is true but the 'tensorboard' package is not installed: "
                           "pip install -e '.[tb]' (or set logging.tensorboard: false)") from None


class TensorBoardLogger:
    """Writes metric rows as scalars to ``log_dir`` (a SummaryWriter event file)."""

    def __init__(self, log_dir: str | Path, after_step: int = -1):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.last_step = after_step  # rows up to this step are already written (resume)

    def log_rows(self, rows: list[dict]) -> int:
        """Write every row past ``last_step``; returns how many rows were written."""
        new = sorted((r for r in rows if int(r["step"]) > self.last_step), key=lambda r: r["step"])
        for row in new:
            step = int(row["step"])
            for name in contract.METRIC_COLUMNS:
                value = row.get(name)
                if name in _NOT_SCALARS or not isinstance(value, (int, float)) or math.isnan(value):
                    continue
                self.writer.add_scalar(name, float(value), global_step=step)
            self.last_step = step
        self.writer.flush()
        return len(new)

    def close(self) -> None:
        self.writer.close()
