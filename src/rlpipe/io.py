"""Atomic file output.

Every file rlpipe writes goes through these helpers: the bytes land in a temporary file in the
destination folder and are moved into place with ``os.replace``, so a crash or kill never leaves
a half-written output that Snakemake (or a resumed run) would mistake for a finished one.

A write that fails part-way (disk full, file-size limit, I/O error) raises ``OutputWriteError``
naming the destination; the temporary file is removed and the destination keeps its previous
content, so a later step (or ``--resume``) still reads the last complete version.

An output gets the mode any other program's new file would: ``0666`` less the process's umask
(``0644`` under the usual ``022``, group-readable under ``002``), not the ``0600`` of the temporary
file ``tempfile.mkstemp`` creates, so a group sharing a results directory can read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class OutputWriteError(OSError):
    """Writing an output failed part-way; the message names the file. The destination was left
    as it was (its previous content, or absent) and the temporary file was removed."""


def _write_failed(dest: Path, cause: BaseException) -> OutputWriteError:
    err = OutputWriteError(f"could not write {dest}: {cause} (disk full or file-size limit? "
                           f"{dest.name} keeps its previous content; the partial temporary file was removed)")
    err.errno = getattr(cause, "errno", None)  # kept for callers that test it (ENOSPC, EFBIG)
    return err


_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status), else by setting
    and restoring it under a lock."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def output_mode() -> int:
    """The permission bits of a new output file: 0666 less the umask."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move it onto ``path``.

    On an exception the temporary file is removed and ``path`` is left untouched; an ``OSError``
    (disk full, ``RLIMIT_FSIZE``, ...) becomes an ``OutputWriteError`` naming ``path``.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix + ".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, output_mode())  # mkstemp made it 0600
        os.replace(tmp_path, dest)
    except OutputWriteError:
        raise
    except OSError as e:
        raise _write_failed(dest, e) from e
    finally:
        tmp_path.unlink(missing_ok=True)


#: the names ``atomic_path`` gives its temporary files: ``.<dest>.<8 random chars><suffix>.tmp``
_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}(\.[A-Za-z0-9]+)?\.tmp$")


def remove_stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files ``atomic_path`` left under ``folder`` (recursively) when its
    process was killed mid-write (a SIGKILL runs no cleanup); returns them. Only for a folder that
    no other process writes to (a run directory under its lock): it cannot tell a stale temporary
    file from one being written. Files of other names are kept."""
    removed = []
    for p in sorted(Path(folder).rglob("*.tmp")):
        if _TEMP_NAME.match(p.name) and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


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
        try:
            torch.save(obj, tmp)
        except RuntimeError as e:  # torch's zip writer reports a failed write as a RuntimeError
            raise _write_failed(Path(path), e) from e


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
