"""Benchmarks (``rlpipe bench <name>``); each prints its result as one JSON line."""

from __future__ import annotations

import json

from rlpipe.io import write_text


def emit(result: dict, out: str | None) -> None:
    """Print ``result`` as one JSON line and, with ``out``, also write it there atomically."""
    line = json.dumps(result)
    print(line, flush=True)
    if out:
        write_text(out, line + "\n")
