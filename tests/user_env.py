"""The environment of a user who activated the project's venv, for the tests that start Snakemake as
such a user would: the venv's bin/ first on PATH, so that the jobs' ``rlpipe`` and ``python`` are the
venv's (sbatch passes the environment on to SLURM jobs too)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def activated_env() -> dict[str, str]:
    """``os.environ`` with this interpreter's bin/ directory leading PATH."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
