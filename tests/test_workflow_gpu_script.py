"""benchmarks/gpu/run_workflow.sh, the whole workflow on one GPU, without a GPU: its syntax, the GPU
page's install lines and overlay carried verbatim, and its steps and copies run against a stand-in
``python3 -m snakemake`` (each call recorded; the workflow call writes a run timing and a benchmark
JSON) and a stand-in ``nvidia-smi``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "run_workflow.sh"
DOCS = ROOT / "docs" / "gpu-and-clusters.md"

FAKE_PYTHON = """#!/bin/bash
if [ "$1 $2" = "-m snakemake" ]; then
    echo "$PWD $*" >> "$FAKE_LOG"
    case " $* " in
        *" --report "*) echo '<html>' > report.html ;;
        *) mkdir -p results/bench logs/x && echo '{"wall_s": 1.5}' > results/run_timing.json &&
           echo '{"bench": "sampler"}' > results/bench/sampler.json && echo log > logs/x/a.log
           exit "${FAKE_RC:-0}" ;;
    esac
    exit 0
fi
exec %s "$@"
"""


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_the_script_carries_the_gpu_pages_install_lines_and_one_gpu_overlay():
    text, docs = SCRIPT.read_text(), DOCS.read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", docs, re.S) if ".venv-gpu" in b)
    for line in block.strip().splitlines():
        line = line.replace("wheels/*.whl", '"$WHEELS"/*.whl')
        assert line.strip() in text, line
    overlay = next(b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "# one-gpu.yaml" in b)
    written = re.search(r"printf '(workflow:.*?)'", text).group(1).encode().decode("unicode_escape")
    assert yaml.safe_load(written) == yaml.safe_load(overlay)


def run_script(tmp_path: Path, rc: int) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON % sys.executable)
    (bin_dir / "nvidia-smi").write_text("#!/bin/bash\necho 'NVIDIA H200'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out, log = tmp_path / "out", tmp_path / "snakemake.calls"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(log), FAKE_RC=str(rc),
               RLPIPE_GPU_RUN_DIR=str(tmp_path / "runs"), RLPIPE_WORKFLOW_TIMEOUT_S="60")
    env.pop("OUT", None)
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=120)
    return proc, out, log.read_text().splitlines() if log.exists() else []


def test_a_run_copies_its_timing_and_benchmarks_with_each_steps_status(tmp_path):
    proc, out, calls = run_script(tmp_path, 0)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dest = next((out / "benchmarks" / "gpu" / "workflow").iterdir())
    assert dest.name.endswith("-nvidia-h200"), dest
    assert json.loads((dest / "run_timing.json").read_text()) == {"wall_s": 1.5}
    assert json.loads((dest / "bench" / "sampler.json").read_text()) == {"bench": "sampler"}
    status = json.loads((dest / "status.json").read_text())
    assert status["gpu"] == "NVIDIA H200" and status["exit"] == 0
    assert [(s["step"], s["rc"], s["limit_s"]) for s in status["steps"]] == [("workflow", 0, 60), ("report", 0, 120)]
    workflow, report = calls  # the docs' command, in a fresh directory holding the project's configs
    assert "--configfile config/gpu.yaml config/one-gpu.yaml --cores 16 --resources gpu=1" in workflow
    assert report.endswith("--report report.html")
    run_dir = Path(workflow.split()[0])
    assert run_dir.parent == tmp_path / "runs" and (run_dir / "config" / "gpu.yaml").is_file()
    assert (out / "logs" / "workflow-logs.tar.gz").is_file()


@pytest.mark.parametrize("rc", [1, 124])
def test_a_failed_workflow_exits_with_its_status_and_still_copies_what_it_made(tmp_path, rc):
    proc, out, calls = run_script(tmp_path, rc)
    assert proc.returncode == rc and len(calls) == 1, proc.stderr[-2000:]  # no report after a failure
    dest = next((out / "benchmarks" / "gpu" / "workflow").iterdir())
    status = json.loads((dest / "status.json").read_text())
    assert status["exit"] == rc and [s["step"] for s in status["steps"]] == ["workflow"]
    assert (dest / "run_timing.json").is_file()
