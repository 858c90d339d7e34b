"""One ``rlpipe train`` per run directory: ``<out>/.lock``, held with ``fcntl.flock`` for the run.

A second ``rlpipe train`` on the same ``--out`` (a duplicate Snakemake job, a manual rerun while
the first still runs) would interleave checkpoints and metrics of two runs. ``run_lock`` takes an
exclusive, non-blocking lock on ``<out>/.lock`` before anything in the directory is read or
changed (the resume decision included), so the second process refuses at once with
``RunLockedError``. The kernel releases the lock when the holder exits, however it exits (a
SIGKILLed run leaves no stale lock: the file stays, unlocked). The file holds the holder's pid and
host, for the message only. ``flock`` locks are local to one machine (and not reliable on some
network file systems): two hosts sharing a run directory are not protected. A directory that cannot
be created or written (read-only, below a file, no permission) is a ``RunDirError`` naming it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from rlpipe.contract import RUN_LOCK_FILE

LOCK_FILE = RUN_LOCK_FILE


class RunLockedError(RuntimeError):
    """Another process holds the run directory's lock."""


class RunDirError(RuntimeError):
    """The run directory or its lock file cannot be created; the message names it and why."""


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold ``<run_dir>/.lock`` (created, with ``run_dir``, if missing) for the ``with`` block."""
    d = Path(run_dir)
    path = d / LOCK_FILE
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"--out {d}: cannot create the run directory or its lock file {path} "
                          f"({e.strerror or e}); choose a writable --out") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _holder(path)
        raise RunLockedError(f"{d} is in use by another `rlpipe train` ({holder}; {path} is locked): wait for "
                             "it to finish or stop it. The lock is released when that process exits") from None
    try:
        # not an output (rlpipe.io): a lock file must keep its inode, and its content is informative
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield path
    finally:
        os.close(fd)  # releases the lock


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "holder unknown"
    except OSError:
        return "holder unknown"
