"""Benchmarks (``rlpipe bench <name>``); each prints its result as one JSON line.

Every benchmark JSON carries ``provenance`` (``rlpipe.provenance``: CPU model and kernels, package
versions, lock hash), so a ratio can be traced to the machine and versions that gave it.
"""

from __future__ import annotations

import json

from rlpipe.io import write_text
from rlpipe.provenance import provenance


def stamp(result: dict) -> dict:
    """``result`` with its ``provenance`` added (kept if the caller already set one)."""
    result.setdefault("provenance", provenance())
    return result


def emit(result: dict, out: str | None) -> None:
    """Print ``result`` (stamped) as one JSON line and, with ``out``, also write it there atomically."""
    line = json.dumps(stamp(result))
    print(line, flush=True)
    if out:
        write_text(out, line + "\n")
