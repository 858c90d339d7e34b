"""What a result came from: the machine, its CPU kernels and the package versions.

Seeded runs are bit-identical only on the same CPU kernels with the same package versions (torch
picks its ATen kernels by CPU capability: AVX-512, AVX2 or the portable default, and each sums in
another order). So every ``run_info.json`` and every benchmark JSON records ``provenance()``, and the
report says which of these differ between the runs it compares.

Not in the seeds: they assume one machine. Nothing here imports a package it reports on except torch,
whose capability is only known to torch itself (the versions come from package metadata).
"""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path

from rlpipe.contract import PROVENANCE_KEYS

#: The packages whose versions decide a run's numbers (``versions`` in ``provenance()``).
PACKAGES = ("torch", "transformers", "tokenizers", "ray", "snakemake", "numpy", "pydantic", "math-verify")
#: The lock file of a checkout (``requirements/lock.txt`` beside ``src/``); absent for a library install.
LOCK_FILE = Path(__file__).resolve().parents[2] / "requirements" / "lock.txt"


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """{package: installed version, or None when not installed}."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def lock_sha256(path: Path = LOCK_FILE) -> str | None:
    """sha256 of the lock file, or None where there is none (rlpipe installed as a library)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def provenance() -> dict:
    """The record every run and benchmark writes (keys: ``PROVENANCE_KEYS``)."""
    import torch

    record = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY") or None,
            "cpu_model": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "versions": package_versions(), "lock_sha256": lock_sha256()}
    assert tuple(record) == PROVENANCE_KEYS
    return record
