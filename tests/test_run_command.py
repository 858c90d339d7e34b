"""Targets and config files cannot be confused: ``rlpipe run`` (rlpipe.config.run_command), the
workflow's one-line refusal of a non-YAML config file, and every documented command's order."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.config import ConfigError
from rlpipe.config.run_command import build_command

pytestmark = pytest.mark.dag

ROOT = Path(__file__).resolve().parents[1]
FAMILY_TARGET = "results/families/lr_sweep/report/family.json"


def test_config_files_and_targets_go_to_their_own_places(tmp_path):
    overlay = tmp_path / "study.yaml"
    overlay.write_text("families: {lr_sweep: {replicates: 3}}\n")
    cmd = build_command([FAMILY_TARGET], [str(overlay)], "2", True, ["--resources", "gpu=1"])
    assert cmd[1:3] == ["-m", "snakemake"]
    assert cmd[3:] == ["--cores", "2", "--dry-run", "--configfile", str(overlay), "--resources", "gpu=1", "--",
                       FAMILY_TARGET]
    assert build_command([], [], "all", False, [])[3:] == ["--cores", "all"]


@pytest.mark.parametrize("name, content, message", [
    ("metrics.parquet", b"PAR1\xff\xfe", "looks like a target; put targets before --configfile"),
    ("family.json", b"{}", "looks like a target; put targets before --configfile"),
    ("missing.yaml", None, "config file not found"),
    ("list.yaml", b"- a\n", "top level must be a mapping"),
])
def test_a_config_file_that_is_no_yaml_mapping_is_refused_naming_it(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as e:
        build_command([], [str(path)], "1", True, [])
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_config_file_given_as_a_target_is_refused():
    with pytest.raises(ConfigError, match="looks like a config file"):
        build_command(["config/study.yaml"], [], "1", True, [])


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "config", tmp_path / "config")
    return tmp_path


def test_rlpipe_run_plans_the_documented_study_target_in_either_order(workdir):
    proc = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", "--config-file", "config/study.yaml",
                           FAMILY_TARGET, "-n", "--cores", "1", "--", "-s", str(ROOT / "Snakefile")],
                          cwd=workdir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "+ snakemake --cores 1 --dry-run --configfile config/study.yaml" in proc.stderr
    assert "rule report_family:" in proc.stdout and "family=lr_sweep" in proc.stdout
    assert "family=std_norm" not in proc.stdout  # only the target's family is planned


def test_snakemake_refuses_an_existing_result_given_as_a_config_file_in_one_line(workdir):
    """A JSON target that exists parses as a config; the workflow names it before anything else."""
    (workdir / "results").mkdir()
    (workdir / "results" / "family.json").write_text('{"variants": {}}')
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-n", "--cores", "1",
                           "--configfile", "config/study.yaml", "results/family.json"],
                          cwd=workdir, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "looks like a target" in line]
    assert lines == [f"{workdir / 'results/family.json'}: looks like a target; put targets before --configfile "
                     "(or use `rlpipe run`)"], proc.stderr[-2000:]


DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "config" / "README.md", ROOT / "Snakefile",
        *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "config").glob("*.yaml")),
        *sorted((ROOT / "examples").rglob("*.yaml")), *sorted((ROOT / "examples").rglob("*.md")),
        *sorted((ROOT / "workflow" / "profiles").rglob("*.yaml")),
        *sorted((ROOT / "workflow" / "report").glob("*.rst")),
        *sorted((ROOT / ".ci").glob("*"))]


def configfile_arguments(text: str) -> list[str]:
    """Every path that a documented ``--configfile`` takes (the words up to an option, a shell
    separator, a comment or the end of the line that look like a path: ``a/b``, ``x.ext``)."""
    out = []
    for m in re.finditer(r"--configfile((?:[ \t]+[^\s`|&;)<>#-][^\s`|&;)<>]*)+)", text):
        out += [w for w in m.group(1).split() if re.search(r"\w[/.]\w", w)]
    return out


def test_every_documented_command_puts_targets_before_configfile():
    bad = {f"{p.relative_to(ROOT)}: {w}" for p in DOCS for w in configfile_arguments(p.read_text())
           if not w.endswith((".yaml", ".yml", "FILE", "F"))}
    assert not bad, f"a target after --configfile is read as a config file: {sorted(bad)}"


def test_the_docs_check_finds_a_target_after_configfile():
    text = "`snakemake --cores all --configfile config/study.yaml results/families/x/report/family.json`"
    assert configfile_arguments(text) == ["config/study.yaml", "results/families/x/report/family.json"]
    assert configfile_arguments("snakemake --configfile a.yaml --resources gpu=2 && x") == ["a.yaml"]
    assert configfile_arguments("--configfile config/smoke.yaml  # a smoke run, the same way") == ["config/smoke.yaml"]
