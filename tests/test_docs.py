"""The documentation as a product: the docs site builds strictly (a broken link or a missing page
fails), the README stays a short entry point whose test command is CI's, and no user-facing text
carries project history (issue numbers, commit hashes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.bench import gpu_report

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
USER_FACING = ("README.md", "docs", "config", "workflow")
SUFFIXES = {".md", ".yaml", ".yml", ".smk", ".rst", ".py", ".txt", ".json", ""}

# A commit hash: 7-40 lowercase hex characters, holding a digit and a letter, standing alone (not
# part of a longer word, path, version or hex digest). Full 64-character sha256 digests are longer
# than 40 and so never match.
HASH = re.compile(r"(?<![0-9A-Za-z_./+-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
ISSUE = re.compile(r"\b[Ii]ssues? #?[0-9]+|\([Ii]ssue|\b[Ii]ssue #|\bcommit [0-9a-f]{7}")


def user_facing_files() -> list[Path]:
    out = []
    for name in USER_FACING:
        p = ROOT / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in SUFFIXES]
    return out


def history_hits(text: str) -> list[str]:
    return [m.group(0) for pat in (HASH, ISSUE) for m in pat.finditer(text)]


def test_mkdocs_build_is_strict_and_clean(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs extra (in requirements/lock.txt) is not installed")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("rlpipe.grpo.compute_group_normalized_rewards", "rlpipe.grpo.compute_grpo_clip_loss",
                 "rlpipe.tasks.base.Task"):
        assert f'id="{name}"' in api, f"the API page does not render {name}"


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= 150, f"README.md has {n} lines; move detail into docs/ (at most 150)"


def test_readme_test_command_is_what_ci_runs():
    blocks = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.S)
    test_cmd = next(b for b in blocks if "pytest" in b)
    install_and_test = test_cmd.split(" && ", 2)[2]  # after the venv and its activation
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install_and_test in ci, f".ci/run does not run the README's test command:\n{install_and_test}"
    # under `set -e` a failure before the last `&&` does not stop the script: the next line must
    after = ci[ci.index(install_and_test) + 1]
    assert after.startswith('rc=$?; if [ "$rc" -ne 0 ]') and after.endswith('exit "$rc"; fi'), after
    assert test_cmd.startswith("python3 -m venv .venv && . .venv/bin/activate && ")


@pytest.mark.parametrize("text, hits", [
    ("measured on commit 4c5a97d (2026-11-24)", ["4c5a97d", "commit 4c5a97d"]),
    ("## Experiment families (issue 12)", ["(issue"]),
    ("as issue 13 item 4 asks", ["issue 13"]),
    ("sha256: c5146a2f9864c63686c50848db7d4990b7bacfe807ce49a87cf1330eac020f4a", []),
    ("torch==2.13.0, 1e-4, 0x1f, seed 1234567, results/config/math-1a2b3c4d.yaml", []),
    ("the decade 2025; a word like deadbeef has no digit", []),
])
def test_history_pattern(text, hits):
    assert history_hits(text) == hits


def test_no_project_history_in_user_facing_text():
    found = []
    for f in user_facing_files():
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            found += [f"{f.relative_to(ROOT)}:{i}: {h}" for h in history_hits(line)]
    assert not found, "issue numbers or commit hashes in user-facing text:\n" + "\n".join(found)


def test_no_issue_numbers_or_hashes_in_the_package():
    """Error messages, report text and docstrings are user-facing too."""
    found = []
    for f in sorted((ROOT / "src").rglob("*.py")):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            found += [f"{f.relative_to(ROOT)}:{i}: {h}" for h in history_hits(line)]
    assert not found, "issue numbers or commit hashes under src/:\n" + "\n".join(found)


def without_generated(text: str) -> str:
    """``text`` with the sections ``rlpipe gpu-report`` generates from committed results blanked
    (their lines kept, so line numbers still match); tests/test_gpu_check.py checks them against
    the results."""
    pattern = re.escape(gpu_report.BEGIN) + ".*?" + re.escape(gpu_report.END)
    return re.sub(pattern, lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def test_docs_quote_no_measured_times():
    """A measured duration or rate in the docs is a number typed by hand (they come from runs)."""
    unit = re.compile(r"\b[0-9]+(\.[0-9]+)? ?(ms|min|GB/s|GFLOP/s|samples/s)\b|\b[0-9]+ min [0-9]+ s\b")
    found = []
    for f in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for i, line in enumerate(without_generated(f.read_text()).splitlines(), 1):
            found += [f"{f.relative_to(ROOT)}:{i}: {m.group(0)}" for m in unit.finditer(line)]
    assert not found, "measured numbers typed into the docs:\n" + "\n".join(found)
