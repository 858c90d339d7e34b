"""The report's benchmark sections: a skipped bench is one sentence on how to run it, and the TRL
comparison calls a ratio a lead only when every interleaved pair agrees."""

from __future__ import annotations

import copy

from rlpipe.analysis.bench_text import bench_section, limits_section, trl_section

TRL = {
    "bench": "trl", "skipped": False, "threads": 2, "cpus": 2,
    "settings": {"steps": 16, "prompts_per_step": 8, "group_size": 4, "val_size": 64},
    "ratios_rlpipe_over_trl": {"pairs": 3, "step_samples_per_s_median": 1.6,
                               "step_samples_per_s_median_spread": [1.5, 1.7],
                               "samples_per_s": 1.55, "samples_per_s_spread": [1.4, 1.6]},
    "rlpipe": {"val_reward_initial": 0.4, "val_reward_final": 0.85,
               "phases_s_per_step": {"generate": 0.1, "score": 0.01, "logprobs": 0.0, "update": 0.2,
                                     "weight_sync": 0.002, "other": 0.02, "step": 0.332},
               "load_avg_per_pair": [[[0.5, 0.5, 0.5], [0.9, 0.6, 0.5]]] * 3},
    "trl": {"val_reward_final": 0.8, "phases_s_per_step": {"generate": 0.3, "score": 0.01, "other": 0.2,
                                                          "step": 0.51},
            "load_avg_per_pair": [[[0.9, 0.6, 0.5], [1.0, 0.7, 0.5]]] * 3},
}


def _text(sec: dict) -> str:
    return " ".join(sec["sentences"])


def test_a_lead_in_every_pair_is_stated_with_its_spread_and_phases():
    text = _text(trl_section({"trl": TRL}))
    assert "rlpipe / TRL 1.6x (pairs 1.5..1.7), faster in every pair" in text
    assert "3 interleaved pairs" in text
    assert "rlpipe: a step takes 0.332 s" in text and "generate 0.1 s (30%)" in text
    assert "TRL: a step takes 0.51 s" in text and "other 0.2 s (39%)" in text
    assert "within the sampling noise" in text  # 0.85 vs 0.80 on 64 prompts
    assert "indicative only" not in text  # load stayed below the CPU count
    assert "(load 1 on 2 CPUs)" in text  # every ratio carries the load it was measured at


def test_pairs_that_disagree_are_no_finding_and_load_is_flagged():
    t = copy.deepcopy(TRL)
    t["ratios_rlpipe_over_trl"]["step_samples_per_s_median_spread"] = [0.9, 1.7]
    t["trl"]["load_avg_per_pair"] = [[[3.5, 2.0, 1.0], [4.0, 2.0, 1.0]]]
    text = _text(trl_section({"trl": t}))
    assert "not a consistent difference: the pairs disagree" in text
    assert "faster in every pair (load 4 on 2 CPUs: contended, indicative only)" in text


def test_a_run_without_trl_says_once_how_to_add_it_and_has_no_trl_section():
    for bench in ({"sampler": {"kv_gflops": 1.0}, "weight_sync": {}},  # the default run: no trl.json at all
                  {"trl": {"bench": "trl", "skipped": True,  # an older run's skip record
                           "reason": "trl is not installed: pip install -e '.[bench]'"}}):
        assert trl_section(bench) is None
        listing = _text(bench_section(bench))
        assert listing.count("rlpipe against TRL's GRPOTrainer: not in this run") == 1
        assert listing.count("pip install -e '.[bench]'") == 1  # said once, not "...; to run it: <same>"
        assert "rerun snakemake --cores all" in listing
        assert "=" not in listing and "{" not in listing  # no key = value or JSON dumps
    measured = _text(bench_section({"trl": TRL}))
    assert "rlpipe against TRL's GRPOTrainer: measured" in measured and "pip install" not in measured


def test_the_aot_decode_package_is_said_to_be_outside_the_timing():
    assert "compiled decode package" not in _text(trl_section({"trl": TRL}))  # eager: no package
    built = copy.deepcopy(TRL)
    built["decode_package"] = {"package": "/c/decode-x.pt2", "built_here": True, "build_s": 27.4}
    text = _text(trl_section({"trl": built}))
    assert "built once before the first pair (27.4 s" in text and "no timed run includes its build" in text
    built["decode_package"] = {"package": "/c/decode-x.pt2", "built_here": False, "build_s": None}
    assert "already in this machine's cache" in _text(trl_section({"trl": built}))


def test_limits_name_the_compiled_decodes_and_the_heads_memory():
    sampler = {"kv_fraction_of_peak": 0.11, "kv_gflops": 18.0, "batch": 32, "matmul_peak_gflops": 160.0,
               "compiled_fraction_of_peak": 0.12, "compiled_over_eager": 1.2,
               "aot_fraction_of_peak": 0.17, "aot_over_eager": 1.45}
    update = {"update_fraction_of_peak": 0.4, "fwd_bwd_fraction_of_peak": 0.41, "torch_threads": 1,
              "update_gflops": 35.0, "matmul_peak_gflops": 87.0, "fwd_bwd_share": 0.8, "kl_monitor_share": 0.15,
              "optimizer_share": 0.05, "fwd_bwd_peak_mb": 170.5, "full_head_fwd_bwd_peak_mb": 189.3,
              "peak_memory_ratio": 1.11}
    text = _text(limits_section({"sampler": sampler, "update": update}))
    assert "compiled ahead of time (`train.decode: aot`" in text and "17% of the peak, 1.45x the eager" in text
    assert "through torch.compile" in text and "12% of the peak, 1.2x" in text
    assert "170 MB with the LM head on response tokens only" in text and "189 MB with the head over every" in text
    text = _text(limits_section({"sampler": {k: v for k, v in sampler.items() if "aot" not in k}}))
    assert "ahead of time" not in text and "Peak memory" not in text


SAMPLER = {"kv_fraction_of_peak": 0.11, "kv_gflops": 18.0, "batch": 32, "matmul_peak_gflops": 160.0,
           "aot_fraction_of_peak": 0.17, "aot_over_eager": 1.46, "torch_threads": 2, "load_avg_1m": 5.7,
           "provenance": {"cpus": 2}}


def test_a_contended_bench_flags_every_ratio_and_a_quiet_one_does_not():
    busy = _text(limits_section({"sampler": SAMPLER}))
    assert "1.46x the eager sampler measured beside it (load 5.7 on 2 CPUs: contended, indicative only)" in busy
    assert "GFLOP/s; load 5.7 on 2 CPUs: contended, indicative only)" in busy
    quiet = _text(limits_section({"sampler": {**SAMPLER, "load_avg_1m": 2.1}}))  # its own 2 threads
    assert "1.46x the eager sampler measured beside it (load 2.1 on 2 CPUs)" in quiet
    assert "indicative" not in quiet


def test_limits_quote_the_device_peak_beside_the_shape_peak():
    update = {"update_fraction_of_peak": 0.4, "fwd_bwd_fraction_of_peak": 0.41, "torch_threads": 1,
              "update_gflops": 35.0, "matmul_peak_gflops": 87.0, "fwd_bwd_share": 0.8, "kl_monitor_share": 0.15,
              "optimizer_share": 0.05, "fraction_of_device_peak": 0.35, "device_peak_tflops": 0.1,
              "device_peak_dtype": "float32", "device_peak_matmul_size": 2048}
    sampler = {**SAMPLER, "fraction_of_device_peak": 0.001, "device_peak_tflops": 800.0,
               "device_peak_dtype": "bfloat16", "device_peak_matmul_size": 8192}
    sec = limits_section({"sampler": sampler, "update": update})
    text = _text(sec)
    assert "the update 35% of 0.1 TFLOP/s (float32, side 2048)" in text
    assert "generation 0.1% of 800 TFLOP/s (bfloat16, side 8192)" in text
    assert sec["numbers"]["generation_device_fraction"] == 0.001
    assert "device's own peak" not in _text(limits_section({"sampler": SAMPLER}))  # older JSONs: no sentence
