"""``python -m rlpipe.trainer.trackers.child``: the trackers' process (``rlpipe.trainer.trackers.process``),
reading its set-up and the run's rows from stdin. A module of its own, which the package does not
import, so that ``-m`` runs it once."""

from __future__ import annotations

import sys

from rlpipe.trainer.trackers.process import run_child

if __name__ == "__main__":
    run_child(sys.stdin.buffer)
