"""The sha256 of the run fingerprint's input files, kept between runs (``rlpipe.trainer.resume``).

Every ``rlpipe train`` start fingerprints its base model and dataset by the content of their files,
and every variant and replicate of a workflow starts from the same base: for a 1.5B HuggingFace
model that was ~3 GB read at each start. A file's digest is therefore kept in a cache directory
(``$RLPIPE_DIGEST_CACHE``, default ``~/.cache/rlpipe/digests``; an empty value turns the cache off),
one small JSON entry per file, named by the hash of the file's resolved path and holding the file's
signature and its sha256. A start reuses an entry only while the file's signature is the same:

    (device, inode, size, mtime_ns, ctime_ns)

What the fingerprint promises stays true: its inputs count by their content, never by path or file
time (the digest enters it, the signature never does):

- writing to a file changes its mtime and ctime, and replacing it (an atomic rename, a retrained base
  model, a copy) gives another inode. A ctime cannot be set from user space, so a file given an old
  mtime back (``touch -d``, ``cp -p``, ``rsync -a``, ``tar x``) with other bytes is read again;
- a signature cannot see a second write that lands in the same timestamp tick as the one before it
  with the same size. As with git's "racily clean" index entries, an entry is written only for a file
  whose mtime and ctime are at least ``RACY_S`` older than the moment its hashing began (any later
  write then gets a later time, on filesystems whose timestamps are at least that fine), and only
  when its signature taken after the read equals the one taken before (nothing wrote during it). A
  file changed within the last ``RACY_S`` seconds is read at every start until it has aged;
- a moved or copied project (other paths, inodes and times) misses the cache, reads each file once
  more and gets the same fingerprint;
- an entry that cannot be read or parsed is a miss; a cache that cannot be written costs the read.

What it does not protect against: a system clock set back by more than ``RACY_S`` between two
writes of the same size, and someone editing the cache directory's entries by hand (it is the user's
own directory, as the decode cache is). Entries of deleted files are left behind (~200 bytes each).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlpipe.io import write_json

CACHE_ENV = "RLPIPE_DIGEST_CACHE"
RACY_S = 2.0  # an entry is written only for a file unchanged for this long before its hashing began
CHUNK = 1 << 20


def default_dir() -> Path | None:
    """``$RLPIPE_DIGEST_CACHE``, else ``~/.cache/rlpipe/digests``; None when the variable is empty (off)."""
    value = os.environ.get(CACHE_ENV)
    if value is None:
        return Path("~/.cache/rlpipe/digests").expanduser()
    return Path(value).expanduser() if value.strip() else None


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


@dataclass
class DigestStats:
    """What a cache did: files and bytes read to hash them, and digests reused without a read."""

    hashed: int = 0
    bytes_read: int = 0
    reused: int = 0


@dataclass
class DigestCache:
    """sha256 of files, reusing the entry of a file whose signature is unchanged (see the module
    docstring); ``root=None`` reads every file every time."""

    root: Path | None
    racy_s: float = RACY_S
    stats: DigestStats = field(default_factory=DigestStats)

    @classmethod
    def default(cls) -> DigestCache:
        return cls(default_dir())

    def _entry(self, path: Path) -> Path:
        return self.root / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"

    def digest(self, path: str | Path) -> str:
        """The sha256 (hex) of the file's bytes."""
        path = Path(path).resolve()
        before = _signature(path.stat())
        if self.root is not None:
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                entry = json.loads(self._entry(path).read_text())
                if entry["path"] == str(path) and entry["signature"] == before:
                    self.stats.reused += 1
                    return str(entry["sha256"])
        started = time.time_ns()
        digest = self._read(path)
        if self.root is not None and _signature(path.stat()) == before:
            aged = started - int(self.racy_s * 1e9)
            if max(before[3], before[4]) <= aged:
                with contextlib.suppress(OSError):
                    write_json(self._entry(path), {"path": str(path), "signature": before, "sha256": digest})
        return digest

    def _read(self, path: Path) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(CHUNK):
                h.update(block)
                self.stats.bytes_read += len(block)
        self.stats.hashed += 1
        return h.hexdigest()
