"""rlpipe.trainer.digest_cache: a run's start reads no unchanged input file again, and reads every
changed one (its size, its mtime, or its bytes with the mtime put back), so the fingerprint keeps
counting inputs by content. What was read is the cache's own count of files and bytes it hashed."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from rlpipe.trainer.digest_cache import CACHE_ENV, DigestCache, default_dir
from rlpipe.trainer.resume import run_fingerprint

TRAIN = {"learning_rate": 5e-4, "n_grpo_steps": 80}
MODEL = {"preset": "cpu-tiny"}


def _start(root, racy_s: float = 0.0) -> DigestCache:
    """A new process's cache (nothing in memory), on the same directory; ``racy_s=0``: a file written
    a moment ago may be entered (the default's guard has its own test)."""
    time.sleep(0.01)  # past the filesystem's timestamp tick of the last write
    return DigestCache(root, racy_s=racy_s)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_read_once_across_starts(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"w" * 3000)
    first = _start(tmp_path / "cache")
    assert first.digest(f) == _sha(b"w" * 3000)
    assert (first.stats.hashed, first.stats.bytes_read, first.stats.reused) == (1, 3000, 0)
    again = _start(tmp_path / "cache")
    assert again.digest(f) == _sha(b"w" * 3000)
    assert (again.stats.hashed, again.stats.bytes_read, again.stats.reused) == (0, 0, 1)


def _grow(f):
    f.write_bytes(f.read_bytes() + b"!")


def _other_mtime(f):
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))  # another mtime (an earlier one: not racy)


def _same_size_old_mtime(f):
    """Other bytes, same size, and the old mtime put back (``cp -p``, ``touch -d``): only ctime tells."""
    st = f.stat()
    f.write_bytes(b"v" * st.st_size)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size


def _replaced_by_rename(f):
    """An atomic rewrite with the same bytes' length and mtime: a new inode."""
    st = f.stat()
    tmp = f.with_name(".new")
    tmp.write_bytes(b"u" * st.st_size)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, f)


@pytest.mark.parametrize("change", [_grow, _other_mtime, _same_size_old_mtime, _replaced_by_rename])
def test_a_changed_file_is_read_again(tmp_path, change):
    f = tmp_path / "model.pt"
    f.write_bytes(b"w" * 3000)
    _start(tmp_path / "cache").digest(f)
    change(f)
    cache = _start(tmp_path / "cache")
    assert cache.digest(f) == _sha(f.read_bytes())
    assert (cache.stats.hashed, cache.stats.bytes_read, cache.stats.reused) == (1, f.stat().st_size, 0)
    after = _start(tmp_path / "cache")  # and the new digest is the one kept
    assert after.digest(f) == _sha(f.read_bytes()) and after.stats.reused == 1


def test_a_file_changed_within_the_racy_window_is_not_entered(tmp_path):
    """A file written just before its hashing could be written again within the same timestamp tick:
    its digest is not kept until the file has been left alone for ``racy_s``."""
    f = tmp_path / "config.json"
    f.write_text('{"a": 1}')
    for _ in range(2):
        cache = DigestCache(tmp_path / "cache", racy_s=0.5)
        assert cache.digest(f) == _sha(f.read_bytes()) and cache.stats.hashed == 1
    assert not (tmp_path / "cache").exists()
    time.sleep(0.6)
    DigestCache(tmp_path / "cache", racy_s=0.5).digest(f)
    cache = DigestCache(tmp_path / "cache", racy_s=0.5)
    cache.digest(f)
    assert cache.stats.reused == 1 and cache.stats.hashed == 0


def test_an_unreadable_entry_is_a_miss_and_is_rewritten(tmp_path):
    f = tmp_path / "model.pt"
    f.write_bytes(b"w" * 100)
    _start(tmp_path / "cache").digest(f)
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_text("{not json")
    cache = _start(tmp_path / "cache")
    assert cache.digest(f) == _sha(b"w" * 100) and cache.stats.hashed == 1
    again = _start(tmp_path / "cache")
    assert again.digest(f) == _sha(b"w" * 100) and again.stats.reused == 1


def test_a_second_start_reads_no_base_file_and_a_changed_one_alone(tmp_path):
    base = tmp_path / "qwen"
    base.mkdir()
    for name, size in (("config.json", 50), ("model-00001.safetensors", 4000), ("model-00002.safetensors", 3000)):
        (base / name).write_bytes(b"x" * size)
    first = _start(tmp_path / "cache")
    fp = run_fingerprint(TRAIN, MODEL, "k4", base, digests=first)
    assert (first.stats.hashed, first.stats.bytes_read) == (3, 7050)
    second = _start(tmp_path / "cache")
    assert run_fingerprint(TRAIN, MODEL, "k4", base, digests=second) == fp
    assert (second.stats.hashed, second.stats.bytes_read, second.stats.reused) == (0, 0, 3)
    _same_size_old_mtime(base / "model-00002.safetensors")
    third = _start(tmp_path / "cache")
    assert run_fingerprint(TRAIN, MODEL, "k4", base, digests=third) != fp
    assert (third.stats.hashed, third.stats.bytes_read, third.stats.reused) == (1, 3000, 2)
    uncached = DigestCache(None)  # the fingerprint is the same with or without the cache
    assert run_fingerprint(TRAIN, MODEL, "k4", base, digests=uncached) == run_fingerprint(
        TRAIN, MODEL, "k4", base, digests=_start(tmp_path / "cache"))
    assert uncached.stats.hashed == 3


def test_the_cache_directory_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "d"))
    assert default_dir() == tmp_path / "d" and DigestCache.default().root == tmp_path / "d"
    monkeypatch.setenv(CACHE_ENV, "")
    assert default_dir() is None  # off: every file read at every start
    monkeypatch.delenv(CACHE_ENV)
    assert str(default_dir()) == os.path.expanduser("~/.cache/rlpipe/digests")
