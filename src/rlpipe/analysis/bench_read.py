"""Benchmark JSON files as aggregation reads them: the weight-sync bench's rows of the summary's
``weight_sync.parquet`` and every other bench file as loaded (the discussion quotes them).

``read_bench_weight_sync`` accepts ``rlpipe bench weight-sync``'s shape and a few simpler ones (its
docstring lists them), so a hand-written or older bench file still reaches the report; a skipped or
failed measurement is kept with its reason, so the report can say why a number is missing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rlpipe.analysis.rdt_text import MEMCPY_LABEL
from rlpipe.contract import WEIGHT_SYNC_COLUMNS


def sync_label(info: dict) -> str:
    transport = info.get("transport") or "unknown"
    backend = info.get("backend")
    return f"{transport}/{backend}" if backend else str(transport)  # rdt/gloo, object_store/channel


_MEDIAN_KEYS = ("median_s", "seconds_median", "median_seconds", "median", "p50_s")
_SAMPLES_KEYS = ("all_s", "seconds", "times_s", "times", "samples_s")


def _bench_seconds(rec: dict) -> tuple[float, int]:
    """(median seconds, repeats) of one bench record, whatever reasonable shape it has."""
    for key in _MEDIAN_KEYS:
        val = rec.get(key)
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            reps = rec.get("all_s")
            return float(val), len(reps) if isinstance(reps, list) else int(rec.get("repeats", 1) or 1)
    for key in _SAMPLES_KEYS:
        val = rec.get(key)
        if isinstance(val, list) and val:
            xs = [float(x) for x in val if x is not None]
            return (float(np.median(xs)), len(xs)) if xs else (math.nan, 0)
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            return float(val), 1
    return math.nan, 0


def _bench_records(data) -> list[dict]:
    """Flat records from the shapes we accept (see ``read_bench_weight_sync``)."""
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if not isinstance(data, dict):
        return []
    if isinstance(data.get("payloads"), dict):  # rlpipe bench weight-sync
        out = []
        for payload, body in data["payloads"].items():
            body = body if isinstance(body, dict) else {}
            for rec in _bench_records(body.get("transports") or {}):
                out.append({"payload": payload, "bytes": body.get("bytes"), **rec})
            # the in-run memcpy bound, a row per placement that the report divides by
            for place, key in (("cpu", "memcpy_cpu"), ("gpu", "memcpy_gpu"), ("gpu-shared", "memcpy_gpu")):
                bound = body.get(key)
                if isinstance(bound, dict) and "seconds" in bound:
                    out.append({"payload": payload, "bytes": body.get("bytes"),
                                "label": f"{MEMCPY_LABEL}@{place}", "median_s": bound["seconds"],
                                "gbps": bound.get("gbps"), "repeats": bound.get("repeats", 1)})
        return out
    for key in ("results", "transports", "rows", "records"):
        if isinstance(data.get(key), list):
            return [r for r in data[key] if isinstance(r, dict)]
    if data and all(isinstance(v, dict) for v in data.values()):  # {label: record}
        return [{"label": k, **v} for k, v in data.items()]
    return []


def read_bench_weight_sync(path: str | Path) -> pd.DataFrame:
    """Rows ``source=bench`` from a weight-sync bench JSON. Accepted: ``rlpipe bench weight-sync``'s
    ``{"payloads": {name: {"bytes", "memcpy_cpu": {"seconds", "gbps", ...}, "transports":
    {"object_store@cpu": {"median_s", "all_s", "gbps", ...} | {"skipped": why}}}}}`` (each
    ``memcpy_cpu`` / ``memcpy_gpu`` bound becomes a row ``memcpy@cpu`` / ``memcpy@gpu`` and ``@gpu-shared``),
    and simpler shapes: a list of records, ``{"results": [...]}`` or ``{label: record}``, a record
    naming ``transport`` [+ ``backend``] or ``label`` with ``median_s`` or a list of ``seconds``.
    Skipped/failed runs are kept with NaN latency and the reason in ``note``, so the report can say
    why a number is missing."""
    data = json.loads(Path(path).read_text())
    rows = []
    for rec in _bench_records(data):
        info = {"transport": rec.get("transport"), "backend": rec.get("backend")}
        label = rec.get("label") or (sync_label(info) if info["transport"] else None)
        if label is None:
            continue
        seconds, n = _bench_seconds(rec)
        nbytes = rec.get("bytes", rec.get("nbytes"))
        gbps = rec.get("gbps")
        if gbps is None and nbytes and seconds > 0:
            gbps = float(nbytes) / seconds / 1e9
        note = rec.get("error") or rec.get("skipped") or ""
        rows.append({"source": "bench", "variant": "", "payload": str(rec.get("payload", "")),
                     "label": str(label), "median_s": seconds, "n": n,
                     "bytes": float(nbytes) if nbytes is not None else math.nan,
                     "gbps": float(gbps) if gbps is not None else math.nan, "note": str(note)})
    return pd.DataFrame(rows, columns=list(WEIGHT_SYNC_COLUMNS))



def read_bench_any(files: list[str | Path]) -> dict:
    """Every bench JSON file as loaded (the discussion quotes them; unreadable ones are noted)."""
    out = {}
    for f in files:
        p = Path(f)
        try:
            out[p.stem] = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            out[p.stem] = {"error": f"{p}: {e}"}
    return out
