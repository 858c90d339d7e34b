"""rlpipe.io: outputs follow the user's umask (not mkstemp's 0600)."""

from __future__ import annotations

import os
import stat

import pytest

from rlpipe import io


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_outputs_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        io.write_text(tmp_path / "a.txt", "x")
        io.write_json(tmp_path / "sub" / "b.json", {"a": 1})
        with io.atomic_path(tmp_path / "c.bin") as tmp:
            tmp.write_bytes(b"\0")
    finally:
        os.umask(old)
    for p in (tmp_path / "a.txt", tmp_path / "sub" / "b.json", tmp_path / "c.bin"):
        assert stat.S_IMODE(p.stat().st_mode) == mode, p


def test_umask_is_read_without_changing_it():
    old = os.umask(0o027)
    try:
        assert io.output_mode() == 0o640
        assert os.umask(0o027) == 0o027  # still what the process set
    finally:
        os.umask(old)
