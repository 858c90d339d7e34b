"""Scaling curves (issue 13 item 3): the design, the growth exponents (hand values), the report, and
the bench's input checks (before Ray starts). The real runs are in the smoke workflow test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from rlpipe.analysis import findings, scaling
from rlpipe.bench import scaling as bench
from rlpipe.contract import SCALING_MODES, SCALING_REPORT_FILES, scaling_phase_key


def test_growth_exponent_hand_values():
    assert scaling.growth_exponent([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)  # y = 3 x^2
    assert scaling.growth_exponent([16, 32, 64], [5.0, 5.0, 5.0]) == pytest.approx(0.0, abs=1e-12)
    # least squares on (ln x, ln y) = (0, 0), (a, a), (2a, 4a), a = ln 2: centred dx = (-a, 0, a),
    # dy = (-5a/3, -2a/3, 7a/3), slope = sum dx dy / sum dx^2 = 4a^2 / 2a^2 = 2
    assert scaling.growth_exponent([1, 2, 4], [1, 2, 16]) == pytest.approx(2.0)
    assert math.isnan(scaling.growth_exponent([8, 8], [1, 2]))  # one distinct x
    assert scaling.growth_exponent([0, 1, 2], [5, 1, 2]) == pytest.approx(1.0)  # x = 0 is dropped


def test_design_moves_one_axis_at_a_time_through_the_centre():
    center = {"d_model": 128, "batch": 32, "length": 40}
    pts = bench.points((64, 256), (16, 64), (20, 80), center)
    by_axis = {a: [(p["d_model"], p["batch"], p["length"]) for p in pts if p["axis"] == a] for a in
               ("model", "batch", "length")}
    assert by_axis == {"model": [(64, 32, 40), (128, 32, 40), (256, 32, 40)],
                       "batch": [(128, 16, 40), (128, 32, 40), (128, 64, 40)],
                       "length": [(128, 32, 20), (128, 32, 40), (128, 32, 80)]}
    assert len({(p["d_model"], p["batch"], p["length"]) for p in pts}) == 7  # the centre runs once per mode
    assert [p["axis"] for p in bench.points((), (), (), center)] == ["model", "batch", "length"]


def synthetic_points() -> list[dict]:
    """samples/s ~ batch^0.5 and update seconds ~ params^1, generate ~ params^0.5, in both modes."""
    pts = []
    for mode in SCALING_MODES:
        for b in (16, 32, 64):
            pts.append({"mode": mode, "axis": "batch", "d_model": 128, "num_parameters": 1e6, "batch": b,
                        "length": 40, "samples_per_s": 10 * b ** 0.5, scaling_phase_key("update"): 0.01 * b,
                        scaling_phase_key("generate"): 0.02 * b, scaling_phase_key("score"): 0.001,
                        scaling_phase_key("weight_sync"): 0.0})
        for n in (1e5, 1e6, 1e7):
            pts.append({"mode": mode, "axis": "model", "d_model": 128, "num_parameters": n, "batch": 32,
                        "length": 40, "samples_per_s": 1e7 / n, scaling_phase_key("update"): n * 1e-7,
                        scaling_phase_key("generate"): (n ** 0.5) * 1e-4, scaling_phase_key("score"): 0.001,
                        scaling_phase_key("weight_sync"): 0.0})
    return pts


def test_exponents_table_and_sentences():
    pts = pd.DataFrame(synthetic_points())
    sync = pd.DataFrame({"source": "bench", "label": "object_store@cpu", "bytes": [1e6, 1e7, 1e8],
                         "median_s": [1e-3, 1e-2, 1e-1]})
    tab = scaling.exponents(pts, sync)
    get = {(r.mode, r.axis, r.quantity): r.exponent for r in tab.itertuples()}
    for mode in SCALING_MODES:
        assert get[(mode, "batch", "samples_per_s")] == pytest.approx(0.5)
        assert get[(mode, "batch", scaling_phase_key("update"))] == pytest.approx(1.0)
        assert get[(mode, "model", scaling_phase_key("generate"))] == pytest.approx(0.5)
    assert (mode, "model", scaling_phase_key("weight_sync")) not in get  # all-zero curves are not fitted
    assert get[("object_store@cpu", "payload", "sync_seconds")] == pytest.approx(1.0)
    text = " ".join(scaling.sentences(tab, pts))
    assert "samples/s grows as batch^0.50" in text
    assert "generation grows more slowly (exponent 0.50 vs 1.00)" in text
    assert "latency grows as payload^1.00" in text


def test_report_writes_figure_table_and_page(tmp_path):
    src = tmp_path / "scaling.json"
    src.write_text(json.dumps({"bench": "scaling", "steps": 4, "threads": 2, "points": synthetic_points()}))
    assert scaling.main(["--bench", str(src), "--out", str(tmp_path / "out")]) == 0
    for f in SCALING_REPORT_FILES.values():
        assert (tmp_path / "out" / f).stat().st_size > 0, f
    page = (tmp_path / "out" / SCALING_REPORT_FILES["discussion"]).read_text()
    assert "no weight-sync bench JSON" in page  # the payload panels say why they are empty
    assert len(pd.read_csv(tmp_path / "out" / SCALING_REPORT_FILES["table"])) == 2 * 2 * 4


def test_report_rejects_a_file_that_is_not_a_scaling_result(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"points": [{"mode": "colocated_sync"}]}))
    with pytest.raises(SystemExit):
        scaling.main(["--bench", str(bad), "--out", str(tmp_path / "o")])
    assert "not an `rlpipe bench scaling` result" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scaling.main(["--bench", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")])
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("workflow, message", [
    ({"scaling_sizes": [9]}, "workflow.scaling_sizes: 9 does not fit"),
    ({"scaling_sizes": [6]}, "workflow.scaling_sizes[0]: must be >= 8, got 6"),
    ({"scaling_batches": [6]}, "workflow.scaling_batches: 6 is not a multiple of train.group_size (4)"),
])
def test_bench_rejects_a_bad_sweep_before_ray_starts(workflow, message, tiny_base, write_config, tmp_path,
                                                    capsys, no_ray):
    cfg = write_config(tmp_path / "c.yaml", workflow={"threads_per_variant": 2, **workflow})
    with pytest.raises(SystemExit):
        bench.main(["--config", str(cfg), "--base", tiny_base[0], "--dataset", tiny_base[1]])
    assert message in capsys.readouterr().err


def test_bench_names_a_missing_input(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--config", str(tmp_path / "c.yaml"), "--base", "b.pt", "--dataset", "d"])
    err = capsys.readouterr().err
    assert "--config" in err and "does not exist" in err


def _bench(load: float, contended_points: bool) -> dict:
    pts = [{**p, "conditions": {"load_avg_start": load, "load_avg_end": load, "cpus": 2, "contended":
                                contended_points and p["axis"] == "batch"}} for p in synthetic_points()]
    return {"bench": "scaling", "steps": 4, "threads": 2, "load_avg_1m_end": load, "points": pts,
            "provenance": {"cpus": 2}}


def test_contended_exponents_are_flagged_and_drawn_hollow_quiet_ones_are_not(tmp_path):
    """Every exponent sentence carries the bench's load; a contended bench (one of its runs
    contended by the training runs' rule) marks them "contended, indicative only", and the figure
    draws that run's points hollow with a footnote saying so."""
    for load, busy in ((5.7, True), (1.2, False)):
        src = tmp_path / f"scaling_{busy}.json"
        src.write_text(json.dumps(_bench(load, busy)))
        pts = scaling.load_points(src)
        assert list(pts["contended"]) == [busy and a == "batch" for a in pts["axis"]]
        tab = scaling.exponents(pts)
        text = scaling.sentences(tab, pts, findings.timing_load(json.loads(src.read_text())))
        flagged = [s for s in text if s.endswith(f"(load {load:g} on 2 CPUs: contended, indicative only).")]
        assert len(flagged) == (len(text) if busy else 0), text
        assert all(f"(load {load:g} on 2 CPUs" in s for s in text)
        note = scaling.footnote(pts, findings.timing_load(json.loads(src.read_text())), None)
        assert ("Hollow points" in note) is busy and "one short run (n=1)" in note
    # the figure: the contended points are hollow markers, the quiet ones filled
    fig, ax = scaling.plt.subplots()
    scaling._panel(ax, pts.assign(contended=pts["axis"] == "batch"), "batch", "samples_per_s", "s", "k", [])
    faces = [ln.get_markerfacecolor() for ln in ax.lines if ln.get_marker() == "o"]
    assert "none" in faces and any(f != "none" for f in faces)
    scaling.plt.close(fig)


def test_point_fractions_divide_the_steps_useful_flops_by_both_peaks():
    """Hand values: 8 GFLOP per step of 8 samples at 16 samples/s is 16 GFLOP/s; a phase that took
    no time gets None, not a number."""
    p = {"flops_per_step": {"generate": 2e9, "update": 6e9}, "samples_per_s": 16.0, "batch": 8,
         scaling_phase_key("generate"): 0.5, scaling_phase_key("update"): 0.0}
    chip = {"flops_per_s": 1.6e12}
    out = bench.point_fractions(p, 32e9, chip)
    assert out["step_gflops"] == 16.0
    assert out["fraction_of_shape_peak"] == 0.5 and out["fraction_of_device_peak"] == 0.01
    assert out["generate_fraction_of_peak"] == 0.125 and out["generate_fraction_of_device_peak"] == 0.0025
    assert out["update_fraction_of_peak"] is None and out["update_fraction_of_device_peak"] is None
    top = bench.chip_fields([{**p, "mode": "colocated_sync", "d_model": 1, "length": 2}],
                            {"d_model": 1, "batch": 8, "length": 2}, 32e9, {**chip, "tflops": 1.6, "dtype": "float32",
                                                                           "matmul_size": 2048})
    assert top["fraction_of_shape_peak"] == 0.5 and top["fraction_of_device_peak"] == 0.01
    assert set(top["fraction_not_applicable"]) == {"score", "weight_sync"} and "grpo_step_flops" in top["peak_note"]


def test_report_lists_every_points_fractions(tmp_path):
    pts = synthetic_points()
    for i, p in enumerate(pts):
        p.update(fraction_of_shape_peak=0.01 * (i + 1), fraction_of_device_peak=0.001 * (i + 1))
    pts[0].pop("fraction_of_device_peak")  # a point without it reads n/a
    src = tmp_path / "scaling.json"
    src.write_text(json.dumps({"bench": "scaling", "steps": 4, "threads": 2, "points": pts, "device_peak_tflops": 0.07,
                               "device_peak_dtype": "float32", "shape_peak_gflops": 110.0,
                               "fraction_not_applicable": {"score": "no matrix products"}}))
    scaling.main(["--bench", str(src), "--out", str(tmp_path / "out")])
    page = (tmp_path / "out" / SCALING_REPORT_FILES["discussion"]).read_text()
    assert "device peak 0.07 TFLOP/s (float32)" in page and "No FLOP fraction for score: no matrix products" in page
    table = page.split("<h4>Points")[1]
    assert table.count("<tr><td>") == len(pts) and "<td>colocated_sync</td><td>batch</td><td>16</td>" in table
    assert "<td>0.01</td><td>n/a</td>" in table and "<td>0.02</td><td>0.002</td>" in table


def test_a_scaling_point_logs_to_no_tracker_of_the_user(tmp_path):
    """The bench's timing runs are not experiments: a pipeline with trackers gives points without any
    (they used to land in the user's MLflow experiment, from a temporary directory)."""
    from rlpipe.config import load_config
    from rlpipe.io import write_yaml

    config = tmp_path / "c.yaml"
    write_yaml(config, {"logging": {"trackers": ["wandb", "mlflow"], "tensorboard": True}})
    path, name = bench.point_config(str(config), "colocated_sync", {"d_model": 64, "batch": 8, "length": 8}, 2,
                                     tmp_path)
    cfg = load_config(path)
    assert name == "coloc_d64_b8_l8" and list(cfg.variants) == [name]
    assert cfg.logging.trackers == [] and load_config(config).logging.trackers == ["wandb", "mlflow", "tensorboard"]


def test_a_scaling_point_is_valid_beside_a_users_track_with_shorter_responses(tmp_path, monkeypatch):
    """A point's length sets the shared train section's sampling_min/max_tokens, which a user's track
    inherits: one whose own sampling_max_tokens is shorter (the worked example's 8 against a point's 12)
    made every point's config invalid, and the bench failed in a run with the user's track beside the
    keyword track. A point is a keyword-track run: it carries no user track."""
    from rlpipe.config import apply_overrides, load_config, load_yaml
    from rlpipe.io import write_yaml

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the example's paths are relative to the repository root
    data = apply_overrides(load_yaml(root / "config/config.yaml"), load_yaml(root / "examples/wordrev/config.yaml"))
    data["workflow"]["tracks"] = ["keyword", "wordrev"]
    config = tmp_path / "c.yaml"
    write_yaml(config, data)
    path, _ = bench.point_config(str(config), "colocated_sync", {"d_model": 64, "batch": 8, "length": 12}, 2, tmp_path)
    cfg = load_config(path)  # raised: tracks.wordrev.train.sampling_min_tokens (12) must be <= ... (8)
    assert cfg.workflow.tracks == ["keyword"] and not cfg.tracks
    assert (cfg.train.sampling_min_tokens, cfg.train.sampling_max_tokens) == (12, 12)


def test_the_bench_holds_the_gpus_its_points_train_on_or_hides_every_gpu(tmp_path, monkeypatch, capsys):
    """A point is a training run on the pipeline's GPU settings: the bench holds the most any mode
    takes for all its runs, and a point's own acquisition takes them from it (it used to find no GPU
    under SLURM: 'job needs 1 GPUs but the pool has 0'). None declared: no GPU is visible at all."""
    from rlpipe.config import parse_config
    from rlpipe.trainer import gpu_slots

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    for name in gpu_slots.SCHEDULER_GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    cpu = parse_config({"workflow": {"results_dir": str(tmp_path)}})
    gpu = parse_config({"workflow": {"results_dir": str(tmp_path), "gpus_per_colocated": 1,
                                     "gpus_per_disaggregated": 2}})
    assert bench.bench_gpus(cpu, SCALING_MODES) == 0
    assert (bench.bench_gpus(gpu, SCALING_MODES), bench.bench_gpus(gpu, ("colocated_sync",))) == (2, 1)
    monkeypatch.setenv(gpu_slots.ENV, "3,5")
    with bench.bench_devices(cpu, 0) as devices:
        assert devices == [] and gpu_slots.gpu_pool() == []
    assert "its points run on the CPU" in capsys.readouterr().out and gpu_slots.gpu_pool() == ["3", "5"]
    with bench.bench_devices(gpu, 2) as devices:
        assert devices == ["3", "5"] and (tmp_path / ".gpu_slots" / "gpu-n1-5.lock").exists()
        with gpu_slots.acquire_gpus(1, lock_dir=tmp_path / ".gpu_slots", timeout_s=0.3) as point:  # a point's run
            assert point.devices == ["3"]
    assert "its points run on 2 GPU(s), CUDA_VISIBLE_DEVICES=3,5" in capsys.readouterr().out
    assert gpu_slots.gpu_pool() == ["3", "5"]
