"""What the trackers have of a run, kept beside its checkpoint: ``checkpoints/trackers.json``.

``{"key": ..., "last_step": {"wandb": 12, ...}}``. ``key`` names the run in every tracker (W&B's run
id; MLflow's ``rlpipe.run_key`` tag, by which the run is found again); ``last_step`` is the last
optimizer step each tracker logged. A resumed run reads both, so it continues the same tracker run
and logs only steps after ``last_step``: the steps the killed run computed past its checkpoint are
in the tracker already, and are not logged a second time. Starting afresh deletes ``checkpoints/``
(``rlpipe.trainer.resume``), so a fresh start gets a new key and a new tracker run.

The key is derived from the run directory (its path under the results directory) and a random part,
so two runs of the same directory, one after a fresh start, never share a tracker run.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from pathlib import Path

from rlpipe import contract, io

STATE_FILE = "trackers.json"
_KEY = re.compile(r"^[a-z0-9]{8,64}$")  # W&B run ids: letters and digits


class TrackerState:
    """The key and the last logged step per tracker of one run directory (thread-safe)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / contract.CHECKPOINT_DIR / STATE_FILE
        self._lock = threading.Lock()
        data = self._read()
        key = data.get("key")
        self.key: str = key if isinstance(key, str) and _KEY.match(key) else _new_key(Path(run_dir))
        steps = data.get("last_step") if isinstance(data.get("last_step"), dict) else {}
        self.last_step: dict[str, int] = {k: int(v) for k, v in steps.items() if isinstance(v, int)}
        self._write()

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def after(self, tracker: str) -> int:
        """Steps up to this one are in ``tracker`` already (-1: none)."""
        with self._lock:
            return self.last_step.get(tracker, -1)

    def logged(self, tracker: str, step: int) -> None:
        with self._lock:
            self.last_step[tracker] = max(step, self.last_step.get(tracker, -1))
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        io.write_json(self.path, {"key": self.key, "last_step": dict(self.last_step)})


def _new_key(run_dir: Path) -> str:
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
    return f"{digest}{secrets.token_hex(6)}"
