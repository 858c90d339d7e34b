"""Aggregation on synthetic run directories (``rlpipe.contract``) with hand-computed values.

Three synthetic runs (``make_runs``), each consuming 32 samples in 4 optimizer steps:

- onpolicy (colocated_sync, 1 device): wall 40 s; per step generate 6 s, update 2 s, weight_sync
  0.5 s, driver wait 6 s; validate 1 s at steps 2 and 4. Stack 24+8+2+2 = 36 s, other 4 s.
  Validation reward 0.1 (step 0), 0.5 (step 2), 0.4 (step 4). KL to ref = 0.01 t^2.
- k2 (colocated_k, k=2, 1 device): wall 32 s, 2 weight syncs.
- disagg (disaggregated, 2 devices): wall 25 s; generator generate 5 s/step, learner update
  3 s/step and ref_logprobs 1 s/step, so T_gen = 20, T_train = 16, bound 36/20 = 1.8.

``make_runs`` is a fixture of tests/conftest.py (shared with test_plots and test_workflow_dryrun).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.analysis import aggregate, frames, kl_text, report_text


@pytest.fixture
def runs(tmp_path, make_runs):
    return aggregate.load_runs(make_runs(tmp_path / "runs"))


def by_variant(table: pd.DataFrame) -> dict:
    return {r["variant"]: r for r in table.to_dict("records")}


def test_rewards_wall_and_throughput(runs):
    t = by_variant(aggregate.summarize(runs, "onpolicy"))
    on = t["onpolicy"]
    assert on["val_reward_initial"] == pytest.approx(0.1)
    assert on["val_reward_final"] == pytest.approx(0.4)
    assert on["val_reward_best"] == pytest.approx(0.5) and on["best_step"] == 2
    assert on["samples_per_s"] == pytest.approx(32 / 40)
    # equal samples: speedup == onpolicy wall / variant wall
    assert t["disagg"]["speedup_vs_ref"] == pytest.approx(40 / 25)
    assert t["k2"]["speedup_vs_ref"] == pytest.approx(40 / 32)
    assert on["speedup_vs_ref"] == pytest.approx(1.0)
    assert bool(t["disagg"]["equal_samples"])


def test_device_hours_and_phase_shares(runs):
    t = by_variant(aggregate.summarize(runs, "onpolicy"))
    assert t["onpolicy"]["device_hours"] == pytest.approx(40 * 1 / 3600)
    assert t["disagg"]["device_hours"] == pytest.approx(25 * 2 / 3600)
    on = t["onpolicy"]
    assert on["time_generate_s"] == pytest.approx(24) and on["time_update_s"] == pytest.approx(8)
    assert on["time_weight_sync_s"] == pytest.approx(2.0) and on["time_validate_s"] == pytest.approx(2)
    assert on["time_wait_s"] == pytest.approx(24)  # reported, but not stacked
    assert on["time_other_s"] == pytest.approx(40 - 36)
    assert on["share_generate"] == pytest.approx(24 / 40)
    assert on["share_update"] == pytest.approx(8 / 40)
    assert on["share_other"] == pytest.approx(4 / 40)
    shares = sum(on[contract.phase_share_column(p)] for p in contract.STACK_PHASES) + on["share_other"]
    assert shares == pytest.approx(1.0)
    assert math.isnan(t["disagg"]["time_other_s"])  # phases overlap: no "other"


def test_overlap_bound_and_sync(runs):
    t = by_variant(aggregate.summarize(runs, "onpolicy"))
    d = t["disagg"]
    assert d["t_gen_s"] == pytest.approx(20) and d["t_train_s"] == pytest.approx(16)
    assert d["overlap_bound"] == pytest.approx(36 / 20)
    assert d["overlap_achieved"] == pytest.approx(36 / 25)
    assert d["bound_fraction"] == pytest.approx((40 / 25) / (36 / 20))
    assert math.isnan(t["onpolicy"]["overlap_bound"])
    assert t["onpolicy"]["sync_median_s"] == pytest.approx(0.5)
    assert t["k2"]["num_syncs"] == 2 and t["onpolicy"]["num_syncs"] == 4
    assert t["disagg"]["sync_label"] == "object_store"
    assert t["onpolicy"]["kl_ref_final"] == pytest.approx(0.16)
    assert t["onpolicy"]["kl_prev_k3_final"] == pytest.approx(0.0032)


def test_missing_reference_gives_nan_speedup(runs):
    table = aggregate.summarize([r for r in runs if r.variant != "onpolicy"], "onpolicy")
    assert table["speedup_vs_ref"].isna().all()


def test_phases_fall_back_to_metrics_without_events(tmp_path, make_runs):
    make_runs(tmp_path, ["onpolicy"])
    (tmp_path / "onpolicy" / contract.EVENTS_FILE).unlink()
    run = aggregate.load_run(tmp_path / "onpolicy")
    phases = aggregate.phase_seconds(run)
    assert phases["generate"] == pytest.approx(24) and phases["update"] == pytest.approx(8)
    assert math.isnan(phases["validate"])  # not in the metrics: unknown, not zero


def test_missing_metrics_names_the_file(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(aggregate.AggregateError, match="metrics.parquet"):
        aggregate.load_run(tmp_path / "x")


@pytest.mark.parametrize("payload", [
    [{"transport": "object_store", "seconds": [0.3, 0.1, 0.2]}, {"transport": "rdt", "backend": "gloo",
                                                                 "seconds": [0.05, 0.01, 0.02]}],
    {"results": [{"transport": "object_store", "median_s": 0.2}, {"label": "rdt/gloo", "median_s": 0.02}]},
    {"object_store": {"median_s": 0.2}, "rdt/gloo": {"median_s": 0.02}},
])
def test_bench_reader_shapes(tmp_path, payload):
    p = tmp_path / "weight_sync.json"
    p.write_text(json.dumps(payload))
    df = aggregate.read_bench_weight_sync(p).set_index("label")
    assert df.loc["object_store", "median_s"] == pytest.approx(0.2)
    assert df.loc["rdt/gloo", "median_s"] == pytest.approx(0.02)


def test_bench_reader_rlpipe_bench_format(tmp_path):
    """The shape `rlpipe bench weight-sync` writes: payloads -> transports keyed label@placement."""
    payload = {"payloads": {
        "model": {"bytes": 1000, "transports": {
            "object_store@cpu": {"median_s": 0.2, "gbps": 0.5, "all_s": [0.1, 0.2, 0.3], "bytes": 1000},
            "rdt/gloo@cpu": {"median_s": 0.05, "gbps": 2.0, "all_s": [0.05, 0.05, 0.06], "bytes": 1000}}},
        "synthetic": {"bytes": 10**8, "transports": {
            "object_store@cpu": {"median_s": 1.0, "all_s": [1.0]},
            "rdt/nccl@gpu": {"skipped": "needs 2 GPU(s), Ray sees 0"}}}}}
    p = tmp_path / "weight_sync.json"
    p.write_text(json.dumps(payload))
    df = aggregate.read_bench_weight_sync(p)
    model = df[df["payload"] == "model"].set_index("label")
    assert model.loc["rdt/gloo@cpu", "median_s"] == pytest.approx(0.05) and model.loc["rdt/gloo@cpu", "n"] == 3
    skipped = df[df["label"] == "rdt/nccl@gpu"].iloc[0]
    assert np.isnan(skipped["median_s"]) and "needs 2 GPU" in skipped["note"]
    assert df[df["payload"] == "synthetic"]["bytes"].iloc[0] == 1e8
    sec = report_text.rdt_section(df)
    assert sec["numbers"]["rdt_gain_bench"] == pytest.approx(4.0)  # model payload, cpu placement
    assert any("needs 2 GPU" in x for x in sec["sentences"])


def _sweep_payload(nbytes: int, obj_s: float, gloo_s: float, memcpy_s: float) -> dict:
    return {"bytes": nbytes, "memcpy_cpu": {"seconds": memcpy_s, "gbps": nbytes / memcpy_s / 1e9, "repeats": 50},
            "transports": {"object_store@cpu": {"median_s": obj_s, "all_s": [obj_s] * 3},
                           "object_store/tensors@cpu": {"median_s": 4 * obj_s, "all_s": [4 * obj_s] * 3},
                           "rdt/gloo@cpu": {"median_s": gloo_s, "all_s": [gloo_s] * 3}}}


def test_a_contended_weight_sync_bench_is_flagged_a_quiet_one_is_not(tmp_path):
    """The CPU verdict and each bench ratio carry the bench's recorded load; contended by the
    training runs' rule, they are marked "contended, indicative only"."""
    payload = {"cpus": 2, "load_avg_start": [5.1, 3.0, 2.0], "load_avg_end": [5.7, 3.0, 2.0],
               "payloads": {"model": _sweep_payload(5 * 10**6, 0.01, 0.02, 0.001),
                            "synthetic_100MB": _sweep_payload(10**8, 0.05, 0.2, 0.015)}}
    p = tmp_path / "weight_sync.json"
    p.write_text(json.dumps(payload))
    disc = report_text.discussion(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                                  aggregate.read_bench_weight_sync(p), "onpolicy", {"weight_sync": payload})
    sec = next(x for x in disc["sections"] if x["id"] == "rdt")
    text = " ".join(sec["sentences"])
    assert ("RDT's best latency is 2.00x to 4.00x the best object-store path's (load 5.7 on 2 CPUs: contended, "
            "indicative only)") in text
    assert "faster than rdt/gloo in the benchmark (model, cpu) (load 5.7 on 2 CPUs: contended" in text
    assert sec["numbers"]["bench_contended"] is True
    quiet = {**payload, "load_avg_start": [1.1, 1.0, 1.0], "load_avg_end": [1.9, 1.0, 1.0]}
    disc = report_text.discussion(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                                  aggregate.read_bench_weight_sync(p), "onpolicy", {"weight_sync": quiet})
    text = " ".join(next(x for x in disc["sections"] if x["id"] == "rdt")["sentences"])
    assert "the best object-store path's (load 1.9 on 2 CPUs)." in text and "indicative" not in text


def test_bench_sweep_memcpy_rows_and_cpu_verdict(tmp_path):
    """The sweep shape: the memcpy bound becomes a row; the report compares the best object-store
    path with the best RDT backend per payload, names the CPU winner and the memcpy multiples."""
    payload = {"payloads": {"model": _sweep_payload(5 * 10**6, 0.01, 0.02, 0.001),
                            "synthetic_1MB": _sweep_payload(10**6, 0.008, 0.016, 0.0001),
                            "synthetic_100MB": _sweep_payload(10**8, 0.05, 0.2, 0.015)}}
    p = tmp_path / "weight_sync.json"
    p.write_text(json.dumps(payload))
    df = aggregate.read_bench_weight_sync(p)
    big = df[df["payload"] == "synthetic_100MB"].set_index("label")
    assert big.loc["memcpy@cpu", "median_s"] == pytest.approx(0.015) and big.loc["memcpy@cpu", "n"] == 50
    assert big.loc["rdt/gloo@cpu", "gbps"] == pytest.approx(0.5)  # 1e8 B / 0.2 s
    sec = report_text.rdt_section(df)
    nums, text = sec["numbers"], " ".join(sec["sentences"])
    assert nums["rdt_gain_bench"] == pytest.approx(0.5)  # first group (model): 0.01 / 0.02
    assert nums["cpu_rdt_over_object_store"] == pytest.approx(4.0)  # largest payload: 0.2 / 0.05
    assert nums["cpu_best_fraction_of_memcpy"] == pytest.approx(0.3)  # 0.015 / 0.05
    assert "object_store 50 ms (2 GB/s, 0.3 of memcpy)" in text and "in-run memcpy bound 15 ms (6.67 GB/s)" in text
    assert "On CPU the object store wins at every benchmarked payload (synthetic_1MB, model, synthetic_100MB)" in text
    assert "RDT's best latency is 2.00x to 4.00x the best object-store path's" in text
    assert "costs 3.3 memcpys of the payload and rdt/gloo 13" in text and "Why:" in text
    assert "memcpy@cpu" not in text  # the bound is not listed as a transport
    # RDT faster at the largest payload: the verdict and the why flip with the numbers
    payload["payloads"]["synthetic_100MB"] = _sweep_payload(10**8, 0.2, 0.05, 0.015)
    p.write_text(json.dumps(payload))
    text = " ".join(report_text.rdt_section(aggregate.read_bench_weight_sync(p))["sentences"])
    assert "the winner depends on the payload: the object store wins at synthetic_1MB, model, RDT at synthetic_100MB" \
        in text and "RDT sends the tensors straight" in text


def test_bench_error_record_is_kept_with_reason(tmp_path):
    p = tmp_path / "weight_sync.json"
    p.write_text(json.dumps([{"transport": "rdt", "backend": "nccl", "error": "needs 2 GPUs"}]))
    df = aggregate.read_bench_weight_sync(p)
    assert df["label"].tolist() == ["rdt/nccl"] and np.isnan(df["median_s"][0])
    assert df["note"][0] == "needs 2 GPUs"


def test_main_writes_every_output(tmp_path, make_runs):
    make_runs(tmp_path / "runs")
    bench = tmp_path / "weight_sync.json"
    bench.write_text(json.dumps([{"transport": "object_store", "median_s": 0.2},
                                 {"transport": "rdt", "backend": "gloo", "median_s": 0.05}]))
    out = tmp_path / "summary"
    assert aggregate.main(["--runs", str(tmp_path / "runs"), "--out", str(out), "--variants", "onpolicy",
                           "disagg", "--bench", str(bench), str(tmp_path / "missing.json")]) == 0
    for name in (*contract.SUMMARY_FILES.values(), *contract.SUMMARY_REPORT_FILES.values()):
        assert (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*contract.SUMMARY_FILES.values(), *contract.SUMMARY_REPORT_FILES.values()])
    m = pd.read_parquet(out / "metrics.parquet")
    assert list(m.columns)[0] == "variant" and set(m["variant"]) == {"onpolicy", "disagg"}
    html = (out / "summary.html").read_text()
    assert not re.search(r"\bnan\b", html, re.IGNORECASE) and "1.60x" in html
    ws = pd.read_parquet(out / "weight_sync.parquet")
    assert set(ws["source"]) == {"run", "bench"}
    disc = json.loads((out / "discussion.json").read_text())
    rdt = next(s for s in disc["sections"] if s["id"] == "rdt")
    assert rdt["numbers"]["rdt_gain_bench"] == pytest.approx(4.0)


# --------------------------------------------------------------------------- report_text


@pytest.mark.parametrize("shape,fn", [
    ("linear", lambda t: 0.3 * t + 1), ("quadratic", lambda t: 0.02 * t**2 + 0.1),
    ("sqrt", lambda t: 2 * np.sqrt(t)), ("exponential", lambda t: 0.01 * np.exp(0.1 * t)),
])
def test_fit_growth_names_the_shape(shape, fn):
    t = np.arange(1, 41, dtype=float)
    assert kl_text.fit_growth(t, fn(t))["best"] == shape


def test_fit_growth_power_exponent():
    t = np.arange(1, 30, dtype=float)
    assert kl_text.fit_growth(t, 0.5 * t**1.5)["power"] == pytest.approx(1.5, abs=1e-6)
    assert kl_text.fit_growth([1, 2], [1, 2])["best"] is None  # too few points


def test_max_version_lag_by_hand():
    v = pd.DataFrame({"who": ["learner", "generator", "learner", "learner", "generator"],
                      "version": [1, 0, 2, 3, 1], "wall_time": [1.0, 1.5, 2.0, 3.0, 3.5],
                      "event": ["x"] * 5})
    # replayed in time order: at t=3.0 the learner is at 3 while the generator still holds 0
    assert report_text.max_version_lag(v) == 3.0
    assert report_text.max_version_lag(v[v["who"] == "learner"]) is not None  # one side only: NaN
    assert np.isnan(report_text.max_version_lag(v[v["who"] == "learner"]))


def test_discussion_numbers_and_missing_variants(runs):
    table = aggregate.summarize(runs, "onpolicy")
    metrics = aggregate.stack_frames(runs, "metrics")
    versions = aggregate.stack_frames(runs, "versions")
    sync = aggregate.weight_sync_frame(runs, [])
    disc = report_text.discussion(table, metrics, versions, sync, "onpolicy", {}, aggregate.rollouts_frame(runs))
    sec = {s["id"]: s for s in disc["sections"]}
    assert sec["profiling"]["numbers"]["dominant"] == "generate"
    assert "3.0x the update time" in " ".join(sec["profiling"]["sentences"])
    assert sec["kl"]["numbers"]["best_fit"] == "quadratic"
    assert kl_text.fit_growth(np.arange(1, 9), np.zeros(8))["constant"]  # flat KL: no shape
    assert sec["kstep"]["numbers"]["speedup_k2"] == pytest.approx(1.25)
    # ideal k=2 gain from dropping half the syncs: 40 / (40 - 0.5 * 2)
    assert sec["kstep"]["numbers"]["ideal_k2"] == pytest.approx(40 / 39)
    # Same work (equal samples), but k2's generate phase is 5 s/step instead of 6: flagged as noise.
    assert sec["kstep"]["numbers"]["work_ratio_k2"] == pytest.approx(7 / 8)
    assert "took 12% less time" in " ".join(sec["kstep"]["sentences"])
    assert sec["disagg"]["numbers"]["bound_disagg"] == pytest.approx(1.8)
    assert sec["versions"]["numbers"]["lag_disagg"] == 1.0
    assert sec["replay"]["sentences"][0].startswith("No data: no variant with train.replay.enabled")
    assert "1/2" in sec["rollouts"]["sentences"][0] and "2/2" in sec["rollouts"]["sentences"][0]
    # Problem 10 by hand (onpolicy: generate 24 s, update 8 s, sync 2 s, wall 40 s, 6 s elsewhere):
    # overlap saves 40 - max(24, 10) - 6 = 10 s (1.33x); a 2x sampler saves 12 s (1.43x); but disagg
    # measured 40 / 25 = 1.60x of overlap, so the measurement recommends overlap
    opt = sec["optimization"]["numbers"]
    assert opt["speedup_0"] == pytest.approx(40 / 30) and opt["speedup_1"] == pytest.approx(40 / 28)
    assert opt["measured_0"] == pytest.approx(1.6)
    assert opt["recommended"].startswith("overlap generation") and opt["basis"] == "measured"
    assert not re.search(r"\bnan\b", json.dumps(disc), re.IGNORECASE)
    assert "<h3>" in report_text.render_html(disc)


@pytest.mark.parametrize("device_type,unit", [("gpu", "GPU-hours"), ("cpu", "device-hours")])
def test_device_hours_unit_follows_the_drivers_device_type(tmp_path, device_type, unit, make_runs):
    """The drivers write ``device_type: "gpu"`` (rlpipe.contract.DEVICE_GPU, not torch's
    "cuda") into run_info.json: such a run is billed in GPU-hours by the discussion and the table."""
    runs = aggregate.load_runs(make_runs(tmp_path / "runs", device_type=device_type))
    table = aggregate.summarize(runs, "onpolicy")
    sentences = report_text.disagg_section(table, "onpolicy")["sentences"]
    assert sentences[0].startswith(f"Wall time and {unit}")
    assert f"its {unit}." in sentences[1]
    assert ("GPU-hours" in " ".join(sentences)) == (device_type == "gpu")
    each = re.findall(r"= [0-9.e-]+ ?(\S*)", sentences[0])  # every device-hours value carries its unit
    assert len(each) >= 2 and all(x.rstrip(";.") == unit for x in each), each
    assert f"<th>{unit}</th>" in aggregate.table_html(table)


def test_last_valid_skips_trailing_nans():
    assert frames.last_valid(pd.Series([1.0, 2.0, np.nan])) == 2.0
    assert math.isnan(frames.last_valid(pd.Series([np.nan], dtype=float)))
    assert frames.col(pd.DataFrame({"a": ["1", "x"]}), "a").tolist()[0] == 1.0
    assert frames.col(pd.DataFrame({"a": [1]}), "missing").isna().all()


# --------------------------------------------------------------------------- conditions (issue 12)


def _cond(other_frac: float, load: float, contended: bool) -> dict:
    """A run_info ``conditions`` dict on a 2-CPU machine over a 40 s run."""
    return {"load_avg_start": load - 0.5, "load_avg_end": load, "cpus": 2, "run_cores": 2.0, "wall_s": 40.0,
            "own_cpu_s": 70.0, "other_cpu_s": other_frac * 80.0, "other_cpu_frac": other_frac,
            "contended": contended, "note": ""}


QUIET = _cond(0.02, 1.2, False)
BUSY = _cond(0.35, 3.1, True)


def _discussion(runs, ref="onpolicy"):
    table = aggregate.summarize(runs, ref)
    sync = aggregate.weight_sync_frame(runs, [])
    disc = report_text.discussion(table, aggregate.stack_frames(runs, "metrics"),
                                  aggregate.stack_frames(runs, "versions"), sync, ref, {},
                                  aggregate.rollouts_frame(runs))
    return table, {s["id"]: s for s in disc["sections"]}


def test_conditions_columns_in_the_summary(tmp_path, make_runs):
    root = make_runs(tmp_path / "runs", conditions={"onpolicy": QUIET, "disagg": BUSY})
    t = by_variant(aggregate.summarize(aggregate.load_runs(root), "onpolicy"))
    assert t["disagg"]["load_avg_max"] == pytest.approx(3.1) and t["disagg"]["other_cpu_frac"] == pytest.approx(0.35)
    assert bool(t["disagg"]["contended"]) and not bool(t["onpolicy"]["contended"])
    assert t["onpolicy"]["load_avg_max"] == pytest.approx(1.2)
    # k2 recorded no conditions (an older run): NaN / False, not a made-up value
    assert math.isnan(t["k2"]["load_avg_max"]) and math.isnan(t["k2"]["other_cpu_frac"])
    assert not bool(t["k2"]["contended"])
    html = aggregate.table_html(aggregate.summarize(aggregate.load_runs(root), "onpolicy"))
    assert "<th>contended</th>" in html and "35%" in html and not re.search(r"\bnan\b", html, re.IGNORECASE)


def test_contended_run_is_flagged_and_draws_no_conclusion(tmp_path, make_runs):
    root = make_runs(tmp_path / "runs", conditions={"onpolicy": QUIET, "k2": QUIET, "disagg": BUSY})
    _, sec = _discussion(aggregate.load_runs(root))
    disagg = " ".join(sec["disagg"]["sentences"])
    assert ("measured under contention: other processes took 35% of the CPUs during disagg; no conclusion is drawn "
            "from this comparison") in disagg
    # neither the speedup nor the share of the overlap bound is stated as a finding
    assert "speedup 1.60x" not in disagg and "of the bound" not in disagg and "exceeds the overlap bound" not in disagg
    assert "disagg 25 s x 2 = 0.0139 device-hours (contended)" in disagg
    assert "onpolicy 40 s x 1 = 0.0111 device-hours;" in disagg
    assert sec["disagg"]["numbers"]["contended_disagg"] is True
    # the uncontended pair (k2 vs onpolicy) still gets its conclusion
    kstep = " ".join(sec["kstep"]["sentences"])
    assert "a speedup of 1.25x" in kstep and "under contention" not in kstep
    assert sec["kstep"]["numbers"]["contended_k2"] is False
    conditions = sec["profiling"]["sentences"][-1]
    assert conditions.startswith("Run conditions")
    assert "disagg load average up to 3.1, other processes 35% of the CPUs (contended)" in conditions
    assert "k2 load average up to 1.2, other processes 2% of the CPUs;" in conditions
    assert "1 run(s) were timed under contention" in conditions
    assert sec["profiling"]["numbers"]["contended_runs"] == 1


def test_contended_reference_flags_every_comparison(tmp_path, make_runs):
    root = make_runs(tmp_path / "runs", conditions={"onpolicy": BUSY, "k2": QUIET, "disagg": BUSY})
    _, sec = _discussion(aggregate.load_runs(root))
    kstep = " ".join(sec["kstep"]["sentences"])
    assert "k2 vs 'onpolicy' throughput: measured under contention: other processes took 35% of the CPUs during " \
           "onpolicy; no conclusion is drawn from this comparison." in kstep
    assert "a speedup of" not in kstep and "took 12% less time" not in kstep  # no noise verdict either
    assert "2 weight syncs instead of 4" in kstep  # counts are not timings: still reported
    disagg = " ".join(sec["disagg"]["sentences"])
    assert "35% of the CPUs during disagg and 35% of the CPUs during onpolicy" in disagg
    prof = " ".join(sec["profiling"]["sentences"])
    assert "'onpolicy' was timed under contention" in prof and "2 run(s) were timed under contention" in prof


def test_runs_without_conditions_keep_their_conclusions(runs):
    _, sec = _discussion(runs)
    assert "speedup 1.60x over 'onpolicy'" in " ".join(sec["disagg"]["sentences"])
    assert "a speedup of 1.25x" in " ".join(sec["kstep"]["sentences"])
    cond = sec["profiling"]["sentences"][-1]
    assert cond.startswith("Run conditions: no run recorded") and "could be checked for contention" in cond


def test_conditions_sentence_with_some_runs_unrecorded(tmp_path, make_runs):
    root = make_runs(tmp_path / "runs", conditions={"onpolicy": QUIET})
    _, sec = _discussion(aggregate.load_runs(root))
    cond = sec["profiling"]["sentences"][-1]
    assert "disagg not recorded; k2 not recorded; onpolicy load average up to 1.2, other processes 2% of" in cond
    assert cond.endswith("No run with recorded conditions was timed under contention.")


def test_run_transport_and_replay_comparisons_check_contention():
    table = pd.DataFrame([
        {"variant": "disagg", "mode": "disaggregated", "replay": False, "transport": "object_store",
         "contended": True, "other_cpu_frac": 0.4, "samples_per_s": 1.0,
         "val_reward_final": 0.5, "val_reward_best": 0.6, "replay_reuse_mean": math.nan,
         "replay_age_mean": math.nan, "staleness_max": 1.0},
        {"variant": "disagg_rdt", "mode": "disaggregated", "replay": False, "transport": "rdt",
         "contended": False, "other_cpu_frac": 0.01, "samples_per_s": 2.0,
         "val_reward_final": 0.5, "val_reward_best": 0.6, "replay_reuse_mean": math.nan,
         "replay_age_mean": math.nan, "staleness_max": 1.0},
        {"variant": "replay", "mode": "disaggregated", "replay": True, "transport": "object_store",
         "contended": False, "other_cpu_frac": 0.01, "samples_per_s": 3.0,
         "val_reward_final": 0.4, "val_reward_best": 0.6, "replay_reuse_mean": 1.5,
         "replay_age_mean": 0.8, "staleness_max": 2.0}])
    sync = pd.DataFrame([
        {"source": "run", "variant": "disagg", "payload": "", "label": "object_store", "median_s": 0.2, "n": 4,
         "bytes": 1e6, "gbps": 0.005, "note": ""},
        {"source": "run", "variant": "disagg_rdt", "payload": "", "label": "rdt/gloo", "median_s": 0.05, "n": 4,
         "bytes": 1e6, "gbps": 0.02, "note": ""}], columns=list(contract.WEIGHT_SYNC_COLUMNS))
    text = " ".join(report_text.rdt_section(sync, table)["sentences"])
    assert "object_store vs rdt/gloo in the training runs: measured under contention: other processes took 40% " \
           "of the CPUs during disagg; no conclusion is drawn from this comparison." in text
    assert "faster than" not in text
    # without the table (or with both runs quiet) the comparison is stated
    assert "rdt/gloo is 4.00x faster than object_store" in " ".join(report_text.rdt_section(sync)["sentences"])
    replay = " ".join(report_text.replay_section(table)["sentences"])
    assert "throughput measured under contention: other processes took 40% of the CPUs during disagg" in replay
    assert "samples/s" not in replay
    table.loc[0, "contended"] = False
    assert "throughput 3 vs 1 samples/s" in " ".join(report_text.replay_section(table)["sentences"])
