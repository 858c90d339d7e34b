"""Reading a task's JSONL file: one JSON object per non-blank line, errors naming ``file:line``.

Shared by the MATH loader and the generic text task, so both refuse a bad line the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from rlpipe.tasks.base import DatasetError


def jsonl_records(path: Path, error: type[ValueError] = DatasetError,
                  what: str = "data file") -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) for every non-blank line of ``path``; a missing file is a
    ``FileNotFoundError`` naming ``what``, a bad line an ``error`` naming ``file:line``."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(record, dict):
                raise error(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record
