"""The report's one honesty rule (rlpipe.analysis.findings) and its use by the family pages and the
main discussion: a single seed, or a contended pair, is never called a finding."""

import json
import math

import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.analysis import aggregate, findings, report_text
from rlpipe.analysis.stats import mean_ci, ratio_of_means, welch_difference

FINDING_CLAUSE = findings.Verdict(True, findings.FINDING).clause()


@pytest.mark.parametrize("diff, contended, finding, reason", [
    ((0.3, 0.2, 0.4, 3), False, True, findings.FINDING),
    ((0.3, 0.2, 0.4, 3), True, False, findings.CONTENDED),
    ((0.3, -0.1, 0.7, 3), False, False, findings.NOISE),
    ((0.3, math.nan, math.nan, 1), False, False, findings.UNREPLICATED),
    ((0.3, 0.2, 0.4, 1), False, False, findings.UNREPLICATED),  # an interval, but one seed: still not
    ((math.nan, math.nan, math.nan, 0), False, False, findings.NO_DATA),
])
def test_is_finding_on_tuples(diff, contended, finding, reason):
    v = findings.is_finding(diff, contended)
    assert bool(v) is finding and v.reason == reason and v.clause()


def test_is_finding_on_the_stats_records():
    assert findings.is_finding(welch_difference([0.5, 0.52, 0.48], [0.8, 0.82, 0.78]))
    assert not findings.is_finding(welch_difference([0.5, 0.52, 0.48], [0.51, 0.47, 0.53]))
    assert findings.is_finding(welch_difference([0.5], [0.9])).reason == findings.UNREPLICATED
    assert findings.is_finding(mean_ci([0.2, 0.21, 0.19]))
    assert findings.is_finding(mean_ci([0.2])).reason == findings.UNREPLICATED
    fast = ratio_of_means([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])
    assert findings.is_finding(fast, null=1.0)
    assert not findings.is_finding(fast, contended=True, null=1.0)
    assert not findings.is_finding(ratio_of_means([10.0], [20.0]), null=1.0)
    assert not findings.single_runs(0.1, 0.9)  # a huge single-run gap is still a measurement


def _discussion(root):
    runs = aggregate.load_runs(root)
    table = aggregate.summarize(runs, "onpolicy")
    disc = report_text.discussion(table, aggregate.stack_frames(runs, "metrics"),
                                  aggregate.stack_frames(runs, "versions"), aggregate.weight_sync_frame(runs, []),
                                  "onpolicy", {}, aggregate.rollouts_frame(runs))
    return {s["id"]: s for s in disc["sections"]}


def test_main_discussion_states_single_run_gaps_as_measurements(tmp_path, make_runs):
    sec = _discussion(make_runs(tmp_path / "runs"))
    kstep, disagg = " ".join(sec["kstep"]["sentences"]), " ".join(sec["disagg"]["sentences"])
    assert "a speedup of 1.25x (unreplicated, so a measurement, not a finding)" in kstep
    assert "speedup 1.60x over 'onpolicy' (unreplicated, so a measurement, not a finding)" in disagg
    assert "final validation reward 0.4 vs 0.4 (unreplicated" in kstep
    assert sec["kstep"]["numbers"]["finding_k2"] is False and sec["disagg"]["numbers"]["finding_disagg"] is False
    everything = json.dumps(sec)
    assert FINDING_CLAUSE not in everything and findings.FINDING not in everything


def test_main_discussion_contended_pair_is_no_finding(tmp_path, make_runs):
    busy = {"load_avg_start": 3.0, "load_avg_end": 3.1, "cpus": 2, "run_cores": 2.0, "wall_s": 40.0,
            "own_cpu_s": 70.0, "other_cpu_s": 28.0, "other_cpu_frac": 0.35, "contended": True, "note": ""}
    sec = _discussion(make_runs(tmp_path / "runs", conditions={"k2": busy, "disagg": busy}))
    kstep = " ".join(sec["kstep"]["sentences"])
    assert "a speedup of" not in kstep and "no conclusion is drawn" in kstep
    assert sec["kstep"]["numbers"]["finding_k2"] is False and sec["disagg"]["numbers"]["finding_disagg"] is False
    assert FINDING_CLAUSE not in json.dumps(sec)


def test_transport_comparison_between_training_runs_is_a_measurement():
    sync = pd.DataFrame([
        {"source": "run", "variant": "disagg", "payload": "", "label": "object_store", "median_s": 0.2, "n": 4,
         "bytes": 1e6, "gbps": 0.005, "note": ""},
        {"source": "run", "variant": "disagg_rdt", "payload": "", "label": "rdt/gloo", "median_s": 0.05, "n": 4,
         "bytes": 1e6, "gbps": 0.02, "note": ""}], columns=list(contract.WEIGHT_SYNC_COLUMNS))
    text = " ".join(report_text.rdt_section(sync)["sentences"])
    assert "rdt/gloo is 4.00x faster than object_store in the training runs (unreplicated, so a measurement" in text


def test_main_page_says_its_gaps_are_measurements(tmp_path, make_runs):
    runs = aggregate.load_runs(make_runs(tmp_path / "runs"))
    table = aggregate.summarize(runs, "onpolicy")
    disc = report_text.discussion(table, aggregate.stack_frames(runs, "metrics"),
                                  aggregate.stack_frames(runs, "versions"), aggregate.weight_sync_frame(runs, []),
                                  "onpolicy", {}, aggregate.rollouts_frame(runs))
    assert "a gap between variants is a measurement, not a finding" in report_text.render_html(disc)


# --------------------------------------------------------------------------- timings and their load


def test_a_bench_is_contended_by_the_training_runs_rule():
    """Others' cores = the highest 1-minute load minus the bench's own cores, decided by the same
    decide_contended (and threshold) as a training run's CPU-time measure."""
    busy = findings.timing_load({"load_avg_1m": 5.7, "torch_threads": 2, "provenance": {"cpus": 2}})
    assert busy.contended is True and busy.clause() == "load 5.7 on 2 CPUs: contended, indicative only"
    quiet = findings.timing_load({"load_avg_1m": 2.1, "torch_threads": 2, "cpus": 2})  # the bench's own 2 threads
    assert quiet.contended is False and quiet.clause() == "load 2.1 on 2 CPUs"
    # the threshold is contract.OTHER_CPU_THRESHOLD of the machine beyond the idle cores
    assert findings.timing_load({"load_avg_1m": 2.19, "torch_threads": 2, "cpus": 2}).contended is False
    assert findings.timing_load({"load_avg_1m": 2.21, "torch_threads": 2, "cpus": 2}).contended is True
    # one thread on 2 CPUs leaves a core idle: another process there does not contend it
    assert findings.timing_load({"load_avg_1m": 2.1, "torch_threads": 1, "cpus": 2}).contended is False
    # the weight-sync and TRL shapes: os.getloadavg() triples, before/after per pair, nested
    assert findings.timing_load({"cpus": 2, "load_avg_start": [0.4, 0.3, 0.2],
                                 "load_avg_end": [5.7, 2.0, 1.0]}).load == 5.7
    assert findings.timing_load({"cpus": 2, "threads": 2, "rlpipe": {
        "load_avg_per_pair": [[[0.9, 0.5, 0.5], [3.5, 1.0, 1.0]]]}}).contended is True
    # a nested run's own conditions (CPU time over its interval) decide first
    pts = {"cpus": 2, "points": [{"conditions": {"contended": True, "load_avg_start": 0.5, "cpus": 2}}]}
    assert findings.timing_load(pts).contended is True
    unknown = findings.timing_load({"cpus": 2})
    assert unknown.contended is None and unknown.clause() == "load not recorded"


def test_the_contention_rule_is_shared_with_the_trainer():
    from rlpipe.trainer import conditions

    assert conditions.decide_contended is contract.decide_contended
    assert conditions.OTHER_CPU_THRESHOLD is contract.OTHER_CPU_THRESHOLD
