"""``rlpipe gpu-check``'s ``git`` record names the project's own commit, never another repository's:
a copy of the project inside another git repository (as the shared H200 result was run: the
project unpacked by ``git archive`` inside a larger checkout), a copy with no ``.git`` at all, and
a folder that is not the project record no commit; a checkout of the project records its HEAD."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlpipe.bench import gpu_check

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = '[project]\nname = "rlpipe"\nversion = "0"\n'


def _git(cwd: Path, *args: str) -> str:
    r = subprocess.run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t", *args], cwd=cwd,
                       capture_output=True, text=True, check=True, timeout=60)
    return r.stdout.strip()


def _repo(path: Path, files: dict[str, str]) -> str:
    """A git repository at ``path`` with ``files`` committed; returns its HEAD."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    _git(path, "init", "-q")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "c")
    return _git(path, "rev-parse", "HEAD")


def test_a_copy_inside_another_repository_records_no_commit(tmp_path):
    outer = _repo(tmp_path / "outer", {"README": "another project\n", "copy/pyproject.toml": PYPROJECT})
    rec = gpu_check.project_git(tmp_path / "outer" / "copy")
    assert rec["commit"] is None and rec["commit"] != outer and rec["dirty"] is None
    assert rec["note"].startswith("unknown (no git checkout of the project)")
    assert str((tmp_path / "outer").resolve()) in rec["note"]


def test_a_copy_without_git_records_no_commit(tmp_path):
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "pyproject.toml").write_text(PYPROJECT)
    rec = gpu_check.project_git(tmp_path / "copy")
    assert rec["commit"] is None and "not inside a git repository" in rec["note"]


def test_a_folder_that_is_not_the_project_records_no_commit(tmp_path):
    _repo(tmp_path / "other", {"pyproject.toml": '[project]\nname = "other"\n'})
    rec = gpu_check.project_git(tmp_path / "other")
    assert rec["commit"] is None and "no pyproject.toml of rlpipe" in rec["note"]


def test_a_checkout_of_the_project_records_its_head_and_whether_it_is_dirty(tmp_path):
    head = _repo(tmp_path / "proj", {"pyproject.toml": PYPROJECT, "a.py": "x = 1\n"})
    assert gpu_check.project_git(tmp_path / "proj") == {"commit": head, "dirty": False}
    (tmp_path / "proj" / "a.py").write_text("x = 2\n")
    assert gpu_check.project_git(tmp_path / "proj") == {"commit": head, "dirty": True}


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="this copy of the project is not a git checkout")
def test_the_check_records_this_checkout_s_commit():
    assert gpu_check.PROJECT_ROOT == ROOT
    rec = gpu_check.project_git()
    assert rec["commit"] == _git(ROOT, "rev-parse", "HEAD")
