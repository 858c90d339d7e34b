"""Provenance: every run and benchmark records its CPU kernels, CPU model, package versions and lock
hash, and the report names what differs between the runs it compares."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

import pandas as pd
import torch

from rlpipe import contract
from rlpipe.analysis.provenance import PROVENANCE_COLUMNS, provenance_sentences, provenance_stats
from rlpipe.bench import emit
from rlpipe.provenance import LOCK_FILE, provenance

ROOT = Path(__file__).resolve().parents[1]


def test_provenance_names_the_kernels_versions_and_lock():
    p = provenance()
    assert tuple(p) == contract.PROVENANCE_KEYS
    assert p["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert p["cpu_model"] and p["cpus"] >= 1
    for name in ("torch", "transformers", "tokenizers", "ray", "snakemake"):
        assert p["versions"][name] == metadata.version(name), name
    assert LOCK_FILE == ROOT / "requirements" / "lock.txt"
    assert p["lock_sha256"] == hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()
    json.dumps(p)  # JSON-ready


def test_every_benchmark_json_is_stamped(tmp_path, capsys):
    out = tmp_path / "bench.json"
    emit({"bench": "x", "ratio": 1.5}, str(out))
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert printed == written and tuple(written["provenance"]) == contract.PROVENANCE_KEYS


def _info(capability="AVX512", torch_version="2.13.0", lock="a" * 64, aten=None):
    return {"provenance": {"cpu_capability": capability, "aten_cpu_capability": aten, "cpu_model": "Xeon",
                           "cpus": 2, "python": "3.11.7", "platform": "Linux",
                           "versions": {"torch": torch_version, "transformers": "5.24.0", "tokenizers": "0.23.3",
                                        "ray": "2.60.0", "snakemake": "9.27.1"}, "lock_sha256": lock}}


def _table(*infos) -> pd.DataFrame:
    return pd.DataFrame([{"variant": f"v{i}", **provenance_stats(info)} for i, info in enumerate(infos)])


def test_report_names_what_differs_between_compared_runs():
    same = provenance_sentences(_table(_info(), _info()))
    assert "All 2 runs share: cpu capability AVX512" in same[0] and "bit-identical when rerun" in same[1]
    diff = provenance_sentences(_table(_info(), _info(capability="AVX2", torch_version="2.14.1")))
    assert "They differ in cpu capability (AVX2, AVX512); torch (2.13.0, 2.14.1)" in diff[1]
    assert "may come from the machine" in diff[1]
    forced = provenance_stats(_info(capability="AVX2", aten="avx2"))
    assert forced["prov_cpu_capability"] == "AVX2 (ATEN_CPU_CAPABILITY=avx2)"


def test_runs_without_provenance_say_so():
    row = provenance_stats({})
    assert set(row) == set(PROVENANCE_COLUMNS) and set(row.values()) == {"not recorded"}
    assert provenance_sentences(pd.DataFrame()) == [
        "The runs recorded no provenance (machine, CPU kernels, package versions)."]
