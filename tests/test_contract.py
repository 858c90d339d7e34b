"""The run-output contract (rlpipe.contract) against every party that uses it: the
CONTRIBUTING.md "Run outputs" section, the writer and the profiler, the drivers' run_info, the plot
functions, the report captions, the workflow and the smoke test."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.analysis import aggregate, plots, report_text

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- CONTRIBUTING.md


@pytest.fixture(scope="module")
def run_outputs_doc() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    start = text.index("## Run outputs")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def bullet(doc: str, name: str) -> str:
    """Text of the ``- `name`: ...`` bullet, up to the next bullet."""
    m = re.search(rf"^- `{re.escape(name)}`:(.*?)(?=^- `|\Z)", doc, re.M | re.S)
    assert m, f"CONTRIBUTING.md 'Run outputs' has no bullet for {name}"
    return m.group(1)


def ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def column_names(text: str) -> list[str]:
    return [t for t in ticked(text) if re.fullmatch(r"[a-z_]+(/[a-z0-9_]+)?", t)]


def int64_columns(text: str) -> list[str]:
    return re.findall(r"`([^`]+)` \(int64", text)


def alternatives(text: str, name: str) -> list[str]:
    m = re.search(rf"`{name}` \(([^)]*)\)", text)
    return [a.strip() for a in m.group(1).split("|")]


def test_run_files_match_contributing(run_outputs_doc):
    documented = set(re.findall(r"^- `([^`]+)`", run_outputs_doc, re.M))
    declared = {*contract.RUN_FILES.values(), contract.RUN_CONFIG_FILE, contract.CHECKPOINT_FILE}
    assert documented == declared


def test_metrics_columns_match_contributing(run_outputs_doc):
    text = bullet(run_outputs_doc, contract.METRICS_FILE)
    assert column_names(text) == list(contract.METRIC_COLUMNS)
    assert int64_columns(text) == list(contract.METRIC_INT_COLUMNS)


def test_events_versions_rollouts_run_info_match_contributing(run_outputs_doc):
    events = bullet(run_outputs_doc, contract.EVENTS_FILE)
    assert column_names(events) == list(contract.EVENT_COLUMNS)
    assert int64_columns(events) == list(contract.EVENT_INT_COLUMNS)
    assert alternatives(events, "phase") == list(contract.PHASES)
    versions = bullet(run_outputs_doc, contract.VERSIONS_FILE)
    assert column_names(versions) == list(contract.VERSION_COLUMNS)
    assert int64_columns(versions) == list(contract.VERSION_INT_COLUMNS)
    assert sorted(alternatives(versions, "who")) == sorted(contract.VERSION_HOLDERS)
    rollouts = bullet(run_outputs_doc, contract.ROLLOUTS_FILE)
    assert re.findall(r'"(\w+)"', ticked(rollouts)[0]) == list(contract.ROLLOUT_KEYS)
    info = bullet(run_outputs_doc, contract.RUN_INFO_FILE)
    assert re.findall(r'"(\w+)"', ticked(info)[0]) == list(contract.RUN_INFO_KEYS)


# --------------------------------------------------------------------------- internal consistency


def test_phase_groups():
    phases = set(contract.PHASES)
    assert len(phases) == len(contract.PHASES)
    assert set(contract.STACK_PHASES) | set(contract.OVERLAPPING_PHASES) == phases
    assert not set(contract.STACK_PHASES) & set(contract.OVERLAPPING_PHASES)
    assert set(contract.GEN_PHASES) | set(contract.TRAIN_PHASES) <= set(contract.STACK_PHASES)
    assert not set(contract.GEN_PHASES) & set(contract.TRAIN_PHASES)
    assert set(contract.STEP_STACK_PHASES) <= set(contract.TIMED_PHASES) & set(contract.STACK_PHASES)
    assert contract.OTHER not in phases
    time_columns = [c for c in contract.METRIC_COLUMNS if c.startswith("time/")]
    assert time_columns == [contract.metric_time_column(p) for p in contract.TIMED_PHASES]


def test_columns_are_unique_and_known():
    for cols in (contract.METRIC_COLUMNS, contract.EVENT_COLUMNS, contract.VERSION_COLUMNS,
                 contract.WEIGHT_SYNC_COLUMNS, contract.SUMMARY_ROLLOUT_COLUMNS):
        assert len(set(cols)) == len(cols), cols
    assert set(contract.METRIC_INT_COLUMNS) <= set(contract.METRIC_COLUMNS)
    assert set(contract.EVENT_INT_COLUMNS) <= set(contract.EVENT_COLUMNS)
    assert set(contract.VERSION_INT_COLUMNS) <= set(contract.VERSION_COLUMNS)
    assert set(contract.KL_COLUMNS) <= set(contract.METRIC_COLUMNS)
    assert set(aggregate.KL_FINAL_COLUMNS.values()) == set(contract.KL_COLUMNS)
    assert not set(contract.RUN_INFO_KEYS) & set(contract.RUN_INFO_OPTIONAL_KEYS)
    assert set(contract.SUMMARY_FILES).isdisjoint(contract.SUMMARY_REPORT_FILES)


def test_analysis_phase_tables_cover_the_phases():
    assert set(report_text.PHASE_WHY) <= set(contract.PHASES)
    assert {*contract.PHASES, contract.OTHER} <= set(plots.PHASE_COLORS)


def test_device_hours_unit():
    assert contract.device_hours_unit([contract.DEVICE_GPU]) == "GPU-hours"
    assert contract.device_hours_unit([contract.DEVICE_CPU, contract.DEVICE_GPU]) == "GPU-hours"
    assert contract.device_hours_unit([contract.DEVICE_CPU, None, "unknown"]) == "device-hours"
    assert contract.device_hours_unit([]) == "device-hours"


# --------------------------------------------------------------------------- figures


@pytest.mark.parametrize("kind", sorted(contract.FIGURES))
def test_every_figure_has_a_plot_function_and_a_caption(kind):
    fig = contract.FIGURES[kind]
    assert fig.category and fig.title and fig.ext in ("png", "html")
    assert callable(plots.KINDS[kind])
    caption = ROOT / "workflow" / "report" / f"{kind}.rst"
    assert caption.exists() and caption.read_text().strip(), f"missing caption {caption}"
    assert contract.figure_file(kind) == f"{kind}.{fig.ext}"


def test_plot_kinds_are_exactly_the_figures():
    assert set(plots.KINDS) == set(contract.FIGURES)


def test_smoke_test_takes_its_figures_from_the_contract():
    import test_workflow_smoke

    assert test_workflow_smoke.FIGURES == [contract.figure_file(k) for k in contract.FIGURES]
    tree = ast.parse((ROOT / "tests" / "test_workflow_smoke.py").read_text())
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not literals & {contract.figure_file(k) for k in contract.FIGURES}  # no hand-typed copy


def test_workflow_imports_the_contract():
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    assert re.search(r"^from rlpipe\.contract import", common, re.M)
    for name in ("RUN_FILES", "SUMMARY_FILES", "FIGURES"):
        assert not re.search(rf"^{name}\s*=", common, re.M), f"common.smk redefines {name}"
    assert not re.search(r"^class Figure\b", common, re.M)


# --------------------------------------------------------------------------- trainer side


def _device_type_values(tree: ast.AST) -> set[str]:
    """Values passed as ``run_info(..., device_type=...)``: string literals or contract constants."""
    out: set[str] = set()
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        name = getattr(func, "attr", getattr(func, "id", None))
        if not (isinstance(node, ast.Call) and name == "run_info"):
            continue
        for kw in node.keywords:
            if kw.arg != "device_type":
                continue
            for n in ast.walk(kw.value):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    out.add(n.value)
                elif isinstance(n, ast.Attribute) and n.attr.startswith("DEVICE_"):
                    out.add(getattr(contract, n.attr))
                elif isinstance(n, ast.Name) and n.id.startswith("DEVICE_"):
                    out.add(getattr(contract, n.id))
    return out


def test_drivers_write_contract_device_types():
    written = set()
    for path in sorted((ROOT / "src" / "rlpipe" / "trainer" / "drivers").glob("*.py")):
        written |= _device_type_values(ast.parse(path.read_text()))
    assert written, "no run_info(device_type=...) call found in the drivers"
    assert written <= set(contract.DEVICE_TYPES), written
    assert contract.DEVICE_GPU in written  # the GPU label depends on it


def test_writer_and_profiler_follow_the_contract(tmp_path):
    from rlpipe.rl.records import PhaseEvent, VersionEvent
    from rlpipe.trainer import profiling
    from rlpipe.trainer.run_writer import RunWriter

    assert profiling.PHASES is contract.PHASES
    w = RunWriter(tmp_path)
    w.add_row({"step": 0, "policy_version": 0, "wall_time": 0.0, "samples": 0})
    events = [PhaseEvent("generate", "worker", w.t0, w.t0 + 1.0, 1, 0)]
    w.add_row({"step": 1, "policy_version": 1, "wall_time": 1.0, "samples": 8, **profiling.seconds_by_phase(events)})
    w.add_events(events)
    w.add_versions([VersionEvent("learner", 1, w.t0 + 1.0, "optimizer_step")])
    w.add_rollouts(1, 0, [{"prompt": "p", "response": "r", "reward": 1.0, "ground_truth": ["k"]}])
    w.finish({"variant": "v", "mode": "colocated_sync", "devices": 1, "device_type": contract.DEVICE_CPU,
              "threads": 1, "total_samples": 8, "total_optimizer_steps": 1, "transport": "local",
              "backend": None})
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(contract.RUN_FILES.values())
    for name, cols, ints in ((contract.METRICS_FILE, contract.METRIC_COLUMNS, contract.METRIC_INT_COLUMNS),
                             (contract.EVENTS_FILE, contract.EVENT_COLUMNS, contract.EVENT_INT_COLUMNS),
                             (contract.VERSIONS_FILE, contract.VERSION_COLUMNS, contract.VERSION_INT_COLUMNS)):
        df = pd.read_parquet(tmp_path / name)
        assert tuple(df.columns) == cols, name
        assert all(str(df[c].dtype) == "int64" for c in ints), name
    run = aggregate.load_run(tmp_path)
    assert run.rollouts[0].keys() == set(contract.ROLLOUT_KEYS)
    assert set(contract.RUN_INFO_KEYS) <= set(run.info)
    assert aggregate.phase_seconds(run)["generate"] == pytest.approx(1.0)
    assert aggregate.run_row(run)["device_type"] == contract.DEVICE_CPU


# --------------------------------------------------------------------------- layering


def test_contract_is_standard_library_only():
    tree = ast.parse((ROOT / "src" / "rlpipe" / "contract.py").read_text())
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules


def test_analysis_imports_neither_torch_nor_ray():
    code = ("import sys, rlpipe.contract, rlpipe.analysis.aggregate, rlpipe.analysis.plots, "
            "rlpipe.analysis.report_text; bad = {'torch', 'ray'} & set(sys.modules); assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
