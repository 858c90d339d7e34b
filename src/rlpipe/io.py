"""Atomic file output.

Every file rlpipe writes goes through these helpers: the bytes land in a temporary file in the
destination folder and are moved into place with ``os.replace``, so a crash or kill never leaves
a half-written output that Snakemake (or a resumed run) would mistake for a finished one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move it onto ``path``.

    On an exception the temporary file is removed and ``path`` is left untouched.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix + ".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def write_yaml(path: str | os.PathLike, obj: Any) -> None:
    import yaml

    write_text(path, yaml.safe_dump(obj, sort_keys=False))


def write_parquet(path: str | os.PathLike, df) -> None:
    """Write a pandas DataFrame as parquet (pyarrow engine), atomically."""
    with atomic_path(path, suffix=".parquet") as tmp:
        df.to_parquet(tmp, engine="pyarrow", index=False)


def torch_save(path: str | os.PathLike, obj: Any) -> None:
    """``torch.save`` atomically. Keep ``obj`` to tensors, containers and primitives so that it
    loads back with ``torch.load(..., weights_only=True)``."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
