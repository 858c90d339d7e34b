"""Trackers that misbehave, for tests/test_trackers.py: one raises, one blocks for good. Module-level
classes, so that the trackers' process (``spawn``) can import them by name."""

from __future__ import annotations

import threading


class Raises:
    name, wants_files = "raises", True

    def open(self, spec) -> None:
        pass

    def log_rows(self, rows) -> None:
        raise ConnectionError("tracker server unreachable")

    def finish(self, files, ok) -> None:
        pass


class Blocks:
    name, wants_files = "blocks", False

    def open(self, spec) -> None:
        pass

    def log_rows(self, rows) -> None:
        threading.Event().wait()  # a tracker stuck on a dead connection, for good

    def finish(self, files, ok) -> None:
        pass
