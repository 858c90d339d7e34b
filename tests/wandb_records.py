"""Reads a W&B offline run back, through W&B's own protobuf records (``wandb.proto``).

wandb 0.31 writes an offline run only as its binary transaction log, ``run-<id>.wandb``, and no
longer ships a Python reader of it. The log is LevelDB's log format with W&B's header: a 7-byte
file header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte
header (CRC32, length, type: full, first, middle, last); a block's tail shorter than a header is
padding. Every whole record is one serialized ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path) -> Iterator:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, buf = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if (length, kind) == (0, 0):  # zero padding to the block's end
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, f"{path}: bad chunk at {pos}"
        pos += HEADER + length
        buf = chunk if kind in (FULL, FIRST) else buf + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            yield record


def offline_runs(run_dir: str | Path) -> list[Path]:
    """The ``run-<id>.wandb`` logs under ``<run>/wandb/``, oldest first."""
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))


def read_run(run_dir: str | Path) -> dict:
    """Every offline log of a run dir merged: ``ids``, ``groups``, ``names``, ``config`` (the first
    run record's, decoded), ``history`` ([(step, {key: value})] in order, W&B's own ``_`` keys
    dropped), ``files`` (paths saved)."""
    out = {"ids": [], "groups": [], "names": [], "config": {}, "history": [], "files": [], "exit_codes": []}
    for log in offline_runs(run_dir):
        for r in records(log):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                out["ids"].append(r.run.run_id)
                out["groups"].append(r.run.run_group)
                out["names"].append(r.run.display_name)
                out["config"] = out["config"] or {u.key: json.loads(u.value_json) for u in r.run.config.update}
            elif kind == "history":
                values = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                out["history"].append((r.history.step.num, {k: v for k, v in values.items()
                                                            if not k.startswith("_")}))
            elif kind == "files":
                out["files"] += [f.path for f in r.files.files]
            elif kind == "exit":
                out["exit_codes"].append(r.exit.exit_code)
    return out
