"""The committed ``rlpipe gpu-check`` results under ``benchmarks/gpu/`` read back through
``rlpipe gpu-report``: every file renders, with its machine, its check's status and every part, and
the H200 result's own figures land on the page as the check wrote them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpipe.bench import gpu_report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "gpu").glob("*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_every_committed_result_renders_its_machine_and_parts(path):
    res = json.loads(path.read_text())
    assert res["kind"] == "rlpipe gpu-check" and res["gpu"]["name"]
    assert set(res["git"]) >= {"commit", "dirty"} and res["git"]["commit"], res["git"]
    text = gpu_report.render_result(res)
    assert f"- GPU: {res['gpu']['name']} x{res['gpu']['count']}" in text
    assert f"status {res['status']}" in text
    for name, rec in res["parts"].items():
        assert f"| {name} | {rec['status']} |" in text, name


def test_the_h200_result_s_figures_reach_the_page():
    name = "2026-11-28-nvidia-h200.json"
    res = json.loads((ROOT / "benchmarks" / "gpu" / name).read_text())
    page = gpu_report.render_results(ROOT / "benchmarks" / "gpu")
    assert f"### NVIDIA H200: `benchmarks/gpu/{name}` (2026-11-28)" in page
    section = page.split(f"`benchmarks/gpu/{name}`", 1)[1]
    assert "- Check: status ok, 363 s of a 500 s budget" in section
    assert len(res["parts"]) == 15 and all(r["status"] == "ok" for r in res["parts"].values())
    assert "- bf16 matmul at 8192x8192x8192: 785 TFLOP/s" in section
    q = res["parts"]["qwen_step"]["result"]
    assert (f"generate {q['measured']['gen_rows']} x {q['measured']['gen_tokens']} tokens in "
            f"{gpu_report._num(q['measured']['gen_s'])} s") in section
    assert "101 to 569 s" in section
    assert "- cudagraph_bf16_tokens_per_s: 86,619" in section
    # the copy's git record was the enclosing repository's: the committed file names the project's
    assert "git archive of this commit" in res["git"]["note"] and res["git"]["dirty"] is None
