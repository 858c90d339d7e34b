"""The locked install: requirements/lock.txt agrees with pyproject.toml, and CI's environment is
exactly the lock (requirements/lockcheck.py holds the checks; requirements/lock.sh regenerates)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lockcheck(root: Path = ROOT):
    spec = importlib.util.spec_from_file_location("lockcheck", ROOT / "requirements" / "lockcheck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.LOCK, mod.PYPROJECT = root / "requirements" / "lock.txt", root / "pyproject.toml"
    return mod


def test_lock_agrees_with_pyproject():
    assert _lockcheck().disagreements() == []


def test_lock_pins_torch_without_a_local_label():
    """One lock for CPU and GPU machines: `torch==X` takes the CPU wheel from a CPU index or find-links
    folder, and the CUDA wheel from PyPI or a CUDA index."""
    lines = [x for x in (ROOT / "requirements" / "lock.txt").read_text().splitlines() if x.startswith("torch==")]
    assert len(lines) == 1 and "+" not in lines[0]
    pins = [x for x in (ROOT / "requirements" / "lock.txt").read_text().splitlines() if "==" in x]
    # no CUDA library; NVML's Python binding (pure Python, what torch.cuda.utilization imports) is locked
    assert [x.split("==")[0] for x in pins if x.startswith("nvidia-")] == ["nvidia-ml-py"]


@pytest.fixture
def copy(tmp_path):
    (tmp_path / "requirements").mkdir()
    shutil.copy(ROOT / "requirements" / "lock.txt", tmp_path / "requirements" / "lock.txt")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_a_changed_dependency_list_needs_a_new_lock(copy):
    py = copy / "pyproject.toml"
    py.write_text(py.read_text().replace('"tqdm>=4.66",', '"tqdm>=4.66",\n    "hypercorn>=0.17",'))
    problems = _lockcheck(copy).disagreements()
    assert any("changed since requirements/lock.txt was generated" in p for p in problems)
    assert any(p.startswith("hypercorn ") and "is not pinned" in p for p in problems)


def test_a_pin_outside_a_range_is_named(copy):
    lock = copy / "requirements" / "lock.txt"
    text = lock.read_text()
    pin = next(x for x in text.splitlines() if x.startswith("pydantic=="))
    lock.write_text(text.replace(pin, "pydantic==2.0.0"))
    assert _lockcheck(copy).disagreements() == [
        "requirements/lock.txt pins pydantic==2.0.0, outside pyproject.toml's 'pydantic>=2.7'"]


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI installs through the lock; a dev venv may hold more")
def test_ci_environment_is_exactly_the_lock():
    # In a fresh interpreter: once anything in this session imported setuptools (torch's C++ builds
    # do), its vendored copies (packaging, platformdirs, ...) sit on sys.path and would read as installed.
    done = subprocess.run([sys.executable, str(ROOT / "requirements" / "lockcheck.py"), "installed"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
