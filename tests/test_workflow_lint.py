"""``snakemake --lint``: only justified lints are left, and every rule that gets one carries the
``# lint: <what>`` comment that points to its justification in common.smk:

- conda/container: every rule runs the rlpipe package of the project's virtual environment;
- the shell uses the global ``CONFIG_FILE``: a param would rerun every stage on any config edit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dag

ROOT = Path(__file__).resolve().parents[1]
CONDA = "Specify a conda environment or container for each rule."
CONFIG_GLOBAL = "Shell command directly uses variable CONFIG_FILE from outside of the rule"

JUSTIFIED = {CONDA: "# lint: conda", CONFIG_GLOBAL: "# lint: CONFIG_FILE"}
BLOCK = re.compile(r"^Lints for (rule (\S+) \(line (\d+), (.+?)\)|snakefile (.+?)):\n((?:    .*\n|\s*\n)*)", re.M)


def lint_blocks(text: str) -> list[tuple[str, list[str], int | None, str | None]]:
    """(what, lint titles, line, file) for every block of ``snakemake --lint`` output."""
    out = []
    for m in BLOCK.finditer(text):
        titles = [t.rstrip(":") for t in re.findall(r"^    \* (.+)$", m.group(6), re.M)]
        what = f"rule {m.group(2)}" if m.group(2) else f"snakefile {m.group(5)}"
        out.append((what, titles, int(m.group(3)) if m.group(3) else None, m.group(4)))
    return out


def test_only_justified_lints_remain():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    text = proc.stdout + proc.stderr
    blocks = lint_blocks(text)
    assert blocks, text[-3000:]  # the conda lint is expected: an empty parse means the format changed
    problems = []
    for what, titles, line, path in blocks:
        extra = [t for t in titles if t not in JUSTIFIED]
        if extra:
            problems.append(f"{what}: {extra}")
        if line is not None:
            source = Path(path).read_text().splitlines()
            above = source[max(0, line - 4):line - 1]
            for title in set(titles) & set(JUSTIFIED):
                if not any(JUSTIFIED[title] in s for s in above):
                    problems.append(f"{what} ({path}:{line}): no '{JUSTIFIED[title]}' comment above the rule")
    assert not problems, "\n".join(problems)


def test_the_parser_reads_snakemake_lint_output():
    sample = ("Lints for snakefile /x/common.smk:\n    * Mixed rules and functions in same snakefile.:\n"
              "      body\n\nLints for rule a (line 3, /x/a.smk):\n    * " + CONDA + ":\n      body\n")
    assert lint_blocks(sample) == [("snakefile /x/common.smk", ["Mixed rules and functions in same snakefile."],
                                    None, None), ("rule a", [CONDA], 3, "/x/a.smk")]
